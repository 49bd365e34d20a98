//! What did not fit in the maps at the last write ([`Overflow`]): noted by the
//! writes, logged once per write, and exported by the mode's metrics.

use std::collections::{BTreeMap, BTreeSet};

/// What did not fit in the maps at the last write: keys per map, and the
/// service ports left out or rejecting because of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overflow {
    pub keys: BTreeMap<&'static str, usize>,
    pub ports: BTreeSet<String>,
}

impl Overflow {
    pub(super) fn note(&mut self, map: &'static str, keys: usize, port: &dyn std::fmt::Display) {
        self.note_keys(map, keys);
        self.ports.insert(port.to_string());
    }

    /// Keys that did not fit without a service port left out for it (the
    /// guard's cluster IPs: their unexposed ports are not refused).
    pub(super) fn note_keys(&mut self, map: &'static str, keys: usize) {
        *self.keys.entry(map).or_default() += keys;
    }

    /// Logs what did not fit, once per write.
    pub(super) fn report(&self, sizes: &crate::ebpf::MapSizes) {
        if self.keys.is_empty() {
            return;
        }
        let first: Vec<&str> = self.ports.iter().take(10).map(String::as_str).collect();
        tracing::error!(
            maps = ?self.keys,
            sizes = ?sizes.by_map(),
            service_ports = self.ports.len(),
            first = ?first,
            "BPF maps are full: these service ports are not served as planned (their addresses not translated, or refused for want of room for their endpoints); everything else is; raise the flag of the full map: --ebpf-map-size-services (svcproxy_svc, svcproxy_vip, svcproxy_rr), --ebpf-map-size-endpoints (svcproxy_slot, svcproxy_member), --ebpf-map-size-maglev (svcproxy_mh: a Maglev table of the default 16381 cells takes 64 entries)"
        );
    }
}
