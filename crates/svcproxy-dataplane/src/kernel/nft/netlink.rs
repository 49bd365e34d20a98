//! Syncs written to the kernel over netlink: one nf_tables batch per sync
//! (`NFNL_MSG_BATCH_BEGIN`, the statements, `NFNL_MSG_BATCH_END`), one transaction,
//! no `nft` process, no text and no cache fetch. Every statement of a plan is typed
//! ([`svcproxy_plan::nft::typed`]: tables, base and regular chains, set and map
//! declarations with the user data `nft` stores, rules, elements), so a partial
//! sync costs the kernel's commit and little else (`nft` would first list every
//! chain and set of the table: tens of milliseconds at 10k services), and a full
//! sync about the kernel's commit (`nft` parses and evaluates the whole text).
//!
//! Entry points: [`BatchBuilder`] (statements in, as the planner makes them),
//! then [`NetlinkWriter::apply`]. Each message is written straight into the
//! batch's buffer ([`W`]). Keys and values are laid out as the
//! kernel stores them: an address in network order, a protocol as one byte, a port
//! in network order, an endpoint map's key (`numgen`'s) in host order; in a
//! concatenation each field padded to 4 bytes. A rule is the expressions `nft`
//! compiles for the same text (`nft --debug=netlink` shows them), so a listing
//! cannot tell the writers apart (a test compares them).
//!
//! The socket stays open from one batch to the next ([`NetlinkWriter`]): the
//! kernel makes the closing of an nf_tables socket wait for the last
//! transaction's objects to be freed after an RCU grace period (8-10 ms here),
//! which would otherwise be most of a small sync.
//!
//! The batch is all or nothing: the kernel aborts the transaction on the first
//! error (a deleted element that is not there, a set that does not exist), so the
//! rules in force stay those of the last successful sync, and the error names the
//! element.

use std::io;
use std::net::IpAddr;

use ipnet::IpNet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use netlink_packet_core::{NLA_F_NESTED, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_REQUEST};
use netlink_packet_netfilter::NetfilterMessage;
use svcproxy_core::model::{IpFamily, Protocol};
use svcproxy_plan::nft::elements::{Atom, ElemOp, ElemValue, ElemVerdict};
use svcproxy_plan::nft::ruleset::{Field, TABLE_COMMENT};
use svcproxy_plan::nft::typed::{Action, Addr, CtState, Match, Op, TypedRule};
use svcproxy_plan::nft::{BaseChain, ChainType, Hook, Map, MapType, Set, TABLE_NAME};

use netlink_sys::Socket;

use crate::error::DataPlaneError;
use crate::kernel::netfilter::{
    ip_protocol, open_socket, recv_datagram, split_datagram, NetlinkError,
};

/// nfnetlink's subsystem id of nf_tables (a batch's `res_id`).
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// Elements per message (as `nft` groups them, well under a page each).
const ELEMENTS_PER_MESSAGE: usize = 64;
/// The socket's send buffer below which it is left as the kernel made it: one
/// `sendmsg` must carry the whole batch.
const DEFAULT_SNDBUF: usize = 128 * 1024;
/// The size of a batch's chunks.
const CHUNK_BYTES: usize = 1 << 20;

/// One message of a batch: its sequence number, its first statement and how
/// many it carries, to say which one the kernel refused.
#[derive(Debug)]
struct Message {
    seq: u32,
    first: Op,
    taken: usize,
}

/// One encoded transaction, built by a [`BatchBuilder`]: its bytes in chunks of
/// whole messages, sent together by one `sendmsg`.
#[derive(Debug)]
pub struct Batch {
    chunks: Vec<Vec<u8>>,
    messages: Vec<Message>,
    /// The time its statements took to encode.
    encode: Duration,
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// A key or value as the kernel stores it: a single field as is, a
/// concatenation with each field padded to 4 bytes.
pub fn layout(atoms: &[Atom]) -> Vec<u8> {
    let mut out = Vec::new();
    for atom in atoms {
        let field = match atom {
            Atom::Ip(ip) => ip_bytes(ip),
            Atom::Proto(p) => vec![ip_protocol(*p)],
            Atom::Port(p) => p.to_be_bytes().to_vec(),
            Atom::Num(n) => n.to_ne_bytes().to_vec(),
        };
        let padded = if atoms.len() > 1 {
            field.len().div_ceil(4) * 4
        } else {
            field.len()
        };
        out.extend_from_slice(&field);
        out.resize(out.len() + padded - field.len(), 0);
    }
    out
}

/// One element (`NFTA_LIST_ELEM`) of a set element list.
fn element(w: &mut W, op: &ElemOp) {
    w.nest(NFTA_LIST_ELEM, |w| {
        // NFTA_SET_ELEM_KEY { NFTA_DATA_VALUE }.
        w.nest(1, |w| w.attr(NFTA_DATA_VALUE, &layout(&op.key)));
        match &op.value {
            // NFTA_SET_ELEM_DATA.
            Some(ElemValue::Data(atoms)) => w.nest(2, |w| w.attr(NFTA_DATA_VALUE, &layout(atoms))),
            Some(ElemValue::Verdict(v)) => w.nest(2, |w| match v {
                ElemVerdict::Goto(chain) => verdict_data(w, NFT_GOTO, Some(chain)),
                ElemVerdict::Drop => verdict_data(w, NF_DROP, None),
            }),
            None => {}
        }
    });
}

/// An interval set's elements for `nets` (sorted, disjoint), as the kernel's
/// interval sets take them: each prefix's first address, and the address after
/// its last flagged as an interval's end (none past the top of the space), with
/// an end at address zero first when the first prefix starts later.
fn interval_elements(w: &mut W, nets: &[IpNet]) {
    let bytes = |v: u128, net: &IpNet| match net {
        IpNet::V4(_) => (v as u32).to_be_bytes().to_vec(),
        IpNet::V6(_) => v.to_be_bytes().to_vec(),
    };
    let value = |ip: IpAddr| match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    };
    // NFTA_SET_ELEM_KEY { NFTA_DATA_VALUE }, and NFTA_SET_ELEM_FLAGS
    // (NFT_SET_ELEM_INTERVAL_END) for an end.
    let one = |w: &mut W, key: &[u8], end: bool| {
        w.nest(NFTA_LIST_ELEM, |w| {
            w.nest(1, |w| w.attr(NFTA_DATA_VALUE, key));
            if end {
                w.be32(3, 1);
            }
        })
    };
    if let Some(first) = nets.first() {
        if value(first.network()) != 0 {
            one(w, &bytes(0, first), true);
        }
    }
    for net in nets {
        one(w, &ip_bytes(&net.network()), false);
        if let Some(next) = value(net.broadcast()).checked_add(1) {
            let top = match net {
                IpNet::V4(_) => u128::from(u32::MAX),
                IpNet::V6(_) => u128::MAX,
            };
            if next <= top {
                one(w, &bytes(next, net), true);
            }
        }
    }
}

