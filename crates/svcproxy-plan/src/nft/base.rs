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

use super::common::{MapId, MARK_MASQ_CHAIN, POD_CIDRS_SET, REJECT_CHAIN};
use super::ruleset::{BaseChain, Chain, ChainType, Field, Hook, Map, MapType, Ruleset, Set};
use super::service::Detect;
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

/// A cluster IP port is served without a chain of its own when nothing but the
/// choice of endpoint and its masquerade is needed (see
/// `service::cluster_layout`): linking or unlinking it is then data elements
/// only, which the kernel does not validate table-wide (see the module `nft`).
///
/// Its destination `VIP . PROTO . PORT` goes in the set of its protocol and
/// endpoint count N (`clusterip-tcp-3`), whose one rule in `services` DNATs to
/// `numgen random mod N` of the elements `VIP . PROTO . PORT . 0..N-1` of the
/// protocol's map (`clusterip-dnat-tcp`). The sets and their rules exist per
/// count in use: a partial sync adds one when a count first appears (that rule
/// is validated once), and only a full sync removes the unused.
pub(crate) fn clusterip_set(protocol: Protocol, n: u32) -> String {
    format!("clusterip-{}-{n}", protocol_keyword(protocol))
}

/// The cluster IP endpoint map of a protocol (see [`clusterip_set`]).
pub(crate) fn clusterip_dnat_map(protocol: Protocol) -> String {
    format!("clusterip-dnat-{}", protocol_keyword(protocol))
}

/// The cluster IP ports whose every connection is masqueraded
/// (`--masquerade-all`), and those masqueraded unless from this node's pods.
pub(crate) const CLUSTERIP_MASQ_SET: &str = "clusterip-masq";
pub(crate) const CLUSTERIP_MASQ_NONLOCAL_SET: &str = "clusterip-masq-nonlocal";

const PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

/// A set of cluster IP ports, `VIP . PROTO . PORT`.
pub(crate) fn clusterip_port_set(family: IpFamily) -> Set {
    address_set(
        vec![Field::Addr(family), Field::Proto, Field::Port],
        Vec::new(),
    )
}

/// The rule serving the cluster IP ports of `protocol` with `n` endpoints.
pub(crate) fn clusterip_rule(family: IpFamily, protocol: Protocol, n: u32) -> TypedRule {
    TypedRule::new(
        family,
        vec![
            Match::TupleInSet(clusterip_set(protocol, n)),
            Match::L4Proto(protocol),
        ],
        Action::TupleDnat {
            n,
            map: clusterip_dnat_map(protocol),
        },
    )
}

/// `A . A` for every endpoint address `A` that may be this node's own: a connection
/// DNATed back to its own source is masqueraded (the hairpin), one rule for all.
pub(crate) const HAIRPIN_SET: &str = "hairpin-endpoints";

/// The dispatch chain both NAT base chains jump to.
pub const SERVICES_CHAIN: &str = "services";

/// The chains whose use count (their rules, and the jumps to them) the nftables
/// mode's drift check compares with what the last full sync left: every base chain
/// of the skeleton, and the dispatch chain. A flushed table or base chain keeps the
/// table's handle but lowers these.
pub const DRIFT_WATCHED_CHAINS: &[&str] = &[
    SERVICES_CHAIN,
    "filter-prerouting",
    "filter-input",
    "filter-forward",
    "filter-output",
    "filter-output-post-dnat",
    "nat-prerouting",
    "nat-output",
    "nat-postrouting",
];
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

/// The shared objects of one family's table, without map elements or cluster IPs:
/// its sets and maps, the base chains on the hooks, the dispatch to services, the
/// checks after it, and masquerading.
pub(crate) fn base_ruleset(ctx: &NodeIntent) -> Ruleset {
    let r = Rules(ctx.family);
    let mut rs = Ruleset::new(ctx.family);
    shared_sets(ctx, &mut rs);
    let nodeport_dests = nodeport_destinations(ctx, r);
    let chains = hook_chains(ctx, r, &mut rs)
        .into_iter()
        .chain(dispatch_chains(ctx, r, &nodeport_dests))
        .chain(check_chains(ctx, r, &nodeport_dests))
        .chain(masquerade_chains(ctx, r));
    for (name, chain) in chains {
        rs.chains.insert(name.to_string(), chain);
    }
    for &p in &ctx.localhost_rejects {
        // A TCP reset needs the protocol matched: `nft` adds `meta l4proto tcp` to
        // the text by itself, and the netlink writer must write the same rule.
        let tcp = p == Protocol::Tcp;
        let matches = if tcp {
            vec![Match::L4Proto(Protocol::Tcp)]
        } else {
            Vec::new()
        };
        rs.chains.insert(
            localhost_reject_chain(p),
            regular(vec![
                r.rule(matches, Action::CountedReject { tcp_reset: tcp })
            ]),
        );
    }
    rs
}

