//! Statements encoded into one transaction ([`BatchBuilder`]): runs of element
//! changes to one set grouped in a message, every other statement a message of
//! its own, the buffer kept in chunks of whole messages, and only the last
//! message asking for an acknowledgement ([`BatchBuilder::finish`]).

use std::time::Duration;

use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST};
use svcproxy_plan::nft::typed::Op;
use svcproxy_plan::nft::TABLE_NAME;

use super::attr::W;
use super::elements::{element, interval_elements};
use super::message::{
    begin_message, end_message, message_kind, NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END,
};
use super::objects::{base_chain_attributes, chain_comment, table_comment, SetSpec};
use super::rules::{nfproto, rule_expressions};
use super::{Batch, Message};

/// Elements per message (as `nft` groups them, well under a page each).
const ELEMENTS_PER_MESSAGE: usize = 64;

/// The size of a batch's chunks.
const CHUNK_BYTES: usize = 1 << 20;

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

#[cfg(test)]
mod tests {
    use super::*;
    use svcproxy_core::model::IpFamily;
    use svcproxy_plan::nft::elements::{Atom, ElemOp, ElemValue};

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
