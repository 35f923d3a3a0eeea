//! skillbox's seccomp policy: a deny list compiled once to classic BPF. It stops the
//! syscalls that widen the kernel's attack surface or would undo the other layers
//! (namespaces, mounts, tracing). Every backend that runs code on the host's kernel
//! installs this one filter: `native` in the sandbox's init before it forks the
//! payload, `docker` in its exec wrapper on top of Docker's own profile (from
//! [`filter_bytes`]).
//!
//! The policy is data: `rules()` names the rule for each syscall number, each rule's
//! reason is written beside it, and the tests run the compiled filter for every
//! syscall number against the rules restated plainly.

use libc::{
    BPF_ABS, BPF_ALU, BPF_AND, BPF_JA, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_RET,
    BPF_W, sock_filter,
};

/// `struct seccomp_data` offsets.
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
/// Low 32 bits of args[0] / args[1] (little-endian).
const OFFSET_ARG0_LO: u32 = 16;
const OFFSET_ARG1_LO: u32 = 24;
const OFFSET_ARG2_LO: u32 = 32;
const OFFSET_ARG3_LO: u32 = 40;
/// S_ISUID | S_ISGID.
const SETID_BITS: u32 = 0o6000;
/// fchmodat2 (Linux 6.6), the same number on x86_64 and aarch64.
const SYS_FCHMODAT2: i64 = 452;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_NATIVE: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH_NATIVE: u32 = 0xc000_00b7;
/// x32 syscalls carry this bit in their number while reporting the x86_64 arch.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const RET_KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
const RET_EPERM: u32 = libc::SECCOMP_RET_ERRNO | (libc::EPERM as u32);
const RET_EAFNOSUPPORT: u32 = libc::SECCOMP_RET_ERRNO | (libc::EAFNOSUPPORT as u32);
const RET_EPROTONOSUPPORT: u32 = libc::SECCOMP_RET_ERRNO | (libc::EPROTONOSUPPORT as u32);
const RET_ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | (libc::ENOSYS as u32);

/// Namespace flags that `clone(2)` may not carry (CLONE_NEWTIME is clone3-only).
const CLONE_NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;

const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541c;
const TIOCSETD: u32 = 0x5423;

/// `socket(2)` takes the type's flags (SOCK_NONBLOCK, SOCK_CLOEXEC) in the same word;
/// the kernel keeps the type in these bits.
const SOCK_TYPE_MASK: u32 = 0xf;

/// `personality(2)`: the plain Linux persona, and the value that only asks for the
/// current one.
const PER_LINUX: u32 = 0;
const PERSONALITY_QUERY: u32 = 0xffff_ffff;

/// Syscalls refused outright with EPERM.
fn denied_syscalls() -> Vec<i64> {
    let mut nrs = vec![
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_chroot,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_mount_setattr,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_reboot,
        libc::SYS_acct,
        libc::SYS_quotactl,
        libc::SYS_syslog,
        libc::SYS_vhangup,
        libc::SYS_pidfd_getfd,
    ];
    #[cfg(target_arch = "x86_64")]
    nrs.extend([libc::SYS_iopl, libc::SYS_ioperm, libc::SYS_uselib]);
    nrs
}

fn stmt(code: u32, k: u32) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The filter as the bytes of a `struct sock_filter` array (native byte order), for a
/// loader outside this process (the docker backend's exec wrapper).
pub fn filter_bytes() -> Vec<u8> {
    let mut bytes = Vec::new();
    for insn in filter() {
        bytes.extend_from_slice(&insn.code.to_ne_bytes());
        bytes.push(insn.jt);
        bytes.push(insn.jf);
        bytes.extend_from_slice(&insn.k.to_ne_bytes());
    }
    bytes
}