/// Makes the rules of one family's skeleton.
#[derive(Clone, Copy)]
struct Rules(IpFamily);

impl Rules {
    fn rule(self, matches: Vec<Match>, action: Action) -> TypedRule {
        TypedRule::new(self.0, matches, action)
    }

    fn daddr_is(self, net: IpNet, negate: bool) -> Match {
        Match::Prefix {
            addr: Addr::Daddr,
            net,
            negate,
        }
    }

    fn vmap(self, daddr: bool, map: MapId) -> Action {
        Action::Vmap {
            daddr,
            map: map.name().to_string(),
        }
    }

    /// `ct state new jump CHAIN`.
    fn if_new(self, chain: &str) -> TypedRule {
        self.rule(vec![Match::CtState(CtState::New)], jump(chain))
    }

    /// A rule of no condition jumping to `chain`.
    fn jump_to(self, chain: &str) -> TypedRule {
        self.rule(Vec::new(), jump(chain))
    }
}

fn jump(chain: &str) -> Action {
    Action::Jump(chain.to_string())
}

/// The sets and the verdict maps every table has (the elements of `nodeport-ips`
/// and `pod-cidrs` with them; the maps' come from the planner).
fn shared_sets(ctx: &NodeIntent, rs: &mut Ruleset) {
    let family = ctx.family;
    let addr = Field::Addr(family);
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
    // Several local-pod CIDRs live in one named set (see `Detect`).
    match &ctx.local_traffic {
        Some(LocalTraffic::Cidrs(nets)) if nets.len() > 1 => {
            rs.sets.insert(
                POD_CIDRS_SET.to_string(),
                Set {
                    interval: true,
                    ..address_set(vec![addr], nets.iter().map(ToString::to_string).collect())
                },
            );
        }
        _ => {}
    }
    for map in MapId::ALL {
        rs.maps
            .insert(map.name().to_string(), Map::verdict(map.key_type(family)));
    }
    rs.sets.insert(
        HAIRPIN_SET.to_string(),
        address_set(vec![addr, addr], Vec::new()),
    );
    for set in [CLUSTERIP_MASQ_SET, CLUSTERIP_MASQ_NONLOCAL_SET] {
        rs.sets.insert(set.to_string(), clusterip_port_set(family));
    }
    for protocol in PROTOCOLS {
        rs.maps.insert(
            clusterip_dnat_map(protocol),
            Map {
                map_type: MapType::ClusterEndpoints { family, protocol },
                elements: Vec::new(),
            },
        );
    }
}

/// The destinations NodePort lookups apply to, one rule's matches each.
fn nodeport_destinations(ctx: &NodeIntent, r: Rules) -> Vec<Vec<Match>> {
    let family = ctx.family;
    let mut dests = Vec::new();
    match &ctx.nodeports {
        NodePortDestinations::Ips(_) => dests.push(vec![Match::InSet {
            addr: Addr::Daddr,
            set: NODEPORT_IPS_SET.to_string(),
            negate: false,
        }]),
        NodePortDestinations::AllLocal if ctx.localhost_nodeports => {
            dests.push(vec![Match::FibLocal(Addr::Daddr)])
        }
        NodePortDestinations::AllLocal => dests.push(vec![
            Match::FibLocal(Addr::Daddr),
            r.daddr_is(loopback(family), true),
        ]),
    }
    if ctx.localhost_nodeports && matches!(ctx.nodeports, NodePortDestinations::Ips(_)) {
        dests.push(vec![r.daddr_is(loopback(family), false)]);
    }
    dests
}

