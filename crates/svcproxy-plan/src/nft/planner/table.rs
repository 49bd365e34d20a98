//! A family's whole table, from its state: the shared objects with their
//! elements, then each service port's objects, as `nft -f` text, as typed
//! statements, or as one typed ruleset; and the names of its objects.
//!
//! Entry points: [`FamilyState::write_table`], [`FamilyState::table_ops`],
//! [`FamilyState::ruleset`], [`FamilyState::names`].

use super::*;

impl FamilyState {
    /// The shared objects, without their elements.
    pub(super) fn skeleton(&self, node: &NodeIntent) -> Ruleset {
        let mut rs = base_ruleset(node);
        if self.capture.is_some() {
            // The capture serves NodePorts on loopback to the node's own clients
            // only: a packet from outside addressed to loopback is left alone (the
            // kernel drops it as a martian), never redirected to the proxy.
            if let Some(chain) = rs.chains.get_mut("nat-prerouting") {
                let from_loopback = Match::Prefix {
                    addr: Addr::Daddr,
                    net: loopback(self.family),
                    negate: false,
                };
                chain.rules.insert(
                    0,
                    TypedRule::new(self.family, vec![from_loopback], RuleAction::Return),
                );
            }
        }
        // The cluster IP ports served without a chain: a set and a rule per
        // protocol and endpoint count, after the skeleton's own rules.
        for &(protocol, n) in &self.cluster_rules {
            rs.sets
                .insert(clusterip_set(protocol, n), clusterip_port_set(self.family));
            if let Some(chain) = rs.chains.get_mut(SERVICES_CHAIN) {
                chain.rules.push(clusterip_rule(self.family, protocol, n));
            }
        }
        rs
    }

    /// Each frontend's elements of the cluster IP sets (`links`) and map
    /// (`dnats`), as [`cluster_elems`] makes them, from its owner.
    pub(super) fn cluster_elems(
        &self,
        fam: &FamilyIntent,
        links: &mut dyn FnMut(DataElem),
        dnats: &mut dyn FnMut(DataElem),
    ) {
        for (svc, frontend) in fam.frontends() {
            cluster_elems(svc, &frontend.key, self.chainless, links, dnats);
        }
    }

    /// The shared objects with their elements filled in.
    fn base_with_elements(&self, node: &NodeIntent, fam: &FamilyIntent) -> Ruleset {
        let mut rs = self.skeleton(node);
        if let Some(set) = rs.sets.get_mut(CLUSTER_IPS_SET) {
            set.elements = fam.cluster_ips().map(|ip| ip.to_string()).collect();
        }
        if let Some(set) = rs.sets.get_mut(HAIRPIN_SET) {
            set.elements = self
                .hairpin
                .keys()
                .map(|ip| concat_text(&hairpin_elem(*ip)))
                .collect();
        }
        for (key, elems) in self.frontend_elems(fam) {
            let text = key_text(key);
            for elem in elems {
                if let Some(map) = rs.maps.get_mut(elem.map.name()) {
                    map.elements.push((text.clone(), elem.verdict.text()));
                }
            }
        }
        // The cluster IP map's elements are written after the rules (see
        // `write_table`).
        self.cluster_elems(
            fam,
            &mut |e| {
                if let Some(set) = rs.sets.get_mut(&e.set) {
                    set.elements.push(concat_text(&e.key));
                }
            },
            &mut |_| {},
        );
        rs
    }

