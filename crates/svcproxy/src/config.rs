//! Configuration: kube-proxy's command-line flags and `KubeProxyConfiguration` file,
//! resolved with kube-proxy's precedence into the [`Settings`] the rest of svcproxy uses.
//!
//! Entry point: [`resolve`]. Submodules: `flags` ([`ProxyFlags`]), `file`
//! ([`KubeProxyConfiguration`]), `mode_flags` (svcproxy's flags of the modes,
//! resolved into their options), `from_flags` and `from_file` (the modeled fields
//! from either), `parse` (the values both share), `gates`, `effective` (the
//! settings written back as a file), `duration` (Go duration syntax).
//!
//! Each concept is resolved once, into the type its user owns: the plan's
//! [`PlanConfig`], the node's [`ConntrackSettings`], the modes'
//! [`svcproxy_dataplane::ModeOptions`].
//!
//! Precedence, as upstream: kube-proxy binds its flags into a config struct and, when
//! `--config` is given, replaces that struct with the loaded file. So with a file, every
//! flag the file models is ignored (and svcproxy warns about those given explicitly),
//! whether or not the file sets the field; absent file fields take upstream's
//! *file* defaults. Only `--hostname-override` (when non-empty) wins over the file, and
//! flags outside the config (`--master`, `--cleanup`, `-v`, svcproxy's own) always apply.

/// Go's duration syntax (shared with the data planes' own flags).
pub use svcproxy_core::go_syntax as duration;
pub mod effective;
pub mod file;
pub mod flags;
mod from_file;
mod from_flags;
pub mod gates;
pub mod mode_flags;
mod parse;

/// The kube-proxy release whose semantics, flags, config file, feature gates and
/// metrics svcproxy follows (its API types are k8s-openapi's `v1_37`); what of it
/// differs is in docs/configuration.md. `--version` and `/configz` report it.
pub const KUBE_PROXY_RELEASE: &str = "v1.38";

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use svcproxy_core::model::Scheduler;
use svcproxy_dataplane::{ConfigSection, ConntrackSettings, LocalhostDefault, NodePortDefault};
use svcproxy_plan::{InterfaceName, LocalDetection, NodePortAddresses, PlanConfig};

use duration::{format_go_duration, GoDuration};
pub use file::KubeProxyConfiguration;
pub use flags::{explicitly_set_in, ProxyFlags};
use flags::{system_hostname, CONFIG_MODELED_FLAGS};
use from_file::from_file;
use from_flags::from_flags;
use gates::FeatureGates;
use parse::*;
pub use parse::{parse_bind_address, parse_cluster_cidrs, parse_nodeport_addresses};

