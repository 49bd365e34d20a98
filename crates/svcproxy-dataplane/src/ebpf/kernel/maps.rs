//! The maps by the names pinned ([`MAPS`]); the pin directory made ready
//! ([`prepare_pin_dir`]) and whose it is ([`pinned_owner`]); maps taken from a
//! loaded object ([`take`]) or opened from their pins ([`open_pinned`]); and
//! keys removed ([`remove`], [`remove_unless`], and their LPM trie forms).

use std::path::Path;

use aya::maps::lpm_trie::{Key as LpmKey, LpmTrie};
use aya::maps::{Array, HashMap, MapData};
use aya::Ebpf;

use super::host::{netns_cookie, on_bpffs};
use super::kernel_err;
use crate::ebpf::wire::Config;
use crate::ebpf::EbpfOptions;
use crate::error::DataPlaneError;

/// The maps, by the names pinned.
pub const MAPS: [&str; 29] = [
    "svcproxy_svc",
    "svcproxy_slot",
    "svcproxy_member",
    "svcproxy_local",
    "svcproxy_aff",
    "svcproxy_rev",
    "svcproxy_peer",
    "svcproxy_flow",
    "svcproxy_cfg",
    "svcproxy_fw",
    "svcproxy_podnet",
    "svcproxy_ifc",
    "svcproxy_ct",
    "svcproxy_affip",
    "svcproxy_vip",
    "svcproxy_guard",
    "svcproxy_rr",
    "svcproxy_mh",
    "svcproxy_conns",
    "svcproxy_flows",
    "svcproxy_timeouts",
    "svcproxy_xdp_tx",
    "svcproxy_xdp_stats",
    "svcproxy_xdp_nat",
    "svcproxy_snat",
    "svcproxy_snat_stats",
    "svcproxy_remap",
    "svcproxy_remap_stats",
    "svcproxy_udpsock",
];

/// Maps an earlier release pinned whose layout changed under a new name: their
/// pins are removed at start and by cleanup (a program still using one keeps it
/// until that program goes).
pub(super) const RETIRED_MAPS: [&str; 1] = ["svcproxy_xdp_fwd"];

/// The pin directory made ready: on a bpffs, not another network namespace's,
/// and without a pinned map of another size than the flags say (the kernel cannot
/// resize one: it is made afresh).
pub(super) fn prepare_pin_dir(opts: &EbpfOptions) -> Result<(), DataPlaneError> {
    let pin_dir = &opts.pin_dir;
    let parent = pin_dir.parent().unwrap_or(pin_dir);
    if !on_bpffs(parent) {
        return Err(kernel_err(
            format!("pin directory {}", pin_dir.display()),
            format!(
                "{} is not on a bpffs (mount -t bpf bpf DIR, or name a directory inside \
                 one with --ebpf-bpffs, such as /sys/fs/bpf/svcproxy)",
                parent.display()
            ),
        ));
    }
    std::fs::create_dir_all(pin_dir)
        .map_err(|e| kernel_err(format!("creating {}", pin_dir.display()), e))?;
    // Pins another network namespace's svcproxy made are not taken over.
    if let Some(owner) = pinned_owner(pin_dir) {
        if owner != netns_cookie()? {
            return Err(kernel_err(
                format!("pin directory {}", pin_dir.display()),
                "it holds the pins of svcproxy in another network namespace; give this \
                 one its own --ebpf-bpffs",
            ));
        }
    }
    // A pinned map of another size (the flags changed) is made afresh: the
    // kernel cannot resize one.
    for (name, size) in opts.sizes.by_map() {
        let pin = pin_dir.join(name);
        let pinned = MapData::from_pin(&pin)
            .ok()
            .and_then(|m| m.info().ok())
            .map(|i| i.max_entries());
        if let Some(old) = pinned.filter(|old| *old != size) {
            tracing::warn!(map = name, from = old, to = size, "resizing a pinned map: it is made afresh (the packet path's connections through it are forgotten)");
            std::fs::remove_file(&pin)
                .map_err(|e| kernel_err(format!("unpinning {}", pin.display()), e))?;
        }
    }
    Ok(())
}

