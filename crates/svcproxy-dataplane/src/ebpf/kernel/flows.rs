//! The packet path's connections: its idle timeouts, written at open
//! ([`write_timeouts`]), and its live-connection counts brought back to what
//! its connection table holds ([`Kernel::reconcile_flows`], [`flow_counts`]).

use aya::maps::{Array, MapData};
use aya::Ebpf;

use super::maps::{remove, take};
use super::{kernel_err, HashMap2, Kernel};
use crate::ebpf::wire::{self, Backend, CtKey, CtVal};
use crate::error::DataPlaneError;

/// The packet path's idle timeouts, in whole seconds (a part-second rounds up).
pub(super) fn write_timeouts(
    tc: &mut Ebpf,
    t: &crate::ebpf::IdleTimeouts,
) -> Result<(), DataPlaneError> {
    let secs = |d: Option<std::time::Duration>| {
        d.map_or(0, |d| {
            u32::try_from(d.as_secs() + u64::from(d.subsec_nanos() > 0)).unwrap_or(u32::MAX)
        })
    };
    let mut timeouts: Array<MapData, wire::Timeouts> = take(tc, "svcproxy_timeouts")?;
    timeouts
        .set(
            0,
            wire::Timeouts {
                tcp: secs(t.tcp),
                tcpfin: secs(t.tcp_fin),
                udp: secs(t.udp),
                pad: 0,
            },
            0,
        )
        .map_err(|e| kernel_err("writing svcproxy_timeouts", e))
}

impl Kernel {
    /// Brings the packet path's live-connection counts (`svcproxy_flows`, the lc
    /// schedulers') back to the connections its table holds that count: one the
    /// LRU forgot, or whose FIN was lost, no longer counts, and one idle past its
    /// timeout (`--ipvs-tcp-timeout`, `-tcpfin-`) is forgotten. Programs counting
    /// meanwhile may leave the count off by the connections opened or closed
    /// during the pass, until the next. Returns the map writes and deletions.
    pub fn reconcile_flows(&mut self) -> Result<usize, DataPlaneError> {
        let (counts, expired) = flow_counts(
            self.ct.iter().filter_map(Result::ok),
            monotonic_secs(),
            &self.timeouts,
        );
        let mut ops = 0;
        for k in &expired {
            ops += remove(&mut self.ct, k)?;
        }
        let stale: Vec<Backend> = self
            .flows
            .keys()
            .filter_map(Result::ok)
            .filter(|be| !counts.contains_key(be))
            .collect();
        for be in &stale {
            ops += remove(&mut self.flows, be)?;
        }
        for (be, n) in counts {
            self.flows
                .insert(be, n, 0)
                .map_err(|e| kernel_err("writing svcproxy_flows", e))?;
            ops += 1;
        }
        Ok(ops)
    }
}

/// What the packet path's connection table says the live-connection counts are
/// (`now` in the programs' seconds): each counted connection's endpoint once,
/// but for those idle past their timeout, which are returned to be forgotten.
fn flow_counts(
    entries: impl Iterator<Item = (CtKey, CtVal)>,
    now: u64,
    timeouts: &crate::ebpf::IdleTimeouts,
) -> (HashMap2<Backend, i64>, Vec<CtKey>) {
    let secs = |d: Option<std::time::Duration>| d.map_or(0, |d| d.as_secs().max(1));
    let (tcp, fin) = (secs(timeouts.tcp), secs(timeouts.tcp_fin));
    let mut counts: HashMap2<Backend, i64> = HashMap2::new();
    let mut expired = Vec::new();
    for (k, v) in entries {
        if k.dir != wire::CT_ORIGINAL || v.counted == 0 {
            continue;
        }
        let limit = if v.flags & wire::CT_CLOSING != 0 {
            fin
        } else {
            tcp
        };
        if limit != 0 && v.seen_s != 0 && now.saturating_sub(u64::from(v.seen_s)) > limit {
            expired.push(k);
            continue;
        }
        let be = Backend {
            addr: v.addr,
            port: v.port,
            family: k.family,
            pad: 0,
        };
        *counts.entry(be).or_default() += 1;
    }
    (counts, expired)
}

/// The monotonic clock in seconds, as the programs' `bpf_ktime_get_ns`.
fn monotonic_secs() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(ts.tv_sec).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn flow(
        client_port: u16,
        endpoint: &str,
        counted: bool,
        flags: u8,
        seen_s: u32,
    ) -> (CtKey, CtVal) {
        let be = Backend::of(endpoint.parse().unwrap());
        (
            CtKey {
                saddr: wire::addr_words(Some("198.51.100.7".parse().unwrap())),
                daddr: wire::addr_words(Some("198.19.0.10".parse().unwrap())),
                sport: client_port,
                dport: 80,
                proto: 6,
                family: wire::FAMILY_V4,
                dir: wire::CT_ORIGINAL,
                pad: 0,
            },
            CtVal {
                addr: be.addr,
                port: be.port,
                flags,
                counted: u8::from(counted),
                seen_s,
                created_ns: 0,
            },
        )
    }

    #[test]
    fn the_packet_paths_counts_are_what_its_connection_table_holds() {
        let a = "10.244.1.5:8080";
        let b = "10.244.2.5:8080";
        let mut reply = flow(9, a, true, 0, 1000);
        reply.0.dir = 1;
        let entries = vec![
            flow(1, a, true, 0, 1000),
            flow(2, a, true, 0, 1000),
            // Released at its FIN: no longer counted.
            flow(3, a, false, wire::CT_CLOSING, 1000),
            flow(4, b, true, 0, 1000),
            // Idle for 500 s, past a 300 s tcp timeout: forgotten.
            flow(5, b, true, 0, 500),
            // Closing and idle past a 60 s tcpfin timeout.
            flow(6, b, true, wire::CT_CLOSING, 900),
            // Never touched (a release without idle timeouts wrote it): kept.
            flow(7, b, true, 0, 0),
            // A reply entry counts nothing.
            reply,
        ];
        let timeouts = crate::IdleTimeouts {
            tcp: Some(Duration::from_secs(300)),
            tcp_fin: Some(Duration::from_secs(60)),
            udp: None,
        };
        let (counts, expired) = flow_counts(entries.clone().into_iter(), 1001, &timeouts);
        let be = |s: &str| Backend::of(s.parse().unwrap());
        assert_eq!(counts.get(&be(a)), Some(&2));
        assert_eq!(counts.get(&be(b)), Some(&2));
        let gone: Vec<u16> = expired.iter().map(|k| k.sport).collect();
        assert_eq!(gone, [5, 6]);
        // Without timeouts nothing idles out.
        let (counts, expired) =
            flow_counts(entries.into_iter(), 1001, &crate::IdleTimeouts::default());
        assert_eq!(counts.get(&be(b)), Some(&4));
        assert!(expired.is_empty());
    }
}
