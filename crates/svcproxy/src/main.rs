//! svcproxy: a Kubernetes Service proxy, a drop-in replacement for kube-proxy.
//!
//! The binary wires the layers together: flags and config file ([`config`]), sources
//! ([`sources`]) feeding the pure [`svcproxy_core::state::ClusterState`], the sync
//! runner ([`runner`]) and the data plane ([`proxy`]). Subcommands are tools that read
//! the same inputs without touching the kernel (`snapshot`, `render`) or that remove
//! what svcproxy created (`cleanup`).

mod config;
mod proxy;
mod runner;
mod sources;

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use svcproxy_core::report;
use svcproxy_core::state::{ClusterState, StateConfig};

use config::{explicitly_set_in, ProxyFlags, Settings};
use sources::manifests::ManifestDir;

/// A Kubernetes Service proxy: a drop-in replacement for kube-proxy.
///
/// Without a subcommand, runs the proxy: watches Services, EndpointSlices and Nodes
/// and programs this node's nftables so that connections to Service IPs and ports
/// reach a ready backend. Flags are kube-proxy's where kube-proxy has them.
#[derive(Parser, Debug)]
#[command(name = "svcproxy", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    flags: ProxyFlags,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print what this node would do with every service port: its addresses and the
    /// endpoints each kind of traffic may reach, after readiness, traffic policies and
    /// topology. Reads the same inputs as the proxy; touches nothing.
    Snapshot {
        /// `table` for people, `json` for scripts (a stable contract: see README).
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
        #[command(flatten)]
        flags: ProxyFlags,
    },
    /// Print the nftables ruleset a full sync would apply, without applying it.
    Render {
        #[command(flatten)]
        flags: ProxyFlags,
    },
    /// Remove everything svcproxy created in the kernel (its nftables tables) and exit.
    Cleanup {
        #[command(flatten)]
        flags: ProxyFlags,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    Table,
    Json,
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let sub_matches = matches.subcommand().map(|(_, m)| m).unwrap_or(&matches);
    let (flags, command) = match &cli.command {
        None => (&cli.flags, None),
        Some(Command::Snapshot { flags, .. })
        | Some(Command::Render { flags })
        | Some(Command::Cleanup { flags }) => (flags, cli.command.as_ref()),
    };
    let explicitly_set = explicitly_set_in(sub_matches);
    let (settings, warnings) = match config::resolve(flags, &explicitly_set) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("svcproxy: {e:#}");
            return ExitCode::from(2);
        }
    };
    init_logging(settings.verbosity);
    for w in &warnings {
        tracing::warn!("{w}");
    }
    let result = match command {
        Some(Command::Snapshot { format, .. }) => snapshot(&settings, *format),
        Some(Command::Render { .. }) => render(&settings),
        Some(Command::Cleanup { .. }) => proxy::cleanup(),
        None if settings.cleanup => proxy::cleanup(),
        None => proxy::run(settings),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("svcproxy: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(verbosity: u32) {
    // klog-style -v: 0-2 info, 3-5 debug, 6+ trace. RUST_LOG wins when set.
    let level = match verbosity {
        0..=2 => "info",
        3..=5 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// The state built from every source's initial list, and the manifests source (for
/// watching) if there is one.
pub(crate) fn initial_state(
    settings: &Settings,
) -> anyhow::Result<(ClusterState, Option<ManifestDir>)> {
    let mut state = ClusterState::new(StateConfig {
        node_name: settings.node_name.clone(),
        service_proxy_name: settings.service_proxy_name.clone(),
    });
    let Some(dir) = &settings.manifests else {
        if settings.kubeconfig.is_some() || settings.master.is_some() {
            bail!("the Kubernetes API source is not implemented yet; use --manifests DIR");
        }
        bail!("no source of Services: pass --manifests DIR");
    };
    let mut manifests = ManifestDir::new(dir.clone());
    let scan = manifests
        .rescan()
        .with_context(|| format!("reading manifests from {}", dir.display()))?;
    for e in &scan.errors {
        tracing::error!("{e}");
    }
    for update in scan.updates {
        state.apply(update);
    }
    Ok((state, Some(manifests)))
}

fn snapshot(settings: &Settings, format: Format) -> anyhow::Result<()> {
    let (mut state, _) = initial_state(settings)?;
    let update = state.snapshot();
    let all = state.problems();
    let problems: Vec<_> = all.values().flatten().collect();
    let snaps = [update.v4.as_ref(), update.v6.as_ref()];
    let text = match format {
        Format::Json => {
            let mut s = serde_json::to_string_pretty(&report::snapshot_json(&snaps, &problems))?;
            s.push('\n');
            s
        }
        Format::Table => report::snapshot_table(&snaps, &problems),
    };
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(())
}

fn render(settings: &Settings) -> anyhow::Result<()> {
    let (mut state, _) = initial_state(settings)?;
    let update = state.snapshot();
    let text = proxy::render(settings, &update)?;
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(())
}
