//! Arrow Flight tickets that Fathom decodes: JSON query tickets and the
//! head-read tickets an ingester answers.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    use fathom_api::ticket::{HeadTicket, is_json, json_params};
    if !is_json(data) {
        return;
    }
    if let Some(t) = HeadTicket::decode(data) {
        if let HeadTicket::HeadSymbols { stacks } = &t {
            let _ = HeadTicket::stack_ids(stacks);
        }
        let _ = t.kind();
        return;
    }
    let _ = json_params(data);
});
