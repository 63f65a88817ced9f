//! "What changed": functions ranked by the change of their share of the
//! total between two selections A and B, each with a significance test.
//!
//! ```text
//!  window A ─► observations (one per profile, or per time bucket when the
//!  window B ─►   window holds more profiles than `samples`)
//!                 └─ per function: flat (as leaf) and cum, and the total
//!        │
//!        ▼
//!  per function: share = flat / total in each observation
//!        Mann–Whitney U of A's shares against B's (two-sided, normal
//!        approximation with tie correction) → p-value
//!        Benjamini–Hochberg over every function tested → q-value
//!        │
//!        ▼
//!  rank: significant first, then by the change of the merged share
//!        (B's flat sum / B's total − A's), largest increase first
//! ```
//!
//! The share (not the absolute value) is compared so that a window with
//! more profiles or more load does not make every function look slower.
//! The rank test makes a function whose share jumps around from profile to
//! profile rank below a smaller change that every profile agrees on; the
//! false-discovery correction keeps "nothing changed" from marking the
//! handful of functions that a thousand independent tests at 5 % would.

use std::collections::HashMap;

use arrow::array::{Array, AsArray, FixedSizeBinaryArray};
use arrow::datatypes::Int64Type;
use datafusion::functions_aggregate::expr_fn::sum;
use datafusion::prelude::*;
use fathom_block::columns;
use fathom_model::{Id, Selector, Symbols, TenantId};
use serde::Serialize;

use crate::{Querier, QueryError};

/// A q-value (Benjamini–Hochberg adjusted p-value) below this marks a
/// change significant.
pub const ALPHA: f64 = 0.05;

/// Fewer observations than this on a side: no test (p = 1).
pub const MIN_OBSERVATIONS: usize = 3;

/// At most this many (observation, stack) pairs per window are held: the
/// memory a changes request may use is bounded whatever the data.
pub const MAX_OBSERVATION_ROWS: usize = 10_000_000;

/// Function names shared by both sides, interned to small indices.
#[derive(Default)]
pub struct Functions {
    index: HashMap<String, u32>,
    names: Vec<String>,
}

impl Functions {
    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        let i = self.names.len() as u32;
        self.index.insert(name.to_owned(), i);
        self.names.push(name.to_owned());
        i
    }
}

/// One observation (a profile, or a time bucket of profiles): the total and
/// each function's flat and cumulative values.
#[derive(Default, Clone, Debug)]
pub struct Observation {
    pub total: i64,
    /// function → (flat, cum)
    values: HashMap<u32, (i64, i64)>,
}

impl Observation {
    /// Adds one stack (frames root first) with its value.
    pub fn add_stack(&mut self, fns: &mut Functions, frames: &[String], value: i64) {
        self.total += value;
        let ids: Vec<u32> = frames.iter().map(|f| fns.intern(f)).collect();
        if let Some(&leaf) = ids.last() {
            self.values.entry(leaf).or_default().0 += value;
        }
        let mut once = ids;
        once.sort_unstable();
        once.dedup();
        for f in once {
            self.values.entry(f).or_default().1 += value;
        }
    }
}

/// One function's change between A and B.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Change {
    pub name: String,
    /// Flat values summed over each window.
    pub a_flat: i64,
    pub b_flat: i64,
    pub a_cum: i64,
    pub b_cum: i64,
    /// Flat share of the window's total, 0..1.
    pub a_share: f64,
    pub b_share: f64,
    /// `b_share - a_share`.
    pub delta_share: f64,
    /// `b_cum / b_total - a_cum / a_total`.
    pub delta_cum_share: f64,
    /// Mann–Whitney U of B's per-observation shares over A's.
    pub u: f64,
    /// Two-sided p-value of the rank test.
    pub p_value: f64,
    /// Benjamini–Hochberg adjusted p-value over every function tested.
    pub q_value: f64,
    /// `q_value < ALPHA` and the share moved.
    pub significant: bool,
}

/// The order of the ranking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Largest increase of share first (what got slower).
    Slower,
    /// Largest decrease first (what got faster).
    Faster,
    /// Largest absolute change first.
    Any,
}

impl Direction {
    pub fn parse(s: &str) -> Option<Direction> {
        match s {
            "slower" => Some(Direction::Slower),
            "faster" => Some(Direction::Faster),
            "any" => Some(Direction::Any),
            _ => None,
        }
    }
}

