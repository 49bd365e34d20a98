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

/// How long a TCP connection may stay idle between queries.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// TCP connections served at once. At the cap a new connection is still taken, and
/// the idlest one open is closed to make room (as NSD and Unbound shed load): a
/// client holding idle connections cannot keep others out.
const MAX_TCP_CONNECTIONS: usize = 1024;
/// TCP connections one client address may hold at once; a further one from it is
/// closed as soon as it is accepted.
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
    /// TCP connections closed at once because their client held
    /// [`MAX_TCP_PER_CLIENT`] already.
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

/// Answers queries from the catalog, and relays the others upstream.
pub struct Handler {
    catalog: Arc<RwLock<Catalog>>,
    /// Empty: names that are not the catalog's are refused.
    upstreams: Vec<SocketAddr>,
    limiter: Option<Mutex<RateLimiter>>,
    relays: Arc<tokio::sync::Semaphore>,
    counters: Arc<Counters>,
}

/// What to do with one query.
#[derive(Debug)]
pub enum Reply {
    /// Send these bytes back.
    Send(Vec<u8>),
    /// Relay it upstream first ([`Handler::relay`] gives the bytes to send).
    Relay(Relay),
    /// Nothing: it was not a query (too short for a header, or a response).
    Nothing,
}

/// A query for a name outside the catalog, to relay as it came.
#[derive(Debug)]
pub struct Relay {
    raw: Vec<u8>,
    request: Message,
    edns: Option<Edns>,
    transport: Transport,
    limit: u16,
}

