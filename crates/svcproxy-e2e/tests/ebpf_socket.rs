//! The eBPF data plane's socket programs on real sockets: a client process moved
//! into a cgroup the test creates, in a network namespace the test creates,
//! connects to service addresses that exist nowhere, and reaches the endpoints
//! the maps name.
//!
//! Shown here: TCP and UDP (connected, and unconnected with sendto) in IPv4 and
//! IPv6, the service address reported back by getpeername() and as the source
//! of UDP replies, NodePorts on the node's address, REJECT as a refused connect,
//! DROP as a connect that times out, ClientIP affinity, an endpoint removed by a
//! partial sync, `explain --live`'s comparison, the data path staying when the
//! process is gone, a restarted process sweeping what the maps hold beyond its
//! intent, and cleanup removing every pin.
//!
//! Safety: the socket programs attach only to the test's own cgroup (made under
//! a cgroup2 mount of the test's), the packet programs only to interfaces of the
//! namespace the data plane runs in (one the test creates), pins live in a bpffs
//! the test mounts; all are removed at the end, even when the test fails. Traffic stays inside the test's
//! namespace. Without root, BPF or the tools the test prints SKIP (fails under CI).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use svcproxy_core::objects::SourceUpdate;
use svcproxy_core::state::ClusterState;
use svcproxy_dataplane::ebpf::kernel;
use svcproxy_dataplane::{DataPlane, EbpfDataPlane};
use svcproxy_e2e::probe::{ProbeLine, ProbeResult};
use svcproxy_e2e::{ebpf_options, ebpf_runs_here, echo_bin, Attempt, Confinement, NsProcess};
use svcproxy_plan::{build_intent, LocalDetection, PlanConfig};
use svcproxy_sync::Driver;
use svcproxy_testkit::netns::{self, Netns};

const NODE: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {kubernetes.io/hostname: node-a}
spec:
  podCIDRs: ["198.18.1.0/24", "2001:db8:1::/64"]
status:
  addresses:
  - {type: InternalIP, address: 198.18.0.1}
  - {type: InternalIP, address: "2001:db8::1"}
"#;

/// A dual-stack NodePort service `name` with TCP port 80 and UDP port 90 at
/// cluster IPs `198.19.0.<n>` and `2001:db8:ffff::<n>`, and `extra` spec lines.
fn service(name: &str, n: u8, node_ports: Option<(u16, u16)>, extra: &str) -> String {
    let (ty, tcp_np, udp_np) = match node_ports {
        Some((t, u)) => (
            "NodePort",
            format!(", nodePort: {t}"),
            format!(", nodePort: {u}"),
        ),
        None => ("ClusterIP", String::new(), String::new()),
    };
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: demo}}
spec:
  type: {ty}
  clusterIP: 198.19.0.{n}
  clusterIPs: [198.19.0.{n}, "2001:db8:ffff::{n}"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
{extra}
  ports:
  - {{name: http, port: 80, protocol: TCP{tcp_np}}}
  - {{name: echo, port: 90, protocol: UDP{udp_np}}}
"#
    )
}

/// A slice of service `svc` named `name`, with `addrs` on `node` serving both
/// ports at `port`.
fn slice(svc: &str, name: &str, v6: bool, port: u16, node: &str, addrs: &[&str]) -> String {
    let eps: String = addrs
        .iter()
        .map(|a| format!("- {{addresses: [\"{a}\"], nodeName: {node}}}\n"))
        .collect();
    let ty = if v6 { "IPv6" } else { "IPv4" };
    format!(
        r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}
  namespace: demo
  labels: {{kubernetes.io/service-name: {svc}}}
addressType: {ty}
ports:
- {{name: http, port: {port}, protocol: TCP}}
- {{name: echo, port: {port}, protocol: UDP}}
endpoints:
{eps}"#
    )
}

/// `svc`'s endpoints: pod-a at .10 (port 8080) and, with `with_b`, pod-b at .11
/// (port 8081), both on this node, in both families.
fn both_pods(svc: &str, with_b: bool) -> Vec<String> {
    pods(svc, true, with_b)
}

