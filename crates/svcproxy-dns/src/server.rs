//! The DNS server: UDP and TCP on one address, answers from a shared [`Catalog`],
//! other names relayed to upstream resolvers ([`crate::upstream`]). hickory-server
//! does the wire work (parsing, EDNS payload sizes, truncation with the TC bit on
//! UDP, TCP framing); this module only asks the catalog or the upstreams.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use hickory_proto::op::{Edns, MessageType, Metadata, OpCode, ResponseCode};
use hickory_server::net::runtime::Time;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use hickory_server::Server;

use crate::catalog::Catalog;
use crate::limit::RateLimiter;

/// How long a TCP connection may stay idle between queries.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// Answers queries from the catalog, and relays the others upstream.
pub struct Handler {
    catalog: Arc<RwLock<Catalog>>,
    /// Empty: names that are not the catalog's are refused.
    upstreams: Vec<SocketAddr>,
    limiter: Option<Mutex<RateLimiter>>,
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
        }
    }
}

/// Queries per second per client address, and the burst allowed at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    pub rate: u32,
    pub burst: u32,
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let mut edns = None;
        if let Some(asked) = request.edns.as_ref() {
            let mut ours = Edns::new();
            ours.set_max_payload(asked.max_payload().max(512));
            ours.set_version(0);
            if asked.version() > 0 {
                return send_error(request, ResponseCode::BADVERS, Some(&ours), response_handle)
                    .await;
            }
            edns = Some(ours);
        }
        let limited = self.limiter.as_ref().is_some_and(|l| {
            !l.lock()
                .unwrap_or_else(|e| e.into_inner())
                .allow(request.src().ip(), std::time::Instant::now())
        });
        if limited {
            // Over UDP an empty truncated answer, no bigger than the query (no
            // amplification; a real client retries over TCP, limited too); over
            // TCP, REFUSED.
            if request.protocol() == hickory_server::net::xfer::Protocol::Udp {
                let mut metadata = Metadata::response_from_request(&request.metadata);
                metadata.truncation = true;
                let response =
                    MessageResponseBuilder::new(&request.queries, None).build_no_records(metadata);
                return sent(request, response_handle.send_response(response).await);
            }
            return send_error(
                request,
                ResponseCode::Refused,
                edns.as_ref(),
                response_handle,
            )
            .await;
        }
        if request.metadata.message_type != MessageType::Query
            || request.metadata.op_code != OpCode::Query
        {
            return send_error(
                request,
                ResponseCode::NotImp,
                edns.as_ref(),
                response_handle,
            )
            .await;
        }
        let info = match request.request_info() {
            Ok(info) => info,
            Err(_) => {
                return send_error(
                    request,
                    ResponseCode::FormErr,
                    edns.as_ref(),
                    response_handle,
                )
                .await;
            }
        };
        let qname = info.query.name().into();
        let qtype = info.query.query_type();
        // `None`: not ready, the sources have not listed everything yet (an
        // NXDOMAIN now would be cached).
        let answer = {
            let catalog = self.catalog.read().unwrap_or_else(|e| e.into_inner());
            catalog
                .is_ready()
                .then(|| catalog.answer(&qname, qtype, Some(request.src().ip())))
        };
        let Some(answer) = answer else {
            return send_error(
                request,
                ResponseCode::ServFail,
                edns.as_ref(),
                response_handle,
            )
            .await;
        };
        let Some(answer) = answer else {
            // Not ours: the upstreams', if there are any.
            if self.upstreams.is_empty() {
                return send_error(
                    request,
                    ResponseCode::Refused,
                    edns.as_ref(),
                    response_handle,
                )
                .await;
            }
            let tcp = request.protocol() == hickory_server::net::xfer::Protocol::Tcp;
            let id = request.metadata.id;
            let Some(relayed) =
                crate::upstream::forward(&self.upstreams, request.as_slice(), id, tcp).await
            else {
                return send_error(
                    request,
                    ResponseCode::ServFail,
                    edns.as_ref(),
                    response_handle,
                )
                .await;
            };
            let response = MessageResponseBuilder::new(&request.queries, edns.as_ref()).build(
                relayed.metadata,
                relayed.answers.iter(),
                relayed.authorities.iter(),
                std::iter::empty(),
                relayed.additionals.iter(),
            );
            return sent(request, response_handle.send_response(response).await);
        };
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.authoritative = true;
        metadata.response_code = answer.code;
        let response = MessageResponseBuilder::new(&request.queries, edns.as_ref()).build(
            metadata,
            answer.answers.iter(),
            std::iter::empty(),
            answer.authority.iter(),
            answer.additionals.iter(),
        );
        sent(request, response_handle.send_response(response).await)
    }
}

