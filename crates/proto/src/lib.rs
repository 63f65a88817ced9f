//! Protobuf types at Fathom's edges, and the one place where they convert
//! into domain types.
//!
//! - [`pprof`]: Google's pprof `Profile`, as clients send it and as the query
//!   API returns it.
//! - [`push`]: `fathom.push.v1.PushService`, the native push API.
//! - [`pyroscope`]: Grafana Pyroscope's public API types, written from
//!   Pyroscope's definitions with the same packages and field numbers:
//!   `push.v1.PusherService` (what current Pyroscope SDKs push with, over
//!   Connect or gRPC), the query API that Grafana's Pyroscope data source
//!   speaks over Connect (`querier.v1`, `google.v1`) and the shared
//!   `types.v1`; with serde impls of the canonical protobuf JSON mapping
//!   (pbjson) for Connect's `application/json`.
//! - [`ingester`]: `fathom.ingester.v1`, the normalized write a distributor
//!   sends to ingesters; the ingester's write-ahead log stores the same
//!   message, so replay and network writes share one decoder;
//!   [`encode_write_request`] writes that message's bytes straight from an
//!   [`IngestBatch`](fathom_model::IngestBatch), once per write, and
//!   [`decode_write_request`] reads them back.
//!
//! Record format versions ([`WRITE_FORMAT`]): in formats 2 and 3 every
//! symbol carries the content-addressed id the distributor computed, and
//! the receiver takes it as sent (the ingester's write API is only open to
//! holders of the cluster secret, and every process computes ids with the
//! same code). A format-2 stack names its locations by id (16 bytes per
//! frame, one packed field); a format-3 stack by their index among the
//! record's locations (a varint per frame), which makes a record about a
//! third of the size. A format-4 profile writes its samples as two
//! columns, each sample's stack as its index among the record's stacks
//! and its value (two varints instead of a message with a 16-byte id), so
//! that a receiver finds a sample's stack by position, not by a lookup.
//! Format 0, the first one, has no ids and the receiver recomputes them
//! from the content. Format 5 ([`WRITE_FORMAT_HELD`]) is format 4 written
//! after leaving out what the receiving head holds (a single process's
//! ingester, a distributor for what every replica acknowledged): it may
//! name such stacks and locations by id without carrying them, and is
//! read against that head ([`decode_write_request_skipping`]). A WAL
//! written in format 0, 2, 3, 4 or 5 replays; any other version is refused
//! with [`ConvertError::FormatVersion`].

#[allow(unreachable_pub, clippy::all)]
mod encode;
mod record;

pub use encode::{encode_write, encode_write_request};

/// The format version of the `WriteRequest`s this build writes: symbols
/// carry their ids, stacks index the record's locations, samples index
/// the record's stacks (see the crate documentation).
pub const WRITE_FORMAT: u32 = 4;

/// [`WRITE_FORMAT`] written after leaving out what the receiving head
/// holds (by a single process's ingester for its own WAL, or by a
/// distributor for the stacks every replica acknowledged): a sample may
/// name by id a stack the record lacks, and a stack a location it lacks,
/// when the head the records before it built holds them. Decoding against that head
/// ([`decode_write_request_skipping`]) reads it; replay applies records
/// in order, so the head holds them again. Without the head it reads as
/// format 4 does: every reference must be in the record.
pub const WRITE_FORMAT_HELD: u32 = 5;

/// Symbols carry their ids, stacks index the record's locations, samples
/// name their stack by id.
pub const WRITE_FORMAT_V3: u32 = 3;

/// Symbols carry their ids, stacks name their locations by id.
pub const WRITE_FORMAT_V2: u32 = 2;

/// The first format: no symbol ids, recomputed by the receiver.
pub const WRITE_FORMAT_V0: u32 = 0;

