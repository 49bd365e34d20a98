//! The shared skeleton of each family's table: base chains on the netfilter hooks,
//! the dispatch chains, the verdict maps and sets, masquerading and the
//! "no endpoints" and ServiceCIDR checks.
//!
//! Entry point: [`base_ruleset`]. It translates the family's [`NodeIntent`] and
//! never looks at individual services; when that changes the planner does a full
//! resync. Map elements and `cluster-ips` are filled
//! in by the planner from the service ports' claims.
//!
//! Hooks and priorities follow upstream nftables mode:
//! - `filter-prerouting`/`filter-output` (filter, -110, before DNAT): the
//!   loadBalancerSourceRanges `firewall-check`, on the original destination.
//! - `filter-input`/`filter-forward` (filter, -110; after prerouting DNAT) and
//!   `filter-output-post-dnat` (filter, -90, after output DNAT): the "no endpoints"
//!   drop/reject checks and the `cluster-ips-check`. Upstream checks locally
//!   generated traffic before DNAT; checking it after DNAT means the host's own
//!   connections to an eTP Local external address, which the external chain
//!   short-circuits, are not dropped on nodes without local endpoints.
//! - `nat-prerouting`/`nat-output` (nat, -100): `services` dispatch.
//! - `nat-postrouting` (nat, 100): `masquerading` of marked packets.
//!
//! The table deliberately has few sets: the kernel finds a set by name in a list,
//! and its loop check walks every verdict map's elements for every chain it
//! visits, so per-service sets make loading quadratic. Several local-pod CIDRs
//! therefore live in one `pod-cidrs` set here, and the endpoints in at most
//! [`ENDPOINT_MAP_SHARDS`] data maps per protocol (see there).

use svcproxy_core::model::{IpFamily, Protocol};

use crate::intent::{LocalTraffic, NodeIntent, NodePortDestinations};
use crate::names::protocol_keyword;

use super::ruleset::{
    addr_type, family_keyword, BaseChain, Chain, ChainType, Hook, Map, MapType, Ruleset, Set,
};
use super::service::{join, MapId, MARK_MASQ_CHAIN, POD_CIDRS_SET, REJECT_CHAIN};

pub(crate) const CLUSTER_IPS_SET: &str = "cluster-ips";
pub(crate) const NODEPORT_IPS_SET: &str = "nodeport-ips";
/// Endpoint maps: every endpoint's address and port under a number. A set chain
/// DNATs to `numgen random mod N offset B map @endpoint-dnat-tcp-5e`, its
/// endpoints being the elements `B` to `B + N - 1` (the planner hands out the
/// numbers, unique in the family).
///
/// There is a map per protocol, because the map's port type names it: `nft`
/// refuses a `th dport` map after `meta l4proto tcp` once the map comes from the
/// kernel (nft 1.0.6). And the endpoints are spread over [`ENDPOINT_MAP_SHARDS`]
/// maps per protocol by the service port's hash, because the kernel checks each
/// element of a map against every rule using it, and each new rule against every
/// element: in one map that is quadratic (a full load at 10k services x 10
/// endpoints took 64 s, against 0.9 s sharded). A map exists while a set uses it
/// (the planner declares and deletes them).
pub(crate) const ENDPOINT_MAP_SHARDS: u64 = 256;

/// The endpoint map of a service port's sets (`hash`: its [`service_port_hash`](crate::names::service_port_hash)).
pub(crate) fn endpoint_map(protocol: Protocol, hash: u64) -> String {
    format!(
        "endpoint-dnat-{}-{:02x}",
        protocol_keyword(protocol),
        hash % ENDPOINT_MAP_SHARDS
    )
}

/// An endpoint map's declaration.
pub(crate) fn endpoint_map_decl(family: IpFamily, protocol: Protocol) -> Map {
    Map {
        map_type: MapType::Typeof {
            key: "numgen random mod 1".to_string(),
            data: format!(
                "{} daddr . {} dport",
                family_keyword(family),
                protocol_keyword(protocol)
            ),
        },
        elements: Vec::new(),
    }
}

/// `A . A` for every endpoint address `A` that may be this node's own: a connection
/// DNATed back to its own source is masqueraded (the hairpin), one rule for all.
pub(crate) const HAIRPIN_SET: &str = "hairpin-endpoints";

const SERVICES_CHAIN: &str = "services";
const MASQUERADING_CHAIN: &str = "masquerading";
const FIREWALL_CHECK_CHAIN: &str = "firewall-check";
const SERVICE_ENDPOINTS_CHECK_CHAIN: &str = "service-endpoints-check";
const NODEPORT_ENDPOINTS_CHECK_CHAIN: &str = "nodeport-endpoints-check";
const CLUSTER_IPS_CHECK_CHAIN: &str = "cluster-ips-check";

