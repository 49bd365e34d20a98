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

/// The headings `--help` groups the flags under, in the order it shows them (the
/// order of the fields below); [`crate::help`] decides which commands show which.
/// The data planes' own flags are put under their mode's heading by the registry.
pub mod heading {
    pub const SOURCES: &str = "Where services come from";
    pub const ADDRESSES: &str = "Proxy mode and service addresses";
    pub const RULES: &str = "Rules";
    pub const SYNC: &str = "Syncing";
    pub const CONNTRACK: &str = "Conntrack (the node's settings)";
    pub const SERVERS: &str = "Health and metrics servers";
    pub const DNS: &str = "Cluster DNS (svcproxy only)";
    pub const LOGGING: &str = "Logging";
    pub const PROCESS: &str = "Process";
    pub const IGNORED: &str = "kube-proxy flags accepted without effect";
}

/// kube-proxy's command-line flags, plus svcproxy's own.
// Each field's clap id is its name; the resolver asks `explicitly_set` by that id (see
// CONFIG_MODELED_FLAGS). Plain comment: clap shows a doc comment here as the command's
// description when the parent has none.
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyFlags {
    /// Path to a KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1, YAML or JSON). As with kube-proxy, its values replace every flag it models; --hostname-override, --master, --cleanup, -v and svcproxy's own flags still apply.
    #[arg(long, value_name = "FILE", help_heading = heading::SOURCES)]
    pub config: Option<PathBuf>,

    /// Path to a kubeconfig file with the API server location and credentials. Default: in-cluster configuration.
    #[arg(long, value_name = "FILE", help_heading = heading::SOURCES)]
    pub kubeconfig: Option<PathBuf>,

    /// API server address; overrides the kubeconfig's server.
    #[arg(long, value_name = "URL", help_heading = heading::SOURCES)]
    pub master: Option<String>,

    /// Content type of requests sent to the API server.
    #[arg(
        long,
        value_name = "TYPE",
        default_value = "application/vnd.kubernetes.protobuf",
        help_heading = heading::SOURCES
    )]
    pub kube_api_content_type: String,

    /// Queries per second to the API server.
    #[arg(
        long,
        value_name = "QPS",
        default_value_t = 5.0,
        value_parser = parse_number,
        help_heading = heading::SOURCES
    )]
    pub kube_api_qps: f32,

    /// Burst of queries to the API server.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 10, value_parser = whole_number::<u32>(0, U32_MAX),
        help_heading = heading::SOURCES
    )]
    pub kube_api_burst: u32,

    /// kube-proxy's informer resync period (Go duration), checked as kube-proxy checks it (greater than 0); no effect in svcproxy, whose watches keep their state from the API server's events and resume from resource versions, with no periodic resync.
    #[arg(long, value_name = "DURATION", default_value = "15m", value_parser = parse_duration_arg, help_heading = heading::SOURCES)]
    pub config_sync_period: Duration,

    /// Name of the Node svcproxy runs on. Default: this host's name, lowercased. Wins over the config file's hostnameOverride, as in kube-proxy.
    #[arg(long, value_name = "NAME", help_heading = heading::SOURCES)]
    pub hostname_override: Option<String>,

    /// Handle only Services labelled service.kubernetes.io/service-proxy-name=NAME; default: only Services without that label, as kube-proxy (svcproxy only).
    #[arg(long, value_name = "NAME", help_heading = heading::SOURCES)]
    pub service_proxy_name: Option<String>,

    /// Read Services, EndpointSlices and Nodes from the manifests in DIR instead of the API server (svcproxy only).
    #[arg(long, value_name = "DIR", help_heading = heading::SOURCES)]
    pub manifests: Option<PathBuf>,

    /// With --manifests: rescan the whole directory this often even without filesystem events (the safety net for changes the watch cannot see); 0 disables (svcproxy only).
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_duration_arg, help_heading = heading::SOURCES)]
    pub manifests_rescan_period: Duration,

    /// Proxy mode: 'nftables', 'iptables', 'userspace' (svcproxy itself relays TCP and UDP, as kube-proxy's original mode), 'ebpf' (sockets translated at connect(), packets by tc programs) or 'ipvs' (the ebpf data plane with IPVS's schedulers and the ipvs mode's defaults; needs the KubeProxyIPVS gate, as kube-proxy). Unset (or empty): 'iptables' with a warning, as kube-proxy 1.37, whose default will change to 'nftables'. kube-proxy's Windows 'kernelspace' falls back to nftables with a warning.
    #[arg(
        long,
        value_name = "MODE",
        default_value = "",
        hide_default_value = true,
        help_heading = heading::ADDRESSES
    )]
    pub proxy_mode: String,

    /// The node IP svcproxy reports as its own (kube-proxy's historical name; no socket is bound to it). 0.0.0.0 or :: means "take it from the Node object".
    #[arg(
        long,
        value_name = "IP",
        default_value = "0.0.0.0",
        help_heading = heading::ADDRESSES
    )]
    pub bind_address: String,

    /// Node IPs that accept NodePort connections: comma-separated CIDRs and the keywords 'primary' (the Node object's primary IPs), 'localhost' (127.0.0.0/8, ::1/128) and 'all' (every address), in any combination (as kube-proxy 1.37). Default: 'primary' in nftables mode, 'all' in iptables mode.
    #[arg(long, value_name = "CIDRS,KEYWORDS", help_heading = heading::ADDRESSES)]
    pub nodeport_addresses: Option<String>,

    /// Serve NodePorts on loopback too. nftables mode: on 127.0.0.1 and ::1 through the userspace proxy's forwarder on loopback, no route_localnet (off by default, as upstream's nftables mode has none). userspace mode: on 127.0.0.1 and ::1 (on by default). iptables mode: overrides --iptables-localhost-nodeports (127.0.0.1 only, by the kernel's DNAT with route_localnet; on by default) (svcproxy only).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set, help_heading = heading::ADDRESSES)]
    pub nodeport_localhost: Option<bool>,

    /// iptables mode only: accept NodePort connections on 127.0.0.1 (IPv4), as kube-proxy does by default.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set, help_heading = heading::ADDRESSES)]
    pub iptables_localhost_nodeports: bool,

    /// Pod CIDR range(s) of the cluster: one CIDR or a comma-separated dual-stack pair. With --detect-local-mode=ClusterCIDR, traffic from it counts as local.
    #[arg(long, value_name = "CIDR[,CIDR]", help_heading = heading::RULES)]
    pub cluster_cidr: Option<String>,

    /// How to tell pod-originated (local) traffic: ClusterCIDR (default, also when empty), NodeCIDR, BridgeInterface or InterfaceNamePrefix.
    #[arg(
        long,
        value_name = "MODE",
        default_value = "",
        hide_default_value = true,
        help_heading = heading::RULES
    )]
    pub detect_local_mode: String,

    /// Bridge interface whose traffic is local, with --detect-local-mode=BridgeInterface.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "",
        hide_default_value = true,
        help_heading = heading::RULES
    )]
    pub pod_bridge_interface: String,

    /// Interface name prefix whose traffic is local, with --detect-local-mode=InterfaceNamePrefix.
    #[arg(
        long,
        value_name = "PREFIX",
        default_value = "",
        hide_default_value = true,
        help_heading = heading::RULES
    )]
    pub pod_interface_name_prefix: String,

    /// SNAT all traffic sent to Service cluster IPs (needed by some CNI plugins).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set, help_heading = heading::RULES)]
    pub masquerade_all: bool,

    /// Bit of the packet mark used to flag packets for SNAT, 0-31. svcproxy uses it in both modes (kube-proxy's nftables mode takes it from the config file only).
    #[arg(long, value_name = "BIT", default_value_t = 14,
          value_parser = whole_number::<u8>(0, 31), help_heading = heading::RULES)]
    pub iptables_masquerade_bit: u8,

    /// kube-proxy feature gates (Name=true,Other=false), checked as kube-proxy 1.37 checks them: every Kubernetes 1.37 gate is known, an unknown gate or a locked one set against its lock is refused, a GA or deprecated one warns. KubeProxyIPVS (off: 'ipvs' is refused), KubeProxyNFTablesLocalhostNodePorts (nftables mode serves NodePorts on loopback when --nodeport-addresses names it) and AllowServiceExternalIPs (off: spec.externalIPs are not served) take effect; the others change nothing here (docs/configuration.md).
    #[arg(long, value_name = "NAME=BOOL,...", help_heading = heading::RULES)]
    pub feature_gates: Option<String>,

    /// Minimum time between rule syncs (Go duration: 500ms, 1s, 1m30s). 0 syncs on every change. svcproxy's mode-neutral name: kube-proxy's are --iptables-min-sync-period and --ipvs-min-sync-period (below), which win when given.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration_arg, help_heading = heading::SYNC)]
    pub min_sync_period: Duration,

    /// Maximum time between full resyncs of the rules (Go duration). Must be greater than 0. svcproxy's mode-neutral name: kube-proxy's are --iptables-sync-period and --ipvs-sync-period (below), which win when given.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration_arg, help_heading = heading::SYNC)]
    pub sync_period: Duration,

    /// kube-proxy's name for --min-sync-period outside ipvs mode (wins over it when both are given).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg, help_heading = heading::SYNC)]
    pub iptables_min_sync_period: Option<Duration>,

    /// kube-proxy's name for --sync-period outside ipvs mode (wins over it when both are given).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg, help_heading = heading::SYNC)]
    pub iptables_sync_period: Option<Duration>,

    /// --min-sync-period when --proxy-mode is ipvs (which svcproxy runs as nftables), as kube-proxy.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg, help_heading = heading::SYNC)]
    pub ipvs_min_sync_period: Option<Duration>,

    /// --sync-period when --proxy-mode is ipvs (which svcproxy runs as nftables), as kube-proxy.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg, help_heading = heading::SYNC)]
    pub ipvs_sync_period: Option<Duration>,

    /// Sync once, then exit (svcproxy only).
    #[arg(long, help_heading = heading::SYNC)]
    pub once: bool,

    /// Conntrack entries to allow per CPU core (0 leaves the limit as it is and ignores --conntrack-min).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 32768, value_parser = whole_number::<u32>(0, U32_MAX),
        help_heading = heading::CONNTRACK
    )]
    pub conntrack_max_per_core: u32,

    /// Minimum conntrack table size, whatever --conntrack-max-per-core gives.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 131072, value_parser = whole_number::<u32>(0, U32_MAX),
        help_heading = heading::CONNTRACK
    )]
    pub conntrack_min: u32,

    /// Idle timeout of established TCP conntrack entries (0 leaves it as it is).
    #[arg(long, value_name = "DURATION", default_value = "24h0m0s", value_parser = parse_duration_arg, help_heading = heading::CONNTRACK)]
    pub conntrack_tcp_timeout_established: Duration,

    /// Timeout of TCP conntrack entries in CLOSE_WAIT (0 leaves it as it is).
    #[arg(long, value_name = "DURATION", default_value = "1h0m0s", value_parser = parse_duration_arg, help_heading = heading::CONNTRACK)]
    pub conntrack_tcp_timeout_close_wait: Duration,

    /// Run conntrack in liberal mode: out-of-window TCP packets are not marked INVALID.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set, help_heading = heading::CONNTRACK)]
    pub conntrack_tcp_be_liberal: bool,

    /// Idle timeout of UNREPLIED UDP conntrack entries (0 leaves it as it is).
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_duration_arg, help_heading = heading::CONNTRACK)]
    pub conntrack_udp_timeout: Duration,

    /// Idle timeout of ASSURED UDP conntrack entries (0 leaves it as it is).
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_duration_arg, help_heading = heading::CONNTRACK)]
    pub conntrack_udp_timeout_stream: Duration,

    /// Health check server address: IP:PORT, or an IP meaning port 10256. Empty disables it.
    #[arg(
        long,
        value_name = "IP[:PORT]",
        default_value = "0.0.0.0:10256",
        help_heading = heading::SERVERS
    )]
    pub healthz_bind_address: String,

    /// Deprecated (kube-proxy too): the health server's port when --healthz-bind-address has none; 0 disables the server.
    #[arg(long, value_name = "PORT", value_parser = whole_number::<u16>(0, 65535), help_heading = heading::SERVERS)]
    pub healthz_port: Option<u16>,

    /// Metrics server address: IP:PORT, or an IP meaning port 10249. Empty disables it.
    #[arg(
        long,
        value_name = "IP[:PORT]",
        default_value = "127.0.0.1:10249",
        help_heading = heading::SERVERS
    )]
    pub metrics_bind_address: String,

    /// Deprecated (kube-proxy too): the metrics server's port when --metrics-bind-address has none; 0 disables the server.
    #[arg(long, value_name = "PORT", value_parser = whole_number::<u16>(0, 65535), help_heading = heading::SERVERS)]
    pub metrics_port: Option<u16>,

    /// Exit when the health or metrics server cannot bind its address; otherwise the failure is logged and the bind retried every 5s (as kube-proxy).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set, help_heading = heading::SERVERS)]
    pub bind_address_hard_fail: bool,

    /// Also serve the cluster DNS (Kubernetes' DNS-based service discovery for --cluster-domain) on IP:PORT, UDP and TCP; `svcproxy dns` serves it alone, on 0.0.0.0:53 unless this says otherwise (svcproxy only).
    #[arg(long, value_name = "IP:PORT", help_heading = heading::DNS)]
    pub dns_bind_address: Option<std::net::SocketAddr>,

    /// The cluster domain the DNS answers for (svcproxy only).
    #[arg(
        long,
        value_name = "DOMAIN",
        default_value = "cluster.local",
        help_heading = heading::DNS
    )]
    pub cluster_domain: String,

    /// Resolvers the DNS relays other names to: comma-separated IP or IP:PORT, or 'none' to refuse names outside the cluster domain; default: the nameservers of /etc/resolv.conf (svcproxy only).
    #[arg(long, value_name = "IP[:PORT],...|none", value_delimiter = ',', value_parser = parse_dns_upstream, help_heading = heading::DNS)]
    pub dns_upstream: Vec<Option<std::net::SocketAddr>>,

    /// Every client of the DNS runs on this node (the node-local deployment): a headless Service that opts into topology (svcproxy.io/topology-keys, trafficDistribution, hints) is answered with the endpoints this node's proxy would choose; without it every ready endpoint is answered (svcproxy only).
    #[arg(long, help_heading = heading::DNS)]
    pub dns_node_local: bool,

    /// How a new connection's endpoint is chosen, for every Service without its own svcproxy.io/scheduler annotation: 'random', or IPVS's 'rr' (in turn), 'sh' (source hash), 'dh' (destination hash), 'mh' (Maglev: the same choice for a flow on every node), 'wrr' (in turn by weight), 'lc' (fewest live connections), 'wlc', 'sed', 'nq' (lc's weighted kin); weights from a Service's svcproxy.io/endpoint-weights. ebpf and ipvs modes only (the other modes choose at random); in ipvs mode --ipvs-scheduler (or ipvs.scheduler) wins, and the default is 'rr'. Default in ebpf mode: 'random' (svcproxy only).
    #[arg(long, value_name = "NAME", help_heading = heading::ADDRESSES)]
    pub scheduler: Option<String>,

    /// The Maglev table's size (cells) of every Service scheduled by 'mh' without its own svcproxy.io/maglev-table-size annotation: one of the primes 251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071, at least 100 times the largest endpoint count for an even spread (Maglev's rule). The size stays whatever the endpoints, so that one endpoint more or less moves few flows; give every node the same, so that they choose alike. ebpf and ipvs modes (svcproxy only).
    #[arg(long, value_name = "CELLS", default_value_t = svcproxy_core::model::DEFAULT_MAGLEV_TABLE_SIZE,
          value_parser = |s: &str| svcproxy_core::model::parse_maglev_table_size(s), help_heading = heading::ADDRESSES)]
    pub maglev_table_size: u32,

    /// Answer each client address at most this many DNS queries per second (over UDP the rest get an empty truncated answer, over TCP REFUSED); 0: no limit (svcproxy only).
    #[arg(
        long,
        value_name = "QPS",
        default_value_t = 0, value_parser = whole_number::<u32>(0, U32_MAX),
        help_heading = heading::DNS
    )]
    pub dns_rate_limit: u32,

    /// With --dns-rate-limit: the queries a client may send at once; 0: twice the rate (svcproxy only).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = whole_number::<u32>(0, U32_MAX), help_heading = heading::DNS)]
    pub dns_rate_limit_burst: u32,

    /// The time to live of the DNS's records, in whole seconds (svcproxy only).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration_arg, help_heading = heading::DNS)]
    pub dns_ttl: Duration,

    /// Log verbosity, as kube-proxy's --v / -v (0 = important messages only, 4 = debug, 5+ = trace). Wins over the config file's logging.verbosity.
    #[arg(
        short = 'v',
        long = "v",
        value_name = "LEVEL",
        default_value_t = 0, value_parser = whole_number::<u32>(0, U32_MAX),
        help_heading = heading::LOGGING
    )]
    pub v: u32,

    /// Log format: 'text' (the default) or 'json' (one JSON object per line, as kube-proxy's json format).
    #[arg(
        long,
        value_name = "FORMAT",
        default_value = "text",
        help_heading = heading::LOGGING
    )]
    pub logging_format: String,

    /// Remove every rule svcproxy (or kube-proxy, in the selected mode) installed, then exit.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set, help_heading = heading::PROCESS)]
    pub cleanup: bool,

    /// Prepare the node (the sysctls the proxy mode and the conntrack settings need) and exit, without programming any rule: run it with full privileges, then the proxy with only NET_ADMIN.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set, help_heading = heading::PROCESS)]
    pub init_only: bool,

    /// The proxy process's OOM score adjustment, -1000..1000 (as kube-proxy, -999 by default).
    #[arg(long, value_name = "N", default_value_t = -999, allow_hyphen_values = true,
          value_parser = whole_number::<i32>(-1000, 1000), help_heading = heading::PROCESS)]
    pub oom_score_adj: i32,

    /// Write the effective configuration (flags or --config resolved, as a KubeProxyConfiguration in YAML) to FILE and exit.
    #[arg(long, value_name = "FILE", help_heading = heading::PROCESS)]
    pub write_config_to: Option<PathBuf>,

    // The data planes' own flags (each mode declares its group).
    #[command(flatten)]
    pub mode: super::mode_flags::ModeFlags,

    #[command(flatten)]
    pub ignored: IgnoredFlags,
}

