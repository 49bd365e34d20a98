//! eBPF socket-LB benchmark (ignored by default: a benchmark, not a timed test).
//! Connections from a pod's namespace to a ClusterIP, in the same run:
//!
//! - `floor`: the client connects straight to an endpoint's address;
//! - `ebpf`: the client is in the cgroup the socket programs attach to, and its
//!   connect() is translated to an endpoint from the maps;
//! - `nftables`, `iptables`: the mode's rules in the client's namespace DNAT the
//!   connection (the nat lookup and conntrack a pod's connection meets on a node);
//!
//! - `ebpf-rr`, `ebpf-mh`, `ebpf-lc`: the ebpf row with that scheduler (issue 34:
//!   the per-connection cost of a scheduler against `ebpf`'s random choice; with
//!   `BENCH_MEASURED_ENDPOINTS=2`, `lc` compares two counts);
//!
//! each with 1 service and with `BENCH_SERVICES` (default 30,000) services × 10
//! endpoints (the measured one among them, whose endpoint is the floor's address;
//! `BENCH_MEASURED_ENDPOINTS=2` adds a second address of the backend), `BENCH_REPEAT` (default 3) times in
//! turn; each figure is the median of its runs. The client is `svcproxy-loadgen
//! connect` (8 threads, each connect, a 32-byte request echoed, close) pinned to
//! CPU 0, the server to CPU 1. Prints connections per second and the p50/p99 of a
//! whole connection, each as a ratio to the floor, and the ebpf mode's sync times
//! (full at the large size, and one service added to it).
//!
//! `cargo test --release -p svcproxy-e2e --test bench_ebpf -- --ignored --nocapture`
//! (root; `ip`, `nft`, `iptables`, `taskset`).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use svcproxy_core::objects::{Kind, ObjectKey, SourceUpdate};
use svcproxy_core::state::{ClusterState, StateConfig};
use svcproxy_dataplane::iptables::{IptablesCommands, IptablesDataPlane};
use svcproxy_dataplane::{DataPlane, EbpfDataPlane, NftCommand, NftDataPlane};
use svcproxy_e2e::nodeport_bench::{env, median};
use svcproxy_e2e::{ebpf_options, loadgen_bin, Confinement, NsProcess};
use svcproxy_plan::{LocalDetection, PlanConfig};
use svcproxy_sync::Driver;
use svcproxy_testkit::netns::{self, NsSet};

const VIP: &str = "198.19.0.1:80";

/// The service the partial sync adds.
const EXTRA: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: extra, namespace: bench}\nspec:\n  clusterIP: 198.18.255.1\n  ports: [{name: http, port: 80, targetPort: 8080}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: extra-1, namespace: bench, labels: {kubernetes.io/service-name: extra}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n- {addresses: [10.70.0.2], nodeName: node-b}\n";
const ENDPOINTS: [&str; 2] = ["10.70.0.2", "10.70.0.3"];

/// The measured service (cluster IP 198.19.0.1, both endpoints on the backend
/// namespace), then `n - 1` more with 10 endpoints each nobody connects to.
fn manifests(n: usize) -> String {
    let mut y = String::from(
        "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\nspec: {podCIDRs: [10.70.0.0/24]}\nstatus:\n  addresses: [{type: InternalIP, address: 10.70.0.1}]\n",
    );
    for i in 0..n {
        let ip = format!("198.19.{}.{}", i / 250, i % 250 + 1);
        let eps: Vec<String> = if i == 0 {
            let n = env("BENCH_MEASURED_ENDPOINTS", 1).clamp(1, ENDPOINTS.len());
            ENDPOINTS[..n].iter().map(|s| s.to_string()).collect()
        } else {
            (0..10)
                .map(|e| {
                    let k = i * 10 + e;
                    format!("10.{}.{}.{}", 80 + k / 65536, (k / 256) % 256, k % 256)
                })
                .collect()
        };
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: bench}}\nspec:\n  clusterIP: {ip}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc-{i}-1, namespace: bench, labels: {{kubernetes.io/service-name: svc-{i}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n"
        );
        for ep in eps {
            let _ = writeln!(y, "- {{addresses: [{ep}], nodeName: node-b}}");
        }
    }
    y
}

fn state(n: usize) -> ClusterState {
    let mut st = ClusterState::new(StateConfig {
        node_name: "node-a".to_string(),
        service_proxy_name: None,
        ignore_external_ips: false,
        dns: false,
        without_snapshots: false,
    });
    for object in svcproxy_testkit::objects::parse(&manifests(n)) {
        st.apply(SourceUpdate::Upsert {
            object,
            origin: "bench".to_string(),
        });
    }
    st
}

