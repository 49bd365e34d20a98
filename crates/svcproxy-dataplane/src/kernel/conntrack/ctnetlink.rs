//! Conntrack entries dumped and deleted over ctnetlink (`NETLINK_NETFILTER`): the real
//! [`ConntrackCleaner`].
//!
//! Entry point: [`NetlinkConntrack`]. For each family that has filters, one dump
//! (`IPCTNL_MSG_CT_GET` with `NLM_F_DUMP`, the kernel filtering by family) is matched
//! in userspace, then each matching entry is deleted (`IPCTNL_MSG_CT_DELETE` with its
//! original tuple, zone and id, pipelined in batches): no process per entry, and
//! nothing no filter matches is touched. Messages are the `netlink-packet-netfilter`
//! types; a dump message that does not parse (a hostile or unknown layout) is counted
//! and skipped, never deleted, and never panics.
//!
//! The socket belongs to the network namespace it was opened in: the calling
//! thread's (normally the process's), or the one named by
//! [`NetlinkConntrack::in_netns`], which is entered by a short-lived helper thread so
//! the caller's own namespace never changes.

use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use netlink_packet_core::{
    DefaultNla, NetlinkMessage, NetlinkPayload, Nla, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol as CtProtocol, Tuple,
};
use netlink_packet_netfilter::{NetfilterMessage, NetfilterMessageInner};
use netlink_sys::Socket;
use svcproxy_core::model::IpFamily;

use super::{
    CleanupStats, ConntrackCleaner, ConntrackEntry, ConntrackFilter, FamilyCleanup, NetlinkError,
    StaleUdpFlows,
};
pub use crate::kernel::netfilter::DEFAULT_CONNTRACK_TIMEOUT;
use crate::kernel::netfilter::{
    encode, next_seq, open_socket, recv_datagram, send_request, split_datagram,
};

const CTA_ID: u16 = 12;
const CTA_ZONE: u16 = 18;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const ENOENT: i32 = 2;
/// Larger than any dump datagram the kernel builds (at most 32 KiB).
const RECV_BUFFER: usize = 64 * 1024;
/// Deletes sent before their acknowledgements are read.
const DELETE_BATCH: usize = 64;

/// The kernel's conntrack table, over ctnetlink.
pub struct NetlinkConntrack {
    netns: Option<PathBuf>,
    socket: Option<Socket>,
    seq: u32,
    timeout: Duration,
}

impl Default for NetlinkConntrack {
    fn default() -> Self {
        NetlinkConntrack::new()
    }
}

impl std::fmt::Debug for NetlinkConntrack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetlinkConntrack")
            .field("netns", &self.netns)
            .field("open", &self.socket.is_some())
            .finish()
    }
}

impl NetlinkConntrack {
    /// The table of the network namespace of the thread that first uses it (the
    /// socket is opened lazily, and reopened after an error).
    pub fn new() -> Self {
        NetlinkConntrack {
            netns: None,
            socket: None,
            seq: 0,
            timeout: DEFAULT_CONNTRACK_TIMEOUT,
        }
    }

    /// The table of the network namespace `netns` names (e.g. `/run/netns/NAME`).
    pub fn in_netns(netns: impl Into<PathBuf>) -> Self {
        NetlinkConntrack {
            netns: Some(netns.into()),
            ..NetlinkConntrack::new()
        }
    }

    /// The same table with another bound on each wait for the kernel.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Every entry of `family`, and how many dump messages could not be parsed.
    pub fn dump(&mut self, family: IpFamily) -> Result<(Vec<ConntrackEntry>, usize), NetlinkError> {
        let dumped = self.with_socket(|sock, seq| dump_on(sock, seq, family, |_| true))?;
        Ok((dumped.kept, dumped.unparsed))
    }

    /// Deletes `entries` (by original tuple, zone and id): `(deleted, vanished)`,
    /// where vanished ones were already gone.
    pub fn delete_entries(
        &mut self,
        entries: &[ConntrackEntry],
    ) -> Result<(usize, usize), NetlinkError> {
        self.with_socket(|sock, seq| delete_on(sock, seq, entries))
    }

    /// Runs `op` on the (possibly new) socket; an error closes it, so the next call
    /// starts clean (no stale replies in its queue).
    fn with_socket<T>(
        &mut self,
        op: impl FnOnce(&Socket, &mut u32) -> Result<T, NetlinkError>,
    ) -> Result<T, NetlinkError> {
        if self.socket.is_none() {
            self.socket = Some(open_socket(self.netns.as_deref(), self.timeout)?);
        }
        let sock = self.socket.as_ref().expect("opened above");
        let result = op(sock, &mut self.seq);
        if result.is_err() {
            self.socket = None;
        }
        result
    }
}