impl Handler {
    pub fn new(
        catalog: Arc<RwLock<Catalog>>,
        upstreams: Vec<SocketAddr>,
        rate_limit: Option<RateLimit>,
    ) -> Self {
        Handler {
            catalog,
            upstreams,
            limiter: rate_limit.map(|r| Mutex::new(RateLimiter::new(r.rate, r.burst))),
            relays: Arc::new(tokio::sync::Semaphore::new(MAX_RELAYS)),
            counters: Arc::default(),
        }
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// The reply to the query `bytes` from `client`.
    pub fn respond(&self, bytes: &[u8], client: IpAddr, transport: Transport) -> Reply {
        self.respond_with(bytes, client, transport, None)
    }

    /// [`Handler::respond`], with a UDP worker's cache of encoded answers.
    fn respond_with(
        &self,
        bytes: &[u8],
        client: IpAddr,
        transport: Transport,
        mut cache: Option<&mut AnswerCache>,
    ) -> Reply {
        match transport {
            Transport::Udp => &self.counters.udp_queries,
            Transport::Tcp => &self.counters.tcp_queries,
        }
        .fetch_add(1, Ordering::Relaxed);
        let limited = self.over_limit(client);
        let catalog = self.catalog.read().unwrap_or_else(|e| e.into_inner());
        if let Some(cache) = cache
            .as_deref_mut()
            .filter(|_| !limited && catalog.is_ready())
        {
            if let Some(bytes) = cache.get(&catalog, bytes, client) {
                self.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .count_response(ResponseCode::from_low(bytes[3] & 0x0f));
                return Reply::Send(bytes);
            }
        }
        let request = match Message::from_vec(bytes) {
            Ok(m) => m,
            Err(_) => return self.malformed(bytes),
        };
        if request.metadata.message_type != MessageType::Query {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return Reply::Nothing;
        }
        let (edns, limit) = match negotiate(&request, transport) {
            Ok(ours) => ours,
            Err((ours, limit)) => {
                return self.error(&request, ResponseCode::BADVERS, Some(&ours), limit);
            }
        };
        if limited {
            return self.refuse_over_limit(&request, transport, edns.as_ref(), limit);
        }
        if request.metadata.op_code != OpCode::Query {
            return self.error(&request, ResponseCode::NotImp, edns.as_ref(), limit);
        }
        let [query] = request.queries.as_slice() else {
            return self.error(&request, ResponseCode::FormErr, edns.as_ref(), limit);
        };
        // `None`: not ready, the sources have not listed everything yet (an
        // NXDOMAIN now would be cached). `Some(None)`: not the catalog's name.
        let answer = catalog.is_ready().then(|| {
            matches!(query.query_class(), DNSClass::IN | DNSClass::ANY)
                .then(|| catalog.answer(query.name(), query.query_type(), Some(client)))
                .flatten()
        });
        let Some(answer) = answer else {
            return self.error(&request, ResponseCode::ServFail, edns.as_ref(), limit);
        };
        let Some(answer) = answer else {
            // Not ours: the upstreams', if there are any.
            if self.upstreams.is_empty() {
                return self.error(&request, ResponseCode::Refused, edns.as_ref(), limit);
            }
            return Reply::Relay(Relay {
                raw: bytes.to_vec(),
                request,
                edns,
                transport,
                limit,
            });
        };
        let reply = self.authoritative(&request, &answer, edns.as_ref(), limit);
        if let (Some(cache), Reply::Send(response)) = (cache, &reply) {
            cache.put(&catalog, bytes, client, response, answer.per_client);
        }
        reply
    }

    /// Whether `client` is over its rate limit (one query counted).
    fn over_limit(&self, client: IpAddr) -> bool {
        self.limiter.as_ref().is_some_and(|l| {
            !l.lock()
                .unwrap_or_else(|e| e.into_inner())
                .allow(client, std::time::Instant::now())
        })
    }

    /// A query over its client's rate limit: over UDP an empty truncated answer, no
    /// bigger than the query (no amplification; a real client retries over TCP,
    /// limited too); over TCP, REFUSED.
    fn refuse_over_limit(
        &self,
        request: &Message,
        transport: Transport,
        edns: Option<&Edns>,
        limit: u16,
    ) -> Reply {
        self.counters.rate_limited.fetch_add(1, Ordering::Relaxed);
        if transport == Transport::Udp {
            let mut metadata = Metadata::response_from_request(&request.metadata);
            metadata.truncation = true;
            return self.send(Parts::new(metadata, &request.queries), limit);
        }
        self.error(request, ResponseCode::Refused, edns, limit)
    }

    /// The catalog's answer, as the zone's authority.
    fn authoritative(
        &self,
        request: &Message,
        answer: &crate::catalog::Answer,
        edns: Option<&Edns>,
        limit: u16,
    ) -> Reply {
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.authoritative = true;
        metadata.response_code = answer.code;
        self.send(
            Parts {
                metadata,
                queries: &request.queries,
                answers: &answer.answers,
                authorities: &answer.authority,
                additionals: &answer.additionals,
                edns,
            },
            limit,
        )
    }

    /// The answer to a query for a name that is not the catalog's: the first
    /// upstream's, relayed, or SERVFAIL.
    pub async fn relay(&self, relay: Relay) -> Vec<u8> {
        let Relay {
            raw,
            request,
            edns,
            transport,
            limit,
        } = relay;
        let servfail = |h: &Handler| {
            h.counters.relay_failures.fetch_add(1, Ordering::Relaxed);
            match h.error(&request, ResponseCode::ServFail, edns.as_ref(), limit) {
                Reply::Send(bytes) => bytes,
                _ => Vec::new(),
            }
        };
        let Ok(_permit) = self.relays.clone().try_acquire_owned() else {
            return servfail(self);
        };
        self.counters.relayed.fetch_add(1, Ordering::Relaxed);
        let tcp = transport == Transport::Tcp;
        let id = request.metadata.id;
        let Some(relayed) = crate::upstream::forward(&self.upstreams, &raw, id, tcp).await else {
            return servfail(self);
        };
        match self.send(
            Parts {
                metadata: relayed.metadata,
                queries: &request.queries,
                answers: &relayed.answers,
                authorities: &relayed.authorities,
                additionals: &relayed.additionals,
                edns: edns.as_ref(),
            },
            limit,
        ) {
            Reply::Send(bytes) => bytes,
            _ => Vec::new(),
        }
    }

    /// A message that did not parse: FORMERR when its header did and says it is a
    /// query (as RFC 1035 asks), else nothing.
    fn malformed(&self, bytes: &[u8]) -> Reply {
        match Header::read(&mut BinDecoder::new(bytes)) {
            Ok(header) if header.metadata.message_type == MessageType::Query => {
                let mut metadata = Metadata::response_from_request(&header.metadata);
                metadata.response_code = ResponseCode::FormErr;
                self.send(Parts::new(metadata, &[]), 512)
            }
            _ => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                Reply::Nothing
            }
        }
    }