/// KEP-6032: a NodePort of a rejected protocol on loopback goes, by the map the
/// planner fills from the NodePorts, to its protocol's counting reject chain,
/// before DNAT. (A lookup in `service-nodeports` itself cannot do: the kernel
/// checks a verdict map's chains against every chain that looks it up, and a
/// filter chain may not reach their DNAT.) The rule, and its map into `rs`, when
/// there are such NodePorts.
fn localhost_rejects(ctx: &NodeIntent, r: Rules, rs: &mut Ruleset) -> Vec<TypedRule> {
    if ctx.localhost_rejects.is_empty() {
        return Vec::new();
    }
    rs.maps.insert(
        MapId::LocalhostNodePortRejects.name().to_string(),
        Map::verdict(MapId::LocalhostNodePortRejects.key_type(ctx.family)),
    );
    vec![r.rule(
        vec![r.daddr_is(loopback(ctx.family), false)],
        r.vmap(false, MapId::LocalhostNodePortRejects),
    )]
}

/// The base chains on the netfilter hooks, each jumping to the chains below (and
/// the localhost NodePort rejects' map, when there are any, into `rs`).
fn hook_chains(ctx: &NodeIntent, r: Rules, rs: &mut Ruleset) -> Vec<(&'static str, Chain)> {
    let localhost_rejects = localhost_rejects(ctx, r, rs);
    let filter = |hook, priority, rules| base(ChainType::Filter, hook, priority, rules);
    let nat = |hook, priority, rules| base(ChainType::Nat, hook, priority, rules);
    vec![
        (
            "filter-prerouting",
            filter(
                Hook::Prerouting,
                PRIORITY_FILTER,
                vec![r.if_new(FIREWALL_CHECK_CHAIN)],
            ),
        ),
        (
            "filter-input",
            filter(
                Hook::Input,
                PRIORITY_FILTER,
                vec![
                    r.if_new(NODEPORT_ENDPOINTS_CHECK_CHAIN),
                    r.if_new(SERVICE_ENDPOINTS_CHECK_CHAIN),
                ],
            ),
        ),
        (
            "filter-forward",
            filter(
                Hook::Forward,
                PRIORITY_FILTER,
                ctx.drop_invalid_forwarded
                    .then(|| r.rule(vec![Match::CtState(CtState::Invalid)], Action::Drop))
                    .into_iter()
                    .chain([
                        r.if_new(SERVICE_ENDPOINTS_CHECK_CHAIN),
                        r.if_new(CLUSTER_IPS_CHECK_CHAIN),
                    ])
                    .collect(),
            ),
        ),
        (
            "filter-output",
            filter(
                Hook::Output,
                PRIORITY_FILTER,
                localhost_rejects
                    .into_iter()
                    .chain([r.if_new(FIREWALL_CHECK_CHAIN)])
                    .collect(),
            ),
        ),
        (
            "filter-output-post-dnat",
            filter(
                Hook::Output,
                PRIORITY_FILTER_POST_DNAT,
                vec![
                    r.if_new(SERVICE_ENDPOINTS_CHECK_CHAIN),
                    r.if_new(CLUSTER_IPS_CHECK_CHAIN),
                ],
            ),
        ),
        (
            "nat-prerouting",
            nat(
                Hook::Prerouting,
                PRIORITY_DSTNAT,
                vec![r.jump_to(SERVICES_CHAIN)],
            ),
        ),
        (
            "nat-output",
            nat(
                Hook::Output,
                PRIORITY_DSTNAT,
                vec![r.jump_to(SERVICES_CHAIN)],
            ),
        ),
        (
            "nat-postrouting",
            nat(
                Hook::Postrouting,
                PRIORITY_SRCNAT,
                vec![r.jump_to(MASQUERADING_CHAIN)],
            ),
        ),
    ]
}

/// `services`: the masquerade of cluster IP ports served without a chain, then
/// the service addresses and the NodePorts, each by its verdict map (the planner
/// appends the rules serving those cluster IP ports, see [`clusterip_set`]).
fn dispatch_chains(
    ctx: &NodeIntent,
    r: Rules,
    nodeport_dests: &[Vec<Match>],
) -> Vec<(&'static str, Chain)> {
    let masq = |set: &str, mut matches: Vec<Match>| {
        matches.insert(0, Match::TupleInSet(set.to_string()));
        r.rule(matches, jump(MARK_MASQ_CHAIN))
    };
    let mut rules = vec![masq(CLUSTERIP_MASQ_SET, Vec::new())];
    // Without a way to tell this node's pods, nothing is masqueraded "unless
    // from a local pod" (as in a service's own chain).
    if let Some(detect) = Detect::new(ctx) {
        rules.push(masq(CLUSTERIP_MASQ_NONLOCAL_SET, vec![detect.if_not_local]));
    }
    rules.push(r.rule(Vec::new(), r.vmap(true, MapId::ServiceIps)));
    for dest in nodeport_dests {
        rules.push(r.rule(dest.clone(), r.vmap(false, MapId::ServiceNodePorts)));
    }
    vec![(SERVICES_CHAIN, regular(rules))]
}

