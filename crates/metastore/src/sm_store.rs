//! The state machine store: the applied [`State`] in memory, persisted as
//! JSON snapshots.
//!
//! Applying does not write to disk: after a restart the state is the last
//! snapshot plus the replay of the log entries after it (openraft purges the
//! log only up to a snapshot that is on disk). A snapshot is written to
//! `snapshot.json.tmp`, fsynced and renamed to `snapshot.json`.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, Snapshot, StorageIOError};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use crate::state::State;
use crate::types::{
    Entry, LogId, Response, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};

const SNAPSHOT_FILE: &str = "snapshot.json";
/// A snapshot received from the leader may not exceed this.
pub(crate) const MAX_SNAPSHOT_BYTES: u64 = 1 << 30;

/// The applied state, shared with the client service for reads.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    pub(crate) last_applied: Option<LogId>,
    pub(crate) last_membership: StoredMembership,
    pub(crate) state: State,
}

/// `snapshot.json`.
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta,
    state: State,
}

struct Current {
    meta: SnapshotMeta,
    /// JSON of the [`State`]: what openraft sends to followers.
    data: Vec<u8>,
}

pub(crate) struct StateMachineStore {
    applied: Arc<RwLock<Applied>>,
    dir: PathBuf,
    current: Arc<tokio::sync::Mutex<Option<Current>>>,
    built: u64,
}

fn write_snapshot(dir: &Path, file: &SnapshotFile) -> std::io::Result<()> {
    use std::io::Write;
    let bytes = serde_json::to_vec(file).map_err(std::io::Error::other)?;
    let tmp = dir.join(format!("{SNAPSHOT_FILE}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(SNAPSHOT_FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

impl StateMachineStore {
    /// Loads the last snapshot of `dir`, if any.
    pub(crate) fn open(dir: &Path) -> Result<StateMachineStore, crate::Error> {
        let path = dir.join(SNAPSHOT_FILE);
        let io = |source| crate::Error::Io {
            path: path.clone(),
            source,
        };
        let mut applied = Applied::default();
        let mut current = None;
        match std::fs::read(&path) {
            Ok(bytes) => {
                let f: SnapshotFile =
                    serde_json::from_slice(&bytes).map_err(|e| crate::Error::Snapshot {
                        path: path.clone(),
                        reason: e.to_string(),
                    })?;
                let data =
                    serde_json::to_vec(&f.state).map_err(|e| io(std::io::Error::other(e)))?;
                applied = Applied {
                    last_applied: f.meta.last_log_id,
                    last_membership: f.meta.last_membership.clone(),
                    state: f.state,
                };
                current = Some(Current { meta: f.meta, data });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        Ok(StateMachineStore {
            applied: Arc::new(RwLock::new(applied)),
            dir: dir.to_owned(),
            current: Arc::new(tokio::sync::Mutex::new(current)),
            built: 0,
        })
    }

    pub(crate) fn applied(&self) -> Arc<RwLock<Applied>> {
        self.applied.clone()
    }

    /// Persists `file` and makes it the current snapshot unless a newer one
    /// is already current.
    async fn save(&self, file: SnapshotFile) -> Result<Current, StorageError> {
        let signature = Some(file.meta.signature());
        let err = |e: &std::io::Error| -> StorageError {
            StorageIOError::write_snapshot(signature.clone(), e).into()
        };
        let data = serde_json::to_vec(&file.state).map_err(|e| err(&std::io::Error::other(e)))?;
        let mut cur = self.current.lock().await;
        let newer = cur
            .as_ref()
            .is_some_and(|c| c.meta.last_log_id > file.meta.last_log_id);
        let meta = file.meta.clone();
        if !newer {
            let dir = self.dir.clone();
            tokio::task::spawn_blocking(move || write_snapshot(&dir, &file))
                .await
                .map_err(|e| err(&std::io::Error::other(e)))?
                .map_err(|e| err(&e))?;
            *cur = Some(Current {
                meta: meta.clone(),
                data: data.clone(),
            });
        }
        Ok(Current { meta, data })
    }
}

/// Builds a snapshot of the state as of when it was created.
pub(crate) struct SnapshotBuilder {
    store: StateMachineStore,
    file: SnapshotFile,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let file = SnapshotFile {
            meta: self.file.meta.clone(),
            state: std::mem::take(&mut self.file.state),
        };
        let cur = self.store.save(file).await?;
        tracing::info!(snapshot = %cur.meta, bytes = cur.data.len(), "built metastore snapshot");
        Ok(Snapshot {
            meta: cur.meta,
            snapshot: Box::new(Cursor::new(cur.data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let a = self.applied.read();
        Ok((a.last_applied, a.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut a = self.applied.write();
        let mut out = Vec::new();
        for e in entries {
            a.last_applied = Some(e.log_id);
            out.push(match e.payload {
                EntryPayload::Blank => Response::Done,
                EntryPayload::Normal(req) => a.state.apply(&req),
                EntryPayload::Membership(m) => {
                    a.last_membership = StoredMembership::new(Some(e.log_id), m);
                    Response::Done
                }
            });
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        self.built += 1;
        let a = self.applied.read();
        let last = a.last_applied;
        let snapshot_id = match last {
            Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, self.built),
            None => format!("0-0-{}", self.built),
        };
        SnapshotBuilder {
            store: StateMachineStore {
                applied: self.applied.clone(),
                dir: self.dir.clone(),
                current: self.current.clone(),
                built: self.built,
            },
            file: SnapshotFile {
                meta: SnapshotMeta {
                    last_log_id: last,
                    last_membership: a.last_membership.clone(),
                    snapshot_id,
                },
                state: a.state.clone(),
            },
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.into_inner();
        let state: State = serde_json::from_slice(&bytes).map_err(|e| -> StorageError {
            StorageIOError::read_snapshot(Some(meta.signature()), &e).into()
        })?;
        self.save(SnapshotFile {
            meta: meta.clone(),
            state: state.clone(),
        })
        .await?;
        let mut a = self.applied.write();
        *a = Applied {
            last_applied: meta.last_log_id,
            last_membership: meta.last_membership.clone(),
            state,
        };
        tracing::info!(snapshot = %meta, "installed metastore snapshot from the leader");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(self.current.lock().await.as_ref().map(|c| Snapshot {
            meta: c.meta.clone(),
            snapshot: Box::new(Cursor::new(c.data.clone())),
        }))
    }
}