/// `svc`'s endpoints: pod-a at .10 (port 8080) with `with_a`, pod-b at .11 (port
/// 8081) with `with_b`, both on this node, in both families.
fn pods(svc: &str, with_a: bool, with_b: bool) -> Vec<String> {
    let mut v = Vec::new();
    for (pod, with, port, v4, v6) in [
        ("a", with_a, 8080, "198.18.1.10", "2001:db8:1::10"),
        ("b", with_b, 8081, "198.18.1.11", "2001:db8:1::11"),
    ] {
        let (a4, a6): (&[&str], &[&str]) = if with { (&[v4], &[v6]) } else { (&[], &[]) };
        v.push(slice(
            svc,
            &format!("{svc}-{pod}4"),
            false,
            port,
            "node-a",
            a4,
        ));
        v.push(slice(
            svc,
            &format!("{svc}-{pod}6"),
            true,
            port,
            "node-a",
            a6,
        ));
    }
    v
}

fn manifests(with_b: bool) -> Vec<String> {
    let mut docs = vec![NODE.to_string()];
    docs.push(service("web", 10, Some((30080, 30090)), ""));
    docs.extend(both_pods("web", with_b));
    // No endpoint anywhere: REJECT.
    docs.push(service("empty", 20, None, ""));
    // ClientIP affinity over both pods.
    docs.push(service(
        "sticky",
        30,
        None,
        "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}",
    ));
    docs.extend(both_pods("sticky", true));
    // internalTrafficPolicy Local, its only endpoint on another node: DROP.
    docs.push(service(
        "elsewhere",
        40,
        None,
        "  internalTrafficPolicy: Local",
    ));
    docs.push(slice(
        "elsewhere",
        "elsewhere-4",
        false,
        8080,
        "node-b",
        &["198.18.2.10"],
    ));
    docs.push(slice(
        "elsewhere",
        "elsewhere-6",
        true,
        8080,
        "node-b",
        &["2001:db8:2::10"],
    ));
    docs
}

fn state(docs: &[String]) -> ClusterState {
    svcproxy_testkit::objects::state("node-a", docs)
}

fn plan_config() -> PlanConfig {
    PlanConfig {
        local_detection: LocalDetection::NodeCidr(Vec::new()),
        ..PlanConfig::default()
    }
}

/// The test's world: the namespace with the node's and the pods' addresses, the
/// two echo pods, the confinement.
struct World {
    ns: Netns,
    /// Where the data plane runs: the "host" its cookie names, apart from the
    /// clients' namespace (a pod's, to the programs), and the namespace whose
    /// interfaces the packet programs take.
    plane: Netns,
    conf: Confinement,
    _pods: Vec<NsProcess>,
    logs: tempfile::TempDir,
    echo: PathBuf,
}

impl World {
    fn new(test: &str) -> Option<World> {
        let ns = Netns::create(test, "ebpf", &["mount", "umount"])?;
        let plane = Netns::create(test, "ebpf-plane", &[])?;
        let conf = match Confinement::new() {
            Ok(c) => c,
            Err(e) => {
                netns::skip(test, &format!("cannot confine BPF programs: {e}"));
                return None;
            }
        };
        let lines: Vec<String> = [
            "link set lo up",
            "link add node0 type veth peer name node1",
            "link set node1 up",
            "link set node0 up",
            "addr add 198.18.0.1/32 dev node0",
            "addr add 2001:db8::1/128 dev node0 nodad",
            "addr add 198.18.1.10/32 dev lo",
            "addr add 198.18.1.11/32 dev lo",
            "addr add 2001:db8:1::10/128 dev lo nodad",
            "addr add 2001:db8:1::11/128 dev lo nodad",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        netns::ip_batch(&ns.name, &lines).expect("addresses");
        let logs = tempfile::tempdir().expect("log dir");
        let echo = echo_bin().expect("svcproxy-echo");
        let e = echo.to_string_lossy().into_owned();
        let mut pods = Vec::new();
        for (name, port, v4, v6) in [
            ("pod-a", "8080", "198.18.1.10", "2001:db8:1::10"),
            ("pod-b", "8081", "198.18.1.11", "2001:db8:1::11"),
        ] {
            let addrs = format!("{v4},{v6}");
            let argv = [
                e.as_str(),
                "serve",
                "--name",
                name,
                "--tcp",
                port,
                "--udp",
                port,
                "--addr",
                &addrs,
                "--lifetime-secs",
                "300",
            ];
            let p = NsProcess::spawn(&ns.name, &argv, name, logs.path()).expect("echo pod");
            p.wait_for_stdout("\"ready\"", Duration::from_secs(10))
                .expect("echo pod ready");
            pods.push(p);
        }
        Some(World {
            ns,
            plane,
            conf,
            _pods: pods,
            logs,
            echo,
        })
    }

    /// Runs `f` (the data plane's calls) inside the plane's namespace.
    fn in_plane<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        netns::in_netns(&self.plane.name, f).expect("entering the plane's namespace")
    }

