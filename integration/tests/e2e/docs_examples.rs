//! Every example in README.md and docs/ works when pasted as written.
//!
//! Each `sh`/`bash` block carries a marker on the line before it:
//!
//! - `<!-- docs-test: run -->` (optionally `run, expect "text"`): run here,
//!   against a live `fathom all`, with `localhost:7400` pointed at the test's
//!   port and `curl` failing on HTTP errors. A `python` block with `run` is
//!   run with `python3` the same way.
//! - `<!-- docs-test: skip (why) -->`: not run, with the reason in the docs.
//!
//! A shell block without a marker fails the test: a new example must be
//! either run or explained.

use std::path::{Path, PathBuf};
use std::process::Command;

use fathom_integration::{Fathom, testdata, workspace};

/// One fenced block of a Markdown file.
#[derive(Debug)]
struct Block {
    file: PathBuf,
    line: usize,
    lang: String,
    marker: Option<String>,
    code: String,
}

fn blocks(file: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(lang) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i;
        let marker = lines[..start]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| l.trim().strip_prefix("<!-- docs-test:"))
            .and_then(|l| l.strip_suffix("-->"))
            .map(|m| m.trim().to_owned());
        let mut code = String::new();
        i += 1;
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            code.push_str(lines[i]);
            code.push('\n');
            i += 1;
        }
        out.push(Block {
            file: file.to_owned(),
            line: start + 1,
            lang: lang.trim().to_owned(),
            marker,
            code,
        });
        i += 1;
    }
    out
}

fn doc_files() -> Vec<PathBuf> {
    let root = workspace();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// `"text"` after `expect` in a run marker.
fn expectation(marker: &str) -> Option<String> {
    let rest = marker.split_once("expect")?.1.trim();
    Some(rest.strip_prefix('"')?.strip_suffix('"')?.to_owned())
}

#[test]
fn every_example_in_readme_and_docs_works_as_pasted() {
    let all: Vec<Block> = doc_files().iter().flat_map(|f| blocks(f)).collect();
    let is_shell = |b: &Block| matches!(b.lang.as_str(), "sh" | "bash" | "shell");
    let unmarked: Vec<String> = all
        .iter()
        .filter(|b| is_shell(b) && b.marker.is_none())
        .map(|b| format!("{}:{}", b.file.display(), b.line))
        .collect();
    assert!(
        unmarked.is_empty(),
        "shell blocks without a `<!-- docs-test: run -->` or `<!-- docs-test: skip (why) -->` \
         marker on the line before: {unmarked:?}"
    );
    let bad_skips: Vec<String> = all
        .iter()
        .filter_map(|b| Some((b, b.marker.as_deref()?)))
        .filter(|(_, m)| m.starts_with("skip") && !(m.contains('(') && m.ends_with(')')))
        .map(|(b, m)| format!("{}:{}: {m}", b.file.display(), b.line))
        .collect();
    assert!(bad_skips.is_empty(), "a skip must say why: {bad_skips:?}");
    let runs: Vec<&Block> = all
        .iter()
        .filter(|b| b.marker.as_deref().is_some_and(|m| m.starts_with("run")))
        .collect();
    assert!(
        runs.iter().any(|b| b.file.ends_with("README.md")),
        "the README's examples are not run"
    );

    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(&dir.path().join("data"), &[]).unwrap();
    // The working directory of the examples: the files they name.
    let cwd = dir.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::copy(
        testdata().join("pprof/google+pprof/internal/report/testdata/sample.cpu"),
        cwd.join("cpu.pb.gz"),
    )
    .unwrap();
    let here = format!("127.0.0.1:{}", f.port);
    for b in runs {
        let code = b.code.replace("localhost:7400", &here);
        let at = format!("{}:{}", b.file.display(), b.line);
        let out = match b.lang.as_str() {
            "sh" | "bash" | "shell" => Command::new("bash")
                .arg("-c")
                // Pasted into a shell that stops at the first failure, with
                // curl failing on an HTTP error (and showing its body).
                .arg(format!(
                    "set -euo pipefail\ncurl() {{ command curl --fail-with-body -sS \"$@\"; }}\n{code}"
                ))
                .current_dir(&cwd)
                .output()
                .unwrap(),
            "python" => Command::new("python3")
                .arg("-c")
                .arg(&code)
                .current_dir(&cwd)
                .output()
                .unwrap(),
            other => panic!("{at}: cannot run a `{other}` block"),
        };
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{at} failed ({}):\n{code}\nstdout:\n{stdout}\nstderr:\n{stderr}\nserver log:\n{}",
            out.status,
            f.log()
        );
        if let Some(want) = b.marker.as_deref().and_then(expectation) {
            assert!(
                stdout.contains(&want),
                "{at}: output lacks {want:?}:\n{stdout}\nstderr:\n{stderr}"
            );
        }
    }
}
