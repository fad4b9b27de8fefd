//! Installs what the project needs on a bare Debian 12 machine, and checks
//! it quickly when it is already there.
//!
//! The eBPF crate needs `-Z build-std=core`, so a compiler with its library
//! source: Debian's `rustc-web` + `rust-web-src`, linked as the rustup
//! toolchain `memprof-bpf` that `memprof/build.rs` asks aya-build for. The
//! linker is `bpf-linker` built against Debian's LLVM 22.

use std::{path::Path, process::Command};

use anyhow::{bail, Context, Result};

/// Debian packages: the eBPF toolchain, and what the tests use.
const PACKAGES: &[&str] = &[
    "rustc-web",       // rustc 1.96 with LLVM 22, sysroot /usr
    "rust-web-src",    // its library source, for -Z build-std=core
    "rust-web-clippy", // clippy for that compiler, to lint the eBPF crate
    "llvm-22-dev",     // for bpf-linker
    "bpftool",         // tests check that no program is left loaded
    "bpftrace",        // the peer the benchmarks compare against
    "gcc",             // builds the C workloads
    "libc6-dev",       // including libc.a for the static-binary test
    "binutils",        // strip, for the stripped-binary test
    "tmux",            // drives the dashboard in its test
    "pbzip2",          // a real multithreaded program for the lock tests
    "util-linux",      // setpriv, for the unprivileged-run test
    "libjemalloc2",    // allocators the allocator tests preload
    "libtcmalloc-minimal4",
    "libmimalloc2.0",
];
const BPF_LINKER_VERSION: &str = "0.13.0";
const TOOLCHAIN: &str = "memprof-bpf";
const TOOLCHAIN_DIR: &str = "/usr/local/lib/memprof-ebpf/bpf-toolchain";
const LLVM_BIN: &str = "/usr/lib/llvm-22/bin";
/// Debian's binaries that make up the linked toolchain.
const TOOLS: [&str; 4] = ["rustc", "cargo", "cargo-clippy", "clippy-driver"];

pub fn ensure() -> Result<()> {
    ensure_packages()?;
    ensure_bpf_linker()?;
    ensure_toolchain()?;
    Ok(())
}

fn missing_packages() -> Vec<&'static str> {
    PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            let out = Command::new("dpkg-query").args(["-W", "-f=${Status}", p]).output();
            !matches!(out, Ok(o) if String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect()
}

fn ensure_packages() -> Result<()> {
    let missing = missing_packages();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("setup: installing Debian packages: {}", missing.join(" "));
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "these packages are missing and installing them needs root: {}",
            missing.join(" ")
        );
    }
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    Ok(())
}

fn ensure_bpf_linker() -> Result<()> {
    let have = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION))
        .unwrap_or(false);
    if have {
        return Ok(());
    }
    eprintln!("setup: building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (about a minute)");
    let path = format!("{LLVM_BIN}:{}", std::env::var("PATH").unwrap_or_default());
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(cargo)
        .args([
            "install",
            "bpf-linker",
            "--locked",
            "--version",
            BPF_LINKER_VERSION,
        ])
        .args(["--no-default-features", "--features", "llvm-22"])
        .env("PATH", path))
}

fn ensure_toolchain() -> Result<()> {
    let works = Command::new("rustup")
        .args(["run", TOOLCHAIN, "rustc", "--print", "sysroot"])
        .output()
        .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "/usr")
        .unwrap_or(false);
    let dir = Path::new(TOOLCHAIN_DIR);
    let complete = TOOLS.iter().all(|t| dir.join("bin").join(t).exists());
    if works && complete {
        return Ok(());
    }
    eprintln!("setup: linking Debian's rustc-web as the rustup toolchain `{TOOLCHAIN}`");
    std::fs::create_dir_all(dir.join("bin")).context("creating the toolchain directory")?;
    std::fs::create_dir_all(dir.join("lib"))?;
    for tool in TOOLS {
        let link = dir.join("bin").join(tool);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(format!("/usr/bin/{tool}"), &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    run(Command::new("rustup").args(["toolchain", "link", TOOLCHAIN, TOOLCHAIN_DIR]))
}

/// A command run with the eBPF toolchain (for linting the eBPF crate the
/// way `memprof/build.rs` builds it).
pub fn bpf_cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", TOOLCHAIN, "cargo"])
        .args(args)
        .args([
            "--release",
            "-Z",
            "build-std=core",
            "--target",
            "bpfel-unknown-none",
        ])
        .env("RUSTC_BOOTSTRAP", "1")
        .env(
            "PATH",
            format!("{LLVM_BIN}:{}", std::env::var("PATH").unwrap_or_default()),
        )
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER");
    cmd
}

pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}
