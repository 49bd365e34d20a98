//! Bad input (issue 2, section 2): for every class of bad input, the problem is
//! recorded against the right object and field with the right severity
//! (Rejected = the object is skipped; Ignored = one field or entry is skipped;
//! Warning = used as documented), it is counted in `invalid_counts` (warnings are
//! not), and every other valid object in the same state still produces correct
//! snapshot entries. Nothing panics.
//!
//! Address plan (shared with tests/common):
//! - this node: node-a; nodes node-a 192.168.0.1 / fd00::1 (zone-a),
//!   node-b 192.168.0.2 / fd00::2 (zone-a), node-c 192.168.0.3 / fd00::3 (zone-b)
//! - pod CIDR 10.244.0.0/16 (node-a 10.244.1.0/24, node-b .2, node-c .3) and
//!   fd00:244::/56 for IPv6 endpoints
//! - service CIDR 10.96.0.0/16 and fd00:96::/112
//! - external and load-balancer addresses from the documentation ranges
//!   203.0.113.0/24, 198.51.100.0/24 and 2001:db8::/32
//! - the baseline Service default/web is 10.96.0.10:80 (http) with endpoints
//!   10.244.1.5:8080 (node-a) and 10.244.2.5:8080 (node-b)

mod common;

use std::net::IpAddr;

use common::*;
use k8s_openapi::api::core::v1::{Endpoints, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use svcproxy_core::model::{
    IpMode, LoadBalancerIngress, Protocol, TopologyKey, TrafficPolicy,
    DEFAULT_AFFINITY_TIMEOUT_SECONDS,
};
use svcproxy_core::objects::{Kind, KubeObject};
use svcproxy_core::problem::{quote, Severity};
use svcproxy_core::state::{ClusterState, StateConfig};

use Severity::{Ignored, Rejected, Warning};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A state holding the baseline, with no problems yet.
fn baseline_state() -> ClusterState {
    let mut st = new_state();
    add_baseline(&mut st);
    expect_no_problems(&st);
    st
}

/// A minimal ClusterIP service `default/NAME` at `cluster_ip`, port http 80, with
/// extra spec lines appended (indented by two spaces).
fn simple_service(name: &str, cluster_ip: &str, extra_spec: &str) -> KubeObject {
    service(&format!(
        r#"
metadata: {{name: {name}, namespace: default}}
spec:
  clusterIP: "{cluster_ip}"
  ports:
  - {{name: http, port: 80, targetPort: 8080}}
{extra_spec}
"#
    ))
}

/// An IPv4 slice `default/SERVICE-1` for `service` with port http 8080 and these
/// (address, node) endpoints, all ready.
fn simple_slice(service_name: &str, endpoints: &[(&str, &str)]) -> KubeObject {
    let mut eps = String::new();
    for (addr, node) in endpoints {
        eps.push_str(&format!(
            "- {{addresses: [\"{addr}\"], nodeName: {node}, conditions: {{ready: true}}}}\n"
        ));
    }
    slice(&format!(
        r#"
metadata:
  name: {service_name}-1
  namespace: default
  labels: {{kubernetes.io/service-name: {service_name}}}
addressType: IPv4
ports:
- {{name: http, port: 8080}}
endpoints:
{eps}
"#
    ))
}

#[test]
fn the_baseline_itself_has_no_problems_and_works() {
    let mut st = baseline_state();
    let update = st.snapshot();
    assert_baseline_works(&update);
    assert_eq!(port_names(&update.v4), vec!["default/web:http"]);
    assert!(update.v6.service_ports.is_empty());
}

// ---------------------------------------------------------------------------
// Cluster IPs

#[test]
fn a_service_with_one_invalid_cluster_ip_keeps_its_other_family() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service(
            r#"
metadata: {name: half-v4, namespace: default}
spec:
  clusterIP: 10.96.0.20
  clusterIPs: [10.96.0.20, "fd00:96::zz"]
  ipFamilyPolicy: RequireDualStack
  ports: [{name: http, port: 80}]
"#,
        ),
    );
    upsert(
        &mut st,
        service(
            r#"
metadata: {name: half-v6, namespace: default}
spec:
  clusterIPs: ["300.1.1.1", "fd00:96::21"]
  ports: [{name: http, port: 80}]
"#,
        ),
    );
    let p = expect_problem(
        &st,
        &key(Kind::Service, "default", "half-v4"),
        "spec.clusterIPs[1]",
        Ignored,
    );
    assert!(p.message.contains("fd00:96::zz"), "{p}");
    expect_problems(
        &st,
        &key(Kind::Service, "default", "half-v6"),
        &[("spec.clusterIPs[0]", Ignored)],
    );
    assert_eq!(count(&st, Kind::Service), 2);

    let update = st.snapshot();
    assert_baseline_works(&update);
    let v4 = must_view(&update.v4, &tcp("default", "half-v4", "http"));
    assert_eq!(v4.port.cluster_ips, vec![ip("10.96.0.20")].into());
    assert!(view(&update.v6, &tcp("default", "half-v4", "http")).is_none());
    let v6 = must_view(&update.v6, &tcp("default", "half-v6", "http"));
    assert_eq!(v6.port.cluster_ips, vec![ip("fd00:96::21")].into());
    assert!(view(&update.v4, &tcp("default", "half-v6", "http")).is_none());
}

#[test]
fn a_service_whose_cluster_ips_are_all_invalid_is_rejected() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service(
            r#"
metadata: {name: no-ip, namespace: default}
spec:
  clusterIPs: ["10.96.0.300", "127.0.0.1"]
  ports: [{name: http, port: 80}]
"#,
        ),
    );
    let k = key(Kind::Service, "default", "no-ip");
    expect_problems(
        &st,
        &k,
        &[
            ("spec.clusterIPs[0]", Ignored),
            ("spec.clusterIPs[1]", Ignored),
            ("spec.clusterIPs", Rejected),
        ],
    );
    assert_eq!(count(&st, Kind::Service), 3);
    let update = st.snapshot();
    assert_baseline_works(&update);
    assert_eq!(port_names(&update.v4), vec!["default/web:http"]);
    assert!(update.v6.service_ports.is_empty());
}

#[test]
fn a_service_with_more_than_two_cluster_ips_uses_one_per_family() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service(
            r#"
metadata: {name: many, namespace: default}
spec:
  clusterIPs: [10.96.0.22, 10.96.0.23, "fd00:96::22"]
  ports: [{name: http, port: 80}]
"#,
        ),
    );
    expect_problems(
        &st,
        &key(Kind::Service, "default", "many"),
        &[
            ("spec.clusterIPs", Ignored),
            ("spec.clusterIPs[1]", Ignored),
        ],
    );
    let update = st.snapshot();
    assert_baseline_works(&update);
    let v = must_view(&update.v4, &tcp("default", "many", "http"));
    assert_eq!(v.port.cluster_ips, vec![ip("10.96.0.22")].into());
}

#[test]
fn a_service_without_a_cluster_ip_is_rejected() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service(
            r#"
metadata: {name: unallocated, namespace: default}
spec:
  ports: [{name: http, port: 80}]
"#,
        ),
    );
    let k = key(Kind::Service, "default", "unallocated");
    expect_problems(&st, &k, &[("spec.clusterIP", Rejected)]);
    assert_eq!(count(&st, Kind::Service), 1);
    let update = st.snapshot();
    assert_baseline_works(&update);
    assert_eq!(port_names(&update.v4), vec!["default/web:http"]);
}

#[test]
fn headless_and_external_name_services_are_not_proxied_and_are_not_problems() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        simple_service("headless", "None", "  clusterIPs: [\"None\"]"),
    );
    upsert(
        &mut st,
        service(
            r#"
metadata: {name: headless-legacy, namespace: default}
spec:
  clusterIP: None
  ports: [{name: http, port: 80}]
"#,
        ),
    );
    upsert(
        &mut st,
        service(
            r#"
metadata: {name: elsewhere, namespace: default}
spec:
  type: ExternalName
  externalName: example.com
  ports: [{name: http, port: 80}]
"#,
        ),
    );
    upsert(
        &mut st,
        simple_slice("headless", &[("10.244.1.9", "node-a")]),
    );
    expect_no_problems(&st);
    let update = st.snapshot();
    assert_baseline_works(&update);
    assert_eq!(port_names(&update.v4), vec!["default/web:http"]);
    expect_no_problems(&st);
}

#[test]
fn a_service_labelled_headless_is_not_proxied_and_is_not_a_problem() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service(
            r#"
metadata:
  name: labelled
  namespace: default
  labels: {service.kubernetes.io/headless: ""}
spec:
  clusterIP: 10.96.0.24
  ports: [{name: http, port: 80}]
"#,
        ),
    );
    upsert(
        &mut st,
        slice(
            r#"
metadata:
  name: web-headless
  namespace: default
  labels: {kubernetes.io/service-name: web, service.kubernetes.io/headless: ""}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.3.99]}]
"#,
        ),
    );
    expect_no_problems(&st);
    let update = st.snapshot();
    // The headless-labelled slice adds nothing to web.
    assert_baseline_works(&update);
    assert_eq!(port_names(&update.v4), vec!["default/web:http"]);
}

#[test]
fn a_service_owned_by_another_proxy_is_skipped_silently() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service(
            r#"
metadata:
  name: theirs
  namespace: default
  labels: {service.kubernetes.io/service-proxy-name: other-proxy}
spec:
  clusterIP: 10.96.0.25
  ports: [{name: http, port: 80}]
"#,
        ),
    );
    expect_no_problems(&st);
    let update = st.snapshot();
    assert_baseline_works(&update);
    assert_eq!(port_names(&update.v4), vec!["default/web:http"]);
}

#[test]
fn with_a_service_proxy_name_only_services_labelled_with_it_are_proxied() {
    let mut st = ClusterState::new(StateConfig {
        node_name: THIS_NODE.to_string(),
        service_proxy_name: Some("x".to_string()),
        ignore_external_ips: false,
        dns: false,
        without_snapshots: false,
    });
    add_baseline(&mut st); // web has no label: not ours now
    for (name, label) in [
        ("ours", Some("x")),
        ("theirs", Some("y")),
        ("empty", Some("")),
        ("unlabelled", None),
    ] {
        let labels = label
            .map(|l| format!("  labels: {{service.kubernetes.io/service-proxy-name: \"{l}\"}}"))
            .unwrap_or_default();
        upsert(
            &mut st,
            service(&format!(
                r#"
metadata:
  name: {name}
  namespace: default
{labels}
spec:
  clusterIP: 10.96.0.26
  ports: [{{name: http, port: 80}}]
"#
            )),
        );
        upsert(&mut st, simple_slice(name, &[("10.244.2.7", "node-b")]));
    }
    expect_no_problems(&st);
    let update = st.snapshot();
    assert_eq!(port_names(&update.v4), vec!["default/ours:http"]);
    let ours = must_view(&update.v4, &tcp("default", "ours", "http"));
    assert_eq!(
        cluster_endpoints(ours),
        Some(vec!["10.244.2.7:8080".to_string()])
    );
}

