//! The DNS server: UDP and TCP on one address, answers from a shared [`Catalog`],
//! other names relayed to upstream resolvers ([`crate::upstream`]).
//!
//! hickory-proto does the wire format (parsing, encoding with name compression);
//! this module moves datagrams and streams. [`Handler::respond`] turns one query's
//! bytes into the answer's bytes, synchronously; UDP is served by blocking worker
//! threads, each with its own `SO_REUSEPORT` socket, that receive, answer and send
//! with no task, no wake-up and no hand-off per query (a task per query, as
//! hickory-server's server runs them, spent most of its time switching tasks). Only
//! what must wait goes to the async runtime: TCP connections and relays upstream.
//!
//! The parts: `handler` (one query's bytes to its answer's, or to a relay),
//! `encode` (a response in wire form, truncated to fit), `cache` (a UDP worker's
//! encoded answers), `udp` (the worker threads), `tcp` (connections, their
//! limits and shedding), `bind` (the sockets on one port). Here: the limits, the
//! counters, the options, and [`Dedicated`], the running server.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use hickory_proto::op::{
    emit_message_parts, Edns, Header, Message, MessageType, Metadata, OpCode, Query, ResponseCode,
};
use hickory_proto::rr::{DNSClass, Record};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, BinEncoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::catalog::Catalog;
use crate::limit::RateLimiter;

mod bind;
mod cache;
mod encode;
mod handler;
mod tcp;
mod udp;

use bind::bind_all;
use cache::AnswerCache;
use encode::{encode, Parts};
pub use handler::{Handler, Relay, Reply};
use tcp::serve_tcp;
use udp::serve_udp;

/// How long a TCP connection may stay idle between queries.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// TCP connections served at once. At the cap a new connection is still taken, and
/// the idlest one open is closed to make room (as NSD and Unbound shed load): a
/// client holding idle connections cannot keep others out.
const MAX_TCP_CONNECTIONS: usize = 1024;
/// TCP connections one client address may hold at once; a further one from it is
/// taken, and that client's idlest connection closed to make room.
const MAX_TCP_PER_CLIENT: usize = 64;
/// The TCP listen backlog (the kernel caps it at `net.core.somaxconn`): room for a
/// burst of connections while the accept loop catches up.
const TCP_BACKLOG: i32 = 4096;
/// Relays upstream in flight at once; past this a query that needs one is answered
/// SERVFAIL at once (a flood of foreign names cannot pile up tasks).
const MAX_RELAYS: usize = 1024;
/// The largest UDP answer sent, whatever a client's EDNS offers.
const MAX_UDP_PAYLOAD: u16 = 4096;
/// How often an idle UDP worker looks whether it should stop.
const STOP_POLL: Duration = Duration::from_millis(200);

/// The transport a query came on: UDP answers are truncated to the client's
/// payload size (512 bytes without EDNS), TCP ones to 65,535.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// What the server has done, for the metrics: monotonic counts.
#[derive(Debug, Default)]
pub struct Counters {
    /// Queries received (parsed or not), by transport.
    pub udp_queries: AtomicU64,
    pub tcp_queries: AtomicU64,
    /// Answers sent by response code: NOERROR, FORMERR, SERVFAIL, NXDOMAIN,
    /// NOTIMP, REFUSED, other.
    responses: [AtomicU64; RCODES.len() + 1],
    /// UDP answers sent from a worker's cache of encoded answers.
    pub cache_hits: AtomicU64,
    /// Answers with no records because the client was over its rate limit.
    pub rate_limited: AtomicU64,
    /// Queries relayed upstream, and those no upstream answered in time.
    pub relayed: AtomicU64,
    pub relay_failures: AtomicU64,
    /// Datagrams or messages that were not queries (too short, or responses):
    /// dropped without an answer.
    pub dropped: AtomicU64,
    /// TCP connections open now.
    pub tcp_open: AtomicU64,
    /// TCP connections closed, their client's idlest first, because their client
    /// opened one more past [`MAX_TCP_PER_CLIENT`].
    pub tcp_over_client_limit: AtomicU64,
    /// TCP connections closed, the idlest first, to make room for a new one at
    /// [`MAX_TCP_CONNECTIONS`].
    pub tcp_shed: AtomicU64,
}

