//! The cluster as svcproxy knows it, fed by sources and read as node snapshots.
//!
//! Entry point: [`ClusterState`]. Sources call [`ClusterState::apply`] with
//! [`SourceUpdate`]s; each object is validated and converted once, its problems logged
//! and counted, and the converted value recorded in a [`Tracker`]. The sync runner
//! calls [`ClusterState::snapshot`], which rebuilds only the views of services whose
//! Service, slices or relevant Nodes changed and says which service ports moved.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use smallvec::SmallVec;

use crate::convert::{self, ConvertOptions, Slice};
use crate::model::*;
use crate::objects::{Kind, KubeObject, ObjectKey, SourceUpdate};
use crate::problem::{InputProblem, Problem, Severity};
use crate::selection::{select_endpoints, NodeContext};
use crate::snapshot::{NodeSnapshot, ServicePortView};
use crate::tracker::Tracker;

#[derive(Clone, Debug, Default)]
pub struct StateConfig {
    /// This node's name: the Node whose labels define locality and whose endpoints
    /// are local.
    pub node_name: String,
    /// `--service-proxy-name`.
    pub service_proxy_name: Option<String>,
    /// Services' `spec.externalIPs` are not served (the `AllowServiceExternalIPs`
    /// feature gate off, as kube-proxy 1.37).
    pub ignore_external_ips: bool,
    /// The cluster DNS reads this state too: the Services the proxy leaves alone
    /// (headless, ExternalName, other proxies'), their slices, and Pods are kept,
    /// and what changes is noted for [`ClusterState::take_model_changes`].
    pub dns: bool,
    /// Nothing reads node snapshots (`svcproxy dns`): [`ClusterState::snapshot`]
    /// only forgets the changes and returns empty ones.
    pub without_snapshots: bool,
}

/// What changed in the model since the last [`ClusterState::take_model_changes`]
/// (kept only for the cluster DNS: [`StateConfig::dns`]): names to read again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelChanges {
    /// Services whose Service or slices changed.
    pub services: BTreeSet<ServiceName>,
    pub nodes: BTreeSet<String>,
    /// Pods by namespace and name.
    pub pods: BTreeSet<(Arc<str>, Arc<str>)>,
}

impl ModelChanges {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && self.nodes.is_empty() && self.pods.is_empty()
    }
}

/// A slice's namespace and name.
type SliceKey = (Arc<str>, Arc<str>);

/// The result of [`ClusterState::snapshot`].
#[derive(Clone, Debug)]
pub struct SnapshotUpdate {
    pub v4: Arc<NodeSnapshot>,
    pub v6: Arc<NodeSnapshot>,
    /// Service ports (either family) whose view was added, removed or changed.
    pub changed: BTreeSet<ServicePortName>,
    /// Changed Services and EndpointSlices consumed by this snapshot.
    pub service_changes: usize,
    pub endpoint_changes: usize,
    /// The `last-change-trigger-time` of each consumed slice change, with the
    /// slice's address family.
    pub trigger_times: Vec<(IpFamily, String)>,
}

impl SnapshotUpdate {
    pub fn family(&self, family: IpFamily) -> &Arc<NodeSnapshot> {
        match family {
            IpFamily::V4 => &self.v4,
            IpFamily::V6 => &self.v6,
        }
    }
}

