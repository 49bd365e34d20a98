//! The pinned maps read without loading anything: as text ([`dump`], for tests,
//! operators and the comparison with a table), the lines a table says they must
//! hold ([`expected_lines`]), and the XDP program's and the masquerade's
//! counters ([`xdp_packets`], [`masquerade_ports`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;

use aya::maps::lpm_trie::LpmTrie;
use aya::maps::{Array, HashMap, MapData};

use super::kernel_err;
use super::maps::open_pinned;
use super::readback::{addrs_in, dest_of, nets_in};
use crate::ebpf::wire::{
    self, Backend, Config, FwData, LocalKey, PodnetData, SlotKey, SvcKey, SvcVal,
};
use crate::error::DataPlaneError;
use svcproxy_core::model::Scheduler;
use svcproxy_plan::ebpf::{Dest, PortName, Route, Table};

/// The XDP program's packets so far, summed over CPUs: sent on to an endpoint,
/// dropped, and left to the stack (the tc programs); zeros when it never ran,
/// `None` when the programs' maps are not pinned in `pin_dir`.
pub fn xdp_packets(pin_dir: &Path) -> Option<[u64; 3]> {
    per_cpu_sums(pin_dir, "svcproxy_xdp_stats")
}

/// svcproxy's own masquerade so far, summed over CPUs: ports taken for new
/// connections, and new connections that found none free (left to the kernel's
/// masquerade); `None` when the map is not pinned.
pub fn masquerade_ports(pin_dir: &Path) -> Option<[u64; 2]> {
    per_cpu_sums(pin_dir, "svcproxy_snat_stats")
}

/// The new connections of the packet path whose translated tuple another
/// connection held: given another client port, and left to share it.
pub fn remapped_client_ports(pin_dir: &Path) -> Option<[u64; 2]> {
    per_cpu_sums(pin_dir, "svcproxy_remap_stats")
}

/// The first `N` counters of a pinned per-CPU array, summed over CPUs.
fn per_cpu_sums<const N: usize>(pin_dir: &Path, map: &str) -> Option<[u64; N]> {
    let data = MapData::from_pin(pin_dir.join(map)).ok()?;
    let stats: aya::maps::PerCpuArray<MapData, u64> =
        aya::maps::PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data)).ok()?;
    let mut out = [0u64; N];
    for (i, n) in out.iter_mut().enumerate() {
        *n = stats.get(&(i as u32), 0).ok()?.iter().sum();
    }
    Some(out)
}

/// What the maps pinned in `pin_dir` hold, as text: the configuration, each
/// service entry with its routes' endpoints resolved, the admitted sources, the
/// pods' CIDRs and interfaces, and the affinity entries (age in seconds). Read
/// without loading anything; for tests and operators (`svcproxy render` prints
/// the plan, this the kernel).
pub fn dump(pin_dir: &Path) -> Result<String, DataPlaneError> {
    use std::fmt::Write as _;
    let cfg: Array<MapData, Config> = open_pinned(pin_dir, "svcproxy_cfg")?;
    let mut out = String::new();
    let c = cfg
        .get(&0, 0)
        .map_err(|e| kernel_err("reading svcproxy_cfg", e))?;
    let _ = writeln!(out, "generation {}", c.generation);
    let _ = writeln!(out, "host-only {}", c.host_only);
    for seal in super::seal::seals(pin_dir) {
        let _ = writeln!(out, "sealed {seal}");
    }
    if let Some([forwarded, dropped, passed]) = xdp_packets(pin_dir) {
        let _ = writeln!(
            out,
            "xdp forwarded {forwarded} dropped {dropped} passed {passed}"
        );
    }
    let mut lines = vec![marks_line(c.masquerade_mark, c.reject_mark)];
    lines.extend(service_lines(pin_dir)?);
    lines.extend(address_lines(pin_dir)?);
    lines.extend(affinity_lines(pin_dir)?);
    lines.extend(connection_lines(pin_dir));
    lines.sort();
    for l in lines {
        out.push_str(&l);
        out.push('\n');
    }
    Ok(out)
}

