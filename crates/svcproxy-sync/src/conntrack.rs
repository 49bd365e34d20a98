//! Which UDP conntrack entries a sync leaves stale, from the intent's change.
//!
//! UDP has no teardown, so a conntrack entry keeps sending a flow's packets where
//! its first packet went: to an endpoint that is gone (the classic DNS black
//! hole), or into a REJECT cached from when the service had no endpoints. After
//! each successful apply the [`Driver`](crate::Driver) deletes the entries the
//! change made stale, as upstream's `deleteStaleServiceConntrackEntries` and
//! `deleteStaleEndpointConntrackEntries`:
//!
//! - [`UdpChanges`] gathers the UDP service ports the intent changed since the
//!   last apply that succeeded (each one's intent then and now), across failed
//!   syncs, and [`UdpChanges::take_filters`] turns them into precise
//!   [`ConntrackFilter`]s ([`filters_of_change`], pure): the frontends the intent
//!   programmed, not every address a Service lists.
//! - The first sync has nothing to compare with: [`stale_udp_flows`] lists every
//!   UDP frontend of the intent with the endpoints it may reach, and the kernel's
//!   entries are compared with that instead.
//!
//! The kernel side (dumping, matching, deleting) is the data plane crate's
//! ([`svcproxy_dataplane::ConntrackCleaner`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use svcproxy_core::model::{IpFamily, Protocol, ServicePortName};
use svcproxy_dataplane::{ConntrackFilter, StaleUdpFlows};
use svcproxy_plan::intent::{FrontendKey, ServiceIntent};
use svcproxy_plan::{Intent, IntentDelta};

/// The UDP service ports changed since the last successful apply: for each, its
/// intent then (`None`: it did not exist) and now.
#[derive(Clone, Debug, Default)]
pub struct UdpChanges {
    pending: BTreeMap<(IpFamily, ServicePortName), Change>,
}

#[derive(Clone, Debug)]
struct Change {
    before: Option<Arc<ServiceIntent>>,
    after: Option<Arc<ServiceIntent>>,
}

impl UdpChanges {
    /// Adds what `delta` changed (whether or not its apply succeeds): a port seen
    /// before keeps the intent it had at the last successful apply.
    pub fn record(&mut self, delta: &IntentDelta) {
        for family in delta.families() {
            for c in &family.services {
                if c.name.protocol != Protocol::Udp {
                    continue;
                }
                self.pending
                    .entry((family.family, c.name.clone()))
                    .or_insert_with(|| Change {
                        before: c.before.clone(),
                        after: None,
                    })
                    .after = c.after.clone();
            }
        }
    }

    /// Forgets every change (the first sync compares with the kernel instead).
    pub fn clear(&mut self) {
        self.pending.clear();
    }

    /// The filters of every change since the last successful apply, sorted and
    /// without duplicates; the changes are forgotten. `applied` is the intent that
    /// apply put in: a frontend another service port holds there (two ports
    /// claiming one address and port: the conflict's winner) is that port's, and no
    /// change of the other touches its flows.
    pub fn take_filters(&mut self, applied: &Intent) -> Vec<ConntrackFilter> {
        let mut out = BTreeSet::new();
        for ((family, name), c) in std::mem::take(&mut self.pending) {
            let fam = applied.family(family);
            let other_owner = |key: &FrontendKey| {
                fam.owner(key)
                    .filter(|o| o.name != name)
                    .map(|o| o.as_ref())
            };
            filters_of_change(
                family,
                c.before.as_deref(),
                c.after.as_deref(),
                &other_owner,
                &mut out,
            );
        }
        out.into_iter().collect()
    }
}

