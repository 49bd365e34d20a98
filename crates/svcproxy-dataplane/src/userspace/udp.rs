//! The userspace proxy's UDP: one socket per endpoint set of a UDP service port,
//! which its capture rule redirects to.
//!
//! A datagram from a client opens a flow: an upstream socket of its own, connected
//! to the endpoint the pool chooses, whose replies go back to the client. A flow
//! with no datagram either way for the idle timeout is closed. Replies leave from
//! the address the client's datagram was redirected to (`IP_PKTINFO`), so conntrack
//! turns them back into the service's address and port, as the client expects.

use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, sockopt, ControlMessage, ControlMessageOwned, MsgFlags,
    SockaddrIn, SockaddrIn6, SockaddrStorage,
};
use svcproxy_core::model::{IpFamily, Protocol};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::tcp::{Endpoint, Pool, PortCounters, Stats};
use crate::kernel::conntrack::ConntrackFilter;

/// Clients with an open flow per socket at most; a datagram from a new client past
/// it is dropped (the client retries once a flow idles out).
const MAX_FLOWS: usize = 65_536;

/// The largest datagram relayed.
const MAX_DATAGRAM: usize = 65_535;

/// One UDP service port's endpoint set, served on `port`.
pub struct UdpFrontend {
    pub port: u16,
    /// The destination ports its capture rules redirect here: the service port and
    /// the NodePort of the service port it serves, as of the last sync.
    pub dports: Vec<u16>,
    pool: Arc<RwLock<Arc<Pool>>>,
    task: JoinHandle<()>,
}

impl Drop for UdpFrontend {
    fn drop(&mut self) {
        self.task.abort();
        self.pool.read().unwrap_or_else(|e| e.into_inner()).retire();
    }
}

impl UdpFrontend {
    /// Starts relaying on `handle` what reaches `std_sock` (from [`bind_wildcard`]).
    pub fn start(
        handle: &Handle,
        family: IpFamily,
        std_sock: std::net::UdpSocket,
        pool: Pool,
        idle: Duration,
        stats: Arc<Stats>,
    ) -> io::Result<UdpFrontend> {
        match family {
            IpFamily::V4 => setsockopt(&std_sock, sockopt::Ipv4PacketInfo, &true)?,
            IpFamily::V6 => setsockopt(&std_sock, sockopt::Ipv6RecvPacketInfo, &true)?,
        }
        let port = std_sock.local_addr()?.port();
        let sock = {
            let _guard = handle.enter();
            UdpSocket::from_std(std_sock)?
        };
        let pool = Arc::new(RwLock::new(Arc::new(pool)));
        let task = handle.spawn(relay(Arc::new(sock), pool.clone(), idle, stats));
        Ok(UdpFrontend {
            port,
            dports: Vec::new(),
            pool,
            task,
        })
    }

    /// Which conntrack entries to delete once this socket is closed: the flows its
    /// rules redirected here (to one of its destination ports, with this socket's
    /// port as the reply's source). Left in place, a client still sending from the
    /// same address and port would follow its entry to the closed socket and be
    /// refused, whatever the rules now say (a deleted service's address is dropped).
    pub fn flow_filters(&self, family: IpFamily) -> impl Iterator<Item = ConntrackFilter> + '_ {
        self.dports.iter().map(move |&dport| ConntrackFilter {
            family,
            protocol: Protocol::Udp,
            orig_dst: None,
            orig_dport: Some(dport),
            reply_src: None,
            reply_sport: Some(self.port),
            dst_nat: Some(true),
        })
    }

    /// The pool new flows choose from.
    pub fn pool(&self) -> Arc<Pool> {
        self.pool.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// New flows choose from `pool` from now on (open flows keep their endpoint).
    pub fn set_pool(&self, pool: Arc<Pool>) {
        *self.pool.write().unwrap_or_else(|e| e.into_inner()) = pool;
    }
}

/// A non-blocking UDP socket on the family's wildcard address (IPv6 only for
/// IPv6) at `port`.
pub fn bind_wildcard(family: IpFamily, port: u16) -> io::Result<std::net::UdpSocket> {
    bind(match family {
        IpFamily::V4 => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
        IpFamily::V6 => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
    })
}