    /// `count` probes from a process in the test's cgroup, inside the namespace.
    fn probe(&self, proto: &str, target: &str, count: usize, extra: &[&str]) -> Vec<Attempt> {
        let count = count.to_string();
        let echo = self.echo.to_string_lossy();
        let mut argv = vec![
            "ip",
            "netns",
            "exec",
            &self.ns.name,
            &echo,
            "probe",
            "--proto",
            proto,
            "--target",
            target,
            "--count",
            &count,
            "--timeout-ms",
            "1500",
        ];
        argv.extend_from_slice(extra);
        let mut cmd = self.conf.command(&argv);
        let out = netns::run(&mut cmd, None, Duration::from_secs(120)).expect("probe ran");
        assert!(
            out.status.success(),
            "probe {target}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                serde_json::from_str::<ProbeLine>(l)
                    .unwrap_or_else(|e| panic!("probe line {l:?}: {e}"))
                    .into()
            })
            .collect()
    }

    fn backends(attempts: &[Attempt]) -> BTreeSet<String> {
        attempts.iter().map(|a| a.label()).collect()
    }
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn sockets_in_the_cgroup_reach_endpoints_and_see_the_service_address() {
    let test = "sockets_in_the_cgroup_reach_endpoints_and_see_the_service_address";
    let Some(w) = World::new(test) else { return };
    let mut st = state(&manifests(true));
    let opts = ebpf_options(&w.conf);
    // A kernel without the program types is a machine that cannot run it: its
    // preflight says so. A sync that fails after it is a failure.
    if !ebpf_runs_here(test, &w.plane.name, &opts) {
        return;
    }
    let mut driver = Driver::without_conntrack(plan_config(), EbpfDataPlane::new(opts));
    let snap = st.snapshot();
    if let Err(e) = w.in_plane(|| driver.sync(&snap, true)) {
        panic!("{test}: the first sync failed: {e}");
    }
    let mut failures = Vec::new();
    let mut check = |what: &str, ok: bool, detail: String| {
        if !ok {
            failures.push(format!("{what}: {detail}"));
        }
    };

    for (proto, target, vip) in [
        ("tcp", "198.19.0.10:80", "198.19.0.10:80"),
        ("tcp", "[2001:db8:ffff::10]:80", "[2001:db8:ffff::10]:80"),
        ("udp", "198.19.0.10:90", "198.19.0.10:90"),
        ("udp", "[2001:db8:ffff::10]:90", "[2001:db8:ffff::10]:90"),
        ("tcp", "198.18.0.1:30080", "198.18.0.1:30080"),
        ("udp", "[2001:db8::1]:30090", "[2001:db8::1]:30090"),
    ] {
        let a = w.probe(proto, target, 30, &[]);
        let seen = World::backends(&a);
        check(
            &format!("{proto} {target} spreads over both pods"),
            seen == set(&["pod-a", "pod-b"]),
            format!("{seen:?}"),
        );
        let vip: SocketAddr = vip.parse().unwrap();
        let peers: BTreeSet<Option<SocketAddr>> = a.iter().map(|x| x.peer).collect();
        check(
            &format!("{proto} {target}: the socket's peer is the service address"),
            peers == BTreeSet::from([Some(vip)]),
            format!("{peers:?}"),
        );
    }
    for target in ["198.19.0.10:90", "[2001:db8:ffff::10]:90"] {
        let a = w.probe("udp", target, 20, &["--unconnected"]);
        let from: BTreeSet<Option<SocketAddr>> = a.iter().map(|x| x.peer).collect();
        check(
            &format!("unconnected udp {target}: replies come from the service address"),
            from == BTreeSet::from([Some(target.parse().unwrap())]),
            format!("{from:?} {:?}", World::backends(&a)),
        );
    }
    for target in ["198.19.0.20:80", "[2001:db8:ffff::20]:80"] {
        let a = w.probe("tcp", target, 3, &[]);
        check(
            &format!("{target} (no endpoints) is refused"),
            a.iter().all(Attempt::is_refused),
            format!("{:?}", World::backends(&a)),
        );
    }
    let a = w.probe("tcp", "198.19.0.40:80", 2, &[]);
    check(
        "198.19.0.40:80 (Local policy, endpoints elsewhere) times out",
        a.iter().all(Attempt::is_timeout),
        format!("{:?}", World::backends(&a)),
    );
    for target in ["198.19.0.30:80", "[2001:db8:ffff::30]:80"] {
        let a = w.probe("tcp", target, 20, &[]);
        let seen = World::backends(&a);
        check(
            &format!("{target} (ClientIP affinity) sticks to one pod"),
            seen.len() == 1 && !seen.contains("refused"),
            format!("{seen:?}"),
        );
    }

    // The kernel holds what the plan says.
    let snap = st.snapshot();
    let intent = build_intent(&snap.v4, &snap.v6, &plan_config());
    let cmp = w
        .in_plane(|| driver.plane_mut().compare(&intent))
        .expect("compare");
    check(
        "explain --live finds the maps as planned",
        cmp.differences.is_empty(),
        cmp.differences.join("\n"),
    );

    // pod-b leaves web: a partial sync.
    for doc in both_pods("web", false) {
        for object in svcproxy_testkit::objects::parse(&doc) {
            st.apply(SourceUpdate::Upsert {
                object,
                origin: "test".to_string(),
            });
        }
    }
    let snap = st.snapshot();
    let report = w
        .in_plane(|| driver.sync(&snap, false))
        .expect("partial sync");
    check(
        "the endpoint change is a partial sync",
        !report.kind.is_full(),
        format!("{:?}", report.kind),
    );
    for (proto, target, extra) in [
        ("tcp", "198.19.0.10:80", &[][..]),
        ("tcp", "[2001:db8:ffff::10]:80", &[]),
        ("udp", "198.19.0.10:90", &[]),
        ("udp", "[2001:db8:ffff::10]:90", &["--unconnected"]),
    ] {
        let seen = World::backends(&w.probe(proto, target, 20, extra));
        check(
            &format!("{proto} {target} {extra:?} after pod-b left web"),
            seen == set(&["pod-a"]),
            format!("{seen:?}"),
        );
    }
    let seen = World::backends(&w.probe("tcp", "198.19.0.30:80", 10, &[]));
    check(
        "sticky keeps both pods (its list untouched)",
        seen.len() == 1 && !seen.contains("refused"),
        format!("{seen:?}"),
    );

    // The process goes; the pinned links and maps keep the data path.
    drop(driver);
    let seen = World::backends(&w.probe("tcp", "198.19.0.10:80", 5, &[]));
    check(
        "translation goes on with no svcproxy running",
        seen == set(&["pod-a"]),
        format!("{seen:?}"),
    );

    // A new process whose intent lacks sticky: its first sync sweeps sticky out.
    let mut docs = vec![
        NODE.to_string(),
        service("web", 10, Some((30080, 30090)), ""),
    ];
    docs.extend(both_pods("web", true));
    let mut st2 = state(&docs);
    let mut driver =
        Driver::without_conntrack(plan_config(), EbpfDataPlane::new(ebpf_options(&w.conf)));
    let snap = st2.snapshot();
    w.in_plane(|| driver.sync(&snap, true))
        .expect("restarted full sync");
    let seen = World::backends(&w.probe("tcp", "198.19.0.10:80", 30, &[]));
    check(
        "the restarted process serves both pods again",
        seen == set(&["pod-a", "pod-b"]),
        format!("{seen:?}"),
    );
    let a = w.probe("tcp", "198.19.0.30:80", 2, &[]);
    check(
        "sticky is gone after the restart's sweep (no longer translated)",
        a.iter().all(|x| x.backend().is_none()),
        format!("{:?}", World::backends(&a)),
    );
    let snap = st2.snapshot();
    let intent = build_intent(&snap.v4, &snap.v6, &plan_config());
    let cmp = w
        .in_plane(|| driver.plane_mut().compare(&intent))
        .expect("compare");
    check(
        "after the restart the maps hold exactly the plan",
        cmp.differences.is_empty(),
        cmp.differences.join("\n"),
    );

    // Socket-LB for the host's own processes only: the client's namespace is
    // not the host's (the plane runs in the test's), so it is left alone.
    drop(driver);
    let mut opts = ebpf_options(&w.conf);
    opts.host_namespace_only = true;
    let mut driver = Driver::without_conntrack(plan_config(), EbpfDataPlane::new(opts));
    let snap = st2.snapshot();
    w.in_plane(|| driver.sync(&snap, true))
        .expect("host-only full sync");
    let a = w.probe("tcp", "198.19.0.10:80", 2, &[]);
    check(
        "with host_namespace_only a pod's connection is not translated",
        a.iter().all(|x| x.backend().is_none()),
        format!("{:?}", World::backends(&a)),
    );

    // Cleanup removes every pin and the translation with them.
    w.in_plane(|| driver.plane_mut().cleanup())
        .expect("cleanup");
    let pin_dir = w.conf.pin_dir();
    check(
        "cleanup leaves nothing pinned",
        !pin_dir.exists(),
        format!("{:?}", kernel::pinned(&pin_dir)),
    );
    let a = w.probe("tcp", "198.19.0.10:80", 2, &[]);
    check(
        "no translation after cleanup",
        a.iter().all(|x| x.backend().is_none()),
        format!("{:?}", World::backends(&a)),
    );
    let _ = &w.logs;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A probe kept running in the test's cgroup (`--keep-socket`: one connected UDP
/// socket, a new one after an error), its lines read as they come.
struct KeptClient {
    child: std::process::Child,
    /// Each attempt with when its line was read (as it was printed: the reader
    /// waits on the pipe).
    lines: std::sync::mpsc::Receiver<(std::time::Instant, Attempt)>,
}

impl KeptClient {
    fn start(w: &World, target: &str) -> KeptClient {
        use std::io::BufRead;
        let echo = w.echo.to_string_lossy();
        let mut argv = vec!["ip", "netns", "exec", &w.ns.name, &echo];
        let args = svcproxy_e2e::probe::kept_udp_probe_args(target);
        argv.extend(args.iter().map(String::as_str));
        let mut child = w
            .conf
            .command(&argv)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("probe started");
        let out = child.stdout.take().expect("piped");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let a: Attempt = serde_json::from_str::<ProbeLine>(&l)
                    .unwrap_or_else(|e| panic!("probe line {l:?}: {e}"))
                    .into();
                if tx.send((std::time::Instant::now(), a)).is_err() {
                    return;
                }
            }
        });
        KeptClient { child, lines }
    }

    /// The next attempt's outcome (a panic after 5 s without one).
    fn next(&self) -> (std::time::Instant, Attempt) {
        self.lines
            .recv_timeout(Duration::from_secs(5))
            .expect("the probe answers within 5 s")
    }

    /// Attempts until one satisfies `done` (at most `max`), all returned.
    fn until(
        &self,
        max: usize,
        done: impl Fn(&Attempt) -> bool,
    ) -> Vec<(std::time::Instant, Attempt)> {
        let mut out = Vec::new();
        while out.len() < max {
            let a = self.next();
            let stop = done(&a.1);
            out.push(a);
            if stop {
                break;
            }
        }
        out
    }
}

