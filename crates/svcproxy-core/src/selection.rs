//! Endpoint selection: the one function that decides which endpoints each kind of
//! traffic to a service port may reach from this node. Every data plane uses it.
//!
//! Entry point: [`select_endpoints`]. It follows upstream kube-proxy's
//! `CategorizeEndpoints` (readiness, serving-terminating fallback, Local traffic
//! policies, topology hints and `trafficDistribution`) and adds svcproxy's arbitrary
//! topology keys. Precedence: Local policies > topology keys > hints.

use std::sync::Arc;

use crate::model::{Endpoint, Labels, ServicePort, TopologyKey, LABEL_ZONE};

/// What this node knows about locality.
pub struct NodeContext<'a> {
    /// This node's name (`--hostname-override`).
    pub node_name: &'a str,
    /// This node's labels; empty when its Node object is unknown.
    pub labels: &'a Labels,
    /// Labels of any node by name; `None` for unknown nodes.
    pub node_labels: &'a dyn Fn(&str) -> Option<&'a Labels>,
}

/// The outcome of selection for one service port on one node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Selection {
    /// Endpoints cluster-policy traffic may reach; `None` when no traffic to this
    /// port uses the cluster policy on this node. Shares the port's list when it
    /// holds every endpoint (the usual case).
    pub cluster_endpoints: Option<Arc<[Endpoint]>>,
    /// Endpoints local-policy traffic may reach (this node's); `None` when no traffic
    /// to this port uses a Local policy.
    pub local_endpoints: Option<Arc<[Endpoint]>>,
    /// Usable (ready, or serving and terminating) endpoints exist anywhere: with none,
    /// traffic is rejected; with some but none local, Local-policy traffic is dropped.
    pub has_any_endpoints: bool,
    /// Which rule chose the endpoints, for people. Interned: the ports of a cluster
    /// mostly share a handful of reasons.
    pub reason: Arc<str>,
}

impl Selection {
    /// Every endpoint some traffic may reach (the union, deduplicated, sorted).
    pub fn all_reachable(&self) -> Vec<&Endpoint> {
        let mut all: Vec<&Endpoint> = self
            .cluster_endpoints
            .iter()
            .chain(self.local_endpoints.iter())
            .flat_map(|l| l.iter())
            .collect();
        all.sort_by_key(|e| (e.ip, e.port));
        all.dedup_by(|a, b| (a.ip, a.port) == (b.ip, b.port));
        all
    }
}

impl Endpoint {
    fn usable(&self) -> bool {
        self.ready || self.serving_terminating()
    }
}

/// Decides which endpoints serve cluster-wide and node-local traffic to `port` from
/// this node. `endpoints` are the port's endpoints of the port's family, sorted by
/// address and port; a selection of all of them shares the list.
pub fn select_endpoints(
    port: &ServicePort,
    endpoints: &Arc<[Endpoint]>,
    node: &NodeContext<'_>,
) -> Selection {
    let share = |picked: Vec<Endpoint>| -> Arc<[Endpoint]> {
        if *picked == **endpoints {
            endpoints.clone()
        } else {
            picked.into()
        }
    };
    let has_any_endpoints = endpoints.iter().any(|e| e.usable());
    let mut reasons = Vec::new();

    let cluster_endpoints = port.uses_cluster_endpoints().then(|| {
        let (eps, why) = match &port.topology_keys {
            Some(keys) => by_topology_keys(keys, endpoints, node),
            None => by_hints(port, endpoints, node),
        };
        reasons.push(format!("cluster: {why}"));
        share(eps)
    });

    let local_endpoints = port.uses_local_endpoints().then(|| {
        let local = |ep: &&Endpoint| ep.node_name.as_deref() == Some(node.node_name);
        let (eps, why) = ready_or_terminating(endpoints.iter().filter(local));
        reasons.push(format!("local: {why} on this node"));
        share(eps)
    });

    Selection {
        cluster_endpoints,
        local_endpoints,
        has_any_endpoints,
        reason: intern(reasons.join("; ")),
    }
}

/// Distinct reasons kept for sharing at most; past it a reason is its own copy.
/// The table only grows (by zone names, topology keys), so it is bounded.
const MAX_INTERNED: usize = 4096;

/// `reason` as an `Arc<str>` shared with every equal one before it.
fn intern(reason: String) -> Arc<str> {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static TABLE: OnceLock<Mutex<HashSet<Arc<str>>>> = OnceLock::new();
    let mut table = TABLE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(shared) = table.get(reason.as_str()) {
        return shared.clone();
    }
    let reason: Arc<str> = reason.into();
    if table.len() < MAX_INTERNED {
        table.insert(reason.clone());
    }
    reason
}

