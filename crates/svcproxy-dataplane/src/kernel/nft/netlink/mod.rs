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
//! batch's buffer (`attr::W`). Keys and values are laid out as the
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
//!
//! **Modules**: `builder`, [`BatchBuilder`], statements encoded into one
//! transaction, each message framed by `message`; `objects`, the table, chains,
//! sets and maps declared (with the user data `nft` stores); `rules`, a rule's
//! expressions; `elements`, set elements and intervals ([`layout`]: keys and
//! values as the kernel stores them); `attr`, the attribute writer. Here: the
//! [`Batch`], sent and acknowledged, and the [`NetlinkWriter`] that holds the
//! socket.

mod attr;
mod builder;
mod elements;
mod message;
mod objects;
mod rules;

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use netlink_packet_netfilter::NetfilterMessage;
use svcproxy_plan::nft::typed::Op;

use netlink_sys::Socket;

use crate::error::DataPlaneError;
use crate::kernel::netfilter::{open_socket, recv_datagram, split_datagram, NetlinkError};

pub use builder::BatchBuilder;
pub use elements::layout;

/// The socket's send buffer below which it is left as the kernel made it: one
/// `sendmsg` must carry the whole batch.
const DEFAULT_SNDBUF: usize = 128 * 1024;

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
