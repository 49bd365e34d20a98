//! Incremental planning: after a committed full plan, a change to one service
//! yields a script about that service only; deletions remove map elements before
//! the chains they point to; nothing changed means an empty script; failures and
//! configuration changes lead to full plans.
//!
//! Scenarios come from `testdata/` (address plan in `tests/common`). The real
//! kernel check of these scripts is in `tests/nft_netns.rs`.

mod common;

use std::collections::BTreeSet;

use common::*;
use svcproxy_core::model::{IpFamily, Protocol, ServicePortName};
use svcproxy_core::objects::{Kind, ObjectKey, SourceUpdate};
use svcproxy_plan::names::{service_port_hash, EndpointHasher, Prefix};
use svcproxy_plan::nft::PlanKind;

const API_SLICE_WITH_ANOTHER_LOCAL_ENDPOINT: &str = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: api-1
  namespace: demo
  labels: {kubernetes.io/service-name: api}
addressType: IPv4
ports:
- {name: https, port: 8443}
endpoints:
- {addresses: [198.18.1.30], nodeName: node-a}
- {addresses: [198.18.2.30], nodeName: node-b}
- {addresses: [198.18.1.31], nodeName: node-a}
"#;

/// A planner that has planned and committed the scenario's first sync.
fn synced(case: &str) -> (Scenario, NftPipeline) {
    let mut sc = Scenario::load(case);
    let up = sc.snapshot();
    let mut planner = NftPipeline::new();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Recreate);
    planner.commit(&plan);
    (sc, planner)
}

/// Every hashed object name in a text.
fn hashed_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')) {
        for prefix in Prefix::ALL {
            if let Some(rest) = word.strip_prefix(prefix.as_str()) {
                if rest.len() == 16 && rest.bytes().all(|b| b.is_ascii_hexdigit()) {
                    out.insert(word.to_string());
                }
            }
        }
    }
    out
}

/// The names a service port may own in a family, for the given endpoints.
fn owned_names(
    family: IpFamily,
    name: &ServicePortName,
    endpoints: &[(&str, u16)],
    affinity: Option<u32>,
) -> BTreeSet<String> {
    let h = service_port_hash(family, name);
    let mut out: BTreeSet<String> = [
        Prefix::Service,
        Prefix::Local,
        Prefix::External,
        Prefix::Firewall,
    ]
    .iter()
    .map(|p| format!("{}{h:016x}", p.as_str()))
    .collect();
    let eh = EndpointHasher::new(family, name);
    for (ip, port) in endpoints {
        let ip = ip.parse().unwrap();
        out.insert(format!("endpoint-{:016x}", eh.endpoint(ip, *port)));
        if let Some(t) = affinity {
            out.insert(format!("affinity-{:016x}", eh.affinity(ip, *port, t)));
        }
    }
    out
}

fn lines_starting<'a>(script: &'a str, prefix: &str) -> Vec<(usize, &'a str)> {
    script
        .lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with(prefix))
        .collect()
}