fn plan_config() -> PlanConfig {
    PlanConfig {
        local_detection: LocalDetection::NodeCidr(Vec::new()),
        ..PlanConfig::default()
    }
}

/// [`plan_config`] with the ebpf mode's scheduler `name` for every service.
fn scheduler_config(name: &str) -> PlanConfig {
    svcproxy_plan::ebpf::SEMANTICS.apply(PlanConfig {
        scheduler: svcproxy_core::model::Scheduler::parse(name).expect("a scheduler"),
        ..plan_config()
    })
}

#[derive(Clone, Copy, Debug, Default)]
struct Run {
    per_s: f64,
    p50_us: f64,
    p99_us: f64,
    errors: f64,
}

struct Bench {
    client: String,
    seconds: f64,
    loadgen: String,
    _set: NsSet,
}

impl Bench {
    /// `loadgen connect` to `target` from the client namespace, inside `conf`'s
    /// cgroup when given.
    fn connect(&self, target: &str, conf: Option<&Confinement>) -> Run {
        let secs = self.seconds.to_string();
        let argv = [
            "ip",
            "netns",
            "exec",
            &self.client,
            "taskset",
            "-c",
            "0",
            &self.loadgen,
            "connect",
            "--target",
            target,
            "--concurrency",
            "8",
            "--seconds",
            &secs,
        ];
        let mut cmd = match conf {
            Some(c) => c.command(&argv),
            None => {
                let mut c = std::process::Command::new(argv[0]);
                c.args(&argv[1..]);
                c
            }
        };
        let out = netns::run(&mut cmd, None, Duration::from_secs(120)).expect("loadgen");
        assert!(
            out.status.success(),
            "loadgen: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("one JSON line from loadgen");
        let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
        Run {
            per_s: f("per_s"),
            p50_us: f("p50_us"),
            p99_us: f("p99_us"),
            errors: f("errors"),
        }
    }
}

#[test]
#[ignore]
fn bench_ebpf_connect() {
    let test = "bench_ebpf_connect";
    if !netns::can_run(test, &["ip", "nft", "iptables", "taskset"]) {
        return;
    }
    let big = env("BENCH_SERVICES", 30_000);
    let repeat = env("BENCH_REPEAT", 3);
    let seconds = env("BENCH_SECONDS", 5) as f64;
    let mut set = NsSet::new();
    let names = set
        .add(&[
            "client".to_string(),
            "backend".to_string(),
            "plane".to_string(),
        ])
        .expect("namespaces");
    let (client, backend) = (names[0].clone(), names[1].clone());
    // The eBPF plane runs in a namespace of its own: the "host" to its socket
    // programs (the client is a pod's), and the only interfaces its packet
    // programs take.
    let plane = names[2].clone();
    let in_plane = |f: &mut (dyn FnMut() + Send)| {
        netns::in_netns(&plane, f).expect("entering the plane's namespace")
    };
    netns::ip_batch(
        &client,
        &[
            "link set lo up".into(),
            format!("link add veth0 type veth peer name veth1 netns {backend}"),
            "addr add 10.70.0.1/24 dev veth0".into(),
            "link set veth0 up".into(),
            // The kernel modes route the cluster IP before they DNAT it.
            "route add default dev veth0".into(),
        ],
    )
    .expect("client links");
    netns::ip_batch(
        &backend,
        &[
            "link set lo up".into(),
            "addr add 10.70.0.2/24 dev veth1".into(),
            "addr add 10.70.0.3/24 dev veth1".into(),
            "link set veth1 up".into(),
        ],
    )
    .expect("backend links");
    let logs = tempfile::tempdir().unwrap();
    let loadgen = loadgen_bin().expect("svcproxy-loadgen");
    let lg = loadgen.to_string_lossy().into_owned();
    let listen = ENDPOINTS.map(|e| format!("{e}:8080")).join(",");
    let server = NsProcess::spawn(
        &backend,
        &["taskset", "-c", "1", &lg, "serve", "--listen", &listen],
        "server",
        logs.path(),
    )
    .expect("server");
    server
        .wait_for_stdout("ready", Duration::from_secs(10))
        .expect("server ready");
    let conf = Confinement::new().expect("cgroup and bpffs");
    let bench = Bench {
        client: client.clone(),
        seconds,
        loadgen: lg.clone(),
        _set: set,
    };

    let sizes = [1usize, big];
    let mut states: Vec<ClusterState> = sizes.iter().map(|&n| state(n)).collect();
    // `floor-cg`: the floor from inside the cgroup with the programs attached (the
    // cost of running them for a connection to no service).
    let rows = [
        "floor", "floor-cg", "ebpf", "nftables", "iptables", "ebpf-rr", "ebpf-mh", "ebpf-lc",
    ];
    let mut results: Vec<Vec<Vec<Run>>> = vec![vec![Vec::new(); sizes.len()]; rows.len()];
    let mut ebpf_syncs = Vec::new();
    let floor_target = format!("{}:8080", ENDPOINTS[0]);
    for _ in 0..repeat {
        for (si, st) in states.iter_mut().enumerate() {
            for (ri, row) in rows.iter().enumerate() {
                if row.starts_with("floor") && si > 0 {
                    continue;
                }
                let snap = st.snapshot();
                let run = match *row {
                    "floor" => bench.connect(&floor_target, None),
                    "floor-cg" => {
                        let mut d = Driver::without_conntrack(
                            plan_config(),
                            EbpfDataPlane::new(ebpf_options(&conf)),
                        );
                        in_plane(&mut || {
                            d.sync(&snap, true).expect("ebpf sync");
                        });
                        let r = bench.connect(&floor_target, Some(&conf));
                        in_plane(&mut || d.plane_mut().cleanup().expect("ebpf cleanup"));
                        r
                    }
                    "ebpf" => {
                        let mut d = Driver::without_conntrack(
                            plan_config(),
                            EbpfDataPlane::new(ebpf_options(&conf)),
                        );
                        let t = Instant::now();
                        in_plane(&mut || {
                            d.sync(&snap, true).expect("ebpf sync");
                        });
                        let full = t.elapsed();
                        let r = bench.connect(VIP, Some(&conf));
                        if si == 1 {
                            // One service added at this size: a partial sync.
                            for object in svcproxy_testkit::objects::parse(EXTRA) {
                                st.apply(SourceUpdate::Upsert {
                                    object,
                                    origin: "bench".to_string(),
                                });
                            }
                            let snap = st.snapshot();
                            let t = Instant::now();
                            let mut rep = None;
                            in_plane(&mut || {
                                rep = Some(d.sync(&snap, false).expect("one service"));
                            });
                            let rep = rep.expect("synced");
                            ebpf_syncs.push((full, t.elapsed(), rep.apply_duration));
                            for kind in [Kind::Service, Kind::EndpointSlice] {
                                let name = if kind == Kind::Service {
                                    "extra"
                                } else {
                                    "extra-1"
                                };
                                st.apply(SourceUpdate::Delete(ObjectKey::new(kind, "bench", name)));
                            }
                            st.snapshot();
                        }
                        in_plane(&mut || d.plane_mut().cleanup().expect("ebpf cleanup"));
                        r
                    }
                    scheduled if scheduled.starts_with("ebpf-") => {
                        let mut d = Driver::without_conntrack(
                            scheduler_config(&scheduled["ebpf-".len()..]),
                            EbpfDataPlane::new(ebpf_options(&conf)),
                        );
                        in_plane(&mut || {
                            d.sync(&snap, true).expect("ebpf sync");
                        });
                        let r = bench.connect(VIP, Some(&conf));
                        in_plane(&mut || d.plane_mut().cleanup().expect("ebpf cleanup"));
                        r
                    }
                    "nftables" => {
                        let cmd = NftCommand::from_argv(["ip", "netns", "exec", &client, "nft"])
                            .in_netns(format!("/run/netns/{client}"));
                        let mut d =
                            Driver::without_conntrack(plan_config(), NftDataPlane::with_sink(cmd));
                        d.sync(&snap, true).expect("nft sync");
                        let r = bench.connect(VIP, None);
                        d.plane_mut().cleanup().expect("nft cleanup");
                        r
                    }
                    _ => {
                        let cmds = IptablesCommands::with_prefix(["ip", "netns", "exec", &client]);
                        let mut d =
                            Driver::without_conntrack(plan_config(), IptablesDataPlane::new(cmds));
                        d.sync(&snap, true).expect("iptables sync");
                        let r = bench.connect(VIP, None);
                        d.plane_mut().cleanup().expect("iptables cleanup");
                        r
                    }
                };
                eprintln!(
                    "{row} {} services: {:.0}/s p50 {:.0} µs p99 {:.0} µs errors {}",
                    sizes[si], run.per_s, run.p50_us, run.p99_us, run.errors
                );
                results[ri][si].push(run);
            }
        }
    }

    let med = |runs: &[Run], f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
    let floor = &results[0][0];
    let (f_rate, f_p50) = (med(floor, |r| r.per_s), med(floor, |r| r.p50_us));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n| row | services | conn/s | × floor | p50 µs | × floor | p99 µs | errors |\n|---|---|---|---|---|---|---|---|"
    );
    for (ri, row) in rows.iter().enumerate() {
        for (si, n) in sizes.iter().enumerate() {
            let runs = &results[ri][si];
            if runs.is_empty() {
                continue;
            }
            let (rate, p50, p99) = (
                med(runs, |r| r.per_s),
                med(runs, |r| r.p50_us),
                med(runs, |r| r.p99_us),
            );
            let _ = writeln!(
                out,
                "| {row} | {n} | {rate:.0} | {:.3} | {p50:.0} | {:.3} | {p99:.0} | {} |",
                rate / f_rate,
                p50 / f_p50,
                med(runs, |r| r.errors)
            );
        }
    }
    let p50_of = |si: usize| med(&results[2][si], |r| r.p50_us);
    let _ = writeln!(
        out,
        "\nebpf p50 at {big} services / at 1: {:.3} (target ≤ 1.05); ebpf conn/s / floor: {:.3} (target ≥ 0.97)",
        p50_of(1) / p50_of(0),
        med(&results[2][0], |r| r.per_s) / f_rate
    );
    for (full, one, kernel) in &ebpf_syncs {
        let _ = writeln!(
            out,
            "ebpf sync at {big} × 10: full {:.0} ms; one service added {:.2} ms (maps {:.2} ms)",
            full.as_secs_f64() * 1e3,
            one.as_secs_f64() * 1e3,
            kernel.as_secs_f64() * 1e3
        );
    }
    println!("{out}");
    drop(server);
}