pub mod pprof {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

#[allow(unreachable_pub, clippy::all)]
pub mod push {
    include!(concat!(env!("OUT_DIR"), "/fathom.push.v1.rs"));
}

#[allow(unreachable_pub, clippy::all)]
pub mod ingester {
    include!(concat!(env!("OUT_DIR"), "/fathom.ingester.v1.rs"));
}

/// Pyroscope's public API types, in modules named after their protobuf
/// packages (`types.v1` is `pyroscope::types::v1`), as prost's generated
/// cross-package paths expect.
pub mod pyroscope {
    pub mod types {
        #[allow(unreachable_pub, clippy::all)]
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/types.v1.rs"));
            include!(concat!(env!("OUT_DIR"), "/types.v1.serde.rs"));
        }
    }
    pub mod push {
        #[allow(unreachable_pub, clippy::all)]
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/push.v1.rs"));
            include!(concat!(env!("OUT_DIR"), "/push.v1.serde.rs"));
        }
    }
    pub mod google {
        /// pprof's `Profile` as Pyroscope's API names it.
        #[allow(unreachable_pub, clippy::all)]
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/google.v1.rs"));
            include!(concat!(env!("OUT_DIR"), "/google.v1.serde.rs"));
        }
    }
    pub mod querier {
        #[allow(unreachable_pub, clippy::all)]
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/querier.v1.rs"));
            include!(concat!(env!("OUT_DIR"), "/querier.v1.serde.rs"));
        }
    }
}

use fathom_model as model;
use model::Id;

/// Why a wire message could not become a domain value.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("invalid tenant: {0}")]
    Tenant(#[from] model::TenantError),
    #[error("invalid profile type: {0}")]
    ProfileType(#[from] model::ProfileTypeError),
    #[error("invalid labels: {0}")]
    Labels(#[from] model::LabelError),
    #[error("{what} id must be 16 bytes, got {len}")]
    IdLength { what: &'static str, len: usize },
    #[error("stack {index} refers to location {index_in_stack} that the request does not define")]
    UnknownLocation { index: usize, index_in_stack: usize },
    #[error("stack {index} names its locations both by id and by index")]
    TwoLocationLists { index: usize },
    #[error("sample refers to a stack the request does not define")]
    UnknownStack,
    #[error(
        "sample {sample} of profile {profile} refers to stack {stack}, and the request has {stacks}"
    )]
    StackIndex {
        profile: usize,
        sample: usize,
        stack: u32,
        stacks: usize,
    },
    #[error(
        "profile {profile} has {stacks} sample stacks and {values} sample values; they must be as many"
    )]
    SampleColumns {
        profile: usize,
        stacks: usize,
        values: usize,
    },
    #[error(
        "write request format version {version} is not known to this build (it reads {WRITE_FORMAT_V0}, \
         {WRITE_FORMAT_V2}, {WRITE_FORMAT_V3}, {WRITE_FORMAT} and {WRITE_FORMAT_HELD}): written by a newer version of fathom?"
    )]
    FormatVersion { version: u32 },
    #[error("write request is not a valid protobuf message")]
    Decode(#[from] prost::DecodeError),
}

/// `b` as a `WriteRequest` of format 3 (samples name their stack by id),
/// as WALs written before format 4 hold it; for tests and benchmarks of
/// their replay.
pub fn write_request_format3(b: &model::IngestBatch) -> ingester::WriteRequest {
    let mut r = ingester::WriteRequest::from(b);
    r.format_version = WRITE_FORMAT_V3;
    for p in &mut r.profiles {
        let stacks = std::mem::take(&mut p.sample_stacks);
        let values = std::mem::take(&mut p.sample_values);
        p.samples.extend(
            stacks
                .into_iter()
                .zip(values)
                .map(|(s, value)| ingester::Sample {
                    stack_id: r.stacks[s as usize].id.clone(),
                    value,
                }),
        );
    }
    r
}

