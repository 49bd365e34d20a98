//! Shared by the data plane's integration tests: a small cluster built from YAML
//! through the real `ClusterState`.
//!
//! Address plan (as testdata/scenarios): node-a 198.18.0.1 / 2001:db8::1, pods
//! 198.18.<n>.0/24 on node n, ServiceCIDRs 198.19.0.0/16 and 2001:db8:ffff::/112,
//! external IPs 203.0.113.0/24.
#![allow(dead_code)]

pub mod netns;

use std::fmt::Write as _;

use svcproxy_core::model::{IpFamily, Protocol, ServiceName, ServicePortName};
use svcproxy_core::objects::{Kind, ObjectKey, SourceUpdate};
use svcproxy_core::state::{ClusterState, SnapshotUpdate, StateConfig};
use svcproxy_dataplane::{DataPlane, DataPlaneError, RuleCount, SyncKind};
use svcproxy_plan::names::service_port_hash;
use svcproxy_plan::{build_intent, Conflict, IntentBuilder, LocalDetection, PlanConfig};

pub const CLUSTER: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {kubernetes.io/hostname: node-a, topology.kubernetes.io/zone: zone-1}
spec:
  podCIDRs: ["198.18.1.0/24", "2001:db8:1::/64"]
status:
  addresses:
  - {type: InternalIP, address: 198.18.0.1}
  - {type: InternalIP, address: "2001:db8::1"}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes}
spec:
  cidrs: ["198.19.0.0/16", "2001:db8:ffff::/112"]
"#;

/// web: 198.19.0.10:80 → :8080 on 198.18.1.10 (local) and 198.18.2.10.
pub const WEB: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  clusterIP: 198.19.0.10
  ports:
  - {name: http, port: 80, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: demo
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
- {name: http, port: 8080}
endpoints:
- {addresses: [198.18.1.10], nodeName: node-a}
- {addresses: [198.18.2.10], nodeName: node-b}
"#;

/// web's endpoints changed: 198.18.2.10 replaced by 198.18.3.10.
pub const WEB_MOVED: &str = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: demo
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
- {name: http, port: 8080}
endpoints:
- {addresses: [198.18.1.10], nodeName: node-a}
- {addresses: [198.18.3.10], nodeName: node-c}
"#;

/// db: 198.19.0.20:5432 on 198.18.2.20, plus external IP 203.0.113.20.
pub const DB: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: db, namespace: demo}
spec:
  clusterIP: 198.19.0.20
  externalIPs: [203.0.113.20]
  ports:
  - {name: pg, port: 5432}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: db-1
  namespace: demo
  labels: {kubernetes.io/service-name: db}
addressType: IPv4
ports:
- {name: pg, port: 5432}
endpoints:
- {addresses: [198.18.2.20], nodeName: node-b}
"#;

/// cache: claims db's external IP and port (a conflict cache wins: first by name).
pub const CACHE_CONFLICT: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: cache, namespace: demo}
spec:
  clusterIP: 198.19.0.30
  externalIPs: [203.0.113.20]
  ports:
  - {name: pg, port: 5432}
"#;

/// Every object in a multi-document YAML text (the workspace's one loader).
pub use svcproxy_testkit::objects::parse as objects;

/// A cluster state for node-a holding `CLUSTER` and the given YAML texts.
pub fn cluster(yamls: &[&str]) -> ClusterState {
    let mut state = ClusterState::new(StateConfig {
        node_name: "node-a".to_string(),
        service_proxy_name: None,
        ignore_external_ips: false,
        dns: false,
        without_snapshots: false,
    });
    upsert(&mut state, CLUSTER);
    for yaml in yamls {
        upsert(&mut state, yaml);
    }
    state
}

pub fn upsert(state: &mut ClusterState, yaml: &str) {
    for object in objects(yaml) {
        state.apply(SourceUpdate::Upsert {
            object,
            origin: "test".to_string(),
        });
    }
}

pub fn delete_service(state: &mut ClusterState, name: &str) {
    state.apply(SourceUpdate::Delete(ObjectKey::new(
        Kind::Service,
        "demo",
        name,
    )));
}

/// NodeCIDR local detection from node-a's podCIDRs.
pub fn plan_config() -> PlanConfig {
    PlanConfig {
        local_detection: LocalDetection::NodeCidr(Vec::new()),
        ..PlanConfig::default()
    }
}

pub fn spn(name: &str, port: &str) -> ServicePortName {
    ServicePortName::new(ServiceName::new("demo", name), port, Protocol::Tcp)
}

