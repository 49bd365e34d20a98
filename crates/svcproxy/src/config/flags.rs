//! svcproxy's command-line flags: kube-proxy's names, value syntax and defaults, so that
//! an existing kube-proxy command line (e.g. a kubeadm DaemonSet's) works unchanged.
//!
//! Entry point: [`ProxyFlags`], which the binary's parser flattens. Values that need
//! the config file or the proxy mode to interpret (CIDR lists, bind addresses, mode
//! names) are kept as strings here and checked by `config::resolve`, so that a flag and
//! its config-file field share one parser and one error style.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::ArgAction;

use super::duration::parse_go_duration;

/// kube-proxy's command-line flags, plus svcproxy's own.
// Each field's clap id is its name; the resolver asks `explicitly_set` by that id (see
// CONFIG_MODELED_FLAGS). Plain comment: clap shows a doc comment here as the command's
// description when the parent has none.
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyFlags {
    /// Path to a KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1, YAML or JSON). As with kube-proxy, its values replace every flag it models; --hostname-override, --master, --cleanup, -v and svcproxy's own flags still apply.
    #[arg(long, value_name = "FILE", help_heading = "kube-proxy")]
    pub config: Option<PathBuf>,

    /// Name of the Node svcproxy runs on. Default: this host's name, lowercased. Wins over the config file's hostnameOverride, as in kube-proxy.
    #[arg(long, value_name = "NAME", help_heading = "kube-proxy")]
    pub hostname_override: Option<String>,

    /// Proxy mode: 'nftables' (the default, also when empty) or 'iptables'. kube-proxy's 'ipvs' and 'kernelspace' are not implemented and fall back to nftables with a warning.
    #[arg(
        long,
        value_name = "MODE",
        default_value = "",
        hide_default_value = true,
        help_heading = "kube-proxy"
    )]
    pub proxy_mode: String,

    /// The node IP svcproxy reports as its own (kube-proxy's historical name; no socket is bound to it). 0.0.0.0 or :: means "take it from the Node object".
    #[arg(
        long,
        value_name = "IP",
        default_value = "0.0.0.0",
        help_heading = "kube-proxy"
    )]
    pub bind_address: String,

    /// Pod CIDR range(s) of the cluster: one CIDR or a comma-separated dual-stack pair. With --detect-local-mode=ClusterCIDR, traffic from it counts as local.
    #[arg(long, value_name = "CIDR[,CIDR]", help_heading = "kube-proxy")]
    pub cluster_cidr: Option<String>,

    /// Node IPs that accept NodePort connections: comma-separated CIDRs, or 'primary' (the Node object's primary IPs). Default: 'primary' in nftables mode, all local IPs in iptables mode (as kube-proxy).
    #[arg(long, value_name = "CIDRS|primary", help_heading = "kube-proxy")]
    pub nodeport_addresses: Option<String>,

    /// SNAT all traffic sent to Service cluster IPs (needed by some CNI plugins).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set, help_heading = "kube-proxy")]
    pub masquerade_all: bool,

    /// Bit of the packet mark used to flag packets for SNAT, 0-31. svcproxy uses it in both modes (kube-proxy's nftables mode takes it from the config file only).
    #[arg(long, value_name = "BIT", default_value_t = 14,
          value_parser = clap::value_parser!(u8).range(0..=31), help_heading = "kube-proxy")]
    pub iptables_masquerade_bit: u8,

    /// iptables mode only: accept NodePort connections on 127.0.0.1 (IPv4), as kube-proxy does by default.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set, help_heading = "kube-proxy")]
    pub iptables_localhost_nodeports: bool,

    /// Health check server address: IP:PORT, or an IP meaning port 10256. Empty disables it.
    #[arg(
        long,
        value_name = "IP[:PORT]",
        default_value = "0.0.0.0:10256",
        help_heading = "kube-proxy"
    )]
    pub healthz_bind_address: String,

    /// Metrics server address: IP:PORT, or an IP meaning port 10249. Empty disables it.
    #[arg(
        long,
        value_name = "IP[:PORT]",
        default_value = "127.0.0.1:10249",
        help_heading = "kube-proxy"
    )]
    pub metrics_bind_address: String,

    /// Minimum time between rule syncs (Go duration: 500ms, 1s, 1m30s). 0 syncs on every change.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration_arg, help_heading = "kube-proxy")]
    pub min_sync_period: Duration,

    /// Maximum time between full resyncs of the rules (Go duration). Must be greater than 0.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration_arg, help_heading = "kube-proxy")]
    pub sync_period: Duration,

    /// How often the API informers resync their caches (Go duration). Must be greater than 0.
    #[arg(long, value_name = "DURATION", default_value = "15m", value_parser = parse_duration_arg, help_heading = "kube-proxy")]
    pub config_sync_period: Duration,

    /// Path to a kubeconfig file with the API server location and credentials. Default: in-cluster configuration.
    #[arg(long, value_name = "FILE", help_heading = "kube-proxy")]
    pub kubeconfig: Option<PathBuf>,

    /// API server address; overrides the kubeconfig's server.
    #[arg(long, value_name = "URL", help_heading = "kube-proxy")]
    pub master: Option<String>,

    /// Content type of requests sent to the API server.
    #[arg(
        long,
        value_name = "TYPE",
        default_value = "application/vnd.kubernetes.protobuf",
        help_heading = "kube-proxy"
    )]
    pub kube_api_content_type: String,

    /// Queries per second to the API server.
    #[arg(
        long,
        value_name = "QPS",
        default_value_t = 5.0,
        help_heading = "kube-proxy"
    )]
    pub kube_api_qps: f32,

    /// Burst of queries to the API server.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 10,
        help_heading = "kube-proxy"
    )]
    pub kube_api_burst: u32,

    /// Remove every rule svcproxy (or kube-proxy, in the selected mode) installed, then exit.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set, help_heading = "kube-proxy")]
    pub cleanup: bool,

    /// How to tell pod-originated (local) traffic: ClusterCIDR (default, also when empty), NodeCIDR, BridgeInterface or InterfaceNamePrefix.
    #[arg(
        long,
        value_name = "MODE",
        default_value = "",
        hide_default_value = true,
        help_heading = "kube-proxy"
    )]
    pub detect_local_mode: String,

    /// Bridge interface whose traffic is local, with --detect-local-mode=BridgeInterface.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "",
        hide_default_value = true,
        help_heading = "kube-proxy"
    )]
    pub pod_bridge_interface: String,

    /// Interface name prefix whose traffic is local, with --detect-local-mode=InterfaceNamePrefix.
    #[arg(
        long,
        value_name = "PREFIX",
        default_value = "",
        hide_default_value = true,
        help_heading = "kube-proxy"
    )]
    pub pod_interface_name_prefix: String,

    /// Conntrack entries to allow per CPU core (0 leaves the limit as it is and ignores --conntrack-min).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 32768,
        help_heading = "kube-proxy"
    )]
    pub conntrack_max_per_core: u32,

    /// Minimum conntrack table size, whatever --conntrack-max-per-core gives.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 131072,
        help_heading = "kube-proxy"
    )]
    pub conntrack_min: u32,

    /// Idle timeout of established TCP conntrack entries (0 leaves it as it is).
    #[arg(long, value_name = "DURATION", default_value = "24h0m0s", value_parser = parse_duration_arg, help_heading = "kube-proxy")]
    pub conntrack_tcp_timeout_established: Duration,

    /// Timeout of TCP conntrack entries in CLOSE_WAIT (0 leaves it as it is).
    #[arg(long, value_name = "DURATION", default_value = "1h0m0s", value_parser = parse_duration_arg, help_heading = "kube-proxy")]
    pub conntrack_tcp_timeout_close_wait: Duration,

    /// Run conntrack in liberal mode: out-of-window TCP packets are not marked INVALID.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set, help_heading = "kube-proxy")]
    pub conntrack_tcp_be_liberal: bool,

    /// Idle timeout of UNREPLIED UDP conntrack entries (0 leaves it as it is).
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_duration_arg, help_heading = "kube-proxy")]
    pub conntrack_udp_timeout: Duration,

    /// Idle timeout of ASSURED UDP conntrack entries (0 leaves it as it is).
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_duration_arg, help_heading = "kube-proxy")]
    pub conntrack_udp_timeout_stream: Duration,

    /// kube-proxy feature gates (Name=true,Other=false): accepted for compatibility; svcproxy has none, so they are ignored with a warning.
    #[arg(long, value_name = "NAME=BOOL,...", help_heading = "kube-proxy")]
    pub feature_gates: Option<String>,

    /// Log verbosity, as kube-proxy's --v / -v (0 = important messages only, 4 = debug, 5+ = trace). Wins over the config file's logging.verbosity.
    #[arg(
        short = 'v',
        long = "v",
        value_name = "LEVEL",
        default_value_t = 0,
        help_heading = "kube-proxy"
    )]
    pub v: u32,

    /// Read Services, EndpointSlices and Nodes from the manifests in DIR instead of the API server (svcproxy only).
    #[arg(long, value_name = "DIR", help_heading = "svcproxy")]
    pub manifests: Option<PathBuf>,

    /// Handle only Services labelled service.kubernetes.io/service-proxy-name=NAME; default: only Services without that label, as kube-proxy (svcproxy only).
    #[arg(long, value_name = "NAME", help_heading = "svcproxy")]
    pub service_proxy_name: Option<String>,

    /// Sync once, then exit (svcproxy only).
    #[arg(long, help_heading = "svcproxy")]
    pub once: bool,
}

