//! The maps read back through the open handles as a table ([`Kernel::read`],
//! for `explain --live`): lists named as this process wrote them, routes
//! checked against their lists and their schedulers' state, and lines for what
//! cannot be read so. Its key decoders ([`dest_of`], [`addrs_in`], [`nets_in`])
//! serve the dump too.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use aya::maps::lpm_trie::LpmTrie;
use aya::maps::{HashMap, MapData};
use ipnet::IpNet;

use super::Kernel;
use crate::ebpf::wire::{self, LocalKey, MhKey, PodnetData, SvcKey, SvcVal};
use svcproxy_plan::ebpf::{
    maglev, Dest, EndpointList, Entry, ListName, Masquerade, PacketRoute, PortName, Route, Table,
};

impl Kernel {
    /// The maps' contents read back as a table (lists named by the entries that
    /// point at them), for `explain --live`; lines for what cannot be read so.
    pub fn read(&self) -> (Table, Vec<String>) {
        let mut problems = Vec::new();
        let lists = ReadBack {
            kernel: self,
            lists: self.read_lists(&mut problems),
            names: self
                .written
                .iter()
                .flat_map(|w| w.lists.iter().map(|(n, (id, _))| (*id, n.clone())))
                .collect(),
        };
        let mut t = Table {
            masquerade_mark: self.config.masquerade_mark,
            reject_mark: self.config.reject_mark,
            ..Table::default()
        };
        let ports: BTreeMap<u64, PortName> = self
            .written
            .iter()
            .flat_map(|w| w.firewalls.iter().map(|(id, (p, _))| (*id, p.clone())))
            .collect();
        t.firewalls = self.read_firewalls(&ports, &mut problems);
        t.pod_cidrs = nets_in(&self.podnet, "svcproxy_podnet", &mut problems);
        t.guard_cidrs = nets_in(&self.guard, "svcproxy_guard", &mut problems);
        t.cluster_ips = addrs_in(&self.vip, "svcproxy_vip", &mut problems)
            .into_iter()
            .map(|ip| (ip, 1))
            .collect();
        for kv in self.svc.iter() {
            let (k, v) = match kv {
                Ok(kv) => kv,
                Err(e) => {
                    problems.push(format!("reading svcproxy_svc: {e}"));
                    continue;
                }
            };
            let Some(dest) = dest_of(&k) else {
                problems.push(format!("service entry {k:?} is not one svcproxy writes"));
                continue;
            };
            let entry = lists.entry(&dest, &v, &ports, &mut t, &mut problems);
            t.entries.insert(dest, entry);
        }
        t.local_addrs = addrs_in(&self.local, "svcproxy_local", &mut problems);
        (t, problems)
    }

    /// The endpoint lists' slots, weights and member counts, by list id.
    fn read_lists(&self, problems: &mut Vec<String>) -> ReadLists {
        let mut slots: BTreeMap<u32, BTreeMap<u32, SocketAddr>> = BTreeMap::new();
        // Each weighted list's slots' weights (every slot of one carries its own).
        let mut slot_weights: BTreeMap<u32, BTreeMap<u32, u8>> = BTreeMap::new();
        for kv in self.slot.iter() {
            match kv {
                Ok((k, be)) => {
                    if let Some(a) = be.socket_addr() {
                        slots.entry(k.list).or_default().insert(k.slot, a);
                    }
                    if be.pad != 0 {
                        slot_weights
                            .entry(k.list)
                            .or_default()
                            .insert(k.slot, be.pad);
                    }
                }
                Err(e) => problems.push(format!("reading svcproxy_slot: {e}")),
            }
        }
        let mut members: BTreeMap<u32, usize> = BTreeMap::new();
        for k in self.member.keys() {
            match k {
                Ok(k) => *members.entry(k.list).or_default() += 1,
                Err(e) => problems.push(format!("reading svcproxy_member: {e}")),
            }
        }
        ReadLists {
            slots,
            members,
            weights: slot_weights
                .into_iter()
                .map(|(list, w)| (list, w.into_values().collect()))
                .collect(),
        }
    }

