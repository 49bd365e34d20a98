//! The DNS server on real sockets (loopback): queries over UDP and TCP, EDNS and
//! truncation, and answers that follow the catalog as it changes.

use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;
use serde_json::json;
use svcproxy_core::objects::{KubeObject, SourceUpdate};
use svcproxy_core::problem::Severity;
use svcproxy_core::state::{ClusterState, StateConfig};
use svcproxy_dns::probe::{self, answers as addresses, query};
use svcproxy_dns::server::{self, Options, RateLimit, Upstreams};
use svcproxy_dns::{Catalog, DnsConfig};

fn upsert(object: serde_json::Value) -> SourceUpdate {
    let object = match object["kind"].as_str() {
        Some("Service") => KubeObject::Service(serde_json::from_value(object).unwrap()),
        Some("Node") => KubeObject::Node(serde_json::from_value(object).unwrap()),
        Some("Pod") => KubeObject::Pod(serde_json::from_value(object).unwrap()),
        _ => KubeObject::EndpointSlice(serde_json::from_value(object).unwrap()),
    };
    SourceUpdate::Upsert {
        object,
        origin: "test".into(),
    }
}

/// A headless service with `n` ready endpoints, 10.244.0.1 on.
fn headless(n: u32) -> Vec<SourceUpdate> {
    let endpoints: Vec<serde_json::Value> = (1..=n)
        .map(|i| json!({"addresses": [format!("10.244.{}.{}", i / 250, i % 250 + 1)]}))
        .collect();
    vec![
        upsert(
            json!({"kind": "Service", "metadata": {"namespace": "demo", "name": "big"},
            "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80}]}}),
        ),
        upsert(json!({"kind": "EndpointSlice",
            "metadata": {"namespace": "demo", "name": "big-1", "labels": {"kubernetes.io/service-name": "big"}},
            "addressType": "IPv4", "endpoints": endpoints,
            "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]})),
        upsert(
            json!({"kind": "Service", "metadata": {"namespace": "demo", "name": "web"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80}]}}),
        ),
    ]
}

struct Running {
    addr: SocketAddr,
    /// The model the catalog follows, as the daemon keeps it.
    state: Mutex<ClusterState>,
    catalog: Arc<RwLock<Catalog>>,
    counters: Arc<server::Counters>,
    _server: server::Dedicated,
}

fn start(updates: &[SourceUpdate]) -> Running {
    start_with(DnsConfig::default(), updates, &Upstreams::default())
}

fn start_with(cfg: DnsConfig, updates: &[SourceUpdate], upstreams: &Upstreams) -> Running {
    start_opts(
        cfg,
        updates,
        &Options {
            upstreams: upstreams.clone(),
            rate_limit: None,
            udp_workers: 0,
        },
    )
}

fn start_opts(cfg: DnsConfig, updates: &[SourceUpdate], options: &Options) -> Running {
    let state = ClusterState::new(StateConfig {
        node_name: "node-a".into(),
        dns: true,
        ..StateConfig::default()
    });
    let catalog = Arc::new(RwLock::new(Catalog::new(&cfg).unwrap()));
    let server =
        server::Dedicated::start(catalog.clone(), "127.0.0.1:0".parse().unwrap(), options).unwrap();
    let running = Running {
        addr: server.addr,
        counters: server.counters.clone(),
        state: Mutex::new(state),
        catalog,
        _server: server,
    };
    for u in updates {
        running.apply(u);
    }
    running.catalog.write().unwrap().set_ready();
    running
}

impl Running {
    /// Applies `u` to the model and the catalog follows; asserts that the state
    /// found nothing wrong with it.
    fn apply(&self, u: &SourceUpdate) {
        let mut state = self.state.lock().unwrap();
        state.apply(u.clone());
        self.catalog.write().unwrap().follow(&mut state);
        let errors: Vec<String> = state
            .problems()
            .into_values()
            .flatten()
            .filter(|p| p.severity != Severity::Warning)
            .map(|p| p.to_string())
            .collect();
        assert!(errors.is_empty(), "{errors:?}");
    }
}

const WAIT: Duration = Duration::from_secs(5);

fn udp(addr: SocketAddr, q: &[u8]) -> (Message, usize) {
    probe::udp(addr, q, WAIT).expect("an answer over UDP")
}

fn tcp(addr: SocketAddr, q: &[u8]) -> Message {
    probe::tcp(addr, q, WAIT).expect("an answer over TCP")
}

#[test]
fn udp_and_tcp_answer_the_same_and_big_answers_truncate_over_udp() {
    let dns = start(&headless(100));
    // A plain service over both transports, authoritative.
    let q = query("web.demo.svc.cluster.local.", RecordType::A, None);
    let (m, _) = udp(dns.addr, &q);
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.metadata.authoritative);
    assert_eq!(m.metadata.id, 4242);
    assert_eq!(addresses(&m), ["10.96.0.10"]);
    assert_eq!(addresses(&tcp(dns.addr, &q)), ["10.96.0.10"]);

    // 100 A records (~1.6 KB): over 512 bytes without EDNS, so UDP truncates (TC)...
    let q = query("big.demo.svc.cluster.local.", RecordType::A, None);
    let (m, n) = udp(dns.addr, &q);
    assert!(m.metadata.truncation, "TC set");
    assert!(n <= 512, "{n} bytes");
    assert!(m.answers.len() < 100);
    // ...TCP holds them all...
    assert_eq!(tcp(dns.addr, &q).answers.len(), 100);
    // ...and so does UDP with a large enough EDNS payload.
    let q = query("big.demo.svc.cluster.local.", RecordType::A, Some(4096));
    let (m, n) = udp(dns.addr, &q);
    assert!(!m.metadata.truncation);
    assert_eq!(m.answers.len(), 100);
    assert!(n > 512);
    assert_eq!(m.edns.as_ref().map(|e| e.max_payload()), Some(4096));

    // SRV with the targets' addresses in the additional section, over TCP.
    let m = tcp(
        dns.addr,
        &query(
            "_http._tcp.big.demo.svc.cluster.local.",
            RecordType::SRV,
            None,
        ),
    );
    assert_eq!(m.answers.len(), 100);
    assert_eq!(m.additionals.len(), 100);

    // Negative answers: NXDOMAIN and NODATA, each with the SOA; outside the zone:
    // refused (no upstream yet).
    let (m, _) = udp(
        dns.addr,
        &query("nope.demo.svc.cluster.local.", RecordType::A, None),
    );
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(m.authorities.len(), 1);
    let (m, _) = udp(
        dns.addr,
        &query("web.demo.svc.cluster.local.", RecordType::AAAA, None),
    );
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.answers.is_empty());
    assert_eq!(m.authorities.len(), 1);
    let (m, _) = udp(dns.addr, &query("example.com.", RecordType::A, None));
    assert_eq!(m.metadata.response_code, ResponseCode::Refused);
}

#[test]
fn nothing_is_denied_before_the_first_complete_list() {
    let dns = start(&headless(2));
    let q = query("web.demo.svc.cluster.local.", RecordType::A, None);
    let fresh = Catalog::new(&DnsConfig::default()).unwrap();
    *dns.catalog.write().unwrap() = fresh;
    let (m, _) = udp(dns.addr, &q);
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    dns.catalog.write().unwrap().set_ready();
    let (m, _) = udp(dns.addr, &q);
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
}

#[test]
fn answers_follow_the_catalog_at_once() {
    let dns = start(&headless(2));
    let q = query("web.demo.svc.cluster.local.", RecordType::A, None);
    assert_eq!(addresses(&udp(dns.addr, &q).0), ["10.96.0.10"]);
    dns.apply(&upsert(json!({
        "kind": "Service", "metadata": {"namespace": "demo", "name": "web"},
        "spec": {"clusterIP": "10.96.0.99", "ports": [{"name": "http", "port": 80}]}})));
    assert_eq!(addresses(&udp(dns.addr, &q).0), ["10.96.0.99"]);
}

#[test]
fn garbage_gets_no_answer_and_the_server_keeps_answering() {
    let dns = start(&headless(2));
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    for junk in [&b""[..], &b"\x00"[..], &[0xffu8; 40][..], &[0u8; 12][..]] {
        s.send_to(junk, dns.addr).unwrap();
    }
    let q = query("web.demo.svc.cluster.local.", RecordType::A, None);
    assert_eq!(addresses(&udp(dns.addr, &q).0), ["10.96.0.10"]);
}

#[test]
fn other_names_are_relayed_to_the_upstream_over_the_clients_transport() {
    // The upstream: another server, authoritative for example.test.
    let upstream = start_with(
        DnsConfig {
            zone: "example.test".into(),
            ttl: 60,
            clients_node: None,
        },
        &headless(100),
        &Upstreams::default(),
    );
    // An upstream that never answers: after its timeout, SERVFAIL (not a hang,
    // not a made-up answer).
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let dns = start_with(
        DnsConfig::default(),
        &headless(2),
        &Upstreams {
            configured: vec![silent.local_addr().unwrap()],
            resolv_conf: String::new(),
        },
    );
    let q = query("web.demo.svc.example.test.", RecordType::A, None);
    let (m, _) = udp(dns.addr, &q);
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);

    // The upstream named in resolv.conf form would be port 53; the configured one
    // carries its port.
    let dns = start_with(
        DnsConfig::default(),
        &headless(2),
        &Upstreams {
            configured: vec![upstream.addr],
            resolv_conf: "nameserver 192.0.2.1\n".into(),
        },
    );
    let (m, _) = udp(dns.addr, &q);
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(addresses(&m), ["10.96.0.10"]);
    assert_eq!(m.answers[0].ttl, 60, "the upstream's record, as it gave it");
    assert_eq!(addresses(&tcp(dns.addr, &q)), ["10.96.0.10"]);
    // Truncation at the upstream reaches the client, which then asks over TCP,
    // relayed over TCP.
    let q = query("big.demo.svc.example.test.", RecordType::A, None);
    let (m, _) = udp(dns.addr, &q);
    assert!(m.metadata.truncation);
    assert_eq!(tcp(dns.addr, &q).answers.len(), 100);
    // The upstream's NXDOMAIN is relayed as such; our own zone is still ours.
    let q = query("nope.demo.svc.example.test.", RecordType::A, None);
    assert_eq!(
        udp(dns.addr, &q).0.metadata.response_code,
        ResponseCode::NXDomain
    );
    let q = query("web.demo.svc.cluster.local.", RecordType::A, None);
    let (m, _) = udp(dns.addr, &q);
    assert!(m.metadata.authoritative);
    assert_eq!(addresses(&m), ["10.96.0.10"]);
}