// ---------------------------------------------------------------------------
// Ports

/// A service `default/ports` whose ports list is `ports` (YAML flow sequence items).
fn service_with_ports(kind: &str, ports: &[&str]) -> KubeObject {
    let list: Vec<String> = ports.iter().map(|p| format!("  - {p}")).collect();
    service(&format!(
        r#"
metadata: {{name: ports, namespace: default}}
spec:
  type: {kind}
  clusterIP: 10.96.0.30
  ports:
{}
"#,
        list.join("\n")
    ))
}

#[test]
fn a_service_port_of_zero_is_skipped_and_the_other_ports_kept() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service_with_ports(
            "ClusterIP",
            &["{name: http, port: 80}", "{name: zero, port: 0}"],
        ),
    );
    let p = expect_problem(
        &st,
        &key(Kind::Service, "default", "ports"),
        "spec.ports[1].port",
        Ignored,
    );
    assert!(p.message.contains("out of range"), "{p}");
    assert_eq!(count(&st, Kind::Service), 1);
    let update = st.snapshot();
    assert_baseline_works(&update);
    assert_eq!(
        port_names(&update.v4),
        vec!["default/ports:http", "default/web:http"]
    );
}

#[test]
fn a_service_port_above_65535_is_skipped() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service_with_ports(
            "ClusterIP",
            &["{name: big, port: 70000}", "{name: http, port: 80}"],
        ),
    );
    expect_problems(
        &st,
        &key(Kind::Service, "default", "ports"),
        &[("spec.ports[0].port", Ignored)],
    );
    let update = st.snapshot();
    assert_baseline_works(&update);
    assert!(view(&update.v4, &tcp("default", "ports", "big")).is_none());
    assert_eq!(
        must_view(&update.v4, &tcp("default", "ports", "http"))
            .port
            .port,
        80
    );
}

#[test]
fn a_negative_service_port_is_skipped() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service_with_ports(
            "ClusterIP",
            &["{name: http, port: 80}", "{name: neg, port: -80}"],
        ),
    );
    expect_problems(
        &st,
        &key(Kind::Service, "default", "ports"),
        &[("spec.ports[1].port", Ignored)],
    );
    let update = st.snapshot();
    assert_baseline_works(&update);
    assert!(view(&update.v4, &tcp("default", "ports", "neg")).is_none());
}

#[test]
fn a_service_whose_only_port_is_invalid_is_rejected() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service_with_ports("ClusterIP", &["{name: http, port: 0}"]),
    );
    expect_problems(
        &st,
        &key(Kind::Service, "default", "ports"),
        &[("spec.ports[0].port", Ignored), ("spec.ports", Rejected)],
    );
    assert_eq!(count(&st, Kind::Service), 2);
    let update = st.snapshot();
    assert_baseline_works(&update);
    assert_eq!(port_names(&update.v4), vec!["default/web:http"]);
}

#[test]
fn a_service_with_no_ports_is_rejected() {
    let mut st = baseline_state();
    upsert(&mut st, service_with_ports("ClusterIP", &[]));
    expect_problems(
        &st,
        &key(Kind::Service, "default", "ports"),
        &[("spec.ports", Rejected)],
    );
    assert_baseline_works(&st.snapshot());
}

#[test]
fn a_node_port_above_65535_is_ignored_but_the_port_is_kept() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service_with_ports(
            "NodePort",
            &[
                "{name: http, port: 80, nodePort: 70000}",
                "{name: https, port: 443, nodePort: 30443}",
            ],
        ),
    );
    expect_problems(
        &st,
        &key(Kind::Service, "default", "ports"),
        &[("spec.ports[0].nodePort", Ignored)],
    );
    let update = st.snapshot();
    assert_baseline_works(&update);
    let http = must_view(&update.v4, &tcp("default", "ports", "http"));
    assert_eq!((http.port.port, http.port.node_port), (80, None));
    let https = must_view(&update.v4, &tcp("default", "ports", "https"));
    assert_eq!(https.port.node_port, Some(30443));
}

#[test]
fn a_negative_node_port_is_ignored_but_the_port_is_kept() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service_with_ports("NodePort", &["{name: http, port: 80, nodePort: -1}"]),
    );
    expect_problems(
        &st,
        &key(Kind::Service, "default", "ports"),
        &[("spec.ports[0].nodePort", Ignored)],
    );
    let update = st.snapshot();
    let http = must_view(&update.v4, &tcp("default", "ports", "http"));
    assert_eq!(http.port.node_port, None);
}

#[test]
fn a_node_port_on_a_cluster_ip_service_is_ignored() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service_with_ports("ClusterIP", &["{name: http, port: 80, nodePort: 30080}"]),
    );
    let p = expect_problem(
        &st,
        &key(Kind::Service, "default", "ports"),
        "spec.ports[0].nodePort",
        Ignored,
    );
    assert!(p.message.contains("NodePort"), "{p}");
    let update = st.snapshot();
    assert_baseline_works(&update);
    let http = must_view(&update.v4, &tcp("default", "ports", "http"));
    assert_eq!(http.port.node_port, None);
    assert!(!http.port.externally_accessible());
}

#[test]
fn a_duplicate_port_name_and_protocol_is_skipped() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service_with_ports(
            "ClusterIP",
            &[
                "{name: dns, port: 53, protocol: UDP}",
                "{name: dns, port: 5353, protocol: UDP}",
                "{name: dns, port: 53, protocol: TCP}",
            ],
        ),
    );
    let p = expect_problem(
        &st,
        &key(Kind::Service, "default", "ports"),
        "spec.ports[1]",
        Ignored,
    );
    assert!(p.message.contains("duplicate"), "{p}");
    let update = st.snapshot();
    assert_baseline_works(&update);
    let udp = must_view(
        &update.v4,
        &port_name("default", "ports", "dns", Protocol::Udp),
    );
    assert_eq!(udp.port.port, 53, "the first of the duplicates wins");
    let tcp_dns = must_view(&update.v4, &tcp("default", "ports", "dns"));
    assert_eq!(tcp_dns.port.port, 53);
}

#[test]
fn an_unknown_protocol_skips_the_port() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service_with_ports(
            "ClusterIP",
            &[
                "{name: http, port: 80}",
                "{name: ping, port: 7, protocol: ICMP}",
                "{name: low, port: 8, protocol: tcp}",
            ],
        ),
    );
    expect_problems(
        &st,
        &key(Kind::Service, "default", "ports"),
        &[
            ("spec.ports[1].protocol", Ignored),
            ("spec.ports[2].protocol", Ignored),
        ],
    );
    let update = st.snapshot();
    assert_baseline_works(&update);
    assert_eq!(
        port_names(&update.v4),
        vec!["default/ports:http", "default/web:http"]
    );
}

#[test]
fn invalid_port_names_skip_the_port() {
    let mut st = baseline_state();
    let too_long = format!("{{name: {}, port: 84}}", "p".repeat(64));
    upsert(
        &mut st,
        service_with_ports(
            "ClusterIP",
            &[
                "{name: http, port: 80}",
                "{name: HTTP, port: 81}",
                "{name: -web, port: 82}",
                "{name: a_b, port: 83}",
                &too_long,
                "{name: \"a.b\", port: 85}",
            ],
        ),
    );
    expect_problems(
        &st,
        &key(Kind::Service, "default", "ports"),
        &[
            ("spec.ports[1].name", Ignored),
            ("spec.ports[2].name", Ignored),
            ("spec.ports[3].name", Ignored),
            ("spec.ports[4].name", Ignored),
            ("spec.ports[5].name", Ignored),
        ],
    );
    assert_eq!(count(&st, Kind::Service), 5);
    let update = st.snapshot();
    assert_baseline_works(&update);
    assert_eq!(
        port_names(&update.v4),
        vec!["default/ports:http", "default/web:http"]
    );
}

#[test]
fn an_unknown_service_type_rejects_the_service() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service_with_ports("Tunnel", &["{name: http, port: 80}"]),
    );
    expect_problems(
        &st,
        &key(Kind::Service, "default", "ports"),
        &[("spec.type", Rejected)],
    );
    let update = st.snapshot();
    assert_baseline_works(&update);
    assert_eq!(port_names(&update.v4), vec!["default/web:http"]);
}

/// The API server defaults an empty `type` to ClusterIP and an empty service port
/// `protocol` to TCP (both are plain strings in the Go types, so "" is "unset"); a
/// manifest that spells them out as "" should mean the same here.
#[test]

fn empty_type_and_protocol_strings_mean_the_api_defaults() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service_with_ports("\"\"", &["{name: http, port: 80, protocol: \"\"}"]),
    );
    expect_problems(&st, &key(Kind::Service, "default", "ports"), &[]);
    let update = st.snapshot();
    let http = must_view(&update.v4, &tcp("default", "ports", "http"));
    assert_eq!(http.port.port, 80);
}

// ---------------------------------------------------------------------------
// External IPs and load-balancer ingress

#[test]
fn an_invalid_external_ip_is_ignored_and_the_others_kept() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        simple_service(
            "ext",
            "10.96.0.31",
            r#"  externalIPs: [203.0.113.10, bogus, 0.0.0.0, 224.0.0.1, 203.0.113.11, 203.0.113.10]"#,
        ),
    );
    expect_problems(
        &st,
        &key(Kind::Service, "default", "ext"),
        &[
            ("spec.externalIPs[1]", Ignored),
            ("spec.externalIPs[2]", Ignored),
            ("spec.externalIPs[3]", Ignored),
        ],
    );
    assert_eq!(count(&st, Kind::Service), 3);
    let update = st.snapshot();
    assert_baseline_works(&update);
    let ext = must_view(&update.v4, &tcp("default", "ext", "http"));
    assert_eq!(
        ext.port.external_ips,
        vec![ip("203.0.113.10"), ip("203.0.113.11")].into(),
        "invalid entries dropped, the duplicate collapsed"
    );
}

