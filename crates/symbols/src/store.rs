//! Debug info files kept by GNU build id in the object store the blocks
//! use:
//!
//! ```text
//! <tenant>/debuginfo/<build id>/file        the ELF file as uploaded
//! <tenant>/debuginfo/<build id>/meta.json   its metadata, written last
//! _shared/debuginfod/<build id>/…           fetched from a public debuginfod server
//! ```
//!
//! A file exists once its `meta.json` does: an upload writes the file, then
//! the metadata; a delete removes the metadata, then the file. A crash in
//! between leaves a file nobody sees, which the next upload overwrites.
//! Tenant names never hold `/`, and a tenant's own directory names
//! (`blocks`, `debuginfo`) differ from `debuginfod`, so the shared prefix
//! cannot collide with a tenant's.

use std::sync::Arc;

use bytes::Bytes;
use fathom_model::TenantId;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use crate::elf::{ElfError, ElfInfo, Kind, inspect};

/// Where a file came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Upload,
    Debuginfod,
}

/// What is kept next to each file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DebugInfoMeta {
    pub build_id: String,
    pub kind: Kind,
    pub size: u64,
    pub source: Source,
    /// RFC 3339, UTC.
    pub stored_at: String,
    /// The uploaded file's name (informational).
    #[serde(default)]
    pub name: String,
    pub segments: Vec<crate::elf::Segment>,
}

impl DebugInfoMeta {
    pub fn info(&self) -> ElfInfo {
        ElfInfo {
            build_id: self.build_id.clone(),
            kind: self.kind,
            segments: self.segments.clone(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("build id {0:?} is not a GNU build id (2 to 64 lowercase hex digits)")]
    BadBuildId(String),
    #[error("{0}")]
    Elf(#[from] ElfError),
    #[error("the file's build id is {actual}, not {claimed} as the request says")]
    Mismatch { claimed: String, actual: String },
    #[error("the file is {size} bytes; the limit is {limit} bytes (--debuginfo-max-size)")]
    TooLarge { size: u64, limit: u64 },
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("corrupt metadata at {path}: {source}")]
    Meta {
        path: String,
        source: serde_json::Error,
    },
}

impl From<StoreError> for fathom_api::ApiError {
    fn from(e: StoreError) -> Self {
        use fathom_api::ApiError;
        match e {
            StoreError::BadBuildId(_) | StoreError::Elf(_) | StoreError::Mismatch { .. } => {
                ApiError::bad_request(e)
            }
            StoreError::TooLarge { .. } => ApiError::TooLarge(e.to_string()),
            StoreError::Store(_) => ApiError::Unavailable(e.to_string()),
            StoreError::Meta { .. } => ApiError::internal(e),
        }
    }
}

/// Whose a file is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    Tenant(TenantId),
    /// Fetched from a debuginfod server: the same for everyone.
    Shared,
}

/// Checks a build id given in a request.
pub fn check_build_id(s: &str) -> Result<String, StoreError> {
    let ok = (2..=64).contains(&s.len())
        && s.len().is_multiple_of(2)
        && s.bytes().all(|b| b.is_ascii_hexdigit());
    if ok {
        Ok(s.to_ascii_lowercase())
    } else {
        Err(StoreError::BadBuildId(s.chars().take(80).collect()))
    }
}

/// The debug info store; cheap to clone.
#[derive(Clone)]
pub struct DebugInfoStore {
    store: Arc<dyn ObjectStore>,
    max_size: u64,
}

impl DebugInfoStore {
    pub fn new(store: Arc<dyn ObjectStore>, max_size: u64) -> Self {
        DebugInfoStore { store, max_size }
    }

    pub fn max_size(&self) -> u64 {
        self.max_size
    }

    fn dir(owner: &Owner, build_id: &str) -> String {
        match owner {
            Owner::Tenant(t) => format!("{t}/debuginfo/{build_id}"),
            Owner::Shared => format!("_shared/debuginfod/{build_id}"),
        }
    }

