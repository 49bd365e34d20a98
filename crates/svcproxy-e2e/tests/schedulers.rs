//! IPVS's schedulers on the eBPF data plane, shown by real connections: each
//! scheduler's defining property, through the socket path (a pod's connect()) and
//! the packet path (a client outside the cluster, through a NodePort), in the
//! two-node namespace cluster of the data-plane tests.
//!
//! - `rr`: the endpoints answer in turn (ipvs mode's default scheduler);
//! - `sh`: one client, one endpoint (`--ipvs-scheduler=sh`);
//! - `mh`: the same flow (client address and port) meets the same endpoint
//!   through either node, and removing one of four endpoints moves about a
//!   quarter of the flows (ipvs mode, `--ipvs-scheduler=mh`); and a Service's
//!   `svcproxy.io/scheduler: mh` in ebpf mode (whose default is random) gives the
//!   same choice on both nodes.
//!
//! Needs root (skips cleanly otherwise) and a `svcproxy` binary built from the
//! current tree (`cargo build -p svcproxy` first, as for the other data-plane tests).

// Shared with the other end-to-end test binaries; each uses only part of it.
#[allow(dead_code)]
#[path = "dataplane/support.rs"]
mod support;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use support::*;
use svcproxy_e2e::plan::{self, Family};
use svcproxy_e2e::{Host, ProbeSpec, Proto, NODE_A, NODE_B};

const A0: Host = Host::Pod(NODE_A, 0);
const A1: Host = Host::Pod(NODE_A, 1);
const B0: Host = Host::Pod(NODE_B, 0);
const B1: Host = Host::Pod(NODE_B, 1);
const NODE_PORT: u16 = 30480;
const PODS: [&str; 4] = ["pod-a0", "pod-a1", "pod-b0", "pod-b1"];

/// A NodePort service on 80/tcp (NodePort 30480) with `pods` behind it, in both
/// families.
fn service(name: &str, annotations: &[(&str, &str)], pods: &[Host]) -> (Svc, String) {
    let mut svc = Svc::dual(name, 40)
        .node_port()
        .port(SvcPort::new("http", Proto::Tcp, 80, BACKEND_PORT).node_port(NODE_PORT));
    for (k, v) in annotations {
        svc = svc.annotate(k, v);
    }
    let slices: Vec<Slice> = Family::BOTH
        .iter()
        .map(|f| Slice::of(&svc, *f, pods))
        .collect();
    let text = svc_file(&svc, &slices);
    (svc, text)
}

fn start(mode: Mode, flags: &[&str], file: &str) -> Option<Env> {
    Env::start(
        mode,
        EnvSpec {
            flags: flags.iter().map(|f| f.to_string()).collect(),
            ..EnvSpec::default()
        },
        &[("svc.yaml", file.to_string())],
    )
}

/// The backends that answered, in order (`-` for an attempt nobody answered).
fn answers(env: &Env, from: Host, target: SocketAddr, count: usize) -> Vec<String> {
    env.probe(from, Proto::Tcp, target, count, ANSWER)
        .iter()
        .map(|a| a.backend().unwrap_or("-").to_string())
        .collect()
}

/// One connection per source port from the external client to `target`: the
/// backend each flow met.
fn flows(env: &Env, target: SocketAddr, ports: &[u16]) -> BTreeMap<u16, String> {
    ports
        .iter()
        .map(|&port| {
            let spec = ProbeSpec::new(Proto::Tcp, target)
                .source_port(port)
                .timeout(ANSWER);
            let got = env.c.probe_spec(Host::Ext, &spec);
            let backend = got
                .first()
                .and_then(|a| a.backend())
                .unwrap_or("-")
                .to_string();
            (port, backend)
        })
        .collect()
}

/// Whether every window of `n` consecutive answers holds `n` different backends.
fn in_turn(seq: &[String], n: usize) -> bool {
    seq.len() >= n
        && seq.windows(n).all(|w| {
            let mut w: Vec<&String> = w.iter().collect();
            w.sort();
            w.dedup();
            w.len() == n && w.iter().all(|b| *b != "-")
        })
}

