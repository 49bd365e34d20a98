//! Sync benchmark (ignored by default: a benchmark, not a timed test). For N services
//! × M endpoints (env `BENCH_SERVICES`, default 1000 and 10000; `BENCH_ENDPOINTS`,
//! default 10) it runs, each in a fresh network namespace and in the same run (the
//! two iptables floors and iptables mode not with `BENCH_SKIP_IPTABLES=1`):
//!
//! - the floor: `iptables-restore --noflush` of as many bare rules as the iptables
//!   mode's full restore holds (`-A BENCH-n -j RETURN`, in as many chains);
//! - the floor of upstream's shape: as many bare rules and chains as a chain per
//!   endpoint makes (upstream's `KUBE-SEP-*`: svcproxy DNATs an endpoint that needs
//!   neither the hairpin nor affinity from the set's chain);
//! - iptables mode: the full sync (both families), then `BENCH_CHANGES` (default 5)
//!   single changes, each a partial sync: one service added, then one endpoint of an
//!   existing service replaced;
//! - the commit floor: the kernel's price of any commit to iptables mode's table (one
//!   bare rule added to an unreferenced chain: the kernel validates every reachable
//!   chain at each commit that adds a rule);
//! - the nftables floor: `nft -f` of a table holding only the same data (a verdict
//!   map of the service addresses, a map of every endpoint, an empty chain per
//!   service);
//! - the eBPF data plane's socket side (unless `BENCH_SKIP_EBPF=1`): its full sync
//!   from a fresh process, as a ratio to the nftables floor, then the same single
//!   changes;
//! - nftables mode: the full sync through `nft -f` (`--nft-writer=text`), then
//!   the same syncs as iptables mode over netlink (the default; unless
//!   `BENCH_SKIP_NFT=1`), full syncs also as a ratio to the floor, with the
//!   longest single commit of the full sync (the kernel's time in the one
//!   `sendmsg` carrying the batch) and this process's peak RSS during it;
//!
//! and prints the times (single changes: median and maximum), the ratio of iptables
//! mode's full sync to each floor (target: at most 1.5) and of its one-service sync
//! (target: under 100 ms at 10k), and the peak RSS of the tools each sync ran
//! (`iptables-save`/`-restore`, `nft`), read with GNU `time` when `/usr/bin/time`
//! exists.
//!
//! `cargo test --release -p svcproxy-dataplane --test bench_sync -- --ignored --nocapture`

mod common;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use common::netns::Netns;
use common::*;
use svcproxy_dataplane::iptables::{IptablesCommands, IptablesDataPlane};
use svcproxy_dataplane::nftables::NftWriter;
use svcproxy_dataplane::{NftCommand, NftDataPlane};

