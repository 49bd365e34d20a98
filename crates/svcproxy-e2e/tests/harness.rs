//! Proves the harness itself, before any svcproxy is involved: the namespace cluster routes
//! what it should and nothing more, the echo tool reports true addresses, a probe tells a
//! refusal from a timeout, SCTP survives conntrack NAT, and nothing is left behind.
//!
//! Every test builds its own cluster (about a quarter of a second), so tests stay
//! independent and can run in parallel. Address plan: `svcproxy_e2e::plan`.

use std::net::{IpAddr, SocketAddr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use svcproxy_e2e::plan::{self, Family};
use svcproxy_e2e::{
    netns, tally, BackendPorts, Cluster, ClusterSpec, Host, ProbeResult, ProbeSpec, Proto,
    SctpMode, NODE_A, NODE_B,
};

const PORT: u16 = 8080;
const CLOSED_PORT: u16 = 9999;
const SHORT: Duration = Duration::from_millis(300);
const NORMAL: Duration = Duration::from_secs(2);

fn cluster(pods_per_node: usize) -> Cluster {
    Cluster::create(ClusterSpec {
        pods_per_node,
        ..ClusterSpec::default()
    })
    .expect("create cluster")
}

fn sa(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

/// Protocols to exercise: SCTP only where this kernel (or the raw emulation) allows it.
fn protos(c: &Cluster) -> Vec<Proto> {
    if c.sctp_mode() == SctpMode::Unavailable {
        eprintln!("SCTP unavailable here: SCTP cases skipped");
        vec![Proto::Tcp, Proto::Udp]
    } else {
        Proto::ALL.to_vec()
    }
}

/// Asserts a single answered attempt from `backend` that saw `client_ip`.
fn assert_answered(attempts: &[svcproxy_e2e::Attempt], backend: &str, client_ip: IpAddr) {
    assert!(!attempts.is_empty());
    for a in attempts {
        match &a.result {
            ProbeResult::Answered {
                backend: b,
                client_seen,
                ..
            } => {
                assert_eq!(b, backend, "{a:?}");
                assert_eq!(client_seen.ip(), client_ip, "{a:?}");
            }
            other => panic!("expected an answer from {backend}, got {other:?}"),
        }
    }
}

#[test]
fn pods_reach_pods_on_the_same_node_and_across_nodes_in_both_families() {
    if !svcproxy_e2e::require_root_or_skip() {
        return;
    }
    let c = cluster(2);
    let _b = c.start_backends(&BackendPorts::all(&[PORT])).unwrap();
    let from = Host::Pod(NODE_A, 0);
    for family in Family::BOTH {
        for (to, name) in [
            (Host::Pod(NODE_A, 1), "pod-a1"),
            (Host::Pod(NODE_B, 1), "pod-b1"),
        ] {
            for proto in [Proto::Tcp, Proto::Udp] {
                let got = c.probe(from, proto, sa(c.ip(to, family), PORT), 2, NORMAL);
                // No NAT anywhere in the bare cluster: the backend sees the pod's own IP.
                assert_answered(&got, name, c.ip(from, family));
            }
        }
    }
}

#[test]
fn echo_reports_backend_address_and_client_address_for_every_protocol() {
    if !svcproxy_e2e::require_root_or_skip() {
        return;
    }
    let c = cluster(1);
    let _b = c.start_backends(&BackendPorts::all(&[PORT])).unwrap();
    let (from, to) = (Host::Pod(NODE_B, 0), Host::Pod(NODE_A, 0));
    for proto in protos(&c) {
        for family in Family::BOTH {
            let target = sa(c.ip(to, family), PORT);
            let got = c.probe_spec(
                from,
                &ProbeSpec::new(proto, target)
                    .count(1)
                    .timeout(NORMAL)
                    .source_port(40123),
            );
            let expected = ProbeResult::Answered {
                backend: "pod-a0".into(),
                backend_ip: target.ip(),
                backend_port: PORT,
                client_seen: sa(c.ip(from, family), 40123),
            };
            assert_eq!(got[0].result, expected, "{proto} {family:?}");
            assert_eq!(got[0].local, Some(sa(c.ip(from, family), 40123)));
        }
    }
}

#[test]
fn ext_reaches_node_ips_but_never_pod_ips() {
    if !svcproxy_e2e::require_root_or_skip() {
        return;
    }
    let c = cluster(1);
    let _b = c.start_backends(&BackendPorts::all(&[PORT])).unwrap();
    let ports = BackendPorts {
        tcp: vec![PORT],
        udp: vec![PORT],
        sctp: vec![],
    };
    let _na = c
        .start_backend(Host::Node(NODE_A), "node-a", &ports)
        .unwrap();
    let _nb = c
        .start_backend(Host::Node(NODE_B), "node-b", &ports)
        .unwrap();
    for family in Family::BOTH {
        for (node, name) in [(NODE_A, "node-a"), (NODE_B, "node-b")] {
            let got = c.probe(
                Host::Ext,
                Proto::Tcp,
                sa(c.ip(Host::Node(node), family), PORT),
                1,
                NORMAL,
            );
            assert_answered(&got, name, plan::ext_ip(family));
        }
        // Pod IPs are not routed from outside: the packets die in the LAN router's
        // blackhole, which is a timeout, not an error.
        for pod in [Host::Pod(NODE_A, 0), Host::Pod(NODE_B, 0)] {
            for proto in [Proto::Tcp, Proto::Udp] {
                let got = c.probe(Host::Ext, proto, sa(c.ip(pod, family), PORT), 1, SHORT);
                assert!(
                    got[0].is_timeout(),
                    "{proto} {family:?} to {pod:?}: {got:?}"
                );
            }
        }
        // Nor are cluster IPs.
        let got = c.probe(
            Host::Ext,
            Proto::Tcp,
            sa(plan::cluster_ip(10, family), 80),
            1,
            SHORT,
        );
        assert!(got[0].is_timeout(), "{got:?}");
    }
}

#[test]
fn a_closed_port_is_refused_at_once() {
    if !svcproxy_e2e::require_root_or_skip() {
        return;
    }
    let c = cluster(1);
    let _b = c.start_backends(&BackendPorts::all(&[PORT])).unwrap();
    // A closed port next to an open one (the echo server answers SCTP INIT to it with
    // ABORT), and a host with no server at all (in raw SCTP mode the kernel answers with
    // ICMP protocol-unreachable): both are refusals.
    let targets = [Host::Pod(NODE_B, 0), Host::Node(NODE_B)];
    for proto in protos(&c) {
        for (family, to) in Family::BOTH
            .into_iter()
            .flat_map(|f| targets.map(|t| (f, t)))
        {
            let target = sa(c.ip(to, family), CLOSED_PORT);
            let got = c.probe(
                Host::Pod(NODE_A, 0),
                proto,
                target,
                3,
                Duration::from_secs(3),
            );
            for a in &got {
                assert!(a.is_refused(), "{proto} {family:?}: {a:?}");
                assert!(
                    a.elapsed < Duration::from_secs(1),
                    "{proto} {family:?}: slow {a:?}"
                );
            }
        }
    }
}

/// nftables inside a node namespace decides the outcome a probe reports: DROP is a
/// timeout, REJECT an immediate refusal, for every protocol and family.
///
/// TCP is rejected with a reset here. An ICMP port-unreachable for a TCP SYN also ends as
/// `Refused`, but often only after the first SYN retransmit (~1 s): on an all-veth path the
/// ICMP comes back while `connect()` still holds the socket lock, and the kernel drops it
/// (`TcpExtLockDroppedIcmps`), reliably so for IPv6. The last case pins that down.
#[test]
fn node_rules_turn_drop_into_timeout_and_reject_into_refusal() {
    if !svcproxy_e2e::require_root_or_skip() {
        return;
    }
    let c = cluster(1);
    let _b = c
        .start_backends(&BackendPorts::all(&[9001, 9002, 9003]))
        .unwrap();
    c.nft(
        Host::Node(NODE_A),
        "table inet harness {
            chain forward_filter {
                type filter hook forward priority 0;
                meta l4proto { tcp, udp, sctp } th dport 9001 drop
                tcp dport 9002 reject with tcp reset
                meta l4proto { udp, sctp } th dport 9002 reject
                tcp dport 9003 reject
            }
        }
        ",
    )
    .unwrap();
    let from = Host::Pod(NODE_B, 0);
    for proto in protos(&c) {
        for family in Family::BOTH {
            let pod = c.ip(Host::Pod(NODE_A, 0), family);
            let dropped = c.probe(from, proto, sa(pod, 9001), 1, SHORT);
            assert!(dropped[0].is_timeout(), "{proto} {family:?}: {dropped:?}");
            // poll(2) may wake a fraction of a millisecond early.
            assert!(
                dropped[0].elapsed >= SHORT * 9 / 10,
                "{proto} {family:?}: {dropped:?}"
            );
            let rejected = c.probe(from, proto, sa(pod, 9002), 1, NORMAL);
            assert!(rejected[0].is_refused(), "{proto} {family:?}: {rejected:?}");
            assert!(
                rejected[0].elapsed < Duration::from_millis(500),
                "{proto} {family:?}: {rejected:?}"
            );
        }
    }
    for family in Family::BOTH {
        let pod = c.ip(Host::Pod(NODE_A, 0), family);
        let icmp = c.probe(from, Proto::Tcp, sa(pod, 9003), 1, Duration::from_secs(3));
        assert!(icmp[0].is_refused(), "{family:?}: {icmp:?}");
    }
}

/// What svcproxy will do, done by hand: DNAT a cluster IP on the client's node to a pod on
/// the other node with a port rewrite, and DNAT + masquerade an external IP for `ext`.
/// Proves conntrack NAT works for every protocol here (for SCTP also through the raw
/// emulation, which must get vtags and CRC32c right for conntrack to pass it), and shows
/// which source a masqueraded packet gets: the address of the interface it leaves by, so
/// the node's LAN IP towards another node's pod but the pod gateway towards a local pod.
#[test]
fn hand_written_dnat_and_masquerade_carry_every_protocol() {
    if !svcproxy_e2e::require_root_or_skip() {
        return;
    }
    let c = cluster(1);
    let _b = c.start_backends(&BackendPorts::all(&[PORT])).unwrap();
    let backend = |f| c.ip(Host::Pod(NODE_A, 0), f);
    let dest = |host: Host, f: Family| match f {
        Family::V4 => format!("{}:{PORT}", c.ip(host, f)),
        Family::V6 => format!("[{}]:{PORT}", c.ip(host, f)),
    };
    let rules = |node_masq: bool| {
        let mut s = String::from("table inet harness {\n");
        s += "chain pre { type nat hook prerouting priority -100;\n";
        for f in Family::BOTH {
            let (fam, vip, eip) = match f {
                Family::V4 => ("ip", plan::cluster_ip(10, f), plan::external_ip(10, f)),
                Family::V6 => ("ip6", plan::cluster_ip(10, f), plan::external_ip(10, f)),
            };
            for (ip, to) in [(vip, Host::Pod(NODE_A, 0)), (eip, Host::Pod(NODE_B, 0))] {
                s += &format!(
                    "{fam} daddr {ip} meta l4proto {{ tcp, udp, sctp }} th dport 80 \
                     meta mark set 0x4000 dnat {fam} to {}\n",
                    dest(to, f)
                );
            }
        }
        s += "}\n";
        if node_masq {
            s += "chain post { type nat hook postrouting priority 100;\n\
                  meta mark 0x4000 masquerade\n}\n";
        }
        s + "}\n"
    };
    c.nft(Host::Node(NODE_B), &rules(false)).unwrap();
    c.nft(Host::Node(NODE_A), &rules(true)).unwrap();
    for proto in protos(&c) {
        for family in Family::BOTH {
            // Pod on node-b to the cluster IP: DNAT on node-b, client IP preserved.
            let got = c.probe(
                Host::Pod(NODE_B, 0),
                proto,
                sa(plan::cluster_ip(10, family), 80),
                2,
                NORMAL,
            );
            assert_answered(&got, "pod-a0", c.ip(Host::Pod(NODE_B, 0), family));
            for a in &got {
                let ProbeResult::Answered {
                    backend_ip,
                    backend_port,
                    ..
                } = a.result
                else {
                    unreachable!()
                };
                assert_eq!((backend_ip, backend_port), (backend(family), PORT));
            }
            // ext to an external IP routed via node-a, DNAT to a pod on node-b: masqueraded
            // to node-a's LAN IP.
            let got = c.probe(
                Host::Ext,
                proto,
                sa(plan::external_ip(10, family), 80),
                2,
                NORMAL,
            );
            assert_answered(&got, "pod-b0", c.ip(Host::Node(NODE_A), family));
            // The same from pod-a0's own node to itself (hairpin): masqueraded to the pod
            // gateway address.
            let got = c.probe(
                Host::Pod(NODE_A, 0),
                proto,
                sa(plan::cluster_ip(10, family), 80),
                1,
                NORMAL,
            );
            assert_answered(&got, "pod-a0", plan::pod_gateway(NODE_A, family));
        }
    }
}

#[test]
fn ext_source_address_and_gateway_node_can_be_chosen() {
    if !svcproxy_e2e::require_root_or_skip() {
        return;
    }
    let c = cluster(0);
    let ports = BackendPorts {
        tcp: vec![PORT],
        udp: vec![],
        sctp: vec![],
    };
    // A node-local server on an external IP: only the node ext routes through answers.
    for (node, name) in [(NODE_A, "node-a"), (NODE_B, "node-b")] {
        for f in Family::BOTH {
            let eip = plan::host_cidr(plan::external_ip(20, f));
            c.exec_ok(Host::Node(node), &["ip", "addr", "add", &eip, "dev", "lo"]);
        }
        std::mem::forget(c.start_backend(Host::Node(node), name, &ports).unwrap());
    }
    for family in Family::BOTH {
        let target = sa(plan::external_ip(20, family), PORT);
        assert_answered(
            &c.probe(Host::Ext, Proto::Tcp, target, 1, NORMAL),
            "node-a",
            plan::ext_ip(family),
        );
        let alt = c.probe_spec(
            Host::Ext,
            &ProbeSpec::new(Proto::Tcp, target).source_ip(plan::ext_alt_ip(family)),
        );
        assert_answered(&alt, "node-a", plan::ext_alt_ip(family));
    }
    c.route_ext_via(NODE_B).unwrap();
    assert_eq!(c.ext_via(), NODE_B);
    for family in Family::BOTH {
        let target = sa(plan::external_ip(20, family), PORT);
        assert_answered(
            &c.probe(Host::Ext, Proto::Tcp, target, 1, NORMAL),
            "node-b",
            plan::ext_ip(family),
        );
    }
    // The forgotten guards above are killed by the cluster itself on drop.
}

/// The helper svcproxy will run under: a process inside a node namespace whose output lands
/// in files (for failure messages) and which stops on request or on drop.
#[test]
fn spawned_processes_run_in_their_namespace_and_log_to_files() {
    if !svcproxy_e2e::require_root_or_skip() {
        return;
    }
    let c = cluster(0);
    let script = "ip -br addr show dev eth0; echo to-stderr >&2; echo started; exec sleep 600";
    let p = c
        .spawn(Host::Node(NODE_B), "proxy-b", &["sh", "-c", script])
        .unwrap();
    let out = p.wait_for_stdout("started", NORMAL).unwrap();
    assert!(
        out.contains("198.18.0.2/24"),
        "not in node-b's namespace: {out}"
    );
    assert!(p.stderr().contains("to-stderr"));
    assert!(p.stdout_path().starts_with(c.log_dir()));
    assert!(p.logs().contains("to-stderr") && p.logs().contains("proxy-b"));
    assert!(p.is_running());
    // SIGTERM is honoured (sleep dies of it), well within the grace period.
    assert!(p.terminate(NORMAL).is_some());
    assert!(!p.is_running());
    // A second process with the same label keeps the first one's logs.
    let again = c
        .spawn(Host::Node(NODE_B), "proxy-b", &["sh", "-c", "echo second"])
        .unwrap();
    again.wait(NORMAL).unwrap();
    assert!(p.stdout().contains("started") && again.stdout().contains("second"));
}

#[test]
fn namespaces_and_processes_are_gone_after_drop_even_after_a_panic() {
    if !svcproxy_e2e::require_root_or_skip() {
        return;
    }
    let c = cluster(1);
    let names = c.namespaces().to_vec();
    assert_eq!(names.len(), 6, "{names:?}");
    assert!(names.iter().all(|n| netns::list_ours().contains(n)));
    let server = c
        .spawn(Host::Node(NODE_A), "sleeper", &["sleep", "600"])
        .unwrap();
    let pid = server.pid().unwrap();
    std::mem::forget(server);
    drop(c);
    let left: Vec<String> = netns::list_ours()
        .into_iter()
        .filter(|n| names.contains(n))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "process {pid} survived"
    );

    let mut seen = Vec::new();
    let mut logs = None;
    let result = catch_unwind(AssertUnwindSafe(|| {
        let c = cluster(1);
        seen = c.namespaces().to_vec();
        logs = Some(c.log_dir().to_path_buf());
        panic!("deliberate panic inside a test using the cluster");
    }));
    assert!(result.is_err());
    // A panicking cluster keeps its logs for a post-mortem; this panic needs none.
    let logs = logs.unwrap();
    assert!(logs.is_dir(), "logs of a failed test must be kept");
    std::fs::remove_dir_all(logs).unwrap();
    assert_eq!(seen.len(), 6);
    let left: Vec<String> = netns::list_ours()
        .into_iter()
        .filter(|n| seen.contains(n))
        .collect();
    assert!(left.is_empty(), "left behind after panic: {left:?}");
}

