//! A table written into the maps ([`Kernel::write`]): the marks and the
//! interfaces, then either everything under fresh list ids with whatever else
//! the maps hold deleted ([`Kernel::write_all`]), or only what the changes name
//! ([`Kernel::write_changes`]): the sources fenced ports admit, the endpoint
//! lists, the service entries ([`encode`]) and the addresses; then the maps'
//! generation moves. What the last write left is remembered ([`Written`]).

use std::collections::{BTreeMap, BTreeSet};

use aya::maps::IterableMap;
use ipnet::IpNet;

use super::lists::ListBatch;
use super::maps::{lpm_parts, lpm_remove_unless, remove, remove_unless, removed};
use super::overflow::Overflow;
use super::{kernel_err, HashMap2, Kernel};
use crate::ebpf::batch;
use crate::ebpf::wire::{self, Config, FwData, LocalKey, PodnetData, SvcKey, SvcVal};
use crate::error::DataPlaneError;
use svcproxy_plan::ebpf::{
    Changes, Dest, EndpointList, Entry, ListName, Masquerade, PortName, Route, Table,
};

/// The maps as last written: each list's id and contents, and each entry's key
/// and encoded value.
#[derive(Default)]
pub(super) struct Written {
    pub(super) lists: HashMap2<ListName, (u32, EndpointList)>,
    pub(super) entries: HashMap2<Dest, (SvcKey, SvcVal)>,
    pub(super) local: BTreeSet<LocalKey>,
    /// The guard's cluster IPs and ServiceCIDRs.
    pub(super) vips: BTreeSet<LocalKey>,
    pub(super) guard: BTreeSet<IpNet>,
    /// Each fenced port's admitted sources, by the port's id.
    pub(super) firewalls: BTreeMap<u64, (PortName, Vec<IpNet>)>,
    pub(super) pod_cidrs: BTreeSet<IpNet>,
}

pub(super) fn local_key(ip: &std::net::IpAddr) -> LocalKey {
    LocalKey {
        addr: wire::addr_words(Some(*ip)),
        family: wire::family_byte(svcproxy_core::model::IpFamily::of(ip)),
        pad: [0; 3],
    }
}

impl Kernel {
    /// Brings the maps to `table`. With `changes` (and a known last write), only
    /// the entries and lists named there are compared and written; otherwise
    /// everything is written under fresh list ids and whatever else the maps hold
    /// is deleted. Returns the number of map writes and deletions.
    pub fn write(
        &mut self,
        table: &Table,
        changes: Option<&Changes>,
    ) -> Result<usize, DataPlaneError> {
        // Until this write succeeds, the maps hold what nobody recorded.
        let unknown = std::mem::replace(&mut self.unknown_keys, true);
        let result = self.write_marks(table).and_then(|marks| {
            let ifaces = self.attach_interfaces(table)?;
            let maps = match (changes, self.written.take()) {
                (Some(changes), Some(written)) => self.write_changes(table, changes, written),
                (_, before) => self.write_all(table, before, unknown),
            }?;
            self.bump_generation()?;
            Ok(marks + ifaces + maps + 1)
        });
        self.unknown_keys = result.is_err();
        result
    }

    /// Everything under fresh ids; then what the last write left (or, when it is
    /// unknown, anything else the maps hold) is deleted.
    fn write_all(
        &mut self,
        table: &Table,
        before: Option<Written>,
        unknown: bool,
    ) -> Result<usize, DataPlaneError> {
        let mut ops = 0usize;
        if unknown {
            // Lists no entry names (a failed write's, or a predecessor's leftovers)
            // go first: the new lists need room beside the ones in use.
            ops += self.drop_unnamed_lists()?;
        }
        let mut w = Written::default();
        self.overflow = Overflow::default();
        // A list that finds no room beside the old ones keeps its old id when its
        // endpoints are unchanged (only with a record of what the maps hold).
        let known = before.as_ref().filter(|_| !unknown);
        ops += self.write_all_lists(table, known, &mut w)?;
        ops += self.write_all_fences(table, &mut w)?;
        ops += self.write_all_entries(table, &mut w)?;
        ops += self.write_all_addresses(table, &mut w)?;
        match before {
            Some(before) if !unknown => ops += self.remove_stale(&before, &w)?,
            _ if unknown => ops += self.sweep(&w)?,
            _ => {}
        }
        self.overflow.report(&self.sizes);
        self.written = Some(w);
        Ok(ops)
    }

