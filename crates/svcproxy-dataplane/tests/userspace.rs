//! The userspace proxy's engine on real TCP sockets, loopback only: a dead endpoint
//! is skipped so every client is answered, round-robin spreads exactly,
//! least-connections prefers the idle endpoint, affinity sticks, a half-closed
//! connection keeps its other half, 1 GiB goes through both ways intact (with
//! `splice(2)` and with the buffered copy), and a client with no reachable endpoint is
//! refused; an endpoint that leaves its pool has its connections closed after the
//! drain timeout, and kept without one. UDP: a flow per client, replies from the
//! address the client sent to, a flow whose endpoint left moves at its next
//! datagram, and an idle flow is closed.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use svcproxy_core::model::{IpFamily, Protocol, ServiceName, ServicePortName};
use svcproxy_dataplane::userspace::{
    bind_wildcard, serve_tcp, Options, Pool, Routes, Scheduler, Sets, Stats, UdpFrontend,
};
use svcproxy_plan::intent::EndpointSetId;
use svcproxy_testkit::pattern::Pattern;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};

const WAIT: Duration = Duration::from_secs(5);

/// An endpoint that writes its name and then echoes what it reads until the end
/// of file, then writes how many bytes it read and closes.
async fn endpoint(name: &'static str) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let _ = s.write_all(format!("{name}\n").as_bytes()).await;
                let mut buf = vec![0u8; 64 * 1024];
                let mut total = 0usize;
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => total += n,
                    }
                }
                let _ = s.write_all(format!("read {total}\n").as_bytes()).await;
            });
        }
    });
    addr
}

/// An address nothing listens on (bound, then closed): connecting is refused.
async fn dead() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

fn web() -> ServicePortName {
    ServicePortName::new(ServiceName::new("demo", "web"), "http", Protocol::Tcp)
}

/// The engine on an ephemeral port serving the cluster set, with `pool` as the
/// cluster set of the service port that port is the frontend of.
async fn proxy(pool: Pool) -> (SocketAddr, Arc<Stats>, Arc<Pool>) {
    let (front, stats, pool, _) = proxy_draining(pool, Duration::ZERO).await;
    (front, stats, pool)
}

/// [`proxy`] with a drain timeout, also returning the routes (to change the pool).
async fn proxy_draining(
    pool: Pool,
    drain: Duration,
) -> (SocketAddr, Arc<Stats>, Arc<Pool>, Routes) {
    proxy_with(pool, drain, true).await
}

/// [`proxy_draining`], relaying with `splice(2)` or through a buffer.
async fn proxy_with(
    pool: Pool,
    drain: Duration,
    zero_copy: bool,
) -> (SocketAddr, Arc<Stats>, Arc<Pool>, Routes) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front = l.local_addr().unwrap();
    let pool = Arc::new(pool);
    let routes = Routes::default();
    {
        let mut table = routes.write().unwrap();
        table.vips.insert(front, web());
        table.services.insert(
            (IpFamily::V4, web()),
            Sets {
                cluster: Some(pool.clone()),
                local: None,
            },
        );
    }
    let stats = Arc::new(Stats::default());
    let options = Options {
        connect_timeout: Duration::from_secs(1),
        drain_timeout: drain,
        zero_copy,
    };
    tokio::spawn(serve_tcp(
        l,
        EndpointSetId::Cluster,
        routes.clone(),
        options,
        stats.clone(),
    ));
    (front, stats, pool, routes)
}

/// Connects from `from` (an address on lo) and reads the endpoint's name.
async fn connect(front: SocketAddr, from: IpAddr) -> (TcpStream, String) {
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::new(from, 0)).unwrap();
    let mut s = tokio::time::timeout(WAIT, sock.connect(front))
        .await
        .unwrap()
        .unwrap();
    let mut name = Vec::new();
    let mut b = [0u8; 1];
    while tokio::time::timeout(WAIT, s.read_exact(&mut b))
        .await
        .is_ok_and(|r| r.is_ok())
    {
        if b[0] == b'\n' {
            break;
        }
        name.push(b[0]);
    }
    (s, String::from_utf8(name).unwrap())
}

