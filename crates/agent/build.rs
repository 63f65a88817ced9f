//! Compiles the BPF program in crates/agent-ebpf with clang into a CO-RE
//! object (BTF + relocations) that the agent embeds and aya loads.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};

fn main() -> anyhow::Result<()> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let src_dir = manifest.join("../agent-ebpf/src/bpf");
    let src = src_dir.join("profiler.bpf.c");
    for f in ["profiler.bpf.c", "profiler.h", "vmlinux_min.h"] {
        println!("cargo:rerun-if-changed={}", src_dir.join(f).display());
    }
    println!("cargo:rerun-if-env-changed=FATHOM_BPF_CLANG");

    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("profiler.bpf.o");
    let clang = std::env::var("FATHOM_BPF_CLANG").unwrap_or_else(|_| "clang".into());
    // The kernel UAPI headers include <asm/types.h>, which Debian keeps under
    // the multiarch directory of the target.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH")?;
    let (multiarch, target_arch) = match arch.as_str() {
        "x86_64" => ("x86_64-linux-gnu", "x86"),
        "aarch64" => ("aarch64-linux-gnu", "arm64"),
        other => bail!("the BPF program is not built for target arch {other}"),
    };
    let status = Command::new(&clang)
        .args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror"])
        .arg(format!("-D__TARGET_ARCH_{target_arch}"))
        .arg(format!("-I/usr/include/{multiarch}"))
        .arg("-I")
        .arg(&src_dir)
        .arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status()
        .with_context(|| {
            format!("running {clang} (install clang, llvm and libbpf-dev to build the agent)")
        })?;
    if !status.success() {
        bail!("{clang} failed to compile {}: {status}", src.display());
    }
    // `fathom-agent` with packed relative relocations, like `fathom`
    // (see cmd/build.rs): fewer pages read and kept at start.
    let os = std::env::var("CARGO_CFG_TARGET_OS")?;
    let env = std::env::var("CARGO_CFG_TARGET_ENV")?;
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    Ok(())
}