impl Drop for KeptClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A connected UDP socket translated at connect() follows its endpoint: when
/// the endpoint leaves the service, the sync destroys the socket (the client's
/// call fails and a new socket reaches an endpoint that is there), and when the
/// last endpoint goes, the same; never an answer from an endpoint that left once
/// the sync is done. IPv4 and IPv6. `host`: the clients are the node's own
/// processes (the data plane runs in their namespace); else a pod's (the plane
/// runs in a namespace of its own and enters theirs).
fn connected_udp_sockets_follow_their_endpoints(test: &str, host: bool) {
    let Some(w) = World::new(test) else { return };
    let plane_ns = if host { &w.ns.name } else { &w.plane.name };
    let opts = ebpf_options(&w.conf);
    if !ebpf_runs_here(test, plane_ns, &opts) {
        return;
    }
    let mut st = state(&manifests(true));
    let mut driver = Driver::without_conntrack(plan_config(), EbpfDataPlane::new(opts));
    let mut sync = |st: &mut ClusterState, docs: Vec<String>| {
        for doc in docs {
            for object in svcproxy_testkit::objects::parse(&doc) {
                st.apply(SourceUpdate::Upsert {
                    object,
                    origin: "test".to_string(),
                });
            }
        }
        let snap = st.snapshot();
        netns::in_netns(plane_ns, || driver.sync(&snap, false))
            .expect("entering the plane's namespace")
            .expect("sync");
    };
    sync(&mut st, Vec::new());
    let mut failures = Vec::new();
    let pod_of = |a: &Attempt| a.backend().map(str::to_string);
    for target in ["198.19.0.10:90", "[2001:db8:ffff::10]:90"] {
        sync(&mut st, pods("web", true, true));
        let client = KeptClient::start(&w, target);
        let first = client.until(20, |a| a.backend().is_some());
        let Some(left) = first.last().and_then(|(_, a)| pod_of(a)) else {
            failures.push(format!("{target}: no answer at first: {first:?}"));
            continue;
        };
        let stays = if left == "pod-a" { "pod-b" } else { "pod-a" };
        let local = first.last().and_then(|(_, a)| a.local);
        // The socket's endpoint leaves. Attempts read while the sync ran may be
        // answered by it; of those read after, one (in flight) at most.
        sync(&mut st, pods("web", stays == "pod-a", stays == "pod-b"));
        let synced = std::time::Instant::now();
        let after = client.until(40, |a| a.backend() == Some(stays));
        let late = |v: &[(std::time::Instant, Attempt)], pod: &str| {
            v.iter()
                .filter(|(t, _)| *t > synced)
                .skip(1)
                .any(|(_, a)| a.backend() == Some(pod))
        };
        let moved = after
            .last()
            .map(|(_, a)| a)
            .filter(|a| a.backend() == Some(stays));
        if moved.is_none() || late(&after, &left) {
            failures.push(format!(
                "{target}: after {left} left, the socket went on with {left} or never reached {stays}: {after:?}"
            ));
        }
        let failed_call =
            |(_, a): &(std::time::Instant, Attempt)| matches!(a.result, ProbeResult::Other(_));
        if !after.iter().any(failed_call) || moved.and_then(|a| a.local) == local {
            failures.push(format!(
                "{target}: the socket on {left} was not destroyed (no failed call, or the same socket {local:?}): {after:?}"
            ));
        }
        // The last endpoint goes.
        sync(&mut st, pods("web", false, false));
        let synced = std::time::Instant::now();
        let last = client.until(40, Attempt::is_refused);
        let late_answer = last
            .iter()
            .filter(|(t, _)| *t > synced)
            .skip(1)
            .any(|(_, a)| a.backend().is_some());
        if !last.last().is_some_and(|(_, a)| a.is_refused())
            || !last.iter().any(failed_call)
            || late_answer
        {
            failures.push(format!(
                "{target}: after the last endpoint went, the socket was answered, not destroyed, or new ones not refused: {last:?}"
            ));
        }
    }
    let destroyed: f64 = driver
        .plane_mut()
        .collectors()
        .iter()
        .flat_map(|c| c.collect())
        .filter(|f| f.name() == "svcproxy_ebpf_udp_sockets_destroyed_total")
        .flat_map(|f| {
            f.get_metric()
                .iter()
                .map(|m| m.get_counter().get_value())
                .collect::<Vec<_>>()
        })
        .sum();
    if destroyed < 4.0 {
        failures.push(format!(
            "svcproxy_ebpf_udp_sockets_destroyed_total is {destroyed}, not at least 4"
        ));
    }
    assert!(failures.is_empty(), "{test}:\n{}", failures.join("\n"));
}

#[test]
fn a_pods_connected_udp_socket_is_destroyed_when_its_endpoint_leaves() {
    connected_udp_sockets_follow_their_endpoints(
        "a_pods_connected_udp_socket_is_destroyed_when_its_endpoint_leaves",
        false,
    );
}

#[test]
fn a_node_processs_connected_udp_socket_is_destroyed_when_its_endpoint_leaves() {
    connected_udp_sockets_follow_their_endpoints(
        "a_node_processs_connected_udp_socket_is_destroyed_when_its_endpoint_leaves",
        true,
    );
}
