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

use ipnet::IpNet;
use svcproxy_core::model::{IpFamily, Protocol};

use crate::intent::{LocalTraffic, NodeIntent, NodePortDestinations};
use crate::names::protocol_keyword;

use super::ruleset::{BaseChain, Chain, ChainType, Field, Hook, Map, MapType, Ruleset, Set};
use super::service::{MapId, MARK_MASQ_CHAIN, POD_CIDRS_SET, REJECT_CHAIN};
use super::typed::{Action, Addr, CtState, Match, TypedRule};

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
        map_type: MapType::Endpoints { family, protocol },
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

fn base(chain_type: ChainType, hook: Hook, priority: i32, rules: Vec<TypedRule>) -> Chain {
    Chain {
        base: Some(BaseChain {
            chain_type,
            hook,
            priority,
        }),
        comment: None,
        rules,
    }
}

fn regular(rules: Vec<TypedRule>) -> Chain {
    Chain {
        base: None,
        comment: None,
        rules,
    }
}

/// The loopback prefix of a family (`127.0.0.0/8`, `::1`).
pub(crate) fn loopback(family: IpFamily) -> IpNet {
    match family {
        IpFamily::V4 => "127.0.0.0/8".parse().expect("a valid prefix"),
        IpFamily::V6 => "::1/128".parse().expect("a valid prefix"),
    }
}

