//! The DNS server: UDP and TCP on one address, answers from a shared [`Catalog`].
//! hickory-server does the wire work (parsing, EDNS payload sizes, truncation with
//! the TC bit on UDP, TCP framing); this module only asks the catalog.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_proto::op::{Edns, MessageType, Metadata, OpCode, ResponseCode};
use hickory_server::net::runtime::Time;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use hickory_server::Server;

use crate::catalog::Catalog;

/// How long a TCP connection may stay idle between queries.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// Answers queries from the catalog.
pub struct Handler {
    catalog: Arc<RwLock<Catalog>>,
}

impl Handler {
    pub fn new(catalog: Arc<RwLock<Catalog>>) -> Self {
        Handler { catalog }
    }
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
            catalog.is_ready().then(|| catalog.answer(&qname, qtype))
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
            // Not ours: no upstream to forward to yet.
            return send_error(
                request,
                ResponseCode::Refused,
                edns.as_ref(),
                response_handle,
            )
            .await;
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
        match response_handle.send_response(response).await {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!(error = %e, src = %request.src(), "sending a DNS answer failed");
                ResponseInfo::from(hickory_proto::op::Header {
                    metadata: {
                        let mut m = Metadata::response_from_request(&request.metadata);
                        m.response_code = ResponseCode::ServFail;
                        m
                    },
                    counts: Default::default(),
                })
            }
        }
    }
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

/// Serves `catalog` on `addr` over UDP and TCP until `stop` resolves. Binds first,
/// so a busy address is an error here, not later.
pub async fn serve(
    catalog: Arc<RwLock<Catalog>>,
    addr: SocketAddr,
    stop: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let (mut server, bound) = bind(catalog, addr).await?;
    tracing::info!(address = %bound, "DNS server listening (UDP and TCP)");
    stop.await;
    server
        .shutdown_gracefully()
        .await
        .map_err(std::io::Error::other)
}

/// The server bound to `addr` (UDP and TCP on the same port: with port 0, the one
/// the UDP socket got), and that address.
pub async fn bind(
    catalog: Arc<RwLock<Catalog>>,
    addr: SocketAddr,
) -> std::io::Result<(Server<Handler>, SocketAddr)> {
    let udp = tokio::net::UdpSocket::bind(addr).await?;
    let bound = udp.local_addr()?;
    let tcp = tokio::net::TcpListener::bind(bound).await?;
    let mut server = Server::new(Handler::new(catalog));
    server.register_socket(udp);
    server.register_listener(tcp, TCP_IDLE, 64 * 1024);
    Ok((server, bound))
}
