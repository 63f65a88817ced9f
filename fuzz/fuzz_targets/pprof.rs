//! pprof protobuf (gzip'd or not; legacy formats as the fallback), then
//! normalization into Fathom profiles: what every pprof payload goes
//! through. The one pass the distributor takes
//! (`fathom_pprof::decode_and_normalize`) must give the same profiles,
//! symbols and frame index as decode then normalize, or the same error.
#![no_main]

mod limits;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let limits = limits::pprof();
    let opts = fathom_pprof::NormalizeOptions::default();
    let two = fathom_pprof::decode(data, &limits)
        .map_err(|e| e.to_string())
        .and_then(|p| fathom_pprof::normalize(&p, &opts).map_err(|e| e.to_string()));
    let one = fathom_pprof::decode_and_normalize(data, &limits, &opts).map_err(|e| e.to_string());
    match (&one, &two) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b);
            assert_eq!(a.symbols.frame_index, b.symbols.frame_index);
        }
        (Err(a), Err(b)) => assert_eq!(a, b),
        _ => panic!("one pass {:?} against two {:?}", one.is_ok(), two.is_ok()),
    }
});
