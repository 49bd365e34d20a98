//! The programs attached and their links pinned in place, then released: the
//! socket programs on the cgroup ([`attach_socket_programs`]), the packet
//! programs (tcx, ingress and egress) on every Ethernet interface of the node
//! and the XDP program on those that take it ([`Kernel::attach_interfaces`]),
//! with the interfaces the XDP program may send frames to.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use aya::programs::links::{FdLink, LinkOrder, PinnedLink};
use aya::programs::tc::TcAttachOptions;
use aya::programs::xdp::XdpLink;
use aya::programs::{CgroupAttachMode, CgroupSock, CgroupSockAddr, SchedClassifier, Xdp};
use aya::Ebpf;

use super::load::{program, verifier, PROGRAMS, RELEASE_PROGRAM, TC_PROGRAMS, XDP_PROGRAM};
use super::maps::remove;
use super::{kernel_err, Kernel};
use crate::ebpf::wire;
use crate::ebpf::XdpMode;
use crate::error::DataPlaneError;
use svcproxy_plan::ebpf::Table;

/// Loads the socket programs, attaches them to `cgroup` and pins their links in
/// `pin_dir` (each pin replaced in place).
pub(super) fn attach_socket_programs(
    ebpf: &mut Ebpf,
    cgroup_dir: &File,
    cgroup: &Path,
    pin_dir: &Path,
) -> Result<(), DataPlaneError> {
    macro_rules! attach {
        ($ty:ty, $name:expr) => {{
            let name = $name;
            let prog: &mut $ty = program(ebpf, name)?;
            prog.load()
                .map_err(|e| kernel_err(format!("loading {name}"), verifier(e)))?;
            let id = prog
                .attach(cgroup_dir, CgroupAttachMode::Single)
                .map_err(|e| kernel_err(format!("attaching {name} to {}", cgroup.display()), e))?;
            let link: FdLink = prog
                .take_link(id)
                .map_err(|e| kernel_err(name, e))?
                .try_into()
                .map_err(|e| kernel_err(name, e))?;
            pin_in_place(link, &pin_dir.join(format!("link-{name}")))?;
        }};
    }
    for (name, _) in PROGRAMS {
        attach!(CgroupSockAddr, name);
    }
    attach!(CgroupSock, RELEASE_PROGRAM);
    Ok(())
}

impl Kernel {
    /// The packet programs on every Ethernet interface there is now, each
    /// interface flagged as the table says (its packets come from this node's
    /// pods, or not); the links of interfaces gone are released. An interface
    /// that goes while it is being attached is skipped (the next write sees it
    /// gone). Returns the number of map writes and attachments.
    pub fn attach_interfaces(&mut self, table: &Table) -> Result<usize, DataPlaneError> {
        let links = crate::kernel::host_addrs::ether_links()
            .map_err(|e| kernel_err("listing the node's interfaces", e))?;
        let mut ops = 0;
        let present: BTreeMap<u32, String> =
            links.iter().map(|l| (l.index, l.name.clone())).collect();
        let mtus: BTreeMap<u32, u32> = links.iter().map(|l| (l.index, l.mtu)).collect();
        let masters: BTreeMap<u32, u32> = links
            .iter()
            .filter_map(|l| l.master.map(|m| (l.index, m)))
            .collect();
        for (&index, name) in &present {
            // A pod's packets arrive on its veth before the bridge it is a port
            // of: the bridge's ports are the pods' interfaces too
            // (`--detect-local-mode=BridgeInterface`).
            let bridge = masters.get(&index).and_then(|m| present.get(m));
            let pods = table
                .pod_interfaces
                .iter()
                .any(|p| p.matches(name) || bridge.is_some_and(|b| p.matches(b)));
            let flags = if pods { wire::IFC_PODS } else { 0 };
            match self.attached.get(&index) {
                Some((n, f)) if n == name && *f == flags => continue,
                Some((n, _)) if n == name => {}
                _ => {
                    // Flagged before the first packet meets the programs.
                    self.ifc
                        .insert(index, flags, 0)
                        .map_err(|e| kernel_err(format!("flagging interface {name}"), e))?;
                    match self.attach_interface(index, name) {
                        Ok(()) => ops += TC_PROGRAMS.len(),
                        Err(e) if !still_there(index, name) => {
                            tracing::debug!(interface = %name, error = %e, "an interface went while being attached");
                            continue;
                        }
                        // One interface must not keep every service from the
                        // maps: logged, and tried again at the next write.
                        Err(e) => {
                            tracing::warn!(interface = %name, error = %e, "cannot attach the packet programs to an interface; its packets are not translated");
                            continue;
                        }
                    }
                }
            }
            self.ifc
                .insert(index, flags, 0)
                .map_err(|e| kernel_err(format!("flagging interface {name}"), e))?;
            ops += 1;
            self.attached.insert(index, (name.clone(), flags));
            ops += self.xdp_interface(index, name, flags & wire::IFC_PODS == 0)?;
        }
        // Interfaces gone: this process's, and any pinned by an earlier one.
        let gone: Vec<u32> = self
            .attached
            .keys()
            .copied()
            .chain(pinned_interfaces(&self.pin_dir))
            .filter(|i| !present.contains_key(i))
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .collect();
        for index in gone {
            release_interface(&self.pin_dir, index)?;
            ops += remove(&mut self.ifc, &index)?;
            self.attached.remove(&index);
            self.xdp_links.remove(&index);
        }
        ops += self.write_xdp_targets(&mtus)?;
        Ok(ops)
    }