pub struct ClusterState {
    config: StateConfig,
    opts: ConvertOptions,
    services: Tracker<ServiceName, Service>,
    slices: Tracker<SliceKey, Slice>,
    /// Slice names per service, from the current slices. Sorted; almost every
    /// service has one slice per family, held inline.
    slices_by_service: HashMap<ServiceName, SmallVec<[Arc<str>; 1]>>,
    nodes: Tracker<String, NodeInfo>,
    service_cidrs: Tracker<String, Vec<IpNet>>,
    /// Slices mirrored from each legacy Endpoints object.
    mirrored: HashMap<ObjectKey, Vec<ObjectKey>>,
    /// Problems of the objects currently held, by object (for reports).
    problems: BTreeMap<ObjectKey, Vec<Problem>>,
    /// Slice ports that match no port of their service, by slice: found when the
    /// service is re-evaluated, reported only when they change.
    unmatched_ports: BTreeMap<ObjectKey, Vec<Problem>>,
    /// Invalid objects and fields seen, by kind (a metric).
    invalid_counts: BTreeMap<Kind, u64>,
    last: Option<(Arc<NodeSnapshot>, Arc<NodeSnapshot>)>,
    /// This host's own addresses per family (sorted, deduplicated), from the latest
    /// [`SourceUpdate::HostAddresses`].
    host_ips: [Arc<[IpAddr]>; 2],
    /// What the source could not read, from the latest
    /// [`SourceUpdate::InputProblems`].
    input_problems: Vec<InputProblem>,
    /// Endpoint infos (and the names in them), interned.
    interned: Interner,
    /// Pods by namespace and name (the cluster DNS's only).
    pods: HashMap<(Arc<str>, Arc<str>), Arc<PodInfo>>,
    /// `Some` when the cluster DNS reads the state.
    model_changes: Option<ModelChanges>,
}

/// Interned endpoint infos and node labels: endpoints differ by address, but all the
/// endpoints on one node with the same conditions and hints say the same thing about
/// it, so 100k endpoints on 5k nodes hold about 5k infos and 5k node-name strings;
/// and Nodes share their label keys and most values.
#[derive(Default)]
struct Interner {
    names: HashSet<Arc<str>>,
    infos: HashSet<Arc<EndpointInfo>>,
    /// Sizes after the last [`Interner::prune`].
    kept: usize,
}

impl Interner {
    fn name(&mut self, name: &mut Arc<str>) {
        match self.names.get(&**name) {
            Some(shared) => *name = shared.clone(),
            None => {
                self.names.insert(name.clone());
            }
        }
    }

    fn info(&mut self, info: &mut Arc<EndpointInfo>) {
        if let Some(shared) = self.infos.get(info) {
            *info = shared.clone();
            return;
        }
        if let Some(fresh) = Arc::get_mut(info) {
            for name in fresh.node_name.iter_mut().chain(fresh.zone.iter_mut()) {
                self.name(name);
            }
            for name in fresh
                .zone_hints
                .iter_mut()
                .chain(fresh.node_hints.iter_mut())
            {
                self.name(name);
            }
        }
        self.infos.insert(info.clone());
    }

    fn labels(&mut self, labels: &mut Labels) {
        *labels = std::mem::take(labels)
            .into_iter()
            .map(|(mut k, mut v)| {
                self.name(&mut k);
                self.name(&mut v);
                (k, v)
            })
            .collect();
    }

    /// Forgets what no endpoint or Node uses any more, once the sets have doubled.
    fn prune(&mut self) {
        if self.names.len() + self.infos.len() > 2 * self.kept + 1024 {
            self.infos.retain(|i| Arc::strong_count(i) > 1);
            self.names.retain(|n| Arc::strong_count(n) > 1);
            self.kept = self.names.len() + self.infos.len();
        }
    }
}

impl ClusterState {
    pub fn new(config: StateConfig) -> Self {
        ClusterState {
            opts: ConvertOptions {
                service_proxy_name: config.service_proxy_name.clone(),
                keep_unproxied: config.dns,
                ignore_external_ips: config.ignore_external_ips,
            },
            model_changes: config.dns.then(ModelChanges::default),
            config,
            services: Tracker::default(),
            slices: Tracker::default(),
            slices_by_service: HashMap::new(),
            nodes: Tracker::default(),
            service_cidrs: Tracker::default(),
            mirrored: HashMap::new(),
            problems: BTreeMap::new(),
            unmatched_ports: BTreeMap::new(),
            invalid_counts: BTreeMap::new(),
            last: None,
            host_ips: [Arc::from([]), Arc::from([])],
            input_problems: Vec::new(),
            interned: Interner::default(),
            pods: HashMap::new(),
        }
    }

    pub fn node_name(&self) -> &str {
        &self.config.node_name
    }

