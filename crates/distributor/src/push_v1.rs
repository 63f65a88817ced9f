//! Pyroscope's `push.v1.PusherService/Push`, what current Pyroscope SDKs
//! (pyroscope-io 1.x, the Rust `pyroscope` crate 2.x, Grafana Alloy) send:
//! over Connect (HTTP/1.1 or HTTP/2 POST, `application/proto` or
//! `application/json`, gzip by `Content-Encoding`) and over gRPC, on one
//! path. A thin adapter over [`Distributor::ingest`]: every sample is a
//! pprof payload.
//!
//! - `series[].labels`: `__name__` names the profile (`process_cpu`,
//!   `memory`, … a hint for the profile type, as in Pyroscope), other
//!   labels starting with `__` are reserved and dropped, `.` in a label
//!   name becomes `_` (Pyroscope's sanitization: `otel.scope.name` is
//!   `otel_scope_name`), empty values are dropped; `service_name` is
//!   required, as in Pyroscope.
//! - `samples[].raw_profile`: pprof, gzip'd or not; `samples[].ID` seeds
//!   the profile ids, so a retried push with the same IDs is stored once
//!   (without an ID, the content does).
//! - `annotations` are dropped (Pyroscope drops them on push too).
//! - `Authorization` (Basic or Bearer) is accepted and not checked yet.
//!
//! Bounds, before anything is decoded: the body size as sent and after
//! gzip, then a scan of the protobuf framing (or of the JSON's objects)
//! that counts series, samples and labels against [`crate::Limits`].

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use fathom_api::connect::{self, Codec, ConnectError};
use fathom_api::{ApiError, tenant_from_headers, tenant_from_metadata};
use fathom_model::{Labels, SERVICE_NAME, TenantId, valid_label_name};
use fathom_proto::pyroscope::push::v1::pusher_service_server::{
    PusherService, PusherServiceServer,
};
use fathom_proto::pyroscope::push::v1::{PushRequest, PushResponse};
use fathom_proto::pyroscope::types::v1::LabelPair;
use prost::Message;
use tonic::codegen::Service;

use crate::ingest::key_seed;
use crate::{Distributor, Format, Idempotence, IngestRequest, Limits, Payload};

/// The path of `push.v1.PusherService/Push`, for Connect and gRPC alike.
pub const PUSH_V1_PATH: &str = "/push.v1.PusherService/Push";

/// What the route needs: the distributor, and the tonic service that
/// answers the gRPC requests on the same path.
#[derive(Clone)]
pub(crate) struct PushV1 {
    d: Distributor,
    grpc: PusherServiceServer<PushV1Grpc>,
}

impl PushV1 {
    pub(crate) fn new(d: Distributor) -> Self {
        let max = d.limits.max_body_bytes;
        let grpc = PusherServiceServer::new(PushV1Grpc { d: d.clone() })
            .max_decoding_message_size(max)
            .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
        PushV1 { d, grpc }
    }
}

/// The route's handler: gRPC requests go to the tonic service, the rest is
/// Connect.
pub(crate) async fn handle(State(s): State<PushV1>, req: Request) -> Response {
    if connect::is_grpc(req.headers()) {
        let mut grpc = s.grpc.clone();
        return match grpc.call(req).await {
            Ok(r) => r.map(Body::new),
            Err(never) => match never {},
        };
    }
    let r = connect_push(&s.d, req).await;
    s.d.count_request("push_v1_connect", r.is_ok());
    r.unwrap_or_else(IntoResponse::into_response)
}

