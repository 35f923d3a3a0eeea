# skillbox's exec wrapper in a docker sandbox: reads its status key, makes itself
# undumpable, sets no_new_privs, installs skillbox's seccomp filter on top of Docker's
# (inherited by everything it starts), changes to the working directory, runs the
# command and reports how it ended as the last line of stderr:
#   NUL "skillbox-status:<tag>:<kind> <n>" LF
# where kind is exit, signal, exec (errno of execve), cwd (errno of chdir) or setup,
# and tag is a one-time MAC of the status under the key (see outcome.rs for why).
# An exit or signal is oomexit or oomsignal when the container's memory cgroup counted
# an out-of-memory kill while the command ran (a count read before and after it, where
# one can be read: not in gVisor's own kernel), whoever the victim was: the daemon's
# event for it can come late.
# The key is the first line of stdin, read byte by byte before anything else (so the
# command's own stdin is left as it was sent), and kept only in this process's memory:
# never in a command line, the environment or a file. Nothing of the sandbox runs
# while it is read (execs take turns, and what one leaves is killed before the next).
# Files to write before the command starts (a run's script, written in the same exec
# as it runs) follow the key on stdin, as many as the count in the arguments says: a
# header line "<length> <path>" then exactly that many bytes, each written as a new
# 0644 file (made beside the path, renamed over it) as the sandbox's user. A failed
# write ends the exec with kind input and n = index * 4096 + errno; nothing runs.
# A walk to make after the command (a run's collection, in the same exec) comes as a
# count and that many arguments: the file helper's `walkread` arguments, made by
# helpers/walk.pl (appended to this script) in a fork of this process. Its output,
# when it answers and is at most 16 MiB, goes on stderr just before the status line,
# framed (an empty frame when there is none: the caller then walks with the helper):
#   NUL "skillbox-walk:<length>" LF <output>
# The caller's environment variables come as arguments (a count, then KEY=VALUE each)
# and are set only in the child, after the filter: none of them can reach perl itself
# (PERL5OPT, PERL5LIB, LD_PRELOAD would run code before the filter is in place).
# Fcntl, not POSIX: under gVisor, loading POSIX costs ~18 ms an exec.
use Fcntl ();
my ($prctl, $seccomp, $exit_group, $filter_hex, $cwd, $ninputs, $nwalk, @rest) = @ARGV;
# _exit: ends this process at once, nothing flushed, no END blocks or destructors.
sub quit { syscall($exit_group, $_[0]); }
my @walk = splice(@rest, 0, $nwalk);
# The first is the exec's timeout in seconds: the walk is skipped when less than 4 s
# of it are left, and bounded to half of what is left (at most 10 s), so it never
# makes a command that ended in time look timed out.
my $budget = @walk ? shift(@walk) : 0;
my $started = time;
my $nenv = shift(@rest);
my @env = splice(@rest, 0, $nenv);
my @cmd = @rest;
my $line = '';
while (length($line) < 256) {
    sysread(STDIN, my $c, 1) or last;
    last if $c eq "\n";
    $line .= $c;
}
my @key = split(' ', $line);
# Without its key the wrapper cannot say anything skillbox would believe: it says
# nothing, and the exec reads as killed.
@key == 8 or quit(1);
my %kinds = (exit => 1, signal => 2, exec => 3, cwd => 4, setup => 5, input => 6,
    oomexit => 7, oomsignal => 8);