    /// Every endpoint list under a fresh id: in one batch, else (no room for them
    /// all) list by list, each whole or not at all. A list that does not fit
    /// keeps the id it had when `before` records it there with the same
    /// endpoints: a full sync needs room only for the lists that changed, not
    /// for a second copy of every list. Any other list that does not fit leaves
    /// its entries rejecting.
    fn write_all_lists(
        &mut self,
        table: &Table,
        before: Option<&Written>,
        w: &mut Written,
    ) -> Result<usize, DataPlaneError> {
        let mut ops = 0usize;
        let mut batch = ListBatch::default();
        let mut fresh = Vec::new();
        for (name, list) in &table.lists {
            let id = self.fresh_id();
            batch.add(id, list);
            fresh.push((name, id, list));
        }
        match self.write_lists(&batch) {
            Ok(n) => {
                ops += n;
                for (name, id, list) in fresh {
                    w.lists.insert(name.clone(), (id, list.clone()));
                }
            }
            // No room for them all: list by list, each whole or not at all (a
            // list that does not fit leaves its entries rejecting).
            Err(DataPlaneError::MapFull { .. }) => {
                for (name, id, list) in fresh {
                    match self.write_list(id, list) {
                        Ok(n) => {
                            ops += n;
                            w.lists.insert(name.clone(), (id, list.clone()));
                        }
                        Err(DataPlaneError::MapFull { map, .. }) => {
                            ops += self.delete_list(id, list)?;
                            let kept = before
                                .and_then(|b| b.lists.get(name))
                                .filter(|(_, old)| old == list);
                            match kept {
                                Some((old_id, _)) => {
                                    w.lists.insert(name.clone(), (*old_id, list.clone()));
                                }
                                None => {
                                    self.overflow.note(map, list.endpoints.len(), &name.service)
                                }
                            }
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            Err(e) => return Err(e),
        }
        Ok(ops)
    }

    /// The sources fenced entries admit, and the pod CIDRs, before the entries.
    fn write_all_fences(
        &mut self,
        table: &Table,
        w: &mut Written,
    ) -> Result<usize, DataPlaneError> {
        let mut ops = 0usize;
        for (port, nets) in &table.firewalls {
            ops += self.write_firewall(port, nets, &[])?;
            w.firewalls.insert(port.id(), (port.clone(), nets.clone()));
        }
        for net in &table.pod_cidrs {
            self.podnet
                .insert(&wire::podnet_key(net), 1, 0)
                .map_err(|e| kernel_err(format!("writing pod CIDR {net}"), e))?;
            ops += 1;
            w.pod_cidrs.insert(*net);
        }
        Ok(ops)
    }

    /// Every service entry: in one batch, then one by one those that fit when
    /// the map has no room for the batch.
    fn write_all_entries(
        &mut self,
        table: &Table,
        w: &mut Written,
    ) -> Result<usize, DataPlaneError> {
        let mut ops = 0usize;
        let (mut keys, mut values, mut dests) = (Vec::new(), Vec::new(), Vec::new());
        for (dest, entry) in &table.entries {
            let (k, v) = encode(dest, entry, &w.lists);
            keys.push(k);
            values.push(v);
            dests.push((dest, entry));
        }
        let written = match batch::update(self.svc.map(), &keys, &values) {
            Ok(()) => keys.len(),
            Err((n, e)) if e.raw_os_error() == Some(libc::E2BIG) => n,
            Err((n, e)) => {
                return Err(kernel_err(
                    format!("writing service entries (after {n})"),
                    e,
                ));
            }
        };
        ops += written;
        for i in 0..keys.len() {
            if i >= written {
                // No room left for the batch: one by one, those that fit.
                match self.svc.insert(keys[i], values[i], 0) {
                    Ok(()) => ops += 1,
                    Err(e) if map_full(&e) => {
                        self.overflow
                            .note("svcproxy_svc", 1, &entry_port(dests[i].1));
                        continue;
                    }
                    Err(e) => return Err(kernel_err(format!("writing service {}", dests[i].0), e)),
                }
            }
            w.entries.insert(*dests[i].0, (keys[i], values[i]));
        }
        Ok(ops)
    }

    /// This node's addresses, the cluster IPs (to refuse their unexposed ports)
    /// and the ServiceCIDRs.
    fn write_all_addresses(
        &mut self,
        table: &Table,
        w: &mut Written,
    ) -> Result<usize, DataPlaneError> {
        let mut ops = 0usize;
        for ip in &table.local_addrs {
            let k = local_key(ip);
            self.local
                .insert(k, 1, 0)
                .map_err(|e| kernel_err(format!("writing local address {ip}"), e))?;
            ops += 1;
            w.local.insert(k);
        }
        for ip in table.cluster_ips.keys() {
            let k = local_key(ip);
            match self.vip.insert(k, 1, 0) {
                Ok(()) => {
                    ops += 1;
                    w.vips.insert(k);
                }
                // No room: that cluster IP's unexposed ports are not refused.
                Err(e) if map_full(&e) => self.overflow.note_keys("svcproxy_vip", 1),
                Err(e) => return Err(kernel_err(format!("writing cluster IP {ip}"), e)),
            }
        }
        for net in &table.guard_cidrs {
            self.guard
                .insert(&wire::podnet_key(net), 1, 0)
                .map_err(|e| kernel_err(format!("writing ServiceCIDR {net}"), e))?;
            ops += 1;
            w.guard.insert(*net);
        }
        Ok(ops)
    }

    /// What the previous write held and this one does not.
    fn remove_stale(&mut self, before: &Written, w: &Written) -> Result<usize, DataPlaneError> {
        let mut ops = 0usize;
        let keys: BTreeSet<SvcKey> = w.entries.values().map(|(k, _)| *k).collect();
        for (k, _) in before.entries.values().filter(|(k, _)| !keys.contains(k)) {
            ops += remove(&mut self.svc, k)?;
        }
        for k in before.local.iter().filter(|k| !w.local.contains(k)) {
            ops += remove(&mut self.local, k)?;
        }
        // (A list kept under its id, for want of room for a fresh copy, stays.)
        let kept: BTreeSet<u32> = w.lists.values().map(|(id, _)| *id).collect();
        for (id, list) in before.lists.values().filter(|(id, _)| !kept.contains(id)) {
            ops += self.delete_list(*id, list)?;
        }
        for (id, (_, nets)) in &before.firewalls {
            let now = w.firewalls.get(id).map_or(&[][..], |(_, n)| n);
            ops += self.delete_firewall(*id, nets, now)?;
        }
        for net in before.pod_cidrs.difference(&w.pod_cidrs) {
            ops += removed(self.podnet.remove(&wire::podnet_key(net)), net)?;
        }
        for k in before.vips.difference(&w.vips) {
            ops += remove(&mut self.vip, k)?;
        }
        for net in before.guard.difference(&w.guard) {
            ops += removed(self.guard.remove(&wire::podnet_key(net)), net)?;
        }
        Ok(ops)
    }

    /// Only what `changes` names: a list that differs is written whole under a
    /// fresh id before the entries switch to it, and deleted after.
    fn write_changes(
        &mut self,
        table: &Table,
        changes: &Changes,
        mut w: Written,
    ) -> Result<usize, DataPlaneError> {
        let overflow_before = self.overflow.clone();
        // Sources admitted before the entries that need them; those no longer
        // admitted go after.
        let (mut ops, fenced) = self.write_changed_fences(table, changes, &mut w)?;
        let (n, retired) = self.write_changed_lists(table, changes, &mut w)?;
        ops += n;
        ops += self.write_changed_entries(table, changes, &mut w)?;
        ops += self.write_changed_addresses(table, changes, &mut w)?;
        for (id, list) in &retired {
            ops += self.delete_list(*id, list)?;
        }
        for (id, old) in fenced {
            let now = w.firewalls.get(&id).map_or(&[][..], |(_, n)| n);
            ops += self.delete_firewall(id, &old, now)?;
        }
        if self.overflow != overflow_before {
            self.overflow.report(&self.sizes);
        }
        self.written = Some(w);
        Ok(ops)
    }

    /// The changed ports' admitted sources, written; returns what each admitted
    /// before, to be taken away once the entries no longer need it.
    #[allow(clippy::type_complexity)]
    fn write_changed_fences(
        &mut self,
        table: &Table,
        changes: &Changes,
        w: &mut Written,
    ) -> Result<(usize, Vec<(u64, Vec<IpNet>)>), DataPlaneError> {
        let mut ops = 0usize;
        let mut fenced: Vec<(u64, Vec<IpNet>)> = Vec::new();
        for port in &changes.firewalls {
            let id = port.id();
            let new = table.firewalls.get(port);
            let old = w.firewalls.remove(&id).map(|(_, n)| n).unwrap_or_default();
            if let Some(nets) = new {
                ops += self.write_firewall(port, nets, &old)?;
                w.firewalls.insert(id, (port.clone(), nets.clone()));
            }
            fenced.push((id, old));
        }
        Ok((ops, fenced))
    }

    /// The changed endpoint lists, each under a fresh id; returns the lists they
    /// replace, to be deleted once no entry names them.
    fn write_changed_lists(
        &mut self,
        table: &Table,
        changes: &Changes,
        w: &mut Written,
    ) -> Result<(usize, Vec<(u32, EndpointList)>), DataPlaneError> {
        let mut ops = 0usize;
        let mut retired: Vec<(u32, EndpointList)> = Vec::new();
        for name in &changes.lists {
            let new = table.lists.get(name);
            match (w.lists.get(name), new) {
                (Some((_, old)), Some(new)) if old == new => {}
                (_, Some(new)) => {
                    let id = self.fresh_id();
                    match self.write_list(id, new) {
                        Ok(n) => {
                            ops += n;
                            retired.extend(w.lists.insert(name.clone(), (id, new.clone())));
                        }
                        // No room: the entries keep the list they name (its old
                        // endpoints) until there is; a new list is not written and
                        // its entries refuse.
                        Err(DataPlaneError::MapFull { map, .. }) => {
                            self.delete_list(id, new)?;
                            self.overflow.note(map, new.endpoints.len(), &name.service);
                        }
                        Err(e) => return Err(e),
                    }
                }
                (Some(_), None) => retired.extend(w.lists.remove(name)),
                (None, None) => {}
            }
        }
        Ok((ops, retired))
    }

    /// The changed service entries, written or removed.
    fn write_changed_entries(
        &mut self,
        table: &Table,
        changes: &Changes,
        w: &mut Written,
    ) -> Result<usize, DataPlaneError> {
        let mut ops = 0usize;
        for dest in &changes.entries {
            match table.entries.get(dest) {
                Some(entry) => {
                    let (k, v) = encode(dest, entry, &w.lists);
                    if w.entries.get(dest) != Some(&(k, v)) {
                        match self.svc.insert(k, v, 0) {
                            Ok(()) => {
                                ops += 1;
                                w.entries.insert(*dest, (k, v));
                            }
                            Err(e) if map_full(&e) => {
                                self.overflow.note("svcproxy_svc", 1, &entry_port(entry));
                            }
                            Err(e) => {
                                return Err(kernel_err(format!("writing service {dest}"), e));
                            }
                        }
                    }
                }
                None => {
                    if let Some((k, _)) = w.entries.remove(dest) {
                        ops += remove(&mut self.svc, &k)?;
                    }
                }
            }
        }
        Ok(ops)
    }

    /// This node's addresses, and the changed cluster IPs.
    fn write_changed_addresses(
        &mut self,
        table: &Table,
        changes: &Changes,
        w: &mut Written,
    ) -> Result<usize, DataPlaneError> {
        let mut ops = 0usize;
        let local: BTreeSet<LocalKey> = table.local_addrs.iter().map(local_key).collect();
        for k in local.difference(&w.local) {
            self.local
                .insert(*k, 1, 0)
                .map_err(|e| kernel_err("writing a local address", e))?;
            ops += 1;
        }
        for k in w.local.difference(&local) {
            ops += remove(&mut self.local, k)?;
        }
        w.local = local;
        for ip in &changes.cluster_ips {
            let k = local_key(ip);
            match (table.cluster_ips.contains_key(ip), w.vips.contains(&k)) {
                (true, false) => match self.vip.insert(k, 1, 0) {
                    Ok(()) => {
                        ops += 1;
                        w.vips.insert(k);
                    }
                    Err(e) if map_full(&e) => self.overflow.note_keys("svcproxy_vip", 1),
                    Err(e) => return Err(kernel_err(format!("writing cluster IP {ip}"), e)),
                },
                (false, true) => {
                    ops += remove(&mut self.vip, &k)?;
                    w.vips.remove(&k);
                }
                _ => {}
            }
        }
        Ok(ops)
    }

    /// The sources of fenced `port` that `old` lacks.
    fn write_firewall(
        &mut self,
        port: &PortName,
        nets: &[IpNet],
        old: &[IpNet],
    ) -> Result<usize, DataPlaneError> {
        let id = port.id();
        let mut ops = 0;
        for net in nets.iter().filter(|n| !old.contains(n)) {
            self.fw
                .insert(&wire::fw_key(id, net), 1, 0)
                .map_err(|e| kernel_err(format!("writing source range {net} of {port}"), e))?;
            ops += 1;
        }
        Ok(ops)
    }

    /// The sources of fenced port `id` in `old` that `now` lacks.
    fn delete_firewall(
        &mut self,
        id: u64,
        old: &[IpNet],
        now: &[IpNet],
    ) -> Result<usize, DataPlaneError> {
        let mut ops = 0;
        for net in old.iter().filter(|n| !now.contains(n)) {
            ops += removed(self.fw.remove(&wire::fw_key(id, net)), net)?;
        }
        Ok(ops)
    }

    /// Deletes every key the maps hold beyond what `w` wrote.
    fn sweep(&mut self, w: &Written) -> Result<usize, DataPlaneError> {
        let entries: BTreeSet<SvcKey> = w.entries.values().map(|(k, _)| *k).collect();
        let ids: BTreeSet<u32> = w.lists.values().map(|(id, _)| *id).collect();
        let fw: BTreeSet<(u32, FwData)> = w
            .firewalls
            .iter()
            .flat_map(|(id, (_, nets))| nets.iter().map(|n| lpm_parts(&wire::fw_key(*id, n))))
            .collect();
        let pod: BTreeSet<(u32, PodnetData)> = w
            .pod_cidrs
            .iter()
            .map(|n| lpm_parts(&wire::podnet_key(n)))
            .collect();
        let guard: BTreeSet<(u32, PodnetData)> = w
            .guard
            .iter()
            .map(|n| lpm_parts(&wire::podnet_key(n)))
            .collect();
        Ok(remove_unless(&mut self.svc, |k| entries.contains(k))?
            + remove_unless(&mut self.local, |k| w.local.contains(k))?
            + self.drop_lists_but(&ids)?
            + lpm_remove_unless(&mut self.fw, |k| fw.contains(&lpm_parts(k)))?
            + lpm_remove_unless(&mut self.podnet, |k| pod.contains(&lpm_parts(k)))?
            + remove_unless(&mut self.vip, |k| w.vips.contains(k))?
            + lpm_remove_unless(&mut self.guard, |k| guard.contains(&lpm_parts(k)))?)
    }

    /// The marks in the programs' configuration follow the table's.
    fn write_marks(&mut self, table: &Table) -> Result<usize, DataPlaneError> {
        if (self.config.masquerade_mark, self.config.reject_mark)
            == (table.masquerade_mark, table.reject_mark)
        {
            return Ok(0);
        }
        self.set_config(Config {
            masquerade_mark: table.masquerade_mark,
            reject_mark: table.reject_mark,
            ..self.config
        })?;
        Ok(1)
    }

    /// The programs' configuration written, and remembered.
    fn set_config(&mut self, config: Config) -> Result<(), DataPlaneError> {
        self.cfg
            .set(0, config, 0)
            .map_err(|e| kernel_err("writing svcproxy_cfg", e))?;
        self.config = config;
        Ok(())
    }

    /// The maps' generation moves on (the XDP program's cache goes stale).
    pub(super) fn bump_generation(&mut self) -> Result<(), DataPlaneError> {
        self.set_config(Config {
            generation: self.config.generation.wrapping_add(1).max(1),
            ..self.config
        })
    }

    /// The entries the maps svcproxy fills hold now, by map.
    pub fn fill(&self) -> Vec<(&'static str, usize)> {
        let Some(w) = self.written.as_ref() else {
            return Vec::new();
        };
        let slots: usize = w.lists.values().map(|(_, l)| l.endpoints.len()).sum();
        let members: usize = w
            .lists
            .values()
            .filter(|(_, l)| l.remembered)
            .map(|(_, l)| l.endpoints.len())
            .sum();
        vec![
            ("svcproxy_svc", w.entries.len()),
            ("svcproxy_slot", slots),
            ("svcproxy_member", members),
        ]
    }
}

pub(super) fn encode(
    dest: &Dest,
    entry: &Entry,
    lists: &HashMap2<ListName, (u32, EndpointList)>,
) -> (SvcKey, SvcVal) {
    let key = SvcKey {
        addr: wire::addr_words(dest.ip),
        port: wire::port_word(dest.port),
        proto: wire::proto_byte(dest.protocol),
        family: wire::family_byte(dest.family),
    };
    let route = |r: &Route, flags: u8| {
        let (action, list, count, (sched, mh_size)) = match r {
            Route::Forward(name) => match lists.get(name) {
                Some((id, list)) => (
                    wire::ACT_FORWARD,
                    *id,
                    list.endpoints.len() as u32,
                    wire::sched_bytes(list),
                ),
                None => (wire::ACT_REJECT, 0, 0, (0, 0)),
            },
            Route::Drop => (wire::ACT_DROP, 0, 0, (0, 0)),
            Route::Reject => (wire::ACT_REJECT, 0, 0, (0, 0)),
            Route::Pass => (wire::ACT_PASS, 0, 0, (0, 0)),
        };
        wire::Route {
            list,
            count,
            action,
            flags: if action == wire::ACT_FORWARD {
                flags
            } else {
                0
            },
            sched,
            mh_size,
        }
    };
    let masq = |m: bool| if m { wire::ROUTE_MASQUERADE } else { 0 };
    let (affinity_id, affinity_secs) = entry.affinity.unwrap_or((0, 0));
    (
        key,
        SvcVal {
            pod: route(&entry.pod, 0),
            host: route(
                &entry.host,
                match entry.host_masquerade {
                    Masquerade::Never => 0,
                    Masquerade::Always => wire::ROUTE_MASQUERADE,
                    Masquerade::UnlessFromLocalPod => wire::ROUTE_MASQUERADE_UNLESS_POD,
                },
            ),
            pkt_pod: route(&entry.packet_pod.route, masq(entry.packet_pod.masquerade)),
            pkt_other: route(
                &entry.packet_other.route,
                masq(entry.packet_other.masquerade),
            ),
            affinity_id,
            fw_id: entry.firewall.as_ref().map_or(0, PortName::id),
            affinity_secs,
            pad: 0,
        },
    )
}

/// Whether a map update failed for want of room.
fn map_full(e: &aya::maps::MapError) -> bool {
    matches!(e, aya::maps::MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::E2BIG))
}

/// The service port an entry's routes belong to, for overflow reports.
fn entry_port(entry: &Entry) -> String {
    [
        &entry.pod,
        &entry.host,
        &entry.packet_pod.route,
        &entry.packet_other.route,
    ]
    .into_iter()
    .find_map(|r| match r {
        Route::Forward(l) => Some(l.service.to_string()),
        _ => None,
    })
    .or_else(|| entry.firewall.as_ref().map(|p| p.service.to_string()))
    .unwrap_or_else(|| "a service without endpoints".to_string())
}
