//! The eBPF mode's kernel side: the socket programs loaded and attached to the
//! cgroup, the packet programs to every Ethernet interface of the node (tcx,
//! ingress and egress), the maps and links pinned under svcproxy's bpffs
//! directory, and a [`Table`](svcproxy_plan::ebpf::Table) written into the maps.
//!
//! **Pins.** Maps are pinned by name in the pin directory, so a restarted
//! svcproxy finds and reuses them (sockets translated before the restart keep
//! their reverse entries). Links are pinned there too (`link-<program>`), so the
//! programs stay attached while no svcproxy runs (`--once`, a restart); a new
//! process attaches its programs beside the old ones, then releases the old links.
//! The packet programs' links are pinned per interface index
//! (`tc-<index>-ingress`, `tc-<index>-egress`); each write attaches them to
//! interfaces that appeared and releases those of interfaces that went. With
//! `--ebpf-xdp=native` the XDP program is attached (in the driver) to every
//! interface that is not a pod's, its link pinned as `xdp-<index>`; an interface
//! whose driver has no native XDP keeps the tc programs alone.
//!
//! **Writes.** An endpoint list is written under a fresh id before any service
//! entry names it, and an old list is deleted only after no entry names it: a
//! socket never sees a half-written list. A full sync writes everything under
//! new ids, then deletes whatever the maps hold that the table does not (what an
//! earlier process left included).
//!
//! **Modules**, one per concern; [`Kernel`] (here) holds the programs and the
//! maps, [`Kernel::open`] loads, opens and attaches, and each module adds the
//! methods of its concern:
//! - `load`: the programs' objects, the checks before anything is loaded
//!   ([`preflight`]), the programs loaded with their maps at the flags' sizes;
//! - `maps`: the maps by name ([`MAPS`]), the pin directory made ready, maps
//!   taken from an object or opened from their pins, keys removed;
//! - `attach`: the socket programs on the cgroup, the packet programs (tc, XDP)
//!   on the node's interfaces, their links pinned and released;
//! - `write`: a table written into the maps, whole or by its changes
//!   ([`Kernel::write`]); `lists` its endpoint lists, `overflow` what did not
//!   fit ([`Overflow`]);
//! - `readback`: the maps read back as a table ([`Kernel::read`]);
//! - `dump`: the pinned maps as text ([`dump`], [`expected_lines`]) and their
//!   counters;
//! - `drift`: the links that should be pinned and are not ([`missing_links`]);
//! - `evictions`: the LRU maps' fill ([`lru_fill`]) and evictions ([`Evictions`]);
//! - `flows`: the packet path's idle timeouts and live-connection counts;
//! - `masquerade`: the ports svcproxy's own masquerade takes ([`snat_ports`]);
//! - `host`: what the node offers (the kernel's release, cgroup v2, bpffs, the
//!   network namespace's cookie);
//! - `seal`: a hand-over's seal, and the maps adopted as they are
//!   ([`Kernel::adopt`]);
//! - `cleanup`: everything pinned removed ([`cleanup`]).

mod attach;
mod cleanup;
mod drift;
mod dump;
mod evictions;
mod flows;
mod host;
mod lists;
mod load;
mod maps;
mod masquerade;
mod overflow;
mod readback;
mod seal;
mod sockets;
mod write;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;

use aya::maps::lpm_trie::LpmTrie;
use aya::maps::{Array, HashMap, MapData};
use aya::Ebpf;

use super::wire::{
    Backend, Config, CtKey, CtVal, FwData, LocalKey, MemberKey, MhKey, MhVal, PodnetData, SlotKey,
    SvcKey, SvcVal,
};
use super::{EbpfOptions, XdpMode};
use crate::error::DataPlaneError;

use attach::attach_socket_programs;
use flows::write_timeouts;
use host::netns_cookie;
use lists::next_list_id;
use load::{load_programs, SOCK_OBJECT, TC_OBJECT};
use maps::{prepare_pin_dir, take, RETIRED_MAPS};
use masquerade::write_snat;
use write::Written;

