//! SCTP over raw IP sockets, for kernels without an SCTP stack.
//!
//! The data plane only has to get SCTP packets through nftables and conntrack (whose SCTP
//! tracker and NAT are built into kernels that lack the SCTP socket module, as on this
//! project's machines). A probe needs nothing more than the association's first exchange, so
//! both ends are emulated in user space with raw sockets:
//!
//! * the client sends INIT (verification tag 0, its own initiate tag);
//! * the backend answers INIT-ACK whose State Cookie carries the backend's JSON [`Reply`],
//!   or ABORT for a port it does not serve (as a real stack answers a closed port);
//! * the client reads the cookie and sends ABORT so conntrack forgets the association.
//!
//! Conntrack validates vtags and the CRC32c, and NAT rewrites ports and recomputes the CRC,
//! so these are genuine SCTP packets to every box in the path. While a raw socket for
//! protocol 132 is open the kernel does not answer SCTP with ICMP protocol-unreachable.
//!
//! Entry points: [`serve`] (one responder per local address), [`probe_once`].

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::probe::{Proto, Reply};

pub const IPPROTO_SCTP: i32 = 132;

const CHUNK_INIT: u8 = 1;
const CHUNK_INIT_ACK: u8 = 2;
const CHUNK_ABORT: u8 = 6;
const PARAM_STATE_COOKIE: u16 = 7;

