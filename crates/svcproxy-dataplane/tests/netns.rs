//! The real `nft` in a throwaway network namespace: full, partial and deleting
//! syncs show in `nft list table ip svcproxy`; a rejected transaction leaves the
//! previous rules in force and the next sync recreates the tables; a bogus `nft`
//! is an error; cleanup removes svcproxy's tables and nothing else.
//!
//! Every `nft` here runs as `ip netns exec <namespace> nft`: the root
//! namespace is never touched. Without root (or `ip`/`nft`) the tests print SKIP and
//! pass, unless `CI` is set, in which case they fail.

mod common;

use std::process::Command;

use common::netns::Netns;
use common::*;
use svcproxy_core::model::IpFamily;
use svcproxy_dataplane::nftables::NftWriter;
use svcproxy_dataplane::nftables::{cleanup, cleanup_with};
use svcproxy_dataplane::Batch;
use svcproxy_dataplane::TableState;
use svcproxy_dataplane::{
    DataPlane, DataPlaneError, NftCommand, NftDataPlane, ScriptSink, SyncKind,
};
use svcproxy_plan::nft::ColdStart;

/// What these tests do inside their namespace.
impl Netns {
    /// `nft` inside the namespace, for the data plane (whose drift check reads the
    /// namespace's tables over netlink).
    fn nft_command(&self) -> NftCommand {
        NftCommand::from_argv(["ip", "netns", "exec", &self.name, "nft"])
            .in_netns(format!("/run/netns/{}", self.name))
    }