#[test]
fn changing_one_service_touches_only_its_chains_and_elements() {
    let (mut sc, mut planner) = synced("loadbalancer-source-ranges-etp-local");
    sc.upsert_yaml(API_SLICE_WITH_ANOTHER_LOCAL_ENDPOINT);
    let up = sc.snapshot();
    let api = spn("demo", "api", "https", Protocol::Tcp);
    assert_eq!(up.changed, BTreeSet::from([api.clone()]));

    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Partial);
    assert_eq!(plan.stats.replanned, 1);
    let script = &plan.script;

    // Only api's objects appear, and no chain is declared (endpoints are map
    // elements); the cluster and local chains (which dispatch over their endpoint
    // count) are rewritten in place.
    let allowed = owned_names(
        IpFamily::V4,
        &api,
        &[("198.18.1.30", 8443), ("198.18.2.30", 8443)],
        None,
    );
    let used = hashed_names(script);
    assert!(used.is_subset(&allowed), "foreign names in\n{script}");
    let service_chain = format!("service-{:016x}", service_port_hash(IpFamily::V4, &api));
    let local_chain = format!("local-{:016x}", service_port_hash(IpFamily::V4, &api));
    assert!(lines_starting(script, "add chain").is_empty(), "{script}");
    assert_eq!(
        lines_starting(script, "flush chain")
            .iter()
            .map(|(_, l)| *l)
            .collect::<Vec<_>>(),
        // (A local endpoint joins the local set too.)
        vec![
            format!("flush chain ip svcproxy {local_chain}"),
            format!("flush chain ip svcproxy {service_chain}")
        ]
    );
    // Elements: the new endpoint's address and port in the endpoint map (it is in
    // both sets), its hairpin (it is this node's), nothing in the verdict maps
    // (the destinations still go to the same chains).
    let elements: Vec<&str> = script.lines().filter(|l| l.contains("element")).collect();
    assert!(
        elements
            .iter()
            .all(|l| l.contains(" endpoint-dnat-tcp-") || l.contains(" hairpin-endpoints ")),
        "{script}"
    );
    assert_eq!(
        elements
            .iter()
            .filter(|l| l.contains("198.18.1.31 . 8443"))
            .count(),
        2,
        "{script}"
    );
    assert_eq!(
        lines_starting(script, "add element ip svcproxy hairpin-endpoints"),
        vec![(
            script
                .lines()
                .position(|l| l.contains("hairpin-endpoints"))
                .unwrap(),
            "add element ip svcproxy hairpin-endpoints { 198.18.1.31 . 198.18.1.31 }"
        )],
        "{script}"
    );
    assert!(
        !script.contains("ip6 svcproxy"),
        "IPv6 untouched:\n{script}"
    );
    planner.commit(&plan);

    // And the state moved on: planning again is a no-op.
    let again = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &BTreeSet::new());
    assert!(again.is_empty(), "{}", again.script);
}

#[test]
fn a_new_cluster_ip_port_adds_data_elements_only() {
    let (mut sc, mut planner) = synced("clusterip-basic");
    sc.upsert_yaml(
        r#"
apiVersion: v1
kind: Service
metadata: {name: new, namespace: demo}
spec:
  clusterIP: 198.19.0.99
  ports:
  - {name: http, port: 80, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: new-1
  namespace: demo
  labels: {kubernetes.io/service-name: new}
addressType: IPv4
ports:
- {name: http, port: 8080}
endpoints:
- {addresses: [198.18.2.99], nodeName: node-b}
"#,
    );
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Partial);
    let new = spn("demo", "new", "http", Protocol::Tcp);
    let allowed = owned_names(IpFamily::V4, &new, &[("198.18.2.99", 8080)], None);
    assert!(
        hashed_names(&plan.script).is_subset(&allowed),
        "{}",
        plan.script
    );
    // A cluster IP port of one endpoint: served without a chain. The table
    // serves no TCP port of one endpoint yet: the set and rule of that count
    // come first (the one statement the kernel validates table-wide).
    assert_eq!(
        plan.script,
        "add set ip svcproxy clusterip-tcp-1 { type ipv4_addr . inet_proto . inet_service ; }\n\
         add rule ip svcproxy services ip daddr . meta l4proto . th dport @clusterip-tcp-1 meta l4proto tcp dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 1 map @clusterip-dnat-tcp\n\
         add element ip svcproxy clusterip-dnat-tcp { 198.19.0.99 . tcp . 80 . 0 : 198.18.2.99 . 8080 }\n\
         add element ip svcproxy clusterip-masq-nonlocal { 198.19.0.99 . tcp . 80 }\n\
         add element ip svcproxy clusterip-tcp-1 { 198.19.0.99 . tcp . 80 }\n\
         add element ip svcproxy cluster-ips { 198.19.0.99 }\n"
    );
    planner.commit(&plan);

    // The next such port is data elements only.
    sc.upsert_yaml(
        r#"
apiVersion: v1
kind: Service
metadata: {name: next, namespace: demo}
spec:
  clusterIP: 198.19.0.98
  ports:
  - {name: http, port: 80, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: next-1
  namespace: demo
  labels: {kubernetes.io/service-name: next}
addressType: IPv4
ports:
- {name: http, port: 8080}
endpoints:
- {addresses: [198.18.2.98], nodeName: node-b}
"#,
    );
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Partial);
    assert_eq!(
        plan.script,
        "add element ip svcproxy clusterip-dnat-tcp { 198.19.0.98 . tcp . 80 . 0 : 198.18.2.98 . 8080 }\n\
         add element ip svcproxy clusterip-masq-nonlocal { 198.19.0.98 . tcp . 80 }\n\
         add element ip svcproxy clusterip-tcp-1 { 198.19.0.98 . tcp . 80 }\n\
         add element ip svcproxy cluster-ips { 198.19.0.98 }\n"
    );
    assert!(!plan.script.contains("flush"), "{}", plan.script);
    assert!(!plan.script.contains("delete"), "{}", plan.script);
}

