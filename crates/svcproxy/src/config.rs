//! Configuration: kube-proxy's command-line flags and `KubeProxyConfiguration` file,
//! resolved with kube-proxy's precedence into the [`Settings`] the rest of svcproxy uses.
//!
//! Entry point: [`resolve`]. Submodules: `flags` ([`ProxyFlags`]), `file`
//! ([`KubeProxyConfiguration`]), `duration` (Go duration syntax).
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
pub mod gates;
pub mod mode_flags;

/// The kube-proxy release whose semantics, flags, config file, feature gates and
/// metrics svcproxy follows (its API types are k8s-openapi's `v1_37`); what of it
/// differs is in docs/configuration.md. `--version` and `/configz` report it.
pub const KUBE_PROXY_RELEASE: &str = "v1.37";

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
use gates::FeatureGates;

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

fn from_flags(flags: &ProxyFlags, errors: &mut Errors, warnings: &mut Vec<String>) -> Modeled {
    let mode = errors.check(
        "--proxy-mode",
        svcproxy_dataplane::resolve_mode(&flags.proxy_mode),
        default_mode(),
    );
    // The unset mode concerns the commands that write or show rules only.
    let (mode_rule_warning, mode_warning) = split_mode_warning(&mode);
    warnings.extend(mode_warning.map(|w| format!("--proxy-mode: {w}")));
    let cluster_cidrs = errors.check(
        "--cluster-cidr",
        parse_cluster_cidrs(flags.cluster_cidr.as_deref().unwrap_or("")),
        Vec::new(),
    );
    let nodeport_addresses = flag_nodeport_addresses(flags, errors);
    let (sync_period, min_sync_period) = flag_sync_periods(flags, &mode, errors, warnings);
    let feature_gates = feature_gates(
        "--feature-gates",
        flags
            .feature_gates
            .as_deref()
            .map(gates::parse_flag)
            .unwrap_or_else(|| Ok(BTreeMap::new())),
        errors,
        warnings,
    );
    let mut rule_warnings: Vec<String> = mode_rule_warning.into_iter().collect();
    let detect_local = errors.check(
        "--detect-local-mode",
        detect_local(
            &flags.detect_local_mode,
            &cluster_cidrs,
            &flags.pod_bridge_interface,
            &flags.pod_interface_name_prefix,
            (
                "--pod-bridge-interface",
                "--pod-interface-name-prefix",
                "--cluster-cidr",
            ),
            &mut rule_warnings,
        ),
        LocalDetection::None,
    );
    let (healthz_bind, metrics_bind) = flag_servers(flags, errors);
    Modeled {
        proxy_mode: mode.backend,
        mode_gate: mode.gate.map(|g| (g, mode.asked)),
        ipvs_scheduler: ("--ipvs-scheduler", flags.ignored.ipvs_scheduler.clone()),
        ipvs_timeouts: [
            ("--ipvs-tcp-timeout", flags.ignored.ipvs_tcp_timeout),
            ("--ipvs-tcpfin-timeout", flags.ignored.ipvs_tcpfin_timeout),
            ("--ipvs-udp-timeout", flags.ignored.ipvs_udp_timeout),
        ],
        feature_gates,
        bind_address: errors.check(
            "--bind-address",
            parse_ip(&flags.bind_address),
            Ipv4Addr::UNSPECIFIED.into(),
        ),
        cluster_cidrs,
        nodeport_addresses,
        masquerade_all: flags.masquerade_all,
        masquerade_bit: flags.iptables_masquerade_bit,
        localhost_nodeports: flags.iptables_localhost_nodeports,
        healthz_bind,
        metrics_bind,
        min_sync_period,
        sync_period,
        config_sync_period: flags.config_sync_period,
        kubeconfig: flags
            .kubeconfig
            .clone()
            .filter(|p| !p.as_os_str().is_empty()),
        client_connection: ClientConnection {
            qps: flags.kube_api_qps,
            burst: flags.kube_api_burst,
            content_type: flags.kube_api_content_type.clone(),
            accept_content_types: String::new(),
        },
        detect_local,
        rule_warnings,
        conntrack: flag_conntrack(flags),
        hostname_override: None,
        verbosity: None,
        log_format: None,
        oom_score_adj: flags.oom_score_adj,
        bind_address_hard_fail: flags.bind_address_hard_fail,
    }
}