fn env(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The same service as `services_yaml(i, i + 1, m)` with its first endpoint moved to
/// `10.250.<k>`.
fn endpoint_moved(i: usize, m: usize, k: usize) -> String {
    let y = services_yaml(i, i + 1, m);
    let n = i * m;
    let first = format!("10.{}.{}.{}]", n / 62500 % 250, n / 250 % 250, n % 250 + 1);
    y.replacen(&first, &format!("10.250.{}.{}]", k / 250, k % 250 + 1), 1)
}

/// Runs `changes` single changes through `sync` (each on a fresh snapshot of
/// `state` after `change(k)` was applied) and returns the median and maximum time.
fn single_changes(
    state: &mut svcproxy_core::state::ClusterState,
    changes: usize,
    change: impl Fn(usize) -> String,
    mut sync: impl FnMut(&svcproxy_core::state::SnapshotUpdate) -> Result<String, String>,
) -> (Duration, Duration, Vec<String>) {
    let mut times = Vec::new();
    let mut notes = Vec::new();
    for k in 0..changes {
        upsert(state, &change(k));
        let snap = snapshot(state);
        let t = Instant::now();
        match sync(&snap) {
            Ok(note) => notes.push(note),
            Err(e) => notes.push(format!("FAILED: {e}")),
        }
        times.push(t.elapsed());
    }
    times.sort();
    (
        times.get(times.len() / 2).copied().unwrap_or_default(),
        times.last().copied().unwrap_or_default(),
        notes,
    )
}

/// `restore -w --noflush` of `input` in network namespace `ns`.
fn restore_in(
    ns: &str,
    restore: &str,
    input: &str,
) -> Result<svcproxy_dataplane::CommandOutput, svcproxy_dataplane::DataPlaneError> {
    svcproxy_dataplane::run_command(
        &["ip", "netns", "exec", ns, restore, "-w", "--noflush"].map(String::from),
        Some(input),
        Duration::from_secs(900),
    )
}

fn restore_floor(ns: &str, restore: &str, chains: usize, rules: usize) -> (Duration, String) {
    // The same number of bare rules, in as many chains, one restore, in the order
    // the tool handles best (each chain declared, then its rules, in descending name
    // order: see `FamilyRules::restore`).
    let mut floor = String::from("*nat\n");
    for c in (0..chains).rev() {
        let _ = writeln!(floor, ":BENCH-{c:07} - [0:0]");
        for _ in (c..rules).step_by(chains) {
            let _ = writeln!(floor, "-A BENCH-{c:07} -j RETURN");
        }
    }
    floor.push_str("COMMIT\n");
    let t = Instant::now();
    let ok = restore_in(ns, restore, &floor);
    (
        t.elapsed(),
        ok.err()
            .map(|e| format!("  FAILED: {e}"))
            .unwrap_or_default(),
    )
}

fn run(n: usize, m: usize) {
    let tools = ["nft", "iptables-restore", "ip6tables-restore", "iptables"];
    let Some(floor_ns) = Netns::create("bench_sync", "bench-floor", &tools) else {
        return;
    };
    let changes = env("BENCH_CHANGES").unwrap_or(5);
    let mut state = cluster(&[]);
    // In pieces: the test harness reads at most 100,000 documents a YAML.
    for start in (0..n).step_by(20_000) {
        upsert(
            &mut state,
            &services_yaml(start, (start + 20_000).min(n), m),
        );
    }
    let base = snapshot(&mut state);

    let rss_log = std::env::temp_dir().join(format!("bench_sync-rss-{}", std::process::id()));
    let _ = std::fs::write(&rss_log, "");
    let time = peak_rss_prefix(&rss_log).unwrap_or_default();
    let netns_exec = |ns: &str| {
        let mut argv = time.clone();
        argv.extend(["ip", "netns", "exec", ns].map(String::from));
        argv
    };
    // BENCH_SKIP_IPTABLES=1: only nftables (and ebpf) at sizes where iptables
    // mode would take minutes.
    if !std::env::var("BENCH_SKIP_IPTABLES").is_ok_and(|v| v == "1") {
        let legacy = std::env::var("BENCH_IPTABLES").is_ok_and(|v| v == "legacy");
        let cfg = svcproxy_plan::iptables::SEMANTICS.apply(plan_config());
        // The rule count of iptables mode's full restore (v4), for the floor.
        let intent = svcproxy_plan::build_intent(&base.v4, &base.v6, &cfg);
        let rules = svcproxy_plan::iptables::rules(&intent, svcproxy_core::model::IpFamily::V4)
            .expect("v4");
        let (chains, rule_count) = (
            rules.nat.chains().count() + rules.filter.chains().count(),
            rules.nat.rule_count() + rules.filter.rule_count(),
        );
        // Upstream's shape: a chain of two rules (hairpin mark, DNAT) per endpoint.
        let inline: usize = intent
            .family(svcproxy_core::model::IpFamily::V4)
            .services()
            .values()
            .filter(|s| s.affinity_timeout.is_none())
            .map(|s| {
                (0..s.endpoints.len())
                    .filter(|&i| !s.endpoints.hairpin(i))
                    .count()
            })
            .sum();
        let (up_chains, up_rules) = (chains + inline, rule_count + 2 * inline);
        drop((rules, intent));
        let restore = if legacy {
            "iptables-legacy-restore"
        } else {
            "iptables-restore"
        };
        let (floor_time, floor_err) = restore_floor(&floor_ns.name, restore, chains, rule_count);
        drop(floor_ns);
        settle();
        let up_ns = Netns::create("bench_sync", "bench-floor-up", &tools).expect("netns");
        let (up_time, up_err) = restore_floor(&up_ns.name, restore, up_chains, up_rules);
        drop(up_ns);
        settle();
        println!(
            "{n} services x {m} endpoints ({rule_count} iptables rules in {chains} chains, v4; {}):\n\
             \x20 floor: {restore} of {rule_count} bare rules in {chains} chains {:>9.1} ms{floor_err}\n\
             \x20 floor, upstream's shape: {up_rules} bare rules in {up_chains} chains {:>9.1} ms{up_err}",
            if legacy {
                "legacy"
            } else {
                "the host's iptables"
            },
            ms(floor_time),
            ms(up_time),
        );

        // iptables mode.
        let ipt_ns = Netns::create("bench_sync", "bench-ipt", &tools).expect("netns");
        let commands = IptablesCommands::with_prefix(netns_exec(&ipt_ns.name));
        let commands = if legacy { commands.legacy() } else { commands };
        let mut ipt = Syncer::new(cfg, IptablesDataPlane::new(commands));
        let t = Instant::now();
        match ipt.sync(&base, true) {
            Ok(full) => {
                let ipt_full = t.elapsed();
                println!(
                    "  iptables mode: full sync (both families)          {:>9.1} ms  ({:.2} x floor, {:.2} x upstream-shape floor; target <= 1.5; {} bytes; in the tools {:.1} ms; tools' peak RSS {})",
                    ms(ipt_full),
                    ipt_full.as_secs_f64() / floor_time.as_secs_f64(),
                    ipt_full.as_secs_f64() / up_time.as_secs_f64(),
                    full.script_bytes,
                    ms(full.apply_duration),
                    take_peak_rss(&rss_log),
                );
                let mut sync = |snap: &svcproxy_core::state::SnapshotUpdate| {
                    ipt.sync(snap, false)
                        .map(|r| {
                            format!(
                                "{:?} {} bytes, tools {:.1} ms",
                                r.kind,
                                r.script_bytes,
                                ms(r.apply_duration)
                            )
                        })
                        .map_err(|e| e.to_string())
                };
                let (med, max, notes) = single_changes(
                    &mut state,
                    changes,
                    |k| services_yaml(n + k, n + k + 1, m),
                    &mut sync,
                );
                println!(
                    "  iptables mode: one service added, median / max    {:>9.1} / {:.1} ms  (target < 100 ms at 10k; {}; tools' peak RSS {})",
                    ms(med),
                    ms(max),
                    notes.first().cloned().unwrap_or_default(),
                    take_peak_rss(&rss_log),
                );
                let (med, max, notes) = single_changes(
                    &mut state,
                    changes,
                    |k| endpoint_moved(k * 97 % n, m, k),
                    &mut sync,
                );
                println!(
                    "  iptables mode: one endpoint moved, median / max   {:>9.1} / {:.1} ms  ({})",
                    ms(med),
                    ms(max),
                    notes.first().cloned().unwrap_or_default(),
                );
                // The kernel's own price of any commit to this table: one bare rule
                // added to a chain nothing jumps to (then flushed again). The kernel
                // validates every chain reachable from the base chains at each commit
                // that adds a rule, whatever the rule.
                let mut commit = Vec::new();
                for _ in 0..changes {
                    let t = Instant::now();
                    let _ = restore_in(
                        &ipt_ns.name,
                        restore,
                        "*nat\n:SVCPROXY-CANARY - [0:0]\n-A SVCPROXY-CANARY -j RETURN\nCOMMIT\n",
                    );
                    commit.push(t.elapsed());
                    let _ = restore_in(
                        &ipt_ns.name,
                        restore,
                        "*nat\n:SVCPROXY-CANARY - [0:0]\nCOMMIT\n",
                    );
                }
                commit.sort();
                println!(
                    "  the commit floor: {restore} of one bare rule into this table, median {:>6.1} ms",
                    ms(commit[commit.len() / 2]),
                );
            }
            Err(e) => println!(
                "  iptables mode: full sync FAILED after {:?}: {e}",
                t.elapsed()
            ),
        }
        drop(ipt);
        drop(ipt_ns);
        settle();
    }

    if std::env::var("BENCH_SKIP_NFT").is_ok_and(|v| v == "1") {
        let _ = std::fs::remove_file(&rss_log);
        return;
    }
    // The nftables floor: `nft -f` of a table holding only the same data, as
    // plain as it gets: one verdict map of the service addresses, one map of every
    // endpoint under a number, an empty chain per service.
    let floor_ns = Netns::create("bench_sync", "bench-nft-floor", &tools).expect("netns");
    let mut floor = String::from(
        "table ip bench {\n map vips { type ipv4_addr . inet_proto . inet_service : verdict; }\n \
         map eps { typeof numgen random mod 1 : ip daddr . tcp dport; }\n}\n",
    );
    for i in 0..n {
        let _ = writeln!(floor, "add chain ip bench s{i}");
    }
    let mut first = true;
    for i in 0..n {
        let _ = write!(
            floor,
            "{}{} . tcp . 80 : goto s{i}",
            if first {
                "add element ip bench vips { "
            } else {
                ", "
            },
            bench_vip(i),
        );
        first = false;
    }
    floor.push_str(" }\nadd element ip bench eps { ");
    for k in 0..n * m {
        let _ = write!(
            floor,
            "{}{} : 10.{}.{}.{} . 8080",
            if k == 0 { "" } else { ", " },
            k + 1,
            k / 62500 % 250,
            k / 250 % 250,
            k % 250 + 1
        );
    }
    floor.push_str(" }\n");
    let t = Instant::now();
    let floor_err = svcproxy_dataplane::run_command(
        &["ip", "netns", "exec", &floor_ns.name, "nft", "-f", "-"].map(String::from),
        Some(&floor),
        Duration::from_secs(900),
    )
    .err()
    .map(|e| format!("  FAILED: {e}"))
    .unwrap_or_default();
    let nft_floor = t.elapsed();
    println!(
        "  nftables floor: nft -f of {n} empty chains, {n} verdict-map and {} endpoint-map elements {:>9.1} ms{floor_err}",
        n * m,
        ms(nft_floor)
    );
    drop(floor_ns);
    settle();

    if std::env::var("BENCH_SKIP_EBPF").is_ok_and(|v| v == "1") {
        println!("  ebpf: skipped (BENCH_SKIP_EBPF=1)");
    } else {
        ebpf(n, m, changes, nft_floor);
    }

    // nftables mode, from the same services as iptables mode started with: first
    // through `nft -f` (`--nft-writer=text`), then as it runs by default (netlink).
    let mut state = cluster(&[]);
    // In pieces: the test harness reads at most 100,000 documents a YAML.
    for start in (0..n).step_by(20_000) {
        upsert(
            &mut state,
            &services_yaml(start, (start + 20_000).min(n), m),
        );
    }
    let base = snapshot(&mut state);
    let plane = |ns: &Netns, writer: NftWriter| {
        Syncer::new(
            plan_config(),
            NftDataPlane::with_sink(
                NftCommand::from_argv({
                    let mut argv = netns_exec(&ns.name);
                    argv.push("nft".into());
                    argv
                })
                .in_netns(format!("/run/netns/{}", ns.name)),
            )
            .with_writer(writer),
        )
    };
    {
        let ns = Netns::create("bench_sync", "bench-nft-text", &tools).expect("netns");
        let mut text = plane(&ns, NftWriter::Text);
        let _ = take_peak_rss(&rss_log);
        reset_peak_rss();
        let t = Instant::now();
        let full = text.sync(&base, true).expect("nft full (text)");
        let took = t.elapsed();
        println!(
            "  nftables mode, nft -f (--nft-writer=text): full sync {:>9.1} ms  ({:.2} x the nftables floor; {} bytes, in nft {:.1} ms; nft's peak RSS {}; this process {})",
            ms(took),
            took.as_secs_f64() / nft_floor.as_secs_f64(),
            full.script_bytes,
            ms(full.apply_duration),
            take_peak_rss(&rss_log),
            own_rss(),
        );
        drop(text);
        drop(ns);
        settle();
    }
    let nft_ns = Netns::create("bench_sync", "bench-nft", &tools).expect("netns");
    let mut nft = plane(&nft_ns, NftWriter::Netlink);
    let _ = take_peak_rss(&rss_log);
    reset_peak_rss();
    let before_rss = own_rss();
    let t = Instant::now();
    let full = nft.sync(&base, true).expect("nft full");
    let nft_full = t.elapsed();
    // The longest single commit: the kernel processes and commits a batch inside
    // the one sendmsg(2) that carries it (holding the nftables commit lock).
    let batch = nft.plane_mut().sink().last_batch();
    let full_rss = format!("before: {before_rss}; after: {}", own_rss());
    let nft_full_rss = take_peak_rss(&rss_log);
    let mut sync = |snap: &svcproxy_core::state::SnapshotUpdate| {
        nft.sync(snap, false)
            .map(|r| {
                format!(
                    "{:?}, {} bytes, applied in {:.1} ms",
                    r.kind,
                    r.script_bytes,
                    ms(r.apply_duration)
                )
            })
            .map_err(|e| e.to_string())
    };
    let (med, max, notes) = single_changes(
        &mut state,
        changes,
        |k| services_yaml(n + k, n + k + 1, m),
        &mut sync,
    );
    let (emed, emax, enotes) = single_changes(
        &mut state,
        changes,
        |k| endpoint_moved(k * 97 % n, m, k),
        &mut sync,
    );
    println!(
        "  nftables mode: full sync (both families, netlink) {:>9.1} ms  ({:.2} x the nftables floor; target <= 1.5; {} bytes of script, applied in {:.1} ms; the commit {}; tools' peak RSS {nft_full_rss}; this process {full_rss})\n\
         \x20 nftables mode: one service added, median / max    {:>9.1} / {:.1} ms  ({}; tools' peak RSS {})\n\
         \x20 nftables mode: one endpoint moved, median / max   {:>9.1} / {:.1} ms  ({})",
        ms(nft_full),
        nft_full.as_secs_f64() / nft_floor.as_secs_f64(),
        full.script_bytes,
        ms(full.apply_duration),
        batch.map_or_else(
            || "n/a".to_string(),
            |b| format!(
                "{:.1} ms, {} bytes in {} messages encoded in {:.1} ms",
                ms(b.commit),
                b.bytes,
                b.messages,
                ms(b.encode)
            )
        ),
        ms(med),
        ms(max),
        notes.first().cloned().unwrap_or_default(),
        take_peak_rss(&rss_log),
        ms(emed),
        ms(emax),
        enotes.first().cloned().unwrap_or_default(),
    );
    drop(nft);
    drop(nft_ns);
    settle();
    let _ = std::fs::remove_file(&rss_log);
}

/// Forgets this process's peak RSS (VmHWM), so that [`own_rss`] reports the peak
/// of what follows.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// This process's resident memory now, and its peak since [`reset_peak_rss`].
fn own_rss() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or_else(|| "n/a".to_string(), |k| format!("{:.1} MiB", k / 1024.0))
    };
    format!("peak {}, now {}", kib("VmHWM:"), kib("VmRSS:"))
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

