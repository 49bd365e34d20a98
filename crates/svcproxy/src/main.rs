//! svcproxy: a Kubernetes Service proxy, a drop-in replacement for kube-proxy.
//!
//! The binary wires the layers together: flags and config file ([`config`]), sources
//! ([`sources`]) feeding the pure [`svcproxy_core::state::ClusterState`], the sync
//! loop ([`runner`]), and [`daemon`], which starts them with the HTTP servers and
//! hands each sync's snapshot to a [`targets::Target`]: the kernel (the mode's data
//! plane, resolved through the registry in `svcproxy_dataplane`) or a tool's
//! output. Subcommands are tools that read the same inputs without touching the
//! kernel (`snapshot`, `render`, `explain`) or that remove what svcproxy created
//! (`cleanup`).

mod config;
mod daemon;
mod help;
mod http;
mod owner;
mod runner;
mod sources;
mod targets;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use config::{explicitly_set_in, ProxyFlags};
use daemon::{Output, Servers};

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
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    flags: ProxyFlags,
    /// Print the version, and the kube-proxy release whose behaviour svcproxy follows, then exit ('raw': as key: value lines).
    #[arg(long, value_name = "true|raw", num_args = 0..=1, require_equals = true,
          default_missing_value = "true")]
    version: Option<String>,
}

use config::KUBE_PROXY_RELEASE;

