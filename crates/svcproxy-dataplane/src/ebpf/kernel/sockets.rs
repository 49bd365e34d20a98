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
//! (`CONFIG_INET_DIAG_DESTROY`): a waiting or the next `recv` fails with
//! `ECONNABORTED`, and the socket is no longer connected. (sock_diag reports a
//! socket's BPF storage for TCP only: hence the map.) At a cleanup, the packet
//! path's connections whose clients are this node's sockets are ended the same
//! way ([`end_local_clients`]).
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
const IPPROTO_TCP: u8 = 6;
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

/// A connected UDP socket's translation, as `svcproxy_udpsock` keeps it (a copy
/// of the socket's `svcproxy_peer` storage).
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
    /// the service address, answered by the endpoint, DNATed. (Its client's
    /// address and port are no filter's concern: left unspecified.)
    pub fn as_entry(&self) -> ConntrackEntry {
        let local = match self.family {
            IpFamily::V4 => std::net::IpAddr::from([0u8; 4]),
            IpFamily::V6 => std::net::IpAddr::from([0u8; 16]),
        };
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
    /// The listing's protocol (the reply does not say it).
    proto: u8,
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
        self.address(2, 20)
    }

    /// The socket's local address and port (an IPv4-mapped one as IPv4).
    fn local(&self) -> std::net::SocketAddr {
        self.address(0, 4)
    }

    fn address(&self, port_at: usize, addr_at: usize) -> std::net::SocketAddr {
        let port = u16::from_be_bytes([self.id[port_at], self.id[port_at + 1]]);
        let addr: [u8; 16] = self.id[addr_at..addr_at + 16].try_into().expect("16");
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
    node_address: &dyn Fn(std::net::IpAddr) -> bool,
) -> HashMap<u64, Peer> {
    entries
        .filter_map(|(cookie, p)| Some((cookie, Peer::of(&p)?)))
        .filter(|(_, p)| stale.is_stale_held(&p.as_entry(), node_address))
        .collect()
}