/// The conntrack entries to delete after a UDP service port went from `before`
/// to `after` (`None`: absent), added to `out`, as kube-proxy 1.38 does:
///
/// * The port deleted (k/k#141371), or left with no usable endpoint
///   (k/k#139629): every entry to each of its service IPs and port, whoever
///   answered and whether or not it was DNATed (a flow another proxy made, a
///   miss cached before the rules were in). Not its NodePort: that matches on the
///   port alone, whatever the address.
/// * An endpoint that some traffic could reach before (the union of the
///   endpoint sets) and cannot now: DNATed entries to its NodePort (any
///   destination address) answered by it, and, unless the whole port's entries go
///   anyway, from each of the port's service IPs to that endpoint's address and
///   port.
/// * A port that had no usable endpoint (or did not exist) and now has some:
///   entries to each of its frontends that were not DNATed — a REJECT (or a miss)
///   cached in conntrack.
///
/// A frontend that `other_owner` says another service port holds now (two ports
/// claiming one address and port) is that port's: none of its flows goes as a
/// whole, and of the entries DNATed to this port's removed endpoints only those to
/// endpoints the owner does not have.
pub fn filters_of_change<'a>(
    family: IpFamily,
    before: Option<&ServiceIntent>,
    after: Option<&ServiceIntent>,
    other_owner: &dyn Fn(&FrontendKey) -> Option<&'a ServiceIntent>,
    out: &mut BTreeSet<ConntrackFilter>,
) {
    if before == after {
        return;
    }
    let udp =
        |orig_dst, orig_dport, reply: Option<std::net::SocketAddr>, dst_nat| ConntrackFilter {
            family,
            protocol: Protocol::Udp,
            orig_dst,
            orig_dport: Some(orig_dport),
            reply_src: reply.map(|r| r.ip()),
            reply_sport: reply.map(|r| r.port()),
            dst_nat,
        };
    let all_gone = after.is_none_or(|a| !a.has_any_endpoints);
    let mine = |svc: &'_ ServiceIntent| {
        svc.frontends
            .iter()
            .filter(|f| other_owner(&f.key).is_none())
            .map(|f| f.key)
            .collect::<Vec<FrontendKey>>()
    };
    if all_gone {
        for svc in [before, after].into_iter().flatten() {
            for key in mine(svc) {
                if let FrontendKey::Vip { ip, port, .. } = key {
                    out.insert(udp(Some(ip), port, None, None));
                }
            }
        }
    }
    if let Some(old) = before {
        let now: BTreeSet<std::net::SocketAddr> = after
            .map(|a| a.endpoints.iter().collect())
            .unwrap_or_default();
        for ep in old.endpoints.iter().filter(|ep| !now.contains(ep)) {
            for f in old.frontends.iter() {
                let owner = other_owner(&f.key);
                if owner.is_some_and(|o| o.endpoints.iter().any(|e| e == ep)) {
                    continue;
                }
                match f.key {
                    FrontendKey::NodePort { port, .. } => {
                        out.insert(udp(None, port, Some(ep), Some(true)));
                    }
                    FrontendKey::Vip { ip, port, .. } if !all_gone || owner.is_some() => {
                        out.insert(udp(Some(ip), port, Some(ep), Some(true)));
                    }
                    FrontendKey::Vip { .. } => {}
                }
            }
        }
    }
    if let Some(new) = after {
        let was_active = before.is_some_and(|b| b.has_any_endpoints);
        if new.has_any_endpoints && !was_active {
            // Each service IP with the service port, and the NodePort on any address.
            for key in mine(new) {
                let (orig_dst, port) = frontend_destination(&key);
                out.insert(udp(orig_dst, port, None, Some(false)));
            }
        }
    }
}

/// A frontend's destination as conntrack's original direction has it: a service
/// IP and port, or a NodePort on any address.
fn frontend_destination(key: &FrontendKey) -> (Option<IpAddr>, u16) {
    match *key {
        FrontendKey::Vip { ip, port, .. } => (Some(ip), port),
        FrontendKey::NodePort { port, .. } => (None, port),
    }
}

