//! The spawner process's wire: a request is the plan, encoded, with its fds attached
//! (`SCM_RIGHTS`) and referred to by their index; the answer is init's pid with its
//! pidfd, or what failed. Pure encoding and the socket calls that carry fds; neither
//! side's logic.

use std::ffi::{CStr, CString};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use crate::child::{ChildFds, ChildPlan, Layout, MountOp};
use crate::landlock;

/// The first argument that makes this program the spawner process (see
/// [`main`](super::server::main)).
pub const SUBCOMMAND: &str = "__skillbox-spawner";

/// The most fds one request carries: the six pipe ends, the workspace's two trees,
/// the bind trees, the v2 cgroup and the v1 leaves to join (`SCM_MAX_FD` is 253).
pub(super) const MAX_FDS: usize = 6 + 2 + crate::child::MAX_BINDS + 1 + MAX_CGROUP_LEAVES;
/// A request's encoded plan may not be larger (argv and env are bounded far below).
pub(super) const MAX_REQUEST: usize = 64 << 20;
/// Linux's number of resource limits.
const RLIM_NLIMITS: usize = 16;
/// The kernel's limit on a seccomp filter's length.
const BPF_MAXINSNS: usize = 4096;
/// No field of the encoding uses this index: the field has no fd.
const NO_FD: u32 = u32::MAX;
/// An exec's cgroup v1 leaves: one per controller (memory, pids, cpu).
const MAX_CGROUP_LEAVES: usize = 3;
/// The byte the spawner process sends once it is ready for requests.
pub(super) const READY: u8 = 0x5b;
/// What failed, in an answer without a pid.
pub(super) const CLONE_FAILED: i32 = 1;
pub(super) const MALFORMED: i32 = 2;

/// An answer: init's pid (0 when none), what failed and its errno.
pub(super) fn reply(pid: i32, what: i32, errno: i32) -> [u8; 12] {
    let mut bytes = [0u8; 12];
    bytes[..4].copy_from_slice(&pid.to_le_bytes());
    bytes[4..8].copy_from_slice(&what.to_le_bytes());
    bytes[8..].copy_from_slice(&errno.to_le_bytes());
    bytes
}

/// Encodes `plan` (and the v2 cgroup to clone into); the fds travel beside the bytes,
/// referred to by their index.
pub(super) fn encode(plan: &ChildPlan, into: Option<RawFd>) -> (Vec<u8>, Vec<RawFd>) {
    let mut w = Writer::default();
    let ChildFds {
        sync,
        error,
        status,
        stdin,
        stdout,
        stderr,
    } = plan.fds;
    for fd in [sync, error, status, stdin, stdout, stderr] {
        w.fd(fd);
    }
    w.fd(into.unwrap_or(-1));
    w.bool(plan.clear_groups);
    w.cstr(&plan.cwd);
    w.cstrs(&plan.programs);
    w.cstrs(&plan.argv);
    w.cstrs(&plan.env);
    w.bool(plan.egress);
    w.bool(plan.late);
    w.fd(plan.workspace_tree);
    w.fd(plan.workspace_source);
    w.u32(plan.bind_trees.len() as u32);
    for &fd in &plan.bind_trees {
        w.fd(fd);
    }
    w.u32(plan.cgroup_join.len() as u32);
    for &fd in &plan.cgroup_join {
        w.fd(fd);
    }
    let layout = &*plan.layout;
    w.u32(layout.mounts.len() as u32);
    for op in &layout.mounts {
        match op {
            MountOp::Dir { path } => {
                w.u8(0);
                w.cstr(path);
            }
            MountOp::File { path } => {
                w.u8(1);
                w.cstr(path);
            }
            MountOp::Symlink { target, path } => {
                w.u8(2);
                w.cstr(target);
                w.cstr(path);
            }
            MountOp::Bind {
                source,
                target,
                attrs,
            } => {
                w.u8(3);
                w.cstr(source);
                w.cstr(target);
                w.u64(*attrs);
            }
            MountOp::Tmpfs { target, options } => {
                w.u8(4);
                w.cstr(target);
                w.cstr(options);
            }
            MountOp::Proc { target } => {
                w.u8(5);
                w.cstr(target);
            }
            MountOp::Devpts { target } => {
                w.u8(6);
                w.cstr(target);
            }
        }
    }
    w.cstr(&layout.root_options);
    w.cstrs(&layout.seal);
    w.cstr(&layout.hostname);
    w.u32(layout.rlimits.len() as u32);
    for &(resource, soft, hard) in &layout.rlimits {
        w.u32(resource);
        w.u64(soft);
        w.u64(hard);
    }
    let ll = &layout.landlock;
    w.u32(ll.abi);
    w.u64(ll.handled_fs);
    w.u64(ll.handled_net);
    w.u64(ll.scoped);
    w.u32(ll.rules.len() as u32);
    for rule in &ll.rules {
        w.cstr(&rule.path);
        w.u64(rule.access);
    }
    for ports in [&ll.bind_ports, &ll.connect_ports] {
        w.u32(ports.len() as u32);
        for &port in ports {
            w.u16(port);
        }
    }
    w.u32(layout.seccomp.len() as u32);
    for f in &layout.seccomp {
        w.u16(f.code);
        w.u8(f.jt);
        w.u8(f.jf);
        w.u32(f.k);
    }
    w.u64(layout.workspace_op as u64);
    (w.bytes, w.fds)
}

