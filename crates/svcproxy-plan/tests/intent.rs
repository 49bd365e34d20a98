//! The intent decides every behaviour of the service proxy implementation notes,
//! without naming a backend: each case builds objects on the shared address plan
//! (see `common`), takes the intent for node-a, and checks the decision for one
//! frontend. Nothing here imports a data plane.
//!
//! Address plan: node-a 198.18.0.1 (pods 198.18.1.0/24, local), node-b 198.18.0.2
//! (pods 198.18.2.0/24); ServiceCIDR 198.19.0.0/16; external and LB IPs in
//! 203.0.113.0/24; clients outside in 198.51.100.0/24.

mod common;

use std::net::{IpAddr, SocketAddr};

use common::*;
use svcproxy_core::model::{IpFamily, Protocol, Scheduler};
use svcproxy_plan::intent::{
    Action, Disposition, EndpointSetId, ExternalRoute, Frontend, FrontendKey, FrontendKind,
    IntentBuilder, Masquerade, Origin, PacketOrigin, ServiceIntent, SocketVerdict,
};
use svcproxy_plan::{Intent, LocalDetection};

const LOCAL_POD: &str = "198.18.1.10";
const REMOTE_POD: &str = "198.18.2.10";

/// The intent of node-a for these objects, with `tweak` applied to the config.
fn intent_with(yaml: &str, tweak: impl FnOnce(&mut svcproxy_plan::PlanConfig)) -> Intent {
    let mut sc = Scenario::empty("node-a");
    tweak(&mut sc.cfg);
    sc.upsert_yaml(yaml);
    sc.intent()
}

fn intent(yaml: &str) -> Intent {
    intent_with(yaml, |_| {})
}

fn vip(ip: &str, port: u16) -> FrontendKey {
    FrontendKey::Vip {
        ip: ip.parse().unwrap(),
        protocol: Protocol::Tcp,
        port,
    }
}

fn node_port(port: u16) -> FrontendKey {
    FrontendKey::NodePort {
        protocol: Protocol::Tcp,
        port,
    }
}

/// The frontend at `key` (IPv4) and the service port that owns it.
fn at(intent: &Intent, key: FrontendKey) -> (ServiceIntent, Frontend) {
    let (svc, f) = intent
        .family(IpFamily::V4)
        .frontend(&key)
        .unwrap_or_else(|| panic!("no frontend {key}"));
    ((**svc).clone(), *f)
}

fn eps(list: &[&str]) -> Option<Vec<SocketAddr>> {
    Some(
        list.iter()
            .map(|ip| SocketAddr::new(ip.parse::<IpAddr>().unwrap(), 8080))
            .collect(),
    )
}

#[test]
fn a_cluster_ip_forwards_to_every_ready_endpoint() {
    let i = intent(&service(
        "web",
        10,
        "",
        &[ready(LOCAL_POD, "node-a"), ready(REMOTE_POD, "node-b")],
    ));
    let (svc, f) = at(&i, vip("198.19.0.10", 80));
    assert_eq!(
        (f.kind, f.action),
        (FrontendKind::ClusterIp, Action::Forward)
    );
    assert_eq!(svc.internal.set, EndpointSetId::Cluster);
    assert_eq!(
        svc.set(EndpointSetId::Cluster),
        eps(&[LOCAL_POD, REMOTE_POD])
    );
    assert!(!f.firewall);
}

#[test]
fn not_ready_endpoints_are_not_used() {
    let i = intent(&service(
        "web",
        10,
        "",
        &[
            ready(LOCAL_POD, "node-a"),
            (REMOTE_POD, "node-b", false, false, false),
        ],
    ));
    let (svc, _) = at(&i, vip("198.19.0.10", 80));
    assert_eq!(svc.set(EndpointSetId::Cluster), eps(&[LOCAL_POD]));
}

#[test]
fn a_service_without_endpoints_rejects_on_every_frontend() {
    let i = intent(&service(
        "empty",
        40,
        "  type: NodePort\n  externalIPs: [203.0.113.40]",
        &[],
    ));
    for key in [
        vip("198.19.0.40", 80),
        vip("203.0.113.40", 80),
        node_port(30040),
    ] {
        let (svc, f) = at(&i, key);
        assert_eq!(f.action, Action::Reject, "{key}");
        assert!(!svc.has_any_endpoints);
    }
}

