//! Everything svcproxy pinned removed ([`cleanup`]): the packet path's
//! connections ended first, then the links (the programs detached), then the
//! maps, then the directory; the pins of another network namespace's svcproxy
//! are left alone.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;

use aya::programs::links::PinnedLink;

use super::attach::{pinned_interfaces, release_interface};
use super::host::netns_cookie;
use super::kernel_err;
use super::load::socket_programs;
use super::maps::{pinned_owner, MAPS, RETIRED_MAPS};
use super::sockets::{end_local_clients, may_enter_namespaces, ClientFlow, Ending};
use crate::ebpf::wire::{self, CtKey, CtVal};
use crate::error::DataPlaneError;
use crate::kernel::conntrack::{ConntrackEntry, NetlinkConntrack};
use svcproxy_core::model::IpFamily;

/// Removes what svcproxy pinned in `pin_dir`: the links first (detaching the
/// programs), then the maps, then the directory. Nothing there is no error.
///
/// Pins another network namespace's svcproxy made (the host's, seen from a
/// namespace sharing its filesystem) are left alone: the cookie of the namespace
/// whose processes count as the host, pinned in `svcproxy_cfg`, must be this one's.
pub fn cleanup(pin_dir: &Path) -> Result<(), DataPlaneError> {
    if !pin_dir.exists() {
        return Ok(());
    }
    if let Some(owner) = pinned_owner(pin_dir) {
        let here = netns_cookie()?;
        if owner != here {
            tracing::warn!(
                pin_dir = %pin_dir.display(),
                "the eBPF pins there belong to svcproxy in another network namespace; left alone"
            );
            return Ok(());
        }
    }
    // The packet path's connections cannot go on without the programs: they end
    // now, cleanly. A client socket of this node is destroyed while the programs
    // still translate (its reset reaches the endpoint); a client elsewhere loses
    // the kernel's conntrack entry of its translated connection once the programs
    // are gone, so that the endpoint's late packets meet a reset at this node
    // rather than leaving for the client untranslated, and the client's next
    // packet meets one too (nothing here answers the service address).
    let connections = packet_connections(pin_dir);
    let mut ending = Ending {
        flows: connections.iter().map(|(c, _)| *c).collect(),
        pod_nets: pod_nets(pin_dir),
    };
    match end_local_clients(&mut ending, may_enter_namespaces()) {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            ended = n,
            "ended this node's connections through the packet path (their sockets destroyed)"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "this node's connections through the packet path were not ended; their next packets leave untranslated")
        }
    }
    for index in pinned_interfaces(pin_dir) {
        release_interface(pin_dir, index)?;
    }
    for name in socket_programs() {
        let _ = std::fs::remove_file(pin_dir.join(format!("link-{name}-new")));
        let pin = pin_dir.join(format!("link-{name}"));
        if pin.exists() {
            let link = PinnedLink::from_pin(&pin)
                .map_err(|e| kernel_err(format!("opening {}", pin.display()), e))?;
            link.unpin()
                .map_err(|e| kernel_err(format!("unpinning {}", pin.display()), e))?;
        }
    }
    for name in MAPS.iter().chain(&RETIRED_MAPS) {
        let pin = pin_dir.join(name);
        match std::fs::remove_file(&pin) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(kernel_err(format!("unpinning {}", pin.display()), e)),
        }
    }
    forget_conntrack(&connections);
    super::seal::unseal(pin_dir)?;
    match std::fs::remove_dir(pin_dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(kernel_err(format!("removing {}", pin_dir.display()), e)),
    }
}

/// The packet path's connections (their original entries in `svcproxy_ct`): the
/// client's flow, and the endpoint it was translated to. None when the map
/// cannot be read.
fn packet_connections(pin_dir: &Path) -> Vec<(ClientFlow, SocketAddr)> {
    let Ok(ct) = super::maps::open_pinned::<aya::maps::HashMap<aya::maps::MapData, CtKey, CtVal>>(
        pin_dir,
        "svcproxy_ct",
    ) else {
        return Vec::new();
    };
    connections_of(ct.iter().filter_map(Result::ok))
}

fn connections_of(entries: impl Iterator<Item = (CtKey, CtVal)>) -> Vec<(ClientFlow, SocketAddr)> {
    entries
        .filter(|(k, _)| k.dir == wire::CT_ORIGINAL)
        .filter_map(|(k, v)| {
            let at = |words, port| {
                Some(SocketAddr::new(
                    wire::addr_of(words, k.family)?,
                    wire::port_of(port),
                ))
            };
            Some((
                (k.proto, at(k.saddr, k.sport)?, at(k.daddr, k.dport)?),
                at(v.addr, v.port)?,
            ))
        })
        .collect()
}

/// This node's pods' networks, as the pinned `svcproxy_podnet` holds them (none
/// when it cannot be read, or the local-traffic detector is not by CIDR).
fn pod_nets(pin_dir: &Path) -> Vec<ipnet::IpNet> {
    let Ok(map) = super::maps::open_pinned::<
        aya::maps::lpm_trie::LpmTrie<aya::maps::MapData, wire::PodnetData, u8>,
    >(pin_dir, "svcproxy_podnet") else {
        return Vec::new();
    };
    super::readback::nets_in(&map, "svcproxy_podnet", &mut Vec::new())
        .into_iter()
        .collect()
}