/// The ready endpoints among `candidates`; if none, the serving-terminating ones.
fn ready_or_terminating<'e>(
    candidates: impl Iterator<Item = &'e Endpoint> + Clone,
) -> (Vec<Endpoint>, &'static str) {
    let ready = collect(candidates.clone().filter(|e| e.ready));
    if !ready.is_empty() {
        return (ready, "ready endpoints");
    }
    let terminating = collect(candidates.filter(|e| e.serving_terminating()));
    if !terminating.is_empty() {
        return (
            terminating,
            "no ready endpoint, serving-terminating fallback",
        );
    }
    (Vec::new(), "no usable endpoint")
}

fn collect<'e>(it: impl Iterator<Item = &'e Endpoint>) -> Vec<Endpoint> {
    let mut v: Vec<Endpoint> = it.cloned().collect();
    v.sort_by_key(|e| (e.ip, e.port));
    v
}

/// Topology-aware hints: as upstream's `CategorizeEndpoints`, chosen from the ready
/// endpoints — node hints if every ready endpoint has one and one names this node,
/// else zone hints likewise, else none — whatever the service says: the EndpointSlice
/// controller only writes hints for services that asked (`trafficDistribution`, the
/// topology-mode annotation), so their presence on every ready endpoint is the signal.
/// The same filter then applies to the serving-terminating fallback.
fn by_hints(
    port: &ServicePort,
    endpoints: &[Endpoint],
    node: &NodeContext<'_>,
) -> (Vec<Endpoint>, String) {
    let opted_in = port.traffic_distribution.is_some()
        || matches!(port.topology_mode.as_deref(), Some("Auto" | "auto"));
    let zone = node.labels.get(LABEL_ZONE).map(|z| &**z).unwrap_or("");
    let ready: Vec<&Endpoint> = endpoints.iter().filter(|e| e.ready).collect();

    #[derive(Clone, Copy)]
    enum Mode {
        All,
        Node,
        Zone,
    }
    let mut mode = Mode::All;
    if !ready.is_empty() {
        let all_node = ready.iter().all(|e| !e.node_hints.is_empty());
        let for_node = ready
            .iter()
            .any(|e| e.node_hints.iter().any(|h| &**h == node.node_name));
        let all_zone = ready.iter().all(|e| !e.zone_hints.is_empty());
        let for_zone = !zone.is_empty()
            && ready
                .iter()
                .any(|e| e.zone_hints.iter().any(|h| &**h == zone));
        // Node hints are only ever written for PreferSameNode; honour them whenever
        // present, as upstream does, and fall back to zone hints otherwise.
        if all_node && for_node {
            mode = Mode::Node;
        } else if all_zone && for_zone {
            mode = Mode::Zone;
        }
    }
    let fits = |e: &&Endpoint| match mode {
        Mode::All => true,
        Mode::Node => e.node_hints.iter().any(|h| &**h == node.node_name),
        Mode::Zone => e.zone_hints.iter().any(|h| &**h == zone),
    };
    let (eps, why) = ready_or_terminating(endpoints.iter().filter(fits));
    let why = match (mode, port.traffic_distribution) {
        (Mode::Node, _) => format!("node hints for {}: {why}", node.node_name),
        (Mode::Zone, _) => format!("zone hints for {zone}: {why}"),
        (Mode::All, Some(td)) if !ready.is_empty() => {
            format!("{why} (trafficDistribution {td:?}: no usable hints for this node)")
        }
        (Mode::All, None) if opted_in && !ready.is_empty() => {
            format!("{why} (topology mode Auto: no usable hints for this node)")
        }
        (Mode::All, _) => why.to_string(),
    };
    (eps, why)
}

/// svcproxy topology keys: the first key (in preference order) under which some
/// endpoint shares this node's label value wins. Ready endpoints are sought under
/// every key before serving-terminating ones are, so a terminating local endpoint
/// never beats a ready one that a later key (such as `*`) allows.
fn by_topology_keys(
    keys: &[TopologyKey],
    endpoints: &[Endpoint],
    node: &NodeContext<'_>,
) -> (Vec<Endpoint>, String) {
    let matches = |key: &TopologyKey, ep: &Endpoint| -> bool {
        match key {
            TopologyKey::Any => true,
            TopologyKey::Label(k) => {
                let Some(mine) = node.labels.get(k.as_str()) else {
                    return false;
                };
                ep.node_name
                    .as_deref()
                    .and_then(|n| (node.node_labels)(n))
                    .and_then(|labels| labels.get(k.as_str()))
                    == Some(mine)
            }
        }
    };
    for (pass, usable) in [
        ("ready", (|e: &Endpoint| e.ready) as fn(&Endpoint) -> bool),
        (
            "serving-terminating fallback",
            Endpoint::serving_terminating,
        ),
    ] {
        for key in keys {
            let eps = collect(endpoints.iter().filter(|e| usable(e) && matches(key, e)));
            if !eps.is_empty() {
                return (eps, format!("topology key {key}: {pass} endpoints"));
            }
        }
    }
    let list: Vec<String> = keys.iter().map(ToString::to_string).collect();
    (
        Vec::new(),
        format!(
            "no usable endpoint matches topology keys [{}]",
            list.join(", ")
        ),
    )
}
