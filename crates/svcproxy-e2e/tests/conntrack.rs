//! UDP conntrack cleanup with real packets: a UDP client keeps sending from one
//! source port to a ClusterIP; its endpoint is replaced; after svcproxy's next sync
//! the same flow reaches the new endpoint — while the old backend keeps running, so
//! only the deletion of the stale conntrack entry can move it (while svcproxy is
//! down, with the old rules in place, the flow is shown staying on the old one). The
//! second test replaces the endpoint while svcproxy is down: the restarted process
//! has no previous snapshot, and its first sync compares the conntrack table with its
//! rules instead, so the flow moves there too. (Before that reconciliation existed,
//! the same steps left the flow on the removed endpoint for as long as one looked.)
//!
//! Address plan (the harness's): service `dns` at `plan::cluster_ip(53)` port 53/UDP
//! → the echo backends' 8080; endpoint A is pod-b0, B is pod-b1 (both behind
//! node-b); the client is pod-a1, behind node-a, source port 40053. svcproxy runs in
//! node-a (and node-b); the flow is NATed in node-a.
//!
//! Needs root (skips cleanly otherwise) and a `svcproxy` binary built from the
//! current tree (`cargo build -p svcproxy` first, as for the other data-plane tests).

// Shared with the other end-to-end test binaries; each uses only part of it.
#[allow(dead_code)]
#[path = "dataplane/support.rs"]
mod support;

use std::time::{Duration, Instant};

use support::*;
use svcproxy_e2e::plan::{self, Family};
use svcproxy_e2e::probe::ProbeLine;
use svcproxy_e2e::{echo_bin, Attempt, Host, NsProcess, ProbeResult, Proto, NODE_A};

// Every test below, once per data plane that NATs in the kernel (`<mode>::<test>`).
per_kernel_mode!(
    after_an_endpoint_is_replaced_the_same_udp_flow_reaches_the_new_one,
    after_a_restart_the_first_sync_clears_a_flow_stuck_on_a_removed_endpoint,
    a_restart_keeps_an_established_tcp_connection_and_a_udp_flow,
    a_flow_that_began_before_the_rules_is_rejected_once_its_service_has_no_endpoints,
);

/// The tests every data plane shares, the userspace proxy's included
/// (`every_mode::<mode>::<test>`).
mod every_mode {
    use super::*;
    per_mode!(once_its_service_is_deleted_the_same_udp_flow_is_dropped);
}

const A: Host = Host::Pod(1, 0);
const B: Host = Host::Pod(1, 1);
const CLIENT: Host = Host::Pod(0, 1);
const CLIENT_PORT: u16 = 40053;
const FILE: &str = "svc-dns.yaml";
/// How long the client sends at most (it stops by itself).
const CLIENT_LIFETIME: Duration = Duration::from_secs(16);
const INTERVAL_MS: u64 = 50;
/// Bound on the flow moving after the manifests changed.
const MOVE_DEADLINE: Duration = Duration::from_secs(5);

fn dns() -> Svc {
    Svc::new("dns", &[plan::cluster_ip(53, Family::V4)]).port(SvcPort::new(
        "dns",
        Proto::Udp,
        53,
        BACKEND_PORT,
    ))
}

fn dns_file(endpoint: Host) -> String {
    dns_file_of(&[endpoint])
}

fn dns_file_of(endpoints: &[Host]) -> String {
    let svc = dns();
    svc_file(&svc, &[Slice::of(&svc, Family::V4, endpoints)])
}

fn pod_ip(h: Host) -> std::net::IpAddr {
    match h {
        Host::Pod(n, p) => plan::pod_ip(n, p, Family::V4),
        other => panic!("{other:?} is not a pod"),
    }
}

/// The long-running client: one UDP request every 50 ms from `CLIENT_PORT`, each
/// waiting up to 300 ms for its answer; stops by itself after `CLIENT_LIFETIME`.
fn start_client(env: &Env) -> NsProcess {
    let bin = echo_bin().expect("svcproxy-echo");
    let bin = bin.to_string_lossy().into_owned();
    let count = (CLIENT_LIFETIME.as_millis() as u64 / (INTERVAL_MS + 10)).to_string();
    let target = sa(dns().cluster_ip(Family::V4), 53).to_string();
    let port = CLIENT_PORT.to_string();
    let interval = INTERVAL_MS.to_string();
    let argv = [
        bin.as_str(),
        "probe",
        "--proto",
        "udp",
        "--target",
        &target,
        "--count",
        &count,
        "--timeout-ms",
        "300",
        "--interval-ms",
        &interval,
        "--source-port",
        &port,
    ];
    env.c
        .spawn(CLIENT, "udp-client", &argv)
        .expect("start the UDP client")
}