pub use cleanup::cleanup;
pub use drift::{missing_links, pinned};
pub use dump::{dump, expected_lines, masquerade_ports, remapped_client_ports, xdp_packets};
pub use evictions::{lru_fill, may_trace, Evictions, LRU_MAPS};
pub use host::{cgroup2_root, on_bpffs, own_pin_dir};
pub use load::preflight;
pub use maps::MAPS;
pub use masquerade::{local_range_overlapping, snat_ports};
pub use overflow::Overflow;
pub use seal::{seals, unseal, write_seal};
pub use sockets::{close_stale, may_enter_namespaces};

type HashMap2<K, V> = std::collections::HashMap<K, V>;

fn kernel_err(what: impl Into<String>, reason: impl std::fmt::Display) -> DataPlaneError {
    DataPlaneError::Kernel {
        what: what.into(),
        reason: reason.to_string(),
    }
}

/// The programs attached and the maps open.
pub struct Kernel {
    pin_dir: PathBuf,
    cfg: Array<MapData, Config>,
    config: Config,
    svc: HashMap<MapData, SvcKey, SvcVal>,
    fw: LpmTrie<MapData, FwData, u8>,
    podnet: LpmTrie<MapData, PodnetData, u8>,
    ifc: HashMap<MapData, u32, u32>,
    vip: HashMap<MapData, LocalKey, u8>,
    guard: LpmTrie<MapData, PodnetData, u8>,
    /// The interfaces the packet programs are attached to: index → name and
    /// the flags written for it.
    attached: BTreeMap<u32, (String, u32)>,
    /// `--ebpf-xdp`, and the interfaces the XDP program was tried on: index →
    /// attached (false: the driver refused it; not tried again while the
    /// interface stays).
    xdp: XdpMode,
    xdp_links: BTreeMap<u32, bool>,
    /// The interfaces the XDP program may send frames to, with their MTUs, as
    /// the map holds them.
    xdp_tx: HashMap<MapData, u32, u32>,
    xdp_targets: BTreeMap<u32, u32>,
    /// `--ebpf-xdp-interfaces`: where the XDP program goes (empty: every
    /// interface that is not a pod's).
    xdp_interfaces: Vec<String>,
    /// The kernel could not say which interfaces take redirected frames, and
    /// the log said so.
    xdp_features_warned: bool,
    slot: HashMap<MapData, SlotKey, Backend>,
    member: HashMap<MapData, MemberKey, u8>,
    /// The schedulers' state: round-robin turns and Maglev tables, by list.
    rr: HashMap<MapData, u32, u64>,
    mh: HashMap<MapData, MhKey, MhVal>,
    /// The packet path's connections, and its live-connection counts, which
    /// [`Kernel::reconcile_flows`] brings back to them.
    ct: HashMap<MapData, CtKey, CtVal>,
    flows: HashMap<MapData, Backend, i64>,
    timeouts: super::IdleTimeouts,
    local: HashMap<MapData, LocalKey, u8>,
    /// The next list id to give (ids only grow: an id is never reused while a
    /// socket may still read it).
    next_list: u32,
    /// `None` until the first full write, and after a failed one.
    written: Option<Written>,
    /// The maps may hold keys no write of this process made (they were pinned
    /// before it opened them, or a write failed part-way): the next full write
    /// sweeps them.
    unknown_keys: bool,
    /// What did not fit at the last write.
    pub overflow: Overflow,
    sizes: super::MapSizes,
    /// Held so the programs stay loaded while the process runs (the packet
    /// programs also to be attached to interfaces that appear).
    _ebpf: Ebpf,
    tc: Ebpf,
    /// The XDP program's object, loaded with `--ebpf-xdp=native` alone.
    xdp_ebpf: Option<Ebpf>,
}

