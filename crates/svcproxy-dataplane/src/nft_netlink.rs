//! Partial syncs written to the kernel over netlink: one nf_tables batch
//! (`NFNL_MSG_BATCH_BEGIN`, the statements, `NFNL_MSG_BATCH_END`), one transaction,
//! no `nft` process, no text and no cache fetch. A partial plan whose every
//! statement is typed ([`svcproxy_plan::nft::typed`]: set and map elements, a
//! service port's set chain with its masquerade marks and its DNAT, chains added,
//! flushed and deleted) costs the kernel's commit and little else; `nft` would
//! first list every chain and set of the table (tens of milliseconds at 10k
//! services).
//!
//! Entry point: [`NetlinkWriter::apply`]. Keys and values are laid out as the
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

use netlink_packet_core::{
    DefaultNla, Emitable as _, Nla, NLA_F_NESTED, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE,
    NLM_F_REQUEST,
};
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, DataAttribute, ExpressionAttribute, Expressions, ListAttribute,
    NfTablesMessage, RuleAttribute, RuleMessage, SetAttribute, SetElementAttribute, SetElementList,
    SetElementMessage, SetMessage, TableAttribute, TableMessage, Verdict, VerdictAttribute,
};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use svcproxy_core::model::{IpFamily, Protocol};
use svcproxy_plan::nft::elements::{Atom, ElemOp, ElemValue, ElemVerdict};
use svcproxy_plan::nft::ruleset::{Field, TABLE_COMMENT};
use svcproxy_plan::nft::typed::{Action, Addr, CtState, Match, Op, TypedRule};
use svcproxy_plan::nft::{BaseChain, ChainType, Hook, Map, MapType, Set, TABLE_NAME};

use netlink_sys::Socket;

use crate::conntrack::{ip_protocol, ConntrackError};
use crate::ctnetlink::{
    encode, encode_with, open_socket, recv_datagram, send_request, split_datagram,
};
use crate::DataPlaneError;

/// nfnetlink's subsystem id of nf_tables (a batch's `res_id`).
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// Elements per message (as `nft` groups them, well under a page each).
const ELEMENTS_PER_MESSAGE: usize = 64;
/// The socket's send buffer below which it is left as the kernel made it: one
/// `sendmsg` must carry the whole batch.
const DEFAULT_SNDBUF: usize = 128 * 1024;

/// One message of a batch: its sequence number and the statements it carries
/// (`taken` of them from index `at`), to say which one the kernel refused.
#[derive(Debug)]
struct Message {
    seq: u32,
    at: usize,
    taken: usize,
}

/// One encoded transaction.
#[derive(Debug)]
pub(crate) struct Batch {
    buf: Vec<u8>,
    messages: Vec<Message>,
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

fn element(op: &ElemOp) -> ListAttribute<SetElementAttribute> {
    let mut attrs = vec![SetElementAttribute::Key(DataAttribute::Value(layout(
        &op.key,
    )))];
    match &op.value {
        Some(ElemValue::Data(atoms)) => attrs.push(SetElementAttribute::Data(
            DataAttribute::Value(layout(atoms)),
        )),
        Some(ElemValue::Verdict(v)) => {
            let verdict = match v {
                ElemVerdict::Goto(chain) => vec![
                    VerdictAttribute::Code(Verdict::Goto),
                    VerdictAttribute::Chain(chain.clone()),
                ],
                // NF_DROP.
                ElemVerdict::Drop => vec![VerdictAttribute::Code(Verdict::Other(0))],
            };
            attrs.push(SetElementAttribute::Data(DataAttribute::Verdict(verdict)));
        }
        None => {}
    }
    ListAttribute::Element(attrs)
}

/// An interval set's elements for `nets` (sorted, disjoint), as the kernel's
/// interval sets take them: each prefix's first address, and the address after
/// its last flagged as an interval's end (none past the top of the space), with
/// an end at address zero first when the first prefix starts later.
fn interval_elements(nets: &[IpNet]) -> Vec<ListAttribute<SetElementAttribute>> {
    let bytes = |v: u128, net: &IpNet| match net {
        IpNet::V4(_) => (v as u32).to_be_bytes().to_vec(),
        IpNet::V6(_) => v.to_be_bytes().to_vec(),
    };
    let value = |ip: IpAddr| match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    };
    let key = |b: Vec<u8>| SetElementAttribute::Key(DataAttribute::Value(b));
    // NFTA_SET_ELEM_FLAGS: NFT_SET_ELEM_INTERVAL_END.
    let end = || SetElementAttribute::Other(be32(3, 1));
    let mut out = Vec::new();
    if let Some(first) = nets.first() {
        if value(first.network()) != 0 {
            out.push(ListAttribute::Element(vec![key(bytes(0, first)), end()]));
        }
    }
    for net in nets {
        out.push(ListAttribute::Element(vec![key(ip_bytes(&net.network()))]));
        if let Some(next) = value(net.broadcast()).checked_add(1) {
            let top = match net {
                IpNet::V4(_) => u128::from(u32::MAX),
                IpNet::V6(_) => u128::MAX,
            };
            if next <= top {
                out.push(ListAttribute::Element(vec![key(bytes(next, net)), end()]));
            }
        }
    }
    out
}