/// Everything svcproxy's runtime needs, with defaults applied and values validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `--feature-gates` or the file's `featureGates`, checked as kube-proxy does.
    pub feature_gates: FeatureGates,
    /// The Node this proxy serves: `--hostname-override`, else the file's
    /// `hostnameOverride`, else the host name; trimmed and lowercased.
    pub node_name: String,
    /// The data plane `--proxy-mode` names, from the registry.
    pub proxy_mode: &'static svcproxy_dataplane::Backend,
    /// What the data plane's plan needs beyond the snapshot, resolved once from
    /// the flags or the file and the mode's semantics: masquerading, local-traffic
    /// detection, NodePort addresses and loopback, the scheduler, the families.
    pub plan: PlanConfig,
    /// kube-proxy's `bindAddress`: an override for the node's primary IP. Unspecified
    /// (0.0.0.0 or ::) means "from the Node object"; its family still hints the
    /// primary IP family.
    pub bind_address: IpAddr,
    /// Pod CIDRs: empty, one, or one per IP family.
    pub cluster_cidrs: Vec<IpNet>,
    /// iptables mode, IPv4 only: NodePorts also answer on 127.0.0.1
    /// (`--iptables-localhost-nodeports`, `iptables.localhostNodePorts`), as
    /// given (what it means for this mode is in [`Settings::plan`]).
    pub iptables_localhost_nodeports: bool,
    /// `None`: health check server disabled.
    pub healthz_bind: Option<SocketAddr>,
    /// `None`: metrics server disabled.
    pub metrics_bind: Option<SocketAddr>,
    pub min_sync_period: Duration,
    pub sync_period: Duration,
    /// Informer resync period (kube-proxy's configSyncPeriod).
    pub config_sync_period: Duration,
    /// `None`: in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    /// API server URL overriding the kubeconfig's.
    pub master: Option<String>,
    pub client_connection: ClientConnection,
    pub cleanup: bool,
    /// Warnings about how rules would be written (how local traffic is told
    /// apart): for the commands that write or show rules, not for `svcproxy dns`.
    pub rule_warnings: Vec<String>,
    /// No mode was set (iptables runs): warned about in the log and, with the API
    /// source, by a Warning Event on this node, as kube-proxy 1.37 (KEP-5343).
    pub mode_defaulted: bool,
    /// The node's conntrack settings, written after the first sync.
    pub conntrack: ConntrackSettings,
    /// The `--config` file the settings came from, if any (to watch it for changes, as
    /// kube-proxy exits when its config file changes).
    pub config_file: Option<PathBuf>,
    pub manifests: Option<PathBuf>,
    /// `--manifests-rescan-period`; zero: only filesystem events trigger rescans.
    pub manifests_rescan_period: Duration,
    pub service_proxy_name: Option<String>,
    pub once: bool,
    /// klog-style verbosity (`-v`), or the file's logging.verbosity if `-v` is not given.
    pub verbosity: u32,
    /// `--logging-format`, or the file's logging.format if the flag is not given.
    pub log_format: LogFormat,
    /// The process's `/proc/self/oom_score_adj` (kube-proxy's `oomScoreAdj`).
    pub oom_score_adj: i32,
    /// A health or metrics server that cannot bind ends the process (otherwise the bind
    /// is retried).
    pub bind_address_hard_fail: bool,
    /// `--init-only`: prepare the node and exit.
    pub init_only: bool,
    /// `--write-config-to`: write the effective configuration there and exit.
    pub write_config_to: Option<PathBuf>,
    /// `--dns-bind-address`: also serve the cluster DNS there.
    pub dns_bind: Option<SocketAddr>,
    /// The DNS's zone and TTL (`--cluster-domain`, `--dns-ttl`).
    pub dns: svcproxy_dns::DnsConfig,
    /// `--dns-rate-limit` and its burst; `None`: no limit.
    pub dns_rate_limit: Option<svcproxy_dns::server::RateLimit>,
    /// `--dns-upstream`: `None` for /etc/resolv.conf's nameservers, `Some([])` for
    /// none (`--dns-upstream none`: names outside the cluster domain are refused).
    pub dns_upstreams: Option<Vec<SocketAddr>>,
    /// The modes' own options, from svcproxy's flags and the configuration,
    /// handed to the mode's data plane.
    pub mode_options: svcproxy_dataplane::ModeOptions,
}

/// kube-proxy's `--logging-format` / `logging.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }

    fn parse(s: &str) -> Result<LogFormat, String> {
        match s {
            "" | "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("unsupported log format {s:?} (use text or json)")),
        }
    }
}

/// Whether NodePorts are asked for on loopback: `--nodeport-localhost` when given;
/// else the iptables setting in the iptables and userspace modes (on by default, as
/// upstream's iptables mode), and in nftables mode only with the
/// `KubeProxyNFTablesLocalhostNodePorts` gate on and loopback named in
/// `--nodeport-addresses` (as upstream's 1.37). Where and how they are then served
/// is the mode's ([`PlanConfig::serves_localhost_nodeports`]).
fn asks_localhost_nodeports(
    mode: &svcproxy_dataplane::Backend,
    gates: &FeatureGates,
    nodeport_localhost: Option<bool>,
    iptables_setting: bool,
    addresses: &NodePortAddresses,
) -> bool {
    nodeport_localhost.unwrap_or(match mode.defaults.localhost_nodeports {
        LocalhostDefault::Off => false,
        LocalhostDefault::IptablesSetting => iptables_setting,
        LocalhostDefault::WhenGatedAndNamed(gate) => {
            gates.enabled(gate) && addresses.names_loopback()
        }
    })
}

