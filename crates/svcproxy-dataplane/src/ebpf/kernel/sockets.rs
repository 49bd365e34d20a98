//! Connected UDP sockets that follow their endpoints: the sockets the socket
//! programs translated at connect() to an endpoint their service no longer
//! reaches are destroyed, as conntrack's stale entries are deleted in the kernel
//! modes (the DNS black hole of upstream's UDP cleanup).
//!
//! How: the socket programs keep each connected UDP socket's translation by
//! socket cookie (`svcproxy_udpsock`, a copy of its `svcproxy_peer` storage,
//! deleted when the socket is released). The translations the sync's stale set
//! ([`StaleUdp`], the conntrack cleanup's own decision) calls stale are picked
//! from it, each shown as the conntrack entry its flow would be; with none,
//! nothing else is done. Else `sock_diag` (`NETLINK_SOCK_DIAG`) lists the
//! connected UDP sockets (state `TCP_ESTABLISHED`) with their cookies, and those
//! still connected to the stale endpoint are destroyed with `SOCK_DESTROY`
//! (`CONFIG_INET_DIAG_DESTROY`): the next call fails with `ECONNABORTED`, and the
//! socket is no longer connected. (sock_diag reports a socket's BPF storage for
//! TCP only: hence the map.)
//!
//! Where: a listing sees one network namespace. The data plane's own is looked
//! at first; the pods' (every namespace named in `/run/netns` and every
//! process's in `/proc`) then, while stale sockets remain unfound, only with
//! `CAP_SYS_ADMIN`, which entering one needs (`setns(2)`), and not with
//! `--ebpf-host-namespace-only` (pods' sockets are not translated then).
//!
//! Why not `bpf_sock_destroy` from a socket iterator (Cilium's way): the loader
//! cannot call kfuncs, and an iterator is a tracing program, which this kernel
//! does not offer; an iterator also sees one namespace.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use netlink_sys::protocols::NETLINK_SOCK_DIAG;
use netlink_sys::{Socket, SocketAddr};
use svcproxy_core::model::IpFamily;

use crate::ebpf::wire;
use crate::kernel::conntrack::{ConntrackEntry, StaleUdp, IPS_DST_NAT};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const IPPROTO_UDP: u8 = 17;
/// A connected UDP socket's state.
const TCP_ESTABLISHED: u32 = 1;

const NLMSG_HEADER: usize = 16;
/// `struct inet_diag_sockid`: ports, addresses, interface, cookie.
const SOCKID: usize = 48;
/// `struct inet_diag_req_v2`: family, protocol, ext, pad, states, the id.
const REQ: usize = 8 + SOCKID;
/// `struct inet_diag_msg`: family, state, timer, retrans, the id, then five u32.
const MSG: usize = 4 + SOCKID + 20;

/// A connected socket's translation, from its `svcproxy_peer` storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub family: IpFamily,
    pub service: std::net::SocketAddr,
    pub endpoint: std::net::SocketAddr,
}

impl Peer {
    /// A translation as sock.c keeps it; `None` for a socket that holds none
    /// (connected again untranslated: port 0).
    pub fn of(p: &wire::SockPeer) -> Option<Peer> {
        let family = match p.family {
            wire::FAMILY_V4 => IpFamily::V4,
            wire::FAMILY_V6 => IpFamily::V6,
            _ => return None,
        };
        if p.beport == 0 {
            return None;
        }
        Some(Peer {
            family,
            service: std::net::SocketAddr::new(
                wire::addr_of(p.vip, p.family)?,
                wire::port_of(p.vport),
            ),
            endpoint: std::net::SocketAddr::new(
                wire::addr_of(p.be, p.family)?,
                wire::port_of(p.beport),
            ),
        })
    }

    /// The conntrack entry this socket's flow would be in the kernel modes: to
    /// the service address, answered by the endpoint, DNATed.
    pub fn as_entry(&self, local: std::net::IpAddr) -> ConntrackEntry {
        ConntrackEntry {
            family: self.family,
            protocol: IPPROTO_UDP,
            orig_src: local,
            orig_dst: self.service.ip(),
            orig_sport: None,
            orig_dport: Some(self.service.port()),
            reply_src: self.endpoint.ip(),
            reply_dst: local,
            reply_sport: Some(self.endpoint.port()),
            reply_dport: None,
            status: IPS_DST_NAT,
            zone: 0,
            id: None,
        }
    }
}

