//! The seam between the shared sync logic and each data plane: the [`DataPlane`]
//! trait, and the registry of backends keyed on `--proxy-mode`.
//!
//! Entry points: [`backend`] (the factory: a mode name to its [`Backend`]) and
//! [`BACKENDS`]. A backend translates the intent ([`svcproxy_plan::intent`]) into
//! its kernel objects and applies them; it decides nothing about traffic. Adding a
//! mode is one module implementing [`DataPlane`] plus one entry in [`BACKENDS`].

use std::sync::Arc;
use std::time::Duration;

use svcproxy_core::model::IpFamily;

use svcproxy_plan::{Intent, IntentDelta, ModeSemantics, PlanConfig};

use crate::conntrack::ConntrackFilter;
use crate::error::DataPlaneError;
use crate::node::Sysctl;

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
}

impl SyncKind {
    pub fn is_full(self) -> bool {
        self != SyncKind::Partial
    }
}

/// What a backend reports of a successful sync.
#[derive(Clone, Debug)]
pub struct ApplyReport {
    pub kind: SyncKind,
    /// Time spent in the kernel's tool or API (translation excluded).
    pub apply_duration: Duration,
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
    /// asks for a full sync. After an error the previous rules stay in force and
    /// the next call must write everything.
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

    /// Checks, cheaply (not rule by rule), that the kernel still holds what the last
    /// successful sync wrote, and says why not: tables deleted, re-created or made
    /// dormant behind svcproxy's back, or the built-in chains flushed. On drift the
    /// next sync rewrites everything. `Ok(None)` before the first sync and after a
    /// failed one (the next sync is full anyway); `Err` when the kernel could not be
    /// asked.
    fn drift(&mut self) -> Result<Option<String>, DataPlaneError>;

    /// How the kernel's rules differ from what a full sync of `intent` would write
    /// (`svcproxy explain --live`): chains and sets missing or extra, rules and
    /// elements lacking or added (or, when the plan cannot be listed in the
    /// kernel's form, their counts), and what sees packets before svcproxy's rules.
    /// Reads only.
    fn compare(&mut self, intent: &Intent) -> Result<Comparison, DataPlaneError>;

    /// The counters of a mode that forwards connections itself (userspace), for
    /// its metrics; `None` for the modes where the kernel forwards.
    fn proxy_stats(&self) -> Option<Arc<crate::userspace::Stats>> {
        None
    }

    /// The process is stopping (SIGTERM): a mode that forwards connections itself
    /// stops accepting and lets open ones finish within `grace`. The kernel's
    /// modes leave their rules in force and do nothing.
    fn shutdown(&mut self, grace: Duration) {
        let _ = grace;
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

    fn drift(&mut self) -> Result<Option<String>, DataPlaneError> {
        (**self).drift()
    }

    fn compare(&mut self, intent: &Intent) -> Result<Comparison, DataPlaneError> {
        (**self).compare(intent)
    }

    fn proxy_stats(&self) -> Option<Arc<crate::userspace::Stats>> {
        (**self).proxy_stats()
    }

    fn shutdown(&mut self, grace: Duration) {
        (**self).shutdown(grace)
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

/// A registered data plane.
#[derive(Clone, Copy)]
pub struct Backend {
    /// The `--proxy-mode` name.
    pub mode: &'static str,
    /// The mode's failure counters, named as upstream names them for that mode.
    pub failure_counters: &'static [FailureCounter],
    /// The mode reports [`RuleCount`]s (upstream's iptables rule gauges).
    pub counts_rules: bool,
    /// Where this mode behaves differently from the others, as upstream's same mode
    /// does; folded into the configuration before the intent is built.
    pub semantics: ModeSemantics,
    /// A data plane programming the current network namespace.
    pub new: fn(&PlanConfig) -> Box<dyn DataPlane>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").field("mode", &self.mode).finish()
    }
}

/// Every implemented mode. The factory: a new backend is one line here.
pub const BACKENDS: &[Backend] = &[
    crate::nft::BACKEND,
    crate::iptables::BACKEND,
    crate::userspace::BACKEND,
];

/// The backend for `--proxy-mode NAME`, if implemented.
pub fn backend(mode: &str) -> Option<&'static Backend> {
    BACKENDS.iter().find(|b| b.mode == mode)
}

/// Runs every backend's cleanup (`svcproxy cleanup`): each removes its own objects
/// and nothing else. Returns each mode's failure.
pub fn cleanup_all(cfg: &PlanConfig) -> Vec<(&'static str, DataPlaneError)> {
    let mut failures = Vec::new();
    for b in BACKENDS {
        if let Err(e) = (b.new)(cfg).cleanup() {
            failures.push((b.mode, e));
        }
    }
    failures
}
