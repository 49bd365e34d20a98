//! A cold start: the whole table of a family the kernel does not have yet,
//! written in several bounded transactions, each whole on its own, instead of
//! one that holds the kernel's nftables lock for the whole table.
//!
//! Entry point: [`FamilyState::staged_table_ops`], which a recreate calls when
//! [`Planner::set_cold_start`] asked for it; the steps are a [`Staging`]'s, in
//! the sizes of a [`ColdStart`].

use super::*;

/// How to write a table the kernel does not have yet (a node's first start): in
/// several transactions, each bounded and whole on its own, instead of one that
/// holds the kernel's nftables lock for the whole table (kubernetes#139328).
/// Another writer then waits for one of them at most. See
/// `FamilyState::staged_table_ops` for the order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColdStart {
    /// Statements per transaction writing service ports' objects (a transaction
    /// ends after the service port that reaches it).
    pub objects_per_commit: usize,
    /// Elements per transaction linking services in; each such transaction makes
    /// the kernel validate everything linked so far.
    pub links_per_commit: usize,
}

impl Default for ColdStart {
    /// Measured at 100k services x 10 endpoints (docs/benchmarks.md): a
    /// transaction of 8192 objects or elements takes the kernel 40-90 ms; one
    /// linking 16384 elements at most 120 ms plus the validation of what is
    /// linked.
    fn default() -> Self {
        ColdStart {
            objects_per_commit: 8192,
            links_per_commit: 16384,
        }
    }
}

/// The Services a node needs before any other (written and linked in the first
/// transaction of a cold start): the API server's `default/kubernetes` and the
/// cluster DNS's `kube-system/kube-dns`, by their well-known names.
pub fn needed_first(name: &ServicePortName) -> bool {
    matches!(
        (&*name.service.namespace, &*name.service.name),
        ("default", "kubernetes") | ("kube-system", "kube-dns")
    )
}

/// A cold start's steps for one family ([`FamilyState::staged_table_ops`]), with
/// what they have written so far.
struct Staging<'a> {
    state: &'a FamilyState,
    fam: &'a FamilyIntent,
    cold: ColdStart,
    /// Hairpin addresses and cluster IPs written (several fragments share them).
    hairpin: BTreeSet<IpAddr>,
    linked: BTreeSet<IpAddr>,
    /// Sets written: the kernel's cost of a statement about a set grows with them.
    sets: usize,
    /// The weight written since the last commit.
    pending: usize,
}

impl<'a> Staging<'a> {
    fn new(state: &'a FamilyState, fam: &'a FamilyIntent, cold: ColdStart) -> Self {
        Staging {
            state,
            fam,
            cold,
            hairpin: BTreeSet::new(),
            linked: BTreeSet::new(),
            sets: 0,
            pending: 0,
        }
    }

    fn elem(&self, set: &str, key: Vec<Atom>, value: Option<ElemValue>) -> Step {
        Step::Op(add_element(self.state.family, set, key, value))
    }

    /// Ends the transaction once `limit` is reached.
    fn commit_at(&mut self, limit: usize, out: &mut dyn FnMut(Step)) {
        if self.pending >= limit.max(1) {
            out(Step::Commit);
            self.pending = 0;
        }
    }

    /// The table's declarations (every set and map, the endpoint maps), the
    /// skeleton's chains and rules, and the node-wide elements.
    fn skeleton(&mut self, node: &NodeIntent, out: &mut dyn FnMut(Step)) {
        let (state, f) = (self.state, self.state.family);
        let shared = state.skeleton(node);
        state.declarations(&shared, &mut |op| out(Step::Op(op)));
        chain_ops(f, shared.chains, out);
        if let Some(o) = state.pod_cidrs().ok().flatten() {
            out(Step::Op(o));
        }
        if let NodePortDestinations::Ips(ips) = &node.nodeports {
            for ip in ips {
                out(self.elem(NODEPORT_IPS_SET, vec![Atom::Ip(*ip)], None));
            }
        }
    }

    /// The service ports the node needs first ([`needed_first`]), whole.
    fn needed_first(&mut self, out: &mut dyn FnMut(Step)) {
        let state = self.state;
        for (name, frag) in state.entries.iter().filter(|(n, _)| needed_first(n)) {
            self.fragment(frag, out);
            self.endpoints(frag, out);
            self.hairpins(&mut frag.hairpin_ips(), out);
            if let Some(svc) = self.fam.service(name) {
                self.cluster_dnats(svc, out);
                self.link(svc, out);
            }
        }
    }