    /// Applies one update from a source.
    pub fn apply(&mut self, update: SourceUpdate) {
        match update {
            SourceUpdate::Upsert { object, origin } => self.upsert(&object, Some(&origin)),
            SourceUpdate::Delete(key) => self.delete(&key),
            SourceUpdate::Replace { kinds, objects } => {
                let incoming: HashSet<ObjectKey> = objects.iter().map(|(o, _)| o.key()).collect();
                for key in self.keys_of(&kinds) {
                    if !incoming.contains(&key) {
                        self.delete(&key);
                    }
                }
                for (object, origin) in objects {
                    if kinds.contains(&object.kind()) {
                        self.upsert(&object, Some(&origin));
                    }
                }
            }
            SourceUpdate::HostAddresses(mut ips) => {
                ips.sort();
                ips.dedup();
                for (slot, family) in self.host_ips.iter_mut().zip([IpFamily::V4, IpFamily::V6]) {
                    let of_family: Vec<IpAddr> = ips
                        .iter()
                        .copied()
                        .filter(|ip| IpFamily::of(ip) == family)
                        .collect();
                    if **slot != *of_family {
                        *slot = Arc::from(of_family);
                    }
                }
            }
            SourceUpdate::InputProblems(problems) => self.input_problems = problems,
        }
    }

    fn keys_of(&self, kinds: &[Kind]) -> Vec<ObjectKey> {
        let mut keys = Vec::new();
        for kind in kinds {
            match kind {
                Kind::Service => keys.extend(
                    self.services
                        .keys()
                        .map(|k| ObjectKey::new(Kind::Service, &k.namespace, &k.name)),
                ),
                Kind::EndpointSlice => {
                    // Slices mirrored from Endpoints belong to their Endpoints object:
                    // a re-list of slices alone must not remove them.
                    let mirrored: HashSet<&ObjectKey> = self.mirrored.values().flatten().collect();
                    keys.extend(
                        self.slices
                            .keys()
                            .map(|(ns, n)| ObjectKey::new(Kind::EndpointSlice, ns, n))
                            .filter(|k| !mirrored.contains(k)),
                    )
                }
                Kind::Node => {
                    keys.extend(self.nodes.keys().map(|n| ObjectKey::new(Kind::Node, "", n)))
                }
                Kind::ServiceCidr => keys.extend(
                    self.service_cidrs
                        .keys()
                        .map(|n| ObjectKey::new(Kind::ServiceCidr, "", n)),
                ),
                Kind::Endpoints => keys.extend(self.mirrored.keys().cloned()),
                Kind::Pod => keys.extend(
                    self.pods
                        .keys()
                        .map(|(ns, n)| ObjectKey::new(Kind::Pod, ns, n)),
                ),
            }
        }
        // Objects that were rejected are still "held" for Replace purposes.
        let mirrored: HashSet<&ObjectKey> = self.mirrored.values().flatten().collect();
        keys.extend(
            self.problems
                .keys()
                .filter(|k| kinds.contains(&k.kind) && !mirrored.contains(k))
                .cloned(),
        );
        keys.sort();
        keys.dedup();
        keys
    }

