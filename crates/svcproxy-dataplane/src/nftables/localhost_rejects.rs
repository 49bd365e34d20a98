//! `kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family,protocol}`
//! (kube-proxy 1.37, KEP-6032): the packets the nftables mode rejected on a NodePort
//! of loopback it does not serve, read at each scrape from the counter of each
//! protocol's `localhost-nodeport-reject-<protocol>` chain
//! ([`svcproxy_plan::nft::localhost_reject_chain`]) with `nft -j list chain`.
//!
//! The rule's counter starts again at zero whenever a full sync rewrites the chain;
//! the collector keeps a running total across those restarts (a count that went
//! down is a restart: what was counted before it is kept), so the exported counter
//! only grows while svcproxy runs. Rejections between the last scrape and a
//! restart that the new count has already overtaken by the next scrape are missed.

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, Opts};
use svcproxy_core::model::{IpFamily, Protocol};
use svcproxy_plan::nft::{family_keyword, localhost_reject_chain, TABLE_NAME};
use svcproxy_plan::PlanConfig;

use crate::kernel::nft::{NftCommand, ScriptSink};

const NAME: &str = "kubeproxy_nftables_localhost_nodeport_rejected_packets_total";
const HELP: &str = "[ALPHA] Number of packets rejected on localhost NodePorts. UDP and SCTP \
     are always rejected; TCP is rejected when the localhost NodePort proxy is not running";

/// The counting chains `cfg` has the rules hold, as a collector; `None` without any
/// (the gate off, or a mode that does not follow it).
pub fn collector(cfg: &PlanConfig) -> Option<Box<dyn Collector>> {
    let chains: Vec<(IpFamily, Protocol)> = IpFamily::BOTH
        .into_iter()
        .flat_map(|f| {
            cfg.rejected_localhost_nodeports(f)
                .into_iter()
                .map(move |p| (f, p))
        })
        .collect();
    (!chains.is_empty()).then(|| {
        Box::new(LocalhostRejectCollector {
            chains,
            template: family(),
            totals: Mutex::new(BTreeMap::new()),
        }) as Box<dyn Collector>
    })
}

fn family() -> IntCounterVec {
    IntCounterVec::new(Opts::new(NAME, HELP), &["ip_family", "protocol"]).expect("valid")
}

struct LocalhostRejectCollector {
    chains: Vec<(IpFamily, Protocol)>,
    template: IntCounterVec,
    /// Per chain, the running total's parts.
    totals: Mutex<BTreeMap<(IpFamily, Protocol), Running>>,
}

/// A kernel counter that starts again at zero now and then, as one that only grows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Running {
    /// What the counters before the last restart had counted.
    before: u64,
    /// The kernel's count at the last reading.
    last: u64,
}

impl Running {
    /// Takes a reading; the total so far.
    fn read(&mut self, now: u64) -> u64 {
        if now < self.last {
            self.before += self.last;
        }
        self.last = now;
        self.before + now
    }
}

/// How long one reading may take: a scrape must not hang on `nft`.
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

impl Collector for LocalhostRejectCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.template.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let counters = family();
        let mut nft = NftCommand::default().with_timeout(READ_TIMEOUT);
        let mut totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        for &(f, p) in &self.chains {
            let chain = localhost_reject_chain(p);
            let listed = nft.list(&["-j", "list", "chain", family_keyword(f), TABLE_NAME, &chain]);
            let now = match listed {
                Ok(Some(json)) => packets(&json),
                // Not there (yet): no reading.
                Ok(None) => None,
                Err(e) => {
                    tracing::debug!(chain, family = %f, error = %e, "cannot read a localhost NodePort reject counter");
                    None
                }
            };
            let entry = totals.entry((f, p)).or_default();
            let total = match now {
                Some(n) => entry.read(n),
                None => entry.before + entry.last,
            };
            if now.is_some() || total > 0 {
                counters
                    .with_label_values(&[f.as_str(), p.as_str()])
                    .inc_by(total);
            }
        }
        counters.collect()
    }
}

/// The packets counted by every counter of a chain listed as JSON; `None` when the
/// listing cannot be read (not a restart of the count).
fn packets(json: &str) -> Option<u64> {
    let v = serde_json::from_str::<serde_json::Value>(json).ok()?;
    Some(
        v["nftables"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o["rule"]["expr"].as_array())
            .flatten()
            .filter_map(|e| e["counter"]["packets"].as_u64())
            .sum(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use svcproxy_plan::LocalhostGate;

    #[test]
    fn counters_are_read_off_the_chain_s_json() {
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
            {"chain": {"family": "ip", "table": "svcproxy", "name": "localhost-nodeport-reject-udp"}},
            {"rule": {"family": "ip", "table": "svcproxy", "chain": "localhost-nodeport-reject-udp",
              "expr": [{"counter": {"packets": 7, "bytes": 420}}, {"reject": null}]}}]}"#;
        assert_eq!(packets(json), Some(7));
        assert_eq!(packets("not json"), None);
    }

    #[test]
    fn a_counter_that_starts_again_keeps_its_total() {
        let mut r = Running::default();
        assert_eq!(r.read(3), 3);
        assert_eq!(r.read(5), 5);
        // A full sync rewrote the chain: counted from zero again.
        assert_eq!(r.read(1), 6);
        assert_eq!(r.read(4), 9);
        assert_eq!(r.read(0), 9);
    }

    #[test]
    fn only_a_gated_config_has_counters() {
        assert!(collector(&PlanConfig::default()).is_none());
        let cfg = PlanConfig {
            localhost_gate: Some(LocalhostGate { tcp_only: true }),
            ..PlanConfig::default()
        };
        let c = collector(&cfg).expect("a collector");
        assert_eq!(c.desc()[0].fq_name, NAME);
    }
}