/// CRC32c (Castagnoli), the SCTP checksum (RFC 9260 appendix A).
pub fn crc32c(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0x82F6_3B78 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut crc = !0u32;
    for &b in data {
        crc = TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// A parsed SCTP packet: common header and the first chunk (all this emulation needs;
/// INIT, INIT-ACK and ABORT travel alone).
#[derive(Debug, PartialEq, Eq)]
pub struct Packet {
    pub src_port: u16,
    pub dst_port: u16,
    pub vtag: u32,
    pub chunk_type: u8,
    pub chunk_flags: u8,
    /// The chunk's value (after its 4-byte header), cut to the chunk length.
    pub chunk_value: Vec<u8>,
}

impl Packet {
    pub fn parse(sctp: &[u8]) -> Option<Packet> {
        if sctp.len() < 16 {
            return None;
        }
        let mut copy = sctp.to_vec();
        let sum = u32::from_le_bytes([copy[8], copy[9], copy[10], copy[11]]);
        copy[8..12].fill(0);
        if crc32c(&copy) != sum {
            return None;
        }
        let len = usize::from(u16::from_be_bytes([sctp[14], sctp[15]]));
        if len < 4 || 12 + len > sctp.len() {
            return None;
        }
        Some(Packet {
            src_port: u16::from_be_bytes([sctp[0], sctp[1]]),
            dst_port: u16::from_be_bytes([sctp[2], sctp[3]]),
            vtag: u32::from_be_bytes([sctp[4], sctp[5], sctp[6], sctp[7]]),
            chunk_type: sctp[12],
            chunk_flags: sctp[13],
            chunk_value: sctp[16..12 + len].to_vec(),
        })
    }

    /// Serialises with the chunk padded to 4 bytes and the CRC32c filled in (stored
    /// little-endian, as Linux does).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.chunk_value.len() + 3);
        out.extend_from_slice(&self.src_port.to_be_bytes());
        out.extend_from_slice(&self.dst_port.to_be_bytes());
        out.extend_from_slice(&self.vtag.to_be_bytes());
        out.extend_from_slice(&[0; 4]);
        out.push(self.chunk_type);
        out.push(self.chunk_flags);
        out.extend_from_slice(&((4 + self.chunk_value.len()) as u16).to_be_bytes());
        out.extend_from_slice(&self.chunk_value);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        let sum = crc32c(&out);
        out[8..12].copy_from_slice(&sum.to_le_bytes());
        out
    }

    /// The initiate tag of an INIT or INIT-ACK chunk.
    pub fn initiate_tag(&self) -> Option<u32> {
        let v = self.chunk_value.get(0..4)?;
        Some(u32::from_be_bytes([v[0], v[1], v[2], v[3]]))
    }

    /// The State Cookie parameter of an INIT-ACK.
    pub fn state_cookie(&self) -> Option<&[u8]> {
        let mut rest = self.chunk_value.get(16..)?;
        while rest.len() >= 4 {
            let ptype = u16::from_be_bytes([rest[0], rest[1]]);
            let plen = usize::from(u16::from_be_bytes([rest[2], rest[3]]));
            if plen < 4 || plen > rest.len() {
                return None;
            }
            if ptype == PARAM_STATE_COOKIE {
                return Some(&rest[4..plen]);
            }
            let padded = (plen + 3) & !3;
            rest = rest.get(padded..)?;
        }
        None
    }
}

/// The fixed part of INIT / INIT-ACK: initiate tag, a_rwnd, streams out/in, initial TSN.
fn init_fields(tag: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(16);
    v.extend_from_slice(&tag.to_be_bytes());
    v.extend_from_slice(&65535u32.to_be_bytes());
    v.extend_from_slice(&10u16.to_be_bytes());
    v.extend_from_slice(&10u16.to_be_bytes());
    v.extend_from_slice(&tag.to_be_bytes());
    v
}

pub fn init(src_port: u16, dst_port: u16, tag: u32) -> Packet {
    Packet {
        src_port,
        dst_port,
        vtag: 0,
        chunk_type: CHUNK_INIT,
        chunk_flags: 0,
        chunk_value: init_fields(tag),
    }
}

pub fn init_ack(src_port: u16, dst_port: u16, peer_tag: u32, tag: u32, cookie: &[u8]) -> Packet {
    let mut value = init_fields(tag);
    value.extend_from_slice(&PARAM_STATE_COOKIE.to_be_bytes());
    value.extend_from_slice(&((4 + cookie.len()) as u16).to_be_bytes());
    // The last parameter's padding is chunk padding, which the chunk length excludes;
    // `encode` adds it.
    value.extend_from_slice(cookie);
    Packet {
        src_port,
        dst_port,
        vtag: peer_tag,
        chunk_type: CHUNK_INIT_ACK,
        chunk_flags: 0,
        chunk_value: value,
    }
}

pub fn abort(src_port: u16, dst_port: u16, vtag: u32) -> Packet {
    Packet {
        src_port,
        dst_port,
        vtag,
        chunk_type: CHUNK_ABORT,
        chunk_flags: 0,
        chunk_value: Vec::new(),
    }
}

/// A raw SCTP socket of `family_of`'s family, bound to `bind` if given, wrapped as a
/// `UdpSocket` only to reuse std's safe `send_to` / `recv_from` / timeouts; the fd stays a
/// raw socket.
pub fn raw_socket(family_of: IpAddr, bind: Option<IpAddr>) -> io::Result<UdpSocket> {
    let domain = match family_of {
        IpAddr::V4(_) => Domain::IPV4,
        IpAddr::V6(_) => Domain::IPV6,
    };
    let sock = Socket::new(domain, Type::RAW, Some(Protocol::from(IPPROTO_SCTP)))?;
    if let Some(ip) = bind {
        sock.bind(&SocketAddr::new(ip, 0).into())?;
    }
    Ok(sock.into())
}

/// Strips the IPv4 header raw IPv4 sockets deliver (IPv6 raw sockets deliver payload only).
fn sctp_payload(buf: &[u8], v4: bool) -> Option<&[u8]> {
    if !v4 {
        return Some(buf);
    }
    let ihl = usize::from(buf.first()? & 0x0f) * 4;
    buf.get(ihl..)
}

/// A small non-cryptographic random source for tags and ports: distinct per process and call,
/// which is all SCTP's tags need here.
pub fn random_u32() -> u32 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    (h.finish() as u32) | 1
}

