//! Builds the eBPF object (the `memprof-ebpf` crate) for `bpfel-unknown-none`
//! and leaves it in `OUT_DIR`, where `kernel::loader` embeds it.
//!
//! The eBPF crate needs `-Z build-std=core` and so a compiler with its
//! library source. This machine kind's one is Debian's `rustc-web`, linked by
//! `cargo xtask setup` as the rustup toolchain named below.

use std::process::Command;

/// The rustup toolchain `cargo xtask setup` links to Debian's rustc-web.
const BPF_TOOLCHAIN: &str = "memprof-bpf";

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    let toolchain_ok = Command::new("rustup")
        .args(["run", BPF_TOOLCHAIN, "rustc", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !toolchain_ok && std::env::var_os("AYA_BUILD_SKIP").is_none() {
        anyhow::bail!(
            "the eBPF toolchain `{BPF_TOOLCHAIN}` is missing: run `cargo xtask setup` once \
             (it installs rustc-web, rust-web-src, LLVM 22 and bpf-linker)"
        );
    }
    // aya-build passes `-Z build-std=core` when RUSTC_BOOTSTRAP=1, which lets
    // the stable Debian compiler take the flag. Only the child cargo that
    // builds the eBPF crate inherits it.
    std::env::set_var("RUSTC_BOOTSTRAP", "1");
    let mut path = std::ffi::OsString::from("/usr/lib/llvm-22/bin:");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    std::env::set_var("PATH", path);

    let package = aya_build::Package {
        name: "memprof-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../memprof-ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::Custom(BPF_TOOLCHAIN))
}
