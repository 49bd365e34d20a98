//! svcproxy: a Kubernetes Service proxy, a drop-in replacement for kube-proxy.
//!
//! The binary wires the layers together: flags and config file ([`config`]), sources
//! ([`sources`]) feeding the pure [`svcproxy_core::state::ClusterState`], the sync
//! loop ([`runner`]), and [`daemon`], which starts them with the HTTP servers and
//! hands each sync's snapshot to a [`svcproxy_sync::Target`]: the kernel (the mode's data
//! plane, resolved through the registry in `svcproxy_dataplane`) or a tool's
//! output. Subcommands are tools that read the same inputs without touching the
//! kernel (`snapshot`, `render`, `explain`) or that remove what svcproxy created
//! (`cleanup`).

mod alloc;
mod cli;
mod config;
mod daemon;
mod help;

mod owner;
mod runner;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

use alloc::limit_malloc_arenas;
use cli::{parse_from, print_version, Cli, Command, ExplainFormat, Format, Proto};

use config::explicitly_set_in;
use daemon::{Output, Servers};

/// When this process started (set first thing in `main`): what the start-up
/// metrics count from.
static STARTED: std::sync::OnceLock<std::time::SystemTime> = std::sync::OnceLock::new();

/// When this process started (now, for a caller that is not `main`'s).
pub(crate) fn process_started() -> std::time::SystemTime {
    *STARTED.get_or_init(std::time::SystemTime::now)
}

fn main() -> ExitCode {
    process_started();
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
    let command = cli.command.as_ref();
    let flags = match command {
        None => &cli.flags,
        Some(Command::Snapshot { flags, .. })
        | Some(Command::Explain { flags, .. })
        | Some(Command::Render { flags })
        | Some(Command::Dns { flags })
        | Some(Command::Cleanup { flags, .. }) => flags,
    };
    let explicitly_set = explicitly_set_in(sub_matches);
    let settings = match settings(flags, &explicitly_set, command) {
        Ok(s) => s,
        Err(code) => return code,
    };
    if let Some(path) = &settings.write_config_to {
        return write_config(&settings, path);
    }
    match run(command, settings, &explicitly_set) {
        Ok(result) => exit_code(result),
        Err(code) => code,
    }
}

/// The settings from the flags and config file, with logging started and the
/// warnings said (the rules' only for the commands that write or show rules).
/// `Err`: the exit code of a usage error, said.
fn settings(
    flags: &config::ProxyFlags,
    explicitly_set: &dyn Fn(&str) -> bool,
    command: Option<&Command>,
) -> Result<config::Settings, ExitCode> {
    let (settings, warnings) = match config::resolve(flags, explicitly_set) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("svcproxy: {}", error_text(&e));
            return Err(ExitCode::from(2));
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
    Ok(settings)
}

/// As kube-proxy's `--write-config-to`: the resolved configuration written, and
/// nothing else.
fn write_config(settings: &config::Settings, path: &std::path::Path) -> ExitCode {
    match config::effective::to_yaml(settings)
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
    }
}

/// The servers a tool serves: /healthz and /metrics only where their addresses
/// were given explicitly.
fn tool_servers(settings: &config::Settings, explicitly_set: &dyn Fn(&str) -> bool) -> Servers {
    let explicit = |id: &str, addr| explicitly_set(id).then_some(addr).flatten();
    Servers {
        healthz: explicit("healthz_bind_address", settings.healthz_bind),
        metrics: explicit("metrics_bind_address", settings.metrics_bind),
        health_check_node_ports: false,
    }
}

/// Runs the command (the proxy without one). `Err`: the exit code of a usage
/// error, said.
fn run(
    command: Option<&Command>,
    settings: config::Settings,
    explicitly_set: &dyn Fn(&str) -> bool,
) -> Result<anyhow::Result<daemon::Finished>, ExitCode> {
    Ok(match command {
        Some(Command::Snapshot { format, watch, .. }) => {
            let servers = if *watch {
                tool_servers(&settings, explicitly_set)
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
            let servers = tool_servers(&settings, explicitly_set);
            let mut settings = settings;
            settings.dns_bind = settings
                .dns_bind
                .or(Some(std::net::SocketAddr::from(([0, 0, 0, 0], 53))));
            daemon::run(settings, Output::Dns, servers)
        }
        Some(explain @ Command::Explain { format, live, .. }) => {
            let packet = explain_packet(explain).map_err(|e| {
                eprintln!("svcproxy: {e}");
                ExitCode::from(2)
            })?;
            let output = Output::Explain {
                packet,
                json: *format == ExplainFormat::Json,
                live: *live,
            };
            daemon::run(settings, output, Servers::default())
        }
        Some(Command::Cleanup {
            kube_proxy: true, ..
        }) => daemon::cleanup_kube_proxy().map(|()| daemon::Finished::Clean),
        Some(Command::Cleanup { .. }) => {
            daemon::cleanup(&settings.mode_options).map(|()| daemon::Finished::Clean)
        }
        None if settings.cleanup => {
            daemon::cleanup(&settings.mode_options).map(|()| daemon::Finished::Clean)
        }
        None => {
            let servers = Servers {
                healthz: settings.healthz_bind,
                metrics: settings.metrics_bind,
                health_check_node_ports: true,
            };
            daemon::run(settings, Output::Kernel, servers)
        }
    })
}

/// `explain`'s packet: from, to, protocol and origin as its flags say.
fn explain_packet(command: &Command) -> Result<svcproxy_plan::explain::Packet, String> {
    let Command::Explain {
        from,
        to,
        proto,
        from_node,
        from_pod,
        external,
        ..
    } = command
    else {
        return Err("not explain".to_string());
    };
    use svcproxy_plan::explain::Origin;
    let from = parse_from(from)?;
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
            Some(Origin::Node)
        } else if *from_pod {
            Some(Origin::LocalPod)
        } else if *external {
            Some(Origin::External)
        } else {
            None
        },
    })
}

/// The process's exit code for what the command returned (an error logged once).
fn exit_code(result: anyhow::Result<daemon::Finished>) -> ExitCode {
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

/// Whether `e`, or a cause of it, is the kernel refusing for want of privilege:
/// asked of the errors' own types, a sync's and the data plane's (which knows its
/// tools' words for it) and the system's.
pub(crate) fn permission_denied(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<svcproxy_sync::SyncError>()
            .is_some_and(svcproxy_sync::SyncError::permission_denied)
            || c.downcast_ref::<svcproxy_dataplane::DataPlaneError>()
                .is_some_and(svcproxy_dataplane::DataPlaneError::permission_denied)
            || c.downcast_ref::<std::io::Error>()
                .is_some_and(svcproxy_dataplane::is_permission_error)
    })
}

/// What to do about an error the kernel refused for want of privilege.
fn permission_hint(e: &anyhow::Error) -> Option<&'static str> {
    permission_denied(e).then_some(
        "svcproxy programs the kernel: run it as root, or with the capabilities the \
         DaemonSet grants (NET_ADMIN and NET_RAW, and BPF in the ebpf and ipvs modes; deploy/)",
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
