//! An ordered map whose clones share their storage: sorted runs of entries
//! ("chunks") behind `Arc`s, a chunk copied only when a clone that shares it
//! writes to it.
//!
//! The snapshot keeps every service port's view in one of these: each sync starts
//! from the previous snapshot's map, which the data plane still holds, and changes a
//! handful of ports. A `BTreeMap` clone copied every node and touched every entry's
//! reference count (a quarter of a partial sync at 30k services); here a clone
//! copies one pointer per chunk, and a write copies the one chunk it lands in.
//! (The persistent maps on crates.io are MPL-licensed.)

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

/// Entries per chunk when built from a sorted sequence; a chunk splits in two
/// halves past twice this, and one under a quarter of it merges into its
/// neighbour when that fits.
const CHUNK: usize = 128;

/// An ordered map from `K` to `V` (see the module's documentation). Lookups are a
/// binary search over chunks, then within one.
pub struct ChunkedMap<K, V> {
    /// Non-empty, sorted, each chunk's keys above the previous chunk's.
    chunks: Vec<Arc<Vec<(K, V)>>>,
    len: usize,
}

impl<K, V> ChunkedMap<K, V> {
    pub const fn new() -> Self {
        ChunkedMap {
            chunks: Vec::new(),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// In key order.
    pub fn iter(&self) -> Iter<'_, K, V> {
        Iter {
            chunks: self.chunks.iter(),
            current: [].iter(),
            back: [].iter(),
            left: self.len,
        }
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + ExactSizeIterator + '_ {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator + '_ {
        self.iter().map(|(_, v)| v)
    }
}

impl<K: Ord, V> ChunkedMap<K, V> {
    /// The chunk that holds `key` if any chunk does, else the one it would go in.
    fn chunk_for<Q>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.chunks
            .partition_point(|c| c[0].0.borrow() <= key)
            .saturating_sub(1)
    }

    /// Where `key` is: its chunk, and its index there or where it would go.
    fn find<Q>(&self, key: &Q) -> Option<(usize, Result<usize, usize>)>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        if self.chunks.is_empty() {
            return None;
        }
        let i = self.chunk_for(key);
        Some((
            i,
            self.chunks[i].binary_search_by(|(k, _)| k.borrow().cmp(key)),
        ))
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match self.find(key)? {
            (i, Ok(j)) => Some(&self.chunks[i][j].1),
            _ => None,
        }
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.get(key).is_some()
    }

    /// The entries from `start` (included) on, in key order. Not counted ahead:
    /// counting the entries before `start` visits every chunk before it, and a
    /// snapshot built from nothing asks once per service, at the end of the map
    /// it is filling (quadratic in the services).
    pub fn range_from<Q>(&self, start: &Q) -> impl Iterator<Item = (&K, &V)> + '_
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let (i, j) = match self.find(start) {
            Some((i, Ok(j) | Err(j))) => (i, j),
            None => (0, 0),
        };
        let first = self.chunks.get(i).map_or(&[][..], |c| &c[j..]);
        let rest = self.chunks.get(i + 1..).unwrap_or_default();
        first
            .iter()
            .chain(rest.iter().flat_map(|c| c.iter()))
            .map(|(k, v)| (k, v))
    }
}

impl<K: Ord + Clone, V: Clone> ChunkedMap<K, V> {
    /// Inserts or replaces; returns the value replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let Some((i, at)) = self.find(&key) else {
            self.chunks.push(Arc::new(vec![(key, value)]));
            self.len = 1;
            return None;
        };
        let chunk = Arc::make_mut(&mut self.chunks[i]);
        match at {
            Ok(j) => Some(std::mem::replace(&mut chunk[j].1, value)),
            Err(j) => {
                chunk.insert(j, (key, value));
                self.len += 1;
                if chunk.len() > 2 * CHUNK {
                    let tail = chunk.split_off(chunk.len() / 2);
                    self.chunks.insert(i + 1, Arc::new(tail));
                }
                None
            }
        }
    }

    /// Removes `key`; returns its value. A chunk is copied only when it holds the
    /// key.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let (i, Ok(j)) = self.find(key)? else {
            return None;
        };
        let chunk = Arc::make_mut(&mut self.chunks[i]);
        let (_, value) = chunk.remove(j);
        self.len -= 1;
        let small = chunk.len();
        if small == 0 {
            self.chunks.remove(i);
        } else if small < CHUNK / 4 {
            // Merge into a neighbour when the two fit in one chunk.
            let with = if i + 1 < self.chunks.len() {
                Some(i + 1)
            } else {
                i.checked_sub(1)
            };
            if let Some(n) = with {
                let (a, b) = (i.min(n), i.max(n));
                if self.chunks[a].len() + self.chunks[b].len() <= 2 * CHUNK {
                    let later = self.chunks.remove(b);
                    let earlier = Arc::make_mut(&mut self.chunks[a]);
                    earlier.extend(Arc::unwrap_or_clone(later));
                }
            }
        }
        Some(value)
    }
}

