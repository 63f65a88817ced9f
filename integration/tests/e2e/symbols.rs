//! Server-side symbols end to end (`docs/symbols.md`): stripped binaries
//! built by the test (C and Rust, with an inlined function), their debug
//! info split off with `objcopy --only-keep-debug`; profiles that carry
//! only build ids and addresses show `binary+0xoffset` until the debug info
//! is uploaded with `fathom debuginfo upload` (or served by a real
//! `debuginfod`), then functions, the inlined frame, files and lines equal
//! to what binutils' `addr2line` reads from the unstripped binary.
//!
//! Needs clang, rustc, binutils and (for the debuginfod test) Debian's
//! `debuginfod`; a missing tool fails the test with its name.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fathom_integration::{Fathom, fathom_bin, free_port, workspace};

use crate::agent::{Agent, Workload, eventually};
use fathom_proto::pprof;
use prost::Message;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A built program: the unstripped binary, its separate debug file and the
/// stripped copy.
pub(crate) struct Built {
    pub(crate) full: PathBuf,
    pub(crate) debug: PathBuf,
    pub(crate) stripped: PathBuf,
    pub(crate) build_id: String,
}

fn sources() -> PathBuf {
    workspace().join("integration/symbols")
}

/// Splits `full` into `<name>.debug` (only the debug info) and
/// `<name>-s` (stripped), as a distribution's build does.
fn split(full: PathBuf) -> Built {
    let name = full.file_name().unwrap().to_str().unwrap().to_owned();
    let dir = full.parent().unwrap().to_owned();
    let debug = dir.join(format!("{name}.debug"));
    let stripped = dir.join(format!("{name}-s"));
    run_ok(
        Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&full)
            .arg(&debug),
        "objcopy --only-keep-debug",
    );
    run_ok(
        Command::new("strip")
            .arg("--strip-all")
            .arg(&full)
            .arg("-o")
            .arg(&stripped),
        "strip",
    );
    let notes = run_ok(
        Command::new("readelf").arg("-n").arg(&stripped),
        "readelf -n",
    );
    let build_id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("the stripped binary keeps its build id")
        .trim()
        .to_owned();
    // Stripped really means no symbols: nothing but .dynsym names it.
    let syms = Command::new("nm").arg(&stripped).output().unwrap();
    assert!(
        String::from_utf8_lossy(&syms.stderr).contains("no symbols"),
        "{} still has symbols",
        stripped.display()
    );
    Built {
        full,
        debug,
        stripped,
        build_id,
    }
}

pub(crate) fn build_c(dir: &Path) -> Built {
    build_c_with(dir, "chainc", "-O2")
}

/// chain.c built with optimization `opt` (another level, another build id).
fn build_c_with(dir: &Path, name: &str, opt: &str) -> Built {
    let out = dir.join(name);
    run_ok(
        Command::new("clang")
            .args([
                opt,
                "-g",
                "-fno-omit-frame-pointer",
                "-mno-omit-leaf-frame-pointer",
                "-fno-optimize-sibling-calls",
            ])
            .arg(sources().join("chain.c"))
            .arg("-o")
            .arg(&out),
        "building chain.c",
    );
    split(out)
}

pub(crate) fn build_rust(dir: &Path) -> Built {
    let out = dir.join("chainrs");
    run_ok(
        Command::new("rustc")
            .args(["-C", "force-frame-pointers=yes", "-C", "opt-level=2", "-g"])
            .args(["--edition", "2021", "--crate-name", "chainrs"])
            .arg(sources().join("chain.rs"))
            .arg("-o")
            .arg(&out),
        "building chain.rs",
    );
    split(out)
}

/// The loadable segments of an ELF file: (offset, vaddr, filesz).
fn segments(bin: &Path) -> Vec<(u64, u64, u64)> {
    let text = run_ok(Command::new("readelf").arg("-lW").arg(bin), "readelf -l");
    text.lines()
        .filter(|l| l.trim_start().starts_with("LOAD"))
        .map(|l| {
            let f: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .take(5)
                .map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).unwrap())
                .collect();
            (f[0], f[1], f[3])
        })
        .collect()
}

fn vaddr_to_offset(segs: &[(u64, u64, u64)], vaddr: u64) -> u64 {
    segs.iter()
        .find(|(_, v, size)| vaddr >= *v && vaddr < v + size)
        .map(|(o, v, _)| vaddr - v + o)
        .expect("the address is in a loadable segment")
}

/// The address of the instruction in `caller` that calls `callee`, or the
/// first instruction after `callee`'s first 4 bytes when `caller` is
/// `None` (a leaf sample inside its body). Names as `objdump -C` prints
/// them.
fn address(bin: &Path, caller: Option<&str>, callee: &str) -> u64 {
    let dis = run_ok(
        Command::new("objdump")
            .args(["-d", "-C", "--no-show-raw-insn"])
            .arg(bin),
        "objdump -d",
    );
    let mut current = String::new();
    let mut in_callee_body = 0;
    for line in dis.lines() {
        if let Some(name) = line.strip_suffix(">:") {
            current = name.split_once('<').map(|x| x.1).unwrap_or("").to_owned();
            in_callee_body = 0;
            continue;
        }
        let addr = line
            .trim()
            .split_once(':')
            .and_then(|(a, _)| u64::from_str_radix(a, 16).ok());
        let Some(addr) = addr else { continue };
        match caller {
            Some(c)
                if current == c
                    && line.contains("call")
                    && line.contains(&format!("<{callee}>")) =>
            {
                return addr;
            }
            None if current == callee => {
                in_callee_body += 1;
                if in_callee_body == 4 {
                    return addr;
                }
            }
            _ => {}
        }
    }
    panic!("no call from {caller:?} to {callee} in {}", bin.display());
}

/// `addr2line -f -i -C` at `vaddr`: (function, file, line), innermost first.
fn addr2line(bin: &Path, vaddr: u64) -> Vec<(String, String, i64)> {
    let out = run_ok(
        Command::new("addr2line")
            .args(["-f", "-i", "-C", "-e"])
            .arg(bin)
            .arg(format!("{vaddr:#x}")),
        "addr2line",
    );
    let lines: Vec<&str> = out.lines().collect();
    lines
        .chunks(2)
        .map(|c| {
            let (file, line) = c[1].rsplit_once(':').unwrap();
            let line = line.split_whitespace().next().unwrap_or("0");
            (
                c[0].to_owned(),
                file.to_owned(),
                line.parse::<i64>().unwrap_or(0),
            )
        })
        .collect()
}