    fn error(
        &self,
        request: &Message,
        code: ResponseCode,
        edns: Option<&Edns>,
        limit: u16,
    ) -> Reply {
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.response_code = code;
        self.send(
            Parts {
                edns,
                ..Parts::new(metadata, &request.queries)
            },
            limit,
        )
    }

    fn send(&self, parts: Parts<'_>, limit: u16) -> Reply {
        self.counters.count_response(parts.metadata.response_code);
        Reply::Send(encode(parts, limit))
    }
}

/// A UDP worker's answers, encoded: the bytes of a query after its id, to the
/// bytes of the answer after its id. An answer is kept only while the catalog's
/// generation is the one it was made at; the query's bytes hold everything else an
/// answer depends on (flags, the question as spelt, EDNS and its payload size),
/// but for answers chosen for the client's node: those are kept per node, and the
/// query alone only says that its answer depends on the node. A hit costs a hash
/// lookup or two and a copy instead of parsing, looking up, choosing endpoints,
/// building records and encoding.
struct AnswerCache {
    generation: u64,
    entries: std::collections::HashMap<Box<[u8]>, Kept, foldhash::fast::RandomState>,
    /// Bytes held in keys and values.
    size: usize,
    /// The key being looked up (reused).
    key: Vec<u8>,
}

enum Kept {
    Answer(Box<[u8]>),
    /// The answer depends on the client's node: look again with the node.
    PerNode,
}

/// What one worker's cache may hold, in bytes of queries and answers; when full
/// it starts again empty (queries for hot names fill it again at once).
const CACHE_BYTES: usize = 4 << 20;

/// Key prefixes: the query alone, the query from a client on a known node (then
/// the node's name and a NUL follow), from a client on no known node.
const ANY_CLIENT: u8 = 0;
const ON_NODE: u8 = 1;
const NO_NODE: u8 = 2;

impl AnswerCache {
    fn new() -> Self {
        AnswerCache {
            generation: u64::MAX,
            entries: std::collections::HashMap::default(),
            size: 0,
            key: Vec::with_capacity(512),
        }
    }

    fn set_key(&mut self, query: &[u8], node: Option<Option<&str>>) {
        self.key.clear();
        match node {
            None => self.key.push(ANY_CLIENT),
            Some(None) => self.key.push(NO_NODE),
            Some(Some(node)) => {
                self.key.push(ON_NODE);
                self.key.extend_from_slice(node.as_bytes());
                self.key.push(0);
            }
        }
        self.key.extend_from_slice(&query[2..]);
    }

    /// The answer to `query` from `client`, its id set, if kept.
    fn get(&mut self, catalog: &Catalog, query: &[u8], client: IpAddr) -> Option<Vec<u8>> {
        if catalog.generation() != self.generation {
            self.entries.clear();
            self.size = 0;
            self.generation = catalog.generation();
            return None;
        }
        let id = query.get(..2)?;
        self.set_key(query, None);
        let mut kept = self.entries.get(self.key.as_slice())?;
        if let Kept::PerNode = kept {
            self.set_key(query, Some(catalog.client_node(Some(client))));
            kept = self.entries.get(self.key.as_slice())?;
        }
        let Kept::Answer(tail) = kept else {
            return None;
        };
        let mut out = Vec::with_capacity(tail.len() + 2);
        out.extend_from_slice(id);
        out.extend_from_slice(tail);
        Some(out)
    }

    /// Keeps `answer` to `query` from `client`, made at `catalog`'s generation.
    fn put(
        &mut self,
        catalog: &Catalog,
        query: &[u8],
        client: IpAddr,
        answer: &[u8],
        per_client: bool,
    ) {
        if catalog.generation() != self.generation || query.len() < 12 || answer.len() < 12 {
            return;
        }
        if per_client {
            self.set_key(query, None);
            self.insert(Kept::PerNode);
            self.set_key(query, Some(catalog.client_node(Some(client))));
        } else {
            self.set_key(query, None);
        }
        self.insert(Kept::Answer(answer[2..].into()));
    }

    fn insert(&mut self, kept: Kept) {
        let size = self.key.len()
            + match &kept {
                Kept::Answer(a) => a.len(),
                Kept::PerNode => 0,
            };
        if self.size + size > CACHE_BYTES {
            self.entries.clear();
            self.size = 0;
        }
        if self
            .entries
            .insert(self.key.as_slice().into(), kept)
            .is_none()
        {
            self.size += size;
        }
    }
}

