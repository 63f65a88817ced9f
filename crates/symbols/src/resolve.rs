//! Symbolization at query time: locations that arrived as (mapping with a
//! build id, address) and no function get their functions, inlined frames,
//! files and lines from the debug info of that build id.
//!
//! ```text
//! query's symbol table ──► unsymbolized locations ──► address cache (owner, build id, address)
//!                                                          │ misses, grouped by build id
//!                                                          ▼
//!                     local copy ◄── tenant's upload │ shared debuginfod copy │ debuginfod fetch
//!                          │
//!                          ▼ blazesym (DWARF, else .symtab), on the blocking pool
//!                     address cache ──► the query's locations (within --symbolize-wait)
//! ```
//!
//! A query waits at most `wait` for its misses; what is not resolved by
//! then stays as `binary+0xaddr` for this answer and keeps resolving in the
//! background, so the next query finds it cached. A build id nobody has is
//! remembered as missing for `missing_ttl` (a negative cache), so a flame
//! graph over a month does not look for it again at every query.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fathom_model::{Function, Line, Symbols, TenantId};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::debuginfod::Debuginfod;
use crate::elf::ElfInfo;
use crate::store::{DebugInfoStore, Owner, Source};

/// One frame of a resolved address: function, file, line.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub function: String,
    pub file: String,
    pub line: i64,
}

/// Settings of the server-side symbolizer.
#[derive(Clone, Debug)]
pub struct SymbolizerConfig {
    /// Where local copies of debug info files are kept for reading.
    pub cache_dir: PathBuf,
    /// Longest time a query waits for symbols.
    pub wait: Duration,
    /// How long a build id found nowhere is not looked for again.
    pub missing_ttl: Duration,
    /// Most (build id, address) results kept in memory.
    pub max_cached_addresses: usize,
}

impl SymbolizerConfig {
    pub fn new(cache_dir: PathBuf) -> Self {
        SymbolizerConfig {
            cache_dir,
            wait: Duration::from_secs(2),
            missing_ttl: Duration::from_secs(300),
            max_cached_addresses: 1_000_000,
        }
    }
}

#[derive(Clone)]
struct Metrics {
    resolved: Counter,
    unresolved: Counter,
    cache_hits: Counter,
    resolve_seconds: Histogram,
}

impl Metrics {
    fn register(r: &mut Registry) -> Self {
        let m = Metrics {
            resolved: Counter::default(),
            unresolved: Counter::default(),
            cache_hits: Counter::default(),
            resolve_seconds: Histogram::new([0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0]),
        };
        r.register(
            "fathom_symbolizer_addresses_resolved",
            "Addresses symbolized from debug info (cache misses that found a function)",
            m.resolved.clone(),
        );
        r.register(
            "fathom_symbolizer_addresses_unresolved",
            "Addresses shown as binary+address: no debug info, nothing at the address, or not in time",
            m.unresolved.clone(),
        );
        r.register(
            "fathom_symbolizer_cache_hits",
            "Addresses answered from the (build id, address) cache",
            m.cache_hits.clone(),
        );
        r.register(
            "fathom_symbolizer_resolve_seconds",
            "Time to symbolize one build id's missing addresses of one query",
            m.resolve_seconds.clone(),
        );
        m
    }
}

/// A local, readable copy of a debug info file.
#[derive(Clone)]
struct LocalFile {
    owner: Owner,
    path: PathBuf,
    info: ElfInfo,
}

enum FileState {
    Ready(LocalFile),
    /// Found nowhere at this time.
    Missing(Instant),
}

type AddrKey = (Owner, String, u64);
type BuildIdLocks = HashMap<(TenantId, String), Arc<tokio::sync::Mutex<()>>>;

/// The server-side symbolizer; cheap to clone.
#[derive(Clone)]
pub struct Symbolizer {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: SymbolizerConfig,
    store: DebugInfoStore,
    debuginfod: Option<Debuginfod>,
    /// Per (tenant, build id): where its file is, or that there is none.
    files: Mutex<HashMap<(TenantId, String), FileState>>,
    /// Resolved addresses; `None` is "nothing at this address".
    addrs: Mutex<HashMap<AddrKey, Option<Arc<[Frame]>>>>,
    /// One resolution per (tenant, build id) at a time.
    locks: Mutex<BuildIdLocks>,
    metrics: Metrics,
}

/// An unsymbolized location of a query: where it is in the table and what
/// to look up.
struct Pending {
    location: fathom_model::Id,
    build_id: String,
    offset: u64,
}