#[test]
fn only_serving_terminating_endpoints_are_used_when_none_is_ready() {
    let i = intent(&service(
        "drain",
        10,
        "",
        &[
            terminating(LOCAL_POD, "node-a"),
            (REMOTE_POD, "node-b", false, false, true),
        ],
    ));
    let (svc, f) = at(&i, vip("198.19.0.10", 80));
    assert_eq!(f.action, Action::Forward);
    assert_eq!(svc.set(EndpointSetId::Cluster), eps(&[LOCAL_POD]));
}

#[test]
fn cluster_ip_traffic_is_masqueraded_unless_it_comes_from_a_local_pod() {
    let yaml = service("web", 10, "", &[ready(REMOTE_POD, "node-b")]);
    let (svc, _) = at(&intent(&yaml), vip("198.19.0.10", 80));
    assert_eq!(svc.internal.masquerade, Masquerade::UnlessFromLocalPod);

    let all = intent_with(&yaml, |c| c.masquerade_all = true);
    assert_eq!(
        at(&all, vip("198.19.0.10", 80)).0.internal.masquerade,
        Masquerade::Always
    );

    // Without a way to tell local traffic, nothing is masqueraded for being
    // non-local (as upstream without a local detector).
    let blind = intent_with(&yaml, |c| c.local_detection = LocalDetection::None);
    assert_eq!(
        at(&blind, vip("198.19.0.10", 80)).0.internal.masquerade,
        Masquerade::Never
    );
}

#[test]
fn internal_local_policy_uses_only_this_nodes_endpoints() {
    let i = intent(&service(
        "agent",
        60,
        "  internalTrafficPolicy: Local",
        &[ready(LOCAL_POD, "node-a"), ready(REMOTE_POD, "node-b")],
    ));
    let (svc, f) = at(&i, vip("198.19.0.60", 80));
    assert_eq!(f.action, Action::Forward);
    assert_eq!(svc.internal.set, EndpointSetId::Local);
    assert_eq!(svc.set(EndpointSetId::Local), eps(&[LOCAL_POD]));
}

#[test]
fn internal_local_policy_without_local_endpoints_drops_while_others_exist() {
    let i = intent(&service(
        "agent",
        61,
        "  internalTrafficPolicy: Local",
        &[ready(REMOTE_POD, "node-b")],
    ));
    assert_eq!(at(&i, vip("198.19.0.61", 80)).1.action, Action::Drop);
}

#[test]
fn external_cluster_policy_masquerades_every_external_connection() {
    let i = intent(&service(
        "web",
        11,
        "  type: NodePort\n  externalIPs: [203.0.113.11]",
        &[ready(REMOTE_POD, "node-b")],
    ));
    for key in [node_port(30011), vip("203.0.113.11", 80)] {
        let (svc, f) = at(&i, key);
        assert_eq!(f.action, Action::Forward, "{key}");
        assert_eq!(
            svc.external,
            Some(ExternalRoute {
                masquerade: true,
                pods_to_cluster: false,
                host_masquerade: false,
                host_to_cluster: false,
                rest: Disposition::Forward(EndpointSetId::Cluster),
            }),
            "{key}"
        );
    }
    assert_eq!(
        at(&i, vip("203.0.113.11", 80)).1.kind,
        FrontendKind::ExternalIp
    );
}

#[test]
fn external_local_policy_keeps_the_client_address_and_uses_local_endpoints() {
    let i = intent(&service(
        "lb",
        30,
        "  type: LoadBalancer\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 32030\nstatus:\n  loadBalancer:\n    ingress:\n    - {ip: 203.0.113.30}",
        &[ready(LOCAL_POD, "node-a"), ready(REMOTE_POD, "node-b")],
    ));
    let (svc, f) = at(&i, vip("203.0.113.30", 80));
    assert_eq!(
        (f.kind, f.action),
        (FrontendKind::LoadBalancerIp, Action::Forward)
    );
    let route = svc.external.unwrap();
    assert!(!route.masquerade);
    assert_eq!(route.rest, Disposition::Forward(EndpointSetId::Local));
    assert_eq!(svc.set(EndpointSetId::Local), eps(&[LOCAL_POD]));
    // Pods and the host reaching the LB IP are short-circuited to every endpoint.
    assert!(route.pods_to_cluster && route.host_masquerade && route.host_to_cluster);
    assert_eq!(
        svc.set(EndpointSetId::Cluster),
        eps(&[LOCAL_POD, REMOTE_POD])
    );
    assert_eq!(svc.health_check_node_port, Some(32030));
    // Internal traffic still uses the cluster policy.
    assert_eq!(svc.internal.set, EndpointSetId::Cluster);
}