#[test]
fn round_robin_gives_each_endpoint_its_turn() {
    let (svc, file) = service("rr", &[], &[A0, B0, B1]);
    // ipvs mode's default scheduler is rr.
    let Some(env) = start(Mode::Ipvs, &[], &file) else {
        return;
    };
    let mut ck = Checks::new("rr");
    for f in Family::BOTH {
        let fam = family_name(f);
        // The socket path: a pod's connections to the cluster IP.
        let seq = answers(&env, A1, sa(svc.cluster_ip(f), 80), 12);
        ck.check(in_turn(&seq, 3), || {
            format!("{fam}: a pod's 12 connections not in turn over 3 endpoints: {seq:?}")
        });
        // The packet path: the external client through node-a's NodePort.
        let node = plan::node_ip(NODE_A, f);
        let seq = answers(&env, Host::Ext, sa(node, NODE_PORT), 12);
        ck.check(in_turn(&seq, 3), || {
            format!("{fam}: the NodePort's 12 connections not in turn over 3 endpoints: {seq:?}")
        });
    }
    ck.finish(&env);
}

#[test]
fn source_hashing_keeps_each_client_on_one_endpoint() {
    let (svc, file) = service("sh", &[], &[A0, A1, B0, B1]);
    let Some(env) = start(Mode::Ipvs, &["--ipvs-scheduler=sh"], &file) else {
        return;
    };
    let mut ck = Checks::new("sh");
    for f in Family::BOTH {
        let fam = family_name(f);
        for (what, from, target) in [
            ("pod-a1 to the cluster IP", A1, sa(svc.cluster_ip(f), 80)),
            ("pod-b0 to the cluster IP", B0, sa(svc.cluster_ip(f), 80)),
            (
                "the external client to node-a's NodePort",
                Host::Ext,
                sa(plan::node_ip(NODE_A, f), NODE_PORT),
            ),
        ] {
            let seq = answers(&env, from, target, 10);
            let mut seen = seq.clone();
            seen.sort();
            seen.dedup();
            ck.check(seen.len() == 1 && seen[0] != "-", || {
                format!("{fam}: {what}: 10 connections met {seen:?}, one endpoint expected")
            });
        }
    }
    ck.finish(&env);
}

/// A second address on each node's LAN interface, so that a flow already seen
/// through one address can be seen afresh (the packet path remembers a client
/// port's endpoint for a minute).
fn second_node_ip(node: usize) -> IpAddr {
    IpAddr::from([198, 18, 0, 11 + node as u8])
}

/// A third one, for a third look at the same flows.
fn third_node_ip(node: usize) -> IpAddr {
    IpAddr::from([198, 18, 0, 21 + node as u8])
}

