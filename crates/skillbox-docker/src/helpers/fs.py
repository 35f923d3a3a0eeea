# skillbox's file helper in a docker sandbox: one operation per run, as the sandbox's
# user, so it sees exactly what the sandbox's processes see. Reads write the content to
# stdout; other operations print one JSON value. Failures print {"errno", "msg"} to
# stderr (and "entry", the entry of a batch that failed) and exit 1.
# Only cheap modules at the top: under gVisor each module costs a few ms to load (json
# and tempfile bring re, shutil, random, bz2, lzma: ~60 ms), and a run's collection
# walks in every run. json is loaded only to parse (put_tree, readmany); output is
# written by `dumps` below.
import ctypes, errno, os, stat, sys

# Not dumpable: the sandbox's code runs as the same uid and may be running right now;
# it must not be able to read or write this process's memory through /proc.
if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:
    sys.exit(3)

TMP = '/workspace/.tmp'

_ESCAPES = {'"': '\\"', '\\': '\\\\', '\n': '\\n', '\r': '\\r', '\t': '\\t', '\b': '\\b', '\f': '\\f'}


def _escape(c):
    if c in _ESCAPES:
        return _ESCAPES[c]
    o = ord(c)
    if 0x20 <= o < 0x7f:
        return c
    if o < 0x10000:
        return '\\u%04x' % o
    o -= 0x10000
    return '\\u%04x\\u%04x' % (0xd800 | (o >> 10), 0xdc00 | (o & 0x3ff))


def dumps(value):
    """JSON for what this helper prints (None, bools, ints, strings, lists, tuples and
    dicts with string keys), ASCII only, as json.dumps writes it."""
    if value is None:
        return 'null'
    if value is True:
        return 'true'
    if value is False:
        return 'false'
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        if value.isascii() and value.isprintable() and '"' not in value and '\\' not in value:
            return '"' + value + '"'
        return '"' + ''.join(_escape(c) for c in value) + '"'
    if isinstance(value, (list, tuple)):
        return '[' + ', '.join(dumps(v) for v in value) + ']'
    if isinstance(value, dict):
        return '{' + ', '.join(dumps(k) + ': ' + dumps(v) for k, v in value.items()) + '}'
    raise TypeError('cannot write %r as JSON' % type(value))


def kind(mode):
    if stat.S_ISLNK(mode):
        return 'symlink'
    if stat.S_ISDIR(mode):
        return 'dir'
    if stat.S_ISREG(mode):
        return 'file'
    return 'other'


def special(mode):
    """What a file that is neither regular nor a directory is, for messages."""
    if stat.S_ISFIFO(mode):
        return 'a FIFO'
    if stat.S_ISSOCK(mode):
        return 'a socket'
    if stat.S_ISCHR(mode):
        return 'a character device'
    if stat.S_ISBLK(mode):
        return 'a block device'
    return 'not a regular file'


def refuse(mode):
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(21, 'Is a directory')
    if not stat.S_ISREG(mode):
        raise OSError(22, special(mode) + ', not a regular file (skillbox reads and appends '
                      'only to regular files: opening anything else could block or act)')


def open_regular(path, flags):
    """An fd on the regular file at path, or an error that says what is there instead.
    It never blocks and never opens a special file it has seen: it looks first, opens
    non-blocking (a FIFO swapped in meanwhile cannot stall it, and a terminal cannot
    become the helper's), and checks again what it opened."""
    try:
        refuse(os.stat(path).st_mode)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, 0o644)
    except OSError as e:
        # ENXIO: a FIFO without a reader or a socket, put there since the look.
        if e.errno == errno.ENXIO:
            refuse(os.stat(path).st_mode)
        raise
    try:
        refuse(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_only(path, st):
    probe = os.path.dirname(path) if stat.S_ISLNK(st.st_mode) else path
    try:
        return bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def remove_tree(path):
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                remove_tree(entry.path)
            else:
                os.unlink(entry.path)
    os.rmdir(path)


def temp_file(parent):
    """A new empty file (0600) under a fresh name in parent, opened to write: (fd, path).
    What tempfile.mkstemp does, at a third of its cost under gVisor (it matters for a
    tree of thousands of files)."""
    for _ in range(100):
        tmp = os.path.join(parent, '.skillbox-write-' + os.urandom(8).hex())
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, 'no free temporary name')