/// Flags whose value a `--config` file replaces (clap id, flag as typed). Those not
/// listed (--config, --hostname-override, --master, --cleanup, -v and svcproxy's own)
/// keep applying with a config file.
pub const CONFIG_MODELED_FLAGS: &[(&str, &str)] = &[
    ("proxy_mode", "--proxy-mode"),
    ("bind_address", "--bind-address"),
    ("cluster_cidr", "--cluster-cidr"),
    ("nodeport_addresses", "--nodeport-addresses"),
    ("masquerade_all", "--masquerade-all"),
    ("iptables_masquerade_bit", "--iptables-masquerade-bit"),
    (
        "iptables_localhost_nodeports",
        "--iptables-localhost-nodeports",
    ),
    ("healthz_bind_address", "--healthz-bind-address"),
    ("metrics_bind_address", "--metrics-bind-address"),
    ("min_sync_period", "--min-sync-period"),
    ("sync_period", "--sync-period"),
    ("config_sync_period", "--config-sync-period"),
    ("kubeconfig", "--kubeconfig"),
    ("kube_api_content_type", "--kube-api-content-type"),
    ("kube_api_qps", "--kube-api-qps"),
    ("kube_api_burst", "--kube-api-burst"),
    ("detect_local_mode", "--detect-local-mode"),
    ("pod_bridge_interface", "--pod-bridge-interface"),
    ("pod_interface_name_prefix", "--pod-interface-name-prefix"),
    ("conntrack_max_per_core", "--conntrack-max-per-core"),
    ("conntrack_min", "--conntrack-min"),
    (
        "conntrack_tcp_timeout_established",
        "--conntrack-tcp-timeout-established",
    ),
    (
        "conntrack_tcp_timeout_close_wait",
        "--conntrack-tcp-timeout-close-wait",
    ),
    ("conntrack_tcp_be_liberal", "--conntrack-tcp-be-liberal"),
    ("conntrack_udp_timeout", "--conntrack-udp-timeout"),
    (
        "conntrack_udp_timeout_stream",
        "--conntrack-udp-timeout-stream",
    ),
    ("feature_gates", "--feature-gates"),
];

