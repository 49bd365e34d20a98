//! The userspace proxy's engine on real TCP sockets, loopback only: a dead endpoint
//! is skipped so every client is answered, round-robin spreads exactly,
//! least-connections prefers the idle endpoint, affinity sticks, a half-closed
//! connection keeps its other half, and a client with no reachable endpoint is
//! refused.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use svcproxy_dataplane::userspace::{serve_tcp, Options, Pool, Routes, Scheduler, Stats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

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

/// The engine on an ephemeral port, with `pool` as that port's frontend.
async fn proxy(pool: Pool) -> (SocketAddr, Arc<Stats>, Arc<Pool>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front = l.local_addr().unwrap();
    let pool = Arc::new(pool);
    let routes: Routes = Arc::new(RwLock::new(HashMap::from([(front, pool.clone())])));
    let stats = Arc::new(Stats::default());
    let options = Options {
        connect_timeout: Duration::from_secs(1),
    };
    tokio::spawn(serve_tcp(l, routes, options, stats.clone()));
    (front, stats, pool)
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

#[tokio::test]
async fn a_half_closed_connection_keeps_its_other_half() {
    let eps = vec![endpoint("a").await];
    let (front, stats, _) = proxy(Pool::new(eps, Scheduler::RoundRobin, None)).await;
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
    assert_eq!(rest, format!("read {}\n", 1 << 20));
    for _ in 0..100 {
        if stats.active.load(Ordering::Relaxed) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(stats.bytes_to_endpoints.load(Ordering::Relaxed), 1 << 20);
    assert_eq!(stats.active.load(Ordering::Relaxed), 0);
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