def write(path, data, append, mode=None):
    """Appends, or creates or replaces the file at path atomically; with mode (the
    permission bits to give it) instead of those of the file it replaces."""
    if append:
        fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        return
    # Replacing a regular file keeps its permission bits (an edited script stays
    # executable), never setuid, setgid or sticky, as native does. A symlink there is
    # replaced, not followed: its target's mode (a setuid binary's) is not copied.
    kept = 0o644
    try:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(21, 'Is a directory')
        if stat.S_ISREG(st.st_mode):
            kept = stat.S_IMODE(st.st_mode) & 0o777
    except FileNotFoundError:
        pass
    mode = kept if mode is None else mode
    parent = os.path.dirname(path) or '/'
    fd, tmp = temp_file(parent)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def plain(rel):
    """A relative path of plain names: no root, no empty, '.' or '..' component."""
    return bool(rel) and '\0' not in rel and all(
        part not in ('', '.', '..') for part in rel.split('/'))


def put_tree(base, stream):
    """The tree on stream beneath base: a JSON line listing the entries in order
    ([path, 'dir'] or [path, 'file', executable, size]), then each file's bytes, back to
    back. Each directory is made with its parents (something else there is 'not a
    directory'), each file written as `write` does (a symlink there replaced, never
    followed) with 0755 or 0644. A failure names its entry; what came before it stays."""
    made = set()

    def makedirs(path):
        if path in made:
            return
        try:
            os.makedirs(path, exist_ok=True)
        except FileExistsError:
            # makedirs says "exists" when what is there is not a directory.
            raise NotADirectoryError(errno.ENOTDIR, 'Not a directory')
        made.add(path)

    makedirs(base)
    import json
    for entry in json.loads(stream.readline()):
        rel = entry[0]
        try:
            if not isinstance(rel, str) or not plain(rel):
                raise OSError(errno.EINVAL, 'not a relative path of plain names')
            path = os.path.join(base, rel)
            if entry[1] == 'dir':
                makedirs(path)
                continue
            size = entry[3]
            data = stream.read(size)
            if len(data) != size:
                raise OSError(errno.EIO, 'the input ended before this file did')
            makedirs(os.path.dirname(path))
            write(path, data, False, 0o755 if entry[2] else 0o644)
        except OSError as e:
            e.entry = rel
            raise


def walk(root, limit, prune):
    """The walk's listing ([path, kind, size, executable]) and each entry's full path."""
    if not stat.S_ISDIR(os.lstat(root).st_mode):
        raise NotADirectoryError(20, 'Not a directory (a symlink is not followed)')
    found, paths, pending = [], [], [(root, '')]
    while pending:
        directory, rel = pending.pop(0)
        with os.scandir(directory) as entries:
            listed = sorted(entries, key=lambda e: e.name)
        for entry in listed:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            what = kind(st.st_mode)
            path = rel + '/' + entry.name if rel else entry.name
            found.append([path, what, st.st_size if what == 'file' else 0,
                          what == 'file' and bool(st.st_mode & 0o111)])
            paths.append(entry.path)
            if len(found) > limit:
                return found, paths
            if what == 'dir' and path not in prune:
                pending.append((entry.path, path))
    return found, paths