/// The sockets of a listing to destroy: those whose cookie `doomed` holds,
/// still connected to the endpoint it names. Every listed cookie it holds is
/// found: taken out of `peers`, and its translation to be forgotten.
fn pick(sockets: Vec<Diag>, doomed: &mut Doomed) -> Vec<Diag> {
    sockets
        .into_iter()
        .filter(|d| {
            let Some(peer) = doomed.peers.remove(&d.cookie()) else {
                return false;
            };
            doomed.forget.push(d.cookie());
            d.remote() == peer.endpoint
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

fn request(out: &mut Vec<u8>, family: u8, proto: u8, states: u32, id: &[u8; SOCKID]) {
    out.extend_from_slice(&[family, proto, 0, 0]);
    out.extend_from_slice(&states.to_ne_bytes());
    out.extend_from_slice(id);
}

/// A listing of `family`'s `proto` sockets in `states` (a mask of `1 << state`).
fn dump_request(family: u8, proto: u8, states: u32, seq: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(NLMSG_HEADER + REQ);
    header(
        &mut out,
        SOCK_DIAG_BY_FAMILY,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
    );
    request(&mut out, family, proto, states, &[0; SOCKID]);
    finish(out)
}

/// `SOCK_DESTROY` of the socket `id` names (its cookie included: a socket that
/// reused the tuple since the dump is not the one destroyed).
fn destroy_request(d: &Diag, seq: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(NLMSG_HEADER + REQ);
    header(&mut out, SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, seq);
    request(&mut out, d.family, d.proto, u32::MAX, &d.id);
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
        // A dump that failed ends with its error in the end's payload.
        NLMSG_DONE
            if body.len() >= 4 && i32::from_ne_bytes(body[..4].try_into().expect("4")) < 0 =>
        {
            Reply::Error(i32::from_ne_bytes(body[..4].try_into().expect("4")))
        }
        NLMSG_DONE => Reply::Done,
        NLMSG_ERROR if body.len() >= 4 => {
            Reply::Error(i32::from_ne_bytes(body[..4].try_into().expect("4")))
        }
        SOCK_DIAG_BY_FAMILY if body.len() >= MSG => Reply::Socket(Box::new(Diag {
            family: body[0],
            proto: 0,
            id: body[4..4 + SOCKID].try_into().expect("48"),
        })),
        _ => Reply::Other,
    }
}

fn io(context: &str, e: impl std::fmt::Display) -> String {
    format!("{context}: {e}")
}

/// Why sockets could not be listed or destroyed; `permanent` when this kernel
/// or these privileges will never allow it (`EOPNOTSUPP`: no
/// `CONFIG_INET_DIAG_DESTROY`; `ENOENT` from a listing: no diag module for the
/// protocol; `EPERM`).
#[derive(Debug)]
pub struct SockError {
    pub message: String,
    pub permanent: bool,
}

impl std::fmt::Display for SockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<String> for SockError {
    fn from(message: String) -> SockError {
        SockError {
            message,
            permanent: false,
        }
    }
}

/// The kernel's refusal `errno` (positive) while `what`.
fn refused(what: &str, errno: i32) -> SockError {
    SockError {
        message: io(what, std::io::Error::from_raw_os_error(errno)),
        permanent: matches!(errno, libc::EOPNOTSUPP | libc::EPERM | libc::ENOENT),
    }
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
    crate::kernel::netfilter::send_request(sock, req, "a sock_diag request")
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        crate::kernel::netfilter::recv_datagram(sock, &mut buf).map_err(|e| e.to_string())?;
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

/// The `proto` sockets of the calling thread's namespace in `states`, both
/// families (`seq` counts the requests).
fn list(sock: &Socket, proto: u8, states: u32, seq: &mut u32) -> Result<Vec<Diag>, SockError> {
    let mut sockets = Vec::new();
    for family in [AF_INET, AF_INET6] {
        *seq += 1;
        for r in exchange(sock, &dump_request(family, proto, states, *seq), true)? {
            match r {
                Reply::Socket(mut d) => {
                    d.proto = proto;
                    sockets.push(*d);
                }
                // No diag module for the protocol: ENOENT.
                Reply::Error(e) if e < 0 => return Err(refused("listing sockets", -e)),
                _ => {}
            }
        }
    }
    Ok(sockets)
}

/// Destroys the socket `d` names: whether it was (not: closed since the listing).
fn destroy(sock: &Socket, d: &Diag, seq: &mut u32) -> Result<bool, SockError> {
    *seq += 1;
    match exchange(sock, &destroy_request(d, *seq), false)?.first() {
        Some(Reply::Error(0)) => Ok(true),
        Some(Reply::Error(e)) if -e == libc::ENOENT => Ok(false),
        Some(Reply::Error(e)) => Err(refused(
            &format!("destroying the socket connected to {}", d.remote()),
            -*e,
        )),
        _ => Ok(false),
    }
}

/// The stale translations still to find, and what was done of them.
#[derive(Debug, Default)]
struct Doomed {
    peers: HashMap<u64, Peer>,
    /// Cookies to take out of the map: sockets destroyed, or found connected
    /// elsewhere (a socket lives in one namespace: it is not looked for again).
    forget: Vec<u64>,
    destroyed: usize,
}

/// Destroys the connected UDP sockets of the calling thread's namespace that
/// `doomed` names: how many were destroyed.
fn close_here(doomed: &mut Doomed) -> Result<usize, SockError> {
    let sock = open()?;
    let mut seq = 0u32;
    let mut closed = 0;
    let sockets = list(&sock, IPPROTO_UDP, 1 << TCP_ESTABLISHED, &mut seq)?;
    for d in pick(sockets, doomed) {
        if destroy(&sock, &d, &mut seq)? {
            closed += 1;
            doomed.destroyed += 1;
        }
    }
    Ok(closed)
}

/// The network namespace a path names, as (device, inode).
fn ns_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Every other network namespace this process can name: those in `/run/netns`
/// (where container runtimes keep pods'), then each process's, once each, as
/// they are needed.
fn other_namespaces() -> impl Iterator<Item = PathBuf> {
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
        .filter(move |p| ns_id(p).is_some_and(|id| seen.insert(id)))
}

/// `here` run inside the namespace at `path`, from a throwaway thread
/// (setns(2) moves only the calling thread).
fn run_in<S: Send>(
    path: &Path,
    state: &mut S,
    here: &(impl Fn(&mut S, bool) -> Result<usize, SockError> + Sync),
) -> Result<usize, SockError> {
    let ns = File::open(path).map_err(|e| io(&format!("opening {}", path.display()), e))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .map_err(|e| io(&format!("entering {}", path.display()), e))?;
            here(state, false)
        })
        .join()
        .unwrap_or_else(|_| Err(String::from("the namespace thread panicked").into()))
    })
}

/// `here` run in this thread's network namespace (told it is: `true`), then, with
/// `others`, in every other one this process can name while `done` says there is
/// more to do. A
/// namespace that cannot be entered or listed (gone since it was named) is
/// skipped; this namespace's failure is the error. The sum of `here`'s counts.
fn each_namespace<S: Send>(
    state: &mut S,
    others: bool,
    here: impl Fn(&mut S, bool) -> Result<usize, SockError> + Sync,
    done: impl Fn(&S) -> bool,
) -> Result<usize, SockError> {
    let mut n = here(state, true)?;
    if others {
        for path in other_namespaces() {
            if done(state) {
                break;
            }
            match run_in(&path, state, &here) {
                Ok(k) => n += k,
                Err(e) => tracing::debug!(error = %e, "sockets of a namespace not looked at"),
            }
        }
    }
    Ok(n)
}