/// Ranks every function seen in `a` or `b`.
pub fn rank(fns: &Functions, a: &[Observation], b: &[Observation], dir: Direction) -> Vec<Change> {
    let a_total: i64 = a.iter().map(|o| o.total).sum();
    let b_total: i64 = b.iter().map(|o| o.total).sum();
    // Observations with no value say nothing about shares.
    let a: Vec<&Observation> = a.iter().filter(|o| o.total > 0).collect();
    let b: Vec<&Observation> = b.iter().filter(|o| o.total > 0).collect();
    let frac = |x: i64, t: i64| if t > 0 { x as f64 / t as f64 } else { 0.0 };
    let mut out: Vec<Change> = Vec::with_capacity(fns.names.len());
    let mut xs = Vec::with_capacity(a.len());
    let mut ys = Vec::with_capacity(b.len());
    for (i, name) in fns.names.iter().enumerate() {
        let i = i as u32;
        let sums = |side: &[&Observation]| {
            side.iter().fold((0i64, 0i64), |acc, o| {
                let v = o.values.get(&i).copied().unwrap_or_default();
                (acc.0 + v.0, acc.1 + v.1)
            })
        };
        let (a_flat, a_cum) = sums(&a);
        let (b_flat, b_cum) = sums(&b);
        xs.clear();
        ys.clear();
        xs.extend(
            a.iter()
                .map(|o| frac(o.values.get(&i).map_or(0, |v| v.0), o.total)),
        );
        ys.extend(
            b.iter()
                .map(|o| frac(o.values.get(&i).map_or(0, |v| v.0), o.total)),
        );
        let (u, p_value) = mann_whitney(&ys, &xs);
        let a_share = frac(a_flat, a_total);
        let b_share = frac(b_flat, b_total);
        out.push(Change {
            name: name.clone(),
            a_flat,
            b_flat,
            a_cum,
            b_cum,
            a_share,
            b_share,
            delta_share: b_share - a_share,
            delta_cum_share: frac(b_cum, b_total) - frac(a_cum, a_total),
            u,
            p_value,
            q_value: 1.0,
            significant: false,
        });
    }
    let q = benjamini_hochberg(&out.iter().map(|c| c.p_value).collect::<Vec<_>>());
    for (c, q) in out.iter_mut().zip(q) {
        c.q_value = q;
        c.significant = q < ALPHA && c.delta_share != 0.0;
    }
    let key = |c: &Change| match dir {
        Direction::Slower => c.delta_share,
        Direction::Faster => -c.delta_share,
        Direction::Any => c.delta_share.abs(),
    };
    out.sort_by(|x, y| {
        y.significant
            .cmp(&x.significant)
            .then_with(|| key(y).total_cmp(&key(x)))
            .then_with(|| x.name.cmp(&y.name))
    });
    out
}

/// Mann–Whitney U of `ys` over `xs` (the number of pairs in which the y is
/// larger, ties counting one half) and its two-sided p-value from the
/// normal approximation with tie correction and continuity correction.
/// Sides with fewer than [`MIN_OBSERVATIONS`] values give p = 1.
pub fn mann_whitney(ys: &[f64], xs: &[f64]) -> (f64, f64) {
    let (n1, n2) = (ys.len(), xs.len());
    if n1 < MIN_OBSERVATIONS || n2 < MIN_OBSERVATIONS {
        return (f64::NAN, 1.0);
    }
    // Rank the pooled values (average ranks for ties); remember ties.
    let mut all: Vec<(f64, bool)> = ys
        .iter()
        .map(|&v| (v, true))
        .chain(xs.iter().map(|&v| (v, false)))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    let n = all.len();
    let mut rank_sum_y = 0.0;
    let mut tie_term = 0.0;
    let mut i = 0;
    while i < n {
        let mut j = i + 1;
        while j < n && all[j].0 == all[i].0 {
            j += 1;
        }
        // Ranks i+1 ..= j share their average.
        let avg = (i + 1 + j) as f64 / 2.0;
        let t = (j - i) as f64;
        tie_term += t * t * t - t;
        rank_sum_y += avg * all[i..j].iter().filter(|x| x.1).count() as f64;
        i = j;
    }
    let (n1f, n2f, nf) = (n1 as f64, n2 as f64, n as f64);
    let u = rank_sum_y - n1f * (n1f + 1.0) / 2.0;
    let mean = n1f * n2f / 2.0;
    let var = n1f * n2f / 12.0 * ((nf + 1.0) - tie_term / (nf * (nf - 1.0)));
    if var <= 0.0 {
        // Every value equal: no evidence of a difference.
        return (u, 1.0);
    }
    let z = ((u - mean).abs() - 0.5).max(0.0) / var.sqrt();
    (u, (2.0 * normal_sf(z)).min(1.0))
}