/// A pprof of one stack (leaf first) of a binary loaded at a fixed base:
/// mapping with the build id and file name, locations with addresses and
/// no functions, as the agent in server mode or the OpenTelemetry profiler
/// send them.
fn address_pprof(b: &Built, file_offsets: &[u64], samples: i64) -> Vec<u8> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    address_pprof_many(b, &[(file_offsets.to_vec(), samples)], now - 60)
}

/// The C program's hot stack as (vaddrs, file offsets), leaf first:
/// spin_leaf, the call in outer_caller (with inlined_middle inlined), the
/// call in main.
fn c_stack(b: &Built) -> (Vec<u64>, Vec<u64>) {
    let v = vec![
        address(&b.full, None, "spin_leaf"),
        address(&b.full, Some("outer_caller"), "spin_leaf"),
        address(&b.full, Some("main"), "outer_caller"),
    ];
    let segs = segments(&b.full);
    let o = v.iter().map(|a| vaddr_to_offset(&segs, *a)).collect();
    (v, o)
}

fn rust_stack(b: &Built) -> (Vec<u64>, Vec<u64>) {
    let v = vec![
        address(&b.full, None, "chainrs::rust_leaf"),
        address(&b.full, Some("chainrs::rust_outer"), "chainrs::rust_leaf"),
        address(&b.full, Some("chainrs::main"), "chainrs::rust_outer"),
    ];
    let segs = segments(&b.full);
    let o = v.iter().map(|a| vaddr_to_offset(&segs, *a)).collect();
    (v, o)
}

fn ingest(f: &Fathom, service: &str, body: Vec<u8>) {
    let name = format!("{service}.cpu");
    let (s, b) = f
        .ingest(None, &[("name", &name), ("format", "pprof")], body)
        .unwrap();
    assert_eq!(s, 200, "{b}");
}

fn folded(f: &Fathom, service: &str) -> BTreeMap<String, i64> {
    shown(f, &format!("{CPU}{{service_name=\"{service}\"}}"))
}

/// The stacks of `query` over the last hour as the flame graph shows them.
fn shown(f: &Fathom, query: &str) -> BTreeMap<String, i64> {
    let (status, body) = f
        .get(
            None,
            "/api/v1/query",
            &[("query", query), ("start", "now-1h"), ("end", "now")],
        )
        .unwrap();
    let body = String::from_utf8_lossy(&body);
    if status != 200 {
        // Nothing ingested yet, for example: callers wait or assert.
        println!("{query}: {status} {body}");
        return BTreeMap::new();
    }
    let tree: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut out = BTreeMap::new();
    flatten(&tree, &mut Vec::new(), &mut out);
    out
}

/// The stacks of a flame graph (`{"name", "self", "children"}` below a
/// root): what a person sees, with address-only frames as
/// `binary+0xoffset` (`format=folded` prints them as `go tool pprof`
/// does, `0x<address>`).
fn flatten(node: &serde_json::Value, path: &mut Vec<String>, out: &mut BTreeMap<String, i64>) {
    let own = node["self"].as_i64().unwrap_or(0);
    if own != 0 && !path.is_empty() {
        *out.entry(path.join(";")).or_insert(0) += own;
    }
    for c in node["children"].as_array().into_iter().flatten() {
        path.push(c["name"].as_str().unwrap_or("?").to_owned());
        flatten(c, path, out);
        path.pop();
    }
}

/// The merged profile of a service as pprof: every sample's frames as
/// (function, file, line), leaf first, inlined frames expanded.
fn frames_pprof(f: &Fathom, service: &str) -> Vec<Vec<(String, String, i64)>> {
    let (s, b) = f
        .get(
            None,
            "/api/v1/query",
            &[
                ("query", &format!("{CPU}{{service_name=\"{service}\"}}")),
                ("start", "now-1h"),
                ("end", "now"),
                ("format", "pprof"),
            ],
        )
        .unwrap();
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&b));
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(b.as_slice())
        .read_to_end(&mut raw)
        .unwrap();
    let p = pprof::Profile::decode(raw.as_slice()).unwrap();
    let s = |i: i64| p.string_table[i as usize].clone();
    p.sample
        .iter()
        .map(|smp| {
            smp.location_id
                .iter()
                .flat_map(|lid| {
                    let loc = p.location.iter().find(|l| l.id == *lid).unwrap();
                    loc.line
                        .iter()
                        .map(|l| {
                            let func = p.function.iter().find(|f| f.id == l.function_id).unwrap();
                            (s(func.name), s(func.filename), l.line)
                        })
                        .collect::<Vec<_>>()
                })
                .collect()
        })
        .collect()
}

/// `fathom debuginfo <args>` against `f`: (success, stdout + stderr).
fn debuginfo(f: &Fathom, args: &[&str]) -> (bool, String) {
    debuginfo_at(&f.url(""), args)
}

