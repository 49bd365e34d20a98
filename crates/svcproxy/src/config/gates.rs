//! Feature gates, as kube-proxy 1.38 takes them (`--feature-gates`, the config
//! file's `featureGates`): every gate of Kubernetes 1.38 is known (kube-proxy links
//! the whole `pkg/features` set, so a kubelet's gate is accepted too), a name it does
//! not know is refused, a locked gate set against its lock is refused, and a GA or
//! deprecated gate set is accepted with a warning. `AllAlpha` and `AllBeta` set every
//! alpha (beta) gate not set by name.
//!
//! The gates that change what svcproxy does are read through [`FeatureGates`]'s
//! named accessors; every other gate is accepted and has no effect here (the list, and
//! why, is in docs/configuration.md).
//!
//! The table (`kube_feature_gates_1_38.tsv`) holds each gate's default, stage and
//! lock at 1.38: 1.37's, read off upstream's sources, with the changes 1.38's release
//! notes name (its header lists both). A gate whose default changed keeps 1.37's
//! behaviour when set to it (`KubeProxyNFTablesLocalhostNodePorts=false`).

use std::collections::BTreeMap;
use std::sync::OnceLock;

/// A gate's stage at 1.38.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Alpha,
    Beta,
    Ga,
    Deprecated,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateSpec {
    pub name: &'static str,
    pub default: bool,
    pub stage: Stage,
    pub locked: bool,
}

const TABLE: &str = include_str!("kube_feature_gates_1_38.tsv");

/// The gates that change what svcproxy does (`KubeProxyIPVS` and
/// `KubeProxyNFTablesLocalhostNodePorts` are named by the registry's nftables entry).
#[cfg(test)]
const KUBE_PROXY_IPVS: &str = "KubeProxyIPVS";
#[cfg(test)]
const NFTABLES_LOCALHOST_NODEPORTS: &str = "KubeProxyNFTablesLocalhostNodePorts";
const ALLOW_SERVICE_EXTERNAL_IPS: &str = "AllowServiceExternalIPs";
const ALL_ALPHA: &str = "AllAlpha";
const ALL_BETA: &str = "AllBeta";

/// Every gate kube-proxy 1.38 knows, by name.
pub fn known() -> &'static BTreeMap<&'static str, GateSpec> {
    static KNOWN: OnceLock<BTreeMap<&'static str, GateSpec>> = OnceLock::new();
    KNOWN.get_or_init(|| {
        TABLE
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| {
                let cols: Vec<&'static str> = l.split('\t').collect();
                let [name, default, stage, locked] = cols[..] else {
                    panic!("kube_feature_gates_1_38.tsv: bad row {l:?}");
                };
                let spec = GateSpec {
                    name,
                    default: default == "true",
                    stage: match stage {
                        "Alpha" => Stage::Alpha,
                        "Beta" => Stage::Beta,
                        "GA" => Stage::Ga,
                        "Deprecated" => Stage::Deprecated,
                        other => panic!("kube_feature_gates_1_38.tsv: stage {other:?}"),
                    },
                    locked: locked == "true",
                };
                (name, spec)
            })
            .collect()
    })
}

/// The gates as set: each gate's value is the one set by name, else `AllAlpha` /
/// `AllBeta` for an alpha / beta gate that is not locked, else its default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeatureGates {
    set: BTreeMap<String, bool>,
}

impl FeatureGates {
    /// Checks `set` (name → value, from the flag or the file) as upstream's
    /// `SetFromMap` does. Returns the gates and the warnings for GA and deprecated
    /// gates set, or every refusal in upstream's words.
    pub fn new(set: &BTreeMap<String, bool>) -> Result<(Self, Vec<String>), Vec<String>> {
        let known = known();
        let mut errors = Vec::new();
        let mut warnings = Vec::new();
        for (name, &value) in set {
            let Some(spec) = known.get(name.as_str()) else {
                errors.push(format!("unrecognized feature gate: {name}"));
                continue;
            };
            if spec.locked && spec.default != value {
                errors.push(format!(
                    "cannot set feature gate {name} to {value}, feature is locked to {}",
                    spec.default
                ));
                continue;
            }
            match spec.stage {
                Stage::Ga => warnings.push(format!(
                    "Setting GA feature gate {name}={value}. It will be removed in a future \
                     release."
                )),
                Stage::Deprecated => warnings.push(format!(
                    "Setting deprecated feature gate {name}={value}. It will be removed in a \
                     future release."
                )),
                Stage::Alpha | Stage::Beta => {}
            }
        }
        if errors.is_empty() {
            Ok((FeatureGates { set: set.clone() }, warnings))
        } else {
            Err(errors)
        }
    }

    /// Whether `name` (a known gate) is on.
    pub fn enabled(&self, name: &str) -> bool {
        if let Some(&v) = self.set.get(name) {
            return v;
        }
        let Some(spec) = known().get(name) else {
            return false;
        };
        if !spec.locked {
            let all = match spec.stage {
                Stage::Alpha => self.set.get(ALL_ALPHA),
                Stage::Beta => self.set.get(ALL_BETA),
                Stage::Ga | Stage::Deprecated => None,
            };
            if let Some(&v) = all {
                return v;
            }
        }
        spec.default
    }

    /// The gates set by name, as given (the effective configuration's
    /// `featureGates`).
    pub fn as_set(&self) -> &BTreeMap<String, bool> {
        &self.set
    }