impl<K: Ord, V> ChunkedMap<K, V> {
    /// The entries that differ from `before` to `self`, in key order: `(key,
    /// before's value, self's value)`, with `None` where a side lacks the key.
    /// Chunks the two share are skipped whole (entries in them are not compared),
    /// so the cost follows what changed since `self` was cloned from `before`; an
    /// entry in a copied chunk is reported when `changed(old, new)` says so.
    pub fn diff<'a>(
        &'a self,
        before: &'a Self,
        changed: impl Fn(&V, &V) -> bool,
    ) -> Vec<(&'a K, Option<&'a V>, Option<&'a V>)> {
        let mut out = Vec::new();
        // Cursors: (chunk, index in it).
        let (mut a, mut b) = ((0usize, 0usize), (0usize, 0usize));
        let (old, new) = (&before.chunks, &self.chunks);
        loop {
            // Both at the start of the same chunk: nothing in it differs.
            while a.1 == 0
                && b.1 == 0
                && a.0 < old.len()
                && b.0 < new.len()
                && Arc::ptr_eq(&old[a.0], &new[b.0])
            {
                a.0 += 1;
                b.0 += 1;
            }
            let x = old.get(a.0).map(|c| &c[a.1]);
            let y = new.get(b.0).map(|c| &c[b.1]);
            let step = |at: &mut (usize, usize), chunks: &Vec<Arc<Vec<(K, V)>>>| {
                at.1 += 1;
                if at.1 == chunks[at.0].len() {
                    *at = (at.0 + 1, 0);
                }
            };
            match (x, y) {
                (None, None) => break,
                (Some((k, v)), None) => {
                    out.push((k, Some(v), None));
                    step(&mut a, old);
                }
                (None, Some((k, v))) => {
                    out.push((k, None, Some(v)));
                    step(&mut b, new);
                }
                (Some((ka, va)), Some((kb, vb))) => match ka.cmp(kb) {
                    Ordering::Less => {
                        out.push((ka, Some(va), None));
                        step(&mut a, old);
                    }
                    Ordering::Greater => {
                        out.push((kb, None, Some(vb)));
                        step(&mut b, new);
                    }
                    Ordering::Equal => {
                        if changed(va, vb) {
                            out.push((kb, Some(va), Some(vb)));
                        }
                        step(&mut a, old);
                        step(&mut b, new);
                    }
                },
            }
        }
        out
    }
}

impl<K, V> Default for ChunkedMap<K, V> {
    fn default() -> Self {
        ChunkedMap::new()
    }
}

impl<K, V> Clone for ChunkedMap<K, V> {
    /// One reference count per chunk; the entries are shared.
    fn clone(&self) -> Self {
        ChunkedMap {
            chunks: self.chunks.clone(),
            len: self.len,
        }
    }
}

impl<K: PartialEq, V: PartialEq> PartialEq for ChunkedMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl<K: Eq, V: Eq> Eq for ChunkedMap<K, V> {}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for ChunkedMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for ChunkedMap<K, V> {
    /// As a `BTreeMap` collects: of two equal keys, the later entry stays.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut entries: Vec<(K, V)> = iter.into_iter().collect();
        // Stable: equal keys keep their order, and the last of each run is kept.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut deduped: Vec<(K, V)> = Vec::with_capacity(entries.len());
        for entry in entries {
            match deduped.last_mut() {
                Some(last) if last.0.cmp(&entry.0) == Ordering::Equal => *last = entry,
                _ => deduped.push(entry),
            }
        }
        let len = deduped.len();
        let mut chunks = Vec::with_capacity(len.div_ceil(CHUNK));
        let mut rest = deduped.into_iter();
        loop {
            let chunk: Vec<(K, V)> = rest.by_ref().take(CHUNK).collect();
            if chunk.is_empty() {
                break;
            }
            chunks.push(Arc::new(chunk));
        }
        ChunkedMap { chunks, len }
    }
}

impl<K: Ord, V> From<std::collections::BTreeMap<K, V>> for ChunkedMap<K, V> {
    fn from(map: std::collections::BTreeMap<K, V>) -> Self {
        map.into_iter().collect()
    }
}

impl<'a, K, V> IntoIterator for &'a ChunkedMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Iter<'a, K, V>;
    fn into_iter(self) -> Iter<'a, K, V> {
        self.iter()
    }
}

/// The entries of a [`ChunkedMap`] in key order.
pub struct Iter<'a, K, V> {
    chunks: std::slice::Iter<'a, Arc<Vec<(K, V)>>>,
    current: std::slice::Iter<'a, (K, V)>,
    /// The chunk being walked from the back.
    back: std::slice::Iter<'a, (K, V)>,
    left: usize,
}

impl<K, V> Clone for Iter<'_, K, V> {
    fn clone(&self) -> Self {
        Iter {
            chunks: self.chunks.clone(),
            current: self.current.clone(),
            back: self.back.clone(),
            left: self.left,
        }
    }
}