/// Whether conntrack's `entry` is the kernel's view of one of `connections`
/// (the packet path translates before conntrack sees a packet: client to
/// endpoint).
fn tracks(entry: &ConntrackEntry, connections: &HashSet<(u8, SocketAddr, SocketAddr)>) -> bool {
    let (Some(sport), Some(dport)) = (entry.orig_sport, entry.orig_dport) else {
        return false;
    };
    connections.contains(&(
        entry.protocol,
        SocketAddr::new(entry.orig_src, sport),
        SocketAddr::new(entry.orig_dst, dport),
    ))
}

/// Deletes the kernel's conntrack entries of `connections` (logged, never an
/// error: the cleanup goes on without).
fn forget_conntrack(connections: &[(ClientFlow, SocketAddr)]) {
    if connections.is_empty() {
        return;
    }
    let wanted: HashSet<(u8, SocketAddr, SocketAddr)> = connections
        .iter()
        .map(|((proto, client, _), endpoint)| (*proto, *client, *endpoint))
        .collect();
    let mut ct = NetlinkConntrack::new();
    let mut deleted = 0;
    for family in IpFamily::BOTH {
        let result = ct.dump(family).and_then(|(entries, _)| {
            let doomed: Vec<ConntrackEntry> =
                entries.into_iter().filter(|e| tracks(e, &wanted)).collect();
            ct.delete_entries(&doomed)
        });
        match result {
            Ok((n, _)) => deleted += n,
            Err(e) => {
                tracing::warn!(error = %e, %family, "the packet path's conntrack entries were not deleted; the endpoints' late packets may leave untranslated")
            }
        }
    }
    if deleted > 0 {
        tracing::info!(
            deleted,
            "deleted the conntrack entries of the packet path's connections"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(client: &str, service: &str, proto: u8, dir: u8) -> CtKey {
        let c: SocketAddr = client.parse().unwrap();
        let s: SocketAddr = service.parse().unwrap();
        CtKey {
            saddr: wire::addr_words(Some(c.ip())),
            daddr: wire::addr_words(Some(s.ip())),
            sport: wire::port_word(c.port()),
            dport: wire::port_word(s.port()),
            proto,
            family: wire::family_byte(IpFamily::of(&c.ip())),
            dir,
            pad: 0,
        }
    }

    fn val(endpoint: &str) -> CtVal {
        let be = wire::Backend::of(endpoint.parse().unwrap());
        CtVal {
            addr: be.addr,
            port: be.port,
            ..CtVal::default()
        }
    }

    #[test]
    fn the_connections_to_end_are_the_original_entries_and_conntrack_sees_them_translated() {
        let entries = vec![
            (
                key("198.18.1.5:40000", "198.19.0.10:80", 6, wire::CT_ORIGINAL),
                val("198.18.2.10:9100"),
            ),
            // The reply direction's entry of the same connection.
            (
                key("198.18.2.10:9100", "198.18.1.5:40000", 6, 1),
                val("198.19.0.10:80"),
            ),
            (
                key(
                    "[2001:db8:1::5]:40001",
                    "[2001:db8:ffff::10]:80",
                    6,
                    wire::CT_ORIGINAL,
                ),
                val("[2001:db8:2::10]:9100"),
            ),
        ];
        let got = connections_of(entries.into_iter());
        let sa = |s: &str| -> SocketAddr { s.parse().unwrap() };
        assert_eq!(
            got,
            [
                (
                    (6, sa("198.18.1.5:40000"), sa("198.19.0.10:80")),
                    sa("198.18.2.10:9100")
                ),
                (
                    (6, sa("[2001:db8:1::5]:40001"), sa("[2001:db8:ffff::10]:80")),
                    sa("[2001:db8:2::10]:9100")
                ),
            ]
        );
        let wanted: HashSet<(u8, SocketAddr, SocketAddr)> =
            got.iter().map(|((p, c, _), e)| (*p, *c, *e)).collect();
        let entry = |src: &str, dst: &str, proto: u8| {
            let (s, d) = (sa(src), sa(dst));
            ConntrackEntry {
                family: IpFamily::of(&s.ip()),
                protocol: proto,
                orig_src: s.ip(),
                orig_dst: d.ip(),
                orig_sport: Some(s.port()),
                orig_dport: Some(d.port()),
                reply_src: d.ip(),
                reply_dst: s.ip(),
                reply_sport: Some(d.port()),
                reply_dport: Some(s.port()),
                status: 0,
                zone: 0,
                id: None,
            }
        };
        assert!(tracks(
            &entry("198.18.1.5:40000", "198.18.2.10:9100", 6),
            &wanted
        ));
        // Another client port, another protocol, the untranslated view: not ours.
        assert!(!tracks(
            &entry("198.18.1.5:40002", "198.18.2.10:9100", 6),
            &wanted
        ));
        assert!(!tracks(
            &entry("198.18.1.5:40000", "198.18.2.10:9100", 17),
            &wanted
        ));
        assert!(!tracks(
            &entry("198.18.1.5:40000", "198.19.0.10:80", 6),
            &wanted
        ));
    }
}