    /// Runs `nft ARGS` inside the namespace; stdout.
    fn nft(&self, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft"])
            .args(args)
            .output()
            .expect("run ip netns exec");
        assert!(
            out.status.success(),
            "nft {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn table(&self) -> String {
        self.nft(&["list", "table", "ip", "svcproxy"])
    }
}

fn create(test: &str, tag: &str) -> Option<Netns> {
    Netns::create(test, tag, &["nft"])
}

#[test]
fn the_drift_check_reads_the_namespaces_tables_over_netlink() {
    let Some(ns) = create(
        "the_drift_check_reads_the_namespaces_tables_over_netlink",
        "drift",
    ) else {
        return;
    };
    let mut state = cluster(&[WEB, DB]);
    let mut dp = Syncer::new(plan_config(), NftDataPlane::with_sink(ns.nft_command()));
    dp.sync(&snapshot(&mut state), true).expect("full sync");
    assert_eq!(dp.drift().unwrap(), None);
    assert!(
        dp.plane().drift_armed(),
        "both tables and their chains read"
    );
    for (by_hand, said) in [
        (
            "add table ip svcproxy { flags dormant; }",
            "table ip svcproxy was made dormant",
        ),
        (
            "delete table ip6 svcproxy",
            "table ip6 svcproxy was deleted",
        ),
        (
            "delete table ip svcproxy\nadd table ip svcproxy",
            "table ip svcproxy was deleted and created again by someone else",
        ),
        // The table's handle stays; the dispatch chain's use count tells.
        (
            "flush table ip svcproxy",
            "chain services of table ip svcproxy lost rules or the jumps to it (0 of",
        ),
        (
            "flush chain ip6 svcproxy nat-output",
            "chain services of table ip6 svcproxy lost rules or the jumps to it",
        ),
    ] {
        ns.nft(&[by_hand]);
        let drift = dp.drift().unwrap().expect("a drift");
        assert!(drift.contains(said), "{by_hand}: {drift}");
        let report = dp.sync(&snapshot(&mut state), false).expect("repair");
        assert_eq!(report.kind, SyncKind::Recreate);
        assert_eq!(dp.drift().unwrap(), None, "{by_hand}: repaired");
        has(&ns.table(), ": 198.18.1.10 . 8080", "repaired");
    }
    // svcproxy's own syncs, partial and full, leave nothing the check calls drift.
    upsert(&mut state, WEB_MOVED);
    let report = dp.sync(&snapshot(&mut state), false).expect("partial");
    assert_eq!(report.kind, SyncKind::Partial);
    assert_eq!(dp.drift().unwrap(), None, "after a partial sync");
    dp.sync(&snapshot(&mut state), true).expect("full");
    assert_eq!(
        dp.drift().unwrap(),
        None,
        "after a full sync over the tables"
    );
    assert!(dp.plane().drift_armed());
}

#[test]
fn syncs_show_in_the_kernel_and_failures_recover() {
    let Some(ns) = create("syncs_show_in_the_kernel_and_failures_recover", "sync") else {
        return;
    };
    let mut state = cluster(&[WEB, DB]);
    // Through `nft -f` (its errors are checked below; the netlink writer's in
    // `the_netlink_and_text_writers_leave_the_same_tables`).
    let mut dp = Syncer::new(
        plan_config(),
        NftDataPlane::with_sink(ns.nft_command()).with_writer(NftWriter::Text),
    );
    let web = service_chain("web", "http");
    let db = service_chain("db", "pg");

    // Full sync.
    let report = dp.sync(&snapshot(&mut state), true).expect("full sync");
    assert_eq!(report.kind, SyncKind::Recreate);
    assert!(report.script_bytes > 0);
    let t = ns.table();
    // (web, a cluster IP port alone, has no chain: its two endpoints are elements
    // of the cluster IP map, `VIP . PROTO . PORT . K : ADDRESS . PORT`, and its
    // port one of the set of its endpoint count. db's external IP takes chains,
    // and its one endpoint is DNATed directly.)
    for needle in [
        "198.19.0.10 . tcp . 80 . 0 : 198.18.1.10 . 8080".to_string(),
        "198.19.0.10 . tcp . 80 . 1 : 198.18.2.10 . 8080".to_string(),
        "@clusterip-tcp-2 dnat ip to".to_string(),
        "198.19.0.20 . tcp . 5432 : goto ".to_string(),
        "203.0.113.20 . tcp . 5432 : goto ".to_string(),
        "dnat to 198.18.2.20:5432".to_string(),
        format!("chain {db}"),
    ] {
        has(&t, &needle, "full sync");
    }
    assert!(ns.nft(&["list", "tables"]).contains("table ip6 svcproxy"));

    // One service's endpoints change: a partial sync.
    upsert(&mut state, WEB_MOVED);
    let report = dp.sync(&snapshot(&mut state), false).expect("partial sync");
    assert_eq!(report.kind, SyncKind::Partial);
    let t = ns.table();
    has(&t, ": 198.18.3.10 . 8080", "endpoints changed");
    has(&t, ": 198.18.1.10 . 8080", "endpoints changed");
    lacks(&t, "198.18.2.10", "endpoints changed");
    has(&t, "dnat to 198.18.2.20:5432", "endpoints changed");

    // A service deleted: its elements and chains go.
    delete_service(&mut state, "db");
    let report = dp.sync(&snapshot(&mut state), false).expect("delete sync");
    assert_eq!(report.kind, SyncKind::Partial);
    let t = ns.table();
    lacks(&t, "198.19.0.20", "db deleted");
    lacks(&t, "203.0.113.20", "db deleted");
    lacks(&t, &db, "db deleted");
    has(&t, "198.19.0.10 . tcp . 80 . 0 : ", "db deleted");

    // nft rejects a transaction (the kernel no longer holds what the planner
    // believes): nothing of it applies, the error carries nft's stderr, and the next
    // sync recreates the tables.
    ns.nft(&[
        "delete",
        "element",
        "ip",
        "svcproxy",
        "clusterip-tcp-2",
        "{ 198.19.0.10 . tcp . 80 }",
    ]);
    delete_service(&mut state, "web");
    let err = dp.sync(&snapshot(&mut state), false).unwrap_err();
    let DataPlaneError::Rejected { stderr, .. } = &err else {
        panic!("expected a rejection, got {err:?}");
    };
    assert!(stderr.contains("Error: Could not process rule"), "{err}");
    assert!(stderr.contains("clusterip-tcp-2"), "{err}");
    assert!(err.to_string().contains("ip netns exec"), "{err}");
    has(
        &ns.table(),
        "198.19.0.10 . tcp . 80 . 0 : ",
        "rejected (rolled back)",
    );
    let report = dp.sync(&snapshot(&mut state), false).expect("recreate");
    assert_eq!(report.kind, SyncKind::Recreate);
    let t = ns.table();
    lacks(&t, &web, "recreated without web");
    lacks(&t, "198.19.0.10", "recreated without web");

    // A bogus nft: an error, and again a recreate once nft is back.
    upsert(&mut state, DB);
    *dp.plane_mut().sink_mut() = NftCommand::from_argv([
        "ip",
        "netns",
        "exec",
        &ns.name,
        "/nonexistent/svcproxy-test/nft",
    ])
    .in_netns(format!("/run/netns/{}", ns.name));
    let err = dp.sync(&snapshot(&mut state), false).unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent/svcproxy-test/nft"),
        "{err}"
    );
    lacks(&ns.table(), "198.19.0.20", "bogus nft");
    *dp.plane_mut().sink_mut() = ns.nft_command();
    let report = dp.sync(&snapshot(&mut state), false).expect("recovered");
    assert_eq!(report.kind, SyncKind::Recreate);
    has(&ns.table(), "198.19.0.20 . tcp . 5432 : goto ", "recovered");

