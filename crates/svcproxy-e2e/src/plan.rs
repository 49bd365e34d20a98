//! The one address plan every end-to-end test uses, stated once.
//!
//! IPv4 comes only from 198.18.0.0/15 (RFC 2544 benchmarking range) and IPv6 only from
//! 2001:db8::/32 (documentation range); these addresses exist only inside namespaces the
//! harness creates, which have no route out of the machine.
//!
//! | what                         | IPv4              | IPv6                  |
//! |------------------------------|-------------------|-----------------------|
//! | node LAN                     | 198.18.0.0/24     | 2001:db8::/64         |
//! | node *i* (0 = node-a)        | 198.18.0.(i+1)    | 2001:db8::(i+1)       |
//! | LAN router (bridge, `lan`)   | 198.18.0.254      | 2001:db8::fe          |
//! | external client `ext`        | 198.18.0.100, .101| 2001:db8::100, ::101  |
//! | all pods (`--cluster-cidr`)  | 198.18.16.0/20    | 2001:db8:10::/44      |
//! | pod CIDR of node *i*         | 198.18.(17+i).0/24| 2001:db8:(11+i)::/64  |
//! | pod *j* on node *i*          | 198.18.(17+i).(j+1)| 2001:db8:(11+i)::(j+1)|
//! | pod gateway on node *i*      | 198.18.(17+i).254 | 2001:db8:(11+i)::ffff |
//! | service CIDR (cluster IPs)   | 198.19.0.0/16     | 2001:db8:ffff::/112   |
//! | external / load-balancer IPs | 198.18.100.0/24   | 2001:db8:100::/64     |
//!
//! (IPv6 hextets are hex: node-a's pods are 198.18.17.0/24 and 2001:db8:11::/64.)
//!
//! The pod CIDRs share one prefix that excludes the node LAN and the external client, so
//! `--detect-local-mode ClusterCIDR` classifies exactly the pods as local.
//! External and load-balancer IPs deliberately sit outside the service CIDR: upstream
//! nftables mode drops or rejects traffic to unallocated addresses inside a ServiceCIDR, and
//! an overlap would make those rules swallow external-IP tests.
//!
//! Entry points: [`node_ip`], [`pod_ip`], [`pod_cidr`], the `*_V4` / `*_V6` constants and
//! [`cluster_ip`] / [`external_ip`] to pick service addresses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An IP family; every address helper takes one so tests can be written once per family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const BOTH: [Family; 2] = [Family::V4, Family::V6];

    /// `4` or `6`, as `ip -4` / `ip -6` and nftables' `ip` / `ip6` want it.
    pub fn number(self) -> u8 {
        match self {
            Family::V4 => 4,
            Family::V6 => 6,
        }
    }

    pub fn of(ip: IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
}

/// Most nodes a cluster may have: their pod CIDRs must stay inside the cluster CIDR.
pub const MAX_NODES: usize = 8;
/// Most pods per node: pod host numbers must stay below the gateway (.254 / ::ffff).
pub const MAX_PODS_PER_NODE: usize = 200;

pub const NODE_LAN_V4: &str = "198.18.0.0/24";
pub const NODE_LAN_V6: &str = "2001:db8::/64";
pub const NODE_LAN_PREFIX_V4: u8 = 24;
pub const NODE_LAN_PREFIX_V6: u8 = 64;

pub const LAN_ROUTER_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 254);
pub const LAN_ROUTER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0xfe);

pub const EXT_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
pub const EXT_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);
/// A second external-client address, e.g. a source outside `loadBalancerSourceRanges`.
pub const EXT_ALT_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 101);
pub const EXT_ALT_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x101);

pub const SERVICE_CIDR_V4: &str = "198.19.0.0/16";
pub const SERVICE_CIDR_V6: &str = "2001:db8:ffff::/112";

pub const EXTERNAL_IPS_V4: &str = "198.18.100.0/24";
pub const EXTERNAL_IPS_V6: &str = "2001:db8:100::/64";

/// All pod CIDRs together (what `--cluster-cidr` covers), and nothing else of the plan.
pub const CLUSTER_CIDR_V4: &str = "198.18.16.0/20";
pub const CLUSTER_CIDR_V6: &str = "2001:db8:10::/44";