const RCODES: [ResponseCode; 6] = [
    ResponseCode::NoError,
    ResponseCode::FormErr,
    ResponseCode::ServFail,
    ResponseCode::NXDomain,
    ResponseCode::NotImp,
    ResponseCode::Refused,
];

impl Counters {
    fn count_response(&self, code: ResponseCode) {
        let i = RCODES
            .iter()
            .position(|c| *c == code)
            .unwrap_or(RCODES.len());
        self.responses[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Answers sent, by the response code's name (`NOERROR`, ..., `other`).
    pub fn responses(&self) -> Vec<(&'static str, u64)> {
        const NAMES: [&str; RCODES.len() + 1] = [
            "NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED", "other",
        ];
        NAMES
            .iter()
            .zip(&self.responses)
            .map(|(n, c)| (*n, c.load(Ordering::Relaxed)))
            .collect()
    }
}

/// Queries per second per client address, and the burst allowed at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    pub rate: u32,
    pub burst: u32,
}

/// Where names that are not the catalog's go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Upstreams {
    /// `--dns-upstream`: these, when any.
    pub configured: Vec<SocketAddr>,
    /// Else the `nameserver`s of this resolv.conf text.
    pub resolv_conf: String,
}

/// How the server runs, beyond its address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub upstreams: Upstreams,
    /// `None`: no limit.
    pub rate_limit: Option<RateLimit>,
    /// UDP worker threads; 0: one per CPU this process may run on.
    pub udp_workers: usize,
}

/// A running server: UDP worker threads, and a thread with a single-threaded
/// runtime for TCP and relays (the process's other runtime keeps the sources and
/// syncs, so queries never wait behind a sync).
pub struct Dedicated {
    pub addr: SocketAddr,
    pub upstreams: Vec<SocketAddr>,
    pub counters: Arc<Counters>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    stop_udp: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Dedicated {
    /// Binds `addr` (UDP and TCP, the same port) and starts serving; returns once
    /// bound, or with the bind's error.
    pub fn start(
        catalog: Arc<RwLock<Catalog>>,
        addr: SocketAddr,
        options: &Options,
    ) -> std::io::Result<Dedicated> {
        let workers = match options.udp_workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let (udp, tcp) = bind_all(addr, workers)?;
        let bound = udp[0].local_addr()?;
        let upstreams = crate::upstream::choose(
            &options.upstreams.configured,
            &options.upstreams.resolv_conf,
            bound,
        );
        let handler = Arc::new(Handler::new(catalog, upstreams.clone(), options.rate_limit));
        let counters = handler.counters();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let stop_udp = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (i, socket) in udp.into_iter().enumerate() {
            socket.set_read_timeout(Some(STOP_POLL))?;
            let (socket, handler, stop) = (Arc::new(socket), handler.clone(), stop_udp.clone());
            let rt = rt.handle().clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("dns-udp-{i}"))
                    .spawn(move || {
                        serve_udp(socket, handler, rt, stop);
                        Ok(())
                    })?,
            );
        }
        tcp.set_nonblocking(true)?;
        threads.push(std::thread::Builder::new().name("dns".into()).spawn(
            move || -> std::io::Result<()> {
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(tcp)?;
                    serve_tcp(listener, handler, stop_rx).await;
                    Ok(())
                })
            },
        )?);
        Ok(Dedicated {
            addr: bound,
            upstreams,
            counters,
            stop: Some(stop_tx),
            stop_udp,
            threads,
        })
    }

    /// Stops serving and waits for the threads.
    pub fn stop(mut self) -> std::io::Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.stop_udp.store(true, Ordering::Relaxed);
        let mut result = Ok(());
        for t in self.threads.drain(..) {
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(e),
                Err(_) => result = Err(std::io::Error::other("a DNS thread panicked")),
            }
        }
        result
    }
}

impl Drop for Dedicated {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
