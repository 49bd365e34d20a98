//! Helpers shared by svcproxy-plan's integration tests: the workspace's scenario
//! directories (`testdata/scenarios/`, read by `svcproxy-testkit`) as a live
//! `ClusterState` and plan configuration, and throwaway network namespaces for running
//! the real `nft`.
//!
//! Address plan (every scenario, stated once in `testdata/scenarios/cluster.yaml`):
//! - nodes node-a 198.18.0.1 / 2001:db8::1 (zone-1), node-b 198.18.0.2 /
//!   2001:db8::2 (zone-1), node-c 198.18.0.3 / 2001:db8::3 (zone-2)
//! - pods 198.18.<n>.0/24 and 2001:db8:<n>::/64 on node n (a=1, b=2, c=3)
//! - ServiceCIDRs 198.19.0.0/16 and 2001:db8:ffff::/112
//! - external and load-balancer IPs 203.0.113.0/24 and 2001:db8:ee::/64
//! - external clients 198.51.100.0/24
//!
//! Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use svcproxy_core::model::{Protocol, ServiceName, ServicePortName};
use svcproxy_core::objects::SourceUpdate;
use svcproxy_core::snapshot::NodeSnapshot;
use svcproxy_core::state::{ClusterState, SnapshotUpdate};
use svcproxy_plan::PlanConfig;

#[allow(unused_imports)] // each test binary uses some
pub use svcproxy_testkit::scenario::{assert_golden, cases, root as testdata};

/// One scenario directory (the workspace's shared scenarios) loaded into a live
/// `ClusterState`.
pub struct Scenario {
    pub dir: PathBuf,
    pub state: ClusterState,
    pub cfg: PlanConfig,
}

impl Scenario {
    /// `cluster.yaml` (nodes and ServiceCIDRs) plus the case's `*.yaml` files in name
    /// order, as node `node.txt` (default node-a).
    pub fn load(case: &str) -> Scenario {
        Scenario::from(svcproxy_testkit::scenario::Scenario::load(case))
    }

    /// Only `cluster.yaml`, as `node`, with the default configuration.
    pub fn empty(node: &str) -> Scenario {
        Scenario::from(svcproxy_testkit::scenario::Scenario::cluster_only(node))
    }

    fn from(s: svcproxy_testkit::scenario::Scenario) -> Scenario {
        Scenario {
            state: s.state(),
            cfg: s.config.to_plan_config(),
            dir: s.dir,
        }
    }

    pub fn upsert_yaml(&mut self, yaml: &str) {
        for object in svcproxy_testkit::objects::parse(yaml) {
            self.state.apply(SourceUpdate::Upsert {
                object,
                origin: "test".to_string(),
            });
        }
    }

    pub fn snapshot(&mut self) -> SnapshotUpdate {
        self.state.snapshot()
    }

    /// The intent of the current state under the scenario's configuration.
    pub fn intent(&mut self) -> svcproxy_plan::Intent {
        let up = self.snapshot();
        svcproxy_plan::build_intent(&up.v4, &up.v6, &self.cfg)
    }
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

pub fn spn(ns: &str, name: &str, port: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName::new(ServiceName::new(ns, name), port, protocol)
}

pub fn no_changes() -> BTreeSet<ServicePortName> {
    BTreeSet::new()
}

pub fn snaps(update: &SnapshotUpdate) -> (Arc<NodeSnapshot>, Arc<NodeSnapshot>) {
    (update.v4.clone(), update.v6.clone())
}

// ---------------------------------------------------------------------------
// Throwaway network namespaces for the real nft.

/// A throwaway network namespace (the workspace's one helper and skip rule, from
/// `svcproxy-testkit`) with the real `nft` in it; deleted when dropped.
pub struct Netns {
    ns: svcproxy_testkit::netns::Netns,
    pub name: String,
}

impl Netns {
    /// `None` after a skip (not root, `ip`/`nft` missing); under `CI` that fails.
    pub fn create(test: &str) -> Option<Netns> {
        let ns = svcproxy_testkit::netns::Netns::create(test, "plan", &["nft"])?;
        Some(Netns {
            name: ns.name.clone(),
            ns,
        })
    }