    /// Every other service port's objects, then their endpoint map and hairpin
    /// elements: unreachable until linked.
    ///
    /// Every rule before any endpoint map element: a new rule using a map is
    /// checked against every element the map holds, a new element against every
    /// rule using its map (cheaply); rules after elements would be quadratic (see
    /// `write_table`). And map by map: those checks walk the map's list of rules,
    /// which walked again and again stays in the CPU's caches. The fragments
    /// without an endpoint map first: those with sets (session affinity's, one per
    /// endpoint) cost the kernel a walk of the table's sets each, and the table is
    /// smallest then (each commit also walks every chain of the table).
    fn objects(&mut self, out: &mut dyn FnMut(Step)) {
        let state = self.state;
        let limit = self.cold.objects_per_commit;
        let rest = |f: &&Fragment| !needed_first(&f.intent.name);
        let by_map = state.fragments_by_endpoint_map();
        let unmapped = state.entries.values().filter(|f| !f.uses_endpoint_map());
        for frag in unmapped
            .chain(by_map.values().flatten().copied())
            .filter(rest)
        {
            self.pending += self.fragment(frag, out);
            self.commit_at(limit, out);
        }
        for frag in by_map.values().flatten().copied().filter(rest) {
            self.pending += self.endpoints(frag, out);
            self.commit_at(limit, out);
        }
        let fam = self.fam;
        for (_, svc) in fam.services().iter().filter(|(n, _)| !needed_first(n)) {
            self.pending += self.cluster_dnats(svc, out);
            self.commit_at(limit, out);
        }
        for frag in state.entries.values().filter(rest) {
            self.pending += self.hairpins(&mut frag.hairpin_ips(), out);
            self.commit_at(limit, out);
        }
        // Addresses no fragment names (none, as fragments are made; the table
        // stays whole whatever the state holds).
        self.pending += self.hairpins(&mut state.hairpin.keys().copied(), out);
        if self.pending > 0 {
            out(Step::Commit);
            self.pending = 0;
        }
    }

    /// The links, a Service at a time: each Service's are in one transaction.
    fn links(&mut self, out: &mut dyn FnMut(Step)) {
        let fam = self.fam;
        let mut last: Option<&ServicePortName> = None;
        for (name, svc) in fam.services().iter().filter(|(n, _)| !needed_first(n)) {
            if last.is_some_and(|l| l.service != name.service) {
                self.commit_at(self.cold.links_per_commit, out);
            }
            last = Some(name);
            self.pending += self.link(svc, out);
        }
        // Cluster IPs of no service port (none, as the intent is built).
        for ip in fam.cluster_ips() {
            if self.linked.insert(ip) {
                out(self.elem(CLUSTER_IPS_SET, vec![Atom::Ip(ip)], None));
            }
        }
    }

    /// A fragment's objects; their weight: the number of statements, each
    /// weighing more the more sets the table holds when the fragment has sets, as
    /// the kernel finds a set by name in a list of them.
    fn fragment(&mut self, frag: &Fragment, out: &mut dyn FnMut(Step)) -> usize {
        let f = self.state.family;
        let objs = frag.objects(self.state.detect.as_ref());
        for (name, set) in &objs.sets {
            out(Step::Op(add_set(f, name, set)));
        }
        let n = objs.sets.len() + chain_ops(f, objs.chains, out);
        let weight = match objs.sets.len() {
            0 => 1,
            _ => 1 + self.sets / SETS_PER_WEIGHT,
        };
        self.sets += objs.sets.len();
        n * weight
    }

    /// A fragment's endpoint map elements; their number.
    fn endpoints(&self, frag: &Fragment, out: &mut dyn FnMut(Step)) -> usize {
        let mut n = 0;
        self.state.dnat_ops(frag, &mut |op| {
            n += 1;
            out(Step::Op(op))
        });
        n
    }

    /// The cluster IP map's elements of the frontends a service port owns (see
    /// [`Staging::link`]); their number.
    fn cluster_dnats(&self, svc: &Arc<ServiceIntent>, out: &mut dyn FnMut(Step)) -> usize {
        let f = self.state.family;
        let mut n = 0;
        for frontend in svc.frontends.iter().filter(|f| self.owns(svc, &f.key)) {
            cluster_elems(
                svc,
                &frontend.key,
                self.state.chainless,
                &mut |_| {},
                &mut |e| {
                    n += 1;
                    out(Step::Op(data_elem(f, e)));
                },
            );
        }
        n
    }

