//! The endpoint lists in the maps: their slots, members and schedulers' state
//! (round-robin turns, Maglev tables), gathered for batched writes
//! ([`ListBatch`]), written under a fresh id ([`Kernel::write_lists`]) and
//! deleted; the lists no entry names dropped; and the first id a process gives
//! ([`next_list_id`]).

use std::collections::BTreeSet;

use aya::maps::{HashMap, IterableMap, MapData};

use super::maps::{remove, remove_unless};
use super::{kernel_err, Kernel};
use crate::ebpf::batch;
use crate::ebpf::wire::{self, Backend, MemberKey, MhKey, MhVal, SlotKey, SvcKey, SvcVal};
use crate::error::DataPlaneError;
use svcproxy_plan::ebpf::{maglev, EndpointList};

/// Lists' keys and values gathered for batched writes.
#[derive(Default)]
pub(super) struct ListBatch {
    slots: Vec<SlotKey>,
    backends: Vec<Backend>,
    members: Vec<MemberKey>,
    /// Round-robin lists' turns, from 0.
    turns: Vec<u32>,
    /// Maglev lists' tables.
    mh_keys: Vec<MhKey>,
    mh_vals: Vec<MhVal>,
}

impl ListBatch {
    pub(super) fn add(&mut self, id: u32, list: &EndpointList) {
        match wire::sched_bytes(list) {
            (wire::SCHED_RR | wire::SCHED_WRR, _) => self.turns.push(id),
            (wire::SCHED_MH, size) => {
                let cells = maglev::SIZES[usize::from(size)];
                if let Some(table) = maglev::table(&list.endpoints, cells) {
                    for (k, v) in wire::mh_entries(id, &table) {
                        self.mh_keys.push(k);
                        self.mh_vals.push(v);
                    }
                }
            }
            _ => {}
        }
        // A weighted list holds an endpoint in several slots: one member each.
        let mut seen = std::collections::HashSet::new();
        for (slot, ep) in list.endpoints.iter().enumerate() {
            let mut be = Backend::of(*ep);
            be.pad = list.weights.get(slot).copied().unwrap_or(0);
            if list.remembered && seen.insert(*ep) {
                self.members.push(MemberKey::of(id, &be));
            }
            self.slots.push(SlotKey {
                list: id,
                slot: slot as u32,
            });
            self.backends.push(be);
        }
    }
}

/// The first list id to give: past every id in use, the entries' included (a
/// slot map made afresh, resized, must not hand out an id the pinned entries
/// still name).
pub(super) fn next_list_id(
    slot: &HashMap<MapData, SlotKey, Backend>,
    svc: &HashMap<MapData, SvcKey, SvcVal>,
) -> u32 {
    slot.keys()
        .filter_map(Result::ok)
        .map(|k| k.list)
        .chain(
            svc.iter()
                .filter_map(Result::ok)
                .flat_map(|(_, v)| [v.pod, v.host, v.pkt_pod, v.pkt_other])
                .map(|r| r.list),
        )
        .max()
        .map_or(1, |m| m.wrapping_add(1).max(1))
}

impl Kernel {
    pub(super) fn fresh_id(&mut self) -> u32 {
        let id = self.next_list;
        self.next_list = self.next_list.wrapping_add(1).max(1);
        id
    }

    /// The list's slots, and its members when clients remember endpoints of it.
    pub(super) fn write_list(
        &mut self,
        id: u32,
        list: &EndpointList,
    ) -> Result<usize, DataPlaneError> {
        let mut batch = ListBatch::default();
        batch.add(id, list);
        self.write_lists(&batch)
    }

    pub(super) fn write_lists(&mut self, b: &ListBatch) -> Result<usize, DataPlaneError> {
        let err = |map: &'static str, what: &str, n: usize, e: std::io::Error| {
            if e.raw_os_error() == Some(libc::E2BIG) {
                DataPlaneError::MapFull {
                    map,
                    what: format!("writing {what} (after {n})"),
                }
            } else {
                kernel_err(format!("writing {what} (after {n})"), e)
            }
        };
        batch::update(self.slot.map(), &b.slots, &b.backends)
            .map_err(|(n, e)| err("svcproxy_slot", "endpoints", n, e))?;
        let ones = vec![1u8; b.members.len()];
        batch::update(self.member.map(), &b.members, &ones)
            .map_err(|(n, e)| err("svcproxy_member", "endpoint members", n, e))?;
        let zeros = vec![0u64; b.turns.len()];
        batch::update(self.rr.map(), &b.turns, &zeros)
            .map_err(|(n, e)| err("svcproxy_rr", "round-robin turns", n, e))?;
        batch::update(self.mh.map(), &b.mh_keys, &b.mh_vals)
            .map_err(|(n, e)| err("svcproxy_mh", "Maglev tables", n, e))?;
        Ok(b.slots.len() + b.members.len() + b.turns.len() + b.mh_keys.len())
    }

    pub(super) fn delete_list(
        &mut self,
        id: u32,
        list: &EndpointList,
    ) -> Result<usize, DataPlaneError> {
        let mut ops = 0;
        for (slot, ep) in list.endpoints.iter().enumerate() {
            let key = SlotKey {
                list: id,
                slot: slot as u32,
            };
            ops += remove(&mut self.slot, &key)?;
            if list.remembered {
                ops += remove(&mut self.member, &MemberKey::of(id, &Backend::of(*ep)))?;
            }
        }
        match wire::sched_bytes(list) {
            (wire::SCHED_RR | wire::SCHED_WRR, _) => ops += remove(&mut self.rr, &id)?,
            (wire::SCHED_MH, size) => {
                for chunk in 0..wire::mh_chunks(size) {
                    ops += remove(&mut self.mh, &MhKey { list: id, chunk })?;
                }
            }
            _ => {}
        }
        Ok(ops)
    }

    /// Deletes the slots and members of every list no service entry names.
    pub(super) fn drop_unnamed_lists(&mut self) -> Result<usize, DataPlaneError> {
        let named: BTreeSet<u32> = self
            .svc
            .iter()
            .filter_map(Result::ok)
            .flat_map(|(_, v)| [v.pod, v.host, v.pkt_pod, v.pkt_other])
            .filter(|r| r.action == wire::ACT_FORWARD)
            .map(|r| r.list)
            .collect();
        self.drop_lists_but(&named)
    }

    /// Deletes the slots and members of every list but `ids`.
    pub(super) fn drop_lists_but(&mut self, ids: &BTreeSet<u32>) -> Result<usize, DataPlaneError> {
        Ok(remove_unless(&mut self.slot, |k| ids.contains(&k.list))?
            + remove_unless(&mut self.member, |k| ids.contains(&k.list))?
            + remove_unless(&mut self.rr, |k| ids.contains(k))?
            + remove_unless(&mut self.mh, |k| ids.contains(&k.list))?)
    }
}