/// A set of addresses with no flags.
fn address_set(key: Vec<Field>, elements: Vec<String>) -> Set {
    Set {
        key,
        timeout: None,
        interval: false,
        elements,
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
    let addr = Field::Addr(family);
    let mut rs = Ruleset::new(family);

    rs.sets.insert(
        CLUSTER_IPS_SET.to_string(),
        address_set(vec![addr], Vec::new()),
    );
    if let NodePortDestinations::Ips(ips) = &ctx.nodeports {
        rs.sets.insert(
            NODEPORT_IPS_SET.to_string(),
            address_set(vec![addr], ips.iter().map(ToString::to_string).collect()),
        );
    }
    if !pod_cidrs.is_empty() {
        rs.sets.insert(
            POD_CIDRS_SET.to_string(),
            Set {
                interval: true,
                ..address_set(
                    vec![addr],
                    pod_cidrs.iter().map(ToString::to_string).collect(),
                )
            },
        );
    }
    for map in MapId::ALL {
        rs.maps
            .insert(map.name().to_string(), Map::verdict(map.key_type(family)));
    }
    rs.sets.insert(
        HAIRPIN_SET.to_string(),
        address_set(vec![addr, addr], Vec::new()),
    );

    let rule = |matches: Vec<Match>, action: Action| TypedRule::new(family, matches, action);
    let daddr_is = |net: IpNet, negate: bool| Match::Prefix {
        addr: Addr::Daddr,
        net,
        negate,
    };
    // The destinations NodePort lookups apply to, one rule each.
    let mut nodeport_dests = Vec::new();
    match &ctx.nodeports {
        NodePortDestinations::Ips(_) => nodeport_dests.push(vec![Match::InSet {
            addr: Addr::Daddr,
            set: NODEPORT_IPS_SET.to_string(),
            negate: false,
        }]),
        NodePortDestinations::AllLocal if ctx.localhost_nodeports => {
            nodeport_dests.push(vec![Match::FibLocal(Addr::Daddr)])
        }
        NodePortDestinations::AllLocal => nodeport_dests.push(vec![
            Match::FibLocal(Addr::Daddr),
            daddr_is(loopback(family), true),
        ]),
    }
    if ctx.localhost_nodeports && matches!(ctx.nodeports, NodePortDestinations::Ips(_)) {
        nodeport_dests.push(vec![daddr_is(loopback(family), false)]);
    }
    let vmap = |daddr: bool, map: MapId| Action::Vmap {
        daddr,
        map: map.name().to_string(),
    };
    let jump = |chain: &str| Action::Jump(chain.to_string());
    // KEP-6032: a NodePort of a rejected protocol on loopback goes, by the map the
    // planner fills from the NodePorts, to its protocol's counting reject chain,
    // before DNAT. (A lookup in `service-nodeports` itself cannot do: the kernel
    // checks a verdict map's chains against every chain that looks it up, and a
    // filter chain may not reach their DNAT.)
    let localhost_rejects: Vec<TypedRule> = if ctx.localhost_rejects.is_empty() {
        Vec::new()
    } else {
        rs.maps.insert(
            MapId::LocalhostNodePortRejects.name().to_string(),
            Map::verdict(MapId::LocalhostNodePortRejects.key_type(family)),
        );
        vec![rule(
            vec![daddr_is(loopback(family), false)],
            vmap(false, MapId::LocalhostNodePortRejects),
        )]
    };
    let if_new = |chain: &str| rule(vec![Match::CtState(CtState::New)], jump(chain));

    let chains = [
        (
            "filter-prerouting",
            base(
                ChainType::Filter,
                Hook::Prerouting,
                PRIORITY_FILTER,
                vec![if_new(FIREWALL_CHECK_CHAIN)],
            ),
        ),
        (
            "filter-input",
            base(
                ChainType::Filter,
                Hook::Input,
                PRIORITY_FILTER,
                vec![
                    if_new(NODEPORT_ENDPOINTS_CHECK_CHAIN),
                    if_new(SERVICE_ENDPOINTS_CHECK_CHAIN),
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
                    .then(|| rule(vec![Match::CtState(CtState::Invalid)], Action::Drop))
                    .into_iter()
                    .chain([
                        if_new(SERVICE_ENDPOINTS_CHECK_CHAIN),
                        if_new(CLUSTER_IPS_CHECK_CHAIN),
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
                localhost_rejects
                    .into_iter()
                    .chain([if_new(FIREWALL_CHECK_CHAIN)])
                    .collect(),
            ),
        ),
        (
            "filter-output-post-dnat",
            base(
                ChainType::Filter,
                Hook::Output,
                PRIORITY_FILTER_POST_DNAT,
                vec![
                    if_new(SERVICE_ENDPOINTS_CHECK_CHAIN),
                    if_new(CLUSTER_IPS_CHECK_CHAIN),
                ],
            ),
        ),
        (
            "nat-prerouting",
            base(
                ChainType::Nat,
                Hook::Prerouting,
                PRIORITY_DSTNAT,
                vec![rule(Vec::new(), jump(SERVICES_CHAIN))],
            ),
        ),
        (
            "nat-output",
            base(
                ChainType::Nat,
                Hook::Output,
                PRIORITY_DSTNAT,
                vec![rule(Vec::new(), jump(SERVICES_CHAIN))],
            ),
        ),
        (
            "nat-postrouting",
            base(
                ChainType::Nat,
                Hook::Postrouting,
                PRIORITY_SRCNAT,
                vec![rule(Vec::new(), jump(MASQUERADING_CHAIN))],
            ),
        ),
        (SERVICES_CHAIN, {
            let mut rules = vec![rule(Vec::new(), vmap(true, MapId::ServiceIps))];
            for dest in &nodeport_dests {
                rules.push(rule(dest.clone(), vmap(false, MapId::ServiceNodePorts)));
            }
            regular(rules)
        }),
        (
            SERVICE_ENDPOINTS_CHECK_CHAIN,
            regular(vec![rule(
                Vec::new(),
                vmap(true, MapId::NoEndpointServices),
            )]),
        ),
        (
            NODEPORT_ENDPOINTS_CHECK_CHAIN,
            regular(
                nodeport_dests
                    .iter()
                    .map(|dest| rule(dest.clone(), vmap(false, MapId::NoEndpointNodePorts)))
                    .collect(),
            ),
        ),
        (
            FIREWALL_CHECK_CHAIN,
            regular(vec![rule(Vec::new(), vmap(true, MapId::FirewallIps))]),
        ),
        (CLUSTER_IPS_CHECK_CHAIN, {
            // Runs after DNAT: a packet still addressed to a cluster IP here matched
            // no service port, and one inside a ServiceCIDR hit no cluster IP (one
            // rule per CIDR: an anonymous set would cost the kernel's loop check a
            // scan of every set, as in `Detect`).
            let mut rules = Vec::new();
            if ctx.guard_service_ips {
                rules.push(rule(
                    vec![Match::InSet {
                        addr: Addr::Daddr,
                        set: CLUSTER_IPS_SET.to_string(),
                        negate: false,
                    }],
                    Action::Goto(REJECT_CHAIN.to_string()),
                ));
                for net in &ctx.service_cidrs {
                    rules.push(rule(vec![daddr_is(*net, false)], Action::Drop));
                }
            }
            regular(rules)
        }),
        // A TCP reset refuses a TCP client at once; an ICMP error can reach a
        // connecting socket before it is ready for it and cost a SYN retry (~1 s).
        (
            REJECT_CHAIN,
            regular(vec![
                rule(
                    vec![Match::L4Proto(Protocol::Tcp)],
                    Action::Reject { tcp_reset: true },
                ),
                rule(Vec::new(), Action::Reject { tcp_reset: false }),
            ]),
        ),
        (
            MARK_MASQ_CHAIN,
            regular(vec![rule(Vec::new(), Action::MarkOr(ctx.masquerade_mark))]),
        ),
        (
            MASQUERADING_CHAIN,
            regular(vec![
                // The hairpin: a connection DNATed back to the endpoint it came
                // from must leave with another source, or the reply never
                // reaches conntrack to be translated back.
                rule(
                    vec![
                        Match::CtStatusDnat,
                        Match::PairInSet(HAIRPIN_SET.to_string()),
                    ],
                    jump(MARK_MASQ_CHAIN),
                ),
                rule(vec![Match::MarkClear(ctx.masquerade_mark)], Action::Return),
                // Clear the bit so a packet re-entering (e.g. tunnelled) is not
                // masqueraded twice.
                rule(Vec::new(), Action::MarkXor(ctx.masquerade_mark)),
                rule(Vec::new(), Action::MasqueradeFullyRandom),
            ]),
        ),
    ];
    for (name, chain) in chains {
        rs.chains.insert(name.to_string(), chain);
    }
    for &p in &ctx.localhost_rejects {
        rs.chains.insert(
            localhost_reject_chain(p),
            regular(vec![rule(
                Vec::new(),
                Action::CountedReject {
                    tcp_reset: p == Protocol::Tcp,
                },
            )]),
        );
    }
    rs
}

/// The chain counting and rejecting a protocol's NodePorts on loopback
/// (`localhost-nodeport-reject-udp`): its one rule's counter is the
/// `kubeproxy_nftables_localhost_nodeport_rejected_packets_total` of the protocol.
pub fn localhost_reject_chain(protocol: Protocol) -> String {
    format!("localhost-nodeport-reject-{}", protocol_keyword(protocol))
}