impl Symbolizer {
    pub fn new(
        cfg: SymbolizerConfig,
        store: DebugInfoStore,
        debuginfod: Option<Debuginfod>,
        registry: &mut Registry,
    ) -> Self {
        Symbolizer {
            inner: Arc::new(Inner {
                cfg,
                store,
                debuginfod,
                files: Mutex::new(HashMap::new()),
                addrs: Mutex::new(HashMap::new()),
                locks: Mutex::new(HashMap::new()),
                metrics: Metrics::register(registry),
            }),
        }
    }

    /// How long a query waits for symbols (`SymbolizerConfig::wait`).
    pub fn wait(&self) -> Duration {
        self.inner.cfg.wait
    }

    pub fn store(&self) -> &DebugInfoStore {
        &self.inner.store
    }

    /// Forgets what is known of `build_id` for `tenant` (after an upload or
    /// a delete), so the next query looks again.
    pub fn forget(&self, tenant: &TenantId, build_id: &str) {
        self.inner
            .files
            .lock()
            .remove(&(tenant.clone(), build_id.to_owned()));
        self.inner.addrs.lock().retain(|(o, b, _), _| {
            !(b == build_id && matches!(o, Owner::Tenant(t) if t == tenant))
        });
    }

    /// Symbolizes the unsymbolized locations of `symbols` that have a
    /// mapping with a build id, waiting at most the configured time.
    /// Locations keep their ids (the table is the query's own copy).
    /// Returns how many locations got functions.
    pub async fn symbolize(&self, tenant: &TenantId, symbols: &mut Symbols) -> usize {
        self.symbolize_within(tenant, symbols, self.inner.cfg.wait)
            .await
    }

    /// As [`Symbolizer::symbolize`], waiting at most `wait`.
    pub async fn symbolize_within(
        &self,
        tenant: &TenantId,
        symbols: &mut Symbols,
        wait: Duration,
    ) -> usize {
        let pending = unsymbolized(symbols);
        if pending.is_empty() {
            return 0;
        }
        let mut missing: HashMap<String, Vec<u64>> = HashMap::new();
        {
            let addrs = self.inner.addrs.lock();
            for p in &pending {
                if !self.cached(&addrs, tenant, &p.build_id, p.offset) {
                    missing
                        .entry(p.build_id.clone())
                        .or_default()
                        .push(p.offset);
                }
            }
        }
        if !missing.is_empty() {
            let this = self.clone();
            let t = tenant.clone();
            let work = tokio::spawn(async move {
                let jobs = missing
                    .into_iter()
                    .map(|(bid, offsets)| this.resolve_build_id(&t, bid, offsets));
                futures::future::join_all(jobs).await;
            });
            // Past the wait, the work goes on and fills the cache for the
            // next query.
            let _ = tokio::time::timeout(wait, work).await;
        }
        self.apply(tenant, symbols, &pending)
    }

    fn cached(
        &self,
        addrs: &HashMap<AddrKey, Option<Arc<[Frame]>>>,
        tenant: &TenantId,
        build_id: &str,
        offset: u64,
    ) -> bool {
        addrs.contains_key(&(Owner::Tenant(tenant.clone()), build_id.to_owned(), offset))
            || addrs.contains_key(&(Owner::Shared, build_id.to_owned(), offset))
    }

    fn apply(&self, tenant: &TenantId, symbols: &mut Symbols, pending: &[Pending]) -> usize {
        let mut done = 0;
        let mut hits = 0u64;
        let mut unresolved = 0u64;
        let addrs = self.inner.addrs.lock();
        for p in pending {
            let frames = addrs
                .get(&(Owner::Tenant(tenant.clone()), p.build_id.clone(), p.offset))
                .or_else(|| addrs.get(&(Owner::Shared, p.build_id.clone(), p.offset)))
                .cloned()
                .flatten();
            let Some(frames) = frames else {
                unresolved += 1;
                continue;
            };
            hits += 1;
            let lines: Vec<Line> = frames
                .iter()
                .map(|f| Line {
                    function: symbols.add_function(Function {
                        name: f.function.clone(),
                        system_name: f.function.clone(),
                        filename: f.file.clone(),
                        start_line: 0,
                    }),
                    line: f.line,
                })
                .collect();
            if let Some(loc) = symbols.locations.get_mut(&p.location) {
                loc.lines = lines;
                done += 1;
            }
        }
        self.inner.metrics.cache_hits.inc_by(hits);
        self.inner.metrics.unresolved.inc_by(unresolved);
        done
    }

