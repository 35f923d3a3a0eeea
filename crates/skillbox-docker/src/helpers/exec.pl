# skillbox's exec wrapper in a docker sandbox: makes itself undumpable, sets
# no_new_privs, installs skillbox's seccomp filter on top of Docker's (inherited by
# everything it starts), changes to the working directory, runs the command and reports
# how it ended as the last line of stderr:  NUL "skillbox-status:<nonce>:<kind> <n>" LF
# where kind is exit, signal, exec (errno of execve), cwd (errno of chdir) or setup.
# The caller's environment variables come as arguments (a count, then KEY=VALUE each)
# and are set only in the child, after the filter: none of them can reach perl itself
# (PERL5OPT, PERL5LIB, LD_PRELOAD would run code before the filter is in place).
use POSIX ();
my ($prctl, $seccomp, $filter_hex, $nonce, $cwd, $nenv, @rest) = @ARGV;
my @env = splice(@rest, 0, $nenv);
my @cmd = @rest;
sub status { syswrite(STDERR, "\0skillbox-status:$nonce:$_[0]\n"); POSIX::_exit(0); }
syscall($prctl, 4, 0, 0, 0, 0) == 0 or status("setup " . ($! + 0));
syscall($prctl, 38, 1, 0, 0, 0) == 0 or status("setup " . ($! + 0));
my $filter = pack('H*', $filter_hex);
my $prog = pack('S x6 p', length($filter) / 8, $filter);
syscall($seccomp, 1, 0, $prog) == 0 or status("setup " . ($! + 0));
chdir($cwd) or status("cwd " . ($! + 0));
pipe(my $r, my $w) or status("setup " . ($! + 0));
my $pid = fork();
defined($pid) or status("setup " . ($! + 0));
if ($pid == 0) {
    close($r);
    for my $pair (@env) {
        my ($k, $v) = split(/=/, $pair, 2);
        $ENV{$k} = $v;
    }
    exec { $cmd[0] } @cmd;
    syswrite($w, ($! + 0) . "");
    POSIX::_exit(127);
}
close($w);
my $err = '';
sysread($r, $err, 16);
waitpid($pid, 0);
my $st = $?;
status("exec $err") if length($err);
status(($st & 127) ? "signal " . ($st & 127) : "exit " . ($st >> 8));