def read_one(path, limit):
    """One file as readmany answers it: (header, content or None). Never through a final
    symlink, never blocking, never a special file; past limit bytes, toolarge."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY |
                     os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return {'s': 'missing'}, None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):
            return {'s': 'notfile'}, None
        return {'s': 'error', 'errno': e.errno or 0}, None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return {'s': 'notfile'}, None
        if st.st_size > limit:
            return {'s': 'toolarge', 'n': st.st_size}, None
        chunks, got = [], 0
        try:
            while got <= limit:
                chunk = os.read(fd, min(1 << 20, limit + 1 - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
        except OSError as e:
            return {'s': 'error', 'errno': e.errno or 0}, None
        data = b''.join(chunks)
    finally:
        os.close(fd)
    if len(data) > limit:
        return {'s': 'toolarge', 'n': max(len(data), st.st_size)}, None
    return {'s': 'ok', 'n': len(data)}, data


def resolve(path):
    """The path with its parent's symlinks resolved here, component by component (gVisor
    mis-resolves some paths through a symlink to /); the last component is left as is."""
    parent, name = os.path.split(path)
    return os.path.join(os.path.realpath(parent), name) if parent and name else path


def main(op, args):
    out = sys.stdout.buffer
    if op not in ('canonical', 'mktemp'):
        args = [resolve(args[0])] + [resolve(a) if op == 'rename' else a for a in args[1:]]
    if op == 'read':
        fd = open_regular(args[0], os.O_RDONLY)
        with os.fdopen(fd, 'rb') as f:
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    return
                out.write(chunk)
    if op == 'readmax':
        # At most limit + 1 bytes of the file opened once, never through a final symlink:
        # the caller refuses the file past limit, and a file grown or swapped in since it
        # was looked at cannot make this read (or print) more.
        path, left = args[0], int(args[1]) + 1
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            raise OSError(22, 'a symlink, which a read does not follow')
        refuse(mode)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY |
                         os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise OSError(22, 'a symlink, which a read does not follow')
            raise
        try:
            refuse(os.fstat(fd).st_mode)
            while left > 0:
                chunk = os.read(fd, min(1 << 20, left))
                if not chunk:
                    return
                out.write(chunk)
                left -= len(chunk)
        finally:
            os.close(fd)
        return
    if op == 'canonical':
        return os.path.realpath(args[0], strict=True)
    if op == 'exists':
        try:
            os.lstat(args[0])
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False
    if op == 'info':
        st = os.lstat(args[0])
        return {'kind': kind(st.st_mode), 'size': st.st_size, 'mode': stat.S_IMODE(st.st_mode),
                'mtimeNs': st.st_mtime_ns, 'readOnly': read_only(args[0], st)}
    if op == 'list':
        # [name, kind, size]: the size of a regular file, else None (a link not followed).
        # More than args[1] entries: "too many", not a listing (nothing past the limit
        # is looked at, and none of it is printed).
        listed = []
        with os.scandir(args[0]) as entries:
            for e in entries:
                if len(listed) == int(args[1]):
                    return 'too many'
                st = e.stat(follow_symlinks=False)
                listed.append((e.name, kind(st.st_mode),
                               st.st_size if stat.S_ISREG(st.st_mode) else None))
        return sorted(listed, key=lambda e: e[0])
    if op == 'walk':
        # Breadth first, each directory sorted; symlinks listed, never followed; the
        # directories in args[2:] (relative) listed but not entered. One entry more
        # than the limit tells the caller there are too many.
        return walk(args[0], int(args[1]), set(args[2:]))[0]
    if op == 'walkread':
        # walk's listing (args[0], args[1], prune args[3:]) as one JSON line, then, when
        # the regular files listed come to at most args[2] bytes in all, each one's
        # content as readmany answers it, in the listing's order, one record per file
        # ({"i": its index in the listing, "s": ...}). Over that, the listing alone.
        found, paths = walk(args[0], int(args[1]), set(args[3:]))
        out.write(dumps(found).encode() + b'\n')
        budget = int(args[2])
        if len(found) > int(args[1]) or sum(e[2] for e in found if e[1] == 'file') > budget:
            return None
        written = 0
        for index, entry in enumerate(found):
            if entry[1] != 'file':
                continue
            header, data = read_one(paths[index], budget - written)
            header['i'] = index
            out.write(dumps(header).encode() + b'\n')
            if data is None:
                continue
            out.write(data)
            written += len(data)
        return None
    if op == 'readmany':
        # The paths (JSON on stdin) in order: a header line for each, then the content
        # when it is a regular file of at most args[0] bytes. Past args[1] bytes written,
        # the rest is left for another run ("later").
        limit, budget = int(args[0]), int(args[1])
        written = 0
        import json
        for path in json.loads(sys.stdin.buffer.read()):
            path = resolve(path)
            try:
                # Non-blocking (a FIFO cannot stall it) and not through a final symlink.
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY |
                             os.O_CLOEXEC)
            except (FileNotFoundError, NotADirectoryError):
                out.write(b'{"s":"missing"}\n')
                continue
            except OSError as e:
                # ELOOP: a symlink. ENXIO: a socket, or a FIFO without a writer.
                if e.errno in (errno.ELOOP, errno.ENXIO):
                    out.write(b'{"s":"notfile"}\n')
                else:
                    # This file's error, named by the caller; the rest is not read.
                    out.write(dumps({'s': 'error', 'errno': e.errno or 0}).encode() + b'\n')
                    return None
                continue
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    out.write(b'{"s":"notfile"}\n')
                    continue
                if st.st_size > limit:
                    out.write(dumps({'s': 'toolarge', 'n': st.st_size}).encode() + b'\n')
                    continue
                if written and written + st.st_size > budget:
                    out.write(b'{"s":"later"}\n')
                    return None
                chunks, got = [], 0
                try:
                    while got <= limit:
                        chunk = os.read(fd, min(1 << 20, limit + 1 - got))
                        if not chunk:
                            break
                        chunks.append(chunk)
                        got += len(chunk)
                except OSError as e:
                    out.write(dumps({'s': 'error', 'errno': e.errno or 0}).encode() + b'\n')
                    return None
                data = b''.join(chunks)
            finally:
                os.close(fd)
            if len(data) > limit:
                out.write(dumps({'s': 'toolarge', 'n': max(len(data), st.st_size)}).encode() + b'\n')
                continue
            out.write(dumps({'s': 'ok', 'n': len(data)}).encode() + b'\n')
            out.write(data)
            written += len(data)
        return None
    if op == 'write' or op == 'append':
        write(args[0], sys.stdin.buffer.read(), op == 'append')
        return True
    if op == 'puttree':
        put_tree(args[0], sys.stdin.buffer)
        return True
    if op == 'rename':
        os.rename(args[0], args[1])
        return True
    if op == 'remove':
        st = os.lstat(args[0])
        if stat.S_ISDIR(st.st_mode):
            if args[1] == '1':
                remove_tree(args[0])
            else:
                os.rmdir(args[0])
        else:
            os.unlink(args[0])
        return True
    if op == 'mkdir':
        if args[1] == '1':
            os.makedirs(args[0], exist_ok=True)
        else:
            os.mkdir(args[0])
        return True
    if op == 'mktemp':
        os.makedirs(TMP, exist_ok=True)
        import tempfile
        if args[0] == 'dir':
            return tempfile.mkdtemp(prefix=args[1], dir=TMP)
        fd, path = tempfile.mkstemp(prefix=args[1], dir=TMP)
        os.close(fd)
        return path
    raise OSError(22, 'unknown operation ' + op)


try:
    result = main(sys.argv[1], sys.argv[2:])
    if sys.argv[1] not in ('read', 'readmax', 'readmany', 'walkread'):
        sys.stdout.write(dumps(result))
    sys.stdout.flush()
except OSError as e:
    failed = {'errno': e.errno or 0, 'msg': e.strerror or str(e)}
    # The entry of a batch (below the path given) that failed.
    if getattr(e, 'entry', None) is not None:
        failed['entry'] = e.entry
    sys.stderr.write(dumps(failed))
    sys.exit(1)