/// The plan of a request, its fds now this process's (its payload stack still empty);
/// and the cgroup fd, if any. `None` for anything malformed.
pub(super) fn decode(bytes: &[u8], fds: &[OwnedFd]) -> Option<(ChildPlan, Option<RawFd>)> {
    let mut r = Reader { bytes, fds };
    let pipe_fds = ChildFds {
        sync: r.fd()?,
        error: r.fd()?,
        status: r.fd()?,
        stdin: r.fd()?,
        stdout: r.fd()?,
        stderr: r.fd()?,
    };
    let into = Some(r.fd()?).filter(|fd| *fd >= 0);
    let clear_groups = r.bool()?;
    let cwd = r.cstr()?;
    let programs = r.cstrs()?;
    let argv = r.cstrs()?;
    let env = r.cstrs()?;
    let egress = r.bool()?;
    let late = r.bool()?;
    let workspace_tree = r.fd()?;
    let workspace_source = r.fd()?;
    let bind_trees = r.list(|r| r.fd())?;
    let cgroup_join = r.list(|r| r.fd())?;
    let mounts = r.list(|r| {
        Some(match r.u8()? {
            0 => MountOp::Dir { path: r.cstr()? },
            1 => MountOp::File { path: r.cstr()? },
            2 => MountOp::Symlink {
                target: r.cstr()?,
                path: r.cstr()?,
            },
            3 => MountOp::Bind {
                source: r.cstr()?,
                target: r.cstr()?,
                attrs: r.u64()?,
            },
            4 => MountOp::Tmpfs {
                target: r.cstr()?,
                options: r.cstr()?,
            },
            5 => MountOp::Proc { target: r.cstr()? },
            6 => MountOp::Devpts { target: r.cstr()? },
            _ => return None,
        })
    })?;
    let root_options = r.cstr()?;
    let seal = r.cstrs()?;
    let hostname = r.cstr()?;
    let rlimits = r.list(|r| Some((r.u32()?, r.u64()?, r.u64()?)))?;
    let landlock = landlock::Plan {
        abi: r.u32()?,
        handled_fs: r.u64()?,
        handled_net: r.u64()?,
        scoped: r.u64()?,
        rules: r.list(|r| {
            Some(landlock::Rule {
                path: r.cstr()?,
                access: r.u64()?,
            })
        })?,
        bind_ports: r.list(|r| r.u16())?,
        connect_ports: r.list(|r| r.u16())?,
    };
    let seccomp = r.list(|r| {
        Some(libc::sock_filter {
            code: r.u16()?,
            jt: r.u8()?,
            jf: r.u8()?,
            k: r.u32()?,
        })
    })?;
    let workspace_op = usize::try_from(r.u64()?).ok()?;
    // What init's fixed arrays and the kernel can hold, checked here as the sandbox
    // checks it before sending: argv and envp keep their terminating nulls, the filter
    // is not cut to a prefix, no bind tree is dropped.
    let fits = r.bytes.is_empty()
        && workspace_op < mounts.len().max(1)
        && programs.len() <= crate::child::MAX_PROGRAMS
        && argv.len() <= crate::child::MAX_ARGS
        && env.len() <= crate::child::MAX_ENV
        && bind_trees.len() <= crate::child::MAX_BINDS
        && cgroup_join.len() <= MAX_CGROUP_LEAVES
        && cgroup_join.iter().all(|fd| *fd >= 0)
        && rlimits.len() <= RLIM_NLIMITS
        && seccomp.len() <= BPF_MAXINSNS;
    if !fits {
        return None;
    }
    let plan = ChildPlan {
        layout: Arc::new(Layout {
            mounts,
            root_options,
            seal,
            hostname,
            rlimits,
            landlock,
            seccomp,
            workspace_op,
        }),
        clear_groups,
        cwd,
        programs,
        argv,
        env,
        fds: pipe_fds,
        // Given by the caller (see `main`), which keeps one stack (and one late
        // buffer) for every request.
        payload_stack: Vec::new(),
        late,
        late_buffer: Vec::new(),
        egress,
        workspace_tree,
        workspace_source,
        bind_trees,
        cgroup_join,
    };
    Some((plan, into))
}

