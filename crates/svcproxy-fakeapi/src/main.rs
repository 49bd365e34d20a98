//! `svcproxy-fakeapi`: serves a generated cluster (see `svcproxy_fakeapi::scale`)
//! until killed. Prints "ready" on stdout once listening with every object stored.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use svcproxy_fakeapi::{scale, FakeApiServer};

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
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    server.shutdown().await;
    Ok(())
}