/// `--nodeport-addresses`, a comma-separated list (`None`: unset).
fn flag_nodeport_addresses(flags: &ProxyFlags, errors: &mut Errors) -> Option<NodePortAddresses> {
    let items: Vec<String> = flags
        .nodeport_addresses
        .as_deref()
        .unwrap_or("")
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    errors.check(
        "--nodeport-addresses",
        parse_nodeport_addresses(&items),
        None,
    )
}

/// The sync period and the minimum one: kube-proxy's mode-specific names
/// (processV1Alpha1Flags): --ipvs-* in ipvs mode, --iptables-* in every other mode;
/// each wins over svcproxy's mode-neutral flag, and the other mode's warn.
fn flag_sync_periods(
    flags: &ProxyFlags,
    mode: &svcproxy_dataplane::ModeChoice,
    errors: &mut Errors,
    warnings: &mut Vec<String>,
) -> (Duration, Duration) {
    let (mode_sync, mode_min, other) = if mode.sync_section == ConfigSection::Ipvs {
        (
            flags.ipvs_sync_period,
            flags.ipvs_min_sync_period,
            [
                ("--iptables-sync-period", flags.iptables_sync_period),
                ("--iptables-min-sync-period", flags.iptables_min_sync_period),
            ],
        )
    } else {
        (
            flags.iptables_sync_period,
            flags.iptables_min_sync_period,
            [
                ("--ipvs-sync-period", flags.ipvs_sync_period),
                ("--ipvs-min-sync-period", flags.ipvs_min_sync_period),
            ],
        )
    };
    for (flag, value) in other {
        if value.is_some() {
            warnings.push(format!(
                "{flag}: ignored, --proxy-mode is {} (as kube-proxy)",
                mode.name()
            ));
        }
    }
    let sync_period = mode_sync.unwrap_or(flags.sync_period);
    let min_sync_period = mode_min.unwrap_or(flags.min_sync_period);
    if sync_period.is_zero() {
        errors.push("--sync-period: must be greater than 0".to_string());
    }
    if flags.config_sync_period.is_zero() {
        errors.push("--config-sync-period: must be greater than 0".to_string());
    }
    (sync_period, min_sync_period)
}

/// The health and metrics servers' addresses. The deprecated --healthz-port and
/// --metrics-port (addressFromDeprecatedFlags): 0 disables the server; another
/// port only fills in an address without one.
fn flag_servers(
    flags: &ProxyFlags,
    errors: &mut Errors,
) -> (Option<SocketAddr>, Option<SocketAddr>) {
    let mut server = |flag: &str, addr: &str, port: Option<u16>, default: u16| match port {
        Some(0) => None,
        port => errors.check(
            flag,
            parse_bind_address(addr, port.unwrap_or(default)),
            None,
        ),
    };
    let healthz = server(
        "--healthz-bind-address",
        &flags.healthz_bind_address,
        flags.healthz_port,
        HEALTHZ_PORT,
    );
    let metrics = server(
        "--metrics-bind-address",
        &flags.metrics_bind_address,
        flags.metrics_port,
        METRICS_PORT,
    );
    (healthz, metrics)
}

/// The conntrack settings the flags give (0: leave the kernel's).
fn flag_conntrack(flags: &ProxyFlags) -> ConntrackSettings {
    let nonzero = |d: Duration| Some(d).filter(|d| !d.is_zero());
    ConntrackSettings {
        max_per_core: flags.conntrack_max_per_core,
        min: flags.conntrack_min,
        tcp_established_timeout: nonzero(flags.conntrack_tcp_timeout_established),
        tcp_close_wait_timeout: nonzero(flags.conntrack_tcp_timeout_close_wait),
        tcp_be_liberal: flags.conntrack_tcp_be_liberal,
        udp_timeout: nonzero(flags.conntrack_udp_timeout),
        udp_stream_timeout: nonzero(flags.conntrack_udp_timeout_stream),
    }
}