#[test]
fn two_clusters_coexist_without_sharing_anything() {
    if !svcproxy_e2e::require_root_or_skip() {
        return;
    }
    let one = cluster(1);
    let two = cluster(1);
    assert!(one
        .namespaces()
        .iter()
        .all(|n| !two.namespaces().contains(n)));
    let _b1 = one
        .start_backend(Host::Pod(NODE_A, 0), "one", &BackendPorts::all(&[PORT]))
        .unwrap();
    let _b2 = two
        .start_backend(Host::Pod(NODE_A, 0), "two", &BackendPorts::all(&[PORT]))
        .unwrap();
    // The same addresses in both clusters, each answered by its own backend.
    let target = sa(plan::pod_ip(NODE_A, 0, Family::V4), PORT);
    let from = Host::Pod(NODE_B, 0);
    assert_eq!(
        tally(&one.probe(from, Proto::Tcp, target, 3, NORMAL))["one"],
        3
    );
    assert_eq!(
        tally(&two.probe(from, Proto::Tcp, target, 3, NORMAL))["two"],
        3
    );
    two.close().unwrap();
    assert_eq!(
        tally(&one.probe(from, Proto::Udp, target, 3, NORMAL))["one"],
        3
    );
}

#[test]
fn cleanup_stale_removes_namespaces_of_dead_processes_only() {
    if !svcproxy_e2e::require_root_or_skip() {
        return;
    }
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = format!("svp-{dead}-0-stale");
    let live = format!("svp-{}-999-live", std::process::id());
    {
        let _no_cleanup_meanwhile = netns::cleanup_lock();
        for name in [&stale, &live] {
            let out = std::process::Command::new("ip")
                .args(["netns", "add", name])
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{name}: {err}");
        }
    }
    svcproxy_e2e::cleanup_stale();
    let ours = netns::list_ours();
    netns::delete_namespaces(std::slice::from_ref(&live)).unwrap();
    // Checked by presence, not by cleanup_stale's return value: a cluster created by a
    // concurrent test also cleans up, and may have got there first.
    assert!(!ours.contains(&stale), "stale namespace survived");
    assert!(
        ours.contains(&live),
        "a live process's namespace was removed"
    );
}
