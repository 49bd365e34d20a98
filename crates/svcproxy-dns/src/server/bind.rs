//! The sockets on one port: a `SO_REUSEPORT` UDP socket per worker and a TCP
//! listener.
//!
//! Entry point: [`bind_all`].

use super::*;

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
pub(super) fn bind_all(
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
