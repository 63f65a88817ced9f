//! `fathom import`: writes blocks straight into the object store, from a
//! directory of pprof/JFR files or from a generated history, and
//! registers them with the metastore when one is given.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use fathom_compactor::import::{Importer, Synthetic};
use fathom_metastore::{ClientOptions, MetastoreClient};
use fathom_model::{IdHasher, Labels, TenantId};

use crate::{StoreArgs, parse_duration};

#[derive(Args, Clone)]
pub(crate) struct ImportArgs {
    /// Data directory (the filesystem store is <data-dir>/store).
    #[arg(long, env = "FATHOM_DATA_DIR", default_value = "./data")]
    data_dir: PathBuf,
    #[command(flatten)]
    store: StoreArgs,
    /// Tenant the blocks belong to.
    #[arg(long, env = "FATHOM_IMPORT_TENANT", default_value = "anonymous")]
    tenant: String,
    /// Metastore nodes (`host:port,…`; for `fathom all`, its --listen) to
    /// register the blocks with. Without it, the blocks are found by the
    /// next `fathom all` or metastore that starts with an empty index.
    #[arg(long, env = "FATHOM_METASTORE", value_delimiter = ',')]
    metastore: Vec<String>,
    #[command(flatten)]
    secret: crate::cluster::SecretArgs,
    /// Most sample rows buffered before a block is written (about 100
    /// bytes each in memory); a day with more is split into several
    /// blocks, which the compactor merges later.
    #[arg(long, env = "FATHOM_IMPORT_MAX_ROWS", default_value_t = 8_000_000)]
    max_rows: usize,
    /// A directory of profiles to import (searched recursively): pprof
    /// (`.pb.gz`, `.pb`, `.pprof`, gzip or not) and JFR (`.jfr`,
    /// `.jfr.gz`). Each file's time is its own (the pprof's `time_nanos`,
    /// the JFR recording start), else the file's modification time.
    #[arg(long, conflicts_with = "synthetic")]
    dir: Option<PathBuf>,
    /// Labels of every imported profile, `name=value` (repeatable);
    /// `service_name` defaults to the directory's name.
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Generate a history instead: one CPU profile per instance and
    /// --interval over --duration, ending now (or at --end).
    #[arg(long)]
    synthetic: bool,
    /// Length of the generated history.
    #[arg(long, default_value = "30d", value_parser = parse_duration)]
    duration: Duration,
    /// End of the generated history, unix seconds (default: now).
    #[arg(long)]
    end: Option<i64>,
    /// Instances of the generated service.
    #[arg(long, default_value_t = 10)]
    instances: usize,
    /// Time between two profiles of one instance.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    interval: Duration,
    /// Stacks in each generated profile.
    #[arg(long, default_value_t = 32)]
    stacks_per_profile: usize,
    /// Distinct stacks of the generated service.
    #[arg(long, default_value_t = 2_000)]
    distinct_stacks: usize,
    /// `service_name` of the generated service.
    #[arg(long, default_value = "synthetic")]
    service_name: String,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not name=value"))?;
    Ok((k.to_owned(), v.to_owned()))
}

fn nanos(d: Duration) -> anyhow::Result<i64> {
    i64::try_from(d.as_nanos()).context("duration too long")
}