    fn upsert(&mut self, object: &KubeObject, origin: Option<&str>) {
        let key = object.key();
        let mut problems = Vec::new();
        match object {
            KubeObject::Service(svc) => {
                let converted = convert::convert_service(svc, &self.opts, &mut problems);
                // The key shares the service's own name (and its ports' names).
                let name = converted
                    .as_ref()
                    .map(|s| s.name.clone())
                    .unwrap_or_else(|| ServiceName::new(&key.namespace, &key.name));
                self.note_service(&name);
                self.services.set(name, converted.map(Arc::new));
            }
            KubeObject::EndpointSlice(slice) => {
                let converted = convert::convert_slice_with(slice, &self.opts, &mut problems);
                self.set_slice(slice_key(&key), converted);
            }
            KubeObject::Node(node) => {
                let converted = convert::convert_node(node, &mut problems).map(|mut n| {
                    self.interned.labels(&mut n.labels);
                    Arc::new(n)
                });
                self.note_node(&key.name);
                self.nodes.set(key.name.clone(), converted);
            }
            KubeObject::ServiceCidr(cidr) => {
                let converted = convert::convert_service_cidr(cidr, &mut problems);
                self.service_cidrs
                    .set(key.name.clone(), converted.map(Arc::new));
            }
            KubeObject::Endpoints(ep) => {
                let mirrored = crate::mirror::endpoints_to_slices(ep);
                for p in mirrored.problems {
                    problems.push(Problem::new(&key, Severity::Ignored, "subsets", p));
                }
                let new_keys: Vec<ObjectKey> = mirrored
                    .slices
                    .iter()
                    .map(|s| KubeObject::EndpointSlice(s.clone()).key())
                    .collect();
                for old in self.mirrored.remove(&key).unwrap_or_default() {
                    if !new_keys.contains(&old) {
                        self.delete(&old);
                    }
                }
                for slice in mirrored.slices {
                    self.upsert(&KubeObject::EndpointSlice(slice), origin);
                }
                self.mirrored.insert(key.clone(), new_keys);
            }
            // Only the cluster DNS reads Pods.
            KubeObject::Pod(_) if self.model_changes.is_none() => return,
            KubeObject::Pod(pod) => {
                let id = pod_key(&key);
                match convert::convert_pod(pod, &mut problems) {
                    Some(info) => self.pods.insert(id.clone(), Arc::new(info)),
                    None => self.pods.remove(&id),
                };
                if let Some(changes) = &mut self.model_changes {
                    changes.pods.insert(id);
                }
            }
        }
        self.record_problems(key, origin, problems);
    }

    fn delete(&mut self, key: &ObjectKey) {
        match key.kind {
            Kind::Service => {
                let name = ServiceName::new(&key.namespace, &key.name);
                self.note_service(&name);
                self.services.set(name, None);
            }
            Kind::EndpointSlice => self.set_slice(slice_key(key), None),
            Kind::Node => {
                self.note_node(&key.name);
                self.nodes.set(key.name.clone(), None);
            }
            Kind::ServiceCidr => {
                self.service_cidrs.set(key.name.clone(), None);
            }
            Kind::Endpoints => {
                for old in self.mirrored.remove(key).unwrap_or_default() {
                    self.delete(&old);
                }
            }
            Kind::Pod => {
                let id = pod_key(key);
                if self.pods.remove(&id).is_some() {
                    if let Some(changes) = &mut self.model_changes {
                        changes.pods.insert(id);
                    }
                }
            }
        }
        self.problems.remove(key);
        self.unmatched_ports.remove(key);
    }

    fn set_slice(&mut self, key: SliceKey, mut slice: Option<Slice>) {
        if let Some(s) = &mut slice {
            for e in s.endpoints.iter_mut() {
                self.interned.info(&mut e.info);
            }
            // Share the names the state already holds: the service's (from the
            // Service, or another slice of it), the slice's own (its key), and
            // the port names every slice repeats.
            let known = self
                .services
                .get_key_value(&s.service)
                .map(|(k, _)| k)
                .or_else(|| {
                    self.slices_by_service
                        .get_key_value(&s.service)
                        .map(|(k, _)| k)
                });
            if let Some(k) = known {
                s.service = k.clone();
            }
            s.name = key.1.clone();
            for p in s.ports.iter_mut() {
                self.interned.name(&mut p.name);
            }
        }
        if let Some(changes) = &mut self.model_changes {
            let old = self.slices.get(&key).map(|s| s.service.clone());
            let new = slice.as_ref().map(|s| s.service.clone());
            changes.services.extend(old.into_iter().chain(new));
        }
        if let Some(old) = self.slices.get(&key) {
            let svc = old.service.clone();
            if let Some(names) = self.slices_by_service.get_mut(&svc) {
                names.retain(|n| *n != key.1);
                if names.is_empty() {
                    self.slices_by_service.remove(&svc);
                }
            }
        }
        if let Some(new) = &slice {
            let names = self
                .slices_by_service
                .entry(new.service.clone())
                .or_default();
            if let Err(at) = names.binary_search(&key.1) {
                names.insert(at, key.1.clone());
            }
        }
        self.slices.set(key, slice.map(Arc::new));
    }