/// The compiled filter. Build it once per process; installing it is one prctl.
pub fn filter() -> Vec<sock_filter> {
    let mut prog = vec![
        // Only the native ABI: i386 (int 0x80) and others kill the process.
        stmt(BPF_LD | BPF_W | BPF_ABS, OFFSET_ARCH),
        jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_NATIVE, 1, 0),
        stmt(BPF_RET | BPF_K, RET_KILL),
        stmt(BPF_LD | BPF_W | BPF_ABS, OFFSET_NR),
    ];
    #[cfg(target_arch = "x86_64")]
    {
        prog.push(jump(BPF_JMP | BPF_JGE | BPF_K, X32_SYSCALL_BIT, 0, 1));
        prog.push(stmt(BPF_RET | BPF_K, RET_KILL));
    }
    // The syscall number is dispatched through a binary search over the numbers that
    // have a rule, not a chain of comparisons: a few steps for any syscall, and the
    // kernel's per-syscall verdict cache, which runs the filter for every number when
    // it is installed, gets there quickly.
    let mut asm = Asm::default();
    let entries: Vec<(u32, Block)> = rules().into_iter().collect();
    asm.tree(&entries);
    for block in [
        Block::Allow,
        Block::Eperm,
        Block::Enosys,
        Block::Socket,
        Block::Clone,
        Block::Ioctl,
        Block::Personality,
    ]
    .into_iter()
    .chain(
        entries
            .iter()
            .filter_map(|(_, b)| matches!(b, Block::Mode(_)).then_some(*b)),
    ) {
        asm.block(block);
    }
    prog.extend(asm.finish());
    prog
}

/// What a syscall number is sent to; every other number is allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Block {
    Allow,
    /// Refused outright.
    Eperm,
    /// "Not implemented": libc falls back to a call whose arguments BPF can read.
    Enosys,
    /// Sockets only of the families a script may need: unix, IPv4/6 (which the empty
    /// network namespace confines) and netlink (interface lists). Not vsock, which is
    /// not namespaced and can reach a hypervisor, nor packet, bluetooth, can and the rest.
    ///
    /// Inside IPv4/6, only TCP and UDP (type stream or datagram, protocol 0 or the one
    /// named): a socket of another protocol makes the kernel load that protocol's module
    /// if it can (SCTP, DCCP and the rest, on the host's kernel even from a container),
    /// and those modules have been the way in for several local root bugs. MPTCP and
    /// UDP-Lite are built in but new surface nothing here needs. ICMP "ping" sockets
    /// are refused too: the only address a sandbox could ping is its own loopback, and
    /// ping sockets have had their own local root bug (CVE-2015-3636). Raw sockets
    /// need a capability the sandbox does not have, and are refused here as well.
    ///
    /// Inside netlink, only NETLINK_ROUTE: what getifaddrs (glibc, Node's
    /// `os.networkInterfaces`), getaddrinfo's address checks and `ip` use. Generic
    /// netlink loads family modules by name, and audit, uevent, xfrm, netfilter and
    /// the rest are kernel interfaces a script has no use for.
    ///
    /// A refused protocol answers EPROTONOSUPPORT, as a kernel without it would, so
    /// programs that probe (Go's MPTCP listeners) fall back to TCP.
    Socket,
    /// A call that sets a file mode, whose mode (the low word at this offset) may not
    /// carry setuid/setgid bits: whatever the sandbox writes may be run later on the
    /// host by someone else.
    Mode(u32),
    /// clone(2) with any namespace flag.
    Clone,
    /// ioctl(TIOCSTI / TIOCLINUX / TIOCSETD). TIOCSTI pushes input into a terminal,
    /// TIOCLINUX reaches the console; TIOCSETD changes a terminal's line discipline,
    /// which loads that discipline's module (n_gsm, n_hdlc: several local root bugs)
    /// on a kernel that autoloads them, from the sandbox's own pty. The kernel takes
    /// the request as 32 bits, so only the low word is compared: setting high bits
    /// must not slip past.
    Ioctl,
    /// personality(2) only for the plain Linux persona or to ask for the current one.
    /// Its flags switch off mitigations for the calling process (ASLR with
    /// ADDR_NO_RANDOMIZE, non-executable data with READ_IMPLIES_EXEC, the unmapped
    /// page zero with MMAP_PAGE_ZERO), which helps turn a kernel bug into an exploit;
    /// the other personas are for binaries of other systems. Nothing a script runs
    /// needs them. Compared on the low 32 bits, which is what the kernel reads.
    Personality,
}

