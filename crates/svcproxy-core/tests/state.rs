//! Change tracking and snapshots (issue 2, sections 2 and 3): endpoint
//! deduplication and per-slice port resolution, per-family snapshots, partial
//! snapshots that reuse unchanged views and report exactly which service ports
//! moved, `Replace` re-lists, legacy Endpoints, and problems recorded once.
//!
//! Address plan (shared with tests/common):
//! - this node: node-a; nodes node-a 192.168.0.1 / fd00::1 (zone-a),
//!   node-b 192.168.0.2 / fd00::2 (zone-a), node-c 192.168.0.3 / fd00::3 (zone-b)
//! - pod CIDR 10.244.0.0/16 (node-a 10.244.1.0/24, node-b .2, node-c .3) and
//!   fd00:244::/56 (node-a fd00:244::1:x, node-b ::2:x, node-c ::3:x)
//! - service CIDR 10.96.0.0/16 and fd00:96::/112
//! - external and load-balancer addresses from the documentation ranges
//!   203.0.113.0/24, 198.51.100.0/24 and 2001:db8::/32
//! - the baseline Service default/web is 10.96.0.10:80 (http) with endpoints
//!   10.244.1.5:8080 (node-a) and 10.244.2.5:8080 (node-b)

mod common;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use common::*;
use ipnet::IpNet;
use svcproxy_core::model::{IpFamily, Protocol, ServicePortName};
use svcproxy_core::objects::{Kind, KubeObject, SourceUpdate};
use svcproxy_core::problem::Severity;
use svcproxy_core::snapshot::NodeSnapshot;
use svcproxy_core::state::ClusterState;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn names(v: &[ServicePortName]) -> BTreeSet<ServicePortName> {
    v.iter().cloned().collect()
}

fn only(name: &ServicePortName) -> BTreeSet<ServicePortName> {
    names(std::slice::from_ref(name))
}

/// Every view of `old` except those named in `except` is the very same `Arc` in `new`.
fn assert_views_reused(old: &NodeSnapshot, new: &NodeSnapshot, except: &[ServicePortName]) {
    for (name, view) in &old.service_ports {
        if except.contains(name) {
            continue;
        }
        let again = new
            .service_ports
            .get(name)
            .unwrap_or_else(|| panic!("{name} vanished from the {} snapshot", new.family));
        assert!(
            Arc::ptr_eq(view, again),
            "{name} ({}) was rebuilt although nothing about it changed",
            new.family
        );
    }
}

/// A ready endpoint line for a slice.
fn ep(addr: &str, node: &str) -> String {
    format!("- {{addresses: [\"{addr}\"], nodeName: {node}, conditions: {{ready: true}}}}")
}

/// A slice `default/NAME` for `service` of `family` with the given ports (flow
/// items) and endpoint lines.
fn slice_of(name: &str, service: &str, family: &str, ports: &[&str], eps: &[String]) -> KubeObject {
    slice(&format!(
        r#"
metadata:
  name: {name}
  namespace: default
  labels: {{kubernetes.io/service-name: {service}}}
addressType: {family}
ports: [{}]
endpoints:
{}
"#,
        ports.join(", "),
        eps.join("\n")
    ))
}

// ---------------------------------------------------------------------------
// Endpoints: deduplication and port resolution

#[test]
fn an_endpoint_listed_in_two_slices_counts_once() {
    let mut st = new_state();
    add_baseline(&mut st);
    upsert(
        &mut st,
        slice_of(
            "web-def",
            "web",
            "IPv4",
            &["{name: http, port: 8080}"],
            &[ep("10.244.2.5", "node-b"), ep("10.244.3.5", "node-c")],
        ),
    );
    let update = st.snapshot();
    let web = must_view(&update.v4, &tcp("default", "web", "http"));
    assert_eq!(
        all_endpoints(web),
        strings(&["10.244.1.5:8080", "10.244.2.5:8080", "10.244.3.5:8080"])
    );
    assert_eq!(
        cluster_endpoints(web),
        Some(strings(&[
            "10.244.1.5:8080",
            "10.244.2.5:8080",
            "10.244.3.5:8080"
        ]))
    );
}

#[test]
fn a_local_duplicate_wins_over_a_remote_copy_whichever_slice_comes_first() {
    for (local_slice, remote_slice) in [("dup-2", "dup-1"), ("dup-1", "dup-2")] {
        let mut st = new_state();
        add_baseline(&mut st);
        upsert(
            &mut st,
            service(
                r#"
metadata: {name: dup, namespace: default}
spec:
  clusterIP: 10.96.0.20
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80}]
"#,
            ),
        );
        upsert(
            &mut st,
            slice_of(
                remote_slice,
                "dup",
                "IPv4",
                &["{name: http, port: 8080}"],
                &[
                    "- {addresses: [10.244.1.20], nodeName: node-b, conditions: {ready: false}}"
                        .to_string(),
                ],
            ),
        );
        upsert(
            &mut st,
            slice_of(
                local_slice,
                "dup",
                "IPv4",
                &["{name: http, port: 8080}"],
                &[ep("10.244.1.20", "node-a")],
            ),
        );
        let update = st.snapshot();
        let dup = must_view(&update.v4, &tcp("default", "dup", "http"));
        assert_eq!(dup.endpoints.len(), 1, "local in {local_slice}");
        assert_eq!(dup.endpoints[0].node_name.as_deref(), Some("node-a"));
        assert!(dup.endpoints[0].ready);
        assert_eq!(
            dup.selection
                .local_endpoints
                .as_ref()
                .map(|v| v.iter().map(ToString::to_string).collect::<Vec<_>>()),
            Some(strings(&["10.244.1.20:8080"])),
            "local in {local_slice}"
        );
    }
}

