//! The object store: an etcd-like global resourceVersion, the current objects of
//! every served kind, the change history (for watches and consistent paginated
//! lists) and the registry of open watches.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::selector::Filter;
use crate::util;

/// A served resource.
#[derive(Debug)]
pub(crate) struct KindInfo {
    pub(crate) kind: &'static str,
    pub(crate) list_kind: &'static str,
    pub(crate) group: &'static str,
    pub(crate) version: &'static str,
    pub(crate) api_version: &'static str,
    pub(crate) plural: &'static str,
    pub(crate) namespaced: bool,
}

pub(crate) const KINDS: [KindInfo; 5] = [
    KindInfo {
        kind: "Service",
        list_kind: "ServiceList",
        group: "",
        version: "v1",
        api_version: "v1",
        plural: "services",
        namespaced: true,
    },
    KindInfo {
        kind: "EndpointSlice",
        list_kind: "EndpointSliceList",
        group: "discovery.k8s.io",
        version: "v1",
        api_version: "discovery.k8s.io/v1",
        plural: "endpointslices",
        namespaced: true,
    },
    KindInfo {
        kind: "Node",
        list_kind: "NodeList",
        group: "",
        version: "v1",
        api_version: "v1",
        plural: "nodes",
        namespaced: false,
    },
    KindInfo {
        kind: "ServiceCIDR",
        list_kind: "ServiceCIDRList",
        group: "networking.k8s.io",
        version: "v1",
        api_version: "networking.k8s.io/v1",
        plural: "servicecidrs",
        namespaced: false,
    },
    KindInfo {
        kind: "Pod",
        list_kind: "PodList",
        group: "",
        version: "v1",
        api_version: "v1",
        plural: "pods",
        namespaced: true,
    },
];

pub(crate) fn kind_index(kind: &str) -> Option<usize> {
    KINDS.iter().position(|k| k.kind == kind)
}

pub(crate) fn kind_index_or_panic(kind: &str) -> usize {
    kind_index(kind).unwrap_or_else(|| {
        panic!(
            "svcproxy-fakeapi: unknown kind {kind:?} (served: {:?})",
            KINDS.iter().map(|k| k.kind).collect::<Vec<_>>()
        )
    })
}

/// (namespace, name); the namespace is empty for cluster-scoped objects.
pub(crate) type Key = (String, String);

/// One write: the object before (None: created) and after (None: deleted).
#[derive(Debug)]
pub(crate) struct Change {
    pub(crate) rv: u64,
    pub(crate) kind: usize,
    pub(crate) key: Key,
    pub(crate) old: Option<Arc<Value>>,
    pub(crate) new: Option<Arc<Value>>,
}

/// What a watch stream receives, in write order.
#[derive(Debug)]
pub(crate) enum Msg {
    Change(Arc<Change>),
    Bookmark(u64),
}

struct WatchSlot {
    kind: usize,
    bookmarks: bool,
    tx: mpsc::UnboundedSender<Msg>,
}

/// Where a new watch starts.
pub(crate) enum WatchStart {
    /// Synthetic ADDED events for these (current) objects first.
    Initial(Vec<Arc<Value>>),
    /// Replay of the changes after the requested resourceVersion.
    Replay(Vec<Arc<Change>>),
}

/// Why a read at a resourceVersion failed.
#[derive(Debug, PartialEq)]
pub(crate) enum RvError {
    /// Older than the compaction point.
    Expired { compacted: u64 },
    /// Newer than the newest write.
    TooLarge { current: u64 },
}

/// One page of a list.
pub(crate) struct Page {
    pub(crate) items: Vec<Arc<Value>>,
    /// The key of the last item, when more matching items follow.
    pub(crate) next: Option<Key>,
    pub(crate) remaining: Option<usize>,
}