/// The `explicitly_set` predicate for `config::resolve`, from the binary's matches:
/// true for flags given on the command line (not defaulted).
pub fn explicitly_set_in(matches: &clap::ArgMatches) -> impl Fn(&str) -> bool + '_ {
    |id| {
        matches!(
            matches
                .try_get_raw(id)
                .ok()
                .and_then(|_| matches.value_source(id)),
            Some(clap::parser::ValueSource::CommandLine)
        )
    }
}

fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    parse_go_duration(s).map_err(|e| e.to_string())
}

/// Go's `strconv.ParseBool`, which pflag uses for `--flag=VALUE` on boolean flags.
pub fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("invalid boolean {s:?} (use true or false)")),
    }
}

/// The host's name as kube-proxy finds it (Go's `os.Hostname` reads this file on
/// Linux), trimmed and lowercased. `$HOSTNAME` is the fallback for systems without
/// procfs.
pub fn system_hostname() -> anyhow::Result<String> {
    let raw = match std::fs::read_to_string("/proc/sys/kernel/hostname") {
        Ok(s) => s,
        Err(e) => std::env::var("HOSTNAME").map_err(|_| {
            anyhow::anyhow!(
                "cannot determine the host name (reading /proc/sys/kernel/hostname: {e}); \
                 set --hostname-override"
            )
        })?,
    };
    let name = raw.trim().to_lowercase();
    if name.is_empty() {
        anyhow::bail!("the host name is empty; set --hostname-override");
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: ProxyFlags,
    }

    fn parse(args: &[&str]) -> Result<ProxyFlags, clap::Error> {
        let argv = std::iter::once("svcproxy").chain(args.iter().copied());
        Cli::try_parse_from(argv).map(|c| c.flags)
    }

    #[test]
    fn defaults_match_kube_proxy() {
        let f = parse(&[]).unwrap();
        assert_eq!(f.healthz_bind_address, "0.0.0.0:10256");
        assert_eq!(f.metrics_bind_address, "127.0.0.1:10249");
        assert_eq!(f.min_sync_period, Duration::from_secs(1));
        assert_eq!(f.sync_period, Duration::from_secs(30));
        assert_eq!(f.config_sync_period, Duration::from_secs(900));
        assert_eq!(f.conntrack_max_per_core, 32768);
        assert_eq!(f.conntrack_min, 131072);
        assert_eq!(
            f.conntrack_tcp_timeout_established,
            Duration::from_secs(86400)
        );
        assert_eq!(
            f.conntrack_tcp_timeout_close_wait,
            Duration::from_secs(3600)
        );
        assert_eq!(f.conntrack_udp_timeout, Duration::ZERO);
        assert_eq!(f.iptables_masquerade_bit, 14);
        assert!(f.iptables_localhost_nodeports);
        assert!(!f.masquerade_all && !f.cleanup && !f.once);
        assert_eq!(f.kube_api_qps, 5.0);
        assert_eq!(f.kube_api_burst, 10);
        assert_eq!(f.proxy_mode, "");
        assert_eq!(f.v, 0);
    }

    #[test]
    fn go_style_values() {
        let f = parse(&[
            "--masquerade-all",
            "--cleanup=true",
            "--iptables-localhost-nodeports=false",
            "--min-sync-period=500ms",
            "--sync-period",
            "1m30s",
            "-v=4",
            "--conntrack-udp-timeout=0",
        ])
        .unwrap();
        assert!(f.masquerade_all && f.cleanup && !f.iptables_localhost_nodeports);
        assert_eq!(f.min_sync_period, Duration::from_millis(500));
        assert_eq!(f.sync_period, Duration::from_secs(90));
        assert_eq!(f.v, 4);
        assert_eq!(parse(&["--v=2"]).unwrap().v, 2);
        assert_eq!(parse(&["-v", "3"]).unwrap().v, 3);
        assert!(!parse(&["--masquerade-all=F"]).unwrap().masquerade_all);
    }

    #[test]
    fn bad_values_are_rejected_naming_the_value() {
        let e = parse(&["--sync-period=10"]).unwrap_err().to_string();
        assert!(
            e.contains("--sync-period") && e.contains("missing unit"),
            "{e}"
        );
        let e = parse(&["--masquerade-all=yes"]).unwrap_err().to_string();
        assert!(e.contains("\"yes\""), "{e}");
        assert!(parse(&["--iptables-masquerade-bit=32"]).is_err());
        assert!(parse(&["--min-sync-period=-1s"]).is_err());
    }

    #[test]
    fn explicitly_set_sees_only_the_command_line() {
        let m = Cli::command()
            .try_get_matches_from(["svcproxy", "--sync-period=10s", "--masquerade-all"])
            .unwrap();
        let set = explicitly_set_in(&m);
        assert!(set("sync_period") && set("masquerade_all"));
        assert!(!set("min_sync_period") && !set("cluster_cidr"));
        assert!(!set("no_such_flag"));
        // Every id the resolver asks about must be a real arg, or the warning about
        // flags overridden by --config would silently miss it.
        let cmd = Cli::command();
        for (id, flag) in CONFIG_MODELED_FLAGS {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_id() == id)
                .unwrap_or_else(|| panic!("no arg with id {id}"));
            assert_eq!(format!("--{}", arg.get_long().unwrap()), *flag);
        }
        let _ = Cli::from_arg_matches(&m).unwrap();
    }

    #[test]
    fn help_renders() {
        let help = Cli::command().render_long_help().to_string();
        for flag in [
            "--config",
            "--hostname-override",
            "--nodeport-addresses",
            "-v, --v",
            "--once",
        ] {
            assert!(help.contains(flag), "{flag} missing from help");
        }
        Cli::command().debug_assert();
    }
}
