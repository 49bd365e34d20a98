//! Sync benchmark (ignored by default: a benchmark, not a timed test). For N services
//! × M endpoints (env `BENCH_SERVICES`, default 1000 and 10000; `BENCH_ENDPOINTS`,
//! default 10) it runs, each in a fresh network namespace and in the same run:
//!
//! - the floor: `iptables-restore --noflush` of as many bare rules as the iptables
//!   mode's full restore holds (`-A BENCH-n -j RETURN`, in as many chains);
//! - iptables mode: the full sync (both families), then one service added (partial);
//! - nftables mode: the same two syncs.
//!
//! and prints the times and the ratio of iptables mode's full sync to the floor (target:
//! at most 1.5) and of its one-service sync (target: under 100 ms at 10k), and the peak
//! RSS of the tools each sync ran (`iptables-save`/`-restore`, `nft`), read with GNU
//! `time` when `/usr/bin/time` exists.
//!
//! `cargo test --release -p svcproxy-dataplane --test bench_sync -- --ignored --nocapture`

mod common;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use common::netns::Netns;
use common::*;
use svcproxy_dataplane::iptables::{IptablesCommands, IptablesDataPlane};
use svcproxy_dataplane::{NftCommand, NftDataPlane, Proxier};

fn env(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// `n` services `svc-i` (cluster IP from 198.19.0.0/16) with `m` endpoints each.
fn services_yaml(from: usize, to: usize, m: usize) -> String {
    let mut y = String::new();
    for i in from..to {
        let ip = format!("198.19.{}.{}", i / 250, i % 250 + 1);
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: bench}}\nspec:\n  clusterIP: {ip}\n  ports:\n  - {{name: http, port: 80, targetPort: 8080}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc-{i}-1\n  namespace: bench\n  labels: {{kubernetes.io/service-name: svc-{i}}}\naddressType: IPv4\nports:\n- {{name: http, port: 8080}}\nendpoints:\n"
        );
        for e in 0..m {
            let n = i * m + e;
            let _ = writeln!(
                y,
                "- {{addresses: [10.{}.{}.{}], nodeName: node-b}}",
                n / 62500 % 250,
                n / 250 % 250,
                n % 250 + 1
            );
        }
    }
    y
}