/// Answers SCTP INITs to `local` on `ports` forever (run it on its own thread).
pub fn serve(name: &str, local: IpAddr, ports: &[u16]) -> io::Result<()> {
    // Bound to one address: only packets for it arrive, and replies leave from it, which
    // keeps conntrack's reply tuple exact on multi-address hosts.
    let sock = raw_socket(local, Some(local))?;
    let mut buf = vec![0u8; 65536];
    loop {
        let (n, peer) = sock.recv_from(&mut buf)?;
        let Some(pkt) = sctp_payload(&buf[..n], local.is_ipv4()).and_then(Packet::parse) else {
            continue;
        };
        if pkt.chunk_type != CHUNK_INIT || pkt.vtag != 0 {
            continue;
        }
        let Some(peer_tag) = pkt.initiate_tag() else {
            continue;
        };
        let answer = if ports.contains(&pkt.dst_port) {
            let reply = Reply {
                backend: name.to_string(),
                ip: local,
                port: pkt.dst_port,
                client: SocketAddr::new(peer.ip(), pkt.src_port),
                proto: Proto::Sctp,
            };
            let cookie = serde_json::to_vec(&reply).unwrap_or_default();
            init_ack(pkt.dst_port, pkt.src_port, peer_tag, random_u32(), &cookie)
        } else {
            // A closed port: ABORT tagged with the INIT's initiate tag, T bit clear
            // (RFC 9260 8.4), exactly what a kernel SCTP stack sends.
            abort(pkt.dst_port, pkt.src_port, peer_tag)
        };
        let _ = sock.send_to(&answer.encode(), SocketAddr::new(peer.ip(), 0));
    }
}

/// How one raw SCTP attempt ended.
#[derive(Debug)]
pub enum Outcome {
    Answered(Reply),
    Aborted,
    Error(io::Error),
}

/// One association attempt to `target`; returns the outcome and the client's address.
pub fn probe_once(
    target: SocketAddr,
    source: Option<SocketAddr>,
    timeout: Duration,
) -> (Outcome, Option<SocketAddr>) {
    let start = Instant::now();
    let sock = match raw_socket(target.ip(), source.map(|s| s.ip())) {
        Ok(s) => s,
        Err(e) => return (Outcome::Error(e), None),
    };
    let src_port = source
        .map(|s| s.port())
        .filter(|p| *p != 0)
        .unwrap_or_else(|| 32768 + (random_u32() % 28000) as u16);
    // Connected: only the target's packets arrive, and ICMP errors about ours surface as
    // socket errors (ECONNREFUSED for port unreachable), as with a connected UDP socket.
    if let Err(e) = sock.connect(SocketAddr::new(target.ip(), 0)) {
        return (Outcome::Error(e), None);
    }
    let local = sock
        .local_addr()
        .ok()
        .map(|l| SocketAddr::new(l.ip(), src_port));
    let tag = random_u32();
    if let Err(e) = sock.send(&init(src_port, target.port(), tag).encode()) {
        return (Outcome::Error(e), local);
    }
    let mut buf = vec![0u8; 65536];
    loop {
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return (Outcome::Error(io::ErrorKind::TimedOut.into()), local);
        }
        if let Err(e) = sock.set_read_timeout(Some(left)) {
            return (Outcome::Error(e), local);
        }
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            Err(e) => return (Outcome::Error(e), local),
        };
        let Some(pkt) = sctp_payload(&buf[..n], target.is_ipv4()).and_then(Packet::parse) else {
            continue;
        };
        // Someone else's association (another probe in this namespace): not ours.
        if pkt.src_port != target.port() || pkt.dst_port != src_port || pkt.vtag != tag {
            continue;
        }
        match pkt.chunk_type {
            CHUNK_INIT_ACK => {
                if let Some(peer_tag) = pkt.initiate_tag() {
                    let _ = sock.send(&abort(src_port, target.port(), peer_tag).encode());
                }
                let reply = pkt
                    .state_cookie()
                    .and_then(|c| serde_json::from_slice::<Reply>(c).ok());
                return match reply {
                    Some(r) => (Outcome::Answered(r), local),
                    None => (
                        Outcome::Error(io::Error::other("INIT-ACK without an echo cookie")),
                        local,
                    ),
                };
            }
            CHUNK_ABORT => return (Outcome::Aborted, local),
            _ => continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn init_ack_round_trips_with_its_cookie() {
        let p = init_ack(80, 40000, 7, 9, b"{\"x\":1}");
        let bytes = p.encode();
        assert_eq!(bytes.len() % 4, 0);
        let q = Packet::parse(&bytes).unwrap();
        assert_eq!(q.vtag, 7);
        assert_eq!(q.initiate_tag(), Some(9));
        assert_eq!(q.state_cookie(), Some(&b"{\"x\":1}"[..]));
    }

    #[test]
    fn a_corrupted_packet_is_ignored() {
        let mut bytes = init(1, 2, 3).encode();
        bytes[1] ^= 1;
        assert_eq!(Packet::parse(&bytes), None);
    }
}
