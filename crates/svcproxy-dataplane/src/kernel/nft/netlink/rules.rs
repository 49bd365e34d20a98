//! A typed rule's expressions, as `nft` compiles the same rule
//! ([`rule_expressions`]): each match ([`match_expressions`]) and the action
//! ([`action_expressions`]) as `meta`, `cmp`, `payload`, `bitwise`, `lookup`,
//! `nat` and the other expressions, with registers allocated as `nft` does.

use svcproxy_core::model::{IpFamily, Protocol};
use svcproxy_plan::nft::typed::{Action, Addr, CtState, Match, TypedRule};

use super::attr::{verdict_data, NFTA_LIST_ELEM, NFT_GOTO, NFT_JUMP, NFT_RETURN, NF_DROP, W};
use super::elements::ip_bytes;
use crate::kernel::netfilter::ip_protocol;

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

pub(super) fn nfproto(f: IpFamily) -> u8 {
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
            numgen(w, REG_1, *n, 0);
            cmp(w, CMP_EQ, &[0; 4]);
        }
        Match::TupleInSet(set) => {
            service_port(w, family);
            lookup(w, set, REG_1, None, false);
        }
    }
}

/// `F daddr . meta l4proto . th dport` loaded as a concatenation from reg 1; the
/// offset after it.
fn service_port(w: &mut W, family: IpFamily) -> u32 {
    let (offset, len) = addr_at(family, Addr::Daddr);
    payload(w, 1, offset, len, REG_1);
    meta(w, META_L4PROTO, reg_at(len));
    payload(w, 2, 2, 2, reg_at(len + 4));
    len + 8
}

/// `ct load KEY => reg 1`.
fn ct(w: &mut W, key: u32) {
    expr(w, "ct", |w| {
        w.be32(1, REG_1);
        w.be32(2, key);
    });
}

/// `numgen reg DREG = random mod N offset B`.
fn numgen(w: &mut W, dreg: u32, n: u32, offset: u32) {
    // NFTA_NG_DREG, _MODULUS, _TYPE (NFT_NG_RANDOM), _OFFSET.
    expr(w, "numgen", |w| {
        w.be32(1, dreg);
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
            if *daddr {
                service_port(w, family);
            } else {
                meta(w, META_L4PROTO, REG_1);
                payload(w, 2, 2, 2, reg_at(4));
            }
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
            numgen(w, REG_1, *n, *offset);
            lookup(w, map, REG_1, Some(REG_1), false);
            // The value is address . port: the port follows the address.
            dnat(w, family, reg_at(addr_len(family)));
        }
        Action::TupleDnat { n, map } => {
            let at = service_port(w, family);
            numgen(w, reg_at(at), *n, 0);
            lookup(w, map, REG_1, Some(REG_1), false);
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
pub(super) fn rule_expressions(w: &mut W, rule: &TypedRule) {
    for m in &rule.matches {
        match_expressions(w, rule.family, m);
    }
    action_expressions(w, rule.family, &rule.action);
}

#[cfg(test)]
mod tests {
    use super::super::attr::attrs;
    use super::*;

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
}