/// `b` as a `WriteRequest` of format 2 (stacks name their locations by
/// id), as WALs written before format 3 hold it; for tests and benchmarks
/// of their replay.
pub fn write_request_format2(b: &model::IngestBatch) -> ingester::WriteRequest {
    let mut r = write_request_format3(b);
    r.format_version = WRITE_FORMAT_V2;
    for s in &mut r.stacks {
        s.locations = std::mem::take(&mut s.location_indexes)
            .into_iter()
            .flat_map(|i| r.locations[i as usize].id.clone())
            .collect();
    }
    r
}

/// `b` as a `WriteRequest` of the first format (format 0: no symbol ids,
/// one element per location id in stacks), as WALs written before format 2
/// hold it; for tests and benchmarks of their replay.
pub fn write_request_format0(b: &model::IngestBatch) -> ingester::WriteRequest {
    let mut r = write_request_format2(b);
    r.format_version = WRITE_FORMAT_V0;
    r.functions.iter_mut().for_each(|f| f.id.clear());
    r.mappings.iter_mut().for_each(|m| m.id.clear());
    r.locations.iter_mut().for_each(|l| l.id.clear());
    for s in &mut r.stacks {
        s.id.clear();
        s.location_ids = std::mem::take(&mut s.locations)
            .chunks(16)
            .map(<[u8]>::to_vec)
            .collect();
    }
    r
}

/// Decodes the bytes of a `WriteRequest` (a WAL record, a replicated write)
/// into a batch; see [`WRITE_FORMAT`] for which ids are taken as sent.
///
/// A well-formed format-2, 3 or 4 record is read straight from its bytes (no
/// intermediate prost message, about 2x faster: docs/benchmarks.md);
/// anything else (format 0, damaged or refused records) goes through
/// prost and [`TryFrom`], which decides and words the error. Both give the
/// same result for every input (tested on damaged records too).
pub fn decode_write_request(record: &[u8]) -> Result<model::IngestBatch, ConvertError> {
    if let Some(batch) = record::decode_direct(record) {
        return Ok(batch);
    }
    decode_write_request_prost(record)
}

/// [`decode_write_request`] for a table that already holds many of the
/// record's symbols (an ingester's head): the batch's symbols are what the
/// record's stacks that `known(tenant)` lacks reach, without what it
/// holds, so that known symbols are neither looked up one by one nor
/// copied only to be dropped when the batch is applied. `known` must be
/// closed (a stack's locations, a location's functions and mapping come
/// with it), as a head's table is. The record is read, and accepted or
/// refused, exactly as [`decode_write_request`] does; every reference is
/// checked against the record itself. A record that takes the prost path
/// gives every symbol.
pub fn decode_write_request_skipping<'k>(
    record: &[u8],
    known: impl FnOnce(&str) -> Option<&'k model::Symbols>,
) -> Result<model::IngestBatch, ConvertError> {
    decode_write_request_held(record, known, false)
}

/// [`decode_write_request_skipping`]; with `trusted`, the stacks that a
/// format-5 record's samples name without carrying them are taken as held
/// by `known` without looking each one up. Only for a caller that knows
/// it: an ingester whose head still has the number under which the
/// sender learned that it holds them (`Record.held_under`). A stack it
/// lacks after all would be named by samples with no frames, so nothing
/// else may pass `true`.
pub fn decode_write_request_held<'k>(
    record: &[u8],
    known: impl FnOnce(&str) -> Option<&'k model::Symbols>,
    trusted: bool,
) -> Result<model::IngestBatch, ConvertError> {
    if let Some(batch) = record::decode_held(record, known, trusted) {
        return Ok(batch);
    }
    decode_write_request_prost(record)
}

/// The format version of the encoded `WriteRequest` `record` (0 when
/// absent; see [`WRITE_FORMAT`]), `None` if its fields cannot be read:
/// for wording why a record was refused.
pub fn write_format(record: &[u8]) -> Option<u32> {
    record::format_of(record)
}

