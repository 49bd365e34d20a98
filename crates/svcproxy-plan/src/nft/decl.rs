//! What an nftables table declares, apart from the rules: the table's name and
//! families, base chains' hooks, set and map types. A leaf of the nft planner:
//! [`super::ruleset`] (chains with rules, the whole table), [`super::typed`] (the
//! rules) and [`super::elements`] read it, and it reads none of them.

use svcproxy_core::model::{IpFamily, Protocol};

use crate::names::protocol_keyword;

/// The table svcproxy owns in each family.
pub const TABLE_NAME: &str = "svcproxy";
/// The table's comment.
pub const TABLE_COMMENT: &str = "managed-by-svcproxy";

/// `ip` or `ip6`: the table family, and the payload keyword for addresses.
pub fn family_keyword(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

/// `ipv4_addr` or `ipv6_addr`.
pub fn addr_type(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ipv4_addr",
        IpFamily::V6 => "ipv6_addr",
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChainType {
    Filter,
    Nat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

/// What attaches a base chain to a netfilter hook. Priorities are numeric: nft 1.0.6
/// accepts the name `dstnat` only on the prerouting hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BaseChain {
    pub chain_type: ChainType,
    pub hook: Hook,
    pub priority: i32,
}

impl BaseChain {
    pub(super) fn spec(&self) -> String {
        let t = match self.chain_type {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
        };
        let h = match self.hook {
            Hook::Prerouting => "prerouting",
            Hook::Input => "input",
            Hook::Forward => "forward",
            Hook::Output => "output",
            Hook::Postrouting => "postrouting",
        };
        format!(
            "type {t} hook {h} priority {}; policy accept;",
            self.priority
        )
    }
}

/// One field of a set's key (or a map's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// `ipv4_addr` or `ipv6_addr`.
    Addr(IpFamily),
    /// `inet_proto`.
    Proto,
    /// `inet_service`.
    Port,
}

impl Field {
    pub(super) fn name(self) -> &'static str {
        match self {
            Field::Addr(f) => addr_type(f),
            Field::Proto => "inet_proto",
            Field::Port => "inet_service",
        }
    }
}

/// A key type as `nft` reads it: the fields joined by ` . `.
pub fn key_text(key: &[Field]) -> String {
    key.iter().map(|f| f.name()).collect::<Vec<_>>().join(" . ")
}

/// A named set of addresses. With a timeout it is a dynamic set filled by the
/// packet path (`update @set { ip saddr }`), used for session affinity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set {
    pub key: Vec<Field>,
    /// Seconds; `Some` makes the set `flags dynamic,timeout`.
    pub timeout: Option<u32>,
    /// Elements are prefixes (`flags interval`).
    pub interval: bool,
    pub elements: Vec<String>,
}

/// What a named map maps from and to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapType {
    /// `type KEY : verdict`.
    Verdict(Vec<Field>),
    /// An endpoint map: `typeof numgen random mod 1 : F daddr . P dport` (its
    /// key is `numgen`'s integer, whose type has no name of its own).
    Endpoints {
        family: IpFamily,
        protocol: Protocol,
    },
    /// The cluster IP endpoint map of a protocol: `typeof F daddr . meta l4proto .
    /// th dport . numgen random mod 1 : F daddr . P dport`, the endpoints of each
    /// cluster IP port under their number (see `base::CLUSTERIP_DNAT_MAPS`).
    ClusterEndpoints {
        family: IpFamily,
        protocol: Protocol,
    },
}

/// A named map: a verdict map, or a data map (the endpoints' addresses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Map {
    pub map_type: MapType,
    /// (key, value) pairs.
    pub elements: Vec<(String, String)>,
}

impl Map {
    pub fn verdict(key: Vec<Field>) -> Map {
        Map {
            map_type: MapType::Verdict(key),
            elements: Vec::new(),
        }
    }

    pub(super) fn declaration(&self) -> String {
        match &self.map_type {
            MapType::Verdict(key) => format!("type {} : verdict", key_text(key)),
            MapType::Endpoints { family, protocol } => format!(
                "typeof numgen random mod 1 : {} daddr . {} dport",
                family_keyword(*family),
                protocol_keyword(*protocol)
            ),
            MapType::ClusterEndpoints { family, protocol } => {
                let ipx = family_keyword(*family);
                format!(
                    "typeof {ipx} daddr . meta l4proto . th dport . numgen random mod 1 : {ipx} daddr . {} dport",
                    protocol_keyword(*protocol)
                )
            }
        }
    }
}