#[test]
fn external_local_policy_without_local_endpoints_drops_others_but_short_circuits_pods_and_host() {
    let i = intent(&service(
        "remote",
        50,
        "  type: NodePort\n  externalTrafficPolicy: Local",
        &[ready(REMOTE_POD, "node-b")],
    ));
    let (svc, f) = at(&i, node_port(30050));
    assert_eq!(f.action, Action::Forward);
    let route = svc.external.unwrap();
    assert_eq!(route.rest, Disposition::Drop);
    assert!(route.pods_to_cluster && route.host_to_cluster);
    // Without local-traffic detection pods cannot be told apart: no pod short
    // circuit, the host one stays.
    let blind = intent_with(
        &service(
            "remote",
            50,
            "  type: NodePort\n  externalTrafficPolicy: Local",
            &[ready(REMOTE_POD, "node-b")],
        ),
        |c| c.local_detection = LocalDetection::None,
    );
    let route = at(&blind, node_port(30050)).0.external.unwrap();
    assert!(!route.pods_to_cluster && route.host_to_cluster);
}

#[test]
fn external_local_policy_with_no_endpoint_anywhere_rejects() {
    let i = intent(&service(
        "gone",
        51,
        "  type: NodePort\n  externalTrafficPolicy: Local",
        &[],
    ));
    assert_eq!(at(&i, node_port(30051)).1.action, Action::Reject);
    assert_eq!(at(&i, vip("198.19.0.51", 80)).1.action, Action::Reject);
}

#[test]
fn load_balancer_source_ranges_fence_only_the_load_balancer_ips() {
    let i = intent(&service(
        "api",
        31,
        "  type: LoadBalancer\n  externalIPs: [203.0.113.131]\n  loadBalancerSourceRanges: [198.51.100.0/24, 198.18.0.0/24]\nstatus:\n  loadBalancer:\n    ingress:\n    - {ip: 203.0.113.31}",
        &[ready(REMOTE_POD, "node-b")],
    ));
    let (svc, f) = at(&i, vip("203.0.113.31", 80));
    assert!(f.firewall);
    let fw = svc.firewall.unwrap();
    assert_eq!(
        fw.ranges,
        [
            "198.18.0.0/24".parse().unwrap(),
            "198.51.100.0/24".parse().unwrap()
        ]
    );
    // node-a's 198.18.0.1 is inside: the node itself may connect.
    assert!(fw.allow_from_node);
    assert!(!at(&i, vip("203.0.113.131", 80)).1.firewall);
    assert!(!at(&i, node_port(30031)).1.firewall);
    assert!(!at(&i, vip("198.19.0.31", 80)).1.firewall);
}

#[test]
fn a_load_balancer_ip_in_proxy_mode_is_left_to_the_load_balancer() {
    let i = intent(&service(
        "proxied",
        32,
        "  type: LoadBalancer\nstatus:\n  loadBalancer:\n    ingress:\n    - {ip: 203.0.113.32, ipMode: Proxy}",
        &[ready(REMOTE_POD, "node-b")],
    ));
    assert!(i
        .family(IpFamily::V4)
        .frontend(&vip("203.0.113.32", 80))
        .is_none());
    assert!(i.family(IpFamily::V4).frontend(&node_port(30032)).is_some());
}

#[test]
fn client_ip_session_affinity_carries_its_timeout() {
    let i = intent(&service(
        "sticky",
        70,
        "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}",
        &[ready(LOCAL_POD, "node-a")],
    ));
    assert_eq!(at(&i, vip("198.19.0.70", 80)).0.affinity_timeout, Some(60));
}

#[test]
fn hard_topology_keys_without_a_match_reject_cluster_traffic() {
    let i = intent(&service(
        "rack",
        120,
        "",
        &[ready(REMOTE_POD, "node-b")],
    )
    .replace(
        "metadata: {name: rack, namespace: demo}",
        "metadata: {name: rack, namespace: demo, annotations: {svcproxy.io/topology-keys: kubernetes.io/hostname}}",
    ));
    let (svc, f) = at(&i, vip("198.19.0.120", 80));
    assert_eq!(f.action, Action::Reject);
    assert!(svc.has_any_endpoints);
}

