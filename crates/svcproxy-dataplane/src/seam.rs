//! The seam between the sync's orchestration and each data plane: the
//! [`DataPlane`] trait with what a sync reports ([`ApplyReport`], [`SyncKind`],
//! [`RuleCount`], [`Comparison`]) and what a mode declares of itself
//! ([`ModeInfo`]: its names, its defaults where kube-proxy's modes differ, its
//! flag groups, counters and [`ModeSemantics`]).
//!
//! A data plane translates the intent ([`svcproxy_plan::intent`]) into its kernel
//! objects and applies them; it decides nothing about traffic. Every mode's folder
//! imports this module and nothing of another mode; the registry
//! ([`crate::registry`]) is the one module that imports the modes.

use std::time::Duration;

use svcproxy_core::model::IpFamily;

use svcproxy_plan::{Intent, IntentDelta, ModeSemantics, PlanConfig};

use crate::error::DataPlaneError;
use crate::kernel::conntrack::{ConntrackFilter, StaleUdp};
use crate::kernel::sysctl::Sysctl;

/// How a sync was applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncKind {
    /// Everything written from scratch (the backend's objects deleted and
    /// re-created): the first sync, and the first after a failure.
    Recreate,
    /// Everything written again in place, keeping dynamic state (affinity).
    Resync,
    /// Only what changed since the last successful sync.
    Partial,
    /// Nothing written: the kernel's objects, sealed by the predecessor at a
    /// hand-over, are what this sync would have written ([`DataPlane::adopt`]).
    Adopted,
}

impl SyncKind {
    pub fn is_full(self) -> bool {
        matches!(self, SyncKind::Recreate | SyncKind::Resync)
    }
}

/// What a backend reports of a successful sync.
#[derive(Clone, Debug)]
pub struct ApplyReport {
    pub kind: SyncKind,
    /// Time spent in the kernel's tool or API (translation excluded).
    pub apply_duration: Duration,
    /// The same per family, when each family is written apart (its own
    /// transaction or restore); empty when one write held both.
    pub family_apply: Vec<(IpFamily, Duration)>,
    /// Size of what was sent to the kernel; 0 when nothing changed (and nothing
    /// was run).
    pub script_bytes: usize,
    /// Rule counts per family and table, for the modes that count rules (upstream's
    /// iptables `kubeproxy_sync_proxy_rules_iptables_total` and `_last`).
    pub rules: Vec<RuleCount>,
    /// Conntrack entries only the data plane knows to be stale, deleted after the
    /// apply with those the snapshots' difference names: the userspace mode's
    /// flows redirected to a UDP socket it closed.
    pub stale_flows: Vec<ConntrackFilter>,
}

/// The rules svcproxy owns in one table of one family, after a sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleCount {
    pub family: IpFamily,
    pub table: &'static str,
    /// Rules in svcproxy's chains of the table.
    pub total: usize,
    /// Rules the sync wrote (all of them in a full sync; the changed chains' in a
    /// partial one).
    pub written: usize,
}

/// What the node must provide for a backend to work.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeRequirements {
    /// Kernel settings, written at start in the proxy's network namespace.
    pub sysctls: Vec<Sysctl>,
    /// Kernel modules the kernel does not load on demand (checked and logged).
    pub modules: Vec<&'static str>,
}

/// One data plane. Implementations translate and apply; they never look at
/// traffic policies, topology or endpoint conditions.
pub trait DataPlane: Send {
    /// The `--proxy-mode` name, as `/proxyMode` answers it.
    fn mode(&self) -> &'static str;

    /// Brings the kernel to `intent`. `delta` is how `intent` differs from the
    /// intent of the previous call (whether or not that call succeeded); `full`
    /// asks for a full sync. After an error the next call must write everything;
    /// each family's write is atomic, so what stays in force is each family's
    /// previous rules, or its new ones where its write went through before another
    /// family's failed.
    fn sync(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        full: bool,
    ) -> Result<ApplyReport, DataPlaneError>;

    /// What a first sync of `intent` would apply, as the backend's own text
    /// (`svcproxy render`, golden files). Touches neither the kernel nor `self`'s
    /// state.
    fn render(&self, intent: &Intent) -> String;