#[test]
fn each_endpoint_carries_its_own_slices_port_for_a_named_target_port() {
    let mut st = new_state();
    add_baseline(&mut st);
    upsert(
        &mut st,
        service(
            r#"
metadata: {name: named, namespace: default}
spec:
  clusterIP: 10.96.0.21
  ports: [{name: http, port: 80, targetPort: web}]
"#,
        ),
    );
    // Two backends whose container port named "web" differs: the controller writes
    // one slice per distinct port set.
    upsert(
        &mut st,
        slice_of(
            "named-v1",
            "named",
            "IPv4",
            &["{name: http, port: 8080}"],
            &[ep("10.244.1.30", "node-a")],
        ),
    );
    upsert(
        &mut st,
        slice_of(
            "named-v2",
            "named",
            "IPv4",
            &["{name: http, port: 9090}"],
            &[ep("10.244.2.30", "node-b"), ep("10.244.1.30", "node-a")],
        ),
    );
    let update = st.snapshot();
    let v = must_view(&update.v4, &tcp("default", "named", "http"));
    assert_eq!(
        all_endpoints(v),
        strings(&["10.244.1.30:8080", "10.244.1.30:9090", "10.244.2.30:9090"]),
        "the same address at two ports is two endpoints"
    );
    assert_eq!(st.invalid_counts().get(&Kind::EndpointSlice), None);
}

#[test]
fn slice_ports_match_service_ports_by_name_and_protocol() {
    let mut st = new_state();
    add_baseline(&mut st);
    upsert(
        &mut st,
        service(
            r#"
metadata: {name: dns, namespace: default}
spec:
  clusterIP: 10.96.0.22
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
"#,
        ),
    );
    upsert(
        &mut st,
        slice_of(
            "dns-1",
            "dns",
            "IPv4",
            &[
                "{name: dns-tcp, port: 5354, protocol: TCP}",
                "{name: dns, port: 5353, protocol: UDP}",
            ],
            &[ep("10.244.2.22", "node-b")],
        ),
    );
    let update = st.snapshot();
    let udp = must_view(
        &update.v4,
        &port_name("default", "dns", "dns", Protocol::Udp),
    );
    assert_eq!(all_endpoints(udp), strings(&["10.244.2.22:5353"]));
    let tcp_view = must_view(&update.v4, &tcp("default", "dns", "dns-tcp"));
    assert_eq!(all_endpoints(tcp_view), strings(&["10.244.2.22:5354"]));
}

// ---------------------------------------------------------------------------
// Dual-stack

const DUAL_STACK: &str = r#"
metadata: {name: ds, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.50
  clusterIPs: [10.96.0.50, "fd00:96::50"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  externalIPs: [203.0.113.50, "2001:db8::50"]
  loadBalancerSourceRanges: [203.0.113.0/24, "2001:db8::/32"]
  ports: [{name: http, port: 80, nodePort: 30050}]
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.50}, {ip: "2001:db8:1::50"}]
"#;

fn add_dual_stack(st: &mut ClusterState) {
    upsert(st, service(DUAL_STACK));
    upsert(
        st,
        slice_of(
            "ds-v4",
            "ds",
            "IPv4",
            &["{name: http, port: 8080}"],
            &[ep("10.244.1.50", "node-a"), ep("10.244.2.50", "node-b")],
        ),
    );
    upsert(
        st,
        slice_of(
            "ds-v6",
            "ds",
            "IPv6",
            &["{name: http, port: 8080}"],
            &[
                ep("fd00:244::1:50", "node-a"),
                ep("fd00:244::3:50", "node-c"),
            ],
        ),
    );
}

#[test]
fn a_dual_stack_service_shows_each_family_only_its_own_addresses() {
    let mut st = new_state();
    add_baseline(&mut st);
    add_dual_stack(&mut st);
    expect_no_problems(&st);
    let update = st.snapshot();
    let name = tcp("default", "ds", "http");

    let v4 = must_view(&update.v4, &name);
    assert_eq!(update.v4.family, IpFamily::V4);
    assert_eq!(v4.port.cluster_ips, vec![ip("10.96.0.50")].into());
    assert_eq!(v4.port.external_ips, vec![ip("203.0.113.50")].into());
    assert_eq!(
        v4.port.load_balancer_vips().collect::<Vec<_>>(),
        vec![ip("198.51.100.50")]
    );
    assert_eq!(
        v4.port.load_balancer_source_ranges,
        Some(vec![net("203.0.113.0/24")].into())
    );
    assert_eq!(v4.port.node_port, Some(30050));
    assert_eq!(
        all_endpoints(v4),
        strings(&["10.244.1.50:8080", "10.244.2.50:8080"])
    );
    assert_eq!(update.v4.node_ips(), vec![ip("192.168.0.1")]);
    assert_eq!(update.v4.service_cidrs, vec![net("10.96.0.0/16")]);

    let v6 = must_view(&update.v6, &name);
    assert_eq!(update.v6.family, IpFamily::V6);
    assert_eq!(v6.port.cluster_ips, vec![ip("fd00:96::50")].into());
    assert_eq!(v6.port.external_ips, vec![ip("2001:db8::50")].into());
    assert_eq!(
        v6.port.load_balancer_vips().collect::<Vec<_>>(),
        vec![ip("2001:db8:1::50")]
    );
    assert_eq!(
        v6.port.load_balancer_source_ranges,
        Some(vec![net("2001:db8::/32")].into())
    );
    assert_eq!(v6.port.node_port, Some(30050));
    assert_eq!(
        all_endpoints(v6),
        strings(&["[fd00:244::1:50]:8080", "[fd00:244::3:50]:8080"])
    );
    assert_eq!(update.v6.node_ips(), vec![ip("fd00::1")]);
    assert_eq!(update.v6.service_cidrs, vec![net("fd00:96::/112")]);
}