#[test]
fn a_contested_address_goes_to_the_first_port_by_name_and_is_reported() {
    let yaml = format!(
        "{}\n---\n{}",
        service(
            "beta",
            131,
            "  externalIPs: [203.0.113.130]",
            &[ready(LOCAL_POD, "node-a")]
        ),
        service(
            "alpha",
            130,
            "  externalIPs: [203.0.113.130]",
            &[ready(REMOTE_POD, "node-b")]
        ),
    );
    let i = intent(&yaml);
    let (svc, _) = at(&i, vip("203.0.113.130", 80));
    assert_eq!(svc.name.service.name.as_ref(), "alpha");
    let conflicts = i.conflicts();
    assert_eq!(conflicts.len(), 1);
    assert_eq!(conflicts[0].destination, "203.0.113.130:80/TCP");
    assert_eq!(conflicts[0].ignored[0].service.name.as_ref(), "beta");
    // The loser keeps what it does not contest.
    assert_eq!(
        at(&i, vip("198.19.0.131", 80)).0.name.service.name.as_ref(),
        "beta"
    );
}

#[test]
fn a_cluster_ip_also_listed_as_external_ip_stays_a_cluster_ip() {
    let i = intent(&service(
        "self",
        12,
        "  externalIPs: [198.19.0.12]",
        &[ready(REMOTE_POD, "node-b")],
    ));
    assert_eq!(
        at(&i, vip("198.19.0.12", 80)).1.kind,
        FrontendKind::ClusterIp
    );
}

#[test]
fn node_wide_parts_follow_the_configuration_and_the_node() {
    let i = intent(&service("web", 10, "", &[ready(LOCAL_POD, "node-a")]));
    let v4 = i.family(IpFamily::V4);
    let node = v4.node().unwrap();
    assert_eq!(node.masquerade_mark, 0x4000);
    assert_eq!(node.service_cidrs, ["198.19.0.0/16".parse().unwrap()]);
    assert_eq!(
        v4.cluster_ips().collect::<Vec<_>>(),
        ["198.19.0.10".parse::<IpAddr>().unwrap()]
    );

    let v4_only = intent_with(&service("web", 10, "", &[]), |c| c.ipv6 = false);
    assert!(v4_only.family(IpFamily::V6).node().is_none());
    assert!(v4_only.family(IpFamily::V6).services().is_empty());
}

#[test]
fn the_delta_names_exactly_what_changed() {
    let mut sc = Scenario::empty("node-a");
    sc.upsert_yaml(&format!(
        "{}\n---\n{}",
        service("web", 10, "", &[ready(LOCAL_POD, "node-a")]),
        service("db", 20, "", &[ready(REMOTE_POD, "node-b")]),
    ));
    let mut builder = IntentBuilder::new();
    let up = sc.snapshot();
    let first = builder.update(&up.v4, &up.v6, &sc.cfg, &up.changed);
    assert!(first.family(IpFamily::V4).node_changed);
    assert_eq!(first.family(IpFamily::V4).services.len(), 2);

    // Nothing changed: an empty delta, nothing decided again.
    let up = sc.snapshot();
    let idle = builder.update(&up.v4, &up.v6, &sc.cfg, &up.changed);
    assert!(idle.is_empty(), "{idle:?}");
    assert_eq!(idle.rebuilt, 0);
    assert_eq!(idle.from, first.to);

    // A port the caller names changed is decided again even when its view is the
    // same `Arc` (and, decided alike, is no change); a name of no port is ignored.
    let web = up
        .v4
        .service_ports
        .keys()
        .find(|k| &*k.service.name == "web")
        .unwrap()
        .clone();
    let named = builder.update(
        &up.v4,
        &up.v6,
        &sc.cfg,
        &std::collections::BTreeSet::from([web, spn("default", "gone", "", Protocol::Tcp)]),
    );
    assert_eq!(named.rebuilt, 1);
    assert!(named.is_empty(), "{named:?}");

    // db loses its endpoint: one service and its one frontend change to reject.
    sc.upsert_yaml(&service("db", 20, "", &[]));
    let up = sc.snapshot();
    let d = builder.update(&up.v4, &up.v6, &sc.cfg, &up.changed);
    let fd = d.family(IpFamily::V4);
    assert!(!fd.node_changed);
    assert_eq!(fd.services.len(), 1);
    assert_eq!(fd.services[0].name.service.name.as_ref(), "db");
    assert_eq!(fd.frontends.len(), 1);
    assert_eq!(fd.frontends[0].key, vip("198.19.0.20", 80));
    let after = fd.frontends[0].after.as_ref().unwrap();
    assert_eq!(
        after.frontend(&vip("198.19.0.20", 80)).unwrap().action,
        Action::Reject
    );
    assert!(fd.cluster_ips_added.is_empty() && fd.cluster_ips_removed.is_empty());
}