/// The filter checks: no endpoints, the firewall, the service address space, and
/// the reject they share.
fn check_chains(
    ctx: &NodeIntent,
    r: Rules,
    nodeport_dests: &[Vec<Match>],
) -> Vec<(&'static str, Chain)> {
    // Runs after DNAT: a packet still addressed to a cluster IP here matched no
    // service port, and one inside a ServiceCIDR hit no cluster IP (one rule per
    // CIDR: an anonymous set would cost the kernel's loop check a scan of every
    // set, as in `Detect`).
    let mut guards = Vec::new();
    if ctx.guard_service_ips {
        guards.push(r.rule(
            vec![Match::InSet {
                addr: Addr::Daddr,
                set: CLUSTER_IPS_SET.to_string(),
                negate: false,
            }],
            Action::Goto(REJECT_CHAIN.to_string()),
        ));
        for net in &ctx.service_cidrs {
            guards.push(r.rule(vec![r.daddr_is(*net, false)], Action::Drop));
        }
    }
    vec![
        (
            SERVICE_ENDPOINTS_CHECK_CHAIN,
            regular(vec![
                r.rule(Vec::new(), r.vmap(true, MapId::NoEndpointServices))
            ]),
        ),
        (
            NODEPORT_ENDPOINTS_CHECK_CHAIN,
            regular(
                nodeport_dests
                    .iter()
                    .map(|dest| r.rule(dest.clone(), r.vmap(false, MapId::NoEndpointNodePorts)))
                    .collect(),
            ),
        ),
        (
            FIREWALL_CHECK_CHAIN,
            regular(vec![r.rule(Vec::new(), r.vmap(true, MapId::FirewallIps))]),
        ),
        (CLUSTER_IPS_CHECK_CHAIN, regular(guards)),
        // A TCP reset refuses a TCP client at once; an ICMP error can reach a
        // connecting socket before it is ready for it and cost a SYN retry (~1 s).
        (
            REJECT_CHAIN,
            regular(vec![
                r.rule(
                    vec![Match::L4Proto(Protocol::Tcp)],
                    Action::Reject { tcp_reset: true },
                ),
                r.rule(Vec::new(), Action::Reject { tcp_reset: false }),
            ]),
        ),
    ]
}

/// Marking for masquerade, and masquerading the marked.
fn masquerade_chains(ctx: &NodeIntent, r: Rules) -> Vec<(&'static str, Chain)> {
    let mark = ctx.masquerade_mark;
    vec![
        (
            MARK_MASQ_CHAIN,
            regular(vec![r.rule(Vec::new(), Action::MarkOr(mark))]),
        ),
        (
            MASQUERADING_CHAIN,
            regular(vec![
                // The hairpin: a connection DNATed back to the endpoint it came
                // from must leave with another source, or the reply never
                // reaches conntrack to be translated back.
                r.rule(
                    vec![
                        Match::CtStatusDnat,
                        Match::PairInSet(HAIRPIN_SET.to_string()),
                    ],
                    jump(MARK_MASQ_CHAIN),
                ),
                r.rule(vec![Match::MarkClear(mark)], Action::Return),
                // Clear the bit so a packet re-entering (e.g. tunnelled) is not
                // masqueraded twice.
                r.rule(Vec::new(), Action::MarkXor(mark)),
                r.rule(Vec::new(), Action::MasqueradeFullyRandom),
            ]),
        ),
    ]
}

/// The chain counting and rejecting a protocol's NodePorts on loopback
/// (`localhost-nodeport-reject-udp`): its one rule's counter is the
/// `kubeproxy_nftables_localhost_nodeport_rejected_packets_total` of the protocol.
pub fn localhost_reject_chain(protocol: Protocol) -> String {
    format!("localhost-nodeport-reject-{}", protocol_keyword(protocol))
}