#[test]
fn maglev_makes_the_same_choice_on_every_node_and_moves_few_flows() {
    let (_, file) = service("mh", &[], &[A0, A1, B0, B1]);
    let Some(mut env) = Env::start(
        Mode::Ipvs,
        EnvSpec {
            start_proxies: false,
            ..EnvSpec::default()
        },
        &[("svc.yaml", file)],
    ) else {
        return;
    };
    // ipvs mode answers NodePorts on every local address: the second and third
    // ones too.
    for n in [NODE_A, NODE_B] {
        for ip in [second_node_ip(n), third_node_ip(n)] {
            let ip = format!("{ip}/24");
            env.c
                .exec_ok(Host::Node(n), &["ip", "addr", "add", &ip, "dev", "eth0"]);
        }
    }
    let bin = svcproxy_e2e::bins::svcproxy_bin();
    for n in [NODE_A, NODE_B] {
        let p = env.spawn_svcproxy(&bin, n, &["--ipvs-scheduler=mh".to_string()]);
        env.proxies.push(p);
    }
    for n in [NODE_A, NODE_B] {
        env.wait_synced(n);
    }
    let mut ck = Checks::new("mh");
    let ports: Vec<u16> = (41000..41080).collect();
    let via = |node: IpAddr| sa(node, NODE_PORT);
    let a = flows(&env, via(plan::node_ip(NODE_A, Family::V4)), &ports);
    let b = flows(&env, via(plan::node_ip(NODE_B, Family::V4)), &ports);
    let unanswered = a.values().chain(b.values()).filter(|x| *x == "-").count();
    ck.check(unanswered == 0, || {
        format!("{unanswered} flows unanswered: node-a {a:?} node-b {b:?}")
    });
    let differ: Vec<u16> = ports.iter().copied().filter(|p| a[p] != b[p]).collect();
    ck.check(differ.is_empty(), || {
        format!("flows from the same client port met different endpoints through node-a and node-b: ports {differ:?}\nnode-a {a:?}\nnode-b {b:?}")
    });
    let mut share: BTreeMap<&str, usize> = BTreeMap::new();
    for x in a.values() {
        *share.entry(x.as_str()).or_default() += 1;
    }
    eprintln!("[schedulers] mh: 80 flows over 4 endpoints: {share:?}");
    ck.check(
        PODS.iter().all(|p| share.get(p).is_some_and(|n| *n >= 8)),
        || format!("80 flows spread unevenly over 4 endpoints: {share:?}"),
    );

    // pod-b1 goes: only its flows move (and few others).
    let (_, file) = service("mh", &[], &[A0, A1, B0]);
    env.write("svc.yaml", &file);
    let gone = plan::pod_ip(NODE_B, 1, Family::V4);
    let deadline = Instant::now() + Duration::from_secs(20);
    while [NODE_A, NODE_B].iter().any(|n| {
        env.mode
            .dump(&env.c, *n)
            .contains(&format!("{gone}:{BACKEND_PORT}"))
    }) {
        assert!(
            Instant::now() < deadline,
            "pod-b1 still in the maps after 20 s"
        );
        thread::sleep(Duration::from_millis(100));
    }
    let after = flows(&env, via(second_node_ip(NODE_A)), &ports);
    let after_b = flows(&env, via(second_node_ip(NODE_B)), &ports);
    let differ: Vec<u16> = ports
        .iter()
        .copied()
        .filter(|p| after[p] != after_b[p])
        .collect();
    ck.check(differ.is_empty(), || {
        format!("after the removal, node-a and node-b disagree on ports {differ:?}")
    });
    let on_gone = ports.iter().filter(|p| a[p] == "pod-b1").count();
    let moved_needlessly: Vec<u16> = ports
        .iter()
        .copied()
        .filter(|p| a[p] != "pod-b1" && after[p] != a[p])
        .collect();
    let stranded = ports
        .iter()
        .filter(|p| after[p] == "pod-b1" || after[p] == "-")
        .count();
    eprintln!(
        "[schedulers] mh: pod-b1 held {on_gone} of 80 flows; {} others moved",
        moved_needlessly.len()
    );
    ck.check(stranded == 0, || {
        format!("{stranded} flows still meet pod-b1 or nobody: {after:?}")
    });
    // Maglev moves the removed endpoint's flows and, of the others, a few
    // percent at most (8 of 80 would be 10%).
    ck.check(moved_needlessly.len() <= 8, || {
        format!(
            "{} flows of the remaining endpoints moved: ports {moved_needlessly:?}",
            moved_needlessly.len()
        )
    });

    // pod-b0 goes too: 3 endpoints to 2, where a table sized from the count
    // would have halved (509 cells to 251) and moved most flows. One size per
    // service keeps at least 80% of the remaining endpoints' flows in place.
    let (_, file) = service("mh", &[], &[A0, A1]);
    env.write("svc.yaml", &file);
    let gone = plan::pod_ip(NODE_B, 0, Family::V4);
    let deadline = Instant::now() + Duration::from_secs(20);
    while [NODE_A, NODE_B].iter().any(|n| {
        env.mode
            .dump(&env.c, *n)
            .contains(&format!("{gone}:{BACKEND_PORT}"))
    }) {
        assert!(
            Instant::now() < deadline,
            "pod-b0 still in the maps after 20 s"
        );
        thread::sleep(Duration::from_millis(100));
    }
    // The same client ports seen afresh, through a third address of node-a (the
    // packet path remembers a client port's endpoint for a minute per address).
    let third = flows(&env, via(third_node_ip(NODE_A)), &ports);
    let kept: Vec<u16> = ports
        .iter()
        .copied()
        .filter(|p| after[p] != "pod-b0" && third[p] == after[p])
        .collect();
    let others = ports.iter().filter(|p| after[p] != "pod-b0").count();
    eprintln!(
        "[schedulers] mh: 3 to 2 endpoints: {} of {others} flows of the remaining endpoints kept",
        kept.len()
    );
    ck.check(kept.len() * 10 >= others * 8, || {
        format!(
            "only {} of {others} flows of the remaining endpoints kept their endpoint: before {after:?} after {third:?}",
            kept.len()
        )
    });
    ck.finish(&env);
}

