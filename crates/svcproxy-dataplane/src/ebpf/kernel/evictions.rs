//! The LRU maps under pressure: how full each is ([`lru_fill`], counted from
//! the pins at each scrape, since the programs fill them without svcproxy), and
//! their evictions counted per map ([`Evictions`]): `bpf/evict.c`, an
//! fexit program on the kernel function an LRU hash map calls when it evicts a
//! live entry to make room, counts the evictions of the maps whose ids this
//! process gives it (its own, by their pins). An evicted entry may still have
//! been wanted (a live connection's endpoint or masquerade, an unconnected UDP
//! reply's source, a session's endpoint, a live-connection count), or be one an
//! LRU map keeps until it needs the room (a connection long closed): the kernel
//! cannot tell them apart, so a steady rate of evictions is the signal, not one.
//!
//! Optional: a tracing program needs `CAP_PERFMON` (beside `CAP_BPF`) and a
//! kernel with BPF trampolines. Without them the mode runs as before, the
//! counters are absent and the log says why once. Not pinned: the program and
//! its counts are this process's (a restart starts the counters again, as any
//! Prometheus counter; evictions while no svcproxy runs are not counted).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use aya::maps::{HashMap, MapData};
use aya::programs::FExit;
use aya::{Btf, Ebpf, EbpfLoader};

use super::kernel_err;
use crate::error::DataPlaneError;

/// The program, built by build.rs (empty when clang was missing).
static EVICT_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/evict.o"));

/// The kernel function an LRU hash map calls to take back an entry it evicts
/// (kernel/bpf/hashtab.c).
const HOOK: &str = "htab_lru_map_delete_node";

/// The LRU maps, by the names pinned: the maps whose entries the kernel may
/// evict.
pub const LRU_MAPS: [&str; 10] = [
    "svcproxy_ct",
    "svcproxy_remap",
    "svcproxy_rev",
    "svcproxy_flow",
    "svcproxy_aff",
    "svcproxy_affip",
    "svcproxy_conns",
    "svcproxy_flows",
    "svcproxy_xdp_nat",
    "svcproxy_udpsock",
];

/// Each LRU map pinned in `pin_dir`: its entries now and its size. A map that
/// cannot be read is left out (and logged at debug).
pub fn lru_fill(pin_dir: &Path) -> Vec<(&'static str, usize, u32)> {
    let mut out = Vec::new();
    for name in LRU_MAPS {
        let pin = pin_dir.join(name);
        let read = MapData::from_pin(&pin)
            .map_err(|e| e.to_string())
            .and_then(|m| {
                let info = m.info().map_err(|e| e.to_string())?;
                let n = crate::ebpf::batch::count(
                    &m,
                    info.key_size() as usize,
                    info.value_size() as usize,
                )
                .map_err(|e| e.to_string())?;
                Ok((n, info.max_entries()))
            });
        match read {
            Ok((n, max)) => out.push((name, n, max)),
            Err(e) => tracing::debug!(map = name, error = %e, "cannot count the map's entries"),
        }
    }
    out
}

/// The eviction counter of this process: the program attached, and its counts.
pub struct Evictions {
    /// Held so the program stays attached.
    _ebpf: Ebpf,
    counts: Mutex<HashMap<MapData, u32, u64>>,
    /// Each id counted, and its map's name (a map made afresh, resized, gets a
    /// new id: its name then sums both).
    ids: Mutex<BTreeMap<u32, &'static str>>,
}

impl std::fmt::Debug for Evictions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Evictions").field("ids", &self.ids).finish()
    }
}

/// Whether this process may load tracing programs: `CAP_PERFMON` (38), or
/// `CAP_SYS_ADMIN` (21) which implies it, among its effective capabilities.
pub fn may_trace() -> bool {
    super::host::has_any_capability(1 << 38 | 1 << 21)
}

impl Evictions {
    /// The program loaded and attached, counting the LRU maps pinned in
    /// `pin_dir`.
    pub fn start(pin_dir: &Path) -> Result<Evictions, DataPlaneError> {
        if EVICT_OBJECT.is_empty() {
            return Err(kernel_err(
                "the eviction counter",
                "svcproxy was built without clang",
            ));
        }
        let btf = Btf::from_sys_fs()
            .map_err(|e| kernel_err("the kernel's BTF (/sys/kernel/btf/vmlinux)", e))?;
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .load(EVICT_OBJECT)
            .map_err(|e| kernel_err("loading the eviction counter", e))?;
        let prog: &mut FExit = super::load::program(&mut ebpf, "svcproxy_evicted")?;
        prog.load(HOOK, &btf).map_err(|e| {
            kernel_err(
                format!("loading the eviction counter on {HOOK}"),
                super::load::verifier(e),
            )
        })?;
        prog.attach()
            .map_err(|e| kernel_err(format!("attaching the eviction counter to {HOOK}"), e))?;
        let counts = super::maps::take(&mut ebpf, "svcproxy_evictions")?;
        let evictions = Evictions {
            _ebpf: ebpf,
            counts: Mutex::new(counts),
            ids: Mutex::new(BTreeMap::new()),
        };
        evictions.watch(pin_dir)?;
        Ok(evictions)
    }

    /// The LRU maps pinned in `pin_dir` counted (those counted already keep
    /// their counts).
    pub fn watch(&self, pin_dir: &Path) -> Result<(), DataPlaneError> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        for name in LRU_MAPS {
            let pin = pin_dir.join(name);
            let Ok(info) = MapData::from_pin(&pin).and_then(|m| m.info()) else {
                continue;
            };
            let id = info.id();
            if ids.contains_key(&id) {
                continue;
            }
            counts
                .insert(id, 0, 0)
                .map_err(|e| kernel_err(format!("counting the evictions of {name}"), e))?;
            ids.insert(id, name);
        }
        Ok(())
    }

    /// Evictions so far, by map name.
    pub fn counts(&self) -> BTreeMap<&'static str, u64> {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: BTreeMap<&'static str, u64> = LRU_MAPS.iter().map(|m| (*m, 0)).collect();
        for (id, name) in ids.iter() {
            *out.entry(name).or_default() += counts.get(id, 0).unwrap_or(0);
        }
        out
    }
}