    /// The admitted source ranges, by the port that `ports` names for their id.
    fn read_firewalls(
        &self,
        ports: &BTreeMap<u64, PortName>,
        problems: &mut Vec<String>,
    ) -> BTreeMap<PortName, Vec<IpNet>> {
        let mut firewalls: BTreeMap<PortName, Vec<IpNet>> = BTreeMap::new();
        for k in self.fw.keys() {
            let k = match k {
                Ok(k) => k,
                Err(e) => {
                    problems.push(format!("reading svcproxy_fw: {e}"));
                    continue;
                }
            };
            let id = wire::fw_id(&k);
            let Some(port) = ports.get(&id) else {
                problems.push(format!(
                    "source range of port id {id:#x} is no port svcproxy wrote"
                ));
                continue;
            };
            match wire::fw_of(&k, port.family == svcproxy_core::model::IpFamily::V4) {
                Some((_, net)) => firewalls.entry(port.clone()).or_default().push(net),
                None => problems.push(format!("source range key of {port} is malformed")),
            }
        }
        for nets in firewalls.values_mut() {
            nets.sort();
        }
        firewalls
    }
}

/// The endpoint lists as read back from the maps, by list id.
struct ReadLists {
    slots: BTreeMap<u32, BTreeMap<u32, SocketAddr>>,
    members: BTreeMap<u32, usize>,
    weights: BTreeMap<u32, Vec<u8>>,
}

/// What [`Kernel::read`] resolves entries' routes with: the lists read back, and
/// the names this process wrote them under.
struct ReadBack<'k> {
    kernel: &'k Kernel,
    lists: ReadLists,
    names: BTreeMap<u32, ListName>,
}

impl ReadBack<'_> {
    /// A service entry read back: its four routes resolved, its affinity and
    /// source ranges.
    fn entry(
        &self,
        dest: &Dest,
        v: &SvcVal,
        ports: &BTreeMap<u64, PortName>,
        t: &mut Table,
        problems: &mut Vec<String>,
    ) -> Entry {
        let mut packet = |r: &wire::Route, t: &mut Table| PacketRoute {
            route: self.route(r, t, problems),
            masquerade: r.flags & wire::ROUTE_MASQUERADE != 0,
        };
        let packet_pod = packet(&v.pkt_pod, t);
        let packet_other = packet(&v.pkt_other, t);
        let firewall = match v.fw_id {
            0 => None,
            id => match ports.get(&id) {
                Some(p) => Some(p.clone()),
                None => {
                    problems.push(format!(
                        "service entry {dest} names source ranges {id:#x} svcproxy did not write"
                    ));
                    None
                }
            },
        };
        Entry {
            pod: self.route(&v.pod, t, problems),
            host: self.route(&v.host, t, problems),
            host_masquerade: if v.host.flags & wire::ROUTE_MASQUERADE != 0 {
                Masquerade::Always
            } else if v.host.flags & wire::ROUTE_MASQUERADE_UNLESS_POD != 0 {
                Masquerade::UnlessFromLocalPod
            } else {
                Masquerade::Never
            },
            packet_pod,
            packet_other,
            affinity: (v.affinity_secs > 0).then_some((v.affinity_id, v.affinity_secs)),
            firewall,
        }
    }

    /// A route read back; a forward's list resolved to its endpoints (checked
    /// against the entry's count, its members and its scheduler's state) and put in
    /// `t` under the name it was written with.
    fn route(&self, r: &wire::Route, t: &mut Table, problems: &mut Vec<String>) -> Route {
        match r.action {
            wire::ACT_FORWARD => {}
            wire::ACT_DROP => return Route::Drop,
            wire::ACT_PASS => return Route::Pass,
            _ => return Route::Reject,
        }
        let list: Vec<SocketAddr> = self
            .lists
            .slots
            .get(&r.list)
            .map(|s| s.values().copied().collect())
            .unwrap_or_default();
        if list.len() != r.count as usize {
            problems.push(format!(
                "endpoint list {} has {} endpoints, its entries say {}",
                r.list,
                list.len(),
                r.count
            ));
        }
        let member_count = self.lists.members.get(&r.list).copied().unwrap_or(0);
        let distinct = list.iter().collect::<BTreeSet<_>>().len();
        if member_count != 0 && member_count != distinct {
            problems.push(format!(
                "endpoint list {} has {distinct} endpoints and {member_count} members",
                r.list,
            ));
        }
        let scheduler = wire::scheduler_of(r.sched);
        if !self.scheduler_state(r) {
            problems.push(format!(
                "endpoint list {} lacks its {scheduler} scheduler's state",
                r.list
            ));
        }
        let list = EndpointList {
            endpoints: list,
            remembered: member_count > 0,
            scheduler,
            maglev_table_size: (r.sched == wire::SCHED_MH)
                .then(|| maglev::SIZES[usize::from(r.mh_size).min(maglev::SIZES.len() - 1)]),
            weights: self.lists.weights.get(&r.list).cloned().unwrap_or_default(),
        };
        match self.names.get(&r.list) {
            Some(name) => {
                t.lists.insert(name.clone(), list);
                Route::Forward(name.clone())
            }
            None => {
                problems.push(format!(
                    "endpoint list {} is no list svcproxy wrote",
                    r.list
                ));
                Route::Reject
            }
        }
    }

    /// Whether a list's scheduler has its state in the maps: rr's turn counter,
    /// every chunk of mh's table.
    fn scheduler_state(&self, r: &wire::Route) -> bool {
        let k = self.kernel;
        match r.sched {
            wire::SCHED_RR | wire::SCHED_WRR => k.rr.get(&r.list, 0).is_ok(),
            wire::SCHED_MH => (0..wire::mh_chunks(r.mh_size)).all(|chunk| {
                k.mh.get(
                    &MhKey {
                        list: r.list,
                        chunk,
                    },
                    0,
                )
                .is_ok()
            }),
            _ => true,
        }
    }
}