/// One socket of a listing: its family (the socket's, `AF_INET*`) and its id as
/// the kernel gave it (a destroy names it so, cookie included).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Diag {
    family: u8,
    id: [u8; SOCKID],
}

impl Diag {
    fn cookie(&self) -> u64 {
        let word = |at: usize| {
            u64::from(u32::from_ne_bytes(
                self.id[at..at + 4].try_into().expect("4"),
            ))
        };
        word(40) | word(44) << 32
    }

    /// The socket's remote address and port (an IPv4-mapped one as IPv4).
    fn remote(&self) -> std::net::SocketAddr {
        let port = u16::from_be_bytes([self.id[2], self.id[3]]);
        let addr: [u8; 16] = self.id[20..36].try_into().expect("16");
        let ip = if self.family == AF_INET {
            std::net::IpAddr::from([addr[0], addr[1], addr[2], addr[3]])
        } else {
            let v6 = std::net::Ipv6Addr::from(addr);
            v6.to_ipv4_mapped()
                .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4)
        };
        std::net::SocketAddr::new(ip, port)
    }
}

/// The translations of `entries` (the cookie map's) that `stale` calls stale.
fn stale_peers(
    entries: impl Iterator<Item = (u64, wire::SockPeer)>,
    stale: &StaleUdp<'_>,
) -> HashMap<u64, Peer> {
    let any = std::net::IpAddr::from([0u8, 0, 0, 0]);
    entries
        .filter_map(|(cookie, p)| Some((cookie, Peer::of(&p)?)))
        .filter(|(_, p)| stale.is_stale(&p.as_entry(any)))
        .collect()
}

/// The sockets of a listing to destroy: those whose cookie `doomed` holds,
/// still connected to the endpoint it names.
fn to_destroy(sockets: Vec<Diag>, doomed: &HashMap<u64, Peer>) -> Vec<Diag> {
    sockets
        .into_iter()
        .filter(|d| {
            doomed
                .get(&d.cookie())
                .is_some_and(|p| d.remote() == p.endpoint)
        })
        .collect()
}

fn header(out: &mut Vec<u8>, kind: u16, flags: u16, seq: u32) {
    out.extend_from_slice(&0u32.to_ne_bytes()); // length, set at the end
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
}

fn finish(mut out: Vec<u8>) -> Vec<u8> {
    let len = u32::try_from(out.len()).expect("a short request");
    out[..4].copy_from_slice(&len.to_ne_bytes());
    out
}

fn request(out: &mut Vec<u8>, family: u8, states: u32, id: &[u8; SOCKID]) {
    out.extend_from_slice(&[family, IPPROTO_UDP, 0, 0]);
    out.extend_from_slice(&states.to_ne_bytes());
    out.extend_from_slice(id);
}

/// A listing of `family`'s connected UDP sockets.
fn dump_request(family: u8, seq: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(NLMSG_HEADER + REQ);
    header(
        &mut out,
        SOCK_DIAG_BY_FAMILY,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
    );
    request(&mut out, family, 1 << TCP_ESTABLISHED, &[0; SOCKID]);
    finish(out)
}

/// `SOCK_DESTROY` of the socket `id` names (its cookie included: a socket that
/// reused the tuple since the dump is not the one destroyed).
fn destroy_request(family: u8, id: &[u8; SOCKID], seq: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(NLMSG_HEADER + REQ);
    header(&mut out, SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, seq);
    request(&mut out, family, u32::MAX, id);
    finish(out)
}

/// What one message of a dump says: a socket, the end, or the kernel's error.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Socket(Box<Diag>),
    Done,
    Error(i32),
    Other,
}