/// Upstream's iptables mode leaves the service address space alone: the intent says so
/// and the nftables translation then has no cluster-IP reject or ServiceCIDR drop.
#[test]
fn an_unguarded_service_address_space_is_routed() {
    let yaml = service("web", 10, "", &[ready("198.18.1.10", "node-a")]);
    let guarded = intent(&yaml);
    let text = svcproxy_plan::intent::describe(&guarded);
    assert!(text.contains("(other ports: reject)") && text.contains("(unallocated: drop)"));
    let open = intent_with(&yaml, |c| c.guard_service_ips = false);
    let text = svcproxy_plan::intent::describe(&open);
    assert!(
        text.contains("(other ports: routed)") && text.contains("(unallocated: routed)"),
        "{text}"
    );
    let nft = svcproxy_plan::nft::render_full(&open);
    assert!(
        !nft.contains("daddr @cluster-ips goto reject-chain"),
        "{nft}"
    );
    assert!(
        svcproxy_plan::nft::render_full(&guarded).contains("daddr @cluster-ips goto reject-chain")
    );
}

/// Upstream's iptables mode drops forwarded conntrack-INVALID packets unless conntrack
/// is liberal; the intent says so, and both translations honour it.
#[test]
fn invalid_forwarded_packets_are_dropped_unless_conntrack_is_liberal() {
    let yaml = service("web", 10, "", &[ready("198.18.1.10", "node-a")]);
    let strict = intent_with(&yaml, |c| c.drop_invalid_forwarded = true);
    let node = strict.family(IpFamily::V4).node().unwrap().clone();
    assert!(node.drop_invalid_forwarded);
    assert!(svcproxy_plan::nft::render_full(&strict).contains("ct state invalid drop"));
    let ipt = svcproxy_plan::iptables::render_full(&strict);
    assert!(
        ipt.contains("-A SVCPROXY-FORWARD -m conntrack --ctstate INVALID -j DROP"),
        "{ipt}"
    );
    let liberal = intent_with(&yaml, |c| {
        c.drop_invalid_forwarded = true;
        c.conntrack_tcp_be_liberal = true;
    });
    assert!(
        !liberal
            .family(IpFamily::V4)
            .node()
            .unwrap()
            .drop_invalid_forwarded
    );
    assert!(!svcproxy_plan::iptables::render_full(&liberal).contains("INVALID"));
    // nftables mode (the default semantics) never asks for it.
    assert!(!svcproxy_plan::nft::render_full(&intent(&yaml)).contains("invalid"));
}

#[test]
fn only_endpoints_that_may_be_this_nodes_own_need_the_hairpin_masquerade() {
    // (An empty nodeName is unset.)
    let i = intent(&service(
        "web",
        10,
        "",
        &[
            ready(LOCAL_POD, "node-a"),
            ready(REMOTE_POD, "node-b"),
            ready("198.18.3.10", ""),
            ready("198.18.0.1", "node-b"),
        ],
    ));
    let (svc, _) = at(&i, vip("198.19.0.10", 80));
    let hairpin: Vec<(String, bool)> = (0..svc.endpoints.len())
        .map(|i| {
            (
                svc.endpoints.get(i).ip().to_string(),
                svc.endpoints.hairpin(i),
            )
        })
        .collect();
    assert_eq!(
        hairpin,
        [
            // node-a's own address, whatever nodeName says
            ("198.18.0.1".to_string(), true),
            (LOCAL_POD.to_string(), true),
            (REMOTE_POD.to_string(), false),
            // no nodeName: it could be anywhere
            ("198.18.3.10".to_string(), true),
        ]
    );
}

/// Service `s<i>` (a ClusterIP, one port) with `n` ready endpoints on `node`.
fn many(i: usize, node: &str, n: usize) -> String {
    let mut eps = String::new();
    for e in 0..n {
        eps.push_str(&format!(
            "- {{addresses: [198.18.{}.{}], nodeName: {node}}}\n",
            i % 200,
            e + 1
        ));
    }
    let eps = if eps.is_empty() {
        " []\n".to_string()
    } else {
        format!("\n{eps}")
    };
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: demo}}\nspec:\n  \
         clusterIP: 198.19.{}.{}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: s{i}-1, \
         namespace: demo, labels: {{kubernetes.io/service-name: s{i}}}}}\naddressType: IPv4\n\
         ports: [{{name: http, port: 8080}}]\nendpoints:{eps}",
        i / 200,
        i % 200 + 1
    )
}

