//! Scenario directories: objects in, the expected intent and each backend's expected
//! ruleset out, shared by the golden tests (svcproxy-plan) and the real-packet tests
//! (svcproxy-e2e).
//!
//! Layout, under `testdata/scenarios/` at the workspace root:
//! - `cluster.yaml`: the nodes and ServiceCIDRs every scenario runs in (address plan
//!   there);
//! - `<case>/*.yaml`: the scenario's own objects, loaded in name order after
//!   `cluster.yaml`; `<case>/config.yaml`: its proxy configuration ([`ScenarioConfig`]);
//!   `<case>/node.txt`: the node it runs as (default `node-a`);
//! - `<case>/expected.intent`, `<case>/expected.<backend>`: golden files
//!   ([`assert_golden`]; `UPDATE_GOLDEN=1` rewrites them).
//!
//! Entry points: [`cases`], [`Scenario::load`], [`Scenario::state`].

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::Deserialize;
use svcproxy_core::objects::{KubeObject, SourceUpdate};
use svcproxy_core::state::{ClusterState, StateConfig};
use svcproxy_plan::{InterfaceName, LocalDetection, NodePortAddresses, PlanConfig};

/// `testdata/scenarios` of the workspace.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/scenarios")
}

/// The scenario names (directories), sorted.
pub fn cases() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root())
        .expect("testdata/scenarios")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// How a scenario's `config.yaml` spells its proxy configuration. Absent: NodeCIDR
/// local detection (from the node's podCIDRs) and primary NodePort addresses.
#[derive(Clone, Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScenarioConfig {
    #[serde(default)]
    pub masquerade_all: bool,
    pub detect_local: Option<Detect>,
    #[serde(default)]
    pub node_ips: Vec<IpAddr>,
    pub node_port_addresses: Option<NodePorts>,
    #[serde(default)]
    pub localhost_node_ports: bool,
}

/// `detectLocal` of [`ScenarioConfig`].
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "mode", deny_unknown_fields)]
pub enum Detect {
    None,
    ClusterCIDR { cidrs: Vec<IpNet> },
    NodeCIDR,
    BridgeInterface { interface: String },
    InterfaceNamePrefix { interface: String },
}

/// `nodePortAddresses` of [`ScenarioConfig`].
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "mode", deny_unknown_fields)]
pub enum NodePorts {
    Primary,
    /// These host addresses: the scenario's host has them, and `--nodeport-addresses`
    /// names each as a single-address CIDR.
    Ips {
        ips: Vec<IpAddr>,
    },
    AllLocal,
}