impl NetlinkConntrack {
    /// Dumps `family`'s table, deletes the entries `doomed` picks, and adds what it
    /// did to `stats`. Entries are matched while the dump streams in: a table of a
    /// million entries is never held in memory, only what is to be deleted.
    fn clean_family(
        &mut self,
        family: IpFamily,
        doomed: impl Fn(&ConntrackEntry) -> bool,
        stats: &mut CleanupStats,
    ) -> Result<(), NetlinkError> {
        let start = Instant::now();
        let dumped = self.with_socket(|sock, seq| dump_on(sock, seq, family, &doomed))?;
        stats.scanned += dumped.scanned;
        stats.unparsed += dumped.unparsed;
        let mut deleted = 0;
        if !dumped.kept.is_empty() {
            let vanished;
            (deleted, vanished) = self.delete_entries(&dumped.kept)?;
            stats.deleted += deleted;
            stats.vanished += vanished;
        }
        stats.families.insert(
            family,
            FamilyCleanup {
                deleted,
                duration: start.elapsed(),
            },
        );
        Ok(())
    }
}

impl ConntrackCleaner for NetlinkConntrack {
    fn delete(&mut self, filters: &[ConntrackFilter]) -> Result<CleanupStats, NetlinkError> {
        let mut stats = CleanupStats::default();
        for family in IpFamily::BOTH {
            let mine: Vec<&ConntrackFilter> =
                filters.iter().filter(|f| f.family == family).collect();
            if !mine.is_empty() {
                self.clean_family(family, |e| mine.iter().any(|f| f.matches(e)), &mut stats)?;
            }
        }
        Ok(stats)
    }

    fn delete_stale(&mut self, stale: &StaleUdpFlows) -> Result<CleanupStats, NetlinkError> {
        let mut stats = CleanupStats::default();
        for family in stale.families() {
            self.clean_family(family, |e| stale.is_stale(e), &mut stats)?;
        }
        Ok(stats)
    }
}

/// `IPCTNL_MSG_CT_GET` dump of one family.
pub(crate) fn dump_request(seq: u32, family: IpFamily) -> Vec<u8> {
    encode(
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        family,
        ConntrackMessage::Get(vec![]),
    )
}

/// `IPCTNL_MSG_CT_DELETE` of exactly `entry`: its original tuple, zone and id.
pub(crate) fn delete_request(seq: u32, entry: &ConntrackEntry) -> Vec<u8> {
    let mut proto = vec![ProtoTuple::Protocol(CtProtocol::from(entry.protocol))];
    if let (Some(s), Some(d)) = (entry.orig_sport, entry.orig_dport) {
        proto.push(ProtoTuple::SourcePort(s));
        proto.push(ProtoTuple::DestinationPort(d));
    }
    let mut attrs = vec![ConntrackAttribute::CtaTupleOrig(vec![
        Tuple::Ip(vec![
            IPTuple::SourceAddress(entry.orig_src),
            IPTuple::DestinationAddress(entry.orig_dst),
        ]),
        Tuple::Proto(proto),
    ])];
    if entry.zone != 0 {
        attrs.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ZONE,
            entry.zone.to_be_bytes().to_vec(),
        )));
    }
    if let Some(id) = entry.id {
        attrs.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ID,
            id.to_be_bytes().to_vec(),
        )));
    }
    encode(
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        entry.family,
        ConntrackMessage::Delete(attrs),
    )
}

/// What one netlink message of a reply said.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A conntrack entry (dump part).
    Entry(ConntrackEntry),
    /// A message that did not parse, or an entry without the fields cleanup needs.
    Unparsed,
    /// The end of a dump.
    Done,
    /// An acknowledgement: `0` for success, else a negative errno.
    Ack(i32),
    /// Anything else (other subsystems, no-ops): ignored.
    Other,
}

/// [`split_datagram`], each message read as a ctnetlink [`Reply`].
pub(crate) fn parse_datagram(buf: &[u8]) -> Result<Vec<(u32, Reply)>, NetlinkError> {
    Ok(split_datagram(buf)?
        .into_iter()
        .map(|(seq, msg)| (seq, parse_message(msg)))
        .collect())
}