/// [`decode_write_request`] through the prost message only: the reference
/// the direct decoder is tested and benchmarked against.
pub fn decode_write_request_prost(record: &[u8]) -> Result<model::IngestBatch, ConvertError> {
    let req = <ingester::WriteRequest as prost::Message>::decode(record)?;
    model::IngestBatch::try_from(req)
}

fn id(what: &'static str, b: &[u8]) -> Result<Id, ConvertError> {
    Id::from_slice(b).ok_or(ConvertError::IdLength { what, len: b.len() })
}

impl From<&model::IngestBatch> for ingester::WriteRequest {
    fn from(b: &model::IngestBatch) -> Self {
        let s = &b.symbols;
        // Format 3: a stack names its locations by index, unless one of
        // them is missing from the request (then by id, as in format 2);
        // the same order and choice as `encode_write_request`'s.
        let frames = encode::StackFrames::new(s);
        let positions = frames.sample_stacks(&b.profiles);
        let locations = frames
            .locations
            .iter()
            .map(|&(id, l)| location_message(id, l))
            .collect();
        let stacks = frames
            .stacks
            .iter()
            .enumerate()
            .map(|(k, &(id, st))| {
                let mut m = stack_message(id, st);
                if let Some(ix) = frames.indexes(k) {
                    m.location_indexes = ix.to_vec();
                    m.locations.clear();
                }
                m
            })
            .collect();
        let ingester::HeadSymbols {
            functions,
            mappings,
            ..
        } = function_and_mapping_messages(s);
        ingester::WriteRequest {
            tenant: b.tenant.to_string(),
            profiles: b
                .profiles
                .iter()
                .enumerate()
                .map(|(k, p)| {
                    // Format 4: the samples as columns, unless one's stack
                    // is missing from the request (then by id).
                    let (samples, sample_stacks, sample_values) = match positions.of(k) {
                        Some((at, _)) => (
                            Vec::new(),
                            at.to_vec(),
                            p.samples.iter().map(|x| x.value).collect(),
                        ),
                        None => (
                            p.samples
                                .iter()
                                .map(|x| ingester::Sample {
                                    stack_id: x.stack.0.to_vec(),
                                    value: x.value,
                                })
                                .collect(),
                            Vec::new(),
                            Vec::new(),
                        ),
                    };
                    ingester::Profile {
                        id: p.id.0.to_vec(),
                        profile_type: p.profile_type.to_string(),
                        labels: p
                            .labels
                            .iter()
                            .map(|(k, v)| ingester::Label {
                                name: k.to_owned(),
                                value: v.to_owned(),
                            })
                            .collect(),
                        time_nanos: p.time_nanos,
                        duration_nanos: p.duration_nanos,
                        period: p.period,
                        samples,
                        sample_stacks,
                        sample_values,
                    }
                })
                .collect(),
            functions,
            mappings,
            locations,
            stacks,
            format_version: frames.format(&positions),
        }
    }
}

impl TryFrom<ingester::WriteRequest> for model::IngestBatch {
    type Error = ConvertError;

