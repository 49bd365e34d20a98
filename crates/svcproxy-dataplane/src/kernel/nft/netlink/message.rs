//! A message's frame: its `nlmsghdr` and `nfgenmsg` written ([`begin_message`],
//! [`end_message`]), the `NFT_MSG_*` type and flags of each statement
//! ([`message_kind`]), and the batch's control messages.

use netlink_packet_core::{NLM_F_APPEND, NLM_F_CREATE};
use svcproxy_core::model::IpFamily;
use svcproxy_plan::nft::typed::Op;

/// nfnetlink's subsystem id of nf_tables (a batch's `res_id`).
const NFNL_SUBSYS_NFTABLES: u16 = 10;

/// The netlink message an operation is: its type, its flags and its family.
pub(super) fn message_kind(op: &Op) -> (u16, u16, IpFamily) {
    match op {
        Op::Element(e) if e.add => (NFT_MSG_NEWSETELEM, NLM_F_CREATE, e.family),
        Op::Element(e) => (NFT_MSG_DELSETELEM, 0, e.family),
        Op::AddTable { family } => (NFT_MSG_NEWTABLE, NLM_F_CREATE, *family),
        Op::DeleteTable { family } => (NFT_MSG_DELTABLE, 0, *family),
        Op::FlushTable { family } => (NFT_MSG_DELRULE, 0, *family),
        Op::AddChain { family, .. } => (NFT_MSG_NEWCHAIN, NLM_F_CREATE, *family),
        Op::FlushChain { family, .. } => (NFT_MSG_DELRULE, 0, *family),
        Op::DeleteChain { family, .. } => (NFT_MSG_DELCHAIN, 0, *family),
        Op::AddSet { family, .. } | Op::AddMap { family, .. } => {
            (NFT_MSG_NEWSET, NLM_F_CREATE, *family)
        }
        Op::FlushSet { family, .. } => (NFT_MSG_DELSETELEM, 0, *family),
        Op::DeleteSet { family, .. } => (NFT_MSG_DELSET, 0, *family),
        Op::AddRule { family, .. } => (NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, *family),
        Op::AddIntervals { family, .. } => (NFT_MSG_NEWSETELEM, NLM_F_CREATE, *family),
    }
}

/// Starts a message (`nlmsghdr` and `nfgenmsg`) of nf_tables type `kind`
/// (`NFT_MSG_*`), or a batch control message (`NFNL_MSG_BATCH_*`) when `kind`
/// is one; its length is filled in by [`end_message`]. Returns where it starts.
pub(super) fn begin_message(
    buf: &mut Vec<u8>,
    kind: u16,
    flags: u16,
    seq: u32,
    family: u8,
) -> usize {
    let at = buf.len();
    let (msg_type, res_id) = if kind >= NFNL_MSG_BATCH_BEGIN {
        (kind, NFNL_SUBSYS_NFTABLES)
    } else {
        ((NFNL_SUBSYS_NFTABLES << 8) | kind, 0)
    };
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(&msg_type.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg: family, NFNETLINK_V0, res_id (big endian).
    buf.push(family);
    buf.push(0);
    buf.extend_from_slice(&res_id.to_be_bytes());
    at
}

pub(super) fn end_message(buf: &mut [u8], at: usize) {
    let len = (buf.len() - at) as u32;
    buf[at..at + 4].copy_from_slice(&len.to_ne_bytes());
}

pub(super) const NFNL_MSG_BATCH_BEGIN: u16 = 16;
pub(super) const NFNL_MSG_BATCH_END: u16 = 17;
// NFT_MSG_* types.
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_DELSET: u16 = 11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