/// The service address a `svcproxy_svc` key names; `None` for a key svcproxy
/// does not write (an unknown protocol or family).
pub(super) fn dest_of(k: &SvcKey) -> Option<Dest> {
    let (protocol, family) = (wire::proto_of(k.proto)?, family_of(k.family)?);
    Some(Dest {
        family,
        ip: wire::addr_of(k.addr, k.family),
        protocol,
        port: wire::port_of(k.port),
    })
}

fn family_of(b: u8) -> Option<svcproxy_core::model::IpFamily> {
    match b {
        wire::FAMILY_V4 => Some(svcproxy_core::model::IpFamily::V4),
        wire::FAMILY_V6 => Some(svcproxy_core::model::IpFamily::V6),
        _ => None,
    }
}

/// The addresses a set of addresses (`svcproxy_local`, `svcproxy_vip`) holds;
/// what cannot be read, as problems.
pub(super) fn addrs_in(
    map: &HashMap<MapData, LocalKey, u8>,
    name: &str,
    problems: &mut Vec<String>,
) -> BTreeSet<std::net::IpAddr> {
    let mut out = BTreeSet::new();
    for k in map.keys() {
        match k {
            Ok(k) => out.extend(wire::addr_of(k.addr, k.family)),
            Err(e) => problems.push(format!("reading {name}: {e}")),
        }
    }
    out
}

/// The prefixes a set of prefixes (`svcproxy_podnet`, `svcproxy_guard`) holds;
/// what cannot be read, as problems.
pub(super) fn nets_in(
    map: &LpmTrie<MapData, PodnetData, u8>,
    name: &str,
    problems: &mut Vec<String>,
) -> BTreeSet<IpNet> {
    let mut out = BTreeSet::new();
    for k in map.keys() {
        match k.map(|k| wire::podnet_of(&k)) {
            Ok(Some(net)) => {
                out.insert(net);
            }
            Ok(None) => problems.push(format!("a key of {name} is malformed")),
            Err(e) => problems.push(format!("reading {name}: {e}")),
        }
    }
    out
}
