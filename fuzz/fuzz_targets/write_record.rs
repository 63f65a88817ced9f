//! Ingester write records (`WriteRequest`, formats 0, 2, 3 and 4), as a
//! replica and a WAL replay decode them. The direct decoder and the prost
//! path must agree on every input. The first byte chooses: the rest is a
//! record (0), or a pprof (1) that is normalized and written as a format-4
//! record and as format-3 and format-2 ones, which must all read back as
//! the batch.
#![no_main]

mod limits;

use prost::Message;

fn agree(record: &[u8]) {
    let fast = fathom_proto::decode_write_request(record);
    let prost = fathom_proto::decode_write_request_prost(record);
    assert_eq!(fast.is_ok(), prost.is_ok(), "{fast:?} / {prost:?}");
    assert_eq!(fast.ok(), prost.ok());
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        agree(rest);
        return;
    }
    let Ok(p) = fathom_pprof::decode(rest, &limits::pprof()) else {
        return;
    };
    let Ok(n) = fathom_pprof::normalize(&p, &fathom_pprof::NormalizeOptions::default()) else {
        return;
    };
    let batch = fathom_model::IngestBatch {
        tenant: fathom_model::TenantId::new("fuzz").unwrap(),
        profiles: n.profiles,
        symbols: n.symbols,
    };
    let v4 = fathom_proto::encode_write_request(&batch);
    assert_eq!(fathom_proto::decode_write_request(&v4).ok(), Some(batch.clone()));
    agree(&v4);
    let v3 = fathom_proto::write_request_format3(&batch).encode_to_vec();
    assert_eq!(fathom_proto::decode_write_request(&v3).ok(), Some(batch.clone()));
    agree(&v3);
    let v2 = fathom_proto::write_request_format2(&batch).encode_to_vec();
    assert_eq!(fathom_proto::decode_write_request(&v2).ok(), Some(batch));
    agree(&v2);
});
