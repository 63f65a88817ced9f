//! speedscope JSON.
#![no_main]

mod limits;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = fathom_pprof::parse_speedscope(
        data,
        &fathom_pprof::SpeedscopeOptions::default(),
        &limits::pprof(),
    );
});