#[test]
fn deleting_a_service_deletes_its_chains_after_removing_its_elements() {
    let (mut sc, mut planner) = synced("loadbalancer-source-ranges-etp-local");
    let before = planner.ruleset(IpFamily::V4).unwrap();
    let api = spn("demo", "api", "https", Protocol::Tcp);
    let api_chains: BTreeSet<String> = before
        .chains
        .iter()
        .filter(|(name, chain)| {
            chain.comment.as_deref() == Some("demo/api:https/tcp") || name.starts_with("endpoint-")
        })
        .map(|(n, _)| n.clone())
        .filter(|n| {
            owned_names(
                IpFamily::V4,
                &api,
                &[("198.18.1.30", 8443), ("198.18.2.30", 8443)],
                None,
            )
            .contains(n)
        })
        .collect();
    assert_eq!(
        api_chains.len(),
        4,
        "service, local, external, firewall (no endpoint has a chain: no affinity)"
    );

    sc.state.apply(SourceUpdate::Delete(ObjectKey::new(
        Kind::Service,
        "demo",
        "api",
    )));
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Partial);
    let script = &plan.script;

    let deleted: BTreeSet<String> = lines_starting(script, "delete chain")
        .iter()
        .map(|(_, l)| l.rsplit(' ').next().unwrap().to_string())
        .collect();
    assert_eq!(deleted, api_chains, "{script}");
    let last_element = lines_starting(script, "delete element")
        .last()
        .map(|(i, _)| *i)
        .expect("elements deleted");
    let first_flush = lines_starting(script, "flush chain")[0].0;
    let first_delete = lines_starting(script, "delete chain")[0].0;
    assert!(
        last_element < first_flush && first_flush < first_delete,
        "{script}"
    );
    // Every element of api goes: its cluster IP, LB IP (service, firewall) and
    // NodePort. edge keeps its own.
    for key in [
        "cluster-ips { 198.19.0.30 }",
        "service-ips { 198.19.0.30 . tcp . 443 }",
        "service-ips { 203.0.113.30 . tcp . 443 }",
        "firewall-ips { 203.0.113.30 . tcp . 443 }",
        "service-nodeports { tcp . 30443 }",
    ] {
        assert!(
            script.contains(&format!("delete element ip svcproxy {key}")),
            "{key} not deleted:\n{script}"
        );
    }
    // Its endpoints leave the endpoint map (the cluster set's 2; the local set's
    // one endpoint is DNATed directly), and its endpoint on this node the hairpin
    // set.
    assert_eq!(
        lines_starting(script, "delete element ip svcproxy endpoint-dnat-tcp-").len(),
        2,
        "{script}"
    );
    assert!(
        script
            .contains("delete element ip svcproxy hairpin-endpoints { 198.18.1.30 . 198.18.1.30 }"),
        "{script}"
    );
    assert!(!script.contains("add "), "nothing is added:\n{script}");
}