/// KEP-6032's gate in a mode that follows it (kube-proxy 1.37's nftables mode):
/// `Some` with the gate on. NodePorts on loopback not served are then rejected;
/// served ones are TCP only, as upstream's, unless svcproxy's own
/// `--nodeport-localhost` asked for them (its forwarder relays UDP too).
fn localhost_gate(
    mode: &svcproxy_dataplane::Backend,
    gates: &FeatureGates,
    nodeport_localhost: Option<bool>,
) -> Option<svcproxy_plan::LocalhostGate> {
    match mode.defaults.localhost_nodeports {
        LocalhostDefault::WhenGatedAndNamed(gate) if gates.enabled(gate) => {
            Some(svcproxy_plan::LocalhostGate {
                tcp_only: nodeport_localhost.is_none(),
            })
        }
        _ => None,
    }
}

pub use svcproxy_sources::ClientConnection;

const HEALTHZ_PORT: u16 = 10256;
const METRICS_PORT: u16 = 10249;
const DEFAULT_MASQUERADE_BIT: u8 = 14;
const DEFAULT_SYNC_PERIOD: Duration = Duration::from_secs(30);
const DEFAULT_MIN_SYNC_PERIOD: Duration = Duration::from_secs(1);
const DEFAULT_CONFIG_SYNC_PERIOD: Duration = Duration::from_secs(15 * 60);
const DEFAULT_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// Upstream's `qos.KubeProxyOOMScoreAdj`.
const DEFAULT_OOM_SCORE_ADJ: i32 = -999;

/// Resolves flags (and the `--config` file they name) into [`Settings`], plus warnings
/// for the caller to log (`tracing::warn!` each). `explicitly_set(id)` tells whether
/// the flag with clap id `id` (the [`ProxyFlags`] field name) was given on the command
/// line; [`explicitly_set_in`] builds it from `ArgMatches`.
///
/// Errors name the flag or config field and the bad value; all invalid values are
/// reported at once.
pub fn resolve(
    flags: &ProxyFlags,
    explicitly_set: &dyn Fn(&str) -> bool,
) -> anyhow::Result<(Settings, Vec<String>)> {
    resolve_with(flags, explicitly_set, &system_hostname)
}