    /// The XDP program on interface `name` when `--ebpf-xdp=native` and it
    /// `wanted` (not a pod's), off it otherwise. A driver without native XDP
    /// is said once; its packets meet the tc programs alone.
    fn xdp_interface(
        &mut self,
        index: u32,
        name: &str,
        wanted: bool,
    ) -> Result<usize, DataPlaneError> {
        let named = self.xdp_interfaces.is_empty() || self.xdp_interfaces.iter().any(|n| n == name);
        let wanted = wanted && named && self.xdp == XdpMode::Native;
        match (wanted, self.xdp_links.get(&index).copied()) {
            (true, None) => match self.attach_xdp(index, name) {
                Ok(()) => {
                    self.xdp_links.insert(index, true);
                    Ok(1)
                }
                Err(e) if !still_there(index, name) => {
                    tracing::debug!(interface = %name, error = %e, "an interface went while being attached");
                    Ok(0)
                }
                Err(e) => {
                    tracing::warn!(interface = %name, error = %e, "no native XDP on this interface: its packets meet the tc programs alone");
                    self.xdp_links.insert(index, false);
                    Ok(0)
                }
            },
            (false, Some(attached)) => {
                self.xdp_links.remove(&index);
                if attached {
                    release_xdp(&self.pin_dir, index)?;
                }
                Ok(usize::from(attached))
            }
            // An earlier process's XDP program, with the XDP path off now.
            (false, None) if self.pin_dir.join(format!("xdp-{index}")).exists() => {
                release_xdp(&self.pin_dir, index)?;
                Ok(1)
            }
            _ => Ok(0),
        }
    }

    /// Attaches the XDP program to interface `index` in its driver: in place
    /// of an earlier process's program when its link is pinned (the link is
    /// updated, never detached), pinned as `xdp-<index>`.
    fn attach_xdp(&mut self, index: u32, name: &str) -> Result<(), DataPlaneError> {
        let pin = self.pin_dir.join(format!("xdp-{index}"));
        let xdp = self
            .xdp_ebpf
            .as_mut()
            .ok_or_else(|| kernel_err(XDP_PROGRAM, "not loaded (--ebpf-xdp is not native)"))?;
        let prog: &mut Xdp = program(xdp, XDP_PROGRAM)?;
        let id = match PinnedLink::from_pin(&pin) {
            Ok(old) => {
                let old = XdpLink::try_from(FdLink::from(old))
                    .map_err(|e| kernel_err(format!("the XDP link pinned for {name}"), e))?;
                prog.attach_to_link(old)
            }
            Err(_) => prog.attach_to_if_index(index, aya::programs::XdpMode::Driver),
        }
        .map_err(|e| kernel_err(format!("attaching {XDP_PROGRAM} to {name}"), e))?;
        let link: FdLink = prog
            .take_link(id)
            .map_err(|e| kernel_err(XDP_PROGRAM, e))?
            .try_into()
            .map_err(|e| kernel_err(XDP_PROGRAM, e))?;
        pin_in_place(link, &pin)
    }

