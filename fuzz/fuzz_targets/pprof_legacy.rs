//! The legacy pprof formats alone (gperftools CPU, heapz, Go debug=1
//! text, contention, threadz, Java), then normalization.
#![no_main]

mod limits;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(p) = fathom_pprof::decode_legacy(data, &limits::pprof()) {
        let _ = fathom_pprof::normalize(&p, &fathom_pprof::NormalizeOptions::default());
    }
});
