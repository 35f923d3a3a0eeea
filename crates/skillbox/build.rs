//! The binary starts at `skillbox_entry` (crates/skillbox-entry), which sends a plain
//! `exec` to `skillbox warm` before glibc starts and otherwise jumps to glibc's
//! `_start`. Only x86-64 Linux has that entry point; elsewhere glibc's is kept.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let var = |name| std::env::var(name).unwrap_or_default();
    if var("CARGO_CFG_TARGET_ARCH") == "x86_64" && var("CARGO_CFG_TARGET_OS") == "linux" {
        println!("cargo:rustc-link-arg-bin=skillbox=-Wl,--undefined=skillbox_entry");
        println!("cargo:rustc-link-arg-bin=skillbox=-Wl,--entry=skillbox_entry");
    }
}
