//! UDP conntrack cleanup as `Driver::sync` drives it, against a fake `nft`
//! (`RecordingSink`) and a fake conntrack table (`RecordingCleaner`): when it runs,
//! what it is asked to delete, and that its failure never fails a sync.
//!
//! Address plan: as `common` (node-a, pods 198.18.<n>.0/24, services 198.19.0.0/16,
//! external IPs 203.0.113.0/24); the DNS service below is 198.19.0.53.

// The data plane's test cluster (YAML through the real `ClusterState`).
#[path = "../../svcproxy-dataplane/tests/common/mod.rs"]
mod common;

use common::*;
use svcproxy_core::model::{IpFamily, Protocol};
use svcproxy_dataplane::{
    ConntrackEntry, ConntrackFilter, NftDataPlane, RecordingCleaner, RecordingSink, IPS_DST_NAT,
};
use svcproxy_sync::Driver;

/// dns: 198.19.0.53:53/UDP (+ external IP 203.0.113.53, NodePort 30053) → :5353.
const DNS: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: demo}
spec:
  type: NodePort
  clusterIP: 198.19.0.53
  externalIPs: [203.0.113.53]
  ports:
  - {name: dns, protocol: UDP, port: 53, targetPort: 5353, nodePort: 30053}
  - {name: dns-tcp, protocol: TCP, port: 53, targetPort: 5353}
"#;

fn dns_slice(ips: &[&str]) -> String {
    let mut s = String::from(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: dns-1\n  \
         namespace: demo\n  labels: {kubernetes.io/service-name: dns}\naddressType: IPv4\n\
         ports:\n- {name: dns, protocol: UDP, port: 5353}\n- {name: dns-tcp, protocol: TCP, port: 5353}\n",
    );
    if ips.is_empty() {
        s.push_str("endpoints: []\n");
    } else {
        s.push_str("endpoints:\n");
        for ip in ips {
            s.push_str(&format!("- {{addresses: [{ip}], nodeName: node-b}}\n"));
        }
    }
    s
}

fn ip(s: &str) -> std::net::IpAddr {
    s.parse().unwrap()
}

/// A UDP flow from pod 198.18.1.20:40000 to `dst:dport`, answered by `reply`.
fn flow(dst: &str, dport: u16, reply: &str, rport: u16, dnat: bool) -> ConntrackEntry {
    ConntrackEntry {
        family: IpFamily::V4,
        protocol: 17,
        orig_src: ip("198.18.1.20"),
        orig_dst: ip(dst),
        orig_sport: Some(40000),
        orig_dport: Some(dport),
        reply_src: ip(reply),
        reply_dst: ip("198.18.1.20"),
        reply_sport: Some(rport),
        reply_dport: Some(40000),
        status: if dnat { IPS_DST_NAT | 0xe } else { 0x8 },
        zone: 0,
        id: None,
    }
}

fn plane(entries: Vec<ConntrackEntry>) -> Driver<NftDataPlane<RecordingSink>, RecordingCleaner> {
    Driver::with_cleaner(
        plan_config(),
        NftDataPlane::with_sink(RecordingSink::new()),
        RecordingCleaner::with_entries(entries),
    )
}

#[test]
fn a_removed_endpoint_loses_exactly_its_udp_flows_after_the_apply() {
    let to_a = flow("198.19.0.53", 53, "198.18.2.10", 5353, true);
    let to_b = flow("198.19.0.53", 53, "198.18.2.11", 5353, true);
    let ext_to_a = flow("203.0.113.53", 53, "198.18.2.10", 5353, true);
    let np_to_a = flow("198.18.0.1", 30053, "198.18.2.10", 5353, true);
    let mut tcp_to_a = flow("198.19.0.53", 53, "198.18.2.10", 5353, true);
    tcp_to_a.protocol = 6;
    let direct_to_a = flow("198.18.2.10", 5353, "198.18.2.10", 5353, false);
    let all = vec![
        to_a.clone(),
        to_b.clone(),
        ext_to_a.clone(),
        np_to_a.clone(),
        tcp_to_a.clone(),
        direct_to_a.clone(),
    ];
    let mut state = cluster(&[DNS, &dns_slice(&["198.18.2.10", "198.18.2.11"])]);
    let mut dp = plane(all);

    // First sync: nothing to compare with; the table is reconciled with the rules,
    // and every flow here is one they still serve (or not a service's).
    let first = dp.sync(&snapshot(&mut state), false).expect("first sync");
    assert!(first.conntrack.filters.is_empty());
    assert!(dp.cleaner().calls.is_empty());
    assert_eq!(dp.cleaner().reconciliations, 1);
    assert!(
        dp.cleaner().deleted.is_empty(),
        "{:?}",
        dp.cleaner().deleted
    );

    upsert(&mut state, &dns_slice(&["198.18.2.11"]));
    let report = dp.sync(&snapshot(&mut state), false).expect("sync");
    assert_eq!(report.conntrack.error, None);
    assert_eq!(report.conntrack.deleted, 3, "{:?}", report.conntrack);
    assert_eq!(report.conntrack.filters.len(), 3, "{:?}", report.conntrack);
    assert_eq!(
        dp.cleaner().deleted,
        [to_a, ext_to_a, np_to_a],
        "the cluster IP, external IP and NodePort flows to the removed endpoint"
    );
    assert_eq!(dp.cleaner().entries, [to_b, tcp_to_a, direct_to_a]);

    // Nothing changed: no filters, the cleaner is not called.
    let calls = dp.cleaner().calls.len();
    let idle = dp.sync(&snapshot(&mut state), false).expect("sync");
    assert!(idle.conntrack.filters.is_empty());
    assert_eq!(dp.cleaner().calls.len(), calls);
}