#[test]
fn a_services_maglev_annotation_is_honoured_in_ebpf_mode() {
    let (_, file) = service(
        "mh-annotated",
        &[("svcproxy.io/scheduler", "mh")],
        &[A0, A1, B0, B1],
    );
    let Some(env) = start(Mode::Ebpf, &[], &file) else {
        return;
    };
    let mut ck = Checks::new("mh annotation");
    let ports: Vec<u16> = (42000..42040).collect();
    let a = flows(
        &env,
        sa(plan::node_ip(NODE_A, Family::V4), NODE_PORT),
        &ports,
    );
    let b = flows(
        &env,
        sa(plan::node_ip(NODE_B, Family::V4), NODE_PORT),
        &ports,
    );
    let differ: Vec<u16> = ports.iter().copied().filter(|p| a[p] != b[p]).collect();
    ck.check(differ.is_empty() && a.values().all(|x| x != "-"), || {
        format!("ports {differ:?} met different endpoints through the two nodes\nnode-a {a:?}\nnode-b {b:?}")
    });
    let state = env.mode.dump(&env.c, NODE_A);
    ck.check(state.contains("[mh]"), || {
        format!("node-a's maps do not show the mh list:\n{state}")
    });
    ck.finish(&env);
}

/// Holds `n` connections to `target` open from the process it runs in, one after
/// the other, and prints the backends that answered as one JSON line.
fn holder_script(target: SocketAddr, n: usize) -> String {
    format!(
        "import json, socket, sys, time\n\
         held, names = [], []\n\
         for _ in range({n}):\n\
         \x20   s = socket.create_connection(('{ip}', {port}), timeout=5)\n\
         \x20   names.append(json.loads(s.makefile().readline())['backend'])\n\
         \x20   held.append(s)\n\
         print(json.dumps(names), flush=True)\n\
         time.sleep(120)\n",
        ip = target.ip(),
        port = target.port(),
    )
}

/// A process of node-a (whose connections are translated at connect() and count
/// until their sockets close) holding `n` connections to `target`: the process,
/// and how many went to each backend.
fn hold(
    env: &Env,
    target: SocketAddr,
    n: usize,
) -> (svcproxy_e2e::NsProcess, BTreeMap<String, usize>) {
    let script = holder_script(target, n);
    let holder = env
        .c
        .spawn(Host::Node(NODE_A), "holder", &["python3", "-c", &script])
        .expect("spawn the holder");
    let line = holder
        .wait_for_stdout("]", Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("the holder's connections: {e}\n{}", holder.logs()));
    let held: Vec<String> = serde_json::from_str(line.lines().last().unwrap_or("[]")).unwrap();
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for b in held {
        *count.entry(b).or_default() += 1;
    }
    (holder, count)
}

