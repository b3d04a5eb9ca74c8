//! Gives libfastwake.so its SONAME, `libfastwake.so.<FW_ABI_VERSION>`.
//!
//! Why the ABI version and not the crate version: the header already
//! promises that FW_ABI_VERSION changes with every incompatible change of
//! the C ABI (layouts are checked by the ABI size tests, src/abi_sizes.rs and
//! tests/abi.c), so a program linked against libfastwake.so.1 keeps
//! loading every later release with the same ABI, and refuses one without
//! it. The number is read from the header, the one place it is written;
//! src/lib.rs's constant is checked against the header by tests/abi.c.
//!
//! cargo-c would do this too, but Debian bookworm's cargo-c (0.9.14)
//! cannot read this workspace (`resolver = "3"`), and building a current
//! one compiles the cargo crate itself: minutes on a 2-CPU machine for a
//! single linker flag. scripts/install writes the symlinks and fastwake.pc.

fn main() {
    let header = "include/fastwake.h";
    println!("cargo:rerun-if-changed={header}");
    let text = std::fs::read_to_string(header).expect("read include/fastwake.h");
    let abi = text
        .lines()
        .find_map(|l| l.strip_prefix("#define FW_ABI_VERSION "))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        .expect("include/fastwake.h defines FW_ABI_VERSION as a number");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libfastwake.so.{abi}");
    }
}