/// Whether this process may enter other network namespaces: `CAP_SYS_ADMIN`
/// (21) among its effective capabilities.
pub fn may_enter_namespaces() -> bool {
    super::host::has_any_capability(1 << 21)
}

/// What [`close_stale`] did: sockets destroyed, and stale translations whose
/// socket was found nowhere this process can look.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Closed {
    pub destroyed: usize,
    pub unfound: usize,
}

/// Destroys every connected UDP socket whose translation (in the cookie map
/// `svcproxy_udpsock` of `pin_dir`) `stale` calls stale (a NodePort's, only to
/// one of `node_address`): in this thread's network namespace, and with
/// `others`, in every other one this process can name, until none is left to
/// find. The translations of the sockets found are taken out of the map.
pub fn close_stale(
    pin_dir: &Path,
    stale: &StaleUdp<'_>,
    others: bool,
    node_address: &dyn Fn(std::net::IpAddr) -> bool,
) -> Result<Closed, SockError> {
    let mut map: aya::maps::HashMap<aya::maps::MapData, u64, wire::SockPeer> =
        super::maps::open_pinned(pin_dir, "svcproxy_udpsock").map_err(|e| e.to_string())?;
    let mut doomed = Doomed {
        peers: stale_peers(map.iter().filter_map(Result::ok), stale, node_address),
        ..Doomed::default()
    };
    if doomed.peers.is_empty() {
        return Ok(Closed::default());
    }
    let result = each_namespace(
        &mut doomed,
        others,
        |d, _| close_here(d),
        |d| d.peers.is_empty(),
    );
    for cookie in &doomed.forget {
        // Gone already: released meanwhile.
        let _ = map.remove(cookie);
    }
    result?;
    Ok(Closed {
        destroyed: doomed.destroyed,
        unfound: doomed.peers.len(),
    })
}

/// A connection of the packet path, by its client's socket: protocol, the
/// client's address and port, the service address and port it sent to.
pub type ClientFlow = (u8, std::net::SocketAddr, std::net::SocketAddr);

/// A TCP socket's states with a peer (all but `LISTEN`, `TIME_WAIT`, `CLOSE`).
const TCP_CONNECTED: u32 =
    (1 << 1) | (1 << 2) | (1 << 3) | (1 << 4) | (1 << 5) | (1 << 8) | (1 << 9) | (1 << 11);

/// The packet path's connections to end, and where their clients may be.
pub struct Ending {
    pub flows: std::collections::HashSet<ClientFlow>,
    /// This node's pods' networks (`svcproxy_podnet`): in another namespace than
    /// svcproxy's, only a client socket with an address of them is this node's
    /// (a namespace of another host's, seen from here, is not).
    pub pod_nets: Vec<ipnet::IpNet>,
}

/// Destroys the TCP sockets, and the connected UDP sockets, of the calling
/// thread's namespace that are the clients of `ending`'s flows (taken out of
/// them): how many. `own`: svcproxy's namespace, whose sockets are the node's;
/// elsewhere only pods' are. A TCP socket destroyed resets its connection,
/// toward the endpoint too while the programs still translate its packets.
fn end_here(ending: &mut Ending, own: bool) -> Result<usize, SockError> {
    let sock = open()?;
    let mut seq = 0u32;
    let mut ended = 0;
    for (proto, states) in [
        (IPPROTO_TCP, TCP_CONNECTED),
        (IPPROTO_UDP, 1 << TCP_ESTABLISHED),
    ] {
        for d in list(&sock, proto, states, &mut seq)? {
            let local = d.local();
            if !own && !ending.pod_nets.iter().any(|n| n.contains(&local.ip())) {
                continue;
            }
            if ending.flows.remove(&(proto, local, d.remote())) {
                ended += usize::from(destroy(&sock, &d, &mut seq)?);
            }
        }
    }
    Ok(ended)
}