#[test]
fn a_single_stack_service_is_absent_from_the_other_family() {
    let mut st = new_state();
    add_baseline(&mut st);
    // An IPv6 slice for the IPv4-only web service: never used.
    upsert(
        &mut st,
        slice_of(
            "web-v6",
            "web",
            "IPv6",
            &["{name: http, port: 8080}"],
            &[ep("fd00:244::1:5", "node-a")],
        ),
    );
    upsert(
        &mut st,
        service(
            r#"
metadata: {name: only6, namespace: default}
spec:
  clusterIPs: ["fd00:96::60"]
  ipFamilies: [IPv6]
  ports: [{name: http, port: 80}]
"#,
        ),
    );
    let update = st.snapshot();
    assert_baseline_works(&update);
    let web = must_view(&update.v4, &tcp("default", "web", "http"));
    assert_eq!(web.endpoints.len(), 2, "no IPv6 endpoint leaks into IPv4");
    assert_eq!(port_names(&update.v4), strings(&["default/web:http"]));
    assert_eq!(port_names(&update.v6), strings(&["default/only6:http"]));
}

#[test]
fn source_ranges_given_only_for_the_other_family_fence_this_family_to_nobody() {
    let mut st = new_state();
    add_baseline(&mut st);
    upsert(
        &mut st,
        service(&DUAL_STACK.replace("[203.0.113.0/24, \"2001:db8::/32\"]", "[\"2001:db8::/32\"]")),
    );
    let update = st.snapshot();
    let name = tcp("default", "ds", "http");
    assert_eq!(
        must_view(&update.v4, &name)
            .port
            .load_balancer_source_ranges,
        Some(vec![].into())
    );
    assert_eq!(
        must_view(&update.v6, &name)
            .port
            .load_balancer_source_ranges,
        Some(vec![net("2001:db8::/32")].into())
    );
}

// ---------------------------------------------------------------------------
// Partial snapshots

const API_SERVICE: &str = r#"
metadata: {name: api, namespace: default}
spec:
  clusterIP: 10.96.0.30
  ports:
  - {name: http, port: 80}
  - {name: grpc, port: 9000}
"#;

fn api_slice(extra: &[String], grpc_port: u16) -> KubeObject {
    let mut eps = vec![ep("10.244.2.30", "node-b"), ep("10.244.3.30", "node-c")];
    eps.extend_from_slice(extra);
    slice_of(
        "api-1",
        "api",
        "IPv4",
        &[
            "{name: http, port: 8080}",
            &format!("{{name: grpc, port: {grpc_port}}}"),
        ],
        &eps,
    )
}

/// web, api (two ports) and the dual-stack ds, after a first snapshot.
fn partial_state() -> (ClusterState, svcproxy_core::state::SnapshotUpdate) {
    let mut st = new_state();
    add_baseline(&mut st);
    upsert(&mut st, service(API_SERVICE));
    upsert(&mut st, api_slice(&[], 9090));
    add_dual_stack(&mut st);
    let first = st.snapshot();
    assert_eq!(
        first.changed,
        names(&[
            tcp("default", "api", "grpc"),
            tcp("default", "api", "http"),
            tcp("default", "ds", "http"),
            tcp("default", "web", "http"),
        ]),
        "the first snapshot adds everything"
    );
    (st, first)
}

#[test]
fn changing_one_services_slice_changes_only_that_services_ports() {
    let (mut st, first) = partial_state();
    upsert(&mut st, api_slice(&[ep("10.244.1.30", "node-a")], 9090));
    assert_eq!(st.pending_changes(), (0, 1));
    let second = st.snapshot();
    let api = [tcp("default", "api", "http"), tcp("default", "api", "grpc")];
    assert_eq!(second.changed, names(&api));
    assert_eq!((second.service_changes, second.endpoint_changes), (0, 1));
    assert_views_reused(&first.v4, &second.v4, &api);
    assert_views_reused(&first.v6, &second.v6, &[]);
    let http = must_view(&second.v4, &api[0]);
    assert_eq!(http.endpoints.len(), 3);
    assert_eq!(st.pending_changes(), (0, 0));
}

#[test]
fn changing_one_slice_port_changes_only_that_service_port() {
    let (mut st, first) = partial_state();
    upsert(&mut st, api_slice(&[], 9091));
    let second = st.snapshot();
    let grpc = tcp("default", "api", "grpc");
    assert_eq!(second.changed, only(&grpc));
    assert_views_reused(&first.v4, &second.v4, std::slice::from_ref(&grpc));
    assert_eq!(
        all_endpoints(must_view(&second.v4, &grpc)),
        strings(&["10.244.2.30:9091", "10.244.3.30:9091"])
    );
}

#[test]
fn a_change_to_the_ipv6_slice_leaves_the_ipv4_view_untouched() {
    let (mut st, first) = partial_state();
    upsert(
        &mut st,
        slice_of(
            "ds-v6",
            "ds",
            "IPv6",
            &["{name: http, port: 8080}"],
            &[ep("fd00:244::1:50", "node-a")],
        ),
    );
    let second = st.snapshot();
    let ds = tcp("default", "ds", "http");
    assert_eq!(second.changed, only(&ds));
    assert_views_reused(&first.v4, &second.v4, &[]);
    assert_views_reused(&first.v6, &second.v6, std::slice::from_ref(&ds));
    assert_eq!(must_view(&second.v6, &ds).endpoints.len(), 1);
}