/// kube-proxy flags that have no effect in svcproxy (IPVS, Go runtime, klog output
/// tuning, flags removed upstream): accepted so that a kube-proxy command line starts
/// unchanged, each reported by one warning ([`IgnoredFlags::warnings`]). Values are
/// still checked as kube-proxy checks them (a bad duration is an error).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct IgnoredFlags {
    /// Go's pprof handlers; svcproxy has none. Ignored.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_go_bool, help_heading = IGNORED)]
    pub profiling: Option<bool>,
    /// Ignored: svcproxy hides no metrics.
    #[arg(long, value_name = "VERSION", help_heading = IGNORED)]
    pub show_hidden_metrics_for_version: Option<String>,
    /// ipvs mode: the scheduler of every Service without its own (rr, wrr, sh, dh, mh, lc, wlc, sed, nq; empty: rr), as --scheduler. Ignored in the other modes.
    #[arg(long, value_name = "NAME", help_heading = heading::ADDRESSES)]
    pub ipvs_scheduler: Option<String>,
    /// IPVS only: svcproxy makes no IPVS virtual servers, so has none to keep. Ignored.
    #[arg(long, value_name = "CIDRS", help_heading = IGNORED)]
    pub ipvs_exclude_cidrs: Option<String>,
    /// IPVS only: svcproxy binds no service address to an interface, so has no ARP reply to restrict. Ignored.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_go_bool, help_heading = IGNORED)]
    pub ipvs_strict_arp: Option<bool>,
    /// ipvs mode: how long the packet path keeps an idle established TCP connection (0: no idle timeout). Ignored in the other modes.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg, help_heading = heading::ADDRESSES)]
    pub ipvs_tcp_timeout: Option<Duration>,
    /// ipvs mode: how long the packet path keeps an idle TCP connection after a FIN or RST (0: no idle timeout). Ignored in the other modes.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg, help_heading = heading::ADDRESSES)]
    pub ipvs_tcpfin_timeout: Option<Duration>,
    /// ipvs mode: how long the packet path keeps an idle UDP flow's endpoint; past it the next datagram is scheduled afresh (0: no idle timeout). Ignored in the other modes.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg, help_heading = heading::ADDRESSES)]
    pub ipvs_udp_timeout: Option<Duration>,
    /// Removed upstream. Ignored.
    #[arg(long, value_name = "NAME", hide = true)]
    pub resource_container: Option<String>,
    /// klog per-file verbosity (pattern=N,...); svcproxy's log levels are per message. Ignored.
    #[arg(long, value_name = "PATTERN=N,...", help_heading = IGNORED)]
    pub vmodule: Option<String>,
    /// svcproxy writes every log line at once. Ignored.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg, help_heading = IGNORED)]
    pub log_flush_frequency: Option<Duration>,
    /// Ignored: every log line goes to stderr.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_go_bool, help_heading = IGNORED)]
    pub log_text_split_stream: Option<bool>,
    /// Ignored.
    #[arg(long, value_name = "SIZE", help_heading = IGNORED)]
    pub log_text_info_buffer_size: Option<String>,
    /// Ignored: every log line goes to stderr.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_go_bool, help_heading = IGNORED)]
    pub log_json_split_stream: Option<bool>,
    /// Ignored.
    #[arg(long, value_name = "SIZE", help_heading = IGNORED)]
    pub log_json_info_buffer_size: Option<String>,
    // klog's own flags, removed from kube-proxy in 1.26 but still in older manifests.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = parse_go_bool, hide = true)]
    pub logtostderr: Option<bool>,
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = parse_go_bool, hide = true)]
    pub alsologtostderr: Option<bool>,
    #[arg(long, hide = true)]
    pub log_dir: Option<String>,
    #[arg(long, hide = true)]
    pub log_file: Option<String>,
    #[arg(long, value_parser = clap::value_parser!(u64), hide = true)]
    pub log_file_max_size: Option<u64>,
    #[arg(long, hide = true)]
    pub log_backtrace_at: Option<String>,
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = parse_go_bool, hide = true)]
    pub skip_headers: Option<bool>,
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = parse_go_bool, hide = true)]
    pub skip_log_headers: Option<bool>,
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = parse_go_bool, hide = true)]
    pub one_output: Option<bool>,
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = parse_go_bool, hide = true)]
    pub add_dir_header: Option<bool>,
    #[arg(long, hide = true)]
    pub stderrthreshold: Option<String>,
}