    fn try_from(r: ingester::WriteRequest) -> Result<Self, ConvertError> {
        let trusted = match r.format_version {
            WRITE_FORMAT | WRITE_FORMAT_V3 | WRITE_FORMAT_V2 => true,
            // Format 5 without the head it was written to: every
            // reference must be in the record, as in format 4.
            WRITE_FORMAT_HELD => true,
            WRITE_FORMAT_V0 => false,
            version => return Err(ConvertError::FormatVersion { version }),
        };
        let mut r = r;
        if matches!(
            r.format_version,
            WRITE_FORMAT | WRITE_FORMAT_HELD | WRITE_FORMAT_V3
        ) {
            located_by_id(&r.locations, &mut r.stacks)?;
        }
        // Format 4's samples index the stacks: their ids by position.
        let columns = matches!(r.format_version, WRITE_FORMAT | WRITE_FORMAT_HELD);
        let stack_ids = if columns {
            r.stacks
                .iter()
                .map(|st| id("stack", &st.id))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            Vec::new()
        };
        let tenant = model::TenantId::new(&r.tenant)?;
        let symbols = if trusted {
            model::Symbols::try_from(ingester::HeadSymbols {
                functions: r.functions,
                mappings: r.mappings,
                locations: r.locations,
                stacks: r.stacks,
            })?
        } else {
            recomputed_symbols(r.functions, r.mappings, r.locations, &r.stacks)?
        };
        let profiles = r
            .profiles
            .into_iter()
            .enumerate()
            .map(|(profile, p)| {
                let mut samples = p
                    .samples
                    .iter()
                    .map(|x| {
                        let stack = id("stack", &x.stack_id)?;
                        if !symbols.stacks.contains_key(&stack) {
                            return Err(ConvertError::UnknownStack);
                        }
                        Ok(model::Sample {
                            stack,
                            value: x.value,
                        })
                    })
                    .collect::<Result<Vec<_>, ConvertError>>()?;
                if columns {
                    if p.sample_stacks.len() != p.sample_values.len() {
                        return Err(ConvertError::SampleColumns {
                            profile,
                            stacks: p.sample_stacks.len(),
                            values: p.sample_values.len(),
                        });
                    }
                    samples.reserve(p.sample_stacks.len());
                    for (sample, (&s, &value)) in
                        p.sample_stacks.iter().zip(&p.sample_values).enumerate()
                    {
                        let stack = *stack_ids.get(s as usize).ok_or(ConvertError::StackIndex {
                            profile,
                            sample,
                            stack: s,
                            stacks: stack_ids.len(),
                        })?;
                        samples.push(model::Sample { stack, value });
                    }
                }
                Ok(model::Profile {
                    id: id("profile", &p.id)?,
                    profile_type: p.profile_type.parse()?,
                    labels: model::Labels::from_pairs(
                        p.labels.into_iter().map(|l| (l.name, l.value)),
                    )?,
                    time_nanos: p.time_nanos,
                    duration_nanos: p.duration_nanos,
                    period: p.period,
                    samples,
                })
            })
            .collect::<Result<_, ConvertError>>()?;
        Ok(model::IngestBatch {
            tenant,
            profiles,
            symbols,
        })
    }
}

/// `s` with every symbol's content-addressed id: the symbols of a format-2
/// write and of a head symbol read.
impl From<&model::Symbols> for ingester::HeadSymbols {
    fn from(s: &model::Symbols) -> Self {
        ingester::HeadSymbols {
            locations: s
                .locations
                .iter()
                .map(|(id, l)| location_message(id, l))
                .collect(),
            stacks: s
                .stacks
                .iter()
                .map(|(id, st)| stack_message(id, st))
                .collect(),
            ..function_and_mapping_messages(s)
        }
    }
}

/// The functions and mappings of `s` as messages (no locations or stacks).
fn function_and_mapping_messages(s: &model::Symbols) -> ingester::HeadSymbols {
    ingester::HeadSymbols {
        functions: s
            .functions
            .iter()
            .map(|(id, f)| ingester::Function {
                name: f.name.clone(),
                system_name: f.system_name.clone(),
                filename: f.filename.clone(),
                start_line: f.start_line,
                id: id.0.to_vec(),
            })
            .collect(),
        mappings: s
            .mappings
            .iter()
            .map(|(id, m)| ingester::Mapping {
                memory_start: m.memory_start,
                memory_limit: m.memory_limit,
                file_offset: m.file_offset,
                filename: m.filename.clone(),
                build_id: m.build_id.clone(),
                id: id.0.to_vec(),
            })
            .collect(),
        locations: Vec::new(),
        stacks: Vec::new(),
    }
}

fn location_message(id: &Id, l: &model::Location) -> ingester::Location {
    ingester::Location {
        mapping_id: l.mapping.0.to_vec(),
        address: l.address,
        lines: l
            .lines
            .iter()
            .map(|x| ingester::Line {
                function_id: x.function.0.to_vec(),
                line: x.line,
            })
            .collect(),
        id: id.0.to_vec(),
    }
}

