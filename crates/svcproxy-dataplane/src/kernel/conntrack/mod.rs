//! UDP conntrack cleanup: which entries to delete after a sync, and who deletes them.
//!
//! UDP has no teardown, so a conntrack entry keeps sending a flow's packets where its
//! first packet went: to an endpoint that is gone (the classic DNS black hole), or
//! into a REJECT cached from when the service had no endpoints. After each successful
//! apply, [`cleanup_filters`] compares the previously applied snapshot with the new
//! one (a pure function, as upstream's `deleteStaleServiceConntrackEntries` /
//! `deleteStaleEndpointConntrackEntries`) and yields precise [`ConntrackFilter`]s; a
//! [`ConntrackCleaner`] deletes the entries they match. [`NetlinkConntrack`]
//! (`crate::ctnetlink`) talks to the kernel; [`RecordingCleaner`] is a fake table for
//! tests; [`NoConntrackCleanup`] does nothing.
//!
//! [`NetlinkConntrack`]: crate::NetlinkConntrack

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use svcproxy_core::model::{IpFamily, Protocol, ServicePort};
use svcproxy_core::snapshot::NodeSnapshot;
use svcproxy_core::state::SnapshotUpdate;

pub use crate::kernel::netfilter::{ip_protocol, NetlinkError};

pub mod ctnetlink;
pub mod sysctl;

pub use ctnetlink::{NetlinkConntrack, DEFAULT_CONNTRACK_TIMEOUT};
pub use sysctl::{
    apply_conntrack_sysctls, apply_conntrack_sysctls_at, online_cpus, ConntrackSettings,
};

/// `IPS_DST_NAT` in a conntrack entry's status: the flow's destination was NATed.
pub const IPS_DST_NAT: u32 = 1 << 5;

/// Which conntrack entries to delete: every field that is set must match. Ports
/// and addresses are those of the original direction's destination (what the
/// client sent to) and of the reply direction's source (who answers: after DNAT,
/// the endpoint).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConntrackFilter {
    pub family: IpFamily,
    pub protocol: Protocol,
    pub orig_dst: Option<IpAddr>,
    pub orig_dport: Option<u16>,
    pub reply_src: Option<IpAddr>,
    pub reply_sport: Option<u16>,
    /// `Some(true)`: only entries whose destination was NATed (`IPS_DST_NAT`);
    /// `Some(false)`: only entries whose destination was not; `None`: either.
    pub dst_nat: Option<bool>,
}

impl ConntrackFilter {
    /// Whether `entry` is one this filter deletes.
    pub fn matches(&self, entry: &ConntrackEntry) -> bool {
        entry.family == self.family
            && entry.protocol == ip_protocol(self.protocol)
            && self.orig_dst.is_none_or(|ip| entry.orig_dst == ip)
            && self.orig_dport.is_none_or(|p| entry.orig_dport == Some(p))
            && self.reply_src.is_none_or(|ip| entry.reply_src == ip)
            && self
                .reply_sport
                .is_none_or(|p| entry.reply_sport == Some(p))
            && self
                .dst_nat
                .is_none_or(|nat| (entry.status & IPS_DST_NAT != 0) == nat)
    }
}

impl fmt::Display for ConntrackFilter {
    /// `conntrack`-like: `IPv4 udp orig-dst 198.19.0.10 orig-dport 53 reply-src
    /// 198.18.1.10 reply-sport 8080 dnat`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}",
            self.family,
            self.protocol.as_str().to_ascii_lowercase()
        )?;
        if let Some(ip) = self.orig_dst {
            write!(f, " orig-dst {ip}")?;
        }
        if let Some(p) = self.orig_dport {
            write!(f, " orig-dport {p}")?;
        }
        if let Some(ip) = self.reply_src {
            write!(f, " reply-src {ip}")?;
        }
        if let Some(p) = self.reply_sport {
            write!(f, " reply-sport {p}")?;
        }
        match self.dst_nat {
            Some(true) => f.write_str(" dnat"),
            Some(false) => f.write_str(" not-dnat"),
            None => Ok(()),
        }
    }
}

/// One conntrack entry, as much of it as cleanup looks at.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConntrackEntry {
    pub family: IpFamily,
    /// IP protocol number (17 for UDP).
    pub protocol: u8,
    pub orig_src: IpAddr,
    pub orig_dst: IpAddr,
    /// Ports, for protocols that have them.
    pub orig_sport: Option<u16>,
    pub orig_dport: Option<u16>,
    pub reply_src: IpAddr,
    pub reply_dst: IpAddr,
    pub reply_sport: Option<u16>,
    pub reply_dport: Option<u16>,
    /// `IPS_*` status bits.
    pub status: u32,
    /// Conntrack zone (0 when none).
    pub zone: u16,
    /// The kernel's id of the entry, when it said: a delete by id cannot remove a
    /// newer entry that reused the tuple.
    pub id: Option<u32>,
}