const IGNORED: &str = heading::IGNORED;

/// Why `--ipvs-exclude-cidrs` (`ipvs.excludeCIDRs`) is ignored.
pub const IPVS_EXCLUDE_CIDRS: &str =
    "svcproxy makes no IPVS virtual servers, so it has none to keep from deletion";
/// Why `--ipvs-strict-arp` (`ipvs.strictARP`) is ignored.
pub const IPVS_STRICT_ARP: &str = "svcproxy binds no service address to an interface (there \
     is no kube-ipvs0), so it has no ARP reply to restrict";

impl IgnoredFlags {
    /// One warning per flag given, naming it and why it has no effect.
    pub fn warnings(&self) -> Vec<String> {
        let klog = "svcproxy's logger has no such setting (every line goes to stderr at once)";
        let given: [(&str, bool, &str); 22] = [
            (
                "--profiling",
                self.profiling.is_some(),
                "svcproxy has no pprof handlers",
            ),
            (
                "--show-hidden-metrics-for-version",
                self.show_hidden_metrics_for_version.is_some(),
                "svcproxy hides no metrics",
            ),
            (
                "--ipvs-exclude-cidrs",
                self.ipvs_exclude_cidrs.is_some(),
                IPVS_EXCLUDE_CIDRS,
            ),
            (
                "--ipvs-strict-arp",
                self.ipvs_strict_arp.is_some(),
                IPVS_STRICT_ARP,
            ),
            (
                "--resource-container",
                self.resource_container.is_some(),
                "removed upstream",
            ),
            (
                "--vmodule",
                self.vmodule.is_some(),
                "svcproxy's log levels are per message, not per file (use -v)",
            ),
            (
                "--log-flush-frequency",
                self.log_flush_frequency.is_some(),
                klog,
            ),
            (
                "--log-text-split-stream",
                self.log_text_split_stream.is_some(),
                klog,
            ),
            (
                "--log-text-info-buffer-size",
                self.log_text_info_buffer_size.is_some(),
                klog,
            ),
            (
                "--log-json-split-stream",
                self.log_json_split_stream.is_some(),
                klog,
            ),
            (
                "--log-json-info-buffer-size",
                self.log_json_info_buffer_size.is_some(),
                klog,
            ),
            ("--logtostderr", self.logtostderr.is_some(), klog),
            ("--alsologtostderr", self.alsologtostderr.is_some(), klog),
            ("--log-dir", self.log_dir.is_some(), klog),
            ("--log-file", self.log_file.is_some(), klog),
            (
                "--log-file-max-size",
                self.log_file_max_size.is_some(),
                klog,
            ),
            ("--log-backtrace-at", self.log_backtrace_at.is_some(), klog),
            ("--skip-headers", self.skip_headers.is_some(), klog),
            ("--skip-log-headers", self.skip_log_headers.is_some(), klog),
            ("--one-output", self.one_output.is_some(), klog),
            ("--add-dir-header", self.add_dir_header.is_some(), klog),
            ("--stderrthreshold", self.stderrthreshold.is_some(), klog),
        ];
        given
            .into_iter()
            .filter(|(_, set, _)| *set)
            .map(|(flag, _, why)| format!("{flag}: accepted for compatibility, no effect: {why}"))
            .collect()
    }
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
    ("iptables_sync_period", "--iptables-sync-period"),
    ("iptables_min_sync_period", "--iptables-min-sync-period"),
    ("ipvs_sync_period", "--ipvs-sync-period"),
    ("ipvs_min_sync_period", "--ipvs-min-sync-period"),
    ("healthz_port", "--healthz-port"),
    ("metrics_port", "--metrics-port"),
    ("oom_score_adj", "--oom-score-adj"),
    ("bind_address_hard_fail", "--bind-address-hard-fail"),
];

