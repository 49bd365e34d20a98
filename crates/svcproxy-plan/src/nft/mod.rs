//! The nftables translation of the intent: svcproxy's tables `ip svcproxy` and
//! `ip6 svcproxy`, as a typed model ([`Ruleset`]), `nft -f` text, and minimal
//! deltas between syncs.
//!
//! Entry point: [`Planner::plan`] (intent and delta in, one script out), then
//! [`Planner::commit`] or [`Planner::abandon`]. [`render_full`] prints what a first
//! sync applies (`svcproxy render`); [`cleanup_script`] removes the tables.
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

mod base;
mod common;
pub mod decl;
pub use base::localhost_reject_chain;
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