    fn file_path(owner: &Owner, build_id: &str) -> Path {
        Path::from(format!("{}/file", Self::dir(owner, build_id)))
    }

    fn meta_path(owner: &Owner, build_id: &str) -> Path {
        Path::from(format!("{}/meta.json", Self::dir(owner, build_id)))
    }

    /// Validates `data` (ELF, build id equal to `claimed` if given, size)
    /// and stores it with its metadata. Nothing is written when it is
    /// refused.
    pub async fn put(
        &self,
        owner: &Owner,
        claimed: Option<&str>,
        name: &str,
        source: Source,
        data: Bytes,
    ) -> Result<DebugInfoMeta, StoreError> {
        let size = data.len() as u64;
        if size > self.max_size {
            return Err(StoreError::TooLarge {
                size,
                limit: self.max_size,
            });
        }
        let claimed = claimed.map(check_build_id).transpose()?;
        let d = data.clone();
        let info = tokio::task::spawn_blocking(move || inspect(&d))
            .await
            .map_err(|e| ElfError::Corrupt(format!("inspecting the file failed: {e}")))??;
        if let Some(c) = claimed
            && c != info.build_id
        {
            return Err(StoreError::Mismatch {
                claimed: c,
                actual: info.build_id,
            });
        }
        let meta = DebugInfoMeta {
            build_id: info.build_id.clone(),
            kind: info.kind,
            size,
            source,
            stored_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            name: name.chars().take(256).collect(),
            segments: info.segments,
        };
        self.store
            .put(
                &Self::file_path(owner, &meta.build_id),
                PutPayload::from(data),
            )
            .await?;
        let json = serde_json::to_vec(&meta).map_err(|source| StoreError::Meta {
            path: Self::meta_path(owner, &meta.build_id).to_string(),
            source,
        })?;
        self.store
            .put(
                &Self::meta_path(owner, &meta.build_id),
                PutPayload::from(json),
            )
            .await?;
        Ok(meta)
    }

    /// The metadata of a stored file, if it exists.
    pub async fn meta(
        &self,
        owner: &Owner,
        build_id: &str,
    ) -> Result<Option<DebugInfoMeta>, StoreError> {
        let path = Self::meta_path(owner, build_id);
        let bytes = match self.store.get(&path).await {
            Ok(r) => r.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| StoreError::Meta {
                path: path.to_string(),
                source,
            })
    }

    /// The file's bytes, if it exists.
    pub async fn file(&self, owner: &Owner, build_id: &str) -> Result<Option<Bytes>, StoreError> {
        match self.store.get(&Self::file_path(owner, build_id)).await {
            Ok(r) => Ok(Some(r.bytes().await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The tenant's files, by build id.
    pub async fn list(&self, owner: &Owner) -> Result<Vec<DebugInfoMeta>, StoreError> {
        let prefix = match owner {
            Owner::Tenant(t) => Path::from(format!("{t}/debuginfo")),
            Owner::Shared => Path::from("_shared/debuginfod"),
        };
        let objects: Vec<_> = self.store.list(Some(&prefix)).try_collect().await?;
        let mut out = Vec::new();
        for o in objects {
            if o.location.filename() != Some("meta.json") {
                continue;
            }
            let Some(bid) = o.location.parts().rev().nth(1) else {
                continue;
            };
            if let Some(m) = self.meta(owner, bid.as_ref()).await? {
                out.push(m);
            }
        }
        out.sort_by(|a, b| a.build_id.cmp(&b.build_id));
        Ok(out)
    }

    /// Deletes a file; false if there was none.
    pub async fn delete(&self, owner: &Owner, build_id: &str) -> Result<bool, StoreError> {
        if self.meta(owner, build_id).await?.is_none() {
            return Ok(false);
        }
        self.store.delete(&Self::meta_path(owner, build_id)).await?;
        match self.store.delete(&Self::file_path(owner, build_id)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(true),
            Err(e) => Err(e.into()),
        }
    }
}