    /// Services' `spec.externalIPs` are served (KEP-5707: off, they are ignored).
    pub fn service_external_ips(&self) -> bool {
        self.enabled(ALLOW_SERVICE_EXTERNAL_IPS)
    }
}

/// `--feature-gates` (`Name=true,Other=false`), as component-base's map flag parses
/// it: each pair's value is a Go boolean, an empty pair (`A=true,`) is malformed, and
/// an empty value sets nothing. Errors in upstream's words.
pub fn parse_flag(s: &str) -> Result<BTreeMap<String, bool>, String> {
    let mut set = BTreeMap::new();
    if s.trim().is_empty() {
        return Ok(set);
    }
    for pair in s.split(',').map(str::trim) {
        let Some((name, value)) = pair.split_once('=') else {
            return Err(format!(
                "invalid argument {pair:?}: malformed pair, expect string=bool"
            ));
        };
        let (name, value) = (name.trim(), value.trim());
        let value = crate::config::flags::parse_go_bool(value)
            .map_err(|_| format!("invalid value of {name}: {value}, use true or false"))?;
        set.insert(name.to_string(), value);
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&str, bool)]) -> BTreeMap<String, bool> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn the_table_reads_and_holds_the_gates_svcproxy_acts_on() {
        let k = known();
        assert!(k.len() > 200, "{}", k.len());
        let ipvs = k[KUBE_PROXY_IPVS];
        assert_eq!(
            (ipvs.default, ipvs.stage, ipvs.locked),
            (true, Stage::Deprecated, false)
        );
        // Beta and on by default from 1.38 (k/k#142490); false keeps 1.37's.
        let lh = k[NFTABLES_LOCALHOST_NODEPORTS];
        assert_eq!(
            (lh.default, lh.stage, lh.locked),
            (true, Stage::Beta, false)
        );
        // Removed in 1.38: refused as unknown; GA in 1.38: locked on.
        assert!(!k.contains_key("PodSchedulingReadiness"));
        assert!(k["HPAGeneration"].locked && k["HPAGeneration"].default);
        let ext = k[ALLOW_SERVICE_EXTERNAL_IPS];
        assert_eq!((ext.default, ext.stage), (true, Stage::Ga));
        assert!(k["NFTablesProxyMode"].locked);
        // Gone upstream: refused as unknown.
        assert!(!k.contains_key("TopologyAwareHints"));
        // Every gate the registry names is a real one.
        for b in svcproxy_dataplane::BACKENDS {
            for a in b.aliases {
                if let Some(g) = a.gate {
                    assert!(k.contains_key(g), "{}: {g}", a.name);
                }
            }
            if let svcproxy_dataplane::LocalhostDefault::WhenGatedAndNamed(g) =
                b.defaults.localhost_nodeports
            {
                assert!(k.contains_key(g), "{}: {g}", b.mode);
            }
        }
    }

    #[test]
    fn unknown_and_locked_gates_are_refused_in_upstream_s_words() {
        let err = FeatureGates::new(&set(&[("NoSuchGate", true), ("NFTablesProxyMode", false)]))
            .unwrap_err();
        assert_eq!(
            err,
            vec![
                "cannot set feature gate NFTablesProxyMode to false, feature is locked to true",
                "unrecognized feature gate: NoSuchGate",
            ]
        );
        // A locked gate at its own value is fine (with the GA warning).
        let (_, warnings) = FeatureGates::new(&set(&[("NFTablesProxyMode", true)])).unwrap();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].starts_with("Setting GA feature gate NFTablesProxyMode=true"));
    }

    #[test]
    fn a_gate_set_by_name_wins_over_all_beta_which_wins_over_the_default() {
        let (g, w) = FeatureGates::new(&set(&[("AllBeta", false)])).unwrap();
        assert!(w.is_empty());
        assert!(!g.enabled(NFTABLES_LOCALHOST_NODEPORTS));
        assert!(g.enabled(KUBE_PROXY_IPVS), "a deprecated gate is not beta");
        let (g, _) = FeatureGates::new(&set(&[
            ("AllBeta", false),
            (NFTABLES_LOCALHOST_NODEPORTS, true),
        ]))
        .unwrap();
        assert!(g.enabled(NFTABLES_LOCALHOST_NODEPORTS));
        let (g, w) = FeatureGates::new(&set(&[(KUBE_PROXY_IPVS, false)])).unwrap();
        assert!(!g.enabled(KUBE_PROXY_IPVS));
        assert!(
            w[0].contains("deprecated feature gate KubeProxyIPVS=false"),
            "{w:?}"
        );
        let g = FeatureGates::default();
        assert!(g.enabled(KUBE_PROXY_IPVS));
        assert!(g.service_external_ips() && g.enabled(NFTABLES_LOCALHOST_NODEPORTS));
        // A kubelet's gate is known to kube-proxy too.
        assert!(FeatureGates::new(&set(&[("InPlacePodVerticalScaling", true)])).is_ok());
    }

    #[test]
    fn the_flag_parses_as_pflag_s_map() {
        assert_eq!(
            parse_flag("A=true, B=false,C=1").unwrap(),
            set(&[("A", true), ("B", false), ("C", true)])
        );
        assert!(parse_flag("A=true,")
            .unwrap_err()
            .contains("malformed pair"));
        assert_eq!(parse_flag("").unwrap(), set(&[]));
        assert!(parse_flag("A").unwrap_err().contains("malformed pair"));
        assert!(parse_flag("A=maybe")
            .unwrap_err()
            .contains("invalid value of A"));
    }
}
