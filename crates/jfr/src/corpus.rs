//! Where Pyroscope's JFR test corpus keeps its files (the shared
//! `testdata` directory, see its `jfr/README.md`): the recordings and the
//! pprof conversions Pyroscope made of each. The crate's tests and the
//! end-to-end tests walk the corpus through these, so they check the same
//! files.

use std::io;
use std::path::{Path, PathBuf};

/// Where the expectations of Pyroscope's conversions sit under `testdata`.
const CONVERSIONS: &str = "pprof/expected/grafana+pyroscope/pkg/og/convert/jfr/testdata";

/// The recordings: (name, path) of each `jfr/<name>.jfr.gz` under
/// `testdata`, sorted by name.
pub fn recordings(testdata: &Path) -> io::Result<Vec<(String, PathBuf)>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(testdata.join("jfr"))? {
        let p = e?.path();
        if let Some(name) = p
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".jfr.gz"))
        {
            v.push((name.to_owned(), p.clone()));
        }
    }
    v.sort();
    Ok(v)
}

/// One pprof file Pyroscope converted a recording to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conversion {
    /// The profile type as the file name says it (`cpu`, `alloc_in_new_tlab_bytes`, ...).
    pub profile_type: String,
    /// The hash of the label set the profile carries (one file per set).
    pub labels_hash: String,
    /// The `go tool pprof` expectation (`.folded.tsv.gz`) of that pprof.
    pub expectation: PathBuf,
}

/// Pyroscope's conversions of recording `name`, sorted.
pub fn conversions(testdata: &Path, name: &str) -> io::Result<Vec<Conversion>> {
    let prefix = format!("{name}.jfr.gz.");
    let mut out = Vec::new();
    for e in std::fs::read_dir(testdata.join(CONVERSIONS))? {
        let p = e?.path();
        let Some(rest) = p
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(&prefix))
        else {
            continue;
        };
        let mut parts = rest.split('.');
        if let (Some(t), Some(h)) = (parts.next(), parts.next()) {
            out.push(Conversion {
                profile_type: t.to_owned(),
                labels_hash: h.to_owned(),
                expectation: p.clone(),
            });
        }
    }
    out.sort_by(|a, b| a.expectation.cmp(&b.expectation));
    Ok(out)
}
