//! pprof protobuf (gzip'd or not; legacy formats as the fallback), then
//! normalization into Fathom profiles: what every pprof payload goes
//! through.
#![no_main]

mod limits;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(p) = fathom_pprof::decode(data, &limits::pprof()) {
        let _ = fathom_pprof::normalize(&p, &fathom_pprof::NormalizeOptions::default());
    }
});