/// A response's sections, borrowed.
#[derive(Clone, Copy)]
struct Parts<'a> {
    metadata: Metadata,
    queries: &'a [Query],
    answers: &'a [Record],
    authorities: &'a [Record],
    additionals: &'a [Record],
    edns: Option<&'a Edns>,
}

impl<'a> Parts<'a> {
    /// A header and the question, nothing else.
    fn new(metadata: Metadata, queries: &'a [Query]) -> Self {
        Parts {
            metadata,
            queries,
            answers: &[],
            authorities: &[],
            additionals: &[],
            edns: None,
        }
    }
}

fn emit(parts: &Parts<'_>) -> Result<Vec<u8>, hickory_proto::ProtoError> {
    let mut buffer = Vec::with_capacity(512);
    let mut encoder = BinEncoder::new(&mut buffer);
    emit_message_parts(
        &parts.metadata,
        &mut parts.queries.iter(),
        &mut parts.answers.iter(),
        &mut parts.authorities.iter(),
        &mut parts.additionals.iter(),
        parts.edns,
        None,
        &mut encoder,
    )?;
    Ok(buffer)
}

/// The response in wire form, at most `limit` bytes: when the whole does not fit,
/// as many answer records as do, with the TC bit set (the client asks again over
/// TCP), and no other section but the question and EDNS.
fn encode(parts: Parts<'_>, limit: u16) -> Vec<u8> {
    let limit = usize::from(limit);
    if let Ok(whole) = emit(&parts) {
        if whole.len() <= limit {
            return whole;
        }
    }
    let mut cut = Parts {
        authorities: &[],
        additionals: &[],
        ..parts
    };
    cut.metadata.truncation = true;
    // The most answers that fit: a binary search over the count.
    let fits = |n: usize| {
        let cut = Parts {
            answers: &parts.answers[..n],
            ..cut
        };
        emit(&cut).ok().filter(|bytes| bytes.len() <= limit)
    };
    let mut best = fits(0);
    if best.is_some() {
        // `lo` fits; `hi` does not, or is past the last answer.
        let (mut lo, mut hi) = (0, parts.answers.len() + 1);
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            match fits(mid) {
                Some(bytes) => (lo, best) = (mid, Some(bytes)),
                None => hi = mid,
            }
        }
    }
    best.unwrap_or_else(|| {
        // Not even the question fits (or encoding failed): SERVFAIL, header only.
        let mut metadata = parts.metadata;
        metadata.response_code = ResponseCode::ServFail;
        emit(&Parts::new(metadata, &[])).unwrap_or_default()
    })
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

/// A UDP socket with `SO_REUSEPORT`, so that each worker has its own and the
/// kernel spreads clients over them.
fn reuseport_udp(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// A TCP listener on `addr` with a backlog of [`TCP_BACKLOG`], with `SO_REUSEPORT`
/// as the UDP sockets: a warm standby svcproxy on the same node serves the same port
/// (from its own catalog) until it takes over.
fn tcp_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    socket.listen(TCP_BACKLOG)?;
    Ok(socket.into())
}