#[test]
fn a_service_that_gets_endpoints_loses_its_cached_rejects() {
    let rejected = flow("198.19.0.53", 53, "198.19.0.53", 53, false);
    let np_rejected = flow("198.18.0.1", 30053, "198.18.0.1", 30053, false);
    let other = flow("198.19.0.54", 53, "198.19.0.54", 53, false);
    let mut state = cluster(&[DNS, &dns_slice(&[])]);
    let mut dp = plane(vec![rejected.clone(), np_rejected.clone(), other.clone()]);
    dp.sync(&snapshot(&mut state), false).expect("first sync");
    upsert(&mut state, &dns_slice(&["198.18.2.10"]));
    let report = dp.sync(&snapshot(&mut state), false).expect("sync");
    let want: Vec<ConntrackFilter> = [
        (Some("198.19.0.53"), 53),
        (Some("203.0.113.53"), 53),
        (None, 30053),
    ]
    .iter()
    .map(|(dst, port)| ConntrackFilter {
        family: IpFamily::V4,
        protocol: Protocol::Udp,
        orig_dst: dst.map(ip),
        orig_dport: Some(*port),
        reply_src: None,
        reply_sport: None,
        dst_nat: Some(false),
    })
    .collect();
    let mut got = report.conntrack.filters.clone();
    got.sort();
    let mut want_sorted = want;
    want_sorted.sort();
    assert_eq!(got, want_sorted);
    assert_eq!(dp.cleaner().deleted, [rejected, np_rejected]);
    assert_eq!(dp.cleaner().entries, [other]);
}

#[test]
fn a_failed_apply_cleans_nothing_and_the_next_success_cleans_from_the_applied_state() {
    let to_a = flow("198.19.0.53", 53, "198.18.2.10", 5353, true);
    let mut state = cluster(&[DNS, &dns_slice(&["198.18.2.10"])]);
    let mut dp = plane(vec![to_a.clone()]);
    dp.sync(&snapshot(&mut state), false).expect("first sync");

    upsert(&mut state, &dns_slice(&["198.18.2.11"]));
    dp.plane_mut().sink_mut().fail_next("Error: nope");
    dp.sync(&snapshot(&mut state), false).unwrap_err();
    assert!(
        dp.cleaner().calls.is_empty(),
        "the old rules are still in force"
    );

    // The retry's snapshot has no change of its own, but the kernel still holds the
    // first one: the endpoint counts as removed now.
    let report = dp.sync(&snapshot(&mut state), false).expect("retry");
    assert_eq!(report.conntrack.deleted, 1);
    assert_eq!(dp.cleaner().deleted, [to_a]);
}

#[test]
fn a_cleanup_failure_is_reported_not_an_error_and_retried_with_the_next_sync() {
    let to_a = flow("198.19.0.53", 53, "198.18.2.10", 5353, true);
    let mut state = cluster(&[DNS, &dns_slice(&["198.18.2.10"])]);
    let mut dp = plane(vec![to_a.clone()]);
    dp.sync(&snapshot(&mut state), false).expect("first sync");
    upsert(&mut state, &dns_slice(&[]));
    dp.cleaner_mut().fail_next("netlink went away");
    let report = dp
        .sync(&snapshot(&mut state), false)
        .expect("sync succeeds");
    let err = report.conntrack.error.as_deref().expect("error reported");
    assert!(err.contains("netlink went away"), "{err}");
    assert_eq!(report.conntrack.deleted, 0);
    assert!(!report.conntrack.filters.is_empty());
    assert!(dp.cleaner().deleted.is_empty());
    // The next sync has no change of its own, but retries what failed.
    let next = dp.sync(&snapshot(&mut state), false).expect("sync");
    assert_eq!(next.conntrack.filters, report.conntrack.filters);
    assert_eq!(next.conntrack.error, None);
    assert_eq!(dp.cleaner().deleted, [to_a]);
    // Once done, nothing is retried.
    let idle = dp.sync(&snapshot(&mut state), false).expect("sync");
    assert!(idle.conntrack.filters.is_empty());
}