    /// Each frontend's key, and the elements its owner puts in the shared maps.
    fn frontend_elems<'a>(
        &'a self,
        fam: &'a FamilyIntent,
    ) -> impl Iterator<Item = (&'a FrontendKey, Vec<Elem>)> + 'a {
        fam.frontends().map(|(svc, frontend)| {
            (
                &frontend.key,
                elems(
                    svc,
                    self.port_hash(svc),
                    &frontend.key,
                    self.localhost_rejects(),
                    self.chainless,
                ),
            )
        })
    }

    /// The hash naming a service port's objects: its fragment's, or (a port with
    /// no fragment yet) computed.
    pub(super) fn port_hash(&self, svc: &ServiceIntent) -> u64 {
        match self.entries.get(&svc.name) {
            Some(f) => f.hash,
            None => service_port_hash(svc.family, &svc.name),
        }
    }

    /// `AddTable`, and the declarations of the shared sets and maps and of the
    /// endpoint maps (without elements).
    pub(super) fn declarations(&self, shared: &Ruleset, out: &mut dyn FnMut(Op)) {
        let f = self.family;
        out(Op::AddTable { family: f });
        for (name, set) in &shared.sets {
            out(add_set(f, name, set));
        }
        for (name, map) in &shared.maps {
            out(add_map(f, name, map));
        }
        for (name, protocol) in self.endpoint_maps.iter() {
            out(add_map(f, name, &endpoint_map_decl(f, protocol)));
        }
    }

    /// A fragment's endpoint map elements.
    pub(super) fn dnat_ops(&self, frag: &Fragment, out: &mut dyn FnMut(Op)) {
        if frag.uses_endpoint_map() {
            let map = frag.endpoint_map();
            frag.dnat_elements(|k, ep| {
                out(add_element(
                    self.family,
                    &map,
                    vec![Atom::Num(k)],
                    Some(ElemValue::Data(dnat_value(ep))),
                ))
            });
        }
    }

    /// The whole table block, streamed: the shared objects, then each service
    /// port's objects in name order. Nothing but the output grows with the table.
    pub(super) fn write_table(&self, fam: &FamilyIntent, out: &mut String) -> usize {
        let Some(node) = &self.node else {
            return 0;
        };
        write_table_open(out, self.family);
        let shared = self.base_with_elements(node, fam);
        let mut chains = shared.chains.len();
        shared.write_body(out);
        for (name, protocol) in self.endpoint_maps.iter() {
            write_map(out, name, &endpoint_map_decl(self.family, protocol));
        }
        for frag in self.entries.values() {
            let objs = frag.objects(self.detect.as_ref());
            chains += objs.chains.len();
            objs.write_body(out);
        }
        write_table_close(out);
        // The endpoint maps' elements after the rules using them: the kernel
        // checks a new rule against every element of its map, and a new element
        // against every rule using its map (see `base::ENDPOINT_MAP_SHARDS`).
        // Streamed: no element is held as text but in `out`.
        let family = self.family;
        for (name, frags) in self.fragments_by_endpoint_map() {
            let mut statement = ElementStatement::new(out, family, &name);
            for frag in frags {
                frag.dnat_elements(|k, ep| statement.push(&[Atom::Num(k)], &dnat_value(ep)));
            }
            statement.finish();
        }
        // The same for the cluster IP maps, one statement per map.
        for protocol in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
            let name = clusterip_dnat_map(protocol);
            let mut statement = ElementStatement::new(out, family, &name);
            self.cluster_elems(fam, &mut |_| {}, &mut |e| {
                if e.set == name {
                    statement.push(&e.key, e.value.as_deref().unwrap_or_default());
                }
            });
            statement.finish();
        }
        chains
    }

    /// Each endpoint map in use with its elements (key, value).
    fn endpoint_map_elements(&self) -> BTreeMap<String, Vec<(String, String)>> {
        let mut maps: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        for frag in self.entries.values().filter(|f| f.uses_endpoint_map()) {
            let elements = maps.entry(frag.endpoint_map()).or_default();
            frag.dnat_elements(|k, ep| {
                elements.push((k.to_string(), concat_text(&dnat_value(ep))))
            });
        }
        maps
    }

    /// The `pod-cidrs` elements, when the table has that set: `Err` when they
    /// have no typed form (overlapping prefixes, which `nft` refuses).
    pub(super) fn pod_cidrs(&self) -> Result<Option<Op>, ()> {
        let Some(node) = &self.node else {
            return Ok(None);
        };
        match &node.local_traffic {
            Some(LocalTraffic::Cidrs(nets)) if nets.len() > 1 => Ok(Some(Op::AddIntervals {
                family: self.family,
                set: POD_CIDRS_SET.to_string(),
                nets: disjoint_prefixes(nets).ok_or(())?,
            })),
            _ => Ok(None),
        }
    }

    /// The whole table as typed statements (what [`FamilyState::write_table`]
    /// writes as text), in an order in which every reference resolves: the
    /// declarations of every set, map and chain, the elements of the shared sets
    /// and verdict maps, every rule, and last the endpoint maps' elements (see
    /// there). Only when [`FamilyState::pod_cidrs`] is not `Err`.
    pub(super) fn table_ops(&self, fam: &FamilyIntent, out: &mut dyn FnMut(Op)) {
        let Some(node) = &self.node else {
            return;
        };
        let f = self.family;
        let shared = self.skeleton(node);
        let pod_cidrs = self.pod_cidrs().ok().flatten();
        self.declarations(&shared, out);
        let mut rules = Vec::new();
        // Each chain declared now, its rules kept for after the elements.
        let mut chains = |out: &mut dyn FnMut(Op), objs: Ruleset| {
            for (name, chain) in objs.chains {
                out(add_chain(f, &name, &chain));
                rules.extend(chain.rules.into_iter().map(|rule| Op::AddRule {
                    family: f,
                    chain: name.clone(),
                    rule,
                }));
            }
        };
        chains(out, shared);
        // Map by map (see `staged_table_ops`).
        let by_map = self.fragments_by_endpoint_map();
        let unmapped = self.entries.values().filter(|f| !f.uses_endpoint_map());
        for frag in by_map.values().flatten().copied().chain(unmapped) {
            let objs = frag.objects(self.detect.as_ref());
            for (name, set) in &objs.sets {
                out(add_set(f, name, set));
            }
            chains(out, objs);
        }
        let elem = |set: &str, key, value| add_element(f, set, key, value);
        if let Some(op) = pod_cidrs {
            out(op);
        }
        for ip in fam.cluster_ips() {
            out(elem(CLUSTER_IPS_SET, vec![Atom::Ip(ip)], None));
        }
        if let NodePortDestinations::Ips(ips) = &node.nodeports {
            for ip in ips {
                out(elem(NODEPORT_IPS_SET, vec![Atom::Ip(*ip)], None));
            }
        }
        for ip in self.hairpin.keys() {
            out(elem(HAIRPIN_SET, hairpin_elem(*ip), None));
        }
        for (key, elems) in self.frontend_elems(fam) {
            for e in elems {
                out(elem(
                    e.map.name(),
                    key_atoms(key),
                    Some(ElemValue::Verdict(e.verdict.elem())),
                ));
            }
        }
        self.cluster_elems(fam, &mut |e| out(data_elem(f, e)), &mut |_| {});
        for rule in rules {
            out(rule);
        }
        for frag in by_map.into_values().flatten() {
            self.dnat_ops(frag, out);
        }
        self.cluster_elems(fam, &mut |_| {}, &mut |e| out(data_elem(f, e)));
    }

    /// The fragments that use an endpoint map, by map.
    pub(super) fn fragments_by_endpoint_map(&self) -> BTreeMap<String, Vec<&Fragment>> {
        let mut by_map: BTreeMap<String, Vec<&Fragment>> = BTreeMap::new();
        for frag in self.entries.values().filter(|f| f.uses_endpoint_map()) {
            by_map.entry(frag.endpoint_map()).or_default().push(frag);
        }
        by_map
    }

    /// The whole desired table as one typed ruleset.
    pub(super) fn ruleset(&self, fam: &FamilyIntent) -> Option<Ruleset> {
        let node = self.node.as_ref()?;
        let mut rs = self.base_with_elements(node, fam);
        for frag in self.entries.values() {
            rs.extend(frag.objects(self.detect.as_ref()));
        }
        self.cluster_elems(fam, &mut |_| {}, &mut |e| {
            if let Some(map) = rs.maps.get_mut(&e.set) {
                let value = concat_text(e.value.as_deref().unwrap_or_default());
                map.elements.push((concat_text(&e.key), value));
            }
        });
        let mut elements = self.endpoint_map_elements();
        for (name, protocol) in self.endpoint_maps.iter() {
            rs.maps.insert(
                name.clone(),
                Map {
                    elements: elements.remove(name).unwrap_or_default(),
                    ..endpoint_map_decl(self.family, protocol)
                },
            );
        }
        Some(rs)
    }

    pub(super) fn names(&self) -> Names {
        let mut names = Names::default();
        let Some(node) = &self.node else {
            return names;
        };
        let shared = base_ruleset(node);
        names.chains.extend(shared.chains.into_keys());
        names.sets.extend(
            shared
                .sets
                .into_iter()
                .map(|(n, s)| (n, s.timeout.is_some())),
        );
        names.maps.extend(shared.maps.into_keys());
        names.maps.extend(self.endpoint_maps.keys().cloned());
        for &(protocol, n) in &self.cluster_rules {
            names.sets.insert(clusterip_set(protocol, n), false);
        }
        for frag in self.entries.values() {
            let (chains, sets) = frag.object_names();
            names.chains.extend(chains);
            names.sets.extend(sets.into_iter().map(|s| (s, true)));
        }
        names
    }
}

/// One `add element F svcproxy MAP { KEY : VALUE, ... }` statement, written as its
/// elements come; nothing when none came.
struct ElementStatement<'a> {
    out: &'a mut String,
    family: IpFamily,
    map: &'a str,
    first: bool,
}

impl<'a> ElementStatement<'a> {
    fn new(out: &'a mut String, family: IpFamily, map: &'a str) -> Self {
        ElementStatement {
            out,
            family,
            map,
            first: true,
        }
    }

    fn push(&mut self, key: &[Atom], value: &[Atom]) {
        if self.first {
            let _ = write!(
                self.out,
                "add element {} {TABLE_NAME} {} {{ ",
                family_keyword(self.family),
                self.map
            );
            self.first = false;
        } else {
            self.out.push_str(", ");
        }
        concat(self.out, key);
        self.out.push_str(" : ");
        concat(self.out, value);
    }

    fn finish(self) {
        if !self.first {
            self.out.push_str(" }\n");
        }
    }
}