#[test]
fn an_update_that_returns_to_the_start_changes_nothing() {
    let (mut st, first) = partial_state();
    upsert(&mut st, api_slice(&[ep("10.244.1.30", "node-a")], 9091));
    upsert(&mut st, service(&API_SERVICE.replace("9000", "9001")));
    upsert(&mut st, api_slice(&[], 9090)); // back to the start
    upsert(&mut st, service(API_SERVICE));
    // Something added and deleted again between two snapshots is no change either.
    upsert(
        &mut st,
        service(&API_SERVICE.replace("name: api", "name: passing")),
    );
    delete(&mut st, Kind::Service, "default", "passing");
    assert_eq!(st.pending_changes(), (0, 0));
    let second = st.snapshot();
    assert!(second.changed.is_empty(), "{:?}", second.changed);
    assert_eq!((second.service_changes, second.endpoint_changes), (0, 0));
    assert_views_reused(&first.v4, &second.v4, &[]);
    assert_views_reused(&first.v6, &second.v6, &[]);
    assert_eq!(first.v4.service_ports.len(), second.v4.service_ports.len());
}

#[test]
fn deleting_a_service_lists_its_ports_as_changed_and_removes_them() {
    let (mut st, first) = partial_state();
    delete(&mut st, Kind::Service, "default", "api");
    delete(&mut st, Kind::Service, "default", "ds");
    let second = st.snapshot();
    let gone = [
        tcp("default", "api", "http"),
        tcp("default", "api", "grpc"),
        tcp("default", "ds", "http"),
    ];
    assert_eq!(second.changed, names(&gone));
    assert_eq!(second.service_changes, 2);
    assert_eq!(port_names(&second.v4), strings(&["default/web:http"]));
    assert!(second.v6.service_ports.is_empty());
    assert_views_reused(&first.v4, &second.v4, &gone);

    // Its slices stay: the service coming back finds its endpoints again.
    upsert(&mut st, service(API_SERVICE));
    let third = st.snapshot();
    assert_eq!(
        third.changed,
        names(&[tcp("default", "api", "http"), tcp("default", "api", "grpc")])
    );
    assert_eq!(
        all_endpoints(must_view(&third.v4, &tcp("default", "api", "http"))),
        strings(&["10.244.2.30:8080", "10.244.3.30:8080"])
    );
}

#[test]
fn deleting_a_slice_leaves_its_service_without_endpoints() {
    let (mut st, first) = partial_state();
    delete(&mut st, Kind::EndpointSlice, "default", "api-1");
    let second = st.snapshot();
    let api = [tcp("default", "api", "http"), tcp("default", "api", "grpc")];
    assert_eq!(second.changed, names(&api));
    assert_views_reused(&first.v4, &second.v4, &api);
    for name in &api {
        let v = must_view(&second.v4, name);
        assert!(v.endpoints.is_empty());
        assert!(!v.selection.has_any_endpoints);
        assert_eq!(cluster_endpoints(v), Some(vec![]));
    }
}

#[test]
fn a_service_that_turns_invalid_disappears_and_comes_back_when_fixed() {
    let (mut st, first) = partial_state();
    upsert(
        &mut st,
        service(&API_SERVICE.replace("10.96.0.30", "10.96.0.300")),
    );
    let second = st.snapshot();
    let api = [tcp("default", "api", "http"), tcp("default", "api", "grpc")];
    assert_eq!(second.changed, names(&api));
    assert_views_reused(&first.v4, &second.v4, &api);
    assert!(view(&second.v4, &api[0]).is_none());
    expect_problem(
        &st,
        &key(Kind::Service, "default", "api"),
        "spec.clusterIPs",
        Severity::Rejected,
    );

    upsert(&mut st, service(API_SERVICE));
    assert!(st.problems().is_empty(), "{:#?}", st.problems());
    let third = st.snapshot();
    assert_eq!(third.changed, names(&api));
    assert_eq!(
        must_view(&third.v4, &api[0]).as_ref(),
        must_view(&first.v4, &api[0]).as_ref()
    );
}

#[test]
fn trigger_times_of_consumed_slice_changes_are_reported() {
    let (mut st, _) = partial_state();
    upsert(
        &mut st,
        slice(
            r#"
metadata:
  name: api-1
  namespace: default
  labels: {kubernetes.io/service-name: api}
  annotations: {endpoints.kubernetes.io/last-change-trigger-time: "2025-01-02T03:04:05Z"}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: grpc, port: 9090}]
endpoints: [{addresses: [10.244.2.30], nodeName: node-b}]
"#,
        ),
    );
    upsert(
        &mut st,
        slice(
            r#"
metadata:
  name: api-v6
  namespace: default
  labels: {kubernetes.io/service-name: api}
  annotations: {endpoints.kubernetes.io/last-change-trigger-time: "2025-01-02T03:04:06Z"}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ["fd00:10:244:2::30"], nodeName: node-b}]
"#,
        ),
    );
    let update = st.snapshot();
    let mut times = update.trigger_times.clone();
    times.sort();
    // Each under its slice's family (upstream's ip_family label).
    assert_eq!(
        times,
        [
            (IpFamily::V4, "2025-01-02T03:04:05Z".to_string()),
            (IpFamily::V6, "2025-01-02T03:04:06Z".to_string())
        ]
    );
    assert!(st.snapshot().trigger_times.is_empty(), "consumed once");
}

// ---------------------------------------------------------------------------
// Node label changes

/// topo: topology keys [zone]; hinted: trafficDistribution PreferSameZone with zone
/// hints. Each has one endpoint on node-b (zone-a) and one on node-c (zone-b).
fn add_topology_services(st: &mut ClusterState) {
    upsert(
        st,
        service(
            r#"
metadata:
  name: topo
  namespace: default
  annotations: {svcproxy.io/topology-keys: topology.kubernetes.io/zone}
spec:
  clusterIP: 10.96.0.70
  ports: [{name: http, port: 80}]
"#,
        ),
    );
    upsert(
        st,
        slice_of(
            "topo-1",
            "topo",
            "IPv4",
            &["{name: http, port: 8080}"],
            &[ep("10.244.2.70", "node-b"), ep("10.244.3.70", "node-c")],
        ),
    );
    upsert(
        st,
        service(
            r#"
metadata: {name: hinted, namespace: default}
spec:
  clusterIP: 10.96.0.71
  trafficDistribution: PreferSameZone
  ports: [{name: http, port: 80}]
"#,
        ),
    );
    upsert(
        st,
        slice_of(
            "hinted-1",
            "hinted",
            "IPv4",
            &["{name: http, port: 8080}"],
            &[
                "- {addresses: [10.244.2.71], nodeName: node-b, zone: zone-a, hints: {forZones: [{name: zone-a}]}}".to_string(),
                "- {addresses: [10.244.3.71], nodeName: node-c, zone: zone-b, hints: {forZones: [{name: zone-b}]}}".to_string(),
            ],
        ),
    );
}