/// Addresses that would capture the node's own traffic (loopback, link-local) or are
/// no unicast destination (broadcast) are refused as cluster, external and
/// load-balancer IPs, each with the reason, and the service keeps its other ones.
#[test]
fn node_local_and_broadcast_addresses_are_refused_as_service_ips() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        simple_service(
            "ext",
            "10.96.0.31",
            r#"  externalIPs: [203.0.113.10, 127.0.0.53, 169.254.169.254, "fe80::1", 255.255.255.255, "::1"]"#,
        ),
    );
    upsert(
        &mut st,
        service(
            r#"
metadata: {name: metadata-hijack, namespace: default}
spec:
  clusterIPs: [169.254.169.254, "fd00:96::40"]
  ports: [{name: http, port: 80}]
"#,
        ),
    );
    upsert(
        &mut st,
        load_balancer(
            "lb",
            "",
            r#"
    - ip: 198.51.100.10
    - ip: 127.0.0.1
    - ip: 169.254.0.1
"#,
        ),
    );
    let ext = key(Kind::Service, "default", "ext");
    expect_problems(
        &st,
        &ext,
        &[
            ("spec.externalIPs[1]", Ignored),
            ("spec.externalIPs[2]", Ignored),
            ("spec.externalIPs[3]", Ignored),
            ("spec.externalIPs[4]", Ignored),
            ("spec.externalIPs[5]", Ignored),
        ],
    );
    for (field, why) in [
        ("spec.externalIPs[1]", "loopback"),
        ("spec.externalIPs[2]", "link-local"),
        ("spec.externalIPs[3]", "link-local"),
        ("spec.externalIPs[4]", "broadcast"),
    ] {
        let p = expect_problem(&st, &ext, field, Ignored);
        assert!(p.message.contains(why), "{p}");
    }
    let p = expect_problem(
        &st,
        &key(Kind::Service, "default", "metadata-hijack"),
        "spec.clusterIPs[0]",
        Ignored,
    );
    assert!(p.message.contains("link-local"), "{p}");
    expect_problems(
        &st,
        &key(Kind::Service, "default", "lb"),
        &[
            ("status.loadBalancer.ingress[1].ip", Ignored),
            ("status.loadBalancer.ingress[2].ip", Ignored),
        ],
    );
    let update = st.snapshot();
    assert_baseline_works(&update);
    let ext = must_view(&update.v4, &tcp("default", "ext", "http"));
    assert_eq!(ext.port.external_ips, vec![ip("203.0.113.10")].into());
    assert!(view(&update.v4, &tcp("default", "metadata-hijack", "http")).is_none());
    let v6 = must_view(&update.v6, &tcp("default", "metadata-hijack", "http"));
    assert_eq!(v6.port.cluster_ips, vec![ip("fd00:96::40")].into());
    let lb = must_view(&update.v4, &tcp("default", "lb", "http"));
    assert_eq!(
        lb.port.load_balancer_vips().collect::<Vec<_>>(),
        vec![ip("198.51.100.10")]
    );
}

fn load_balancer(name: &str, extra_spec: &str, ingress: &str) -> KubeObject {
    service(&format!(
        r#"
metadata: {{name: {name}, namespace: default}}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.32
  ports: [{{name: http, port: 80, nodePort: 30080}}]
{extra_spec}
status:
  loadBalancer:
    ingress:
{ingress}
"#
    ))
}

#[test]
fn an_invalid_load_balancer_ingress_ip_is_ignored() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        load_balancer(
            "lb",
            "",
            r#"
    - ip: 198.51.100.10
    - ip: not-an-ip
    - hostname: lb.example.com
    - ip: 0.0.0.0
    - ip: 198.51.100.11
"#,
        ),
    );
    expect_problems(
        &st,
        &key(Kind::Service, "default", "lb"),
        &[
            ("status.loadBalancer.ingress[1].ip", Ignored),
            ("status.loadBalancer.ingress[3].ip", Ignored),
        ],
    );
    let update = st.snapshot();
    assert_baseline_works(&update);
    let lb = must_view(&update.v4, &tcp("default", "lb", "http"));
    assert_eq!(
        lb.port.load_balancer_vips().collect::<Vec<_>>(),
        vec![ip("198.51.100.10"), ip("198.51.100.11")]
    );
}

#[test]
fn an_unknown_ip_mode_ignores_that_ingress_entry() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        load_balancer(
            "lb",
            "",
            r#"
    - {ip: 198.51.100.10, ipMode: VIP}
    - {ip: 198.51.100.11, ipMode: Tunnel}
"#,
        ),
    );
    let p = expect_problem(
        &st,
        &key(Kind::Service, "default", "lb"),
        "status.loadBalancer.ingress[1].ipMode",
        Ignored,
    );
    assert!(p.message.contains("Tunnel"), "{p}");
    let update = st.snapshot();
    assert_baseline_works(&update);
    let lb = must_view(&update.v4, &tcp("default", "lb", "http"));
    assert_eq!(
        lb.port.load_balancer_ingress,
        vec![LoadBalancerIngress {
            ip: ip("198.51.100.10"),
            ip_mode: IpMode::Vip
        }]
        .into()
    );
}

#[test]
fn an_ingress_ip_with_ip_mode_proxy_is_kept_but_not_captured() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        load_balancer(
            "lb",
            "",
            r#"
    - {ip: 198.51.100.10}
    - {ip: 198.51.100.12, ipMode: Proxy}
"#,
        ),
    );
    expect_no_problems(&st);
    let update = st.snapshot();
    assert_baseline_works(&update);
    let lb = must_view(&update.v4, &tcp("default", "lb", "http"));
    assert_eq!(
        lb.port.load_balancer_ingress,
        vec![
            LoadBalancerIngress {
                ip: ip("198.51.100.10"),
                ip_mode: IpMode::Vip
            },
            LoadBalancerIngress {
                ip: ip("198.51.100.12"),
                ip_mode: IpMode::Proxy
            },
        ]
        .into()
    );
    assert_eq!(
        lb.port.load_balancer_vips().collect::<Vec<_>>(),
        vec![ip("198.51.100.10")]
    );
}

// ---------------------------------------------------------------------------
// loadBalancerSourceRanges

const ONE_INGRESS: &str = "    - ip: 198.51.100.10";

#[test]
fn one_invalid_source_range_is_ignored_and_the_others_kept() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        load_balancer(
            "lb",
            "  loadBalancerSourceRanges: [203.0.113.0/24, banana, 198.51.100.0/24]",
            ONE_INGRESS,
        ),
    );
    let p = expect_problem(
        &st,
        &key(Kind::Service, "default", "lb"),
        "spec.loadBalancerSourceRanges[1]",
        Ignored,
    );
    assert!(p.message.contains("banana"), "{p}");
    expect_problems(
        &st,
        &key(Kind::Service, "default", "lb"),
        &[("spec.loadBalancerSourceRanges[1]", Ignored)],
    );
    assert_eq!(count(&st, Kind::Service), 1);
    let update = st.snapshot();
    assert_baseline_works(&update);
    let lb = must_view(&update.v4, &tcp("default", "lb", "http"));
    assert_eq!(
        lb.port.load_balancer_source_ranges,
        Some(
            vec![
                "203.0.113.0/24".parse().unwrap(),
                "198.51.100.0/24".parse().unwrap()
            ]
            .into()
        )
    );
}

#[test]
fn when_every_source_range_is_invalid_the_load_balancer_fails_closed() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        load_balancer(
            "lb",
            "  loadBalancerSourceRanges: [banana, 10.0.0.0/33]",
            ONE_INGRESS,
        ),
    );
    expect_problems(
        &st,
        &key(Kind::Service, "default", "lb"),
        &[
            ("spec.loadBalancerSourceRanges[0]", Ignored),
            ("spec.loadBalancerSourceRanges[1]", Ignored),
            ("spec.loadBalancerSourceRanges", Warning),
        ],
    );
    assert_eq!(count(&st, Kind::Service), 2, "warnings are not counted");
    let update = st.snapshot();
    assert_baseline_works(&update);
    let lb = must_view(&update.v4, &tcp("default", "lb", "http"));
    assert_eq!(
        lb.port.load_balancer_source_ranges,
        Some(vec![].into()),
        "no source is allowed, not every source"
    );
}

#[test]
fn a_source_range_that_is_not_a_network_address_is_ignored() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        load_balancer(
            "lb",
            "  loadBalancerSourceRanges: [10.1.2.3/8, 192.168.0.0/16]",
            ONE_INGRESS,
        ),
    );
    let p = expect_problem(
        &st,
        &key(Kind::Service, "default", "lb"),
        "spec.loadBalancerSourceRanges[0]",
        Ignored,
    );
    assert!(p.message.contains("10.1.2.3/8"), "{p}");
    let update = st.snapshot();
    let lb = must_view(&update.v4, &tcp("default", "lb", "http"));
    assert_eq!(
        lb.port.load_balancer_source_ranges,
        Some(vec!["192.168.0.0/16".parse().unwrap()].into()),
        "10.1.2.3/8 is neither widened to 10.0.0.0/8 nor kept"
    );
}

#[test]
fn source_ranges_are_read_from_the_annotation_when_the_spec_has_none() {
    let mut st = baseline_state();
    let annotated = |name: &str, spec_ranges: &str| {
        service(&format!(
            r#"
metadata:
  name: {name}
  namespace: default
  annotations:
    service.beta.kubernetes.io/load-balancer-source-ranges: " 203.0.113.0/24 ,bad, 198.51.100.0/24"
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.33
  ports: [{{name: http, port: 80}}]
{spec_ranges}
status: {{loadBalancer: {{ingress: [{{ip: 198.51.100.10}}]}}}}
"#
        ))
    };
    upsert(&mut st, annotated("from-annotation", ""));
    upsert(
        &mut st,
        annotated("from-spec", "  loadBalancerSourceRanges: [192.0.2.0/24]"),
    );
    expect_problems(
        &st,
        &key(Kind::Service, "default", "from-annotation"),
        &[(
            "metadata.annotations[service.beta.kubernetes.io/load-balancer-source-ranges][1]",
            Ignored,
        )],
    );
    expect_problems(&st, &key(Kind::Service, "default", "from-spec"), &[]);
    let update = st.snapshot();
    assert_baseline_works(&update);
    let a = must_view(&update.v4, &tcp("default", "from-annotation", "http"));
    assert_eq!(
        a.port.load_balancer_source_ranges,
        Some(
            vec![
                "203.0.113.0/24".parse().unwrap(),
                "198.51.100.0/24".parse().unwrap()
            ]
            .into()
        )
    );
    let s = must_view(&update.v4, &tcp("default", "from-spec", "http"));
    assert_eq!(
        s.port.load_balancer_source_ranges,
        Some(vec!["192.0.2.0/24".parse().unwrap()].into()),
        "the spec field wins over the annotation"
    );
}