    // A missing binary cannot even start. (The text writer: the netlink writer
    // needs no binary, and this command names no namespace, so it would write to
    // this process's own.)
    let err = Syncer::new(
        plan_config(),
        NftDataPlane::with_sink(NftCommand::new("/nonexistent/nft")).with_writer(NftWriter::Text),
    )
    .sync(&snapshot(&mut cluster(&[WEB])), true)
    .unwrap_err();
    assert!(matches!(err, DataPlaneError::Spawn { .. }), "{err:?}");
}

#[test]
fn cleanup_removes_only_svcproxy_tables() {
    let Some(ns) = create("cleanup_removes_only_svcproxy_tables", "cleanup") else {
        return;
    };
    let mut nft = ns.nft_command();
    // Nothing to clean: still fine.
    cleanup_with(&mut nft).expect("cleanup of nothing");
    ns.nft(&["add", "table", "inet", "other"]);
    ns.nft(&["add chain inet other input { type filter hook input priority 0 ; policy accept ; }"]);
    ns.nft(&["add table ip svcproxy-other"]);
    let mut state = cluster(&[WEB, DB]);
    let mut dp = Syncer::new(plan_config(), NftDataPlane::with_sink(ns.nft_command()));
    dp.sync(&snapshot(&mut state), false).expect("sync");
    let tables = ns.nft(&["list", "tables"]);
    assert!(tables.contains("table ip svcproxy\n"), "{tables}");
    assert!(tables.contains("table ip6 svcproxy\n"), "{tables}");

    cleanup_with(&mut nft).expect("cleanup");
    assert_eq!(
        ns.nft(&["list", "tables"]),
        "table inet other\ntable ip svcproxy-other\n"
    );
    assert!(ns
        .nft(&["list", "table", "inet", "other"])
        .contains("chain input"));

    // The plain-path form reports a missing binary (and runs nothing).
    let err = cleanup("/nonexistent/nft").unwrap_err();
    assert!(matches!(err, DataPlaneError::Spawn { .. }), "{err:?}");
}

/// Both tables of a namespace, as `nft_listing` reads them (elements sorted:
/// the kernel lists a hash set in its own order).
fn listings(ns: &Netns) -> Vec<svcproxy_dataplane::kernel::listing::Listing> {
    ["ip", "ip6"]
        .iter()
        .map(|f| {
            svcproxy_dataplane::kernel::listing::nft_listing(
                &ns.nft(&["list", "table", f, "svcproxy"]),
                f,
                "svcproxy",
            )
        })
        .collect()
}

fn same_tables(a: &Netns, b: &Netns, step: &str) {
    for (f, (x, y)) in ["ip", "ip6"]
        .iter()
        .zip(listings(a).iter().zip(&listings(b)))
    {
        let d = svcproxy_dataplane::kernel::listing::differences(
            f,
            x,
            y,
            svcproxy_dataplane::kernel::listing::Compared::Rules,
        );
        assert!(d.is_empty(), "{step}: the writers' tables differ: {d:#?}");
        assert_eq!(x, y, "{step}: {f}");
    }
}

