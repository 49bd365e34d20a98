//! The real `nft` as the judge of syntax and of deltas: every golden script loads
//! into a throwaway network namespace; after full, partial and resync plans the
//! kernel holds exactly what a from-scratch load of the same desired state holds;
//! the cleanup script removes svcproxy's tables and nothing else.
//!
//! Each test creates its own namespace (`svcproxy-plan-test-<pid>-<n>`) and deletes
//! it when done, even on failure; the root namespace is never touched. Without root
//! or without `ip`/`nft` the tests print SKIP and pass.

mod common;

use common::*;
use svcproxy_core::objects::{Kind, ObjectKey, SourceUpdate};
use svcproxy_plan::intent::{EndpointSetId, ServiceIntent};
use svcproxy_plan::nft::{cleanup_script, CapturePorts, PlanKind};

#[test]
fn every_golden_ruleset_loads_into_the_kernel() {
    let Some(ns) = Netns::create("every_golden_ruleset_loads_into_the_kernel") else {
        return;
    };
    for case in cases() {
        let path = testdata().join(&case).join("expected.nft");
        let script = std::fs::read_to_string(&path).expect("golden file");
        ns.nft_apply(&script)
            .unwrap_or_else(|e| panic!("{case}: nft rejected expected.nft:\n{e}"));
        // Applying the same first-sync script over existing tables works too.
        ns.nft_apply(&script)
            .unwrap_or_else(|e| panic!("{case}: second load failed:\n{e}"));
        ns.nft_apply(&cleanup_script()).expect("cleanup");
        assert_eq!(
            ns.nft(&["list", "tables"]).trim(),
            "",
            "{case}: tables left"
        );
    }
}

/// Applies `plan`'s script, commits it, and checks the namespace now holds what a
/// fresh namespace holds after loading the planner's full render.
fn apply_and_compare(
    ns: &Netns,
    planner: &mut NftPipeline,
    plan: &svcproxy_plan::nft::Plan,
    step: &str,
) {
    if let Err(e) = ns.nft_apply(&plan.script) {
        panic!(
            "{step}: nft rejected the {:?} script:\n{e}\n--- script ---\n{}",
            plan.kind, plan.script
        );
    }
    planner.commit(plan);
    let Some(fresh) = Netns::create(step) else {
        return;
    };
    fresh
        .nft_apply(&planner.render())
        .expect("full render loads");
    let got = ns.ruleset_normalized();
    let want = fresh.ruleset_normalized();
    if got != want {
        let missing: Vec<&String> = want.iter().filter(|w| !got.contains(w)).collect();
        let extra: Vec<&String> = got.iter().filter(|g| !want.contains(g)).collect();
        panic!("{step}: kernel state differs from a full load\nmissing: {missing:#?}\nextra: {extra:#?}");
    }
}