fn set_node(st: &mut ClusterState, name: &str, v4: &str, zone: &str) {
    let n = name.trim_start_matches("node-");
    upsert(
        st,
        node(&node_yaml(
            name,
            v4,
            &format!("fd00::{n}"),
            zone,
            "10.244.0.0/24",
        )),
    );
}

#[test]
fn a_label_change_on_another_node_reevaluates_only_services_with_topology_keys() {
    let mut st = new_state();
    add_baseline(&mut st);
    add_topology_services(&mut st);
    let first = st.snapshot();
    let topo = tcp("default", "topo", "http");
    let hinted = tcp("default", "hinted", "http");
    assert_eq!(
        cluster_endpoints(must_view(&first.v4, &topo)),
        Some(strings(&["10.244.2.70:8080"]))
    );
    assert_eq!(
        cluster_endpoints(must_view(&first.v4, &hinted)),
        Some(strings(&["10.244.2.71:8080"]))
    );

    // node-c moves to zone-a: its endpoint now shares this node's zone.
    set_node(&mut st, "node-c", "192.168.0.3", "zone-a");
    let second = st.snapshot();
    assert_eq!(second.changed, only(&topo));
    assert_eq!(
        cluster_endpoints(must_view(&second.v4, &topo)),
        Some(strings(&["10.244.2.70:8080", "10.244.3.70:8080"]))
    );
    assert_views_reused(&first.v4, &second.v4, std::slice::from_ref(&topo));

    // An address change with the same labels re-evaluates nothing.
    set_node(&mut st, "node-c", "192.168.0.33", "zone-a");
    let third = st.snapshot();
    assert!(third.changed.is_empty(), "{:?}", third.changed);
    assert_views_reused(&second.v4, &third.v4, &[]);

    // node-b leaves zone-a, and an unknown node appears: topo follows.
    set_node(&mut st, "node-b", "192.168.0.2", "zone-b");
    set_node(&mut st, "node-d", "192.168.0.4", "zone-a");
    let fourth = st.snapshot();
    assert_eq!(fourth.changed, only(&topo));
    assert_eq!(
        cluster_endpoints(must_view(&fourth.v4, &topo)),
        Some(strings(&["10.244.3.70:8080"]))
    );

    // A deleted node's endpoints match no label key.
    delete(&mut st, Kind::Node, "", "node-c");
    let fifth = st.snapshot();
    assert_eq!(fifth.changed, only(&topo));
    assert_eq!(
        cluster_endpoints(must_view(&fifth.v4, &topo)),
        Some(vec![]),
        "no key yields: the service has no endpoints here"
    );
    assert!(must_view(&fifth.v4, &topo).selection.has_any_endpoints);
}

#[test]
fn a_label_change_on_this_node_reevaluates_every_service() {
    let mut st = new_state();
    add_baseline(&mut st);
    add_topology_services(&mut st);
    let first = st.snapshot();
    let topo = tcp("default", "topo", "http");
    let hinted = tcp("default", "hinted", "http");

    set_node(&mut st, "node-a", "192.168.0.1", "zone-b");
    let second = st.snapshot();
    assert_eq!(second.changed, names(&[hinted.clone(), topo.clone()]));
    assert_eq!(
        cluster_endpoints(must_view(&second.v4, &topo)),
        Some(strings(&["10.244.3.70:8080"]))
    );
    assert_eq!(
        cluster_endpoints(must_view(&second.v4, &hinted)),
        Some(strings(&["10.244.3.71:8080"]))
    );
    assert_eq!(
        second.v4.node.as_ref().unwrap().labels["topology.kubernetes.io/zone"],
        "zone-b".into()
    );
    // Re-evaluated but unchanged views keep their identity.
    assert_views_reused(&first.v4, &second.v4, &[hinted, topo]);
}

#[test]
fn this_nodes_object_arriving_late_reevaluates_every_service() {
    let mut st = new_state();
    add_topology_services(&mut st);
    let first = st.snapshot();
    let topo = tcp("default", "topo", "http");
    let hinted = tcp("default", "hinted", "http");
    assert!(first.v4.node.is_none());
    assert_eq!(
        cluster_endpoints(must_view(&first.v4, &topo)),
        Some(vec![]),
        "this node has no zone label yet, so the key yields nothing"
    );
    assert_eq!(
        cluster_endpoints(must_view(&first.v4, &hinted)),
        Some(strings(&["10.244.2.71:8080", "10.244.3.71:8080"]))
    );
    add_baseline(&mut st);
    let second = st.snapshot();
    assert!(second.v4.node.is_some());
    assert_eq!(
        cluster_endpoints(must_view(&second.v4, &topo)),
        Some(strings(&["10.244.2.70:8080"]))
    );
    assert_eq!(
        cluster_endpoints(must_view(&second.v4, &hinted)),
        Some(strings(&["10.244.2.71:8080"]))
    );
    assert!(second.changed.contains(&topo) && second.changed.contains(&hinted));
}

// ---------------------------------------------------------------------------
// Replace (a re-list)

fn replace(st: &mut ClusterState, kinds: &[Kind], objects: Vec<KubeObject>) {
    st.apply(SourceUpdate::Replace {
        kinds: kinds.to_vec(),
        objects: objects
            .into_iter()
            .map(|o| (o, ORIGIN.to_string()))
            .collect(),
    });
}

