//! First-packet latency benchmark (ignored by default: a benchmark, not a timed test):
//! does a new connection to a service get slower as the table grows? In a fresh
//! network namespace each, nftables mode (over netlink) is loaded with one service,
//! then with `BENCH_SERVICES` (default 30,000) × `BENCH_ENDPOINTS` (default 10); in
//! each, a client times `BENCH_CONNECTS` (default 3,000) TCP connects to the first
//! service's cluster IP, whose endpoints are addresses of the namespace's loopback
//! with a listener behind them. Each connect's first packet goes through the NAT
//! lookup and is DNATed, so its time is the SYN's path and the SYN-ACK's. The two
//! sizes are measured twice, alternated, and the ratio of the medians printed
//! (issue 16: keep it at most 1.05).
//!
//! `cargo test --release -p svcproxy-dataplane --test bench_connect -- --ignored --nocapture`
//! (root; `nft`, `ip` and `python3`).

mod common;

use std::time::Duration;

use common::netns::Netns;
use common::*;
use svcproxy_dataplane::{NftCommand, NftDataPlane};

fn env(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The client: a listener on every address at 8080, then `argv[2]` connects to
/// `argv[1]`:80, each timed from `connect()` to its return; prints the median,
/// 90th and 99th percentiles in microseconds.
const CLIENT: &str = r#"
import socket, sys, threading, time
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 8080))
srv.listen(1024)
def serve():
    while True:
        c, _ = srv.accept()
        c.close()
threading.Thread(target=serve, daemon=True).start()
vip, n = sys.argv[1], int(sys.argv[2])
times = []
for i in range(n):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    t = time.perf_counter_ns()
    s.connect((vip, 80))
    times.append(time.perf_counter_ns() - t)
    s.close()
times.sort()
print(times[len(times) // 2] / 1000, times[len(times) * 9 // 10] / 1000, times[len(times) * 99 // 100] / 1000)
"#;

/// Median, p90 and p99 connect times (µs) with `n` services × `m` endpoints loaded.
fn measure(n: usize, m: usize, connects: usize) -> (f64, f64, f64) {
    let tools = ["nft", "python3"];
    let ns = Netns::create("bench_connect", "bench-connect", &tools).expect("netns");
    let exec = |argv: &[&str]| {
        let mut full: Vec<String> = ["ip", "netns", "exec", &ns.name]
            .iter()
            .map(|s| s.to_string())
            .collect();
        full.extend(argv.iter().map(|s| s.to_string()));
        svcproxy_dataplane::run_command(&full, None, Duration::from_secs(600))
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"))
    };
    exec(&["ip", "link", "set", "lo", "up"]);
    // A route for the cluster IPs (the first lookup, before the DNAT re-routes the
    // packet to an endpoint).
    exec(&["ip", "route", "add", "198.19.0.0/16", "dev", "lo"]);
    // The first service's endpoints: 10.0.0.1 .. 10.0.0.m, on this namespace's lo.
    for e in 0..m {
        exec(&[
            "ip",
            "addr",
            "add",
            &format!("10.0.0.{}/32", e + 1),
            "dev",
            "lo",
        ]);
    }
    let mut state = cluster(&[]);
    upsert(&mut state, &services_yaml(0, n, m));
    let update = snapshot(&mut state);
    let mut plane = Syncer::new(
        plan_config(),
        NftDataPlane::with_sink(
            NftCommand::from_argv(
                ["ip", "netns", "exec", &ns.name, "nft"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<String>>(),
            )
            .in_netns(format!("/run/netns/{}", ns.name)),
        ),
    );
    plane.sync(&update, true).expect("sync");
    let out = exec(&["python3", "-c", CLIENT, "198.19.0.1", &connects.to_string()]);
    let v: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|x| x.parse().expect("a number"))
        .collect();
    (v[0], v[1], v[2])
}

#[test]
#[ignore]
fn bench_connect() {
    let n = env("BENCH_SERVICES").unwrap_or(30_000);
    let m = env("BENCH_ENDPOINTS").unwrap_or(10);
    let connects = env("BENCH_CONNECTS").unwrap_or(3000);
    let mut medians = [Vec::new(), Vec::new()];
    for round in 0..2 {
        for (i, size) in [1, n].into_iter().enumerate() {
            let (p50, p90, p99) = measure(size, m, connects);
            println!(
                "round {round}: {size} services x {m} endpoints: {connects} connects, \
                 median {p50:.1} us, p90 {p90:.1} us, p99 {p99:.1} us"
            );
            medians[i].push(p50);
        }
    }
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "first-packet connect latency, {n} services vs 1: {:.2} x (medians averaged over \
         the rounds; target <= 1.05)",
        avg(&medians[1]) / avg(&medians[0])
    );
}
