//! Pyroscope push.v1 `PushRequest`s, then the payloads they carry, as the
//! distributor decodes them. The first byte chooses: a protobuf body, a
//! JSON body, or (so that pprof seeds reach the whole path) a pprof
//! wrapped into a one-series protobuf request.
#![no_main]

mod limits;

use fathom_proto::pyroscope::push::v1::{PushRequest, RawProfileSeries, RawSample};
use fathom_proto::pyroscope::types::v1::LabelPair;
use prost::Message;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let tenant = fathom_model::TenantId::new("fuzz").unwrap();
    let l = limits::distributor();
    let wrapped;
    let (body, json) = match mode % 3 {
        0 => (rest, false),
        1 => (rest, true),
        _ => {
            wrapped = PushRequest {
                series: vec![RawProfileSeries {
                    labels: vec![
                        LabelPair {
                            name: "__name__".into(),
                            value: "process_cpu".into(),
                        },
                        LabelPair {
                            name: "service_name".into(),
                            value: "fuzz".into(),
                        },
                    ],
                    samples: vec![RawSample {
                        raw_profile: rest.to_vec(),
                        id: String::new(),
                    }],
                    ..Default::default()
                }],
            }
            .encode_to_vec();
            (&wrapped[..], false)
        }
    };
    if let Ok(payloads) = fathom_distributor::push_v1_payloads(body, json, &tenant, &l) {
        let _ = fathom_distributor::decode_payloads(&tenant, payloads, &l);
    }
});