pub(crate) async fn run(a: ImportArgs) -> anyhow::Result<()> {
    let tenant = TenantId::new(&a.tenant).context("--tenant")?;
    let store = a
        .store
        .config()
        .build(&a.data_dir)
        .context("opening the object store")?;
    let mut importer = Importer::new(store, tenant.as_str(), a.max_rows);
    let started = std::time::Instant::now();
    let mut profiles = 0usize;
    if a.synthetic {
        let spec = Synthetic {
            service_name: a.service_name.clone(),
            instances: a.instances.max(1),
            interval_nanos: nanos(a.interval)?.max(1),
            stacks_per_profile: a.stacks_per_profile.max(1),
            distinct_stacks: a.distinct_stacks.max(1),
            seed: 1,
        };
        let end = match a.end {
            Some(s) => s.checked_mul(1_000_000_000).context("--end")?,
            None => nanos(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?)?,
        };
        let start = end.checked_sub(nanos(a.duration)?).context("--duration")?;
        let (symbols, stacks) = spec.symbols();
        // Generated on a blocking thread, imported here, a chunk at a time.
        let (tx, mut rx) = tokio::sync::mpsc::channel(2);
        let generator = tokio::task::spawn_blocking(move || {
            spec.profiles(
                &stacks,
                start,
                end,
                |chunk| {
                    let _ = tx.blocking_send(chunk);
                },
                20_000,
            );
        });
        while let Some(chunk) = rx.recv().await {
            profiles += chunk.len();
            importer.add(&chunk, &symbols).await?;
        }
        generator.await?;
    } else if let Some(dir) = &a.dir {
        let mut labels = Labels::new();
        let default_service = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "import".into());
        labels.insert("service_name", &default_service);
        for (k, v) in &a.labels {
            labels.insert(k, v);
        }
        let mut files = Vec::new();
        walk(dir, &mut files)?;
        files.sort();
        let mut skipped = 0usize;
        for f in files {
            match read_profile(&f, &labels) {
                Ok((_, Some(n))) => {
                    profiles += n.profiles.len();
                    importer.add(&n.profiles, &n.symbols).await?;
                }
                Ok((_, None)) => {}
                // A file without a profile's name that is not a pprof
                // either (a README, an expectation file) is skipped.
                Err((false, e)) => {
                    tracing::warn!(file = %f.display(), error = %format!("{e:#}"), "skipped: not a profile");
                    skipped += 1;
                }
                Err((true, e)) => anyhow::bail!("{}: {e:#}", f.display()),
            }
        }
        if skipped > 0 {
            println!("skipped {skipped} files that are not profiles");
        }
    } else {
        anyhow::bail!("give --dir <directory of profiles> or --synthetic");
    }
    let metas = importer.finish().await?;
    println!(
        "imported {profiles} profiles into {} blocks in {:.1} s",
        metas.len(),
        started.elapsed().as_secs_f64()
    );
    if !a.metastore.is_empty() {
        let secret = a.secret.secret(([127, 0, 0, 1], 0).into())?;
        let client = MetastoreClient::with_options(
            a.metastore.clone(),
            ClientOptions {
                secret,
                ..ClientOptions::default()
            },
        )
        .context("--metastore")?;
        for m in &metas {
            client
                .add_block(m.clone())
                .await
                .with_context(|| format!("registering block {}", m.id))?;
        }
        println!("registered {} blocks with the metastore", metas.len());
    }
    Ok(())
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        if p.is_dir() {
            walk(&p, out)?;
        } else {
            out.push(p);
        }
    }
    Ok(())
}

/// One file's profiles. A file named like a profile must be one (the
/// error says so: `(true, e)`); any other file is tried as a pprof and may
/// fail (`(false, e)`).
fn read_profile(
    path: &Path,
    labels: &Labels,
) -> Result<(bool, Option<fathom_pprof::Normalized>), (bool, anyhow::Error)> {
    let name = path.to_string_lossy().to_lowercase();
    let is_jfr = name.ends_with(".jfr") || name.ends_with(".jfr.gz");
    let is_pprof = [".pb.gz", ".pb", ".pprof", ".pprof.gz", ".prof"]
        .iter()
        .any(|s| name.ends_with(s));
    let named = is_jfr || is_pprof;
    read_named(path, &name, is_jfr, labels)
        .map(|n| (named, n))
        .map_err(|e| (named, e))
}

fn read_named(
    path: &Path,
    name: &str,
    is_jfr: bool,
    labels: &Labels,
) -> anyhow::Result<Option<fathom_pprof::Normalized>> {
    let bytes = std::fs::read(path)?;
    let mtime = std::fs::metadata(path)?
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_nanos()).ok());
    let seed = IdHasher::new("import-file")
        .str(name)
        .bytes(&bytes)
        .finish();
    let limits = fathom_pprof::Limits::default();
    if is_jfr {
        let raw = if name.ends_with(".gz") {
            let mut out = Vec::new();
            std::io::Read::read_to_end(
                &mut std::io::Read::take(
                    flate2::read::GzDecoder::new(&bytes[..]),
                    limits.max_decompressed_bytes as u64 + 1,
                ),
                &mut out,
            )?;
            anyhow::ensure!(
                out.len() <= limits.max_decompressed_bytes,
                "larger than the decompression limit"
            );
            out
        } else {
            bytes
        };
        let opts = fathom_jfr::JfrOptions {
            labels: labels.clone(),
            profile_id_seed: seed,
            ..Default::default()
        };
        return Ok(Some(fathom_jfr::decode(&raw, None, &opts, &limits)?));
    }
    let p = fathom_pprof::decode(&bytes, &limits)?;
    let opts = fathom_pprof::NormalizeOptions {
        labels: labels.clone(),
        time_nanos_override: (p.time_nanos == 0).then_some(mtime).flatten(),
        profile_id_seed: seed,
        ..Default::default()
    };
    Ok(Some(fathom_pprof::normalize(&p, &opts)?))
}