    /// Removes exactly this backend's kernel objects; succeeds when there are none.
    fn cleanup(&mut self) -> Result<(), DataPlaneError>;

    /// What the node needs for this backend under `cfg`.
    fn node_requirements(&self, cfg: &PlanConfig) -> NodeRequirements;

    /// Checks at start that this node can run the backend at all (kernel
    /// features, file systems), doing what it may to make it so (mounting a
    /// missing bpffs); `Err` names what is missing, and the process refuses to
    /// start rather than retry a sync that cannot succeed.
    fn preflight(&mut self) -> Result<(), DataPlaneError> {
        Ok(())
    }

    /// Checks, cheaply (not rule by rule), that the kernel still holds what the last
    /// successful sync wrote, and says why not: tables deleted, re-created or made
    /// dormant behind svcproxy's back, or the built-in chains flushed. On drift the
    /// next sync rewrites everything. `Ok(None)` before the first sync and after a
    /// failed one (the next sync is full anyway); `Err` when the kernel could not be
    /// asked.
    fn drift(&mut self) -> Result<Option<String>, DataPlaneError>;

    /// Whether [`DataPlane::drift`] watches all it can of what the last full sync
    /// wrote (a table that could not be read after it is not watched). A mode
    /// that skips the periodic full sync in a large cluster does so only while
    /// this holds: that sync is what repairs what the check does not watch.
    fn drift_armed(&self) -> bool {
        true
    }

    /// How the kernel's rules differ from what a full sync of `intent` would write
    /// (`svcproxy explain --live`): chains and sets missing or extra, rules and
    /// elements lacking or added (or, when the plan cannot be listed in the
    /// kernel's form, their counts), and what sees packets before svcproxy's rules.
    /// Reads only.
    fn compare(&mut self, intent: &Intent) -> Result<Comparison, DataPlaneError>;

    /// The mode's own metrics, registered once into the process's registry (read
    /// at each scrape); none by default.
    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        Vec::new()
    }

    /// The process is stopping (SIGTERM): a mode that forwards connections itself
    /// stops accepting and lets open ones finish within its own grace period. The
    /// kernel's modes leave their rules in force and do nothing.
    fn shutdown(&mut self) {}

    /// After a successful apply, the UDP flows it left stale (the decision the
    /// conntrack cleanup acts on, made once above the data planes): a mode that
    /// holds such flows outside conntrack closes them, and says how many it
    /// closed. The eBPF modes destroy the connected UDP sockets they translated
    /// at connect() to an endpoint the flow may no longer reach, so that a
    /// resolver's next call fails and it retries on a fresh socket. None by
    /// default: the kernel's modes' flows are conntrack's.
    fn close_stale_udp(&mut self, stale: &StaleUdp<'_>) -> Result<usize, DataPlaneError> {
        let _ = stale;
        Ok(0)
    }

    /// At a hand-over (the owner stopping, `svcproxy_sync::Driver::seal`): marks the
    /// kernel's objects as holding exactly what the last sync wrote, `seal` naming
    /// that content, so that a successor whose first sync would write the same
    /// takes them as they are ([`DataPlane::adopt`]). Says whether it did; only
    /// after a successful sync, and never by a mode whose rules depend on this
    /// process (the userspace mode's redirects to its own sockets). None by default.
    fn seal(&mut self, seal: &str) -> Result<bool, DataPlaneError> {
        let _ = seal;
        Ok(false)
    }

    /// Whether the kernel holds a predecessor's seal at all (cheap: only then is
    /// the seal of this process's own first sync worth computing).
    fn sealed(&mut self) -> Result<bool, DataPlaneError> {
        Ok(false)
    }

    /// The first sync, when the kernel holds a seal: if it is `seal` (what a first
    /// sync of `intent` would write), takes the kernel's objects as they are
    /// instead of writing them (its state brought to `intent` and `delta`, as a
    /// sync would; the next write rewrites in place, keeping dynamic state) and
    /// removes the seal. `Ok(false)`, with nothing changed, when it is not.
    fn adopt(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        seal: &str,
    ) -> Result<bool, DataPlaneError> {
        let _ = (intent, delta, seal);
        Ok(false)
    }
}

