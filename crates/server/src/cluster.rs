//! The metastore as the other roles see it: live ingesters for the
//! distributors' ring and the queriers' head reads, the block index, and
//! the compactor's jobs.

use std::sync::Arc;
use std::time::Duration;

use fathom_api::cluster::{IngesterAddr, Ingesters, MembershipError};
use fathom_block::BlockMeta;
use fathom_compactor::{CompactionIndex, CompactionIndexError};
use fathom_metastore::{MetastoreClient, Role};

/// The live ingesters as the metastore last listed them, refreshed in the
/// background: a write or a head read takes the current view without a
/// metastore call of its own.
///
/// A listing that fails, or that comes back empty while the view has
/// members, leaves the view as it is: a metastore that is electing a
/// leader or has just started must not empty a distributor's ring (every
/// write would then be refused while the ingesters are up). An ingester
/// that is really gone is dropped by the metastore after its heartbeat
/// timeout and so from the next non-empty listing; until then a write to it
/// fails and the other replicas make the quorum.
pub struct RingView {
    view: tokio::sync::watch::Receiver<View>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone, Debug, Default)]
struct View {
    members: Arc<Vec<IngesterAddr>>,
    /// Registered ingesters neither in `members` nor left on purpose
    /// ([`Ingesters::down`]), as of the last listing of every member.
    down: Arc<Vec<String>>,
    /// Whether a listing ever succeeded; if not, why (for the error).
    listed: bool,
    error: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl RingView {
    /// Starts listing every `refresh`.
    pub fn spawn(client: MetastoreClient, refresh: Duration) -> Arc<RingView> {
        let (tx, view) = tokio::sync::watch::channel(View::default());
        let task = tokio::spawn(async move {
            loop {
                // Every member first, then the live ones: one that
                // registers in between is live without being down for a
                // moment, and one that dies in between is down.
                let all = client.all_members(Some(Role::Ingester)).await;
                let listed = client.members(Some(Role::Ingester)).await;
                tx.send_modify(|v| {
                    apply(v, listed);
                    apply_down(v, all);
                });
                tokio::time::sleep(refresh).await;
            }
        });
        Arc::new(RingView { view, task })
    }

    /// Waits until the view holds at least `n` ingesters.
    pub async fn wait_for(&self, n: usize) {
        let mut view = self.view.clone();
        let _ = view.wait_for(|v| v.members.len() >= n).await;
    }
}

/// Takes one listing into the view (see [`RingView`]).
fn apply(
    v: &mut View,
    listed: Result<Vec<fathom_metastore::Member>, fathom_metastore::MetastoreError>,
) {
    match listed {
        Ok(members) => {
            let mut members: Vec<IngesterAddr> = members
                .into_iter()
                .map(|m| IngesterAddr {
                    id: m.id,
                    addr: m.addr,
                })
                .collect();
            members.sort();
            v.listed = true;
            v.error = None;
            if members.is_empty() && !v.members.is_empty() {
                tracing::debug!("the metastore listed no live ingester; keeping the last view");
            } else if *v.members != members {
                tracing::info!(
                    ingesters = members.len(),
                    names = ?members.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(),
                    "ingester ring changed"
                );
                v.members = Arc::new(members);
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, "listing the ingesters failed; keeping the last view");
            v.error = Some(Arc::new(e));
        }
    }
}

/// Takes a listing of every member into the view's `down` (a failed one
/// keeps the last).
fn apply_down(
    v: &mut View,
    all: Result<Vec<fathom_metastore::Member>, fathom_metastore::MetastoreError>,
) {
    let Ok(all) = all else { return };
    let mut down: Vec<String> = all
        .into_iter()
        .filter(|m| {
            m.state(v.members.iter().any(|l| l.id == m.id)) == fathom_metastore::MemberState::Down
        })
        .map(|m| m.id)
        .collect();
    down.sort();
    if *v.down != down {
        if down.is_empty() {
            tracing::info!("no ingester is down any more");
        } else {
            tracing::warn!(
                ?down,
                "ingesters are down (registered, not live, not left after a flush): head reads count them as missed replicas"
            );
        }
        v.down = Arc::new(down);
    }
}

impl Drop for RingView {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[async_trait::async_trait]
impl Ingesters for RingView {
    async fn ingesters(&self) -> Result<Vec<IngesterAddr>, MembershipError> {
        let v = self.view.borrow();
        match (&v.error, v.listed) {
            (Some(e), false) => Err(MembershipError::NotListed { source: e.clone() }),
            _ => Ok(v.members.as_ref().clone()),
        }
    }

    async fn down(&self) -> Vec<String> {
        self.view.borrow().down.as_ref().clone()
    }
}

/// The compactor's view of the metastore.
pub struct MetastoreJobs(pub MetastoreClient);

#[async_trait::async_trait]
impl CompactionIndex for MetastoreJobs {
    async fn all(&self) -> Result<Vec<BlockMeta>, CompactionIndexError> {
        self.0
            .all_blocks()
            .await
            .map_err(|e| CompactionIndexError::new("listing blocks", e))
    }