const BAD_SERVICE: &str = r#"
metadata: {name: bad, namespace: default}
spec:
  ports: [{name: http, port: 80}]
"#;

#[test]
fn a_replace_removes_what_is_missing_keeps_what_is_unchanged_and_adds_what_is_new() {
    let (mut st, first) = partial_state();
    upsert(&mut st, service(BAD_SERVICE));
    let bad = key(Kind::Service, "default", "bad");
    assert!(!problems_of(&st, &bad).is_empty());
    st.snapshot();

    let fresh = service(
        r#"
metadata: {name: fresh, namespace: default}
spec:
  clusterIP: 10.96.0.90
  ports: [{name: http, port: 80}]
"#,
    );
    replace(
        &mut st,
        &[Kind::Service],
        vec![
            service(WEB_SERVICE),
            service(DUAL_STACK),
            fresh,
            // Not of a kind being replaced: ignored.
            slice_of(
                "stray",
                "fresh",
                "IPv4",
                &["{name: http, port: 8080}"],
                &[ep("10.244.3.90", "node-c")],
            ),
        ],
    );
    assert!(
        problems_of(&st, &bad).is_empty(),
        "the rejected service is gone"
    );
    let second = st.snapshot();
    let api = [tcp("default", "api", "http"), tcp("default", "api", "grpc")];
    let fresh_http = tcp("default", "fresh", "http");
    let mut expected = api.to_vec();
    expected.push(fresh_http.clone());
    assert_eq!(second.changed, names(&expected));
    assert_views_reused(&first.v4, &second.v4, &api);
    assert_views_reused(&first.v6, &second.v6, &[]);
    assert!(must_view(&second.v4, &fresh_http).endpoints.is_empty());
    assert_eq!(
        port_names(&second.v4),
        strings(&["default/ds:http", "default/fresh:http", "default/web:http"])
    );
    // Slices were not replaced: api's slice is still there.
    upsert(&mut st, service(API_SERVICE));
    let third = st.snapshot();
    assert_eq!(must_view(&third.v4, &api[0]).endpoints.len(), 2);
}

#[test]
fn a_replace_with_an_identical_list_changes_nothing() {
    let (mut st, _) = partial_state();
    upsert(&mut st, service(BAD_SERVICE));
    let first = st.snapshot();
    let counts = st.invalid_counts().clone();
    let problems = st.problems();
    let all = || {
        let mut v = vec![
            service(WEB_SERVICE),
            slice(WEB_SLICE),
            service(API_SERVICE),
            api_slice(&[], 9090),
            service(BAD_SERVICE),
            service_cidr(
                "metadata: {name: cluster}\nspec: {cidrs: [\"10.96.0.0/16\", \"fd00:96::/112\"]}",
            ),
        ];
        for (name, v4, v6, zone, cidr) in [
            (
                "node-a",
                "192.168.0.1",
                "fd00::1",
                "zone-a",
                "10.244.1.0/24",
            ),
            (
                "node-b",
                "192.168.0.2",
                "fd00::2",
                "zone-a",
                "10.244.2.0/24",
            ),
            (
                "node-c",
                "192.168.0.3",
                "fd00::3",
                "zone-b",
                "10.244.3.0/24",
            ),
        ] {
            v.push(node(&node_yaml(name, v4, v6, zone, cidr)));
        }
        v.push(service(DUAL_STACK));
        v
    };
    let mut objects = all();
    objects.push(slice_of(
        "ds-v4",
        "ds",
        "IPv4",
        &["{name: http, port: 8080}"],
        &[ep("10.244.1.50", "node-a"), ep("10.244.2.50", "node-b")],
    ));
    objects.push(slice_of(
        "ds-v6",
        "ds",
        "IPv6",
        &["{name: http, port: 8080}"],
        &[
            ep("fd00:244::1:50", "node-a"),
            ep("fd00:244::3:50", "node-c"),
        ],
    ));
    replace(
        &mut st,
        &[
            Kind::Service,
            Kind::EndpointSlice,
            Kind::Node,
            Kind::ServiceCidr,
            Kind::Endpoints,
        ],
        objects,
    );
    assert_eq!(st.pending_changes(), (0, 0));
    let second = st.snapshot();
    assert!(second.changed.is_empty(), "{:?}", second.changed);
    assert_eq!((second.service_changes, second.endpoint_changes), (0, 0));
    assert_views_reused(&first.v4, &second.v4, &[]);
    assert_views_reused(&first.v6, &second.v6, &[]);
    assert_eq!(st.invalid_counts(), &counts, "nothing counted twice");
    assert_eq!(st.problems(), problems);
}

#[test]
fn a_replace_touches_only_the_kinds_it_names() {
    let (mut st, first) = partial_state();
    upsert(
        &mut st,
        slice(
            r#"
metadata: {name: orphan, namespace: default}
addressType: IPv4
endpoints: []
"#,
        ),
    );
    assert!(!st.problems().is_empty());
    replace(&mut st, &[Kind::EndpointSlice], vec![slice(WEB_SLICE)]);
    assert!(st.problems().is_empty(), "the rejected slice is gone too");
    let second = st.snapshot();
    let emptied = [
        tcp("default", "api", "http"),
        tcp("default", "api", "grpc"),
        tcp("default", "ds", "http"),
    ];
    assert_eq!(second.changed, names(&emptied));
    assert_views_reused(&first.v4, &second.v4, &emptied);
    assert_baseline_works(&second);
    for name in &emptied {
        assert!(must_view(&second.v4, name).endpoints.is_empty());
    }
    assert!(must_view(&second.v6, &emptied[2]).endpoints.is_empty());
    assert!(second.v4.node.is_some(), "nodes were not replaced");
}

// ---------------------------------------------------------------------------
// Legacy Endpoints

