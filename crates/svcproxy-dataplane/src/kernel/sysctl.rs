//! Kernel settings the rules need, in the current network namespace.
//!
//! Only `net.ipv4.conf.all.route_localnet=1`, and only when localhost NodePorts are
//! enabled (as upstream): without it the kernel drops DNATed packets from
//! 127.0.0.0/8 as martians. `net.bridge.bridge-nf-call-iptables` is deliberately left
//! alone: it is node (CNI) configuration, not the proxy's. Sysctls are written through
//! `/proc/sys`, which is per network namespace for `net.*`; failures are warnings,
//! because everything else still works.

use std::path::{Path, PathBuf};

use svcproxy_plan::PlanConfig;

/// One kernel setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sysctl {
    /// Dotted name, e.g. `net.ipv4.conf.all.route_localnet`.
    pub name: &'static str,
    pub value: &'static str,
    /// What does not work without it (for the warning).
    pub needed_for: &'static str,
}

impl Sysctl {
    /// The file under a `/proc/sys`-like root.
    pub fn path(&self, proc_sys: &Path) -> PathBuf {
        proc_sys.join(self.name.replace('.', "/"))
    }
}

/// What [`prepare_node`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodePreparation {
    /// Settings written, as `name=value`.
    pub changed: Vec<String>,
    /// Settings already right, as `name=value`.
    pub unchanged: Vec<String>,
    /// Settings that could not be read or written (also logged).
    pub warnings: Vec<String>,
}

/// The settings `cfg` needs.
pub fn required_sysctls(cfg: &PlanConfig) -> Vec<Sysctl> {
    let mut out = Vec::new();
    if cfg.needs_route_localnet() {
        out.push(Sysctl {
            name: "net.ipv4.conf.all.route_localnet",
            value: "1",
            needed_for: "localhost NodePorts",
        });
    }
    out
}

/// Writes `sysctls` (a data plane's [`NodeRequirements`](crate::NodeRequirements))
/// through `/proc/sys` in the current network namespace.
pub fn prepare_node(sysctls: &[Sysctl]) -> NodePreparation {
    prepare_node_at(Path::new("/proc/sys"), sysctls)
}

/// [`prepare_node`] under another `/proc/sys`-like root (tests).
pub fn prepare_node_at(proc_sys: &Path, sysctls: &[Sysctl]) -> NodePreparation {
    let mut out = NodePreparation::default();
    for sysctl in sysctls {
        let path = sysctl.path(proc_sys);
        let setting = format!("{}={}", sysctl.name, sysctl.value);
        match std::fs::read_to_string(&path) {
            Ok(current) if current.trim() == sysctl.value => {
                out.unchanged.push(setting);
                continue;
            }
            _ => {}
        }
        match std::fs::write(&path, format!("{}\n", sysctl.value)) {
            Ok(()) => {
                tracing::info!(sysctl = %sysctl.name, value = sysctl.value, "kernel setting changed");
                out.changed.push(setting);
            }
            Err(e) => {
                let warning = format!("cannot set {setting} ({}): {e}", path.display());
                tracing::warn!("{warning}; {} will not work", sysctl.needed_for);
                out.warnings.push(warning);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn localhost(on: bool) -> PlanConfig {
        PlanConfig {
            localhost_nodeports: on,
            nodeport_addresses: svcproxy_plan::NodePortAddresses::AllLocal,
            ..PlanConfig::default()
        }
    }

    #[test]
    fn nothing_is_needed_without_localhost_nodeports() {
        assert!(required_sysctls(&localhost(false)).is_empty());
        let v6_only = PlanConfig {
            ipv4: false,
            ..localhost(true)
        };
        assert!(required_sysctls(&v6_only).is_empty());
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            prepare_node_at(dir.path(), &required_sysctls(&localhost(false))),
            NodePreparation::default()
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn route_localnet_is_written_once() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("net/ipv4/conf/all/route_localnet");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "0\n").unwrap();
        let done = prepare_node_at(dir.path(), &required_sysctls(&localhost(true)));
        assert_eq!(done.changed, ["net.ipv4.conf.all.route_localnet=1"]);
        assert!(done.warnings.is_empty());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "1\n");
        let again = prepare_node_at(dir.path(), &required_sysctls(&localhost(true)));
        assert_eq!(again.unchanged, ["net.ipv4.conf.all.route_localnet=1"]);
        assert!(again.changed.is_empty());
    }

    #[test]
    fn failures_are_warnings() {
        let dir = tempfile::tempdir().unwrap();
        // No such directory: the write fails.
        let done = prepare_node_at(
            &dir.path().join("missing"),
            &required_sysctls(&localhost(true)),
        );
        assert!(done.changed.is_empty());
        assert_eq!(done.warnings.len(), 1);
        assert!(
            done.warnings[0].contains("route_localnet=1"),
            "{:?}",
            done.warnings
        );
    }

    #[test]
    fn bridge_netfilter_is_never_touched() {
        let all = PlanConfig {
            masquerade_all: true,
            localhost_nodeports: true,
            ..PlanConfig::default()
        };
        assert!(required_sysctls(&all)
            .iter()
            .all(|s| !s.name.starts_with("net.bridge")));
    }
}
