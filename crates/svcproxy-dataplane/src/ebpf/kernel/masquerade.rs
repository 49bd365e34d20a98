//! svcproxy's own masquerade (the XDP fast path's, and the client ports the tc
//! programs remap where two connections would be one tuple at their endpoint):
//! the ports it takes, above the node's `ip_local_port_range` ([`snat_ports`]),
//! written for the programs at open ([`write_snat`]), and the node's range
//! checked against them later ([`local_range_overlapping`]).

use aya::maps::{Array, MapData};
use aya::Ebpf;

use super::host::{kernel_release, kernel_version};
use super::kernel_err;
use super::maps::take;
use crate::ebpf::wire;
use crate::ebpf::XdpMode;
use crate::error::DataPlaneError;

/// The ports svcproxy's own masquerade takes (the XDP fast path's): those
/// above the node's `ip_local_port_range` up to 65535, so that no socket of the
/// node uses them (the fixed rule keeps the kernel's masquerade out of them
/// too). Set without XDP as well, so that a restart with XDP off still turns
/// back the replies of the connections masqueraded before. None, said in the
/// log, when fewer than 1024 are left there: the kernel's conntrack then
/// masquerades every connection, and the XDP program leaves those connections
/// to the stack. With XDP, a kernel too old for the program's source-address
/// lookup is said in the log too. Read once per process.
pub fn snat_ports(xdp: XdpMode) -> Option<(u16, u16)> {
    let range = local_port_range();
    let high = range.as_deref().and_then(range_high);
    if xdp == XdpMode::Native {
        let release = kernel_release();
        if kernel_version(&release).is_some_and(|v| v < (6, 7)) {
            // The program asks the FIB for the source address with
            // BPF_FIB_LOOKUP_SRC (6.7); an older kernel refuses the lookup, and
            // the program then passes the connection to the stack.
            tracing::warn!(
                kernel = %release,
                "the kernel predates BPF_FIB_LOOKUP_SRC (Linux 6.7), unless its vendor \
                 backported it: the XDP fast path then leaves masqueraded connections \
                 (externalTrafficPolicy: Cluster) to the kernel's conntrack"
            );
        }
    }
    match high {
        Some(high) if high <= 65535 - 1024 => Some((high + 1, 65535)),
        _ if xdp != XdpMode::Native => None,
        _ => {
            tracing::warn!(
                ip_local_port_range = range.as_deref().map(str::trim).unwrap_or("unreadable"),
                "no room above the node's ip_local_port_range for svcproxy's own masquerade \
                 (1024 ports wanted below 65536): the XDP fast path leaves masqueraded \
                 connections (externalTrafficPolicy: Cluster) to the kernel's"
            );
            None
        }
    }
}

/// The node's `ip_local_port_range`, as the kernel prints it.
fn local_port_range() -> Option<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()
}

/// The high end of an `ip_local_port_range` ("32768\t60999").
fn range_high(range: &str) -> Option<u16> {
    range.split_whitespace().nth(1)?.parse().ok()
}

/// The node's `ip_local_port_range` now, when it reaches into the masquerade's
/// ports from `lo` on (None when it does not, or cannot be read).
pub fn local_range_overlapping(lo: u16) -> Option<String> {
    local_port_range().filter(|r| overlaps(r, lo))
}

/// `range` (an `ip_local_port_range`) reaches port `lo`.
fn overlaps(range: &str, lo: u16) -> bool {
    range_high(range).is_some_and(|h| h >= lo)
}

pub(super) fn write_snat(
    tc: &mut Ebpf,
    ports: Option<(u16, u16)>,
    xdp: XdpMode,
) -> Result<(), DataPlaneError> {
    let mut map: Array<MapData, wire::SnatRange> = take(tc, "svcproxy_snat")?;
    let (lo, hi) = ports.unwrap_or((0, 0));
    let flags = if xdp == XdpMode::Native {
        wire::SNAT_XDP
    } else {
        0
    };
    map.set(0, wire::SnatRange { lo, hi, flags }, 0)
        .map_err(|e| kernel_err("writing svcproxy_snat", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_range_high_end_is_read_as_the_kernel_prints_it() {
        assert_eq!(range_high("32768\t60999\n"), Some(60999));
        assert_eq!(range_high("1024 65535"), Some(65535));
        assert_eq!(range_high("32768"), None);
        assert_eq!(range_high("32768\t70000\n"), None);
        assert_eq!(range_high(""), None);
    }

    #[test]
    fn a_range_overlaps_the_masquerade_from_its_first_port_on() {
        assert!(!overlaps("32768\t60999\n", 61000));
        assert!(overlaps("32768\t61000\n", 61000));
        assert!(overlaps("1024 65535", 61000));
        assert!(!overlaps("unreadable", 61000));
    }
}
