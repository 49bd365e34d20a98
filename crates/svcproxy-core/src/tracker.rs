//! Change tracking: one previous/current pair per key.
//!
//! A [`Tracker`] holds the current value of every key and, for keys touched since the
//! last [`Tracker::take_changes`], the value they had then. A key whose value comes
//! back to where it started is no change at all (an add then delete, or an update
//! that is undone, vanishes), so a burst of events costs one sync of what really moved.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

/// One key's change since the last [`Tracker::take_changes`].
#[derive(Debug, PartialEq, Eq)]
pub struct Change<K, V> {
    pub key: K,
    pub previous: Option<Arc<V>>,
    pub current: Option<Arc<V>>,
}

#[derive(Debug)]
pub struct Tracker<K, V> {
    current: HashMap<K, Arc<V>>,
    /// For each key changed since the last take: its value at that take.
    baseline: HashMap<K, Option<Arc<V>>>,
}

impl<K, V> Default for Tracker<K, V> {
    fn default() -> Self {
        Tracker {
            current: HashMap::new(),
            baseline: HashMap::new(),
        }
    }
}

impl<K: Clone + Eq + Hash, V: PartialEq> Tracker<K, V> {
    /// Sets (`Some`) or removes (`None`) a key's value. Returns whether the key now
    /// differs from its value at the last take.
    pub fn set(&mut self, key: K, value: Option<Arc<V>>) -> bool {
        let old = match &value {
            Some(v) => self.current.insert(key.clone(), v.clone()),
            None => self.current.remove(&key),
        };
        let baseline = self.baseline.entry(key.clone()).or_insert(old);
        if opt_eq(baseline, &value) {
            self.baseline.remove(&key);
            false
        } else {
            true
        }
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&Arc<V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.current.get(key)
    }

    /// The stored key equal to `key` (to share its allocations), with its value.
    pub fn get_key_value<Q>(&self, key: &Q) -> Option<(&K, &Arc<V>)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.current.get_key_value(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &Arc<V>)> {
        self.current.iter()
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.current.keys()
    }

    pub fn len(&self) -> usize {
        self.current.len()
    }

    pub fn is_empty(&self) -> bool {
        self.current.is_empty()
    }

    /// Keys changed since the last take (pending changes).
    pub fn pending(&self) -> usize {
        self.baseline.len()
    }

    /// Returns the changes since the last take and starts a new period. The
    /// period's map goes with them: after the initial lists (every key changed) a
    /// drained map would keep room for the whole cluster.
    pub fn take_changes(&mut self) -> Vec<Change<K, V>> {
        std::mem::take(&mut self.baseline)
            .into_iter()
            .map(|(key, previous)| Change {
                current: self.current.get(&key).cloned(),
                key,
                previous,
            })
            .collect()
    }
}

fn opt_eq<V: PartialEq>(a: &Option<Arc<V>>, b: &Option<Arc<V>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || **a == **b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Option<Arc<String>> {
        Some(Arc::new(s.to_string()))
    }

    #[test]
    fn add_then_delete_is_no_change() {
        let mut t: Tracker<&str, String> = Tracker::default();
        assert!(t.set("a", v("1")));
        assert!(!t.set("a", None));
        assert!(t.take_changes().is_empty());
        assert!(t.is_empty());
    }

    #[test]
    fn update_that_returns_to_the_start_is_no_change() {
        let mut t: Tracker<&str, String> = Tracker::default();
        t.set("a", v("1"));
        t.take_changes();
        assert!(t.set("a", v("2")));
        assert!(!t.set("a", v("1")));
        assert!(t.take_changes().is_empty());
        assert_eq!(t.get(&"a").map(|s| s.as_str()), Some("1"));
    }

    #[test]
    fn a_change_reports_its_previous_and_current_value() {
        let mut t: Tracker<&str, String> = Tracker::default();
        t.set("a", v("1"));
        t.take_changes();
        t.set("a", v("2"));
        t.set("a", v("3"));
        let changes = t.take_changes();
        assert_eq!(
            changes,
            vec![Change {
                key: "a",
                previous: v("1"),
                current: v("3")
            }]
        );
        assert_eq!(t.pending(), 0);
    }

    #[test]
    fn identical_value_is_no_change() {
        let mut t: Tracker<&str, String> = Tracker::default();
        t.set("a", v("1"));
        t.take_changes();
        assert!(!t.set("a", v("1")));
        assert_eq!(t.pending(), 0);
    }

    #[test]
    fn delete_reports_the_removed_value() {
        let mut t: Tracker<&str, String> = Tracker::default();
        t.set("a", v("1"));
        t.take_changes();
        t.set("a", None);
        let changes = t.take_changes();
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].previous, v("1"));
        assert_eq!(changes[0].current, None);
    }
}