/// Each syscall number with a rule, and its rule (the first one given wins).
fn rules() -> std::collections::BTreeMap<u32, Block> {
    let mut rules = std::collections::BTreeMap::new();
    let mut add = |nr: i64, block: Block| {
        rules.entry(nr as u32).or_insert(block);
    };
    for nr in denied_syscalls() {
        add(nr, Block::Eperm);
    }
    add(libc::SYS_socket, Block::Socket);
    add(libc::SYS_socketpair, Block::Socket);
    add(libc::SYS_fchmod, Block::Mode(OFFSET_ARG1_LO));
    add(libc::SYS_fchmodat, Block::Mode(OFFSET_ARG2_LO));
    add(SYS_FCHMODAT2, Block::Mode(OFFSET_ARG2_LO));
    add(libc::SYS_openat, Block::Mode(OFFSET_ARG3_LO));
    add(libc::SYS_mknodat, Block::Mode(OFFSET_ARG2_LO));
    #[cfg(target_arch = "x86_64")]
    {
        add(libc::SYS_chmod, Block::Mode(OFFSET_ARG1_LO));
        add(libc::SYS_open, Block::Mode(OFFSET_ARG2_LO));
        add(libc::SYS_creat, Block::Mode(OFFSET_ARG1_LO));
        add(libc::SYS_mknod, Block::Mode(OFFSET_ARG1_LO));
    }
    // openat2 hides its mode behind a pointer, and clone3 its flags: make libc fall
    // back to openat and clone(2), whose arguments BPF can check.
    add(libc::SYS_openat2, Block::Enosys);
    add(libc::SYS_clone3, Block::Enosys);
    add(libc::SYS_clone, Block::Clone);
    add(libc::SYS_ioctl, Block::Ioctl);
    add(libc::SYS_personality, Block::Personality);
    rules
}

/// Where a jump goes, resolved when the program is finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Block(Block),
    /// An instruction index in the dispatch tree.
    At(usize),
}

/// A small assembler for the dispatch: instructions plus the jumps still to resolve.
#[derive(Default)]
struct Asm {
    prog: Vec<sock_filter>,
    /// (instruction, target): a `JA` (32-bit offset) or a conditional's `jt` (8-bit).
    fixups: Vec<(usize, Target)>,
    blocks: Vec<(Block, usize)>,
    /// Tree positions not yet known: (label id, instruction index once placed).
    places: Vec<Option<usize>>,
}

impl Asm {
    fn push(&mut self, insn: sock_filter) -> usize {
        self.prog.push(insn);
        self.prog.len() - 1
    }

    /// A binary search over `entries` (sorted by number); the accumulator holds the
    /// syscall number.
    fn tree(&mut self, entries: &[(u32, Block)]) {
        if entries.len() <= 3 {
            for &(nr, block) in entries {
                self.push(jump(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1));
                let at = self.push(stmt(BPF_JMP | BPF_JA, 0));
                self.fixups.push((at, Target::Block(block)));
            }
            let at = self.push(stmt(BPF_JMP | BPF_JA, 0));
            self.fixups.push((at, Target::Block(Block::Allow)));
            return;
        }
        let (low, high) = entries.split_at(entries.len() / 2);
        let label = self.places.len();
        self.places.push(None);
        let at = self.push(jump(BPF_JMP | BPF_JGE | BPF_K, high[0].0, 0, 0));
        self.fixups.push((at, Target::At(label)));
        self.tree(low);
        self.places[label] = Some(self.prog.len());
        self.tree(high);
    }

