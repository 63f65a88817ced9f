//! Series selectors (`type{label="value",other=~"re.*"}`), as every query
//! API parses them.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let _ = fathom_model::Selector::parse(s);
});
