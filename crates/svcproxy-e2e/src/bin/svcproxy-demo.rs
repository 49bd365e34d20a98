//! The quickstart demo: a throwaway two-node cluster of network namespaces, svcproxy
//! in nftables mode on node-a from generated manifests, and real requests to a
//! ClusterIP and a NodePort showing the balancing and the client IP each backend saw.
//! Everything it creates is removed on every exit: success, error, a closed
//! output (`| head`: the demo stops and cleans up), and SIGINT, SIGTERM or SIGHUP
//! (the main thread, waiting for the demo's thread or a signal, removes this
//! process's namespaces and the processes in them, then exits).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use svcproxy_e2e::plan::{self, Family};
use svcproxy_e2e::{svcproxy_bin, BackendPorts, Cluster, ClusterSpec, Host, Proto, NODE_A};

const SERVICE_PORT: u16 = 80;
const TARGET_PORT: u16 = 8080;
const NODE_PORT: u16 = 30080;

/// svcproxy's live demo: a throwaway cluster of network namespaces (two nodes, four
/// backend pods, an external client), svcproxy in nftables mode on node-a, and 30
/// real connections each to a ClusterIP and to a NodePort, showing which backend
/// answered and which client address it saw. Run as root; everything it creates
/// is removed when it ends, however it ends.
#[derive(Parser)]
#[command(name = "svcproxy-demo")]
struct Args {}

/// Writes a line to stdout; an error (the reader went away) ends the demo,
/// which then cleans up as on any other error.
macro_rules! say {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout(), $($arg)*).context("writing to stdout")?
    };
}

/// How the demo ended.
enum End {
    Done(std::thread::Result<Result<()>>),
    Signal(i32),
}