/// More source ranges than the limit: the rest are dropped, which must be said.
#[test]

fn source_ranges_beyond_the_limit_are_reported() {
    let mut st = baseline_state();
    let ranges: Vec<String> = (0..1001)
        .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256))
        .collect();
    upsert(
        &mut st,
        load_balancer(
            "lb",
            &format!("  loadBalancerSourceRanges: [{}]", ranges.join(", ")),
            ONE_INGRESS,
        ),
    );
    expect_problem(
        &st,
        &key(Kind::Service, "default", "lb"),
        "spec.loadBalancerSourceRanges",
        Ignored,
    );
}

// ---------------------------------------------------------------------------
// Session affinity and policies

fn affinity(name: &str, timeout: &str) -> KubeObject {
    simple_service(
        name,
        "10.96.0.34",
        &format!(
            "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: {timeout}}}}}"
        ),
    )
}

#[test]
fn an_affinity_timeout_of_zero_falls_back_to_the_default() {
    let mut st = baseline_state();
    upsert(&mut st, affinity("sticky", "0"));
    expect_problems(
        &st,
        &key(Kind::Service, "default", "sticky"),
        &[(
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            Ignored,
        )],
    );
    let update = st.snapshot();
    assert_baseline_works(&update);
    let v = must_view(&update.v4, &tcp("default", "sticky", "http"));
    assert_eq!(v.port.session_affinity_timeout, Some(10800));
    assert_eq!(DEFAULT_AFFINITY_TIMEOUT_SECONDS, 10800);
}

#[test]
fn an_affinity_timeout_above_one_day_falls_back_to_the_default() {
    let mut st = baseline_state();
    upsert(&mut st, affinity("sticky", "100000"));
    let p = expect_problem(
        &st,
        &key(Kind::Service, "default", "sticky"),
        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
        Ignored,
    );
    assert!(p.message.contains("100000"), "{p}");
    let update = st.snapshot();
    let v = must_view(&update.v4, &tcp("default", "sticky", "http"));
    assert_eq!(v.port.session_affinity_timeout, Some(10800));
}

#[test]
fn valid_affinity_timeouts_are_kept_and_a_missing_one_is_the_default() {
    let mut st = baseline_state();
    upsert(&mut st, affinity("one-day", "86400"));
    upsert(
        &mut st,
        simple_service("no-timeout", "10.96.0.35", "  sessionAffinity: ClientIP"),
    );
    expect_no_problems(&st);
    let update = st.snapshot();
    let day = must_view(&update.v4, &tcp("default", "one-day", "http"));
    assert_eq!(day.port.session_affinity_timeout, Some(86400));
    let none = must_view(&update.v4, &tcp("default", "no-timeout", "http"));
    assert_eq!(none.port.session_affinity_timeout, Some(10800));
}

#[test]
fn unknown_policies_are_ignored_and_the_defaults_used() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service(
            r#"
metadata: {name: odd, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.36
  ports: [{name: http, port: 80, nodePort: 30080}]
  sessionAffinity: Sticky
  externalTrafficPolicy: Nearby
  internalTrafficPolicy: Elsewhere
  trafficDistribution: PreferMars
"#,
        ),
    );
    expect_problems(
        &st,
        &key(Kind::Service, "default", "odd"),
        &[
            ("spec.externalTrafficPolicy", Ignored),
            ("spec.internalTrafficPolicy", Ignored),
            ("spec.sessionAffinity", Ignored),
            ("spec.trafficDistribution", Ignored),
        ],
    );
    assert_eq!(count(&st, Kind::Service), 4);
    let update = st.snapshot();
    assert_baseline_works(&update);
    let v = must_view(&update.v4, &tcp("default", "odd", "http"));
    assert_eq!(v.port.external_traffic_policy, TrafficPolicy::Cluster);
    assert_eq!(v.port.internal_traffic_policy, TrafficPolicy::Cluster);
    assert_eq!(v.port.session_affinity_timeout, None);
    assert_eq!(v.port.traffic_distribution, None);
}

// ---------------------------------------------------------------------------
// Topology keys annotation

const TOPOLOGY_KEYS_FIELD: &str = "metadata.annotations[svcproxy.io/topology-keys]";

/// A service `default/NAME` with the topology keys annotation; `extra_spec` with a
/// `type: NodePort` line gives its port node port 30080.
fn with_topology_keys(name: &str, keys: &str, extra_spec: &str) -> KubeObject {
    let node_port = if extra_spec.contains("NodePort") {
        ", nodePort: 30080"
    } else {
        ""
    };
    service(&format!(
        r#"
metadata:
  name: {name}
  namespace: default
  annotations: {{svcproxy.io/topology-keys: "{keys}"}}
spec:
  clusterIP: 10.96.0.40
  ports: [{{name: http, port: 80{node_port}}}]
{extra_spec}
"#
    ))
}

/// The topology service's endpoints: one on this node, one in its zone, one elsewhere.
fn topology_slice(name: &str) -> KubeObject {
    simple_slice(
        name,
        &[
            ("10.244.1.40", "node-a"),
            ("10.244.2.40", "node-b"),
            ("10.244.3.40", "node-c"),
        ],
    )
}

const ALL_THREE: [&str; 3] = ["10.244.1.40:8080", "10.244.2.40:8080", "10.244.3.40:8080"];

fn all_three() -> Option<Vec<String>> {
    Some(ALL_THREE.iter().map(|s| s.to_string()).collect())
}

#[test]
fn valid_topology_keys_are_kept_in_preference_order() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        with_topology_keys(
            "topo",
            "kubernetes.io/hostname, topology.kubernetes.io/zone, *",
            "",
        ),
    );
    upsert(&mut st, topology_slice("topo"));
    expect_no_problems(&st);
    let update = st.snapshot();
    assert_baseline_works(&update);
    let v = must_view(&update.v4, &tcp("default", "topo", "http"));
    assert_eq!(
        v.port.topology_keys,
        Some(
            vec![
                TopologyKey::Label("kubernetes.io/hostname".into()),
                TopologyKey::Label("topology.kubernetes.io/zone".into()),
                TopologyKey::Any,
            ]
            .into()
        )
    );
    assert_eq!(
        cluster_endpoints(v),
        Some(vec!["10.244.1.40:8080".to_string()]),
        "the first key that yields wins: this node's endpoint"
    );
}

/// Each malformed annotation is ignored as a whole: the service routes as if it had
/// no keys (to all three endpoints), and says so once.
#[test]
fn malformed_topology_keys_are_ignored_as_a_whole() {
    let seventeen: Vec<String> = (0..17).map(|i| format!("example.com/k{i}")).collect();
    let seventeen = seventeen.join(",");
    for (case, keys, expected_words) in [
        ("star not last", "*, kubernetes.io/hostname", "last"),
        (
            "duplicate key",
            "kubernetes.io/hostname,kubernetes.io/hostname",
            "duplicate",
        ),
        (
            "invalid key",
            "kubernetes.io/hostname, not a key!",
            "invalid",
        ),
        ("empty key", "kubernetes.io/hostname,,*", "invalid"),
        ("too many keys", seventeen.as_str(), "17 keys"),
    ] {
        let mut st = baseline_state();
        upsert(&mut st, with_topology_keys("topo", keys, ""));
        upsert(&mut st, topology_slice("topo"));
        let p = expect_problem(
            &st,
            &key(Kind::Service, "default", "topo"),
            TOPOLOGY_KEYS_FIELD,
            Ignored,
        );
        assert!(p.message.contains(expected_words), "{case}: {p}");
        assert_eq!(count(&st, Kind::Service), 1, "{case}");
        let update = st.snapshot();
        assert_baseline_works(&update);
        let v = must_view(&update.v4, &tcp("default", "topo", "http"));
        assert_eq!(v.port.topology_keys, None, "{case}");
        assert_eq!(v.port.scheduler, None, "{case}");
        assert_eq!(v.port.endpoint_weights, None, "{case}");
        assert_eq!(cluster_endpoints(v), all_three(), "{case}");
    }
}

#[test]
fn sixteen_topology_keys_are_allowed() {
    let sixteen: Vec<String> = (0..15)
        .map(|i| format!("example.com/k{i}"))
        .chain(["*".to_string()])
        .collect();
    let mut st = baseline_state();
    upsert(&mut st, with_topology_keys("topo", &sixteen.join(","), ""));
    expect_no_problems(&st);
    let update = st.snapshot();
    let v = must_view(&update.v4, &tcp("default", "topo", "http"));
    assert_eq!(v.port.topology_keys.as_ref().map(|k| k.len()), Some(16));
}

#[test]
fn topology_keys_with_external_traffic_policy_local_on_a_node_port_service_are_ignored_with_a_warning(
) {
    let mut st = baseline_state();
    upsert(
        &mut st,
        with_topology_keys(
            "topo",
            "kubernetes.io/hostname, *",
            "  type: NodePort\n  externalTrafficPolicy: Local",
        ),
    );
    upsert(&mut st, topology_slice("topo"));
    let p = expect_problem(
        &st,
        &key(Kind::Service, "default", "topo"),
        TOPOLOGY_KEYS_FIELD,
        Warning,
    );
    assert!(p.message.contains("mutually exclusive"), "{p}");
    assert_eq!(count(&st, Kind::Service), 0, "warnings are not counted");
    let update = st.snapshot();
    assert_baseline_works(&update);
    let v = must_view(&update.v4, &tcp("default", "topo", "http"));
    assert_eq!(v.port.topology_keys, None);
    assert_eq!(v.port.external_traffic_policy, TrafficPolicy::Local);
    assert_eq!(cluster_endpoints(v), all_three());
    assert_eq!(
        v.selection
            .local_endpoints
            .as_ref()
            .map(|e| e.iter().map(ToString::to_string).collect::<Vec<_>>()),
        Some(vec!["10.244.1.40:8080".to_string()])
    );
}

// ---------------------------------------------------------------------------
// EndpointSlices

const SERVICE_NAME_LABEL_FIELD: &str = "metadata.labels[kubernetes.io/service-name]";