#[test]
fn partial_and_resync_plans_leave_the_kernel_as_a_full_load_would() {
    let Some(ns) = Netns::create("partial_and_resync_plans") else {
        return;
    };
    let mut sc = Scenario::load("loadbalancer-source-ranges-etp-local");
    let mut planner = NftPipeline::new();
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    apply_and_compare(&ns, &mut planner, &plan, "first sync");

    let steps: Vec<(&str, &str)> = vec![
        (
            "endpoint added",
            r#"
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
- {addresses: [198.18.3.30], nodeName: node-c}
"#,
        ),
        (
            "local endpoint gone (eTP Local now drops externally)",
            r#"
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
- {addresses: [198.18.2.30], nodeName: node-b}
"#,
        ),
        (
            "affinity switched on and a second service added",
            r#"
apiVersion: v1
kind: Service
metadata: {name: edge, namespace: demo}
spec:
  type: LoadBalancer
  clusterIP: 198.19.0.32
  externalTrafficPolicy: Cluster
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 30}}
  loadBalancerSourceRanges: [198.51.100.0/24]
  ports:
  - {name: https, port: 443, targetPort: 8443, nodePort: 30444}
status:
  loadBalancer:
    ingress:
    - {ip: 203.0.113.32}
---
apiVersion: v1
kind: Service
metadata: {name: extra, namespace: demo}
spec:
  clusterIP: 198.19.0.33
  clusterIPs: [198.19.0.33, "2001:db8:ffff::33"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: PreferDualStack
  externalIPs: [203.0.113.30]
  ports:
  - {name: dns, port: 53, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: extra-6
  namespace: demo
  labels: {kubernetes.io/service-name: extra}
addressType: IPv6
ports:
- {name: dns, port: 53, protocol: UDP}
endpoints:
- {addresses: ["2001:db8:1::33"], nodeName: node-a}
"#,
        ),
        (
            "affinity timeout changed",
            r#"
apiVersion: v1
kind: Service
metadata: {name: edge, namespace: demo}
spec:
  type: LoadBalancer
  clusterIP: 198.19.0.32
  externalTrafficPolicy: Cluster
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 5}}
  loadBalancerSourceRanges: [198.51.100.0/24]
  ports:
  - {name: https, port: 443, targetPort: 8443, nodePort: 30444}
status:
  loadBalancer:
    ingress:
    - {ip: 203.0.113.32}
"#,
        ),
    ];
    for (step, yaml) in steps {
        sc.upsert_yaml(yaml);
        let up = sc.snapshot();
        let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
        assert_eq!(plan.kind, PlanKind::Partial, "{step}");
        assert!(!plan.is_empty(), "{step}: nothing planned");
        apply_and_compare(&ns, &mut planner, &plan, step);
    }

    // Deletions: a service with stale chains, elements and affinity sets.
    for (step, name) in [("edge deleted", "edge"), ("api deleted", "api")] {
        sc.state.apply(SourceUpdate::Delete(ObjectKey::new(
            Kind::Service,
            "demo",
            name,
        )));
        let up = sc.snapshot();
        let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
        assert_eq!(plan.kind, PlanKind::Partial, "{step}");
        apply_and_compare(&ns, &mut planner, &plan, step);
    }

    // A periodic resync in place, then one after a skeleton change (ServiceCIDR)
    // with an object going stale (the NodePort set, by switching to all-local).
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, true, &up.changed);
    assert_eq!(plan.kind, PlanKind::Resync);
    apply_and_compare(&ns, &mut planner, &plan, "periodic resync");

    let mut cfg = sc.cfg.clone();
    cfg.nodeport_addresses = svcproxy_plan::NodePortAddresses::AllLocal;
    let plan = planner.plan(&up.v4, &up.v6, &cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Resync);
    apply_and_compare(&ns, &mut planner, &plan, "nodeport addresses changed");

    // After a failed apply the next plan recreates whatever the kernel holds.
    ns.nft_apply("add chain ip svcproxy stray\nadd rule ip svcproxy stray drop\n")
        .expect("tamper");
    planner.abandon();
    let plan = planner.plan(&up.v4, &up.v6, &cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Recreate);
    apply_and_compare(&ns, &mut planner, &plan, "recreate after failure");
}

#[test]
fn conflict_takeover_applies_cleanly() {
    let Some(ns) = Netns::create("conflict_takeover_applies_cleanly") else {
        return;
    };
    let mut sc = Scenario::load("conflicting-vips");
    let mut planner = NftPipeline::new();
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    apply_and_compare(&ns, &mut planner, &plan, "first sync");
    sc.state.apply(SourceUpdate::Delete(ObjectKey::new(
        Kind::Service,
        "demo",
        "alpha",
    )));
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    apply_and_compare(&ns, &mut planner, &plan, "alpha deleted");
}