/// A non-blocking UDP socket bound to `addr` (an IPv6 one takes IPv6 only).
pub fn bind(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let domain = match addr {
        SocketAddr::V4(_) => Domain::IPV4,
        SocketAddr::V6(_) => Domain::IPV6,
    };
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    Ok(s.into())
}

/// One client's flow: its endpoint, its upstream socket, and when a datagram last
/// passed.
struct Flow {
    endpoint: Arc<Endpoint>,
    counters: Arc<PortCounters>,
    upstream: Arc<UdpSocket>,
    last: Mutex<Instant>,
    /// Relays the endpoint's replies; aborted when the flow is replaced.
    replies: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Flow {
    fn drop(&mut self) {
        if let Some(task) = self
            .replies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            task.abort();
        }
    }
}

impl Flow {
    fn touch(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn last(&self) -> Instant {
        *self.last.lock().unwrap_or_else(|e| e.into_inner())
    }
}

type Flows = Arc<Mutex<HashMap<SocketAddr, Arc<Flow>>>>;

async fn relay(
    sock: Arc<UdpSocket>,
    pool: Arc<RwLock<Arc<Pool>>>,
    idle: Duration,
    stats: Arc<Stats>,
) {
    let flows: Flows = Arc::default();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let received = sock
            .async_io(Interest::READABLE, || {
                recv_with_destination(&*sock, &mut buf)
            })
            .await;
        let (n, client, local) = match received {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "userspace proxy: receiving a UDP datagram");
                continue;
            }
        };
        let existing = flows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&client)
            .cloned();
        // A flow whose endpoint left its pool moves to another at its next
        // datagram (what deleting a stale conntrack entry does in the kernel's modes).
        let existing = existing.filter(|f| {
            let stale = f.endpoint.is_removed();
            if stale {
                let mut all = flows.lock().unwrap_or_else(|e| e.into_inner());
                if all.get(&client).is_some_and(|g| Arc::ptr_eq(g, f)) {
                    all.remove(&client);
                }
                if let Some(task) = f.replies.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    task.abort();
                }
            }
            !stale
        });
        let flow = match existing {
            Some(f) => f,
            None => {
                let current = pool.read().unwrap_or_else(|e| e.into_inner()).clone();
                match open_flow(&sock, &flows, &current, client, local, idle, &stats).await {
                    Some(f) => f,
                    None => continue,
                }
            }
        };
        flow.touch();
        if flow.upstream.send(&buf[..n]).await.is_ok() {
            stats
                .udp_datagrams_to_endpoints
                .fetch_add(1, Ordering::Relaxed);
            flow.counters.udp_datagrams.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Opens the flow of `client` (whose datagram was addressed to `local`): an
/// upstream socket connected to the pool's choice, and the task that relays its
/// replies until the flow idles out.
async fn open_flow(
    sock: &Arc<UdpSocket>,
    flows: &Flows,
    pool: &Pool,
    client: SocketAddr,
    local: IpAddr,
    idle: Duration,
    stats: &Arc<Stats>,
) -> Option<Arc<Flow>> {
    if flows.lock().unwrap_or_else(|e| e.into_inner()).len() >= MAX_FLOWS {
        return None;
    }
    let endpoint = pool.pick(client.ip())?;
    let family = IpFamily::of(&endpoint.addr.ip());
    let upstream = match bind_wildcard(family, 0).and_then(UdpSocket::from_std) {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(error = %e, "userspace proxy: opening an upstream UDP socket");
            return None;
        }
    };
    if let Err(e) = upstream.connect(endpoint.addr).await {
        tracing::debug!(endpoint = %endpoint.addr, error = %e, "userspace proxy: connecting a UDP flow");
        return None;
    }
    let flow = Arc::new(Flow {
        endpoint,
        counters: pool.counters().clone(),
        upstream: Arc::new(upstream),
        last: Mutex::new(Instant::now()),
        replies: Mutex::new(None),
    });
    flows
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(client, flow.clone());
    stats.udp_flows.fetch_add(1, Ordering::Relaxed);
    pool.counters().udp_flows.fetch_add(1, Ordering::Relaxed);
    let (sock, flows, stats) = (sock.clone(), flows.clone(), stats.clone());
    // The task holds the flow weakly: replacing the flow drops it and ends the task.
    let weak = Arc::downgrade(&flow);
    let upstream = flow.upstream.clone();
    let task = tokio::spawn(async move {
        let mut buf = vec![0u8; MAX_DATAGRAM];
        loop {
            let Some(deadline) = weak.upgrade().map(|f| f.last() + idle) else {
                return;
            };
            tokio::select! {
                got = upstream.recv(&mut buf) => {
                    // A refusal (ICMP from the endpoint) is an error here: skip it.
                    let Ok(n) = got else { continue };
                    if let Some(f) = weak.upgrade() {
                        f.touch();
                    }
                    let sent = sock
                        .async_io(Interest::WRITABLE, || send_from(&*sock, &buf[..n], client, local))
                        .await;
                    if sent.is_ok() {
                        stats.udp_datagrams_to_clients.fetch_add(1, Ordering::Relaxed);
                        if let Some(f) = weak.upgrade() {
                            f.counters.udp_datagrams.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    let idle_out = weak.upgrade().is_none_or(|f| f.last() + idle <= Instant::now());
                    if idle_out {
                        break;
                    }
                }
            }
        }
        let mut all = flows.lock().unwrap_or_else(|e| e.into_inner());
        if all
            .get(&client)
            .is_some_and(|g| Weak::ptr_eq(&Arc::downgrade(g), &weak))
        {
            all.remove(&client);
        }
    });
    *flow.replies.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
    Some(flow)
}

/// One datagram: its length, its sender, and the address it was sent to.
fn recv_with_destination(
    sock: &impl AsRawFd,
    buf: &mut [u8],
) -> io::Result<(usize, SocketAddr, IpAddr)> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut cmsg = nix::cmsg_space!(nix::libc::in6_pktinfo);
    let msg = recvmsg::<SockaddrStorage>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_DONTWAIT,
    )?;
    let from = msg
        .address
        .as_ref()
        .and_then(socket_addr)
        .ok_or_else(|| io::Error::other("a datagram without a sender address"))?;
    let mut local = None;
    for c in msg.cmsgs()? {
        match c {
            ControlMessageOwned::Ipv4PacketInfo(pi) => {
                local = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(pi.ipi_addr.s_addr))));
            }
            ControlMessageOwned::Ipv6PacketInfo(pi) => {
                local = Some(IpAddr::V6(Ipv6Addr::from(pi.ipi6_addr.s6_addr)));
            }
            _ => {}
        }
    }
    let local = local.ok_or_else(|| io::Error::other("a datagram without its destination"))?;
    Ok((msg.bytes, from, local))
}

