//! Answering one query: from the catalog as the zone's authority, with the
//! client's rate limit, EDNS negotiated, and errors as the DNS specification
//! asks; a name that is not the catalog's is handed back to relay upstream.
//!
//! Entry points: [`Handler::respond`], then [`Handler::relay`] for a
//! [`Reply::Relay`].

use super::*;

/// Answers queries from the catalog, and relays the others upstream.
pub struct Handler {
    catalog: Arc<RwLock<Catalog>>,
    /// Empty: names that are not the catalog's are refused.
    upstreams: Vec<SocketAddr>,
    limiter: Option<Mutex<RateLimiter>>,
    relays: Arc<tokio::sync::Semaphore>,
    pub(super) counters: Arc<Counters>,
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
    pub(super) fn respond_with(
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
