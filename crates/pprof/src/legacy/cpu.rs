//! gperftools binary CPU profiles (C++ and Java), transcribed from Go's
//! `parseCPU`, `cpuProfile` and `parseCPUSamples`.
//!
//! The file is a sequence of machine words, 32 or 64 bits wide, in the
//! endianness of the profiled machine; the header (`0, 3, 0|1, period_us,
//! 0`) is tried in each of the four layouts, like Go does.

use std::collections::HashMap;

use super::{LProfile, LSample, LegacyError, Scanner, java};
use crate::Limits;

/// Reads one word; `None` when too few bytes are left (Go returns `nil`).
type Word = fn(&[u8]) -> Option<(u64, &[u8])>;

fn get32l(b: &[u8]) -> Option<(u64, &[u8])> {
    let (w, rest) = b.split_first_chunk::<4>()?;
    Some((u64::from(u32::from_le_bytes(*w)), rest))
}

fn get32b(b: &[u8]) -> Option<(u64, &[u8])> {
    let (w, rest) = b.split_first_chunk::<4>()?;
    Some((u64::from(u32::from_be_bytes(*w)), rest))
}

fn get64l(b: &[u8]) -> Option<(u64, &[u8])> {
    let (w, rest) = b.split_first_chunk::<8>()?;
    Some((u64::from_le_bytes(*w), rest))
}

fn get64b(b: &[u8]) -> Option<(u64, &[u8])> {
    let (w, rest) = b.split_first_chunk::<8>()?;
    Some((u64::from_be_bytes(*w), rest))
}

/// Go's `parse(b)` on a possibly-nil slice: a missing word reads as 0 and
/// leaves the slice nil.
fn word(parse: Word, b: &mut Option<&[u8]>) -> u64 {
    match b.and_then(parse) {
        Some((v, rest)) => {
            *b = Some(rest);
            v
        }
        None => {
            *b = None;
            0
        }
    }
}

/// Go's `parseCPU`.
pub(super) fn parse_cpu(b: &[u8], limits: &Limits) -> Result<LProfile, LegacyError> {
    for parse in [get32l as Word, get32b, get64l, get64b] {
        let mut tmp = Some(b);
        let n: [u64; 5] = std::array::from_fn(|_| word(parse, &mut tmp));
        let Some(rest) = tmp else { continue };
        if n[0] == 0 && n[1] == 3 && n[3] > 0 && n[4] == 0 {
            if n[2] == 0 {
                return cpu_profile(rest, n[3] as i64, parse, limits);
            }
            if n[2] == 1 {
                return java_cpu_profile(rest, n[3] as i64, parse, limits);
            }
        }
    }
    Err(LegacyError::Unrecognized)
}

fn new_cpu_profile(period_us: i64, limits: &Limits) -> LProfile {
    let mut p = LProfile::new(limits);
    p.period = period_us.wrapping_mul(1000);
    p.set_types(
        &[("samples", "count"), ("cpu", "nanoseconds")],
        ("cpu", "nanoseconds"),
    );
    p
}

/// Go's `cpuProfile`.
fn cpu_profile(
    b: &[u8],
    period_us: i64,
    parse: Word,
    limits: &Limits,
) -> Result<LProfile, LegacyError> {
    let mut p = new_cpu_profile(period_us, limits);
    let (rest, _) = parse_cpu_samples(b, parse, true, &mut p)?;

    // If most samples share the second frame, it is an artifact of the
    // signal handler: strip it (up to twice), allowing one different
    // sample per 32.
    let margin = p.samples.len() / 32;
    for _ in 0..2 {
        let mut counts: HashMap<u64, usize> = HashMap::new();
        for s in &p.samples {
            if s.locations.len() > 1 {
                *counts
                    .entry(p.loc_arena[s.locations[1]].address)
                    .or_default() += 1;
            }
        }
        // At most one address can reach the threshold, so the (random, in
        // Go) iteration order does not matter.
        let found = counts
            .iter()
            .find(|&(_, &c)| c >= p.samples.len().saturating_sub(margin))
            .map(|(&a, _)| a);
        if let Some(addr) = found {
            for i in 0..p.samples.len() {
                let s = &p.samples[i];
                if s.locations.len() > 1 && p.loc_arena[s.locations[1]].address == addr {
                    p.samples[i].locations.remove(1);
                }
            }
        }
    }
    p.parse_memory_map(&mut Scanner::new(rest.unwrap_or(&[])))?;
    p.cleanup_duplicate_locations();
    Ok(p)
}