fn socket_addr(s: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = s.as_sockaddr_in() {
        return Some(SocketAddr::new(IpAddr::V4(v4.ip()), v4.port()));
    }
    s.as_sockaddr_in6()
        .map(|v6| SocketAddr::new(IpAddr::V6(v6.ip()), v6.port()))
}

/// Sends `data` to `to` from the address `from` (one of this host's).
fn send_from(sock: &impl AsFd, data: &[u8], to: SocketAddr, from: IpAddr) -> io::Result<usize> {
    let iov = [IoSlice::new(data)];
    let fd = sock.as_fd().as_raw_fd();
    let flags = MsgFlags::MSG_DONTWAIT;
    let sent = match (to, from) {
        (SocketAddr::V4(to), IpAddr::V4(src)) => {
            let info = nix::libc::in_pktinfo {
                ipi_ifindex: 0,
                ipi_spec_dst: nix::libc::in_addr {
                    s_addr: u32::from(src).to_be(),
                },
                ipi_addr: nix::libc::in_addr { s_addr: 0 },
            };
            sendmsg(
                fd,
                &iov,
                &[ControlMessage::Ipv4PacketInfo(&info)],
                flags,
                Some(&SockaddrIn::from(to)),
            )
        }
        (SocketAddr::V6(to), IpAddr::V6(src)) => {
            let info = nix::libc::in6_pktinfo {
                ipi6_addr: nix::libc::in6_addr {
                    s6_addr: src.octets(),
                },
                ipi6_ifindex: 0,
            };
            sendmsg(
                fd,
                &iov,
                &[ControlMessage::Ipv6PacketInfo(&info)],
                flags,
                Some(&SockaddrIn6::from(to)),
            )
        }
        _ => return Err(io::Error::other("a reply across families")),
    };
    Ok(sent?)
}
