//! `kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family,protocol}`
//! (kube-proxy 1.37, KEP-6032): the packets the nftables mode rejected on a NodePort
//! of loopback it does not serve, read at each scrape from the counter of each
//! protocol's `localhost-nodeport-reject-<protocol>` chain
//! ([`svcproxy_plan::nft::localhost_reject_chain`]) with `nft -j list chain`.

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, Opts};
use svcproxy_core::model::{IpFamily, Protocol};
use svcproxy_plan::nft::{family_keyword, localhost_reject_chain, TABLE_NAME};
use svcproxy_plan::PlanConfig;

use crate::sink::{NftCommand, ScriptSink};

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
        }) as Box<dyn Collector>
    })
}

fn family() -> IntCounterVec {
    IntCounterVec::new(Opts::new(NAME, HELP), &["ip_family", "protocol"]).expect("valid")
}

struct LocalhostRejectCollector {
    chains: Vec<(IpFamily, Protocol)>,
    template: IntCounterVec,
}

impl Collector for LocalhostRejectCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.template.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let counters = family();
        let mut nft = NftCommand::default();
        for &(f, p) in &self.chains {
            let chain = localhost_reject_chain(p);
            let listed = nft.list(&["-j", "list", "chain", family_keyword(f), TABLE_NAME, &chain]);
            match listed {
                Ok(Some(json)) => counters
                    .with_label_values(&[f.as_str(), &protocol_label(p)])
                    .inc_by(packets(&json)),
                // Not there (yet): no series, as before the first sync.
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(chain, family = %f, error = %e, "cannot read a localhost NodePort reject counter")
                }
            }
        }
        counters.collect()
    }
}

/// `tcp`, `udp`, `sctp`: the protocol as the counting chain's name has it.
fn protocol_label(p: Protocol) -> String {
    p.as_str().to_ascii_lowercase()
}

/// The packets counted by every counter of a chain listed as JSON.
fn packets(json: &str) -> u64 {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else {
        return 0;
    };
    v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o["rule"]["expr"].as_array())
        .flatten()
        .filter_map(|e| e["counter"]["packets"].as_u64())
        .sum()
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
        assert_eq!(packets(json), 7);
        assert_eq!(packets("not json"), 0);
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
        assert_eq!(protocol_label(Protocol::Sctp), "sctp");
    }
}