/// A stored Event (events.k8s.io/v1 or core v1).
pub(crate) type EventKey = (&'static str, String, String);

#[derive(Default)]
pub(crate) struct Store {
    pub(crate) rv: u64,
    /// History before (and at) this resourceVersion is forgotten.
    pub(crate) compacted: u64,
    objects: [BTreeMap<Key, Arc<Value>>; KINDS.len()],
    history: VecDeque<Arc<Change>>,
    pub(crate) unserved: [bool; KINDS.len()],
    watches: Vec<WatchSlot>,
    pub(crate) events: BTreeMap<EventKey, Value>,
    /// Creation order of the events (keys), for `FakeApiServer::events`.
    pub(crate) event_order: Vec<EventKey>,
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    let o = obj.as_object_mut().expect("an object");
    let m = o
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !m.is_object() {
        *m = Value::Object(Map::new());
    }
    m.as_object_mut().expect("metadata is an object")
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

/// The object with its `metadata.resourceVersion` replaced.
pub(crate) fn with_rv(obj: &Value, rv: u64) -> Value {
    let mut o = obj.clone();
    meta_mut(&mut o).insert("resourceVersion".into(), Value::String(rv.to_string()));
    o
}

impl Store {
    pub(crate) fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Creates or updates an object; returns its resourceVersion (unchanged for a
    /// no-op update, as the API server does).
    pub(crate) fn apply(&mut self, obj: Value) -> u64 {
        let kind_str = obj
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("svcproxy-fakeapi: apply: object without a kind: {obj}"));
        let kind = kind_index_or_panic(kind_str);
        let info = &KINDS[kind];
        let mut obj = obj;
        if !obj.is_object() {
            panic!("svcproxy-fakeapi: apply: not an object: {obj}");
        }
        obj["apiVersion"] = Value::String(info.api_version.into());
        let name = meta_str(&obj, "name")
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| panic!("svcproxy-fakeapi: apply: object without a name: {obj}"))
            .to_string();
        let ns = if info.namespaced {
            let ns = meta_str(&obj, "namespace")
                .filter(|n| !n.is_empty())
                .unwrap_or("default")
                .to_string();
            meta_mut(&mut obj).insert("namespace".into(), Value::String(ns.clone()));
            ns
        } else {
            meta_mut(&mut obj).remove("namespace");
            String::new()
        };
        let key = (ns, name);
        let old = self.objects[kind].get(&key).cloned();
        {
            let meta = meta_mut(&mut obj);
            meta.remove("resourceVersion");
            let inherited = |f: &str| old.as_ref().and_then(|o| meta_str(o, f)).map(String::from);
            if !meta.get("uid").is_some_and(Value::is_string) {
                let uid = inherited("uid").unwrap_or_else(util::new_uid);
                meta.insert("uid".into(), Value::String(uid));
            }
            if !meta.get("creationTimestamp").is_some_and(Value::is_string) {
                let ts = inherited("creationTimestamp").unwrap_or_else(util::now_rfc3339);
                meta.insert("creationTimestamp".into(), Value::String(ts));
            }
        }
        if let Some(old) = &old {
            let mut prev = (**old).clone();
            let prev_rv = meta_mut(&mut prev).remove("resourceVersion");
            if prev == obj {
                return prev_rv
                    .and_then(|v| v.as_str().and_then(|s| s.parse().ok()))
                    .unwrap_or(self.rv);
            }
        }
        let rv = self.next_rv();
        meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let new = Arc::new(obj);
        self.objects[kind].insert(key.clone(), new.clone());
        self.record(Change {
            rv,
            kind,
            key,
            old,
            new: Some(new),
        });
        rv
    }

    /// Deletes an object; false if there was none.
    pub(crate) fn delete(&mut self, kind: usize, key: &Key) -> bool {
        let Some(old) = self.objects[kind].remove(key) else {
            return false;
        };
        let rv = self.next_rv();
        self.record(Change {
            rv,
            kind,
            key: key.clone(),
            old: Some(old),
            new: None,
        });
        true
    }

    fn record(&mut self, change: Change) {
        let change = Arc::new(change);
        self.history.push_back(change.clone());
        let kind = change.kind;
        self.watches
            .retain(|w| w.kind != kind || w.tx.send(Msg::Change(change.clone())).is_ok());
    }

    pub(crate) fn get(&self, kind: usize, key: &Key) -> Option<Arc<Value>> {
        self.objects[kind].get(key).cloned()
    }

    pub(crate) fn objects(&self, kind: usize) -> impl Iterator<Item = &Arc<Value>> {
        self.objects[kind].values()
    }

    /// Forgets all but the last `keep` changes, as etcd's periodic compaction does:
    /// reads and watches from before them get 410 Gone.
    pub(crate) fn trim_history(&mut self, keep: usize) {
        while self.history.len() > keep {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted = dropped.rv;
            }
        }
    }

    /// Forgets every change so far: reads and watches at older resourceVersions
    /// get 410 Gone.
    pub(crate) fn compact(&mut self) {
        self.compacted = self.rv;
        self.history.clear();
    }

    fn check_rv(&self, rv: u64) -> Result<(), RvError> {
        if rv > self.rv {
            Err(RvError::TooLarge { current: self.rv })
        } else if rv < self.compacted {
            Err(RvError::Expired {
                compacted: self.compacted,
            })
        } else {
            Ok(())
        }
    }

    /// The changes of `kind` after `rv`, oldest first.
    fn changes_after(&self, kind: usize, rv: u64) -> impl Iterator<Item = &Arc<Change>> {
        let start = self.history.partition_point(|c| c.rv <= rv);
        self.history.range(start..).filter(move |c| c.kind == kind)
    }

    /// One page of the objects of `kind` as they were at `at_rv`, after key
    /// `after` (exclusive), matching `filter`, at most `limit` of them.
    pub(crate) fn list(
        &self,
        kind: usize,
        at_rv: u64,
        after: Option<&Key>,
        limit: Option<usize>,
        filter: &Filter,
    ) -> Result<Page, RvError> {
        self.check_rv(at_rv)?;
        // The state at `at_rv`: for each key changed since, its value before the
        // first change after `at_rv`.
        let mut overlay: BTreeMap<&Key, Option<&Arc<Value>>> = BTreeMap::new();
        for c in self.changes_after(kind, at_rv) {
            overlay.entry(&c.key).or_insert(c.old.as_ref());
        }
        let lower = match after {
            Some(k) => Bound::Excluded(k),
            None => Bound::Unbounded,
        };
        let current = self.objects[kind].range::<Key, _>((lower, Bound::Unbounded));
        let past = overlay.range::<&Key, _>((
            match after {
                Some(k) => Bound::Excluded(k),
                None => Bound::Unbounded,
            },
            Bound::Unbounded,
        ));
        let merged = Merge {
            current: current.peekable(),
            past: past.map(|(k, v)| (*k, *v)).peekable(),
        };
        let limit = limit.unwrap_or(usize::MAX);
        let mut items = Vec::new();
        let mut last: Option<&Key> = None;
        let mut next = None;
        let mut remaining = 0usize;
        for (key, obj) in merged {
            if !filter.matches(obj) {
                continue;
            }
            if items.len() < limit {
                items.push(obj.clone());
                last = Some(key);
                continue;
            }
            if next.is_none() {
                next = last.cloned();
                if !filter.is_empty() {
                    break;
                }
            }
            remaining += 1;
        }
        let remaining = (next.is_some() && filter.is_empty()).then_some(remaining);
        Ok(Page {
            items,
            next,
            remaining,
        })
    }

    /// Registers a watch of `kind`; returns where it starts and its event channel.
    /// `from`: None for "current state first" (resourceVersion unset or 0, or
    /// sendInitialEvents), Some(rv) to replay the changes after rv.
    pub(crate) fn watch(
        &mut self,
        kind: usize,
        from: Option<u64>,
        filter: &Filter,
        bookmarks: bool,
    ) -> Result<(WatchStart, u64, mpsc::UnboundedReceiver<Msg>), RvError> {
        let start = match from {
            None => WatchStart::Initial(
                self.objects[kind]
                    .values()
                    .filter(|o| filter.matches(o))
                    .cloned()
                    .collect(),
            ),
            Some(rv) => {
                self.check_rv(rv)?;
                WatchStart::Replay(self.changes_after(kind, rv).cloned().collect())
            }
        };
        let (tx, rx) = mpsc::unbounded_channel();
        self.watches.push(WatchSlot {
            kind,
            bookmarks,
            tx,
        });
        Ok((start, self.rv, rx))
    }

    /// Sends a bookmark at the current resourceVersion to every watch asking for
    /// them.
    pub(crate) fn bookmark_all(&mut self) {
        let rv = self.rv;
        self.watches
            .retain(|w| !w.bookmarks || w.tx.send(Msg::Bookmark(rv)).is_ok());
    }

    /// Ends every open watch (their streams abort once drained).
    pub(crate) fn drop_watches(&mut self) {
        self.watches.clear();
    }
}