impl<'a, K, V> Iterator for Iter<'a, K, V> {
    type Item = (&'a K, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((k, v)) = self.current.next() {
                self.left -= 1;
                return Some((k, v));
            }
            match self.chunks.next() {
                Some(chunk) => self.current = chunk.iter(),
                None => {
                    let (k, v) = self.back.next()?;
                    self.left -= 1;
                    return Some((k, v));
                }
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<K, V> DoubleEndedIterator for Iter<'_, K, V> {
    fn next_back(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((k, v)) = self.back.next_back() {
                self.left -= 1;
                return Some((k, v));
            }
            match self.chunks.next_back() {
                Some(chunk) => self.back = chunk.iter(),
                None => {
                    let (k, v) = self.current.next_back()?;
                    self.left -= 1;
                    return Some((k, v));
                }
            }
        }
    }
}

impl<K, V> ExactSizeIterator for Iter<'_, K, V> {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A small xorshift: the operations below are the same at every run.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    fn same(m: &ChunkedMap<u32, u32>, b: &BTreeMap<u32, u32>) {
        assert_eq!(m.len(), b.len());
        assert!(m
            .iter()
            .map(|(k, v)| (*k, *v))
            .eq(b.iter().map(|(k, v)| (*k, *v))));
        assert!(m
            .iter()
            .rev()
            .map(|(k, v)| (*k, *v))
            .eq(b.iter().rev().map(|(k, v)| (*k, *v))));
        for c in &m.chunks {
            assert!(!c.is_empty() && c.len() <= 2 * CHUNK);
        }
    }

    #[test]
    fn behaves_as_a_btreemap_under_random_inserts_and_removes_with_clones_untouched() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let mut m: ChunkedMap<u32, u32> = ChunkedMap::new();
        let mut b: BTreeMap<u32, u32> = BTreeMap::new();
        let mut kept: Vec<(ChunkedMap<u32, u32>, BTreeMap<u32, u32>)> = Vec::new();
        for round in 0..20_000 {
            let k = rng.below(3000) as u32;
            if rng.below(3) == 0 {
                assert_eq!(m.remove(&k), b.remove(&k));
            } else {
                assert_eq!(m.insert(k, round), b.insert(k, round));
            }
            assert_eq!(m.get(&k), b.get(&k));
            if round % 1000 == 0 {
                same(&m, &b);
                kept.push((m.clone(), b.clone()));
            }
            if round % 97 == 0 {
                let start = rng.below(3100) as u32;
                assert!(m
                    .range_from(&start)
                    .map(|(k, v)| (*k, *v))
                    .eq(b.range(start..).map(|(k, v)| (*k, *v))));
            }
        }
        same(&m, &b);
        // What the clones saw stays as it was.
        for (m, b) in &kept {
            same(m, b);
        }
    }

    #[test]
    fn a_diff_names_exactly_what_changed_since_the_clone() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut m: ChunkedMap<u32, u32> = (0..5000u32).map(|k| (k * 2, k)).collect();
        for _ in 0..200 {
            let before = m.clone();
            let reference: BTreeMap<u32, u32> = before.iter().map(|(k, v)| (*k, *v)).collect();
            for _ in 0..rng.below(40) {
                let k = rng.below(11_000) as u32;
                match rng.below(3) {
                    0 => {
                        m.remove(&k);
                    }
                    // Sometimes rewrites a value with itself: not a change.
                    1 => {
                        let v = m.get(&k).copied().unwrap_or(7);
                        m.insert(k, v);
                    }
                    _ => {
                        m.insert(k, rng.below(100) as u32);
                    }
                }
            }
            let now: BTreeMap<u32, u32> = m.iter().map(|(k, v)| (*k, *v)).collect();
            let mut want = Vec::new();
            for k in reference
                .keys()
                .chain(now.keys())
                .collect::<std::collections::BTreeSet<_>>()
            {
                let (x, y) = (reference.get(k), now.get(k));
                if x != y {
                    want.push((*k, x.copied(), y.copied()));
                }
            }
            let got: Vec<(u32, Option<u32>, Option<u32>)> = m
                .diff(&before, |a, b| a != b)
                .into_iter()
                .map(|(k, x, y)| (*k, x.copied(), y.copied()))
                .collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn collects_as_a_btreemap_and_clones_share_their_chunks() {
        let pairs = (0..1000u32).rev().map(|k| (k % 700, k));
        let m: ChunkedMap<u32, u32> = pairs.clone().collect();
        let b: BTreeMap<u32, u32> = pairs.collect();
        same(&m, &b);
        let mut c = m.clone();
        assert!(m
            .chunks
            .iter()
            .zip(&c.chunks)
            .all(|(a, b)| Arc::ptr_eq(a, b)));
        c.insert(5, 0);
        let shared = m
            .chunks
            .iter()
            .zip(&c.chunks)
            .filter(|(a, b)| Arc::ptr_eq(a, b))
            .count();
        assert_eq!(
            shared,
            m.chunks.len() - 1,
            "only the written chunk is copied"
        );
        // A remove of an absent key copies nothing.
        let mut d = m.clone();
        assert_eq!(d.remove(&5000), None);
        assert!(m
            .chunks
            .iter()
            .zip(&d.chunks)
            .all(|(a, b)| Arc::ptr_eq(a, b)));
    }
}