/// `fathom debuginfo ARGS` against the server at `url`: success and output.
fn debuginfo_at(url: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(fathom_bin())
        .arg("debuginfo")
        .arg("--url")
        .arg(url)
        .args(args)
        .output()
        .expect("running fathom debuginfo");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The folded merge of `service` once one of its stacks contains `needle`
/// (symbols resolve in the background), or a failure after `timeout`.
fn folded_when(
    f: &Fathom,
    service: &str,
    needle: &str,
    timeout: Duration,
) -> BTreeMap<String, i64> {
    eventually(timeout, || {
        let s = folded(f, service);
        if s.keys().any(|k| k.contains(needle)) {
            Ok(s)
        } else {
            Err(format!("{s:?}"))
        }
    })
}

fn expected(bin: &Path, vaddrs: &[u64]) -> Vec<(String, String, i64)> {
    vaddrs.iter().flat_map(|v| addr2line(bin, *v)).collect()
}

#[test]
fn address_only_profiles_are_symbolized_after_debuginfo_upload() {
    let dir = tempfile::tempdir().unwrap();
    let c = build_c(dir.path());
    let rs = build_rust(dir.path());
    let f = Fathom::start(&dir.path().join("data"), &[]).unwrap();
    let (cv, co) = c_stack(&c);
    let (rv, ro) = rust_stack(&rs);
    ingest(&f, "chainc", address_pprof(&c, &co, 7));
    ingest(&f, "chainrs", address_pprof(&rs, &ro, 5));

    // Before upload: binary + offset, never blank.
    let before = folded(&f, "chainc");
    let want: String = co
        .iter()
        .rev()
        .map(|o| format!("chainc-s+{o:#x}"))
        .collect::<Vec<_>>()
        .join(";");
    assert_eq!(before, BTreeMap::from([(want, 70_000_000)]));

    let (ok, out) = debuginfo(
        &f,
        &[
            "upload",
            c.debug.to_str().unwrap(),
            rs.debug.to_str().unwrap(),
        ],
    );
    assert!(ok, "{out}");
    assert!(out.contains(&format!("uploaded {}", c.build_id)), "{out}");
    // Again: the server has them, nothing is sent.
    let (ok, out) = debuginfo(&f, &["upload", c.debug.to_str().unwrap()]);
    assert!(
        ok && out.contains("already on the server, skipped"),
        "{out}"
    );
    let (ok, out) = debuginfo(&f, &["list"]);
    assert!(
        ok && out.contains(&c.build_id) && out.contains(&rs.build_id),
        "{out}"
    );

    // The same stored profiles now name functions, with the inlined frame.
    let after = folded_when(
        &f,
        "chainc",
        "main;outer_caller;inlined_middle;spin_leaf",
        Duration::from_secs(30),
    );
    assert_eq!(after.values().sum::<i64>(), 70_000_000);
    let rust = folded(&f, "chainrs");
    assert!(
        rust.contains_key(
            "chainrs::main;chainrs::rust_outer;chainrs::rust_inlined;chainrs::rust_leaf"
        ),
        "{rust:?}"
    );
    // Functions, files and lines equal binutils' reading of the unstripped
    // binaries.
    assert_eq!(frames_pprof(&f, "chainc"), vec![expected(&c.full, &cv)]);
    assert_eq!(frames_pprof(&f, "chainrs"), vec![expected(&rs.full, &rv)]);

    // Deleted: back to addresses (the tenant's cache is forgotten).
    let (ok, out) = debuginfo(&f, &["delete", &c.build_id]);
    assert!(ok, "{out}");
    let s = folded(&f, "chainc");
    assert!(s.keys().all(|k| k.starts_with("chainc-s+")), "{s:?}");
    // Another tenant never sees this tenant's uploads.
    let (s, body) = f
        .get(
            Some("other"),
            &format!("/api/v1/debuginfo/{}", rs.build_id),
            &[],
        )
        .unwrap();
    assert_eq!(s, 404, "{}", String::from_utf8_lossy(&body));
}

#[test]
fn debuginfo_uploads_refuse_bad_files_and_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let c = build_c(dir.path());
    let rs = build_rust(dir.path());
    let f = Fathom::start(&dir.path().join("data"), &["--debuginfo-max-size", "64KiB"]).unwrap();
    let put = |bid: &str, body: Vec<u8>| {
        let r = f
            .http
            .put(f.url(&format!("/api/v1/debuginfo/{bid}")))
            .body(body)
            .send()
            .unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    let debug = std::fs::read(&c.debug).unwrap();

    let (s, b) = put(&c.build_id, b"#!/bin/sh\necho not elf\n".to_vec());
    assert_eq!(s, 400, "{b}");
    assert!(b.contains("not an ELF file"), "{b}");

    // The Rust file's build id under the C file's name.
    let (s, b) = put(&c.build_id, std::fs::read(&rs.stripped).unwrap());
    assert!(s == 400 || s == 413, "{s} {b}");
    let (s, b) = put(&rs.build_id, debug.clone());
    assert_eq!(s, 400, "{b}");
    assert!(b.contains("not") && b.contains(&c.build_id), "{b}");

    // Truncated: the header is there, the sections are not.
    let (s, b) = put(&c.build_id, debug[..debug.len() / 2].to_vec());
    assert_eq!(s, 400, "{b}");
    assert!(b.contains("truncated") || b.contains("corrupt"), "{b}");

    // A stripped binary has nothing to symbolize with.
    let (s, b) = put(&c.build_id, std::fs::read(&c.stripped).unwrap());
    assert_eq!(s, 400, "{b}");
    assert!(b.contains("nothing to symbolize"), "{b}");

    // Over --debuginfo-max-size.
    let (s, b) = put(&rs.build_id, vec![0x7f; 65 * 1024]);
    assert_eq!(s, 413, "{b}");
    assert!(b.contains("limit"), "{b}");

    let (s, b) = put("not-hex", debug.clone());
    assert_eq!(s, 400, "{b}");

    // Nothing of any of them was stored.
    let v = f.get_json(None, "/api/v1/debuginfo", &[]).unwrap();
    assert_eq!(v["files"].as_array().map(Vec::len), Some(0), "{v}");
    let store = f.data_dir.join("store/anonymous/debuginfo");
    let leftovers: Vec<_> = walk(&store);
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // The good one is stored, then found, then deleted.
    let (s, b) = put(&c.build_id, debug);
    assert_eq!(s, 201, "{b}");
    let (s, _) = f
        .get(None, &format!("/api/v1/debuginfo/{}", c.build_id), &[])
        .unwrap();
    assert_eq!(s, 200);
    let r = f
        .http
        .delete(f.url(&format!("/api/v1/debuginfo/{}", c.build_id)))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    assert!(walk(&store).is_empty());
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Debian's debuginfod over a directory, killed on drop.
struct Debuginfod {
    child: Child,
    port: u16,
}

impl Debuginfod {
    fn start(dir: &Path, db: &Path) -> Debuginfod {
        let port = free_port();
        let child = Command::new("debuginfod")
            .arg("-F")
            .arg(dir)
            .arg("-p")
            .arg(port.to_string())
            .arg("-d")
            .arg(db)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting debuginfod (apt-get install debuginfod)");
        Debuginfod { child, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits until it serves `build_id` (its first scan is asynchronous).
    fn wait_for(&self, build_id: &str) {
        let http = reqwest::blocking::Client::new();
        eventually(Duration::from_secs(60), || {
            let r = http
                .get(format!("{}/buildid/{build_id}/debuginfo", self.url()))
                .send()
                .map_err(|e| e.to_string())?;
            if r.status().is_success() {
                Ok(())
            } else {
                Err(format!("debuginfod answers {}", r.status()))
            }
        });
    }
}

impl Drop for Debuginfod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn debuginfod_serves_unknown_build_ids_and_a_stopped_one_leaves_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let c = build_c(dir.path());
    let rs = build_rust(dir.path());
    // debuginfod indexes the debug file of the C program only.
    let served = dir.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    std::fs::copy(&c.debug, served.join("chainc.debug")).unwrap();
    let d = Debuginfod::start(&served, &dir.path().join("debuginfod.sqlite"));
    d.wait_for(&c.build_id);
    let f = Fathom::start(
        &dir.path().join("data"),
        &[
            "--debuginfod-urls",
            &d.url(),
            "--debuginfo-missing-ttl",
            "1h",
        ],
    )
    .unwrap();
    let (cv, co) = c_stack(&c);
    ingest(&f, "chainc", address_pprof(&c, &co, 3));
    let s = folded_when(
        &f,
        "chainc",
        "main;outer_caller;inlined_middle;spin_leaf",
        Duration::from_secs(60),
    );
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(frames_pprof(&f, "chainc"), vec![expected(&c.full, &cv)]);
    assert_eq!(f.metric("fathom_debuginfod_hits_total").unwrap(), 1.0);
    assert!(f.metric("fathom_debuginfod_fetched_bytes_total").unwrap() > 0.0);

    // The Rust program's build id is on no server: addresses, remembered
    // as missing (one look, not one per query).
    let (_, ro) = rust_stack(&rs);
    ingest(&f, "chainrs", address_pprof(&rs, &ro, 3));
    for _ in 0..3 {
        let s = folded(&f, "chainrs");
        assert!(s.keys().all(|k| k.contains("chainrs-s+0x")), "{s:?}");
    }
    assert_eq!(f.metric("fathom_debuginfod_misses_total").unwrap(), 1.0);

    // debuginfod stopped: a new build id is answered at once, as addresses.
    drop(d);
    let c2 = build_c_with(dir.path(), "chainc2", "-O1");
    assert_ne!(c2.build_id, c.build_id);
    let (_, co2) = c_stack(&c2);
    ingest(&f, "chainc2", address_pprof(&c2, &co2, 2));
    let t0 = Instant::now();
    let s = folded(&f, "chainc2");
    let took = t0.elapsed();
    assert!(s.keys().all(|k| k.contains("chainc2-s+0x")), "{s:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// A debuginfod that answers every request with `answer` (None: accepts
/// and never answers).
fn fake_debuginfod(answer: Option<&'static [u8]>) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut conn, &mut buf);
            match answer {
                Some(body) => {
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = std::io::Write::write_all(&mut conn, head.as_bytes());
                    let _ = std::io::Write::write_all(&mut conn, body);
                }
                None => held.push(conn),
            }
        }
    });
    port
}

#[test]
fn debuginfod_answering_garbage_or_hanging_leaves_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let c = build_c(dir.path());
    let (_, co) = c_stack(&c);
    let garbage = fake_debuginfod(Some(b"\x7fELF this is not a debug file"));
    let hangs = fake_debuginfod(None);
    let f = Fathom::start(
        &dir.path().join("data"),
        &[
            "--debuginfod-urls",
            &format!("http://127.0.0.1:{hangs} http://127.0.0.1:{garbage}"),
            "--debuginfod-timeout",
            "1s",
            "--symbolize-wait",
            "500ms",
        ],
    )
    .unwrap();
    ingest(&f, "chainc", address_pprof(&c, &co, 3));
    let t0 = Instant::now();
    let s = folded(&f, "chainc");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(s.keys().all(|k| k.contains("chainc-s+0x")), "{s:?}");
    // Both failures are counted, and nothing was stored.
    eventually(Duration::from_secs(10), || {
        let e = f
            .metric("fathom_debuginfod_errors_total")
            .map_err(|e| e.to_string())?;
        if e >= 2.0 {
            Ok(())
        } else {
            Err(format!("{e} errors"))
        }
    });
    let s = folded(&f, "chainc");
    assert!(s.keys().all(|k| k.contains("chainc-s+0x")), "{s:?}");
    assert!(walk(&f.data_dir.join("store/_shared")).is_empty());
}

fn spawn(bin: &Path, secs: &str) -> Workload {
    Workload::spawn(Command::new(bin).arg(secs))
}

/// Stacks of one `comm` from the frame `from` on (frames below it, libc's
/// start-up code, are named only where libc's debug info is), with their
/// values.
fn from_frame(f: &Fathom, comm: &str, from: &str) -> BTreeMap<String, i64> {
    let all = shown(f, &format!("{CPU}{{comm=\"{comm}\"}}"));
    let mut out = BTreeMap::new();
    for (stack, v) in all {
        let frames: Vec<&str> = stack.split(';').collect();
        let tail = match frames.iter().position(|x| *x == from) {
            Some(i) => frames[i..].join(";"),
            None => stack.clone(),
        };
        *out.entry(tail).or_insert(0) += v;
    }
    out
}

/// The stack holding most of the value.
fn top(stacks: &BTreeMap<String, i64>) -> Option<(String, i64, i64)> {
    let total: i64 = stacks.values().sum();
    stacks
        .iter()
        .max_by_key(|(_, v)| **v)
        .map(|(s, v)| (s.clone(), *v, total))
}

/// The frames from the root through `leaf` of the heaviest stack naming
/// it, once stacks naming `leaf` hold more than half of the value. The
/// frames below the leaf are left out: a hot loop's samples spread over
/// the functions inlined into it (a Rust range's `next`, `lt`,
/// `black_box`) in proportions that vary from run to run, so no one full
/// stack is sure to hold half.
fn leaf_chain(stacks: &BTreeMap<String, i64>, leaf: &str) -> Result<String, String> {
    let total: i64 = stacks.values().sum();
    let mut with_leaf = 0;
    // The heaviest stack naming the leaf, cut after it.
    let mut heaviest: Option<(Vec<&str>, i64)> = None;
    for (stack, &v) in stacks {
        let frames: Vec<&str> = stack.split(';').collect();
        let Some(end) = frames.iter().position(|f| *f == leaf) else {
            continue;
        };
        with_leaf += v;
        if heaviest.as_ref().is_none_or(|(_, h)| v > *h) {
            heaviest = Some((frames[..=end].to_vec(), v));
        }
    }
    match heaviest {
        Some((chain, _)) if with_leaf * 2 > total => Ok(chain.join(";")),
        _ => Err(format!("{leaf} holds {with_leaf} of {total}: {stacks:?}")),
    }
}

/// The agent in server mode profiles stripped binaries: their frames come
/// as build id + address, read `binary+0x…` until the debug files are
/// uploaded, then the same stored profiles read as the agent in local mode
/// reads the unstripped binaries. Needs root and BPF (fails, saying so,
/// without them).
#[test]
fn agent_in_server_mode_profiles_stripped_binaries_symbolized_after_upload() {
    let dir = tempfile::tempdir().unwrap();
    let c = build_c(dir.path());
    let rs = build_rust(dir.path());
    let f = Fathom::start(&dir.path().join("data"), &[]).unwrap();
    let keep = |re: &str| {
        let path = dir.path().join(format!("keep-{}.yaml", re.len()));
        std::fs::write(
            &path,
            format!(
                "relabel_configs:\n  - source_labels: [comm]\n    regex: \"{re}\"\n    action: keep\n"
            ),
        )
        .unwrap();
        path
    };
    let server_keep = keep("chainc-s|chainrs-s");
    let local_keep = keep("chainc|chainrs|unused");
    let _server = Agent::start(
        &f,
        dir.path(),
        &[
            "--push-interval",
            "5s",
            "--symbolize",
            "server",
            "--relabel-config",
            server_keep.to_str().unwrap(),
        ],
    );
    let _local = Agent::start(
        &f,
        dir.path(),
        &[
            "--push-interval",
            "5s",
            "--relabel-config",
            local_keep.to_str().unwrap(),
        ],
    );
    let _w = [
        spawn(&c.stripped, "120"),
        spawn(&rs.stripped, "120"),
        spawn(&c.full, "120"),
        spawn(&rs.full, "120"),
    ];

    // Before upload: the stripped binaries' frames are addresses.
    let wait = Duration::from_secs(180);
    let before = eventually(wait, || {
        let s = from_frame(&f, "chainc-s", "main");
        if s.values().sum::<i64>() >= 20 * 52_631_578 {
            Ok(s)
        } else {
            Err(format!("{s:?}"))
        }
    });
    let hot: i64 = before
        .iter()
        .filter(|(k, _)| k.contains("chainc-s+0x1") && !k.contains("spin_leaf"))
        .map(|(_, v)| v)
        .sum();
    assert!(hot * 10 > before.values().sum::<i64>() * 8, "{before:?}");
    let (ok, out) = debuginfo(
        &f,
        &[
            "upload",
            c.debug.to_str().unwrap(),
            rs.debug.to_str().unwrap(),
        ],
    );
    assert!(ok, "{out}");

    // After: functions with the inlined frame, as local symbolization of
    // the unstripped binary gives them.
    for (comm, full_comm, leaf, from) in [
        ("chainc-s", "chainc", "spin_leaf", "main"),
        (
            "chainrs-s",
            "chainrs",
            "chainrs::rust_leaf",
            "chainrs::main",
        ),
    ] {
        let server_chain = eventually(wait, || {
            leaf_chain(&from_frame(&f, comm, from), leaf).map_err(|e| format!("{comm}: {e}"))
        });
        let local_chain = eventually(wait, || {
            leaf_chain(&from_frame(&f, full_comm, from), leaf)
                .map_err(|e| format!("{full_comm}: {e}"))
        });
        // The inlined frame is there, as local symbolization shows it.
        assert_eq!(server_chain.split(';').count(), 4, "{server_chain}");
        assert_eq!(server_chain, local_chain);
    }
    let c_top = from_frame(&f, "chainc-s", "main");
    assert!(
        c_top.contains_key("main;outer_caller;inlined_middle;spin_leaf"),
        "{c_top:?}"
    );
}

/// CPU seconds (user + system) a process has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    (f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()) as f64 / 100.0
}

fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// A pprof at `time_s` (unix seconds) of `stacks` (leaf first, file
/// offsets, with their sample counts at 100 Hz) of one binary, mapped at a
/// fixed base under `/opt/app/<stripped name>`: addresses only.
fn address_pprof_many(b: &Built, stacks: &[(Vec<u64>, i64)], time_s: i64) -> Vec<u8> {
    const BASE: u64 = 0x5555_5555_0000;
    let mut locs: Vec<u64> = stacks.iter().flat_map(|s| s.0.clone()).collect();
    locs.sort_unstable();
    locs.dedup();
    let id_of = |o: &u64| locs.binary_search(o).unwrap() as u64 + 1;
    let name = b.stripped.file_name().unwrap().to_str().unwrap();
    pprof::Profile {
        sample_type: vec![pprof::ValueType { r#type: 1, unit: 2 }],
        sample: stacks
            .iter()
            .map(|(s, n)| pprof::Sample {
                location_id: s.iter().map(id_of).collect(),
                value: vec![n * 10_000_000],
                ..Default::default()
            })
            .collect(),
        mapping: vec![pprof::Mapping {
            id: 1,
            memory_start: BASE,
            memory_limit: BASE + 0x1000_0000,
            filename: 3,
            build_id: 4,
            ..Default::default()
        }],
        location: locs
            .iter()
            .enumerate()
            .map(|(i, o)| pprof::Location {
                id: i as u64 + 1,
                mapping_id: 1,
                address: BASE + o,
                ..Default::default()
            })
            .collect(),
        string_table: vec![
            String::new(),
            "cpu".into(),
            "nanoseconds".into(),
            format!("/opt/app/{name}"),
            b.build_id.clone(),
        ],
        time_nanos: time_s * 1_000_000_000,
        duration_nanos: 10_000_000_000,
        period_type: Some(pprof::ValueType { r#type: 1, unit: 2 }),
        period: 10_000_000,
        ..Default::default()
    }
    .encode_to_vec()
}

/// Prints, in one run: the agent's CPU and peak RSS in local and in server
/// mode on the same workload (the host's processes plus the C and Rust
/// test programs, unstripped, so local mode has DWARF to read), and the
/// cost of a month-range query whose frames all need server symbolization:
/// without debug info, cold (first query after the upload) and warm.
/// `FATHOM_BENCH_SECS` (default 60) is the agent measurement per mode.
#[test]
#[ignore = "benchmark: minutes long; needs root and BPF"]
fn symbols_benchmark() {
    let secs: u64 = std::env::var("FATHOM_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let dir = tempfile::tempdir().unwrap();
    let c = build_c(dir.path());
    let rs = build_rust(dir.path());

    println!("agent, {secs} s per mode, same workload (host + chainc + chainrs, unstripped):");
    println!(
        "{:<8} {:>10} {:>8} {:>14}",
        "mode", "CPU s", "CPU %", "peak RSS MiB"
    );
    for mode in ["local", "server"] {
        let f = Fathom::start(&dir.path().join(format!("data-{mode}")), &[]).unwrap();
        let _w = [spawn(&c.full, "1000"), spawn(&rs.full, "1000")];
        let t0 = Instant::now();
        let a = Agent::start(
            &f,
            dir.path(),
            &["--push-interval", "5s", "--symbolize", mode],
        );
        let pid = a.child.id();
        std::thread::sleep(Duration::from_secs(secs).saturating_sub(t0.elapsed()));
        let cpu = cpu_seconds(pid);
        let wall = t0.elapsed().as_secs_f64();
        println!(
            "{mode:<8} {cpu:>10.2} {:>8.2} {:>14.1}",
            cpu / wall * 100.0,
            peak_rss_mib(pid)
        );
    }

    // A month of address-only profiles: one every 6 hours, 200 stacks of 4
    // frames each, over 2,000 distinct function addresses of a big binary
    // (`fathom-agent` of this build, with its DWARF), else of chainrs.
    let agent_bin = fathom_bin().with_file_name("fathom-agent");
    let big = if agent_bin.exists() {
        let copy = dir.path().join("bigbin");
        std::fs::copy(&agent_bin, &copy).unwrap();
        let b = split(copy);
        Built {
            debug: b.full.clone(),
            ..b
        }
    } else {
        split(rs.full.clone())
    };
    let rs = big;
    let size_mib = std::fs::metadata(&rs.debug).unwrap().len() as f64 / 1048576.0;
    let segs = segments(&rs.full);
    let nm = run_ok(Command::new("nm").arg("--defined-only").arg(&rs.full), "nm");
    let mut offsets: Vec<u64> = nm
        .lines()
        .filter_map(|l| {
            let mut p = l.split_whitespace();
            let (a, t) = (p.next()?, p.next()?);
            matches!(t, "t" | "T").then(|| u64::from_str_radix(a, 16).ok())?
        })
        .filter_map(|v| {
            segs.iter()
                .find(|(_, sv, size)| v + 1 >= *sv && v + 1 < sv + size)
                .map(|(o, sv, _)| v + 1 - sv + o)
        })
        .collect();
    offsets.sort_unstable();
    offsets.dedup();
    offsets.truncate(2000);
    let n = offsets.len();
    let f = Fathom::start(
        &dir.path().join("data-query"),
        &["--symbolize-wait", "300s"],
    )
    .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let profiles = 30 * 4;
    for p in 0..profiles {
        let stacks: Vec<(Vec<u64>, i64)> = (0..200)
            .map(|s| {
                let frames = (0..4)
                    .map(|k| offsets[(p * 200 + s * 7 + k * 131) % n])
                    .collect();
                (frames, 1)
            })
            .collect();
        let t = now - 30 * 86_400 + p as i64 * 6 * 3600 + 60;
        let body = address_pprof_many(&rs, &stacks, t);
        ingest_pprof_at(&f, "bench.cpu", t, body);
    }
    let query = |label: &str| {
        let t0 = Instant::now();
        let s = f
            .folded(
                None,
                &format!("{CPU}{{service_name=\"bench\"}}"),
                "now-30d",
                "now",
            )
            .unwrap();
        let took = t0.elapsed();
        let named = s
            .keys()
            .filter(|k| !k.split(';').any(|fr| fr.starts_with("0x")))
            .count();
        println!(
            "{label:<34} {:>8.1} ms  {:>6} stacks, {named} fully named",
            took.as_secs_f64() * 1000.0,
            s.len()
        );
    };
    println!(
        "month-range query ({profiles} profiles over 30 days, {n} distinct addresses of a {size_mib:.0} MiB binary with DWARF), debug build of fathom:"
    );
    query("no debug info (addresses)");
    let (ok, out) = debuginfo(&f, &["upload", rs.debug.to_str().unwrap()]);
    assert!(ok, "{out}");
    query("cold (first after upload)");
    query("warm (cached addresses)");
    query("warm again");
}

/// A pprof a Go program wrote of itself, and the same profile with every
/// function removed (addresses and mappings only) are ingested; once the Go
/// binary is uploaded, their merges are equal.
/// Builds chain.go with `ldflags` and runs it: the binary and the CPU
/// profile it wrote of itself.
fn go_profile(dir: &Path, ldflags: &str) -> (PathBuf, pprof::Profile) {
    let src = dir.join("chaingo-src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::copy(sources().join("chain.go"), src.join("main.go")).unwrap();
    std::fs::write(src.join("go.mod"), "module chaingo\n\ngo 1.19\n").unwrap();
    let bin = dir.join("chaingo");
    // A GNU build id: runtime/pprof puts it in the mapping.
    run_ok(
        Command::new("go")
            .arg("build")
            .arg(format!(
                "-ldflags=-B 0x5ca1ab1e0123456789abcdef0123456789abcdef {ldflags}"
            ))
            .arg("-o")
            .arg(&bin)
            .arg(".")
            .current_dir(&src)
            .env("GOCACHE", dir.join("gocache"))
            .env("GOPATH", dir.join("gopath"))
            .env("GOPROXY", "off"),
        "building chain.go (apt-get install golang-go)",
    );
    let out = dir.join("cpu.pprof");
    run_ok(Command::new(&bin).arg(&out), "running chaingo");
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&out).unwrap())
        .read_to_end(&mut raw)
        .unwrap();
    let p = pprof::Profile::decode(raw.as_slice()).unwrap();
    assert!(
        p.mapping
            .iter()
            .any(|m| p.string_table[m.build_id as usize]
                == "5ca1ab1e0123456789abcdef0123456789abcdef"),
        "{:?}",
        p.mapping
    );
    (bin, p)
}

/// The profile with every function removed: addresses and mappings only.
fn without_functions(p: &pprof::Profile) -> pprof::Profile {
    let mut bare = p.clone();
    for l in &mut bare.location {
        l.line.clear();
    }
    bare.function.clear();
    for m in &mut bare.mapping {
        m.has_functions = false;
        m.has_filenames = false;
        m.has_line_numbers = false;
        m.has_inline_frames = false;
    }
    bare
}

/// A pprof a Go program wrote of itself, and the same profile with every
/// function removed (addresses and mappings only) are ingested; once the Go
/// binary (DWARF uncompressed, as distributions ship it) is uploaded,
/// their merges are equal, inlined frames included.
#[test]
fn go_pprof_without_functions_equals_the_original_after_upload() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, original) = go_profile(dir.path(), "-compressdwarf=false");
    let bare = without_functions(&original);
    let f = Fathom::start(&dir.path().join("data"), &[]).unwrap();
    ingest(&f, "goorig", original.encode_to_vec());
    ingest(&f, "goaddr", bare.encode_to_vec());
    let want = folded(&f, "goorig");
    assert!(
        want.keys()
            .any(|k| k.contains("main.outer;main.inlined;main.leaf")),
        "{want:?}"
    );
    let before = folded(&f, "goaddr");
    assert!(
        before
            .keys()
            .all(|k| k.split(';').all(|fr| fr.starts_with("chaingo+0x"))),
        "{before:?}"
    );
    assert_eq!(before.values().sum::<i64>(), want.values().sum::<i64>());

    let (ok, out) = debuginfo(&f, &["upload", bin.to_str().unwrap()]);
    assert!(ok, "{out}");
    let after = folded_when(&f, "goaddr", "main.leaf", Duration::from_secs(30));
    assert_eq!(after, want);
}

/// A stripped Go binary (`-s -w`, no symbols, no DWARF) is symbolized from
/// its `.gopclntab`: the same functions as the Go runtime's own profile,
/// inlined calls folded into their outermost function.
#[test]
fn stripped_go_binaries_are_symbolized_from_gopclntab() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, original) = go_profile(dir.path(), "-s -w");
    let sections = run_ok(Command::new("readelf").arg("-SW").arg(&bin), "readelf -S");
    assert!(
        !sections.contains(".symtab") && !sections.contains(".debug_info"),
        "{sections}"
    );
    let mut outermost = original.clone();
    for l in &mut outermost.location {
        let last = l.line.pop();
        l.line = last.into_iter().collect();
    }
    let f = Fathom::start(&dir.path().join("data"), &[]).unwrap();
    ingest(&f, "goouter", outermost.encode_to_vec());
    ingest(&f, "goaddr", without_functions(&original).encode_to_vec());
    let want = folded(&f, "goouter");
    assert!(
        want.keys().any(|k| k.ends_with("main.main;main.outer")),
        "{want:?}"
    );
    let (ok, out) = debuginfo(&f, &["upload", bin.to_str().unwrap()]);
    assert!(ok, "{out}");
    let v = f
        .get_json(
            None,
            "/api/v1/debuginfo/5ca1ab1e0123456789abcdef0123456789abcdef",
            &[],
        )
        .unwrap();
    assert_eq!(v["kind"], "gopclntab", "{v}");
    let after = folded_when(&f, "goaddr", "main.outer", Duration::from_secs(30));
    assert_eq!(after, want);
}