/// Two ClusterIP services of one endpoint each, one per family: name, family,
/// cluster IP, endpoint (for [`clusterip`]).
/// edge: a LoadBalancer with ClientIP affinity, source ranges and eTP Local, one
/// endpoint here and one on node-b.
const EDGE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: edge, namespace: demo}
spec:
  type: LoadBalancer
  clusterIP: 198.19.0.32
  externalTrafficPolicy: Local
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 30}}
  loadBalancerSourceRanges: [198.51.100.0/24, 0.0.0.0/0]
  ports:
  - {name: https, port: 443, targetPort: 8443, nodePort: 30444}
status:
  loadBalancer:
    ingress:
    - {ip: 203.0.113.32}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: edge-1
  namespace: demo
  labels: {kubernetes.io/service-name: edge}
addressType: IPv4
ports:
- {name: https, port: 8443}
endpoints:
- {addresses: [198.18.1.32], nodeName: node-a}
- {addresses: [198.18.2.32], nodeName: node-b}
"#;

const SOLOS: [(&str, &str, &str, &str); 2] = [
    ("solo", "IPv4", "198.19.0.40", "198.18.2.40"),
    ("solo6", "IPv6", "2001:db8:ffff::40", "2001:db8:2::40"),
];

/// A ClusterIP service `name` of `family` ("IPv4" or "IPv6") at `ip`, port 80 to
/// 8080 on each of `endpoints`.
fn clusterip(name: &str, family: &str, ip: &str, endpoints: &[&str]) -> String {
    let mut y = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: demo}}\n\
         spec:\n  ipFamilies: [{family}]\n  clusterIP: \"{ip}\"\n  ports:\n  - {{name: http, port: 80, targetPort: 8080}}\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: demo\n  \
         labels: {{kubernetes.io/service-name: {name}}}\naddressType: {family}\nports:\n- {{name: http, port: 8080}}\nendpoints:\n"
    );
    for e in endpoints {
        y.push_str(&format!("- {{addresses: [\"{e}\"], nodeName: node-b}}\n"));
    }
    y
}

/// With kube-proxy 1.38's default gate (KEP-6032), NodePorts on loopback are
/// rejected and counted in chains of their own: both writers write the same rules
/// there (the TCP reset with its `meta l4proto tcp`, which `nft` adds by itself).
#[test]
fn the_writers_agree_on_the_localhost_nodeport_reject_chains() {
    let Some(a) = create("the_writers_agree_on_the_localhost", "netlink") else {
        return;
    };
    let b = create("the_writers_agree_on_the_localhost", "text").expect("a second namespace");
    let cfg = svcproxy_plan::PlanConfig {
        localhost_gate: Some(svcproxy_plan::LocalhostGate { tcp_only: true }),
        ..plan_config()
    };
    let mut state = cluster(&[WEB, DB]);
    let mut net = Syncer::new(cfg.clone(), NftDataPlane::with_sink(a.nft_command()));
    let mut txt = Syncer::new(
        cfg,
        NftDataPlane::with_sink(b.nft_command()).with_writer(NftWriter::Text),
    );
    let snap = snapshot(&mut state);
    net.sync(&snap, false).expect("netlink");
    txt.sync(&snap, false).expect("text");
    has(
        &a.table(),
        "localhost-nodeport-reject-tcp",
        "the gate's chains",
    );
    same_tables(&a, &b, "localhost NodePort rejects");
}