    /// Whether `svc` owns the frontend at `key`: only the owner of a contested
    /// frontend links it.
    fn owns(&self, svc: &Arc<ServiceIntent>, key: &FrontendKey) -> bool {
        matches!(self.fam.frontend(key), Some((owner, _)) if Arc::ptr_eq(owner, svc))
    }

    /// The hairpin elements of `ips` not written yet; their number.
    fn hairpins(
        &mut self,
        ips: &mut dyn Iterator<Item = IpAddr>,
        out: &mut dyn FnMut(Step),
    ) -> usize {
        let mut n = 0;
        for ip in ips {
            if self.hairpin.insert(ip) {
                n += 1;
                out(self.elem(HAIRPIN_SET, hairpin_elem(ip), None));
            }
        }
        n
    }

    /// A service port's links (its cluster IPs not written yet, and the verdict
    /// map elements of the frontends it owns); their number.
    fn link(&mut self, svc: &Arc<ServiceIntent>, out: &mut dyn FnMut(Step)) -> usize {
        let state = self.state;
        let mut n = 0;
        for ip in svc.cluster_ips() {
            if self.linked.insert(ip) {
                n += 1;
                out(self.elem(CLUSTER_IPS_SET, vec![Atom::Ip(ip)], None));
            }
        }
        let hash = state.port_hash(svc);
        let f = state.family;
        for frontend in svc.frontends.iter().filter(|f| self.owns(svc, &f.key)) {
            let key = &frontend.key;
            for e in elems(svc, hash, key, state.localhost_rejects(), state.chainless) {
                n += 1;
                out(self.elem(
                    e.map.name(),
                    key_atoms(key),
                    Some(ElemValue::Verdict(e.verdict.elem())),
                ));
            }
            cluster_elems(
                svc,
                key,
                state.chainless,
                &mut |e| {
                    n += 1;
                    out(Step::Op(data_elem(f, e)));
                },
                &mut |_| {},
            );
        }
        n
    }
}

/// In a cold start, how many sets in the table make a statement about a set
/// weigh one more statement (`FamilyState::staged_table_ops`).
const SETS_PER_WEIGHT: usize = 256;

/// The chains' declarations, then their rules (which may jump to one another);
/// the number of statements.
fn chain_ops(
    family: IpFamily,
    chains: BTreeMap<String, Chain>,
    out: &mut dyn FnMut(Step),
) -> usize {
    let mut n = chains.len();
    for (name, chain) in &chains {
        out(Step::Op(add_chain(family, name, chain)));
    }
    for (name, chain) in chains {
        n += chain.rules.len();
        for rule in chain.rules {
            out(Step::Op(Op::AddRule {
                family,
                chain: name.clone(),
                rule,
            }));
        }
    }
    n
}

impl FamilyState {
    /// [`FamilyState::table_ops`] cut into transactions for a table the kernel
    /// does not have yet ([`ColdStart`]), each ended by [`Step::Commit`]:
    /// 1. the skeleton, and the service ports the node needs first
    ///    ([`needed_first`]) whole;
    /// 2. every other service port's objects (sets, chains, rules), then their
    ///    endpoint map elements and the hairpin elements: nothing reaches them yet, so
    ///    traffic meets none of it, and the kernel's validation at each commit
    ///    walks only what step 1 linked;
    /// 3. the links: each service's `cluster-ips` elements and verdict map
    ///    elements (its frontends), all of a Service's in one transaction, so a
    ///    Service appears whole. Each of these commits makes the kernel walk
    ///    everything linked so far, so they are fewer and larger.
    ///
    /// The statements are those of `table_ops` (the same multiset), in this order.
    pub(super) fn staged_table_ops(
        &self,
        fam: &FamilyIntent,
        cold: ColdStart,
        out: &mut dyn FnMut(Step),
    ) {
        let Some(node) = &self.node else {
            return;
        };
        let mut staging = Staging::new(self, fam, cold);
        staging.skeleton(node, out);
        staging.needed_first(out);
        out(Step::Commit);
        staging.objects(out);
        staging.links(out);
        out(Step::Commit);
    }
}