/// What [`DataPlane::compare`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Comparison {
    /// `None` when each rule and element was compared; else why only their
    /// counts were (a rule rewritten in place then goes unseen).
    pub counted_only: Option<String>,
    /// One line per difference.
    pub differences: Vec<String>,
    /// Rules of others that see packets before svcproxy's: other tables' base
    /// chains at the same hooks (nftables), rules in front of svcproxy's jumps in
    /// the built-in chains (iptables).
    pub ahead: Vec<String>,
}

impl<T: DataPlane + ?Sized> DataPlane for Box<T> {
    fn mode(&self) -> &'static str {
        (**self).mode()
    }

    fn sync(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        full: bool,
    ) -> Result<ApplyReport, DataPlaneError> {
        (**self).sync(intent, delta, full)
    }

    fn render(&self, intent: &Intent) -> String {
        (**self).render(intent)
    }

    fn cleanup(&mut self) -> Result<(), DataPlaneError> {
        (**self).cleanup()
    }

    fn node_requirements(&self, cfg: &PlanConfig) -> NodeRequirements {
        (**self).node_requirements(cfg)
    }

    fn preflight(&mut self) -> Result<(), DataPlaneError> {
        (**self).preflight()
    }

    fn drift(&mut self) -> Result<Option<String>, DataPlaneError> {
        (**self).drift()
    }

    fn drift_armed(&self) -> bool {
        (**self).drift_armed()
    }

    fn compare(&mut self, intent: &Intent) -> Result<Comparison, DataPlaneError> {
        (**self).compare(intent)
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        (**self).collectors()
    }

    fn shutdown(&mut self) {
        (**self).shutdown()
    }

    fn close_stale_udp(&mut self, stale: &StaleUdp<'_>) -> Result<usize, DataPlaneError> {
        (**self).close_stale_udp(stale)
    }

    fn seal(&mut self, seal: &str) -> Result<bool, DataPlaneError> {
        (**self).seal(seal)
    }

    fn sealed(&mut self) -> Result<bool, DataPlaneError> {
        (**self).sealed()
    }

    fn adopt(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        seal: &str,
    ) -> Result<bool, DataPlaneError> {
        (**self).adopt(intent, delta, seal)
    }
}

/// Which failures a counter counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// Every failed sync.
    Sync,
    /// Failed partial syncs only.
    PartialSync,
    /// Failed removals of stale objects done apart from the sync.
    Cleanup,
}

/// A failure counter of a mode, with upstream kube-proxy's name for that mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailureCounter {
    pub kind: FailureKind,
    pub name: &'static str,
    pub help: &'static str,
}

/// A section of kube-proxy's `KubeProxyConfiguration` holding one mode's settings
/// (`syncPeriod`, `minSyncPeriod`, `masqueradeAll`, `masqueradeBit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigSection {
    Iptables,
    Nftables,
    Ipvs,
}

impl ConfigSection {
    /// The section's field name in the config file.
    pub fn name(self) -> &'static str {
        match self {
            ConfigSection::Iptables => "iptables",
            ConfigSection::Nftables => "nftables",
            ConfigSection::Ipvs => "ipvs",
        }
    }
}

/// Where NodePorts answer when `--nodeport-addresses` is not given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodePortDefault {
    /// The node's primary IP of each family (upstream's nftables mode).
    Primary,
    /// Every local address (upstream's iptables mode).
    AllLocal,
}

/// Whether NodePorts answer on loopback when `--nodeport-localhost` is not given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalhostDefault {
    /// Never (upstream's nftables mode before 1.37 has no localhost NodePorts).
    Off,
    /// Off, unless this feature gate is on and the NodePort addresses name loopback
    /// explicitly (the `localhost` keyword, or a CIDR other than a `/0` that starts
    /// at or holds a loopback address): kube-proxy 1.37's nftables mode with
    /// `KubeProxyNFTablesLocalhostNodePorts` (KEP-6032).
    WhenGatedAndNamed(&'static str),
    /// As `--iptables-localhost-nodeports` (`iptables.localhostNodePorts`) says: on
    /// by default (upstream's iptables mode).
    IptablesSetting,
}

/// What a mode assumes where kube-proxy's modes differ and the user said nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModeDefaults {
    /// The config file section the mode reads (as upstream reads the configured
    /// mode's section), and whose flags (`--iptables-*` or `--ipvs-*`) set the
    /// sync periods.
    pub config_section: ConfigSection,
    pub nodeport_addresses: NodePortDefault,
    pub localhost_nodeports: LocalhostDefault,
}