    async fn replace(
        &self,
        tenant: &str,
        add: Vec<BlockMeta>,
        remove: Vec<String>,
    ) -> Result<(), CompactionIndexError> {
        self.0
            .replace_blocks(tenant, add, remove)
            .await
            .map_err(|e| CompactionIndexError::new("replacing blocks", e))
    }

    async fn pending_deletions(&self) -> Result<Vec<(BlockMeta, i64)>, CompactionIndexError> {
        self.0
            .pending_deletions()
            .await
            .map_err(|e| CompactionIndexError::new("listing pending deletions", e))
    }

    async fn purge(&self, tenant: &str, ids: Vec<String>) -> Result<(), CompactionIndexError> {
        self.0
            .purge(tenant, ids)
            .await
            .map_err(|e| CompactionIndexError::new("purging deleted blocks", e))
    }

    async fn acquire(
        &self,
        job: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, CompactionIndexError> {
        self.0
            .acquire_lease(job, owner, ttl)
            .await
            .map_err(|e| CompactionIndexError::new("acquiring a job lease", e))
    }

    async fn release(&self, job: &str, owner: &str) -> Result<(), CompactionIndexError> {
        self.0
            .release_lease(job, owner)
            .await
            .map_err(|e| CompactionIndexError::new("releasing a job lease", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fathom_metastore::{Member, MetastoreError};

    fn listing(names: &[&str]) -> Result<Vec<Member>, MetastoreError> {
        Ok(names
            .iter()
            .map(|n| Member::new(*n, Role::Ingester, format!("{n}:9095")))
            .collect())
    }

    fn down() -> Result<Vec<Member>, MetastoreError> {
        Err(MetastoreError::Rejected("no leader".into()))
    }

    fn ids(v: &View) -> Vec<&str> {
        v.members.iter().map(|m| m.id.as_str()).collect()
    }

    #[tokio::test]
    async fn an_empty_or_failed_listing_keeps_the_view() {
        let mut v = View::default();
        apply(&mut v, down());
        let (_tx, rx) = tokio::sync::watch::channel(v.clone());
        let ring = RingView {
            view: rx,
            task: tokio::spawn(async {}),
        };
        let e = ring.ingesters().await.unwrap_err();
        assert!(
            e.to_string()
                .contains("no ingester list from the metastore yet: "),
            "{e}"
        );
        assert!(std::error::Error::source(&e).is_some());

        apply(&mut v, listing(&["b", "a", "c"]));
        assert_eq!(ids(&v), ["a", "b", "c"]);
        apply(&mut v, listing(&[]));
        assert_eq!(
            ids(&v),
            ["a", "b", "c"],
            "an empty listing replaced the view"
        );
        apply(&mut v, down());
        assert_eq!(
            ids(&v),
            ["a", "b", "c"],
            "a failed listing replaced the view"
        );
        apply(&mut v, listing(&["a", "c"]));
        assert_eq!(ids(&v), ["a", "c"], "a smaller listing is taken");

        let (_tx, rx) = tokio::sync::watch::channel(v);
        let ring = RingView {
            view: rx,
            task: tokio::spawn(async {}),
        };
        assert_eq!(ring.ingesters().await.unwrap().len(), 2);
    }

    /// Down: registered, not live, not left; a failed listing of every
    /// member keeps the last answer.
    #[tokio::test]
    async fn an_ingester_neither_live_nor_left_is_down() {
        let mut v = View::default();
        apply(&mut v, listing(&["a", "c"]));
        let mut all = listing(&["a", "b", "c", "d"]).unwrap();
        all[3].left = true;
        apply_down(&mut v, Ok(all));
        assert_eq!(*v.down, ["b"], "d left after a flush; b is down");
        apply_down(&mut v, down());
        assert_eq!(*v.down, ["b"], "a failed listing replaced the down set");
        let (_tx, rx) = tokio::sync::watch::channel(v.clone());
        let ring = RingView {
            view: rx,
            task: tokio::spawn(async {}),
        };
        assert_eq!(ring.down().await, ["b"]);
        apply(&mut v, listing(&["a", "b", "c"]));
        apply_down(&mut v, listing(&["a", "b", "c"]));
        assert!(v.down.is_empty(), "b is live again");
    }

    #[tokio::test]
    async fn an_empty_first_listing_is_an_empty_ring() {
        let mut v = View::default();
        apply(&mut v, listing(&[]));
        assert!(v.listed && v.members.is_empty());
        let (tx, rx) = tokio::sync::watch::channel(v.clone());
        let ring = RingView {
            view: rx,
            task: tokio::spawn(async {}),
        };
        assert!(ring.ingesters().await.unwrap().is_empty());
        // wait_for returns once a quorum shows up.
        let waiting = tokio::spawn(async move {
            ring.wait_for(2).await;
        });
        apply(&mut v, listing(&["a", "b"]));
        tx.send(v).unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("wait_for saw the quorum")
            .unwrap();
    }
}