/// `workers` UDP sockets and a TCP listener on `addr`'s one port. With port 0, the
/// port the kernel gives the first UDP socket may be in use for TCP (by any
/// connection's local end): then another is tried, a few times.
fn bind_all(
    addr: SocketAddr,
    workers: usize,
) -> std::io::Result<(Vec<UdpSocket>, std::net::TcpListener)> {
    let mut tries = if addr.port() == 0 { 20 } else { 1 };
    loop {
        let first = reuseport_udp(addr)?;
        let port = first.local_addr()?;
        match tcp_listener(port) {
            Ok(tcp) => {
                let mut udp = vec![first];
                for _ in 1..workers {
                    udp.push(reuseport_udp(port)?);
                }
                return Ok((udp, tcp));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tries > 1 => tries -= 1,
            Err(e) => return Err(e),
        }
    }
}

/// Queries a UDP worker takes at once: received one after another while more are
/// waiting, answered, and the answers sent with one `sendmmsg`.
const UDP_BATCH: usize = 32;
/// How long a UDP worker pauses after a receive error it does not expect.
const RECEIVE_ERROR_PAUSE: Duration = Duration::from_millis(10);
/// The largest query read over UDP; a longer datagram is dropped (a query is a
/// header, one question and an OPT record: a few hundred bytes at most).
const MAX_UDP_QUERY: usize = 4096;

/// One UDP worker: receive, answer, send, until `stop`. It blocks for the first
/// query, then takes the ones already waiting (up to [`UDP_BATCH`]) without
/// blocking, and sends all their answers in one system call: under load, one send
/// per batch instead of one per query.
fn serve_udp(
    socket: Arc<UdpSocket>,
    handler: Arc<Handler>,
    rt: tokio::runtime::Handle,
    stop: Arc<AtomicBool>,
) {
    use rustix::net::RecvFlags;
    let mut buf = vec![0u8; MAX_UDP_QUERY];
    let mut cache = AnswerCache::new();
    let mut answers: Vec<(Vec<u8>, SocketAddr)> = Vec::with_capacity(UDP_BATCH);
    let mut failed = false;
    while !stop.load(Ordering::Relaxed) {
        let mut flags = RecvFlags::TRUNC;
        while answers.len() < UDP_BATCH {
            let (n, src) = match rustix::net::recvfrom(&*socket, &mut buf[..], flags) {
                Ok((_, n, Some(src))) => match SocketAddr::try_from(src) {
                    Ok(src) => (n, src),
                    Err(_) => continue,
                },
                Ok((_, _, None)) => continue,
                // Nothing more waiting (or, blocking, nothing for STOP_POLL).
                Err(rustix::io::Errno::AGAIN) => break,
                Err(rustix::io::Errno::INTR) => continue,
                // An ICMP error of an earlier send (with IP_RECVERR): go on.
                Err(rustix::io::Errno::CONNREFUSED) => continue,
                Err(e) => {
                    // Anything else may repeat at once (out of memory): answer what
                    // was taken, then pause rather than spin.
                    tracing::debug!(error = %e, "DNS: receiving over UDP");
                    failed = true;
                    break;
                }
            };
            flags = RecvFlags::TRUNC | RecvFlags::DONTWAIT;
            if n > buf.len() {
                handler.counters.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            match handler.respond_with(&buf[..n], src.ip(), Transport::Udp, Some(&mut cache)) {
                Reply::Send(bytes) => answers.push((bytes, src)),
                Reply::Relay(relay) => {
                    let (socket, handler) = (socket.clone(), handler.clone());
                    rt.spawn(async move {
                        let bytes = handler.relay(relay).await;
                        send_udp(&socket, &bytes, src);
                    });
                }
                Reply::Nothing => {}
            }
        }
        send_all(&socket, &answers);
        answers.clear();
        if std::mem::take(&mut failed) {
            std::thread::sleep(RECEIVE_ERROR_PAUSE);
        }
    }
}

/// Sends each answer to its client with `sendmmsg`, as many per call as the kernel
/// takes; an answer the kernel refuses is skipped.
fn send_all(socket: &UdpSocket, answers: &[(Vec<u8>, SocketAddr)]) {
    use rustix::net::addr::SocketAddrArg;
    use rustix::net::{MMsgHdr, SendAncillaryBuffer, SendFlags};
    let mut rest = answers
        .iter()
        .filter(|(bytes, _)| !bytes.is_empty())
        .collect::<Vec<_>>();
    while !rest.is_empty() {
        let iovs: Vec<[std::io::IoSlice<'_>; 1]> = rest
            .iter()
            .map(|(bytes, _)| [std::io::IoSlice::new(bytes)])
            .collect();
        let addrs: Vec<rustix::net::SocketAddrAny> =
            rest.iter().map(|(_, to)| to.as_any()).collect();
        let mut controls: Vec<SendAncillaryBuffer<'_, '_, '_>> = rest
            .iter()
            .map(|_| SendAncillaryBuffer::default())
            .collect();
        let mut msgs: Vec<MMsgHdr<'_>> = iovs
            .iter()
            .zip(&addrs)
            .zip(controls.iter_mut())
            .map(|((iov, addr), control)| MMsgHdr::new_with_addr(addr, iov, control))
            .collect();
        let sent = match rustix::net::sendmmsg(socket, &mut msgs, SendFlags::empty()) {
            Ok(0) => 1,
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => 0,
            Err(e) => {
                tracing::debug!(error = %e, client = %rest[0].1, "DNS: sending an answer over UDP");
                1
            }
        };
        rest.drain(..sent.min(rest.len()));
    }
}

fn send_udp(socket: &UdpSocket, bytes: &[u8], to: SocketAddr) {
    if bytes.is_empty() {
        return;
    }
    if let Err(e) = socket.send_to(bytes, to) {
        tracing::debug!(error = %e, client = %to, "DNS: sending an answer over UDP");
    }
}

/// The TCP connections open: per connection its client and when it last did
/// something (and how to close it), per client how many it holds.
#[derive(Default)]
struct TcpTable {
    next: u64,
    open: HashMap<u64, (IpAddr, Arc<TcpConn>)>,
    per_client: HashMap<IpAddr, usize>,
}

/// One open connection, as its task and the table share it.
struct TcpConn {
    /// Milliseconds since the table's epoch of the last query (or the accept).
    last_active: AtomicU64,
    /// Told when the table closes the connection to make room.
    close: tokio::sync::Notify,
}

/// [`TcpTable`] behind its lock, with the clock its connections' activity is on.
struct TcpConnections {
    table: Mutex<TcpTable>,
    epoch: Instant,
    counters: Arc<Counters>,
}

impl TcpConnections {
    fn new(counters: Arc<Counters>) -> Self {
        TcpConnections {
            table: Mutex::new(TcpTable::default()),
            epoch: Instant::now(),
            counters,
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A new connection from `client`: its entry, or `None` when the client holds
    /// [`MAX_TCP_PER_CLIENT`] already. At [`MAX_TCP_CONNECTIONS`] the idlest
    /// connection open is told to close, and leaves the table at once.
    fn admit(&self, client: IpAddr) -> Option<(u64, Arc<TcpConn>)> {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let held = t.per_client.get(&client).copied().unwrap_or(0);
        if held >= MAX_TCP_PER_CLIENT {
            self.counters
                .tcp_over_client_limit
                .fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if t.open.len() >= MAX_TCP_CONNECTIONS {
            let idlest = t
                .open
                .iter()
                .min_by_key(|(_, (_, c))| c.last_active.load(Ordering::Relaxed))
                .map(|(id, _)| *id);
            if let Some(id) = idlest {
                Self::forget(&mut t, id);
                self.counters.tcp_shed.fetch_add(1, Ordering::Relaxed);
            }
        }
        let conn = Arc::new(TcpConn {
            last_active: AtomicU64::new(self.now()),
            close: tokio::sync::Notify::new(),
        });
        t.next += 1;
        let id = t.next;
        t.open.insert(id, (client, conn.clone()));
        *t.per_client.entry(client).or_default() += 1;
        self.counters
            .tcp_open
            .store(t.open.len() as u64, Ordering::Relaxed);
        Some((id, conn))
    }

    /// The connection `id` ended (whether or not it was told to).
    fn release(&self, id: u64) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        Self::forget(&mut t, id);
        self.counters
            .tcp_open
            .store(t.open.len() as u64, Ordering::Relaxed);
    }

    fn forget(t: &mut TcpTable, id: u64) {
        if let Some((client, conn)) = t.open.remove(&id) {
            conn.close.notify_one();
            if let Some(n) = t.per_client.get_mut(&client) {
                *n -= 1;
                if *n == 0 {
                    t.per_client.remove(&client);
                }
            }
        }
    }
}

/// Accepts TCP connections until `stop`: every one is taken (see
/// [`TcpConnections::admit`] for which are closed at once, and which to make room).
async fn serve_tcp(
    listener: tokio::net::TcpListener,
    handler: Arc<Handler>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let connections = Arc::new(TcpConnections::new(handler.counters()));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = &mut stop => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let Some((id, conn)) = connections.admit(peer.ip()) else {
                    drop(stream);
                    continue;
                };
                let (handler, connections) = (handler.clone(), connections.clone());
                tokio::spawn(async move {
                    tcp_connection(stream, peer, &handler, &conn, &connections).await;
                    connections.release(id);
                });
            }
            Err(e) => {
                // Out of file descriptors, most likely: wait rather than spin.
                tracing::warn!(error = %e, "DNS: accepting a TCP connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Queries on one TCP connection, each a 2-byte length and a message, answered in
/// order; the connection closes when idle for [`TCP_IDLE`], on a message that is
/// not a query, or when the table closes it to make room.
async fn tcp_connection(
    mut stream: tokio::net::TcpStream,
    peer: SocketAddr,
    handler: &Handler,
    conn: &TcpConn,
    connections: &TcpConnections,
) {
    let _ = stream.set_nodelay(true);
    loop {
        let mut len = [0u8; 2];
        let mut message = Vec::new();
        let read = async {
            stream.read_exact(&mut len).await?;
            message.resize(usize::from(u16::from_be_bytes(len)), 0);
            stream.read_exact(&mut message).await
        };
        tokio::select! {
            read = tokio::time::timeout(TCP_IDLE, read) => match read {
                Ok(Ok(_)) => {}
                _ => return,
            },
            _ = conn.close.notified() => return,
        }
        conn.last_active.store(connections.now(), Ordering::Relaxed);
        let bytes = match handler.respond(&message, peer.ip(), Transport::Tcp) {
            Reply::Send(bytes) => bytes,
            Reply::Relay(relay) => handler.relay(relay).await,
            Reply::Nothing => return,
        };
        let Ok(n) = u16::try_from(bytes.len()) else {
            return;
        };
        let mut framed = Vec::with_capacity(bytes.len() + 2);
        framed.extend_from_slice(&n.to_be_bytes());
        framed.extend_from_slice(&bytes);
        if stream.write_all(&framed).await.is_err() {
            return;
        }
    }
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

/// The EDNS of the answer to `request` and the size the answer may take: 512
/// bytes over UDP without EDNS, the client's payload size (within bounds) with
/// it, any over TCP. `Err`: an EDNS version this server does not speak (BADVERS,
/// with ours).
fn negotiate(request: &Message, transport: Transport) -> Result<(Option<Edns>, u16), (Edns, u16)> {
    let mut limit = match transport {
        Transport::Udp => 512,
        Transport::Tcp => u16::MAX,
    };
    let Some(asked) = request.edns.as_ref() else {
        return Ok((None, limit));
    };
    let payload = asked.max_payload().clamp(512, MAX_UDP_PAYLOAD);
    let mut ours = Edns::new();
    ours.set_max_payload(payload);
    ours.set_version(0);
    if transport == Transport::Udp {
        limit = payload;
    }
    if asked.version() > 0 {
        return Err((ours, limit));
    }
    Ok((Some(ours), limit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{Name, RData};

    fn answers(n: usize) -> Vec<Record> {
        let name = Name::from_ascii("big.demo.svc.cluster.local.").unwrap();
        (0..n)
            .map(|i| {
                Record::from_rdata(
                    name.clone(),
                    5,
                    RData::A(A::new(10, 0, (i / 256) as u8, (i % 256) as u8)),
                )
            })
            .collect()
    }

    #[test]
    fn a_response_too_big_keeps_the_answers_that_fit_and_sets_tc() {
        let queries = [Query::query(
            Name::from_ascii("big.demo.svc.cluster.local.").unwrap(),
            hickory_proto::rr::RecordType::A,
        )];
        let records = answers(100);
        let parts = Parts {
            answers: &records,
            additionals: &records[..3],
            ..Parts::new(
                Metadata::new(7, MessageType::Response, OpCode::Query),
                &queries,
            )
        };
        let whole = encode(parts, u16::MAX);
        let m = Message::from_vec(&whole).unwrap();
        assert_eq!((m.answers.len(), m.additionals.len()), (100, 3));
        assert!(!m.metadata.truncation);
        for limit in [512u16, 700, 1000] {
            let bytes = encode(parts, limit);
            assert!(bytes.len() <= usize::from(limit));
            let m = Message::from_vec(&bytes).unwrap();
            assert!(m.metadata.truncation);
            assert!(m.additionals.is_empty());
            // One more record (16 bytes, compressed) would not have fitted.
            assert!(
                bytes.len() + 16 > usize::from(limit),
                "{limit}: {}",
                bytes.len()
            );
            assert_eq!(m.answers[..], records[..m.answers.len()]);
        }
        // Nothing fits but the header: SERVFAIL, header only.
        let m = Message::from_vec(&encode(parts, 20)).unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    }
}