#[test]
fn an_endpoint_replaced_rewrites_one_map_element_and_no_rule() {
    let (mut sc, mut planner) = synced("loadbalancer-source-ranges-etp-local");
    let before = planner.ruleset(IpFamily::V4).unwrap();
    sc.upsert_yaml(
        &API_SLICE_WITH_ANOTHER_LOCAL_ENDPOINT
            .replace("- {addresses: [198.18.1.31], nodeName: node-a}\n", "")
            .replace("198.18.2.30", "198.18.2.32"),
    );
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Partial);
    let script = &plan.script;
    // The endpoint count is the same, so the set keeps its keys and its rule: the
    // replaced endpoint's key gets the new address, nothing else changes.
    let lines: Vec<&str> = script.lines().collect();
    assert_eq!(lines.len(), 2, "{script}");
    let (map, old_key) = before
        .maps
        .iter()
        .filter(|(name, _)| name.starts_with("endpoint-dnat-tcp-"))
        .find_map(|(name, m)| {
            m.elements
                .iter()
                .find(|(_, v)| v == "198.18.2.30 . 8443")
                .map(|(k, _)| (name.clone(), k.clone()))
        })
        .expect("the old endpoint has a key");
    assert_eq!(
        lines,
        vec![
            format!("delete element ip svcproxy {map} {{ {old_key} }}"),
            format!("add element ip svcproxy {map} {{ {old_key} : 198.18.2.32 . 8443 }}"),
        ]
    );
}

#[test]
fn unchanged_input_yields_an_empty_delta() {
    let (mut sc, mut planner) = synced("session-affinity");
    // The same snapshots again, and a new snapshot of an unchanged state.
    let up = sc.snapshot();
    assert!(up.changed.is_empty());
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Partial);
    assert!(plan.is_empty(), "{}", plan.script);
    assert_eq!(plan.stats.replanned, 0);
    planner.commit(&plan);

    // Even a caller that claims everything changed gets an empty script: the new
    // fragments equal the old ones.
    let all: BTreeSet<ServicePortName> = up.v4.service_ports.keys().cloned().collect();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &all);
    assert!(plan.is_empty(), "{}", plan.script);
    assert_eq!(plan.stats.replanned, 1);
}

#[test]
fn a_change_the_caller_did_not_report_is_still_planned() {
    let (mut sc, mut planner) = synced("loadbalancer-source-ranges-etp-local");
    sc.upsert_yaml(API_SLICE_WITH_ANOTHER_LOCAL_ENDPOINT);
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &BTreeSet::new());
    assert_eq!(plan.stats.replanned, 1, "the view is a new Arc");
    assert!(plan.script.contains("198.18.1.31"), "{}", plan.script);
}

#[test]
fn a_failed_or_unconfirmed_apply_makes_the_next_plan_recreate() {
    let (mut sc, mut planner) = synced("clusterip-basic");
    let up = sc.snapshot();
    let _ = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    planner.abandon();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Recreate);
    assert!(plan.script.starts_with("add table ip svcproxy"));
    assert!(plan
        .script
        .contains("\ndelete table ip svcproxy\ntable ip svcproxy {\n"));

    // A plan neither committed nor abandoned leaves the kernel unknown too.
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Recreate);
    planner.commit(&plan);

    // Committing a stale plan forgets what the kernel holds.
    let first = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    let second = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    planner.commit(&first);
    let _ = second;
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Recreate);
}

#[test]
fn a_requested_full_sync_resyncs_in_place_keeping_affinity_sets() {
    let (mut sc, mut planner) = synced("session-affinity");
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, true, &up.changed);
    assert_eq!(plan.kind, PlanKind::Resync);
    let s = &plan.script;
    assert!(!s.contains("delete table ip svcproxy"), "{s}");
    assert!(s.contains("flush table ip svcproxy\n"), "{s}");
    assert!(s.contains("flush map ip svcproxy service-ips\n"), "{s}");
    assert!(s.contains("flush set ip svcproxy cluster-ips\n"), "{s}");
    // The affinity sets are re-declared (a no-op for nft), never flushed.
    assert!(!s.contains("flush set ip svcproxy affinity-"), "{s}");
    assert!(s.contains("\n\tset affinity-"), "{s}");
    assert!(!s.contains("delete chain"), "nothing is stale:\n{s}");
}

#[test]
fn a_new_affinity_timeout_replaces_the_sets_after_the_rules_move() {
    let (mut sc, mut planner) = synced("session-affinity");
    sc.upsert_yaml(
        r#"
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: demo}
spec:
  clusterIP: 198.19.0.70
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 5}}
  ports:
  - {name: http, port: 80, targetPort: 8080}