/// Each service entry with its routes (the endpoints of each list).
fn service_lines(pin_dir: &Path) -> Result<Vec<String>, DataPlaneError> {
    let svc: HashMap<MapData, SvcKey, SvcVal> = open_pinned(pin_dir, "svcproxy_svc")?;
    let slot: HashMap<MapData, SlotKey, Backend> = open_pinned(pin_dir, "svcproxy_slot")?;
    let mut lines = Vec::new();
    let mut lists: BTreeMap<u32, BTreeMap<u32, SocketAddr>> = BTreeMap::new();
    for (k, be) in slot.iter().filter_map(Result::ok) {
        if let Some(a) = be.socket_addr() {
            lists.entry(k.list).or_default().insert(k.slot, a);
        }
    }
    let route = |r: &wire::Route, packet: bool| {
        let eps: Vec<SocketAddr> = lists
            .get(&r.list)
            .map(|l| l.values().copied().collect())
            .unwrap_or_default();
        let masq = packet && r.flags & wire::ROUTE_MASQUERADE != 0;
        route_text(r.action, &eps, masq, r.sched)
    };
    for (k, v) in svc.iter().filter_map(Result::ok) {
        let Some(dest) = dest_of(&k) else {
            continue;
        };
        let routes = [
            route(&v.pod, false),
            route(&v.host, false),
            route(&v.pkt_pod, true),
            route(&v.pkt_other, true),
        ];
        let affinity = (v.affinity_secs > 0).then_some(v.affinity_secs);
        lines.push(service_line(&dest, &routes, affinity, v.fw_id));
    }
    Ok(lines)
}

/// The sets of addresses and networks, the source ranges and the interfaces;
/// what cannot be read, as problems.
fn address_lines(pin_dir: &Path) -> Result<Vec<String>, DataPlaneError> {
    let fw: LpmTrie<MapData, FwData, u8> = open_pinned(pin_dir, "svcproxy_fw")?;
    let podnet: LpmTrie<MapData, PodnetData, u8> = open_pinned(pin_dir, "svcproxy_podnet")?;
    let ifc: HashMap<MapData, u32, u32> = open_pinned(pin_dir, "svcproxy_ifc")?;
    let local: HashMap<MapData, LocalKey, u8> = open_pinned(pin_dir, "svcproxy_local")?;
    let vip: HashMap<MapData, LocalKey, u8> = open_pinned(pin_dir, "svcproxy_vip")?;
    let guard: LpmTrie<MapData, PodnetData, u8> = open_pinned(pin_dir, "svcproxy_guard")?;
    let mut lines = Vec::new();
    let mut problems = Vec::new();
    for (label, map) in [("local-address", &local), ("cluster-ip", &vip)] {
        let addrs = addrs_in(map, label, &mut problems);
        lines.extend(addrs.iter().map(|ip| format!("{label} {ip}")));
    }
    for (label, map) in [("pod-cidr", &podnet), ("guard-cidr", &guard)] {
        let nets = nets_in(map, label, &mut problems);
        lines.extend(nets.iter().map(|net| format!("{label} {net}")));
    }
    lines.extend(problems.into_iter().map(|p| format!("problem {p}")));
    for k in fw.keys().filter_map(Result::ok) {
        let len = k.prefix_len().saturating_sub(64);
        let d = k.data();
        let v4 = len <= 32 && d.addr[1..] == [0, 0, 0];
        if let Some((id, net)) = wire::fw_of(&k, v4) {
            lines.push(format!("source-range {id:#x} {net}"));
        }
    }
    for (index, flags) in ifc.iter().filter_map(Result::ok) {
        let what = if flags & wire::IFC_PODS != 0 {
            "pods"
        } else {
            "other"
        };
        lines.push(format!("interface {index} {what}"));
    }
    Ok(lines)
}

/// The ClientIP affinities held, by client address (packets) and by socket
/// namespace (connects), with their age.
fn affinity_lines(pin_dir: &Path) -> Result<Vec<String>, DataPlaneError> {
    let aff: HashMap<MapData, wire::AffKey, wire::AffVal> = open_pinned(pin_dir, "svcproxy_aff")?;
    let affip: HashMap<MapData, wire::AffIpKey, wire::AffVal> =
        open_pinned(pin_dir, "svcproxy_affip")?;
    let mut lines = Vec::new();
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let now_ns = now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64;
    let age = |last: u64| now_ns.saturating_sub(last) / 1_000_000_000;
    for (k, v) in affip.iter().filter_map(Result::ok) {
        let family = if k.client[1..] == [0, 0, 0] {
            wire::FAMILY_V4
        } else {
            wire::FAMILY_V6
        };
        let client = wire::addr_of(k.client, family).map_or("?".to_string(), |a| a.to_string());
        let be =
            v.be.socket_addr()
                .map_or("?".to_string(), |a| a.to_string());
        lines.push(format!(
            "affinity {:#x} client {client} endpoint {be} age {}s",
            k.affinity_id,
            age(v.last_ns)
        ));
    }
    for (k, v) in aff.iter().filter_map(Result::ok) {
        let be =
            v.be.socket_addr()
                .map_or("?".to_string(), |a| a.to_string());
        lines.push(format!(
            "affinity {:#x} netns {:#x} endpoint {be} age {}s",
            k.affinity_id,
            k.client,
            age(v.last_ns)
        ));
    }
    Ok(lines)
}