/// What the server reports of an answer sent, or of one that could not be.
fn sent(
    request: &Request,
    result: Result<ResponseInfo, hickory_server::net::NetError>,
) -> ResponseInfo {
    result.unwrap_or_else(|e| {
        tracing::debug!(error = %e, src = %request.src(), "sending a DNS answer failed");
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.response_code = ResponseCode::ServFail;
        ResponseInfo::from(hickory_proto::op::Header {
            metadata,
            counts: Default::default(),
        })
    })
}

async fn send_error<R: ResponseHandler>(
    request: &Request,
    code: ResponseCode,
    edns: Option<&Edns>,
    mut response_handle: R,
) -> ResponseInfo {
    let mut response = MessageResponseBuilder::new(&request.queries, None);
    if let Some(edns) = edns {
        response.edns(edns);
    }
    let response = response.error_msg(&request.metadata, code);
    let mut metadata = Metadata::response_from_request(&request.metadata);
    metadata.response_code = code;
    match response_handle.send_response(response).await {
        Ok(info) => info,
        Err(_) => ResponseInfo::from(hickory_proto::op::Header {
            metadata,
            counts: Default::default(),
        }),
    }
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
}

/// A bound server: UDP and TCP on the same port (with port 0, the one the UDP
/// socket got), the address, and the upstreams it relays to.
pub struct Bound {
    pub server: Server<Handler>,
    pub addr: SocketAddr,
    pub upstreams: Vec<SocketAddr>,
}

/// UDP and TCP sockets on `addr`'s one port. With port 0, the port the kernel
/// gives the UDP socket may be in use for TCP (by any connection's local end): then
/// another is tried, a few times.
async fn bind_both(
    addr: SocketAddr,
) -> std::io::Result<(tokio::net::UdpSocket, tokio::net::TcpListener)> {
    let mut tries = if addr.port() == 0 { 20 } else { 1 };
    loop {
        let udp = tokio::net::UdpSocket::bind(addr).await?;
        let port = udp.local_addr()?;
        match tokio::net::TcpListener::bind(port).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tries > 1 => tries -= 1,
            Err(e) => return Err(e),
        }
    }
}

/// The server bound to `addr`. Binds at once, so a busy address is an error here.
pub async fn bind(
    catalog: Arc<RwLock<Catalog>>,
    addr: SocketAddr,
    options: &Options,
) -> std::io::Result<Bound> {
    let upstreams = &options.upstreams;
    let (udp, tcp) = bind_both(addr).await?;
    let bound = udp.local_addr()?;
    let upstreams = crate::upstream::choose(&upstreams.configured, &upstreams.resolv_conf, bound);
    let mut server = Server::new(Handler::new(catalog, upstreams.clone(), options.rate_limit));
    server.register_socket(udp);
    server.register_listener(tcp, TCP_IDLE, 64 * 1024);
    Ok(Bound {
        server,
        addr: bound,
        upstreams,
    })
}

/// A server running on a thread of its own, with a single-threaded runtime: every
/// query is handled where it arrives, with no hand-off between threads (the
/// process's other runtime keeps the sources and syncs).
pub struct Dedicated {
    pub addr: SocketAddr,
    pub upstreams: Vec<SocketAddr>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Dedicated {
    /// Binds `addr` and starts serving on a new thread; returns once bound (or with
    /// the bind's error).
    pub fn start(
        catalog: Arc<RwLock<Catalog>>,
        addr: SocketAddr,
        options: &Options,
    ) -> std::io::Result<Dedicated> {
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let options = options.clone();
        let thread = std::thread::Builder::new().name("dns".into()).spawn(
            move || -> std::io::Result<()> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async move {
                    let mut bound = match bind(catalog, addr, &options).await {
                        Ok(b) => b,
                        Err(e) => {
                            let kind = e.kind();
                            let _ = bound_tx.send(Err(e));
                            return Err(std::io::Error::from(kind));
                        }
                    };
                    let _ = bound_tx.send(Ok((bound.addr, bound.upstreams.clone())));
                    tokio::select! {
                        r = bound.server.block_until_done() => r.map_err(std::io::Error::other),
                        _ = stop_rx => bound
                            .server
                            .shutdown_gracefully()
                            .await
                            .map_err(std::io::Error::other),
                    }
                })
            },
        )?;
        let (addr, upstreams) = bound_rx
            .recv()
            .map_err(|_| std::io::Error::other("the DNS thread ended before binding"))??;
        Ok(Dedicated {
            addr,
            upstreams,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Stops serving and waits for the thread.
    pub fn stop(mut self) -> std::io::Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(std::io::Error::other("the DNS thread panicked")),
            None => Ok(()),
        }
    }
}

impl Drop for Dedicated {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