#[test]
fn tcp_only_changes_never_reach_the_cleaner() {
    let mut state = cluster(&[WEB]);
    let mut dp = plane(vec![]);
    dp.sync(&snapshot(&mut state), false).expect("first sync");
    upsert(&mut state, WEB_MOVED);
    let report = dp.sync(&snapshot(&mut state), false).expect("sync");
    assert!(report.conntrack.filters.is_empty());
    assert!(dp.cleaner().calls.is_empty());
}

/// After a restart (a first sync), flows stuck on an endpoint that went away while
/// svcproxy was down are deleted: the table is compared with the rules just applied
/// (upstream's `CleanStaleEntries`). Flows the rules still serve, TCP, and traffic
/// not to a UDP frontend are left alone.
#[test]
fn the_first_sync_deletes_flows_stuck_on_endpoints_that_went_away_meanwhile() {
    let to_gone = flow("198.19.0.53", 53, "198.18.2.10", 5353, true);
    let ext_to_gone = flow("203.0.113.53", 53, "198.18.2.10", 5353, true);
    let np_to_gone = flow("198.18.0.1", 30053, "198.18.2.10", 5353, true);
    let cached_reject = flow("198.19.0.53", 53, "198.19.0.53", 53, false);
    let to_live = flow("198.19.0.53", 53, "198.18.2.11", 5353, true);
    let np_to_live = flow("198.18.0.1", 30053, "198.18.2.11", 5353, true);
    let mut tcp_to_gone = flow("198.19.0.53", 53, "198.18.2.10", 5353, true);
    tcp_to_gone.protocol = 6;
    let other_service = flow("198.19.0.99", 53, "198.18.2.10", 5353, true);
    let direct = flow("198.18.2.10", 5353, "198.18.2.10", 5353, false);
    let undnat_node_port = flow("198.18.0.1", 30053, "198.18.0.1", 30053, false);
    let mut state = cluster(&[DNS, &dns_slice(&["198.18.2.11"])]);
    let mut dp = plane(vec![
        to_gone.clone(),
        ext_to_gone.clone(),
        np_to_gone.clone(),
        cached_reject.clone(),
        to_live.clone(),
        np_to_live.clone(),
        tcp_to_gone.clone(),
        other_service.clone(),
        direct.clone(),
        undnat_node_port.clone(),
    ]);
    let first = dp.sync(&snapshot(&mut state), false).expect("first sync");
    assert_eq!(first.conntrack.error, None);
    assert_eq!(first.conntrack.deleted, 4, "{:?}", first.conntrack);
    assert_eq!(
        dp.cleaner().deleted,
        [to_gone, ext_to_gone, np_to_gone, cached_reject]
    );
    assert_eq!(
        dp.cleaner().entries,
        [
            to_live,
            np_to_live,
            tcp_to_gone,
            other_service,
            direct,
            undnat_node_port
        ]
    );
    // Later syncs compare snapshots again: no second reconciliation.
    dp.sync(&snapshot(&mut state), false).expect("sync");
    assert_eq!(dp.cleaner().reconciliations, 1);
}

/// With no endpoints at all, every flow to the service IP goes, as kube-proxy 1.38
/// (k/k#139629): a DNATed one (its endpoint is gone) and an un-NATed one (a flow
/// another proxy made, or a miss from before the rules: the service rejects now).
/// A flow to an address the snapshot does not serve stays.
#[test]
fn a_first_sync_without_endpoints_deletes_every_flow_to_the_service_ip() {
    let to_gone = flow("198.19.0.53", 53, "198.18.2.10", 5353, true);
    let not_nated = flow("198.19.0.53", 53, "198.19.0.53", 53, false);
    let elsewhere = flow("198.19.9.9", 53, "198.19.9.9", 53, false);
    let mut state = cluster(&[DNS, &dns_slice(&[])]);
    let mut dp = plane(vec![to_gone.clone(), not_nated.clone(), elsewhere.clone()]);
    dp.sync(&snapshot(&mut state), false).expect("first sync");
    assert_eq!(dp.cleaner().deleted, [to_gone, not_nated]);
    assert_eq!(dp.cleaner().entries, [elsewhere]);
}
