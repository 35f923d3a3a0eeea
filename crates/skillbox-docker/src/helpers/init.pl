# skillbox's pid 1 in a docker sandbox. It is not dumpable (so the sandbox's own code,
# which runs as the same uid, cannot ptrace it or write its memory), reaps orphans, and on
# SIGUSR1 (sent by skillbox from outside) kills every other process in the container.
# Inside its pid namespace the kernel drops signals it has no handler for, so the
# sandbox cannot kill it. The kill count is shown in its command line ("skillbox-init N")
# so skillbox can see that a kill it asked for has happened.
my ($prctl) = @ARGV;
syscall($prctl, 4, 0, 0, 0, 0) == 0 or die "skillbox-init: prctl(PR_SET_DUMPABLE): $!\n";
my $kills = 0;
$SIG{USR1} = sub { kill('KILL', -1); $kills++; $0 = "skillbox-init $kills"; };
$SIG{CHLD} = sub { 1 while waitpid(-1, 1) > 0; };
$0 = "skillbox-init 0";
while (1) { sleep; }