    /// The XDP program may send frames to the interfaces present (`mtus`: each
    /// one's MTU) that the kernel says take them (none while the XDP path is
    /// off). A change makes the XDP program's cache stale at once (the maps'
    /// generation moves). Returns the number of map writes.
    fn write_xdp_targets(&mut self, mtus: &BTreeMap<u32, u32>) -> Result<usize, DataPlaneError> {
        let targets: BTreeMap<u32, u32> = if self.xdp_links.values().any(|a| *a) {
            match crate::kernel::xdp_features::redirect_targets() {
                Ok(t) => t
                    .into_iter()
                    .filter_map(|i| mtus.get(&i).filter(|m| **m > 0).map(|m| (i, *m)))
                    .collect(),
                Err(e) => {
                    // Said once (a kernel before 6.3 has no netdev family at all).
                    if !std::mem::replace(&mut self.xdp_features_warned, true) {
                        tracing::warn!(error = %e, "cannot read the interfaces' XDP features: the XDP program sends no frame on itself, it only drops");
                    }
                    BTreeMap::new()
                }
            }
        } else {
            BTreeMap::new()
        };
        if targets == self.xdp_targets {
            return Ok(0);
        }
        let mut ops = 0;
        for (index, mtu) in &targets {
            if self.xdp_targets.get(index) != Some(mtu) {
                self.xdp_tx
                    .insert(index, mtu, 0)
                    .map_err(|e| kernel_err("writing svcproxy_xdp_tx", e))?;
                ops += 1;
            }
        }
        for index in self.xdp_targets.keys().filter(|i| !targets.contains_key(i)) {
            ops += remove(&mut self.xdp_tx, index)?;
        }
        self.xdp_targets = targets;
        // (Before the first write, the write's own count serves: the generation
        // stays 0 until the maps are written.)
        if self.written.is_some() {
            self.bump_generation()?;
        }
        Ok(ops)
    }

    /// Attaches both packet programs to interface `name` (tcx, after any program
    /// already there), pinning each link under a new name, then over the old.
    fn attach_interface(&mut self, index: u32, name: &str) -> Result<(), DataPlaneError> {
        for (prog_name, attach_type, suffix) in TC_PROGRAMS {
            let prog: &mut SchedClassifier = program(&mut self.tc, prog_name)?;
            let id = prog
                .attach_with_options(
                    name,
                    attach_type,
                    TcAttachOptions::TcxOrder(LinkOrder::default()),
                )
                .map_err(|e| kernel_err(format!("attaching {prog_name} to {name}"), e))?;
            let link: FdLink = prog
                .take_link(id)
                .map_err(|e| kernel_err(prog_name, e))?
                .try_into()
                .map_err(|e| kernel_err(prog_name, e))?;
            pin_in_place(link, &self.pin_dir.join(format!("tc-{index}-{suffix}")))?;
        }
        Ok(())
    }
}

/// Pins `link` at `pin` under a new name, then renames it over whatever is
/// pinned there (an earlier process's link): the old link stays attached until
/// the new one is in its place, and a failure leaves the old one in force.
fn pin_in_place(link: FdLink, pin: &Path) -> Result<(), DataPlaneError> {
    let mut fresh = pin.as_os_str().to_owned();
    fresh.push("-new");
    let fresh = PathBuf::from(fresh);
    let _ = std::fs::remove_file(&fresh);
    link.pin(&fresh)
        .map_err(|e| kernel_err(format!("pinning {}", fresh.display()), e))?;
    std::fs::rename(&fresh, pin).map_err(|e| kernel_err(format!("pinning {}", pin.display()), e))
}

/// The interface indexes whose packet-program links are pinned in `pin_dir`.
pub(super) fn pinned_interfaces(pin_dir: &Path) -> BTreeSet<u32> {
    let Ok(dir) = std::fs::read_dir(pin_dir) else {
        return BTreeSet::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_prefix("tc-")
                .or_else(|| name.strip_prefix("xdp-"))?
                .split('-')
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// Releases the packet programs' links of interface `index` (detaching them,
/// when the interface is still there).
pub(super) fn release_interface(pin_dir: &Path, index: u32) -> Result<(), DataPlaneError> {
    for (_, _, suffix) in TC_PROGRAMS {
        release_pin(pin_dir, &format!("tc-{index}-{suffix}"))?;
    }
    release_xdp(pin_dir, index)
}

/// Releases the XDP program's link of interface `index`.
fn release_xdp(pin_dir: &Path, index: u32) -> Result<(), DataPlaneError> {
    release_pin(pin_dir, &format!("xdp-{index}"))
}

/// Releases the link pinned as `name` (and one left half-pinned beside it).
fn release_pin(pin_dir: &Path, name: &str) -> Result<(), DataPlaneError> {
    for name in [format!("{name}-new"), name.to_string()] {
        let pin = pin_dir.join(name);
        if !pin.exists() {
            continue;
        }
        let link = PinnedLink::from_pin(&pin)
            .map_err(|e| kernel_err(format!("opening {}", pin.display()), e))?;
        link.unpin()
            .map_err(|e| kernel_err(format!("unpinning {}", pin.display()), e))?;
    }
    Ok(())
}

/// Whether interface `index` still has `name`.
fn still_there(index: u32, name: &str) -> bool {
    crate::kernel::host_addrs::ether_links()
        .is_ok_and(|l| l.iter().any(|l| l.index == index && l.name == name))
}
