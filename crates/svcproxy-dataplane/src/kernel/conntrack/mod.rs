//! Conntrack entries deleted, and the kernel's conntrack settings written.
//!
//! Which entries a sync leaves stale is decided above this crate, by the sync's
//! orchestration, as [`ConntrackFilter`]s (or, at the first sync, as
//! [`StaleUdpFlows`]: every UDP frontend with the endpoints it may reach); a
//! [`ConntrackCleaner`] deletes the entries they match. [`NetlinkConntrack`]
//! ([`ctnetlink`]) talks to the kernel; [`RecordingCleaner`] is a fake table for
//! tests; [`NoConntrackCleanup`] does nothing. [`sysctl`] writes the table's size
//! and timeouts.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use svcproxy_core::model::{IpFamily, Protocol};

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

/// Where a UDP frontend's flows may go: the endpoints its rules reach (none: its
/// traffic is rejected or dropped, not DNATed).
type FrontendFlows = BTreeSet<(IpAddr, u16)>;

/// The first sync's conntrack reconciliation, as upstream's `CleanStaleEntries`: after
/// a restart there is no previous snapshot, so instead of comparing snapshots the
/// kernel's UDP entries are compared with the rules just applied. An entry is stale
/// when it was DNATed, through one of this snapshot's UDP frontends (a service IP and
/// port, or a NodePort), to an endpoint that frontend no longer reaches (it vanished,
/// or stopped being selected, while svcproxy was down, or the frontend has none); or
/// when it was not DNATed, to a service IP and port (a miss cached before the rules
/// were in, a flow another proxy made: with endpoints it should reach one, without
/// it should be rejected; kube-proxy 1.38 deletes both). Entries to addresses this
/// snapshot does not serve are never touched.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StaleUdpFlows {
    /// (family, service IP, port) → where its flows may go.
    by_ip: BTreeMap<(IpFamily, IpAddr, u16), FrontendFlows>,
    /// (family, NodePort) → likewise.
    by_node_port: BTreeMap<(IpFamily, u16), FrontendFlows>,
}

impl StaleUdpFlows {
    /// Adds a UDP frontend: a service IP and port (`ip` given), or a NodePort on
    /// any address (`None`), whose flows may go to `endpoints` (none: it has no
    /// usable endpoint).
    pub fn add_frontend(
        &mut self,
        family: IpFamily,
        ip: Option<IpAddr>,
        port: u16,
        endpoints: BTreeSet<(IpAddr, u16)>,
    ) {
        match ip {
            Some(ip) => self.by_ip.insert((family, ip, port), endpoints),
            None => self.by_node_port.insert((family, port), endpoints),
        };
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
            return !dnat || reply.is_none_or(|r| !f.contains(&r));
        }
        // A NodePort answers on node addresses svcproxy does not list here: only its
        // DNATed flows are recognisable as the service's.
        match self.by_node_port.get(&(entry.family, dport)) {
            Some(f) if dnat => reply.is_none_or(|r| !f.contains(&r)),
            _ => false,
        }
    }
}

/// The UDP flows a sync left stale, as the driver found them: the filters of
/// the intent's change since the last successful apply, or, at the first sync,
/// every UDP frontend with the endpoints it may reach. The same decision serves
/// conntrack's entries and a data plane's own flows
/// ([`DataPlane::close_stale_udp`](crate::DataPlane::close_stale_udp)), each
/// shown as the conntrack entry it would be.
#[derive(Clone, Copy, Debug)]
pub enum StaleUdp<'a> {
    Changed(&'a [ConntrackFilter]),
    Reconcile(&'a StaleUdpFlows),
}

impl StaleUdp<'_> {
    /// Whether `entry` is one of the stale flows.
    pub fn is_stale(&self, entry: &ConntrackEntry) -> bool {
        match self {
            StaleUdp::Changed(filters) => filters.iter().any(|f| f.matches(entry)),
            StaleUdp::Reconcile(flows) => flows.is_stale(entry),
        }
    }

    /// [`is_stale`](Self::is_stale) for a flow its application holds (a
    /// translated socket, as the conntrack entry it would be): a NodePort's flows
    /// (any destination address, with the NodePort's port) are only those to one
    /// of the node's addresses (`node_address`), not another service's whose port
    /// happens to be the same. Deleting a conntrack entry of a flow still good
    /// goes unseen; destroying a socket does not.
    pub fn is_stale_held(
        &self,
        entry: &ConntrackEntry,
        node_address: &dyn Fn(IpAddr) -> bool,
    ) -> bool {
        match self {
            StaleUdp::Changed(filters) => filters.iter().any(|f| {
                f.matches(entry) && (f.orig_dst.is_some() || node_address(entry.orig_dst))
            }),
            StaleUdp::Reconcile(flows) => {
                let known = entry
                    .orig_dport
                    .is_some_and(|p| flows.by_ip.contains_key(&(entry.family, entry.orig_dst, p)));
                (known || node_address(entry.orig_dst)) && flows.is_stale(entry)
            }
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

/// What conntrack cleanup did after one sync (part of the sync's report, `svcproxy_sync::SyncReport`).
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
    /// Flows the data plane held itself and closed for the same filters
    /// ([`DataPlane::close_stale_udp`](crate::DataPlane::close_stale_udp)).
    pub closed: usize,
    /// Computing the filters and deleting.
    pub duration: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const DNS_VIP: &str = "198.19.0.10";
    const EXT: &str = "203.0.113.10";
    const EP_A: &str = "198.18.1.10";
    const EP_B: &str = "198.18.2.10";

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