/// The first sync's reconciliation, as upstream's `CleanStaleEntries`: every UDP
/// frontend of `intent` with the endpoints its service port may reach, to compare
/// the kernel's entries with (see [`StaleUdpFlows`]).
pub fn stale_udp_flows(intent: &Intent) -> StaleUdpFlows {
    let mut out = StaleUdpFlows::default();
    for fam in intent.families() {
        for svc in fam.services().values() {
            if svc.protocol != Protocol::Udp {
                continue;
            }
            let endpoints: BTreeSet<(IpAddr, u16)> =
                svc.endpoints.iter().map(|e| (e.ip(), e.port())).collect();
            // A frontend another port won is that port's (its own endpoints).
            let owned = svc.frontends.iter().filter(|f| {
                fam.owner(&f.key)
                    .is_none_or(|o| std::sync::Arc::ptr_eq(o, svc) || o.name == svc.name)
            });
            for f in owned {
                let (ip, port) = frontend_destination(&f.key);
                out.add_frontend(fam.family(), ip, port, endpoints.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use svcproxy_core::model::{
        Endpoint, EndpointInfo, IpMode, LoadBalancerIngress, ServiceName, ServicePort, ServiceType,
        TrafficPolicy,
    };
    use svcproxy_core::selection::Selection;
    use svcproxy_core::snapshot::{NodeSnapshot, ServicePortView};
    use svcproxy_core::state::SnapshotUpdate;
    use svcproxy_plan::{IntentBuilder, PlanConfig};

    /// The filters of the intent's change from `previous` to `next`, as the
    /// driver computes them between two successful syncs.
    fn cleanup_filters(previous: &SnapshotUpdate, next: &SnapshotUpdate) -> Vec<ConntrackFilter> {
        let cfg = PlanConfig::default();
        let mut intents = IntentBuilder::new();
        intents.update(&previous.v4, &previous.v6, &cfg, &BTreeSet::new());
        let mut changes = UdpChanges::default();
        changes.record(&intents.update(&next.v4, &next.v6, &cfg, &BTreeSet::new()));
        changes.take_filters(intents.intent())
    }

    // Address plan: node-a; service VIPs 198.19.0.x, external 203.0.113.x, endpoints
    // 198.18.<node>.<n>, v6 2001:db8::/32.
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const DNS_VIP: &str = "198.19.0.10";
    const EXT: &str = "203.0.113.10";
    const LB: &str = "203.0.113.11";
    const LB_PROXY: &str = "203.0.113.12";
    const EP_A: &str = "198.18.1.10";
    const EP_B: &str = "198.18.2.10";

    fn port(name: &str, protocol: Protocol) -> ServicePort {
        ServicePort {
            name: ServicePortName::new(ServiceName::new("kube-system", name), "dns", protocol),
            service_type: ServiceType::LoadBalancer,
            cluster_ips: vec![ip(DNS_VIP)].into(),
            port: 53,
            node_port: Some(30053),
            external_ips: vec![ip(EXT)].into(),
            load_balancer_ingress: vec![
                LoadBalancerIngress {
                    ip: ip(LB),
                    ip_mode: IpMode::Vip,
                },
                LoadBalancerIngress {
                    ip: ip(LB_PROXY),
                    ip_mode: IpMode::Proxy,
                },
            ]
            .into(),
            load_balancer_source_ranges: None,
            external_traffic_policy: TrafficPolicy::Cluster,
            internal_traffic_policy: TrafficPolicy::Cluster,
            session_affinity_timeout: None,
            health_check_node_port: None,
            traffic_distribution: None,
            topology_mode: None,
            topology_keys: None,
            scheduler: None,
            endpoint_weights: None,
            maglev_table_size: None,
        }
    }

    fn ep(addr: &str, port: u16) -> Endpoint {
        Endpoint {
            ip: ip(addr),
            port,
            info: Arc::new(EndpointInfo {
                node_name: Some("node-b".into()),
                ready: true,
                serving: true,
                ..EndpointInfo::default()
            }),
        }
    }

    fn view(port: &ServicePort, eps: &[Endpoint], usable: bool) -> Arc<ServicePortView> {
        Arc::new(ServicePortView {
            port: Arc::new(port.clone()),
            endpoints: eps.into(),
            selection: Selection {
                cluster_endpoints: Some(eps.into()),
                local_endpoints: None,
                has_any_endpoints: usable,
                reason: "".into(),
            },
        })
    }

    fn update(views: &[Arc<ServicePortView>]) -> SnapshotUpdate {
        let mut v4 = NodeSnapshot::empty("node-a", IpFamily::V4);
        let mut v6 = NodeSnapshot::empty("node-a", IpFamily::V6);
        for v in views {
            let snap = match IpFamily::of(&v.port.cluster_ips[0]) {
                IpFamily::V4 => &mut v4,
                IpFamily::V6 => &mut v6,
            };
            snap.service_ports.insert(v.port.name.clone(), v.clone());
        }
        SnapshotUpdate {
            v4: Arc::new(v4),
            v6: Arc::new(v6),
            changed: BTreeSet::new(),
            service_changes: 0,
            endpoint_changes: 0,
            trigger_times: vec![],
        }
    }

    fn removed(dst: Option<&str>, dport: u16, ep: &str, eport: u16) -> ConntrackFilter {
        ConntrackFilter {
            family: IpFamily::V4,
            protocol: Protocol::Udp,
            orig_dst: dst.map(ip),
            orig_dport: Some(dport),
            reply_src: Some(ip(ep)),
            reply_sport: Some(eport),
            dst_nat: Some(true),
        }
    }

    fn activated(dst: Option<&str>, dport: u16) -> ConntrackFilter {
        ConntrackFilter {
            family: IpFamily::V4,
            protocol: Protocol::Udp,
            orig_dst: dst.map(ip),
            orig_dport: Some(dport),
            reply_src: None,
            reply_sport: None,
            dst_nat: Some(false),
        }
    }

    fn every_entry(dst: &str, dport: u16) -> ConntrackFilter {
        ConntrackFilter {
            family: IpFamily::V4,
            protocol: Protocol::Udp,
            orig_dst: Some(ip(dst)),
            orig_dport: Some(dport),
            reply_src: None,
            reply_sport: None,
            dst_nat: None,
        }
    }

    #[test]
    fn a_removed_udp_endpoint_is_cleaned_on_every_vip_and_the_node_port() {
        let p = port("dns", Protocol::Udp);
        let before = update(&[view(&p, &[ep(EP_A, 8080), ep(EP_B, 8080)], true)]);
        let after = update(&[view(&p, &[ep(EP_B, 8080)], true)]);
        let got = cleanup_filters(&before, &after);
        let mut want = vec![
            removed(Some(DNS_VIP), 53, EP_A, 8080),
            removed(Some(EXT), 53, EP_A, 8080),
            removed(Some(LB), 53, EP_A, 8080),
            removed(None, 30053, EP_A, 8080),
        ];
        want.sort();
        assert_eq!(got, want);
        // ipMode Proxy IPs are not the proxy's: never cleaned.
        assert!(got.iter().all(|f| f.orig_dst != Some(ip(LB_PROXY))));
    }

    #[test]
    fn an_endpoint_that_changed_port_is_removed_at_its_old_port() {
        let p = port("dns", Protocol::Udp);
        let before = update(&[view(&p, &[ep(EP_A, 8080)], true)]);
        let after = update(&[view(&p, &[ep(EP_A, 9090)], true)]);
        let got = cleanup_filters(&before, &after);
        assert!(
            got.contains(&removed(Some(DNS_VIP), 53, EP_A, 8080)),
            "{got:?}"
        );
        assert!(got.iter().all(|f| f.reply_sport != Some(9090)), "{got:?}");
    }

    #[test]
    fn a_deleted_udp_service_cleans_all_its_endpoints() {
        let p = port("dns", Protocol::Udp);
        let before = update(&[view(&p, &[ep(EP_A, 8080), ep(EP_B, 8080)], true)]);
        let got = cleanup_filters(&before, &update(&[]));
        // Every entry to each service IP (k/k#141371), whoever answered; on the
        // NodePort, which matches any address, only those DNATed to an endpoint.
        let mut want = vec![
            every_entry(DNS_VIP, 53),
            every_entry(EXT, 53),
            every_entry(LB, 53),
            removed(None, 30053, EP_A, 8080),
            removed(None, 30053, EP_B, 8080),
        ];
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn a_udp_service_left_without_endpoints_cleans_every_entry_to_its_ips() {
        let p = port("dns", Protocol::Udp);
        let before = update(&[view(&p, &[ep(EP_A, 8080)], true)]);
        let after = update(&[view(&p, &[], false)]);
        let mut want = vec![
            every_entry(DNS_VIP, 53),
            every_entry(EXT, 53),
            every_entry(LB, 53),
            removed(None, 30053, EP_A, 8080),
        ];
        want.sort();
        assert_eq!(cleanup_filters(&before, &after), want);
        // Endpoints listed but none usable here counts the same (k/k#139629).
        let unusable = update(&[view(&p, &[ep(EP_A, 8080)], false)]);
        let got = cleanup_filters(&before, &unusable);
        assert!(got.contains(&every_entry(DNS_VIP, 53)), "{got:?}");
    }

    /// Two UDP ports claiming the same addresses, ports and NodePort (a conflict the
    /// intent resolves for one of them): the name of the port holding the cluster
    /// IP in `update`.
    fn holder(update: &SnapshotUpdate) -> String {
        let mut intents = IntentBuilder::new();
        intents.update(
            &update.v4,
            &update.v6,
            &PlanConfig::default(),
            &BTreeSet::new(),
        );
        let key = FrontendKey::Vip {
            ip: ip(DNS_VIP),
            protocol: Protocol::Udp,
            port: 53,
        };
        let owner = intents.intent().family(IpFamily::V4).owner(&key).cloned();
        owner.expect("an owner").name.service.name.to_string()
    }

    #[test]
    fn a_port_that_lost_its_claims_never_cleans_the_holder_s_flows() {
        let a = port("dns", Protocol::Udp);
        let b = port("dns-copy", Protocol::Udp);
        let both = update(&[
            view(&a, &[ep(EP_A, 8080)], true),
            view(&b, &[ep(EP_B, 8080)], true),
        ]);
        let (winner, loser) = if holder(&both) == "dns" {
            ((&a, EP_A), (&b, EP_B))
        } else {
            ((&b, EP_B), (&a, EP_A))
        };
        // The loser deleted, or left without endpoints: the holder keeps every flow
        // (only the loser's own endpoint's DNATed entries could go, and it has none
        // on these addresses).
        let winner_only = update(&[view(winner.0, &[ep(winner.1, 8080)], true)]);
        let loser_empty = update(&[
            view(winner.0, &[ep(winner.1, 8080)], true),
            view(loser.0, &[], false),
        ]);
        for after in [&winner_only, &loser_empty] {
            let got = cleanup_filters(&both, after);
            assert!(
                got.iter()
                    .all(|f| f.reply_src == Some(ip(loser.1)) && f.dst_nat == Some(true)),
                "{got:?}"
            );
        }
        // The holder deleted: the other port holds the addresses now; the entries
        // DNATed to the old holder's endpoint go, nothing as a whole.
        let loser_only = update(&[view(loser.0, &[ep(loser.1, 8080)], true)]);
        let got = cleanup_filters(&both, &loser_only);
        assert!(
            got.contains(&removed(Some(DNS_VIP), 53, winner.1, 8080)),
            "{got:?}"
        );
        assert!(
            got.iter().all(|f| f.reply_src == Some(ip(winner.1))),
            "{got:?}"
        );
        // Both with the same endpoint: the new holder's flows to it stay.
        let same = update(&[
            view(winner.0, &[ep(EP_A, 8080)], true),
            view(loser.0, &[ep(EP_A, 8080)], true),
        ]);
        let loser_same = update(&[view(loser.0, &[ep(EP_A, 8080)], true)]);
        assert_eq!(cleanup_filters(&same, &loser_same), vec![]);
    }

    #[test]
    fn the_first_sync_compares_a_contested_address_with_its_holder_s_endpoints() {
        let a = port("dns", Protocol::Udp);
        let b = port("dns-copy", Protocol::Udp);
        let both = update(&[
            view(&a, &[ep(EP_A, 8080)], true),
            view(&b, &[ep(EP_B, 8080)], true),
        ]);
        let (winner, loser) = if holder(&both) == "dns" {
            (EP_A, EP_B)
        } else {
            (EP_B, EP_A)
        };
        let mut intents = IntentBuilder::new();
        intents.update(&both.v4, &both.v6, &PlanConfig::default(), &BTreeSet::new());
        let stale = stale_udp_flows(intents.intent());
        let flow = |to: &str| svcproxy_dataplane::ConntrackEntry {
            family: IpFamily::V4,
            protocol: 17,
            orig_src: ip("198.18.1.99"),
            orig_dst: ip(DNS_VIP),
            orig_sport: Some(40000),
            orig_dport: Some(53),
            reply_src: ip(to),
            reply_dst: ip("198.18.1.99"),
            reply_sport: Some(8080),
            reply_dport: Some(40000),
            status: svcproxy_dataplane::IPS_DST_NAT,
            zone: 0,
            id: None,
        };
        // The holder's flow is live whichever port was listed last.
        assert!(!stale.is_stale(&flow(winner)));
        assert!(stale.is_stale(&flow(loser)));
    }

    #[test]
    fn tcp_and_sctp_are_never_cleaned() {
        for proto in [Protocol::Tcp, Protocol::Sctp] {
            let p = port("web", proto);
            let before = update(&[view(&p, &[ep(EP_A, 8080)], true)]);
            let after = update(&[view(&p, &[], false)]);
            assert!(cleanup_filters(&before, &after).is_empty());
            assert!(cleanup_filters(&after, &before).is_empty());
        }
    }

    #[test]
    fn an_unchanged_view_costs_nothing() {
        let v = view(&port("dns", Protocol::Udp), &[ep(EP_A, 8080)], true);
        assert!(cleanup_filters(&update(std::slice::from_ref(&v)), &update(&[v])).is_empty());
        // Equal but not the same Arc: compared, and still nothing.
        let p = port("dns", Protocol::Udp);
        let a = update(&[view(&p, &[ep(EP_A, 8080)], true)]);
        let b = update(&[view(&p, &[ep(EP_A, 8080)], true)]);
        assert!(cleanup_filters(&a, &b).is_empty());
    }

    #[test]
    fn a_service_going_from_no_endpoints_to_some_cleans_cached_rejects() {
        let p = port("dns", Protocol::Udp);
        let before = update(&[view(&p, &[], false)]);
        let after = update(&[view(&p, &[ep(EP_A, 8080)], true)]);
        let mut want = vec![
            activated(Some(DNS_VIP), 53),
            activated(Some(EXT), 53),
            activated(Some(LB), 53),
            activated(None, 30053),
        ];
        want.sort();
        assert_eq!(cleanup_filters(&before, &after), want);
        // A new service that comes with endpoints counts as newly active too.
        assert_eq!(cleanup_filters(&update(&[]), &after), want);
        // Some endpoints to other endpoints: not newly active.
        let other = update(&[view(&p, &[ep(EP_B, 8080)], true)]);
        assert!(cleanup_filters(&other, &after)
            .iter()
            .all(|f| f.dst_nat == Some(true)));
    }

    #[test]
    fn endpoints_no_longer_selected_by_topology_count_as_removed() {
        let p = port("dns", Protocol::Udp);
        let before = view(&p, &[ep(EP_A, 8080), ep(EP_B, 8080)], true);
        // Same endpoints listed, but selection now keeps only EP_B for this node.
        let mut narrowed = (*before).clone();
        narrowed.selection.cluster_endpoints = Some(Arc::from([ep(EP_B, 8080)]));
        let got = cleanup_filters(&update(&[before]), &update(&[Arc::new(narrowed)]));
        assert_eq!(got.len(), 4);
        assert!(got.iter().all(|f| f.reply_src == Some(ip(EP_A))));
    }

    #[test]
    fn families_are_cleaned_on_their_own() {
        let mut p6 = port("dns", Protocol::Udp);
        p6.cluster_ips = vec![ip("2001:db8:ffff::10")].into();
        p6.external_ips = vec![].into();
        p6.load_balancer_ingress = vec![].into();
        let e6 = ep("2001:db8:2::10", 8080);
        let before = update(&[view(&p6, std::slice::from_ref(&e6), true)]);
        let after = update(&[view(&p6, &[], false)]);
        let got = cleanup_filters(&before, &after);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got.iter().all(|f| f.family == IpFamily::V6));
        assert!(got
            .iter()
            .any(|f| f.orig_dst == Some(ip("2001:db8:ffff::10"))));
    }
}