fn parse_message(msg: &[u8]) -> Reply {
    let kind = u16::from_ne_bytes([msg[4], msg[5]]);
    let body = &msg[NLMSG_HEADER.min(msg.len())..];
    match kind {
        NLMSG_DONE => Reply::Done,
        NLMSG_ERROR if body.len() >= 4 => {
            Reply::Error(i32::from_ne_bytes(body[..4].try_into().expect("4")))
        }
        SOCK_DIAG_BY_FAMILY if body.len() >= MSG => Reply::Socket(Box::new(Diag {
            family: body[0],
            id: body[4..4 + SOCKID].try_into().expect("48"),
        })),
        _ => Reply::Other,
    }
}

fn io(context: &str, e: impl std::fmt::Display) -> String {
    format!("{context}: {e}")
}

/// A sock_diag socket in the calling thread's network namespace.
fn open() -> Result<Socket, String> {
    let mut sock = Socket::new(NETLINK_SOCK_DIAG).map_err(|e| io("a sock_diag socket", e))?;
    sock.bind_auto().map_err(|e| io("binding sock_diag", e))?;
    sock.connect(&SocketAddr::new(0, 0))
        .map_err(|e| io("connecting sock_diag", e))?;
    rustix::net::sockopt::set_socket_timeout(
        &sock,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_secs(2)),
    )
    .map_err(|e| io("sock_diag's receive timeout", e))?;
    Ok(sock)
}

/// The replies to one request, until its end (a dump's `NLMSG_DONE`, an ack).
fn exchange(sock: &Socket, req: &[u8], dump: bool) -> Result<Vec<Reply>, String> {
    sock.send(req, 0)
        .map_err(|e| io("sending to sock_diag", e))?;
    let mut out = Vec::new();
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        buf.clear();
        sock.recv(&mut buf, 0)
            .map_err(|e| io("receiving from sock_diag", e))?;
        let messages = crate::kernel::netfilter::split_datagram(&buf).map_err(|e| e.to_string())?;
        for (_, msg) in messages {
            match parse_message(msg) {
                Reply::Done => return Ok(out),
                // An ack (error 0), or the kernel's refusal: the end of this request.
                r @ Reply::Error(_) => {
                    out.push(r);
                    return Ok(out);
                }
                Reply::Other => {}
                r => {
                    out.push(r);
                    if !dump {
                        return Ok(out);
                    }
                }
            }
        }
    }
}

/// Destroys the sockets of the calling thread's namespace that `doomed` names
/// (those destroyed, or closed meanwhile, are taken out of it): how many were
/// destroyed.
fn close_here(doomed: &mut HashMap<u64, Peer>) -> Result<usize, String> {
    let sock = open()?;
    let mut closed = 0;
    let mut seq = 0u32;
    for family in [AF_INET, AF_INET6] {
        seq += 1;
        let mut sockets = Vec::new();
        for r in exchange(&sock, &dump_request(family, seq), true)? {
            match r {
                Reply::Socket(d) => sockets.push(*d),
                // A kernel without IPv6 has no AF_INET6 sockets to list.
                Reply::Error(e) if e < 0 && family == AF_INET6 => {}
                Reply::Error(e) if e < 0 => {
                    return Err(io(
                        "listing connected UDP sockets",
                        std::io::Error::from_raw_os_error(-e),
                    ))
                }
                _ => {}
            }
        }
        for d in to_destroy(sockets, doomed) {
            seq += 1;
            match exchange(&sock, &destroy_request(d.family, &d.id, seq), false)?.first() {
                Some(Reply::Error(0)) => closed += 1,
                // Closed by its owner since the listing.
                Some(Reply::Error(e)) if -e == libc::ENOENT => {}
                Some(Reply::Error(e)) => {
                    return Err(io(
                        &format!("destroying a UDP socket connected to {}", d.remote()),
                        std::io::Error::from_raw_os_error(-e),
                    ))
                }
                _ => {}
            }
            doomed.remove(&d.cookie());
        }
    }
    Ok(closed)
}

