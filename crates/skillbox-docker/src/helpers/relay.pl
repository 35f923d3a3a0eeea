# skillbox's relay (DESIGN.md §2.3): one connection from the host to what an exec
# serves in this container, which has no network for it. Run as the sandbox's own user,
# with the rights the sandbox's code has and no more: it makes itself undumpable (the
# sandbox's code, the same uid, can neither write its memory through /proc nor trace
# it), sets no_new_privs and installs skillbox's seccomp filter, all before perl loads
# anything; then it connects to 127.0.0.1:PORT on the container's loopback (`port
# PORT`) or to a unix socket (`socket PATH`), says how that went in one line on stdout
# (`+ PID START`, its start time, or `- ERRNO TEXT` and exit 1), and carries bytes both ways between its
# stdin/stdout (the host's end) and the socket until the service closes its side and
# everything it sent is delivered. The host's end of file is passed on as a half close
# (`shutdown(SHUT_WR)`). At most 64 KiB wait each way. The host kills it (by the PID it
# answered, while that pid has that start time) when it drops the connection first.
BEGIN {
    my ($prctl, $seccomp, $filter_hex) = @ARGV;
    my $filter = pack('H*', $filter_hex);
    my $prog = pack('S x6 p', length($filter) / 8, $filter);
    unless (syscall($prctl, 4, 0, 0, 0, 0) == 0
        && syscall($prctl, 38, 1, 0, 0, 0) == 0
        && syscall($seccomp, 1, 0, $prog) == 0)
    {
        syswrite(STDOUT, '- ' . ($! + 0) . " the relay's own confinement: $!\n");
        exit 1;
    }
}
use strict;
use Socket qw(PF_INET PF_UNIX SOCK_STREAM SHUT_WR SOL_SOCKET SO_ERROR inet_aton pack_sockaddr_in
    pack_sockaddr_un);
use Fcntl qw(F_GETFL F_SETFL O_NONBLOCK);

use constant { CHUNK => 65536, EINTR => 4, EAGAIN => 11, ETIMEDOUT => 110, EINPROGRESS => 115 };
# The longest a connect waits for the service (the host gives up after 10 s).
use constant CONNECT_SECONDS => 9;

my (undef, undef, undef, $kind, $where) = @ARGV;
my $sock;
# A side that went away is seen as an error from the write, not as a signal.
$SIG{PIPE} = 'IGNORE';

# A process's start time, field 22 of its stat (after the name, which may hold anything).
sub started {
    open(my $stat, '<', "/proc/$_[0]/stat") or return undef;
    my $line = <$stat> // return undef;
    $line =~ s/^.*\) // or return undef;
    return (split(' ', $line))[19];
}

sub fail {
    syswrite(STDOUT, '- ' . ($! + 0) . " $_[0]: $!\n");
    exit 1;
}

# Connects without blocking past CONNECT_SECONDS: a service that never accepts (its
# queue full) leaves no relay waiting on it. A unix socket's full queue is EAGAIN at once.
sub connect_within {
    my ($address, $what) = @_;
    my $flags = fcntl($sock, F_GETFL, 0) or fail('fcntl');
    fcntl($sock, F_SETFL, $flags | O_NONBLOCK) or fail('fcntl');
    return if connect($sock, $address);
    fail($what) unless $! == EINPROGRESS;
    my $until = time + CONNECT_SECONDS;
    while (1) {
        my $w = '';
        vec($w, fileno($sock), 1) = 1;
        my $left = $until - time;
        my $ready = $left > 0 ? select(undef, $w, undef, $left) : 0;
        last if $ready > 0;
        next if $ready < 0 && $! == EINTR;
        $! = ETIMEDOUT if $ready == 0;
        fail($what);
    }
    my $packed = getsockopt($sock, SOL_SOCKET, SO_ERROR) // fail($what);
    my $error = unpack('i', $packed);
    if ($error) {
        $! = $error;
        fail($what);
    }
}

if ($kind eq 'port') {
    socket($sock, PF_INET, SOCK_STREAM, 0) or fail('socket');
    connect_within(pack_sockaddr_in($where, inet_aton('127.0.0.1')), "127.0.0.1:$where");
} elsif ($kind eq 'socket') {
    socket($sock, PF_UNIX, SOCK_STREAM, 0) or fail('socket');
    connect_within(pack_sockaddr_un($where), $where);
} else {
    $! = 22;
    fail("endpoint kind $kind");
}

for my $fh (\*STDIN, \*STDOUT, $sock) {
    my $flags = fcntl($fh, F_GETFL, 0) or fail('fcntl');
    fcntl($fh, F_SETFL, $flags | O_NONBLOCK) or fail('fcntl');
}
# With its start time: the host kills it by pid only while that pid is still this
# process.
my $start = started($$) // fail('/proc/self/stat');
syswrite(STDOUT, "+ $$ $start\n") or exit 1;

my ($in, $out, $s) = (fileno(STDIN), fileno(STDOUT), fileno($sock));
# $up: from the host, for the service; $down: from the service, for the host.
my ($up, $down) = ('', '');
my ($in_done, $shut, $sock_done) = (0, 0, 0);
while (!$sock_done || length $down) {
    if ($in_done && !length $up && !$shut) {
        shutdown($sock, SHUT_WR);
        $shut = 1;
    }
    my ($r, $w) = ('', '');
    vec($r, $in, 1) = 1 if !$in_done && length $up < CHUNK;
    vec($r, $s, 1) = 1 if !$sock_done && length $down < CHUNK;
    vec($w, $s, 1) = 1 if length $up;
    vec($w, $out, 1) = 1 if length $down;
    my ($rr, $ww) = ($r, $w);
    if (select($rr, $ww, undef, undef) < 0) {
        next if $! == EINTR;
        exit 1;
    }
    if (vec($rr, $in, 1)) {
        my $got = sysread(STDIN, $up, CHUNK - length $up, length $up);
        $in_done = 1 if defined $got ? $got == 0 : $! != EAGAIN;
    }
    if (vec($rr, $s, 1)) {
        my $got = sysread($sock, $down, CHUNK - length $down, length $down);
        $sock_done = 1 if defined $got ? $got == 0 : $! != EAGAIN;
    }
    if (length $up && vec($ww, $s, 1)) {
        my $put = syswrite($sock, $up);
        if (defined $put) {
            substr($up, 0, $put) = '';
        } elsif ($! != EAGAIN) {
            # The service no longer reads: what the host sends is dropped.
            ($up, $in_done, $shut) = ('', 1, 1);
        }
    }
    if (length $down && vec($ww, $out, 1)) {
        my $put = syswrite(STDOUT, $down);
        if (defined $put) {
            substr($down, 0, $put) = '';
        } elsif ($! != EAGAIN) {
            exit 0;
        }
    }
}
exit 0;