/// kube-proxy's flags whose repetitions add up, as pflag's string slices and maps do
/// (`--nodeport-addresses=A --nodeport-addresses=B` is `A,B`); every other flag
/// repeated takes its last value, as pflag does (the parser's `args_override_self`).
pub const LIST_FLAGS: [&str; 3] = [
    "--nodeport-addresses",
    "--ipvs-exclude-cidrs",
    "--feature-gates",
];

/// `arg` with the `_` of a long flag's name read as `-`, as kube-proxy's parser
/// does (component-base's word-separator normalisation: `--hostname_override` is
/// `--hostname-override`); a value after `=` is left alone.
fn normalize_flag_name(arg: std::ffi::OsString) -> std::ffi::OsString {
    let Some(text) = arg.to_str() else {
        return arg;
    };
    let Some(rest) = text.strip_prefix("--") else {
        return arg;
    };
    let (name, value) = match rest.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (rest, None),
    };
    if !name.contains('_') {
        return arg;
    }
    let name = name.replace('_', "-");
    match value {
        Some(v) => format!("--{name}={v}").into(),
        None => format!("--{name}").into(),
    }
}

/// `args` with each of [`LIST_FLAGS`] given once, where it first appeared, with the
/// values of all its occurrences joined by commas (`--flag=V` and `--flag V` forms),
/// and `_` in long flags' names read as `-` ([`normalize_flag_name`]).
/// Everything after `--` is left alone.
pub fn merge_list_flags(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let mut out: Vec<std::ffi::OsString> = Vec::new();
    // Per list flag: its index in `out` and the values so far.
    let mut seen: Vec<(&str, usize, Vec<String>)> = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let Some(text) = arg.to_str().map(str::to_string) else {
            out.push(arg);
            continue;
        };
        let arg = normalize_flag_name(arg);
        let text = arg.to_str().map(str::to_string).unwrap_or(text);
        if text == "--" {
            out.push(arg);
            out.extend(args);
            break;
        }
        let found = LIST_FLAGS.iter().find_map(|&flag| {
            if text == flag {
                Some((flag, None))
            } else {
                text.strip_prefix(flag)
                    .and_then(|rest| rest.strip_prefix('='))
                    .map(|v| (flag, Some(v.to_string())))
            }
        });
        let Some((flag, value)) = found else {
            out.push(arg);
            continue;
        };
        let value = match value {
            Some(v) => v,
            None => match args.next() {
                Some(next) => match next.into_string() {
                    Ok(v) => v,
                    Err(raw) => {
                        // Not text: leave both to the parser, which will say so.
                        out.push(arg);
                        out.push(raw);
                        continue;
                    }
                },
                // A flag without its value: the parser reports it.
                None => {
                    out.push(arg);
                    continue;
                }
            },
        };
        match seen.iter_mut().find(|(f, _, _)| *f == flag) {
            Some((_, _, values)) => values.push(value),
            None => {
                seen.push((flag, out.len(), vec![value]));
                out.push(std::ffi::OsString::new());
            }
        }
    }
    for (flag, at, values) in seen {
        let joined: Vec<&str> = values
            .iter()
            .map(|v| v.as_str())
            .filter(|v| !v.is_empty())
            .collect();
        out[at] = format!("{flag}={}", joined.join(",")).into();
    }
    out
}

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

