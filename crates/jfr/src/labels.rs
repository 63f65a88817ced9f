//! The `labels` part of a Pyroscope Java agent request: a
//! `LabelsSnapshot` protobuf (`proto/jfr_labels.proto`, field numbers as
//! Pyroscope defines them). Hand-written prost types: two small messages
//! do not justify a build script.

use std::collections::HashMap;

/// One context's labels: label name string id → label value string id.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Context {
    #[prost(map = "int64, int64", tag = "1")]
    pub labels: HashMap<i64, i64>,
}

/// The contexts that JFR events refer to by `contextId`, and the string
/// table their labels use.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LabelsSnapshot {
    #[prost(map = "int64, message", tag = "1")]
    pub contexts: HashMap<i64, Context>,
    #[prost(map = "int64, string", tag = "2")]
    pub strings: HashMap<i64, String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn field_numbers_match_pyroscope() {
        let mut s = LabelsSnapshot::default();
        s.strings.insert(1, "k".into());
        s.strings.insert(2, "v".into());
        s.contexts.insert(
            7,
            Context {
                labels: HashMap::from([(1, 2)]),
            },
        );
        let b = s.encode_to_vec();
        // contexts = 1 (length-delimited: tag byte 0x0a), strings = 2 (0x12).
        assert!(b.contains(&0x0a) && b.contains(&0x12));
        let back = LabelsSnapshot::decode(b.as_slice()).unwrap();
        assert_eq!(back, s);
        // A map entry of `strings` with key 3, value "x", by hand:
        // field 2, entry {1: varint 3, 2: "x"}.
        let manual = [0x12, 0x05, 0x08, 0x03, 0x12, 0x01, b'x'];
        let m = LabelsSnapshot::decode(&manual[..]).unwrap();
        assert_eq!(m.strings.get(&3).map(String::as_str), Some("x"));
    }
}
