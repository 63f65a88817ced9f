//! Pyroscope's flattened flame graph ("flamebearer" levels): the same tree
//! [`flamegraph`](fathom_querier::flamegraph) builds for Fathom's own API, laid out
//! row by row.
//!
//! Level `d` holds the nodes at depth `d` (level 0 is the root, `total`),
//! left to right. Each node is `3 × N + 1` integers: per column (one for a
//! merge, left then right for a diff) its x offset, total and self, then its
//! index into `names`. A node spans `[x, x + total)`; its self part comes
//! first, then its children in the tree's order. The x offsets are delta
//! encoded along a level: each stores the gap since the end of the node
//! before it. Names are deduplicated, `names[0]` is `total`.

use std::collections::HashMap;

use fathom_model::ProfileType;
use serde_json::json;

use fathom_querier::FlameNode;

/// A flame graph as flattened levels.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Levels {
    pub(crate) names: Vec<String>,
    pub(crate) levels: Vec<Vec<i64>>,
    /// The root's total, summed over the columns.
    pub(crate) total: i64,
    /// The largest self value of any node in any column.
    pub(crate) max_self: i64,
    /// The root's total per column (left and right ticks of a diff).
    pub(crate) ticks: Vec<i64>,
}

/// Flattens `root` (see the module docs).
pub(crate) fn levels<const N: usize>(root: &FlameNode<N>) -> Levels {
    let mut names: Vec<String> = Vec::new();
    let mut index: HashMap<&str, i64> = HashMap::new();
    let mut levels: Vec<Vec<i64>> = Vec::new();
    let mut max_self = 0i64;
    // Pre-order, left to right: every level is filled in increasing x.
    let mut stack: Vec<(&FlameNode<N>, usize, [i64; N])> = vec![(root, 0, [0; N])];
    while let Some((node, depth, x)) = stack.pop() {
        let name = if depth == 0 {
            "total"
        } else {
            node.name.as_str()
        };
        let i = *index.entry(name).or_insert_with(|| {
            names.push(name.to_owned());
            names.len() as i64 - 1
        });
        if levels.len() == depth {
            levels.push(Vec::new());
        }
        let level = &mut levels[depth];
        for ((x, total), slf) in x.iter().zip(&node.value).zip(&node.self_value) {
            level.extend([*x, *total, *slf]);
            max_self = max_self.max(*slf);
        }
        level.push(i);
        // The self part first, then the children left to right.
        let mut cx: [i64; N] = std::array::from_fn(|c| x[c].saturating_add(node.self_value[c]));
        let mut kids = Vec::with_capacity(node.children.len());
        for child in &node.children {
            kids.push((child, depth + 1, cx));
            for (a, v) in cx.iter_mut().zip(&child.value) {
                *a = a.saturating_add(*v);
            }
        }
        stack.extend(kids.into_iter().rev());
    }
    let width = 3 * N + 1;
    for level in &mut levels {
        for c in 0..N {
            let mut end = 0i64;
            for node in level.chunks_exact_mut(width) {
                let (x, total) = (node[3 * c], node[3 * c + 1]);
                node[3 * c] = x.saturating_sub(end);
                end = x.saturating_add(total);
            }
        }
    }
    Levels {
        names,
        levels,
        total: root.value.iter().fold(0i64, |a, v| a.saturating_add(*v)),
        max_self,
        ticks: root.value.to_vec(),
    }
}

/// The unit and sample rate Pyroscope's flamebearer gives a profile type:
/// CPU time as `samples` at a rate of 10⁹ (nanoseconds), counts as
/// `objects`, everything else its sample unit at a rate of 100.
fn units(pt: &ProfileType) -> (&str, u32) {
    match pt.sample_type.as_str() {
        "cpu" => ("samples", 1_000_000_000),
        "inuse_objects" | "alloc_objects" | "goroutine" | "samples" => ("objects", 100),
        _ => (pt.sample_unit.as_str(), 100),
    }
}