impl Kernel {
    /// Loads the programs, opens (or creates) the pinned maps under `pin_dir` and
    /// attaches the programs to `cgroup`, releasing any earlier process's links.
    /// `snat`: the ports svcproxy's own masquerade takes ([`snat_ports`], read
    /// once per process: a reload of the programs keeps them).
    pub fn open(opts: &EbpfOptions, snat: Option<(u16, u16)>) -> Result<Kernel, DataPlaneError> {
        let (cgroup, pin_dir, host_only) = (&opts.cgroup, &opts.pin_dir, opts.host_namespace_only);
        if SOCK_OBJECT.is_empty() || TC_OBJECT.is_empty() {
            return Err(kernel_err(
                "the ebpf mode's programs",
                "svcproxy was built without clang; run scripts/install-deps.sh and build again",
            ));
        }
        prepare_pin_dir(opts)?;
        let reused = MAPS.iter().any(|m| pin_dir.join(m).exists());
        let cgroup_dir = File::open(cgroup)
            .map_err(|e| kernel_err(format!("opening cgroup {}", cgroup.display()), e))?;
        let (mut ebpf, mut tc, xdp_ebpf) = load_programs(opts)?;
        for name in RETIRED_MAPS {
            let _ = std::fs::remove_file(pin_dir.join(name));
        }

        let cookie = netns_cookie()?;
        let xdp_tx: HashMap<MapData, u32, u32> = take(&mut tc, "svcproxy_xdp_tx")?;
        let mut cfg: Array<MapData, Config> = take(&mut ebpf, "svcproxy_cfg")?;
        // A predecessor's marks stay in force until this process's first write.
        let before = cfg.get(&0, 0).unwrap_or_default();
        let config = Config {
            host_netns_cookie: cookie,
            host_only: u32::from(host_only),
            masquerade_mark: before.masquerade_mark,
            reject_mark: before.reject_mark,
            generation: 0,
        };
        cfg.set(0, config, 0)
            .map_err(|e| kernel_err("writing svcproxy_cfg", e))?;

        attach_socket_programs(&mut ebpf, &cgroup_dir, cgroup, pin_dir)?;
        write_timeouts(&mut tc, &opts.timeouts)?;
        write_snat(&mut tc, snat, opts.xdp)?;

        let slot: HashMap<MapData, SlotKey, Backend> = take(&mut ebpf, "svcproxy_slot")?;
        let svc: HashMap<MapData, SvcKey, SvcVal> = take(&mut ebpf, "svcproxy_svc")?;
        let next_list = next_list_id(&slot, &svc);
        Ok(Kernel {
            pin_dir: pin_dir.to_path_buf(),
            cfg,
            config,
            fw: take(&mut tc, "svcproxy_fw")?,
            podnet: take(&mut tc, "svcproxy_podnet")?,
            ifc: take(&mut tc, "svcproxy_ifc")?,
            vip: take(&mut ebpf, "svcproxy_vip")?,
            guard: take(&mut ebpf, "svcproxy_guard")?,
            attached: BTreeMap::new(),
            xdp: opts.xdp,
            xdp_links: BTreeMap::new(),
            // What an earlier process left is brought to what the kernel says at
            // the first write.
            xdp_targets: xdp_tx.iter().filter_map(Result::ok).collect(),
            xdp_tx,
            xdp_interfaces: opts.xdp_interfaces.clone(),
            xdp_features_warned: false,
            svc,
            slot,
            member: take(&mut ebpf, "svcproxy_member")?,
            rr: take(&mut ebpf, "svcproxy_rr")?,
            mh: take(&mut ebpf, "svcproxy_mh")?,
            ct: take(&mut tc, "svcproxy_ct")?,
            flows: take(&mut ebpf, "svcproxy_flows")?,
            timeouts: opts.timeouts,
            local: take(&mut ebpf, "svcproxy_local")?,
            next_list,
            written: None,
            unknown_keys: reused,
            overflow: Overflow::default(),
            sizes: opts.sizes,
            _ebpf: ebpf,
            tc,
            xdp_ebpf,
        })
    }
}