/// Compaction writes what the symbolizer knows into the merged block: once
/// compacted, the frames keep their names after the debug info is deleted.
#[test]
fn compaction_writes_functions_into_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let c = build_c(dir.path());
    let (_, co) = c_stack(&c);
    let mut f = Fathom::start(&dir.path().join("data"), &["--compaction-interval", "1s"]).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    // Both profiles in the previous hour: one compaction window.
    let t = now / 3600 * 3600 - 1800;
    let put = |f: &Fathom, t: i64, n: i64| {
        let body = address_pprof_many(&c, &[(co.clone(), n)], t);
        ingest_pprof_at(f, "chainc.cpu", t, body);
    };
    put(&f, t, 3);
    f.restart().unwrap();
    put(&f, t + 60, 4);
    let (ok, out) = debuginfo(&f, &["upload", c.debug.to_str().unwrap()]);
    assert!(ok, "{out}");
    f.restart().unwrap();
    eventually(Duration::from_secs(60), || {
        match f.metric("fathom_compactor_jobs_total") {
            Ok(v) if v >= 1.0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let (ok, out) = debuginfo(&f, &["delete", &c.build_id]);
    assert!(ok, "{out}");
    let s = f
        .folded(
            None,
            &format!("{CPU}{{service_name=\"chainc\"}}"),
            "now-3h",
            "now",
        )
        .unwrap();
    assert_eq!(
        s,
        BTreeMap::from([(
            "main;outer_caller;inlined_middle;spin_leaf".to_owned(),
            70_000_000
        )])
    );
}

/// In a cluster, the compactor role writes the functions of address-only
/// frames into the blocks it compacts, from debug info uploaded through a
/// querier: once the debug info is deleted again, the querier still shows
/// them.
#[test]
fn cluster_compactor_writes_functions_into_blocks() {
    use fathom_integration::cluster::{Cluster, ClusterOptions};
    let dir = tempfile::tempdir().unwrap();
    let c = build_c(dir.path());
    let (_, co) = c_stack(&c);
    // A query's wait of 1 ms: a compaction still waits for its symbols
    // (at least a minute), however long reading the debug file takes.
    let opts = ClusterOptions {
        compaction_interval: Duration::from_secs(1),
        flush_interval: Duration::from_secs(1),
        compactor_args: vec!["--symbolize-wait".into(), "1ms".into()],
        ..Default::default()
    };
    let cl = Cluster::start(&dir.path().join("cluster"), &opts).unwrap();
    let querier = cl.querier.url("");
    let (ok, out) = debuginfo_at(&querier, &["upload", c.debug.to_str().unwrap()]);
    assert!(ok, "{out}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    // In the previous hour: a window the compactor merges at once.
    let t = now / 3600 * 3600 - 1800;
    let send = |at: i64| {
        let body = address_pprof_many(&c, &[(co.clone(), 5)], at);
        let r = reqwest::blocking::Client::new()
            .post(cl.distributors[0].url("/ingest"))
            .query(&[
                ("name", "chainc.cpu"),
                ("format", "pprof"),
                ("from", &at.to_string()),
            ])
            .body(body)
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
    };
    // Two cuts: the replicas store one copy of a cut between them (the
    // ingester first for the series), and a level-0 block alone in its
    // window is left as it is, so a second block gives the compactor a
    // window to merge.
    send(t);
    eventually(Duration::from_secs(60), || {
        match cl.blocks("anonymous").map_err(|e| e.to_string())?.len() {
            0 => Err("no block yet".to_owned()),
            _ => Ok(()),
        }
    });
    send(t + 1);
    // The level-0 blocks merged into one compacted block.
    eventually(Duration::from_secs(90), || {
        let blocks = cl.blocks("anonymous").map_err(|e| e.to_string())?;
        match blocks.as_slice() {
            [b] if b.level >= 1 => Ok(()),
            other => Err(format!(
                "blocks (level, source): {:?}",
                other
                    .iter()
                    .map(|b| (b.level, &b.source))
                    .collect::<Vec<_>>()
            )),
        }
    });
    let (ok, out) = debuginfo_at(&querier, &["delete", &c.build_id]);
    assert!(ok, "{out}");
    let got = crate::cluster::folded_query(
        &querier,
        None,
        &format!("{CPU}{{service_name=\"chainc\"}}"),
        "now-3h",
        "now",
    )
    .unwrap();
    assert_eq!(
        got,
        BTreeMap::from([(
            "main;outer_caller;inlined_middle;spin_leaf".to_owned(),
            // Both writes: 5 samples of 10 ms each.
            100_000_000
        )])
    );
}

/// `--upload-debuginfo`: the agent in server mode uploads the unstripped
/// binary it finds (once), and its frames are named by the server.
#[test]
fn agent_uploads_debug_info_of_binaries_it_finds() {
    let dir = tempfile::tempdir().unwrap();
    let c = build_c(dir.path());
    let f = Fathom::start(&dir.path().join("data"), &[]).unwrap();
    let keep = dir.path().join("keep.yaml");
    std::fs::write(
        &keep,
        "relabel_configs:\n  - source_labels: [comm]\n    regex: chainc\n    action: keep\n",
    )
    .unwrap();
    let _w = spawn(&c.full, "120");
    let _a = Agent::start(
        &f,
        dir.path(),
        &[
            "--push-interval",
            "5s",
            "--symbolize",
            "server",
            "--upload-debuginfo",
            "--relabel-config",
            keep.to_str().unwrap(),
        ],
    );
    let meta = eventually(Duration::from_secs(180), || {
        f.get_json(None, &format!("/api/v1/debuginfo/{}", c.build_id), &[])
            .map_err(|e| e.to_string())
    });
    assert_eq!(meta["source"], "upload", "{meta}");
    assert_eq!(meta["name"], "chainc", "{meta}");
    assert_eq!(meta["kind"], "dwarf", "{meta}");
    eventually(Duration::from_secs(180), || {
        let s = from_frame(&f, "chainc", "main");
        match top(&s) {
            Some((stack, v, total))
                if stack == "main;outer_caller;inlined_middle;spin_leaf" && v * 2 > total =>
            {
                Ok(())
            }
            _ => Err(format!("{s:?}")),
        }
    });
}

/// OTLP profiles whose frames carry only a mapping with
/// `process.executable.build_id.gnu` and an address (the OpenTelemetry
/// eBPF profiler's native frames) are symbolized the same way.
#[test]
fn otlp_address_frames_are_symbolized_after_upload() {
    let dir = tempfile::tempdir().unwrap();
    let c = build_c(dir.path());
    let (_, co) = c_stack(&c);
    let f = Fathom::start(&dir.path().join("data"), &[]).unwrap();
    let p = pprof::Profile::decode(address_pprof(&c, &co, 5).as_slice()).unwrap();
    let req = fathom_otlp::from_pprof(&p, &[("service.name", "chainc-otlp")]).unwrap();
    let r = f
        .http
        .post(f.url("/v1development/profiles"))
        .header("Content-Type", "application/x-protobuf")
        .body(req.encode_to_vec())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text());
    let before = folded(&f, "chainc-otlp");
    assert!(
        !before.is_empty()
            && before
                .keys()
                .all(|k| k.split(';').all(|fr| fr.starts_with("chainc-s+0x"))),
        "{before:?}"
    );
    let (ok, out) = debuginfo(&f, &["upload", c.debug.to_str().unwrap()]);
    assert!(ok, "{out}");
    let after = folded_when(&f, "chainc-otlp", "spin_leaf", Duration::from_secs(30));
    assert_eq!(
        after,
        BTreeMap::from([(
            "main;outer_caller;inlined_middle;spin_leaf".to_owned(),
            50_000_000
        )])
    );
}

/// Sends a pprof to `f` as series `name` at Unix second `t`; it must be
/// acknowledged.
fn ingest_pprof_at(f: &Fathom, name: &str, t: i64, body: Vec<u8>) {
    let (s, b) = f
        .ingest(
            None,
            &[
                ("name", name),
                ("format", "pprof"),
                ("from", &t.to_string()),
            ],
            body,
        )
        .unwrap();
    assert_eq!(s, 200, "{b}");
}
