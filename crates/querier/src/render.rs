//! Turning merged (stack, value) pairs into what users read: folded text,
//! top tables and flame graph trees, for one profile or a diff of two.
//!
//! Everything here works on "columns": one value per side (one for a merge,
//! two for a diff, left then right), so a merge and a diff share one code
//! path.

use std::collections::{BTreeMap, HashMap};

use fathom_model::{Id, Symbols};
use serde::Serialize;

/// Stacks as frame lists (root first) with one value per column; equal
/// frame lists are summed, all-zero rows dropped, sorted by frames.
/// Functions are named as `go tool pprof` displays them
/// ([`fathom_pprof::display_name`], an unnamed function stays empty), so
/// that folded text and Flight answers equal `go tool pprof -raw`; pprof
/// output keeps the full names.
pub fn folded<const N: usize>(cols: [(&[(Id, i64)], &Symbols); N]) -> Vec<(Vec<String>, [i64; N])> {
    folded_by(cols, fathom_pprof::display_name, false)
}

/// As [`folded`], with every frame under [`frame_name`] (never blank) and
/// address-only frames as binary + offset
/// ([`fathom_model::Symbols::frames_display_by`]): for what people look at
/// (top tables, flame graphs).
pub fn folded_for_display<const N: usize>(
    cols: [(&[(Id, i64)], &Symbols); N],
) -> Vec<(Vec<String>, [i64; N])> {
    folded_by(cols, frame_name, true)
}

fn folded_by<const N: usize>(
    cols: [(&[(Id, i64)], &Symbols); N],
    name: fn(&fathom_model::Function) -> String,
    display: bool,
) -> Vec<(Vec<String>, [i64; N])> {
    let mut acc: BTreeMap<Vec<String>, [i64; N]> = BTreeMap::new();
    for (c, (samples, symbols)) in cols.iter().enumerate() {
        for (stack, v) in samples.iter() {
            let frames = if display {
                symbols.frames_display_by(stack, name)
            } else {
                symbols.frames_by(stack, name)
            };
            acc.entry(frames).or_insert([0; N])[c] += *v;
        }
    }
    acc.into_iter()
        .filter(|(_, v)| v.iter().any(|x| *x != 0))
        .collect()
}

/// The name a frame is shown under: what `go tool pprof` displays
/// ([`fathom_pprof::display_name`]); for a function with no name (some SDKs
/// send those) its system name, else `file:line`, else `?`: never blank.
pub fn frame_name(f: &fathom_model::Function) -> String {
    let name = fathom_pprof::display_name(f);
    if !name.is_empty() {
        name
    } else if !f.system_name.is_empty() {
        f.system_name.clone()
    } else if !f.filename.is_empty() {
        format!("{}:{}", f.filename, f.start_line)
    } else {
        "?".to_owned()
    }
}

/// Folded text: `root;…;leaf v1[ v2]` per line.
pub fn folded_text<const N: usize>(rows: &[(Vec<String>, [i64; N])]) -> String {
    let mut out = String::new();
    for (frames, vals) in rows {
        out.push_str(&frames.join(";"));
        for v in vals {
            out.push(' ');
            out.push_str(&v.to_string());
        }
        out.push('\n');
    }
    out
}

/// One function's flat (as leaf) and cumulative (anywhere on the stack,
/// counted once per stack) values, per column.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TopRow<const N: usize> {
    pub name: String,
    #[serde(skip)]
    pub flat: [i64; N],
    #[serde(skip)]
    pub cum: [i64; N],
}

/// Adds `v` to `acc`, column by column.
fn add(acc: &mut [i64], v: &[i64]) {
    for (a, b) in acc.iter_mut().zip(v) {
        *a += b;
    }
}

/// Functions by flat value of the last column, descending, then by name.
pub fn top<const N: usize>(rows: &[(Vec<String>, [i64; N])]) -> Vec<TopRow<N>> {
    let mut by: HashMap<&str, ([i64; N], [i64; N])> = HashMap::new();
    for (frames, vals) in rows {
        if let Some(leaf) = frames.last() {
            let e = by.entry(leaf.as_str()).or_insert(([0; N], [0; N]));
            add(&mut e.0, vals);
        }
        let mut once: Vec<&str> = frames.iter().map(String::as_str).collect();
        once.sort_unstable();
        once.dedup();
        for f in once {
            let e = by.entry(f).or_insert(([0; N], [0; N]));
            add(&mut e.1, vals);
        }
    }
    let mut out: Vec<TopRow<N>> = by
        .into_iter()
        .map(|(name, (flat, cum))| TopRow {
            name: name.to_owned(),
            flat,
            cum,
        })
        .collect();
    out.sort_by(|a, b| {
        b.flat[N - 1]
            .cmp(&a.flat[N - 1])
            .then_with(|| b.cum[N - 1].cmp(&a.cum[N - 1]))
            .then_with(|| a.name.cmp(&b.name))
    });
    out
}