fn run(n: usize, m: usize) {
    let tools = ["nft", "iptables-restore", "ip6tables-restore", "iptables"];
    let Some(floor_ns) = Netns::create("bench_sync", "bench-floor", &tools) else {
        return;
    };
    let mut state = cluster(&[]);
    upsert(&mut state, &services_yaml(0, n, m));
    let base = snapshot(&mut state);
    upsert(&mut state, &services_yaml(n, n + 1, m));
    let added = snapshot(&mut state);

    let legacy = std::env::var("BENCH_IPTABLES").is_ok_and(|v| v == "legacy");
    let cfg = svcproxy_plan::iptables::SEMANTICS.apply(plan_config());
    // The rule count of iptables mode's full restore (v4), for the floor.
    let rules = svcproxy_plan::iptables::rules(
        &svcproxy_plan::build_intent(&base.v4, &base.v6, &cfg),
        svcproxy_core::model::IpFamily::V4,
    )
    .expect("v4");
    let (chains, rule_count) = (
        rules.nat.chains().count() + rules.filter.chains().count(),
        rules.nat.rule_count() + rules.filter.rule_count(),
    );

    // The floor: the same number of bare rules, in as many chains, one restore, in
    // the order the tool handles best (each chain declared, then its rules, in
    // descending name order: see `FamilyRules::restore`).
    let mut floor = String::from("*nat\n");
    for c in (0..chains).rev() {
        let _ = writeln!(floor, ":BENCH-{c:07} - [0:0]");
        for _ in (c..rule_count).step_by(chains) {
            let _ = writeln!(floor, "-A BENCH-{c:07} -j RETURN");
        }
    }
    floor.push_str("COMMIT\n");
    let restore = if legacy {
        "iptables-legacy-restore"
    } else {
        "iptables-restore"
    };
    let t = Instant::now();
    let floor_ok = svcproxy_dataplane::run_command(
        &[
            "ip",
            "netns",
            "exec",
            &floor_ns.name,
            restore,
            "-w",
            "--noflush",
        ]
        .map(String::from),
        Some(&floor),
        Duration::from_secs(900),
    );
    let floor_time = t.elapsed();
    println!(
        "{n} services x {m} endpoints ({rule_count} iptables rules in {chains} chains, v4; {}):\n\
         \x20 floor: {restore} of {rule_count} bare rules   {:>9.1} ms{}",
        if legacy {
            "legacy"
        } else {
            "the host's iptables"
        },
        ms(floor_time),
        floor_ok
            .err()
            .map(|e| format!("  FAILED: {e}"))
            .unwrap_or_default(),
    );

    // iptables mode.
    let ipt_ns = Netns::create("bench_sync", "bench-ipt", &tools).expect("netns");
    let rss_log = std::env::temp_dir().join(format!("bench_sync-rss-{}", std::process::id()));
    let _ = std::fs::write(&rss_log, "");
    let time = peak_rss_prefix(&rss_log).unwrap_or_default();
    let netns_exec = |ns: &str| {
        let mut argv = time.clone();
        argv.extend(["ip", "netns", "exec", ns].map(String::from));
        argv
    };
    let commands = IptablesCommands::with_prefix(netns_exec(&ipt_ns.name));
    let commands = if legacy { commands.legacy() } else { commands };
    let mut ipt = Proxier::without_conntrack(cfg, IptablesDataPlane::new(commands));
    let t = Instant::now();
    match ipt.sync(&base, true) {
        Ok(full) => {
            let ipt_full = t.elapsed();
            println!(
                "  iptables mode: full sync (both families)          {:>9.1} ms  ({:.2} x floor; target <= 1.5; {} bytes; in the tools {:.1} ms; tools' peak RSS {})",
                ms(ipt_full),
                ipt_full.as_secs_f64() / floor_time.as_secs_f64(),
                full.script_bytes,
                ms(full.apply_duration),
                take_peak_rss(&rss_log),
            );
            let t = Instant::now();
            match ipt.sync(&added, false) {
                Ok(partial) => println!(
                    "  iptables mode: one service added                  {:>9.1} ms  (target < 100 ms at 10k; {} bytes, {:?}; in the tools {:.1} ms; tools' peak RSS {})",
                    ms(t.elapsed()),
                    partial.script_bytes,
                    partial.kind,
                    ms(partial.apply_duration),
                    take_peak_rss(&rss_log),
                ),
                Err(e) => println!("  iptables mode: one service added FAILED after {:?}: {e}", t.elapsed()),
            }
        }
        Err(e) => println!(
            "  iptables mode: full sync FAILED after {:?}: {e}",
            t.elapsed()
        ),
    }

    // nftables mode.
    let nft_ns = Netns::create("bench_sync", "bench-nft", &tools).expect("netns");
    let mut nft = Proxier::without_conntrack(
        plan_config(),
        NftDataPlane::with_sink(
            NftCommand::from_argv({
                let mut argv = netns_exec(&nft_ns.name);
                argv.push("nft".into());
                argv
            })
            .in_netns(format!("/run/netns/{}", nft_ns.name)),
        ),
    );
    let _ = take_peak_rss(&rss_log);
    let t = Instant::now();
    nft.sync(&base, true).expect("nft full");
    let nft_full = t.elapsed();
    let nft_full_rss = take_peak_rss(&rss_log);
    let t = Instant::now();
    nft.sync(&added, false).expect("nft one added");
    let nft_partial = t.elapsed();

    println!(
        "  nftables mode: full sync (both families)          {:>9.1} ms  (nft's peak RSS {nft_full_rss})\n\
         \x20 nftables mode: one service added                  {:>9.1} ms  (nft's peak RSS {})",
        ms(nft_full),
        ms(nft_partial),
        take_peak_rss(&rss_log),
    );
    let _ = std::fs::remove_file(&rss_log);
}

/// GNU time, to read each tool's peak RSS (`-f %M`, KiB, appended to `log`); `None`
/// when it is not installed (the memory figures are then left out).
fn peak_rss_prefix(log: &std::path::Path) -> Option<Vec<String>> {
    let time = std::path::Path::new("/usr/bin/time");
    time.exists().then(|| {
        vec![
            time.display().to_string(),
            "-f".into(),
            "%M".into(),
            "-a".into(),
            "-o".into(),
            log.display().to_string(),
        ]
    })
}

/// The largest peak RSS (MiB) recorded in `log` since the last call (which empties it).
fn take_peak_rss(log: &std::path::Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let _ = std::fs::write(log, "");
    text.lines()
        .filter_map(|l| l.trim().parse::<f64>().ok())
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
        .map(|kib| format!("{:.1} MiB", kib / 1024.0))
        .unwrap_or_else(|| "n/a".into())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[test]
#[ignore]
fn bench_sync() {
    let m = env("BENCH_ENDPOINTS").unwrap_or(10);
    let sizes = match env("BENCH_SERVICES") {
        Some(n) => vec![n],
        None => vec![1000, 10_000],
    };
    for n in sizes {
        run(n, m);
    }
}
