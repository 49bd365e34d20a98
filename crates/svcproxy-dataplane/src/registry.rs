//! The registry: the only code that knows which modes exist. [`BACKENDS`] pairs
//! each mode's [`ModeInfo`] (declared in the mode's own folder) with how to make
//! its data plane from the typed [`ModeOptions`]; [`resolve_mode`] turns a
//! `--proxy-mode` value (aliases included) into its [`Backend`].
//!
//! It is also where modes are composed, since it alone may name two of them:
//! the userspace mode captures with the nftables mode's table, and the nftables
//! mode serves NodePorts on loopback through the userspace proxy's forwarder.
//! Neither mode's folder imports the other's.
//!
//! Adding a mode is one folder implementing [`DataPlane`] and declaring its
//! [`ModeInfo`], and one entry in [`BACKENDS`]; flags of its own are a group the
//! binary declares (the only crate that knows clap), named in
//! [`ModeInfo::flag_groups`], and a field of [`ModeOptions`].

use std::sync::Arc;

use svcproxy_core::model::IpFamily;
use svcproxy_plan::nft::CapturePorts;
use svcproxy_plan::PlanConfig;

use crate::ebpf::{self, EbpfDataPlane, EbpfOptions};
use crate::error::DataPlaneError;
use crate::iptables::{self, IptablesCommands, IptablesDataPlane};
use crate::kernel::nft::NftCommand;
use crate::nftables::{self, NftDataPlane, NftablesOptions};
use crate::seam::{ConfigSection, DataPlane, ModeInfo};
use crate::userspace::{self, UserspaceConfig, UserspaceDataPlane};

/// A registered data plane: what the mode declares of itself, and how to make it.
/// Reads as its [`ModeInfo`] (`backend.mode`, `backend.defaults`).
#[derive(Clone, Copy)]
pub struct Backend {
    pub info: ModeInfo,
    /// A data plane programming the current network namespace, with the mode's
    /// own options.
    pub new: fn(&PlanConfig, &ModeOptions) -> Box<dyn DataPlane>,
}

impl std::ops::Deref for Backend {
    type Target = ModeInfo;

    fn deref(&self) -> &ModeInfo {
        &self.info
    }
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").field("mode", &self.mode).finish()
    }
}

/// Backends are told apart by their mode name.
impl PartialEq for Backend {
    fn eq(&self, other: &Self) -> bool {
        self.mode == other.mode
    }
}

/// The modes' own options, resolved once by the binary from its flags and
/// configuration; each mode reads its own.
#[derive(Clone, Debug, PartialEq)]
pub struct ModeOptions {
    /// The nftables mode's (`--nft-writer`, `--nft-cold-start`).
    pub nftables: NftablesOptions,
    /// The userspace proxy's: the userspace mode's, and the nftables mode's
    /// loopback forwarder's.
    pub userspace: UserspaceConfig,
    /// The ebpf and ipvs modes'.
    pub ebpf: EbpfOptions,
}

impl Default for ModeOptions {
    /// Every option at its default, as an empty command line gives them.
    fn default() -> Self {
        ModeOptions {
            nftables: NftablesOptions::default(),
            userspace: UserspaceConfig::default(),
            ebpf: EbpfOptions::host_defaults(),
        }
    }
}

/// Every implemented mode. The factory: a new backend is one line here.
pub const BACKENDS: &[Backend] = &[
    Backend {
        info: nftables::INFO,
        new: nftables_plane,
    },
    Backend {
        info: iptables::INFO,
        new: |_, _| Box::new(IptablesDataPlane::new(IptablesCommands::default())),
    },
    Backend {
        info: userspace::INFO,
        new: |cfg, o| {
            Box::new(UserspaceDataPlane::new(
                cfg,
                o.userspace.clone(),
                capture_table,
            ))
        },
    },
    Backend {
        info: ebpf::INFO,
        new: |_, o| Box::new(EbpfDataPlane::new(o.ebpf.clone())),
    },
    Backend {
        info: ebpf::ipvs::INFO,
        new: |_, o| Box::new(EbpfDataPlane::new(o.ebpf.clone()).named(ebpf::ipvs::MODE)),
    },
];

/// The nftables mode: its tables alone, or, with NodePorts on loopback asked for
/// (`--nodeport-localhost`), the userspace proxy's loopback forwarder in front of
/// the same tables: the set chains DNAT as usual and redirect only connections
/// to loopback to the forwarder, which connects from the node.
fn nftables_plane(cfg: &PlanConfig, o: &ModeOptions) -> Box<dyn DataPlane> {
    let localhost = IpFamily::BOTH
        .into_iter()
        .any(|f| cfg.serves_localhost_nodeports(f));
    if localhost {
        Box::new(UserspaceDataPlane::localhost_nodeports(
            cfg,
            o.userspace.clone(),
            capture_table,
        ))
    } else {
        Box::new(
            NftDataPlane::new()
                .with_writer(o.nftables.writer)
                .with_cold_start(o.nftables.cold_start)
                .with_config(cfg),
        )
    }
}

