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

/// A value of type `T` for each id of an [`IdIndex`], found with one
/// lookup: a dense index's table is a vector indexed by the id itself (its
/// ids not yet given a value, and the ids it does not have, hold the
/// `empty` value it was made with), a sparse one's a hash map of the ids
/// given a value. The positions stay in the index, so that the table's
/// entries are no larger than their values (a sample's frames read one
/// entry each, at random).
pub(crate) enum IdTable<T> {
    Dense(Vec<T>),
    Sparse(HashMap<u64, T>),
}

impl<T: Copy> IdTable<T> {
    /// A table for the ids of `index`, every one holding `empty`.
    pub(crate) fn new(index: &IdIndex, empty: T) -> Self {
        match index {
            IdIndex::Dense(v) => IdTable::Dense(vec![empty; v.len()]),
            IdIndex::Sparse(m) => IdTable::Sparse(HashMap::with_capacity(m.len())),
        }
    }

    /// The value of `id`: `None` for an id that a sparse table was not
    /// given a value for, or that is past a dense table's end.
    #[inline]
    pub(crate) fn get(&self, id: u64) -> Option<&T> {
        match self {
            IdTable::Dense(v) => v.get(usize::try_from(id).ok()?),
            IdTable::Sparse(m) => m.get(&id),
        }
    }

    /// Gives `id`, one of the index's ids, the value `value`.
    pub(crate) fn set(&mut self, id: u64, value: T) {
        match self {
            IdTable::Dense(v) => {
                if let Some(e) = usize::try_from(id).ok().and_then(|i| v.get_mut(i)) {
                    *e = value;
                }
            }
            IdTable::Sparse(m) => {
                m.insert(id, value);
            }
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

    #[test]
    fn tables_hold_what_they_are_given() {
        for ids in [vec![3u64, 1, 2], vec![u64::MAX, 7, 1 << 40]] {
            let index = IdIndex::new(ids.iter().copied()).ok().expect("valid");
            let mut t = IdTable::new(&index, 0u32);
            t.set(ids[1], 5);
            assert_eq!(t.get(ids[1]), Some(&5));
            // Not given a value: empty in a dense table, absent from a
            // sparse one; never another id's value.
            let unset = match index {
                IdIndex::Dense(_) => Some(&0),
                IdIndex::Sparse(_) => None,
            };
            assert_eq!(t.get(ids[0]), unset);
            assert_eq!(t.get(ids[2]), unset);
            assert_eq!(t.get(u64::MAX - 1), None);
            t.set(ids[0], 9);
            assert_eq!((t.get(ids[0]), t.get(ids[1])), (Some(&9), Some(&5)));
        }
    }
}