/// A stack by location id (format 2).
fn stack_message(id: &Id, st: &model::Stack) -> ingester::Stack {
    ingester::Stack {
        location_ids: Vec::new(),
        location_indexes: Vec::new(),
        id: id.0.to_vec(),
        locations: st.locations.iter().flat_map(|l| l.0).collect(),
    }
}

/// Symbols with their ids as sent (format 2, head symbol reads); every
/// location a stack names must be among them.
impl TryFrom<ingester::HeadSymbols> for model::Symbols {
    type Error = ConvertError;

    fn try_from(m: ingester::HeadSymbols) -> Result<Self, ConvertError> {
        let mut symbols = model::Symbols::default();
        symbols.functions.reserve(m.functions.len());
        symbols.mappings.reserve(m.mappings.len());
        symbols.locations.reserve(m.locations.len());
        symbols.stacks.reserve(m.stacks.len());
        for f in m.functions {
            symbols
                .functions
                .insert(id("function", &f.id)?, function(f));
        }
        for x in m.mappings {
            symbols.mappings.insert(id("mapping", &x.id)?, mapping(x));
        }
        for l in m.locations {
            let lid = l.id.clone();
            let loc = location(l)?;
            symbols.locations.insert(id("location", &lid)?, loc);
        }
        for (index, st) in m.stacks.iter().enumerate() {
            if st.locations.len() % 16 != 0 {
                return Err(ConvertError::IdLength {
                    what: "stack locations",
                    len: st.locations.len(),
                });
            }
            let locations = st
                .locations
                .chunks_exact(16)
                .map(|c| Id(c.try_into().expect("16-byte chunk")))
                .enumerate()
                .map(|(i, lid)| known_location(&symbols, index, i, lid))
                .collect::<Result<_, ConvertError>>()?;
            symbols
                .stacks
                .insert(id("stack", &st.id)?, model::Stack { locations });
        }
        Ok(symbols)
    }
}

/// Format 3: each stack's `location_indexes` turned into the location ids
/// of format 2 (`locations`), which the rest of the conversion reads.
fn located_by_id(
    locations: &[ingester::Location],
    stacks: &mut [ingester::Stack],
) -> Result<(), ConvertError> {
    for (index, st) in stacks.iter_mut().enumerate() {
        if st.location_indexes.is_empty() {
            continue;
        }
        if !st.locations.is_empty() {
            return Err(ConvertError::TwoLocationLists { index });
        }
        let mut ids = Vec::with_capacity(16 * st.location_indexes.len());
        for (i, &l) in st.location_indexes.iter().enumerate() {
            let loc = locations
                .get(l as usize)
                .ok_or(ConvertError::UnknownLocation {
                    index,
                    index_in_stack: i,
                })?;
            ids.extend_from_slice(&id("location", &loc.id)?.0);
        }
        st.locations = ids;
        st.location_indexes.clear();
    }
    Ok(())
}

/// Format 0: symbols without ids; the ids are computed from the content.
fn recomputed_symbols(
    functions: Vec<ingester::Function>,
    mappings: Vec<ingester::Mapping>,
    locations: Vec<ingester::Location>,
    stacks: &[ingester::Stack],
) -> Result<model::Symbols, ConvertError> {
    let mut symbols = model::Symbols::default();
    for f in functions {
        symbols.add_function(function(f));
    }
    for m in mappings {
        symbols.add_mapping(mapping(m));
    }
    for l in locations {
        symbols.add_location(location(l)?);
    }
    for (index, st) in stacks.iter().enumerate() {
        let locations = st
            .location_ids
            .iter()
            .enumerate()
            .map(|(i, b)| known_location(&symbols, index, i, id("location", b)?))
            .collect::<Result<_, ConvertError>>()?;
        symbols.add_stack(model::Stack { locations });
    }
    Ok(symbols)
}