/// The network namespace a path names, as (device, inode).
fn ns_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Every other network namespace this process can name: those in `/run/netns`
/// (where container runtimes keep pods'), then each process's, once each.
fn other_namespaces() -> Vec<PathBuf> {
    let own = ns_id(Path::new("/proc/thread-self/ns/net"));
    let mut seen = std::collections::BTreeSet::new();
    seen.extend(own);
    let named = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path());
    let procs = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .map(|e| e.path().join("ns/net"));
    named
        .chain(procs)
        .filter(|p| ns_id(p).is_some_and(|id| seen.insert(id)))
        .collect()
}

/// [`close_here`] inside the namespace at `path`, from a throwaway thread
/// (setns(2) moves only the calling thread).
fn close_in(path: &Path, doomed: &mut HashMap<u64, Peer>) -> Result<usize, String> {
    let ns = File::open(path).map_err(|e| io(&format!("opening {}", path.display()), e))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .map_err(|e| io(&format!("entering {}", path.display()), e))?;
            close_here(doomed)
        })
        .join()
        .unwrap_or_else(|_| Err("the namespace thread panicked".into()))
    })
}

/// Whether this process may enter other network namespaces: `CAP_SYS_ADMIN`
/// (21) among its effective capabilities.
pub fn may_enter_namespaces() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 21) != 0)
}