/// Ends the packet path's connections whose clients are this node's sockets (in
/// this namespace, and with `others` in every one this process can name, its
/// pods'), before the programs go: each is destroyed, so its application sees
/// the connection aborted at once rather than its next packet leaving
/// untranslated. `ending.flows` keeps the rest (clients elsewhere). Returns how
/// many were ended.
pub fn end_local_clients(ending: &mut Ending, others: bool) -> Result<usize, SockError> {
    if ending.flows.is_empty() {
        return Ok(0);
    }
    let others = others && !ending.pod_nets.is_empty();
    each_namespace(ending, others, end_here, |e| e.flows.is_empty())
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
        let req = dump_request(AF_INET6, IPPROTO_UDP, 1 << TCP_ESTABLISHED, 3);
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
        let d = destroy_request(
            &Diag {
                family: AF_INET,
                proto: IPPROTO_TCP,
                id: [1; SOCKID],
            },
            4,
        );
        assert_eq!(d.len(), NLMSG_HEADER + REQ);
        assert_eq!(u16::from_ne_bytes([d[4], d[5]]), SOCK_DESTROY);
        assert_eq!(u16::from_ne_bytes([d[6], d[7]]), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(&d[16..18], &[AF_INET, IPPROTO_TCP]);
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
            cookies(&stale_peers(entries(), &StaleUdp::Changed(&gone), &|_| {
                false
            })),
            [1]
        );
        // The whole port gone (no endpoint left).
        let port = [filter("198.19.0.10", 53, None)];
        assert_eq!(
            cookies(&stale_peers(entries(), &StaleUdp::Changed(&port), &|_| {
                false
            })),
            [1, 2]
        );
        // Entries not DNATed (a cached REJECT) are no socket's.
        let mut cached = filter("198.19.0.10", 53, None);
        cached.dst_nat = Some(false);
        assert!(stale_peers(entries(), &StaleUdp::Changed(&[cached]), &|_| false).is_empty());
        let gone6 = [filter(
            "2001:db8:ffff::10",
            53,
            Some("[2001:db8:1::10]:5353"),
        )];
        assert_eq!(
            cookies(&stale_peers(entries(), &StaleUdp::Changed(&gone6), &|_| {
                false
            })),
            [4]
        );
        // A NodePort's filter (any address, the NodePort's port) takes a
        // translation to a node address only, not another service's with that port.
        let node_port = [ConntrackFilter {
            orig_dst: None,
            ..filter("198.19.0.10", 53, Some("198.18.1.10:5353"))
        }];
        let nodes = |ip: std::net::IpAddr| ip == "198.19.0.10".parse::<std::net::IpAddr>().unwrap();
        assert!(stale_peers(entries(), &StaleUdp::Changed(&node_port), &|_| false).is_empty());
        assert_eq!(
            cookies(&stale_peers(
                entries(),
                &StaleUdp::Changed(&node_port),
                &nodes
            )),
            [1]
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
            cookies(&stale_peers(
                entries(),
                &StaleUdp::Reconcile(&flows),
                &|_| false
            )),
            [1]
        );
    }

    #[test]
    fn only_a_socket_still_connected_where_its_translation_says_is_destroyed() {
        let mut doomed = Doomed {
            peers: [
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
                (
                    11,
                    Peer::of(&peer("198.19.0.10:53", "198.18.1.10:5353")).unwrap(),
                ),
            ]
            .into(),
            ..Doomed::default()
        };
        let sockets = vec![
            socket(&diag_message(
                AF_INET,
                "198.18.0.1:40000",
                "198.18.1.10:5353",
                7,
            )),
            // Connected elsewhere since: found, not destroyed, forgotten.
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
        let chosen: Vec<(u64, u16)> = pick(sockets, &mut doomed)
            .iter()
            .map(|d| (d.cookie(), d.local().port()))
            .collect();
        assert_eq!(chosen, [(7, 40000), (9, 40003)]);
        assert_eq!(doomed.forget, [7, 8, 9]);
        // Still to find (another namespace's).
        assert_eq!(doomed.peers.keys().copied().collect::<Vec<u64>>(), [11]);
        // An IPv6 socket connected to an IPv4 endpoint: its IPv4-mapped peer.
        let mapped = socket(&diag_message(
            AF_INET6,
            "198.18.0.1:40000",
            "198.18.1.10:5353",
            11,
        ));
        assert_eq!(mapped.remote(), "198.18.1.10:5353".parse().unwrap());
        assert_eq!(pick(vec![mapped], &mut doomed).len(), 1);
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
        // A dump that failed says so in its end.
        let mut failed = Vec::new();
        header(&mut failed, NLMSG_DONE, 2, 1);
        failed.extend_from_slice(&(-libc::ENOENT).to_ne_bytes());
        assert_eq!(parse_message(&finish(failed)), Reply::Error(-libc::ENOENT));
        // A truncated socket message is not a socket.
        let mut short = diag_message(AF_INET, "198.18.0.1:1", "198.18.1.10:2", 1);
        short.truncate(NLMSG_HEADER + MSG - 1);
        assert_eq!(parse_message(&short), Reply::Other);
    }
}