/// `--version`, as component-base's verflag: `true` (or no value) prints one line,
/// `raw` the details, `false` does nothing.
fn print_version(value: &str) -> Option<ExitCode> {
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
enum Command {
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
    /// Every mode's objects: its nftables tables and iptables chains; nothing else.
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
enum Format {
    Table,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ExplainFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Proto {
    Tcp,
    Udp,
    Sctp,
}

/// `--from` as an address (a port, with brackets for IPv6, is allowed and unused).
fn parse_from(s: &str) -> Result<std::net::IpAddr, String> {
    s.parse::<std::net::IpAddr>()
        .or_else(|_| s.parse::<std::net::SocketAddr>().map(|a| a.ip()))
        .map_err(|_| format!("--from {s:?}: not an IP address or IP:PORT"))
}

/// Hands the allocator's free pages back to the kernel. glibc keeps what a burst
/// freed (the initial list's parsed objects, a full sync's rendered rules) as its
/// own: at 10k services x 10 endpoints the daemon held 142 MiB resident for 51 MiB
/// in use, 93 MiB after this. Called after the syncs that follow a burst; a walk of
/// the heaps, a few milliseconds.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub(crate) fn release_free_memory() {
    // SAFETY: malloc_trim only returns free pages to the kernel; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn release_free_memory() {}

/// Heap arenas glibc may make: as many as threads parse manifests at once
/// (`sources::manifests::MAX_READERS`). glibc gives every thread that allocates an
/// arena of its own (up to eight per core), and memory freed in one arena is not
/// reused by another: with the tokio workers decoding lists while the state is
/// built, unlimited arenas held 20 MiB more at 100k endpoints. One arena made the
/// two threads parsing a cold start's manifests queue on its lock (2.5 s against
/// 1.0 s with two, 10k services); two cost the daemon about 6 MiB after its first
/// sync at 10k services through the API (mimalloc, tried instead, 19 MiB).
/// `MALLOC_ARENA_MAX` in the environment still wins.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn limit_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        let arenas = i32::try_from(sources::manifests::MAX_READERS).unwrap_or(1);
        // SAFETY: mallopt only tunes the allocator; no other thread exists yet.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_malloc_arenas() {}

fn main() -> ExitCode {
    limit_malloc_arenas();
    // As pflag: repeated list flags add up, any other repeated flag's last value
    // wins (a DaemonSet's args patched by appending must start unchanged).
    let matches = help::shape(Cli::command())
        .get_matches_from(config::flags::merge_list_flags(std::env::args_os()));
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if let Some(code) = cli.version.as_deref().and_then(print_version) {
        return code;
    }
    let sub_matches = matches.subcommand().map(|(_, m)| m).unwrap_or(&matches);
    let (flags, command) = match &cli.command {
        None => (&cli.flags, None),
        Some(Command::Snapshot { flags, .. })
        | Some(Command::Explain { flags, .. })
        | Some(Command::Render { flags })
        | Some(Command::Dns { flags })
        | Some(Command::Cleanup { flags, .. }) => (flags, cli.command.as_ref()),
    };
    let explicitly_set = explicitly_set_in(sub_matches);
    let (settings, warnings) = match config::resolve(flags, &explicitly_set) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("svcproxy: {}", error_text(&e));
            return ExitCode::from(2);
        }
    };
    init_logging(settings.verbosity, settings.log_format);
    // How rules would be written (the unset mode, how local traffic is told apart)
    // concerns the commands that write or show rules: the daemon, `render` and
    // `explain`; not `snapshot`, `dns` or a cleanup.
    let rules = match command {
        None => !settings.cleanup,
        Some(Command::Render { .. }) | Some(Command::Explain { .. }) => true,
        Some(_) => false,
    };
    for w in warnings
        .iter()
        .chain(settings.rule_warnings.iter().filter(|_| rules))
    {
        tracing::warn!("{w}");
    }
    if let Some(path) = &settings.write_config_to {
        // As kube-proxy: write the resolved configuration and exit, nothing else.
        return match config::effective::to_yaml(&settings)
            .and_then(|y| std::fs::write(path, y).map_err(anyhow::Error::from))
        {
            Ok(()) => {
                tracing::info!(file = %path.display(), "wrote the effective configuration");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("svcproxy: writing {}: {e:#}", path.display());
                ExitCode::FAILURE
            }
        };
    }
    let result = match command {
        Some(Command::Snapshot { format, watch, .. }) => {
            let explicit = |id: &str, addr| explicitly_set(id).then_some(addr).flatten();
            let servers = if *watch {
                Servers {
                    healthz: explicit("healthz_bind_address", settings.healthz_bind),
                    metrics: explicit("metrics_bind_address", settings.metrics_bind),
                    health_check_node_ports: false,
                }
            } else {
                Servers::default()
            };
            let output = Output::Snapshot {
                json: matches!(format, Format::Json),
                watch: *watch,
            };
            daemon::run(settings, output, servers)
        }
        Some(Command::Render { .. }) => daemon::run(settings, Output::Render, Servers::default()),
        Some(Command::Dns { .. }) => {
            let explicit = |id: &str, addr| explicitly_set(id).then_some(addr).flatten();
            let servers = Servers {
                healthz: explicit("healthz_bind_address", settings.healthz_bind),
                metrics: explicit("metrics_bind_address", settings.metrics_bind),
                health_check_node_ports: false,
            };
            let mut settings = settings;
            settings.dns_bind = settings
                .dns_bind
                .or(Some(std::net::SocketAddr::from(([0, 0, 0, 0], 53))));
            daemon::run(settings, Output::Dns, servers)
        }
        Some(Command::Explain {
            from,
            to,
            proto,
            from_node,
            from_pod,
            external,
            format,
            live,
            ..
        }) => {
            let packet = parse_from(from).and_then(|from| {
                let to = to
                    .parse::<std::net::SocketAddr>()
                    .map_err(|_| format!("--to {to:?}: not IP:PORT ([IPv6]:PORT)"))?;
                Ok(svcproxy_plan::explain::Packet {
                    from,
                    to,
                    protocol: match proto {
                        Proto::Tcp => svcproxy_core::model::Protocol::Tcp,
                        Proto::Udp => svcproxy_core::model::Protocol::Udp,
                        Proto::Sctp => svcproxy_core::model::Protocol::Sctp,
                    },
                    origin: if *from_node {
                        Some(svcproxy_plan::explain::Origin::Node)
                    } else if *from_pod {
                        Some(svcproxy_plan::explain::Origin::LocalPod)
                    } else if *external {
                        Some(svcproxy_plan::explain::Origin::External)
                    } else {
                        None
                    },
                })
            });
            match packet {
                Ok(packet) => daemon::run(
                    settings,
                    Output::Explain {
                        packet,
                        json: *format == ExplainFormat::Json,
                        live: *live,
                    },
                    Servers::default(),
                ),
                Err(e) => {
                    eprintln!("svcproxy: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        Some(Command::Cleanup {
            kube_proxy: true, ..
        }) => daemon::cleanup_kube_proxy().map(|()| daemon::Finished::Clean),
        Some(Command::Cleanup { .. }) => {
            daemon::cleanup(&settings.mode_flags).map(|()| daemon::Finished::Clean)
        }
        None if settings.cleanup => {
            daemon::cleanup(&settings.mode_flags).map(|()| daemon::Finished::Clean)
        }
        None => {
            let servers = Servers {
                healthz: settings.healthz_bind,
                metrics: settings.metrics_bind,
                health_check_node_ports: true,
            };
            daemon::run(settings, Output::Kernel, servers)
        }
    };
    match result {
        Ok(daemon::Finished::Clean) => ExitCode::SUCCESS,
        // The output lists the problems; the code lets a script tell.
        Ok(daemon::Finished::InputErrors) => ExitCode::from(EXIT_INPUT_ERRORS),
        Err(e) => {
            // Once: the log goes to stderr.
            let text = error_text(&e);
            match permission_hint(&e) {
                Some(hint) => tracing::error!("{text}\n  {hint}"),
                None => tracing::error!("{text}"),
            }
            ExitCode::FAILURE
        }
    }
}

/// `e` and its causes, each said once: a library error whose own text already ends
/// with its cause's (kube's, many io wrappers) would otherwise repeat it; and a
/// path quoted twice (`'"ca.crt"'`, a Debug-formatted path inside quotes) is quoted
/// once.
fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out.replace("'\"", "'").replace("\"'", "'")
}

/// What to do about an error the kernel refused for want of privilege.
fn permission_hint(e: &anyhow::Error) -> Option<&'static str> {
    let denied = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            .is_some_and(|n| n == libc::EPERM || n == libc::EACCES)
            || {
                let text = c.to_string();
                text.contains("Operation not permitted") || text.contains("Permission denied")
            }
    });
    denied.then_some(
        "svcproxy programs the kernel: run it as root, or with the capabilities the \
         DaemonSet grants (NET_ADMIN and NET_RAW; deploy/daemonset.yaml)",
    )
}

/// `snapshot`, `render` and `explain` ran, and the input had errors (objects or
/// fields rejected or ignored, documents that could not be read): listed in their
/// output. 1 is a failure to run; 2 a usage error.
const EXIT_INPUT_ERRORS: u8 = 3;

fn init_logging(verbosity: u32, format: config::LogFormat) {
    // klog-style -v: 0-2 info, 3-5 debug, 6+ trace. RUST_LOG wins when set.
    let level = match verbosity {
        0..=2 => "info",
        3..=5 => "debug",
        _ => "trace",
    };
    // hickory-proto warns about some messages it encodes or decodes (a client's
    // odd query among them): one line per query would flood the log. Its errors
    // still show; -v 6 shows the rest.
    let hickory = if verbosity >= 6 { level } else { "error" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{level},hickory_proto={hickory}"))
    });
    // Colour only on a terminal (`kubectl logs` of the DaemonSet is a file), and
    // never with NO_COLOR set (https://no-color.org).
    let colour = {
        use std::io::IsTerminal;
        std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match format {
        config::LogFormat::Text => builder.init(),
        // One object per line, the message and fields at the top level (as
        // kube-proxy's json format: ts, level, msg, and the key/value pairs).
        config::LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
