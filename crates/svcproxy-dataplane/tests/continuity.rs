//! A full sync of a large table does not stall established connections
//! (kubernetes#139328: upstream found one giant nftables transaction at cold start
//! held up forwarding). In a throwaway network namespace holding 10,000 services,
//! a connection to one of them, DNATed to a local listener, bounces a byte back
//! and forth without pause while the tables are rewritten twice: a full resync in
//! place, then a recreate (the tables deleted and loaded again, one transaction,
//! as at start). The largest round trip must stay far below the time the kernel
//! spends in such a transaction (about 0.4 s at this size on a 2-core machine).
//!
//! Without root (or `ip`/`nft`) the test prints SKIP and passes, unless `CI` is
//! set, in which case it fails.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::netns::Netns;
use common::*;
use svcproxy_dataplane::{NftCommand, NftDataPlane, SyncKind};

const SERVICES: usize = 10_000;
/// Endpoints of every service but the one the connection goes to.
const ENDPOINTS: usize = 10;
/// A round trip this long would be a stall: the kernel's share of a full sync
/// here is several times longer.
const STALL: Duration = Duration::from_millis(150);

/// Runs `f` on a thread inside the namespace at `path`: sockets it makes stay
/// there.
fn in_netns<T: Send>(path: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let ns = std::fs::File::open(path).expect("the namespace");
            rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .expect("setns");
            f()
        })
        .join()
        .expect("namespace thread")
    })
}

#[test]
fn established_connections_flow_through_full_syncs_of_10k_services() {
    let Some(ns) = Netns::create("continuity", "c", &["nft"]) else {
        return;
    };
    let path = format!("/run/netns/{}", ns.name);
    ns.run_ok(&["ip", "link", "set", "lo", "up"], None)
        .expect("lo up");
    ns.run_ok(&["ip", "addr", "add", "10.77.0.1/32", "dev", "lo"], None)
        .expect("endpoint address");
    // A route for the service addresses (the DNAT then sends them to the listener).
    ns.run_ok(
        &[
            "ip",
            "route",
            "add",
            "198.19.0.0/16",
            "dev",
            "lo",
            "src",
            "10.77.0.1",
        ],
        None,
    )
    .expect("service route");

    // svc-0's one endpoint is the local listener; every other service has ten
    // endpoints nothing answers on.
    let mut state = cluster(&[]);
    upsert(
        &mut state,
        &(services_yaml(0, 1, 1).replacen("[10.0.0.1]", "[10.77.0.1]", 1)
            + &services_yaml(1, SERVICES, ENDPOINTS)),
    );
    let mut dp = Syncer::new(
        plan_config(),
        NftDataPlane::with_sink(
            NftCommand::from_argv(["ip", "netns", "exec", &ns.name, "nft"]).in_netns(&path),
        ),
    );
    let first = Instant::now();
    let report = dp.sync(&snapshot(&mut state), true).expect("first sync");
    assert_eq!(report.kind, SyncKind::Recreate);
    eprintln!("first sync of {SERVICES} services: {:?}", first.elapsed());

    // The echo side and the client, both in the namespace; the client connects to
    // svc-0's cluster IP (DNATed by the table).
    let (listener, client) = in_netns(&path, || {
        let l = TcpListener::bind("10.77.0.1:8080").expect("listen");
        let c =
            TcpStream::connect_timeout(&"198.19.0.1:80".parse().unwrap(), Duration::from_secs(5))
                .expect("connect through the service");
        (l, c)
    });
    let (mut server, _) = listener.accept().expect("accept");
    std::thread::spawn(move || {
        let mut b = [0u8; 1];
        while server.read_exact(&mut b).is_ok() && server.write_all(&b).is_ok() {}
    });
    let stop = Arc::new(AtomicBool::new(false));
    let pinger = {
        let stop = stop.clone();
        let mut c = client;
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.set_nodelay(true).unwrap();
        std::thread::spawn(move || {
            // Bounded: at most 60 s or 10 million round trips.
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut worst = Duration::ZERO;
            let mut trips = 0u64;
            let mut b = [7u8; 1];
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline && trips < 10_000_000 {
                let t = Instant::now();
                c.write_all(&b)
                    .expect("write on the established connection");
                c.read_exact(&mut b)
                    .expect("read on the established connection");
                worst = worst.max(t.elapsed());
                trips += 1;
            }
            (worst, trips)
        })
    };
    std::thread::sleep(Duration::from_millis(200));

    // A full resync in place, then a recreate (the kernel's state made unknown by
    // a table taken away, as after a drift).
    let t = Instant::now();
    let resync = dp.sync(&snapshot(&mut state), true).expect("resync");
    let resync_time = t.elapsed();
    assert_eq!(resync.kind, SyncKind::Resync);
    ns.run_ok(&["nft", "delete", "table", "ip6", "svcproxy"], None)
        .expect("take the ip6 table away");
    assert!(dp.drift().expect("drift check").is_some());
    let t = Instant::now();
    let recreate = dp.sync(&snapshot(&mut state), false).expect("recreate");
    let recreate_time = t.elapsed();
    assert_eq!(recreate.kind, SyncKind::Recreate);
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let (worst, trips) = pinger.join().expect("pinger");
    eprintln!(
        "resync {resync_time:?} (applied in {:?}), recreate {recreate_time:?} (applied in {:?}): {trips} round trips, the longest {worst:?}",
        resync.apply_duration, recreate.apply_duration
    );
    assert!(
        trips > 100,
        "the connection hardly moved: {trips} round trips"
    );
    assert!(
        worst < STALL,
        "a round trip took {worst:?} during the full syncs (applied in {:?} and {:?})",
        resync.apply_duration,
        recreate.apply_duration
    );
}