fn from_file(
    file: &KubeProxyConfiguration,
    errors: &mut Errors,
    warnings: &mut Vec<String>,
) -> Modeled {
    warnings.extend(file.unsupported_fields());
    let feature_gates = feature_gates(
        "featureGates",
        Ok(file.feature_gates.clone().unwrap_or_default()),
        errors,
        warnings,
    );
    let mode = errors.check(
        "mode",
        svcproxy_dataplane::resolve_mode(file.mode.as_deref().unwrap_or("")),
        default_mode(),
    );
    let (mode_rule_warning, mode_warning) = split_mode_warning(&mode);
    warnings.extend(mode_warning.map(|w| format!("mode: {w}")));
    let sections = FileSections::of(file);
    let (sync_period, min_sync_period) = sections.sync_periods(file, &mode, warnings);
    let (masq_all, masquerade_bit) =
        sections.masquerade(&mode, (sync_period, min_sync_period), errors, warnings);
    let cluster_cidrs = errors.check(
        "clusterCIDR",
        parse_cluster_cidrs(file.cluster_cidr.as_deref().unwrap_or("")),
        Vec::new(),
    );
    let nodeport_addresses = errors.check(
        "nodePortAddresses",
        parse_nodeport_addresses(file.node_port_addresses.as_deref().unwrap_or(&[])),
        None,
    );
    let (bind_address, healthz_bind, metrics_bind) = file_servers(file, errors);
    let (client_connection, kubeconfig) = file_client_connection(file, errors);
    let mut rule_warnings: Vec<String> = mode_rule_warning.into_iter().collect();
    let detect_local = file_detect_local(file, &cluster_cidrs, errors, &mut rule_warnings);
    let ipvs = &sections.ipvs;
    Modeled {
        proxy_mode: mode.backend,
        mode_gate: mode.gate.map(|g| (g, mode.asked)),
        ipvs_scheduler: ("ipvs.scheduler", ipvs.scheduler.clone()),
        ipvs_timeouts: [
            ("ipvs.tcpTimeout", ipvs.tcp_timeout.map(|d| d.0)),
            ("ipvs.tcpFinTimeout", ipvs.tcp_fin_timeout.map(|d| d.0)),
            ("ipvs.udpTimeout", ipvs.udp_timeout.map(|d| d.0)),
        ],
        feature_gates,
        bind_address,
        cluster_cidrs,
        nodeport_addresses,
        masquerade_all: masq_all.unwrap_or(false),
        masquerade_bit,
        localhost_nodeports: sections.ipt.localhost_node_ports.unwrap_or(true),
        healthz_bind,
        metrics_bind,
        min_sync_period,
        sync_period,
        config_sync_period: nonzero_duration(file.config_sync_period)
            .unwrap_or(DEFAULT_CONFIG_SYNC_PERIOD),
        kubeconfig,
        client_connection,
        detect_local,
        rule_warnings,
        conntrack: file_conntrack(file, errors),
        hostname_override: file.hostname_override.clone().filter(|h| !h.is_empty()),
        verbosity: file.logging.as_ref().and_then(|l| l.verbosity),
        log_format: file
            .logging
            .as_ref()
            .and_then(|l| l.format.as_deref())
            .and_then(|f| errors.check("logging.format", LogFormat::parse(f).map(Some), None)),
        oom_score_adj: match file.oom_score_adj {
            None => DEFAULT_OOM_SCORE_ADJ,
            Some(n) => errors.check(
                "oomScoreAdj",
                Some(n)
                    .filter(|n| (-1000..=1000).contains(n))
                    .ok_or_else(|| format!("{n} must be within the range [-1000, 1000]")),
                DEFAULT_OOM_SCORE_ADJ,
            ),
        },
        bind_address_hard_fail: file.bind_address_hard_fail.unwrap_or(false),
    }
}

/// A duration of the file, where upstream's defaulting treats zero as unset.
fn nonzero_duration(d: Option<GoDuration>) -> Option<Duration> {
    d.map(|d| d.0).filter(|d| !d.is_zero())
}

/// The config file's per-mode sections (absent ones as empty).
struct FileSections {
    ipt: file::IPTablesConfiguration,
    nft: file::NFTablesConfiguration,
    ipvs: file::IPVSConfiguration,
}

impl FileSections {
    fn of(file: &KubeProxyConfiguration) -> FileSections {
        FileSections {
            ipt: file.iptables.clone().unwrap_or_default(),
            nft: file.nftables.clone().unwrap_or_default(),
            ipvs: file.ipvs.clone().unwrap_or_default(),
        }
    }