#[test]
fn a_slice_without_a_service_name_label_is_rejected() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        slice(
            r#"
metadata: {name: orphan, namespace: default}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.3.9]}]
"#,
        ),
    );
    let p = expect_problem(
        &st,
        &key(Kind::EndpointSlice, "default", "orphan"),
        SERVICE_NAME_LABEL_FIELD,
        Rejected,
    );
    assert!(p.message.contains("missing"), "{p}");
    assert_eq!(count(&st, Kind::EndpointSlice), 1);
    assert_eq!(count(&st, Kind::Service), 0);
    assert_baseline_works(&st.snapshot());
}

#[test]
fn a_slice_with_an_invalid_service_name_label_is_rejected() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        slice(
            r#"
metadata:
  name: web-bad-label
  namespace: default
  labels: {kubernetes.io/service-name: "Web"}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.3.9]}]
"#,
        ),
    );
    expect_problem(
        &st,
        &key(Kind::EndpointSlice, "default", "web-bad-label"),
        SERVICE_NAME_LABEL_FIELD,
        Rejected,
    );
    assert_baseline_works(&st.snapshot());
}

#[test]
fn an_fqdn_slice_is_skipped_silently() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        slice(
            r#"
metadata:
  name: web-fqdn
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: FQDN
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [backend.example.com]}]
"#,
        ),
    );
    expect_no_problems(&st);
    assert_baseline_works(&st.snapshot());
    expect_no_problems(&st);
}

#[test]
fn a_slice_with_an_unknown_address_type_is_rejected() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        slice(
            r#"
metadata:
  name: web-v5
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv5
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.3.9]}]
"#,
        ),
    );
    let p = expect_problem(
        &st,
        &key(Kind::EndpointSlice, "default", "web-v5"),
        "addressType",
        Rejected,
    );
    assert!(p.message.contains("IPv5"), "{p}");
    assert_eq!(count(&st, Kind::EndpointSlice), 1);
    assert_baseline_works(&st.snapshot());
}

#[test]
fn invalid_ipv4_endpoint_addresses_skip_that_endpoint_and_keep_the_others() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        slice(
            r#"
metadata:
  name: web-more
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.244.3.5]
- addresses: [not-an-ip]
- addresses: ["fd00:244::5"]
- addresses: [127.0.0.1]
- addresses: [169.254.1.1]
- addresses: [224.0.0.1]
- addresses: [0.0.0.0]
- addresses: []
- addresses: [" 10.244.3.6"]
- addresses: [10.244.3.7, garbage-second-address]
"#,
        ),
    );
    let k = key(Kind::EndpointSlice, "default", "web-more");
    expect_problems(
        &st,
        &k,
        &[
            ("endpoints[1].addresses[0]", Ignored),
            ("endpoints[2].addresses[0]", Ignored),
            ("endpoints[3].addresses[0]", Ignored),
            ("endpoints[4].addresses[0]", Ignored),
            ("endpoints[5].addresses[0]", Ignored),
            ("endpoints[6].addresses[0]", Ignored),
            ("endpoints[7].addresses", Ignored),
            ("endpoints[8].addresses[0]", Ignored),
        ],
    );
    let messages: Vec<String> = problems_of(&st, &k)
        .into_iter()
        .map(|p| p.message)
        .collect();
    for (i, word) in [
        (0, "invalid"),
        (1, "not an IPv4"),
        (2, "loopback"),
        (3, "link-local"),
        (4, "multicast"),
        (5, "unspecified"),
    ] {
        assert!(messages[i].contains(word), "{:?}", messages[i]);
    }
    assert_eq!(count(&st, Kind::EndpointSlice), 8);
    let update = st.snapshot();
    let web = must_view(&update.v4, &tcp("default", "web", "http"));
    assert_eq!(
        all_endpoints(web),
        vec![
            "10.244.1.5:8080",
            "10.244.2.5:8080",
            "10.244.3.5:8080",
            "10.244.3.7:8080"
        ]
    );
}

#[test]
fn invalid_ipv6_endpoint_addresses_skip_that_endpoint_and_keep_the_others() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service(
            r#"
metadata: {name: web6, namespace: default}
spec:
  clusterIPs: ["fd00:96::10"]
  ipFamilies: [IPv6]
  ports: [{name: http, port: 80}]
"#,
        ),
    );
    upsert(
        &mut st,
        slice(
            r#"
metadata:
  name: web6-1
  namespace: default
  labels: {kubernetes.io/service-name: web6}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints:
- addresses: ["fd00:244::1:5"]
  nodeName: node-a
- addresses: ["::1"]
- addresses: ["fe80::1"]
- addresses: ["ff02::1"]
- addresses: ["::"]
- addresses: [10.244.1.5]
- addresses: ["::ffff:10.244.1.5"]
- addresses: ["fe80::1%eth0"]
- addresses: ["fd00:244::2:5"]
  nodeName: node-b
"#,
        ),
    );
    expect_problems(
        &st,
        &key(Kind::EndpointSlice, "default", "web6-1"),
        &[
            ("endpoints[1].addresses[0]", Ignored),
            ("endpoints[2].addresses[0]", Ignored),
            ("endpoints[3].addresses[0]", Ignored),
            ("endpoints[4].addresses[0]", Ignored),
            ("endpoints[5].addresses[0]", Ignored),
            ("endpoints[6].addresses[0]", Ignored),
            ("endpoints[7].addresses[0]", Ignored),
        ],
    );
    let messages: Vec<String> = problems_of(&st, &key(Kind::EndpointSlice, "default", "web6-1"))
        .into_iter()
        .map(|p| p.message)
        .collect();
    for (i, word) in [
        (0, "loopback"),
        (1, "link-local"),
        (2, "multicast"),
        (3, "unspecified"),
        (4, "not an IPv6"),
        (5, "IPv4-mapped"),
    ] {
        assert!(messages[i].contains(word), "{:?}", messages[i]);
    }
    let update = st.snapshot();
    assert_baseline_works(&update);
    let web6 = must_view(&update.v6, &tcp("default", "web6", "http"));
    assert_eq!(
        cluster_endpoints(web6),
        Some(vec![
            "[fd00:244::1:5]:8080".to_string(),
            "[fd00:244::2:5]:8080".to_string()
        ])
    );
}

#[test]
fn bad_slice_ports_are_ignored_and_the_good_ports_kept() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service(
            r#"
metadata: {name: multi, namespace: default}
spec:
  clusterIP: 10.96.0.50
  ports:
  - {name: http, port: 80}
  - {name: a, port: 81}
  - {name: b, port: 82}
  - {name: c, port: 83}
  - {name: d, port: 84}
"#,
        ),
    );
    upsert(
        &mut st,
        slice(
            r#"
metadata:
  name: multi-1
  namespace: default
  labels: {kubernetes.io/service-name: multi}
addressType: IPv4
ports:
- {name: http, port: 8080}
- {name: a}
- {name: b, port: 0}
- {name: c, port: 70000}
- {name: d, port: -5}
- {name: D, port: 8084}
- {name: http, port: 9090, protocol: TCP}
- {name: e, port: 8085, protocol: ICMP}
endpoints:
- addresses: [10.244.2.50]
"#,
        ),
    );
    expect_problems(
        &st,
        &key(Kind::EndpointSlice, "default", "multi-1"),
        &[
            ("ports[1].port", Ignored),
            ("ports[2].port", Ignored),
            ("ports[3].port", Ignored),
            ("ports[4].port", Ignored),
            ("ports[5].name", Ignored),
            ("ports[6]", Ignored),
            ("ports[7].protocol", Ignored),
        ],
    );
    assert_eq!(count(&st, Kind::EndpointSlice), 7);
    let update = st.snapshot();
    assert_baseline_works(&update);
    let http = must_view(&update.v4, &tcp("default", "multi", "http"));
    assert_eq!(all_endpoints(http), vec!["10.244.2.50:8080"]);
    for p in ["a", "b", "c", "d"] {
        let v = must_view(&update.v4, &tcp("default", "multi", p));
        assert!(v.endpoints.is_empty(), "port {p} has no usable slice port");
        assert!(!v.selection.has_any_endpoints);
    }
}

fn big_slice(n: usize) -> KubeObject {
    let mut eps = String::new();
    for i in 0..n {
        eps.push_str(&format!(
            "- addresses: [10.244.{}.{}]\n",
            100 + i / 200,
            1 + i % 200
        ));
    }
    slice(&format!(
        r#"
metadata:
  name: web-huge
  namespace: default
  labels: {{kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints:
{eps}
"#
    ))
}

#[test]
fn a_slice_with_more_than_1000_endpoints_is_rejected() {
    let mut st = baseline_state();
    upsert(&mut st, big_slice(1001));
    let k = key(Kind::EndpointSlice, "default", "web-huge");
    let problems = problems_of(&st, &k);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!(problems[0].severity, Rejected);
    assert!(
        problems[0].message.contains("1001 endpoints"),
        "{}",
        problems[0]
    );
    assert_clean_message(&problems[0]);
    assert_eq!(count(&st, Kind::EndpointSlice), 1);
    let update = st.snapshot();
    assert_baseline_works(&update);
    let web = must_view(&update.v4, &tcp("default", "web", "http"));
    assert_eq!(web.endpoints.len(), 2, "the huge slice contributes nothing");
}

#[test]
fn a_slice_with_exactly_1000_endpoints_is_used() {
    let mut st = baseline_state();
    upsert(&mut st, big_slice(1000));
    expect_no_problems(&st);
    let update = st.snapshot();
    let web = must_view(&update.v4, &tcp("default", "web", "http"));
    assert_eq!(web.endpoints.len(), 1002);
}

/// The rejection names no field: a reader of the log cannot tell at a glance
/// which list was too long.
#[test]

fn a_slice_with_too_many_endpoints_names_the_endpoints_field() {
    let mut st = baseline_state();
    upsert(&mut st, big_slice(1001));
    expect_problem(
        &st,
        &key(Kind::EndpointSlice, "default", "web-huge"),
        "endpoints",
        Rejected,
    );
}

#[test]
fn a_slice_port_matching_no_service_port_is_counted() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        slice(
            r#"
metadata:
  name: web-metrics
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
- {name: metrics, port: 9090}
- {name: http, port: 8080, protocol: UDP}
endpoints:
- addresses: [10.244.3.5]
"#,
        ),
    );
    // Found when the slice is matched against its service, at snapshot time.
    assert_eq!(count(&st, Kind::EndpointSlice), 0);
    let update = st.snapshot();
    assert_eq!(count(&st, Kind::EndpointSlice), 2);
    assert_eq!(count(&st, Kind::Service), 0);
    assert_baseline_works(&update);
    assert_eq!(port_names(&update.v4), vec!["default/web:http"]);
}