const LEGACY_SERVICE: &str = r#"
metadata: {name: legacy, namespace: default}
spec:
  clusterIP: 10.96.0.80
  ports: [{name: http, port: 80, targetPort: 8080}]
"#;

const LEGACY_ENDPOINTS: &str = r#"
metadata: {name: legacy, namespace: default}
subsets:
- addresses:
  - {ip: 10.244.1.80, nodeName: node-a}
  - {ip: 10.244.2.80, nodeName: node-b}
  notReadyAddresses:
  - {ip: 10.244.3.80, nodeName: node-c}
  ports: [{name: http, port: 8080, protocol: TCP}]
"#;

#[test]

fn legacy_endpoints_give_their_service_endpoints() {
    let mut st = new_state();
    add_baseline(&mut st);
    upsert(&mut st, service(LEGACY_SERVICE));
    upsert(&mut st, endpoints(LEGACY_ENDPOINTS));
    let update = st.snapshot();
    assert_baseline_works(&update);
    let v = must_view(&update.v4, &tcp("default", "legacy", "http"));
    assert_eq!(
        all_endpoints(v),
        strings(&["10.244.1.80:8080", "10.244.2.80:8080", "10.244.3.80:8080"])
    );
    assert_eq!(
        cluster_endpoints(v),
        Some(strings(&["10.244.1.80:8080", "10.244.2.80:8080"])),
        "notReadyAddresses are not ready"
    );
    let local = v.endpoints.iter().find(|e| e.ip == ip("10.244.1.80"));
    assert_eq!(
        local.and_then(|e| e.node_name.as_deref()),
        Some("node-a"),
        "nodeName is carried over"
    );
    expect_no_problems(&st);
}

#[test]

fn updating_and_deleting_legacy_endpoints_updates_and_removes_their_endpoints() {
    let mut st = new_state();
    add_baseline(&mut st);
    upsert(&mut st, service(LEGACY_SERVICE));
    upsert(&mut st, endpoints(LEGACY_ENDPOINTS));
    let first = st.snapshot();
    let name = tcp("default", "legacy", "http");
    assert_eq!(must_view(&first.v4, &name).endpoints.len(), 3);

    upsert(
        &mut st,
        endpoints(
            r#"
metadata: {name: legacy, namespace: default}
subsets:
- addresses: [{ip: 10.244.2.81, nodeName: node-b}]
  ports: [{name: http, port: 8081}]
"#,
        ),
    );
    let second = st.snapshot();
    assert_eq!(second.changed, only(&name));
    assert_eq!(
        all_endpoints(must_view(&second.v4, &name)),
        strings(&["10.244.2.81:8081"])
    );

    delete(&mut st, Kind::Endpoints, "default", "legacy");
    let third = st.snapshot();
    assert_eq!(third.changed, only(&name));
    assert!(must_view(&third.v4, &name).endpoints.is_empty());
    assert_views_reused(&second.v4, &third.v4, &[name]);
}

#[test]
fn legacy_endpoints_never_break_the_rest() {
    // Whatever the mirror produces (it may still be a placeholder), an Endpoints
    // object and its deletion leave the other services alone.
    let mut st = new_state();
    add_baseline(&mut st);
    upsert(&mut st, service(LEGACY_SERVICE));
    upsert(&mut st, endpoints(LEGACY_ENDPOINTS));
    let first = st.snapshot();
    assert_baseline_works(&first);
    delete(&mut st, Kind::Endpoints, "default", "legacy");
    let second = st.snapshot();
    assert_baseline_works(&second);
    assert!(view(&second.v4, &tcp("default", "legacy", "http")).is_some());
}

#[test]

fn a_relist_of_slices_alone_keeps_the_slices_mirrored_from_legacy_endpoints() {
    let mut st = new_state();
    add_baseline(&mut st);
    upsert(&mut st, service(LEGACY_SERVICE));
    upsert(&mut st, endpoints(LEGACY_ENDPOINTS));
    let first = st.snapshot();
    let name = tcp("default", "legacy", "http");
    assert_eq!(must_view(&first.v4, &name).endpoints.len(), 3);
    replace(&mut st, &[Kind::EndpointSlice], vec![slice(WEB_SLICE)]);
    let second = st.snapshot();
    assert!(second.changed.is_empty(), "{:?}", second.changed);
    assert_eq!(must_view(&second.v4, &name).endpoints.len(), 3);
}

#[test]

fn a_relist_with_identical_legacy_endpoints_counts_nothing_again() {
    let legacy = || {
        endpoints(
            r#"
metadata: {name: legacy, namespace: default}
subsets:
- addresses:
  - {ip: 10.244.1.80, nodeName: node-a}
  - {ip: 127.0.0.1, nodeName: node-a}
  ports: [{name: http, port: 8080}]
"#,
        )
    };
    let mut st = new_state();
    add_baseline(&mut st);
    upsert(&mut st, service(LEGACY_SERVICE));
    upsert(&mut st, legacy());
    assert!(
        !st.problems().is_empty(),
        "the loopback address is reported"
    );
    let counts = st.invalid_counts().clone();
    let first = st.snapshot();
    replace(
        &mut st,
        &[Kind::EndpointSlice, Kind::Endpoints],
        vec![slice(WEB_SLICE), legacy()],
    );
    assert_eq!(st.invalid_counts(), &counts, "nothing counted twice");
    let second = st.snapshot();
    assert!(second.changed.is_empty(), "{:?}", second.changed);
    assert_views_reused(&first.v4, &second.v4, &[]);
    assert_eq!(
        all_endpoints(must_view(&second.v4, &tcp("default", "legacy", "http"))),
        strings(&["10.244.1.80:8080"])
    );
}

// ---------------------------------------------------------------------------
// Problems are recorded once

