//! The BPF maps' keys and values, laid out as `bpf/lib/*.h` declares them (change
//! both together; `layouts_match_the_c_structs` checks the sizes), and their
//! encoding from the table's types.

use std::net::{IpAddr, SocketAddr};

use aya::maps::lpm_trie::Key as LpmKey;
use ipnet::IpNet;
use svcproxy_core::model::{IpFamily, Protocol, Scheduler};
use svcproxy_plan::ebpf::{maglev, EndpointList};

pub const FAMILY_V4: u8 = 4;
pub const FAMILY_V6: u8 = 6;

/// A route's action (`ACT_*` in the C).
pub const ACT_FORWARD: u8 = 0;
pub const ACT_DROP: u8 = 1;
pub const ACT_REJECT: u8 = 2;
pub const ACT_PASS: u8 = 3;

/// A route's flags (`ROUTE_*` in the C): the connection is masqueraded.
pub const ROUTE_MASQUERADE: u8 = 1;
/// A host socket's route: masquerade a bound source unless it is a pod's (maps.h).
pub const ROUTE_MASQUERADE_UNLESS_POD: u8 = 2;

/// A route's scheduler (`SCHED_*` in the C).
pub const SCHED_RANDOM: u8 = 0;
pub const SCHED_RR: u8 = 1;
pub const SCHED_SH: u8 = 2;
pub const SCHED_DH: u8 = 3;
pub const SCHED_MH: u8 = 4;
pub const SCHED_LC: u8 = 5;
pub const SCHED_WLC: u8 = 6;
pub const SCHED_SED: u8 = 7;
pub const SCHED_NQ: u8 = 8;
pub const SCHED_WRR: u8 = 9;

/// The byte the programs know `list`'s scheduler by; Maglev's also says its
/// table's size, as an index of [`maglev::SIZES`] (a list longer than its table
/// is chosen from at random).
pub fn sched_bytes(list: &EndpointList) -> (u8, u8) {
    match list.scheduler {
        Scheduler::Random => (SCHED_RANDOM, 0),
        Scheduler::RoundRobin => (SCHED_RR, 0),
        Scheduler::SourceHash => (SCHED_SH, 0),
        Scheduler::DestinationHash => (SCHED_DH, 0),
        Scheduler::Maglev => match list
            .maglev_table_size
            .filter(|&cells| maglev::fits(list.endpoints.len(), cells))
            .and_then(maglev::size_index)
        {
            Some(size) => (SCHED_MH, size),
            None => (SCHED_RANDOM, 0),
        },
        Scheduler::WeightedRoundRobin => (SCHED_WRR, 0),
        Scheduler::LeastConnection => (SCHED_LC, 0),
        Scheduler::WeightedLeastConnection => (SCHED_WLC, 0),
        Scheduler::ShortestExpectedDelay => (SCHED_SED, 0),
        Scheduler::NeverQueue => (SCHED_NQ, 0),
    }
}

/// The scheduler a route's byte names.
pub fn scheduler_of(sched: u8) -> Scheduler {
    match sched {
        SCHED_RR => Scheduler::RoundRobin,
        SCHED_SH => Scheduler::SourceHash,
        SCHED_DH => Scheduler::DestinationHash,
        SCHED_MH => Scheduler::Maglev,
        SCHED_WRR => Scheduler::WeightedRoundRobin,
        SCHED_LC => Scheduler::LeastConnection,
        SCHED_WLC => Scheduler::WeightedLeastConnection,
        SCHED_SED => Scheduler::ShortestExpectedDelay,
        SCHED_NQ => Scheduler::NeverQueue,
        _ => Scheduler::Random,
    }
}

/// `svcproxy_ifc`'s flags (`IFC_*`): packets arriving on the interface come from
/// this node's pods.
pub const IFC_PODS: u32 = 1;

pub fn family_byte(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => FAMILY_V4,
        IpFamily::V6 => FAMILY_V6,
    }
}