/// The netlink writer (every sync as one nf_tables batch) and the
/// `nft -f` writer leave the same tables after every step; the netlink one
/// really writes those syncs itself (with no `nft` at all they still apply); a
/// batch the kernel refuses applies nothing of itself, and the next sync
/// recreates the tables.
#[test]
fn the_netlink_and_text_writers_leave_the_same_tables() {
    let Some(a) = create("the_netlink_and_text_writers", "netlink") else {
        return;
    };
    let b = create("the_netlink_and_text_writers", "text").expect("a second namespace");
    let mut state = cluster(&[WEB, DB]);
    let mut net = Syncer::new(plan_config(), NftDataPlane::with_sink(a.nft_command()));
    let mut txt = Syncer::new(
        plan_config(),
        NftDataPlane::with_sink(b.nft_command()).with_writer(NftWriter::Text),
    );
    // Both planes sync the same snapshot; the tables must agree.
    macro_rules! both {
        ($step:expr) => {{
            let snap = snapshot(&mut state);
            let r = net.sync(&snap, false).expect($step);
            txt.sync(&snap, false).expect($step);
            same_tables(&a, &b, $step);
            r.kind
        }};
    }
    assert_eq!(both!("first sync"), SyncKind::Recreate);
    // Elements only: web keeps two endpoints, one of them another.
    upsert(&mut state, WEB_MOVED);
    assert_eq!(both!("endpoint moved"), SyncKind::Partial);
    has(&a.table(), ": 198.18.3.10 . 8080", "endpoint moved");
    lacks(&a.table(), "198.18.2.10 . 8080", "endpoint moved");
    // Back, and then db deleted (chains: nft for both).
    upsert(&mut state, WEB);
    assert_eq!(both!("endpoint back"), SyncKind::Partial);
    delete_service(&mut state, "db");
    assert_eq!(both!("db deleted"), SyncKind::Partial);

    // With no nft at all every sync applies (netlink): elements only, chains,
    // affinity sets.
    let path = format!("/run/netns/{}", a.name);
    *net.plane_mut().sink_mut() = NftCommand::new("/nonexistent/svcproxy-test/nft").in_netns(&path);
    upsert(&mut state, WEB_MOVED);
    let snap = snapshot(&mut state);
    assert_eq!(
        net.sync(&snap, false).expect("netlink only").kind,
        SyncKind::Partial
    );
    txt.sync(&snap, false).expect("text");
    same_tables(&a, &b, "endpoint moved, netlink only");
    // Typed rules too: a ClusterIP service with one endpoint (served without a
    // chain: the set and rule of its endpoint count, elements) comes and goes
    // without nft, in both families.
    for (name, family, ip, ep) in SOLOS {
        upsert(&mut state, &clusterip(name, family, ip, &[ep]));
        let snap = snapshot(&mut state);
        net.sync(&snap, false).expect("service added, netlink only");
        txt.sync(&snap, false).expect("text");
        same_tables(&a, &b, &format!("{name} added, netlink only"));
    }
    delete_service(&mut state, "solo");
    let snap = snapshot(&mut state);
    net.sync(&snap, false)
        .expect("service deleted, netlink only");
    txt.sync(&snap, false).expect("text");
    same_tables(&a, &b, "solo deleted, netlink only");
    // An external IP's chains too.
    upsert(&mut state, DB);
    let snap = snapshot(&mut state);
    net.sync(&snap, false).expect("db added, netlink only");
    txt.sync(&snap, false).expect("text");
    same_tables(&a, &b, "db added, netlink only");

    // A batch the kernel refuses: the element it deletes was taken away by hand.
    *net.plane_mut().sink_mut() = a.nft_command();
    delete_service(&mut state, "db");
    both!("recovered");
    let listed = a.table();
    let key = listed
        .split([',', '{', '}', '\n'])
        .map(str::trim)
        .find_map(|e| e.strip_suffix(" : 198.18.3.10 . 8080"))
        .expect("the moved endpoint's element")
        .to_string();
    let map = listed
        .lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix("map "))
        .map(|l| l.split(' ').next().unwrap())
        .find(|m| *m == "clusterip-dnat-tcp")
        .expect("the cluster IP endpoint map")
        .to_string();
    a.nft(&[
        "delete",
        "element",
        "ip",
        "svcproxy",
        &map,
        &format!("{{ {key} }}"),
    ]);
    let before = listings(&a);
    upsert(&mut state, WEB);
    let err = net.sync(&snapshot(&mut state), false).unwrap_err();
    let DataPlaneError::Rejected { stderr, .. } = &err else {
        panic!("expected a rejection, got {err:?}");
    };
    assert!(
        stderr.contains(&format!("delete element ip svcproxy {map}")),
        "{err}"
    );
    assert_eq!(listings(&a), before, "nothing of the refused batch applied");
    lacks(&a.table(), "198.18.2.10 . 8080", "refused");
    let report = net.sync(&snapshot(&mut state), false).expect("recreate");
    assert_eq!(report.kind, SyncKind::Recreate);
    // A full sync on the other side too: a partial sync leaves the rule of an
    // endpoint count no longer in use (solo's) until the next full one.
    txt.sync(&snapshot(&mut state), true).expect("text");
    same_tables(&a, &b, "recreated after the refusal");

    // Endpoint maps in IPv6, and a set whose count changes (its port moves to
    // the set of the new count, its map elements follow).
    upsert(
        &mut state,
        &clusterip(
            "web6",
            "IPv6",
            "2001:db8:ffff::50",
            &["2001:db8:2::50", "2001:db8:2::51"],
        ),
    );
    both!("web6 added");
    upsert(
        &mut state,
        &clusterip(
            "web6",
            "IPv6",
            "2001:db8:ffff::50",
            &["2001:db8:2::50", "2001:db8:2::51", "2001:db8:2::52"],
        ),
    );
    // (Without nft: the new count's set and rule and the elements go over
    // netlink.)
    *net.plane_mut().sink_mut() = NftCommand::new("/nonexistent/svcproxy-test/nft").in_netns(&path);
    assert_eq!(both!("web6 grown"), SyncKind::Partial);
    has(
        &a.nft(&["list", "table", "ip6", "svcproxy"]),
        "@clusterip-tcp-3 dnat ip6 to ip6 daddr . meta l4proto . tcp dport . numgen random mod 3 map @clusterip-dnat-tcp",
        "web6 grown",
    );
    upsert(
        &mut state,
        &WEB.replace("- {addresses: [198.18.2.10], nodeName: node-b}", "- {addresses: [198.18.2.10], nodeName: node-b}\n- {addresses: [198.18.2.11], nodeName: node-b}"),
    );
    assert_eq!(both!("web grown"), SyncKind::Partial);
    // A load balancer with ClientIP affinity, source ranges and eTP Local comes
    // and goes in partial syncs: affinity sets (declared, then deleted), endpoint
    // chains, external and firewall chains, all without nft.
    upsert(&mut state, EDGE);
    assert_eq!(both!("edge added"), SyncKind::Partial);
    has(&a.table(), "update @affinity-", "edge added");
    upsert(
        &mut state,
        &EDGE.replace("timeoutSeconds: 30", "timeoutSeconds: 60"),
    );
    assert_eq!(both!("edge's affinity timeout changed"), SyncKind::Partial);
    delete_service(&mut state, "edge");
    assert_eq!(both!("edge deleted"), SyncKind::Partial);
    lacks(&a.table(), "affinity-", "edge deleted");
    delete_service(&mut state, "web6");
    *net.plane_mut().sink_mut() = a.nft_command();
    both!("web6 deleted");
}

