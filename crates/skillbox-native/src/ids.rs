//! Who the sandbox's user is: [`SANDBOX_ID`] inside the sandbox, [`HostIds`] on the
//! host. A leaf: the child, the layout, the scratch tmpfs and the spawner all name
//! these, and this module names none of them.

/// The uid and gid of the sandbox's user, inside.
pub const SANDBOX_ID: u32 = 1000;

/// Host ids the sandbox user maps to.
#[derive(Debug, Clone, Copy)]
pub struct HostIds {
    pub uid: u32,
    pub gid: u32,
}
