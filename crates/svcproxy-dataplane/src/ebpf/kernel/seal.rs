//! A hand-over's seal ([`write_seal`], [`seals`], [`unseal`]) and its adoption
//! ([`Kernel::adopt`]).
//!
//! **The seal** is a directory `sealed-<seal>` in the pin directory (a bpffs
//! holds pins and directories, no files): the stopping owner makes it after a
//! successful sync, naming what its first sync of the same intent would write;
//! any full write of a later process removes it.
//!
//! **Adoption** takes the maps as they are: each list's id is read from the
//! service entries that name it, and the maps, read back under those names,
//! must hold exactly the table (entries, lists with their schedulers' state,
//! addresses, source ranges, marks). Then the process's record of its last
//! write is the predecessor's, and its next write changes in place what the
//! intent changes; nothing of the maps is rewritten, so the connection table,
//! the masquerade's ports, the lc counts and the rr turns go on as they were.

use std::path::Path;

use super::write::{encode, local_key, Written};
use super::{kernel_err, HashMap2, Kernel};
use crate::ebpf::wire;
use crate::error::DataPlaneError;
use svcproxy_plan::ebpf::{ListName, Route, Table};

const PREFIX: &str = "sealed-";

/// The seals in `pin_dir` (normally none or one).
pub fn seals(pin_dir: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(pin_dir) else {
        return Vec::new();
    };
    let mut out: Vec<String> = dir
        .filter_map(Result::ok)
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix(PREFIX)
                .map(String::from)
        })
        .collect();
    out.sort();
    out
}

/// Removes every seal; returns how many there were.
pub fn unseal(pin_dir: &Path) -> Result<usize, DataPlaneError> {
    let found = seals(pin_dir);
    for s in &found {
        let dir = pin_dir.join(format!("{PREFIX}{s}"));
        match std::fs::remove_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(kernel_err(format!("removing {}", dir.display()), e)),
        }
    }
    Ok(found.len())
}

/// Seals the maps with `seal` (only seal: any other is removed first).
pub fn write_seal(pin_dir: &Path, seal: &str) -> Result<(), DataPlaneError> {
    if seal.is_empty() || !seal.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(kernel_err(
            "sealing the maps",
            format!("{seal:?} is not a seal"),
        ));
    }
    unseal(pin_dir)?;
    let dir = pin_dir.join(format!("{PREFIX}{seal}"));
    std::fs::create_dir(&dir).map_err(|e| kernel_err(format!("creating {}", dir.display()), e))
}

impl Kernel {
    /// Whether the last write succeeded and nothing unknown is in the maps
    /// (what a seal vouches for).
    pub fn in_step(&self) -> bool {
        self.written.is_some() && !self.unknown_keys
    }

    /// Takes the maps as they are if they hold exactly `table`: the record of
    /// the last write is rebuilt from them, the packet programs attached to the
    /// node's interfaces, and lists no entry names (none, after a sealed sync)
    /// dropped. `Ok(false)`, with the maps untouched and the next write a full
    /// one, when they differ; the differences are logged.
    pub fn adopt(&mut self, table: &Table) -> Result<bool, DataPlaneError> {
        let Some(w) = self.recorded(table) else {
            return Ok(false);
        };
        self.written = Some(w);
        let (mut have, problems) = self.read();
        have.pod_interfaces = table.pod_interfaces.clone();
        let differences = crate::ebpf::table_differences(table, &have);
        if !problems.is_empty() || !differences.is_empty() {
            tracing::info!(
                problems = ?problems.iter().take(5).collect::<Vec<_>>(),
                differences = ?differences.iter().take(5).collect::<Vec<_>>(),
                "the sealed maps differ from this sync's table"
            );
            self.written = None;
            return Ok(false);
        }
        // Until both are done the maps may hold what nobody recorded: a failure
        // leaves the next write a full one that sweeps.
        let done = self
            .attach_interfaces(table)
            .and_then(|_| self.drop_unnamed_lists());
        if let Err(e) = done {
            self.written = None;
            return Err(e);
        }
        self.unknown_keys = false;
        Ok(true)
    }

    /// The record of a write of `table` whose lists have the ids the service
    /// entries in the maps name; `None` when an entry is missing or names two
    /// ids for one list.
    fn recorded(&self, table: &Table) -> Option<Written> {
        let mut ids: HashMap2<ListName, u32> = HashMap2::new();
        // Each entry's value as the maps hold it, read once, in the table's order.
        let mut held = Vec::with_capacity(table.entries.len());
        for (dest, entry) in &table.entries {
            let (key, _) = encode(dest, entry, &Default::default());
            let have = self.svc.get(&key, 0).ok()?;
            held.push(have);
            let routes = [
                (&entry.pod, have.pod),
                (&entry.host, have.host),
                (&entry.packet_pod.route, have.pkt_pod),
                (&entry.packet_other.route, have.pkt_other),
            ];
            for (want, have) in routes {
                if let Route::Forward(name) = want {
                    if have.action != wire::ACT_FORWARD {
                        return None;
                    }
                    if *ids.entry(name.clone()).or_insert(have.list) != have.list {
                        return None;
                    }
                }
            }
        }
        let mut w = Written::default();
        for (name, list) in &table.lists {
            // A list no entry names is not written (a first sync would name it).
            if let Some(id) = ids.get(name) {
                w.lists.insert(name.clone(), (*id, list.clone()));
            }
        }
        for ((dest, entry), have) in table.entries.iter().zip(held) {
            let (key, value) = encode(dest, entry, &w.lists);
            // Every field as this process would write it (the affinity's id,
            // the source ranges' id, the schedulers' bytes), not only what the
            // read-back below renders.
            if have != value {
                return None;
            }
            w.entries.insert(*dest, (key, value));
        }
        w.local = table.local_addrs.iter().map(local_key).collect();
        w.vips = table.cluster_ips.keys().map(local_key).collect();
        w.guard = table.guard_cidrs.iter().copied().collect();
        w.pod_cidrs = table.pod_cidrs.iter().copied().collect();
        w.firewalls = table
            .firewalls
            .iter()
            .map(|(port, nets)| (port.id(), (port.clone(), nets.clone())))
            .collect();
        Some(w)
    }
}
