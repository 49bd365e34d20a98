//! A UDP worker's cache of encoded answers, kept per catalog generation (and
//! per client node for answers chosen for the node).
//!
//! Entry points: [`AnswerCache::get`] and [`AnswerCache::put`], from
//! `Handler::respond_with`.

use super::*;

/// A UDP worker's answers, encoded: the bytes of a query after its id, to the
/// bytes of the answer after its id. An answer is kept only while the catalog's
/// generation is the one it was made at; the query's bytes hold everything else an
/// answer depends on (flags, the question as spelt, EDNS and its payload size),
/// but for answers chosen for the client's node: those are kept per node, and the
/// query alone only says that its answer depends on the node. A hit costs a hash
/// lookup or two and a copy instead of parsing, looking up, choosing endpoints,
/// building records and encoding.
pub(super) struct AnswerCache {
    generation: u64,
    entries: std::collections::HashMap<Box<[u8]>, Kept, foldhash::fast::RandomState>,
    /// Bytes held in keys and values.
    size: usize,
    /// The key being looked up (reused).
    key: Vec<u8>,
}

enum Kept {
    Answer(Box<[u8]>),
    /// The answer depends on the client's node: look again with the node.
    PerNode,
}

/// What one worker's cache may hold, in bytes of queries and answers; when full
/// it starts again empty (queries for hot names fill it again at once).
const CACHE_BYTES: usize = 4 << 20;

/// Key prefixes: the query alone, the query from a client on a known node (then
/// the node's name and a NUL follow), from a client on no known node.
const ANY_CLIENT: u8 = 0;
const ON_NODE: u8 = 1;
const NO_NODE: u8 = 2;

impl AnswerCache {
    pub(super) fn new() -> Self {
        AnswerCache {
            generation: u64::MAX,
            entries: std::collections::HashMap::default(),
            size: 0,
            key: Vec::with_capacity(512),
        }
    }

    fn set_key(&mut self, query: &[u8], node: Option<Option<&str>>) {
        self.key.clear();
        match node {
            None => self.key.push(ANY_CLIENT),
            Some(None) => self.key.push(NO_NODE),
            Some(Some(node)) => {
                self.key.push(ON_NODE);
                self.key.extend_from_slice(node.as_bytes());
                self.key.push(0);
            }
        }
        self.key.extend_from_slice(&query[2..]);
    }

    /// The answer to `query` from `client`, its id set, if kept.
    pub(super) fn get(
        &mut self,
        catalog: &Catalog,
        query: &[u8],
        client: IpAddr,
    ) -> Option<Vec<u8>> {
        if catalog.generation() != self.generation {
            self.entries.clear();
            self.size = 0;
            self.generation = catalog.generation();
            return None;
        }
        let id = query.get(..2)?;
        self.set_key(query, None);
        let mut kept = self.entries.get(self.key.as_slice())?;
        if let Kept::PerNode = kept {
            self.set_key(query, Some(catalog.client_node(Some(client))));
            kept = self.entries.get(self.key.as_slice())?;
        }
        let Kept::Answer(tail) = kept else {
            return None;
        };
        let mut out = Vec::with_capacity(tail.len() + 2);
        out.extend_from_slice(id);
        out.extend_from_slice(tail);
        Some(out)
    }

    /// Keeps `answer` to `query` from `client`, made at `catalog`'s generation.
    pub(super) fn put(
        &mut self,
        catalog: &Catalog,
        query: &[u8],
        client: IpAddr,
        answer: &[u8],
        per_client: bool,
    ) {
        if catalog.generation() != self.generation || query.len() < 12 || answer.len() < 12 {
            return;
        }
        if per_client {
            self.set_key(query, None);
            self.insert(Kept::PerNode);
            self.set_key(query, Some(catalog.client_node(Some(client))));
        } else {
            self.set_key(query, None);
        }
        self.insert(Kept::Answer(answer[2..].into()));
    }

    fn insert(&mut self, kept: Kept) {
        let size = self.key.len()
            + match &kept {
                Kept::Answer(a) => a.len(),
                Kept::PerNode => 0,
            };
        if self.size + size > CACHE_BYTES {
            self.entries.clear();
            self.size = 0;
        }
        if self
            .entries
            .insert(self.key.as_slice().into(), kept)
            .is_none()
        {
            self.size += size;
        }
    }
}
