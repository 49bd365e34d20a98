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
use std::path::{Path, PathBuf};
use std::time::Duration;

use netlink_packet_core::{
    DefaultNla, Emitable as _, Nla, NLA_F_NESTED, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE,
    NLM_F_REQUEST,
};
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, DataAttribute, ExpressionAttribute, Expressions, ListAttribute,
    NfTablesMessage, RuleAttribute, RuleMessage, SetElementAttribute, SetElementList,
    SetElementMessage, Verdict, VerdictAttribute,
};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use svcproxy_core::model::{IpFamily, Protocol};
use svcproxy_plan::nft::elements::{Atom, ElemOp, ElemValue, ElemVerdict};
use svcproxy_plan::nft::typed::{Op, TypedRule};
use svcproxy_plan::nft::TABLE_NAME;

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
/// A batch larger than this goes through `nft` instead: one `sendmsg` must carry
/// the whole batch, and the socket's default send buffer is about 208 KiB.
const MAX_BATCH_BYTES: usize = 128 * 1024;

/// One encoded transaction.
#[derive(Debug)]
pub(crate) struct Batch {
    buf: Vec<u8>,
    /// Sequence numbers of the messages the kernel acknowledges, with what each
    /// one does (for errors).
    acked: Vec<(u32, String)>,
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

// Registers: NFT_REG_VERDICT, NFT_REG_1, NFT_REG_2, and the 32-bit NFT_REG32_01.
const REG_VERDICT: u32 = 0;
const REG_1: u32 = 1;
const REG_2: u32 = 2;
const REG32_01: u32 = 9;

/// `meta l4proto P` (into reg 1, compared).
fn l4proto_is(p: Protocol) -> [ListAttribute<ExpressionAttribute>; 2] {
    [
        // NFTA_META_DREG, NFTA_META_KEY (NFT_META_L4PROTO).
        expr("meta", vec![be32(1, REG_1), be32(2, 16)]),
        cmp(0, &[ip_protocol(p)]),
    ]
}

/// `cmp` of reg 1 with `bytes` (`op`: NFT_CMP_EQ 0, NFT_CMP_NEQ 1).
fn cmp(op: u32, bytes: &[u8]) -> ListAttribute<ExpressionAttribute> {
    // NFTA_CMP_SREG, NFTA_CMP_OP, NFTA_CMP_DATA.
    expr(
        "cmp",
        vec![be32(1, REG_1), be32(2, op), data_value(3, bytes)],
    )
}

/// `payload load LEN @ BASE + OFFSET => reg 1` (base: 1 network, 2 transport).
fn payload(base: u32, offset: u32, len: u32) -> ListAttribute<ExpressionAttribute> {
    // NFTA_PAYLOAD_DREG, _BASE, _OFFSET, _LEN.
    expr(
        "payload",
        vec![be32(1, REG_1), be32(2, base), be32(3, offset), be32(4, len)],
    )
}

fn nfproto(f: IpFamily) -> u32 {
    match f {
        IpFamily::V4 => 2,
        IpFamily::V6 => 10,
    }
}

/// `dnat` to the address in reg 1 and the port in `proto_reg`
/// (NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED).
fn dnat(f: IpFamily, proto_reg: u32) -> ListAttribute<ExpressionAttribute> {
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

/// A typed rule's expressions, as `nft` compiles the same rule.
fn rule_expressions(rule: &TypedRule) -> Vec<ListAttribute<ExpressionAttribute>> {
    let mut out = Vec::new();
    match rule {
        TypedRule::MapDnat {
            family,
            protocol,
            n,
            offset,
            map,
        } => {
            out.extend(l4proto_is(*protocol));
            // NFTA_NG_DREG, _MODULUS, _TYPE (NFT_NG_RANDOM), _OFFSET.
            out.push(expr(
                "numgen",
                vec![be32(1, REG_1), be32(2, *n), be32(3, 1), be32(4, *offset)],
            ));
            // NFTA_LOOKUP_SET, _SREG, _DREG.
            out.push(expr(
                "lookup",
                vec![
                    DefaultNla::new(1, nul_terminated(map)),
                    be32(2, REG_1),
                    be32(3, REG_1),
                ],
            ));
            // The value is address . port: the port follows the address, in the
            // next 32-bit register after 4 bytes (IPv4) or 16 (IPv6: NFT_REG_2).
            let port_reg = match family {
                IpFamily::V4 => REG32_01,
                IpFamily::V6 => REG_2,
            };
            out.push(dnat(*family, port_reg));
        }
        TypedRule::Dnat {
            family,
            protocol,
            to,
        } => {
            out.extend(l4proto_is(*protocol));
            // NFTA_IMMEDIATE_DREG, NFTA_IMMEDIATE_DATA.
            out.push(expr(
                "immediate",
                vec![be32(1, REG_1), data_value(2, &ip_bytes(&to.ip()))],
            ));
            out.push(expr(
                "immediate",
                vec![be32(1, REG_2), data_value(2, &to.port().to_be_bytes())],
            ));
            out.push(dnat(*family, REG_2));
        }
        TypedRule::MarkMasquerade {
            family,
            daddr,
            protocol,
            port,
            unless_from,
            chain,
        } => {
            let (daddr_at, saddr_at, len) = match family {
                IpFamily::V4 => (16, 12, 4),
                IpFamily::V6 => (24, 8, 16),
            };
            out.push(payload(1, daddr_at, len));
            out.push(cmp(0, &ip_bytes(daddr)));
            out.extend(l4proto_is(*protocol));
            out.push(payload(2, 2, 2));
            out.push(cmp(0, &port.to_be_bytes()));
            if let Some(net) = unless_from {
                let bits = u32::from(net.prefix_len());
                let network = ip_bytes(&net.network());
                if bits % 8 == 0 {
                    // A whole-byte prefix: only its bytes are loaded.
                    out.push(payload(1, saddr_at, bits / 8));
                    out.push(cmp(1, &network[..(bits / 8) as usize]));
                } else {
                    out.push(payload(1, saddr_at, len));
                    // NFTA_BITWISE_SREG, _DREG, _LEN, _MASK, _XOR.
                    out.push(expr(
                        "bitwise",
                        vec![
                            be32(1, REG_1),
                            be32(2, REG_1),
                            be32(3, len),
                            data_value(4, &ip_bytes(&net.netmask())),
                            data_value(5, &vec![0; len as usize]),
                        ],
                    ));
                    out.push(cmp(1, &network));
                }
            }
            // immediate reg 0 jump -> CHAIN: NFTA_DATA_VERDICT { NFTA_VERDICT_CODE
            // (NFT_JUMP), NFTA_VERDICT_CHAIN }.
            let verdict = DataAttribute::Verdict(vec![
                VerdictAttribute::Code(Verdict::Jump),
                VerdictAttribute::Chain(chain.clone()),
            ]);
            out.push(expr(
                "immediate",
                vec![
                    be32(1, REG_VERDICT),
                    DefaultNla::new(2 | NLA_F_NESTED, nested(&[verdict])),
                ],
            ));
        }
    }
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
    let mut out = vec![0, text.len().min(255) as u8];
    out.extend_from_slice(&text[..text.len().min(255)]);
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
    /// message; every other statement is one message.
    pub fn encode(ops: &[Op], seq: u32) -> Batch {
        let mut seq = seq;
        let mut next = || {
            seq = seq.wrapping_add(1).max(1);
            seq
        };
        let mut buf = control(next(), ControlMessage::BatchBegin);
        let mut acked = Vec::new();
        let mut rest = ops;
        while let Some(first) = rest.first() {
            let s = next();
            let (family, flags, msg, what, taken) = match first {
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
                    let what = match group.len() {
                        1 => first.text().trim_end().to_string(),
                        n => format!(
                            "{} ({} more in the same message)",
                            first.text().trim_end(),
                            n - 1
                        ),
                    };
                    (first.family, flags, msg, what, group.len())
                }
                Op::AddChain {
                    family,
                    name,
                    comment,
                } => {
                    let mut attributes = vec![
                        ChainAttribute::Table(TABLE_NAME.to_string()),
                        ChainAttribute::Name(name.clone()),
                    ];
                    if let Some(c) = comment {
                        attributes.push(ChainAttribute::UserData(chain_comment(c)));
                    }
                    (
                        *family,
                        NLM_F_CREATE,
                        NfTablesMessage::NewChain(ChainMessage { attributes }),
                        format!("add chain {name}"),
                        1,
                    )
                }
                Op::FlushChain { family, name } => (
                    *family,
                    0,
                    NfTablesMessage::DeleteRule(RuleMessage {
                        attributes: vec![
                            RuleAttribute::Table(TABLE_NAME.to_string()),
                            RuleAttribute::Chain(name.clone()),
                        ],
                    }),
                    format!("flush chain {name}"),
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
                    format!("delete chain {name}"),
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
                    format!("add rule {chain} {}", rule.text()),
                    1,
                ),
            };
            rest = &rest[taken..];
            buf.extend(encode(NLM_F_REQUEST | NLM_F_ACK | flags, s, family, msg));
            acked.push((s, what));
        }
        buf.extend(control(next(), ControlMessage::BatchEnd));
        Batch { buf, acked }
    }

    /// Bytes of the batch.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.acked.is_empty()
    }