pub fn cluster_cidr(family: Family) -> &'static str {
    match family {
        Family::V4 => CLUSTER_CIDR_V4,
        Family::V6 => CLUSTER_CIDR_V6,
    }
}

/// The third octet (IPv4) / third hextet (IPv6) of a node's pod CIDR.
fn pod_net(node: usize) -> (u8, u16) {
    assert!(node < MAX_NODES, "node index {node} outside the plan");
    (17 + node as u8, 0x11 + node as u16)
}

/// Node names in plan order; `node_name(0)` is `node-a`.
pub fn node_name(node: usize) -> String {
    assert!(node < MAX_NODES, "node index {node} outside the plan");
    format!("node-{}", (b'a' + node as u8) as char)
}

/// Pod names, e.g. `pod-a0`: short, unique across the cluster, and what the echo server
/// reports as its backend name.
pub fn pod_name(node: usize, pod: usize) -> String {
    assert!(node < MAX_NODES, "node index {node} outside the plan");
    format!("pod-{}{}", (b'a' + node as u8) as char, pod)
}

/// A node's LAN address (its primary IP, the one NodePorts use by default).
pub fn node_ip(node: usize, family: Family) -> IpAddr {
    assert!(node < MAX_NODES, "node index {node} outside the plan");
    let host = node as u8 + 1;
    match family {
        Family::V4 => Ipv4Addr::new(198, 18, 0, host).into(),
        Family::V6 => Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, host.into()).into(),
    }
}

/// The pod CIDR of a node, as text for `ip route` and manifests.
pub fn pod_cidr(node: usize, family: Family) -> String {
    let (v4, v6) = pod_net(node);
    match family {
        Family::V4 => format!("198.18.{v4}.0/24"),
        Family::V6 => format!("2001:db8:{v6:x}::/64"),
    }
}

pub fn pod_ip(node: usize, pod: usize, family: Family) -> IpAddr {
    assert!(pod < MAX_PODS_PER_NODE, "pod index {pod} outside the plan");
    let (v4, v6) = pod_net(node);
    let host = pod as u16 + 1;
    match family {
        Family::V4 => Ipv4Addr::new(198, 18, v4, host as u8).into(),
        Family::V6 => Ipv6Addr::new(0x2001, 0xdb8, v6, 0, 0, 0, 0, host).into(),
    }
}

/// The node-side address of every pod veth on a node: the pods' default gateway.
pub fn pod_gateway(node: usize, family: Family) -> IpAddr {
    let (v4, v6) = pod_net(node);
    match family {
        Family::V4 => Ipv4Addr::new(198, 18, v4, 254).into(),
        Family::V6 => Ipv6Addr::new(0x2001, 0xdb8, v6, 0, 0, 0, 0, 0xffff).into(),
    }
}

/// The `n`-th address of the service CIDR, e.g. `cluster_ip(10, V4)` = 198.19.0.10.
pub fn cluster_ip(n: u16, family: Family) -> IpAddr {
    match family {
        Family::V4 => Ipv4Addr::new(198, 19, (n >> 8) as u8, n as u8).into(),
        Family::V6 => Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, n).into(),
    }
}

/// The `n`-th external / load-balancer address (1..=253), routed from `ext` to a node.
pub fn external_ip(n: u8, family: Family) -> IpAddr {
    match family {
        Family::V4 => Ipv4Addr::new(198, 18, 100, n).into(),
        Family::V6 => Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, n.into()).into(),
    }
}

pub fn ext_ip(family: Family) -> IpAddr {
    match family {
        Family::V4 => EXT_V4.into(),
        Family::V6 => EXT_V6.into(),
    }
}

pub fn ext_alt_ip(family: Family) -> IpAddr {
    match family {
        Family::V4 => EXT_ALT_V4.into(),
        Family::V6 => EXT_ALT_V6.into(),
    }
}

pub fn lan_router_ip(family: Family) -> IpAddr {
    match family {
        Family::V4 => LAN_ROUTER_V4.into(),
        Family::V6 => LAN_ROUTER_V6.into(),
    }
}

