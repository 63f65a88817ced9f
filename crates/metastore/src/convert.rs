//! The one place where metastore protobuf messages become domain types.

use fathom_block::{BlockMeta, BlockStats};
use tonic::Status;

use crate::proto;
use crate::types::{Member, PendingDeletion, Role};

impl From<Role> for proto::Role {
    fn from(r: Role) -> Self {
        match r {
            Role::Distributor => proto::Role::Distributor,
            Role::Ingester => proto::Role::Ingester,
            Role::Querier => proto::Role::Querier,
            Role::Compactor => proto::Role::Compactor,
        }
    }
}

pub(crate) fn role(v: i32) -> Result<Role, String> {
    match proto::Role::try_from(v) {
        Ok(proto::Role::Distributor) => Ok(Role::Distributor),
        Ok(proto::Role::Ingester) => Ok(Role::Ingester),
        Ok(proto::Role::Querier) => Ok(Role::Querier),
        Ok(proto::Role::Compactor) => Ok(Role::Compactor),
        Ok(proto::Role::Unspecified) => Err("member role is unspecified".into()),
        Err(_) => Err(format!("unknown member role {v}")),
    }
}

impl From<&Member> for proto::Member {
    fn from(m: &Member) -> Self {
        proto::Member {
            id: m.id.clone(),
            role: proto::Role::from(m.role) as i32,
            addr: m.addr.clone(),
            registered_at_ms: m.registered_at_ms,
            left: m.left,
        }
    }
}

impl TryFrom<proto::Member> for Member {
    type Error = String;
    fn try_from(m: proto::Member) -> Result<Self, String> {
        Ok(Member {
            role: role(m.role)?,
            id: m.id,
            addr: m.addr,
            registered_at_ms: m.registered_at_ms,
            left: m.left,
        })
    }
}

impl From<&BlockMeta> for proto::BlockMeta {
    fn from(b: &BlockMeta) -> Self {
        let s = &b.stats;
        proto::BlockMeta {
            format_version: b.format_version,
            id: b.id.clone(),
            tenant: b.tenant.clone(),
            min_time_nanos: b.min_time_nanos,
            max_time_nanos: b.max_time_nanos,
            level: b.level,
            source: b.source.clone(),
            compacted_from: b.compacted_from.clone(),
            profile_types: b.profile_types.clone(),
            stats: Some(proto::BlockStats {
                series: s.series,
                profiles: s.profiles,
                samples: s.samples,
                stacks: s.stacks,
                locations: s.locations,
                functions: s.functions,
                mappings: s.mappings,
                bytes: s.bytes,
                sample_bytes: s.sample_bytes,
            }),
            created_at_ms: b.created_at_ms,
            rollup_widths_nanos: b.rollup_widths_nanos.clone(),
        }
    }
}

impl From<proto::BlockMeta> for BlockMeta {
    fn from(b: proto::BlockMeta) -> Self {
        let s = b.stats.unwrap_or_default();
        BlockMeta {
            format_version: b.format_version,
            id: b.id,
            tenant: b.tenant,
            min_time_nanos: b.min_time_nanos,
            max_time_nanos: b.max_time_nanos,
            level: b.level,
            source: b.source,
            compacted_from: b.compacted_from,
            profile_types: b.profile_types,
            stats: BlockStats {
                series: s.series,
                profiles: s.profiles,
                samples: s.samples,
                stacks: s.stacks,
                locations: s.locations,
                functions: s.functions,
                mappings: s.mappings,
                bytes: s.bytes,
                sample_bytes: s.sample_bytes,
            },
            created_at_ms: b.created_at_ms,
            rollup_widths_nanos: b.rollup_widths_nanos,
        }
    }
}

impl From<&PendingDeletion> for proto::PendingDeletion {
    fn from(p: &PendingDeletion) -> Self {
        proto::PendingDeletion {
            block: Some((&p.block).into()),
            removed_at_ms: p.removed_at_ms,
        }
    }
}

impl TryFrom<proto::PendingDeletion> for PendingDeletion {
    type Error = String;
    fn try_from(p: proto::PendingDeletion) -> Result<Self, String> {
        Ok(PendingDeletion {
            block: p.block.ok_or("pending deletion without a block")?.into(),
            removed_at_ms: p.removed_at_ms,
        })
    }
}

/// Longest id, job, owner, address or block id accepted.
pub(crate) const MAX_NAME_BYTES: usize = 256;
/// Most blocks or ids in one request.
pub(crate) const MAX_ITEMS: usize = 10_000;

pub(crate) fn check_name(what: &str, v: &str) -> Result<(), Status> {
    if v.is_empty() {
        return Err(Status::invalid_argument(format!("{what} is empty")));
    }
    if v.len() > MAX_NAME_BYTES {
        return Err(Status::invalid_argument(format!(
            "{what} is {} bytes long; the limit is {MAX_NAME_BYTES}",
            v.len()
        )));
    }
    if v.chars().any(|c| c.is_control()) {
        return Err(Status::invalid_argument(format!(
            "{what} {v:?} contains control characters"
        )));
    }
    Ok(())
}

/// The tenant rule of the design brief: `[A-Za-z0-9_.-]`, 1–150 chars.
pub(crate) fn check_tenant(t: &str) -> Result<(), Status> {
    let ok = !t.is_empty()
        && t.len() <= 150
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "invalid tenant {:?}: 1-150 characters of [A-Za-z0-9_.-]",
            t.chars().take(160).collect::<String>()
        )))
    }
}

pub(crate) fn check_items(what: &str, n: usize) -> Result<(), Status> {
    if n > MAX_ITEMS {
        return Err(Status::invalid_argument(format!(
            "{n} {what} in one request; the limit is {MAX_ITEMS}"
        )));
    }
    Ok(())
}

pub(crate) fn check_block(b: &BlockMeta) -> Result<(), Status> {
    check_tenant(&b.tenant)?;
    check_name("block id", &b.id)?;
    if b.min_time_nanos > b.max_time_nanos {
        return Err(Status::invalid_argument(format!(
            "block {}: min_time_nanos {} is after max_time_nanos {}",
            b.id, b.min_time_nanos, b.max_time_nanos
        )));
    }
    check_items("compacted_from ids", b.compacted_from.len())?;
    check_items("profile types", b.profile_types.len())?;
    Ok(())
}
