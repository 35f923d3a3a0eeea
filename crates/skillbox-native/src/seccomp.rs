//! The seccomp filter: a deny list compiled once to classic BPF, installed in the
//! sandbox's init before it forks the payload. It stops the syscalls that widen the
//! kernel's attack surface or would undo the other layers (namespaces, mounts, tracing).

use libc::{
    BPF_ABS, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_RET, BPF_W, sock_filter,
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

/// The compiled filter. Built once per process; installing it is one prctl.
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
    for nr in denied_syscalls() {
        prog.push(jump(BPF_JMP | BPF_JEQ | BPF_K, nr as u32, 0, 1));
        prog.push(stmt(BPF_RET | BPF_K, RET_EPERM));
    }
    // Sockets only of the families a script may need: unix, IPv4/6 (which the empty
    // network namespace confines) and netlink (interface lists). Not vsock, which is not
    // namespaced and can reach a hypervisor, nor packet, bluetooth, can and the rest.
    for nr in [libc::SYS_socket, libc::SYS_socketpair] {
        prog.push(jump(BPF_JMP | BPF_JEQ | BPF_K, nr as u32, 0, 7));
        prog.push(stmt(BPF_LD | BPF_W | BPF_ABS, OFFSET_ARG0_LO));
        prog.push(jump(BPF_JMP | BPF_JEQ | BPF_K, libc::AF_UNIX as u32, 4, 0));
        prog.push(jump(BPF_JMP | BPF_JEQ | BPF_K, libc::AF_INET as u32, 3, 0));
        prog.push(jump(BPF_JMP | BPF_JEQ | BPF_K, libc::AF_INET6 as u32, 2, 0));
        prog.push(jump(
            BPF_JMP | BPF_JEQ | BPF_K,
            libc::AF_NETLINK as u32,
            1,
            0,
        ));
        prog.push(stmt(BPF_RET | BPF_K, RET_EAFNOSUPPORT));
        prog.push(stmt(BPF_RET | BPF_K, RET_ALLOW));
    }
    // No setuid/setgid bits on files: whatever the sandbox writes may be run later on
    // the host by someone else. Refused in every call that sets a mode; openat2 hides
    // its mode behind a pointer, so it answers ENOSYS and libc uses openat.
    let mut mode_calls: Vec<(i64, u32)> = vec![
        (libc::SYS_fchmod, OFFSET_ARG1_LO),
        (libc::SYS_fchmodat, OFFSET_ARG2_LO),
        (SYS_FCHMODAT2, OFFSET_ARG2_LO),
        (libc::SYS_openat, OFFSET_ARG3_LO),
        (libc::SYS_mknodat, OFFSET_ARG2_LO),
    ];
    #[cfg(target_arch = "x86_64")]
    mode_calls.extend([
        (libc::SYS_chmod, OFFSET_ARG1_LO),
        (libc::SYS_open, OFFSET_ARG2_LO),
        (libc::SYS_creat, OFFSET_ARG1_LO),
        (libc::SYS_mknod, OFFSET_ARG1_LO),
    ]);
    for (nr, offset) in mode_calls {
        prog.push(jump(BPF_JMP | BPF_JEQ | BPF_K, nr as u32, 0, 4));
        prog.push(stmt(BPF_LD | BPF_W | BPF_ABS, offset));
        prog.push(jump(BPF_JMP | BPF_JSET | BPF_K, SETID_BITS, 0, 1));
        prog.push(stmt(BPF_RET | BPF_K, RET_EPERM));
        prog.push(stmt(BPF_RET | BPF_K, RET_ALLOW));
    }
    prog.push(jump(
        BPF_JMP | BPF_JEQ | BPF_K,
        libc::SYS_openat2 as u32,
        0,
        1,
    ));
    prog.push(stmt(BPF_RET | BPF_K, RET_ENOSYS));
    // clone3 passes its flags behind a pointer BPF cannot read: make libc fall back to
    // clone(2), whose flags we can check.
    prog.push(jump(
        BPF_JMP | BPF_JEQ | BPF_K,
        libc::SYS_clone3 as u32,
        0,
        1,
    ));
    prog.push(stmt(BPF_RET | BPF_K, RET_ENOSYS));
    // clone(2) with any namespace flag.
    prog.push(jump(
        BPF_JMP | BPF_JEQ | BPF_K,
        libc::SYS_clone as u32,
        0,
        4,
    ));
    prog.push(stmt(BPF_LD | BPF_W | BPF_ABS, OFFSET_ARG0_LO));
    prog.push(jump(
        BPF_JMP | BPF_JSET | BPF_K,
        CLONE_NAMESPACE_FLAGS,
        0,
        1,
    ));
    prog.push(stmt(BPF_RET | BPF_K, RET_EPERM));
    prog.push(stmt(BPF_RET | BPF_K, RET_ALLOW));
    // ioctl(TIOCSTI / TIOCLINUX): the kernel takes the request as 32 bits, so compare
    // only the low word — setting high bits must not slip past.
    prog.push(jump(
        BPF_JMP | BPF_JEQ | BPF_K,
        libc::SYS_ioctl as u32,
        0,
        4,
    ));
    prog.push(stmt(BPF_LD | BPF_W | BPF_ABS, OFFSET_ARG1_LO));
    prog.push(jump(BPF_JMP | BPF_JEQ | BPF_K, TIOCSTI, 1, 0));
    prog.push(jump(BPF_JMP | BPF_JEQ | BPF_K, TIOCLINUX, 0, 1));
    prog.push(stmt(BPF_RET | BPF_K, RET_EPERM));
    prog.push(stmt(BPF_RET | BPF_K, RET_ALLOW));
    prog
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_jump_lands_inside_the_program() {
        let prog = filter();
        for (i, ins) in prog.iter().enumerate() {
            if u32::from(ins.code) & 0x07 == BPF_JMP {
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
}
