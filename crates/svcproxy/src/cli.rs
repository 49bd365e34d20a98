//! The command line: the proxy's flags, the subcommands and `--version`.

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::config::{self, ProxyFlags, KUBE_PROXY_RELEASE};

/// A Kubernetes Service proxy: a drop-in replacement for kube-proxy.
///
/// Without a subcommand, runs the proxy: watches Services, EndpointSlices and Nodes
/// and programs this node (in the --proxy-mode given) so that connections to Service
/// IPs and ports reach a ready backend. Flags are kube-proxy's where kube-proxy has
/// them. '-h' shows each flag in brief, '--help' in full, 'svcproxy COMMAND --help'
/// a command's own flags.
#[derive(Parser, Debug)]
#[command(
    name = "svcproxy",
    disable_version_flag = true,
    args_override_self = true
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
    #[command(flatten)]
    pub(crate) flags: ProxyFlags,
    /// Print the version, and the kube-proxy release whose behaviour svcproxy follows, then exit ('raw': as key: value lines).
    #[arg(long, value_name = "true|raw", num_args = 0..=1, require_equals = true,
          default_missing_value = "true")]
    pub(crate) version: Option<String>,
}

/// `--version`, as component-base's verflag: `true` (or no value) prints one line,
/// `raw` the details, `false` does nothing.
pub(crate) fn print_version(value: &str) -> Option<ExitCode> {
    let version = env!("CARGO_PKG_VERSION");
    match value {
        "raw" => {
            println!(
                "svcproxy: {version}\nkubeProxyCompatibility: {KUBE_PROXY_RELEASE}\n\
                 kubernetesApi: {}\nplatform: {}/{}",
                KUBE_PROXY_RELEASE,
                std::env::consts::OS,
                std::env::consts::ARCH
            );
            Some(ExitCode::SUCCESS)
        }
        v => match config::flags::parse_go_bool(v) {
            Ok(false) => None,
            Ok(true) => {
                println!("svcproxy {version} (kube-proxy {KUBE_PROXY_RELEASE} compatible)");
                Some(ExitCode::SUCCESS)
            }
            Err(_) => {
                eprintln!("svcproxy: --version: invalid value {v:?} (use true, false or raw)");
                Some(ExitCode::from(2))
            }
        },
    }
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Print what this node would do with every service port.
    ///
    /// Its addresses and the endpoints each kind of traffic may reach, after
    /// readiness, traffic policies and topology. Reads the same inputs as the proxy;
    /// touches nothing. Exits 3 when the input had errors.
    #[command(args_override_self = true)]
    Snapshot {
        /// `table` for people, `json` for scripts (a stable contract: see README).
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
        /// Keep watching the sources and print the snapshot again after every sync that
        /// changes it (JSON: one document per line). Serves /healthz and /metrics only
        /// when --healthz-bind-address / --metrics-bind-address are given explicitly.
        #[arg(long)]
        watch: bool,
        #[command(flatten)]
        flags: ProxyFlags,
    },
    /// Serve the cluster DNS only, from the same sources as the proxy.
    ///
    /// Kubernetes' DNS-based service discovery for --cluster-domain (A/AAAA, SRV,
    /// PTR, CNAME), over UDP and TCP on --dns-bind-address (default 0.0.0.0:53).
    /// Touches no rules. Serves /healthz and /metrics only when their addresses are
    /// given.
    #[command(args_override_self = true)]
    Dns {
        #[command(flatten)]
        flags: ProxyFlags,
    },
    /// Print what a full sync would write to the kernel, without writing it.
    ///
    /// In the mode --proxy-mode selects: nftables, the ruleset as `nft -f` input;
    /// iptables, the iptables-restore input of each family; userspace, the nftables
    /// rules that redirect service traffic to svcproxy's listeners. Exits 3 when the
    /// input had errors.
    #[command(args_override_self = true)]
    Render {
        #[command(flatten)]
        flags: ProxyFlags,
    },
    /// Follow one new connection through the rules this node would have.
    ///
    /// The frontend it hits, the firewall, the traffic policy and topology decision,
    /// the endpoints it may reach with their chances, masquerade and why, or why it
    /// is dropped, rejected or left alone. Reads the same inputs as the proxy;
    /// touches nothing. Exits 3 when the input had errors.
    #[command(args_override_self = true)]
    Explain {
        /// The client: IP, or IP:PORT (the port changes nothing in the rules).
        #[arg(long, value_name = "IP[:PORT]")]
        from: String,
        /// The destination: IP:PORT ([IPv6]:PORT).
        #[arg(long, value_name = "IP:PORT")]
        to: String,
        #[arg(long, value_enum, default_value_t = Proto::Tcp)]
        proto: Proto,
        /// The connection comes from this node itself.
        #[arg(long, group = "origin")]
        from_node: bool,
        /// The connection comes from a pod: traffic --detect-local-mode counts as local.
        #[arg(long, group = "origin")]
        from_pod: bool,
        /// The connection comes from outside this node. Without any of the three,
        /// the origin is told from --from: this node's addresses, its pods' CIDRs
        /// (with --detect-local-mode ClusterCIDR or NodeCIDR), else outside.
        #[arg(long, group = "origin")]
        external: bool,
        /// `text` for people, `json` for scripts (a stable contract: see README).
        #[arg(long, value_enum, default_value_t = ExplainFormat::Text)]
        format: ExplainFormat,
        /// Also read the rules this node's kernel holds (in the current network
        /// namespace; reading needs NET_ADMIN) and report where they differ from the
        /// plan, and kube-proxy's rules if installed.
        #[arg(long)]
        live: bool,
        #[command(flatten)]
        flags: ProxyFlags,
    },
    /// Remove everything svcproxy created in the kernel, and exit.
    ///
    /// Every mode's objects, and nothing else (the list follows from the modes).
    #[command(args_override_self = true)]
    Cleanup {
        /// Remove kube-proxy's leftovers instead (its iptables chains, its `kube-proxy`
        /// nftables tables, its IPVS interface, virtual servers and ipsets), as
        /// `kube-proxy --cleanup` does; refused while a kube-proxy process runs.
        #[arg(long)]
        kube_proxy: bool,
        #[command(flatten)]
        flags: ProxyFlags,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum Format {
    Table,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ExplainFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum Proto {
    Tcp,
    Udp,
    Sctp,
}

/// `--from` as an address (a port, with brackets for IPv6, is allowed and unused).
pub(crate) fn parse_from(s: &str) -> Result<std::net::IpAddr, String> {
    s.parse::<std::net::IpAddr>()
        .or_else(|_| s.parse::<std::net::SocketAddr>().map(|a| a.ip()))
        .map_err(|_| format!("--from {s:?}: not an IP address or IP:PORT"))
}