fn bad_objects() -> Vec<KubeObject> {
    vec![
        service(
            r#"
metadata: {name: flawed, namespace: default}
spec:
  clusterIP: 10.96.0.95
  externalIPs: [bogus]
  ports: [{name: http, port: 80}, {name: BAD, port: 81}]
"#,
        ),
        service(BAD_SERVICE),
        slice(
            r#"
metadata:
  name: web-flawed
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [127.0.0.1]}, {addresses: [10.244.3.5]}]
"#,
        ),
        node("metadata: {name: Bad_Node}"),
    ]
}

#[test]
fn re_upserting_an_identical_bad_object_does_not_count_again() {
    let mut st = new_state();
    add_baseline(&mut st);
    for o in bad_objects() {
        upsert(&mut st, o);
    }
    let counts = st.invalid_counts().clone();
    assert_eq!(counts.get(&Kind::Service), Some(&3));
    assert_eq!(counts.get(&Kind::EndpointSlice), Some(&1));
    assert_eq!(counts.get(&Kind::Node), Some(&1));
    let problems = st.problems();
    st.snapshot();
    for _ in 0..3 {
        for o in bad_objects() {
            upsert(&mut st, o);
        }
        let update = st.snapshot();
        assert!(update.changed.is_empty());
        assert_eq!(st.invalid_counts(), &counts);
        assert_eq!(st.problems(), problems);
    }
    // The flawed service works without its bad parts; web keeps its extra endpoint.
    let update = st.snapshot();
    let flawed = must_view(&update.v4, &tcp("default", "flawed", "http"));
    assert!(flawed.port.external_ips.is_empty());
    assert_eq!(
        all_endpoints(must_view(&update.v4, &tcp("default", "web", "http"))),
        strings(&["10.244.1.5:8080", "10.244.2.5:8080", "10.244.3.5:8080"])
    );
}

#[test]
fn a_changed_bad_object_counts_again_and_a_fixed_or_deleted_one_clears_its_problems() {
    let mut st = new_state();
    add_baseline(&mut st);
    upsert(&mut st, service(BAD_SERVICE));
    let bad = key(Kind::Service, "default", "bad");
    assert_eq!(count(&st, Kind::Service), 1);

    // Differently bad: news, counted.
    upsert(
        &mut st,
        service(&BAD_SERVICE.replace("ports:", "clusterIP: nope\n  ports:")),
    );
    expect_problems(
        &st,
        &bad,
        &[
            ("spec.clusterIPs[0]", Severity::Ignored),
            ("spec.clusterIPs", Severity::Rejected),
        ],
    );
    assert_eq!(count(&st, Kind::Service), 3);

    // Fixed: its problems go, the counter (a total since start) stays.
    upsert(
        &mut st,
        service(&BAD_SERVICE.replace("ports:", "clusterIP: 10.96.0.96\n  ports:")),
    );
    assert!(problems_of(&st, &bad).is_empty());
    assert_eq!(count(&st, Kind::Service), 3);
    let update = st.snapshot();
    must_view(&update.v4, &tcp("default", "bad", "http"));

    // Broken again, then deleted: the problems go with the object.
    upsert(&mut st, service(BAD_SERVICE));
    assert_eq!(count(&st, Kind::Service), 4);
    delete(&mut st, Kind::Service, "default", "bad");
    assert!(st.problems().is_empty());
    let update = st.snapshot();
    assert!(view(&update.v4, &tcp("default", "bad", "http")).is_none());
}

/// web-metrics names a port web does not have.
fn add_unmatched_slice(st: &mut ClusterState) {
    upsert(
        st,
        slice_of(
            "web-metrics",
            "web",
            "IPv4",
            &["{name: metrics, port: 9090}"],
            &[ep("10.244.3.5", "node-c")],
        ),
    );
}

#[test]
fn an_unmatched_slice_port_is_counted_when_found() {
    let mut st = new_state();
    add_baseline(&mut st);
    add_unmatched_slice(&mut st);
    st.snapshot();
    assert_eq!(count(&st, Kind::EndpointSlice), 1);
    // Nothing about web changed: not found again.
    let update = st.snapshot();
    assert_eq!(count(&st, Kind::EndpointSlice), 1);
    assert_baseline_works(&update);
}

#[test]

fn an_unmatched_slice_port_is_counted_once() {
    let mut st = new_state();
    add_baseline(&mut st);
    add_unmatched_slice(&mut st);
    st.snapshot();
    assert_eq!(count(&st, Kind::EndpointSlice), 1);

    // Another slice of web changes: the unmatched port is old news.
    upsert(
        &mut st,
        slice(&WEB_SLICE.replace("10.244.2.5", "10.244.2.6")),
    );
    st.snapshot();
    assert_eq!(
        count(&st, Kind::EndpointSlice),
        1,
        "after a sibling slice change"
    );

    // This node's labels change: every service is re-evaluated.
    set_node(&mut st, "node-a", "192.168.0.1", "zone-b");
    st.snapshot();
    assert_eq!(count(&st, Kind::EndpointSlice), 1, "after a full rebuild");
}

#[test]

fn an_unmatched_slice_port_is_listed_among_the_slices_problems() {
    let mut st = new_state();
    add_baseline(&mut st);
    add_unmatched_slice(&mut st);
    st.snapshot();
    let k = key(Kind::EndpointSlice, "default", "web-metrics");
    let problems = problems_of(&st, &k);
    assert!(
        problems.iter().any(|p| p.field == "ports[0]"),
        "{:#?}",
        st.problems()
    );
    // Fixing the service (it gains the port) clears it.
    upsert(
        &mut st,
        service(&WEB_SERVICE.replace(
            "- {name: http, port: 80, targetPort: 8080, protocol: TCP}",
            "- {name: http, port: 80, targetPort: 8080, protocol: TCP}\n  - {name: metrics, port: 9090}",
        )),
    );
    st.snapshot();
    assert!(problems_of(&st, &k).is_empty());
}