/// The flamebearer JSON (`/pyroscope/render`, `/pyroscope/render-diff`) of
/// `l`: `single` for a merge, `double` for a diff (with `leftTicks` and
/// `rightTicks`). `timeline` and `groups` go in as given (`null` when
/// absent).
pub(crate) fn flamebearer(
    l: &Levels,
    pt: &ProfileType,
    timeline: serde_json::Value,
    groups: serde_json::Value,
) -> serde_json::Value {
    let (unit, rate) = units(pt);
    let double = l.ticks.len() == 2;
    let mut v = json!({
        "version": 1,
        "flamebearer": {
            "names": l.names,
            "levels": l.levels,
            "numTicks": l.total,
            "maxSelf": l.max_self,
        },
        "metadata": {
            "format": if double { "double" } else { "single" },
            "spyName": "",
            "sampleRate": rate,
            "units": unit,
            "name": pt.sample_type,
        },
        "timeline": timeline,
        "groups": groups,
        "heatmap": null,
    });
    if double {
        v["leftTicks"] = json!(l.ticks[0]);
        v["rightTicks"] = json!(l.ticks[1]);
    }
    v
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;
    use std::io::Read;

    use super::*;
    use fathom_querier::flamegraph;

    /// Reads flattened levels back into (stack → (total, self)) per column,
    /// the way a flame graph renderer does: a node's parent is the node one
    /// level up whose span holds its x offset (in a column where the node
    /// is not empty).
    pub(crate) fn unflatten<const N: usize>(
        l: &Levels,
    ) -> BTreeMap<Vec<String>, ([i64; N], [i64; N])> {
        let width = 3 * N + 1;
        // Absolute x offsets per level, node and column.
        let mut abs: Vec<Vec<[i64; N]>> = Vec::new();
        for level in &l.levels {
            assert_eq!(level.len() % width, 0, "level of {} values", level.len());
            let mut end = [0i64; N];
            let mut xs = Vec::new();
            for node in level.chunks_exact(width) {
                let mut x = [0i64; N];
                for c in 0..N {
                    x[c] = end[c] + node[3 * c];
                    end[c] = x[c] + node[3 * c + 1];
                }
                xs.push(x);
            }
            abs.push(xs);
        }
        let mut paths: Vec<Vec<Vec<String>>> = Vec::new();
        let mut out = BTreeMap::new();
        for (d, level) in l.levels.iter().enumerate() {
            let mut here = Vec::new();
            for (k, node) in level.chunks_exact(width).enumerate() {
                let name = l.names[node[width - 1] as usize].clone();
                let path = if d == 0 {
                    assert_eq!(name, "total");
                    Vec::new()
                } else {
                    let c = (0..N)
                        .find(|&c| node[3 * c + 1] > 0)
                        .expect("a node with a positive total");
                    let x = abs[d][k][c];
                    let up = &l.levels[d - 1];
                    // Nodes are in x order along a level: the parent is the
                    // last one starting at or before x that spans it.
                    let before = abs[d - 1].partition_point(|px| px[c] <= x);
                    let parent = (0..before)
                        .rev()
                        .find(|&p| x < abs[d - 1][p][c] + up[p * width + 3 * c + 1])
                        .expect("every node has a parent whose span holds it");
                    let mut p = paths[d - 1][parent].clone();
                    p.push(name.clone());
                    p
                };
                let mut total = [0; N];
                let mut slf = [0; N];
                for c in 0..N {
                    total[c] = node[3 * c + 1];
                    slf[c] = node[3 * c + 2];
                }
                let prev = out.insert(path.clone(), (total, slf));
                assert!(prev.is_none(), "two nodes for {path:?}");
                here.push(path);
            }
            paths.push(here);
        }
        out
    }

    /// The same map from the tree.
    fn tree_map<const N: usize>(
        n: &FlameNode<N>,
        path: &mut Vec<String>,
        out: &mut BTreeMap<Vec<String>, ([i64; N], [i64; N])>,
    ) {
        out.insert(path.clone(), (n.value, n.self_value));
        for c in &n.children {
            path.push(c.name.clone());
            tree_map(c, path, out);
            path.pop();
        }
    }

    /// Real profiles: `go tool pprof`'s folded expectations in the shared
    /// test data, as (stack, value) rows per sample type.
    type Rows = Vec<(Vec<String>, [i64; 1])>;

    fn corpus_rows(file: &str) -> BTreeMap<String, Rows> {
        let path = format!(
            "{}/../../../shared/testdata/pprof/expected/{file}.folded.tsv.gz",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut text = String::new();
        flate2::read::GzDecoder::new(
            std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}")),
        )
        .read_to_string(&mut text)
        .unwrap();
        let mut out: BTreeMap<String, BTreeMap<Vec<String>, i64>> = BTreeMap::new();
        for line in text.lines().filter(|l| !l.is_empty()) {
            let (t, rest) = line.split_once('\t').unwrap();
            let (stack, v) = rest.rsplit_once('\t').unwrap();
            let frames = stack.split(';').map(str::to_owned).collect();
            *out.entry(t.to_owned())
                .or_default()
                .entry(frames)
                .or_default() += v.parse::<i64>().unwrap();
        }
        out.into_iter()
            .map(|(t, rows)| (t, rows.into_iter().map(|(f, v)| (f, [v])).collect()))
            .collect()
    }

    const FILES: [&str; 2] = [
        "google+pprof/internal/proftest/testdata/large.cpu",
        "google+pprof/internal/report/testdata/sample.cpu",
    ];

    #[test]
    fn levels_read_back_as_the_flame_graph_of_real_profiles() {
        // The whole tree of the small profile; the large one (20,000
        // stacks) pruned, which keeps a debug build's run short.
        for (file, limits) in FILES.iter().zip([[8192, 3], [1 << 20, 3]]) {
            let rows = &corpus_rows(file)["cpu/nanoseconds"];
            for max_nodes in limits {
                let tree = flamegraph(rows, max_nodes);
                let l = levels(&tree);
                let mut want = BTreeMap::new();
                tree_map(&tree, &mut Vec::new(), &mut want);
                let got = unflatten::<1>(&l);
                assert_eq!(got, want, "{file} max_nodes={max_nodes}");
                // The root is the total of every stack, and the self values
                // of the levels add up to it.
                let sum: i64 = rows.iter().map(|r| r.1[0]).sum();
                assert_eq!(l.total, sum);
                let selfs: i64 = got.values().map(|v| v.1[0]).sum();
                assert_eq!(selfs, sum, "{file}");
                assert_eq!(l.max_self, got.values().map(|v| v.1[0]).max().unwrap());
                // max_nodes bounds the nodes kept; pruned siblings become
                // one `other` node under their parent.
                let kept = got
                    .keys()
                    .filter(|p| p.last().is_none_or(|n| n != fathom_querier::OTHER))
                    .count();
                assert!(kept <= max_nodes, "{kept} nodes for max_nodes={max_nodes}");
            }
        }
    }

    #[test]
    fn diff_levels_keep_both_sides() {
        let mut by: BTreeMap<Vec<String>, [i64; 2]> = BTreeMap::new();
        for (c, file) in FILES.iter().enumerate() {
            for (_, rows) in corpus_rows(file) {
                for (f, v) in rows {
                    by.entry(f).or_insert([0, 0])[c] += v[0];
                }
            }
        }
        let rows: Vec<(Vec<String>, [i64; 2])> = by.into_iter().collect();
        let tree = flamegraph(&rows, 500);
        let l = levels(&tree);
        assert!(l.levels.iter().all(|lv| lv.len() % 7 == 0));
        let mut want = BTreeMap::new();
        tree_map(&tree, &mut Vec::new(), &mut want);
        let got = unflatten::<2>(&l);
        assert_eq!(got, want);
        assert_eq!(l.ticks, tree.value.to_vec());
        assert_eq!(l.total, tree.value[0] + tree.value[1]);
    }

    #[test]
    fn small_tree_layout_matches_pyroscope() {
        let r = |s: &str, v: i64| (s.split(';').map(str::to_owned).collect(), [v]);
        let rows = vec![r("a;b", 3), r("a", 1), r("c", 2)];
        let l = levels(&flamegraph(&rows, 100));
        assert_eq!(l.names, ["total", "a", "b", "c"]);
        // total [0,6); a [0,4) self 1 then b [1,4); c [4,6).
        assert_eq!(
            l.levels,
            vec![
                vec![0, 6, 0, 0],
                vec![0, 4, 1, 1, 0, 2, 2, 3],
                vec![1, 3, 3, 2]
            ]
        );
        assert_eq!((l.total, l.max_self), (6, 3));
        let pt: ProfileType = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
            .parse()
            .unwrap();
        let fb = flamebearer(&l, &pt, json!(null), json!(null));
        assert_eq!(fb["flamebearer"]["levels"], json!(l.levels));
        assert_eq!(fb["flamebearer"]["numTicks"], 6);
        assert_eq!(fb["metadata"]["units"], "samples");
        assert_eq!(fb["metadata"]["format"], "single");
    }
}