    fn block(&mut self, block: Block) {
        if self.blocks.iter().any(|(b, _)| *b == block) {
            return;
        }
        self.blocks.push((block, self.prog.len()));
        use Step::{And, At, IfAny, IfEq, Load, Return};
        let steps: Vec<Step> = match block {
            Block::Allow => vec![Return(RET_ALLOW)],
            Block::Eperm => vec![Return(RET_EPERM)],
            Block::Enosys => vec![Return(RET_ENOSYS)],
            Block::Socket => vec![
                Load(OFFSET_ARG0_LO),
                IfEq(libc::AF_UNIX as u32, "allow"),
                IfEq(libc::AF_INET as u32, "inet"),
                IfEq(libc::AF_INET6 as u32, "inet"),
                IfEq(libc::AF_NETLINK as u32, "netlink"),
                Return(RET_EAFNOSUPPORT),
                At("inet"),
                Load(OFFSET_ARG1_LO),
                And(SOCK_TYPE_MASK),
                IfEq(libc::SOCK_STREAM as u32, "stream"),
                IfEq(libc::SOCK_DGRAM as u32, "datagram"),
                Return(RET_EPROTONOSUPPORT),
                At("stream"),
                Load(OFFSET_ARG2_LO),
                IfEq(0, "allow"),
                IfEq(libc::IPPROTO_TCP as u32, "allow"),
                Return(RET_EPROTONOSUPPORT),
                At("datagram"),
                Load(OFFSET_ARG2_LO),
                IfEq(0, "allow"),
                IfEq(libc::IPPROTO_UDP as u32, "allow"),
                Return(RET_EPROTONOSUPPORT),
                At("netlink"),
                Load(OFFSET_ARG2_LO),
                IfEq(libc::NETLINK_ROUTE as u32, "allow"),
                Return(RET_EPROTONOSUPPORT),
                At("allow"),
                Return(RET_ALLOW),
            ],
            Block::Mode(offset) => vec![
                Load(offset),
                IfAny(SETID_BITS, "deny"),
                Return(RET_ALLOW),
                At("deny"),
                Return(RET_EPERM),
            ],
            Block::Clone => vec![
                Load(OFFSET_ARG0_LO),
                IfAny(CLONE_NAMESPACE_FLAGS, "deny"),
                Return(RET_ALLOW),
                At("deny"),
                Return(RET_EPERM),
            ],
            Block::Ioctl => vec![
                Load(OFFSET_ARG1_LO),
                IfEq(TIOCSTI, "deny"),
                IfEq(TIOCLINUX, "deny"),
                IfEq(TIOCSETD, "deny"),
                Return(RET_ALLOW),
                At("deny"),
                Return(RET_EPERM),
            ],
            Block::Personality => vec![
                Load(OFFSET_ARG0_LO),
                IfEq(PER_LINUX, "allow"),
                IfEq(PERSONALITY_QUERY, "allow"),
                Return(RET_EPERM),
                At("allow"),
                Return(RET_ALLOW),
            ],
        };
        self.prog.extend(assemble(&steps));
    }

    /// Resolves every jump (all forward: BPF has no other kind).
    fn finish(mut self) -> Vec<sock_filter> {
        for (at, target) in std::mem::take(&mut self.fixups) {
            let to = match target {
                Target::Block(block) => self
                    .blocks
                    .iter()
                    .find(|(b, _)| *b == block)
                    .map(|(_, start)| *start),
                Target::At(label) => self.places[label],
            };
            // Every target is emitted after its jump by construction; the tests check
            // the result.
            let offset = to.unwrap_or(at + 1).saturating_sub(at + 1);
            let insn = &mut self.prog[at];
            debug_assert!(to.is_some_and(|to| to > at), "a jump that is not forward");
            if u32::from(insn.code) == BPF_JMP | BPF_JA {
                insn.k = offset as u32;
            } else {
                debug_assert!(offset <= usize::from(u8::MAX), "a conditional jump too far");
                insn.jt = u8::try_from(offset).unwrap_or(u8::MAX);
            }
        }
        self.prog
    }
}

