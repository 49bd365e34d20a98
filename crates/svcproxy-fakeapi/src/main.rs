//! `svcproxy-fakeapi`: serves a generated cluster (see `svcproxy_fakeapi::scale`)
//! until killed. Prints "ready" on stdout once listening with every object stored.
//! With `--churn RATE`, SIGUSR1 starts a stream of endpoint changes
//! (`svcproxy_fakeapi::churn`) at RATE per second, applied to the served store, or
//! written to the `--manifests-out` directory when one is given.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use svcproxy_fakeapi::{churn, scale, FakeApiServer};

#[derive(Parser, Debug)]
#[command(
    name = "svcproxy-fakeapi",
    about = "A fake Kubernetes API server serving a generated cluster"
)]
struct Args {
    /// Address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Write a kubeconfig for this server here.
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
    /// Number of Services.
    #[arg(long, default_value_t = 0)]
    services: usize,
    /// Endpoints per Service (EndpointSlices of at most 100).
    #[arg(long, default_value_t = 10)]
    endpoints_per_service: usize,
    /// Number of Nodes.
    #[arg(long, default_value_t = 0)]
    nodes: usize,
    /// Bookmark interval of watches that allow bookmarks, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    bookmark_interval_ms: u64,
    /// Also write every object as a manifest file (`KIND-NAMESPACE-NAME.json`) in
    /// this directory; churn then rewrites the files (write and rename) instead of
    /// changing the served store.
    #[arg(long)]
    manifests_out: Option<PathBuf>,
    /// Endpoint changes per second, started by SIGUSR1 (0: none).
    #[arg(long, default_value_t = 0.0)]
    churn: f64,
    /// Stop churning after this many seconds (0: until killed).
    #[arg(long, default_value_t = 0)]
    churn_for: u64,
}

/// The history the store keeps while churning (etcd compacts too).
const CHURN_HISTORY: usize = 20_000;

fn file_name(obj: &serde_json::Value) -> String {
    let part = |v: &serde_json::Value| -> String {
        v.as_str()
            .unwrap_or("")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    format!(
        "{}-{}-{}.json",
        part(&obj["kind"]).to_lowercase(),
        part(&obj["metadata"]["namespace"]),
        part(&obj["metadata"]["name"])
    )
}

/// Writes `obj` into `dir` whole or not at all (a temporary file renamed over).
fn write_manifest(dir: &std::path::Path, obj: &serde_json::Value) -> anyhow::Result<()> {
    let name = file_name(obj);
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(obj)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join(&name))
        .with_context(|| format!("renaming {}", tmp.display()))?;
    Ok(())
}

/// Applies `churn`'s changes at `rate` per second for `duration` (None: forever),
/// to `server` or, with `dir`, to manifest files. Returns how many it made.
async fn run_churn(
    server: &FakeApiServer,
    mut churn: churn::Churn,
    rate: f64,
    duration: Option<Duration>,
    dir: Option<&std::path::Path>,
) -> anyhow::Result<u64> {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    // Late ticks are made up at once: the average rate is what was asked.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let start = tokio::time::Instant::now();
    let mut made = 0u64;
    while duration.is_none_or(|d| start.elapsed() < d) {
        tick.tick().await;
        let Some(slice) = churn.next_change(std::time::SystemTime::now()) else {
            break;
        };
        match dir {
            Some(dir) => write_manifest(dir, slice)?,
            None => {
                server.apply(slice.clone());
            }
        }
        made += 1;
        if made.is_multiple_of(1000) {
            server.trim_history(CHURN_HISTORY);
        }
    }
    Ok(made)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let server = FakeApiServer::start_on(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    server.set_bookmark_interval(Duration::from_millis(args.bookmark_interval_ms));
    let objects = scale::cluster(args.services, args.endpoints_per_service, args.nodes);
    let count = objects.len();
    if let Some(dir) = &args.manifests_out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for obj in &objects {
            write_manifest(dir, obj)?;
        }
    }
    let churn = (args.churn > 0.0).then(|| churn::Churn::new(&objects));
    for obj in objects {
        server.apply(obj);
    }
    // The seeding is not history anyone needs.
    server.compact();
    if let Some(path) = &args.kubeconfig_out {
        std::fs::write(path, server.kubeconfig_yaml())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    eprintln!(
        "svcproxy-fakeapi: serving {count} objects at {} (resourceVersion {})",
        server.url(),
        server.resource_version()
    );
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready")?;
        out.flush()?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())?;
    let churned = async {
        let Some(churn) = churn else {
            return std::future::pending().await;
        };
        usr1.recv().await;
        let duration = (args.churn_for > 0).then(|| Duration::from_secs(args.churn_for));
        eprintln!(
            "svcproxy-fakeapi: churning {} EndpointSlices at {}/s",
            churn.len(),
            args.churn
        );
        let started = std::time::Instant::now();
        let made = run_churn(
            &server,
            churn,
            args.churn,
            duration,
            args.manifests_out.as_deref(),
        )
        .await?;
        eprintln!(
            "svcproxy-fakeapi: churn done: {made} changes in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        std::future::pending::<anyhow::Result<()>>().await
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        r = churned => r?,
    }
    server.shutdown().await;
    Ok(())
}