/// What a cleaner did with one batch of filters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanupStats {
    /// Entries looked at (the dumps' sizes).
    pub scanned: usize,
    /// Entries deleted.
    pub deleted: usize,
    /// Entries that matched but were gone by the time of the delete.
    pub vanished: usize,
    /// Dump messages that could not be parsed (skipped, never deleted).
    pub unparsed: usize,
    /// Per family looked at: entries deleted and the time spent (dump and deletes),
    /// for upstream's per-family conntrack reconciler metrics.
    pub families: BTreeMap<IpFamily, FamilyCleanup>,
}

/// What one family's cleanup did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FamilyCleanup {
    pub deleted: usize,
    pub duration: Duration,
}

/// Deletes the conntrack entries some filters match.
pub trait ConntrackCleaner {
    /// Deletes every entry matching at least one of `filters` (which may be empty:
    /// then nothing is looked at). Entries no filter matches are never touched.
    fn delete(&mut self, filters: &[ConntrackFilter]) -> Result<CleanupStats, NetlinkError>;

    /// Deletes every entry `stale` calls stale (the first sync's reconciliation of the
    /// whole table with the rules just applied).
    fn delete_stale(&mut self, stale: &StaleUdpFlows) -> Result<CleanupStats, NetlinkError>;
}

impl<C: ConntrackCleaner + ?Sized> ConntrackCleaner for &mut C {
    fn delete(&mut self, filters: &[ConntrackFilter]) -> Result<CleanupStats, NetlinkError> {
        (**self).delete(filters)
    }
    fn delete_stale(&mut self, stale: &StaleUdpFlows) -> Result<CleanupStats, NetlinkError> {
        (**self).delete_stale(stale)
    }
}

impl<C: ConntrackCleaner + ?Sized> ConntrackCleaner for Box<C> {
    fn delete(&mut self, filters: &[ConntrackFilter]) -> Result<CleanupStats, NetlinkError> {
        (**self).delete(filters)
    }
    fn delete_stale(&mut self, stale: &StaleUdpFlows) -> Result<CleanupStats, NetlinkError> {
        (**self).delete_stale(stale)
    }
}

/// Where a UDP frontend's flows may go: the endpoints its rules reach, and whether it
/// has any (with none, its traffic is rejected or dropped, not DNATed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct FrontendFlows {
    endpoints: BTreeSet<(IpAddr, u16)>,
    active: bool,
}

/// The first sync's conntrack reconciliation, as upstream's `CleanStaleEntries`: after
/// a restart there is no previous snapshot, so instead of comparing snapshots the
/// kernel's UDP entries are compared with the rules just applied. An entry is stale
/// when it was DNATed, through one of this snapshot's UDP frontends (a service IP and
/// port, or a NodePort), to an endpoint that frontend no longer reaches (it vanished,
/// or stopped being selected, while svcproxy was down); or when it was not DNATed, to
/// a service IP and port that now has endpoints (a REJECT cached from when it had
/// none). Entries to addresses this snapshot does not serve are never touched.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StaleUdpFlows {
    /// (family, service IP, port) → where its flows may go.
    by_ip: BTreeMap<(IpFamily, IpAddr, u16), FrontendFlows>,
    /// (family, NodePort) → likewise.
    by_node_port: BTreeMap<(IpFamily, u16), FrontendFlows>,
}

impl StaleUdpFlows {
    /// The UDP frontends of `update` and their endpoints.
    pub fn from_snapshot(update: &SnapshotUpdate) -> Self {
        let mut out = StaleUdpFlows::default();
        for family in IpFamily::BOTH {
            for (name, view) in &update.family(family).service_ports {
                if name.protocol != Protocol::Udp {
                    continue;
                }
                let flows = FrontendFlows {
                    endpoints: view
                        .selection
                        .all_reachable()
                        .iter()
                        .map(|e| (e.ip, e.port))
                        .collect(),
                    active: view.selection.has_any_endpoints,
                };
                let port = &view.port;
                for ip in service_ips(port, family) {
                    out.by_ip.insert((family, ip, port.port), flows.clone());
                }
                if let Some(np) = port.node_port {
                    out.by_node_port.insert((family, np), flows);
                }
            }
        }
        out
    }

