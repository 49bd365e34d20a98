//! One DNS query over UDP or TCP, blocking: for tests and tools that check what
//! the server answers on the wire.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use hickory_proto::op::{Edns, Message, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};

/// A query for `name`/`qtype` (id 4242, recursion desired), with an EDNS payload
/// size when `edns` says one.
pub fn query(name: &str, qtype: RecordType, edns: Option<u16>) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.id = 4242;
    m.metadata.op_code = OpCode::Query;
    m.metadata.recursion_desired = true;
    let name = Name::from_ascii(name).unwrap_or_else(|_| Name::root());
    m.add_query(Query::query(name, qtype));
    if let Some(size) = edns {
        let mut e = Edns::new();
        e.set_max_payload(size);
        m.set_edns(e);
    }
    m.to_vec().expect("a query encodes")
}

fn decode(bytes: &[u8]) -> io::Result<Message> {
    Message::from_vec(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

/// Sends `q` over UDP from an ephemeral port; the answer and its size on the wire.
pub fn udp(server: SocketAddr, q: &[u8], timeout: Duration) -> io::Result<(Message, usize)> {
    let local: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().expect("an address")
    } else {
        "[::]:0".parse().expect("an address")
    };
    udp_from(local, server, q, timeout)
}

/// [`udp`] from the address `local` (a client address the server tells apart).
pub fn udp_from(
    local: SocketAddr,
    server: SocketAddr,
    q: &[u8],
    timeout: Duration,
) -> io::Result<(Message, usize)> {
    let s = UdpSocket::bind(local)?;
    s.set_read_timeout(Some(timeout))?;
    s.send_to(q, server)?;
    let mut buf = [0u8; 65535];
    let (n, _) = s.recv_from(&mut buf)?;
    Ok((decode(&buf[..n])?, n))
}

/// Sends `q` over TCP (length-prefixed, RFC 1035 4.2.2); the answer.
pub fn tcp(server: SocketAddr, q: &[u8], timeout: Duration) -> io::Result<Message> {
    let mut s = TcpStream::connect_timeout(&server, timeout)?;
    tcp_on(&mut s, q, timeout)
}

/// A TCP connection to `server` from `local` (an address of this host; port 0:
/// any).
pub fn connect_from(
    local: SocketAddr,
    server: SocketAddr,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(server),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.bind(&local.into())?;
    socket.connect_timeout(&server.into(), timeout)?;
    Ok(socket.into())
}

/// [`tcp`] from `local`.
pub fn tcp_from(
    local: SocketAddr,
    server: SocketAddr,
    q: &[u8],
    timeout: Duration,
) -> io::Result<Message> {
    tcp_on(&mut connect_from(local, server, timeout)?, q, timeout)
}

/// `q` over the open connection `s` (which stays open for the next); the answer.
pub fn tcp_on(s: &mut TcpStream, q: &[u8], timeout: Duration) -> io::Result<Message> {
    s.set_read_timeout(Some(timeout))?;
    let len = u16::try_from(q.len()).map_err(io::Error::other)?;
    s.write_all(&len.to_be_bytes())?;
    s.write_all(q)?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len)?;
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut buf)?;
    decode(&buf)
}

/// The answer section's data, as text, sorted (`10.96.0.10`, `0 100 80 web...`).
pub fn answers(m: &Message) -> Vec<String> {
    let mut v: Vec<String> = m.answers.iter().map(|r| r.data.to_string()).collect();
    v.sort();
    v
}
