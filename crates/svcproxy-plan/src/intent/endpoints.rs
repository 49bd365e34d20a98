//! A service intent's endpoints, packed: every endpoint some traffic to the port
//! may reach, in address order, each with the sets it belongs to and whether it
//! may need the hairpin masquerade.
//!
//! The intent is held for every service port of the cluster (tens of thousands),
//! so its endpoints take one allocation of 8 bytes per IPv4 endpoint (20 per IPv6
//! one) instead of a list of `SocketAddr`s (32 bytes each) beside a flag list and
//! an index list per set. The sets are subsequences of the list: the selection
//! picks endpoints of the port's sorted list and keeps their order.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::EndpointSetId;

const CLUSTER: u8 = 1;
const LOCAL: u8 = 2;
const HAIRPIN: u8 = 4;

fn set_flag(id: EndpointSetId) -> u8 {
    match id {
        EndpointSetId::Cluster => CLUSTER,
        EndpointSetId::Local => LOCAL,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct V4 {
    ip: [u8; 4],
    port: u16,
    flags: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct V6 {
    ip: [u8; 16],
    port: u16,
    flags: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Packed {
    V4(Box<[V4]>),
    V6(Box<[V6]>),
}

/// One endpoint as the builder hands it over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct EndpointEntry {
    pub addr: SocketAddr,
    pub cluster: bool,
    pub local: bool,
    pub hairpin: bool,
}

/// The endpoints of one service port in one family (see the module).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoints(Packed);

impl Endpoints {
    /// From entries sorted by address, one per address, all of one family.
    ///
    /// # Panics
    /// When the entries mix families or are not sorted and distinct: the builder
    /// guarantees both.
    pub(super) fn new(entries: &[EndpointEntry]) -> Endpoints {
        assert!(
            entries.windows(2).all(|w| w[0].addr < w[1].addr),
            "endpoints sorted and distinct"
        );
        let flags = |e: &EndpointEntry| {
            [(e.cluster, CLUSTER), (e.local, LOCAL), (e.hairpin, HAIRPIN)]
                .into_iter()
                .filter(|(on, _)| *on)
                .fold(0, |acc, (_, flag)| acc | flag)
        };
        let (port, v6) = (
            |e: &EndpointEntry| e.addr.port(),
            |e: &EndpointEntry| e.addr.is_ipv6(),
        );
        if entries.first().is_some_and(v6) {
            assert!(entries.iter().all(v6), "endpoints of one family");
            let ip = |e: &EndpointEntry| match e.addr.ip() {
                IpAddr::V6(a) => a.octets(),
                IpAddr::V4(_) => unreachable!("checked above"),
            };
            let pack = |e| V6 {
                ip: ip(e),
                port: port(e),
                flags: flags(e),
            };
            Endpoints(Packed::V6(entries.iter().map(pack).collect()))
        } else {
            assert!(!entries.iter().any(v6), "endpoints of one family");
            let ip = |e: &EndpointEntry| match e.addr.ip() {
                IpAddr::V4(a) => a.octets(),
                IpAddr::V6(_) => unreachable!("checked above"),
            };
            let pack = |e| V4 {
                ip: ip(e),
                port: port(e),
                flags: flags(e),
            };
            Endpoints(Packed::V4(entries.iter().map(pack).collect()))
        }
    }

    pub fn len(&self) -> usize {
        match &self.0 {
            Packed::V4(v) => v.len(),
            Packed::V6(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn entry(&self, i: usize) -> (SocketAddr, u8) {
        match &self.0 {
            Packed::V4(v) => {
                let e = v[i];
                (
                    SocketAddr::new(Ipv4Addr::from(e.ip).into(), e.port),
                    e.flags,
                )
            }
            Packed::V6(v) => {
                let e = v[i];
                (
                    SocketAddr::new(Ipv6Addr::from(e.ip).into(), e.port),
                    e.flags,
                )
            }
        }
    }

    /// Endpoint `i`.
    ///
    /// # Panics
    /// When `i` is out of range.
    pub fn get(&self, i: usize) -> SocketAddr {
        self.entry(i).0
    }

    /// Whether endpoint `i` may be one of this node's own: its connections through
    /// the service can come back to it and need the hairpin masquerade.
    pub fn hairpin(&self, i: usize) -> bool {
        self.entry(i).1 & HAIRPIN != 0
    }

    /// Every endpoint, in address order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = SocketAddr> + Clone + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    /// The position of `addr`.
    pub fn position(&self, addr: &SocketAddr) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.get(mid).cmp(addr) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// The indices of the members of set `id`, in address order.
    pub fn members(&self, id: EndpointSetId) -> impl Iterator<Item = u32> + Clone + '_ {
        let flag = set_flag(id);
        (0..self.len())
            .filter(move |&i| self.entry(i).1 & flag != 0)
            .map(|i| i as u32)
    }

    /// Whether set `id` has a member.
    pub fn has_members(&self, id: EndpointSetId) -> bool {
        self.members(id).next().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(addr: &str, cluster: bool, local: bool, hairpin: bool) -> EndpointEntry {
        EndpointEntry {
            addr: addr.parse().unwrap(),
            cluster,
            local,
            hairpin,
        }
    }

    #[test]
    fn packed_endpoints_keep_addresses_sets_and_hairpin_flags() {
        for list in [
            vec![
                entry("10.0.0.1:80", true, false, false),
                entry("10.0.0.2:80", true, true, true),
                entry("10.0.0.2:81", false, true, false),
                entry("255.255.255.255:65535", true, false, true),
            ],
            vec![
                entry("[fd00::1]:80", false, true, true),
                entry("[fd00::1:0]:443", true, false, false),
                entry("[ffff::ffff]:65535", true, true, false),
            ],
        ] {
            let eps = Endpoints::new(&list);
            assert_eq!(eps.len(), list.len());
            assert_eq!(
                eps.iter().collect::<Vec<_>>(),
                list.iter().map(|e| e.addr).collect::<Vec<_>>()
            );
            for (i, e) in list.iter().enumerate() {
                assert_eq!(eps.get(i), e.addr);
                assert_eq!(eps.hairpin(i), e.hairpin);
                assert_eq!(eps.position(&e.addr), Some(i));
            }
            for (id, pick) in [
                (
                    EndpointSetId::Cluster,
                    (|e: &EndpointEntry| e.cluster) as fn(&EndpointEntry) -> bool,
                ),
                (EndpointSetId::Local, |e: &EndpointEntry| e.local),
            ] {
                let want: Vec<u32> = (0..list.len() as u32)
                    .filter(|&i| pick(&list[i as usize]))
                    .collect();
                assert_eq!(eps.members(id).collect::<Vec<_>>(), want);
                assert_eq!(eps.has_members(id), !want.is_empty());
            }
            assert_eq!(eps.position(&"10.9.9.9:80".parse().unwrap()), None);
        }
        let empty = Endpoints::new(&[]);
        assert!(empty.is_empty() && !empty.has_members(EndpointSetId::Cluster));
    }

    #[test]
    fn an_ipv4_endpoint_takes_eight_bytes() {
        assert_eq!(std::mem::size_of::<V4>(), 8);
        assert_eq!(std::mem::size_of::<V6>(), 20);
    }

    #[test]
    #[should_panic(expected = "sorted and distinct")]
    fn unsorted_entries_are_refused() {
        Endpoints::new(&[
            entry("10.0.0.2:80", true, false, false),
            entry("10.0.0.1:80", true, false, false),
        ]);
    }
}
