//! The eBPF mode's map contents for an intent, as `svcproxy render` prints them:
//! an entry per address a socket can name (cluster IPs, external IPs, NodePorts on
//! each NodePort address or, for every local address, on the node's own
//! addresses), the route of a pod's and of the host's connection at the socket
//! and of a packet from this node's pods and from elsewhere (masquerade where the
//! intent says), how pods are told, the marks, and the endpoint lists. Pure: no
//! kernel.

mod common;

use std::net::IpAddr;

use common::*;
use svcproxy_plan::ebpf::Table;
use svcproxy_plan::{build_intent, NodePortAddresses};

const NODEPORT: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: np, namespace: demo}
spec:
  type: NodePort
  clusterIP: 198.19.0.40
  externalTrafficPolicy: Local
  sessionAffinity: ClientIP
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: 30040}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: np-1
  namespace: demo
  labels: {kubernetes.io/service-name: np}
addressType: IPv4
ports:
- {name: http, port: 8080}
endpoints:
- {addresses: [198.18.2.40], nodeName: node-b}
"#;

fn table(cfg: svcproxy_plan::PlanConfig, host: &[&str]) -> String {
    let mut state = cluster(&[WEB, DB, NODEPORT]);
    let snap = snapshot(&mut state);
    let intent = build_intent(&snap.v4, &snap.v6, &cfg);
    let host: Vec<IpAddr> = host.iter().map(|a| a.parse().unwrap()).collect();
    Table::build(&intent, &host).render()
}

#[test]
fn the_table_names_every_socket_address_with_its_routes() {
    let text = table(plan_config(), &["127.0.0.1", "198.18.0.1", "10.9.9.9"]);
    let want = "\
service 198.18.0.1:30040/tcp pod: forward IPv4 demo/np:http/TCP cluster host: forward IPv4 demo/np:http/TCP cluster bound-masquerade packet-pod: forward IPv4 demo/np:http/TCP cluster packet-other: drop affinity: 10800s
service 198.19.0.10:80/tcp pod: forward IPv4 demo/web:http/TCP cluster host: forward IPv4 demo/web:http/TCP cluster bound-masquerade-unless-pod packet-pod: forward IPv4 demo/web:http/TCP cluster packet-other: forward IPv4 demo/web:http/TCP cluster masquerade
service 198.19.0.20:5432/tcp pod: forward IPv4 demo/db:pg/TCP cluster host: forward IPv4 demo/db:pg/TCP cluster bound-masquerade-unless-pod packet-pod: forward IPv4 demo/db:pg/TCP cluster packet-other: forward IPv4 demo/db:pg/TCP cluster masquerade
service 198.19.0.40:80/tcp pod: forward IPv4 demo/np:http/TCP cluster host: forward IPv4 demo/np:http/TCP cluster bound-masquerade-unless-pod packet-pod: forward IPv4 demo/np:http/TCP cluster packet-other: forward IPv4 demo/np:http/TCP cluster masquerade affinity: 10800s
service 203.0.113.20:5432/tcp pod: forward IPv4 demo/db:pg/TCP cluster host: forward IPv4 demo/db:pg/TCP cluster bound-masquerade packet-pod: forward IPv4 demo/db:pg/TCP cluster masquerade packet-other: forward IPv4 demo/db:pg/TCP cluster masquerade
pod-cidr 198.18.1.0/24
pod-cidr 2001:db8:1::/64
marks masquerade 0x4000 reject 0x8000
guard-cidr 198.19.0.0/16
guard-cidr 2001:db8:ffff::/112
cluster-ip 198.19.0.10
cluster-ip 198.19.0.20
cluster-ip 198.19.0.40
endpoints IPv4 demo/db:pg/TCP cluster: 198.18.2.20:5432
endpoints IPv4 demo/np:http/TCP cluster (remembered): 198.18.2.40:8080
endpoints IPv4 demo/web:http/TCP cluster: 198.18.1.10:8080 198.18.2.10:8080
";
    assert_eq!(text, want);
}

#[test]
fn nodeports_on_every_local_address_take_the_hosts_addresses_without_loopback() {
    let cfg = svcproxy_plan::PlanConfig {
        nodeport_addresses: NodePortAddresses::AllLocal,
        ..plan_config()
    };
    let text = table(cfg, &["127.0.0.1", "198.18.0.1", "10.9.9.9", "2001:db8::1"]);
    assert!(
        text.contains("service IPv4-local:30040/tcp pod: forward"),
        "{text}"
    );
    assert!(
        text.ends_with(
            "local-address 10.9.9.9\nlocal-address 198.18.0.1\nlocal-address 2001:db8::1\n"
        ),
        "{text}"
    );
}

/// An external IP that is also a NodePort address, on the NodePort's port: one
/// address, two frontends. The service IP's takes it, in a fresh table and in one
/// brought forward when either service comes or goes.
#[test]
fn an_address_two_frontends_name_goes_to_the_service_ip_and_follows_changes() {
    const SHADOW: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: shadow, namespace: demo}
spec:
  clusterIP: 198.19.0.50
  externalIPs: [198.18.0.1]
  ports:
  - {name: http, port: 30040, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: shadow-1
  namespace: demo
  labels: {kubernetes.io/service-name: shadow}
addressType: IPv4
ports:
- {name: http, port: 8080}
endpoints:
- {addresses: [198.18.2.50], nodeName: node-b}
"#;
    let cfg = plan_config();
    let mut state = cluster(&[NODEPORT]);
    let mut builder = svcproxy_plan::IntentBuilder::new();
    let up = snapshot(&mut state);
    builder.update(&up.v4, &up.v6, &cfg, &up.changed);
    let mut table = Table::build(builder.intent(), &[]);
    let node_port = "service 198.18.0.1:30040/tcp pod: forward IPv4 demo/np:http/TCP";
    let shadow = "service 198.18.0.1:30040/tcp pod: forward IPv4 demo/shadow:http/TCP";
    assert!(table.render().contains(node_port), "{}", table.render());
    for (step, yaml, gone, want) in [
        ("the external IP comes", Some(SHADOW), None, shadow),
        ("the external IP goes", None, Some("shadow"), node_port),
    ] {
        if let Some(y) = yaml {
            upsert(&mut state, y);
        }
        if let Some(name) = gone {
            delete_service(&mut state, name);
        }
        let up = snapshot(&mut state);
        let delta = builder.update(&up.v4, &up.v6, &cfg, &up.changed);
        table.update(builder.intent(), &delta, &[]);
        let fresh = Table::build(builder.intent(), &[]);
        assert_eq!(table.render(), fresh.render(), "{step}");
        assert!(table.render().contains(want), "{step}:\n{}", table.render());
    }
}
