//! This host's own addresses, over rtnetlink: a dump of every interface's addresses
//! ([`host_addresses`]) and a subscription to their changes ([`AddressChanges`]).
//!
//! `--nodeport-addresses` CIDRs select NodePort addresses among the host's; the
//! daemon re-reads them whenever the kernel announces an address added or removed,
//! so NodePorts and healthCheckNodePort servers follow the host without a restart
//! (upstream re-reads them on every sync instead, so it follows only as fast as its
//! sync period). Both work in the calling thread's network namespace.

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use netlink_packet_core::{
    NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable,
    NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkLayerType, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::{Socket, SocketAddr};

/// Multicast groups (`RTNLGRP_*`) announcing IPv4 and IPv6 address changes.
const RTNLGRP_IPV4_IFADDR: u32 = 5;
const RTNLGRP_IPV6_IFADDR: u32 = 9;

/// Receive buffer for one datagram: a dump packs several messages per datagram,
/// each well under 1 KiB; the kernel never sends more than a page-sized skb
/// (or 32 KiB) at once.
const RECV_BUFFER: usize = 64 * 1024;

/// How long a dump may wait for the kernel before it is an error.
const DUMP_TIMEOUT: Duration = Duration::from_secs(5);

/// Every address of every interface of this host (both families, loopback
/// included), deduplicated and sorted, as `ip addr` lists them.
pub fn host_addresses() -> io::Result<Vec<IpAddr>> {
    let mut ips = Vec::new();
    dump(
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
        "address dump",
        |msg| {
            if let RouteNetlinkMessage::NewAddress(a) = msg {
                ips.extend(address_of(&a));
            }
        },
    )?;
    ips.sort();
    ips.dedup();
    Ok(ips)
}

/// One of this host's interfaces.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// The index of the interface it is enslaved to (a bridge's port).
    pub master: Option<u32>,
    /// Its MTU (0 when the kernel did not say).
    pub mtu: u32,
}

/// This host's Ethernet interfaces (veths included), in index order: where the
/// eBPF mode's packet programs attach. Loopback and interfaces without an
/// Ethernet header (tunnels, WireGuard) are left out.
pub fn ether_links() -> io::Result<Vec<Link>> {
    let mut links = Vec::new();
    dump(
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
        "link dump",
        |msg| {
            if let RouteNetlinkMessage::NewLink(l) = msg {
                if l.header.link_layer_type != LinkLayerType::Ether {
                    return;
                }
                let name = l.attributes.iter().find_map(|a| match a {
                    LinkAttribute::IfName(n) => Some(n.clone()),
                    _ => None,
                });
                let master = l.attributes.iter().find_map(|a| match a {
                    LinkAttribute::Controller(m) => Some(*m),
                    _ => None,
                });
                let mtu = l.attributes.iter().find_map(|a| match a {
                    LinkAttribute::Mtu(m) => Some(*m),
                    _ => None,
                });
                if let Some(name) = name {
                    links.push(Link {
                        index: l.header.index,
                        name,
                        master,
                        mtu: mtu.unwrap_or(0),
                    });
                }
            }
        },
    )?;
    links.sort();
    Ok(links)
}

/// Sends `request` as a dump and hands each message of the reply to `each`.
fn dump(
    request: RouteNetlinkMessage,
    what: &str,
    each: impl FnMut(RouteNetlinkMessage),
) -> io::Result<()> {
    exchange(NETLINK_ROUTE, request, NLM_F_DUMP, what, each)
}

/// Sends `request` (with `flags` beside `NLM_F_REQUEST`) on a new socket of
/// netlink `protocol` and hands each message of the reply to `each`, until the
/// kernel says it is done (a dump) or, without `NLM_F_DUMP`, after the first.
pub(crate) fn exchange<M>(
    protocol: isize,
    request: M,
    flags: u16,
    what: &str,
    mut each: impl FnMut(M),
) -> io::Result<()>
where
    M: NetlinkSerializable + NetlinkDeserializable + std::fmt::Debug,
    NetlinkPayload<M>: From<M>,
{
    let mut sock = Socket::new(protocol)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    rustix::net::sockopt::set_socket_timeout(
        &sock,
        rustix::net::sockopt::Timeout::Recv,
        Some(DUMP_TIMEOUT),
    )?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | flags;
    header.sequence_number = 1;
    let mut request = NetlinkMessage::new(header, NetlinkPayload::from(request));
    request.finalize();
    let mut out = vec![0u8; request.buffer_len()];
    request.serialize(&mut out);
    let sent = sock.send(&out, 0)?;
    if sent != out.len() {
        return Err(io::Error::other(format!(
            "sent {sent} of {} bytes of the {what} request",
            out.len()
        )));
    }
    let mut buf = Vec::with_capacity(RECV_BUFFER);
    loop {
        buf.clear();
        match sock.recv(&mut buf, 0) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        let mut offset = 0;
        while offset < buf.len() {
            let msg = NetlinkMessage::<M>::deserialize(&buf[offset..])
                .map_err(|e| io::Error::other(format!("a {what} reply: {e}")))?;
            let len = msg.header.length as usize;
            if len == 0 {
                break;
            }
            offset += len;
            match msg.payload {
                NetlinkPayload::InnerMessage(m) => {
                    each(m);
                    if flags & NLM_F_DUMP == 0 {
                        return Ok(());
                    }
                }
                NetlinkPayload::Done(_) => return Ok(()),
                NetlinkPayload::Error(e) if e.code.is_some() => {
                    return Err(io::Error::other(format!(
                        "the kernel refused the {what} request: {e}"
                    )));
                }
                _ => {}
            }
        }
    }
}