/// A sink that counts the transactions it writes, and refuses the one numbered
/// `fail_at` (counted from 1) without writing it.
struct Counting<S> {
    inner: S,
    batches: usize,
    fail_at: Option<usize>,
}

impl<S: ScriptSink> ScriptSink for Counting<S> {
    fn apply(&mut self, script: &str) -> Result<(), DataPlaneError> {
        self.inner.apply(script)
    }
    fn apply_batch(&mut self, batch: Batch, script: &str) -> Result<(), DataPlaneError> {
        self.batches += 1;
        if self.fail_at == Some(self.batches) {
            return Err(DataPlaneError::Io {
                command: "a refused transaction".to_string(),
                source: std::io::Error::other("refused by the test"),
            });
        }
        self.inner.apply_batch(batch, script)
    }
    fn writes_typed(&self) -> bool {
        self.inner.writes_typed()
    }
    fn table_state(&mut self, family: IpFamily, name: &str) -> Result<TableState, DataPlaneError> {
        self.inner.table_state(family, name)
    }
    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<bool, DataPlaneError> {
        self.inner.chain_exists(family, table, chain)
    }
}

/// Full syncs over netlink: for every golden scenario (affinity, firewalls,
/// NodePorts, every local-traffic detection, IPv6, the userspace-free skeleton
/// variants), a first sync and a forced resync written with no `nft` binary at
/// all leave exactly the tables `nft -f` leaves for the same plans (the
/// `pod-cidrs` interval set of local detection by several CIDRs included).
///
/// The first sync finds no svcproxy table, so it is a cold start written in
/// steps: with the default budgets, and in a third namespace with a budget of
/// one statement (a transaction per service port, and one per Service linked),
/// which leaves the same tables; a recreate over existing tables is one
/// transaction per family.
#[test]
fn full_syncs_over_netlink_leave_the_tables_nft_leaves() {
    for case in svcproxy_testkit::scenario::cases() {
        let sc = svcproxy_testkit::scenario::Scenario::load(&case);
        let Some(a) = create("full_syncs_over_netlink", "netlink") else {
            return;
        };
        let b = create("full_syncs_over_netlink", "text").expect("a second namespace");
        let c = create("full_syncs_over_netlink", "steps").expect("a third namespace");
        let cfg = sc.config.to_plan_config();
        let no_nft = |ns: &Netns| {
            NftCommand::new("/nonexistent/svcproxy-test/nft")
                .in_netns(format!("/run/netns/{}", ns.name))
        };
        let mut net = Syncer::new(cfg.clone(), NftDataPlane::with_sink(no_nft(&a)));
        let mut txt = Syncer::new(
            cfg.clone(),
            NftDataPlane::with_sink(b.nft_command()).with_writer(NftWriter::Text),
        );
        let tiny = ColdStart {
            objects_per_commit: 1,
            links_per_commit: 1,
        };
        let mut steps = Syncer::new(
            cfg,
            NftDataPlane::with_sink(Counting {
                inner: no_nft(&c),
                batches: 0,
                fail_at: None,
            })
            .with_cold_start(Some(tiny)),
        );
        let mut state = sc.state();
        let snap = snapshot(&mut state);
        txt.sync(&snap, false).expect("text writer");
        let r = net
            .sync(&snap, false)
            .unwrap_or_else(|e| panic!("{case}: the netlink writer failed: {e}"));
        assert_eq!(r.kind, SyncKind::Recreate, "{case}");
        same_tables(&a, &b, &format!("{case}: first sync"));
        let r = steps
            .sync(&snap, false)
            .unwrap_or_else(|e| panic!("{case}: the cold start in steps failed: {e}"));
        assert_eq!(r.kind, SyncKind::Recreate, "{case}");
        same_tables(&c, &b, &format!("{case}: cold start in steps"));
        let ports = snap.v4.service_ports.len() + snap.v6.service_ports.len();
        let sent = steps.plane().sink().batches;
        // One transaction per family in one go; in steps, at least the skeleton,
        // the objects and the links of a family with a service port.
        assert!(
            sent > ports && sent >= 3,
            "{case}: {sent} transactions for {ports} service ports"
        );
        // Over existing tables (the drift check's repair): one per family.
        c.nft(&["add table ip svcproxy { flags dormant; }"]);
        assert!(steps.drift().expect("drift check").is_some(), "{case}");
        steps.plane_mut().sink_mut().batches = 0;
        let snap2 = snapshot(&mut state);
        assert_eq!(
            steps.sync(&snap2, false).expect("repair").kind,
            SyncKind::Recreate
        );
        assert!(steps.plane().sink().batches <= 2, "{case}: the repair");
        same_tables(&c, &b, &format!("{case}: recreate over a table"));
        // A forced full sync over the loaded tables (flushes, then adds again).
        let snap = snapshot(&mut state);
        assert_eq!(
            net.sync(&snap, true).expect("resync").kind,
            SyncKind::Resync,
            "{case}"
        );
        txt.sync(&snap, true).expect("text resync");
        same_tables(&a, &b, &format!("{case}: resync"));
    }
}

