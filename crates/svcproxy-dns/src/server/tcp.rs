//! TCP: the accept loop, the table of open connections (at a client's limit its
//! own idlest shed, at the server's cap the idlest of all), and one connection's
//! queries in order.
//!
//! Entry point: [`serve_tcp`].

use super::*;

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

    /// A new connection from `client`: always taken, its entry returned. When the
    /// client holds [`MAX_TCP_PER_CLIENT`] already, its own idlest connection is
    /// told to close: the newcomer is the one carrying a query, and an aggregator
    /// (NodeLocal DNSCache, a node's pods behind one masqueraded address) is one
    /// address with many connections. Else, at [`MAX_TCP_CONNECTIONS`], the idlest
    /// connection open is. Either leaves the table at once.
    fn admit(&self, client: IpAddr) -> (u64, Arc<TcpConn>) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let held = t.per_client.get(&client).copied().unwrap_or(0);
        if held >= MAX_TCP_PER_CLIENT {
            if let Some(id) = Self::idlest(&t, Some(client)) {
                Self::forget(&mut t, id);
                self.counters
                    .tcp_over_client_limit
                    .fetch_add(1, Ordering::Relaxed);
            }
        } else if t.open.len() >= MAX_TCP_CONNECTIONS {
            if let Some(id) = Self::idlest(&t, None) {
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
        (id, conn)
    }

    /// The connection that did nothing for the longest: of `client`'s, or of all.
    fn idlest(t: &TcpTable, client: Option<IpAddr>) -> Option<u64> {
        t.open
            .iter()
            .filter(|(_, (c, _))| client.is_none_or(|client| *c == client))
            .min_by_key(|(_, (_, conn))| conn.last_active.load(Ordering::Relaxed))
            .map(|(id, _)| *id)
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
/// [`TcpConnections::admit`] for which are closed to make room).
pub(super) async fn serve_tcp(
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
                let (id, conn) = connections.admit(peer.ip());
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
