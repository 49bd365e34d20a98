//! Helpers shared by svcproxy-plan's integration tests: scenario directories (YAML
//! objects in, snapshots out, through the real `ClusterState`), their plan
//! configuration, and throwaway network namespaces for running the real `nft`.
//!
//! Address plan (every scenario, stated once in `testdata/cluster.yaml`):
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
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ipnet::IpNet;
use serde::Deserialize;
use svcproxy_core::model::{Protocol, ServiceName, ServicePortName};
use svcproxy_core::objects::SourceUpdate;
use svcproxy_core::snapshot::NodeSnapshot;
use svcproxy_core::state::{ClusterState, SnapshotUpdate, StateConfig};
use svcproxy_plan::{InterfaceName, LocalDetection, NodePortAddresses, PlanConfig};

pub fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata")
}

/// The scenario directories, sorted.
pub fn cases() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(testdata())
        .expect("testdata")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Every object in a YAML file (the workspace's one loader).
pub use svcproxy_testkit::objects::load as load_objects;

/// How a scenario's `config.yaml` spells a [`PlanConfig`]. Absent: the defaults
/// below (NodeCIDR detection from node-a's podCIDRs, primary NodePort addresses).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TestConfig {
    #[serde(default)]
    pub masquerade_all: bool,
    pub detect_local: Option<TestDetect>,
    #[serde(default)]
    pub node_ips: Vec<IpAddr>,
    pub node_port_addresses: Option<TestNodePorts>,
    #[serde(default)]
    pub localhost_node_ports: bool,
}

#[derive(Deserialize)]
#[serde(tag = "mode", deny_unknown_fields)]
pub enum TestDetect {
    None,
    ClusterCIDR { cidrs: Vec<IpNet> },
    NodeCIDR,
    BridgeInterface { interface: String },
    InterfaceNamePrefix { interface: String },
}

#[derive(Deserialize)]
#[serde(tag = "mode", deny_unknown_fields)]
pub enum TestNodePorts {
    Primary,
    Ips { ips: Vec<IpAddr> },
    AllLocal,
}

impl TestConfig {
    pub fn to_plan_config(&self) -> PlanConfig {
        let local_detection = match &self.detect_local {
            None | Some(TestDetect::NodeCIDR) => LocalDetection::NodeCidr(Vec::new()),
            Some(TestDetect::None) => LocalDetection::None,
            Some(TestDetect::ClusterCIDR { cidrs }) => LocalDetection::ClusterCidr(cidrs.clone()),
            Some(TestDetect::BridgeInterface { interface }) => {
                LocalDetection::BridgeInterface(InterfaceName::parse(interface).unwrap())
            }
            Some(TestDetect::InterfaceNamePrefix { interface }) => {
                LocalDetection::InterfaceNamePrefix(InterfaceName::parse(interface).unwrap())
            }
        };
        let nodeport_addresses = match &self.node_port_addresses {
            None | Some(TestNodePorts::Primary) => NodePortAddresses::Primary,
            Some(TestNodePorts::Ips { ips }) => NodePortAddresses::Ips(ips.clone()),
            Some(TestNodePorts::AllLocal) => NodePortAddresses::AllLocal,
        };
        PlanConfig {
            masquerade_all: self.masquerade_all,
            local_detection,
            node_ips: self.node_ips.clone(),
            nodeport_addresses,
            localhost_nodeports: self.localhost_node_ports,
            ..PlanConfig::default()
        }
    }
}

/// One scenario directory loaded into a live `ClusterState`.
pub struct Scenario {
    pub dir: PathBuf,
    pub state: ClusterState,
    pub cfg: PlanConfig,
}

impl Scenario {
    /// `testdata/cluster.yaml` (nodes and ServiceCIDRs) plus the case's `*.yaml`
    /// files in name order, as node `node.txt` (default node-a).
    pub fn load(case: &str) -> Scenario {
        let dir = testdata().join(case);
        let node = std::fs::read_to_string(dir.join("node.txt"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "node-a".to_string());
        let cfg: TestConfig = match std::fs::read_to_string(dir.join("config.yaml")) {
            Ok(text) => {
                serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{case}/config.yaml: {e}"))
            }
            Err(_) => TestConfig::default(),
        };
        let mut state = ClusterState::new(StateConfig {
            node_name: node,
            service_proxy_name: None,
        });
        let mut files = vec![testdata().join("cluster.yaml")];
        let mut own: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{dir:?}: {e}"))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml") && !p.ends_with("config.yaml"))
            .collect();
        own.sort();
        files.extend(own);
        for file in files {
            for object in load_objects(&file) {
                state.apply(SourceUpdate::Upsert {
                    object,
                    origin: file.display().to_string(),
                });
            }
        }
        Scenario {
            dir,
            state,
            cfg: cfg.to_plan_config(),
        }
    }

    pub fn upsert_yaml(&mut self, yaml: &str) {
        let tmp = std::env::temp_dir().join(format!(
            "svcproxy-plan-{}-{}.yaml",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::write(&tmp, yaml).unwrap();
        let objects = load_objects(&tmp);
        let _ = std::fs::remove_file(&tmp);
        for object in objects {
            self.state.apply(SourceUpdate::Upsert {
                object,
                origin: "test".to_string(),
            });
        }
    }

    pub fn snapshot(&mut self) -> SnapshotUpdate {
        self.state.snapshot()
    }
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

pub fn spn(ns: &str, name: &str, port: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName {
        service: ServiceName::new(ns, name),
        port: port.into(),
        protocol,
    }
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

impl Scenario {
    /// Only `testdata/cluster.yaml` (nodes and ServiceCIDRs), as `node`, with the
    /// default configuration.
    pub fn empty(node: &str) -> Scenario {
        let file = testdata().join("cluster.yaml");
        let mut state = ClusterState::new(StateConfig {
            node_name: node.to_string(),
            service_proxy_name: None,
        });
        for object in load_objects(&file) {
            state.apply(SourceUpdate::Upsert {
                object,
                origin: file.display().to_string(),
            });
        }
        Scenario {
            dir: testdata(),
            state,
            cfg: TestConfig::default().to_plan_config(),
        }
    }

    /// The intent of the current state under the scenario's configuration.
    pub fn intent(&mut self) -> svcproxy_plan::Intent {
        let up = self.snapshot();
        svcproxy_plan::build_intent(&up.v4, &up.v6, &self.cfg)
    }
}

/// Compares `text` with the golden file `name` of `case` (or rewrites the file
/// when `UPDATE_GOLDEN=1`).
pub fn assert_golden(case: &str, name: &str, text: &str) {
    let path = testdata().join(case).join(name);
    if std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
        std::fs::write(&path, text).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("{case}: no {name}; run with UPDATE_GOLDEN=1 to create it"));
    pretty_assertions::assert_eq!(expected, text, "{case}: differs from {name}");
}