#[test]
fn a_slice_of_an_unknown_service_is_not_a_problem() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        simple_slice("not-yet", &[("10.244.3.5", "node-c")]),
    );
    let update = st.snapshot();
    expect_no_problems(&st);
    assert_baseline_works(&update);
    assert_eq!(port_names(&update.v4), vec!["default/web:http"]);
}

#[test]
fn endpoint_conditions_default_as_upstream() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service(
            r#"
metadata: {name: cond, namespace: default}
spec:
  clusterIP: 10.96.0.60
  ports: [{name: http, port: 80}]
"#,
        ),
    );
    upsert(
        &mut st,
        slice(
            r#"
metadata:
  name: cond-1
  namespace: default
  labels: {kubernetes.io/service-name: cond}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.244.1.10]
- addresses: [10.244.1.11]
  conditions: {}
- addresses: [10.244.1.12]
  conditions: {ready: false}
- addresses: [10.244.1.13]
  conditions: {ready: false, serving: true, terminating: true}
- addresses: [10.244.1.14]
  conditions: {ready: true, terminating: true}
- addresses: [10.244.1.15]
  conditions: {serving: false}
- addresses: [10.244.1.16]
  conditions: {ready: false, terminating: true}
"#,
        ),
    );
    expect_no_problems(&st);
    let update = st.snapshot();
    let v = must_view(&update.v4, &tcp("default", "cond", "http"));
    let conditions: Vec<(String, bool, bool, bool)> = v
        .endpoints
        .iter()
        .map(|e| (e.ip.to_string(), e.ready, e.serving, e.terminating))
        .collect();
    let expected = [
        // (address, ready, serving, terminating)
        ("10.244.1.10", true, true, false), // no conditions at all
        ("10.244.1.11", true, true, false), // empty conditions
        ("10.244.1.12", false, false, false), // serving follows ready
        ("10.244.1.13", false, true, true),
        ("10.244.1.14", true, true, true),
        ("10.244.1.15", true, false, false),
        ("10.244.1.16", false, false, true),
    ];
    let expected: Vec<(String, bool, bool, bool)> = expected
        .iter()
        .map(|(a, r, s, t)| (a.to_string(), *r, *s, *t))
        .collect();
    assert_eq!(conditions, expected);
}

// ---------------------------------------------------------------------------
// Hostile strings

fn hostile_strings() -> Vec<(&'static str, String)> {
    vec![
        ("quotes", "we\"b'x".to_string()),
        ("newline", "web\nERROR forged log line".to_string()),
        ("carriage return", "web\r\x1b[2J".to_string()),
        ("braces", "{web}".to_string()),
        ("unicode", "wéb\u{202e}ǝɔıʌɹǝs".to_string()),
        ("very long", "a".repeat(10_000)),
        ("very long with newlines", "a\n".repeat(5_000)),
        ("very long commas", ",".repeat(10_000)),
    ]
}

#[test]
fn hostile_namespaces_and_names_are_rejected_with_bounded_messages() {
    for (case, h) in hostile_strings() {
        let mut st = baseline_state();
        let mut svc_ns: Service = yaml_serde::from_str(WEB_SERVICE).unwrap();
        svc_ns.metadata.namespace = Some(h.clone());
        upsert(&mut st, KubeObject::Service(svc_ns));
        let mut svc_name: Service = yaml_serde::from_str(WEB_SERVICE).unwrap();
        svc_name.metadata.name = Some(h.clone());
        upsert(&mut st, KubeObject::Service(svc_name));
        let mut slice_ns: EndpointSlice = yaml_serde::from_str(WEB_SLICE).unwrap();
        slice_ns.metadata.namespace = Some(h.clone());
        upsert(&mut st, KubeObject::EndpointSlice(slice_ns));
        let mut slice_name: EndpointSlice = yaml_serde::from_str(WEB_SLICE).unwrap();
        slice_name.metadata.name = Some(h.clone());
        upsert(&mut st, KubeObject::EndpointSlice(slice_name));
        let mut node_obj: Node = yaml_serde::from_str(&node_yaml(
            "x",
            "192.168.0.9",
            "fd00::9",
            "zone-a",
            "10.244.9.0/24",
        ))
        .unwrap();
        node_obj.metadata.name = Some(h.clone());
        upsert(&mut st, KubeObject::Node(Box::new(node_obj)));
        let mut cidr: ServiceCIDR =
            yaml_serde::from_str("metadata: {name: x}\nspec: {cidrs: [10.97.0.0/16]}").unwrap();
        cidr.metadata.name = Some(h.clone());
        upsert(&mut st, KubeObject::ServiceCidr(cidr));

        expect_problems(
            &st,
            &key(Kind::Service, &h, "web"),
            &[("metadata.namespace", Rejected)],
        );
        expect_problems(
            &st,
            &key(Kind::Service, "default", &h),
            &[("metadata.name", Rejected)],
        );
        expect_problems(
            &st,
            &key(Kind::EndpointSlice, &h, "web-abc"),
            &[("metadata.namespace", Rejected)],
        );
        expect_problems(
            &st,
            &key(Kind::EndpointSlice, "default", &h),
            &[("metadata.name", Rejected)],
        );
        expect_problems(
            &st,
            &key(Kind::Node, "", &h),
            &[("metadata.name", Rejected)],
        );
        expect_problems(
            &st,
            &key(Kind::ServiceCidr, "", &h),
            &[("metadata.name", Rejected)],
        );
        for (k, problems) in st.problems() {
            for p in problems {
                assert!(
                    p.message.contains(&quote(&k.name)) || p.message.contains(&quote(&k.namespace)),
                    "{case}: the message quotes the bad value: {:?}",
                    p.message
                );
            }
        }
        assert_eq!(count(&st, Kind::Service), 2, "{case}");
        assert_eq!(count(&st, Kind::EndpointSlice), 2, "{case}");
        assert_eq!(count(&st, Kind::Node), 1, "{case}");
        assert_eq!(count(&st, Kind::ServiceCidr), 1, "{case}");
        let update = st.snapshot();
        assert_baseline_works(&update);
        assert_eq!(port_names(&update.v4), vec!["default/web:http"], "{case}");
    }
}

/// What gets logged is the problem's Display form: it must stay one bounded line
/// whatever the object's name, or a hostile name can forge log lines.
#[test]

fn log_lines_about_hostile_names_stay_on_one_bounded_line() {
    for (case, h) in hostile_strings() {
        let mut st = new_state();
        let mut svc: Service = yaml_serde::from_str(WEB_SERVICE).unwrap();
        svc.metadata.name = Some(h.clone());
        svc.metadata.namespace = Some(h.clone());
        upsert(&mut st, KubeObject::Service(svc));
        for p in st.problems().values().flatten() {
            let line = p.to_string();
            assert!(!line.chars().any(char::is_control), "{case}: {line:?}");
            assert!(line.chars().count() <= 1024, "{case}: {} chars", line.len());
        }
    }
}

#[test]
fn hostile_port_names_are_ignored_with_bounded_messages() {
    for (case, h) in hostile_strings() {
        let mut st = baseline_state();
        let mut svc: Service = yaml_serde::from_str(WEB_SERVICE).unwrap();
        svc.metadata.name = Some("hostile".into());
        let spec = svc.spec.as_mut().unwrap();
        spec.cluster_ip = Some("10.96.0.70".into());
        spec.cluster_ips = None;
        let mut bad_port = spec.ports.as_ref().unwrap()[0].clone();
        bad_port.name = Some(h.clone());
        bad_port.port = 81;
        spec.ports.as_mut().unwrap().push(bad_port);
        upsert(&mut st, KubeObject::Service(svc));

        let mut sl: EndpointSlice = yaml_serde::from_str(WEB_SLICE).unwrap();
        sl.metadata.name = Some("hostile-1".into());
        let mut bad_port = sl.ports.as_ref().unwrap()[0].clone();
        bad_port.name = Some(h.clone());
        sl.ports.as_mut().unwrap().push(bad_port);
        sl.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("kubernetes.io/service-name".into(), "hostile".into());
        upsert(&mut st, KubeObject::EndpointSlice(sl));

        let p = expect_problem(
            &st,
            &key(Kind::Service, "default", "hostile"),
            "spec.ports[1].name",
            Ignored,
        );
        assert!(p.message.contains(&quote(&h)), "{case}: {p:?}");
        expect_problem(
            &st,
            &key(Kind::EndpointSlice, "default", "hostile-1"),
            "ports[1].name",
            Ignored,
        );
        let update = st.snapshot();
        assert_baseline_works(&update);
        let v = must_view(&update.v4, &tcp("default", "hostile", "http"));
        assert_eq!(v.endpoints.len(), 2, "{case}");
        assert_eq!(
            port_names(&update.v4),
            vec!["default/hostile:http", "default/web:http"],
            "{case}"
        );
    }
}