/// The network namespace cookie the pinned configuration names as the host's.
pub(super) fn pinned_owner(pin_dir: &Path) -> Option<u64> {
    let pin = pin_dir.join("svcproxy_cfg");
    if !pin.exists() {
        return None;
    }
    let data = match MapData::from_pin(&pin) {
        Ok(d) => d,
        Err(e) => {
            tracing::debug!(pin = %pin.display(), error = %e, "cannot open the pinned configuration");
            return None;
        }
    };
    let cfg: Array<MapData, Config> = Array::try_from(aya::maps::Map::Array(data)).ok()?;
    cfg.get(&0, 0).ok().map(|c| c.host_netns_cookie)
}

pub(super) fn take<T>(ebpf: &mut Ebpf, name: &str) -> Result<T, DataPlaneError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .take_map(name)
        .ok_or_else(|| kernel_err(name, "missing from the object"))?;
    T::try_from(map).map_err(|e| kernel_err(name, e))
}

/// A pinned map of `pin_dir` opened as `T`.
pub(super) fn open_pinned<T>(pin_dir: &Path, name: &str) -> Result<T, DataPlaneError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let pin = pin_dir.join(name);
    let data =
        MapData::from_pin(&pin).map_err(|e| kernel_err(format!("opening {}", pin.display()), e))?;
    let map = match name {
        "svcproxy_cfg" => aya::maps::Map::Array(data),
        "svcproxy_aff" | "svcproxy_affip" | "svcproxy_udpsock" => aya::maps::Map::LruHashMap(data),
        "svcproxy_fw" | "svcproxy_podnet" | "svcproxy_guard" => aya::maps::Map::LpmTrie(data),
        _ => aya::maps::Map::HashMap(data),
    };
    T::try_from(map).map_err(|e| kernel_err(name, e))
}

/// Removes every key of `map` but those `keep` accepts; the number removed.
pub(super) fn remove_unless<K: aya::Pod + std::fmt::Debug, V: aya::Pod>(
    map: &mut HashMap<MapData, K, V>,
    keep: impl Fn(&K) -> bool,
) -> Result<usize, DataPlaneError> {
    let stale: Vec<K> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|k| !keep(k))
        .collect();
    let mut ops = 0;
    for k in &stale {
        ops += remove(map, k)?;
    }
    Ok(ops)
}

/// Removes `key`; a key already gone is no error. 1 when one was removed.
pub(super) fn remove<K: aya::Pod + std::fmt::Debug, V: aya::Pod>(
    map: &mut HashMap<MapData, K, V>,
    key: &K,
) -> Result<usize, DataPlaneError> {
    removed(map.remove(key), key)
}

/// An LPM trie key as plain parts (aya's key type compares nothing).
pub(super) fn lpm_parts<K: aya::Pod>(k: &LpmKey<K>) -> (u32, K) {
    (k.prefix_len(), k.data())
}

/// [`remove_unless`] for an LPM trie.
pub(super) fn lpm_remove_unless<K: aya::Pod + std::fmt::Debug, V: aya::Pod>(
    map: &mut LpmTrie<MapData, K, V>,
    keep: impl Fn(&LpmKey<K>) -> bool,
) -> Result<usize, DataPlaneError> {
    let stale: Vec<LpmKey<K>> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|k| !keep(k))
        .collect();
    let mut ops = 0;
    for k in &stale {
        ops += removed(map.remove(k), &lpm_parts(k))?;
    }
    Ok(ops)
}

/// A removal's result: 1 removed, 0 already gone, or the error.
pub(super) fn removed(
    r: Result<(), aya::maps::MapError>,
    key: &dyn std::fmt::Debug,
) -> Result<usize, DataPlaneError> {
    match r {
        Ok(()) => Ok(1),
        Err(aya::maps::MapError::KeyNotFound) => Ok(0),
        Err(aya::maps::MapError::SyscallError(e))
            if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
        {
            Ok(0)
        }
        Err(e) => Err(kernel_err(format!("deleting {key:?}"), e)),
    }
}