impl ScenarioConfig {
    pub fn to_plan_config(&self) -> PlanConfig {
        let local_detection = match &self.detect_local {
            None | Some(Detect::NodeCIDR) => LocalDetection::NodeCidr(Vec::new()),
            Some(Detect::None) => LocalDetection::None,
            Some(Detect::ClusterCIDR { cidrs }) => LocalDetection::ClusterCidr(cidrs.clone()),
            Some(Detect::BridgeInterface { interface }) => {
                LocalDetection::BridgeInterface(InterfaceName::parse(interface).unwrap())
            }
            Some(Detect::InterfaceNamePrefix { interface }) => {
                LocalDetection::InterfaceNamePrefix(InterfaceName::parse(interface).unwrap())
            }
        };
        let nodeport_addresses = match &self.node_port_addresses {
            None | Some(NodePorts::Primary) => NodePortAddresses::Primary,
            Some(NodePorts::Ips { ips }) => {
                NodePortAddresses::Cidrs(ips.iter().map(|ip| IpNet::from(*ip)).collect())
            }
            Some(NodePorts::AllLocal) => NodePortAddresses::AllLocal,
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

/// One scenario directory, read.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub case: String,
    pub dir: PathBuf,
    /// The node the scenario runs as.
    pub node: String,
    pub config: ScenarioConfig,
    /// `cluster.yaml` then the scenario's own `*.yaml` (not `config.yaml`), in load order.
    pub files: Vec<PathBuf>,
    /// Every object of `files`, with the file it came from.
    pub objects: Vec<(PathBuf, KubeObject)>,
}

impl Scenario {
    /// Reads `testdata/scenarios/<case>`; panics with the file and reason on bad data.
    pub fn load(case: &str) -> Scenario {
        let dir = root().join(case);
        let node = std::fs::read_to_string(dir.join("node.txt"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "node-a".to_string());
        let config: ScenarioConfig = match std::fs::read_to_string(dir.join("config.yaml")) {
            Ok(text) => {
                yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{case}/config.yaml: {e}"))
            }
            Err(_) => ScenarioConfig::default(),
        };
        let mut files = vec![root().join("cluster.yaml")];
        if !case.is_empty() {
            let mut own: Vec<PathBuf> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{dir:?}: {e}"))
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.extension().is_some_and(|x| x == "yaml") && !p.ends_with("config.yaml")
                })
                .collect();
            own.sort();
            files.extend(own);
        }
        let objects = files
            .iter()
            .flat_map(|f| {
                crate::objects::load(f)
                    .into_iter()
                    .map(move |o| (f.clone(), o))
            })
            .collect();
        Scenario {
            case: case.to_string(),
            dir,
            node,
            config,
            files,
            objects,
        }
    }

    /// Only `cluster.yaml`, as `node`, with the default configuration.
    pub fn cluster_only(node: &str) -> Scenario {
        let mut s = Scenario::load("");
        s.node = node.to_string();
        s.config = ScenarioConfig::default();
        s
    }

    /// A cluster state for [`Scenario::node`] holding every object.
    pub fn state(&self) -> ClusterState {
        let mut state = ClusterState::new(StateConfig {
            node_name: self.node.clone(),
            service_proxy_name: None,
            ignore_external_ips: false,
            dns: false,
            without_snapshots: false,
        });
        for (file, object) in &self.objects {
            state.apply(SourceUpdate::Upsert {
                object: object.clone(),
                origin: file.display().to_string(),
            });
        }
        if let Some(NodePorts::Ips { ips }) = &self.config.node_port_addresses {
            state.apply(SourceUpdate::HostAddresses(ips.clone()));
        }
        state
    }

    /// The intent of the scenario under its configuration (the one `expected.intent`
    /// holds).
    pub fn intent(&self) -> svcproxy_plan::Intent {
        let up = self.state().snapshot();
        svcproxy_plan::build_intent(&up.v4, &up.v6, &self.config.to_plan_config())
    }

    /// The intent as a mode with `semantics` runs the scenario (its configuration with
    /// the mode's behaviour folded in).
    pub fn intent_as(&self, semantics: svcproxy_plan::ModeSemantics) -> svcproxy_plan::Intent {
        let up = self.state().snapshot();
        let cfg = semantics.apply(self.config.to_plan_config());
        svcproxy_plan::build_intent(&up.v4, &up.v6, &cfg)
    }

    /// The golden file `name` of this scenario.
    pub fn expected(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_else(|_| {
            panic!(
                "{}: no {name}; run with UPDATE_GOLDEN=1 to create it",
                self.case
            )
        })
    }
}

/// Compares `text` with the golden file `name` of `case` (or rewrites the file when
/// `UPDATE_GOLDEN=1`).
pub fn assert_golden(case: &str, name: &str, text: &str) {
    let path = root().join(case).join(name);
    if std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
        std::fs::write(&path, text).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("{case}: no {name}; run with UPDATE_GOLDEN=1 to create it"));
    if expected != text {
        panic!(
            "{case}: differs from {name} (UPDATE_GOLDEN=1 rewrites it)\n{}",
            line_diff(&expected, text)
        );
    }
}

/// The lines only one side has, `-` expected and `+` actual, in order.
fn line_diff(expected: &str, actual: &str) -> String {
    let a: Vec<&str> = expected.lines().collect();
    let b: Vec<&str> = actual.lines().collect();
    let mut out = String::new();
    for l in a.iter().filter(|l| !b.contains(l)) {
        out.push_str(&format!("- {l}\n"));
    }
    for l in b.iter().filter(|l| !a.contains(l)) {
        out.push_str(&format!("+ {l}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_loads_with_its_cluster_first() {
        let cases = cases();
        assert!(cases.len() >= 10, "{cases:?}");
        for case in cases {
            let s = Scenario::load(&case);
            assert!(s.files[0].ends_with("cluster.yaml"));
            assert!(s.files.len() >= 2, "{case}: no objects of its own");
            assert!(s.objects.len() > 3, "{case}");
        }
    }

    #[test]
    fn line_diff_shows_both_sides() {
        assert_eq!(line_diff("a\nb\n", "a\nc\n"), "- b\n+ c\n");
    }
}