/// Go's `javaCPUProfile`: samples, then a text section naming locations.
fn java_cpu_profile(
    b: &[u8],
    period_us: i64,
    parse: Word,
    limits: &Limits,
) -> Result<LProfile, LegacyError> {
    let mut p = new_cpu_profile(period_us, limits);
    let (rest, locs) = parse_cpu_samples(b, parse, false, &mut p)?;
    java::parse_java_locations(rest.unwrap_or(&[]), &locs, &mut p)?;
    java::strip_addresses(&mut p);
    Ok(p)
}

/// What `parse_cpu_samples` leaves: the bytes after the end-of-data marker
/// (`None` if the words ran out) and the locations by address.
type Samples<'b> = (Option<&'b [u8]>, HashMap<u64, usize>);

/// Go's `parseCPUSamples`.
fn parse_cpu_samples<'b>(
    b: &'b [u8],
    parse: Word,
    adjust: bool,
    p: &mut LProfile,
) -> Result<Samples<'b>, LegacyError> {
    let mut locs = HashMap::new();
    let mut b = Some(b);
    while b.is_some_and(|x| !x.is_empty()) {
        let count = word(parse, &mut b);
        let nstk = word(parse, &mut b);
        let Some(cur) = b else {
            return Err(LegacyError::Unrecognized);
        };
        if nstk > (cur.len() / 4) as u64 {
            return Err(LegacyError::Unrecognized);
        }
        let addrs: Vec<u64> = (0..nstk).map(|_| word(parse, &mut b)).collect();
        if count == 0 && nstk == 1 && addrs[0] == 0 {
            // End-of-data marker.
            break;
        }
        let mut sloc = Vec::with_capacity(addrs.len());
        for (i, &a) in addrs.iter().enumerate() {
            let a = if adjust && i > 0 {
                a.wrapping_sub(1)
            } else {
                a
            };
            sloc.push(p.location_for(&mut locs, a)?);
        }
        let count = count as i64;
        p.push_sample(LSample {
            locations: sloc,
            values: vec![count, count.wrapping_mul(p.period)],
            ..Default::default()
        })?;
    }
    Ok((b, locs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words64(w: &[u64]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn words32be(w: &[u32]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_be_bytes()).collect()
    }

    #[test]
    fn parses_64_bit_little_endian() {
        let mut data = words64(&[0, 3, 0, 10000, 0, 5, 2, 0x1000, 0x2001, 0, 1, 0]);
        data.extend_from_slice(b"00000000-00010000 r-xp 00000000 00:00 0 /bin/x\n");
        let p = parse_cpu(&data, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.period, 10_000_000);
        assert_eq!(p.samples.len(), 1);
        assert_eq!(p.samples[0].values, vec![5, 50_000_000]);
    }

    #[test]
    fn parses_32_bit_big_endian() {
        let data = words32be(&[0, 3, 0, 100, 0, 1, 1, 0x42, 0, 1, 0]);
        let p = parse_cpu(&data, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.samples.len(), 1);
    }

    #[test]
    fn truncated_stack_is_unrecognized() {
        let data = words64(&[0, 3, 0, 100, 0, 1, 1000]);
        assert!(matches!(
            parse_cpu(&data, &Limits::default()),
            Err(LegacyError::Unrecognized)
        ));
    }
}
