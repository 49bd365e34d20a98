//! The UDP workers: blocking threads that receive queries in batches, answer
//! them and send the answers with one `sendmmsg`; relays go to the runtime.
//!
//! Entry point: [`serve_udp`].

use super::*;

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
pub(super) fn serve_udp(
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