/// A NodePort reached from outside the node, through the packet path: an
/// external namespace, the node's namespace (where the data plane runs) and a
/// backend namespace, joined by veths; the node forwards. Rows, each the median
/// of `BENCH_REPEAT` runs taken in turn:
///
/// - `floor`: the external client connects to the backend's address, routed
///   through the node (forwarding only: no NAT, no program);
/// - `ebpf`: tc programs on the node's interfaces DNAT to the endpoint and turn
///   the replies back, one fixed rule masquerades (externalTrafficPolicy
///   Cluster);
/// - `ebpf-rr`, `ebpf-mh`, `ebpf-lc`: the ebpf row with the packet path's
///   scheduler in place of the random choice (its cost per connection; `lc`
///   counts each connection's flow in and out);
/// - `nftables`: the mode's rules DNAT and masquerade in the node's namespace.
///
/// Two figures each: new connections per second (`loadgen connect`, 8 threads)
/// and requests per second on 8 open connections (`loadgen rr`), each as a ratio
/// to the first row's. `BENCH_ROWS=ebpf` runs that row alone.
/// `BENCH_ENDPOINTS=N` (1 to 250, default 1) gives the service N endpoints, all
/// addresses of the one backend (the floor connects to the first): what `lc`
/// compares per new connection, against the random choice's one draw.
#[test]
#[ignore]
fn bench_ebpf_nodeport_from_outside() {
    let test = "bench_ebpf_nodeport_from_outside";
    if !netns::can_run(test, &["ip", "nft", "taskset"]) {
        return;
    }
    let repeat = env("BENCH_REPEAT", 3);
    let seconds = env("BENCH_SECONDS", 5).to_string();
    let mut set = NsSet::new();
    let (ext, node, backend) =
        svcproxy_e2e::nodeport_bench::namespaces(&mut set).expect("namespaces");
    let logs = tempfile::tempdir().unwrap();
    let lg = loadgen_bin()
        .expect("svcproxy-loadgen")
        .to_string_lossy()
        .into_owned();
    let endpoints = env("BENCH_ENDPOINTS", 1).clamp(1, 250);
    let addrs: Vec<String> = (0..endpoints)
        .map(|i| format!("10.72.0.{}", i + 2))
        .collect();
    if endpoints > 1 {
        netns::ip_batch(
            &backend,
            &addrs[1..]
                .iter()
                .map(|a| format!("addr add {a}/24 dev eth0"))
                .collect::<Vec<_>>(),
        )
        .expect("the backend's addresses");
    }
    let listen = addrs
        .iter()
        .map(|a| format!("{a}:8080"))
        .collect::<Vec<_>>()
        .join(",");
    let server = NsProcess::spawn(
        &backend,
        &["taskset", "-c", "1", &lg, "serve", "--listen", &listen],
        "server",
        logs.path(),
    )
    .expect("server");
    server
        .wait_for_stdout("ready", Duration::from_secs(10))
        .expect("server ready");

    let mut yaml = String::from("apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\nspec: {podCIDRs: [10.72.0.0/24]}\nstatus:\n  addresses: [{type: InternalIP, address: 10.71.0.1}]\n---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: bench}\nspec:\n  type: NodePort\n  clusterIP: 198.19.0.1\n  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: bench, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n");
    for a in &addrs {
        yaml.push_str(&format!("- {{addresses: [{a}], nodeName: node-a}}\n"));
    }
    let mut st = ClusterState::new(StateConfig {
        node_name: "node-a".to_string(),
        service_proxy_name: None,
        ignore_external_ips: false,
        dns: false,
        without_snapshots: false,
    });
    for object in svcproxy_testkit::objects::parse(&yaml) {
        st.apply(SourceUpdate::Upsert {
            object,
            origin: "bench".to_string(),
        });
    }
    let snap = st.snapshot();
    let conf = Confinement::new().expect("cgroup and bpffs");
    let load = |what: &str, target: &str| -> f64 {
        let argv = [
            "ip",
            "netns",
            "exec",
            &ext,
            "taskset",
            "-c",
            "0",
            &lg,
            what,
            "--target",
            target,
            "--concurrency",
            "8",
            "--seconds",
            &seconds,
        ];
        let out = netns::run(
            std::process::Command::new(argv[0]).args(&argv[1..]),
            None,
            Duration::from_secs(120),
        )
        .expect("loadgen");
        assert!(
            out.status.success(),
            "loadgen: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("loadgen JSON");
        assert_eq!(
            v["errors"].as_f64().unwrap_or(0.0),
            0.0,
            "{what} {target}: errors {v}"
        );
        v["per_s"].as_f64().unwrap_or(0.0)
    };
    // `BENCH_ROWS=ebpf` runs one row alone (for a profile of it).
    let only = std::env::var("BENCH_ROWS").unwrap_or_default();
    let rows: Vec<&str> = ["floor", "ebpf", "ebpf-rr", "ebpf-mh", "ebpf-lc", "nftables"]
        .into_iter()
        .filter(|r| only.is_empty() || only.split(',').any(|o| o == *r))
        .collect();
    let mut results: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); rows.len()];
    for _ in 0..repeat {
        for (ri, row) in rows.iter().enumerate() {
            let (target, cleanup): (&str, Box<dyn FnOnce()>) = match *row {
                "floor" => ("10.72.0.2:8080", Box::new(|| {})),
                ebpf if ebpf.starts_with("ebpf") => {
                    // `ebpf-<scheduler>`: the packet path's scheduler in place of
                    // the random choice.
                    let cfg = match ebpf.strip_prefix("ebpf-") {
                        Some(scheduler) => scheduler_config(scheduler),
                        None => plan_config(),
                    };
                    let mut d =
                        Driver::without_conntrack(cfg, EbpfDataPlane::new(ebpf_options(&conf)));
                    netns::in_netns(&node, || d.sync(&snap, true))
                        .expect("netns")
                        .expect("ebpf sync");
                    let node = node.clone();
                    (
                        "10.71.0.1:30080",
                        Box::new(move || {
                            netns::in_netns(&node, || d.plane_mut().cleanup())
                                .expect("netns")
                                .expect("ebpf cleanup")
                        }),
                    )
                }
                _ => {
                    let cmd = NftCommand::from_argv(["ip", "netns", "exec", &node, "nft"])
                        .in_netns(format!("/run/netns/{node}"));
                    let mut d =
                        Driver::without_conntrack(plan_config(), NftDataPlane::with_sink(cmd));
                    d.sync(&snap, true).expect("nft sync");
                    (
                        "10.71.0.1:30080",
                        Box::new(move || d.plane_mut().cleanup().expect("nft cleanup")),
                    )
                }
            };
            results[ri].0.push(load("connect", target));
            results[ri].1.push(load("rr", target));
            cleanup();
        }
    }
    let floor = (median(results[0].0.clone()), median(results[0].1.clone()));
    println!("\nNodePort from outside, {endpoints} endpoint(s), {repeat} runs each (median):");
    println!("| row | conn/s | x floor | req/s (8 open connections) | x floor |");
    println!("|---|---|---|---|---|");
    for (ri, row) in rows.iter().enumerate() {
        let (c, r) = (median(results[ri].0.clone()), median(results[ri].1.clone()));
        println!(
            "| {row} | {c:.0} | {:.3} | {r:.0} | {:.3} |",
            c / floor.0,
            r / floor.1
        );
    }
}