#[test]
fn least_connection_sends_new_connections_away_from_an_endpoint_holding_long_ones() {
    let (svc, file) = service("lc", &[], &[A0, B0, B1]);
    let Some(env) = start(Mode::Ipvs, &["--ipvs-scheduler=lc"], &file) else {
        return;
    };
    let mut ck = Checks::new("lc");
    let vip = sa(svc.cluster_ip(Family::V4), 80);
    // A process of node-a holds four connections: lc spreads them 2, 1, 1.
    let (holder, count) = hold(&env, vip, 4);
    let mut spread: Vec<usize> = count.values().copied().collect();
    spread.sort();
    ck.check(spread == [1, 1, 2], || {
        format!("4 held connections spread {count:?}, lc gives 2, 1, 1")
    });
    let busy = count
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(b, _)| b.to_string())
        .unwrap_or_default();
    let busy_ip = match busy.as_str() {
        "pod-a0" => plan::pod_ip(NODE_A, 0, Family::V4),
        "pod-b0" => plan::pod_ip(NODE_B, 0, Family::V4),
        _ => plan::pod_ip(NODE_B, 1, Family::V4),
    };
    let state = env.mode.dump(&env.c, NODE_A);
    ck.check(
        state.contains(&format!("connections {busy_ip}:{BACKEND_PORT} 2")),
        || format!("node-a's maps do not count 2 connections for {busy}:\n{state}"),
    );
    // New connections, each closed before the next, through the socket path (the
    // node's) and through the packet path (a pod's, the outside client's):
    // never to the endpoint holding two.
    for (what, from, target) in [
        ("node-a's", Host::Node(NODE_A), vip),
        ("pod-a0's", A0, vip),
        (
            "the external client's (NodePort)",
            Host::Ext,
            sa(plan::node_ip(NODE_A, Family::V4), NODE_PORT),
        ),
    ] {
        let seq = answers(&env, from, target, 12);
        ck.check(seq.iter().all(|b| b != "-" && *b != busy), || {
            format!("{what} 12 connections met {seq:?}; {busy} holds two")
        });
    }
    // The holder's sockets released (its process gone), every count is back
    // to 0 (the packet path's connections were released at their FIN).
    holder.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    let settled = loop {
        let state = env.mode.dump(&env.c, NODE_A);
        let live: Vec<&str> = state
            .lines()
            .filter(|l| {
                (l.starts_with("connections ") || l.starts_with("packet-connections "))
                    && !l.ends_with(" 0")
            })
            .collect();
        if live.is_empty() {
            break Ok(());
        }
        if Instant::now() >= deadline {
            break Err(live.join("\n"));
        }
        thread::sleep(Duration::from_millis(100));
    };
    ck.check(settled.is_ok(), || {
        format!(
            "connections still counted after every one closed:\n{}",
            settled.clone().unwrap_err()
        )
    });
    // Nothing open: every endpoint ties at 0, and a tie goes to the first of a
    // scan from a random slot, so short connections one at a time (each made
    // once every count is back to 0) spread; from slot 0 they all met one
    // endpoint, on every node.
    let counts_at_zero = || {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let state = env.mode.dump(&env.c, NODE_A);
            let busy = state.lines().any(|l| {
                (l.starts_with("connections ") || l.starts_with("packet-connections "))
                    && !l.ends_with(" 0")
            });
            if !busy {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
    };
    for (what, from, target) in [
        ("node-a's", Host::Node(NODE_A), vip),
        (
            "the external client's (NodePort)",
            Host::Ext,
            sa(plan::node_ip(NODE_A, Family::V4), NODE_PORT),
        ),
    ] {
        let mut seq = Vec::new();
        for _ in 0..12 {
            counts_at_zero();
            seq.extend(answers(&env, from, target, 1));
        }
        eprintln!("[schedulers] lc: {what} 12 connections one at a time: {seq:?}");
        let mut met: Vec<&String> = seq.iter().filter(|b| *b != "-").collect();
        met.sort();
        met.dedup();
        ck.check(met.len() >= 2, || {
            format!("{what} 12 connections one at a time, all counts 0, met only {met:?}: {seq:?}")
        });
    }
    ck.finish(&env);
}