"#,
    );
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    let s = &plan.script;
    let added = lines_starting(s, "add set");
    let deleted = lines_starting(s, "delete set");
    assert_eq!(added.len(), 2, "{s}");
    assert_eq!(deleted.len(), 2, "{s}");
    assert!(added.iter().all(|(_, l)| l.contains("timeout 5s")), "{s}");
    let last_rule = lines_starting(s, "add rule").last().unwrap().0;
    assert!(added[1].0 < lines_starting(s, "add rule")[0].0, "{s}");
    assert!(deleted[0].0 > last_rule, "{s}");
    assert!(
        !s.contains("delete chain"),
        "endpoint chains are rewritten, not replaced:\n{s}"
    );
}

#[test]
fn conflicting_destinations_go_to_the_first_claimant_and_pass_on_when_it_goes() {
    let (mut sc, mut planner) = synced("conflicting-vips");
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    let alpha = spn("demo", "alpha", "http", Protocol::Tcp);
    let beta = spn("demo", "beta", "http", Protocol::Tcp);
    let aardvark = spn("demo", "aardvark", "http", Protocol::Tcp);
    let got: Vec<(String, ServicePortName, Vec<ServicePortName>)> = plan
        .conflicts
        .iter()
        .map(|c| (c.destination.clone(), c.kept.clone(), c.ignored.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            // alpha's cluster IP beats aardvark's external IP, though aardvark
            // sorts first.
            (
                "198.19.0.130:80/TCP".to_string(),
                alpha.clone(),
                vec![aardvark.clone()]
            ),
            (
                "203.0.113.130:80/TCP".to_string(),
                alpha.clone(),
                vec![beta.clone()]
            ),
            (
                "nodePort 30130/TCP".to_string(),
                alpha.clone(),
                vec![beta.clone()]
            ),
        ]
    );
    planner.commit(&plan);

    sc.state.apply(SourceUpdate::Delete(ObjectKey::new(
        Kind::Service,
        "demo",
        "alpha",
    )));
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    assert!(plan.conflicts.is_empty());
    let beta_external = format!("external-{:016x}", service_port_hash(IpFamily::V4, &beta));
    let alpha_external = format!("external-{:016x}", service_port_hash(IpFamily::V4, &alpha));
    let s = &plan.script;
    assert!(
        s.contains(&format!(
        "add element ip svcproxy service-ips {{ 203.0.113.130 . tcp . 80 : goto {beta_external} }}"
    )),
        "{s}"
    );
    assert!(
        s.contains(&format!(
            "add element ip svcproxy service-nodeports {{ tcp . 30130 : goto {beta_external} }}"
        )),
        "{s}"
    );
    assert!(
        s.contains(&format!("delete chain ip svcproxy {alpha_external}")),
        "{s}"
    );
    // beta's chains already existed: nothing of beta is declared or rewritten.
    assert!(!s.contains("add chain"), "{s}");
}

#[test]
fn configuration_and_skeleton_changes_are_planned() {
    let (mut sc, mut planner) = synced("clusterip-basic");
    let up = sc.snapshot();
    // A setting that only service ports depend on: every service port is
    // planned again, and those served without a chain move to the other
    // masquerade set (no chain to rewrite).
    let mut cfg = sc.cfg.clone();
    cfg.masquerade_all = true;
    let plan = planner.plan(&up.v4, &up.v6, &cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Partial);
    assert_eq!(plan.stats.replanned, 2);
    assert_eq!(
        plan.script,
        "delete element ip svcproxy clusterip-masq-nonlocal { 198.19.0.10 . tcp . 80 }\n\
         delete element ip svcproxy clusterip-masq-nonlocal { 198.19.0.10 . udp . 53 }\n\
         add element ip svcproxy clusterip-masq { 198.19.0.10 . tcp . 80 }\n\
         add element ip svcproxy clusterip-masq { 198.19.0.10 . udp . 53 }\n"
    );
    planner.commit(&plan);

    // One the skeleton depends on (the masquerade mark) resyncs the whole table.
    cfg.masquerade_bit = 13;
    let plan = planner.plan(&up.v4, &up.v6, &cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Resync);
    assert!(plan.script.contains("mark set mark or 0x2000"));
    planner.commit(&plan);

    sc.upsert_yaml(
        r#"
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: extra}
spec:
  cidrs: ["198.20.0.0/24"]
"#,
    );
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Resync);
    assert!(plan.script.contains("ip daddr 198.19.0.0/16 drop\n"));
    assert!(plan.script.contains("ip daddr 198.20.0.0/24 drop\n"));
    planner.commit(&plan);

    // Turning IPv6 off deletes its table in the same transaction.
    cfg.ipv6 = false;
    let plan = planner.plan(&up.v4, &up.v6, &cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Resync);
    assert!(plan.script.contains(
        "add table ip6 svcproxy { comment \"managed-by-svcproxy\" ; }\ndelete table ip6 svcproxy\n"
    ));
    assert!(planner.ruleset(IpFamily::V6).is_none());
}

