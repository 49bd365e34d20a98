//! `svcproxy dns` as a process: real UDP and TCP queries on loopback, answered from a
//! manifests directory, following its edits within a second or so; a bad object is
//! logged and the rest is served.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use svcproxy_dns::probe::{answers, query, tcp, udp, udp_from};

const WAIT: Duration = Duration::from_secs(5);

struct Dns {
    child: Child,
    addr: SocketAddr,
    log: std::path::PathBuf,
}

impl Drop for Dns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Dns {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Starts `svcproxy dns` on an ephemeral loopback port, `dir` its manifests, with
/// `extra` flags (node-a unless they say otherwise); waits for the address it logs.
fn start(dir: &Path, extra: &[&str]) -> Dns {
    let log = dir.with_extension("log");
    let mut extra = extra.to_vec();
    if !extra.contains(&"--hostname-override") {
        extra.extend(["--hostname-override", "node-a"]);
    }
    let mut child =
        svcproxy_testkit::process::die_with_test(&mut Command::new(env!("CARGO_BIN_EXE_svcproxy")))
            .arg("dns")
            .args(extra)
            .args(["--manifests"])
            .arg(dir)
            .args(["--dns-bind-address", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start svcproxy dns");
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        // Listening, and past the first complete list (before it every query is
        // answered SERVFAIL).
        let answering = text.contains("cluster DNS answering");
        if let Some(line) = text
            .lines()
            .find(|l| answering && l.contains("cluster DNS listening"))
        {
            let addr = line
                .split_whitespace()
                .find_map(|w| strip_ansi(w).strip_prefix("address=").map(String::from))
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("no address in {line:?}"));
            return Dns { child, addr, log };
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("svcproxy dns exited ({status}):\n{text}");
        }
        assert!(
            start.elapsed() < WAIT * 2,
            "svcproxy dns did not start:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut in_escape = false;
    for c in s.chars() {
        match (in_escape, c) {
            (false, '\u{1b}') => in_escape = true,
            (true, 'm') => in_escape = false,
            (true, _) => {}
            (false, c) => out.push(c),
        }
    }
    out
}

/// Writes `name` in `dir` atomically (a rename), as a ConfigMap update does.
fn write(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

const WEB: &str = "apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80}]
";

fn headless(ips: &[&str]) -> String {
    let mut s = String::from(
        "apiVersion: v1
kind: Service
metadata: {name: db, namespace: demo}
spec:
  clusterIP: None
  ports: [{name: pg, port: 5432}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: db-1
  namespace: demo
  labels: {kubernetes.io/service-name: db}
addressType: IPv4
ports: [{name: pg, port: 5432, protocol: TCP}]
endpoints:
",
    );
    for (i, ip) in ips.iter().enumerate() {
        s.push_str(&format!("- addresses: [{ip}]\n  hostname: db-{i}\n"));
    }
    s
}

#[test]
fn svcproxy_dns_answers_from_the_manifests_and_follows_their_edits() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("manifests");
    std::fs::create_dir(&dir).unwrap();
    write(&dir, "web.yaml", WEB);
    write(&dir, "db.yaml", &headless(&["10.244.1.5"]));
    let dns = start(
        &dir,
        &[
            "--cluster-domain",
            "cluster.test",
            "--dns-ttl",
            "7s",
            "--dns-upstream",
            "none",
        ],
    );

    let q = query("web.demo.svc.cluster.test.", RecordType::A, None);
    let (m, _) = udp(dns.addr, &q, WAIT).expect("UDP answer");
    assert_eq!(answers(&m), ["10.96.0.10"], "{}", dns.log());
    assert_eq!(m.answers[0].ttl, 7);
    assert_eq!(answers(&tcp(dns.addr, &q, WAIT).unwrap()), ["10.96.0.10"]);
    let q = query("_pg._tcp.db.demo.svc.cluster.test.", RecordType::SRV, None);
    assert_eq!(
        answers(&udp(dns.addr, &q, WAIT).unwrap().0),
        ["0 100 5432 db-0.db.demo.svc.cluster.test."]
    );
    // Another domain is not this server's, and it has no upstream: refused.
    let q = query("web.demo.svc.cluster.local.", RecordType::A, None);
    assert_eq!(
        udp(dns.addr, &q, WAIT).unwrap().0.metadata.response_code,
        ResponseCode::Refused
    );

    // Queries are not logged one by one (a line per query would flood the log at
    // the default verbosity).
    assert!(!dns.log().contains("hickory"), "{}", dns.log());
    // Nor are warnings about rules it does not write (how local traffic would be
    // told apart without --cluster-cidr).
    assert!(!dns.log().contains("detect-local-mode"), "{}", dns.log());

    // A second endpoint appears: visible well within a second of the write on an
    // idle machine (~0.7 s, nearly all of it the manifests source's own settle and
    // debounce, which the data plane waits for too); 1.5 s allows for a loaded one.
    write(&dir, "db.yaml", &headless(&["10.244.1.5", "10.244.2.6"]));
    let written = Instant::now();
    let q = query("db.demo.svc.cluster.test.", RecordType::A, None);
    loop {
        let got = answers(&udp(dns.addr, &q, WAIT).unwrap().0);
        if got == ["10.244.1.5", "10.244.2.6"] {
            break;
        }
        assert!(
            written.elapsed() < Duration::from_millis(1500),
            "still {got:?} 1.5 s after the write:\n{}",
            dns.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "[dns] an endpoint added was answered {:?} after the write",
        written.elapsed()
    );

    // A bad object is logged and refused; the rest is served.
    write(
        &dir,
        "bad.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: bad, namespace: demo}\nspec:\n  type: ExternalName\n  externalName: \"evil.com. 0 IN A 6.6.6.6\"\n",
    );
    let q = query("bad.demo.svc.cluster.test.", RecordType::A, None);
    let start = Instant::now();
    while !dns.log().contains("externalName") {
        assert!(start.elapsed() < WAIT, "no error logged:\n{}", dns.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        udp(dns.addr, &q, WAIT).unwrap().0.metadata.response_code,
        ResponseCode::NXDomain
    );
    let q = query("web.demo.svc.cluster.test.", RecordType::A, None);
    assert_eq!(answers(&udp(dns.addr, &q, WAIT).unwrap().0), ["10.96.0.10"]);

    // Deleting the file takes its records away.
    std::fs::remove_file(dir.join("web.yaml")).unwrap();
    let start = Instant::now();
    while udp(dns.addr, &q, WAIT).unwrap().0.metadata.response_code != ResponseCode::NXDomain {
        assert!(start.elapsed() < WAIT, "web still answered:\n{}", dns.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_bad_cluster_domain_is_refused_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_svcproxy"))
        .args(["dns", "--hostname-override", "node-a", "--manifests"])
        .arg(tmp.path())
        .args([
            "--dns-bind-address",
            "127.0.0.1:0",
            "--cluster-domain",
            "bad domain",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--cluster-domain"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn names_outside_the_cluster_domain_go_to_dns_upstream() {
    let tmp = tempfile::tempdir().unwrap();
    let up_dir = tmp.path().join("upstream");
    let dir = tmp.path().join("cluster");
    for d in [&up_dir, &dir] {
        std::fs::create_dir(d).unwrap();
        write(d, "web.yaml", WEB);
    }
    let upstream = start(
        &up_dir,
        &["--cluster-domain", "example.test", "--dns-upstream", "none"],
    );
    let up = upstream.addr.to_string();
    let dns = start(&dir, &["--dns-upstream", &up]);
    assert!(dns.log().contains(&up), "{}", dns.log());
    let q = query("web.demo.svc.example.test.", RecordType::A, None);
    let (m, _) = udp(dns.addr, &q, WAIT).unwrap();
    assert_eq!(answers(&m), ["10.96.0.10"], "{}", dns.log());
    assert_eq!(answers(&tcp(dns.addr, &q, WAIT).unwrap()), ["10.96.0.10"]);
    let q = query("web.demo.svc.cluster.local.", RecordType::A, None);
    assert_eq!(answers(&udp(dns.addr, &q, WAIT).unwrap().0), ["10.96.0.10"]);
}

const ZONAL: &str = "apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: a}}
---
apiVersion: v1
kind: Node
metadata: {name: node-b, labels: {topology.kubernetes.io/zone: b}}
---
apiVersion: v1
kind: Service
metadata:
  name: db
  namespace: demo
  annotations: {svcproxy.io/topology-keys: \"topology.kubernetes.io/zone\"}
spec:
  clusterIP: None
  ports: [{name: pg, port: 5432}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: db-1
  namespace: demo
  labels: {kubernetes.io/service-name: db}
addressType: IPv4
ports: [{name: pg, port: 5432, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.5], nodeName: node-a, zone: a}
- {addresses: [10.244.2.5], nodeName: node-b, zone: b}
";

#[test]
fn node_local_dns_answers_a_headless_service_with_this_nodes_choice() {
    let tmp = tempfile::tempdir().unwrap();
    let q = query("db.demo.svc.cluster.local.", RecordType::A, None);
    let mut got = Vec::new();
    for (node, local) in [("node-a", true), ("node-b", true), ("node-b", false)] {
        let dir = tmp.path().join(format!("{node}-{local}"));
        std::fs::create_dir(&dir).unwrap();
        write(&dir, "zonal.yaml", ZONAL);
        let mut flags = vec!["--hostname-override", node, "--dns-upstream", "none"];
        if local {
            flags.push("--dns-node-local");
        }
        let dns = start(&dir, &flags);
        got.push(answers(&udp(dns.addr, &q, WAIT).unwrap().0));
    }
    assert_eq!(
        got,
        [
            vec!["10.244.1.5"],
            vec!["10.244.2.5"],
            vec!["10.244.1.5", "10.244.2.5"],
        ],
        "clients on node-a, on node-b, and anywhere"
    );
}

/// Two client pods, on node-a and node-b, with loopback addresses (all of 127/8
/// is this host's): the server tells them apart by source address.
const CLIENT_PODS: &str = "apiVersion: v1
kind: Pod
metadata: {name: client-a, namespace: apps}
spec: {nodeName: node-a, containers: []}
status: {podIPs: [{ip: 127.0.0.2}]}
---
apiVersion: v1
kind: Pod
metadata: {name: client-b, namespace: apps}
spec: {nodeName: node-b, containers: []}
status: {podIPs: [{ip: 127.0.0.3}]}
";

#[test]
fn a_central_dns_answers_each_client_by_its_pods_node() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("central");
    std::fs::create_dir(&dir).unwrap();
    write(&dir, "zonal.yaml", ZONAL);
    write(&dir, "pods.yaml", CLIENT_PODS);
    let dns = start(&dir, &["--dns-upstream", "none"]);
    let q = query("db.demo.svc.cluster.local.", RecordType::A, None);
    let from = |ip: &str| {
        let local: SocketAddr = format!("{ip}:0").parse().unwrap();
        answers(&udp_from(local, dns.addr, &q, WAIT).unwrap().0)
    };
    assert_eq!(from("127.0.0.2"), ["10.244.1.5"], "{}", dns.log());
    assert_eq!(from("127.0.0.3"), ["10.244.2.5"]);
    assert_eq!(
        from("127.0.0.4"),
        ["10.244.1.5", "10.244.2.5"],
        "an unknown client gets every ready endpoint"
    );
    // client-b moves to node-a (a new pod with the same address).
    write(
        &dir,
        "pods.yaml",
        &CLIENT_PODS.replace("nodeName: node-b", "nodeName: node-a"),
    );
    let start = Instant::now();
    while from("127.0.0.3") != ["10.244.1.5"] {
        assert!(
            start.elapsed() < WAIT,
            "still node-b's answer:\n{}",
            dns.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `/metrics` of the server on `port` (HTTP/1.0, blocking).
fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

#[test]
fn svcproxy_dns_counts_queries_and_answers_in_its_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("manifests");
    std::fs::create_dir(&dir).unwrap();
    write(&dir, "web.yaml", WEB);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let dns = start(
        &dir,
        &["--dns-upstream", "none", "--metrics-bind-address", &metrics],
    );
    // Zeros before any query: every series exists from the start.
    let text = scrape(port);
    assert!(
        text.contains("svcproxy_dns_responses_total{rcode=\"NXDOMAIN\"} 0"),
        "{text}"
    );
    let web = query("web.demo.svc.cluster.local.", RecordType::A, None);
    for _ in 0..3 {
        assert_eq!(
            answers(&udp(dns.addr, &web, WAIT).unwrap().0),
            ["10.96.0.10"]
        );
    }
    assert_eq!(answers(&tcp(dns.addr, &web, WAIT).unwrap()), ["10.96.0.10"]);
    let nope = query("nope.demo.svc.cluster.local.", RecordType::A, None);
    udp(dns.addr, &nope, WAIT).unwrap();
    let other = query("example.com.", RecordType::A, None);
    udp(dns.addr, &other, WAIT).unwrap();

    let text = scrape(port);
    let value = |series: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    assert_eq!(value("svcproxy_dns_requests_total{proto=\"udp\"}"), 5);
    assert_eq!(value("svcproxy_dns_requests_total{proto=\"tcp\"}"), 1);
    assert_eq!(value("svcproxy_dns_responses_total{rcode=\"NOERROR\"}"), 4);
    assert_eq!(value("svcproxy_dns_responses_total{rcode=\"NXDOMAIN\"}"), 1);
    assert_eq!(value("svcproxy_dns_responses_total{rcode=\"REFUSED\"}"), 1);
    // Three identical queries over UDP, each from a new port, met at most two
    // workers: one at least was answered as kept.
    assert!(value("svcproxy_dns_cache_hits_total") >= 1, "{text}");
    assert_eq!(value("svcproxy_dns_forward_requests_total"), 0);
    // The one TCP connection (closed by now, or about to be); nothing was shed.
    assert!(value("svcproxy_dns_tcp_connections") <= 1, "{text}");
    for reason in ["client_limit", "idlest"] {
        assert_eq!(
            value(&format!(
                "svcproxy_dns_tcp_connections_shed_total{{reason=\"{reason}\"}}"
            )),
            0
        );
    }
}