#[test]
fn a_flooding_client_is_limited_and_others_are_not() {
    let dns = start_opts(
        DnsConfig::default(),
        &headless(2),
        &Options {
            upstreams: Upstreams::default(),
            rate_limit: Some(RateLimit { rate: 5, burst: 5 }),
            udp_workers: 0,
        },
    );
    let q = query("web.demo.svc.cluster.local.", RecordType::A, None);
    let from = |ip: &str| -> (Message, usize) {
        let local: SocketAddr = format!("{ip}:0").parse().unwrap();
        probe::udp_from(local, dns.addr, &q, WAIT).expect("an answer")
    };
    // 30 queries at once from one client: the burst is answered, the rest get an
    // empty truncated answer no bigger than the query.
    let answers: Vec<(Message, usize)> = (0..30).map(|_| from("127.0.0.2")).collect();
    let answered = answers
        .iter()
        .filter(|(m, _)| !m.metadata.truncation)
        .count();
    // (A loaded machine may take long enough over the 30 for a token or two more.)
    assert!((5..=10).contains(&answered), "{answered} answered");
    for (m, n) in answers.iter().filter(|(m, _)| m.metadata.truncation) {
        assert!(m.answers.is_empty());
        assert!(*n <= q.len(), "{n} bytes for a {}-byte query", q.len());
    }
    // Another client is not affected.
    assert_eq!(addresses(&from("127.0.0.3").0), ["10.96.0.10"]);
    // Over TCP (from 127.0.0.1), answered until that client's bucket is empty, then
    // refused.
    let codes: Vec<ResponseCode> = (0..8)
        .map(|_| tcp(dns.addr, &q).metadata.response_code)
        .collect();
    assert_eq!(codes[0], ResponseCode::NoError);
    assert_eq!(codes[7], ResponseCode::Refused, "{codes:?}");
    // A second later the first client has tokens again.
    std::thread::sleep(Duration::from_millis(1100));
    assert!(!from("127.0.0.2").0.metadata.truncation);
}