#[test]
fn an_intent_kept_from_update_to_update_equals_one_built_from_scratch() {
    // Enough service ports for several chunks of the snapshot's map, so that most of
    // each update is skipped as shared.
    let mut sc = Scenario::empty("node-a");
    let n = 600;
    let all: Vec<String> = (0..n).map(|i| many(i, "node-b", 2)).collect();
    sc.upsert_yaml(&all.join("\n---\n"));
    let mut builder = IntentBuilder::new();
    let mut rng = svcproxy_testkit::rng::XorShift::new(0x2545_f491_4f6c_dd1d);
    for round in 0..30 {
        let up = sc.snapshot();
        builder.update(&up.v4, &up.v6, &sc.cfg, &up.changed);
        let fresh = svcproxy_plan::build_intent(&up.v4, &up.v6, &sc.cfg);
        for family in IpFamily::BOTH {
            assert_eq!(
                builder.intent().family(family).services(),
                fresh.family(family).services(),
                "round {round} {family:?}"
            );
        }
        for _ in 0..4 {
            let seed = rng.next_u64();
            let i = (seed % n as u64) as usize;
            match seed / 7 % 4 {
                0 => sc.upsert_yaml(&many(i, "node-a", 1 + i % 3)),
                1 => sc.upsert_yaml(&many(i, "node-b", 0)),
                2 => sc.upsert_yaml(&many(i, "node-b", 2)),
                _ => sc.state.apply(svcproxy_core::objects::SourceUpdate::Delete(
                    svcproxy_core::objects::ObjectKey::new(
                        svcproxy_core::objects::Kind::Service,
                        "demo",
                        format!("s{i}"),
                    ),
                )),
            }
        }
    }
}

/// A connection made on the node and translated at its socket meets the same
/// decisions as its packets would, read for a source that is the node's own.
#[test]
fn packets_no_socket_translated_follow_the_same_routes_and_masquerade() {
    // (verdict, masquerade) from this node's pods, and from elsewhere.
    let verdicts = |i: &Intent, key: FrontendKey| {
        let (svc, f) = at(i, key);
        let v = |o| {
            let p = svc.packet_verdict(&f, o);
            (p.verdict, p.masquerade)
        };
        (v(PacketOrigin::LocalPod), v(PacketOrigin::Elsewhere))
    };
    use SocketVerdict::*;
    let fwd = Forward(EndpointSetId::Cluster);
    // A cluster IP: masqueraded unless it comes from this node's pods.
    let i = intent(&service("web", 10, "", &[ready(REMOTE_POD, "node-b")]));
    assert_eq!(
        verdicts(&i, vip("198.19.0.10", 80)),
        ((fwd, false), (fwd, true))
    );
    // --masquerade-all: from anywhere.
    let all = intent_with(
        &service("web", 10, "", &[ready(REMOTE_POD, "node-b")]),
        |c| c.masquerade_all = true,
    );
    assert_eq!(
        verdicts(&all, vip("198.19.0.10", 80)),
        ((fwd, true), (fwd, true))
    );
    // Without local-traffic detection nothing is masqueraded (upstream: no
    // rule can tell), whatever the origin the programs assume.
    let blind = intent_with(
        &service("web", 10, "", &[ready(REMOTE_POD, "node-b")]),
        |c| c.local_detection = LocalDetection::None,
    );
    assert_eq!(
        verdicts(&blind, vip("198.19.0.10", 80)),
        ((fwd, false), (fwd, false))
    );
    // A NodePort under the Cluster policy: masqueraded from anywhere.
    let i = intent(&service(
        "np",
        52,
        "  type: NodePort",
        &[ready(REMOTE_POD, "node-b")],
    ));
    assert_eq!(verdicts(&i, node_port(30052)), ((fwd, true), (fwd, true)));
    // Under the Local policy, without a local endpoint: pods short-circuit to the
    // cluster set unmasqueraded, everything else is dropped.
    let i = intent(&service(
        "remote",
        50,
        "  type: NodePort\n  externalTrafficPolicy: Local",
        &[ready(REMOTE_POD, "node-b")],
    ));
    assert_eq!(
        verdicts(&i, node_port(30050)),
        ((fwd, false), (Drop, false))
    );
    // No endpoint anywhere: refused, from anywhere.
    let i = intent(&service("gone", 51, "  type: NodePort", &[]));
    assert_eq!(
        verdicts(&i, node_port(30051)),
        ((Reject, false), (Reject, false))
    );
}