/// The userspace proxy's capture: the nftables mode's tables, each endpoint set's
/// chain redirecting to the proxy's socket for it once `capture` names them.
fn capture_table(cfg: &PlanConfig, capture: Option<Arc<dyn CapturePorts>>) -> Box<dyn DataPlane> {
    Box::new(NftDataPlane::with_capture(NftCommand::default(), capture).with_config(cfg))
}

/// The names of the groups of svcproxy's own flags, as modes name them in
/// [`ModeInfo::flag_groups`]: the binary declares one group of flags for each.
pub mod flag_groups {
    /// `--nft-*`: the nftables mode's.
    pub const NFTABLES: &str = crate::nftables::FLAGS;
    /// `--userspace-*`, `--proxy-port-range`, `--udp-timeout`: the userspace proxy's.
    pub const USERSPACE: &str = crate::userspace::FLAGS;
    /// `--ebpf-*`: the ebpf and ipvs modes'.
    pub const EBPF: &str = crate::ebpf::FLAGS;
}

/// The mode an empty `--proxy-mode` (and no `mode:` in the config file) runs.
pub const DEFAULT_MODE: &str = iptables::MODE;

/// Logged (and posted as a Warning Event on the Node) when no mode is set, as
/// kube-proxy warns from 1.37 (KEP-5343, k/k#139957): the unset mode is iptables
/// there, and its default will change to nftables in 1.40.
pub const DEFAULT_MODE_WARNING: &str = "no proxy mode set: running iptables, the default \
     of kube-proxy 1.38 on Linux; that default will change to nftables in kube-proxy \
     1.40, so set the mode explicitly (--proxy-mode, or mode: in the config file)";

/// What `--proxy-mode` resolved to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModeChoice {
    pub backend: &'static Backend,
    /// The name as given (empty: unset).
    pub asked: &'static str,
    /// The section the sync periods come from.
    pub sync_section: ConfigSection,
    /// Why the mode that runs is not the one asked for, if it is not.
    pub warning: Option<&'static str>,
    /// The feature gate the name asked for needs on ([`crate::Alias::gate`]).
    pub gate: Option<&'static str>,
}

impl ModeChoice {
    /// The name the user gave, or the default mode's when none was.
    pub fn name(&self) -> &'static str {
        if self.asked.is_empty() {
            self.backend.mode
        } else {
            self.asked
        }
    }
}

/// The mode `--proxy-mode NAME` (or `mode: NAME`) runs: a registered mode, an alias
/// of one, or empty for [`DEFAULT_MODE`]. An unknown name is refused naming the
/// registered modes.
pub fn resolve_mode(name: &str) -> Result<ModeChoice, String> {
    let asked = if name.is_empty() { DEFAULT_MODE } else { name };
    for b in BACKENDS {
        if b.mode == asked {
            return Ok(ModeChoice {
                backend: b,
                asked: if name.is_empty() { "" } else { b.mode },
                sync_section: b.defaults.config_section,
                warning: name.is_empty().then_some(DEFAULT_MODE_WARNING),
                gate: b.gate,
            });
        }
        if let Some(a) = b.aliases.iter().find(|a| a.name == asked) {
            return Ok(ModeChoice {
                backend: b,
                asked: a.name,
                sync_section: a.sync_section,
                warning: Some(a.warning),
                gate: a.gate,
            });
        }
    }
    let modes: Vec<&str> = BACKENDS.iter().map(|b| b.mode).collect();
    Err(format!(
        "unknown proxy mode {name:?}: must be {}, or empty ({DEFAULT_MODE})",
        modes.join(", ")
    ))
}

/// Removes what modes writing another kind of objects than `current` left in this
/// network namespace (a mode switch, by a rolling update or a restart with another
/// `--proxy-mode`); returns the failures. One cleanup per kind.
pub fn cleanup_other_modes(
    current: &Backend,
    options: &ModeOptions,
) -> Vec<(&'static str, DataPlaneError)> {
    let mut done = vec![current.objects];
    let mut failures = Vec::new();
    for b in BACKENDS {
        if done.contains(&b.objects) {
            continue;
        }
        done.push(b.objects);
        if let Err(e) = (b.new)(&PlanConfig::default(), options).cleanup() {
            failures.push((b.mode, e));
        }
    }
    failures
}

/// Runs every backend's cleanup (`svcproxy cleanup`): each removes its own objects
/// and nothing else. Returns each mode's failure.
pub fn cleanup_all(cfg: &PlanConfig, options: &ModeOptions) -> Vec<(&'static str, DataPlaneError)> {
    let mut failures = Vec::new();
    for b in BACKENDS {
        if let Err(e) = (b.new)(cfg, options).cleanup() {
            failures.push((b.mode, e));
        }
    }
    failures
}
