# The file helper's `walkread` (helpers/fs.py), made by the exec wrapper after its
# command (a run's collection) in a fork of itself, which bounds its time and memory
# (helpers/exec.pl), instead of by a python it would start: under gVisor every program
# started in the container costs 30-50 ms. The output is byte for byte
# what fs.py prints for the same tree (a test holds the two together): the listing as
# one JSON line, then, when its regular files come to at most $budget bytes, each
# one's content, one record per file.
# It answers only what it is sure fs.py would answer the same: anything else (a name
# that is not UTF-8, an error fs.py would fail on, more than $most bytes of output, the
# $deadline passing) returns undef, and the caller makes the walk with fs.py.
# Nothing is read past the limit: a directory is read entry by entry, and a walk that
# has found more than $limit entries stops with $limit + 1 of them.
# Linux's errno values (the same on x86_64 and aarch64), without loading POSIX or
# constant.pm: every module costs a few ms under gVisor.
sub ENOENT () { 2 }
sub ENXIO () { 6 }
sub ENOTDIR () { 20 }
sub ELOOP () { 40 }

sub walkread {
    my ($root, $limit, $budget, $deadline, $most, @prune) = @_;
    my %prune = map { $_ => 1 } @prune;
    # fs.py resolves the root's parent (gVisor mis-resolves some paths through a
    # symlink to /); the last component is left as it is.
    my ($parent, $name) = $root =~ m{^(.*)/([^/]+)$} or return undef;
    if ($parent ne '') {
        require Cwd;
        $parent = Cwd::abs_path($parent);
        defined($parent) or return undef;
        $parent = '' if $parent eq '/';
    }
    $root = "$parent/$name";
    lstat($root) && -d _ or return undef;
    my ($found, $listing, @files, @pending) = (0, '[');
    push(@pending, [$root, '']);
    DIR: while (@pending) {
        my ($dir, $rel) = @{shift(@pending)};
        opendir(my $dh, $dir) or return undef;
        my ($cut, @names) = (0);
        while (defined(my $n = readdir($dh))) {
            next if $n eq '.' || $n eq '..';
            push(@names, $n);
            if ($found + @names > $limit) { $cut = 1; last; }
        }
        closedir($dh);
        for my $n (sort @names) {
            return undef if time > $deadline;
            my $full = "$dir/$n";
            my @s = lstat($full);
            unless (@s) {
                next if $! == ENOENT;
                return undef;
            }
            my $kind = -l _ ? 'symlink' : -d _ ? 'dir' : -f _ ? 'file' : 'other';
            my $path = $rel eq '' ? $n : "$rel/$n";
            my $json = json_string($path);
            defined($json) or return undef;
            my $size = $kind eq 'file' ? $s[7] : 0;
            my $x = ($kind eq 'file' && ($s[2] & 0111)) ? 'true' : 'false';
            $listing .= ($found ? ', ' : '') . "[$json, \"$kind\", $size, $x]";
            return undef if length($listing) > $most;
            push(@files, [$found, $full, $size]) if $kind eq 'file';
            $found++;
            last DIR if $found > $limit;
            push(@pending, [$full, $path]) if $kind eq 'dir' && !$prune{$path};
        }
        # Cut short, and entries gone since: what was not read may hold more.
        return undef if $cut;
    }
    my $out = "$listing]\n";
    return undef if length($out) > $most;
    my $total = 0;
    $total += $_->[2] for @files;
    return $out if $found > $limit || $total > $budget;
    my $written = 0;
    for my $f (@files) {
        return undef if time > $deadline;
        my ($i, $full) = @$f;
        my ($head, $data) = read_one($full, $budget - $written);
        $out .= "{$head, \"i\": $i}\n";
        if (defined($data)) {
            $out .= $data;
            $written += length($data);
        }
        return undef if length($out) > $most;
    }
    return $out;
}

# One file as fs.py's read_one answers it: (the header's fields, content or undef).
# Never through a final symlink, never blocking, never a special file; past $limit
# bytes, toolarge.
sub read_one {
    my ($path, $limit) = @_;
    my $flags = Fcntl::O_RDONLY() | Fcntl::O_NONBLOCK() | Fcntl::O_NOFOLLOW() | Fcntl::O_NOCTTY();
    my $fh;
    unless (sysopen($fh, $path, $flags)) {
        my $e = $! + 0;
        return ('"s": "missing"') if $e == ENOENT || $e == ENOTDIR;
        return ('"s": "notfile"') if $e == ELOOP || $e == ENXIO;
        return ("\"s\": \"error\", \"errno\": $e");
    }
    my @s = stat($fh);
    return ('"s": "notfile"') unless @s && -f _;
    return ("\"s\": \"toolarge\", \"n\": $s[7]") if $s[7] > $limit;
    my $data = '';
    while (length($data) <= $limit) {
        my $want = $limit + 1 - length($data);
        my $got = sysread($fh, $data, $want > 1048576 ? 1048576 : $want, length($data));
        return ('"s": "error", "errno": ' . ($! + 0)) unless defined($got);
        last unless $got;
    }
    if (length($data) > $limit) {
        my $n = length($data) > $s[7] ? length($data) : $s[7];
        return ("\"s\": \"toolarge\", \"n\": $n");
    }
    return ('"s": "ok", "n": ' . length($data), $data);
}

# A name as fs.py's dumps writes it (ASCII only, \u escapes, surrogate pairs past the
# basic plane); undef when it is not UTF-8, which python would hold as surrogates.
sub json_string {
    my ($s) = @_;
    return "\"$s\"" if $s =~ /\A[\x20-\x7e]*\z/ && $s !~ /["\\]/;
    my $chars = $s;
    utf8::decode($chars) or return undef;
    my $back = $chars;
    utf8::encode($back);
    return undef if $back ne $s;
    my %esc = ('"' => '\\"', '\\' => '\\\\', "\n" => '\\n', "\r" => '\\r', "\t" => '\\t',
        "\b" => '\\b', "\f" => '\\f');
    my $out = '"';
    for my $c (split(//, $chars)) {
        my $o = ord($c);
        return undef if ($o >= 0xd800 && $o <= 0xdfff) || $o > 0x10ffff;
        if (exists($esc{$c})) { $out .= $esc{$c}; }
        elsif ($o >= 0x20 && $o < 0x7f) { $out .= $c; }
        elsif ($o < 0x10000) { $out .= sprintf('\\u%04x', $o); }
        else {
            $o -= 0x10000;
            $out .= sprintf('\\u%04x\\u%04x', 0xd800 | ($o >> 10), 0xdc00 | ($o & 0x3ff));
        }
    }
    return "$out\"";
}