#[test]
fn hostile_label_values_and_endpoint_fields_are_handled_cleanly() {
    for (case, h) in hostile_strings() {
        let mut st = baseline_state();
        // A service "owned" by a hostile proxy name: not ours, silently.
        let mut svc: Service = yaml_serde::from_str(WEB_SERVICE).unwrap();
        svc.metadata.name = Some("theirs".into());
        svc.metadata.labels = Some(
            [(
                "service.kubernetes.io/service-proxy-name".to_string(),
                h.clone(),
            )]
            .into(),
        );
        upsert(&mut st, KubeObject::Service(svc));
        assert!(st.problems().is_empty(), "{case}: {:#?}", st.problems());

        // A slice claiming a hostile service name: rejected.
        let mut sl: EndpointSlice = yaml_serde::from_str(WEB_SLICE).unwrap();
        sl.metadata.name = Some("claims".into());
        sl.metadata.labels = Some([("kubernetes.io/service-name".to_string(), h.clone())].into());
        upsert(&mut st, KubeObject::EndpointSlice(sl));
        expect_problem(
            &st,
            &key(Kind::EndpointSlice, "default", "claims"),
            SERVICE_NAME_LABEL_FIELD,
            Rejected,
        );

        // A slice whose endpoint fields are hostile: those fields ignored.
        let mut sl: EndpointSlice = yaml_serde::from_str(WEB_SLICE).unwrap();
        sl.metadata.name = Some("web-hostile".into());
        let eps = sl.endpoints.get_or_insert_with(Vec::new);
        eps.truncate(1);
        sl.endpoints.as_mut().unwrap()[0].addresses = vec!["10.244.3.77".into()];
        sl.endpoints.as_mut().unwrap()[0].node_name = Some(h.clone());
        sl.endpoints.as_mut().unwrap()[0].zone = Some(h.clone());
        sl.endpoints.as_mut().unwrap()[0].hints =
            Some(yaml_serde::from_str("forZones: [{name: zone-a}]").unwrap());
        sl.endpoints.as_mut().unwrap()[0]
            .hints
            .as_mut()
            .unwrap()
            .for_zones
            .as_mut()
            .unwrap()[0]
            .name = h.clone();
        upsert(&mut st, KubeObject::EndpointSlice(sl));
        expect_problems(
            &st,
            &key(Kind::EndpointSlice, "default", "web-hostile"),
            &[
                ("endpoints[0].nodeName", Ignored),
                ("endpoints[0].zone", Ignored),
                ("endpoints[0].hints.forZones[0]", Ignored),
            ],
        );

        // A node with a hostile label value and a hostile label key.
        let mut n: Node = yaml_serde::from_str(&node_yaml(
            "node-c",
            "192.168.0.3",
            "fd00::3",
            "zone-b",
            "10.244.3.0/24",
        ))
        .unwrap();
        let labels = n.metadata.labels.as_mut().unwrap();
        labels.insert("topology.kubernetes.io/zone".into(), h.clone());
        labels.insert(h.clone(), "x".into());
        upsert(&mut st, KubeObject::Node(Box::new(n)));
        let node_key = key(Kind::Node, "", "node-c");
        for field in [
            format!("metadata.labels[{}]", quote("topology.kubernetes.io/zone")),
            format!("metadata.labels[{}]", quote(&h)),
        ] {
            expect_problem(&st, &node_key, &field, Ignored);
        }

        let update = st.snapshot();
        let web = must_view(&update.v4, &tcp("default", "web", "http"));
        assert_eq!(web.endpoints.len(), 3, "{case}");
        let kept = web
            .endpoints
            .iter()
            .find(|e| e.ip == ip("10.244.3.77"))
            .unwrap_or_else(|| panic!("{case}: the endpoint itself is kept"));
        assert_eq!(kept.node_name, None);
        assert_eq!(kept.zone, None);
        assert!(kept.zone_hints.is_empty());
        assert_eq!(port_names(&update.v4), vec!["default/web:http"], "{case}");
    }
}

#[test]
fn hostile_annotations_are_ignored_cleanly() {
    for (case, h) in hostile_strings() {
        let mut st = baseline_state();
        let mut svc: Service = yaml_serde::from_str(
            r#"
metadata: {name: annotated, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.80
  ports: [{name: http, port: 80}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.80}]}}
"#,
        )
        .unwrap();
        svc.metadata.annotations = Some(
            [
                ("svcproxy.io/topology-keys".to_string(), h.clone()),
                ("svcproxy.io/scheduler".to_string(), h.clone()),
                ("svcproxy.io/endpoint-weights".to_string(), h.clone()),
                (
                    "service.beta.kubernetes.io/load-balancer-source-ranges".to_string(),
                    h.clone(),
                ),
            ]
            .into(),
        );
        upsert(&mut st, KubeObject::Service(svc));
        let k = key(Kind::Service, "default", "annotated");
        expect_problem(&st, &k, TOPOLOGY_KEYS_FIELD, Ignored);
        expect_problem(
            &st,
            &k,
            "metadata.annotations[svcproxy.io/scheduler]",
            Ignored,
        );
        expect_problem(
            &st,
            &k,
            "metadata.annotations[svcproxy.io/endpoint-weights]",
            Ignored,
        );
        let ranges_field =
            "metadata.annotations[service.beta.kubernetes.io/load-balancer-source-ranges]";
        // Fails closed with a warning; a 10k-entry value also reports its truncation.
        let at_field: Vec<_> = problems_of(&st, &k)
            .into_iter()
            .filter(|p| p.field == ranges_field)
            .collect();
        assert!(
            at_field.iter().any(|p| p.severity == Warning),
            "{case}: {at_field:#?}"
        );
        assert!(at_field.len() <= 2, "{at_field:#?}");
        // At most 1000 ranges, their truncation, and one per other annotation.
        assert!(problems_of(&st, &k).len() <= 1005, "{case}: bounded");
        for p in problems_of(&st, &k) {
            assert_clean_message(&p);
        }
        let update = st.snapshot();
        assert_baseline_works(&update);
        let v = must_view(&update.v4, &tcp("default", "annotated", "http"));
        assert_eq!(v.port.topology_keys, None, "{case}");
        assert_eq!(
            v.port.load_balancer_source_ranges,
            Some(vec![].into()),
            "{case}: an unreadable restriction fails closed"
        );
    }
}

// ---------------------------------------------------------------------------
// Nodes and ServiceCIDRs

#[test]
fn a_node_with_an_invalid_name_is_rejected() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        node(&node_yaml(
            "Node_D",
            "192.168.0.4",
            "fd00::4",
            "zone-b",
            "10.244.4.0/24",
        )),
    );
    let p = expect_problem(
        &st,
        &key(Kind::Node, "", "Node_D"),
        "metadata.name",
        Rejected,
    );
    assert!(p.message.contains("Node_D"), "{p}");
    assert_eq!(count(&st, Kind::Node), 1);
    assert_baseline_works(&st.snapshot());
}

#[test]
fn an_invalid_node_label_is_ignored_and_the_others_kept() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        node(
            r#"
metadata:
  name: node-a
  labels:
    topology.kubernetes.io/zone: zone-a
    "bad key!": x
    example.com/ok: "bad value!"
    example.com/empty: ""
status:
  addresses: [{type: InternalIP, address: 192.168.0.1}]
"#,
        ),
    );
    expect_problems(
        &st,
        &key(Kind::Node, "", "node-a"),
        &[
            ("metadata.labels[\"bad key!\"]", Ignored),
            ("metadata.labels[\"example.com/ok\"]", Ignored),
        ],
    );
    assert_eq!(count(&st, Kind::Node), 2);
    let update = st.snapshot();
    assert_baseline_works(&update);
    let labels = &update.v4.node.as_ref().unwrap().labels;
    assert_eq!(
        labels.keys().map(|k| &**k).collect::<Vec<_>>(),
        vec!["example.com/empty", "topology.kubernetes.io/zone"]
    );
}

#[test]
fn an_invalid_node_address_or_pod_cidr_is_ignored() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        node(
            r#"
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}
spec:
  podCIDRs: [10.244.1.5/24, "fd00:244:0:1::/64"]
status:
  addresses:
  - {type: Hostname, address: node-a}
  - {type: InternalIP, address: 192.168.0.1}
  - {type: InternalIP, address: bogus}
  - {type: ExternalIP, address: 203.0.113.1}
  - {type: InternalIP, address: "fd00::1"}
"#,
        ),
    );
    expect_problems(
        &st,
        &key(Kind::Node, "", "node-a"),
        &[
            ("status.addresses[2]", Ignored),
            ("spec.podCIDRs[0]", Ignored),
        ],
    );
    let update = st.snapshot();
    assert_baseline_works(&update);
    assert_eq!(
        update.v4.node_ips(),
        vec![ip("192.168.0.1"), ip("203.0.113.1")]
    );
    assert_eq!(update.v6.node_ips(), vec![ip("fd00::1")]);
    assert_eq!(
        update.v4.node.as_ref().unwrap().pod_cidrs,
        vec!["fd00:244:0:1::/64".parse::<ipnet::IpNet>().unwrap()]
    );
}

#[test]
fn a_service_cidr_with_an_invalid_cidr_ignores_it() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service_cidr(
            r#"
metadata: {name: extra}
spec: {cidrs: [10.97.0.0/16, "fd00:97::1/112"]}
"#,
        ),
    );
    upsert(
        &mut st,
        service_cidr(
            r#"
metadata: {name: broken}
spec: {cidrs: [nonsense]}
"#,
        ),
    );
    expect_problems(
        &st,
        &key(Kind::ServiceCidr, "", "extra"),
        &[("spec.cidrs[1]", Ignored)],
    );
    expect_problems(
        &st,
        &key(Kind::ServiceCidr, "", "broken"),
        &[("spec.cidrs[0]", Ignored), ("spec.cidrs", Rejected)],
    );
    assert_eq!(count(&st, Kind::ServiceCidr), 3);
    let update = st.snapshot();
    assert_baseline_works(&update);
    assert_eq!(
        update.v4.service_cidrs,
        vec![
            "10.96.0.0/16".parse::<ipnet::IpNet>().unwrap(),
            "10.97.0.0/16".parse().unwrap()
        ]
    );
    assert_eq!(
        update.v6.service_cidrs,
        vec!["fd00:96::/112".parse::<ipnet::IpNet>().unwrap()]
    );
}

#[test]
fn a_service_cidr_covering_every_address_is_refused() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service_cidr(
            r#"
metadata: {name: everything}
spec: {cidrs: [0.0.0.0/0, "::/0"]}
"#,
        ),
    );
    let everything = key(Kind::ServiceCidr, "", "everything");
    expect_problems(
        &st,
        &everything,
        &[
            ("spec.cidrs[0]", Ignored),
            ("spec.cidrs[1]", Ignored),
            ("spec.cidrs", Rejected),
        ],
    );
    let p = expect_problem(&st, &everything, "spec.cidrs[0]", Ignored);
    assert!(p.message.contains("covers every address"), "{p}");
    let update = st.snapshot();
    assert_baseline_works(&update);
    assert_eq!(
        update.v4.service_cidrs,
        vec!["10.96.0.0/16".parse::<ipnet::IpNet>().unwrap()]
    );
}

// ---------------------------------------------------------------------------
// Garbage that still deserializes

#[test]
fn default_objects_of_every_kind_are_rejected_for_their_missing_name() {
    let mut st = baseline_state();
    upsert(&mut st, KubeObject::Service(Service::default()));
    upsert(&mut st, KubeObject::EndpointSlice(EndpointSlice::default()));
    upsert(&mut st, KubeObject::Node(Box::default()));
    upsert(&mut st, KubeObject::ServiceCidr(ServiceCIDR::default()));
    for k in [
        key(Kind::Service, "default", ""),
        key(Kind::EndpointSlice, "default", ""),
        key(Kind::Node, "", ""),
        key(Kind::ServiceCidr, "", ""),
    ] {
        expect_problems(&st, &k, &[("metadata.name", Rejected)]);
    }
    let update = st.snapshot();
    assert_baseline_works(&update);
    assert_eq!(port_names(&update.v4), vec!["default/web:http"]);
}