/// The IPv4 service chain of `demo/<name>:<port>/tcp`.
pub fn service_chain(name: &str, port: &str) -> String {
    format!(
        "service-{:016x}",
        service_port_hash(IpFamily::V4, &spn(name, port))
    )
}

pub fn snapshot(state: &mut ClusterState) -> SnapshotUpdate {
    state.snapshot()
}

/// `text` (a ruleset listing) holds `needle`; `step` names the moment for the message.
#[track_caller]
pub fn has(text: &str, needle: &str, step: &str) {
    assert!(text.contains(needle), "{step}: {needle:?} missing:\n{text}");
}

/// `text` does not hold `needle`.
#[track_caller]
pub fn lacks(text: &str, needle: &str, step: &str) {
    assert!(
        !text.contains(needle),
        "{step}: {needle:?} present:\n{text}"
    );
}

/// Services `svc-<from>`..`svc-<to - 1>` in namespace `bench` (cluster IPs from
/// 198.19.0.0/16), `m` endpoints each on node-b (10.0.0.0/8).
pub fn services_yaml(from: usize, to: usize, m: usize) -> String {
    let mut y = String::new();
    for i in from..to {
        let ip = bench_vip(i);
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: bench}}\nspec:\n  clusterIP: {ip}\n  ports:\n  - {{name: http, port: 80, targetPort: 8080}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc-{i}-1\n  namespace: bench\n  labels: {{kubernetes.io/service-name: svc-{i}}}\naddressType: IPv4\nports:\n- {{name: http, port: 8080}}\nendpoints:\n"
        );
        for e in 0..m {
            let n = i * m + e;
            let _ = writeln!(
                y,
                "- {{addresses: [10.{}.{}.{}], nodeName: node-b}}",
                n / 62500 % 250,
                n / 250 % 250,
                n % 250 + 1
            );
        }
    }
    y
}

/// The cluster IP of [`services_yaml`]'s `i`-th Service: 198.19.0.1 on, 64,000
/// to a /16 (198.20.0.1 after 198.19.255.250).
pub fn bench_vip(i: usize) -> String {
    format!("198.{}.{}.{}", 19 + i / 64_000, i / 250 % 256, i % 250 + 1)
}

/// A data plane fed snapshots as the sync's orchestration feeds it: the intent
/// kept from sync to sync ([`IntentBuilder`]) and its delta handed to
/// [`DataPlane::sync`]. Nothing else of `svcproxy-sync`'s `Driver` (conntrack
/// cleanup, adoption, seals), which these tests do not need, and which depends on
/// this crate.
pub struct Syncer<P> {
    cfg: PlanConfig,
    intents: IntentBuilder,
    plane: P,
}

/// What one successful sync did, as these tests look at it.
#[derive(Debug)]
pub struct Synced {
    pub kind: SyncKind,
    pub apply_duration: std::time::Duration,
    pub script_bytes: usize,
    pub rules: Vec<RuleCount>,
    /// Every destination conflict in the intent.
    pub conflicts: Vec<Conflict>,
    /// Service port intents decided again.
    pub replanned: usize,
}

impl<P: DataPlane> Syncer<P> {
    pub fn new(cfg: PlanConfig, plane: P) -> Self {
        Syncer {
            cfg,
            intents: IntentBuilder::new(),
            plane,
        }
    }

    /// The intent brought to `update`, and the data plane to the intent.
    pub fn sync(&mut self, update: &SnapshotUpdate, full: bool) -> Result<Synced, DataPlaneError> {
        let delta = self
            .intents
            .update(&update.v4, &update.v6, &self.cfg, &update.changed);
        let applied = self.plane.sync(self.intents.intent(), &delta, full)?;
        Ok(Synced {
            kind: applied.kind,
            apply_duration: applied.apply_duration,
            script_bytes: applied.script_bytes,
            rules: applied.rules,
            conflicts: self.intents.intent().conflicts(),
            replanned: delta.rebuilt,
        })
    }

    /// What a first sync of `update` would apply (the data plane's `render`).
    pub fn render(&self, update: &SnapshotUpdate) -> String {
        self.plane
            .render(&build_intent(&update.v4, &update.v6, &self.cfg))
    }

    pub fn drift(&mut self) -> Result<Option<String>, DataPlaneError> {
        self.plane.drift()
    }

    pub fn plane(&self) -> &P {
        &self.plane
    }

    pub fn plane_mut(&mut self) -> &mut P {
        &mut self.plane
    }
}