    /// The number of messages it holds (sequence numbers it uses).
    fn messages(&self) -> u32 {
        self.acked.len() as u32 + 2
    }

    /// Sends the batch on `sock` and waits for the kernel's verdict on every
    /// message.
    fn send_on(&self, sock: &Socket) -> Result<(), ConntrackError> {
        send_request(sock, &self.buf, "the nftables batch")?;
        let mut pending: std::collections::BTreeMap<u32, &str> = self
            .acked
            .iter()
            .map(|(s, what)| (*s, what.as_str()))
            .collect();
        let mut failure: Option<ConntrackError> = None;
        let mut buf = Vec::with_capacity(64 * 1024);
        while !pending.is_empty() {
            recv_datagram(sock, &mut buf)?;
            for (seq, msg) in split_datagram(&buf)? {
                let code = ack_code(msg)?;
                let Some(code) = code else { continue };
                let what = pending.remove(&seq);
                if code != 0 && failure.is_none() {
                    let context = match what {
                        Some(what) => format!("the kernel refused `{what}`"),
                        // The batch itself (its commit) failed.
                        None => "the kernel refused the nftables transaction".to_string(),
                    };
                    failure = Some(ConntrackError::Kernel {
                        context,
                        source: io::Error::from_raw_os_error(code.saturating_abs()),
                    });
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Writes element batches over one netlink socket, opened at the first batch in
/// the namespace it is told, and kept.
#[derive(Default)]
pub(crate) struct NetlinkWriter {
    sock: Option<(Option<PathBuf>, Socket)>,
    seq: u32,
}

impl NetlinkWriter {
    /// Applies `ops` in the network namespace `netns` names (or this thread's).
    /// Too large a batch is left to the caller: `Ok(false)`.
    pub fn apply(
        &mut self,
        ops: &[Op],
        netns: Option<&Path>,
        timeout: Duration,
    ) -> Result<bool, DataPlaneError> {
        let batch = Batch::encode(ops, self.seq);
        if batch.is_empty() {
            return Ok(true);
        }
        if batch.len() > MAX_BATCH_BYTES {
            return Ok(false);
        }
        self.seq = self.seq.wrapping_add(batch.messages());
        let result = self
            .socket(netns, timeout)
            .and_then(|sock| batch.send_on(sock));
        if result.is_err() {
            // Whatever the socket still holds (late replies) goes with it.
            self.sock = None;
        }
        result.map(|()| true).map_err(|e| match e {
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

    fn socket(
        &mut self,
        netns: Option<&Path>,
        timeout: Duration,
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
        }
        Ok(&self.sock.as_ref().expect("just opened").1)
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
        assert_eq!(batch.acked.len(), 3);
        assert!(batch.acked[0].1.contains("1 more"), "{:?}", batch.acked);
        // nlmsghdr of the first message: BATCH_BEGIN (16), res_id 10 (big endian).
        assert_eq!(u16::from_ne_bytes([batch.buf[4], batch.buf[5]]), 16);
        assert_eq!(&batch.buf[18..20], &[0, 10]);
    }
}