#[derive(Default)]
struct Writer {
    bytes: Vec<u8>,
    fds: Vec<RawFd>,
}

impl Writer {
    fn u8(&mut self, v: u8) {
        self.bytes.push(v);
    }
    fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }
    fn u16(&mut self, v: u16) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    fn cstr(&mut self, s: &CStr) {
        self.u32(s.to_bytes().len() as u32);
        self.bytes.extend_from_slice(s.to_bytes());
    }
    fn cstrs(&mut self, list: &[CString]) {
        self.u32(list.len() as u32);
        for s in list {
            self.cstr(s);
        }
    }
    /// An fd by its index among the request's fds; a negative one as none.
    fn fd(&mut self, fd: RawFd) {
        if fd < 0 {
            self.u32(NO_FD);
        } else {
            self.u32(self.fds.len() as u32);
            self.fds.push(fd);
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    fds: &'a [OwnedFd],
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.bytes.split_first_chunk::<N>()?;
        self.bytes = rest;
        Some(*head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take::<1>()?[0])
    }
    fn bool(&mut self) -> Option<bool> {
        match self.u8()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }
    fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
    fn cstr(&mut self) -> Option<CString> {
        let len = usize::try_from(self.u32()?).ok()?;
        if len > self.bytes.len() {
            return None;
        }
        let (s, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        CString::new(s).ok()
    }
    fn cstrs(&mut self) -> Option<Vec<CString>> {
        self.list(Reader::cstr)
    }
    /// A counted list; the count cannot claim more items than bytes are left.
    fn list<T>(&mut self, mut item: impl FnMut(&mut Self) -> Option<T>) -> Option<Vec<T>> {
        let count = usize::try_from(self.u32()?).ok()?;
        if count > self.bytes.len() {
            return None;
        }
        (0..count).map(|_| item(self)).collect()
    }
    fn fd(&mut self) -> Option<RawFd> {
        match self.u32()? {
            NO_FD => Some(-1),
            i => Some(self.fds.get(usize::try_from(i).ok()?)?.as_raw_fd()),
        }
    }
}

/// Sends `bytes` with `fds` attached to their first byte.
pub(super) fn send_with_fds(socket: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut space = vec![0u8; cmsg_space(fds.len())];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain data; the pointers set below outlive the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = space.as_mut_ptr().cast();
        msg.msg_controllen = space.len();
        // SAFETY: the control buffer has room for one header with `fds.len()` fds.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(cmsg).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    // SAFETY: a sendmsg over our own socket with the message built above.
    let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let sent = sent as usize;
    if sent < bytes.len() {
        (&*socket).write_all(&bytes[sent..])?;
    }
    Ok(())
}

fn cmsg_space(fds: usize) -> usize {
    // SAFETY: CMSG_SPACE is arithmetic.
    unsafe { libc::CMSG_SPACE((fds * std::mem::size_of::<RawFd>()) as u32) as usize }
}

/// Reads exactly `buf.len()` bytes, keeping any fds that came with them (close-on-exec).
/// An end of stream before the first byte is `UnexpectedEof`.
pub(super) fn recv_with_fds(socket: &UnixStream, buf: &mut [u8]) -> io::Result<Vec<OwnedFd>> {
    let mut space = vec![0u8; cmsg_space(MAX_FDS)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; the pointers set below outlive the recvmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.as_mut_ptr().cast();
    msg.msg_controllen = space.len();
    let got = loop {
        // SAFETY: a recvmsg into the buffers above.
        let got = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if got >= 0 {
            break got as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel filled in; each SCM_RIGHTS fd is
    // ours to own from here.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let count =
                    ((*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other("too many fds in one message"));
    }
    if got == 0 && !buf.is_empty() {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    (&*socket).read_exact(&mut buf[got..])?;
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(fds: [RawFd; 4]) -> ChildPlan {
        let c = |s: &str| CString::new(s).unwrap();
        ChildPlan {
            layout: Arc::new(Layout {
                mounts: vec![
                    MountOp::Dir {
                        path: c("/tmp/usr"),
                    },
                    MountOp::File {
                        path: c("/tmp/etc/hosts"),
                    },
                    MountOp::Symlink {
                        target: c("usr/bin"),
                        path: c("/tmp/bin"),
                    },
                    MountOp::Bind {
                        source: c("/usr"),
                        target: c("/tmp/usr"),
                        attrs: 0xf,
                    },
                    MountOp::Tmpfs {
                        target: c("/tmp/tmp"),
                        options: c("size=1m"),
                    },
                    MountOp::Proc {
                        target: c("/tmp/proc"),
                    },
                    MountOp::Devpts {
                        target: c("/tmp/dev/pts"),
                    },
                ],
                root_options: c("mode=0755"),
                seal: vec![c("/"), c("/etc")],
                hostname: c("sandbox"),
                rlimits: vec![(libc::RLIMIT_CORE, 0, 0), (libc::RLIMIT_NOFILE, 64, 128)],
                landlock: landlock::Plan {
                    abi: 7,
                    handled_fs: 0x7fff,
                    handled_net: 3,
                    scoped: 3,
                    rules: vec![landlock::Rule {
                        path: c("/workspace"),
                        access: 0x1ff,
                    }],
                    bind_ports: vec![8000, 65535],
                    connect_ports: vec![3128],
                },
                seccomp: vec![
                    libc::sock_filter {
                        code: 0x20,
                        jt: 0,
                        jf: 0,
                        k: 4,
                    },
                    libc::sock_filter {
                        code: 0x15,
                        jt: 1,
                        jf: 255,
                        k: 0xc000_003e,
                    },
                ],
                workspace_op: 3,
            }),
            clear_groups: true,
            cwd: c("/workspace"),
            programs: vec![c("/usr/bin/node"), c("/bin/node")],
            argv: vec![c("node"), c("-e"), c("0"), c("")],
            env: vec![c("HOME=/workspace")],
            fds: ChildFds {
                sync: fds[0],
                error: fds[1],
                status: fds[2],
                stdin: fds[3],
                stdout: fds[0],
                stderr: fds[1],
            },
            payload_stack: Vec::new(),
            late: true,
            late_buffer: Vec::new(),
            egress: true,
            workspace_tree: -1,
            workspace_source: fds[2],
            bind_trees: vec![-1, fds[3]],
            cgroup_join: vec![fds[1], fds[2]],
        }
    }

    #[test]
    fn a_plan_crosses_the_socket_whole_with_its_fds() {
        // Four different files, so that each fd received can be told apart.
        let files: Vec<OwnedFd> = ["/dev/null", "/dev/zero", "/dev/full", "/dev/urandom"]
            .into_iter()
            .map(|path| std::fs::File::open(path).unwrap().into())
            .collect();
        let raw: Vec<RawFd> = files.iter().map(AsRawFd::as_raw_fd).collect();
        let sent = plan([raw[0], raw[1], raw[2], raw[3]]);
        let (body, fds) = encode(&sent, Some(raw[3]));
        assert_eq!(
            fds.len(),
            11,
            "six pipe ends, the cgroup, the source, one tree and two cgroup leaves to join"
        );

        let (a, b) = UnixStream::pair().unwrap();
        send_with_fds(&a, &(body.len() as u32).to_le_bytes(), &fds).unwrap();
        (&a).write_all(&body).unwrap();
        let mut header = [0u8; 4];
        let got = recv_with_fds(&b, &mut header).unwrap();
        let mut bytes = vec![0u8; u32::from_le_bytes(header) as usize];
        (&b).read_exact(&mut bytes).unwrap();
        assert_eq!(got.len(), 11);
        // Each received fd is a new fd for the same open file as the one sent.
        let inode = |fd: RawFd| {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(format!("/proc/self/fd/{fd}")).unwrap();
            (meta.dev(), meta.ino())
        };
        let (plan_b, into) = decode(&bytes, &got).unwrap();
        let theirs = |i: usize| got[i].as_raw_fd();
        // Ours were sent in order: sync, error, status, stdin, stdout, stderr, cgroup,
        // the workspace source, the one bind tree, the two leaves to join.
        assert_eq!(plan_b.fds.sync, theirs(0));
        assert_eq!(plan_b.fds.stderr, theirs(5));
        assert_eq!(into, Some(theirs(6)));
        assert_eq!(plan_b.workspace_tree, -1);
        assert_eq!(plan_b.workspace_source, theirs(7));
        assert_eq!(plan_b.bind_trees, vec![-1, theirs(8)]);
        assert_eq!(plan_b.cgroup_join, vec![theirs(9), theirs(10)]);
        assert_eq!(inode(plan_b.cgroup_join[1]), inode(raw[2]));
        assert_eq!(inode(plan_b.fds.stdin), inode(raw[3]));
        assert_eq!(inode(plan_b.fds.error), inode(raw[1]));
        assert_eq!(inode(plan_b.workspace_source), inode(raw[2]));
        assert_ne!(inode(plan_b.fds.sync), inode(raw[1]));
        // Everything else is the same, field by field.
        assert_eq!(format!("{:?}", plan_b.layout), format!("{:?}", sent.layout));
        assert_eq!(
            (&plan_b.cwd, &plan_b.programs, &plan_b.argv, &plan_b.env),
            (&sent.cwd, &sent.programs, &sent.argv, &sent.env)
        );
        assert!(
            plan_b.payload_stack.is_empty(),
            "the spawner process has its own"
        );
        assert!(plan_b.clear_groups && plan_b.egress && plan_b.late);
        assert!(
            plan_b.late_buffer.is_empty(),
            "the spawner process has its own"
        );
    }

    #[test]
    fn a_malformed_plan_is_refused_not_guessed() {
        let files: Vec<OwnedFd> = (0..4)
            .map(|_| std::fs::File::open("/dev/null").unwrap().into())
            .collect();
        let raw: Vec<RawFd> = files.iter().map(AsRawFd::as_raw_fd).collect();
        let (body, fds) = encode(&plan([raw[0], raw[1], raw[2], raw[3]]), None);
        // What the spawner process would receive for an encoding's fds.
        let received = |fds: &[RawFd]| -> Vec<OwnedFd> {
            fds.iter()
                .map(|&fd| {
                    let file = files.iter().find(|f| f.as_raw_fd() == fd).unwrap();
                    file.try_clone().unwrap()
                })
                .collect()
        };
        let owned = received(&fds);
        assert!(decode(&body, &owned).is_some());
        // Cut anywhere, or with a byte too many: refused.
        for cut in [0, 1, 4, body.len() / 2, body.len() - 1] {
            assert!(decode(&body[..cut], &owned).is_none(), "cut at {cut}");
        }
        let mut longer = body.clone();
        longer.push(0);
        assert!(decode(&longer, &owned).is_none());
        // More arguments than init's argv array holds with its null: refused.
        let mut many = plan([raw[0], raw[1], raw[2], raw[3]]);
        many.argv = vec![CString::new("x").unwrap(); crate::child::MAX_ARGS + 1];
        let (body_many, _) = encode(&many, None);
        assert!(decode(&body_many, &owned).is_none());
        many.argv.pop();
        let (body_many, _) = encode(&many, None);
        assert!(decode(&body_many, &owned).is_some());
        // A cgroup leaf to join without its file, or more leaves than controllers:
        // refused (init would write to whatever that fd turned out to be).
        let mut leaves = plan([raw[0], raw[1], raw[2], raw[3]]);
        leaves.cgroup_join = vec![raw[1], -1];
        let (body_leaves, _) = encode(&leaves, None);
        assert!(decode(&body_leaves, &owned).is_none());
        leaves.cgroup_join = vec![raw[1]; MAX_CGROUP_LEAVES + 1];
        let (body_leaves, fds_leaves) = encode(&leaves, None);
        let owned_leaves = received(&fds_leaves);
        assert!(decode(&body_leaves, &owned_leaves).is_none());
        leaves.cgroup_join.truncate(MAX_CGROUP_LEAVES);
        let (body_leaves, fds_leaves) = encode(&leaves, None);
        assert!(decode(&body_leaves, &owned_leaves[..fds_leaves.len()]).is_some());
        // An fd index past the fds that came: refused.
        assert!(decode(&body, &owned[..owned.len() - 1]).is_none());
        // A list that claims more items than bytes are left: refused before allocating.
        let mut huge = body.clone();
        let programs_at = 7 * 4 + 1 + 4 + "/workspace".len();
        huge[programs_at..programs_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge, &owned).is_none());
    }
}