/// A pause after a large namespace is deleted: the kernel frees its rules in the
/// background, which would otherwise be timed with the next step.
fn settle() {
    std::thread::sleep(Duration::from_secs(5));
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

/// The eBPF data plane (socket side) on the same services, confined to a cgroup
/// and bpffs of this run's own: its full sync from a fresh process (programs
/// loaded and attached, maps created) as a ratio to the nftables floor, then
/// single changes.
fn ebpf(n: usize, m: usize, changes: usize, nft_floor: Duration) {
    let conf = match svcproxy_testkit::confine::Confinement::new() {
        Ok(c) => c,
        Err(e) => {
            println!("  ebpf: cannot confine the programs here: {e}");
            return;
        }
    };
    // The plane runs in a namespace of this run's own: its packet programs take
    // that namespace's interfaces, its companion rules go there.
    let Some(ns) = svcproxy_testkit::netns::Netns::create("bench_sync", "ebpf-plane", &[]) else {
        println!("  ebpf: cannot create a network namespace here");
        return;
    };
    let inside = |f: &mut (dyn FnMut() -> Result<common::Synced, svcproxy_dataplane::DataPlaneError>
                            + Send)| {
        svcproxy_testkit::netns::in_netns(&ns.name, f).expect("entering the plane's namespace")
    };
    let mut state = cluster(&[]);
    // In pieces: the test harness reads at most 100,000 documents a YAML.
    for start in (0..n).step_by(20_000) {
        upsert(
            &mut state,
            &services_yaml(start, (start + 20_000).min(n), m),
        );
    }
    let base = snapshot(&mut state);
    let mut d = Syncer::new(
        plan_config(),
        svcproxy_dataplane::EbpfDataPlane::new(svcproxy_dataplane::EbpfOptions {
            cgroup: conf.cgroup().to_path_buf(),
            pin_dir: conf.pin_dir(),
            host_namespace_only: false,
            xdp: svcproxy_dataplane::ebpf::XdpMode::Off,
            xdp_interfaces: Vec::new(),
            sizes: svcproxy_dataplane::ebpf::MapSizes::DEFAULT,
            timeouts: Default::default(),
        }),
    );
    let t = Instant::now();
    let full = match inside(&mut || d.sync(&base, true)) {
        Ok(r) => r,
        Err(e) => {
            println!("  ebpf: full sync FAILED: {e}");
            return;
        }
    };
    let took = t.elapsed();
    let mut sync = |snap: &svcproxy_core::state::SnapshotUpdate| {
        inside(&mut || d.sync(snap, false))
            .map(|r| {
                format!(
                    "{:?}, {} map writes, in the kernel {:.2} ms",
                    r.kind,
                    r.script_bytes,
                    ms(r.apply_duration)
                )
            })
            .map_err(|e| e.to_string())
    };
    let (med, max, notes) = single_changes(
        &mut state,
        changes,
        |k| services_yaml(n + k, n + k + 1, m),
        &mut sync,
    );
    let (emed, emax, enotes) = single_changes(
        &mut state,
        changes,
        |k| endpoint_moved(k * 97 % n, m, k),
        &mut sync,
    );
    println!(
        "  ebpf: full sync from a fresh process              {:>9.1} ms  ({:.2} x the nftables floor; target <= 0.5; {} map writes; loading, attaching and writing {:.1} ms)\n\
         \x20 ebpf: one service added, median / max          {:>9.2} / {:.2} ms  (target <= 1 ms; {})\n\
         \x20 ebpf: one endpoint moved, median / max         {:>9.2} / {:.2} ms  ({})",
        ms(took),
        took.as_secs_f64() / nft_floor.as_secs_f64(),
        full.script_bytes,
        ms(full.apply_duration),
        ms(med),
        ms(max),
        notes.first().cloned().unwrap_or_default(),
        ms(emed),
        ms(emax),
        enotes.first().cloned().unwrap_or_default(),
    );
    let _ = svcproxy_testkit::netns::in_netns(&ns.name, || {
        svcproxy_dataplane::DataPlane::cleanup(d.plane_mut())
    });
}
