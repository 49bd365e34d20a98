//! `NETLINK_NETFILTER` plumbing shared by conntrack cleanup ([`super::conntrack`])
//! and the nftables writers and probes ([`super::nft`]): a socket opened in a
//! network namespace without moving the caller (`open_socket`), requests
//! encoded with `netlink-packet-netfilter`'s types (`encode`), datagrams sent,
//! received and split into messages, and the error they all report
//! ([`NetlinkError`]).

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
use svcproxy_core::model::{IpFamily, Protocol};

/// `recv(2)` flag: return the real datagram length even when it was cut.
const MSG_TRUNC: i32 = 0x20;
/// A netlink message's header.
pub(crate) const NLMSG_HEADER: usize = 16;

/// IP protocol numbers, as conntrack spells protocols.
pub fn ip_protocol(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// How long one receive may wait for the kernel before the operation fails.
pub const DEFAULT_CONNTRACK_TIMEOUT: Duration = Duration::from_secs(10);

/// A netlink exchange with netfilter that failed.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The netlink socket could not be opened or used.
    #[error("conntrack netlink: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The kernel refused a request.
    #[error("conntrack netlink: {context}: kernel error: {source}")]
    Kernel {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The kernel's answer made no sense.
    #[error("conntrack netlink: {0}")]
    Protocol(String),
    /// A fake cleaner told to fail.
    #[error("conntrack cleanup failed: {0}")]
    Fake(String),
}

pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> NetlinkError {
    let context = context.into();
    move |source| NetlinkError::Io { context, source }
}

/// A connected ctnetlink socket in `netns` (or the calling thread's namespace).
pub(crate) fn open_socket(netns: Option<&Path>, timeout: Duration) -> Result<Socket, NetlinkError> {
    let Some(path) = netns else {
        return new_socket(timeout);
    };
    let ns = File::open(path).map_err(io_err(format!("opening {}", path.display())))?;
    // setns(2) moves only the calling thread: a throwaway thread enters the
    // namespace, opens the socket (which stays in that namespace for its life) and
    // ends, leaving every other thread where it was.
    std::thread::scope(|s| {
        s.spawn(|| {
            rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .map_err(|e| io_err(format!("entering {}", path.display()))(e.into()))?;
            // Belt and braces: never open the socket anywhere but in `netns`.
            let want = ns.metadata().map_err(io_err("stat of the namespace"))?;
            let have = std::fs::metadata("/proc/thread-self/ns/net")
                .map_err(io_err("stat of /proc/thread-self/ns/net"))?;
            if (want.dev(), want.ino()) != (have.dev(), have.ino()) {
                return Err(NetlinkError::Protocol(format!(
                    "did not end up in network namespace {}",
                    path.display()
                )));
            }
            new_socket(timeout)
        })
        .join()
        .unwrap_or_else(|_| {
            Err(NetlinkError::Protocol(
                "namespace helper thread panicked".into(),
            ))
        })
    })
}

fn new_socket(timeout: Duration) -> Result<Socket, NetlinkError> {
    let mut sock =
        Socket::new(NETLINK_NETFILTER).map_err(io_err("opening a NETLINK_NETFILTER socket"))?;
    sock.bind_auto()
        .map_err(io_err("binding the netlink socket"))?;
    sock.connect(&SocketAddr::new(0, 0))
        .map_err(io_err("connecting the netlink socket"))?;
    rustix::net::sockopt::set_socket_timeout(
        &sock,
        rustix::net::sockopt::Timeout::Recv,
        Some(timeout),
    )
    .map_err(|e| io_err("setting the receive timeout")(e.into()))?;
    Ok(sock)
}

pub(crate) fn nf_family(family: IpFamily) -> NetfilterProtoFamily {
    match family {
        IpFamily::V4 => NetfilterProtoFamily::IPv4,
        IpFamily::V6 => NetfilterProtoFamily::IPv6,
    }
}

pub(crate) fn next_seq(seq: &mut u32) -> u32 {
    *seq = seq.wrapping_add(1).max(1);
    *seq
}

/// One `NETLINK_NETFILTER` request: header flags, sequence number, and a payload of
/// any netfilter subsystem (ctnetlink's, nftables').
pub(crate) fn encode(
    flags: u16,
    seq: u32,
    family: IpFamily,
    msg: impl Into<NetfilterMessageInner>,
) -> Vec<u8> {
    encode_with(
        flags,
        seq,
        NetfilterHeader::new(nf_family(family), 0, 0),
        msg,
    )
}

/// [`encode`] with a netfilter header of the caller's (an nf_tables batch's
/// begin and end name their subsystem in it; an `inet` table's request).
pub(crate) fn encode_with(
    flags: u16,
    seq: u32,
    nf_header: NetfilterHeader,
    msg: impl Into<NetfilterMessageInner>,
) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(nf_header, msg)),
    );
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    buf
}

/// Splits a datagram into netlink messages: `(sequence number, message)` each. A
/// length that runs past the datagram ends it with an error (no resync is possible).
pub(crate) fn split_datagram(buf: &[u8]) -> Result<Vec<(u32, &[u8])>, NetlinkError> {
    let mut out = Vec::new();
    let mut rest = buf;
    while !rest.is_empty() {
        if rest.len() < NLMSG_HEADER {
            return Err(NetlinkError::Protocol(format!(
                "{} stray bytes after the last netlink message",
                rest.len()
            )));
        }
        let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let seq = u32::from_ne_bytes([rest[8], rest[9], rest[10], rest[11]]);
        if len < NLMSG_HEADER || len > rest.len() {
            return Err(NetlinkError::Protocol(format!(
                "netlink message length {len} with {} bytes left",
                rest.len()
            )));
        }
        out.push((seq, &rest[..len]));
        let aligned = (len + 3) & !3;
        rest = rest.get(aligned..).unwrap_or_default();
    }
    Ok(out)
}

pub(crate) fn recv_datagram(sock: &Socket, buf: &mut Vec<u8>) -> Result<(), NetlinkError> {
    loop {
        buf.clear();
        match sock.recv(buf, MSG_TRUNC) {
            Ok(n) if n > buf.len() => {
                return Err(NetlinkError::Protocol(format!(
                    "a {n}-byte netlink datagram did not fit in {} bytes",
                    buf.capacity()
                )))
            }
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(NetlinkError::Io {
                    context: "waiting for the kernel (timed out)".into(),
                    source: e,
                })
            }
            Err(e) => return Err(io_err("receiving from the kernel")(e)),
        }
    }
}

pub(crate) fn send_request(sock: &Socket, buf: &[u8], what: &str) -> Result<(), NetlinkError> {
    let n = sock
        .send(buf, 0)
        .map_err(io_err(format!("sending {what}")))?;
    if n != buf.len() {
        return Err(NetlinkError::Protocol(format!(
            "sent {n} of {} bytes of {what}",
            buf.len()
        )));
    }
    Ok(())
}
