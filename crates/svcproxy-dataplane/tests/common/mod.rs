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
use svcproxy_plan::names::service_port_hash;
use svcproxy_plan::{LocalDetection, PlanConfig};

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
        let ip = format!("198.19.{}.{}", i / 250, i % 250 + 1);
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
