//! OTLP profiles export requests, JSON: decoding and conversion.
#![no_main]

mod limits;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let l = limits::otlp();
    if let Ok(r) = fathom_otlp::Request::decode(data, fathom_otlp::Encoding::Json, &l) {
        let _ = r.convert(fathom_model::Id::ZERO, &l);
    }
});