/// An attribute's value made of `attrs`, emitted by netlink-packet-core.
fn nested<T: Nla>(attrs: &[T]) -> Vec<u8> {
    let mut buf = vec![0; attrs.buffer_len()];
    attrs.emit(&mut buf);
    buf
}

fn be32(kind: u16, v: u32) -> DefaultNla {
    DefaultNla::new(kind, v.to_be_bytes().to_vec())
}

/// `NFTA_*_DATA` holding `NFTA_DATA_VALUE` bytes.
fn data_value(kind: u16, bytes: &[u8]) -> DefaultNla {
    DefaultNla::new(
        kind | NLA_F_NESTED,
        nested(&[DataAttribute::Value(bytes.to_vec())]),
    )
}

fn expr(name: &str, attributes: Vec<DefaultNla>) -> ListAttribute<ExpressionAttribute> {
    Expressions::Other {
        expression_type: name.to_string(),
        attributes,
    }
    .into()
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

type Expr = ListAttribute<ExpressionAttribute>;

/// `meta load KEY => reg DREG` (NFTA_META_DREG, NFTA_META_KEY).
fn meta(key: u32, dreg: u32) -> Expr {
    expr("meta", vec![be32(1, dreg), be32(2, key)])
}

// NFT_META_* keys.
const META_MARK: u32 = 3;
const META_IIFNAME: u32 = 6;
const META_L4PROTO: u32 = 16;

/// `meta l4proto P` (into reg 1, compared).
fn l4proto_is(p: Protocol) -> [Expr; 2] {
    [meta(META_L4PROTO, REG_1), cmp(CMP_EQ, &[ip_protocol(p)])]
}

const CMP_EQ: u32 = 0;
const CMP_NEQ: u32 = 1;

/// `cmp` of reg 1 with `bytes` (`op`: NFT_CMP_EQ 0, NFT_CMP_NEQ 1).
fn cmp(op: u32, bytes: &[u8]) -> Expr {
    // NFTA_CMP_SREG, NFTA_CMP_OP, NFTA_CMP_DATA.
    expr(
        "cmp",
        vec![be32(1, REG_1), be32(2, op), data_value(3, bytes)],
    )
}

/// `payload load LEN @ BASE + OFFSET => reg DREG` (base: 1 network, 2 transport).
fn payload(base: u32, offset: u32, len: u32, dreg: u32) -> Expr {
    // NFTA_PAYLOAD_DREG, _BASE, _OFFSET, _LEN.
    expr(
        "payload",
        vec![be32(1, dreg), be32(2, base), be32(3, offset), be32(4, len)],
    )
}

/// `reg 1 = (reg 1 & MASK) ^ XOR` over `mask.len()` bytes.
fn bitwise(mask: &[u8], xor: &[u8]) -> Expr {
    // NFTA_BITWISE_SREG, _DREG, _LEN, _MASK, _XOR.
    expr(
        "bitwise",
        vec![
            be32(1, REG_1),
            be32(2, REG_1),
            be32(3, mask.len() as u32),
            data_value(4, mask),
            data_value(5, xor),
        ],
    )
}

/// `reg 1 & BITS != 0` for a 32-bit value loaded in reg 1 (`ct state`, `ct status`).
fn any_bit(bits: u32) -> [Expr; 2] {
    [bitwise(&bits.to_ne_bytes(), &[0; 4]), cmp(CMP_NEQ, &[0; 4])]
}

/// `lookup reg SREG set SET [dreg DREG]`, inverted when `invert`.
fn lookup(set: &str, sreg: u32, dreg: Option<u32>, invert: bool) -> Expr {
    // NFTA_LOOKUP_SET, _SREG, _DREG, _FLAGS (NFT_LOOKUP_F_INV).
    let mut attrs = vec![DefaultNla::new(1, nul_terminated(set)), be32(2, sreg)];
    if let Some(dreg) = dreg {
        attrs.push(be32(3, dreg));
    }
    if invert {
        attrs.push(be32(5, 1));
    }
    expr("lookup", attrs)
}

/// `immediate reg 0 VERDICT`.
fn verdict(code: Verdict, chain: Option<&str>) -> Expr {
    let mut v = vec![VerdictAttribute::Code(code)];
    if let Some(chain) = chain {
        v.push(VerdictAttribute::Chain(chain.to_string()));
    }
    // NFTA_IMMEDIATE_DREG, NFTA_IMMEDIATE_DATA { NFTA_DATA_VERDICT { ... } }.
    expr(
        "immediate",
        vec![
            be32(1, REG_VERDICT),
            DefaultNla::new(2 | NLA_F_NESTED, nested(&[DataAttribute::Verdict(v)])),
        ],
    )
}

/// `immediate reg DREG VALUE`.
fn immediate(dreg: u32, value: &[u8]) -> Expr {
    expr("immediate", vec![be32(1, dreg), data_value(2, value)])
}

fn nfproto(f: IpFamily) -> u32 {
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
fn dnat(f: IpFamily, proto_reg: u32) -> Expr {
    // NFTA_NAT_TYPE (NFT_NAT_DNAT), _FAMILY, _REG_ADDR_MIN, _MAX, _REG_PROTO_MIN,
    // _MAX, _FLAGS.
    expr(
        "nat",
        vec![
            be32(1, 1),
            be32(2, nfproto(f)),
            be32(3, REG_1),
            be32(4, REG_1),
            be32(5, proto_reg),
            be32(6, proto_reg),
            be32(7, 0x3),
        ],
    )
}

/// A match's expressions, as `nft` compiles it.
fn match_expressions(family: IpFamily, m: &Match, out: &mut Vec<Expr>) {
    match m {
        Match::CtState(state) => {
            // NFTA_CT_DREG, NFTA_CT_KEY (NFT_CT_STATE); NF_CT_STATE_BIT(NEW) or
            // NF_CT_STATE_INVALID_BIT.
            out.push(expr("ct", vec![be32(1, REG_1), be32(2, 0)]));
            out.extend(any_bit(match state {
                CtState::New => 0x8,
                CtState::Invalid => 0x1,
            }));
        }
        Match::CtStatusDnat => {
            // NFT_CT_STATUS; IPS_DST_NAT.
            out.push(expr("ct", vec![be32(1, REG_1), be32(2, 2)]));
            out.extend(any_bit(0x20));
        }
        Match::L4Proto(p) => out.extend(l4proto_is(*p)),
        Match::Dport(p, port) => {
            out.extend(l4proto_is(*p));
            out.push(payload(2, 2, 2, REG_1));
            out.push(cmp(CMP_EQ, &port.to_be_bytes()));
        }
        Match::Prefix { addr, net, negate } => {
            let (at, len) = addr_at(family, *addr);
            let op = if *negate { CMP_NEQ } else { CMP_EQ };
            let bits = u32::from(net.prefix_len());
            let network = ip_bytes(&net.network());
            if bits == len * 8 {
                out.push(payload(1, at, len, REG_1));
                out.push(cmp(op, &network));
            } else if bits.is_multiple_of(8) && bits > 0 {
                // A whole-byte prefix: only its bytes are loaded.
                out.push(payload(1, at, bits / 8, REG_1));
                out.push(cmp(op, &network[..(bits / 8) as usize]));
            } else {
                out.push(payload(1, at, len, REG_1));
                out.push(bitwise(&ip_bytes(&net.netmask()), &vec![0; len as usize]));
                out.push(cmp(op, &network));
            }
        }
        Match::InSet { addr, set, negate } => {
            let (at, len) = addr_at(family, *addr);
            out.push(payload(1, at, len, REG_1));
            out.push(lookup(set, REG_1, None, *negate));
        }
        Match::PairInSet(set) => {
            let (saddr, len) = addr_at(family, Addr::Saddr);
            let (daddr, _) = addr_at(family, Addr::Daddr);
            out.push(payload(1, saddr, len, REG_1));
            out.push(payload(1, daddr, len, reg_at(len)));
            out.push(lookup(set, REG_1, None, false));
        }
        Match::FibLocal(addr) => {
            // NFTA_FIB_DREG, _RESULT (NFT_FIB_RESULT_ADDRTYPE), _FLAGS
            // (NFTA_FIB_F_SADDR 1, _DADDR 2); RTN_LOCAL.
            let flags = match addr {
                Addr::Saddr => 1,
                Addr::Daddr => 2,
            };
            out.push(expr(
                "fib",
                vec![be32(1, REG_1), be32(2, 3), be32(3, flags)],
            ));
            out.push(cmp(CMP_EQ, &2u32.to_ne_bytes()));
        }
        Match::MarkClear(mark) => {
            out.push(meta(META_MARK, REG_1));
            out.push(bitwise(&mark.to_ne_bytes(), &[0; 4]));
            out.push(cmp(CMP_EQ, &[0; 4]));
        }
        Match::Iifname { name, negate } => {
            out.push(meta(META_IIFNAME, REG_1));
            let op = if *negate { CMP_NEQ } else { CMP_EQ };
            match name.strip_suffix('*') {
                // A prefix: its bytes only.
                Some(prefix) => out.push(cmp(op, prefix.as_bytes())),
                // A whole name: IFNAMSIZ bytes, NUL-padded.
                None => {
                    let mut bytes = name.as_bytes().to_vec();
                    bytes.resize(16, 0);
                    out.push(cmp(op, &bytes));
                }
            }
        }
        Match::NumgenZero(n) => {
            out.push(numgen(*n, 0));
            out.push(cmp(CMP_EQ, &[0; 4]));
        }
    }
}

/// `numgen reg 1 = random mod N offset B`.
fn numgen(n: u32, offset: u32) -> Expr {
    // NFTA_NG_DREG, _MODULUS, _TYPE (NFT_NG_RANDOM), _OFFSET.
    expr(
        "numgen",
        vec![be32(1, REG_1), be32(2, n), be32(3, 1), be32(4, offset)],
    )
}

/// `meta set mark with reg 1` after `reg 1 = (mark & MASK) ^ XOR`.
fn set_mark(mask: u32, xor: u32, out: &mut Vec<Expr>) {
    out.push(meta(META_MARK, REG_1));
    out.push(bitwise(&mask.to_ne_bytes(), &xor.to_ne_bytes()));
    // NFTA_META_KEY, NFTA_META_SREG.
    out.push(expr("meta", vec![be32(2, META_MARK), be32(3, REG_1)]));
}

/// An action's expressions, as `nft` compiles it.
fn action_expressions(family: IpFamily, action: &Action, out: &mut Vec<Expr>) {
    match action {
        Action::Jump(chain) => out.push(verdict(Verdict::Jump, Some(chain))),
        Action::Goto(chain) => out.push(verdict(Verdict::Goto, Some(chain))),
        Action::Return => out.push(verdict(Verdict::Return, None)),
        // NF_DROP.
        Action::Drop => out.push(verdict(Verdict::Other(0), None)),
        Action::Vmap { daddr, map } => {
            let mut at = 0;
            if *daddr {
                let (offset, len) = addr_at(family, Addr::Daddr);
                out.push(payload(1, offset, len, REG_1));
                at = len;
            }
            out.push(meta(META_L4PROTO, reg_at(at)));
            out.push(payload(2, 2, 2, reg_at(at + 4)));
            out.push(lookup(map, REG_1, Some(REG_VERDICT), false));
        }
        Action::MarkOr(mark) => set_mark(!mark, *mark, out),
        Action::MarkXor(mark) => set_mark(u32::MAX, *mark, out),
        Action::Reject { tcp_reset } => {
            // NFTA_REJECT_TYPE (NFT_REJECT_TCP_RST 1, NFT_REJECT_ICMP_UNREACH 0),
            // NFTA_REJECT_ICMP_CODE (port unreachable: 3 for ICMP, 4 for ICMPv6).
            let (kind, code) = match (tcp_reset, family) {
                (true, _) => (1, 0u8),
                (false, IpFamily::V4) => (0, 3),
                (false, IpFamily::V6) => (0, 4),
            };
            out.push(expr(
                "reject",
                vec![be32(1, kind), DefaultNla::new(2, vec![code])],
            ));
        }
        // NFTA_MASQ_FLAGS: NF_NAT_RANGE_PROTO_RANDOM_FULLY.
        Action::MasqueradeFullyRandom => out.push(expr("masq", vec![be32(1, 0x10)])),
        Action::UpdateSaddr(set) => {
            let (at, len) = addr_at(family, Addr::Saddr);
            out.push(payload(1, at, len, REG_1));
            // NFTA_DYNSET_SET_NAME, _OP (NFT_DYNSET_OP_UPDATE), _SREG_KEY.
            out.push(expr(
                "dynset",
                vec![
                    DefaultNla::new(1, nul_terminated(set)),
                    be32(3, 1),
                    be32(4, REG_1),
                ],
            ));
        }
        Action::Dnat(to) => {
            out.push(immediate(REG_1, &ip_bytes(&to.ip())));
            out.push(immediate(REG_2, &to.port().to_be_bytes()));
            out.push(dnat(family, REG_2));
        }
        Action::MapDnat { n, offset, map } => {
            out.push(numgen(*n, *offset));
            out.push(lookup(map, REG_1, Some(REG_1), false));
            // The value is address . port: the port follows the address.
            out.push(dnat(family, reg_at(addr_len(family))));
        }
        Action::Redirect(port) => {
            out.push(immediate(REG_1, &port.to_be_bytes()));
            // NFTA_REDIR_REG_PROTO_MIN, NFTA_REDIR_FLAGS
            // (NF_NAT_RANGE_PROTO_SPECIFIED).
            out.push(expr("redir", vec![be32(1, REG_1), be32(3, 0x2)]));
        }
    }
}

/// A typed rule's expressions, as `nft` compiles the same rule.
fn rule_expressions(rule: &TypedRule) -> Vec<Expr> {
    let mut out = Vec::new();
    for m in &rule.matches {
        match_expressions(rule.family, m, &mut out);
    }
    action_expressions(rule.family, &rule.action, &mut out);
    out
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

    /// The attributes, `id` naming the set within its batch (the kernel wants one).
    fn attributes(&self, name: &str, id: u32) -> Vec<SetAttribute> {
        let raw = |kind: u16, bytes: Vec<u8>| SetAttribute::Other(DefaultNla::new(kind, bytes));
        let mut out = vec![
            raw(1, nul_terminated(TABLE_NAME)),
            raw(2, nul_terminated(name)),
            raw(3, self.flags.to_be_bytes().to_vec()),
            raw(4, self.key.0.to_be_bytes().to_vec()),
            raw(5, self.key.1.to_be_bytes().to_vec()),
        ];
        if let Some((kind, len)) = self.data {
            out.push(raw(6, kind.to_be_bytes().to_vec()));
            out.push(raw(7, len.to_be_bytes().to_vec()));
        }
        out.push(raw(10, id.to_be_bytes().to_vec()));
        if let Some(ms) = self.timeout_ms {
            out.push(raw(11, ms.to_be_bytes().to_vec()));
        }
        out.push(raw(13, self.udata.clone()));
        out
    }
}

/// A base chain's `NFTA_CHAIN_*` attributes: hook, type, policy accept.
fn base_chain_attributes(base: &BaseChain) -> Vec<ChainAttribute> {
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
    // NFTA_CHAIN_HOOK { NFTA_HOOK_HOOKNUM, NFTA_HOOK_PRIORITY }.
    let hook = DefaultNla::new(
        4 | NLA_F_NESTED,
        nested(&[be32(1, hook), be32(2, base.priority as u32)]),
    );
    vec![
        ChainAttribute::Other(hook),
        ChainAttribute::Type(chain_type.to_string()),
        // NF_ACCEPT.
        ChainAttribute::Policy(1),
    ]
}

/// The table's comment as `nft` stores it (NFTNL_UDATA_TABLE_COMMENT).
fn table_comment() -> Vec<u8> {
    let mut out = Vec::new();
    udata(&mut out, 0, &nul_terminated(TABLE_COMMENT));
    out
}

fn control(seq: u32, msg: ControlMessage) -> Vec<u8> {
    encode_with(
        NLM_F_REQUEST,
        seq,
        NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, NFNL_SUBSYS_NFTABLES),
        NetfilterMessageInner::None(msg),
    )
}

impl Batch {
    /// The batch applying `ops` in order, its messages numbered from `seq` on:
    /// consecutive element changes of the same kind to the same set share a
    /// message; every other statement is one message. Only the last asks for an
    /// acknowledgement: the kernel reports every failing message anyway, and
    /// one acknowledgement per message would not fit in the socket's receive
    /// buffer for a full sync.
    pub fn encode(ops: &[Op], seq: u32) -> Batch {
        let mut seq = seq;
        let mut next = || {
            seq = seq.wrapping_add(1).max(1);
            seq
        };
        let mut buf = control(next(), ControlMessage::BatchBegin);
        let mut messages = Vec::new();
        let mut rest = ops;
        while let Some(first) = rest.first() {
            let s = next();
            let (family, flags, msg, taken) = match first {
                Op::Element(first) => {
                    let group: Vec<&ElemOp> = rest
                        .iter()
                        .take(ELEMENTS_PER_MESSAGE)
                        .map_while(|o| match o {
                            Op::Element(e)
                                if e.family == first.family
                                    && e.add == first.add
                                    && e.set == first.set =>
                            {
                                Some(e)
                            }
                            _ => None,
                        })
                        .collect();
                    let list = SetElementMessage {
                        attributes: vec![
                            SetElementList::Table(TABLE_NAME.to_string()),
                            SetElementList::Set(first.set.clone()),
                            SetElementList::Elements(group.iter().map(|e| element(e)).collect()),
                        ],
                    };
                    let (flags, msg) = if first.add {
                        (NLM_F_CREATE, NfTablesMessage::NewSetElement(list))
                    } else {
                        (0, NfTablesMessage::DeleteSetElement(list))
                    };
                    (first.family, flags, msg, group.len())
                }
                Op::AddChain {
                    family,
                    name,
                    comment,
                    base,
                } => {
                    let mut attributes = vec![
                        ChainAttribute::Table(TABLE_NAME.to_string()),
                        ChainAttribute::Name(name.clone()),
                    ];
                    if let Some(b) = base {
                        attributes.extend(base_chain_attributes(b));
                    }
                    if let Some(c) = comment {
                        attributes.push(ChainAttribute::UserData(chain_comment(c)));
                    }
                    (
                        *family,
                        NLM_F_CREATE,
                        NfTablesMessage::NewChain(ChainMessage { attributes }),
                        1,
                    )
                }
                Op::AddTable { family } => (
                    *family,
                    NLM_F_CREATE,
                    NfTablesMessage::NewTable(TableMessage {
                        attributes: vec![
                            TableAttribute::Name(TABLE_NAME.to_string()),
                            TableAttribute::UserData(table_comment()),
                        ],
                    }),
                    1,
                ),
                Op::DeleteTable { family } => (
                    *family,
                    0,
                    NfTablesMessage::DeleteTable(TableMessage {
                        attributes: vec![TableAttribute::Name(TABLE_NAME.to_string())],
                    }),
                    1,
                ),
                Op::FlushTable { family } => (
                    *family,
                    0,
                    NfTablesMessage::DeleteRule(RuleMessage {
                        attributes: vec![RuleAttribute::Table(TABLE_NAME.to_string())],
                    }),
                    1,
                ),
                Op::AddSet { family, name, set } => (
                    *family,
                    NLM_F_CREATE,
                    NfTablesMessage::NewSet(SetMessage {
                        attributes: SetSpec::of_set(set).attributes(name, s),
                    }),
                    1,
                ),
                Op::AddMap { family, name, map } => (
                    *family,
                    NLM_F_CREATE,
                    NfTablesMessage::NewSet(SetMessage {
                        attributes: SetSpec::of_map(map).attributes(name, s),
                    }),
                    1,
                ),
                Op::AddIntervals { family, set, nets } => (
                    *family,
                    NLM_F_CREATE,
                    NfTablesMessage::NewSetElement(SetElementMessage {
                        attributes: vec![
                            SetElementList::Table(TABLE_NAME.to_string()),
                            SetElementList::Set(set.clone()),
                            SetElementList::Elements(interval_elements(nets)),
                        ],
                    }),
                    1,
                ),
                Op::FlushSet { family, name } => (
                    *family,
                    0,
                    NfTablesMessage::DeleteSetElement(SetElementMessage {
                        attributes: vec![
                            SetElementList::Table(TABLE_NAME.to_string()),
                            SetElementList::Set(name.clone()),
                        ],
                    }),
                    1,
                ),
                Op::DeleteSet { family, name } => (
                    *family,
                    0,
                    NfTablesMessage::DeleteSet(SetMessage {
                        attributes: vec![
                            SetAttribute::Table(TABLE_NAME.to_string()),
                            SetAttribute::Name(name.clone()),
                        ],
                    }),
                    1,
                ),
                Op::FlushChain { family, name } => (
                    *family,
                    0,
                    NfTablesMessage::DeleteRule(RuleMessage {
                        attributes: vec![
                            RuleAttribute::Table(TABLE_NAME.to_string()),
                            RuleAttribute::Chain(name.clone()),
                        ],
                    }),
                    1,
                ),
                Op::DeleteChain { family, name } => (
                    *family,
                    0,
                    NfTablesMessage::DeleteChain(ChainMessage {
                        attributes: vec![
                            ChainAttribute::Table(TABLE_NAME.to_string()),
                            ChainAttribute::Name(name.clone()),
                        ],
                    }),
                    1,
                ),
                Op::AddRule {
                    family,
                    chain,
                    rule,
                } => (
                    *family,
                    NLM_F_CREATE | NLM_F_APPEND,
                    NfTablesMessage::NewRule(RuleMessage {
                        attributes: vec![
                            RuleAttribute::Table(TABLE_NAME.to_string()),
                            RuleAttribute::Chain(chain.clone()),
                            RuleAttribute::Expressions(rule_expressions(rule)),
                        ],
                    }),
                    1,
                ),
            };
            let at = ops.len() - rest.len();
            rest = &rest[taken..];
            let ack = if rest.is_empty() { NLM_F_ACK } else { 0 };
            buf.extend(encode(NLM_F_REQUEST | ack | flags, s, family, msg));
            messages.push(Message { seq: s, at, taken });
        }
        buf.extend(control(next(), ControlMessage::BatchEnd));
        Batch { buf, messages }
    }

    /// Bytes of the batch.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// The number of messages it holds (sequence numbers it uses).
    fn message_count(&self) -> u32 {
        self.messages.len() as u32 + 2
    }

    /// What the message `seq` does, from the statements `ops` it was encoded from.
    fn describe(&self, ops: &[Op], seq: u32) -> Option<String> {
        let m = self.messages.iter().find(|m| m.seq == seq)?;
        let text = describe(&ops[m.at]);
        Some(match m.taken {
            1 => text,
            n => format!("{text} ({} more in the same message)", n - 1),
        })
    }

    /// Sends the batch on `sock` and waits for the kernel's verdict: the last
    /// message's acknowledgement, after the errors of any that failed.
    fn send_on(&self, sock: &Socket, ops: &[Op]) -> Result<Duration, ConntrackError> {
        let start = std::time::Instant::now();
        send_request(sock, &self.buf, "the nftables batch")?;
        let commit = start.elapsed();
        let last = self.messages.last().map(|m| m.seq);
        let mut failure: Option<ConntrackError> = None;
        let mut buf = Vec::with_capacity(64 * 1024);
        loop {
            recv_datagram(sock, &mut buf)?;
            let mut done = false;
            for (seq, msg) in split_datagram(&buf)? {
                let Some(code) = ack_code(msg)? else { continue };
                let what = self.describe(ops, seq);
                // The last message's verdict, or one about the batch itself (its
                // header: the kernel gave up on it as a whole).
                done |= Some(seq) == last || what.is_none();
                if code != 0 && failure.is_none() {
                    let context = match what {
                        Some(what) => format!("the kernel refused `{what}`"),
                        None => "the kernel refused the nftables transaction".to_string(),
                    };
                    failure = Some(ConntrackError::Kernel {
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
    /// The kernel's time in the `sendmsg` carrying the batch: it processes and
    /// commits the whole transaction (under the nftables commit lock) before
    /// returning.
    pub commit: Duration,
}

/// Writes batches over one netlink socket, opened at the first batch in the
/// namespace it is told, and kept.
#[derive(Default)]
pub(crate) struct NetlinkWriter {
    sock: Option<(Option<PathBuf>, Socket)>,
    seq: u32,
    /// The last batch sent.
    pub last: Option<BatchStats>,
    /// The send buffer asked of the open socket (0: the kernel's default).
    sndbuf: usize,
}

impl NetlinkWriter {
    /// Applies `ops` in the network namespace `netns` names (or this thread's).
    pub fn apply(
        &mut self,
        ops: &[Op],
        netns: Option<&Path>,
        timeout: Duration,
    ) -> Result<(), DataPlaneError> {
        let batch = Batch::encode(ops, self.seq);
        if batch.is_empty() {
            return Ok(());
        }
        self.seq = self.seq.wrapping_add(batch.message_count());
        let result = self
            .socket(netns, timeout, batch.len())
            .and_then(|sock| batch.send_on(sock, ops));
        match &result {
            Ok(commit) => {
                self.last = Some(BatchStats {
                    bytes: batch.len(),
                    messages: batch.messages.len(),
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
            ConntrackError::Kernel { context, source } => DataPlaneError::Rejected {
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
    ) -> Result<&Socket, ConntrackError> {
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
                ConntrackError::Io {
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
fn ack_code(msg: &[u8]) -> Result<Option<i32>, ConntrackError> {
    use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
    let parsed = NetlinkMessage::<NetfilterMessage>::deserialize(msg)
        .map_err(|e| ConntrackError::Protocol(format!("an nftables reply did not parse: {e}")))?;
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

    #[test]
    fn intervals_end_after_each_prefix_and_start_from_zero() {
        let keys = |nets: &[&str]| -> Vec<(Vec<u8>, bool)> {
            let nets: Vec<IpNet> = nets.iter().map(|n| n.parse().unwrap()).collect();
            interval_elements(&nets)
                .into_iter()
                .map(|e| {
                    let ListAttribute::Element(attrs) = e else {
                        panic!("not an element")
                    };
                    let SetElementAttribute::Key(DataAttribute::Value(k)) = &attrs[0] else {
                        panic!("no key")
                    };
                    (k.clone(), attrs.len() == 2)
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
        let batch = Batch::encode(&ops, 0);
        assert_eq!(batch.messages.len(), 3);
        let first = batch.describe(&ops, batch.messages[0].seq).unwrap();
        assert!(first.contains("1 more"), "{first}");
        // Only the last message asks for an acknowledgement.
        let flags = |at: usize| u16::from_ne_bytes([batch.buf[at + 6], batch.buf[at + 7]]);
        let mut at = 0;
        let mut acks = Vec::new();
        while at < batch.buf.len() {
            acks.push(flags(at) & NLM_F_ACK != 0);
            let len = u32::from_ne_bytes(batch.buf[at..at + 4].try_into().unwrap()) as usize;
            at += len.div_ceil(4) * 4;
        }
        assert_eq!(acks, vec![false, false, false, true, false]);
        // nlmsghdr of the first message: BATCH_BEGIN (16), res_id 10 (big endian).
        assert_eq!(u16::from_ne_bytes([batch.buf[4], batch.buf[5]]), 16);
        assert_eq!(&batch.buf[18..20], &[0, 10]);
    }
}