#[test]
fn weighted_round_robin_gives_each_endpoint_its_weight_in_ipvs_order() {
    // pod-a0 weighs 3 by its address, node-b's endpoints 1 (the default); pod-b1
    // 2 by node-b's entry but 1 by its own address, which wins.
    let a0 = plan::pod_ip(NODE_A, 0, Family::V4);
    let b1 = plan::pod_ip(NODE_B, 1, Family::V4);
    let weights = format!("{a0}=3, node-b=2, {b1}=1");
    let (svc, file) = service(
        "wrr",
        &[("svcproxy.io/endpoint-weights", weights.as_str())],
        &[A0, B0, B1],
    );
    let Some(env) = start(Mode::Ipvs, &["--ipvs-scheduler=wrr"], &file) else {
        return;
    };
    let mut ck = Checks::new("wrr");
    // IPVS's wrr for weights 3, 2, 1 (address order): a0; a0 b0; a0 b0 b1.
    let round = ["pod-a0", "pod-a0", "pod-b0", "pod-a0", "pod-b0", "pod-b1"];
    for (what, from, target) in [
        (
            "node-a's",
            Host::Node(NODE_A),
            sa(svc.cluster_ip(Family::V4), 80),
        ),
        (
            "the external client's (NodePort)",
            Host::Ext,
            sa(plan::node_ip(NODE_A, Family::V4), NODE_PORT),
        ),
    ] {
        let seq = answers(&env, from, target, 18);
        // The rounds, from wherever the turn counter stood.
        let ok = (0..round.len()).any(|shift| {
            seq.iter()
                .enumerate()
                .all(|(i, b)| *b == round[(i + shift) % round.len()])
        });
        ck.check(ok, || {
            format!("{what} 18 connections met {seq:?}; IPVS's wrr for 3, 2, 1 repeats {round:?}")
        });
    }
    ck.finish(&env);
}

#[test]
fn weighted_least_connection_holds_connections_in_proportion_to_the_weights() {
    let a0 = plan::pod_ip(NODE_A, 0, Family::V4);
    let weights = format!("{a0}=3");
    let (svc, file) = service(
        "wlc",
        &[("svcproxy.io/endpoint-weights", weights.as_str())],
        &[A0, B0, B1],
    );
    let Some(env) = start(Mode::Ipvs, &["--ipvs-scheduler=wlc"], &file) else {
        return;
    };
    let mut ck = Checks::new("wlc");
    // Five connections held from node-a: the fewest per unit of weight each
    // time gives pod-a0 (weight 3) three, the others one each (lc would give
    // 2, 2, 1).
    let (holder, count) = hold(&env, sa(svc.cluster_ip(Family::V4), 80), 5);
    let want: BTreeMap<String, usize> = [("pod-a0", 3), ("pod-b0", 1), ("pod-b1", 1)]
        .map(|(b, n)| (b.to_string(), n))
        .into();
    ck.check(count == want, || {
        format!("5 held connections spread {count:?}, wlc with weights 3, 1, 1 gives {want:?}")
    });
    holder.kill();
    ck.finish(&env);
}

#[test]
fn an_idle_udp_flow_is_scheduled_afresh_after_the_ipvs_udp_timeout() {
    let svc = Svc::dual("udp-idle", 41)
        .node_port()
        .port(SvcPort::new("dns", Proto::Udp, 53, BACKEND_PORT).node_port(30481));
    let slices: Vec<Slice> = Family::BOTH
        .iter()
        .map(|f| Slice::of(&svc, *f, &[A0, B0, B1]))
        .collect();
    let file = svc_file(&svc, &slices);
    let Some(env) = start(Mode::Ipvs, &["--ipvs-udp-timeout=2s"], &file) else {
        return;
    };
    let mut ck = Checks::new("udp timeout");
    let target = sa(plan::node_ip(NODE_A, Family::V4), 30481);
    let datagram = || {
        let spec = ProbeSpec::new(Proto::Udp, target)
            .source_port(45053)
            .timeout(ANSWER);
        env.c
            .probe_spec(Host::Ext, &spec)
            .first()
            .and_then(|a| a.backend())
            .unwrap_or("-")
            .to_string()
    };
    // One flow (the client's port 45053): it keeps its endpoint while it is
    // busy, and is scheduled afresh (rr: the next endpoint) once idle past 2 s.
    let first = datagram();
    let again = datagram();
    ck.check(first != "-" && again == first, || {
        format!("a busy UDP flow moved: {first} then {again}")
    });
    thread::sleep(Duration::from_millis(3500));
    let after = datagram();
    ck.check(after != "-" && after != first, || {
        format!("a UDP flow idle past --ipvs-udp-timeout=2s kept {first} ({after}); rr gives the next endpoint")
    });
    ck.finish(&env);
}
