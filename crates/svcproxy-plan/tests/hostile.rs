//! Hostile names cannot alter the rendered text beyond sanitized comments.
//!
//! The state refuses invalid names (see the `hostile-names` golden scenario), so
//! here the snapshot is built by hand, bypassing that validation: a service port
//! exercising every per-service object (LoadBalancer, eTP Local, source ranges,
//! affinity, NodePort, external IP) is named with quotes, braces, semicolons,
//! newlines and very long strings. Its rendering must equal, line for line, that of
//! the same port with tame names once hashed names are masked and comments are
//! dropped; every quoted string must be a sanitized comment; and `nft` must accept
//! the text.

mod common;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use common::*;
use ipnet::IpNet;
use svcproxy_core::model::*;
use svcproxy_core::selection::Selection;
use svcproxy_core::snapshot::{NodeSnapshot, ServicePortView};
use svcproxy_plan::names::{is_sanitized_comment, Prefix};
use svcproxy_plan::PlanConfig;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn endpoint(addr: &str, node: &str) -> Endpoint {
    Endpoint {
        ip: ip(addr),
        port: 8080,
        info: Arc::new(EndpointInfo {
            node_name: Some(node.into()),
            zone: Some("zone\"; drop".into()),
            ready: true,
            serving: true,
            terminating: false,
            zone_hints: Box::new(["}{".into()]),
            node_hints: Box::default(),
        }),
    }
}

/// node-a's snapshot holding one service port with every kind of object.
fn snapshot(ns: &str, name: &str, port: &str, node: &str) -> NodeSnapshot {
    let spn = ServicePortName::new(ServiceName::new(ns, name), port, Protocol::Tcp);
    let local = endpoint("198.18.1.5", node);
    let remote = endpoint("198.18.2.5", "node-b\n}");
    let sp = ServicePort {
        name: spn.clone(),
        service_type: ServiceType::LoadBalancer,
        cluster_ips: vec![ip("198.19.0.5")].into(),
        port: 80,
        node_port: Some(30005),
        external_ips: vec![ip("203.0.113.6")].into(),
        load_balancer_ingress: vec![LoadBalancerIngress {
            ip: ip("203.0.113.5"),
            ip_mode: IpMode::Vip,
        }]
        .into(),
        load_balancer_source_ranges: Some(vec!["198.51.100.0/24".parse::<IpNet>().unwrap()].into()),
        external_traffic_policy: TrafficPolicy::Local,
        internal_traffic_policy: TrafficPolicy::Cluster,
        session_affinity_timeout: Some(60),
        health_check_node_port: Some(32005),
        traffic_distribution: None,
        topology_mode: Some(("\"; reject".to_string()).into()),
        topology_keys: None,
        scheduler: None,
        endpoint_weights: None,
        maglev_table_size: None,
    };
    let view = ServicePortView {
        port: Arc::new(sp),
        endpoints: Arc::from([local.clone(), remote.clone()]),
        selection: Selection {
            cluster_endpoints: Some(Arc::from([local.clone(), remote])),
            local_endpoints: Some(Arc::from([local])),
            has_any_endpoints: true,
            reason: "\"}; flush ruleset".into(),
        },
    };
    let mut service_ports = BTreeMap::new();
    service_ports.insert(spn, Arc::new(view));
    NodeSnapshot {
        node_name: node.to_string(),
        family: IpFamily::V4,
        host_ips: Arc::from([]),
        node: Some(Arc::new(NodeInfo {
            name: node.to_string(),
            labels: BTreeMap::from([("k\"".into(), "v;".into())]),
            addresses: vec![ip("198.18.0.1")],
            pod_cidrs: vec!["198.18.1.0/24".parse().unwrap()],
            deleting: false,
            to_be_deleted: false,
        })),
        service_cidrs: vec!["198.19.0.0/16".parse().unwrap()],
        service_ports: service_ports.into(),
    }
}