/// A cold start whose step the kernel refuses stops there: the sync fails, no
/// later step is written (the steps are planned on one thread and written on
/// another, in order), what the earlier steps wrote stays, and the next sync
/// recreates the tables whole.
#[test]
fn a_cold_start_stops_at_the_step_the_kernel_refuses() {
    let sc = svcproxy_testkit::scenario::Scenario::load("session-affinity");
    let Some(a) = create("cold_start_refused", "steps") else {
        return;
    };
    let b = create("cold_start_refused", "text").expect("a second namespace");
    let cfg = sc.config.to_plan_config();
    let tiny = ColdStart {
        objects_per_commit: 1,
        links_per_commit: 1,
    };
    let mut state = sc.state();
    let snap = snapshot(&mut state);
    let mut txt = Syncer::new(
        cfg.clone(),
        NftDataPlane::with_sink(b.nft_command()).with_writer(NftWriter::Text),
    );
    txt.sync(&snap, false).expect("text writer");
    let mut steps = Syncer::new(
        cfg,
        NftDataPlane::with_sink(Counting {
            inner: a.nft_command(),
            batches: 0,
            fail_at: Some(3),
        })
        .with_cold_start(Some(tiny)),
    );
    let e = steps
        .sync(&snap, false)
        .expect_err("the third step is refused");
    assert!(e.to_string().contains("refused by the test"), "{e}");
    assert_eq!(
        steps.plane().sink().batches,
        3,
        "no step after the refused one"
    );
    // The first two steps are in: the table exists, but is not whole.
    let partial = a.nft(&["list", "table", "ip", "svcproxy"]);
    assert!(partial.contains("chain services"), "{partial}");
    assert_ne!(partial, b.nft(&["list", "table", "ip", "svcproxy"]));
    steps.plane_mut().sink_mut().fail_at = None;
    steps.plane_mut().sink_mut().batches = 0;
    let snap = snapshot(&mut state);
    assert_eq!(
        steps.sync(&snap, false).expect("the next sync").kind,
        SyncKind::Recreate
    );
    assert!(
        steps.plane().sink().batches <= 2,
        "over a table: one transaction per family"
    );
    same_tables(&a, &b, "after the refused cold start");
}

