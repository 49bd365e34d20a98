//! Element changes written to the kernel over netlink: one nf_tables batch
//! (`NFNL_MSG_BATCH_BEGIN`, `NFT_MSG_NEWSETELEM`/`NFT_MSG_DELSETELEM`,
//! `NFNL_MSG_BATCH_END`), one transaction, no `nft` process, no text and no cache
//! fetch. A partial sync that only moves elements (an endpoint moved, a frontend's
//! verdict changed) costs the kernel's commit and little else; `nft` would first
//! list every chain and set of the table (tens of milliseconds at 10k services).
//!
//! Entry point: [`NetlinkWriter::apply`]. The
//! planner's [`ElemOp`]s carry typed keys and values; this module lays them out
//! as the kernel stores them: an address in network order, a protocol as one
//! byte, a port in network order, an endpoint map's key (`numgen`'s) in host
//! order; in a concatenation each field padded to 4 bytes.
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

use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST};
use netlink_packet_netfilter::nftables::{
    DataAttribute, ListAttribute, NfTablesMessage, SetElementAttribute, SetElementList,
    SetElementMessage, Verdict, VerdictAttribute,
};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use svcproxy_core::model::Protocol;
use svcproxy_plan::nft::elements::{Atom, ElemOp, ElemValue, ElemVerdict};
use svcproxy_plan::nft::TABLE_NAME;

use crate::conntrack::ConntrackError;
use netlink_sys::Socket;

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
pub(crate) struct ElementBatch {
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

fn proto_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// A key or value as the kernel stores it: a single field as is, a
/// concatenation with each field padded to 4 bytes.
pub fn layout(atoms: &[Atom]) -> Vec<u8> {
    let mut out = Vec::new();
    for atom in atoms {
        let field = match atom {
            Atom::Ip(ip) => ip_bytes(ip),
            Atom::Proto(p) => vec![proto_number(*p)],
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

fn control(seq: u32, msg: ControlMessage) -> Vec<u8> {
    encode_with(
        NLM_F_REQUEST,
        seq,
        NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, NFNL_SUBSYS_NFTABLES),
        NetfilterMessageInner::None(msg),
    )
}

impl ElementBatch {
    /// The batch applying `ops` in order, its messages numbered from `seq` on:
    /// consecutive changes of the same kind to the same set share a message.
    pub fn encode(ops: &[ElemOp], seq: u32) -> ElementBatch {
        let mut seq = seq;
        let mut next = || {
            seq = seq.wrapping_add(1).max(1);
            seq
        };
        let mut buf = control(next(), ControlMessage::BatchBegin);
        let mut acked = Vec::new();
        let mut rest = ops;
        while let Some(first) = rest.first() {
            let run = rest
                .iter()
                .take(ELEMENTS_PER_MESSAGE)
                .take_while(|o| {
                    o.family == first.family && o.add == first.add && o.set == first.set
                })
                .count();
            let (group, after) = rest.split_at(run);
            rest = after;
            let list = SetElementMessage {
                attributes: vec![
                    SetElementList::Table(TABLE_NAME.to_string()),
                    SetElementList::Set(first.set.clone()),
                    SetElementList::Elements(group.iter().map(element).collect()),
                ],
            };
            let (flags, msg) = if first.add {
                (
                    NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK,
                    NfTablesMessage::NewSetElement(list),
                )
            } else {
                (
                    NLM_F_REQUEST | NLM_F_ACK,
                    NfTablesMessage::DeleteSetElement(list),
                )
            };
            let s = next();
            buf.extend(encode(flags, s, first.family, msg));
            let what = match group {
                [one] => one.text().trim_end().to_string(),
                _ => format!(
                    "{} ({} more in the same message)",
                    first.text().trim_end(),
                    group.len() - 1
                ),
            };
            acked.push((s, what));
        }
        buf.extend(control(next(), ControlMessage::BatchEnd));
        ElementBatch { buf, acked }
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
        ops: &[ElemOp],
        netns: Option<&Path>,
        timeout: Duration,
    ) -> Result<bool, DataPlaneError> {
        let batch = ElementBatch::encode(ops, self.seq);
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

    use svcproxy_core::model::IpFamily;

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
        let op = |add: bool, set: &str, n: u32| ElemOp {
            family: IpFamily::V4,
            add,
            set: set.into(),
            key: vec![Atom::Num(n)],
            value: None,
        };
        let ops = vec![
            op(false, "a", 1),
            op(false, "a", 2),
            op(true, "a", 1),
            op(true, "b", 3),
        ];
        let batch = ElementBatch::encode(&ops, 0);
        assert_eq!(batch.acked.len(), 3);
        assert!(batch.acked[0].1.contains("1 more"), "{:?}", batch.acked);
        // nlmsghdr of the first message: BATCH_BEGIN (16), res_id 10 (big endian).
        assert_eq!(u16::from_ne_bytes([batch.buf[4], batch.buf[5]]), 16);
        assert_eq!(&batch.buf[18..20], &[0, 10]);
    }
}
