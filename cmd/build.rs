//! Links `fathom` with packed relative relocations (`DT_RELR`).
//!
//! `fathom` is a position-independent executable of several hundred
//! thousand relative relocations: as `.rela.dyn` (24 bytes each) they are
//! ~6 MB that the loader reads at every start, and every process (the
//! agent on each host above all) keeps those pages resident. Packed, the
//! table is a few kilobytes. Needs glibc 2.36 or later (Debian 12).
fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