#[test]
fn a_default_legacy_endpoints_object_does_not_panic() {
    let mut st = baseline_state();
    upsert(&mut st, KubeObject::Endpoints(Endpoints::default()));
    let update = st.snapshot();
    assert_baseline_works(&update);
}

#[test]

fn a_nameless_legacy_endpoints_object_gets_a_clear_problem() {
    let mut st = baseline_state();
    upsert(&mut st, KubeObject::Endpoints(Endpoints::default()));
    assert!(
        !st.problems().is_empty(),
        "a nameless Endpoints object is reported"
    );
    for p in st.problems().values().flatten() {
        assert_clean_message(p);
    }
}

#[test]
fn objects_with_nothing_but_a_name_get_a_clear_problem() {
    let mut st = baseline_state();
    upsert(&mut st, service("metadata: {name: bare}"));
    upsert(&mut st, service("metadata: {name: empty-spec}\nspec: {}"));
    upsert(
        &mut st,
        service("metadata: {name: portless}\nspec: {clusterIP: 10.96.0.90}"),
    );
    upsert(
        &mut st,
        service("metadata: {name: empty-port}\nspec: {clusterIP: 10.96.0.91, ports: [{}]}"),
    );
    upsert(&mut st, slice("metadata: {name: bare}"));
    upsert(&mut st, slice("metadata: {name: typed}\naddressType: IPv4"));
    upsert(
        &mut st,
        slice(
            r#"
metadata: {name: web-empty, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{}]
endpoints: [{}]
"#,
        ),
    );
    upsert(&mut st, node("metadata: {name: bare}"));
    upsert(&mut st, service_cidr("metadata: {name: bare}"));

    let svc = |n: &str| key(Kind::Service, "default", n);
    let sl = |n: &str| key(Kind::EndpointSlice, "default", n);
    expect_problems(&st, &svc("bare"), &[("spec", Rejected)]);
    expect_problems(&st, &svc("empty-spec"), &[("spec.clusterIP", Rejected)]);
    expect_problems(&st, &svc("portless"), &[("spec.ports", Rejected)]);
    expect_problems(
        &st,
        &svc("empty-port"),
        &[("spec.ports[0].port", Ignored), ("spec.ports", Rejected)],
    );
    expect_problems(&st, &sl("bare"), &[("addressType", Rejected)]);
    expect_problems(&st, &sl("typed"), &[(SERVICE_NAME_LABEL_FIELD, Rejected)]);
    expect_problems(
        &st,
        &sl("web-empty"),
        &[
            ("ports[0].port", Ignored),
            ("endpoints[0].addresses", Ignored),
        ],
    );
    expect_problems(&st, &key(Kind::Node, "", "bare"), &[]);
    expect_problems(
        &st,
        &key(Kind::ServiceCidr, "", "bare"),
        &[("spec.cidrs", Rejected)],
    );
    let update = st.snapshot();
    assert_baseline_works(&update);
    assert_eq!(port_names(&update.v4), vec!["default/web:http"]);
    assert_eq!(
        all_endpoints(must_view(&update.v4, &tcp("default", "web", "http"))).len(),
        2
    );
    // Nothing here is valid for IPv6 either.
    assert!(update.v6.service_ports.is_empty());
}

/// Upstream reads addresses with `ParseIPSloppy`/`ParseCIDRSloppy` (objects stored
/// before the API server refused leading zeros still carry them): every field is read
/// as decimal and normalised, with one warning naming it; source ranges are trimmed.
#[test]
fn leading_zeros_are_read_as_decimal_and_normalised_with_a_warning_per_field() {
    let mut st = baseline_state();
    upsert(
        &mut st,
        service(
            r#"
metadata: {name: legacy, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.040
  clusterIPs: [10.96.0.040]
  externalIPs: [203.0.113.007]
  loadBalancerSourceRanges: [" 198.51.100.000/024 ", "203.0.113.0/24 "]
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30081}]
status:
  loadBalancer:
    ingress:
    - ip: 198.51.100.011
"#,
        ),
    );
    upsert(
        &mut st,
        slice(
            r#"
metadata:
  name: legacy-1
  namespace: default
  labels: {kubernetes.io/service-name: legacy}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.1.010], nodeName: node-a}
"#,
        ),
    );
    let svc = key(Kind::Service, "default", "legacy");
    expect_problems(
        &st,
        &svc,
        &[
            ("spec.clusterIPs[0]", Warning),
            ("spec.externalIPs[0]", Warning),
            ("status.loadBalancer.ingress[0].ip", Warning),
            ("spec.loadBalancerSourceRanges[0]", Warning),
        ],
    );
    let p = expect_problem(&st, &svc, "spec.clusterIPs[0]", Warning);
    assert!(p.message.contains("10.96.0.40"), "{p}");
    expect_problems(
        &st,
        &key(Kind::EndpointSlice, "default", "legacy-1"),
        &[("endpoints[0].addresses[0]", Warning)],
    );
    assert_eq!(count(&st, Kind::Service), 0, "warnings are not counted");
    let update = st.snapshot();
    assert_baseline_works(&update);
    let v = must_view(&update.v4, &tcp("default", "legacy", "http"));
    // Decimal, never octal: 040 is 40 (octal would be 32).
    assert_eq!(v.port.cluster_ips, vec![ip("10.96.0.40")].into());
    assert_eq!(v.port.external_ips, vec![ip("203.0.113.7")].into());
    assert_eq!(
        v.port.load_balancer_ingress,
        vec![LoadBalancerIngress {
            ip: ip("198.51.100.11"),
            ip_mode: IpMode::Vip
        }]
        .into()
    );
    assert_eq!(
        v.port.load_balancer_source_ranges,
        Some(
            vec![
                "198.51.100.0/24".parse().unwrap(),
                "203.0.113.0/24".parse().unwrap()
            ]
            .into()
        )
    );
    let eps: Vec<String> = v.endpoints.iter().map(|e| e.ip.to_string()).collect();
    assert_eq!(eps, ["10.244.1.10"]);
}

#[test]
fn a_services_scheduler_annotation_is_read_and_an_unknown_one_ignored() {
    let annotated = |name: &str, ip: &str, value: &str| {
        service(&format!(
            r#"
metadata:
  name: {name}
  namespace: default
  annotations: {{svcproxy.io/scheduler: "{value}"}}
spec:
  clusterIP: {ip}
  ports: [{{name: http, port: 80}}]
"#
        ))
    };
    let mut st = baseline_state();
    upsert(&mut st, annotated("maglev", "10.96.0.91", " mh "));
    upsert(&mut st, annotated("weighted", "10.96.0.92", "lblc"));
    let lc = key(Kind::Service, "default", "weighted");
    expect_problem(
        &st,
        &lc,
        "metadata.annotations[svcproxy.io/scheduler]",
        Ignored,
    );
    assert!(
        problems_of(&st, &lc)
            .iter()
            .any(|p| p.message.contains("\"lblc\" is not implemented")),
        "{:#?}",
        problems_of(&st, &lc)
    );
    let update = st.snapshot();
    assert_baseline_works(&update);
    let v = must_view(&update.v4, &tcp("default", "maglev", "http"));
    assert_eq!(
        v.port.scheduler,
        Some(svcproxy_core::model::Scheduler::Maglev)
    );
    // The Service is served; only its annotation is ignored.
    let v = must_view(&update.v4, &tcp("default", "weighted", "http"));
    assert_eq!(v.port.scheduler, None);
}

#[test]
fn a_services_maglev_table_size_is_read_and_one_that_is_no_size_ignored() {
    let sized = |name: &str, ip: &str, value: &str| {
        service(&format!(
            r#"
metadata:
  name: {name}
  namespace: default
  annotations: {{svcproxy.io/scheduler: mh, svcproxy.io/maglev-table-size: "{value}"}}
spec:
  clusterIP: {ip}
  ports: [{{name: http, port: 80}}]
"#
        ))
    };
    let mut st = baseline_state();
    upsert(&mut st, sized("big", "10.96.0.93", "131071"));
    upsert(&mut st, sized("odd", "10.96.0.94", "16384"));
    upsert(&mut st, sized("huge", "10.96.0.95", "99999999999999999999"));
    for name in ["odd", "huge"] {
        expect_problem(
            &st,
            &key(Kind::Service, "default", name),
            "metadata.annotations[svcproxy.io/maglev-table-size]",
            Ignored,
        );
    }
    let update = st.snapshot();
    assert_baseline_works(&update);
    let size = |name: &str| {
        must_view(&update.v4, &tcp("default", name, "http"))
            .port
            .maglev_table_size
    };
    assert_eq!(size("big"), Some(131071));
    // Served, with the node's size.
    assert_eq!(size("odd"), None);
    assert_eq!(size("huge"), None);
}

#[test]
fn endpoint_weights_are_read_and_a_malformed_list_ignored_whole() {
    let weighted = |name: &str, ip: &str, value: &str| {
        service(&format!(
            r#"
metadata:
  name: {name}
  namespace: default
  annotations: {{svcproxy.io/endpoint-weights: "{value}"}}
spec:
  clusterIP: {ip}
  ports: [{{name: http, port: 80}}]
"#
        ))
    };
    let mut st = baseline_state();
    upsert(
        &mut st,
        weighted("good", "10.96.0.93", "10.244.1.5=3, node-b = 2,"),
    );
    let bad = [
        "10.244.1.5=0",
        "node-b=256",
        "node-b",
        "Node_B=2",
        "10.244.1.5=3,x=y",
    ];
    for (i, value) in bad.iter().enumerate() {
        let name = format!("bad{i}");
        upsert(
            &mut st,
            weighted(&name, &format!("10.96.0.{}", 100 + i), value),
        );
    }
    for i in 0..bad.len() {
        let k = key(Kind::Service, "default", &format!("bad{i}"));
        expect_problem(
            &st,
            &k,
            "metadata.annotations[svcproxy.io/endpoint-weights]",
            Ignored,
        );
    }
    let update = st.snapshot();
    assert_baseline_works(&update);
    let v = must_view(&update.v4, &tcp("default", "good", "http"));
    assert_eq!(
        v.port.endpoint_weights.as_deref(),
        Some(
            &[
                (svcproxy_core::model::WeightKey::Ip(ip("10.244.1.5")), 3),
                (svcproxy_core::model::WeightKey::Node("node-b".into()), 2),
            ][..]
        )
    );
    let v = must_view(&update.v4, &tcp("default", "bad0", "http"));
    assert_eq!(v.port.endpoint_weights, None);
}