pub use svcproxy_core::go_syntax::{parse_duration_arg, parse_go_bool};
use svcproxy_core::go_syntax::{parse_number, whole_number};

/// The largest u32, as the i64 [`whole_number`] takes.
const U32_MAX: i64 = u32::MAX as i64;

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

/// `--dns-upstream`'s values: IP, or IP:PORT ([IPv6]:PORT), port 53 by default;
/// `none` is `None`.
fn parse_dns_upstream(s: &str) -> Result<Option<std::net::SocketAddr>, String> {
    if s == "none" {
        return Ok(None);
    }
    svcproxy_dns::upstream::parse_upstream(s)
        .map(Some)
        .ok_or_else(|| format!("{s:?}: not IP or IP:PORT ([IPv6]:PORT), nor 'none'"))
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

    #[test]
    fn repeated_list_flags_add_up_as_pflag_slices_and_maps() {
        let args = |v: &[&str]| -> Vec<std::ffi::OsString> { v.iter().map(Into::into).collect() };
        assert_eq!(
            merge_list_flags(args(&[
                "svcproxy",
                "--nodeport-addresses=10.0.0.0/8",
                "--v=2",
                "--feature-gates",
                "A=true",
                "--nodeport-addresses",
                "192.168.0.0/16,fd00::/8",
                "--feature-gates=B=false",
                "--",
                "--feature-gates=C=true",
            ])),
            args(&[
                "svcproxy",
                "--nodeport-addresses=10.0.0.0/8,192.168.0.0/16,fd00::/8",
                "--v=2",
                "--feature-gates=A=true,B=false",
                "--",
                "--feature-gates=C=true",
            ])
        );
        // Not a list flag, or not this flag: untouched.
        let plain = args(&[
            "svcproxy",
            "--cluster-cidr=a",
            "--cluster-cidr=b",
            "--nodeport-addresses-x=1",
        ]);
        assert_eq!(merge_list_flags(plain.clone()), plain);
        // A trailing flag without its value is left for the parser to report.
        assert_eq!(
            merge_list_flags(args(&["svcproxy", "--feature-gates"])),
            args(&["svcproxy", "--feature-gates"])
        );
    }

    #[test]
    fn underscores_in_flag_names_read_as_dashes_as_kube_proxy_reads_them() {
        let args = |v: &[&str]| -> Vec<std::ffi::OsString> { v.iter().map(Into::into).collect() };
        assert_eq!(
            merge_list_flags(args(&[
                "svcproxy",
                "--hostname_override=node_a",
                "--cluster_cidr",
                "10.0.0.0/8",
                "--feature_gates=A=true",
                "--feature-gates=B=false",
                "--",
                "--not_a_flag",
            ])),
            args(&[
                "svcproxy",
                "--hostname-override=node_a",
                "--cluster-cidr",
                "10.0.0.0/8",
                "--feature-gates=A=true,B=false",
                "--",
                "--not_a_flag",
            ])
        );
    }
}