/// Writes netlink attributes straight into a batch: a header (length, type),
/// the payload, padding to 4 bytes. A full sync is tens of thousands of
/// messages, and building each as a tree of attribute values first cost more
/// than the kernel's commit of them (263 ms of 913 at 10k services x 10).
struct W<'a>(&'a mut Vec<u8>);

const NFTA_LIST_ELEM: u16 = 1;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
// Verdict codes (NF_DROP, NFT_JUMP, NFT_GOTO, NFT_RETURN).
const NF_DROP: u32 = 0;
const NFT_JUMP: u32 = -3i32 as u32;
const NFT_GOTO: u32 = -4i32 as u32;
const NFT_RETURN: u32 = -5i32 as u32;

impl W<'_> {
    fn attr(&mut self, kind: u16, payload: &[u8]) {
        let len = 4 + payload.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(payload);
        self.pad();
    }

    fn pad(&mut self) {
        let n = self.0.len().div_ceil(4) * 4 - self.0.len();
        self.0.extend_from_slice(&[0; 3][..n]);
    }

    fn be32(&mut self, kind: u16, v: u32) {
        self.attr(kind, &v.to_be_bytes());
    }

    /// A NUL-terminated string.
    fn str(&mut self, kind: u16, s: &str) {
        let len = 4 + s.len() + 1;
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(0);
        self.pad();
    }

    /// An attribute holding the attributes `f` writes.
    fn nest(&mut self, kind: u16, f: impl FnOnce(&mut W)) {
        let at = self.begin_nest(kind);
        f(&mut W(self.0));
        self.end_nest(at);
    }

    /// Starts an attribute holding the attributes written until
    /// [`W::end_nest`]; returns where it starts.
    fn begin_nest(&mut self, kind: u16) -> usize {
        let at = self.0.len();
        self.0.extend_from_slice(&[0; 2]);
        self.0
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        at
    }

    fn end_nest(&mut self, at: usize) {
        let len = (self.0.len() - at) as u16;
        self.0[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    /// `NFTA_*_DATA { NFTA_DATA_VALUE }`.
    fn data_value(&mut self, kind: u16, bytes: &[u8]) {
        self.nest(kind, |w| w.attr(NFTA_DATA_VALUE, bytes));
    }
}

/// `NFTA_DATA_VERDICT { NFTA_VERDICT_CODE, [NFTA_VERDICT_CHAIN] }`.
fn verdict_data(w: &mut W, code: u32, chain: Option<&str>) {
    w.nest(NFTA_DATA_VERDICT, |w| {
        w.be32(1, code);
        if let Some(chain) = chain {
            w.str(2, chain);
        }
    });
}

/// One expression: `NFTA_LIST_ELEM { NFTA_EXPR_NAME, NFTA_EXPR_DATA { ... } }`.
fn expr(w: &mut W, name: &str, data: impl FnOnce(&mut W)) {
    w.nest(NFTA_LIST_ELEM, |w| {
        w.str(1, name);
        w.nest(2, data);
    });
}

// Registers: NFT_REG_VERDICT, NFT_REG_1, NFT_REG_2.
const REG_VERDICT: u32 = 0;
const REG_1: u32 = 1;
const REG_2: u32 = 2;

/// The register a concatenation's field at byte `offset` is loaded into, as `nft`
/// allocates them: a 128-bit register at a multiple of 16 bytes, otherwise the
/// 32-bit register (NFT_REG32_00 is 8) holding that offset.
fn reg_at(offset: u32) -> u32 {
    if offset.is_multiple_of(16) {
        REG_1 + offset / 16
    } else {
        8 + offset / 4
    }
}

/// `meta load KEY => reg DREG` (NFTA_META_DREG, NFTA_META_KEY).
fn meta(w: &mut W, key: u32, dreg: u32) {
    expr(w, "meta", |w| {
        w.be32(1, dreg);
        w.be32(2, key);
    });
}

// NFT_META_* keys.
const META_MARK: u32 = 3;
const META_IIFNAME: u32 = 6;
const META_L4PROTO: u32 = 16;

/// `meta l4proto P` (into reg 1, compared).
fn l4proto_is(w: &mut W, p: Protocol) {
    meta(w, META_L4PROTO, REG_1);
    cmp(w, CMP_EQ, &[ip_protocol(p)]);
}

const CMP_EQ: u32 = 0;
const CMP_NEQ: u32 = 1;

/// `cmp` of reg 1 with `bytes` (`op`: NFT_CMP_EQ 0, NFT_CMP_NEQ 1).
fn cmp(w: &mut W, op: u32, bytes: &[u8]) {
    // NFTA_CMP_SREG, NFTA_CMP_OP, NFTA_CMP_DATA.
    expr(w, "cmp", |w| {
        w.be32(1, REG_1);
        w.be32(2, op);
        w.data_value(3, bytes);
    });
}

/// `payload load LEN @ BASE + OFFSET => reg DREG` (base: 1 network, 2 transport).
fn payload(w: &mut W, base: u32, offset: u32, len: u32, dreg: u32) {
    // NFTA_PAYLOAD_DREG, _BASE, _OFFSET, _LEN.
    expr(w, "payload", |w| {
        w.be32(1, dreg);
        w.be32(2, base);
        w.be32(3, offset);
        w.be32(4, len);
    });
}

/// `reg 1 = (reg 1 & MASK) ^ XOR` over `mask.len()` bytes.
fn bitwise(w: &mut W, mask: &[u8], xor: &[u8]) {
    // NFTA_BITWISE_SREG, _DREG, _LEN, _MASK, _XOR.
    expr(w, "bitwise", |w| {
        w.be32(1, REG_1);
        w.be32(2, REG_1);
        w.be32(3, mask.len() as u32);
        w.data_value(4, mask);
        w.data_value(5, xor);
    });
}

/// `reg 1 & BITS != 0` for a 32-bit value loaded in reg 1 (`ct state`, `ct status`).
fn any_bit(w: &mut W, bits: u32) {
    bitwise(w, &bits.to_ne_bytes(), &[0; 4]);
    cmp(w, CMP_NEQ, &[0; 4]);
}

/// `reject with tcp reset`, or `reject` (ICMP port unreachable).
fn reject(w: &mut W, family: IpFamily, tcp_reset: bool) {
    // NFTA_REJECT_TYPE (NFT_REJECT_TCP_RST 1, NFT_REJECT_ICMP_UNREACH 0),
    // NFTA_REJECT_ICMP_CODE (port unreachable: 3 for ICMP, 4 for ICMPv6).
    let (kind, code) = match (tcp_reset, family) {
        (true, _) => (1, 0u8),
        (false, IpFamily::V4) => (0, 3),
        (false, IpFamily::V6) => (0, 4),
    };
    expr(w, "reject", |w| {
        w.be32(1, kind);
        w.attr(2, &[code]);
    });
}

/// `lookup reg SREG set SET [dreg DREG]`, inverted when `invert`.
fn lookup(w: &mut W, set: &str, sreg: u32, dreg: Option<u32>, invert: bool) {
    // NFTA_LOOKUP_SET, _SREG, _DREG, _FLAGS (NFT_LOOKUP_F_INV).
    expr(w, "lookup", |w| {
        w.str(1, set);
        w.be32(2, sreg);
        if let Some(dreg) = dreg {
            w.be32(3, dreg);
        }
        if invert {
            w.be32(5, 1);
        }
    });
}

/// `immediate reg 0 VERDICT`.
fn verdict(w: &mut W, code: u32, chain: Option<&str>) {
    // NFTA_IMMEDIATE_DREG, NFTA_IMMEDIATE_DATA { NFTA_DATA_VERDICT { ... } }.
    expr(w, "immediate", |w| {
        w.be32(1, REG_VERDICT);
        w.nest(2, |w| verdict_data(w, code, chain));
    });
}

/// `immediate reg DREG VALUE`.
fn immediate(w: &mut W, dreg: u32, value: &[u8]) {
    expr(w, "immediate", |w| {
        w.be32(1, dreg);
        w.data_value(2, value);
    });
}

fn nfproto(f: IpFamily) -> u8 {
    match f {
        IpFamily::V4 => 2,
        IpFamily::V6 => 10,
    }
}

/// Where an address lies in the network header, and its length.
fn addr_at(family: IpFamily, addr: Addr) -> (u32, u32) {
    match (family, addr) {
        (IpFamily::V4, Addr::Saddr) => (12, 4),
        (IpFamily::V4, Addr::Daddr) => (16, 4),
        (IpFamily::V6, Addr::Saddr) => (8, 16),
        (IpFamily::V6, Addr::Daddr) => (24, 16),
    }
}

fn addr_len(family: IpFamily) -> u32 {
    addr_at(family, Addr::Daddr).1
}

/// `dnat` to the address in reg 1 and the port in `proto_reg`
/// (NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED).
fn dnat(w: &mut W, f: IpFamily, proto_reg: u32) {
    // NFTA_NAT_TYPE (NFT_NAT_DNAT), _FAMILY, _REG_ADDR_MIN, _MAX, _REG_PROTO_MIN,
    // _MAX, _FLAGS.
    expr(w, "nat", |w| {
        w.be32(1, 1);
        w.be32(2, u32::from(nfproto(f)));
        w.be32(3, REG_1);
        w.be32(4, REG_1);
        w.be32(5, proto_reg);
        w.be32(6, proto_reg);
        w.be32(7, 0x3);
    });
}

/// A match's expressions, as `nft` compiles it.
fn match_expressions(w: &mut W, family: IpFamily, m: &Match) {
    match m {
        Match::CtState(state) => {
            // NFTA_CT_DREG, NFTA_CT_KEY (NFT_CT_STATE); NF_CT_STATE_BIT(NEW) or
            // NF_CT_STATE_INVALID_BIT.
            ct(w, 0);
            any_bit(
                w,
                match state {
                    CtState::New => 0x8,
                    CtState::Invalid => 0x1,
                },
            );
        }
        Match::CtStatusDnat => {
            // NFT_CT_STATUS; IPS_DST_NAT.
            ct(w, 2);
            any_bit(w, 0x20);
        }
        Match::L4Proto(p) => l4proto_is(w, *p),
        Match::Dport(p, port) => {
            l4proto_is(w, *p);
            payload(w, 2, 2, 2, REG_1);
            cmp(w, CMP_EQ, &port.to_be_bytes());
        }
        Match::Prefix { addr, net, negate } => {
            let (at, len) = addr_at(family, *addr);
            let op = if *negate { CMP_NEQ } else { CMP_EQ };
            let bits = u32::from(net.prefix_len());
            let network = ip_bytes(&net.network());
            if bits == len * 8 {
                payload(w, 1, at, len, REG_1);
                cmp(w, op, &network);
            } else if bits.is_multiple_of(8) && bits > 0 {
                // A whole-byte prefix: only its bytes are loaded.
                payload(w, 1, at, bits / 8, REG_1);
                cmp(w, op, &network[..(bits / 8) as usize]);
            } else {
                payload(w, 1, at, len, REG_1);
                bitwise(w, &ip_bytes(&net.netmask()), &vec![0; len as usize]);
                cmp(w, op, &network);
            }
        }
        Match::InSet { addr, set, negate } => {
            let (at, len) = addr_at(family, *addr);
            payload(w, 1, at, len, REG_1);
            lookup(w, set, REG_1, None, *negate);
        }
        Match::PairInSet(set) => {
            let (saddr, len) = addr_at(family, Addr::Saddr);
            let (daddr, _) = addr_at(family, Addr::Daddr);
            payload(w, 1, saddr, len, REG_1);
            payload(w, 1, daddr, len, reg_at(len));
            lookup(w, set, REG_1, None, false);
        }
        Match::FibLocal(addr) => {
            // NFTA_FIB_DREG, _RESULT (NFT_FIB_RESULT_ADDRTYPE), _FLAGS
            // (NFTA_FIB_F_SADDR 1, _DADDR 2); RTN_LOCAL.
            let flags = match addr {
                Addr::Saddr => 1,
                Addr::Daddr => 2,
            };
            expr(w, "fib", |w| {
                w.be32(1, REG_1);
                w.be32(2, 3);
                w.be32(3, flags);
            });
            cmp(w, CMP_EQ, &2u32.to_ne_bytes());
        }
        Match::MarkClear(mark) => {
            meta(w, META_MARK, REG_1);
            bitwise(w, &mark.to_ne_bytes(), &[0; 4]);
            cmp(w, CMP_EQ, &[0; 4]);
        }
        Match::Iifname { name, negate } => {
            meta(w, META_IIFNAME, REG_1);
            let op = if *negate { CMP_NEQ } else { CMP_EQ };
            match name.strip_suffix('*') {
                // A prefix: its bytes only.
                Some(prefix) => cmp(w, op, prefix.as_bytes()),
                // A whole name: IFNAMSIZ bytes, NUL-padded.
                None => {
                    let mut bytes = name.as_bytes().to_vec();
                    bytes.resize(16, 0);
                    cmp(w, op, &bytes);
                }
            }
        }
        Match::NumgenZero(n) => {
            numgen(w, *n, 0);
            cmp(w, CMP_EQ, &[0; 4]);
        }
    }
}

/// `ct load KEY => reg 1`.
fn ct(w: &mut W, key: u32) {
    expr(w, "ct", |w| {
        w.be32(1, REG_1);
        w.be32(2, key);
    });
}

/// `numgen reg 1 = random mod N offset B`.
fn numgen(w: &mut W, n: u32, offset: u32) {
    // NFTA_NG_DREG, _MODULUS, _TYPE (NFT_NG_RANDOM), _OFFSET.
    expr(w, "numgen", |w| {
        w.be32(1, REG_1);
        w.be32(2, n);
        w.be32(3, 1);
        w.be32(4, offset);
    });
}

/// `meta set mark with reg 1` after `reg 1 = (mark & MASK) ^ XOR`.
fn set_mark(w: &mut W, mask: u32, xor: u32) {
    meta(w, META_MARK, REG_1);
    bitwise(w, &mask.to_ne_bytes(), &xor.to_ne_bytes());
    // NFTA_META_KEY, NFTA_META_SREG.
    expr(w, "meta", |w| {
        w.be32(2, META_MARK);
        w.be32(3, REG_1);
    });
}

/// An action's expressions, as `nft` compiles it.
fn action_expressions(w: &mut W, family: IpFamily, action: &Action) {
    match action {
        Action::Jump(chain) => verdict(w, NFT_JUMP, Some(chain)),
        Action::Goto(chain) => verdict(w, NFT_GOTO, Some(chain)),
        Action::Return => verdict(w, NFT_RETURN, None),
        Action::Drop => verdict(w, NF_DROP, None),
        Action::Vmap { daddr, map } => {
            let mut at = 0;
            if *daddr {
                let (offset, len) = addr_at(family, Addr::Daddr);
                payload(w, 1, offset, len, REG_1);
                at = len;
            }
            meta(w, META_L4PROTO, reg_at(at));
            payload(w, 2, 2, 2, reg_at(at + 4));
            lookup(w, map, REG_1, Some(REG_VERDICT), false);
        }
        Action::MarkOr(mark) => set_mark(w, !mark, *mark),
        Action::MarkXor(mark) => set_mark(w, u32::MAX, *mark),
        Action::Reject { tcp_reset } => reject(w, family, *tcp_reset),
        Action::CountedReject { tcp_reset } => {
            // A counter with no attributes starts at zero.
            expr(w, "counter", |_| {});
            reject(w, family, *tcp_reset);
        }
        // NFTA_MASQ_FLAGS: NF_NAT_RANGE_PROTO_RANDOM_FULLY.
        Action::MasqueradeFullyRandom => expr(w, "masq", |w| w.be32(1, 0x10)),
        Action::UpdateSaddr(set) => {
            let (at, len) = addr_at(family, Addr::Saddr);
            payload(w, 1, at, len, REG_1);
            // NFTA_DYNSET_SET_NAME, _OP (NFT_DYNSET_OP_UPDATE), _SREG_KEY.
            expr(w, "dynset", |w| {
                w.str(1, set);
                w.be32(3, 1);
                w.be32(4, REG_1);
            });
        }
        Action::Dnat(to) => {
            immediate(w, REG_1, &ip_bytes(&to.ip()));
            immediate(w, REG_2, &to.port().to_be_bytes());
            dnat(w, family, REG_2);
        }
        Action::MapDnat { n, offset, map } => {
            numgen(w, *n, *offset);
            lookup(w, map, REG_1, Some(REG_1), false);
            // The value is address . port: the port follows the address.
            dnat(w, family, reg_at(addr_len(family)));
        }
        Action::Redirect(port) => {
            immediate(w, REG_1, &port.to_be_bytes());
            // NFTA_REDIR_REG_PROTO_MIN, NFTA_REDIR_FLAGS
            // (NF_NAT_RANGE_PROTO_SPECIFIED).
            expr(w, "redir", |w| {
                w.be32(1, REG_1);
                w.be32(3, 0x2);
            });
        }
    }
}

/// A typed rule's expressions (`NFTA_RULE_EXPRESSIONS`'s list), as `nft`
/// compiles the same rule.
fn rule_expressions(w: &mut W, rule: &TypedRule) {
    for m in &rule.matches {
        match_expressions(w, rule.family, m);
    }
    action_expressions(w, rule.family, &rule.action);
}

fn nul_terminated(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// A chain's comment as `nft` stores it: a user-data TLV
/// (NFTNL_UDATA_CHAIN_COMMENT, length, the text with its NUL).
fn chain_comment(comment: &str) -> Vec<u8> {
    let text = nul_terminated(comment);
    let mut out = Vec::new();
    udata(&mut out, 0, &text[..text.len().min(255)]);
    out
}

/// A user-data TLV as libnftnl lays it out: type, length, value.
fn udata(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
    out.push(kind);
    out.push(value.len() as u8);
    out.extend_from_slice(value);
}

fn udata_u32(out: &mut Vec<u8>, kind: u8, value: u32) {
    udata(out, kind, &value.to_ne_bytes());
}

// NFTNL_UDATA_SET_* user-data types.
const UDATA_KEYBYTEORDER: u8 = 0;
const UDATA_DATABYTEORDER: u8 = 1;
const UDATA_KEY_TYPEOF: u8 = 3;
const UDATA_DATA_TYPEOF: u8 = 4;
const UDATA_DATA_INTERVAL: u8 = 6;
/// nft's byte orders: big endian (addresses), host order (numgen's integer).
const BYTEORDER_HOST: u32 = 1;
const BYTEORDER_BIG: u32 = 2;
/// nft's expression ids in a `typeof` description.
const EXPR_PAYLOAD: u32 = 7;
const EXPR_CONCAT: u32 = 13;
const EXPR_NUMGEN: u32 = 23;

/// A field's nft data type id and length in bytes.
fn field_type(f: Field) -> (u32, u32) {
    match f {
        Field::Addr(IpFamily::V4) => (7, 4),
        Field::Addr(IpFamily::V6) => (8, 16),
        Field::Proto => (12, 1),
        Field::Port => (13, 2),
    }
}

/// A key's type id and length: a concatenation's type is its fields' ids six
/// bits apart, each field padded to 4 bytes.
fn key_type(key: &[Field]) -> (u32, u32) {
    if let [one] = key {
        return field_type(*one);
    }
    key.iter().fold((0, 0), |(id, len), f| {
        let (fid, flen) = field_type(*f);
        ((id << 6) | fid, len + flen.div_ceil(4) * 4)
    })
}

/// The user data `nft` stores with a set of `key` (it prints the set from it):
/// the key's byte order, and for a concatenation an empty `typeof` of it.
fn key_udata(out: &mut Vec<u8>, key: &[Field]) {
    if key.len() == 1 {
        udata_u32(out, UDATA_KEYBYTEORDER, BYTEORDER_BIG);
    } else {
        udata_u32(out, UDATA_KEYBYTEORDER, 0);
    }
}

fn concat_typeof(out: &mut Vec<u8>) {
    let mut inner = Vec::new();
    udata_u32(&mut inner, 0, EXPR_CONCAT);
    udata(&mut inner, 1, &[]);
    udata(out, UDATA_KEY_TYPEOF, &inner);
}

/// `typeof` of a payload field: its protocol's and field's ids in nft.
fn payload_typeof(proto: u32, field: u32) -> Vec<u8> {
    let mut desc = Vec::new();
    udata_u32(&mut desc, 0, proto);
    udata_u32(&mut desc, 1, field);
    let mut out = Vec::new();
    udata_u32(&mut out, 0, EXPR_PAYLOAD);
    udata(&mut out, 1, &desc);
    out
}

/// An endpoint map's user data: `typeof numgen random mod 1 : F daddr . P dport`.
fn endpoints_udata(family: IpFamily, protocol: Protocol) -> Vec<u8> {
    let mut out = Vec::new();
    udata_u32(&mut out, UDATA_KEYBYTEORDER, BYTEORDER_HOST);
    udata_u32(&mut out, UDATA_DATABYTEORDER, 0);
    let mut numgen = Vec::new();
    udata_u32(&mut numgen, 0, 1); // NFT_NG_RANDOM
    udata_u32(&mut numgen, 1, 1); // mod 1
    udata_u32(&mut numgen, 2, 0); // offset 0
    let mut key = Vec::new();
    udata_u32(&mut key, 0, EXPR_NUMGEN);
    udata(&mut key, 1, &numgen);
    udata(&mut out, UDATA_KEY_TYPEOF, &key);
    // nft's protocol ids (ip, ip6; tcp, udp, sctp) and field ids (daddr, dport).
    let daddr = match family {
        IpFamily::V4 => payload_typeof(12, 12),
        IpFamily::V6 => payload_typeof(13, 9),
    };
    let l4 = match protocol {
        Protocol::Tcp => 8,
        Protocol::Udp => 6,
        Protocol::Sctp => 10,
    };
    let mut fields = Vec::new();
    udata(&mut fields, 0, &daddr);
    udata(&mut fields, 1, &payload_typeof(l4, 2));
    let mut data = Vec::new();
    udata_u32(&mut data, 0, EXPR_CONCAT);
    udata(&mut data, 1, &fields);
    udata(&mut out, UDATA_DATA_TYPEOF, &data);
    udata_u32(&mut out, UDATA_DATA_INTERVAL, 0);
    out
}

// NFT_SET_* flags.
const SET_INTERVAL: u32 = 0x4;
const SET_MAP: u32 = 0x8;
const SET_TIMEOUT: u32 = 0x10;
const SET_EVAL: u32 = 0x20;
/// NFT_DATA_VERDICT as a map's data type.
const DATA_VERDICT: u32 = 0xffff_ff00;

/// A set's or map's declaration: `NFTA_SET_*` attributes after its table and name.
struct SetSpec {
    flags: u32,
    key: (u32, u32),
    data: Option<(u32, u32)>,
    timeout_ms: Option<u64>,
    udata: Vec<u8>,
}

impl SetSpec {
    fn of_set(set: &Set) -> SetSpec {
        let mut udata = Vec::new();
        key_udata(&mut udata, &set.key);
        if set.key.len() > 1 {
            concat_typeof(&mut udata);
        }
        let mut flags = 0;
        if set.interval {
            flags |= SET_INTERVAL;
        }
        if set.timeout.is_some() {
            flags |= SET_TIMEOUT | SET_EVAL;
        }
        SetSpec {
            flags,
            key: key_type(&set.key),
            data: None,
            timeout_ms: set.timeout.map(|t| u64::from(t) * 1000),
            udata,
        }
    }

    fn of_map(map: &Map) -> SetSpec {
        match &map.map_type {
            MapType::Verdict(key) => {
                let mut udata = Vec::new();
                key_udata(&mut udata, key);
                udata_u32(&mut udata, UDATA_DATABYTEORDER, 0);
                if key.len() > 1 {
                    concat_typeof(&mut udata);
                }
                udata_u32(&mut udata, UDATA_DATA_INTERVAL, 0);
                SetSpec {
                    flags: SET_MAP,
                    key: key_type(key),
                    data: Some((DATA_VERDICT, 0)),
                    timeout_ms: None,
                    udata,
                }
            }
            MapType::Endpoints { family, protocol } => SetSpec {
                flags: SET_MAP,
                // numgen's integer (nft's "integer" type, 4).
                key: (4, 4),
                data: Some(key_type(&[Field::Addr(*family), Field::Port])),
                timeout_ms: None,
                udata: endpoints_udata(*family, *protocol),
            },
        }
    }

    /// Writes the attributes, `id` naming the set within its batch (the kernel
    /// wants one).
    fn write(&self, w: &mut W, name: &str, id: u32) {
        w.str(1, TABLE_NAME);
        w.str(2, name);
        w.be32(3, self.flags);
        w.be32(4, self.key.0);
        w.be32(5, self.key.1);
        if let Some((kind, len)) = self.data {
            w.be32(6, kind);
            w.be32(7, len);
        }
        w.be32(10, id);
        if let Some(ms) = self.timeout_ms {
            w.attr(11, &ms.to_be_bytes());
        }
        w.attr(13, &self.udata);
    }
}

/// A base chain's `NFTA_CHAIN_*` attributes: hook, type, policy accept.
fn base_chain_attributes(w: &mut W, base: &BaseChain) {
    let hook = match base.hook {
        Hook::Prerouting => 0u32,
        Hook::Input => 1,
        Hook::Forward => 2,
        Hook::Output => 3,
        Hook::Postrouting => 4,
    };
    let chain_type = match base.chain_type {
        ChainType::Filter => "filter",
        ChainType::Nat => "nat",
    };
    // NFTA_CHAIN_HOOK { NFTA_HOOK_HOOKNUM, NFTA_HOOK_PRIORITY }, NFTA_CHAIN_TYPE,
    // NFTA_CHAIN_POLICY (NF_ACCEPT).
    w.nest(4, |w| {
        w.be32(1, hook);
        w.be32(2, base.priority as u32);
    });
    w.str(7, chain_type);
    w.be32(5, 1);
}

/// The table's comment as `nft` stores it (NFTNL_UDATA_TABLE_COMMENT).
fn table_comment() -> Vec<u8> {
    let mut out = Vec::new();
    udata(&mut out, 0, &nul_terminated(TABLE_COMMENT));
    out
}

/// Starts a message (`nlmsghdr` and `nfgenmsg`) of nf_tables type `kind`
/// (`NFT_MSG_*`), or a batch control message (`NFNL_MSG_BATCH_*`) when `kind`
/// is one; its length is filled in by [`end_message`]. Returns where it starts.
/// The netlink message an operation is: its type, its flags and its family.
fn message_kind(op: &Op) -> (u16, u16, IpFamily) {
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

fn begin_message(buf: &mut Vec<u8>, kind: u16, flags: u16, seq: u32, family: u8) -> usize {
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

fn end_message(buf: &mut [u8], at: usize) {
    let len = (buf.len() - at) as u32;
    buf[at..at + 4].copy_from_slice(&len.to_ne_bytes());
}

const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;
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

/// Encodes statements one at a time into one transaction: consecutive element
/// changes of the same kind to the same set share a message (up to
/// 64); every other statement is one message. Only the last
/// message asks for an acknowledgement: the kernel reports every failing message
/// anyway, and one acknowledgement per message would not fit in the socket's
/// receive buffer for a full sync. The statements are kept only as far as an
/// error message needs them (each message's first).
pub struct BatchBuilder {
    /// Full chunks, then `buf`, the one being written.
    chunks: Vec<Vec<u8>>,
    buf: Vec<u8>,
    messages: Vec<Message>,
    /// The element message being filled: where it and its element list start.
    open: Option<(usize, usize)>,
    /// Where the last message starts.
    last_at: usize,
    encode: Duration,
}

impl Default for BatchBuilder {
    fn default() -> Self {
        BatchBuilder::new()
    }
}

impl BatchBuilder {
    pub fn new() -> Self {
        let mut buf = Vec::new();
        let at = begin_message(&mut buf, NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 1, 0);
        end_message(&mut buf, at);
        BatchBuilder {
            chunks: Vec::new(),
            buf,
            messages: Vec::new(),
            open: None,
            last_at: 0,
            encode: Duration::ZERO,
        }
    }

    /// Appends `op` to the transaction.
    pub fn push(&mut self, op: Op) {
        let start = std::time::Instant::now();
        self.encode_one(op);
        self.encode += start.elapsed();
    }

    fn encode_one(&mut self, op: Op) {
        if let (Op::Element(e), Some(_)) = (&op, self.open) {
            let m = self.messages.last_mut().expect("an open message");
            let same = matches!(&m.first, Op::Element(f)
                if f.family == e.family && f.add == e.add && f.set == e.set);
            if same && m.taken < ELEMENTS_PER_MESSAGE {
                element(&mut W(&mut self.buf), e);
                m.taken += 1;
                return;
            }
        }
        self.close();
        self.roll();
        // The batch's begin is 1, its messages 2 and on.
        let seq = self.messages.len() as u32 + 2;
        let (kind, flags, family) = message_kind(&op);
        let at = begin_message(
            &mut self.buf,
            kind,
            NLM_F_REQUEST | flags,
            seq,
            nfproto(family),
        );
        self.last_at = at;
        let w = &mut W(&mut self.buf);
        match &op {
            Op::Element(e) => {
                // NFTA_SET_ELEM_LIST_TABLE, _SET, _ELEMENTS (left open for the
                // next elements).
                w.str(1, TABLE_NAME);
                w.str(2, &e.set);
                let list = w.begin_nest(3);
                element(w, e);
                self.open = Some((at, list));
            }
            Op::AddTable { .. } => {
                // NFTA_TABLE_NAME, NFTA_TABLE_USERDATA.
                w.str(1, TABLE_NAME);
                w.attr(6, &table_comment());
            }
            Op::DeleteTable { .. } => w.str(1, TABLE_NAME),
            // NFTA_RULE_TABLE: every rule of the table.
            Op::FlushTable { .. } => w.str(1, TABLE_NAME),
            Op::AddChain {
                name,
                comment,
                base,
                ..
            } => {
                // NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME, [hook], NFTA_CHAIN_USERDATA.
                w.str(1, TABLE_NAME);
                w.str(3, name);
                if let Some(b) = base {
                    base_chain_attributes(w, b);
                }
                if let Some(c) = comment {
                    w.attr(12, &chain_comment(c));
                }
            }
            // NFTA_RULE_TABLE, NFTA_RULE_CHAIN (every rule of the chain);
            // NFTA_SET_ELEM_LIST_TABLE, _SET (every element); NFTA_SET_TABLE,
            // NFTA_SET_NAME.
            Op::FlushChain { name, .. }
            | Op::FlushSet { name, .. }
            | Op::DeleteSet { name, .. } => {
                w.str(1, TABLE_NAME);
                w.str(2, name);
            }
            Op::DeleteChain { name, .. } => {
                w.str(1, TABLE_NAME);
                w.str(3, name);
            }
            Op::AddSet { name, set, .. } => SetSpec::of_set(set).write(w, name, seq),
            Op::AddMap { name, map, .. } => SetSpec::of_map(map).write(w, name, seq),
            Op::AddRule { chain, rule, .. } => {
                // NFTA_RULE_TABLE, NFTA_RULE_CHAIN, NFTA_RULE_EXPRESSIONS.
                w.str(1, TABLE_NAME);
                w.str(2, chain);
                w.nest(4, |w| rule_expressions(w, rule));
            }
            Op::AddIntervals { set, nets, .. } => {
                w.str(1, TABLE_NAME);
                w.str(2, set);
                w.nest(3, |w| interval_elements(w, nets));
            }
        }
        if self.open.is_none() {
            end_message(&mut self.buf, at);
        }
        self.messages.push(Message {
            seq,
            first: op,
            taken: 1,
        });
    }

    /// Starts a new chunk when this one is nearly full: a full sync's batch is
    /// tens of megabytes, which one buffer would reach by doubling, holding the
    /// old copy and the new at once. A message never spans chunks (the largest,
    /// 64 elements, is a few kilobytes).
    fn roll(&mut self) {
        if self.buf.len() > CHUNK_BYTES - 64 * 1024 {
            let full = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK_BYTES));
            self.chunks.push(full);
        }
    }

    /// Ends the element message being filled, if any.
    fn close(&mut self) {
        if let Some((at, list)) = self.open.take() {
            W(&mut self.buf).end_nest(list);
            end_message(&mut self.buf, at);
        }
    }

    /// The transaction: the last message asks for an acknowledgement, and the
    /// batch ends.
    pub fn finish(mut self) -> Batch {
        self.close();
        if !self.messages.is_empty() {
            let flags = self.last_at + 6;
            let f = u16::from_ne_bytes([self.buf[flags], self.buf[flags + 1]]) | NLM_F_ACK;
            self.buf[flags..flags + 2].copy_from_slice(&f.to_ne_bytes());
        }
        let seq = self.messages.len() as u32 + 2;
        let at = begin_message(&mut self.buf, NFNL_MSG_BATCH_END, NLM_F_REQUEST, seq, 0);
        end_message(&mut self.buf, at);
        self.chunks.push(self.buf);
        Batch {
            chunks: self.chunks,
            messages: self.messages,
            encode: self.encode,
        }
    }
}

impl Batch {
    /// The batch of `ops`, in order.
    #[cfg(test)]
    fn encode(ops: &[Op]) -> Batch {
        let mut b = BatchBuilder::new();
        for op in ops {
            b.push(op.clone());
        }
        b.finish()
    }

    /// Bytes of the batch.
    pub fn len(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// What the message `seq` does.
    fn describe(&self, seq: u32) -> Option<String> {
        let m = self.messages.get((seq as usize).checked_sub(2)?)?;
        let text = describe(&m.first);
        Some(match m.taken {
            1 => text,
            n => format!("{text} ({} more in the same message)", n - 1),
        })
    }

    /// Sends the batch on `sock` and waits for the kernel's verdict: the last
    /// message's acknowledgement, after the errors of any that failed.
    fn send_on(&self, sock: &Socket) -> Result<Duration, NetlinkError> {
        let start = std::time::Instant::now();
        // One sendmsg: the kernel takes the chunks as one datagram.
        let iov: Vec<std::io::IoSlice> = self
            .chunks
            .iter()
            .map(|c| std::io::IoSlice::new(c))
            .collect();
        let sent = rustix::net::sendmsg(
            sock,
            &iov,
            &mut rustix::net::SendAncillaryBuffer::default(),
            rustix::net::SendFlags::empty(),
        )
        .map_err(|e| NetlinkError::Io {
            context: "sending the nftables batch".into(),
            source: e.into(),
        })?;
        if sent != self.len() {
            return Err(NetlinkError::Protocol(format!(
                "sent {sent} of {} bytes of the nftables batch",
                self.len()
            )));
        }
        let commit = start.elapsed();
        let last = self.messages.last().map(|m| m.seq);
        let mut failure: Option<NetlinkError> = None;
        let mut buf = Vec::with_capacity(64 * 1024);
        loop {
            recv_datagram(sock, &mut buf)?;
            let mut done = false;
            for (seq, msg) in split_datagram(&buf)? {
                let Some(code) = ack_code(msg)? else { continue };
                let what = self.describe(seq);
                // The last message's verdict, or one about the batch itself (its
                // header: the kernel gave up on it as a whole).
                done |= Some(seq) == last || what.is_none();
                if code != 0 && failure.is_none() {
                    let context = match what {
                        Some(what) => format!("the kernel refused `{what}`"),
                        None => "the kernel refused the nftables transaction".to_string(),
                    };
                    failure = Some(NetlinkError::Kernel {
                        context,
                        source: io::Error::from_raw_os_error(code.saturating_abs()),
                    });
                }
            }
            if done {
                break;
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(commit),
        }
    }
}

/// A statement as the script says it (for errors).
fn describe(op: &Op) -> String {
    match op {
        Op::Element(e) => e.text().trim_end().to_string(),
        Op::AddTable { .. } => "add table".to_string(),
        Op::DeleteTable { .. } => "delete table".to_string(),
        Op::FlushTable { .. } => "flush table".to_string(),
        Op::AddChain { name, .. } => format!("add chain {name}"),
        Op::FlushChain { name, .. } => format!("flush chain {name}"),
        Op::DeleteChain { name, .. } => format!("delete chain {name}"),
        Op::AddSet { name, .. } => format!("add set {name}"),
        Op::AddMap { name, .. } => format!("add map {name}"),
        Op::FlushSet { name, .. } => format!("flush set {name}"),
        Op::AddIntervals { set, nets, .. } => format!(
            "add element {set} {{ {} }}",
            nets.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Op::DeleteSet { name, .. } => format!("delete set {name}"),
        Op::AddRule { chain, rule, .. } => format!("add rule {chain} {}", rule.text()),
    }
}

/// What the last batch was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchStats {
    pub bytes: usize,
    pub messages: usize,
    /// The time its encoding took.
    pub encode: Duration,
    /// The kernel's time in the `sendmsg` carrying the batch: it processes and
    /// commits the whole transaction (under the nftables commit lock) before
    /// returning.
    pub commit: Duration,
}

/// Writes batches over one netlink socket, opened at the first batch in the
/// namespace it is told, and kept.
#[derive(Default)]
pub struct NetlinkWriter {
    sock: Option<(Option<PathBuf>, Socket)>,
    /// The last batch sent.
    pub last: Option<BatchStats>,
    /// The send buffer asked of the open socket (0: the kernel's default).
    sndbuf: usize,
}

impl NetlinkWriter {
    /// Applies `batch` in the network namespace `netns` names (or this thread's).
    /// Each batch numbers its messages from 1: the socket holds no reply of an
    /// earlier one (every batch is waited for, and a failed one takes the socket
    /// with it).
    pub fn apply(
        &mut self,
        batch: Batch,
        netns: Option<&Path>,
        timeout: Duration,
    ) -> Result<(), DataPlaneError> {
        if batch.is_empty() {
            return Ok(());
        }
        let encode = batch.encode;
        let result = self
            .socket(netns, timeout, batch.len())
            .and_then(|sock| batch.send_on(sock));
        match &result {
            Ok(commit) => {
                self.last = Some(BatchStats {
                    bytes: batch.len(),
                    messages: batch.messages.len(),
                    encode,
                    commit: *commit,
                });
                tracing::debug!(
                    bytes = batch.len(),
                    messages = batch.messages.len(),
                    commit = ?commit,
                    "nftables batch committed"
                );
            }
            // Whatever the socket still holds (late replies) goes with it.
            Err(_) => self.sock = None,
        }
        result.map(|_| ()).map_err(|e| match e {
            NetlinkError::Kernel { context, source } => DataPlaneError::Rejected {
                command: "nftables netlink batch".into(),
                status: format!("errno {}", source.raw_os_error().unwrap_or(0)),
                stderr: format!("{context}: {source}"),
            },
            other => DataPlaneError::Io {
                command: "nftables netlink batch".into(),
                source: io::Error::other(other.to_string()),
            },
        })
    }

    /// The socket for `netns`, able to send `len` bytes at once.
    fn socket(
        &mut self,
        netns: Option<&Path>,
        timeout: Duration,
        len: usize,
    ) -> Result<&Socket, NetlinkError> {
        if self
            .sock
            .as_ref()
            .is_some_and(|(ns, _)| ns.as_deref() != netns)
        {
            self.sock = None;
        }
        if self.sock.is_none() {
            self.sock = Some((netns.map(Path::to_path_buf), open_socket(netns, timeout)?));
            self.sndbuf = 0;
        }
        let sock = &self.sock.as_ref().expect("just opened").1;
        let want = len.max(DEFAULT_SNDBUF);
        if want > self.sndbuf && len > DEFAULT_SNDBUF {
            // Past net.core.wmem_max: CAP_NET_ADMIN's SO_SNDBUFFORCE, as `nft` does.
            rustix::net::sockopt::set_socket_send_buffer_size_force(sock, want).map_err(|e| {
                NetlinkError::Io {
                    context: format!("setting a {want}-byte send buffer"),
                    source: e.into(),
                }
            })?;
            self.sndbuf = want;
        }
        Ok(sock)
    }
}

impl std::fmt::Debug for NetlinkWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetlinkWriter")
            .field("open", &self.sock.is_some())
            .finish()
    }
}

/// `Some(code)` for an acknowledgement or error (`0`: success), `None` for any
/// other message.
fn ack_code(msg: &[u8]) -> Result<Option<i32>, NetlinkError> {
    use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
    let parsed = NetlinkMessage::<NetfilterMessage>::deserialize(msg)
        .map_err(|e| NetlinkError::Protocol(format!("an nftables reply did not parse: {e}")))?;
    Ok(match parsed.payload {
        NetlinkPayload::Error(e) => Some(e.raw_code()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_are_laid_out_as_the_kernel_stores_them() {
        let v4: IpAddr = "198.19.0.10".parse().unwrap();
        // ipv4_addr . inet_proto . inet_service: 4 + 4 + 4 bytes.
        assert_eq!(
            layout(&[Atom::Ip(v4), Atom::Proto(Protocol::Tcp), Atom::Port(80)]),
            vec![198, 19, 0, 10, 6, 0, 0, 0, 0, 80, 0, 0]
        );
        // A single address: as is.
        assert_eq!(layout(&[Atom::Ip(v4)]), vec![198, 19, 0, 10]);
        // An endpoint map's key, in host order; its value address . port.
        assert_eq!(layout(&[Atom::Num(7)]), 7u32.to_ne_bytes().to_vec());
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let value = layout(&[Atom::Ip(v6), Atom::Port(8080)]);
        assert_eq!(value.len(), 20);
        assert_eq!(&value[16..], &[0x1f, 0x90, 0, 0]);
        // inet_proto . inet_service (NodePorts).
        assert_eq!(
            layout(&[Atom::Proto(Protocol::Sctp), Atom::Port(30000)]),
            vec![132, 0, 0, 0, 0x75, 0x30, 0, 0]
        );
    }

    /// The attributes in `buf`: type (flags masked) and payload.
    fn attrs(buf: &[u8]) -> Vec<(u16, &[u8])> {
        let mut out = Vec::new();
        let mut at = 0;
        while at + 4 <= buf.len() {
            let len = u16::from_ne_bytes([buf[at], buf[at + 1]]) as usize;
            let kind = u16::from_ne_bytes([buf[at + 2], buf[at + 3]]) & !NLA_F_NESTED;
            out.push((kind, &buf[at + 4..at + len]));
            at += len.div_ceil(4) * 4;
        }
        out
    }

    #[test]
    fn a_rule_is_written_as_nft_writes_it() {
        // `meta l4proto tcp dnat ip to 198.18.1.10:8080`, expression by expression:
        // names and the immediate's value.
        let rule = TypedRule::new(
            IpFamily::V4,
            vec![Match::L4Proto(Protocol::Tcp)],
            Action::Dnat("198.18.1.10:8080".parse().unwrap()),
        );
        let mut buf = Vec::new();
        rule_expressions(&mut W(&mut buf), &rule);
        let exprs = attrs(&buf);
        let names: Vec<&[u8]> = exprs.iter().map(|(_, e)| attrs(e)[0].1).collect();
        assert_eq!(
            names,
            [
                &b"meta\0"[..],
                b"cmp\0",
                b"immediate\0",
                b"immediate\0",
                b"nat\0"
            ]
        );
        // The first immediate: NFTA_IMMEDIATE_DREG 1, NFTA_IMMEDIATE_DATA
        // { NFTA_DATA_VALUE 198.18.1.10 }.
        let imm = attrs(attrs(exprs[2].1)[1].1);
        assert_eq!(imm[0], (1, &1u32.to_be_bytes()[..]));
        assert_eq!(attrs(imm[1].1)[0], (1, &[198u8, 18, 1, 10][..]));
    }

    #[test]
    fn intervals_end_after_each_prefix_and_start_from_zero() {
        let keys = |nets: &[&str]| -> Vec<(Vec<u8>, bool)> {
            let nets: Vec<IpNet> = nets.iter().map(|n| n.parse().unwrap()).collect();
            let mut buf = Vec::new();
            interval_elements(&mut W(&mut buf), &nets);
            // Each NFTA_LIST_ELEM { NFTA_SET_ELEM_KEY { NFTA_DATA_VALUE }, [FLAGS] }.
            attrs(&buf)
                .into_iter()
                .map(|(_, elem)| {
                    let inner = attrs(elem);
                    let key = attrs(inner[0].1)[0].1.to_vec();
                    (key, inner.len() == 2)
                })
                .collect()
        };
        // Adjacent prefixes: the first's end, then the next's start, same key.
        assert_eq!(
            keys(&["10.0.0.0/8", "11.0.0.0/8"]),
            vec![
                (vec![0, 0, 0, 0], true),
                (vec![10, 0, 0, 0], false),
                (vec![11, 0, 0, 0], true),
                (vec![11, 0, 0, 0], false),
                (vec![12, 0, 0, 0], true),
            ]
        );
        // From zero to the top: no end before, none after.
        assert_eq!(
            keys(&["0.0.0.0/1", "128.0.0.0/1"]),
            vec![
                (vec![0, 0, 0, 0], false),
                (vec![128, 0, 0, 0], true),
                (vec![128, 0, 0, 0], false),
            ]
        );
        assert_eq!(keys(&["::/0"]), vec![(vec![0; 16], false)]);
    }

    #[test]
    fn a_large_batch_is_chunked_at_message_boundaries() {
        let mut b = BatchBuilder::new();
        let n = 100_000u32;
        for k in 0..n {
            b.push(Op::Element(ElemOp {
                family: IpFamily::V6,
                add: true,
                set: format!("endpoint-dnat-tcp-{:02x}", k % 7),
                key: vec![Atom::Num(k)],
                value: Some(ElemValue::Data(vec![
                    Atom::Ip("2001:db8::1".parse().unwrap()),
                    Atom::Port(8080),
                ])),
            }));
        }
        let batch = b.finish();
        assert!(batch.chunks.len() > 1, "{} chunks", batch.chunks.len());
        // Each chunk is whole messages: their lengths add up to it exactly.
        let mut messages = 0;
        for chunk in &batch.chunks {
            assert!(chunk.len() <= CHUNK_BYTES);
            let mut at = 0;
            while at < chunk.len() {
                at += u32::from_ne_bytes(chunk[at..at + 4].try_into().unwrap()) as usize;
                messages += 1;
            }
            assert_eq!(at, chunk.len());
        }
        // The begin, one message per key (the set changes every time), the end.
        assert_eq!(messages, n as usize + 2);
        assert_eq!(batch.messages.len(), n as usize);
    }

    #[test]
    fn a_batch_groups_runs_of_one_set_and_kind() {
        let op = |add: bool, set: &str, n: u32| {
            Op::Element(ElemOp {
                family: IpFamily::V4,
                add,
                set: set.into(),
                key: vec![Atom::Num(n)],
                value: None,
            })
        };
        let ops = vec![
            op(false, "a", 1),
            op(false, "a", 2),
            op(true, "a", 1),
            op(true, "b", 3),
        ];
        let batch = Batch::encode(&ops);
        assert_eq!(batch.messages.len(), 3);
        let first = batch.describe(batch.messages[0].seq).unwrap();
        assert!(first.contains("1 more"), "{first}");
        // Only the last message asks for an acknowledgement.
        let buf = batch.chunks.concat();
        let flags = |at: usize| u16::from_ne_bytes([buf[at + 6], buf[at + 7]]);
        let mut at = 0;
        let mut acks = Vec::new();
        while at < buf.len() {
            acks.push(flags(at) & NLM_F_ACK != 0);
            let len = u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
            at += len.div_ceil(4) * 4;
        }
        assert_eq!(acks, vec![false, false, false, true, false]);
        // nlmsghdr of the first message: BATCH_BEGIN (16), res_id 10 (big endian).
        assert_eq!(u16::from_ne_bytes([buf[4], buf[5]]), 16);
        assert_eq!(&buf[18..20], &[0, 10]);
    }
}