    /// Finds the file of `build_id` and resolves `offsets` in it into the
    /// address cache.
    async fn resolve_build_id(&self, tenant: &TenantId, build_id: String, offsets: Vec<u64>) {
        let key = (tenant.clone(), build_id.clone());
        let lock = self
            .inner
            .locks
            .lock()
            .entry(key.clone())
            .or_default()
            .clone();
        let guard = lock.lock().await;
        self.resolve_locked(tenant, &build_id, offsets).await;
        drop(guard);
        // The last one out removes the lock.
        let mut locks = self.inner.locks.lock();
        if Arc::strong_count(&lock) == 2 {
            locks.remove(&key);
        }
    }

    async fn resolve_locked(&self, tenant: &TenantId, build_id: &str, offsets: Vec<u64>) {
        let build_id = build_id.to_owned();
        let Some(file) = self.local_file(tenant, &build_id).await else {
            return;
        };
        // Another query may have resolved some meanwhile.
        let todo: Vec<u64> = {
            let addrs = self.inner.addrs.lock();
            offsets
                .into_iter()
                .filter(|o| !addrs.contains_key(&(file.owner.clone(), build_id.clone(), *o)))
                .collect::<HashSet<u64>>()
                .into_iter()
                .collect()
        };
        if todo.is_empty() {
            return;
        }
        let started = Instant::now();
        let f = file.clone();
        let t2 = todo.clone();
        let result = tokio::task::spawn_blocking(move || resolve_offsets(&f.path, &f.info, &t2))
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(build_id, error = %e, "symbolizing failed");
                vec![None; todo.len()]
            });
        self.inner
            .metrics
            .resolve_seconds
            .observe(started.elapsed().as_secs_f64());
        let found = result.iter().filter(|r| r.is_some()).count() as u64;
        self.inner.metrics.resolved.inc_by(found);
        let mut addrs = self.inner.addrs.lock();
        if addrs.len().saturating_add(todo.len()) > self.inner.cfg.max_cached_addresses {
            // Crude but bounded: start over rather than grow.
            addrs.clear();
        }
        for (o, r) in todo.into_iter().zip(result) {
            addrs.insert((file.owner.clone(), build_id.clone(), o), r.map(Arc::from));
        }
    }

    /// A readable local copy of `build_id`'s file for `tenant`: the tenant's
    /// upload, else a shared (debuginfod) copy, else a debuginfod fetch.
    async fn local_file(&self, tenant: &TenantId, build_id: &str) -> Option<LocalFile> {
        let key = (tenant.clone(), build_id.to_owned());
        match self.inner.files.lock().get(&key) {
            Some(FileState::Ready(f)) if f.path.exists() => return Some(f.clone()),
            Some(FileState::Missing(at)) if at.elapsed() < self.inner.cfg.missing_ttl => {
                return None;
            }
            _ => {}
        }
        let found = self.find_file(tenant, build_id).await;
        let state = match &found {
            Some(f) => FileState::Ready(f.clone()),
            None => FileState::Missing(Instant::now()),
        };
        self.inner.files.lock().insert(key, state);
        found
    }

    async fn find_file(&self, tenant: &TenantId, build_id: &str) -> Option<LocalFile> {
        for owner in [Owner::Tenant(tenant.clone()), Owner::Shared] {
            match self.copy_locally(&owner, build_id).await {
                Ok(Some(f)) => return Some(f),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(build_id, error = %e, "reading debug info from the object store");
                    return None;
                }
            }
        }
        let d = self.inner.debuginfod.as_ref()?;
        let data = d.fetch(build_id).await?;
        match self
            .inner
            .store
            .put(&Owner::Shared, Some(build_id), "", Source::Debuginfod, data)
            .await
        {
            Ok(_) => {}
            Err(e) => {
                d.refused();
                tracing::warn!(build_id, error = %e, "debuginfod answered a file that cannot be used");
                return None;
            }
        }
        self.copy_locally(&Owner::Shared, build_id)
            .await
            .ok()
            .flatten()
    }

    async fn copy_locally(
        &self,
        owner: &Owner,
        build_id: &str,
    ) -> Result<Option<LocalFile>, crate::store::StoreError> {
        let Some(meta) = self.inner.store.meta(owner, build_id).await? else {
            return Ok(None);
        };
        let dir = match owner {
            Owner::Tenant(t) => self.inner.cfg.cache_dir.join(t.as_str()),
            Owner::Shared => self.inner.cfg.cache_dir.join("_shared"),
        };
        let path = dir.join(build_id);
        if !path.exists() {
            let Some(bytes) = self.inner.store.file(owner, build_id).await? else {
                return Ok(None);
            };
            let tmp = dir.join(format!("{build_id}.tmp"));
            let written = tokio::fs::create_dir_all(&dir).await.and(
                async {
                    tokio::fs::write(&tmp, &bytes).await?;
                    tokio::fs::rename(&tmp, &path).await
                }
                .await,
            );
            if let Err(e) = written {
                tracing::warn!(path = %path.display(), error = %e, "writing a local copy of debug info");
                return Ok(None);
            }
        }
        Ok(Some(LocalFile {
            owner: owner.clone(),
            path,
            info: meta.info(),
        }))
    }
}

