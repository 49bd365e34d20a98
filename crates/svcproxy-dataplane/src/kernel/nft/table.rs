//! One nftables table as the kernel holds it, asked over netlink
//! (`NFT_MSG_GETTABLE`): whether it exists, its handle, and whether it is dormant.
//!
//! Entry point: [`table_state`]. It is the drift check of the nftables mode: a few
//! microseconds whatever the ruleset's size, where `nft list` would fetch the whole
//! table (and `nft -j list tables` of nft 1.0.6 prints a dormant table's flags as its
//! release name). The messages are `netlink-packet-netfilter`'s nftables types.

use std::io;
use std::path::Path;

use netlink_packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_REQUEST};
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, NfTablesMessage, TableAttribute, TableFlags, TableMessage,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use svcproxy_core::model::IpFamily;

use crate::kernel::netfilter::{
    encode, encode_with, open_socket, recv_datagram, send_request, split_datagram, NetlinkError,
    DEFAULT_CONNTRACK_TIMEOUT,
};

const ENOENT: i32 = 2;

/// A table as the kernel holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableState {
    Missing,
    Present {
        /// The kernel's handle: a table deleted and created again has a new one.
        handle: u64,
        /// `flags dormant`: the table's chains see no packets.
        dormant: bool,
    },
}

/// The `GETTABLE` request for table `name` of `family`.
fn request(seq: u32, family: IpFamily, name: &str) -> Vec<u8> {
    encode(
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        family,
        NfTablesMessage::GetTable(TableMessage {
            attributes: vec![TableAttribute::Name(name.to_string())],
        }),
    )
}

/// The `GETTABLE` request for table `name` of the `inet` family.
fn inet_request(seq: u32, name: &str) -> Vec<u8> {
    encode_with(
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        NetfilterHeader::new(NetfilterProtoFamily::Inet, 0, 0),
        NfTablesMessage::GetTable(TableMessage {
            attributes: vec![TableAttribute::Name(name.to_string())],
        }),
    )
}

/// The `GETCHAIN` request for chain `chain` of table `table` of `family`.
fn chain_request(seq: u32, family: IpFamily, table: &str, chain: &str) -> Vec<u8> {
    encode(
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        family,
        NfTablesMessage::GetChain(ChainMessage {
            attributes: vec![
                ChainAttribute::Table(table.to_string()),
                ChainAttribute::Name(chain.to_string()),
            ],
        }),
    )
}

/// What one message of the reply said.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Table(TableState),
    /// A chain, with its use count (rules in it and references to it).
    Chain(Option<u32>),
    /// `0` for success, else a negative errno.
    Ack(i32),
    Other,
}

fn parse(msg: &[u8]) -> Result<Reply, NetlinkError> {
    let parsed = NetlinkMessage::<NetfilterMessage>::deserialize(msg)
        .map_err(|e| NetlinkError::Protocol(format!("an nftables reply did not parse: {e}")))?;
    Ok(match parsed.payload {
        NetlinkPayload::Error(e) => Reply::Ack(e.raw_code()),
        NetlinkPayload::InnerMessage(nf) => match nf.inner {
            NetfilterMessageInner::NfTables(NfTablesMessage::NewTable(t)) => {
                let mut handle = None;
                let mut dormant = false;
                for a in &t.attributes {
                    match a {
                        TableAttribute::Handle(h) => handle = Some(*h),
                        TableAttribute::Flags(f) => dormant = f.contains(TableFlags::Dormant),
                        _ => {}
                    }
                }
                let handle = handle.ok_or_else(|| {
                    NetlinkError::Protocol("an nftables table without a handle".into())
                })?;
                Reply::Table(TableState::Present { handle, dormant })
            }
            NetfilterMessageInner::NfTables(NfTablesMessage::NewChain(c)) => {
                Reply::Chain(c.attributes.iter().find_map(|a| match a {
                    ChainAttribute::Use(n) => Some(*n),
                    _ => None,
                }))
            }
            _ => Reply::Other,
        },
        _ => Reply::Other,
    })
}

/// Table `name` of `family` in the network namespace `netns` names (or the calling
/// thread's).
pub fn table_state(
    netns: Option<&Path>,
    family: IpFamily,
    name: &str,
) -> Result<TableState, NetlinkError> {
    let what = format!("table {family} {name}");
    state_from(ask(netns, &request(1, family, name), &what)?, family)
}