#[test]
fn connections_translated_at_the_socket_follow_the_same_routes() {
    let verdicts = |i: &Intent, key: FrontendKey| {
        let (svc, f) = at(i, key);
        (
            svc.socket_verdict(&f, Origin::Pod),
            svc.socket_verdict(&f, Origin::Host),
        )
    };
    use SocketVerdict::*;
    let fwd = Forward(EndpointSetId::Cluster);
    // Cluster IP: the internal route, from anywhere on the node.
    let i = intent(&service("web", 10, "", &[ready(REMOTE_POD, "node-b")]));
    assert_eq!(verdicts(&i, vip("198.19.0.10", 80)), (fwd, fwd));
    // internalTrafficPolicy Local with endpoints elsewhere only: dropped.
    let i = intent(&service(
        "web",
        10,
        "  internalTrafficPolicy: Local",
        &[ready(REMOTE_POD, "node-b")],
    ));
    assert_eq!(verdicts(&i, vip("198.19.0.10", 80)), (Drop, Drop));
    // No endpoint anywhere: refused.
    let i = intent(&service("gone", 51, "  type: NodePort", &[]));
    assert_eq!(verdicts(&i, node_port(30051)), (Reject, Reject));
    // eTP Local without a local endpoint: pods and the host short-circuit to the
    // cluster set...
    let yaml = service(
        "remote",
        50,
        "  type: NodePort\n  externalTrafficPolicy: Local",
        &[ready(REMOTE_POD, "node-b")],
    );
    assert_eq!(verdicts(&intent(&yaml), node_port(30050)), (fwd, fwd));
    // ... but without local-traffic detection pods cannot be told apart, and
    // meet the Local policy (drop here), as their packets would.
    let blind = intent_with(&yaml, |c| c.local_detection = LocalDetection::None);
    assert_eq!(verdicts(&blind, node_port(30050)), (Drop, fwd));
    // loadBalancerSourceRanges: the host passes when one of its addresses is in
    // them; a pod's source is unknown at connect(), so its packets decide.
    let fenced = |ranges: &str| {
        intent(&service(
            "api",
            31,
            &format!("  type: LoadBalancer\n  loadBalancerSourceRanges: [{ranges}]\nstatus:\n  loadBalancer:\n    ingress:\n    - {{ip: 203.0.113.31}}"),
            &[ready(REMOTE_POD, "node-b")],
        ))
    };
    assert_eq!(
        verdicts(&fenced("198.18.0.0/24"), vip("203.0.113.31", 80)),
        (Untranslated, fwd)
    );
    assert_eq!(
        verdicts(&fenced("198.51.100.0/24"), vip("203.0.113.31", 80)),
        (Untranslated, Drop)
    );
    // Its NodePort is not fenced.
    assert_eq!(
        verdicts(&fenced("198.51.100.0/24"), node_port(30031)),
        (fwd, fwd)
    );
}

#[test]
fn the_scheduler_is_the_services_else_the_nodes_where_the_mode_runs_schedulers() {
    let yaml = format!(
        "{}\n---\n{}\n---\n{}",
        service("plain", 140, "", &[ready(LOCAL_POD, "node-a")]),
        service("maglev", 141, "", &[ready(LOCAL_POD, "node-a")]).replace(
            "metadata: {name: maglev, namespace: demo}",
            "metadata: {name: maglev, namespace: demo, annotations: {svcproxy.io/scheduler: mh}}",
        ),
        service("big", 142, "", &[ready(LOCAL_POD, "node-a")]).replace(
            "metadata: {name: big, namespace: demo}",
            "metadata: {name: big, namespace: demo, annotations: {svcproxy.io/scheduler: mh, \
             svcproxy.io/maglev-table-size: '131071'}}",
        ),
    );
    let sched = |i: &Intent, n: u8| at(i, vip(&format!("198.19.0.{n}"), 80)).0.scheduler;
    let cells = |i: &Intent, n: u8| at(i, vip(&format!("198.19.0.{n}"), 80)).0.maglev_table_size;
    // A mode that runs schedulers (ebpf, ipvs): the node's, or the Service's own.
    let i = intent_with(&yaml, |c| {
        c.schedulers = true;
        c.scheduler = Scheduler::RoundRobin;
    });
    assert_eq!(sched(&i, 140), Scheduler::RoundRobin);
    assert_eq!(sched(&i, 141), Scheduler::Maglev);
    assert!(
        svcproxy_plan::intent::describe(&i).contains("; scheduler mh (16381 cells)"),
        "{}",
        svcproxy_plan::intent::describe(&i)
    );
    // Maglev's table: the node's size, or the Service's own; none for the others.
    assert_eq!(cells(&i, 140), None);
    assert_eq!(cells(&i, 141), Some(16381));
    assert_eq!(cells(&i, 142), Some(131071));
    let i = intent_with(&yaml, |c| {
        c.schedulers = true;
        c.scheduler = Scheduler::Maglev;
        c.maglev_table_size = 4093;
    });
    assert_eq!((cells(&i, 140), cells(&i, 142)), (Some(4093), Some(131071)));
    // A mode that chooses at random whatever a Service says.
    let i = intent_with(&yaml, |c| c.scheduler = Scheduler::RoundRobin);
    assert_eq!(sched(&i, 140), Scheduler::Random);
    assert_eq!(sched(&i, 141), Scheduler::Random);
    assert_eq!(cells(&i, 142), None);
    assert!(!svcproxy_plan::intent::describe(&i).contains("scheduler"));
}

