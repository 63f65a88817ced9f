//! Java Flight Recorder recordings, with or without a labels snapshot
//! (the `labels` part of Pyroscope's JFR ingest): the first byte says
//! whether, and where, the input splits into labels and recording.
#![no_main]

mod limits;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let (labels, jfr) = if split & 1 == 1 {
        let at = (usize::from(split >> 1) * 16).min(rest.len());
        let (l, j) = rest.split_at(at);
        (Some(l), j)
    } else {
        (None, rest)
    };
    let _ = fathom_jfr::decode(
        jfr,
        labels,
        &fathom_jfr::JfrOptions::default(),
        &limits::pprof(),
    );
});