/// Another `--proxy-mode` name for a registered mode: a kube-proxy mode svcproxy
/// runs on this mode's data plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alias {
    pub name: &'static str,
    /// The section (and flags) the sync periods come from, as kube-proxy reads them
    /// for this name.
    pub sync_section: ConfigSection,
    /// Logged at start when the alias is used.
    pub warning: &'static str,
    /// The kube-proxy feature gate without which kube-proxy refuses this name
    /// (`KubeProxyIPVS` for `ipvs`); the binary refuses it the same way.
    pub gate: Option<&'static str>,
}

/// The kind of kernel objects a mode writes. Modes of one kind share them (each
/// mode's first sync replaces what another of its kind left); a mode of another kind
/// removes them once it has synced, as kube-proxy removes its iptables rules when it
/// starts in nftables mode and the reverse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelObjects {
    /// svcproxy's nftables tables (`ip svcproxy`, `ip6 svcproxy`).
    NftablesTables,
    /// svcproxy's iptables chains and the jumps to them.
    IptablesChains,
    /// The eBPF mode's pinned programs and maps, and its fixed nftables table.
    EbpfMaps,
}

impl KernelObjects {
    /// What they are, for people (`svcproxy cleanup --help`).
    pub fn describe(self) -> &'static str {
        match self {
            KernelObjects::NftablesTables => {
                "svcproxy's nftables tables (ip svcproxy, ip6 svcproxy)"
            }
            KernelObjects::IptablesChains => {
                "svcproxy's iptables chains (SVCPROXY-*, SVP-*) and the jumps to them"
            }
            KernelObjects::EbpfMaps => {
                "the eBPF programs' links and maps pinned under --ebpf-bpffs, and the \
                 nftables table inet svcproxy-ebpf"
            }
        }
    }
}

/// What a mode declares of itself: everything the registry and the binary need
/// to know of it but how to make its data plane ([`crate::registry::Backend`]
/// adds that).
#[derive(Clone, Copy)]
pub struct ModeInfo {
    /// The `--proxy-mode` name.
    pub mode: &'static str,
    /// Other names `--proxy-mode` accepts for this mode.
    pub aliases: &'static [Alias],
    /// The kube-proxy feature gate without which kube-proxy refuses the mode's
    /// name (`KubeProxyIPVS` for `ipvs`); the binary refuses it the same way.
    pub gate: Option<&'static str>,
    /// Defaults where kube-proxy's modes differ.
    pub defaults: ModeDefaults,
    /// The groups of svcproxy's own flags the mode reads (the binary declares each
    /// group's flags, and warns that a group's flags are ignored in a mode that
    /// does not read it).
    pub flag_groups: &'static [&'static str],
    /// The mode's failure counters, named as upstream names them for that mode.
    pub failure_counters: &'static [FailureCounter],
    /// The mode reports [`RuleCount`]s (upstream's iptables rule gauges).
    pub counts_rules: bool,
    /// Upstream's "large cluster mode": with more endpoints than this in one
    /// family, the periodic full sync is skipped (kubernetes#138571); a full sync
    /// still follows a start, a failure, a drift and a node-wide change. `None`:
    /// the mode full-syncs every hour whatever the size.
    pub large_cluster_endpoints: Option<usize>,
    /// The kind of kernel objects it writes: a mode writing another kind removes
    /// this one's ([`crate::registry::cleanup_other_modes`]).
    pub objects: KernelObjects,
    /// Where this mode behaves differently from the others, as upstream's same mode
    /// does; folded into the configuration before the intent is built.
    pub semantics: ModeSemantics,
}

/// Upstream's `largeClusterEndpointsThreshold`: above this many endpoints a mode
/// that declares it ([`ModeInfo::large_cluster_endpoints`]) stops the periodic full
/// sync, which then holds the kernel's rule lock for seconds to rewrite what is
/// already there.
pub const LARGE_CLUSTER_ENDPOINTS: usize = 1000;

impl std::fmt::Debug for ModeInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModeInfo")
            .field("mode", &self.mode)
            .finish()
    }
}