#[test]
fn answers_kept_encoded_are_never_another_clients() {
    // A central server (clients on any node) with one UDP worker, so that both
    // clients meet the same worker's cache: a headless service with topology keys
    // answers each client with its own zone's endpoint, the first time and again.
    let mut updates = headless(2);
    for (node, zone, client) in [("node-a", "a", "127.0.0.2"), ("node-b", "b", "127.0.0.3")] {
        updates.push(upsert(json!({"kind": "Node",
            "metadata": {"name": node, "labels": {"topology.kubernetes.io/zone": zone}},
            "spec": {"podCIDRs": [format!("{client}/32")]}})));
    }
    updates.push(upsert(json!({"kind": "Service",
        "metadata": {"namespace": "demo", "name": "zonal",
            "annotations": {"svcproxy.io/topology-keys": "topology.kubernetes.io/zone"}},
        "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80}]}})));
    // Endpoint 10.244.9.1 on node-a (zone a), 10.244.9.2 on `second`'s node and zone.
    let slice = |second: (&str, &str)| {
        json!({"kind": "EndpointSlice",
            "metadata": {"namespace": "demo", "name": "zonal-1",
                "labels": {"kubernetes.io/service-name": "zonal"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.244.9.1"], "nodeName": "node-a", "zone": "a"},
                {"addresses": ["10.244.9.2"], "nodeName": second.0, "zone": second.1}],
            "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]})
    };
    updates.push(upsert(slice(("node-b", "b"))));
    let dns = start_opts(
        DnsConfig::default(),
        &updates,
        &Options {
            udp_workers: 1,
            ..Options::default()
        },
    );
    let from = |ip: &str, name: &str| -> Vec<String> {
        let local: SocketAddr = format!("{ip}:0").parse().unwrap();
        let q = query(name, RecordType::A, None);
        addresses(
            &probe::udp_from(local, dns.addr, &q, WAIT)
                .expect("an answer")
                .0,
        )
    };
    let zonal = "zonal.demo.svc.cluster.local.";
    for _ in 0..3 {
        assert_eq!(from("127.0.0.2", zonal), ["10.244.9.1"]);
        assert_eq!(from("127.0.0.3", zonal), ["10.244.9.2"]);
    }
    let apply = |object: serde_json::Value| dns.apply(&upsert(object));
    let pod = |node: &str| {
        json!({"kind": "Pod", "metadata": {"namespace": "apps", "name": "client"},
            "spec": {"nodeName": node}, "status": {"podIPs": [{"ip": "127.0.0.4"}]}})
    };
    // A pod's address places it on its node; the pod moves, and so do its answers.
    apply(pod("node-a"));
    assert_eq!(from("127.0.0.4", zonal), ["10.244.9.1"]);
    assert_eq!(from("127.0.0.4", zonal), ["10.244.9.1"]);
    apply(pod("node-b"));
    assert_eq!(from("127.0.0.4", zonal), ["10.244.9.2"]);
    // An endpoint moves to node-a's zone, its address the same: node-a's clients
    // get both.
    apply(slice(("node-a", "a")));
    assert_eq!(from("127.0.0.2", zonal), ["10.244.9.1", "10.244.9.2"]);
    // node-b's clients: nothing left in zone b (NODATA)...
    assert_eq!(from("127.0.0.3", zonal), Vec::<String>::new());
    // ...until node-b's labels move it to zone a.
    apply(json!({"kind": "Node",
        "metadata": {"name": "node-b", "labels": {"topology.kubernetes.io/zone": "a"}},
        "spec": {"podCIDRs": ["127.0.0.3/32"]}}));
    assert_eq!(from("127.0.0.3", zonal), ["10.244.9.1", "10.244.9.2"]);
    // Answers that are everyone's are kept: asked again, they come from the cache,
    // the same bytes but the query's id.
    let web = "web.demo.svc.cluster.local.";
    let hits = dns
        .counters
        .cache_hits
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(from("127.0.0.2", web), ["10.96.0.10"]);
    assert_eq!(from("127.0.0.3", web), ["10.96.0.10"]);
    let mut q = query(web, RecordType::A, None);
    q[..2].copy_from_slice(&777u16.to_be_bytes());
    let (m, _) = udp(dns.addr, &q);
    assert_eq!(
        (m.metadata.id, addresses(&m)),
        (777, vec!["10.96.0.10".to_string()])
    );
    assert_eq!(
        dns.counters
            .cache_hits
            .load(std::sync::atomic::Ordering::Relaxed),
        hits + 2
    );
    // A change is seen at once, cache or not.
    dns.apply(&upsert(json!({
        "kind": "Service", "metadata": {"namespace": "demo", "name": "web"},
        "spec": {"clusterIP": "10.96.0.99", "ports": [{"name": "http", "port": 80}]}})));
    assert_eq!(from("127.0.0.2", web), ["10.96.0.99"]);
}

/// One client holding thousands of idle TCP connections, from many addresses, cannot
/// keep others' TCP queries waiting: each is answered within a second, the idlest
/// connections making room; one address cannot hold more than its share; and the
/// connections held stay bounded.
#[test]
fn idle_tcp_connections_cannot_exhaust_the_server() {
    // Two sockets per connection here (the client's and the server's): this needs
    // an open files limit above 8,000 (20,000 on these machines).
    let dns = start(&headless(2));
    let q = query("web.demo.svc.cluster.local.", RecordType::A, None);
    let from = |ip: String| -> SocketAddr { format!("{ip}:0").parse().unwrap() };
    // 3,000 idle connections from 100 addresses (30 each).
    let mut idle = Vec::new();
    for i in 0..3000u32 {
        let local = from(format!("127.0.{}.{}", 10 + i % 100 / 50, i % 50 + 1));
        match probe::connect_from(local, dns.addr, WAIT) {
            Ok(s) => idle.push(s),
            Err(e) => panic!("idle connection {i}: {e}"),
        }
    }
    // Others' queries are answered at once.
    for n in 0..10 {
        let started = std::time::Instant::now();
        let m = probe::tcp_from(from("127.0.0.2".into()), dns.addr, &q, WAIT)
            .unwrap_or_else(|e| panic!("query {n} while 3,000 idle connections: {e}"));
        assert_eq!(addresses(&m), ["10.96.0.10"]);
        let took = started.elapsed();
        assert!(took < Duration::from_secs(1), "query {n} took {took:?}");
    }
    let open = dns
        .counters
        .tcp_open
        .load(std::sync::atomic::Ordering::Relaxed);
    let shed = dns
        .counters
        .tcp_shed
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(open <= 1024, "{open} open");
    assert!(shed >= 3000 - 1024, "{shed} shed");
    // One address holds at most its share: past it, its own idlest connection is
    // closed to make room for the newest, which is answered.
    let mut mine = Vec::new();
    for _ in 0..100 {
        mine.push(probe::connect_from(from("127.0.0.3".into()), dns.addr, WAIT).unwrap());
    }
    std::thread::sleep(Duration::from_millis(300));
    let shed_own = dns
        .counters
        .tcp_over_client_limit
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(shed_own, 100 - 64, "connections past one client's 64");
    let newest = mine.last_mut().unwrap();
    assert_eq!(
        addresses(&probe::tcp_on(newest, &q, WAIT).unwrap()),
        ["10.96.0.10"]
    );
    // The oldest were the ones closed.
    assert!(probe::tcp_on(&mut mine[0], &q, Duration::from_secs(2)).is_err());
    // Another client is answered meanwhile.
    assert_eq!(
        addresses(&probe::tcp_from(from("127.0.0.4".into()), dns.addr, &q, WAIT).unwrap()),
        ["10.96.0.10"]
    );
    drop(idle);
    drop(mine);
}

/// An aggregator (NodeLocal DNSCache, a node's pods behind one masqueraded
/// address) is one address with many connections: 1,500 idle ones from one
/// address, then a new query from that same address, answered within a second
/// (its own idlest connections make room, not the newcomer carrying the query).
#[test]
fn one_address_s_new_query_is_answered_past_its_idle_connections() {
    let dns = start(&headless(2));
    let q = query("web.demo.svc.cluster.local.", RecordType::A, None);
    let aggregator: SocketAddr = "127.0.0.5:0".parse().unwrap();
    let mut idle = Vec::new();
    for i in 0..1500 {
        match probe::connect_from(aggregator, dns.addr, WAIT) {
            Ok(s) => idle.push(s),
            Err(e) => panic!("idle connection {i}: {e}"),
        }
    }
    let started = std::time::Instant::now();
    let m = probe::tcp_from(aggregator, dns.addr, &q, WAIT)
        .unwrap_or_else(|e| panic!("a query past 1,500 idle connections of its address: {e}"));
    assert_eq!(addresses(&m), ["10.96.0.10"]);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "the query took {took:?}");
    let open = dns
        .counters
        .tcp_open
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(open <= 64, "{open} open for one address");
    drop(idle);
}

/// An address using its whole share, 64 connections each carrying queries, keeps
/// every one of them answered.
#[test]
fn one_address_s_busy_connections_keep_being_answered() {
    let dns = start(&headless(2));
    let q = query("web.demo.svc.cluster.local.", RecordType::A, None);
    let client: SocketAddr = "127.0.0.6:0".parse().unwrap();
    let mut busy: Vec<_> = (0..64)
        .map(|_| probe::connect_from(client, dns.addr, WAIT).unwrap())
        .collect();
    for round in 0..3 {
        for (i, s) in busy.iter_mut().enumerate() {
            let m = probe::tcp_on(s, &q, WAIT)
                .unwrap_or_else(|e| panic!("round {round}, connection {i}: {e}"));
            assert_eq!(addresses(&m), ["10.96.0.10"]);
        }
    }
    let shed = dns
        .counters
        .tcp_over_client_limit
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(shed, 0, "none of the 64 was closed");
}