    /// Whether there is any UDP frontend (else the table need not be read).
    pub fn is_empty(&self) -> bool {
        self.by_ip.is_empty() && self.by_node_port.is_empty()
    }

    /// The families with UDP frontends.
    pub fn families(&self) -> Vec<IpFamily> {
        IpFamily::BOTH
            .into_iter()
            .filter(|f| {
                self.by_ip.keys().any(|k| k.0 == *f) || self.by_node_port.keys().any(|k| k.0 == *f)
            })
            .collect()
    }

    /// Whether `entry` is a stale flow of one of the frontends.
    pub fn is_stale(&self, entry: &ConntrackEntry) -> bool {
        if entry.protocol != ip_protocol(Protocol::Udp) {
            return false;
        }
        let Some(dport) = entry.orig_dport else {
            return false;
        };
        let dnat = entry.status & IPS_DST_NAT != 0;
        let reply = entry.reply_sport.map(|p| (entry.reply_src, p));
        if let Some(f) = self.by_ip.get(&(entry.family, entry.orig_dst, dport)) {
            return if dnat {
                reply.is_none_or(|r| !f.endpoints.contains(&r))
            } else {
                f.active
            };
        }
        // A NodePort answers on node addresses svcproxy does not list here: only its
        // DNATed flows are recognisable as the service's.
        match self.by_node_port.get(&(entry.family, dport)) {
            Some(f) if dnat => reply.is_none_or(|r| !f.endpoints.contains(&r)),
            _ => false,
        }
    }
}

/// A cleaner that deletes nothing: for data planes whose rules are applied somewhere
/// other than the caller's network namespace, or nowhere (tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoConntrackCleanup;

impl ConntrackCleaner for NoConntrackCleanup {
    fn delete(&mut self, _filters: &[ConntrackFilter]) -> Result<CleanupStats, NetlinkError> {
        Ok(CleanupStats::default())
    }
    fn delete_stale(&mut self, _stale: &StaleUdpFlows) -> Result<CleanupStats, NetlinkError> {
        Ok(CleanupStats::default())
    }
}

/// A fake conntrack table for tests: records every batch of filters, deletes the
/// matching [`entries`](RecordingCleaner::entries), and fails when told to.
#[derive(Clone, Debug, Default)]
pub struct RecordingCleaner {
    /// Every non-empty batch of filters handed to [`ConntrackCleaner::delete`].
    pub calls: Vec<Vec<ConntrackFilter>>,
    /// The fake table.
    pub entries: Vec<ConntrackEntry>,
    /// The entries deleted so far, in order.
    pub deleted: Vec<ConntrackEntry>,
    /// How many reconciliations ([`ConntrackCleaner::delete_stale`]) were asked for.
    pub reconciliations: usize,
    failures: VecDeque<String>,
}

impl RecordingCleaner {
    pub fn new() -> Self {
        RecordingCleaner::default()
    }

    /// A fake table holding `entries`.
    pub fn with_entries(entries: Vec<ConntrackEntry>) -> Self {
        RecordingCleaner {
            entries,
            ..RecordingCleaner::default()
        }
    }

    /// The next non-empty delete fails with this message (queued).
    pub fn fail_next(&mut self, message: impl Into<String>) {
        self.failures.push_back(message.into());
    }

    /// Every filter handed over so far, in order.
    pub fn all_filters(&self) -> Vec<&ConntrackFilter> {
        self.calls.iter().flatten().collect()
    }
}

impl ConntrackCleaner for RecordingCleaner {
    fn delete(&mut self, filters: &[ConntrackFilter]) -> Result<CleanupStats, NetlinkError> {
        if filters.is_empty() {
            return Ok(CleanupStats::default());
        }
        self.calls.push(filters.to_vec());
        if let Some(message) = self.failures.pop_front() {
            return Err(NetlinkError::Fake(message));
        }
        Ok(self.remove_where(|e| filters.iter().any(|f| f.matches(e))))
    }

    fn delete_stale(&mut self, stale: &StaleUdpFlows) -> Result<CleanupStats, NetlinkError> {
        self.reconciliations += 1;
        if let Some(message) = self.failures.pop_front() {
            return Err(NetlinkError::Fake(message));
        }
        Ok(self.remove_where(|e| stale.is_stale(e)))
    }
}

impl RecordingCleaner {
    fn remove_where(&mut self, doomed: impl Fn(&ConntrackEntry) -> bool) -> CleanupStats {
        let scanned = self.entries.len();
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.entries)
            .into_iter()
            .partition(|e| doomed(e));
        self.entries = kept;
        let deleted = gone.len();
        let mut families: BTreeMap<IpFamily, FamilyCleanup> = BTreeMap::new();
        for e in &gone {
            families.entry(e.family).or_default().deleted += 1;
        }
        self.deleted.extend(gone);
        CleanupStats {
            scanned,
            deleted,
            families,
            ..CleanupStats::default()
        }
    }
}