#[test]
fn endpoint_weights_by_address_then_node_where_the_scheduler_weighs() {
    let yaml = service(
        "weighted",
        142,
        "",
        &[
            ready(LOCAL_POD, "node-a"),
            ready(REMOTE_POD, "node-b"),
            ready("198.18.2.11", "node-b"),
        ],
    )
    .replace(
        "metadata: {name: weighted, namespace: demo}",
        "metadata: {name: weighted, namespace: demo, annotations: {svcproxy.io/endpoint-weights: '198.18.2.11=5, node-b=2'}}",
    );
    let weights = |s: Scheduler| {
        let i = intent_with(&yaml, |c| {
            c.schedulers = true;
            c.scheduler = s;
        });
        at(&i, vip("198.19.0.142", 80)).0.weights.to_vec()
    };
    // Address order: 198.18.1.10 (node-a: 1), 198.18.2.10 (node-b: 2), 198.18.2.11 (its own: 5).
    assert_eq!(weights(Scheduler::WeightedRoundRobin), [1, 2, 5]);
    assert_eq!(weights(Scheduler::WeightedLeastConnection), [1, 2, 5]);
    // rr, lc and dh ignore weights, as IPVS's.
    assert!(weights(Scheduler::RoundRobin).is_empty());
    assert!(weights(Scheduler::LeastConnection).is_empty());
    // A mode that chooses at random ignores them too.
    let i = intent(&yaml);
    assert!(at(&i, vip("198.19.0.142", 80)).0.weights.is_empty());
}

/// A host socket bound to a source address (the eBPF modes' connect()) is
/// masqueraded as the packet modes masquerade the node's packets from it: a
/// cluster IP unless the source is a pod's (with a detector), always under
/// `--masquerade-all`, never without a detector; an external address under the
/// Cluster policy, and under Local the host's short circuit.
#[test]
fn a_bound_host_socket_is_masqueraded_as_the_nodes_packets_are() {
    let yaml = [
        service("web", 10, "", &[ready(REMOTE_POD, "node-b")]),
        service(
            "np",
            11,
            "  type: NodePort",
            &[ready(REMOTE_POD, "node-b")],
        ),
        service(
            "lb",
            30,
            "  type: LoadBalancer\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 32030\nstatus:\n  loadBalancer:\n    ingress:\n    - {ip: 203.0.113.30}",
            &[ready(LOCAL_POD, "node-a"), ready(REMOTE_POD, "node-b")],
        ),
    ]
    .join("---\n");
    let host = |i: &Intent, key| {
        let (svc, f) = at(i, key);
        svc.host_masquerade(&f)
    };
    let i = intent(&yaml);
    assert_eq!(
        host(&i, vip("198.19.0.10", 80)),
        Masquerade::UnlessFromLocalPod
    );
    assert_eq!(host(&i, node_port(30011)), Masquerade::Always);
    assert_eq!(host(&i, vip("203.0.113.30", 80)), Masquerade::Always);
    let all = intent_with(&yaml, |c| c.masquerade_all = true);
    assert_eq!(host(&all, vip("198.19.0.10", 80)), Masquerade::Always);
    let blind = intent_with(&yaml, |c| c.local_detection = LocalDetection::None);
    assert_eq!(host(&blind, vip("198.19.0.10", 80)), Masquerade::Never);
    assert_eq!(host(&blind, node_port(30011)), Masquerade::Always);
}