fn render(ns: &str, name: &str, port: &str, node: &str) -> String {
    let v4 = snapshot(ns, name, port, node);
    let v6 = NodeSnapshot::empty(node, IpFamily::V6);
    let cfg = PlanConfig {
        local_detection: svcproxy_plan::LocalDetection::NodeCidr(Vec::new()),
        ..PlanConfig::default()
    };
    render_full(&v4, &v6, &cfg)
}

/// The text with every hashed name masked and comment lines dropped, lines sorted
/// (chains are ordered by name, so their order differs between name sets).
fn skeleton(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("comment \""))
        .map(|l| {
            let mut out = l.to_string();
            for prefix in Prefix::ALL {
                let p = prefix.as_str();
                let mut masked = String::new();
                let mut rest = out.as_str();
                while let Some(i) = rest.find(p) {
                    let after = &rest[i + p.len()..];
                    let hex =
                        after.len() >= 16 && after[..16].bytes().all(|b| b.is_ascii_hexdigit());
                    masked.push_str(&rest[..i + p.len()]);
                    if hex {
                        masked.push_str("HASH");
                        rest = &after[16..];
                    } else {
                        rest = after;
                    }
                }
                masked.push_str(rest);
                out = masked;
            }
            out
        })
        .collect();
    lines.sort();
    lines
}

/// Every double-quoted string in the text.
fn quoted(text: &str) -> Vec<&str> {
    text.split('"').skip(1).step_by(2).collect()
}

const HOSTILE: [(&str, &str, &str, &str); 4] = [
    (
        "ns\"; flush ruleset; #",
        "a{b}c;d\ne",
        "p\"'`$(x)\n;{}",
        "node-a",
    ),
    (
        "ns\n}\ntable ip evil {\n",
        "svc\r\n\tchain x { drop }",
        "}",
        "node-a",
    ),
    ("ÄÖ\u{202e}ns", "\u{0}nul", "\\\"", "node-a"),
    ("n", "s", "", "node-a"),
];

#[test]
fn hostile_names_change_nothing_but_hashes_and_sanitized_comments() {
    let tame = render("demo", "web", "http", "node-a");
    let long = "x".repeat(10_000);
    let mut cases: Vec<(String, String, String, String)> = HOSTILE
        .iter()
        .map(|(a, b, c, d)| (a.to_string(), b.to_string(), c.to_string(), d.to_string()))
        .collect();
    cases.push((long.clone(), long.clone(), long, "node-a".to_string()));
    for (ns, name, port, node) in cases {
        let text = render(&ns, &name, &port, &node);
        assert_eq!(
            skeleton(&text),
            skeleton(&tame),
            "names {ns:?}/{name:?}:{port:?} altered the ruleset:\n{text}"
        );
        for q in quoted(&text) {
            assert!(is_sanitized_comment(q), "unsanitized quoted text {q:?}");
        }
        assert!(
            !text
                .chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t'),
            "control characters in the output"
        );
        // The same line count as the tame rendering: no line was split or added.
        assert_eq!(text.lines().count(), tame.lines().count());
        // The user text does reach the comments, reduced.
        assert!(text.contains("\t\tcomment \""), "{text}");
    }
}

#[test]
fn hostile_rendering_is_accepted_by_nft() {
    let Some(ns) = Netns::create("hostile_rendering_is_accepted_by_nft") else {
        return;
    };
    for (a, b, c, d) in HOSTILE {
        let text = render(a, b, c, d);
        ns.nft_apply(&text)
            .unwrap_or_else(|e| panic!("nft rejected {a:?}/{b:?}:{c:?}:\n{e}\n{text}"));
        // The only trace of the names is inside comments.
        let listed = ns.nft(&["list", "ruleset"]);
        for line in listed
            .lines()
            .filter(|l| l.contains("evil") || l.contains("flush"))
        {
            assert!(line.trim_start().starts_with("comment \""), "{line}");
        }
        assert_eq!(
            ns.nft(&["list", "tables"]).trim(),
            "table ip svcproxy\ntable ip6 svcproxy"
        );
    }
}