async fn connect_push(d: &Distributor, req: Request) -> Result<Response, ConnectError> {
    let headers = req.headers().clone();
    let codec = connect::request_codec(&headers)?;
    let api = ConnectError::from;
    connect::check_protocol_version(&headers)?;
    let gzip = connect::request_is_gzip(&headers)?;
    let tenant = tenant_from_headers(&headers)?;
    let l = &d.limits;
    let raw = axum::body::to_bytes(req.into_body(), l.max_body_bytes)
        .await
        .map_err(|_| {
            api(ApiError::TooLarge(format!(
                "request body is larger than the limit of {} bytes",
                l.max_body_bytes
            )))
        })?;
    let received = raw.len();
    let body: Bytes = if gzip {
        let d2 = d.clone();
        tokio::task::spawn_blocking(move || d2.gunzip_request(&raw))
            .await
            .map_err(|e| {
                api(ApiError::internal(format!(
                    "decompression task failed: {e}"
                )))
            })??
            .into()
    } else {
        raw
    };
    let push = decode_body(&body, codec == Codec::Json, l).map_err(api)?;
    push_request(d, tenant, push, received).await?;
    let body = match codec {
        Codec::Proto => PushResponse {}.encode_to_vec(),
        Codec::Json => b"{}".to_vec(),
    };
    Ok(connect::ok_response(codec, body))
}

/// A Connect request body (decompressed): scanned against the limits,
/// then decoded.
fn decode_body(body: &[u8], json: bool, l: &Limits) -> Result<PushRequest, ApiError> {
    if json {
        scan_json(body, l)?;
        serde_json::from_slice::<PushRequest>(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body is not a valid push.v1 PushRequest in JSON: {e}"
            ))
        })
    } else {
        scan_proto(body, l)?;
        PushRequest::decode(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body is not a valid push.v1 PushRequest protobuf: {e}"
            ))
        })
    }
}

/// A push.v1 `PushRequest` body (protobuf, or JSON when `json`; already
/// decompressed) as the payloads the distributor decodes, with every check
/// of the Connect path: for tests and fuzzing. Never panics.
pub fn push_v1_payloads(
    body: &[u8],
    json: bool,
    tenant: &TenantId,
    l: &Limits,
) -> Result<Vec<Payload>, ApiError> {
    let push = decode_body(body, json, l)?;
    check_counts(&push, l)?;
    payloads(tenant, push, l)
}

/// The gRPC service.
#[derive(Clone)]
pub(crate) struct PushV1Grpc {
    d: Distributor,
}

#[tonic::async_trait]
impl PusherService for PushV1Grpc {
    async fn push(
        &self,
        req: tonic::Request<PushRequest>,
    ) -> Result<tonic::Response<PushResponse>, tonic::Status> {
        let r: Result<(), ApiError> = async {
            let tenant = tenant_from_metadata(req.metadata())?;
            let push = req.into_inner();
            let size = push.encoded_len();
            push_request(&self.d, tenant, push, size).await
        }
        .await;
        self.d.count_request("push_v1_grpc", r.is_ok());
        r?;
        Ok(tonic::Response::new(PushResponse {}))
    }
}

/// The request's samples, written as one batch.
async fn push_request(
    d: &Distributor,
    tenant: TenantId,
    push: PushRequest,
    received_bytes: usize,
) -> Result<(), ApiError> {
    check_counts(&push, &d.limits)?;
    let payloads = payloads(&tenant, push, &d.limits)?;
    d.ingest(IngestRequest {
        tenant,
        received_bytes,
        payloads,
    })
    .await?;
    Ok(())
}

/// The most label pairs (and annotations) one series may carry on the
/// wire: the limit on series labels, with room for `__name__` and the
/// reserved and empty labels that are dropped.
fn max_wire_labels(l: &Limits) -> usize {
    l.max_labels.saturating_mul(2).saturating_add(8)
}

fn too_many(what: &str, n: usize, limit: usize) -> ApiError {
    ApiError::TooLarge(format!("{what} {n}; the limit is {limit}"))
}

/// Counts of a decoded request against the limits (the gRPC path, where
/// tonic decoded the message; the Connect path scanned before decoding).
fn check_counts(p: &PushRequest, l: &Limits) -> Result<(), ApiError> {
    if p.series.len() > l.max_profiles_per_push {
        return Err(too_many(
            "the request has more series than allowed:",
            p.series.len(),
            l.max_profiles_per_push,
        ));
    }
    let mut samples = 0usize;
    for (i, s) in p.series.iter().enumerate() {
        let wire = s.labels.len().max(s.annotations.len());
        if wire > max_wire_labels(l) {
            return Err(too_many(
                &format!("series {i}: labels or annotations:"),
                wire,
                max_wire_labels(l),
            ));
        }
        samples = samples.saturating_add(s.samples.len());
    }
    if samples > l.max_profiles_per_push {
        return Err(too_many(
            "the request has more samples (profiles) than allowed:",
            samples,
            l.max_profiles_per_push,
        ));
    }
    Ok(())
}