    fn record_problems(
        &mut self,
        key: ObjectKey,
        origin: Option<&str>,
        mut problems: Vec<Problem>,
    ) {
        for p in &mut problems {
            p.origin = origin.map(str::to_string);
        }
        if problems.is_empty() {
            self.problems.remove(&key);
            return;
        }
        // The same object re-sent unchanged (a re-list, a rescan) is not news.
        if self.problems.get(&key) == Some(&problems) {
            return;
        }
        for p in &problems {
            log_problem(p);
            if p.severity != Severity::Warning {
                *self.invalid_counts.entry(p.object.kind).or_default() += 1;
            }
        }
        self.problems.insert(key, problems);
    }

    fn note_service(&mut self, name: &ServiceName) {
        if let Some(changes) = &mut self.model_changes {
            changes.services.insert(name.clone());
        }
    }

    fn note_node(&mut self, name: &str) {
        if let Some(changes) = &mut self.model_changes {
            changes.nodes.insert(name.to_string());
        }
    }

    /// What changed in the model since the last call (always empty unless
    /// [`StateConfig::dns`]): the cluster DNS reads those names again.
    pub fn take_model_changes(&mut self) -> ModelChanges {
        self.model_changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// A Service as converted (proxied or not), by name.
    pub fn service(&self, name: &ServiceName) -> Option<&Arc<Service>> {
        self.services.get(name)
    }

    /// The slices of a service (whether or not the Service exists), by name.
    pub fn slices_of<'a>(&'a self, name: &'a ServiceName) -> impl Iterator<Item = &'a Arc<Slice>> {
        self.slices_by_service
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(move |n| self.slices.get(&(name.namespace.clone(), n.clone())))
    }

    /// A Node, by name.
    pub fn node(&self, name: &str) -> Option<&Arc<NodeInfo>> {
        self.nodes.get(name)
    }

    /// A Pod (kept only for the cluster DNS), by namespace and name (as
    /// [`ModelChanges::pods`] names it).
    pub fn pod(&self, key: &(Arc<str>, Arc<str>)) -> Option<&Arc<PodInfo>> {
        self.pods.get(key)
    }

    /// Problems of the objects currently held, by object.
    pub fn problems(&self) -> BTreeMap<ObjectKey, Vec<Problem>> {
        let mut all = self.problems.clone();
        for (k, v) in &self.unmatched_ports {
            all.entry(k.clone()).or_default().extend(v.iter().cloned());
        }
        all
    }

    /// Input the source could not read as objects (see [`InputProblem`]).
    pub fn input_problems(&self) -> &[InputProblem] {
        &self.input_problems
    }

    /// Whether the input has errors: an object or a field rejected or ignored, or
    /// input that could not be read (warnings do not count).
    pub fn has_input_errors(&self) -> bool {
        !self.input_problems.is_empty()
            || self
                .problems()
                .values()
                .flatten()
                .any(|p| p.severity != Severity::Warning)
    }

    /// Invalid objects and fields seen since start, by kind.
    pub fn invalid_counts(&self) -> &BTreeMap<Kind, u64> {
        &self.invalid_counts
    }

    /// Services and slices changed since the last snapshot.
    pub fn pending_changes(&self) -> (usize, usize) {
        (self.services.pending(), self.slices.pending())
    }

    /// This node's Node object, if known.
    pub fn own_node(&self) -> Option<&Arc<NodeInfo>> {
        self.nodes.get(&self.config.node_name)
    }

    /// Builds this node's snapshots from everything applied so far, reusing the views
    /// of services that did not change since the previous call.
    pub fn snapshot(&mut self) -> SnapshotUpdate {
        let service_changes = self.services.take_changes();
        let slice_changes = self.slices.take_changes();
        let node_changes = self.nodes.take_changes();
        self.service_cidrs.take_changes();
        self.interned.prune();
        if self.config.without_snapshots {
            let empty = |family| Arc::new(NodeSnapshot::empty(&self.config.node_name, family));
            return SnapshotUpdate {
                v4: empty(IpFamily::V4),
                v6: empty(IpFamily::V6),
                changed: BTreeSet::new(),
                service_changes: service_changes.len(),
                endpoint_changes: slice_changes.len(),
                trigger_times: Vec::new(),
            };
        }

        let mut trigger_times = Vec::new();
        // Gathered, then sorted once: at a cold start every name comes up two or
        // three times (its Service, its slices, the full rebuild), and an insert
        // into an ordered set per mention compared names far more often.
        let mut names: Vec<ServiceName> = service_changes.iter().map(|c| c.key.clone()).collect();
        for c in &slice_changes {
            for s in c.previous.iter().chain(c.current.iter()) {
                names.push(s.service.clone());
            }
            if let Some(slice) = &c.current {
                if let Some(t) = &slice.last_change_trigger_time {
                    trigger_times.push((slice.family, t.clone()));
                }
            }
        }
        let full =
            self.last.is_none() || node_changes.iter().any(|c| c.key == self.config.node_name);
        if full {
            names.extend(self.services.keys().cloned());
        }
        names.sort_unstable();
        names.dedup();
        // From sorted input an ordered set is built in one pass.
        let mut affected: BTreeSet<ServiceName> = names.into_iter().collect();
        if !full
            && node_changes.iter().any(|c| {
                c.previous.as_ref().map(|n| &n.labels) != c.current.as_ref().map(|n| &n.labels)
            })
        {
            // Other nodes' labels only matter to services with topology keys.
            affected.extend(
                self.services
                    .iter()
                    .filter(|(_, s)| s.ports.iter().any(|p| p.topology_keys.is_some()))
                    .map(|(k, _)| k.clone()),
            );
        }
        self.warn_unmatched_slice_ports(&affected);

        // Gathered as built, in name order per family, and made a set once.
        let mut changed = Vec::new();
        let (prev_v4, prev_v6) = match &self.last {
            Some((a, b)) => (Some(a.clone()), Some(b.clone())),
            None => (None, None),
        };
        let v4 =
            Arc::new(self.build_family(IpFamily::V4, prev_v4.as_deref(), &affected, &mut changed));
        let v6 =
            Arc::new(self.build_family(IpFamily::V6, prev_v6.as_deref(), &affected, &mut changed));
        self.last = Some((v4.clone(), v6.clone()));
        SnapshotUpdate {
            v4,
            v6,
            changed: changed.into_iter().collect(),
            service_changes: service_changes.len(),
            endpoint_changes: slice_changes.len(),
            trigger_times,
        }
    }

    fn build_family(
        &self,
        family: IpFamily,
        previous: Option<&NodeSnapshot>,
        affected: &BTreeSet<ServiceName>,
        changed: &mut Vec<ServicePortName>,
    ) -> NodeSnapshot {
        let mut ports = previous
            .map(|p| p.service_ports.clone())
            .unwrap_or_default();
        let empty = BTreeMap::new();
        let own = self.nodes.get(&self.config.node_name);
        let node_labels = |name: &str| self.nodes.get(name).map(|n| &n.labels);
        let ctx = NodeContext {
            node_name: &self.config.node_name,
            labels: own.map(|n| &n.labels).unwrap_or(&empty),
            node_labels: &node_labels,
        };
        for svc_name in affected {
            let old: Vec<ServicePortName> = ports
                .range_from(&port_range_start(svc_name))
                .take_while(|(k, _)| &k.service == svc_name)
                .map(|(k, _)| k.clone())
                .collect();
            let mut old_views: HashMap<ServicePortName, Arc<ServicePortView>> = old
                .into_iter()
                .filter_map(|k| ports.remove(&k).map(|v| (k, v)))
                .collect();
            // Services kept for the cluster DNS only have no view.
            if let Some(svc) = self.services.get(svc_name).filter(|s| s.proxied()) {
                for port in &svc.ports {
                    let Some(narrowed) = ServicePort::shared_for_family(port, family) else {
                        continue;
                    };
                    let endpoints = self.endpoints_for(&narrowed, family);
                    let selection = select_endpoints(&narrowed, &endpoints, &ctx);
                    let view = ServicePortView {
                        port: narrowed,
                        endpoints,
                        selection,
                    };
                    let view = match old_views.remove(&port.name) {
                        Some(old) if *old == view => old,
                        _ => {
                            changed.push(port.name.clone());
                            Arc::new(view)
                        }
                    };
                    ports.insert(port.name.clone(), view);
                }
            }
            changed.extend(old_views.into_keys());
        }
        let mut service_cidrs: Vec<IpNet> = self
            .service_cidrs
            .iter()
            .flat_map(|(_, c)| c.iter().copied())
            .filter(|n| IpFamily::of_net(n) == family)
            .collect();
        service_cidrs.sort();
        service_cidrs.dedup();
        NodeSnapshot {
            node_name: self.config.node_name.clone(),
            family,
            node: own.cloned(),
            host_ips: self.host_ips[family.index()].clone(),
            service_cidrs,
            service_ports: ports,
        }
    }

    /// The endpoints of one service port in one family: every slice of the service of
    /// that family contributes the endpoints of its port with the same name and
    /// protocol, at that slice's port number. The same address and port listed twice
    /// counts once (the local copy wins, as upstream).
    fn endpoints_for(&self, port: &ServicePort, family: IpFamily) -> Arc<[Endpoint]> {
        let svc = &port.name.service;
        let mut by_addr: BTreeMap<(std::net::IpAddr, u16), Endpoint> = BTreeMap::new();
        for slice_name in self.slices_by_service.get(svc).into_iter().flatten() {
            let Some(slice) = self
                .slices
                .get(&(svc.namespace.clone(), slice_name.clone()))
            else {
                continue;
            };
            if slice.family != family {
                continue;
            }
            let Some(sp) = slice
                .ports
                .iter()
                .find(|p| *p.name == *port.name.port && p.protocol == port.name.protocol)
            else {
                continue;
            };
            for e in &slice.endpoints {
                let ep = Endpoint {
                    ip: e.ip,
                    port: sp.port,
                    info: e.info.clone(),
                };
                let local = ep.node_name.as_deref() == Some(self.config.node_name.as_str());
                match by_addr.entry((ep.ip, ep.port)) {
                    std::collections::btree_map::Entry::Vacant(v) => {
                        v.insert(ep);
                    }
                    std::collections::btree_map::Entry::Occupied(mut o) => {
                        if local {
                            o.insert(ep);
                        }
                    }
                }
            }
        }
        by_addr.into_values().collect()
    }

    /// A slice port that names no port of its (existing) service is a mistake worth
    /// saying once: re-checked when the service is re-evaluated, reported and counted
    /// only when the list for a slice changes.
    fn warn_unmatched_slice_ports(&mut self, affected: &BTreeSet<ServiceName>) {
        for svc_name in affected {
            let svc = self.services.get(svc_name).filter(|s| s.proxied()).cloned();
            let slice_names: Vec<Arc<str>> = self
                .slices_by_service
                .get(svc_name)
                .into_iter()
                .flatten()
                .cloned()
                .collect();
            for slice_name in slice_names {
                let key = ObjectKey::new(Kind::EndpointSlice, &svc_name.namespace, &slice_name);
                let mut found = Vec::new();
                if let (Some(svc), Some(slice)) = (
                    svc.as_ref(),
                    self.slices
                        .get(&(svc_name.namespace.clone(), slice_name.clone())),
                ) {
                    for (i, sp) in slice.ports.iter().enumerate() {
                        let matched = svc
                            .ports
                            .iter()
                            .any(|p| *p.name.port == *sp.name && p.name.protocol == sp.protocol);
                        if !matched {
                            found.push(Problem::new(
                                &key,
                                Severity::Ignored,
                                format!("ports[{i}]"),
                                format!(
                                    "port {}/{} matches no port of service {svc_name}",
                                    crate::problem::quote(&sp.name),
                                    sp.protocol
                                ),
                            ));
                        }
                    }
                }
                if found.is_empty() {
                    self.unmatched_ports.remove(&key);
                    continue;
                }
                if self.unmatched_ports.get(&key) == Some(&found) {
                    continue;
                }
                for p in &found {
                    log_problem(p);
                    *self.invalid_counts.entry(Kind::EndpointSlice).or_default() += 1;
                }
                self.unmatched_ports.insert(key, found);
            }
        }
    }
}

fn pod_key(key: &ObjectKey) -> (Arc<str>, Arc<str>) {
    (key.namespace.as_str().into(), key.name.as_str().into())
}

fn slice_key(key: &ObjectKey) -> SliceKey {
    (key.namespace.as_str().into(), key.name.as_str().into())
}

fn port_range_start(svc: &ServiceName) -> ServicePortName {
    ServicePortName::new(svc.clone(), "", Protocol::Tcp)
}

fn log_problem(p: &Problem) {
    match p.severity {
        Severity::Rejected | Severity::Ignored => tracing::error!(
            kind = %p.object.kind,
            object = %p.object,
            origin = p.origin.as_deref().unwrap_or(""),
            field = %p.field,
            "{}",
            p
        ),
        Severity::Warning => tracing::warn!(
            kind = %p.object.kind,
            object = %p.object,
            origin = p.origin.as_deref().unwrap_or(""),
            field = %p.field,
            "{}",
            p
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(node: &str) -> Arc<EndpointInfo> {
        Arc::new(EndpointInfo {
            node_name: Some(node.into()),
            zone: Some("zone-a".into()),
            ready: true,
            serving: true,
            ..EndpointInfo::default()
        })
    }

    #[test]
    fn equal_infos_and_names_are_stored_once_and_forgotten_when_unused() {
        let mut interner = Interner::default();
        let (mut a, mut b, mut c) = (info("node-1"), info("node-1"), info("node-2"));
        interner.info(&mut a);
        interner.info(&mut b);
        interner.info(&mut c);
        assert!(Arc::ptr_eq(&a, &b));
        // Different infos still share the names they have in common.
        assert!(Arc::ptr_eq(
            a.zone.as_ref().unwrap(),
            c.zone.as_ref().unwrap()
        ));
        assert_eq!((interner.infos.len(), interner.names.len()), (2, 3));

        // Pruning waits until the sets have grown past twice what was kept (plus
        // 1024): `c` is unused but still held.
        drop(c);
        interner.prune();
        assert_eq!((interner.infos.len(), interner.names.len()), (2, 3));

        let mut churn: Vec<Arc<EndpointInfo>> = (0..1100).map(|i| info(&format!("n{i}"))).collect();
        churn.iter_mut().for_each(|i| interner.info(i));
        drop(churn);
        interner.prune();
        // What `a` (and `b`) hold is left: one info, node-1 and zone-a.
        assert_eq!((interner.infos.len(), interner.names.len()), (1, 2));
        assert_eq!(interner.kept, 3);
    }

    #[test]
    fn host_addresses_reach_each_familys_snapshot_and_are_replaced_whole() {
        let mut state = ClusterState::new(StateConfig {
            node_name: "node-a".into(),
            service_proxy_name: None,
            ignore_external_ips: false,
            dns: false,
            without_snapshots: false,
        });
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        state.apply(SourceUpdate::HostAddresses(vec![
            ip("fd00::1"),
            ip("10.0.0.2"),
            ip("127.0.0.1"),
            ip("10.0.0.2"),
        ]));
        let up = state.snapshot();
        assert_eq!(*up.v4.host_ips, [ip("10.0.0.2"), ip("127.0.0.1")]);
        assert_eq!(*up.v6.host_ips, [ip("fd00::1")]);
        state.apply(SourceUpdate::HostAddresses(vec![ip("10.0.0.3")]));
        let up = state.snapshot();
        assert_eq!(*up.v4.host_ips, [ip("10.0.0.3")]);
        assert!(up.v6.host_ips.is_empty());
    }
}