/// P(Z > z) for a standard normal Z, from the complementary error function
/// (Numerical Recipes' Chebyshev fit, relative error below 1.2e-7).
fn normal_sf(z: f64) -> f64 {
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

/// Benjamini–Hochberg adjusted p-values (q-values), in input order.
pub fn benjamini_hochberg(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
    let mut q = vec![1.0; m];
    let mut running = 1.0f64;
    for (k, &i) in order.iter().enumerate() {
        // Rank of p[i] from the smallest: m - k.
        let r = (m - k) as f64;
        running = running.min(p[i] * m as f64 / r);
        q[i] = running.min(1.0);
    }
    q
}

/// One window's observations as merged stacks, before naming.
pub struct Window {
    /// One entry per observation: (stack id, value) pairs.
    pub observations: Vec<Vec<(Id, i64)>>,
    pub symbols: Symbols,
    /// Profiles in the window.
    pub profiles: usize,
    /// Whether profiles were grouped into time buckets (more than the
    /// observation limit).
    pub bucketed: bool,
}

impl Window {
    /// The observations with stacks named (root first), for [`rank`].
    pub fn named(&self, fns: &mut Functions) -> Vec<Observation> {
        let mut frames: HashMap<Id, Vec<String>> = HashMap::new();
        self.observations
            .iter()
            .map(|obs| {
                let mut o = Observation::default();
                for (stack, v) in obs {
                    let f = frames.entry(*stack).or_insert_with(|| {
                        self.symbols
                            .frames_display_by(stack, crate::render::frame_name)
                    });
                    o.add_stack(fns, f, *v);
                }
                o
            })
            .collect()
    }
}

impl Querier {
    /// The observations of one window: one per profile, or one per time
    /// bucket (`max_observations` buckets over `[start, end]`) when the
    /// window holds more profiles than that.
    pub async fn observations(
        &self,
        tenant: &TenantId,
        sel: &Selector,
        start: i64,
        end: i64,
        max_observations: usize,
    ) -> Result<Window, QueryError> {
        if sel.profile_type.is_none() {
            return Err(QueryError::BadRequest(
                "the selectors need a profile type".into(),
            ));
        }
        let max_observations = max_observations.max(1);
        let this = self.clone();
        let tenant = tenant.clone();
        let sel = sel.clone();
        self.run(async move {
            let plan = this.plan(&tenant, &sel, start, end).await?;
            let bucketed = plan.profiles > max_observations;
            let mut index: HashMap<Vec<u8>, usize> = HashMap::new();
            let mut observations: Vec<Vec<(Id, i64)>> = Vec::new();
            if let Some((_ctx, df)) = this.frame(&plan, start, end).await? {
                let key = if bucketed {
                    let step = (end - start) / max_observations as i64 + 1;
                    ((col(columns::TIME_NANOS) - lit(start)) / lit(step)).alias("key")
                } else {
                    col(columns::PROFILE_ID).alias("key")
                };
                let batches = df
                    .aggregate(
                        vec![key, col(columns::STACK_ID)],
                        vec![sum(col(columns::VALUE)).alias("value")],
                    )?
                    .collect()
                    .await?;
                let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
                if rows > MAX_OBSERVATION_ROWS {
                    return Err(QueryError::BadRequest(format!(
                        "the window holds {rows} (observation, stack) pairs, over the limit of \
                         {MAX_OBSERVATION_ROWS}: lower samples or narrow the range"
                    )));
                }
                for b in &batches {
                    this.inner.metrics.rows.inc_by(b.num_rows() as u64);
                    let keys = b.column(0);
                    let stacks = b
                        .column(1)
                        .as_any()
                        .downcast_ref::<FixedSizeBinaryArray>()
                        .ok_or_else(|| QueryError::Task("stack_id column type".into()))?;
                    let vals = b.column(2).as_primitive::<Int64Type>();
                    for i in 0..b.num_rows() {
                        if vals.is_null(i) {
                            continue;
                        }
                        let k: Vec<u8> =
                            if let Some(a) = keys.as_any().downcast_ref::<FixedSizeBinaryArray>() {
                                a.value(i).to_vec()
                            } else {
                                keys.as_primitive::<Int64Type>()
                                    .value(i)
                                    .to_le_bytes()
                                    .to_vec()
                            };
                        let n = index.len();
                        let o = *index.entry(k).or_insert(n);
                        if o == observations.len() {
                            observations.push(Vec::new());
                        }
                        if let Some(id) = Id::from_slice(stacks.value(i)) {
                            observations[o].push((id, vals.value(i)));
                        }
                    }
                }
            }
            let mut stacks: Vec<Id> = observations.iter().flatten().map(|s| s.0).collect();
            stacks.sort_unstable();
            stacks.dedup();
            let symbols = this.resolve(&tenant, &plan, &stacks).await?;
            Ok(Window {
                observations,
                symbols,
                profiles: plan.profiles,
                bucketed,
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::io::Read;

    #[test]
    fn mann_whitney_known_values() {
        // Fully separated samples of 5 and 5: U = 25; exact two-sided p is
        // 0.0079; the normal approximation with continuity gives ~0.012.
        let (u, p) = mann_whitney(&[6.0, 7.0, 8.0, 9.0, 10.0], &[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(u, 25.0);
        assert!((p - 0.0119).abs() < 0.001, "p = {p}");
        // Identical samples: no difference.
        let (_, p) = mann_whitney(&[1.0, 1.0, 1.0], &[1.0, 1.0, 1.0]);
        assert_eq!(p, 1.0);
        // Too few observations.
        assert_eq!(mann_whitney(&[1.0, 2.0], &[3.0, 4.0, 5.0]).1, 1.0);
        // Interleaved: large p.
        let (_, p) = mann_whitney(&[1.0, 3.0, 5.0, 7.0], &[2.0, 4.0, 6.0, 8.0]);
        assert!(p > 0.5, "p = {p}");
    }

    #[test]
    fn erfc_matches_known_values() {
        assert!((normal_sf(0.0) - 0.5).abs() < 1e-7);
        assert!((normal_sf(1.959_964) - 0.025).abs() < 1e-6);
        assert!((normal_sf(-1.0) - 0.841_344_7).abs() < 1e-6);
    }

    #[test]
    fn bh_adjusts_and_keeps_order() {
        let q = benjamini_hochberg(&[0.01, 0.04, 0.03, 0.5]);
        assert!((q[0] - 0.04).abs() < 1e-12);
        // 0.03 * 4 / 2 = 0.06, capped by the next larger p's 0.0533.
        assert!((q[2] - 0.04 * 4.0 / 3.0).abs() < 1e-12);
        assert!((q[1] - 0.04 * 4.0 / 3.0).abs() < 1e-12);
        assert_eq!(q[3], 0.5);
    }

    /// The stacks of a real profile: a JVM (Kafka) CPU profile of the
    /// corpus, as `go tool pprof` folds it.
    fn real_stacks() -> Vec<(Vec<String>, i64)> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/testdata/pprof/expected/grafana+pyroscope/pkg/og/convert/jfr/testdata/",
            "cortex-dev-01__kafka-0__cpu__3.jfr.gz.process_cpu_cpu_nanoseconds_cpu_nanoseconds.17241709254077376921.pb.gz.folded.tsv.gz"
        );
        let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut s = String::new();
        flate2::read::GzDecoder::new(f)
            .read_to_string(&mut s)
            .expect("gzip'd expectation");
        let out: Vec<(Vec<String>, i64)> = s
            .lines()
            .filter_map(|l| {
                let mut it = l.split('\t');
                let (_, stack, v) = (it.next()?, it.next()?, it.next()?);
                Some((
                    stack.split(';').map(str::to_owned).collect(),
                    v.parse().ok()?,
                ))
            })
            .collect();
        assert!(out.len() > 300, "{} stacks", out.len());
        out
    }

    /// `n` observations of the real profile in which every function's
    /// (leaf) value carries ±15 % uniform noise, independently per
    /// observation, and `slow` (if any) costs `factor` times more.
    fn noisy(
        rng: &mut StdRng,
        fns: &mut Functions,
        stacks: &[(Vec<String>, i64)],
        n: usize,
        slow: Option<(&str, f64)>,
    ) -> Vec<Observation> {
        (0..n)
            .map(|_| {
                let mut noise: HashMap<&str, f64> = HashMap::new();
                let mut o = Observation::default();
                for (frames, v) in stacks {
                    let leaf = frames.last().expect("non-empty stack").as_str();
                    let k = *noise
                        .entry(leaf)
                        .or_insert_with(|| rng.random_range(0.85..1.15));
                    let extra = match slow {
                        Some((f, factor)) if f == leaf => factor,
                        _ => 1.0,
                    };
                    o.add_stack(fns, frames, (*v as f64 * k * extra).round() as i64);
                }
                o
            })
            .collect()
    }

    /// A function of the real profile with a mid-sized flat share: not the
    /// top one, so that ranking first is not a given.
    fn chosen(stacks: &[(Vec<String>, i64)]) -> String {
        let mut flat: HashMap<&str, i64> = HashMap::new();
        for (f, v) in stacks {
            *flat.entry(f.last().unwrap()).or_default() += v;
        }
        let mut v: Vec<(&str, i64)> = flat.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v[4].0.to_owned()
    }

    #[test]
    fn injected_regression_ranks_first_and_is_significant() {
        let stacks = real_stacks();
        let target = chosen(&stacks);
        for seed in 0..5 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut fns = Functions::default();
            let a = noisy(&mut rng, &mut fns, &stacks, 30, None);
            let b = noisy(&mut rng, &mut fns, &stacks, 30, Some((&target, 1.2)));
            let r = rank(&fns, &a, &b, Direction::Slower);
            assert!(r.len() > 300);
            assert_eq!(r[0].name, target, "seed {seed}: {:?}", &r[..3]);
            assert!(r[0].significant, "seed {seed}: {:?}", r[0]);
            assert!(r[0].delta_share > 0.0);
            // Also first when ranked by absolute change.
            let r = rank(&fns, &a, &b, Direction::Any);
            assert_eq!(r[0].name, target, "seed {seed}");
        }
    }

    #[test]
    fn no_change_marks_nothing_significant() {
        let stacks = real_stacks();
        for seed in 0..5 {
            let mut rng = StdRng::seed_from_u64(100 + seed);
            let mut fns = Functions::default();
            let a = noisy(&mut rng, &mut fns, &stacks, 30, None);
            let b = noisy(&mut rng, &mut fns, &stacks, 30, None);
            let r = rank(&fns, &a, &b, Direction::Slower);
            let sig: Vec<&Change> = r.iter().filter(|c| c.significant).collect();
            assert!(
                sig.is_empty(),
                "seed {seed}: {:?}",
                &sig[..sig.len().min(3)]
            );
            // Some raw p-values are small by chance: the correction matters.
            assert!(r.iter().any(|c| c.p_value < 0.05), "seed {seed}");
        }
    }

    #[test]
    fn noisy_function_ranks_below_a_steady_change() {
        // f: a steady +10 % of a 10 % share. g: a bigger move of its merged
        // share, from profiles that disagree wildly.
        let mut rng = StdRng::seed_from_u64(7);
        let mut fns = Functions::default();
        let s = |x: &str| vec!["main".to_owned(), x.to_owned()];
        let mut side = |f: i64, g_noisy: bool| -> Vec<Observation> {
            (0..20)
                .map(|_| {
                    let mut o = Observation::default();
                    o.add_stack(&mut fns, &s("f"), f);
                    let g = if g_noisy {
                        rng.random_range(0..1500)
                    } else {
                        500 + rng.random_range(0..100)
                    };
                    o.add_stack(&mut fns, &s("g"), g);
                    o.add_stack(&mut fns, &s("rest"), 8000);
                    o
                })
                .collect()
        };
        let a = side(1000, false);
        let b = side(1100, true);
        let r = rank(&fns, &a, &b, Direction::Slower);
        assert_eq!(r[0].name, "f", "{r:?}");
        assert!(r[0].significant, "{r:?}");
        let g = r.iter().find(|c| c.name == "g").unwrap();
        assert!(g.delta_share > r[0].delta_share, "{g:?}");
        assert!(!g.significant, "{g:?}");
    }
}