/// One protobuf field: number, wire type, and for length-delimited fields
/// the payload.
struct Field<'a> {
    number: u64,
    payload: Option<&'a [u8]>,
}

/// Iterates the fields of one message's wire bytes, checking the framing;
/// stops after the first error.
fn fields(mut b: &[u8]) -> impl Iterator<Item = Result<Field<'_>, &'static str>> {
    std::iter::from_fn(move || {
        if b.is_empty() {
            return None;
        }
        let r = next_field(&mut b);
        if r.is_err() {
            b = &[];
        }
        Some(r)
    })
}

fn next_field<'a>(b: &mut &'a [u8]) -> Result<Field<'a>, &'static str> {
    let key = varint(b)?;
    let number = key >> 3;
    if number == 0 {
        return Err("field number 0");
    }
    let cur: &'a [u8] = b;
    let (payload, rest) = match key & 7 {
        0 => {
            varint(b)?;
            return Ok(Field {
                number,
                payload: None,
            });
        }
        1 => (None, cur.get(8..).ok_or("truncated fixed64 field")?),
        2 => {
            let mut c = cur;
            let len = usize::try_from(varint(&mut c)?).map_err(|_| "length overflow")?;
            if len > c.len() {
                return Err("a length-delimited field runs past the end (truncated?)");
            }
            let (p, rest) = c.split_at(len);
            (Some(p), rest)
        }
        5 => (None, cur.get(4..).ok_or("truncated fixed32 field")?),
        _ => return Err("unsupported wire type (groups are not used by push.v1)"),
    };
    *b = rest;
    Ok(Field { number, payload })
}

fn varint(b: &mut &[u8]) -> Result<u64, &'static str> {
    let mut v = 0u64;
    for i in 0..10 {
        let (&byte, rest) = b.split_first().ok_or("truncated varint")?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("varint longer than 10 bytes")
}

/// Counts series, samples and labels in a protobuf `PushRequest` before it
/// is decoded, so that decoding allocates within the limits.
fn scan_proto(b: &[u8], l: &Limits) -> Result<(), ApiError> {
    let bad = |e: &str| {
        ApiError::bad_request(format!(
            "the body is not a valid push.v1 PushRequest protobuf: {e}"
        ))
    };
    let (mut series, mut samples) = (0usize, 0usize);
    for f in fields(b) {
        let f = f.map_err(bad)?;
        if f.number != 1 {
            continue;
        }
        let Some(s) = f.payload else {
            return Err(bad("field 1 (series) is not length-delimited"));
        };
        let i = series;
        series += 1;
        if series > l.max_profiles_per_push {
            return Err(ApiError::TooLarge(format!(
                "the request has more than {} series",
                l.max_profiles_per_push
            )));
        }
        let (mut labels, mut annotations) = (0usize, 0usize);
        for f in fields(s) {
            let f = f.map_err(bad)?;
            match f.number {
                1 => labels += 1,
                2 => samples += 1,
                3 => annotations += 1,
                _ => {}
            }
        }
        let wire = labels.max(annotations);
        if wire > max_wire_labels(l) {
            return Err(too_many(
                &format!("series {i}: labels or annotations:"),
                wire,
                max_wire_labels(l),
            ));
        }
        if samples > l.max_profiles_per_push {
            return Err(ApiError::TooLarge(format!(
                "the request has more than {} samples (profiles)",
                l.max_profiles_per_push
            )));
        }
    }
    Ok(())
}