/// Table `name` of the `inet` family, in the calling thread's network namespace.
pub fn inet_table_state(name: &str) -> Result<TableState, NetlinkError> {
    let what = format!("table inet {name}");
    state_from(ask(None, &inet_request(1, name), &what)?, "inet")
}

fn state_from(
    found: Option<Reply>,
    family: impl std::fmt::Display,
) -> Result<TableState, NetlinkError> {
    Ok(match found {
        Some(Reply::Table(t)) => t,
        None => TableState::Missing,
        Some(_) => {
            return Err(NetlinkError::Protocol(format!(
                "the kernel acknowledged the {family} table request without the table"
            )))
        }
    })
}

/// Whether chain `chain` of table `table` of `family` exists (in `netns`, or the
/// calling thread's namespace); a missing table is a missing chain.
pub fn chain_exists(
    netns: Option<&Path>,
    family: IpFamily,
    table: &str,
    chain: &str,
) -> Result<bool, NetlinkError> {
    let what = format!("chain {family} {table} {chain}");
    let found = ask(netns, &chain_request(1, family, table, chain), &what)?;
    Ok(matches!(found, Some(Reply::Chain(_))))
}

/// Chain `chain` of table `table` of `family`'s use count as the kernel keeps it:
/// the rules in the chain and the jumps, gotos and verdict map elements that lead
/// to it (a flushed table leaves its chains at 0). `None`: no such chain.
pub fn chain_use(
    netns: Option<&Path>,
    family: IpFamily,
    table: &str,
    chain: &str,
) -> Result<Option<u32>, NetlinkError> {
    let what = format!("chain {family} {table} {chain}");
    match ask(netns, &chain_request(1, family, table, chain), &what)? {
        Some(Reply::Chain(Some(n))) => Ok(Some(n)),
        Some(Reply::Chain(None)) => Err(NetlinkError::Protocol(format!(
            "the kernel described {what} without its use count"
        ))),
        _ => Ok(None),
    }
}

/// Sends one `GET` request (sequence number 1) and reads its answer: the object's
/// message (the last one seen) at the acknowledgement, `None` when the kernel says
/// it does not exist.
fn ask(netns: Option<&Path>, req: &[u8], what: &str) -> Result<Option<Reply>, NetlinkError> {
    let sock = open_socket(netns, DEFAULT_CONNTRACK_TIMEOUT)?;
    let seq = 1;
    send_request(&sock, req, "the nftables request")?;
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut found = None;
    loop {
        recv_datagram(&sock, &mut buf)?;
        for (s, msg) in split_datagram(&buf)? {
            if s != seq {
                continue;
            }
            match parse(msg)? {
                Reply::Other => {}
                Reply::Ack(0) => {
                    return Ok(Some(found.ok_or_else(|| {
                        NetlinkError::Protocol(format!(
                            "the kernel acknowledged the request for {what} without it"
                        ))
                    })?))
                }
                Reply::Ack(code) if code.saturating_abs() == ENOENT => return Ok(None),
                Reply::Ack(code) => {
                    return Err(NetlinkError::Kernel {
                        context: format!("asking for {what}"),
                        source: io::Error::from_raw_os_error(code.saturating_abs()),
                    })
                }
                reply => found = Some(reply),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_names_the_table_and_family() {
        let req = request(7, IpFamily::V6, "svcproxy");
        // nlmsghdr: type NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETTABLE, flags REQUEST|ACK.
        assert_eq!(u16::from_ne_bytes([req[4], req[5]]), (10 << 8) | 1);
        assert_eq!(
            u16::from_ne_bytes([req[6], req[7]]),
            NLM_F_REQUEST | NLM_F_ACK
        );
        assert_eq!(u32::from_ne_bytes([req[8], req[9], req[10], req[11]]), 7);
        // nfgenmsg: the family.
        assert_eq!(req[16], 10);
        // NFTA_TABLE_NAME, NUL-terminated.
        assert_eq!(u16::from_ne_bytes([req[22], req[23]]), 1);
        assert_eq!(&req[24..33], b"svcproxy\0");
    }

    #[test]
    fn a_garbled_reply_is_an_error_not_a_panic() {
        assert!(parse(&[0u8; 3]).is_err());
        let mut bogus = request(1, IpFamily::V4, "x");
        bogus[0] = 200; // a length past the message
        assert!(parse(&bogus).is_err());
    }
}