#[test]
fn the_cleanup_script_removes_only_svcproxy_tables() {
    let Some(ns) = Netns::create("the_cleanup_script_removes_only_svcproxy_tables") else {
        return;
    };
    // Nothing to clean: still succeeds.
    ns.nft_apply(&cleanup_script())
        .expect("cleanup on an empty namespace");
    ns.nft_apply(
        "add table inet other\n\
         add chain inet other c { type filter hook input priority 0 ; policy accept ; }\n\
         add table ip svcproxy-other\n\
         add chain ip svcproxy-other c\n",
    )
    .expect("other tables");
    let mut sc = Scenario::load("nodeport");
    let up = sc.snapshot();
    let mut planner = NftPipeline::new();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    ns.nft_apply(&plan.script).expect("first sync");
    ns.nft_apply(&cleanup_script()).expect("cleanup");
    let tables = ns.nft(&["list", "tables"]);
    assert_eq!(
        tables.trim(),
        "table inet other\ntable ip svcproxy-other",
        "{tables}"
    );
}

/// The userspace mode's ports, fixed: per protocol and set; SCTP not captured.
struct FixedPorts;

impl CapturePorts for FixedPorts {
    fn port(&self, svc: &ServiceIntent, set: EndpointSetId) -> Option<u16> {
        let base = match svc.protocol {
            svcproxy_core::model::Protocol::Tcp => 40_000,
            svcproxy_core::model::Protocol::Udp => 41_000,
            svcproxy_core::model::Protocol::Sctp => return None,
        };
        Some(base + u16::from(set == EndpointSetId::Local))
    }
}

/// The userspace mode's capture of every scenario loads into the kernel; it has no
/// per-endpoint chain, each set chain is one redirect to its port (none for SCTP),
/// and packets from outside to loopback are left alone; a partial plan over it
/// leaves the kernel as a full load would.
#[test]
fn the_userspace_capture_loads_and_its_partial_plans_match_a_full_load() {
    let Some(ns) = Netns::create("the_userspace_capture") else {
        return;
    };
    let capture: std::sync::Arc<dyn CapturePorts> = std::sync::Arc::new(FixedPorts);
    for case in cases() {
        let mut sc = Scenario::load(&case);
        let intent = sc.intent();
        let script = svcproxy_plan::nft::render_full_with(&intent, Some(capture.clone()));
        ns.nft_apply(&script)
            .unwrap_or_else(|e| panic!("{case}: nft rejected the capture:\n{e}\n{script}"));
        let listed = ns.nft(&["list", "ruleset"]);
        assert!(!listed.contains("chain endpoint-"), "{case}: {listed}");
        assert!(
            !listed.contains(" dnat ip to ") && !listed.contains(" dnat ip6 to "),
            "{case}: {listed}"
        );
        for block in listed.split("\n\n") {
            let Some(name) = block.trim_start().strip_prefix("chain ") else {
                continue;
            };
            let name = name.split(' ').next().unwrap_or("");
            let hashed = |prefix: &str| {
                name.strip_prefix(prefix)
                    .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            };
            if !(hashed("service-") || hashed("local-")) {
                continue;
            }
            // The chain's own lines, up to its closing brace.
            let rules: Vec<&str> = block
                .lines()
                .skip(1)
                .map(str::trim)
                .take_while(|l| *l != "}")
                .filter(|l| !l.is_empty() && !l.starts_with("comment"))
                .collect();
            assert!(
                rules.is_empty() || (rules.len() == 1 && rules[0].contains(" redirect to :4")),
                "{case}: {block}"
            );
        }
        assert!(
            listed.contains("ip daddr 127.0.0.0/8 return")
                && listed.contains("ip6 daddr ::1 return"),
            "{case}: {listed}"
        );
        ns.nft_apply(&cleanup_script()).expect("cleanup");
    }

    let mut sc = Scenario::load("loadbalancer-source-ranges-etp-local");
    let mut planner = NftPipeline::with_capture(capture);
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    apply_and_compare(&ns, &mut planner, &plan, "capture: first sync");
    sc.upsert_yaml(
        r#"
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
- {addresses: [198.18.2.30], nodeName: node-b}
"#,
    );
    let up = sc.snapshot();
    let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
    assert_eq!(plan.kind, PlanKind::Partial);
    apply_and_compare(&ns, &mut planner, &plan, "capture: local endpoint gone");
}
