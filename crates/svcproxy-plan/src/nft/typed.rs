//! The rules and objects of a service port's chains that a writer may send to the
//! kernel itself, typed; and a partial plan's statements as typed operations
//! ([`Op`]), when every one of them is typed. Each value's text is exactly the
//! statement the plan's script holds, so the netlink writer and `nft -f` apply
//! the same thing (a test compares the tables both leave).
//!
//! Typed: the set chains' endpoint choice (a map lookup, or one endpoint
//! DNATed directly) and their masquerade marks (always, or unless from the
//! local-pod CIDR), a chain with its comment, and elements
//! ([`super::elements`]). Everything else (affinity, external and firewall chains,
//! interface-based local detection, a new endpoint map) goes through `nft -f`.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use svcproxy_core::model::{IpFamily, Protocol};

use crate::names::protocol_keyword;

use super::elements::ElemOp;
use super::ruleset::family_keyword;

/// A rule of a set chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TypedRule {
    /// `meta l4proto P dnat F to numgen random mod N offset B map @MAP`.
    MapDnat {
        family: IpFamily,
        protocol: Protocol,
        n: u32,
        offset: u32,
        map: String,
    },
    /// `meta l4proto P dnat F to ENDPOINT`.
    Dnat {
        family: IpFamily,
        protocol: Protocol,
        to: SocketAddr,
    },
    /// `F daddr IP P dport PORT [F saddr != CIDR] jump CHAIN`.
    MarkMasquerade {
        family: IpFamily,
        daddr: IpAddr,
        protocol: Protocol,
        port: u16,
        unless_from: Option<IpNet>,
        chain: String,
    },
}

impl TypedRule {
    /// The rule as `nft` reads it.
    pub fn text(&self) -> String {
        match self {
            TypedRule::MapDnat {
                family,
                protocol,
                n,
                offset,
                map,
            } => format!(
                "meta l4proto {} dnat {} to numgen random mod {n} offset {offset} map @{map}",
                protocol_keyword(*protocol),
                family_keyword(*family)
            ),
            TypedRule::Dnat {
                family,
                protocol,
                to,
            } => {
                let to = match to.ip() {
                    IpAddr::V4(a) => format!("{a}:{}", to.port()),
                    IpAddr::V6(a) => format!("[{a}]:{}", to.port()),
                };
                format!(
                    "meta l4proto {} dnat {} to {to}",
                    protocol_keyword(*protocol),
                    family_keyword(*family)
                )
            }
            TypedRule::MarkMasquerade {
                family,
                daddr,
                protocol,
                port,
                unless_from,
                chain,
            } => {
                let ipx = family_keyword(*family);
                let mut out = format!(
                    "{ipx} daddr {daddr} {} dport {port}",
                    protocol_keyword(*protocol)
                );
                if let Some(net) = unless_from {
                    let _ = write!(out, " {ipx} saddr != {net}");
                }
                let _ = write!(out, " jump {chain}");
                out
            }
        }
    }
}

/// One statement of a partial plan, typed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `add chain F svcproxy NAME { comment "C" ; }` (a regular chain).
    AddChain {
        family: IpFamily,
        name: String,
        comment: Option<String>,
    },
    /// `flush chain F svcproxy NAME`.
    FlushChain {
        family: IpFamily,
        name: String,
    },
    /// `delete chain F svcproxy NAME`.
    DeleteChain {
        family: IpFamily,
        name: String,
    },
    /// `add rule F svcproxy CHAIN RULE`.
    AddRule {
        family: IpFamily,
        chain: String,
        rule: TypedRule,
    },
    Element(ElemOp),
}