pub fn lan_prefix(family: Family) -> u8 {
    match family {
        Family::V4 => NODE_LAN_PREFIX_V4,
        Family::V6 => NODE_LAN_PREFIX_V6,
    }
}

pub fn service_cidr(family: Family) -> &'static str {
    match family {
        Family::V4 => SERVICE_CIDR_V4,
        Family::V6 => SERVICE_CIDR_V6,
    }
}

pub fn external_ips_cidr(family: Family) -> &'static str {
    match family {
        Family::V4 => EXTERNAL_IPS_V4,
        Family::V6 => EXTERNAL_IPS_V6,
    }
}

/// A host address as a CIDR of the full length (/32 or /128).
pub fn host_cidr(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => format!("{ip}/32"),
        IpAddr::V6(_) => format!("{ip}/128"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_addresses_stay_inside_the_test_ranges() {
        let v4_range: (u32, u32) = (u32::from(Ipv4Addr::new(198, 18, 0, 0)), 15);
        let in_v4 = |ip: IpAddr| match ip {
            IpAddr::V4(a) => {
                (u32::from(a) >> (32 - v4_range.1)) == (v4_range.0 >> (32 - v4_range.1))
            }
            IpAddr::V6(_) => false,
        };
        let in_v6 = |ip: IpAddr| match ip {
            IpAddr::V6(a) => a.segments()[0] == 0x2001 && a.segments()[1] == 0xdb8,
            IpAddr::V4(_) => false,
        };
        for node in 0..MAX_NODES {
            assert!(in_v4(node_ip(node, Family::V4)));
            assert!(in_v6(node_ip(node, Family::V6)));
            for pod in [0, MAX_PODS_PER_NODE - 1] {
                assert!(in_v4(pod_ip(node, pod, Family::V4)));
                assert!(in_v6(pod_ip(node, pod, Family::V6)));
                assert_ne!(pod_ip(node, pod, Family::V4), pod_gateway(node, Family::V4));
            }
        }
        assert!(in_v4(cluster_ip(65535, Family::V4)));
        assert!(in_v6(cluster_ip(65535, Family::V6)));
        assert!(in_v4(external_ip(253, Family::V4)));
        assert!(in_v6(external_ip(253, Family::V6)));
    }

    #[test]
    fn the_cluster_cidr_holds_exactly_the_pods() {
        use ipnet::IpNet;
        for f in Family::BOTH {
            let cluster: IpNet = cluster_cidr(f).parse().unwrap();
            let services: IpNet = service_cidr(f).parse().unwrap();
            let external: IpNet = external_ips_cidr(f).parse().unwrap();
            for node in 0..MAX_NODES {
                let pods: IpNet = pod_cidr(node, f).parse().unwrap();
                assert!(cluster.contains(&pods), "{pods} outside {cluster}");
                assert!(pods.contains(&pod_ip(node, 0, f)));
                assert!(pods.contains(&pod_gateway(node, f)));
                assert!(!cluster.contains(&node_ip(node, f)));
            }
            for outside in [ext_ip(f), ext_alt_ip(f), lan_router_ip(f)] {
                assert!(!cluster.contains(&outside), "{outside} inside {cluster}");
            }
            for ip in [external_ip(1, f), external_ip(253, f)] {
                assert!(external.contains(&ip));
                assert!(!services.contains(&ip) && !cluster.contains(&ip));
            }
            assert!(services.contains(&cluster_ip(1, f)));
            assert!(!cluster.contains(&cluster_ip(1, f)));
        }
    }

    #[test]
    fn names_follow_node_letters() {
        assert_eq!(node_name(0), "node-a");
        assert_eq!(node_name(1), "node-b");
        assert_eq!(pod_name(1, 2), "pod-b2");
        assert_eq!(pod_cidr(1, Family::V4), "198.18.18.0/24");
        assert_eq!(pod_cidr(1, Family::V6), "2001:db8:12::/64");
        assert_eq!(pod_ip(0, 0, Family::V6).to_string(), "2001:db8:11::1");
    }
}