/// Merges the current objects with the overlay of older states (same keys: the
/// overlay wins; an overlay `None` hides the key).
struct Merge<'a, C, P>
where
    C: Iterator<Item = (&'a Key, &'a Arc<Value>)>,
    P: Iterator<Item = (&'a Key, Option<&'a Arc<Value>>)>,
{
    current: std::iter::Peekable<C>,
    past: std::iter::Peekable<P>,
}

impl<'a, C, P> Iterator for Merge<'a, C, P>
where
    C: Iterator<Item = (&'a Key, &'a Arc<Value>)>,
    P: Iterator<Item = (&'a Key, Option<&'a Arc<Value>>)>,
{
    type Item = (&'a Key, &'a Arc<Value>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let take_past = match (self.current.peek(), self.past.peek()) {
                (None, None) => return None,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some((ck, _)), Some((pk, _))) => {
                    if ck == pk {
                        self.current.next();
                        true
                    } else {
                        pk < ck
                    }
                }
            };
            if take_past {
                let (k, v) = self.past.next().expect("peeked");
                if let Some(v) = v {
                    return Some((k, v));
                }
            } else {
                return self.current.next();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(name: &str, v: u32) -> Value {
        json!({"kind": "Service", "metadata": {"name": name, "namespace": "ns", "labels": {"v": v.to_string()}}})
    }

    fn names(p: &Page) -> Vec<String> {
        p.items
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn apply_fills_metadata_and_skips_no_op_updates() {
        let mut s = Store::default();
        assert_eq!(s.apply(svc("a", 1)), 1);
        let a = s.get(0, &("ns".into(), "a".into())).unwrap();
        assert_eq!(a["apiVersion"], "v1");
        assert_eq!(a["metadata"]["resourceVersion"], "1");
        let uid = a["metadata"]["uid"].as_str().unwrap().to_string();
        assert!(a["metadata"]["creationTimestamp"].is_string());
        assert_eq!(s.apply(svc("a", 1)), 1, "no-op update");
        assert_eq!(s.apply(svc("a", 2)), 2);
        let a = s.get(0, &("ns".into(), "a".into())).unwrap();
        assert_eq!(a["metadata"]["uid"], uid.as_str(), "uid kept on update");
        let node = json!({"kind": "Node", "metadata": {"name": "n", "namespace": "x"}});
        s.apply(node);
        let n = s.get(2, &(String::new(), "n".into())).unwrap();
        assert!(n["metadata"].get("namespace").is_none());
    }

    #[test]
    fn lists_at_an_old_resource_version_see_the_old_state() {
        let mut s = Store::default();
        for n in ["a", "b", "c", "d"] {
            s.apply(svc(n, 1));
        }
        let at = s.rv;
        s.apply(svc("b", 2));
        s.delete(0, &("ns".into(), "c".into()));
        s.apply(svc("bb", 1));
        s.apply(svc("e", 1));
        let f = Filter::default();
        let p = s.list(0, at, None, None, &f).unwrap();
        assert_eq!(names(&p), ["a", "b", "c", "d"]);
        assert_eq!(p.items[1]["metadata"]["labels"]["v"], "1");
        let p = s.list(0, at, None, Some(2), &f).unwrap();
        assert_eq!(names(&p), ["a", "b"]);
        assert_eq!(p.remaining, Some(2));
        let p = s.list(0, at, p.next.as_ref(), Some(2), &f).unwrap();
        assert_eq!(names(&p), ["c", "d"]);
        assert!(p.next.is_none());
        let now = s.list(0, s.rv, None, None, &f).unwrap();
        assert_eq!(names(&now), ["a", "b", "bb", "d", "e"]);
        s.compact();
        assert_eq!(
            s.list(0, at, None, None, &f).err(),
            Some(RvError::Expired { compacted: 8 })
        );
        assert!(matches!(
            s.list(0, 99, None, None, &f),
            Err(RvError::TooLarge { .. })
        ));
    }
}