/// What conntrack cleanup did after one sync (part of [`SyncReport`](crate::SyncReport)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConntrackCleanupReport {
    /// The filters computed for this sync (empty when nothing needed cleaning, and
    /// on the first sync, which has nothing to compare with).
    pub filters: Vec<ConntrackFilter>,
    /// Entries looked at.
    pub scanned: usize,
    /// Entries deleted.
    pub deleted: usize,
    /// Per family cleaned: deleted entries and time spent.
    pub families: BTreeMap<IpFamily, FamilyCleanup>,
    /// Why cleanup failed, if it did (the sync itself still succeeded).
    pub error: Option<String>,
    /// Computing the filters and deleting.
    pub duration: Duration,
}

/// The conntrack entries to delete after the kernel went from `previous` to `next`
/// (both families), sorted and without duplicates. Only UDP service ports count.
///
/// * An endpoint that some traffic could reach before
///   ([`Selection::all_reachable`](svcproxy_core::selection::Selection::all_reachable))
///   and cannot now: DNATed entries from each of the port's cluster, external and
///   load-balancer (VIP mode) IPs and port to that endpoint's address and port, and
///   DNATed entries to the NodePort (any destination address) answered by it.
/// * A port that had no usable endpoint (or did not exist) and now has some: entries
///   to each of its IPs and port, and to its NodePort, that were not DNATed — a
///   REJECT (or a miss) cached in conntrack.
pub fn cleanup_filters(previous: &SnapshotUpdate, next: &SnapshotUpdate) -> Vec<ConntrackFilter> {
    let mut out = BTreeSet::new();
    for family in IpFamily::BOTH {
        family_filters(previous.family(family), next.family(family), &mut out);
    }
    out.into_iter().collect()
}

fn family_filters(prev: &NodeSnapshot, next: &NodeSnapshot, out: &mut BTreeSet<ConntrackFilter>) {
    let family = next.family;
    // What differs between the two maps, skipping the chunks they share: the cost
    // follows the change, not the number of services.
    let pairs = next
        .service_ports
        .diff(&prev.service_ports, |a, b| !Arc::ptr_eq(a, b));
    for (name, old, new) in pairs {
        if name.protocol != Protocol::Udp {
            continue;
        }
        // Removed endpoints: the entries were made through the old port's addresses.
        if let Some(old) = old {
            let now: BTreeSet<(IpAddr, u16)> = new
                .map(|v| {
                    v.selection
                        .all_reachable()
                        .iter()
                        .map(|e| (e.ip, e.port))
                        .collect()
                })
                .unwrap_or_default();
            for ep in old.selection.all_reachable() {
                if now.contains(&(ep.ip, ep.port)) {
                    continue;
                }
                let base = ConntrackFilter {
                    family,
                    protocol: Protocol::Udp,
                    orig_dst: None,
                    orig_dport: None,
                    reply_src: Some(ep.ip),
                    reply_sport: Some(ep.port),
                    dst_nat: Some(true),
                };
                push_port_filters(&old.port, family, &base, out);
            }
        }
        // Newly active: what was rejected before may be cached.
        if let Some(new) = new {
            let was_active = old.is_some_and(|v| v.selection.has_any_endpoints);
            if new.selection.has_any_endpoints && !was_active {
                let base = ConntrackFilter {
                    family,
                    protocol: Protocol::Udp,
                    orig_dst: None,
                    orig_dport: None,
                    reply_src: None,
                    reply_sport: None,
                    dst_nat: Some(false),
                };
                push_port_filters(&new.port, family, &base, out);
            }
        }
    }
}

/// The addresses of `port` in `family` whose flows svcproxy NATs: cluster IPs, external
/// IPs and load-balancer (VIP mode) IPs.
fn service_ips(port: &ServicePort, family: IpFamily) -> impl Iterator<Item = IpAddr> + '_ {
    port.cluster_ips
        .iter()
        .chain(port.external_ips.iter())
        .copied()
        .chain(port.load_balancer_vips())
        .filter(move |ip| IpFamily::of(ip) == family)
}