/// Filter chains run before DNAT (-100) so they see the service address.
const PRIORITY_FILTER: i32 = -110;
const PRIORITY_DSTNAT: i32 = -100;
/// After output DNAT: sees where locally generated traffic really goes.
const PRIORITY_FILTER_POST_DNAT: i32 = -90;
const PRIORITY_SRCNAT: i32 = 100;

fn base(chain_type: ChainType, hook: Hook, priority: i32, rules: Vec<String>) -> Chain {
    Chain {
        base: Some(BaseChain {
            chain_type,
            hook,
            priority,
        }),
        comment: None,
        rules,
        typed: None,
    }
}

fn regular(rules: Vec<String>) -> Chain {
    Chain {
        base: None,
        comment: None,
        rules,
        typed: None,
    }
}

/// The shared objects of one family's table, without map elements or cluster IPs.
pub(crate) fn base_ruleset(ctx: &NodeIntent) -> Ruleset {
    let family = ctx.family;
    // Several local-pod CIDRs live in one named set (see `Detect`).
    let pod_cidrs = match &ctx.local_traffic {
        Some(LocalTraffic::Cidrs(nets)) if nets.len() > 1 => nets.as_slice(),
        _ => &[],
    };
    let ipx = family_keyword(family);
    let mut rs = Ruleset::new(family);

    rs.sets.insert(
        CLUSTER_IPS_SET.to_string(),
        Set {
            key_type: addr_type(family).to_string(),
            timeout: None,
            interval: false,
            elements: Vec::new(),
        },
    );
    if let NodePortDestinations::Ips(ips) = &ctx.nodeports {
        rs.sets.insert(
            NODEPORT_IPS_SET.to_string(),
            Set {
                key_type: addr_type(family).to_string(),
                timeout: None,
                interval: false,
                elements: ips.iter().map(ToString::to_string).collect(),
            },
        );
    }
    if !pod_cidrs.is_empty() {
        rs.sets.insert(
            POD_CIDRS_SET.to_string(),
            Set {
                key_type: addr_type(family).to_string(),
                timeout: None,
                interval: true,
                elements: pod_cidrs.iter().map(ToString::to_string).collect(),
            },
        );
    }
    for map in MapId::ALL {
        rs.maps
            .insert(map.name().to_string(), Map::verdict(map.key_type(family)));
    }
    rs.sets.insert(
        HAIRPIN_SET.to_string(),
        Set {
            key_type: format!("{0} . {0}", addr_type(family)),
            timeout: None,
            interval: false,
            elements: Vec::new(),
        },
    );

    let loopback = match family {
        IpFamily::V4 => "127.0.0.0/8",
        IpFamily::V6 => "::1",
    };
    // The destinations NodePort lookups apply to, one rule each.
    let mut nodeport_dests = Vec::new();
    match &ctx.nodeports {
        NodePortDestinations::Ips(_) => {
            nodeport_dests.push(format!("{ipx} daddr @{NODEPORT_IPS_SET}"))
        }
        NodePortDestinations::AllLocal if ctx.localhost_nodeports => {
            nodeport_dests.push("fib daddr type local".to_string())
        }
        NodePortDestinations::AllLocal => {
            nodeport_dests.push(format!("fib daddr type local {ipx} daddr != {loopback}"));
        }
    }
    if ctx.localhost_nodeports && matches!(ctx.nodeports, NodePortDestinations::Ips(_)) {
        nodeport_dests.push(format!("{ipx} daddr {loopback}"));
    }
    let tuple = format!("{ipx} daddr . meta l4proto . th dport");

    let new = "ct state new";
    let chains = [
        (
            "filter-prerouting",
            base(
                ChainType::Filter,
                Hook::Prerouting,
                PRIORITY_FILTER,
                vec![format!("{new} jump {FIREWALL_CHECK_CHAIN}")],
            ),
        ),
        (
            "filter-input",
            base(
                ChainType::Filter,
                Hook::Input,
                PRIORITY_FILTER,
                vec![
                    format!("{new} jump {NODEPORT_ENDPOINTS_CHECK_CHAIN}"),
                    format!("{new} jump {SERVICE_ENDPOINTS_CHECK_CHAIN}"),
                ],
            ),
        ),
        (
            "filter-forward",
            base(
                ChainType::Filter,
                Hook::Forward,
                PRIORITY_FILTER,
                ctx.drop_invalid_forwarded
                    .then(|| "ct state invalid drop".to_string())
                    .into_iter()
                    .chain([
                        format!("{new} jump {SERVICE_ENDPOINTS_CHECK_CHAIN}"),
                        format!("{new} jump {CLUSTER_IPS_CHECK_CHAIN}"),
                    ])
                    .collect(),
            ),
        ),
        (
            "filter-output",
            base(
                ChainType::Filter,
                Hook::Output,
                PRIORITY_FILTER,
                vec![format!("{new} jump {FIREWALL_CHECK_CHAIN}")],
            ),
        ),
        (
            "filter-output-post-dnat",
            base(
                ChainType::Filter,
                Hook::Output,
                PRIORITY_FILTER_POST_DNAT,
                vec![
                    format!("{new} jump {SERVICE_ENDPOINTS_CHECK_CHAIN}"),
                    format!("{new} jump {CLUSTER_IPS_CHECK_CHAIN}"),
                ],
            ),
        ),
        (
            "nat-prerouting",
            base(
                ChainType::Nat,
                Hook::Prerouting,
                PRIORITY_DSTNAT,
                vec![format!("jump {SERVICES_CHAIN}")],
            ),
        ),
        (
            "nat-output",
            base(
                ChainType::Nat,
                Hook::Output,
                PRIORITY_DSTNAT,
                vec![format!("jump {SERVICES_CHAIN}")],
            ),
        ),
        (
            "nat-postrouting",
            base(
                ChainType::Nat,
                Hook::Postrouting,
                PRIORITY_SRCNAT,
                vec![format!("jump {MASQUERADING_CHAIN}")],
            ),
        ),
        (SERVICES_CHAIN, {
            let mut rules = vec![format!("{tuple} vmap @{}", MapId::ServiceIps.name())];
            for dest in &nodeport_dests {
                rules.push(format!(
                    "{dest} meta l4proto . th dport vmap @{}",
                    MapId::ServiceNodePorts.name()
                ));
            }
            regular(rules)
        }),
        (
            SERVICE_ENDPOINTS_CHECK_CHAIN,
            regular(vec![format!(
                "{tuple} vmap @{}",
                MapId::NoEndpointServices.name()
            )]),
        ),
        (
            NODEPORT_ENDPOINTS_CHECK_CHAIN,
            regular(
                nodeport_dests
                    .iter()
                    .map(|dest| {
                        format!(
                            "{dest} meta l4proto . th dport vmap @{}",
                            MapId::NoEndpointNodePorts.name()
                        )
                    })
                    .collect(),
            ),
        ),
        (
            FIREWALL_CHECK_CHAIN,
            regular(vec![format!("{tuple} vmap @{}", MapId::FirewallIps.name())]),
        ),
        (CLUSTER_IPS_CHECK_CHAIN, {
            // Runs after DNAT: a packet still addressed to a cluster IP here matched
            // no service port, and one inside a ServiceCIDR hit no cluster IP.
            let mut rules = Vec::new();
            if ctx.guard_service_ips {
                rules.push(format!(
                    "{ipx} daddr @{CLUSTER_IPS_SET} goto {REJECT_CHAIN}"
                ));
            }
            if ctx.guard_service_ips && !ctx.service_cidrs.is_empty() {
                rules.push(format!(
                    "{ipx} daddr {{ {} }} drop",
                    join(ctx.service_cidrs.iter())
                ));
            }
            regular(rules)
        }),
        // A TCP reset refuses a TCP client at once; an ICMP error can reach a
        // connecting socket before it is ready for it and cost a SYN retry (~1 s).
        (
            REJECT_CHAIN,
            regular(vec![
                "meta l4proto tcp reject with tcp reset".to_string(),
                "reject".to_string(),
            ]),
        ),
        (
            MARK_MASQ_CHAIN,
            regular(vec![format!("mark set mark or {:#x}", ctx.masquerade_mark)]),
        ),
        (
            MASQUERADING_CHAIN,
            regular(vec![
                // The hairpin: a connection DNATed back to the endpoint it came
                // from must leave with another source, or the reply never
                // reaches conntrack to be translated back.
                format!("ct status dnat {ipx} saddr . {ipx} daddr @{HAIRPIN_SET} jump {MARK_MASQ_CHAIN}"),
                format!("mark and {:#x} == 0 return", ctx.masquerade_mark),
                // Clear the bit so a packet re-entering (e.g. tunnelled) is not
                // masqueraded twice.
                format!("mark set mark xor {:#x}", ctx.masquerade_mark),
                "masquerade fully-random".to_string(),
            ]),
        ),
    ];
    for (name, chain) in chains {
        rs.chains.insert(name.to_string(), chain);
    }
    rs
}
