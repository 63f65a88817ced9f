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
//!   [`IngestBatch`](fathom_model::IngestBatch).
//!
//! Conversion from the wire recomputes every content-addressed id from the
//! content, so a sender can never make two processes disagree on an id.

#[allow(unreachable_pub, clippy::all)]
mod encode;

pub use encode::encode_write_request;

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
    #[error("sample refers to a stack the request does not define")]
    UnknownStack,
}

fn id(what: &'static str, b: &[u8]) -> Result<Id, ConvertError> {
    Id::from_slice(b).ok_or(ConvertError::IdLength { what, len: b.len() })
}

impl From<&model::IngestBatch> for ingester::WriteRequest {
    fn from(b: &model::IngestBatch) -> Self {
        let s = &b.symbols;
        ingester::WriteRequest {
            tenant: b.tenant.to_string(),
            profiles: b
                .profiles
                .iter()
                .map(|p| ingester::Profile {
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
                    samples: p
                        .samples
                        .iter()
                        .map(|x| ingester::Sample {
                            stack_id: x.stack.0.to_vec(),
                            value: x.value,
                        })
                        .collect(),
                })
                .collect(),
            functions: s
                .functions
                .values()
                .map(|f| ingester::Function {
                    name: f.name.clone(),
                    system_name: f.system_name.clone(),
                    filename: f.filename.clone(),
                    start_line: f.start_line,
                })
                .collect(),
            mappings: s
                .mappings
                .values()
                .map(|m| ingester::Mapping {
                    memory_start: m.memory_start,
                    memory_limit: m.memory_limit,
                    file_offset: m.file_offset,
                    filename: m.filename.clone(),
                    build_id: m.build_id.clone(),
                })
                .collect(),
            locations: s
                .locations
                .values()
                .map(|l| ingester::Location {
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
                })
                .collect(),
            stacks: s
                .stacks
                .values()
                .map(|st| ingester::Stack {
                    location_ids: st.locations.iter().map(|l| l.0.to_vec()).collect(),
                })
                .collect(),
        }
    }
}

impl TryFrom<ingester::WriteRequest> for model::IngestBatch {
    type Error = ConvertError;

    fn try_from(r: ingester::WriteRequest) -> Result<Self, ConvertError> {
        let tenant = model::TenantId::new(&r.tenant)?;
        let mut symbols = model::Symbols::default();
        for f in r.functions {
            symbols.add_function(model::Function {
                name: f.name,
                system_name: f.system_name,
                filename: f.filename,
                start_line: f.start_line,
            });
        }
        for m in r.mappings {
            symbols.add_mapping(model::Mapping {
                memory_start: m.memory_start,
                memory_limit: m.memory_limit,
                file_offset: m.file_offset,
                filename: m.filename,
                build_id: m.build_id,
            });
        }
        for l in r.locations {
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
            symbols.add_location(model::Location {
                mapping: id("mapping", &l.mapping_id)?,
                address: l.address,
                lines,
            });
        }
        for (index, st) in r.stacks.iter().enumerate() {
            let locations = st
                .location_ids
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let lid = id("location", b)?;
                    if symbols.locations.contains_key(&lid) {
                        Ok(lid)
                    } else {
                        Err(ConvertError::UnknownLocation {
                            index,
                            index_in_stack: i,
                        })
                    }
                })
                .collect::<Result<_, ConvertError>>()?;
            symbols.add_stack(model::Stack { locations });
        }
        let profiles = r
            .profiles
            .into_iter()
            .map(|p| {
                let samples = p
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
                    .collect::<Result<_, ConvertError>>()?;
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
        let back = model::IngestBatch::try_from(wire).unwrap();
        assert_eq!(back, batch);
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