/// `base` once per destination of `port`: each service IP with the service port, and
/// the NodePort on any address.
fn push_port_filters(
    port: &ServicePort,
    family: IpFamily,
    base: &ConntrackFilter,
    out: &mut BTreeSet<ConntrackFilter>,
) {
    for ip in service_ips(port, family) {
        out.insert(ConntrackFilter {
            orig_dst: Some(ip),
            orig_dport: Some(port.port),
            ..base.clone()
        });
    }
    if let Some(node_port) = port.node_port {
        out.insert(ConntrackFilter {
            orig_dst: None,
            orig_dport: Some(node_port),
            ..base.clone()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use svcproxy_core::model::{
        Endpoint, EndpointInfo, IpMode, LoadBalancerIngress, ServiceName, ServicePortName,
        ServiceType, TrafficPolicy,
    };
    use svcproxy_core::selection::Selection;
    use svcproxy_core::snapshot::ServicePortView;

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
        assert_eq!(got.len(), 8, "{got:?}");
        assert!(got.iter().all(|f| f.dst_nat == Some(true)));
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

    fn entry(dst: &str, dport: u16, reply_src: &str, sport: u16, dnat: bool) -> ConntrackEntry {
        ConntrackEntry {
            family: IpFamily::V4,
            protocol: 17,
            orig_src: ip("198.18.1.20"),
            orig_dst: ip(dst),
            orig_sport: Some(40000),
            orig_dport: Some(dport),
            reply_src: ip(reply_src),
            reply_dst: ip("198.18.1.20"),
            reply_sport: Some(sport),
            reply_dport: Some(40000),
            status: if dnat { IPS_DST_NAT | 0b1110 } else { 0b1000 },
            zone: 0,
            id: Some(7),
        }
    }

    #[test]
    fn filters_match_precisely() {
        let f = removed(Some(DNS_VIP), 53, EP_A, 8080);
        assert!(f.matches(&entry(DNS_VIP, 53, EP_A, 8080, true)));
        // Any other field differing: untouched.
        assert!(!f.matches(&entry(DNS_VIP, 54, EP_A, 8080, true)));
        assert!(!f.matches(&entry(EXT, 53, EP_A, 8080, true)));
        assert!(!f.matches(&entry(DNS_VIP, 53, EP_B, 8080, true)));
        assert!(!f.matches(&entry(DNS_VIP, 53, EP_A, 8081, true)));
        assert!(!f.matches(&entry(DNS_VIP, 53, EP_A, 8080, false)));
        let mut tcp = entry(DNS_VIP, 53, EP_A, 8080, true);
        tcp.protocol = 6;
        assert!(!f.matches(&tcp));
        let mut v6 = entry(DNS_VIP, 53, EP_A, 8080, true);
        v6.family = IpFamily::V6;
        assert!(!f.matches(&v6));

        // A cached reject: to the VIP, answered by the VIP, not NATed.
        let reject = activated(Some(DNS_VIP), 53);
        assert!(reject.matches(&entry(DNS_VIP, 53, DNS_VIP, 53, false)));
        assert!(!reject.matches(&entry(DNS_VIP, 53, EP_A, 8080, true)));
        // NodePort filters match any destination address.
        let np = activated(None, 30053);
        assert!(np.matches(&entry("198.18.0.1", 30053, "198.18.0.1", 30053, false)));
        assert!(!np.matches(&entry("198.18.0.1", 30054, "198.18.0.1", 30054, false)));
    }

    #[test]
    fn filters_print_like_conntrack_arguments() {
        assert_eq!(
            removed(Some(DNS_VIP), 53, EP_A, 8080).to_string(),
            "IPv4 udp orig-dst 198.19.0.10 orig-dport 53 reply-src 198.18.1.10 reply-sport 8080 dnat"
        );
        assert_eq!(
            activated(None, 30053).to_string(),
            "IPv4 udp orig-dport 30053 not-dnat"
        );
    }

    #[test]
    fn the_recorder_deletes_only_matching_entries_and_fails_on_request() {
        let keep = entry(DNS_VIP, 53, EP_B, 8080, true);
        let gone = entry(DNS_VIP, 53, EP_A, 8080, true);
        let mut c = RecordingCleaner::with_entries(vec![keep.clone(), gone.clone()]);
        assert_eq!(c.delete(&[]).unwrap(), CleanupStats::default());
        assert!(c.calls.is_empty());
        c.fail_next("boom");
        let filters = [removed(Some(DNS_VIP), 53, EP_A, 8080)];
        assert!(c.delete(&filters).is_err());
        let stats = c.delete(&filters).unwrap();
        assert_eq!((stats.scanned, stats.deleted), (2, 1));
        assert_eq!(c.entries, [keep]);
        assert_eq!(c.deleted, [gone]);
        assert_eq!(c.calls.len(), 2);
    }
}