fn main() -> ExitCode {
    Args::parse();
    if !nix_root() {
        eprintln!("svcproxy-demo: the demo builds network namespaces: run it as root");
        return ExitCode::FAILURE;
    }
    // The demo runs in a thread of its own; this one waits for it or for a
    // signal, and cleans up after either, so nothing the demo does (a panic
    // while its namespaces are being deleted under it) can end the process
    // before the cleanup has.
    let (tx, rx) = std::sync::mpsc::channel::<End>();
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
        Ok(mut signals) => {
            let tx = tx.clone();
            std::thread::spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    let _ = tx.send(End::Signal(sig));
                }
            });
        }
        Err(e) => {
            eprintln!("svcproxy-demo: installing the signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    }
    std::thread::spawn(move || {
        let _ = tx.send(End::Done(std::panic::catch_unwind(run)));
    });
    let end = rx.recv().unwrap_or(End::Signal(SIGTERM));
    // Whatever is left of this process's namespaces (and the processes in them).
    let clean = || {
        if let Err(e) = svcproxy_e2e::netns::delete_own() {
            let _ = writeln!(std::io::stderr(), "svcproxy-demo: cleaning up: {e:#}");
        }
    };
    match end {
        End::Done(Ok(Ok(()))) => ExitCode::SUCCESS,
        End::Done(Ok(Err(e))) => {
            clean();
            let _ = writeln!(std::io::stderr(), "svcproxy-demo: {e:#}");
            ExitCode::FAILURE
        }
        End::Done(Err(_)) => {
            clean();
            ExitCode::FAILURE
        }
        End::Signal(sig) => {
            let _ = writeln!(std::io::stderr(), "svcproxy-demo: interrupted; cleaning up");
            clean();
            std::process::exit(128 + sig);
        }
    }
}

fn run() -> Result<()> {
    svcproxy_e2e::cleanup_stale();
    let cluster = Cluster::create(ClusterSpec {
        nodes: 2,
        pods_per_node: 2,
        dual_stack: true,
        ext_via: NODE_A,
    })?;
    say!(
        "cluster: nodes node-a {} / node-b {}, external client {}",
        plan::node_ip(0, Family::V4),
        plan::node_ip(1, Family::V4),
        plan::ext_ip(Family::V4)
    );
    let _backends = cluster.start_backends(&BackendPorts {
        tcp: vec![TARGET_PORT],
        ..BackendPorts::default()
    })?;
    for p in cluster.pods() {
        say!(
            "  backend {} on {} at {}:{TARGET_PORT}",
            p.name,
            p.node_name,
            p.ipv4
        );
    }

    let dir = tempfile::tempdir()?;
    let manifests = manifests(&cluster);
    std::fs::write(dir.path().join("demo.yaml"), &manifests)?;
    say!(
        "\nmanifests ({}):\n{}",
        dir.path().join("demo.yaml").display(),
        indent(&manifests)
    );

    let bin = svcproxy_bin();
    let dir_arg = dir.path().to_string_lossy().to_string();
    let cidr = format!("{},{}", plan::CLUSTER_CIDR_V4, plan::CLUSTER_CIDR_V6);
    let proxy = cluster.spawn(
        Host::Node(NODE_A),
        "svcproxy",
        &[
            bin.to_str().context("binary path")?,
            "--proxy-mode",
            "nftables",
            "--manifests",
            &dir_arg,
            "--hostname-override",
            "node-a",
            "--cluster-cidr",
            &cidr,
            "--min-sync-period",
            "0s",
        ],
    )?;

    let cluster_ip: SocketAddr = (plan::cluster_ip(10, Family::V4), SERVICE_PORT).into();
    let node_port: SocketAddr = (plan::node_ip(0, Family::V4), NODE_PORT).into();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let a = cluster.probe(
            Host::Pod(0, 0),
            Proto::Tcp,
            cluster_ip,
            1,
            Duration::from_millis(500),
        );
        if a.iter().any(|a| a.backend().is_some()) {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "svcproxy did not program the rules in time:\n{}",
                proxy.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    show(
        &cluster,
        "pod-a0 (on node-a) -> ClusterIP",
        Host::Pod(0, 0),
        cluster_ip,
    )?;
    show(
        &cluster,
        "external client -> NodePort on node-a",
        Host::Ext,
        node_port,
    )?;
    say!("\nA pod's connection keeps its source IP, except when it reaches itself (hairpin,");
    say!("masqueraded to the node's gateway address); external traffic is masqueraded to");
    say!("node-a's address (externalTrafficPolicy Cluster) so replies come back through it.");

    let rules = cluster.exec_ok(
        Host::Node(NODE_A),
        &["nft", "list", "table", "ip", "svcproxy"],
    );
    say!(
        "\nnode-a's nftables table `ip svcproxy` has {} lines (svcproxy render prints it).",
        rules.lines().count()
    );
    drop(proxy);
    cluster.close()?;
    say!("cleaned up: every namespace and process of the demo is gone.");
    Ok(())
}

fn show(cluster: &Cluster, what: &str, from: Host, target: SocketAddr) -> Result<()> {
    let attempts = cluster.probe(from, Proto::Tcp, target, 30, Duration::from_secs(1));
    let mut by_backend: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
    for a in &attempts {
        let entry = by_backend.entry(a.label()).or_default();
        entry.0 += 1;
        if let Some(c) = a.client_seen() {
            let ip = c.ip().to_string();
            if !entry.1.contains(&ip) {
                entry.1.push(ip);
            }
        }
    }
    say!("\n{what} {target}: 30 connections");
    for (backend, (n, seen)) in by_backend {
        say!(
            "  {backend:<8} {n:>3} connections, saw client {}",
            seen.join(", ")
        );
    }
    Ok(())
}

fn manifests(cluster: &Cluster) -> String {
    let mut out = String::new();
    for node in 0..2 {
        out.push_str(&format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels: {{kubernetes.io/hostname: {name}, topology.kubernetes.io/zone: zone-{node}}}\nstatus:\n  addresses:\n  - {{type: InternalIP, address: \"{ip}\"}}\n---\n",
            name = plan::node_name(node),
            ip = plan::node_ip(node, Family::V4),
        ));
    }
    out.push_str(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: demo}}\nspec:\n  type: NodePort\n  clusterIP: {cip}\n  ports:\n  - {{name: http, port: {SERVICE_PORT}, targetPort: {TARGET_PORT}, nodePort: {NODE_PORT}}}\n---\n",
        cip = plan::cluster_ip(10, Family::V4),
    ));
    out.push_str("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: demo\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\n");
    out.push_str(&format!(
        "ports:\n- {{name: http, port: {TARGET_PORT}}}\nendpoints:\n"
    ));
    for p in cluster.pods() {
        out.push_str(&format!(
            "- {{addresses: [\"{}\"], nodeName: {}}}\n",
            p.ipv4, p.node_name
        ));
    }
    out
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("    {l}\n")).collect()
}

fn nix_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}