    /// Runs `nft -f -` with `script` inside the namespace.
    pub fn nft_apply(&self, script: &str) -> Result<(), String> {
        let tmp = std::env::temp_dir().join(format!(
            "{}-{}.nft",
            self.name,
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::write(&tmp, script).unwrap();
        let path = tmp.display().to_string();
        let out = svcproxy_testkit::netns::run(
            &mut self.ns.command(&["nft", "-f", &path]),
            None,
            NFT_TIMEOUT,
        )
        .expect("nft");
        let _ = std::fs::remove_file(&tmp);
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// `nft` arguments run inside the namespace; stdout.
    pub fn nft(&self, args: &[&str]) -> String {
        let mut argv = vec!["nft"];
        argv.extend_from_slice(args);
        let out = svcproxy_testkit::netns::run(&mut self.ns.command(&argv), None, NFT_TIMEOUT)
            .expect("nft");
        assert!(
            out.status.success(),
            "nft {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The namespace's whole ruleset, normalised for comparison: object handles
    /// dropped, set and map elements sorted, objects sorted (rule order within a
    /// chain kept).
    pub fn ruleset_normalized(&self) -> Vec<String> {
        let json: serde_json::Value =
            serde_json::from_str(&self.nft(&["-j", "list", "ruleset"])).expect("nft -j");
        let mut objects = Vec::new();
        let mut rules: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for item in json["nftables"].as_array().into_iter().flatten() {
            let Some((kind, body)) = item.as_object().and_then(|o| o.iter().next()) else {
                continue;
            };
            if kind == "metainfo" {
                continue;
            }
            let mut body = body.clone();
            if let Some(o) = body.as_object_mut() {
                o.remove("handle");
                if let Some(serde_json::Value::Array(elems)) = o.get_mut("elem") {
                    elems.sort_by_key(|e| e.to_string());
                }
            }
            if kind == "rule" {
                let chain = format!("{}/{}/{}", body["family"], body["table"], body["chain"]);
                rules
                    .entry(chain)
                    .or_default()
                    .push(body["expr"].to_string());
            } else {
                objects.push(format!("{kind} {body}"));
            }
        }
        for (chain, r) in rules {
            objects.push(format!("rules {chain}: {}", r.join(" ; ")));
        }
        objects.sort();
        objects
    }
}

/// Bound on one `nft` run (the scale probes load large rulesets on a loaded machine).
const NFT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// The intent builder and the nftables planner as the data plane chains them:
/// snapshots in, one planned script out.
pub struct NftPipeline {
    pub builder: svcproxy_plan::IntentBuilder,
    pub planner: svcproxy_plan::nft::Planner,
}

impl NftPipeline {
    pub fn new() -> Self {
        NftPipeline {
            builder: svcproxy_plan::IntentBuilder::new(),
            planner: svcproxy_plan::nft::Planner::new(),
        }
    }

    /// The userspace mode's pipeline: set chains redirect to `capture`'s ports.
    #[allow(dead_code)]
    pub fn with_capture(capture: std::sync::Arc<dyn svcproxy_plan::nft::CapturePorts>) -> Self {
        NftPipeline {
            builder: svcproxy_plan::IntentBuilder::new(),
            planner: svcproxy_plan::nft::Planner::with_capture(Some(capture)),
        }
    }

    pub fn plan(
        &mut self,
        v4: &NodeSnapshot,
        v6: &NodeSnapshot,
        cfg: &PlanConfig,
        full: bool,
        changed: &BTreeSet<ServicePortName>,
    ) -> svcproxy_plan::nft::Plan {
        let delta = self.builder.update(v4, v6, cfg, changed);
        self.planner.plan(self.builder.intent(), &delta, full)
    }

    pub fn commit(&mut self, plan: &svcproxy_plan::nft::Plan) {
        self.planner.commit(plan)
    }

    pub fn abandon(&mut self) {
        self.planner.abandon()
    }

    pub fn render(&self) -> String {
        self.planner.render(self.builder.intent())
    }

    pub fn ruleset(
        &self,
        family: svcproxy_core::model::IpFamily,
    ) -> Option<svcproxy_plan::nft::Ruleset> {
        self.planner.ruleset(self.builder.intent(), family)
    }
}

/// The script a first sync of these snapshots applies.
pub fn render_full(v4: &NodeSnapshot, v6: &NodeSnapshot, cfg: &PlanConfig) -> String {
    svcproxy_plan::nft::render_full(&svcproxy_plan::build_intent(v4, v6, cfg))
}

/// A Service `demo/NAME` with cluster IP 198.19.0.N, port 80 named `http`
/// (target 8080), `spec` lines added, and a slice with `endpoints` given as
/// (address, node, ready, serving, terminating).
pub fn service(
    name: &str,
    n: u8,
    spec: &str,
    endpoints: &[(&str, &str, bool, bool, bool)],
) -> String {
    let mut eps = String::new();
    for (ip, node, ready, serving, terminating) in endpoints {
        eps.push_str(&format!(
            "- {{addresses: [{ip}], nodeName: {node}, conditions: {{ready: {ready}, serving: {serving}, terminating: {terminating}}}}}\n"
        ));
    }
    let eps = if eps.is_empty() {
        " []\n".to_string()
    } else {
        format!("\n{eps}")
    };
    format!(
        "apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: demo}}
spec:
  clusterIP: 198.19.0.{n}
  ports:
  - {{name: http, port: 80, targetPort: 8080, nodePort: 300{n:02}}}
{spec}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: demo
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports:
- {{name: http, port: 8080}}
endpoints:{eps}"
    )
}

pub fn ready(ip: &str, node: &str) -> (&'static str, &'static str, bool, bool, bool) {
    let ip: &'static str = Box::leak(ip.to_string().into_boxed_str());
    let node: &'static str = Box::leak(node.to_string().into_boxed_str());
    (ip, node, true, true, false)
}

pub fn terminating(ip: &str, node: &str) -> (&'static str, &'static str, bool, bool, bool) {
    let (ip, node, ..) = ready(ip, node);
    (ip, node, false, true, true)
}