fn lo(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[tokio::test]
async fn a_refusing_endpoint_is_skipped_and_every_client_is_answered() {
    let eps = vec![dead().await, endpoint("alive").await];
    let (front, stats, _) = proxy(Pool::new(eps, Scheduler::RoundRobin, None)).await;
    for _ in 0..20 {
        let (_, name) = connect(front, lo("127.0.0.1")).await;
        assert_eq!(name, "alive");
    }
    // Round-robin started at the dead one for half the connections.
    assert_eq!(stats.retried.load(Ordering::Relaxed), 10);
    assert_eq!(stats.failed.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn round_robin_spreads_exactly() {
    let eps = vec![
        endpoint("a").await,
        endpoint("b").await,
        endpoint("c").await,
    ];
    let (front, _, _) = proxy(Pool::new(eps, Scheduler::RoundRobin, None)).await;
    let mut names = Vec::new();
    for _ in 0..9 {
        names.push(connect(front, lo("127.0.0.1")).await.1);
    }
    assert_eq!(names, ["a", "b", "c", "a", "b", "c", "a", "b", "c"]);
}

#[tokio::test]
async fn least_connections_prefers_the_idle_endpoint() {
    let eps = vec![endpoint("a").await, endpoint("b").await];
    let (front, stats, pool) = proxy(Pool::new(eps, Scheduler::LeastConnections, None)).await;
    // Three connections held open: a, b, then the tie goes in turn (a).
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect(front, lo("127.0.0.1")).await);
    }
    let names: Vec<&str> = held.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["a", "b", "a"]);
    // a has two open, b one: the next two go to b (then a tie, in turn).
    assert_eq!(connect(front, lo("127.0.0.1")).await.1, "b");
    held.truncate(1);
    // Closing: the engine sees each end and lets go of the endpoint.
    let active = || -> Vec<usize> { pool.active().into_iter().map(|(_, n)| n).collect() };
    for _ in 0..100 {
        if active() == [1, 0] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(active(), [1, 0]);
    assert_eq!(connect(front, lo("127.0.0.1")).await.1, "b");
    assert_eq!(stats.failed.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn client_ip_affinity_sticks_and_expires() {
    let eps = vec![endpoint("a").await, endpoint("b").await];
    let pool = Pool::new(eps, Scheduler::RoundRobin, Some(Duration::from_millis(600)));
    let (front, _, _) = proxy(pool).await;
    let first = connect(front, lo("127.0.0.2")).await.1;
    let other = connect(front, lo("127.0.0.3")).await.1;
    assert_ne!(first, other);
    for _ in 0..5 {
        assert_eq!(connect(front, lo("127.0.0.2")).await.1, first);
        assert_eq!(connect(front, lo("127.0.0.3")).await.1, other);
    }
    // Past the timeout without a connection, 127.0.0.2 is balanced afresh: in
    // turn, so one of two tries reaches the other endpoint.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let again = [
        connect(front, lo("127.0.0.2")).await.1,
        connect(front, lo("127.0.0.4")).await.1,
    ];
    assert!(again.contains(&other), "{again:?}");
}

/// Both relays: `splice(2)` (the default) and the buffered copy.
const RELAYS: [bool; 2] = [true, false];

#[tokio::test]
async fn a_half_closed_connection_keeps_its_other_half() {
    for zero_copy in RELAYS {
        let eps = vec![endpoint("a").await];
        let pool = Pool::new(eps, Scheduler::RoundRobin, None);
        let (front, stats, _, _) = proxy_with(pool, Duration::ZERO, zero_copy).await;
        let (mut s, name) = connect(front, lo("127.0.0.1")).await;
        assert_eq!(name, "a");
        let data = vec![7u8; 1 << 20];
        s.write_all(&data).await.unwrap();
        // The client is done writing; the endpoint sees its end of file only through
        // the proxy, and its answer comes back on the half still open.
        s.shutdown().await.unwrap();
        let mut rest = String::new();
        tokio::time::timeout(WAIT, s.read_to_string(&mut rest))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            rest,
            format!("read {}\n", 1 << 20),
            "zero copy: {zero_copy}"
        );
        wait_idle(&stats).await;
        assert_eq!(stats.bytes_to_endpoints.load(Ordering::Relaxed), 1 << 20);
        assert_eq!(stats.active.load(Ordering::Relaxed), 0);
    }
}

/// A client that aborts (a reset) has its endpoint connection aborted too: the
/// endpoint reads a reset, not an end of file, with each relay.
#[tokio::test]
async fn a_clients_reset_resets_its_endpoint_connection() {
    for zero_copy in RELAYS {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ep = l.local_addr().unwrap();
        let pool = Pool::new(vec![ep], Scheduler::RoundRobin, None);
        let (front, _, _, _) = proxy_with(pool, Duration::ZERO, zero_copy).await;
        let client = TcpStream::connect(front).await.unwrap();
        let (mut accepted, _) = tokio::time::timeout(WAIT, l.accept())
            .await
            .unwrap()
            .unwrap();
        socket2::SockRef::from(&client)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(client);
        let mut buf = [0u8; 16];
        let got = tokio::time::timeout(WAIT, accepted.read(&mut buf))
            .await
            .unwrap();
        assert!(
            matches!(&got, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "zero copy {zero_copy}: the endpoint read {got:?}, not a reset"
        );
    }
}

/// Waits (bounded) until the proxy has no connection open.
async fn wait_idle(stats: &Stats) {
    for _ in 0..100 {
        if stats.active.load(Ordering::Relaxed) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An endpoint that echoes every byte until the end of file, then closes.
async fn echo_endpoint() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

/// 1 GiB to an echoing endpoint through the proxy and back (so 1 GiB each way),
/// every byte checked, with each relay.
#[tokio::test]
async fn a_gibibyte_goes_both_ways_intact() {
    const TOTAL: u64 = 1 << 30;
    let pattern = Arc::new(Pattern::new());
    for zero_copy in RELAYS {
        let pool = Pool::new(vec![echo_endpoint().await], Scheduler::RoundRobin, None);
        let (front, stats, _, _) = proxy_with(pool, Duration::ZERO, zero_copy).await;
        let s = TcpStream::connect(front).await.unwrap();
        let (mut r, mut w) = s.into_split();
        let p = pattern.clone();
        let sender = tokio::spawn(async move {
            let mut sent = 0u64;
            while sent < TOTAL {
                let piece = p.at(sent, (TOTAL - sent) as usize);
                w.write_all(piece).await.unwrap();
                sent += piece.len() as u64;
            }
            w.shutdown().await.unwrap();
        });
        let mut buf = vec![0u8; 256 * 1024];
        let mut got = 0u64;
        let read = async {
            loop {
                let n = r.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                assert!(
                    pattern.matches(got, &buf[..n]),
                    "zero copy {zero_copy}: bytes {got}..{} differ from what was sent",
                    got + n as u64
                );
                got += n as u64;
            }
        };
        tokio::time::timeout(Duration::from_secs(120), read)
            .await
            .expect("the echo did not end within 120 s");
        sender.await.unwrap();
        assert_eq!(got, TOTAL, "zero copy {zero_copy}");
        wait_idle(&stats).await;
        assert_eq!(stats.bytes_to_endpoints.load(Ordering::Relaxed), TOTAL);
        assert_eq!(stats.bytes_to_clients.load(Ordering::Relaxed), TOTAL);
    }
}

#[tokio::test]
async fn no_reachable_endpoint_is_a_refusal() {
    let eps = vec![dead().await, dead().await];
    let (front, stats, _) = proxy(Pool::new(eps, Scheduler::RoundRobin, None)).await;
    let mut s = TcpStream::connect(front).await.unwrap();
    let mut buf = [0u8; 16];
    // Reset by the proxy once both endpoints refused: no data, an error or an end.
    let r = tokio::time::timeout(WAIT, s.read(&mut buf)).await.unwrap();
    assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    assert_eq!(stats.failed.load(Ordering::Relaxed), 1);
    assert_eq!(stats.retried.load(Ordering::Relaxed), 2);
    // A frontend without a pool: refused too.
    let empty = proxy(Pool::new(Vec::new(), Scheduler::RoundRobin, None)).await;
    let mut s = TcpStream::connect(empty.0).await.unwrap();
    let r = tokio::time::timeout(WAIT, s.read(&mut buf)).await.unwrap();
    assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
}

/// Replaces the cluster pool of the test's service port with `pool`'s successor
/// over `endpoints`.
fn change_endpoints(routes: &Routes, endpoints: Vec<SocketAddr>) {
    let mut table = routes.write().unwrap();
    let sets = table.services.get_mut(&(IpFamily::V4, web())).unwrap();
    let old = sets.cluster.take().unwrap();
    sets.cluster = Some(Arc::new(old.successor(
        endpoints,
        Scheduler::RoundRobin,
        None,
    )));
}

/// Whether `s` is closed (reset or ended) within `wait`.
async fn closed_within(s: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(wait, s.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn a_removed_endpoints_connections_drain_after_the_timeout() {
    let (a, b) = (endpoint("a").await, endpoint("b").await);
    let pool = Pool::new(vec![a, b], Scheduler::RoundRobin, None);
    let (front, stats, _, routes) = proxy_draining(pool, Duration::from_millis(300)).await;
    let (mut to_a, name) = connect(front, lo("127.0.0.1")).await;
    assert_eq!(name, "a");
    let (mut to_b, name) = connect(front, lo("127.0.0.1")).await;
    assert_eq!(name, "b");
    // a leaves: new connections go to b at once; the open one to a is closed after
    // the drain timeout, the one to b is not.
    change_endpoints(&routes, vec![b]);
    assert_eq!(connect(front, lo("127.0.0.1")).await.1, "b");
    assert!(
        closed_within(&mut to_a, WAIT).await,
        "the connection to a stays open"
    );
    assert!(!closed_within(&mut to_b, Duration::from_millis(600)).await);
    to_b.write_all(b"still here").await.unwrap();
    assert_eq!(stats.drained.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn without_a_drain_timeout_a_removed_endpoints_connections_go_on() {
    let (a, b) = (endpoint("a").await, endpoint("b").await);
    let pool = Pool::new(vec![a, b], Scheduler::RoundRobin, None);
    let (front, stats, _, routes) = proxy_draining(pool, Duration::ZERO).await;
    let (mut to_a, name) = connect(front, lo("127.0.0.1")).await;
    assert_eq!(name, "a");
    change_endpoints(&routes, vec![b]);
    assert!(!closed_within(&mut to_a, Duration::from_millis(600)).await);
    to_a.write_all(&[1u8; 1000]).await.unwrap();
    to_a.shutdown().await.unwrap();
    let mut rest = String::new();
    tokio::time::timeout(WAIT, to_a.read_to_string(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rest, "read 1000\n");
    assert_eq!(stats.drained.load(Ordering::Relaxed), 0);
}

/// A UDP endpoint answering each datagram with its name.
async fn udp_endpoint(name: &'static str) -> SocketAddr {
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = s.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 1500];
        while let Ok((_, from)) = s.recv_from(&mut buf).await {
            let _ = s.send_to(name.as_bytes(), from).await;
        }
    });
    addr
}

/// Sends from `client` (connected to the frontend: only replies from the address
/// it sent to are received) and returns the answer.
async fn ask(client: &UdpSocket) -> String {
    client.send(b"?").await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(WAIT, client.recv(&mut buf))
        .await
        .expect("an answer")
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test]
async fn udp_flows_stay_per_client_move_when_their_endpoint_leaves_and_idle_out() {
    let (a, b) = (udp_endpoint("a").await, udp_endpoint("b").await);
    let stats = Arc::new(Stats::default());
    let idle = Duration::from_millis(400);
    let front = UdpFrontend::start(
        &tokio::runtime::Handle::current(),
        IpFamily::V4,
        bind_wildcard(IpFamily::V4, 0).unwrap(),
        Pool::new(vec![a, b], Scheduler::RoundRobin, None),
        idle,
        stats.clone(),
    )
    .unwrap();
    let to = SocketAddr::from(([127, 0, 0, 1], front.port));
    let client = || async {
        let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        c.connect(to).await.unwrap();
        c
    };
    let (c1, c2) = (client().await, client().await);
    // One flow per client, each kept: round-robin gave c1 a and c2 b.
    for _ in 0..3 {
        assert_eq!(ask(&c1).await, "a");
        assert_eq!(ask(&c2).await, "b");
    }
    assert_eq!(stats.udp_flows.load(Ordering::Relaxed), 2);
    // a leaves: c1's flow moves to b at its next datagram; c2's stays.
    front.set_pool(Arc::new(front.pool().successor(
        vec![b],
        Scheduler::RoundRobin,
        None,
    )));
    assert_eq!(ask(&c1).await, "b");
    assert_eq!(ask(&c2).await, "b");
    assert_eq!(stats.udp_flows.load(Ordering::Relaxed), 3);
    // Idle past the timeout: the flow is closed, the next datagram opens another.
    tokio::time::sleep(idle * 2).await;
    assert_eq!(ask(&c2).await, "b");
    assert_eq!(stats.udp_flows.load(Ordering::Relaxed), 4);
    assert_eq!(stats.udp_datagrams_to_clients.load(Ordering::Relaxed), 9);
}