fn function(f: ingester::Function) -> model::Function {
    model::Function {
        name: f.name,
        system_name: f.system_name,
        filename: f.filename,
        start_line: f.start_line,
    }
}

fn mapping(m: ingester::Mapping) -> model::Mapping {
    model::Mapping {
        memory_start: m.memory_start,
        memory_limit: m.memory_limit,
        file_offset: m.file_offset,
        filename: m.filename,
        build_id: m.build_id,
    }
}

fn location(l: ingester::Location) -> Result<model::Location, ConvertError> {
    let lines = l
        .lines
        .iter()
        .map(|x| {
            Ok(model::Line {
                function: id("function", &x.function_id)?,
                line: x.line,
            })
        })
        .collect::<Result<_, ConvertError>>()?;
    Ok(model::Location {
        mapping: id("mapping", &l.mapping_id)?,
        address: l.address,
        lines,
    })
}

/// `lid`, the `i`th location of stack `index`, when `symbols` holds it.
fn known_location(
    symbols: &model::Symbols,
    index: usize,
    i: usize,
    lid: Id,
) -> Result<Id, ConvertError> {
    if symbols.locations.contains_key(&lid) {
        Ok(lid)
    } else {
        Err(ConvertError::UnknownLocation {
            index,
            index_in_stack: i,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_request_round_trip() {
        let mut symbols = model::Symbols::default();
        let f = symbols.add_function(model::Function {
            name: "main".into(),
            ..Default::default()
        });
        let m = symbols.add_mapping(model::Mapping {
            filename: "/bin/x".into(),
            ..Default::default()
        });
        let l = symbols.add_location(model::Location {
            mapping: m,
            address: 7,
            lines: vec![model::Line {
                function: f,
                line: 3,
            }],
        });
        let st = symbols.add_stack(model::Stack { locations: vec![l] });
        let batch = model::IngestBatch {
            tenant: model::TenantId::new("t1").unwrap(),
            profiles: vec![model::Profile {
                id: Id::from_u128(9),
                profile_type: "a:b:c:d:e".parse().unwrap(),
                labels: model::Labels::from_pairs([("service_name", "s")]).unwrap(),
                time_nanos: 1,
                duration_nanos: 2,
                period: 3,
                samples: vec![model::Sample {
                    stack: st,
                    value: 5,
                }],
            }],
            symbols,
        };
        let wire = ingester::WriteRequest::from(&batch);
        assert_eq!(wire.format_version, WRITE_FORMAT);
        // Format 3: the stack names its location by index, not by id.
        assert_eq!(wire.stacks[0].location_indexes, vec![0]);
        assert!(wire.stacks[0].locations.is_empty());
        // Format 4: the sample names its stack by index, in a column.
        assert_eq!(wire.profiles[0].sample_stacks, vec![0]);
        assert_eq!(wire.profiles[0].sample_values, vec![5]);
        assert!(wire.profiles[0].samples.is_empty());
        let back = model::IngestBatch::try_from(wire.clone()).unwrap();
        assert_eq!(back, batch);

        // Format 3 (a WAL written before format 4): samples by stack id,
        // both decoders, the same batch.
        let v3 = write_request_format3(&batch);
        assert_eq!(v3.format_version, WRITE_FORMAT_V3);
        assert_eq!(v3.profiles[0].samples[0].stack_id, st.0.to_vec());
        assert!(v3.profiles[0].sample_stacks.is_empty());
        let v3_bytes = prost::Message::encode_to_vec(&v3);
        assert_eq!(decode_write_request(&v3_bytes).unwrap(), batch);
        assert_eq!(decode_write_request_prost(&v3_bytes).unwrap(), batch);

        // Columns of different lengths, or an index past the record's
        // stacks, are refused, naming the profile and the sample.
        let mut short = wire.clone();
        short.profiles[0].sample_values.push(8);
        let err = decode_write_request(&prost::Message::encode_to_vec(&short)).unwrap_err();
        assert!(
            matches!(
                err,
                ConvertError::SampleColumns {
                    profile: 0,
                    stacks: 1,
                    values: 2
                }
            ),
            "{err}"
        );
        let mut past = wire.clone();
        past.profiles[0].sample_stacks = vec![1];
        let err = decode_write_request(&prost::Message::encode_to_vec(&past)).unwrap_err();
        assert!(
            matches!(
                err,
                ConvertError::StackIndex {
                    profile: 0,
                    sample: 0,
                    stack: 1,
                    stacks: 1
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("refers to stack 1"), "{err}");
        // Format 3 has no columns: a format-3 record's are not read.
        let mut v3_cols = v3.clone();
        v3_cols.profiles[0].sample_stacks = vec![0];
        v3_cols.profiles[0].sample_values = vec![1];
        let v3_cols = prost::Message::encode_to_vec(&v3_cols);
        assert_eq!(decode_write_request(&v3_cols).unwrap(), batch);
        assert_eq!(decode_write_request_prost(&v3_cols).unwrap(), batch);

        // Format 2 (a WAL written before format 3): ids in stacks, both
        // decoders, the same batch.
        let v2 = write_request_format2(&batch);
        assert_eq!(v2.stacks[0].locations, l.0.to_vec());
        assert!(v2.stacks[0].location_indexes.is_empty());
        let v2_bytes = prost::Message::encode_to_vec(&v2);
        assert_eq!(decode_write_request(&v2_bytes).unwrap(), batch);
        assert_eq!(decode_write_request_prost(&v2_bytes).unwrap(), batch);

        // A stack with an index past the record's locations, or with both
        // lists, is refused, naming the stack.
        let mut bad = wire.clone();
        bad.stacks[0].location_indexes = vec![1];
        let err = decode_write_request(&prost::Message::encode_to_vec(&bad)).unwrap_err();
        assert!(
            matches!(
                err,
                ConvertError::UnknownLocation {
                    index: 0,
                    index_in_stack: 0
                }
            ),
            "{err}"
        );
        let mut both = wire.clone();
        both.stacks[0].locations = l.0.to_vec();
        let err = decode_write_request(&prost::Message::encode_to_vec(&both)).unwrap_err();
        assert!(
            matches!(err, ConvertError::TwoLocationLists { index: 0 }),
            "{err}"
        );

        // Format 0, the first one (a WAL written before format 2): no ids,
        // recomputed from the content, to the same batch.
        let v0 = write_request_format0(&batch);
        assert!(v0.stacks.iter().all(|s| s.locations.is_empty()));
        let v0_bytes = prost::Message::encode_to_vec(&v0);
        assert_eq!(decode_write_request(&v0_bytes).unwrap(), batch);

        // Format 4 takes the ids as sent: no re-hashing.
        let mut forged = wire.clone();
        forged.functions[0].id = vec![7; 16];
        forged.locations[0].lines[0].function_id = vec![7; 16];
        let got = model::IngestBatch::try_from(forged).unwrap();
        assert!(got.symbols.functions.contains_key(&Id([7; 16])));

        // A version this build does not know is refused, and says so.
        let mut future = wire;
        future.format_version = 6;
        let err = decode_write_request(&prost::Message::encode_to_vec(&future)).unwrap_err();
        assert!(matches!(err, ConvertError::FormatVersion { version: 6 }));
        assert!(
            err.to_string().contains("format version 6") && err.to_string().contains("newer"),
            "{err}"
        );
    }

    #[test]
    fn refuses_dangling_stack() {
        let r = ingester::WriteRequest {
            tenant: "t".into(),
            profiles: vec![ingester::Profile {
                id: vec![0; 16],
                profile_type: "a:b:c:d:e".into(),
                samples: vec![ingester::Sample {
                    stack_id: vec![1; 16],
                    value: 1,
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(matches!(
            model::IngestBatch::try_from(r),
            Err(ConvertError::UnknownStack)
        ));
    }
}
