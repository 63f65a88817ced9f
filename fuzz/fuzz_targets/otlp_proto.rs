//! OTLP profiles export requests, protobuf: decoding (with the scan that
//! bounds it) and conversion into Fathom profiles.
#![no_main]

mod limits;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let l = limits::otlp();
    if let Ok(r) = fathom_otlp::Request::decode(data, fathom_otlp::Encoding::Protobuf, &l) {
        let _ = r.convert(fathom_model::Id::ZERO, &l);
    }
});
