//! Arrow Flight tickets that Fathom decodes itself (Flight SQL commands
//! are protobuf, decoded by arrow-flight): the JSON tickets of queries
//! (`{"kind":"merge","query":…}`) and the head-read tickets that queriers
//! send to ingesters (served by `fathom_ingester::flight_service`). Outside bytes: bounded in size, refused with a
//! message, never a panic (fuzzed by `fuzz/fuzz_targets/flight_ticket.rs`).

use std::collections::HashMap;

use fathom_model::Id;

use crate::ApiError;

/// Largest JSON ticket accepted.
pub const MAX_JSON_TICKET_BYTES: usize = 1 << 20;

/// Most stacks one head symbol read may name.
pub const MAX_HEAD_STACKS: usize = 1 << 20;

/// Whether a ticket or command is JSON (a Fathom ticket) rather than a
/// Flight SQL protobuf: its first non-blank byte is `{`.
pub fn is_json(b: &[u8]) -> bool {
    b.iter()
        .find(|c| !c.is_ascii_whitespace())
        .is_some_and(|c| *c == b'{')
}

/// A JSON ticket's parameters as strings (numbers are accepted too).
pub fn json_params(bytes: &[u8]) -> Result<HashMap<String, String>, ApiError> {
    if bytes.len() > MAX_JSON_TICKET_BYTES {
        return Err(ApiError::bad_request(format!(
            "a JSON ticket is limited to {MAX_JSON_TICKET_BYTES} bytes"
        )));
    }
    let v: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("JSON ticket: {e}")))?;
    let mut out = HashMap::new();
    for (k, v) in v {
        let s = match v {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            other => {
                return Err(ApiError::bad_request(format!(
                    "JSON ticket: {k} must be a string or a number, not {other}"
                )));
            }
        };
        out.insert(k, s);
    }
    Ok(out)
}

/// What a head-read ticket names (a querier's read of an ingester's head).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HeadTicket {
    /// Series, profiles (app metadata, JSON) and samples (batches) of the
    /// heads in `[start, end]`.
    Head { start: i64, end: i64 },
    /// The symbols of these stacks (hex ids), as a `WriteRequest` without
    /// profiles in the app metadata.
    HeadSymbols { stacks: Vec<String> },
}

impl HeadTicket {
    /// A head-read ticket, or `None` when `bytes` is another ticket.
    pub fn decode(bytes: &[u8]) -> Option<HeadTicket> {
        if bytes.len() > MAX_JSON_TICKET_BYTES.saturating_mul(64) {
            return None;
        }
        serde_json::from_slice(bytes).ok()
    }

    /// For spans: which read this is.
    pub fn kind(&self) -> &'static str {
        match self {
            HeadTicket::Head { .. } => "head",
            HeadTicket::HeadSymbols { .. } => "head_symbols",
        }
    }

    /// The stack ids of a symbol read, at most [`MAX_HEAD_STACKS`].
    pub fn stack_ids(stacks: &[String]) -> Result<Vec<Id>, ApiError> {
        if stacks.len() > MAX_HEAD_STACKS {
            return Err(ApiError::bad_request(format!(
                "at most {MAX_HEAD_STACKS} stacks per symbol read"
            )));
        }
        stacks
            .iter()
            .map(|h| {
                Id::from_hex(h).ok_or_else(|| {
                    ApiError::bad_request(format!("stack id {h:?} is not 32 hex digits"))
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_ticket_parameters() {
        assert!(is_json(br#" {"kind":"merge"}"#));
        assert!(!is_json(b"\x0a\x05hello"));
        let p = json_params(br#"{"kind":"merge","query":"a{}","start":5}"#).unwrap();
        assert_eq!(p["start"], "5");
        let e = json_params(br#"{"kind":"merge","start":[1]}"#).unwrap_err();
        assert!(e.to_string().contains("start"), "{e}");
        assert!(json_params(b"{not json").is_err());
        let big = format!("{{\"a\":\"{}\"}}", "x".repeat(MAX_JSON_TICKET_BYTES));
        assert!(
            json_params(big.as_bytes())
                .unwrap_err()
                .to_string()
                .contains("limited")
        );
    }

    #[test]
    fn head_tickets() {
        let t = HeadTicket::Head { start: 1, end: 2 };
        let bytes = serde_json::to_vec(&t).unwrap();
        assert_eq!(HeadTicket::decode(&bytes), Some(t));
        assert_eq!(HeadTicket::decode(br#"{"kind":"merge"}"#), None);
        let id = "00112233445566778899aabbccddeeff".to_owned();
        assert_eq!(
            HeadTicket::stack_ids(std::slice::from_ref(&id))
                .unwrap()
                .len(),
            1
        );
        let e = HeadTicket::stack_ids(&["zz".into()]).unwrap_err();
        assert!(e.to_string().contains("32 hex digits"), "{e}");
    }
}