/// The typed masquerade marks are the rules `nft` writes for the same text: with a
/// local-pod CIDR whose prefix is not a whole number of bytes (compared under a
/// mask, where a whole-byte prefix is compared by its bytes only), and with
/// `--masquerade-all` (no source condition).
#[test]
fn masquerade_marks_are_written_as_nft_writes_them() {
    let masked = svcproxy_plan::PlanConfig {
        local_detection: svcproxy_plan::LocalDetection::ClusterCidr(vec![
            "198.18.0.0/20".parse().unwrap(),
            "2001:db8::/61".parse().unwrap(),
        ]),
        ..plan_config()
    };
    let all = svcproxy_plan::PlanConfig {
        masquerade_all: true,
        ..plan_config()
    };
    // (Where: the rule of the skeleton; the cluster IP port's element of the
    // masquerade set.)
    for (tag, cfg, within, needle) in [
        (
            "masked",
            masked,
            "chain services {",
            "ip saddr != 198.18.0.0/20 jump mark-for-masquerade",
        ),
        ("all", all, "set clusterip-masq {", "198.19.0.40 . tcp . 80"),
    ] {
        let Some(a) = create("masquerade_marks", &format!("{tag}-netlink")) else {
            return;
        };
        let b = create("masquerade_marks", &format!("{tag}-text")).expect("a second namespace");
        let path = format!("/run/netns/{}", a.name);
        let mut net = Syncer::new(cfg.clone(), NftDataPlane::with_sink(a.nft_command()));
        let mut txt = Syncer::new(
            cfg,
            NftDataPlane::with_sink(b.nft_command()).with_writer(NftWriter::Text),
        );
        let mut state = cluster(&[WEB]);
        let snap = snapshot(&mut state);
        net.sync(&snap, false).expect("first sync");
        txt.sync(&snap, false).expect("first sync");
        *net.plane_mut().sink_mut() =
            NftCommand::new("/nonexistent/svcproxy-test/nft").in_netns(&path);
        for (name, family, ip, ep) in SOLOS {
            upsert(&mut state, &clusterip(name, family, ip, &[ep]));
            let snap = snapshot(&mut state);
            net.sync(&snap, false).expect("netlink only");
            txt.sync(&snap, false).expect("text");
        }
        same_tables(&a, &b, tag);
        let listed = a.nft(&["list", "table", "ip", "svcproxy"]);
        let block = listed
            .split(within)
            .nth(1)
            .and_then(|rest| rest.split('}').next())
            .unwrap_or_else(|| panic!("{tag}: {within} missing:\n{listed}"));
        has(block, needle, tag);
    }
}