/// The locations of `symbols` without lines whose mapping has a build id,
/// with their file offsets.
fn unsymbolized(symbols: &Symbols) -> Vec<Pending> {
    let mut out = Vec::new();
    for (id, loc) in &symbols.locations {
        if !loc.lines.is_empty() {
            continue;
        }
        let Some(m) = symbols.mappings.get(&loc.mapping) else {
            continue;
        };
        if m.build_id.is_empty() {
            continue;
        }
        let Ok(build_id) = crate::store::check_build_id(&m.build_id) else {
            continue;
        };
        let Some(offset) = loc
            .address
            .checked_sub(m.memory_start)
            .and_then(|a| a.checked_add(m.file_offset))
        else {
            continue;
        };
        out.push(Pending {
            location: *id,
            build_id,
            offset,
        });
    }
    out
}

/// Resolves file offsets with blazesym over a local file: the frames of
/// each, innermost first (pprof's order), `None` where nothing is found.
fn resolve_offsets(path: &Path, info: &ElfInfo, offsets: &[u64]) -> Vec<Option<Vec<Frame>>> {
    use blazesym::symbolize::source::{Elf, Source};
    use blazesym::symbolize::{Input, Symbolized, Symbolizer};

    let vaddrs: Vec<Option<u64>> = offsets.iter().map(|o| info.offset_to_vaddr(*o)).collect();
    let wanted: Vec<u64> = vaddrs.iter().flatten().copied().collect();
    if wanted.is_empty() {
        return vec![None; offsets.len()];
    }
    if info.kind == crate::elf::Kind::Gopclntab {
        return resolve_go(path, &vaddrs);
    }
    // No other directories: the stored file is the debug info.
    let sym = Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .enable_demangling(false)
        .set_debug_dirs(Some(Vec::<PathBuf>::new()))
        .build();
    let mut elf = Elf::new(path);
    elf.debug_syms = true;
    let src = Source::Elf(elf);
    let results = match sym.symbolize(&src, Input::VirtOffset(&wanted)) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "symbolizing with debug info");
            return vec![None; offsets.len()];
        }
    };
    let mut results = results.into_iter();
    vaddrs
        .iter()
        .map(|v| {
            v.as_ref()?;
            match results.next()? {
                Symbolized::Sym(s) => Some(frames_of(&s)),
                Symbolized::Unknown(_) => None,
            }
        })
        .collect()
}

/// Resolves with a Go binary's `.gopclntab`.
fn resolve_go(path: &Path, vaddrs: &[Option<u64>]) -> Vec<Option<Vec<Frame>>> {
    use object::{Object, ObjectSection};
    let none = || vec![None; vaddrs.len()];
    let Ok(data) = std::fs::read(path) else {
        return none();
    };
    let Ok(file) = object::File::parse(data.as_slice()) else {
        return none();
    };
    let Some(table) = file
        .section_by_name(".gopclntab")
        .and_then(|s| s.data().ok())
        .and_then(crate::gopclntab::GoTable::parse)
    else {
        tracing::warn!(path = %path.display(), "unreadable .gopclntab");
        return none();
    };
    vaddrs
        .iter()
        .map(|v| {
            let (function, file, line) = table.lookup((*v)?)?;
            Some(vec![Frame {
                function,
                file,
                line,
            }])
        })
        .collect()
}

fn code_file(c: &blazesym::symbolize::CodeInfo<'_>) -> (String, i64) {
    let path = c.to_path();
    (
        path.to_string_lossy().into_owned(),
        c.line.map_or(0, i64::from),
    )
}

/// blazesym gives the outermost function first, each with the location
/// inside it; pprof wants the innermost first.
fn frames_of(s: &blazesym::symbolize::Sym<'_>) -> Vec<Frame> {
    let mut out = Vec::with_capacity(1 + s.inlined.len());
    let (file, line) = s.code_info.as_deref().map(code_file).unwrap_or_default();
    out.push(Frame {
        function: crate::demangle(&s.name),
        file,
        line,
    });
    for f in s.inlined.iter() {
        let (file, line) = f.code_info.as_ref().map(code_file).unwrap_or_default();
        out.push(Frame {
            function: crate::demangle(&f.name),
            file,
            line,
        });
    }
    out.reverse();
    out
}