pub fn proto_byte(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

pub fn proto_of(b: u8) -> Option<Protocol> {
    match b {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

/// An address as the programs read `user_ip4` / `user_ip6`: the bytes in network
/// order, in 32-bit words (an IPv4 address in the first).
pub fn addr_words(ip: Option<IpAddr>) -> [u32; 4] {
    let mut out = [0u32; 4];
    match ip {
        None => {}
        Some(IpAddr::V4(a)) => out[0] = u32::from_ne_bytes(a.octets()),
        Some(IpAddr::V6(a)) => {
            for (i, chunk) in a.octets().chunks(4).enumerate() {
                out[i] = u32::from_ne_bytes(chunk.try_into().expect("4 bytes"));
            }
        }
    }
    out
}

/// The address in `words` of `family`; `None` for all zeros (the wildcard).
pub fn addr_of(words: [u32; 4], family: u8) -> Option<IpAddr> {
    if words == [0; 4] {
        return None;
    }
    if family == FAMILY_V4 {
        Some(IpAddr::from(words[0].to_ne_bytes()))
    } else {
        let mut b = [0u8; 16];
        for (i, w) in words.iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        Some(IpAddr::from(b))
    }
}

/// A port as the programs read `user_port`: network order in a `u16`.
pub fn port_word(port: u16) -> u16 {
    u16::from_ne_bytes(port.to_be_bytes())
}

pub fn port_of(word: u16) -> u16 {
    u16::from_be_bytes(word.to_ne_bytes())
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SvcKey {
    pub addr: [u32; 4],
    pub port: u16,
    pub proto: u8,
    pub family: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Route {
    pub list: u32,
    pub count: u32,
    pub action: u8,
    pub flags: u8,
    pub sched: u8,
    /// Maglev's table size, as an index of [`maglev::SIZES`].
    pub mh_size: u8,
}

/// A Maglev table's entry: `maglev::CHUNK` cells of a list.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MhKey {
    pub list: u32,
    pub chunk: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MhVal {
    pub cell: [u16; maglev::CHUNK],
}

/// A list's Maglev table as the map's entries.
pub fn mh_entries(list: u32, table: &maglev::Table) -> Vec<(MhKey, MhVal)> {
    table
        .cells
        .chunks(maglev::CHUNK)
        .enumerate()
        .map(|(i, cells)| {
            let mut v = MhVal {
                cell: [0; maglev::CHUNK],
            };
            v.cell[..cells.len()].copy_from_slice(cells);
            (
                MhKey {
                    list,
                    chunk: i as u32,
                },
                v,
            )
        })
        .collect()
}

/// The entries of a table of size index `size`.
pub fn mh_chunks(size: u8) -> u32 {
    maglev::SIZES[usize::from(size).min(maglev::SIZES.len() - 1)].div_ceil(maglev::CHUNK as u32)
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SvcVal {
    pub pod: Route,
    pub host: Route,
    pub pkt_pod: Route,
    pub pkt_other: Route,
    pub affinity_id: u64,
    /// Non-zero: `svcproxy_fw` must admit a packet's source.
    pub fw_id: u64,
    pub affinity_secs: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotKey {
    pub list: u32,
    pub slot: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Backend {
    pub addr: [u32; 4],
    pub port: u16,
    pub family: u8,
    pub pad: u8,
}

impl Backend {
    pub fn of(addr: SocketAddr) -> Backend {
        Backend {
            addr: addr_words(Some(addr.ip())),
            port: port_word(addr.port()),
            family: family_byte(IpFamily::of(&addr.ip())),
            pad: 0,
        }
    }

    pub fn socket_addr(&self) -> Option<SocketAddr> {
        let ip = addr_of(self.addr, self.family).unwrap_or(IpAddr::from([0u8, 0, 0, 0]));
        Some(SocketAddr::new(ip, port_of(self.port)))
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemberKey {
    pub list: u32,
    pub addr: [u32; 4],
    pub port: u16,
    pub pad: u16,
}

impl MemberKey {
    pub fn of(list: u32, be: &Backend) -> MemberKey {
        MemberKey {
            list,
            addr: be.addr,
            port: be.port,
            pad: 0,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LocalKey {
    pub addr: [u32; 4],
    pub family: u8,
    pub pad: [u8; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    pub host_netns_cookie: u64,
    /// 1: translate only the host's own sockets.
    pub host_only: u32,
    pub masquerade_mark: u32,
    pub reject_mark: u32,
    /// Successful writes of the maps so far (0: none yet).
    pub generation: u32,
}

/// A packet-path connection's key in `svcproxy_ct` (`struct ct_key`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtKey {
    pub saddr: [u32; 4],
    pub daddr: [u32; 4],
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub family: u8,
    /// `CT_ORIGINAL` (0), `CT_REPLY`, `CT_MASQUERADED_REPLY`, `CT_SNAT`, `CT_SNAT_REPLY`
    /// (bpf/lib/ct.h).
    pub dir: u8,
    pub pad: u8,
}

/// `svcproxy_ct`'s value (`struct ct_val`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtVal {
    pub addr: [u32; 4],
    pub port: u16,
    pub flags: u8,
    /// The original direction's: the connection counts in `svcproxy_flows`.
    pub counted: u8,
    /// When a packet of it last passed, in seconds of the monotonic clock.
    pub seen_s: u32,
    pub created_ns: u64,
}

pub const CT_ORIGINAL: u8 = 0;
/// `ct_val.flags`: a FIN or RST of the connection passed.
pub const CT_CLOSING: u8 = 0x80;

/// `svcproxy_timeouts`' value: the packet path's idle timeouts in seconds (0:
/// none).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timeouts {
    pub tcp: u32,
    pub tcpfin: u32,
    pub udp: u32,
    pub pad: u32,
}

/// `svcproxy_snat`'s value: the ports (host order) svcproxy's own masquerade
/// takes (the XDP fast path's), `hi` 0 for none; `flags` [`SNAT_XDP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnatRange {
    pub lo: u16,
    pub hi: u16,
    pub flags: u32,
}

/// `SnatRange::flags`: the XDP program runs (the replies of the connections
/// it sent on are kept from the kernel's conntrack).
pub const SNAT_XDP: u32 = 1;

/// `svcproxy_fw`'s key data (an LPM trie): a fenced service port's id, then an
/// admitted source prefix; the prefix length counts the id's 64 bits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FwData {
    pub id: [u32; 2],
    pub addr: [u32; 4],
}

pub fn fw_key(id: u64, net: &IpNet) -> LpmKey<FwData> {
    let b = id.to_ne_bytes();
    LpmKey::new(
        64 + u32::from(net.prefix_len()),
        FwData {
            id: [
                u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
                u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
            ],
            addr: addr_words(Some(net.network())),
        },
    )
}

/// The port id and prefix of a key, of the family `v4` says (the key does not).
pub fn fw_of(key: &LpmKey<FwData>, v4: bool) -> Option<(u64, IpNet)> {
    let len = u8::try_from(key.prefix_len().checked_sub(64)?).ok()?;
    Some((fw_id(key), net_of(key.data().addr, v4, len)?))
}

/// The port id of a key.
pub fn fw_id(key: &LpmKey<FwData>) -> u64 {
    let d = key.data();
    let (a, b) = (d.id[0].to_ne_bytes(), d.id[1].to_ne_bytes());
    u64::from_ne_bytes([a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]])
}

/// `svcproxy_podnet`'s key data (an LPM trie): the family, then one of this
/// node's pods' CIDRs; the prefix length counts the family word's 32 bits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodnetData {
    pub family: u32,
    pub addr: [u32; 4],
}

pub fn podnet_key(net: &IpNet) -> LpmKey<PodnetData> {
    LpmKey::new(
        32 + u32::from(net.prefix_len()),
        PodnetData {
            family: u32::from(family_byte(IpFamily::of(&net.network()))),
            addr: addr_words(Some(net.network())),
        },
    )
}

pub fn podnet_of(key: &LpmKey<PodnetData>) -> Option<IpNet> {
    let d = key.data();
    let len = u8::try_from(key.prefix_len().checked_sub(32)?).ok()?;
    net_of(d.addr, d.family == u32::from(FAMILY_V4), len)
}

fn net_of(words: [u32; 4], v4: bool, len: u8) -> Option<IpNet> {
    let family = if v4 { FAMILY_V4 } else { FAMILY_V6 };
    let ip = addr_of(words, family).unwrap_or(if v4 {
        IpAddr::from([0u8; 4])
    } else {
        IpAddr::from([0u8; 16])
    });
    IpNet::new(ip, len).ok()
}

/// `svcproxy_affip`'s key: a service port's id and a client's address (the
/// packet path's ClientIP affinity).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AffIpKey {
    pub affinity_id: u64,
    pub client: [u32; 4],
}

/// `svcproxy_aff`'s key: a service port's id and a client's network namespace
/// cookie (the socket path's ClientIP affinity).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AffKey {
    pub affinity_id: u64,
    pub client: u64,
}

/// An affinity entry: the endpoint, and when the client last used it
/// (`bpf_ktime_get_ns`, CLOCK_MONOTONIC).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AffVal {
    pub be: Backend,
    pub pad: u32,
    pub last_ns: u64,
}

/// A connected socket's translation (`struct sock_peer` in sock.c): the service
/// address and port, the endpoint's family, whether it counts a connection, the
/// endpoint and its port (0: the socket connected again, untranslated).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockPeer {
    pub vip: [u32; 4],
    pub vport: u16,
    pub family: u8,
    pub counted: u8,
    pub be: [u32; 4],
    pub beport: u16,
    pub pad: u16,
}

// SAFETY: each is `repr(C)`, `Copy`, made of integers only, with every padding
// byte an explicit field: any bit pattern is a valid value. aya reads and writes
// map keys and values through this trait; there is no other way to use its maps.
#[allow(unsafe_code)]
mod pod {
    use super::*;
    unsafe impl aya::Pod for SvcKey {}
    unsafe impl aya::Pod for SvcVal {}
    unsafe impl aya::Pod for SlotKey {}
    unsafe impl aya::Pod for Backend {}
    unsafe impl aya::Pod for MemberKey {}
    unsafe impl aya::Pod for LocalKey {}
    unsafe impl aya::Pod for Config {}
    unsafe impl aya::Pod for FwData {}
    unsafe impl aya::Pod for AffIpKey {}
    unsafe impl aya::Pod for AffKey {}
    unsafe impl aya::Pod for AffVal {}
    unsafe impl aya::Pod for PodnetData {}
    unsafe impl aya::Pod for MhKey {}
    unsafe impl aya::Pod for Timeouts {}
    unsafe impl aya::Pod for SnatRange {}
    unsafe impl aya::Pod for CtKey {}
    unsafe impl aya::Pod for CtVal {}
    unsafe impl aya::Pod for MhVal {}
    unsafe impl aya::Pod for SockPeer {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_c_structs() {
        // Sizes as clang lays out the structs of bpf/lib/*.h.
        assert_eq!(std::mem::size_of::<SvcKey>(), 20);
        assert_eq!(std::mem::size_of::<SockPeer>(), 40);
        assert_eq!(std::mem::size_of::<Route>(), 12);
        assert_eq!(std::mem::size_of::<SvcVal>(), 72);
        assert_eq!(std::mem::size_of::<LpmKey<FwData>>(), 28);
        assert_eq!(std::mem::size_of::<LpmKey<PodnetData>>(), 24);
        assert_eq!(std::mem::size_of::<SlotKey>(), 8);
        assert_eq!(std::mem::size_of::<Backend>(), 20);
        assert_eq!(std::mem::size_of::<MemberKey>(), 24);
        assert_eq!(std::mem::size_of::<LocalKey>(), 20);
        assert_eq!(std::mem::size_of::<Config>(), 24);
        assert_eq!(std::mem::size_of::<AffIpKey>(), 24);
        assert_eq!(std::mem::size_of::<AffKey>(), 16);
        assert_eq!(std::mem::size_of::<AffVal>(), 32);
        assert_eq!(std::mem::size_of::<MhKey>(), 8);
        assert_eq!(std::mem::size_of::<Timeouts>(), 16);
        assert_eq!(std::mem::size_of::<CtKey>(), 40);
        assert_eq!(std::mem::size_of::<CtVal>(), 32);
        assert_eq!(std::mem::size_of::<MhVal>(), 512);
    }

    #[test]
    fn lpm_keys_round_trip_and_count_their_prefix_words() {
        let net: IpNet = "198.18.0.0/24".parse().unwrap();
        let k = fw_key(0x0123_4567_89ab_cdef, &net);
        assert_eq!(k.prefix_len(), 64 + 24);
        assert_eq!(fw_of(&k, true), Some((0x0123_4567_89ab_cdef, net)));
        let net6: IpNet = "2001:db8::/32".parse().unwrap();
        let k6 = fw_key(7, &net6);
        assert_eq!(k6.prefix_len(), 64 + 32);
        assert_eq!(fw_of(&k6, false), Some((7, net6)));
        // The id's bytes come first, in memory order, as the C copies them.
        assert_eq!(
            k.data().id[0].to_ne_bytes(),
            0x0123_4567_89ab_cdefu64.to_ne_bytes()[..4]
        );
        let p = podnet_key(&net6);
        assert_eq!(p.prefix_len(), 32 + 32);
        assert_eq!(p.data().family, u32::from(FAMILY_V6));
        assert_eq!(podnet_of(&p), Some(net6));
    }

    #[test]
    fn addresses_and_ports_round_trip_in_network_order() {
        for ip in ["198.19.0.10", "2001:db8:ffff::a"] {
            let ip: IpAddr = ip.parse().unwrap();
            let fam = family_byte(IpFamily::of(&ip));
            assert_eq!(addr_of(addr_words(Some(ip)), fam), Some(ip));
        }
        // The first byte of the address is the first byte in memory.
        let w = addr_words(Some("198.19.0.10".parse().unwrap()));
        assert_eq!(w[0].to_ne_bytes(), [198, 19, 0, 10]);
        assert_eq!(port_word(80).to_ne_bytes(), [0, 80]);
        assert_eq!(port_of(port_word(30080)), 30080);
        let be = Backend::of("[2001:db8::5]:8080".parse().unwrap());
        assert_eq!(
            be.socket_addr(),
            Some("[2001:db8::5]:8080".parse().unwrap())
        );
    }
}