/// The configuration fields that come from either the flags or the file.
struct Modeled {
    proxy_mode: &'static svcproxy_dataplane::Backend,
    /// The feature gate the mode's name needs on (kube-proxy's `ipvs`), and the name.
    mode_gate: Option<(&'static str, &'static str)>,
    /// `--ipvs-scheduler` or `ipvs.scheduler` as given, with its name.
    ipvs_scheduler: (&'static str, Option<String>),
    /// The ipvs idle timeouts (tcp, tcpfin, udp) as given, with their names.
    ipvs_timeouts: [(&'static str, Option<Duration>); 3],
    feature_gates: FeatureGates,
    bind_address: IpAddr,
    cluster_cidrs: Vec<IpNet>,
    /// `None`: the mode's default.
    nodeport_addresses: Option<NodePortAddresses>,
    masquerade_all: bool,
    masquerade_bit: u8,
    localhost_nodeports: bool,
    healthz_bind: Option<SocketAddr>,
    metrics_bind: Option<SocketAddr>,
    min_sync_period: Duration,
    sync_period: Duration,
    config_sync_period: Duration,
    kubeconfig: Option<PathBuf>,
    client_connection: ClientConnection,
    detect_local: LocalDetection,
    rule_warnings: Vec<String>,
    mode_defaulted: bool,
    conntrack: ConntrackSettings,
    hostname_override: Option<String>,
    verbosity: Option<u32>,
    log_format: Option<LogFormat>,
    oom_score_adj: i32,
    bind_address_hard_fail: bool,
}

/// Collects every validation error so that one run reports them all.
#[derive(Default)]
struct Errors(Vec<String>);

impl Errors {
    fn push(&mut self, msg: String) {
        self.0.push(msg);
    }

    /// `r`'s value, or `fallback` after recording its error under `field`.
    fn check<T>(&mut self, field: &str, r: Result<T, String>, fallback: T) -> T {
        r.unwrap_or_else(|e| {
            self.push(format!("{field}: {e}"));
            fallback
        })
    }

    fn finish(self, what: &str) -> anyhow::Result<()> {
        match self.0.len() {
            0 => Ok(()),
            1 => anyhow::bail!("invalid {what}: {}", self.0[0]),
            _ => anyhow::bail!("invalid {what}:\n  {}", self.0.join("\n  ")),
        }
    }
}

fn resolve_with(
    flags: &ProxyFlags,
    explicitly_set: &dyn Fn(&str) -> bool,
    hostname: &dyn Fn() -> anyhow::Result<String>,
) -> anyhow::Result<(Settings, Vec<String>)> {
    let mut warnings = Vec::new();
    let modeled = modeled(flags, explicitly_set, &mut warnings)?;
    let node_name = node_name(flags, &modeled, hostname)?;
    if let Some((gate, name)) = modeled.mode_gate {
        if !modeled.feature_gates.enabled(gate) {
            anyhow::bail!(
                "proxy mode {name:?} needs the {gate} feature gate, which is off (as kube-proxy): \
                 choose nftables or iptables (--proxy-mode, or mode: in the config file)"
            );
        }
    }
    let scheduler = scheduler(
        modeled.proxy_mode,
        &modeled.ipvs_scheduler,
        flags.scheduler.as_deref(),
        &mut warnings,
    )?;
    let idle_timeouts = idle_timeouts(modeled.proxy_mode, &modeled.ipvs_timeouts, &mut warnings);
    let (verbosity, log_format) = logging(flags, &modeled, explicitly_set)?;
    warnings.extend(flags.ignored.warnings());
    warnings.extend(mode_flags::ignored_flag_warnings(
        modeled.proxy_mode,
        explicitly_set,
    ));
    let mode_options = flags
        .mode
        .options(idle_timeouts)
        .map_err(|e| Errors(e).finish("flags").expect_err("an error each"))?;
    let resolved = Resolved {
        node_name,
        scheduler,
        mode_options,
        verbosity,
        log_format,
    };
    Ok((assemble(flags, modeled, resolved), warnings))
}

/// The fields the flags or the config file model (the file's when `--config` is
/// given, with warnings for its unknown fields and for the modeled flags it
/// overrides).
fn modeled(
    flags: &ProxyFlags,
    explicitly_set: &dyn Fn(&str) -> bool,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Modeled> {
    let mut errors = Errors::default();
    let Some(path) = &flags.config else {
        let m = from_flags(flags, &mut errors, warnings);
        errors.finish("flags")?;
        return Ok(m);
    };
    let (file, unknown) = KubeProxyConfiguration::load(path)?;
    if !unknown.is_empty() {
        let s = if unknown.len() == 1 { "" } else { "s" };
        warnings.push(format!(
            "{}: unknown field{s} ignored (strict decoding failed, so the file was \
             decoded leniently, as kube-proxy does): {}",
            path.display(),
            unknown.join(", ")
        ));
    }
    let ignored: Vec<&str> = CONFIG_MODELED_FLAGS
        .iter()
        .filter(|(id, _)| explicitly_set(id))
        .map(|&(_, flag)| flag)
        .collect();
    if !ignored.is_empty() {
        warnings.push(format!(
            "ignoring {} because --config is set (as with kube-proxy, the config file \
             replaces the flags it models; set these in {} instead)",
            ignored.join(", "),
            path.display()
        ));
    }
    let mut m = from_file(&file, &mut errors, warnings);
    if flags.manifests.is_some() {
        // svcproxy's own source flag chooses the source over the file's client
        // connection (a kubeadm config names a kubeconfig).
        if let Some(k) = m.kubeconfig.take() {
            warnings.push(format!(
                "clientConnection.kubeconfig ({}) unused: --manifests is the source",
                k.display()
            ));
        }
    }
    errors
        .finish(&format!("config file {}", path.display()))
        .map_err(|e| e.context(format!("loading config file {}", path.display())))?;
    Ok(m)
}

/// The node's name: upstream's processHostnameOverrideFlag (a non-empty flag
/// beats the file), trimmed and lowercased, else the host's name.
fn node_name(
    flags: &ProxyFlags,
    modeled: &Modeled,
    hostname: &dyn Fn() -> anyhow::Result<String>,
) -> anyhow::Result<String> {
    let override_name = match flags.hostname_override.as_deref() {
        Some(f) if !f.is_empty() => {
            if f.trim().is_empty() {
                anyhow::bail!("--hostname-override: empty (whitespace-only) name is invalid");
            }
            Some(f.to_string())
        }
        _ => modeled.hostname_override.clone(),
    };
    match override_name.map(|n| n.trim().to_lowercase()) {
        Some(n) if !n.is_empty() => Ok(n),
        _ => hostname(),
    }
}

/// The log's verbosity and format: the flags win over the file when given
/// (upstream's copyLogsFromFlags).
fn logging(
    flags: &ProxyFlags,
    modeled: &Modeled,
    explicitly_set: &dyn Fn(&str) -> bool,
) -> anyhow::Result<(u32, LogFormat)> {
    let verbosity = if explicitly_set("v") {
        flags.v
    } else {
        modeled.verbosity.unwrap_or(flags.v)
    };
    let flag_format = LogFormat::parse(&flags.logging_format)
        .map_err(|e| anyhow::anyhow!("--logging-format: {e}"))?;
    let log_format = if explicitly_set("logging_format") {
        flag_format
    } else {
        modeled.log_format.unwrap_or(flag_format)
    };
    Ok((verbosity, log_format))
}

/// What [`resolve_with`] works out beside the modeled fields.
struct Resolved {
    node_name: String,
    scheduler: Scheduler,
    mode_options: svcproxy_dataplane::ModeOptions,
    verbosity: u32,
    log_format: LogFormat,
}

/// The settings: the modeled fields, what was worked out, and svcproxy's own
/// flags.
fn assemble(flags: &ProxyFlags, modeled: Modeled, r: Resolved) -> Settings {
    let dns_clients_node = flags.dns_node_local.then(|| r.node_name.clone());
    let plan = plan_config(flags, &modeled, r.scheduler);
    Settings {
        feature_gates: modeled.feature_gates,
        node_name: r.node_name,
        proxy_mode: modeled.proxy_mode,
        plan,
        bind_address: modeled.bind_address,
        cluster_cidrs: modeled.cluster_cidrs,
        iptables_localhost_nodeports: modeled.localhost_nodeports,
        healthz_bind: modeled.healthz_bind,
        metrics_bind: modeled.metrics_bind,
        min_sync_period: modeled.min_sync_period,
        sync_period: modeled.sync_period,
        config_sync_period: modeled.config_sync_period,
        kubeconfig: modeled.kubeconfig,
        master: flags.master.clone().filter(|m| !m.is_empty()),
        client_connection: modeled.client_connection,
        cleanup: flags.cleanup,
        rule_warnings: modeled.rule_warnings,
        mode_defaulted: modeled.mode_defaulted,
        conntrack: modeled.conntrack,
        config_file: flags.config.clone(),
        manifests: flags.manifests.clone(),
        manifests_rescan_period: flags.manifests_rescan_period,
        service_proxy_name: flags.service_proxy_name.clone().filter(|n| !n.is_empty()),
        once: flags.once,
        verbosity: r.verbosity,
        log_format: r.log_format,
        oom_score_adj: modeled.oom_score_adj,
        bind_address_hard_fail: modeled.bind_address_hard_fail,
        init_only: flags.init_only,
        dns_bind: flags.dns_bind_address,
        dns_rate_limit: (flags.dns_rate_limit > 0).then(|| svcproxy_dns::server::RateLimit {
            rate: flags.dns_rate_limit,
            burst: match flags.dns_rate_limit_burst {
                0 => flags.dns_rate_limit.saturating_mul(2),
                b => b,
            },
        }),
        dns_upstreams: (!flags.dns_upstream.is_empty())
            .then(|| flags.dns_upstream.iter().flatten().copied().collect()),
        dns: svcproxy_dns::DnsConfig {
            zone: flags.cluster_domain.clone(),
            ttl: u32::try_from(flags.dns_ttl.as_secs()).unwrap_or(u32::MAX),
            clients_node: dns_clients_node,
        },
        write_config_to: flags
            .write_config_to
            .clone()
            .filter(|p| !p.as_os_str().is_empty()),
        mode_options: r.mode_options,
    }
}

/// The plan's configuration: the modeled fields the plan reads, the mode's
/// defaults where they were not given, and the mode's semantics folded in
/// ([`svcproxy_plan::ModeSemantics::apply`]).
fn plan_config(flags: &ProxyFlags, modeled: &Modeled, scheduler: Scheduler) -> PlanConfig {
    let mode = modeled.proxy_mode;
    let nodeport_addresses =
        modeled
            .nodeport_addresses
            .clone()
            .unwrap_or(match mode.defaults.nodeport_addresses {
                NodePortDefault::Primary => NodePortAddresses::Primary,
                NodePortDefault::AllLocal => NodePortAddresses::AllLocal,
            });
    let gates = &modeled.feature_gates;
    let plan = PlanConfig {
        masquerade_all: modeled.masquerade_all,
        masquerade_bit: modeled.masquerade_bit,
        local_detection: modeled.detect_local.clone(),
        node_ips: if modeled.bind_address.is_unspecified() {
            Vec::new()
        } else {
            vec![modeled.bind_address]
        },
        localhost_nodeports: asks_localhost_nodeports(
            mode,
            gates,
            flags.nodeport_localhost,
            modeled.localhost_nodeports,
            &nodeport_addresses,
        ),
        localhost_gate: localhost_gate(mode, gates, flags.nodeport_localhost),
        nodeport_addresses,
        conntrack_tcp_be_liberal: modeled.conntrack.tcp_be_liberal,
        scheduler,
        maglev_table_size: flags.maglev_table_size,
        ..PlanConfig::default()
    };
    mode.semantics.apply(plan)
}

/// The node's scheduler: in ipvs mode `--ipvs-scheduler` (or `ipvs.scheduler`)
/// when given, else `--scheduler`, else rr (upstream's ipvs default); in the
/// other modes that execute schedulers `--scheduler`, else random. A mode that
/// executes none refuses `--scheduler` other than random, and warns that the
/// ipvs one is ignored.
fn scheduler(
    mode: &svcproxy_dataplane::Backend,
    (ipvs_name, ipvs): &(&'static str, Option<String>),
    own: Option<&str>,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Scheduler> {
    let ipvs_mode = mode.defaults.config_section == ConfigSection::Ipvs;
    let ipvs = ipvs.as_deref().map(str::trim);
    if !ipvs_mode && ipvs.is_some_and(|s| !s.is_empty()) {
        warnings.push(format!(
            "{ipvs_name}: ignored in {} mode (ipvs mode only)",
            mode.mode
        ));
    }
    let (name, given) = match (ipvs.filter(|s| ipvs_mode && !s.is_empty()), own) {
        (Some(s), _) => (*ipvs_name, s),
        (None, Some(s)) => ("--scheduler", s.trim()),
        (None, None) if ipvs_mode => return Ok(Scheduler::RoundRobin),
        (None, None) => return Ok(Scheduler::Random),
    };
    let scheduler = Scheduler::parse(given).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    if !mode.semantics.schedulers && scheduler != Scheduler::Random {
        anyhow::bail!(
            "{name}: {} mode chooses endpoints at random only; the schedulers run in the \
             ebpf and ipvs modes",
            mode.mode
        );
    }
    Ok(scheduler)
}

/// The packet path's idle timeouts: ipvs mode's `--ipvs-*-timeout` (or
/// `ipvs.*Timeout`), 0 meaning none, as kube-proxy's "leave as is"; the other
/// modes warn that those given are ignored.
fn idle_timeouts(
    mode: &svcproxy_dataplane::Backend,
    given: &[(&'static str, Option<Duration>); 3],
    warnings: &mut Vec<String>,
) -> svcproxy_dataplane::IdleTimeouts {
    let nonzero = |d: Option<Duration>| d.filter(|d| !d.is_zero());
    if mode.defaults.config_section != ConfigSection::Ipvs {
        for (name, d) in given {
            if nonzero(*d).is_some() {
                warnings.push(format!(
                    "{name}: ignored in {} mode (ipvs mode only)",
                    mode.mode
                ));
            }
        }
        return svcproxy_dataplane::IdleTimeouts::default();
    }
    let [(_, tcp), (_, tcp_fin), (_, udp)] = *given;
    svcproxy_dataplane::IdleTimeouts {
        tcp: nonzero(tcp),
        tcp_fin: nonzero(tcp_fin),
        udp: nonzero(udp),
    }
}

/// A mode's warning split by whom it concerns: the unset mode's (the commands that
/// write or show rules), or an alias's (everyone).
fn split_mode_warning(
    mode: &svcproxy_dataplane::ModeChoice,
) -> (Option<String>, Option<&'static str>) {
    if mode.asked.is_empty() {
        (mode.warning.map(str::to_string), None)
    } else {
        (None, mode.warning)
    }
}

/// What an invalid mode falls back to while the other errors are collected.
fn default_mode() -> svcproxy_dataplane::ModeChoice {
    svcproxy_dataplane::resolve_mode("").expect("the default mode is registered")
}

#[cfg(test)]
mod tests;