#[test]
fn the_cleanup_script_deletes_only_svcproxy_tables() {
    assert_eq!(
        svcproxy_plan::nft::cleanup_script(),
        "add table ip svcproxy { comment \"managed-by-svcproxy\" ; }\n\
         delete table ip svcproxy\n\
         add table ip6 svcproxy { comment \"managed-by-svcproxy\" ; }\n\
         delete table ip6 svcproxy\n"
    );
}

#[test]
fn a_cluster_ip_port_taking_affinity_moves_between_the_layouts() {
    let (mut sc, mut planner) = synced("clusterip-basic");
    let with_affinity = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  clusterIP: 198.19.0.10
  sessionAffinity: ClientIP
  ports:
  - {name: http, port: 80, targetPort: 8080}
  - {name: dns, port: 53, protocol: UDP, targetPort: 5353}
"#;
    sc.upsert_yaml(with_affinity);
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Partial);
    let s = &plan.script;
    // Affinity needs chains: out of the cluster IP sets and map, into service-ips.
    let http = spn("demo", "web", "http", Protocol::Tcp);
    let chain = format!("service-{:016x}", service_port_hash(IpFamily::V4, &http));
    for line in [
        "delete element ip svcproxy clusterip-tcp-2 { 198.19.0.10 . tcp . 80 }".to_string(),
        "delete element ip svcproxy clusterip-udp-2 { 198.19.0.10 . udp . 53 }".to_string(),
        "delete element ip svcproxy clusterip-masq-nonlocal { 198.19.0.10 . tcp . 80 }".to_string(),
        "delete element ip svcproxy clusterip-dnat-tcp { 198.19.0.10 . tcp . 80 . 0 }".to_string(),
        "delete element ip svcproxy clusterip-dnat-tcp { 198.19.0.10 . tcp . 80 . 1 }".to_string(),
        format!("add element ip svcproxy service-ips {{ 198.19.0.10 . tcp . 80 : goto {chain} }}"),
        format!("add chain ip svcproxy {chain}"),
    ] {
        assert!(s.lines().any(|l| l.starts_with(&line)), "{line}:\n{s}");
    }
    assert!(
        lines_starting(s, "add element ip svcproxy clusterip-").is_empty(),
        "{s}"
    );
    // Deleted before added: the elements a port leaves go first.
    let last_delete = lines_starting(s, "delete element").last().unwrap().0;
    let first_add = lines_starting(s, "add element").first().unwrap().0;
    assert!(last_delete < first_add, "{s}");
    planner.commit(&plan);

    // And back: its chains go, its elements come back.
    sc.upsert_yaml(&with_affinity.replace("  sessionAffinity: ClientIP\n", ""));
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Partial);
    let s = &plan.script;
    for line in [
        "delete element ip svcproxy service-ips { 198.19.0.10 . tcp . 80 }".to_string(),
        format!("delete chain ip svcproxy {chain}"),
        "add element ip svcproxy clusterip-tcp-2 { 198.19.0.10 . tcp . 80 }".to_string(),
        "add element ip svcproxy clusterip-dnat-tcp { 198.19.0.10 . tcp . 80 . 1 : 198.18.2.10 . 8080 }"
            .to_string(),
    ] {
        assert!(s.lines().any(|l| l.starts_with(&line)), "{line}:\n{s}");
    }
    // The counts' sets and rules stayed: nothing to add but elements.
    assert!(!s.contains("add rule"), "{s}");
    planner.commit(&plan);
    let again = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &BTreeSet::new());
    assert!(again.is_empty(), "{}", again.script);
}