/// Destroys every connected UDP socket whose translation (in the cookie map
/// `svcproxy_udpsock` of `pin_dir`) `stale` calls stale: in this thread's network
/// namespace, and with `others`, in every other one this process can name, until
/// none is left to find. A namespace that cannot be entered or listed (gone since
/// it was named) is skipped; this namespace's failure is the error. Returns how
/// many were destroyed.
pub fn close_stale(pin_dir: &Path, stale: &StaleUdp<'_>, others: bool) -> Result<usize, String> {
    let map: aya::maps::HashMap<aya::maps::MapData, u64, wire::SockPeer> =
        super::maps::open_pinned(pin_dir, "svcproxy_udpsock").map_err(|e| e.to_string())?;
    let mut doomed = stale_peers(map.iter().filter_map(Result::ok), stale);
    if doomed.is_empty() {
        return Ok(0);
    }
    let mut closed = close_here(&mut doomed)?;
    if others {
        for path in other_namespaces() {
            if doomed.is_empty() {
                break;
            }
            match close_in(&path, &mut doomed) {
                Ok(n) => closed += n,
                Err(e) => {
                    tracing::debug!(error = %e, "connected UDP sockets of a namespace not looked at")
                }
            }
        }
    }
    Ok(closed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::conntrack::{ConntrackFilter, StaleUdpFlows};
    use svcproxy_core::model::Protocol;

    fn peer(service: &str, endpoint: &str) -> wire::SockPeer {
        let s: std::net::SocketAddr = service.parse().unwrap();
        let be = wire::Backend::of(endpoint.parse().unwrap());
        wire::SockPeer {
            vip: wire::addr_words(Some(s.ip())),
            vport: wire::port_word(s.port()),
            family: be.family,
            counted: 0,
            be: be.addr,
            beport: be.port,
            pad: 0,
        }
    }

    /// A listing's message for a socket of `family` from `local` to `remote`
    /// with `cookie`.
    fn diag_message(family: u8, local: &str, remote: &str, cookie: u64) -> Vec<u8> {
        let l: std::net::SocketAddr = local.parse().unwrap();
        let r: std::net::SocketAddr = remote.parse().unwrap();
        let octets = |ip: std::net::IpAddr| -> [u8; 16] {
            match ip {
                std::net::IpAddr::V4(a) if family == AF_INET => {
                    let mut o = [0; 16];
                    o[..4].copy_from_slice(&a.octets());
                    o
                }
                std::net::IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
                std::net::IpAddr::V6(a) => a.octets(),
            }
        };
        let mut m = Vec::new();
        header(&mut m, SOCK_DIAG_BY_FAMILY, 2, 7);
        m.extend_from_slice(&[family, 1, 0, 0]);
        m.extend_from_slice(&l.port().to_be_bytes());
        m.extend_from_slice(&r.port().to_be_bytes());
        m.extend_from_slice(&octets(l.ip()));
        m.extend_from_slice(&octets(r.ip()));
        m.extend_from_slice(&[0; 4]); // interface
        m.extend_from_slice(&u32::try_from(cookie & 0xffff_ffff).unwrap().to_ne_bytes());
        m.extend_from_slice(&u32::try_from(cookie >> 32).unwrap().to_ne_bytes());
        m.extend_from_slice(&[0; 20]);
        // INET_DIAG_SKV6ONLY, one byte padded to four: attributes are skipped.
        m.extend_from_slice(&[5, 0, 11, 0, 0, 0, 0, 0]);
        finish(m)
    }

    fn socket(msg: &[u8]) -> Diag {
        match parse_message(msg) {
            Reply::Socket(d) => *d,
            other => panic!("not a socket: {other:?}"),
        }
    }

    fn filter(vip: &str, port: u16, endpoint: Option<&str>) -> ConntrackFilter {
        let e: Option<std::net::SocketAddr> = endpoint.map(|e| e.parse().unwrap());
        let ip: std::net::IpAddr = vip.parse().unwrap();
        ConntrackFilter {
            family: IpFamily::of(&ip),
            protocol: Protocol::Udp,
            orig_dst: Some(ip),
            orig_dport: Some(port),
            reply_src: e.map(|e| e.ip()),
            reply_sport: e.map(|e| e.port()),
            dst_nat: Some(true),
        }
    }

    fn cookies(m: &HashMap<u64, Peer>) -> Vec<u64> {
        let mut v: Vec<u64> = m.keys().copied().collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn the_requests_are_the_kernels_structures() {
        let req = dump_request(AF_INET6, 3);
        assert_eq!(req.len(), NLMSG_HEADER + REQ);
        assert_eq!(
            u32::from_ne_bytes(req[..4].try_into().unwrap()) as usize,
            req.len()
        );
        assert_eq!(u16::from_ne_bytes([req[4], req[5]]), SOCK_DIAG_BY_FAMILY);
        assert_eq!(
            u16::from_ne_bytes([req[6], req[7]]),
            NLM_F_REQUEST | NLM_F_DUMP
        );
        assert_eq!(&req[16..20], &[AF_INET6, IPPROTO_UDP, 0, 0]);
        // Connected sockets only (TCP_ESTABLISHED).
        assert_eq!(u32::from_ne_bytes(req[20..24].try_into().unwrap()), 2);
        let d = destroy_request(AF_INET, &[1; SOCKID], 4);
        assert_eq!(d.len(), NLMSG_HEADER + REQ);
        assert_eq!(u16::from_ne_bytes([d[4], d[5]]), SOCK_DESTROY);
        assert_eq!(u16::from_ne_bytes([d[6], d[7]]), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(&d[24..], &[1; SOCKID]);
    }

    #[test]
    fn a_translation_is_stale_as_its_conntrack_entry_would_be() {
        let entries = || {
            vec![
                (1, peer("198.19.0.10:53", "198.18.1.10:5353")),
                (2, peer("198.19.0.10:53", "198.18.1.11:5353")),
                (3, peer("198.19.0.11:53", "198.18.1.10:5353")),
                (4, peer("[2001:db8:ffff::10]:53", "[2001:db8:1::10]:5353")),
                // Connected again untranslated: no translation.
                (
                    5,
                    wire::SockPeer {
                        beport: 0,
                        ..peer("198.19.0.10:53", "198.18.1.10:5353")
                    },
                ),
            ]
            .into_iter()
        };
        let gone = [filter("198.19.0.10", 53, Some("198.18.1.10:5353"))];
        assert_eq!(
            cookies(&stale_peers(entries(), &StaleUdp::Changed(&gone))),
            [1]
        );
        // The whole port gone (no endpoint left).
        let port = [filter("198.19.0.10", 53, None)];
        assert_eq!(
            cookies(&stale_peers(entries(), &StaleUdp::Changed(&port))),
            [1, 2]
        );
        // Entries not DNATed (a cached REJECT) are no socket's.
        let mut cached = filter("198.19.0.10", 53, None);
        cached.dst_nat = Some(false);
        assert!(stale_peers(entries(), &StaleUdp::Changed(&[cached])).is_empty());
        let gone6 = [filter(
            "2001:db8:ffff::10",
            53,
            Some("[2001:db8:1::10]:5353"),
        )];
        assert_eq!(
            cookies(&stale_peers(entries(), &StaleUdp::Changed(&gone6))),
            [4]
        );
        // The first sync: each frontend's endpoints now; one it does not list is stale.
        let ep = |s: &str| -> (std::net::IpAddr, u16) {
            let a: std::net::SocketAddr = s.parse().unwrap();
            (a.ip(), a.port())
        };
        let mut flows = StaleUdpFlows::default();
        for (vip, eps) in [
            ("198.19.0.10", vec![ep("198.18.1.11:5353")]),
            ("198.19.0.11", vec![ep("198.18.1.10:5353")]),
        ] {
            flows.add_frontend(
                IpFamily::V4,
                Some(vip.parse().unwrap()),
                53,
                eps.into_iter().collect(),
            );
        }
        assert_eq!(
            cookies(&stale_peers(entries(), &StaleUdp::Reconcile(&flows))),
            [1]
        );
    }

    #[test]
    fn only_a_socket_still_connected_where_its_translation_says_is_destroyed() {
        let doomed: HashMap<u64, Peer> = [
            (
                7,
                Peer::of(&peer("198.19.0.10:53", "198.18.1.10:5353")).unwrap(),
            ),
            (
                8,
                Peer::of(&peer("198.19.0.10:53", "198.18.1.10:5353")).unwrap(),
            ),
            (
                9,
                Peer::of(&peer("[2001:db8:ffff::10]:53", "[2001:db8:1::10]:5353")).unwrap(),
            ),
        ]
        .into();
        let sockets = vec![
            socket(&diag_message(
                AF_INET,
                "198.18.0.1:40000",
                "198.18.1.10:5353",
                7,
            )),
            // Connected elsewhere since.
            socket(&diag_message(
                AF_INET,
                "198.18.0.1:40001",
                "198.18.1.12:5353",
                8,
            )),
            // Not a translated socket of ours.
            socket(&diag_message(
                AF_INET,
                "198.18.0.1:40002",
                "198.18.1.10:5353",
                10,
            )),
            // IPv6 throughout; the cookie's high word counts.
            socket(&diag_message(
                AF_INET6,
                "[2001:db8::1]:40003",
                "[2001:db8:1::10]:5353",
                9,
            )),
            socket(&diag_message(
                AF_INET6,
                "[2001:db8::1]:40004",
                "[2001:db8:1::10]:5353",
                9 | 1 << 32,
            )),
        ];
        let chosen: Vec<(u64, u16)> = to_destroy(sockets, &doomed)
            .iter()
            .map(|d| (d.cookie(), d.remote().port()))
            .collect();
        assert_eq!(chosen, [(7, 5353), (9, 5353)]);
        // An IPv6 socket connected to an IPv4 endpoint: its IPv4-mapped peer.
        let mapped = socket(&diag_message(
            AF_INET6,
            "198.18.0.1:40000",
            "198.18.1.10:5353",
            7,
        ));
        assert_eq!(mapped.remote(), "198.18.1.10:5353".parse().unwrap());
        assert_eq!(to_destroy(vec![mapped], &doomed).len(), 1);
    }

    #[test]
    fn a_listings_end_and_the_kernels_errors_are_read() {
        let mut done = Vec::new();
        header(&mut done, NLMSG_DONE, 2, 1);
        done.extend_from_slice(&0i32.to_ne_bytes());
        assert_eq!(parse_message(&finish(done)), Reply::Done);
        let mut err = Vec::new();
        header(&mut err, NLMSG_ERROR, 0, 1);
        err.extend_from_slice(&(-libc::EPERM).to_ne_bytes());
        err.extend_from_slice(&[0; 16]);
        assert_eq!(parse_message(&finish(err)), Reply::Error(-libc::EPERM));
        // A truncated socket message is not a socket.
        let mut short = diag_message(AF_INET, "198.18.0.1:1", "198.18.1.10:2", 1);
        short.truncate(NLMSG_HEADER + MSG - 1);
        assert_eq!(parse_message(&short), Reply::Other);
    }
}
