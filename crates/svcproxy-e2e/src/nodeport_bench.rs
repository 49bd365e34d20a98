//! The NodePort benchmarks' namespaces: a client (`ext`, 10.71.0.100) on one veth of
//! a node (10.71.0.1, forwarding), and a backend (10.72.0.2) on another of the node's
//! veths (`p0`, 10.72.0.1), each veth named `eth0` on the far side.

use anyhow::Result;
use svcproxy_testkit::netns::{self, NsSet};

/// The client's, the node's and the backend's addresses.
pub const CLIENT: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 71, 0, 100);
pub const NODE: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 71, 0, 1);
pub const BACKEND: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 72, 0, 2);

/// A benchmark's setting from the environment: `name` as a number, else `default`.
pub fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The median of a benchmark's runs (0 for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The three namespaces in `set`, wired: `(ext, node, backend)`.
pub fn namespaces(set: &mut NsSet) -> Result<(String, String, String)> {
    let names = set.add(&["ext".to_string(), "node".to_string(), "backend".to_string()])?;
    let (ext, node, backend) = (names[0].clone(), names[1].clone(), names[2].clone());
    netns::ip_batch(
        &ext,
        &[
            "link set lo up".into(),
            format!("link add eth0 type veth peer name eth0 netns {node}"),
            format!("addr add {CLIENT}/24 dev eth0"),
            "link set eth0 up".into(),
            "route add 10.72.0.0/24 via 10.71.0.1".into(),
        ],
    )?;
    netns::ip_batch(
        &node,
        &[
            "link set lo up".into(),
            format!("addr add {NODE}/24 dev eth0"),
            "link set eth0 up".into(),
            format!("link add p0 type veth peer name eth0 netns {backend}"),
            "addr add 10.72.0.1/24 dev p0".into(),
            "link set p0 up".into(),
        ],
    )?;
    netns::sysctl(&node, &[("net.ipv4.ip_forward", "1")])?;
    netns::ip_batch(
        &backend,
        &[
            "link set lo up".into(),
            format!("addr add {BACKEND}/24 dev eth0"),
            "link set eth0 up".into(),
            "route add default via 10.72.0.1".into(),
        ],
    )?;
    Ok((ext, node, backend))
}