    /// A section's `syncPeriod` and `minSyncPeriod`.
    fn sync_of(&self, s: ConfigSection) -> (Option<GoDuration>, Option<GoDuration>) {
        match s {
            ConfigSection::Ipvs => (self.ipvs.sync_period, self.ipvs.min_sync_period),
            ConfigSection::Iptables => (self.ipt.sync_period, self.ipt.min_sync_period),
            ConfigSection::Nftables => (self.nft.sync_period, self.nft.min_sync_period),
        }
    }

    /// A section's `masqueradeAll` and `masqueradeBit`: upstream's ipvs mode
    /// reads the iptables section's.
    fn masquerade_of(&self, s: ConfigSection) -> (Option<bool>, Option<i32>) {
        match s {
            ConfigSection::Iptables | ConfigSection::Ipvs => {
                (self.ipt.masquerade_all, self.ipt.masquerade_bit)
            }
            ConfigSection::Nftables => (self.nft.masquerade_all, self.nft.masquerade_bit),
        }
    }

    /// The sync periods. Upstream's v1alpha1 conversion reads them from the section
    /// of the configured mode (ipvs included); an empty mode is iptables, as
    /// kube-proxy 1.37's, and reads that section. The top-level fields win.
    fn sync_periods(
        &self,
        file: &KubeProxyConfiguration,
        mode: &svcproxy_dataplane::ModeChoice,
        warnings: &mut Vec<String>,
    ) -> (Duration, Duration) {
        let section = mode.sync_section.name();
        let (sec_sync, sec_min) = self.sync_of(mode.sync_section);
        let mut pick = |top: Option<GoDuration>, sec: Option<GoDuration>, name: &str, default| {
            // Upstream defaulting treats zero as unset, so `0s` in the file also
            // means "default" (a file cannot ask for minSyncPeriod 0; the flag can).
            match (nonzero_duration(top), nonzero_duration(sec)) {
                (Some(t), Some(s)) if t != s => {
                    warnings.push(format!(
                        "{section}.{name}: ignored, the top-level {name} ({}) takes precedence",
                        format_go_duration(t)
                    ));
                    t
                }
                (Some(t), _) => t,
                (None, Some(s)) => s,
                (None, None) => default,
            }
        };
        (
            pick(
                file.sync_period,
                sec_sync,
                "syncPeriod",
                DEFAULT_SYNC_PERIOD,
            ),
            pick(
                file.min_sync_period,
                sec_min,
                "minSyncPeriod",
                DEFAULT_MIN_SYNC_PERIOD,
            ),
        )
    }