/// The client's attempts so far (complete lines only).
fn attempts(client: &NsProcess) -> Vec<Attempt> {
    let out = client.stdout();
    out.lines()
        .filter(|l| l.ends_with('}'))
        .filter_map(|l| serde_json::from_str::<ProbeLine>(l).ok())
        .map(Attempt::from)
        .collect()
}

fn backend(a: &Attempt) -> &str {
    match &a.result {
        ProbeResult::Answered { backend, .. } => backend,
        ProbeResult::TimedOut => "timeout",
        ProbeResult::Refused => "refused",
        _ => "other",
    }
}

fn summary(attempts: &[Attempt]) -> String {
    let mut runs: Vec<(String, usize)> = Vec::new();
    for a in attempts {
        match runs.last_mut() {
            Some((b, n)) if b == backend(a) => *n += 1,
            _ => runs.push((backend(a).to_string(), 1)),
        }
    }
    runs.iter()
        .map(|(b, n)| format!("{b}×{n}"))
        .collect::<Vec<_>>()
        .join(" → ")
}

/// Waits (bounded) until `done` holds for the client's attempts after the first
/// `from`; returns them and whether it held.
fn wait_attempts(
    client: &NsProcess,
    from: usize,
    deadline: Duration,
    done: impl Fn(&[Attempt]) -> bool,
) -> (Vec<Attempt>, bool) {
    let start = Instant::now();
    loop {
        let all = attempts(client);
        let after = all.get(from..).unwrap_or_default().to_vec();
        if done(&after) {
            return (after, true);
        }
        if start.elapsed() >= deadline || client.exit_status().is_some() {
            return (after, false);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// The client is on `name`: at least `n` answers, the last `n` all from `name`.
fn settled_on(name: &'static str, n: usize) -> impl Fn(&[Attempt]) -> bool {
    move |a: &[Attempt]| a.len() >= n && a[a.len() - n..].iter().all(|x| backend(x) == name)
}

/// Every answered attempt came from our one source port (one conntrack entry).
fn one_flow(ck: &mut Checks, attempts: &[Attempt]) {
    let ports: Vec<u16> = attempts
        .iter()
        .filter_map(|a| a.local.map(|l| l.port()))
        .collect();
    ck.check(
        !ports.is_empty() && ports.iter().all(|p| *p == CLIENT_PORT),
        || format!("the client must send from port {CLIENT_PORT} only, saw {ports:?}"),
    );
}

fn wait_rules_mention(env: &Env, ip: std::net::IpAddr, present: bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        let rules = env.ruleset(NODE_A);
        let has = rules
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .any(|t| t == ip.to_string());
        if has == present {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn after_an_endpoint_is_replaced_the_same_udp_flow_reaches_the_new_one(mode: Mode) {
    let Some(env) = Env::start(mode, EnvSpec::default(), &[(FILE, dns_file(A))]) else {
        return;
    };
    let mut ck = Checks::new("conntrack cleanup");
    let client = start_client(&env);
    let (before, ok) = wait_attempts(&client, 0, Duration::from_secs(5), settled_on("pod-b0", 5));
    ck.check(ok, || {
        format!(
            "before the change the flow must reach pod-b0: {}",
            summary(&before)
        )
    });

    // Replace A by B; A's backend keeps running, so a stale entry would keep working.
    let mark = attempts(&client).len();
    let changed = Instant::now();
    env.write(FILE, &dns_file(B));
    ck.check(wait_rules_mention(&env, pod_ip(B), true), || {
        "svcproxy on node-a did not program pod-b1 within 10 s".into()
    });
    let synced = changed.elapsed();
    let (after, moved) = wait_attempts(&client, mark, MOVE_DEADLINE, settled_on("pod-b1", 1));
    let took = changed.elapsed();
    ck.check(moved, || {
        format!(
            "the flow must reach pod-b1 within {MOVE_DEADLINE:?} of the change (rules synced \
             after {synced:?}); got {}",
            summary(&after)
        )
    });
    // And it stays there: ten more attempts, all to B.
    let first_b = after.iter().position(|a| backend(a) == "pod-b1");
    if let Some(i) = first_b {
        let (rest, ok) =
            wait_attempts(&client, mark + i, Duration::from_secs(3), |a| a.len() >= 10);
        ck.check(ok && rest.iter().all(|a| backend(a) == "pod-b1"), || {
            format!(
                "once moved, the flow must stay on pod-b1: {}",
                summary(&rest)
            )
        });
    }
    one_flow(&mut ck, &attempts(&client));
    eprintln!(
        "[conntrack] rules synced {synced:?} after the change, flow on pod-b1 after {took:?}: {}",
        summary(&attempts(&client))
    );
    // The move is svcproxy's doing: it says it deleted the stale entry (the ebpf
    // mode's flows are in its own table, where the programs move a flow whose
    // endpoint left: nothing to delete in the kernel's conntrack).
    if !mode.flows_in_kernel_conntrack() {
        ck.finish(&env);
        return;
    }
    let start = Instant::now();
    let deleted = loop {
        let logs = env.proxy_logs();
        if logs.contains("deleted stale UDP conntrack entries") || start.elapsed() > ANSWER {
            break logs;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    ck.check(
        deleted.contains("deleted stale UDP conntrack entries")
            && !deleted.contains("conntrack cleanup failed"),
        || format!("svcproxy must report deleting the stale entry:\n{deleted}"),
    );
    ck.finish(&env);
}

/// The service is deleted while a client keeps sending from one source port: its
/// cluster IP becomes an unallocated address of the service CIDR, which is dropped, and
/// the flow must be dropped too once svcproxy synced. A stale conntrack entry would
/// keep it on its old path: to the endpoint (still running) in the kernel's modes, or
/// in userspace mode to the proxy's closed socket, which refuses it. Upstream deletes
/// those entries (the endpoints' in the kernel's modes; its userspace proxy cleared the
/// service IP's UDP entries).
fn once_its_service_is_deleted_the_same_udp_flow_is_dropped(mode: Mode) {
    let Some(env) = Env::start(mode, EnvSpec::default(), &[(FILE, dns_file(A))]) else {
        return;
    };
    let mut ck = Checks::new("conntrack after a service deletion");
    let client = start_client(&env);
    let (before, ok) = wait_attempts(&client, 0, Duration::from_secs(5), settled_on("pod-b0", 5));
    ck.check(ok, || {
        format!(
            "before the deletion the flow must reach pod-b0: {}",
            summary(&before)
        )
    });

    let vip = dns().cluster_ip(Family::V4);
    let deleted = Instant::now();
    env.remove(FILE);
    ck.check(wait_rules_mention(&env, vip, false), || {
        format!("svcproxy on node-a did not remove {vip} within 10 s")
    });
    let synced = deleted.elapsed();
    // Attempts that started after the sync (one may have been under way).
    let mark = attempts(&client).len() + 1;
    let (after, dropped) = wait_attempts(&client, mark, MOVE_DEADLINE, settled_on("timeout", 4));
    ck.check(dropped, || {
        format!(
            "the flow must be dropped within {MOVE_DEADLINE:?} of the sync (rules synced \
             {synced:?} after the deletion); got {}",
            summary(&after)
        )
    });
    // Once dropped, it stays dropped: no refusal, no answer.
    let (rest, ok) = wait_attempts(&client, mark + after.len(), Duration::from_secs(3), |a| {
        a.len() >= 4
    });
    ck.check(ok && rest.iter().all(|a| backend(a) == "timeout"), || {
        format!(
            "once dropped, the flow must stay dropped: {}",
            summary(&rest)
        )
    });
    one_flow(&mut ck, &attempts(&client));
    eprintln!(
        "[conntrack] {mode:?}: rules synced {synced:?} after the deletion: {}",
        summary(&attempts(&client))
    );
    ck.finish(&env);
}

/// The endpoint is replaced while svcproxy is down; the restarted proxy's first sync
/// has no previous snapshot, so it compares the kernel's conntrack table with the
/// rules it applies (issue 17 item 3): the flow stuck on the removed endpoint moves.
fn after_a_restart_the_first_sync_clears_a_flow_stuck_on_a_removed_endpoint(mode: Mode) {
    let spec = EnvSpec {
        start_proxies: false,
        ..EnvSpec::default()
    };
    let Some(env) = Env::start(mode, spec, &[(FILE, dns_file(A))]) else {
        return;
    };
    let mut ck = Checks::new("conntrack after restart");
    let once = |what: &str| -> String {
        let mut args = env.proxy_args(NODE_A);
        args.push("--once".into());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = env.run_svcproxy(NODE_A, &args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "svcproxy --once ({what}) failed: {stderr}"
        );
        stderr
    };
    once("before the restart");
    let client = start_client(&env);
    let (before, ok) = wait_attempts(&client, 0, Duration::from_secs(5), settled_on("pod-b0", 5));
    ck.check(ok, || {
        format!(
            "before the change the flow must reach pod-b0: {}",
            summary(&before)
        )
    });

    // svcproxy is down (its rules stay); the endpoint is replaced meanwhile. The old
    // rules and the entry keep the flow on pod-b0 (its backend keeps running).
    env.write(FILE, &dns_file(B));
    let mark = attempts(&client).len();
    let (still, ok) = wait_attempts(&client, mark, Duration::from_secs(3), |a| a.len() >= 5);
    ck.check(ok && still.iter().all(|a| backend(a) == "pod-b0"), || {
        format!(
            "while svcproxy is down the flow stays on pod-b0: {}",
            summary(&still)
        )
    });

    // The restart: a first sync.
    let mark = attempts(&client).len();
    let restarted = Instant::now();
    let logs = once("after the restart");
    ck.check(wait_rules_mention(&env, pod_ip(B), true), || {
        "the new rules must send to pod-b1".into()
    });
    let (after, moved) = wait_attempts(&client, mark, MOVE_DEADLINE, settled_on("pod-b1", 5));
    ck.check(moved, || {
        format!(
            "after the restart the same flow must reach pod-b1 within {MOVE_DEADLINE:?}; got {}",
            summary(&after)
        )
    });
    ck.check(
        !mode.flows_in_kernel_conntrack() || logs.contains("deleted stale UDP conntrack entries"),
        || format!("the restarted svcproxy must report the deletion:\n{logs}"),
    );
    one_flow(&mut ck, &attempts(&client));
    eprintln!(
        "[conntrack] restart: flow on pod-b1 {:?} after the restart: {}",
        restarted.elapsed(),
        summary(&attempts(&client))
    );
    ck.finish(&env);
}

/// A UDP responder on `argv[1]`:53 answering as the echo backends do, as "stray".
const STRAY_RESPONDER: &str = r#"
import json, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 53))
print("listening", flush=True)
while True:
    _, peer = s.recvfrom(2048)
    reply = {"backend": "stray", "ip": sys.argv[1], "port": 53,
             "client": "%s:%d" % peer, "proto": "udp"}
    s.sendto((json.dumps(reply) + "\n").encode(), peer)
"#;

/// kube-proxy 1.38 (k/k#139629): a UDP service port with no usable endpoint loses
/// every conntrack entry to its service IPs, whoever answered and whether or not it
/// was NATed. Before svcproxy runs, the cluster IP is routed, un-NATed, to a pod that
/// holds the address itself and answers (what another proxy or a stale route left;
/// a table of another owner has node-a track connections). That flow is established,
/// so the reject for a service without endpoints, which like upstream's sees only a
/// flow's new packets, never sees it: only deleting the entry makes its next packet
/// new, and refused. (Before, such an entry was kept, and the flow went on to the
/// stray pod, timing out once it went quiet, for as long as the client sent.) The ebpf modes translate each new
/// socket at connect(), before any packet: refused there whatever conntrack holds.
fn a_flow_that_began_before_the_rules_is_rejected_once_its_service_has_no_endpoints(mode: Mode) {
    let spec = EnvSpec {
        start_proxies: false,
        ..EnvSpec::default()
    };
    let Some(env) = Env::start(mode, spec, &[(FILE, dns_file_of(&[]))]) else {
        return;
    };
    let mut ck = Checks::new("conntrack of a service without endpoints");
    let vip = dns().cluster_ip(Family::V4).to_string();
    let tracking = "table inet other-owner {\n chain forward {\n  type filter hook forward \
                    priority 0; policy accept;\n  ct state established counter accept\n }\n}\n";
    env.c
        .nft(Host::Node(NODE_A), tracking)
        .expect("a table that tracks connections");
    let host_route = format!("{vip}/32");
    let node_b = plan::node_ip(1, Family::V4).to_string();
    env.c
        .exec_ok(A, &["ip", "addr", "add", &host_route, "dev", "lo"]);
    env.c.exec_ok(
        Host::Node(1),
        &["ip", "route", "add", &host_route, "dev", "p0"],
    );
    env.c.exec_ok(
        Host::Node(NODE_A),
        &["ip", "route", "add", &host_route, "via", &node_b],
    );
    let stray = env
        .c
        .spawn(A, "stray", &["python3", "-c", STRAY_RESPONDER, &vip])
        .expect("start the stray responder");
    let start = Instant::now();
    while !stray.stdout().contains("listening") && start.elapsed() < ANSWER {
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = start_client(&env);
    let (before, ok) = wait_attempts(&client, 0, Duration::from_secs(5), settled_on("stray", 3));
    ck.check(ok, || {
        format!(
            "before svcproxy runs the flow must reach the stray pod: {}",
            summary(&before)
        )
    });
    // The stray pod stops answering before the sync, silently (the flow's entry
    // stays, the client sending on): an answer in flight when the entry is deleted
    // would make a new entry the other way round, which the client's next packet
    // matches, as in kube-proxy's case (a race of a reply's flight time, left alone
    // here); and a refusal from the pod itself would look like the reject.
    env.c
        .nft(
            A,
            "table inet mute {\n chain input {\n  type filter hook input priority 0;\n  \
             udp dport 53 drop\n }\n}\n",
        )
        .expect("mute the stray pod");
    std::thread::sleep(Duration::from_millis(200));
    let mark = attempts(&client).len();
    let mut args = env.proxy_args(NODE_A);
    args.push("--once".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let synced = Instant::now();
    let out = env.run_svcproxy(NODE_A, &args);
    let logs = String::from_utf8_lossy(&out.stderr).into_owned();
    ck.check(out.status.success(), || {
        format!("svcproxy --once failed: {logs}")
    });
    let (after, refused) = wait_attempts(&client, mark, MOVE_DEADLINE, settled_on("refused", 3));
    ck.check(refused, || {
        let table = env.c.exec(Host::Node(NODE_A), &["conntrack", "-L", "-p", "udp"]);
        format!(
            "once svcproxy synced the service without endpoints, the flow must be refused \
             within {MOVE_DEADLINE:?}; got {}\nnode-a's UDP conntrack entries:\n{}\nsvcproxy:\n{logs}",
            summary(&after),
            String::from_utf8_lossy(&table.stdout)
        )
    });
    ck.check(
        !mode.flows_in_kernel_conntrack() || logs.contains("deleted stale UDP conntrack entries"),
        || format!("svcproxy must report the deletion:\n{logs}"),
    );
    eprintln!(
        "[conntrack] {mode:?}: refused {:?} after the sync started: {}",
        synced.elapsed(),
        summary(&attempts(&client))
    );
    ck.finish(&env);
}

/// A line-echo TCP server on `LINE_PORT`: every line sent on a connection comes back on
/// it (the echo backends answer once and close, so they cannot show a connection
/// living through a restart).
const LINE_SERVER: &str = r#"
import socket, sys, threading
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(16)
print("listening", flush=True)
def serve(c):
    f = c.makefile("rwb", buffering=0)
    for line in f:
        f.write(line)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// The client: one TCP connection and one UDP socket (fixed source port) to the
/// service, a round trip on each every 100 ms for `argv[4]` seconds, one line per round:
/// `tcp ok|err … udp <backend>|timeout`. A TCP failure ends it.
const FLOW_CLIENT: &str = r#"
import json, socket, sys, time
vip, tcp_port, udp_port, seconds, src = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
t = socket.create_connection((vip, tcp_port), timeout=2)
f = t.makefile("rwb", buffering=0)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("0.0.0.0", src))
u.settimeout(0.3)
end = time.time() + seconds
i = 0
while time.time() < end:
    i += 1
    try:
        f.write(b"ping %d\n" % i)
        ok = f.readline() == b"ping %d\n" % i
        tcp = "ok" if ok else "err mismatch"
    except Exception as e:
        tcp = "err " + type(e).__name__
    try:
        u.sendto(b"x", (vip, udp_port))
        udp = json.loads(u.recv(4096))["backend"]
    except Exception:
        udp = "timeout"
    print("%.3f tcp %s udp %s" % (time.time(), tcp, udp), flush=True)
    if tcp != "ok":
        sys.exit(1)
    time.sleep(0.1)
"#;

const LINE_PORT: u16 = 9100;

/// Issue 15's restart fault: an established TCP connection and a UDP flow through a
/// cluster IP, both NATed in node-a, go on through a restart of node-a's svcproxy
/// (SIGTERM, then a new process whose first sync recreates everything and reconciles
/// UDP conntrack entries against its rules): same connection, same UDP backend, no
/// round trip lost.
fn a_restart_keeps_an_established_tcp_connection_and_a_udp_flow(mode: Mode) {
    let svc = Svc::new("flows", &[plan::cluster_ip(54, Family::V4)])
        .port(SvcPort::new("chat", Proto::Tcp, 80, LINE_PORT))
        .port(SvcPort::new("dns", Proto::Udp, 53, BACKEND_PORT));
    let file = svc_file(&svc, &[Slice::of(&svc, Family::V4, &[A])]);
    let Some(mut env) = Env::start(mode, EnvSpec::default(), &[("svc-flows.yaml", file)]) else {
        return;
    };
    let mut ck = Checks::new("flows through a restart");
    let port = LINE_PORT.to_string();
    let server = env
        .c
        .spawn(A, "line-server", &["python3", "-c", LINE_SERVER, &port])
        .expect("start the line server");
    server
        .wait_for_stdout("listening", Duration::from_secs(10))
        .expect("line server up");
    let vip = plan::cluster_ip(54, Family::V4).to_string();
    let src = CLIENT_PORT.to_string();
    let client = env
        .c
        .spawn(
            CLIENT,
            "flow-client",
            &["python3", "-c", FLOW_CLIENT, &vip, "80", "53", "14", &src],
        )
        .expect("start the client");
    let rounds = |c: &NsProcess| -> Vec<(f64, String)> {
        c.stdout()
            .lines()
            .filter_map(|l| {
                let (t, rest) = l.split_once(' ')?;
                Some((t.parse().ok()?, rest.to_string()))
            })
            .collect()
    };
    let wait_rounds = |n: usize, bound: Duration| {
        let start = Instant::now();
        while rounds(&client).len() < n && start.elapsed() < bound && client.is_running() {
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_rounds(10, Duration::from_secs(10));

    // The restart: SIGTERM leaves the rules; the successor recreates them.
    let bin = svcproxy_e2e::svcproxy_bin();
    let stopped_at = now();
    let old = env.proxies.remove(NODE_A);
    ck.check(old.terminate(Duration::from_secs(10)).is_some(), || {
        "svcproxy did not stop on SIGTERM".into()
    });
    std::thread::sleep(Duration::from_secs(1));
    let new = env.spawn_svcproxy(&bin, NODE_A, &[]);
    env.proxies.insert(NODE_A, new);
    env.wait_synced(NODE_A);
    let synced_at = now();
    let n = rounds(&client).len();
    wait_rounds(n + 15, Duration::from_secs(10));
    let _ = client.wait(Duration::from_secs(20));

    let all = rounds(&client);
    let after: Vec<_> = all.iter().filter(|(t, _)| *t > synced_at).collect();
    let during: Vec<_> = all
        .iter()
        .filter(|(t, _)| *t >= stopped_at && *t <= synced_at)
        .collect();
    ck.check(after.len() >= 10, || {
        format!(
            "the client must go on after the restart; its rounds: {all:?}\nstderr: {}",
            client.stderr()
        )
    });
    ck.check(!during.is_empty(), || {
        "no round while svcproxy restarted".into()
    });
    for (t, line) in &all {
        ck.check(line == "tcp ok udp pod-b0", || {
            format!("round at {t} (restart {stopped_at}..{synced_at}): {line}")
        });
    }
    ck.check(client.exit_status().is_some_and(|s| s.success()), || {
        format!(
            "the client failed: {:?} {}",
            client.exit_status(),
            client.stderr()
        )
    });
    eprintln!(
        "[conntrack] restart with flows: {} rounds, {} during the restart, {} after",
        all.len(),
        during.len(),
        after.len()
    );
    ck.finish(&env);
}

/// Wall-clock seconds, as the client prints them.
fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}