sub status {
    my ($kind, $n) = split(/ /, $_[0], 2);
    $n = 0 + $n;
    my $m = $kinds{$kind} * 1048576 + $n;
    my $tag = join('', map {
        sprintf('%08x', ($key[2 * $_] * $m + $key[2 * $_ + 1]) % 2147483647)
    } 0 .. 3);
    syswrite(STDERR, "\0skillbox-status:$tag:$kind $n\n");
    quit(0);
}
syscall($prctl, 4, 0, 0, 0, 0) == 0 or status("setup " . ($! + 0));
syscall($prctl, 38, 1, 0, 0, 0) == 0 or status("setup " . ($! + 0));
my $filter = pack('H*', $filter_hex);
my $prog = pack('S x6 p', length($filter) / 8, $filter);
syscall($seccomp, 1, 0, $prog) == 0 or status("setup " . ($! + 0));
for my $i (0 .. $ninputs - 1) {
    my $head = '';
    while (length($head) < 8192) {
        sysread(STDIN, my $c, 1) or last;
        last if $c eq "\n";
        $head .= $c;
    }
    my ($len, $path) = $head =~ /^(\d+) (\/.+)$/s or quit(1);
    my $tmp = $path;
    $tmp =~ s{[^/]*$}{.skillbox-input-$$-$i};
    sysopen(my $out, $tmp, Fcntl::O_WRONLY() | Fcntl::O_CREAT() | Fcntl::O_EXCL(), 0644)
        or status("input " . ($i * 4096 + $! + 0));
    while ($len > 0) {
        my $got = sysread(STDIN, my $chunk, $len > 65536 ? 65536 : $len);
        $got or quit(1);
        $len -= $got;
        my $off = 0;
        while ($off < $got) {
            my $put = syswrite($out, $chunk, $got - $off, $off);
            unless ($put) { my $e = $! + 0; unlink($tmp); status("input " . ($i * 4096 + $e)); }
            $off += $put;
        }
    }
    unless (close($out) && rename($tmp, $path)) {
        my $e = $! + 0;
        unlink($tmp);
        status("input " . ($i * 4096 + $e));
    }
}
# The walk runs in a forked child (a fork, no exec: under gVisor starting a program
# costs 30-50 ms, a fork about 6): SIGKILLed at its bound whatever it is doing (the
# sandbox's leftovers may hold the CPU), its memory its own (a large walk makes it the
# out-of-memory killer's pick, not this process, which still has the status to report;
# its oom_score_adj cannot be raised: undumpable, its /proc files are root's), its
# output read here up to 16 MiB.
sub walk {
    my $left = $budget - (time - $started) - 1;
    return if $left < 4;
    my $bound = int($left / 2) > 10 ? 10 : int($left / 2);
    my $most = 16777216;
    pipe(my $from, my $to) or return;
    my $child = fork();
    defined($child) or return;
    if ($child == 0) {
        close($from);
        my ($root, $limit, $read_ahead, @prune) = @walk;
        my $out = walkread($root, $limit, $read_ahead, time + $bound, $most, @prune);
        defined($out) or quit(1);
        my $off = 0;
        while ($off < length($out)) {
            my $put = syswrite($to, $out, length($out) - $off, $off);
            $put or quit(1);
            $off += $put;
        }
        quit(0);
    }
    close($to);
    my $out = '';
    my $late = 0;
    local $SIG{ALRM} = sub { $late = 1; kill('KILL', $child); };
    alarm($bound);
    while (!$late) {
        my $got = sysread($from, $out, 65536, length($out));
        last unless $got;
        if (length($out) > $most) { kill('KILL', $child); $late = 1; }
    }
    waitpid($child, 0);
    alarm(0);
    return if $? || $late;
    return $out;
}
# The memory cgroup's out-of-memory kills so far (v2, else v1), or -1.
sub oom_kills {
    for my $f ('/sys/fs/cgroup/memory.events', '/sys/fs/cgroup/memory/memory.oom_control') {
        open(my $h, '<', $f) or next;
        while (my $l = <$h>) { return $1 + 0 if $l =~ /^oom_kill (\d+)$/; }
    }
    return -1;
}
chdir($cwd) or status("cwd " . ($! + 0));
my $kills = oom_kills();
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
    quit(127);
}
close($w);
my $err = '';
sysread($r, $err, 16);
waitpid($pid, 0);
my $st = $?;
status("exec $err") if length($err);
my $oom = ($kills >= 0 && oom_kills() > $kills) ? 'oom' : '';
if (@walk) {
    # Always a frame, empty when there is no walk: the last frame is skillbox's, so
    # one the command printed at the end of its stderr stays the command's.
    my $out = walk();
    $out = '' unless defined($out);
    my $frame = "\0skillbox-walk:" . length($out) . "\n" . $out;
    my $off = 0;
    while ($off < length($frame)) {
        my $put = syswrite(STDERR, $frame, length($frame) - $off, $off);
        last unless $put;
        $off += $put;
    }
}
status(($st & 127) ? "${oom}signal " . ($st & 127) : "${oom}exit " . ($st >> 8));