    /// `masqueradeAll` and the masquerade bit from the mode's section, with a
    /// warning for each other section's setting this mode does not read.
    fn masquerade(
        &self,
        mode: &svcproxy_dataplane::ModeChoice,
        (sync_period, min_sync_period): (Duration, Duration),
        errors: &mut Errors,
        warnings: &mut Vec<String>,
    ) -> (Option<bool>, u8) {
        let (masq_all, masq_bit) = self.masquerade_of(mode.sync_section);
        let active = mode.backend.mode;
        for other in [ConfigSection::Iptables, ConfigSection::Nftables] {
            if other == mode.sync_section {
                continue;
            }
            let ((sync, min), (masq, bit)) = (self.sync_of(other), self.masquerade_of(other));
            let mut fields = Vec::new();
            if nonzero_duration(sync).is_some_and(|d| d != DEFAULT_SYNC_PERIOD && d != sync_period)
            {
                fields.push("syncPeriod");
            }
            if nonzero_duration(min)
                .is_some_and(|d| d != DEFAULT_MIN_SYNC_PERIOD && d != min_sync_period)
            {
                fields.push("minSyncPeriod");
            }
            if masq == Some(true) && masq_all != Some(true) {
                fields.push("masqueradeAll");
            }
            if bit.is_some_and(|b| b != i32::from(DEFAULT_MASQUERADE_BIT) && Some(b) != masq_bit) {
                fields.push("masqueradeBit");
            }
            if !fields.is_empty() {
                let name = other.name();
                warnings.push(format!(
                    "{}: ignored in {active} mode",
                    fields
                        .iter()
                        .map(|f| format!("{name}.{f}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                ));
            }
        }
        if mode.sync_section != ConfigSection::Ipvs {
            let mut fields = Vec::new();
            if nonzero_duration(self.ipvs.sync_period).is_some_and(|d| d != DEFAULT_SYNC_PERIOD) {
                fields.push("ipvs.syncPeriod");
            }
            if nonzero_duration(self.ipvs.min_sync_period).is_some() {
                fields.push("ipvs.minSyncPeriod");
            }
            if !fields.is_empty() {
                warnings.push(format!("{}: ipvs mode only; ignored", fields.join(", ")));
            }
        }
        let bit = match masq_bit {
            None => DEFAULT_MASQUERADE_BIT,
            Some(b) => errors.check(
                &format!("{active}.masqueradeBit"),
                u8::try_from(b)
                    .ok()
                    .filter(|b| *b <= 31)
                    .ok_or_else(|| format!("{b} must be within the range [0, 31]")),
                DEFAULT_MASQUERADE_BIT,
            ),
        };
        (masq_all, bit)
    }
}

/// `bindAddress` and the health and metrics servers' addresses. Upstream's
/// SetDefaults_KubeProxyConfiguration: an empty server address means the default
/// for bindAddress's family (so a file cannot disable these servers; the flags
/// can).
fn file_servers(
    file: &KubeProxyConfiguration,
    errors: &mut Errors,
) -> (IpAddr, Option<SocketAddr>, Option<SocketAddr>) {
    let bind_address = match file.bind_address.as_deref().unwrap_or("") {
        "" => Ipv4Addr::UNSPECIFIED.into(),
        s => errors.check("bindAddress", parse_ip(s), Ipv4Addr::UNSPECIFIED.into()),
    };
    let (healthz_default, metrics_default): (IpAddr, IpAddr) = if bind_address.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED.into(), Ipv4Addr::LOCALHOST.into())
    } else {
        (Ipv6Addr::UNSPECIFIED.into(), Ipv6Addr::LOCALHOST.into())
    };
    let mut bind = |field: &str, value: &Option<String>, default_ip: IpAddr, port: u16| match value
        .as_deref()
        .unwrap_or("")
    {
        "" => Some(SocketAddr::new(default_ip, port)),
        s => errors.check(field, parse_bind_address(s, port), None),
    };
    let healthz_bind = bind(
        "healthzBindAddress",
        &file.healthz_bind_address,
        healthz_default,
        HEALTHZ_PORT,
    );
    let metrics_bind = bind(
        "metricsBindAddress",
        &file.metrics_bind_address,
        metrics_default,
        METRICS_PORT,
    );
    (bind_address, healthz_bind, metrics_bind)
}

/// `clientConnection`, and its kubeconfig.
fn file_client_connection(
    file: &KubeProxyConfiguration,
    errors: &mut Errors,
) -> (ClientConnection, Option<PathBuf>) {
    let cc = file.client_connection.clone().unwrap_or_default();
    let burst = match cc.burst.unwrap_or(0) {
        0 => 10,
        b => errors.check(
            "clientConnection.burst",
            u32::try_from(b).map_err(|_| format!("{b} must be greater than or equal to 0")),
            10,
        ),
    };
    let connection = ClientConnection {
        qps: cc.qps.filter(|q| *q != 0.0).unwrap_or(5.0),
        burst,
        content_type: cc
            .content_type
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| DEFAULT_CONTENT_TYPE.to_string()),
        accept_content_types: cc.accept_content_types.unwrap_or_default(),
    };
    let kubeconfig = cc.kubeconfig.filter(|k| !k.is_empty()).map(PathBuf::from);
    (connection, kubeconfig)
}

/// The node's conntrack settings (`conntrack`).
fn file_conntrack(file: &KubeProxyConfiguration, errors: &mut Errors) -> ConntrackSettings {
    let ct = file.conntrack.clone().unwrap_or_default();
    let mut count = |field: &str, v: Option<i32>, default: u32| match v {
        None => default,
        Some(n) => errors.check(
            field,
            u32::try_from(n).map_err(|_| format!("{n} must be greater than or equal to 0")),
            default,
        ),
    };
    let max_per_core = count("conntrack.maxPerCore", ct.max_per_core, 32 * 1024);
    let min = count("conntrack.min", ct.min, 128 * 1024);
    // The TCP timeouts are pointers upstream: null means the default, 0 "leave as is".
    let tcp_timeout = |d: Option<GoDuration>, default: Duration| {
        Some(d.map_or(default, |d| d.0)).filter(|d| !d.is_zero())
    };
    ConntrackSettings {
        max_per_core,
        min,
        tcp_established_timeout: tcp_timeout(
            ct.tcp_established_timeout,
            Duration::from_secs(24 * 3600),
        ),
        tcp_close_wait_timeout: tcp_timeout(ct.tcp_close_wait_timeout, Duration::from_secs(3600)),
        tcp_be_liberal: ct.tcp_be_liberal.unwrap_or(false),
        udp_timeout: nonzero_duration(ct.udp_timeout),
        udp_stream_timeout: nonzero_duration(ct.udp_stream_timeout),
    }
}

/// `detectLocalMode` and `detectLocal`.
fn file_detect_local(
    file: &KubeProxyConfiguration,
    cluster_cidrs: &[IpNet],
    errors: &mut Errors,
    rule_warnings: &mut Vec<String>,
) -> LocalDetection {
    let dl = file.detect_local.clone().unwrap_or_default();
    errors.check(
        "detectLocalMode",
        detect_local(
            file.detect_local_mode.as_deref().unwrap_or(""),
            cluster_cidrs,
            dl.bridge_interface.as_deref().unwrap_or(""),
            dl.interface_name_prefix.as_deref().unwrap_or(""),
            (
                "detectLocal.bridgeInterface",
                "detectLocal.interfaceNamePrefix",
                "clusterCIDR",
            ),
            rule_warnings,
        ),
        LocalDetection::None,
    )
}

/// What an invalid mode falls back to while the other errors are collected.
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

fn default_mode() -> svcproxy_dataplane::ModeChoice {
    svcproxy_dataplane::resolve_mode("").expect("the default mode is registered")
}

/// One CIDR or a dual-stack pair (`10.0.0.0/16,fd00::/48`), as upstream validates
/// clusterCIDR. Host bits are cleared, as Go's ParseCIDR does.
pub fn parse_cluster_cidrs(s: &str) -> Result<Vec<IpNet>, String> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    let cidrs = s
        .split(',')
        .map(|c| parse_cidr(c.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    match cidrs.as_slice() {
        [_] => Ok(cidrs),
        [a, b] if a.addr().is_ipv4() != b.addr().is_ipv4() => Ok(cidrs),
        [_, _] => Err(format!(
            "{s:?} must be one CIDR or a dual-stack pair (one IPv4, one IPv6), e.g. 10.100.0.0/16,fde4:8dba:82e1::/48"
        )),
        _ => Err(format!("{s:?}: at most two CIDRs (one per IP family) are allowed")),
    }
}

fn parse_cidr(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .map(|n| n.trunc())
        .map_err(|_| format!("invalid CIDR {s:?} (expected e.g. 10.0.0.0/8 or fd00::/64)"))
}

/// nodePortAddresses / --nodeport-addresses, as kube-proxy 1.37 reads it: CIDRs and
/// the keywords `primary` (the Node's primary IPs), `localhost` (127.0.0.0/8 and
/// ::1/128) and `all` (0.0.0.0/0 and ::/0), in any combination; a keyword listed
/// twice is refused. `None` when empty (the mode's default applies).
pub fn parse_nodeport_addresses(items: &[String]) -> Result<Option<NodePortAddresses>, String> {
    if items.is_empty() {
        return Ok(None);
    }
    let mut primary = false;
    let mut cidrs = Vec::new();
    let mut keywords = std::collections::BTreeSet::new();
    for item in items {
        let item = item.trim();
        let keyword = matches!(item, "primary" | "localhost" | "all");
        if keyword && !keywords.insert(item) {
            return Err(format!("{:?}: {item:?} is listed twice", items.join(",")));
        }
        match item {
            "primary" => primary = true,
            "localhost" => cidrs.extend([
                net(Ipv4Addr::new(127, 0, 0, 0).into(), 8),
                net(Ipv6Addr::LOCALHOST.into(), 128),
            ]),
            "all" => cidrs.extend([
                net(Ipv4Addr::UNSPECIFIED.into(), 0),
                net(Ipv6Addr::UNSPECIFIED.into(), 0),
            ]),
            _ => cidrs.push(parse_cidr(item).map_err(|e| {
                format!("{e}; entries must be CIDRs or the keywords 'primary', 'localhost', 'all'")
            })?),
        }
    }
    Ok(Some(match (primary, cidrs.is_empty()) {
        (true, true) => NodePortAddresses::Primary,
        (true, false) => NodePortAddresses::PrimaryAnd(cidrs),
        (false, _) => NodePortAddresses::Cidrs(cidrs),
    }))
}

/// The CIDR `ip/len` (valid lengths only: the keywords' own).
fn net(ip: IpAddr, len: u8) -> IpNet {
    IpNet::new(ip, len).expect("a valid prefix length")
}

fn parse_ip(s: &str) -> Result<IpAddr, String> {
    s.parse().map_err(|_| format!("invalid IP address {s:?}"))
}

/// `IP:PORT` or a bare `IP` meaning `default_port` (upstream's AppendPortIfNeeded and
/// validateHostPort); empty disables the server.
pub fn parse_bind_address(s: &str, default_port: u16) -> Result<Option<SocketAddr>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    let addr = match (s.parse::<SocketAddr>(), s.parse::<IpAddr>()) {
        (Ok(a), _) => a,
        (_, Ok(ip)) => SocketAddr::new(ip, default_port),
        _ => {
            return Err(format!(
                "invalid address {s:?}: must be IP:PORT ([IPv6]:PORT) or an IP"
            ))
        }
    };
    if addr.port() == 0 {
        return Err(format!("invalid address {s:?}: port must be 1-65535"));
    }
    Ok(Some(addr))
}

/// The gates `set` (from `field`) asks for, refusals recorded in `errors` and
/// GA/deprecated gates' warnings in `warnings`; the defaults when refused.
fn feature_gates(
    field: &str,
    set: Result<BTreeMap<String, bool>, String>,
    errors: &mut Errors,
    warnings: &mut Vec<String>,
) -> FeatureGates {
    match set
        .map_err(|e| vec![e])
        .and_then(|set| FeatureGates::new(&set))
    {
        Ok((gates, w)) => {
            warnings.extend(w.into_iter().map(|w| format!("{field}: {w}")));
            gates
        }
        Err(refused) => {
            refused
                .into_iter()
                .for_each(|e| errors.push(format!("{field}: {e}")));
            FeatureGates::default()
        }
    }
}

/// detectLocalMode and its companions, as upstream's validation and
/// getLocalDetectors: ClusterCIDR without a CIDR degrades to no detection (with a
/// warning); BridgeInterface and InterfaceNamePrefix require their name.
fn detect_local(
    mode: &str,
    cluster_cidrs: &[IpNet],
    bridge: &str,
    prefix: &str,
    (bridge_field, prefix_field, cidr_field): (&str, &str, &str),
    warnings: &mut Vec<String>,
) -> Result<LocalDetection, String> {
    match mode {
        "" | "ClusterCIDR" => {
            if cluster_cidrs.is_empty() {
                warnings.push(format!(
                    "detect-local-mode is ClusterCIDR but {cidr_field} is not set: no traffic is \
                     treated as local (as kube-proxy)"
                ));
                Ok(LocalDetection::None)
            } else {
                Ok(LocalDetection::ClusterCidr(cluster_cidrs.to_vec()))
            }
        }
        // The node's spec.podCIDRs, from the snapshot.
        "NodeCIDR" => Ok(LocalDetection::NodeCidr(Vec::new())),
        "BridgeInterface" => {
            let name = bridge.trim();
            if name.is_empty() {
                return Err(format!("BridgeInterface requires {bridge_field}"));
            }
            validate_interface_name(name).map_err(|e| format!("{bridge_field}: {e}"))?;
            let name = InterfaceName::parse(name).map_err(|e| format!("{bridge_field}: {e}"))?;
            Ok(LocalDetection::BridgeInterface(name))
        }
        "InterfaceNamePrefix" => {
            let p = prefix.trim();
            if p.is_empty() {
                return Err(format!("InterfaceNamePrefix requires {prefix_field}"));
            }
            let p = InterfaceName::parse(p).map_err(|e| format!("{prefix_field}: {e}"))?;
            Ok(LocalDetection::InterfaceNamePrefix(p))
        }
        _ => Err(format!(
            "unknown mode {mode:?}: must be ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix"
        )),
    }
}

/// Linux interface-name rules (IFNAMSIZ - 1 bytes, no '/' or whitespace).
fn validate_interface_name(name: &str) -> Result<(), String> {
    if name.len() > 15 {
        return Err(format!("{name:?} is longer than 15 characters"));
    }
    if name == "." || name == ".." || name.contains('/') || name.chars().any(char::is_whitespace) {
        return Err(format!("{name:?} is not a valid interface name"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