/// The host's own address an address message carries: `IFA_LOCAL` (on
/// point-to-point links `IFA_ADDRESS` is the peer's), else `IFA_ADDRESS`.
fn address_of(msg: &AddressMessage) -> Option<IpAddr> {
    let local = msg.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(ip) => Some(*ip),
        _ => None,
    });
    local.or_else(|| {
        msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        })
    })
}

/// A subscription to the kernel's announcements of addresses added to or removed
/// from any interface of this host (either family).
pub struct AddressChanges {
    sock: Socket,
    buf: Vec<u8>,
}

impl AddressChanges {
    /// Subscribes. Take the subscription before the first [`host_addresses`], so
    /// that no change between the two is missed.
    pub fn subscribe() -> io::Result<Self> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.add_membership(RTNLGRP_IPV4_IFADDR)?;
        // A host without IPv6 has no such group to join; its IPv4 changes still come.
        if let Err(e) = sock.add_membership(RTNLGRP_IPV6_IFADDR) {
            tracing::debug!(error = %e, "not subscribed to IPv6 address changes");
        }
        Ok(AddressChanges {
            sock,
            buf: Vec::with_capacity(RECV_BUFFER),
        })
    }

    /// Blocks until the kernel announces at least one address change. A lost
    /// announcement (the socket's buffer overflowed: `ENOBUFS`) counts as a change,
    /// so the caller re-reads the addresses either way.
    pub fn wait(&mut self) -> io::Result<()> {
        loop {
            self.buf.clear();
            match self.sock.recv(&mut self.buf, 0) {
                Ok(_) => {
                    if self.holds_address_change() {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc_enobufs()) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether the datagram just received announces an address (anything that does
    /// not parse counts: re-reading costs little, missing a change does not).
    fn holds_address_change(&self) -> bool {
        let mut offset = 0;
        while offset < self.buf.len() {
            let Ok(msg) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&self.buf[offset..])
            else {
                return true;
            };
            let len = msg.header.length as usize;
            if len == 0 {
                return true;
            }
            offset += len;
            if matches!(
                msg.payload,
                NetlinkPayload::InnerMessage(
                    RouteNetlinkMessage::NewAddress(_) | RouteNetlinkMessage::DelAddress(_)
                )
            ) {
                return true;
            }
        }
        false
    }
}

/// `ENOBUFS`: a netlink socket's receive buffer overflowed and messages were lost.
fn libc_enobufs() -> i32 {
    rustix::io::Errno::NOBUFS.raw_os_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dump_lists_loopback() {
        // Every network namespace has `lo`; it is up (with 127.0.0.1) on any host a
        // test runs on.
        let ips = host_addresses().expect("address dump");
        assert!(
            ips.contains(&IpAddr::from([127, 0, 0, 1])),
            "loopback missing from {ips:?}"
        );
        let mut sorted = ips.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(ips, sorted);
    }

    #[test]
    fn an_address_message_gives_its_local_address_first() {
        let mut msg = AddressMessage::default();
        msg.attributes
            .push(AddressAttribute::Address(IpAddr::from([10, 0, 0, 2])));
        assert_eq!(address_of(&msg), Some(IpAddr::from([10, 0, 0, 2])));
        msg.attributes
            .push(AddressAttribute::Local(IpAddr::from([10, 0, 0, 1])));
        assert_eq!(address_of(&msg), Some(IpAddr::from([10, 0, 0, 1])));
        assert_eq!(address_of(&AddressMessage::default()), None);
    }
}