/// A flame graph node: total and self values per column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlameNode<const N: usize> {
    pub name: String,
    pub value: [i64; N],
    pub self_value: [i64; N],
    pub children: Vec<FlameNode<N>>,
}

/// The label of the node that holds a parent's small children.
pub const OTHER: &str = "other";

/// One folded row: frames (root first) and a value per column.
pub type Row<const N: usize> = (Vec<String>, [i64; N]);

/// A bounded merge: its samples, the symbols they need, how many stacks
/// were summed into `other`.
pub type Bounded = (Vec<(Id, i64)>, Symbols, usize);

/// Keeps the `max` heaviest rows of a folded output (by the sum of
/// absolute column values; ties broken by frames, so the cut is
/// deterministic) and sums the others into one last row whose only frame
/// is [`OTHER`], so that totals are preserved. Returns the rows, sorted
/// by frames with the `other` row last, and how many rows were merged
/// into it (0: nothing was cut).
pub fn bound_folded<const N: usize>(rows: Vec<Row<N>>, max: usize) -> (Vec<Row<N>>, usize) {
    let max = max.max(1);
    if rows.len() <= max {
        return (rows, 0);
    }
    let weight = |v: &[i64; N]| v.iter().map(|x| x.unsigned_abs()).sum::<u64>();
    let mut rows = rows;
    // One row is the `other` row.
    let keep = max - 1;
    rows.sort_by(|a, b| weight(&b.1).cmp(&weight(&a.1)).then_with(|| a.0.cmp(&b.0)));
    let cut = rows.split_off(keep);
    let mut other = [0i64; N];
    for (_, v) in &cut {
        for (o, x) in other.iter_mut().zip(v) {
            *o = o.wrapping_add(*x);
        }
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    rows.push((vec![OTHER.to_owned()], other));
    (rows, cut.len())
}

/// Keeps the `max` heaviest stacks of a merge for a pprof output, the
/// others summed into one sample whose stack is a single frame named
/// [`OTHER`] (totals preserved). `None` when the merge has at most `max`
/// stacks (nothing to cut); else the samples, the symbols they need and
/// how many stacks were merged.
pub fn bound_samples(samples: &[(Id, i64)], symbols: &Symbols, max: usize) -> Option<Bounded> {
    let max = max.max(1);
    if samples.len() <= max {
        return None;
    }
    let mut order: Vec<&(Id, i64)> = samples.iter().collect();
    order.sort_by(|a, b| {
        b.1.unsigned_abs()
            .cmp(&a.1.unsigned_abs())
            .then(a.0.cmp(&b.0))
    });
    let (kept, cut) = order.split_at(max - 1);
    let mut out: Vec<(Id, i64)> = kept.iter().map(|s| **s).collect();
    let mut syms = symbols.subset(out.iter().map(|s| &s.0));
    let f = fathom_model::Function {
        name: OTHER.to_owned(),
        system_name: OTHER.to_owned(),
        ..Default::default()
    };
    let fid = f.id();
    let loc = fathom_model::Location {
        mapping: Id::ZERO,
        address: 0,
        lines: vec![fathom_model::Line {
            function: fid,
            line: 0,
        }],
    };
    let lid = loc.id();
    let stack = fathom_model::Stack {
        locations: vec![lid],
    };
    let sid = stack.id();
    syms.functions.insert(fid, f);
    syms.locations.insert(lid, loc);
    syms.stacks.insert(sid, stack);
    let other = cut.iter().fold(0i64, |a, s| a.wrapping_add(s.1));
    out.sort_unstable_by_key(|s| s.0);
    out.push((sid, other));
    Some((out, syms, cut.len()))
}

/// Builds the tree rooted at `total`. At most `max_nodes` nodes are kept:
/// the largest by the sum of absolute column values; the children of a
/// parent that fall below the cut are merged into one `other` child.
/// Children are sorted by name.
pub fn flamegraph<const N: usize>(
    rows: &[(Vec<String>, [i64; N])],
    max_nodes: usize,
) -> FlameNode<N> {
    #[derive(Default)]
    struct Raw<const N: usize> {
        value: Vec<i64>,
        self_value: Vec<i64>,
        children: BTreeMap<String, usize>,
    }
    let mut arena: Vec<Raw<N>> = vec![Raw {
        value: vec![0; N],
        self_value: vec![0; N],
        children: BTreeMap::new(),
    }];
    for (frames, vals) in rows {
        let mut cur = 0;
        add(&mut arena[0].value, vals);
        for f in frames {
            let next = match arena[cur].children.get(f) {
                Some(&i) => i,
                None => {
                    arena.push(Raw {
                        value: vec![0; N],
                        self_value: vec![0; N],
                        children: BTreeMap::new(),
                    });
                    let i = arena.len() - 1;
                    arena[cur].children.insert(f.clone(), i);
                    i
                }
            };
            cur = next;
            add(&mut arena[cur].value, vals);
        }
        add(&mut arena[cur].self_value, vals);
    }
    // The weight that decides what is kept.
    let weight = |r: &Raw<N>| r.value.iter().map(|v| v.unsigned_abs()).sum::<u64>();
    let max_nodes = max_nodes.max(1);
    let threshold = if arena.len() > max_nodes {
        let mut w: Vec<u64> = arena.iter().map(weight).collect();
        w.sort_unstable_by(|a, b| b.cmp(a));
        // Strictly above the (max_nodes)-th weight: ties are cut together.
        w[max_nodes - 1].saturating_add(1)
    } else {
        0
    };
    fn to_arr<const N: usize>(v: &[i64]) -> [i64; N] {
        let mut a = [0; N];
        a.copy_from_slice(v);
        a
    }
    fn build<const N: usize>(
        arena: &[Raw<N>],
        i: usize,
        name: String,
        threshold: u64,
        weight: &dyn Fn(&Raw<N>) -> u64,
    ) -> FlameNode<N> {
        let r = &arena[i];
        let mut children = Vec::new();
        let mut other = [0i64; N];
        let mut has_other = false;
        for (name, &c) in &r.children {
            if weight(&arena[c]) >= threshold {
                children.push(build(arena, c, name.clone(), threshold, weight));
            } else {
                has_other = true;
                add(&mut other, &arena[c].value);
            }
        }
        if has_other {
            children.push(FlameNode {
                name: OTHER.to_owned(),
                value: other,
                self_value: other,
                children: Vec::new(),
            });
        }
        FlameNode {
            name,
            value: to_arr(&r.value),
            self_value: to_arr(&r.self_value),
            children,
        }
    }
    build(&arena, 0, "total".to_owned(), threshold, &weight)
}

impl FlameNode<1> {
    /// `{"name", "value", "self", "children"}`
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "value": self.value[0],
            "self": self.self_value[0],
            "children": self.children.iter().map(|c| c.to_json()).collect::<Vec<_>>(),
        })
    }
}