fn parse_message(msg: &[u8]) -> Reply {
    let Ok(parsed) = NetlinkMessage::<NetfilterMessage>::deserialize(msg) else {
        return Reply::Unparsed;
    };
    match parsed.payload {
        NetlinkPayload::Done(_) => Reply::Done,
        NetlinkPayload::Error(e) => Reply::Ack(e.raw_code()),
        NetlinkPayload::InnerMessage(nf) => {
            let NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)) = &nf.inner else {
                return Reply::Other;
            };
            let family = match u8::from(nf.header.family) {
                AF_INET => IpFamily::V4,
                AF_INET6 => IpFamily::V6,
                _ => return Reply::Unparsed,
            };
            entry_from_attrs(family, attrs).map_or(Reply::Unparsed, Reply::Entry)
        }
        _ => Reply::Other,
    }
}

#[derive(Default)]
struct TupleFields {
    src: Option<std::net::IpAddr>,
    dst: Option<std::net::IpAddr>,
    proto: Option<u8>,
    sport: Option<u16>,
    dport: Option<u16>,
}

fn tuple_fields(tuples: &[Tuple]) -> TupleFields {
    let mut t = TupleFields::default();
    for tuple in tuples {
        match tuple {
            Tuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(a) => t.src = Some(*a),
                        IPTuple::DestinationAddress(a) => t.dst = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(protos) => {
                for p in protos {
                    match p {
                        ProtoTuple::Protocol(n) => t.proto = Some(u8::from(*n)),
                        ProtoTuple::SourcePort(n) => t.sport = Some(*n),
                        ProtoTuple::DestinationPort(n) => t.dport = Some(*n),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    t
}

fn default_nla_bytes(nla: &DefaultNla) -> Vec<u8> {
    let mut v = vec![0; nla.value_len()];
    nla.emit_value(&mut v);
    v
}

/// The entry an `IPCTNL_MSG_CT_NEW` (dump part) describes; `None` when a tuple lacks
/// an address or the protocol, or the addresses are not of `family`.
fn entry_from_attrs(family: IpFamily, attrs: &[ConntrackAttribute]) -> Option<ConntrackEntry> {
    let (mut orig, mut reply) = (None, None);
    let (mut status, mut zone, mut id) = (0, 0, None);
    for attr in attrs {
        match attr {
            ConntrackAttribute::CtaTupleOrig(t) => orig = Some(tuple_fields(t)),
            ConntrackAttribute::CtaTupleReply(t) => reply = Some(tuple_fields(t)),
            ConntrackAttribute::CtaStatus(s) => status = s.bits(),
            ConntrackAttribute::Other(nla) if nla.kind() == CTA_ZONE => {
                if let Ok(b) = <[u8; 2]>::try_from(default_nla_bytes(nla).as_slice()) {
                    zone = u16::from_be_bytes(b);
                }
            }
            ConntrackAttribute::Other(nla) if nla.kind() == CTA_ID => {
                if let Ok(b) = <[u8; 4]>::try_from(default_nla_bytes(nla).as_slice()) {
                    id = Some(u32::from_be_bytes(b));
                }
            }
            _ => {}
        }
    }
    let (orig, reply) = (orig?, reply?);
    let entry = ConntrackEntry {
        family,
        protocol: orig.proto?,
        orig_src: orig.src?,
        orig_dst: orig.dst?,
        orig_sport: orig.sport,
        orig_dport: orig.dport,
        reply_src: reply.src?,
        reply_dst: reply.dst?,
        reply_sport: reply.sport,
        reply_dport: reply.dport,
        status,
        zone,
        id,
    };
    let ips = [
        entry.orig_src,
        entry.orig_dst,
        entry.reply_src,
        entry.reply_dst,
    ];
    ips.iter()
        .all(|ip| IpFamily::of(ip) == family)
        .then_some(entry)
}

/// What one dump found.
struct Dumped {
    /// The entries `keep` accepted.
    kept: Vec<ConntrackEntry>,
    /// Entries of the family seen.
    scanned: usize,
    /// Messages that did not parse.
    unparsed: usize,
}

fn dump_on(
    sock: &Socket,
    seq: &mut u32,
    family: IpFamily,
    keep: impl Fn(&ConntrackEntry) -> bool,
) -> Result<Dumped, NetlinkError> {
    let seq = next_seq(seq);
    send_request(sock, &dump_request(seq, family), "the dump request")?;
    let mut buf = Vec::with_capacity(RECV_BUFFER);
    let mut out = Dumped {
        kept: Vec::new(),
        scanned: 0,
        unparsed: 0,
    };
    loop {
        recv_datagram(sock, &mut buf)?;
        for (s, reply) in parse_datagram(&buf)? {
            if s != seq {
                continue;
            }
            match reply {
                Reply::Entry(e) if e.family == family => {
                    out.scanned += 1;
                    if keep(&e) {
                        out.kept.push(e);
                    }
                }
                Reply::Entry(_) | Reply::Other => {}
                Reply::Unparsed => out.unparsed += 1,
                Reply::Done => return Ok(out),
                Reply::Ack(0) => {}
                Reply::Ack(code) => {
                    return Err(NetlinkError::Kernel {
                        context: format!("dumping the {family} table"),
                        source: io::Error::from_raw_os_error(code.saturating_abs()),
                    })
                }
            }
        }
    }
}

fn delete_on(
    sock: &Socket,
    seq: &mut u32,
    entries: &[ConntrackEntry],
) -> Result<(usize, usize), NetlinkError> {
    let (mut deleted, mut vanished) = (0, 0);
    let mut first_error: Option<NetlinkError> = None;
    let mut buf = Vec::with_capacity(RECV_BUFFER);
    for batch in entries.chunks(DELETE_BATCH) {
        let mut pending = std::collections::BTreeMap::new();
        let mut out = Vec::new();
        for entry in batch {
            let s = next_seq(seq);
            out.extend(delete_request(s, entry));
            pending.insert(s, entry);
        }
        send_request(sock, &out, "delete requests")?;
        while !pending.is_empty() {
            recv_datagram(sock, &mut buf)?;
            for (s, reply) in parse_datagram(&buf)? {
                let Reply::Ack(code) = reply else { continue };
                let Some(entry) = pending.remove(&s) else {
                    continue;
                };
                match code {
                    0 => deleted += 1,
                    c if c == -ENOENT => vanished += 1,
                    c => {
                        let source = io::Error::from_raw_os_error(c.saturating_abs());
                        tracing::warn!(?entry, error = %source, "cannot delete conntrack entry");
                        first_error.get_or_insert(NetlinkError::Kernel {
                            context: format!(
                                "deleting {} {}:{} -> {}:{}",
                                entry.protocol,
                                entry.orig_src,
                                entry.orig_sport.unwrap_or(0),
                                entry.orig_dst,
                                entry.orig_dport.unwrap_or(0)
                            ),
                            source,
                        });
                    }
                }
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok((deleted, vanished)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::netfilter::NLMSG_HEADER;
    use netlink_packet_core::{Emitable, NLMSG_DONE, NLMSG_ERROR};

    fn ip(s: &str) -> std::net::IpAddr {
        s.parse().unwrap()
    }

    fn udp_entry() -> ConntrackEntry {
        ConntrackEntry {
            family: IpFamily::V4,
            protocol: 17,
            orig_src: ip("198.18.1.20"),
            orig_dst: ip("198.19.0.10"),
            orig_sport: Some(40000),
            orig_dport: Some(53),
            reply_src: ip("198.18.2.10"),
            reply_dst: ip("198.18.1.20"),
            reply_sport: Some(8080),
            reply_dport: Some(40000),
            status: 0x1ae,
            zone: 7,
            id: Some(0xdead_beef),
        }
    }

    /// A dump part for `e`, as the kernel sends it (type `IPCTNL_MSG_CT_NEW`).
    fn dump_part(seq: u32, e: &ConntrackEntry, extra: Vec<ConntrackAttribute>) -> Vec<u8> {
        let tuple = |src, dst, sport, dport| {
            vec![
                Tuple::Ip(vec![
                    IPTuple::SourceAddress(src),
                    IPTuple::DestinationAddress(dst),
                ]),
                Tuple::Proto(vec![
                    ProtoTuple::Protocol(CtProtocol::from(e.protocol)),
                    ProtoTuple::SourcePort(sport),
                    ProtoTuple::DestinationPort(dport),
                ]),
            ]
        };
        let mut attrs = vec![
            ConntrackAttribute::CtaTupleOrig(tuple(
                e.orig_src,
                e.orig_dst,
                e.orig_sport.unwrap(),
                e.orig_dport.unwrap(),
            )),
            ConntrackAttribute::CtaTupleReply(tuple(
                e.reply_src,
                e.reply_dst,
                e.reply_sport.unwrap(),
                e.reply_dport.unwrap(),
            )),
            ConntrackAttribute::CtaStatus(
                netlink_packet_netfilter::conntrack::Status::from_bits_retain(e.status),
            ),
            ConntrackAttribute::Other(DefaultNla::new(CTA_ZONE, e.zone.to_be_bytes().to_vec())),
            ConntrackAttribute::Other(DefaultNla::new(
                CTA_ID,
                e.id.unwrap().to_be_bytes().to_vec(),
            )),
        ];
        attrs.extend(extra);
        let mut flags = NLM_F_REQUEST;
        flags |= 2; // NLM_F_MULTIPART
        encode(flags, seq, e.family, ConntrackMessage::New(attrs))
    }

    fn control(kind: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let len = NLMSG_HEADER + body.len();
        let mut v = Vec::new();
        v.extend((len as u32).to_ne_bytes());
        v.extend(kind.to_ne_bytes());
        v.extend(0u16.to_ne_bytes());
        v.extend(seq.to_ne_bytes());
        v.extend(0u32.to_ne_bytes());
        v.extend(body);
        v
    }

    #[test]
    fn a_dump_request_is_a_ctnetlink_get_with_the_family() {
        let req = dump_request(9, IpFamily::V6);
        // nlmsghdr: length, type (subsys 1 << 8 | IPCTNL_MSG_CT_GET), flags, seq, pid.
        assert_eq!(
            u32::from_ne_bytes(req[0..4].try_into().unwrap()) as usize,
            req.len()
        );
        assert_eq!(u16::from_ne_bytes(req[4..6].try_into().unwrap()), 0x0101);
        assert_eq!(
            u16::from_ne_bytes(req[6..8].try_into().unwrap()),
            NLM_F_REQUEST | NLM_F_DUMP
        );
        assert_eq!(u32::from_ne_bytes(req[8..12].try_into().unwrap()), 9);
        // nfgenmsg: family AF_INET6, version 0, res_id 0.
        assert_eq!(&req[16..20], &[AF_INET6, 0, 0, 0]);
        assert_eq!(req.len(), 20);
    }

    #[test]
    fn a_delete_names_the_original_tuple_zone_and_id_big_endian() {
        let e = udp_entry();
        let req = delete_request(3, &e);
        assert_eq!(u16::from_ne_bytes(req[4..6].try_into().unwrap()), 0x0102);
        assert_eq!(
            u16::from_ne_bytes(req[6..8].try_into().unwrap()),
            NLM_F_REQUEST | NLM_F_ACK
        );
        assert_eq!(req[16], AF_INET);
        let hex: String = req[20..].iter().map(|b| format!("{b:02x}")).collect();
        let want = concat!(
            "3400", "0180", // CTA_TUPLE_ORIG, nested, 52 bytes
            "1400", "0180", // CTA_TUPLE_IP, nested
            "0800", "0100", "c6120114", // CTA_IP_V4_SRC 198.18.1.20
            "0800", "0200", "c613000a", // CTA_IP_V4_DST 198.19.0.10
            "1c00", "0280", // CTA_TUPLE_PROTO, nested
            "0500", "0100", "11000000", // CTA_PROTO_NUM 17 (padded)
            "0600", "0200", "9c400000", // CTA_PROTO_SRC_PORT 40000, big-endian
            "0600", "0300", "00350000", // CTA_PROTO_DST_PORT 53
            "0600", "1200", "00070000", // CTA_ZONE 7
            "0800", "0c00", "deadbeef", // CTA_ID
        );
        assert_eq!(hex, want);
        // No zone, no id: neither attribute.
        let plain = ConntrackEntry {
            zone: 0,
            id: None,
            ..udp_entry()
        };
        assert_eq!(delete_request(3, &plain).len(), req.len() - 16);
    }

    #[test]
    fn a_dump_datagram_parses_into_entries_done_and_acks() {
        let e = udp_entry();
        let mut v6 = udp_entry();
        v6.family = IpFamily::V6;
        v6.orig_src = ip("2001:db8:1::20");
        v6.orig_dst = ip("2001:db8:ffff::10");
        v6.reply_src = ip("2001:db8:2::10");
        v6.reply_dst = ip("2001:db8:1::20");
        let mut dgram = dump_part(5, &e, vec![]);
        dgram.extend(dump_part(5, &v6, vec![]));
        let mut err = (-ENOENT).to_ne_bytes().to_vec();
        err.extend(control(1, 4, &[])); // the echoed request header
        dgram.extend(control(NLMSG_ERROR, 4, &err));
        dgram.extend(control(NLMSG_DONE, 5, &0i32.to_ne_bytes()));
        let got = parse_datagram(&dgram).unwrap();
        assert_eq!(
            got,
            [
                (5, Reply::Entry(e)),
                (5, Reply::Entry(v6)),
                (4, Reply::Ack(-ENOENT)),
                (5, Reply::Done)
            ]
        );
    }

    #[test]
    fn unknown_attributes_are_ignored_and_bad_ones_skip_the_entry() {
        let e = udp_entry();
        // An attribute kind nobody knows, with odd-sized payload: still the entry.
        let unknown = ConntrackAttribute::Other(DefaultNla::new(250, vec![1, 2, 3]));
        let got = parse_datagram(&dump_part(1, &e, vec![unknown])).unwrap();
        assert_eq!(got, [(1, Reply::Entry(e.clone()))]);
        // A zone of the wrong size is ignored (zone 0 is then assumed).
        let mut part = dump_part(1, &e, vec![]);
        let zone_at = part
            .windows(4)
            .position(|w| w == [6, 0, 18, 0])
            .expect("zone attribute");
        part[zone_at + 2] = 250; // now an unknown kind; the entry still parses
        let got = parse_datagram(&part).unwrap();
        assert!(matches!(&got[0].1, Reply::Entry(x) if x.zone == 0));
        // A tuple with a 5-byte address: the message does not parse, the entry is
        // skipped, and the datagram goes on.
        let mut bad = dump_part(1, &e, vec![]);
        let at = bad
            .windows(4)
            .position(|w| w == [8, 0, 1, 0])
            .expect("v4 src attribute");
        bad[at] = 9;
        let mut dgram = bad;
        dgram.extend(dump_part(1, &e, vec![]));
        let got = parse_datagram(&dgram);
        // The bad length shifts everything after it: either the first is unparsed
        // and the second is found, or the datagram is rejected — never a panic and
        // never a made-up entry.
        if let Ok(got) = got {
            assert!(got.iter().all(|(_, r)| match r {
                Reply::Entry(x) => *x == e,
                _ => true,
            }));
        }
    }

    #[test]
    fn an_entry_without_a_reply_tuple_is_not_an_entry() {
        let e = udp_entry();
        let mut part = dump_part(1, &e, vec![]);
        // Turn CTA_TUPLE_REPLY (2 | NLA_F_NESTED) into an unknown nested kind.
        let at = part
            .windows(4)
            .position(|w| w == [0x34, 0, 2, 0x80])
            .expect("reply tuple");
        part[at + 2] = 200;
        assert_eq!(parse_datagram(&part).unwrap(), [(1, Reply::Unparsed)]);
    }

    #[test]
    fn hostile_bytes_never_panic() {
        let e = udp_entry();
        let mut good = dump_part(1, &e, vec![]);
        good.extend(control(NLMSG_DONE, 1, &0i32.to_ne_bytes()));
        // Every truncation, and every single-byte corruption of a real datagram.
        for cut in 0..good.len() {
            let _ = parse_datagram(&good[..cut]);
        }
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for i in 0..good.len() {
            for _ in 0..8 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let mut bad = good.clone();
                bad[i] = rng as u8;
                let _ = parse_datagram(&bad);
            }
        }
        // Pure noise.
        for n in 0..2000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let len = (rng % 300) as usize;
            let mut noise: Vec<u8> = (0..len)
                .map(|k| (rng.rotate_left(k as u32 % 64) >> (n % 7)) as u8)
                .collect();
            if noise.len() >= 4 {
                noise[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
            }
            let _ = parse_datagram(&noise);
        }
    }

    #[test]
    fn a_length_past_the_end_is_an_error() {
        let mut d = control(NLMSG_DONE, 1, &0i32.to_ne_bytes());
        d[0] = 200;
        assert!(parse_datagram(&d).is_err());
        assert!(parse_datagram(&[1, 2, 3]).is_err());
        assert_eq!(parse_datagram(&[]).unwrap(), []);
    }

    #[test]
    fn emitted_delete_round_trips_through_the_parser() {
        // The delete's payload is a valid ctnetlink message the crate parses back.
        let e = udp_entry();
        let req = delete_request(1, &e);
        let msg = NetlinkMessage::<NetfilterMessage>::deserialize(&req).unwrap();
        let NetlinkPayload::InnerMessage(nf) = msg.payload else {
            panic!("not a netfilter message");
        };
        let NetfilterMessageInner::Conntrack(ConntrackMessage::Delete(attrs)) = nf.inner else {
            panic!("not a delete");
        };
        assert_eq!(attrs.len(), 3);
        assert_eq!(attrs[0].buffer_len(), 52);
    }
}
