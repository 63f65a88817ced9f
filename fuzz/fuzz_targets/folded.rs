//! Folded (collapsed) stack text, gzip'd, UTF-8 or UTF-16.
#![no_main]

mod limits;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = fathom_pprof::parse_folded(
        data,
        &fathom_pprof::FoldedOptions::default(),
        &limits::pprof(),
    );
});