impl FlameNode<2> {
    /// `{"name", "left", "right", "self_left", "self_right", "children"}`
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "left": self.value[0],
            "right": self.value[1],
            "self_left": self.self_value[0],
            "self_right": self.self_value[1],
            "children": self.children.iter().map(|c| c.to_json()).collect::<Vec<_>>(),
        })
    }
}

impl<const N: usize> FlameNode<N> {
    /// Nodes in the tree, this one included.
    pub fn count(&self) -> usize {
        1 + self.children.iter().map(|c| c.count()).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<(Vec<String>, [i64; 1])> {
        let r = |s: &str, v: i64| (s.split(';').map(str::to_owned).collect(), [v]);
        vec![
            r("main;a;b", 5),
            r("main;a", 2),
            r("main;c", 1),
            r("main;d", 1),
            r("other_root;x", 3),
        ]
    }

    #[test]
    fn bounded_folded_keeps_the_heaviest_lines_and_the_total() {
        let (kept, cut) = bound_folded(rows(), 3);
        assert_eq!(cut, 3);
        let text = folded_text(&kept);
        assert_eq!(text, "main;a;b 5\nother_root;x 3\nother 4\n");
        // Totals are preserved.
        let total = |r: &[(Vec<String>, [i64; 1])]| r.iter().map(|x| x.1[0]).sum::<i64>();
        assert_eq!(total(&kept), total(&rows()));
        // Within the bound nothing changes.
        let (same, cut) = bound_folded(rows(), 5);
        assert_eq!((same, cut), (rows(), 0));
        // A bound of one is the `other` line alone.
        let (one, cut) = bound_folded(rows(), 1);
        assert_eq!((one.len(), cut), (1, 5));
        assert_eq!(one[0], (vec![OTHER.to_owned()], [12]));
    }

    #[test]
    fn bounded_pprof_samples_keep_the_heaviest_stacks_and_the_total() {
        let mut symbols = Symbols::default();
        let mut samples = Vec::new();
        for i in 0..10i64 {
            let f = fathom_model::Function {
                name: format!("f{i}"),
                ..Default::default()
            };
            let fid = f.id();
            let loc = fathom_model::Location {
                mapping: Id::ZERO,
                address: i as u64,
                lines: vec![fathom_model::Line {
                    function: fid,
                    line: 1,
                }],
            };
            let lid = loc.id();
            let st = fathom_model::Stack {
                locations: vec![lid],
            };
            let sid = st.id();
            symbols.functions.insert(fid, f);
            symbols.locations.insert(lid, loc);
            symbols.stacks.insert(sid, st);
            samples.push((sid, (i + 1) * 10));
        }
        assert!(bound_samples(&samples, &symbols, 10).is_none());
        let (kept, syms, cut) = bound_samples(&samples, &symbols, 4).unwrap();
        assert_eq!((kept.len(), cut), (4, 7));
        let total: i64 = kept.iter().map(|s| s.1).sum();
        assert_eq!(total, samples.iter().map(|s| s.1).sum::<i64>());
        let folded = folded([(&kept[..], &syms)]);
        let names: Vec<String> = folded.iter().map(|r| r.0.join(";")).collect();
        assert_eq!(names, vec!["f7", "f8", "f9", OTHER]);
        assert_eq!(folded[3].1, [10 + 20 + 30 + 40 + 50 + 60 + 70]);
        // What the pprof encoder makes of it decodes to the same total.
        let pt: fathom_model::ProfileType = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
            .parse()
            .unwrap();
        let p = fathom_pprof::to_pprof(&pt, &kept, &syms, 0, 1, 1);
        assert_eq!(p.sample.len(), 4);
        assert_eq!(p.sample.iter().map(|s| s.value[0]).sum::<i64>(), total);
    }

    #[test]
    fn a_nameless_frame_is_never_blank() {
        let f = |name: &str, system: &str, file: &str| fathom_model::Function {
            name: name.into(),
            system_name: system.into(),
            filename: file.into(),
            start_line: 12,
        };
        assert_eq!(frame_name(&f("main.run", "main.run", "")), "main.run");
        assert_eq!(
            frame_name(&f("", "_ZN4core3fmt5write", "")),
            "_ZN4core3fmt5write"
        );
        assert_eq!(frame_name(&f("", "", "src/main.rs")), "src/main.rs:12");
        assert_eq!(frame_name(&f("", "", "")), "?");
    }

    #[test]
    fn top_flat_and_cum() {
        let t = top(&rows());
        assert_eq!(t[0].name, "b");
        assert_eq!(t[0].flat, [5]);
        let a = t.iter().find(|r| r.name == "a").unwrap();
        assert_eq!((a.flat, a.cum), ([2], [7]));
        let main = t.iter().find(|r| r.name == "main").unwrap();
        assert_eq!((main.flat, main.cum), ([0], [9]));
    }

    #[test]
    fn top_counts_recursion_once() {
        let r = vec![(vec!["f".to_owned(), "f".to_owned(), "f".to_owned()], [4])];
        let t = top(&r);
        assert_eq!((t[0].flat, t[0].cum), ([4], [4]));
    }

    #[test]
    fn flamegraph_totals_and_snapshot() {
        let g = flamegraph(&rows(), 100);
        assert_eq!(g.value, [12]);
        insta::assert_json_snapshot!(g.to_json());
    }

    #[test]
    fn flamegraph_prunes_into_other() {
        let g = flamegraph(&rows(), 4);
        assert!(g.count() <= 4 + 2, "{}", g.count());
        let main = g.children.iter().find(|c| c.name == "main").unwrap();
        let other = main.children.iter().find(|c| c.name == OTHER).unwrap();
        assert_eq!(other.value, [2]); // c and d
        // Totals are kept whatever is pruned.
        assert_eq!(main.value, [9]);
        let sum: i64 = main.children.iter().map(|c| c.value[0]).sum();
        assert_eq!(sum + main.self_value[0], main.value[0]);
    }

    #[test]
    fn diff_keeps_both_columns() {
        let r =
            |s: &str, a: i64, b: i64| (s.split(';').map(str::to_owned).collect::<Vec<_>>(), [a, b]);
        let rows = vec![r("main;a", 3, 0), r("main;b", 0, 4)];
        let g = flamegraph(&rows, 100);
        assert_eq!(g.value, [3, 4]);
        let t = top(&rows);
        assert_eq!(t[0].name, "b");
        assert_eq!(t[0].flat, [0, 4]);
        assert_eq!(folded_text(&rows), "main;a 3 0\nmain;b 0 4\n");
    }
}
