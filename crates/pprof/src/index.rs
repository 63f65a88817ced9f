//! Lookup from pprof ids (arbitrary `u64`s, usually 1..=n) to positions.

use std::collections::HashMap;

/// Maps the ids of a pprof table to their positions. Dense ids (the usual
/// case) use a vector, anything else a hash map.
pub(crate) enum IdIndex {
    Dense(Vec<u32>),
    Sparse(HashMap<u64, u32>),
}

/// Why an id table could not be indexed.
pub(crate) enum IndexError {
    /// The entry at this position has id 0, which pprof reserves.
    Zero(usize),
    /// Two entries share this id.
    Duplicate(u64),
}

const ABSENT: u32 = u32::MAX;

impl IdIndex {
    /// Indexes `ids` (position i has id `ids[i]`).
    pub(crate) fn new(ids: impl ExactSizeIterator<Item = u64> + Clone) -> Result<Self, IndexError> {
        let n = ids.len();
        let max = ids.clone().max().unwrap_or(0);
        if max <= (2 * n as u64).saturating_add(64) {
            let mut v = vec![ABSENT; usize::try_from(max).unwrap_or(0) + 1];
            for (i, id) in ids.enumerate() {
                if id == 0 {
                    return Err(IndexError::Zero(i));
                }
                let slot = &mut v[id as usize];
                if *slot != ABSENT {
                    return Err(IndexError::Duplicate(id));
                }
                *slot = i as u32;
            }
            Ok(IdIndex::Dense(v))
        } else {
            let mut m = HashMap::with_capacity(n);
            for (i, id) in ids.enumerate() {
                if id == 0 {
                    return Err(IndexError::Zero(i));
                }
                if m.insert(id, i as u32).is_some() {
                    return Err(IndexError::Duplicate(id));
                }
            }
            Ok(IdIndex::Sparse(m))
        }
    }

    /// The position of `id`, if present.
    #[inline]
    pub(crate) fn get(&self, id: u64) -> Option<usize> {
        match self {
            IdIndex::Dense(v) => match v.get(usize::try_from(id).ok()?) {
                Some(&p) if p != ABSENT => Some(p as usize),
                _ => None,
            },
            IdIndex::Sparse(m) => m.get(&id).map(|&p| p as usize),
        }
    }
}

/// The id indexes of a profile's tables, built once: by validation, then
/// handed to normalize.
pub(crate) struct Indexes {
    pub(crate) locations: IdIndex,
    pub(crate) functions: IdIndex,
    pub(crate) mappings: IdIndex,
}

impl Indexes {
    /// Indexes `p`'s locations, functions and mappings; an error names
    /// the table whose ids could not be indexed.
    pub(crate) fn new(
        p: &fathom_proto::pprof::Profile,
    ) -> Result<Indexes, (&'static str, IndexError)> {
        let index = |what, r: Result<IdIndex, IndexError>| r.map_err(|e| (what, e));
        Ok(Indexes {
            mappings: index("mapping", IdIndex::new(p.mapping.iter().map(|m| m.id)))?,
            functions: index("function", IdIndex::new(p.function.iter().map(|f| f.id)))?,
            locations: index("location", IdIndex::new(p.location.iter().map(|l| l.id)))?,
        })
    }
}

/// An [`IdIndex`] with a value of type `T` next to each position, so one
/// lookup (one cache miss) finds both.
pub(crate) enum IdTable<T> {
    Dense(Vec<(u32, T)>),
    Sparse(HashMap<u64, (u32, T)>),
}

impl<T: Clone> IdTable<T> {
    /// Every entry of `index`, with value `init`.
    pub(crate) fn new(index: IdIndex, init: T) -> Self {
        match index {
            IdIndex::Dense(v) => IdTable::Dense(v.into_iter().map(|p| (p, init.clone())).collect()),
            IdIndex::Sparse(m) => {
                IdTable::Sparse(m.into_iter().map(|(k, p)| (k, (p, init.clone()))).collect())
            }
        }
    }

    /// The position of `id` and its value, if `id` is present.
    #[inline]
    pub(crate) fn get_mut(&mut self, id: u64) -> Option<&mut (u32, T)> {
        match self {
            IdTable::Dense(v) => match v.get_mut(usize::try_from(id).ok()?) {
                Some(e) if e.0 != ABSENT => Some(e),
                _ => None,
            },
            IdTable::Sparse(m) => m.get_mut(&id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_and_sparse() {
        let d = IdIndex::new([3u64, 1, 2].into_iter()).ok().expect("valid");
        assert!(matches!(d, IdIndex::Dense(_)));
        assert_eq!(d.get(1), Some(1));
        assert_eq!(d.get(0), None);
        assert_eq!(d.get(99), None);
        let s = IdIndex::new([u64::MAX, 7].into_iter()).ok().expect("valid");
        assert!(matches!(s, IdIndex::Sparse(_)));
        assert_eq!(s.get(u64::MAX), Some(0));
        assert!(matches!(
            IdIndex::new([1u64, 1].into_iter()),
            Err(IndexError::Duplicate(1))
        ));
        assert!(matches!(
            IdIndex::new([0u64].into_iter()),
            Err(IndexError::Zero(0))
        ));
    }
}