/// Bounds a JSON `PushRequest` before it is parsed: every JSON object
/// becomes a struct, so the count of objects (outside strings) bounds what
/// parsing allocates beyond the body itself.
fn scan_json(b: &[u8], l: &Limits) -> Result<(), ApiError> {
    let per_series = 2usize.saturating_add(max_wire_labels(l).saturating_mul(2));
    let limit = l
        .max_profiles_per_push
        .saturating_mul(per_series)
        .saturating_add(1);
    let (mut objects, mut in_string, mut escaped) = (0usize, false, false);
    for &c in b {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            b'"' => in_string = true,
            b'{' => {
                objects += 1;
                if objects > limit {
                    return Err(ApiError::TooLarge(format!(
                        "the JSON request has more than {limit} objects: more series, samples \
                         or labels than the limits allow"
                    )));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// A series' labels as Fathom labels and the profile name (`__name__`).
fn series_labels(i: usize, pairs: &[LabelPair]) -> Result<(Labels, Option<String>), ApiError> {
    let mut name = None;
    let mut out: Vec<(String, String)> = Vec::with_capacity(pairs.len());
    for p in pairs {
        if p.name == "__name__" {
            if !p.value.is_empty() {
                name = Some(p.value.clone());
            }
            continue;
        }
        if p.name.starts_with("__") || p.value.is_empty() {
            continue;
        }
        let n = p.name.replace('.', "_");
        if !valid_label_name(&n) {
            return Err(ApiError::bad_request(format!(
                "series {i}: label name {:?} is not valid: use [a-zA-Z_][a-zA-Z0-9_.]*",
                p.name
            )));
        }
        match out.iter().find(|(k, _)| *k == n) {
            Some((_, v)) if *v == p.value => {}
            Some(_) => {
                return Err(ApiError::bad_request(format!(
                    "series {i}: label {n:?} is given twice with different values{}",
                    if n != p.name {
                        format!(" (after {:?} became {n:?})", p.name)
                    } else {
                        String::new()
                    }
                )));
            }
            None => out.push((n, p.value.clone())),
        }
    }
    if !out.iter().any(|(k, _)| k == SERVICE_NAME) {
        return Err(ApiError::bad_request(format!(
            "series {i}: the service_name label is required (it names the application, \
             as in Pyroscope)"
        )));
    }
    let labels =
        Labels::from_pairs(out).map_err(|e| ApiError::bad_request(format!("series {i}: {e}")))?;
    Ok((labels, name))
}

/// Every sample of every series as a pprof payload.
fn payloads(tenant: &TenantId, push: PushRequest, l: &Limits) -> Result<Vec<Payload>, ApiError> {
    let mut out = Vec::new();
    for (i, s) in push.series.into_iter().enumerate() {
        let (labels, name) = series_labels(i, &s.labels)?;
        labels
            .check_limits(l.max_labels, l.max_label_name_len, l.max_label_value_len)
            .map_err(|e| ApiError::bad_request(format!("series {i}: {e}")))?;
        for (j, sample) in s.samples.into_iter().enumerate() {
            let idempotence = if sample.id.is_empty() {
                Idempotence::Content(vec!["push.v1".to_owned()])
            } else {
                Idempotence::Key(key_seed(tenant, "push.v1", &sample.id))
            };
            out.push(Payload {
                labels: labels.clone(),
                name_hint: name.clone(),
                idempotence,
                context: format!("series {i} sample {j}"),
                ..Payload::new(Format::Pprof, Bytes::from(sample.raw_profile))
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fathom_proto::pyroscope::push::v1::{RawProfileSeries, RawSample};

    fn lp(n: &str, v: &str) -> LabelPair {
        LabelPair {
            name: n.into(),
            value: v.into(),
        }
    }

    #[test]
    fn labels_follow_pyroscope() {
        let (l, name) = series_labels(
            0,
            &[
                lp("__name__", "process_cpu"),
                lp("service_name", "app"),
                lp("otel.scope.name", "x"),
                lp("__session_id__", "s"),
                lp("empty", ""),
            ],
        )
        .unwrap();
        assert_eq!(name.as_deref(), Some("process_cpu"));
        assert_eq!(l.get("otel_scope_name"), Some("x"));
        assert_eq!(l.len(), 2, "{l}");
        let e = series_labels(3, &[lp("env", "a")]).unwrap_err();
        assert!(
            e.to_string().contains("series 3: the service_name label"),
            "{e}"
        );
        let e = series_labels(
            0,
            &[lp("service_name", "a"), lp("a.b", "1"), lp("a_b", "2")],
        )
        .unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
        let e = series_labels(0, &[lp("service_name", "a"), lp("1x", "1")]).unwrap_err();
        assert!(e.to_string().contains("\"1x\""), "{e}");
    }

    fn request(series: usize, labels: usize, samples: usize) -> PushRequest {
        PushRequest {
            series: (0..series)
                .map(|_| RawProfileSeries {
                    labels: (0..labels).map(|k| lp(&format!("l{k}"), "v")).collect(),
                    samples: (0..samples)
                        .map(|k| RawSample {
                            raw_profile: vec![1, 2, 3],
                            id: format!("id-{k}"),
                        })
                        .collect(),
                    annotations: vec![],
                })
                .collect(),
        }
    }

    #[test]
    fn the_wire_scan_counts_like_the_decoded_check() {
        let l = Limits {
            max_labels: 4,
            max_profiles_per_push: 10,
            ..Limits::default()
        };
        for (series, labels, samples, ok) in [
            (1, 4, 1, true),
            (2, 16, 5, true),
            (11, 1, 0, false),
            (1, 17, 1, false),
            (3, 1, 4, false),
        ] {
            let r = request(series, labels, samples);
            let wire = r.encode_to_vec();
            assert_eq!(
                scan_proto(&wire, &l).is_ok(),
                ok,
                "{series} {labels} {samples}"
            );
            assert_eq!(
                check_counts(&r, &l).is_ok(),
                ok,
                "{series} {labels} {samples}"
            );
            let json = serde_json::to_vec(&r).unwrap();
            if ok {
                assert!(scan_json(&json, &l).is_ok());
                let back: PushRequest = serde_json::from_slice(&json).unwrap();
                assert_eq!(back, r);
            }
        }
        // Truncated and garbage bytes are named as such.
        let wire = request(2, 2, 2).encode_to_vec();
        let e = scan_proto(&wire[..wire.len() - 3], &l).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
        assert!(scan_proto(&[0xff; 20], &l).is_err());
        // A JSON body of empty objects is bounded by its object count.
        let many = format!("{{\"series\":[{}]}}", vec!["{}"; 1000].join(","));
        assert!(scan_json(many.as_bytes(), &l).is_err());
        // Braces inside strings do not count.
        let quoted = format!("{{\"series\":[],\"x\":\"{}\"}}", "{\\\"".repeat(1000));
        assert!(scan_json(quoted.as_bytes(), &l).is_ok());
    }

    #[test]
    fn json_uses_the_canonical_mapping() {
        let j = r#"{"series":[{"labels":[{"name":"service_name","value":"a"}],
                   "samples":[{"rawProfile":"AQID","ID":"u-1"}]}]}"#;
        let r: PushRequest = serde_json::from_str(j).unwrap();
        assert_eq!(r.series[0].samples[0].raw_profile, vec![1, 2, 3]);
        assert_eq!(r.series[0].samples[0].id, "u-1");
        let j = r#"{"series":[{"samples":[{"raw_profile":"AQID"}]}]}"#;
        let r: PushRequest = serde_json::from_str(j).unwrap();
        assert_eq!(r.series[0].samples[0].raw_profile, vec![1, 2, 3]);
    }

    #[test]
    fn samples_become_payloads_with_keys() {
        let t = TenantId::new("t").unwrap();
        let mut r = request(2, 0, 2);
        for s in &mut r.series {
            s.labels = vec![lp("service_name", "a"), lp("__name__", "memory")];
        }
        r.series[1].samples[1].id = String::new();
        let p = payloads(&t, r, &Limits::default()).unwrap();
        assert_eq!(p.len(), 4);
        assert_eq!(p[3].context, "series 1 sample 1");
        assert_eq!(p[0].name_hint.as_deref(), Some("memory"));
        assert!(matches!(p[0].idempotence, Idempotence::Key(_)));
        assert!(matches!(p[3].idempotence, Idempotence::Content(_)));
    }
}