/// One step of a rule's block. A block is written as these, with named places to
/// jump to, so that it reads like the rule it carries out.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Load the 32-bit word at this offset of `struct seccomp_data`.
    Load(u32),
    /// Keep only these bits of the loaded word.
    And(u32),
    /// Jump to the place when the word equals the value; else go on.
    IfEq(u32, &'static str),
    /// Jump to the place when the word has any of these bits; else go on.
    IfAny(u32, &'static str),
    Return(u32),
    /// A place to jump to: the next step.
    At(&'static str),
}

/// The instructions of a block. Every jump goes forward to a place of the same block
/// (BPF has no other kind), at most 255 instructions on.
fn assemble(steps: &[Step]) -> Vec<sock_filter> {
    // Where each place is, counting instructions (places take none).
    let mut places = Vec::new();
    let mut at = 0usize;
    for step in steps {
        match step {
            Step::At(name) => places.push((*name, at)),
            _ => at += 1,
        }
    }
    let place = |name: &str, from: usize| -> u8 {
        let to = places
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(from + 1, |(_, to)| *to);
        debug_assert!(to > from, "a jump to {name} that is not forward");
        u8::try_from(to.saturating_sub(from + 1)).unwrap_or(u8::MAX)
    };
    let mut prog = Vec::new();
    for step in steps {
        let here = prog.len();
        match *step {
            Step::Load(offset) => prog.push(stmt(BPF_LD | BPF_W | BPF_ABS, offset)),
            Step::And(bits) => prog.push(stmt(BPF_ALU | BPF_AND | BPF_K, bits)),
            Step::IfEq(value, to) => {
                prog.push(jump(BPF_JMP | BPF_JEQ | BPF_K, value, place(to, here), 0));
            }
            Step::IfAny(bits, to) => {
                prog.push(jump(BPF_JMP | BPF_JSET | BPF_K, bits, place(to, here), 0));
            }
            Step::Return(value) => prog.push(stmt(BPF_RET | BPF_K, value)),
            Step::At(_) => {}
        }
    }
    prog
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_jump_lands_inside_the_program() {
        let prog = filter();
        for (i, ins) in prog.iter().enumerate() {
            let code = u32::from(ins.code);
            if code & 0x07 != BPF_JMP {
                continue;
            }
            if code == BPF_JMP | BPF_JA {
                assert!(
                    i + 1 + (ins.k as usize) < prog.len(),
                    "ja out of range at {i}"
                );
            } else {
                assert!(
                    i + 1 + usize::from(ins.jt) < prog.len(),
                    "jt out of range at {i}"
                );
                assert!(
                    i + 1 + usize::from(ins.jf) < prog.len(),
                    "jf out of range at {i}"
                );
            }
        }
        assert!(
            prog.len() < 4096,
            "BPF programs are limited to 4096 instructions"
        );
    }

    /// Runs `prog` on one `struct seccomp_data` as the kernel would (the subset of
    /// classic BPF the filter uses; anything else fails the test).
    fn run(prog: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        run_counting(prog, arch, nr, args).0
    }

    /// The verdict, and how many instructions it took.
    fn run_counting(prog: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> (u32, usize) {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, arg) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&arg.to_ne_bytes());
        }
        let (mut pc, mut a, mut steps) = (0usize, 0u32, 0);
        loop {
            steps += 1;
            assert!(steps < 4096, "the filter loops");
            let ins = prog[pc];
            let code = u32::from(ins.code);
            pc += 1;
            match code {
                c if c == BPF_LD | BPF_W | BPF_ABS => {
                    let at = ins.k as usize;
                    a = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
                }
                c if c == BPF_ALU | BPF_AND | BPF_K => a &= ins.k,
                c if c == BPF_RET | BPF_K => return (ins.k, steps),
                c if c == BPF_JMP | BPF_JA => pc += ins.k as usize,
                c => {
                    let taken = match c {
                        c if c == BPF_JMP | BPF_JEQ | BPF_K => a == ins.k,
                        c if c == BPF_JMP | BPF_JGE | BPF_K => a >= ins.k,
                        c if c == BPF_JMP | BPF_JSET | BPF_K => a & ins.k != 0,
                        other => panic!("unexpected BPF opcode {other:#x} at {}", pc - 1),
                    };
                    pc += usize::from(if taken { ins.jt } else { ins.jf });
                }
            }
        }
    }

    /// What the filter must answer, written out plainly from the rules.
    fn expected(nr: u32, args: [u64; 6]) -> u32 {
        let lo = |i: usize| args[i] as u32;
        #[cfg(target_arch = "x86_64")]
        if nr & X32_SYSCALL_BIT != 0 {
            return RET_KILL;
        }
        let nr = i64::from(nr);
        // Built once: this runs for a million argument sets.
        static DENIED: std::sync::OnceLock<Vec<i64>> = std::sync::OnceLock::new();
        if DENIED.get_or_init(denied_syscalls).contains(&nr) {
            return RET_EPERM;
        }
        if nr == libc::SYS_socket || nr == libc::SYS_socketpair {
            let (family, kind, protocol) = (lo(0) as i32, lo(1) as i32 & 0xf, lo(2) as i32);
            return match family {
                libc::AF_UNIX => RET_ALLOW,
                libc::AF_INET | libc::AF_INET6 => match (kind, protocol) {
                    (libc::SOCK_STREAM, 0 | libc::IPPROTO_TCP) => RET_ALLOW,
                    (libc::SOCK_DGRAM, 0 | libc::IPPROTO_UDP) => RET_ALLOW,
                    _ => RET_EPROTONOSUPPORT,
                },
                libc::AF_NETLINK if protocol == libc::NETLINK_ROUTE => RET_ALLOW,
                libc::AF_NETLINK => RET_EPROTONOSUPPORT,
                _ => RET_EAFNOSUPPORT,
            };
        }
        if nr == libc::SYS_personality {
            return if lo(0) == 0 || lo(0) == 0xffff_ffff {
                RET_ALLOW
            } else {
                RET_EPERM
            };
        }
        let mode_arg: &[(i64, usize)] = &[
            (libc::SYS_fchmod, 1),
            (libc::SYS_fchmodat, 2),
            (SYS_FCHMODAT2, 2),
            (libc::SYS_openat, 3),
            (libc::SYS_mknodat, 2),
            #[cfg(target_arch = "x86_64")]
            (libc::SYS_chmod, 1),
            #[cfg(target_arch = "x86_64")]
            (libc::SYS_open, 2),
            #[cfg(target_arch = "x86_64")]
            (libc::SYS_creat, 1),
            #[cfg(target_arch = "x86_64")]
            (libc::SYS_mknod, 1),
        ];
        if let Some(&(_, arg)) = mode_arg.iter().find(|(n, _)| *n == nr) {
            return if lo(arg) & SETID_BITS != 0 {
                RET_EPERM
            } else {
                RET_ALLOW
            };
        }
        if nr == libc::SYS_openat2 || nr == libc::SYS_clone3 {
            return RET_ENOSYS;
        }
        if nr == libc::SYS_clone {
            return if lo(0) & CLONE_NAMESPACE_FLAGS != 0 {
                RET_EPERM
            } else {
                RET_ALLOW
            };
        }
        if nr == libc::SYS_ioctl && [0x5412, 0x541c, 0x5423].contains(&lo(1)) {
            // TIOCSTI, TIOCLINUX, TIOCSETD
            return RET_EPERM;
        }
        RET_ALLOW
    }

    #[test]
    fn every_syscall_gets_its_rule() {
        let prog = filter();
        let high = 0xffff_ffff_0000_0000u64;
        let arg_sets: Vec<[u64; 6]> = vec![
            [0; 6],
            [libc::AF_VSOCK as u64, 0o4755, 0o6755, 0o2755, 0, 0],
            [libc::AF_UNIX as u64, TIOCSTI.into(), 0o644, 0o644, 0, 0],
            [
                libc::AF_INET6 as u64 | high,
                u64::from(TIOCLINUX) | high,
                0,
                0o4000,
                0,
                0,
            ],
            [libc::AF_NETLINK as u64, 0x5413, 0o755, 0o755, 0, 0],
            [0, u64::from(TIOCSETD), 0, 0, 0, 0],
            [high, u64::from(TIOCSETD) | high, 0, 0, 0, 0],
            [u64::from(PERSONALITY_QUERY) | high, 0x5423 + 1, 0, 0, 0, 0],
            [8, 0, 0, 0, 0, 0], // PER_LINUX32
            [libc::AF_PACKET as u64, 0, 0, 0, 0, 0],
            [(libc::CLONE_NEWUSER | libc::SIGCHLD) as u64, 0, 0, 0, 0, 0],
            [
                (libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD) as u64,
                0,
                0,
                0,
                0,
                0,
            ],
            [libc::CLONE_NEWNET as u64, 0, 0, 0, 0, 0],
        ];
        // Every socket family, type and protocol worth telling apart (with the flags
        // and high bits a caller may set), each also read as the arguments of every
        // other syscall: personality's persona in arg 0, an ioctl's request in arg 1.
        let families = [
            libc::AF_UNIX as u64,
            libc::AF_INET as u64,
            libc::AF_INET6 as u64,
            libc::AF_NETLINK as u64,
            libc::AF_PACKET as u64,
            libc::AF_VSOCK as u64,
            libc::AF_INET as u64 | high,
            u64::from(PERSONALITY_QUERY),
            libc::READ_IMPLIES_EXEC as u64,
            libc::ADDR_NO_RANDOMIZE as u64,
        ];
        let types = [
            libc::SOCK_STREAM as u64,
            libc::SOCK_DGRAM as u64,
            libc::SOCK_RAW as u64,
            libc::SOCK_SEQPACKET as u64,
            6, // SOCK_DCCP
            (libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) as u64,
            (libc::SOCK_DGRAM | libc::SOCK_CLOEXEC) as u64,
            (libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK) as u64,
            libc::SOCK_STREAM as u64 | high,
            u64::from(TIOCSETD) | high,
        ];
        let protocols = [
            0,
            libc::IPPROTO_TCP as u64,
            libc::IPPROTO_UDP as u64,
            libc::IPPROTO_ICMP as u64,
            libc::IPPROTO_ICMPV6 as u64,
            libc::IPPROTO_SCTP as u64,
            libc::IPPROTO_DCCP as u64,
            libc::IPPROTO_UDPLITE as u64,
            libc::IPPROTO_MPTCP as u64,
            libc::NETLINK_GENERIC as u64,
            libc::NETLINK_AUDIT as u64,
            libc::NETLINK_KOBJECT_UEVENT as u64,
            libc::IPPROTO_TCP as u64 | high,
            high,
        ];
        let mut arg_sets = arg_sets;
        for family in families {
            for kind in types {
                for protocol in protocols {
                    arg_sets.push([family, kind, protocol, 0, 0, 0]);
                }
            }
        }
        let mut numbers: Vec<u32> = (0..1024).collect();
        #[cfg(target_arch = "x86_64")]
        numbers.extend([
            X32_SYSCALL_BIT,
            X32_SYSCALL_BIT | 1,
            X32_SYSCALL_BIT | 101,
            u32::MAX,
        ]);
        for nr in numbers {
            for args in &arg_sets {
                assert_eq!(
                    run(&prog, AUDIT_ARCH_NATIVE, nr, *args),
                    expected(nr, *args),
                    "syscall {nr} with {args:x?}"
                );
            }
        }
        // Another ABI is killed whatever it asks.
        assert_eq!(run(&prog, 0x4000_0003, 1, [0; 6]), RET_KILL);
    }

    #[test]
    fn the_dispatch_takes_a_few_steps_not_a_chain() {
        // The kernel's verdict cache runs the filter for every syscall number when it
        // is installed, and a checked call (openat) runs it every time: a binary search
        // keeps both to a handful of instructions.
        let prog = filter();
        let longest = (0..512)
            .map(|nr| run_counting(&prog, AUDIT_ARCH_NATIVE, nr, [0; 6]).1)
            .max()
            .unwrap();
        assert!(longest <= 24, "{longest} instructions for some syscall");
    }
}
