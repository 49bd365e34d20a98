//! One family's translated state: the node intent the skeleton was written
//! from, each service port's [`Fragment`], the endpoint map keys and the
//! elements several fragments share, and the delta of an intent applied to them.
//!
//! Entry points: [`FamilyState::apply`] (a delta, with the statements of a
//! partial plan when asked) and [`FamilyState::reset`] (the whole intent).

use super::*;

/// Objects or elements several fragments may need (a hairpin address, an endpoint
/// map), counted: each exists while one fragment needs it. What came or went since
/// the last [`Shared::settle`] is what a partial plan adds or deletes.
pub(super) struct Shared<K, V> {
    counts: BTreeMap<K, (V, usize)>,
    /// Keys whose count changed since the last settle, with whether each existed
    /// before.
    touched: BTreeMap<K, bool>,
}

impl<K, V> Default for Shared<K, V> {
    fn default() -> Self {
        Shared {
            counts: BTreeMap::new(),
            touched: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone, V: Copy> Shared<K, V> {
    fn add(&mut self, key: K, value: V) {
        let (_, count) = self.counts.entry(key.clone()).or_insert((value, 0));
        self.touched.entry(key).or_insert(*count > 0);
        *count += 1;
    }

    fn remove(&mut self, key: &K) {
        let Some((_, count)) = self.counts.get_mut(key) else {
            return;
        };
        self.touched.entry(key.clone()).or_insert(true);
        *count -= 1;
        if *count == 0 {
            self.counts.remove(key);
        }
    }

    /// The keys touched since the last call: whether each existed before, and its
    /// value if it exists now.
    fn settle(&mut self) -> Vec<(K, bool, Option<V>)> {
        std::mem::take(&mut self.touched)
            .into_iter()
            .map(|(k, was)| {
                let now = self.counts.get(&k).map(|(v, _)| *v);
                (k, was, now)
            })
            .collect()
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = &K> {
        self.counts.keys()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&K, V)> {
        self.counts.iter().map(|(k, (v, _))| (k, *v))
    }
}

pub(super) struct FamilyState {
    pub(super) family: IpFamily,
    /// The node intent last planned; `None` while the family is not programmed.
    pub(super) node: Option<Arc<NodeIntent>>,
    pub(super) detect: Option<Detect>,
    pub(super) entries: BTreeMap<ServicePortName, Fragment>,
    pub(super) chain_total: usize,
    pub(super) capture: Option<Arc<dyn CapturePorts>>,
    /// Keys of the `endpoint-dnat-*` maps, held by the fragments' sets.
    slots: Slots,
    /// Each address in `hairpin-endpoints`, counted per fragment that puts it there.
    pub(super) hairpin: Shared<IpAddr, ()>,
    /// The endpoint maps in use (with their protocol), counted per fragment.
    pub(super) endpoint_maps: Shared<String, Protocol>,
    /// Cluster IP ports may be served without a chain (no userspace capture
    /// takes them): see [`cluster_layout`].
    pub(super) chainless: bool,
    /// The protocol and endpoint count of each `clusterip-P-N` set and its rule
    /// in `services`, in the order the kernel holds the rules: those in use at
    /// the last full plan, then those partial plans added (see
    /// `base::clusterip_set`).
    pub(super) cluster_rules: Vec<(Protocol, u32)>,
}

/// The elements the owner of a frontend puts in the maps.
fn owner_elems(
    owner: &Option<Arc<crate::intent::ServiceIntent>>,
    key: &crate::intent::FrontendKey,
    localhost_rejects: &[Protocol],
    chainless: bool,
) -> Vec<Elem> {
    owner
        .as_ref()
        .map(|svc| {
            elems(
                svc,
                service_port_hash(svc.family, &svc.name),
                key,
                localhost_rejects,
                chainless,
            )
        })
        .unwrap_or_default()
}

/// The elements the owner of a frontend puts in the cluster IP sets and maps
/// ([`cluster_elems`]), by set and key.
fn owner_cluster_elems(
    owner: &Option<Arc<crate::intent::ServiceIntent>>,
    key: &crate::intent::FrontendKey,
    chainless: bool,
) -> BTreeMap<(String, Vec<Atom>), Option<Vec<Atom>>> {
    let (mut links, mut dnats) = (Vec::new(), Vec::new());
    if let Some(svc) = owner {
        cluster_elems(svc, key, chainless, &mut |e| links.push(e), &mut |e| {
            dnats.push(e)
        });
    }
    links
        .into_iter()
        .chain(dnats)
        .map(|e| ((e.set, e.key), e.value))
        .collect()
}

impl FamilyState {
    pub(super) fn new(family: IpFamily, capture: Option<Arc<dyn CapturePorts>>) -> Self {
        let chainless = capture.as_ref().is_none_or(|c| c.loopback_only());
        FamilyState {
            family,
            node: None,
            detect: None,
            entries: BTreeMap::new(),
            chain_total: 0,
            chainless,
            cluster_rules: Vec::new(),
            capture,
            slots: Slots::new(),
            hairpin: Shared::default(),
            endpoint_maps: Shared::default(),
        }
    }

    /// A new fragment, holding its keys of the `endpoint-dnat-*` maps and counted in
    /// `hairpin-endpoints`; [`FamilyState::release`] gives both back.
    fn fragment(&mut self, svc: Arc<crate::intent::ServiceIntent>) -> Fragment {
        let mut frag = Fragment::new(svc, self.capture.as_deref());
        for (slot, n) in frag.dispatch_sizes().into_iter().enumerate() {
            if n > 0 {
                frag.blocks[slot] = self.slots.alloc(n);
            }
        }
        for ip in frag.hairpin_ips() {
            self.hairpin.add(ip, ());
        }
        if frag.uses_endpoint_map() {
            self.endpoint_maps
                .add(frag.endpoint_map(), frag.intent.protocol);
        }
        frag
    }

    fn release(&mut self, frag: &Fragment) {
        for run in frag.blocks.iter().flatten() {
            self.slots.free(*run);
        }
        for ip in frag.hairpin_ips() {
            self.hairpin.remove(&ip);
        }
        if frag.uses_endpoint_map() {
            self.endpoint_maps.remove(&frag.endpoint_map());
        }
    }

    /// Whether moving to `node` changes more than per-service chains: the shared
    /// objects, or the rule text that recognises local traffic (which every
    /// service chain uses, whether or not its intent changed).
    pub(super) fn skeleton_changes(&self, node: Option<&Arc<NodeIntent>>) -> bool {
        match (&self.node, node) {
            (None, None) => false,
            (Some(old), Some(new)) if Arc::ptr_eq(old, new) => false,
            (Some(old), Some(new)) => {
                base_ruleset(old) != base_ruleset(new)
                    || self.detect.as_ref() != Detect::new(new).as_ref()
            }
            _ => true,
        }
    }

    /// The protocols whose NodePorts the node rejects on loopback (KEP-6032).
    pub(super) fn localhost_rejects(&self) -> &[Protocol] {
        self.node
            .as_deref()
            .map_or(&[], |n| n.localhost_rejects.as_slice())
    }

    fn set_node(&mut self, node: Option<Arc<NodeIntent>>) {
        self.detect = node.as_deref().and_then(Detect::new);
        self.node = node;
    }

    /// Applies one family's delta to the fragments and, when `delta` is given,
    /// writes the statements that take the kernel along.
    pub(super) fn apply(
        &mut self,
        fd: &FamilyDelta,
        node: Option<&Arc<NodeIntent>>,
        mut delta: Option<&mut Delta>,
        stats: &mut PlanStats,
    ) {
        if self.node.as_ref() != node {
            self.set_node(node.cloned());
        }
        self.hairpin.settle();
        self.endpoint_maps.settle();
        for change in &fd.services {
            let old = self.entries.remove(&change.name);
            if let Some(old) = &old {
                // First, so that a changed port whose endpoint count keeps its
                // size gets its keys back.
                self.release(old);
            }
            let new = change.after.clone().map(|svc| self.fragment(svc));
            if let Some(d) = delta.as_deref_mut() {
                let empty = Ruleset::new(self.family);
                let detect = self.detect.as_ref();
                let old_objs = old
                    .as_ref()
                    .map_or_else(|| empty.clone(), |f| f.objects(detect));
                let new_objs = new.as_ref().map_or(empty, |f| f.objects(detect));
                d.objects(&old_objs, &new_objs, stats);
                d.dnat_elements(old.as_ref(), new.as_ref(), stats);
            }
            if let Some(old) = old {
                self.chain_total -= old.chain_count();
            }
            if let Some(new) = new {
                self.chain_total += new.chain_count();
                if let (Some(d), Some(n)) = (delta.as_deref_mut(), new.chainless) {
                    self.add_cluster_rule(new.intent.protocol, n, d);
                }
                self.entries.insert(change.name.clone(), new);
            }
        }
        let Some(d) = delta else {
            // A full plan follows: it writes the rules of the counts in use.
            self.cluster_rules = self.cluster_rules_in_use();
            return;
        };
        self.delta_of_sets(d, stats);
        self.delta_of_verdicts(fd, d, stats);
    }

    /// The rule serving cluster IP ports of `protocol` with `n` endpoints, and its
    /// set, into `d` if the kernel does not have them yet (the rule is appended to
    /// `services`; it stays until a full plan, see `base::clusterip_set`).
    fn add_cluster_rule(&mut self, protocol: Protocol, n: u32, d: &mut Delta) {
        if self.cluster_rules.contains(&(protocol, n)) {
            return;
        }
        let f = self.family;
        let name = clusterip_set(protocol, n);
        let set = clusterip_port_set(f);
        d.declare
            .typed(&stmt::add_set(f, &name, &set), add_set(f, &name, &set));
        let rule = clusterip_rule(f, protocol, n);
        d.rules.typed(
            &stmt::add_rule(f, SERVICES_CHAIN, &rule.text()),
            Op::AddRule {
                family: f,
                chain: SERVICES_CHAIN.to_string(),
                rule,
            },
        );
        self.cluster_rules.push((protocol, n));
    }

    /// The protocol and endpoint count of every service port served without a
    /// chain, in order.
    pub(super) fn cluster_rules_in_use(&self) -> Vec<(Protocol, u32)> {
        let in_use: BTreeSet<(Protocol, u32)> = self
            .entries
            .values()
            .filter_map(|f| Some((f.intent.protocol, f.chainless?)))
            .collect();
        in_use.into_iter().collect()
    }

    /// The endpoint maps and the hairpin set that came into use or went, into
    /// `d`: endpoint maps come into use before the rules that use them, and go
    /// after the chains that used them.
    fn delta_of_sets(&mut self, d: &mut Delta, stats: &mut PlanStats) {
        let f = self.family;
        for (name, was, now) in self.endpoint_maps.settle() {
            match (was, now) {
                (true, None) => d
                    .delete_stale_sets
                    .typed(&stmt::delete_map(f, &name), delete_set(f, &name)),
                (false, Some(protocol)) => {
                    let map = endpoint_map_decl(f, protocol);
                    d.declare
                        .typed(&stmt::add_map(f, &name, &map), add_map(f, &name, &map))
                }
                _ => {}
            }
        }
        for (ip, was, now) in self.hairpin.settle() {
            match (was, now.is_some()) {
                (true, false) => {
                    d.element(false, HAIRPIN_SET, hairpin_elem(ip), None);
                    stats.elements_deleted += 1;
                }
                (false, true) => {
                    d.element(true, HAIRPIN_SET, hairpin_elem(ip), None);
                    stats.elements_added += 1;
                }
                _ => {}
            }
        }
    }

    /// The frontends whose owner changed (their verdict map elements) and the
    /// cluster IPs that came or went, into `d`.
    fn delta_of_verdicts(&self, fd: &FamilyDelta, d: &mut Delta, stats: &mut PlanStats) {
        let rejects = self.localhost_rejects().to_vec();
        let chainless = self.chainless;
        for change in &fd.frontends {
            let key = key_atoms(&change.key);
            let before = owner_elems(&change.before, &change.key, &rejects, chainless);
            let after = owner_elems(&change.after, &change.key, &rejects, chainless);
            for b in &before {
                if !after.contains(b) {
                    d.element(false, b.map.name(), key.clone(), None);
                    stats.elements_deleted += 1;
                }
            }
            for a in &after {
                if !before.contains(a) {
                    d.element(
                        true,
                        a.map.name(),
                        key.clone(),
                        Some(ElemValue::Verdict(a.verdict.elem())),
                    );
                    stats.elements_added += 1;
                }
            }
            // The cluster IP sets and map: an element whose value stays is left
            // alone, one whose value changes is deleted and added again.
            let before = owner_cluster_elems(&change.before, &change.key, chainless);
            let after = owner_cluster_elems(&change.after, &change.key, chainless);
            for ((set, k), v) in &before {
                if after.get(&(set.clone(), k.clone())) != Some(v) {
                    d.element(false, set, k.clone(), None);
                    stats.elements_deleted += 1;
                }
            }
            for ((set, k), v) in &after {
                if before.get(&(set.clone(), k.clone())) != Some(v) {
                    d.element(true, set, k.clone(), v.clone().map(ElemValue::Data));
                    stats.elements_added += 1;
                }
            }
        }
        for ip in &fd.cluster_ips_removed {
            d.element(false, CLUSTER_IPS_SET, vec![Atom::Ip(*ip)], None);
            stats.elements_deleted += 1;
        }
        for ip in &fd.cluster_ips_added {
            d.element(true, CLUSTER_IPS_SET, vec![Atom::Ip(*ip)], None);
            stats.elements_added += 1;
        }
    }

    /// Rebuilds the fragments from the whole intent (reusing those whose intent
    /// is the same `Arc`): for a delta that does not follow the last plan.
    pub(super) fn reset(&mut self, fam: &FamilyIntent) {
        self.set_node(fam.node().cloned());
        let mut old = std::mem::take(&mut self.entries);
        let mut kept = BTreeMap::new();
        for (name, svc) in fam.services() {
            if let Some(f) = old.remove(name) {
                if Arc::ptr_eq(&f.intent, svc) {
                    kept.insert(name.clone(), f);
                } else {
                    old.insert(name.clone(), f);
                }
            }
        }
        for frag in old.values() {
            self.release(frag);
        }
        self.chain_total = 0;
        // Collected in name order, so the map is built with full nodes (inserted
        // one by one, a B-tree's nodes end about half full: a third more memory
        // for tens of thousands of fragments).
        self.entries = fam
            .services()
            .iter()
            .map(|(name, svc)| {
                let frag = match kept.remove(name) {
                    Some(f) => f,
                    None => self.fragment(svc.clone()),
                };
                self.chain_total += frag.chain_count();
                (name.clone(), frag)
            })
            .collect();
        // A full plan follows: nothing to report element by element.
        self.hairpin.settle();
        self.endpoint_maps.settle();
        self.cluster_rules = self.cluster_rules_in_use();
    }
}