/// The lc scheduler's live connections per endpoint.
fn connection_lines(pin_dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    // The lc scheduler's live connections per endpoint (none before a release
    // that has the map).
    for (map, label) in [
        ("svcproxy_conns", "connections"),
        ("svcproxy_flows", "packet-connections"),
    ] {
        let counts: Option<HashMap<MapData, Backend, i64>> = open_pinned(pin_dir, map).ok();
        for (be, n) in counts.iter().flat_map(|m| m.iter().filter_map(Result::ok)) {
            if let Some(a) = be.socket_addr() {
                lines.push(format!("{label} {a} {n}"));
            }
        }
    }
    lines
}

/// A route as [`dump`] writes it: `forward [ENDPOINTS]` (` masquerade` on the
/// packet path), `drop`, `reject` or `pass`.
fn route_text(action: u8, endpoints: &[SocketAddr], masquerade: bool, sched: u8) -> String {
    match action {
        wire::ACT_FORWARD => {
            let eps: Vec<String> = endpoints.iter().map(|a| a.to_string()).collect();
            let masq = if masquerade { " masquerade" } else { "" };
            let by = match wire::scheduler_of(sched) {
                Scheduler::Random => String::new(),
                s => format!(" [{s}]"),
            };
            format!("forward [{}]{masq}{by}", eps.join(" "))
        }
        wire::ACT_DROP => "drop".to_string(),
        wire::ACT_PASS => "pass".to_string(),
        _ => "reject".to_string(),
    }
}

/// A service entry as [`dump`] writes it: address and port apart (as rule
/// listings write them), then the socket and packet routes.
fn service_line(dest: &Dest, routes: &[String; 4], affinity: Option<u32>, fw_id: u64) -> String {
    use std::fmt::Write as _;
    let ip = dest
        .ip
        .map_or(format!("{}-local", dest.family), |ip| ip.to_string());
    let mut line = format!(
        "service {ip} {}/{} pod: {} host: {} packet-pod: {} packet-other: {}",
        dest.port,
        dest.protocol.as_str().to_ascii_lowercase(),
        routes[0],
        routes[1],
        routes[2],
        routes[3]
    );
    if let Some(secs) = affinity {
        let _ = write!(line, " affinity: {secs}s");
    }
    if fw_id != 0 {
        let _ = write!(line, " source-ranges: {fw_id:#x}");
    }
    line
}

fn marks_line(masquerade: u32, reject: u32) -> String {
    format!("marks masquerade {masquerade:#x} reject {reject:#x}")
}

/// The lines of [`dump`] that `table` says the maps must hold (entries with
/// their lists resolved, admitted sources, pods' CIDRs, local addresses, marks):
/// what a process that did not write the maps compares them with.
pub fn expected_lines(table: &Table) -> BTreeSet<String> {
    let text = |r: &Route, masquerade: bool| match r {
        // A forward to a list the table lacks is written as a reject ([`encode`]).
        Route::Forward(name) => match table.lists.get(name) {
            Some(l) => route_text(
                wire::ACT_FORWARD,
                &l.endpoints,
                masquerade,
                wire::sched_bytes(l).0,
            ),
            None => route_text(wire::ACT_REJECT, &[], false, 0),
        },
        Route::Drop => route_text(wire::ACT_DROP, &[], false, 0),
        Route::Reject => route_text(wire::ACT_REJECT, &[], false, 0),
        Route::Pass => route_text(wire::ACT_PASS, &[], false, 0),
    };
    let mut out = BTreeSet::new();
    out.insert(marks_line(table.masquerade_mark, table.reject_mark));
    for (dest, e) in &table.entries {
        let routes = [
            text(&e.pod, false),
            text(&e.host, false),
            text(&e.packet_pod.route, e.packet_pod.masquerade),
            text(&e.packet_other.route, e.packet_other.masquerade),
        ];
        let fw = e.firewall.as_ref().map_or(0, PortName::id);
        out.insert(service_line(dest, &routes, e.affinity.map(|(_, s)| s), fw));
    }
    for (port, nets) in &table.firewalls {
        for net in nets {
            out.insert(format!("source-range {:#x} {net}", port.id()));
        }
    }
    for net in &table.pod_cidrs {
        out.insert(format!("pod-cidr {net}"));
    }
    for ip in &table.local_addrs {
        out.insert(format!("local-address {ip}"));
    }
    for ip in table.cluster_ips.keys() {
        out.insert(format!("cluster-ip {ip}"));
    }
    for net in &table.guard_cidrs {
        out.insert(format!("guard-cidr {net}"));
    }
    out
}
