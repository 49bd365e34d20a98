//! The nftables translation of the intent: svcproxy's tables `ip svcproxy` and
//! `ip6 svcproxy`, as a typed model ([`Ruleset`]), `nft -f` text, and minimal
//! deltas between syncs.
//!
//! Entry point: [`Planner::plan`] (intent and delta in, one script out), then
//! [`Planner::commit`] or [`Planner::abandon`]. [`render_full`] prints what a first
//! sync applies (`svcproxy render`); [`cleanup_script`] removes the tables.
//!
//! A cluster IP port that needs nothing but the choice of endpoint and its
//! masquerade (most ports of a cluster) has no chain: its `VIP . PROTO . PORT` is
//! an element of the set of its protocol and endpoint count, whose rule DNATs
//! through one map keyed `VIP . PROTO . PORT . K` (see `base::clusterip_set` and
//! `service::cluster_layout`), so linking, moving or unlinking it is data
//! elements only. Every other port keeps the shape below.
//!
//! The shape follows upstream kube-proxy's nftables mode: O(1) dispatch through
//! verdict maps keyed on `daddr . meta l4proto . th dport` (service IPs) and
//! `meta l4proto . th dport` (NodePorts), per-service chains named by hashes (the
//! endpoint is then chosen in one rule, `numgen random` into a shared map of
//! endpoints, where upstream has a chain per endpoint: see `service`), and filter
//! chains for "no endpoints",
//! loadBalancerSourceRanges and ServiceCIDRs. The private modules `base` (the shared
//! skeleton, from the node intent) and `service` (one service intent's objects) say
//! which rule implements which behaviour. Nothing here decides a behaviour: every
//! choice is read from the [`crate::intent`].
//!
//! # What a commit costs the kernel
//!
//! The layout is chosen against the kernel's costs, measured on 6.18 with
//! `scripts/nft-cost-model.sh` (numbers in docs/benchmarks.md, "What one commit
//! costs the kernel"). Per nf_tables transaction, whoever sends it:
//! - **every commit walks every chain** of every table of the namespace (to swap in
//!   the chains' new rule blobs), about 50 ns a chain: 5.3 ms at 100k Services
//!   (about 100k chains), for a commit of one map element, and for another
//!   program's commit to a table of its own just the same;
//! - **a commit that adds a `goto`/`jump`** (a rule's or a verdict map element's), or a
//!   rule with any expression the kernel validates (`dnat`, `masquerade`, `reject`,
//!   `update @set`, a verdict map lookup), **walks everything reachable from every
//!   base chain** of that table, once per base chain reaching it (`nat-prerouting`
//!   and `nat-output` both reach `services`): 62-155 ms at 100k (more with each
//!   Service's masquerade rule: the cost is per rule walked), whether or not the
//!   new chain is linked yet;
//! - **a set or data map element** costs its own insert and a walk of the rules
//!   bound to that set (so a map is never shared by thousands of rules: the
//!   endpoint maps are spread 256 ways), nothing table-wide.
//!
//! So a service added or moved at O(change) can only be data elements (and then
//! its cost is the chain walk above, which only fewer chains lower), and a
//! service's own chain costs every writer of the node 50 ns at every commit:
//! hence the chainless cluster IP ports above. A rule that binds a data map
//! walks the map's elements (`nf_tables_bind_set`), so the rules of a new
//! endpoint count are written before the cluster IP map's elements in a full
//! sync; in a partial one that walk (and one table-wide validation) is paid once
//! per count.

mod base;
mod common;
pub mod decl;
pub use base::{localhost_reject_chain, DRIFT_WATCHED_CHAINS, SERVICES_CHAIN};
pub mod elements;
mod planner;
pub mod ruleset;
mod service;
mod slots;
pub mod typed;

/// How upstream's nftables mode behaves where the modes differ: the service address
/// space is guarded. Upstream's nftables mode never serves NodePorts on 127.0.0.1
/// (DNAT from loopback needs `route_localnet`, which exposes localhost-bound
/// services to the network: CVE-2020-8558); svcproxy does when asked
/// (`--nodeport-localhost`, off by default in this mode), through the userspace
/// proxy's forwarder on loopback, which needs neither.
pub const SEMANTICS: crate::config::ModeSemantics = crate::config::ModeSemantics {
    localhost_nodeports: crate::config::LocalhostNodePorts::Proxy,
    guard_service_ips: true,
    drop_invalid_forwarded: false,
    schedulers: false,
};

pub use planner::{
    cleanup_script, needed_first, render_full, render_full_with, ColdStart, Output, Plan, PlanKind,
    PlanStats, Planner, Step,
};
pub use ruleset::{
    family_keyword, BaseChain, Chain, ChainType, Hook, Map, MapType, Ruleset, Set, TABLE_NAME,
};
pub use service::CapturePorts;
