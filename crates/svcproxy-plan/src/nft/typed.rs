//! svcproxy's nftables statements as typed values, for a writer that sends them
//! to the kernel itself: every rule of the table ([`TypedRule`]: matches and one
//! action), set and map declarations ([`super::decl::Field`]), and a
//! plan's statements ([`Op`]). Each value prints as exactly the text the plan's
//! script holds, so the netlink writer and `nft -f` apply the same thing (a test
//! compares the tables both leave).
//!
//! The `pod-cidrs` interval set's elements are typed as the prefixes
//! ([`Op::AddIntervals`]); overlapping prefixes, which `nft` refuses, are not.

use std::fmt::{self, Write as _};
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use svcproxy_core::model::{IpFamily, Protocol};

use crate::names::protocol_keyword;

use super::decl::{family_keyword, BaseChain, Map, Set};
use super::elements::ElemOp;

/// A conntrack state bit `ct state` tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtState {
    New,
    Invalid,
}

/// Which address a `fib` lookup or a payload match reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addr {
    Saddr,
    Daddr,
}

impl Addr {
    fn keyword(self) -> &'static str {
        match self {
            Addr::Saddr => "saddr",
            Addr::Daddr => "daddr",
        }
    }
}

/// One match of a rule; all must hold for its action to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Match {
    /// `ct state new`.
    CtState(CtState),
    /// `ct status dnat`.
    CtStatusDnat,
    /// `meta l4proto P`.
    L4Proto(Protocol),
    /// `P dport PORT`.
    Dport(Protocol, u16),
    /// `F saddr|daddr [!= ]NET` (an address for a full-length prefix).
    Prefix {
        addr: Addr,
        net: IpNet,
        negate: bool,
    },
    /// `F saddr|daddr [!= ]@SET`.
    InSet {
        addr: Addr,
        set: String,
        negate: bool,
    },
    /// `F saddr . F daddr @SET`.
    PairInSet(String),
    /// `fib saddr|daddr type local`.
    FibLocal(Addr),
    /// `mark and M == 0`.
    MarkClear(u32),
    /// `iifname [!= ]"NAME"`; a name ending in `*` matches its prefix.
    Iifname { name: String, negate: bool },
    /// `numgen random mod N == 0`.
    NumgenZero(u32),
    /// `F daddr . meta l4proto . th dport @SET`: the destination is a service port
    /// in `SET`.
    TupleInSet(String),
}

/// What a rule does when its matches hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Jump(String),
    Goto(String),
    Return,
    Drop,
    /// `[F daddr . ]meta l4proto . th dport vmap @MAP`.
    Vmap {
        daddr: bool,
        map: String,
    },
    /// `mark set mark or M`.
    MarkOr(u32),
    /// `mark set mark xor M`.
    MarkXor(u32),
    /// `reject with tcp reset`, or `reject` (ICMP port unreachable).
    Reject {
        tcp_reset: bool,
    },
    /// `counter` then [`Action::Reject`]: the rejections are counted in the rule.
    CountedReject {
        tcp_reset: bool,
    },
    /// `masquerade fully-random`.
    MasqueradeFullyRandom,
    /// `update @SET { F saddr }`.
    UpdateSaddr(String),
    /// `dnat F to ENDPOINT`.
    Dnat(SocketAddr),
    /// `dnat F to numgen random mod N offset B map @MAP`.
    MapDnat {
        n: u32,
        offset: u32,
        map: String,
    },
    /// `redirect to :PORT`.
    Redirect(u16),
    /// `dnat F to F daddr . meta l4proto . th dport . numgen random mod N map @MAP`:
    /// one of the N endpoints the map holds for the destination's service port
    /// (after a match on the protocol, which the port's type needs).
    TupleDnat {
        n: u32,
        map: String,
    },
}

/// One rule of svcproxy's table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypedRule {
    pub family: IpFamily,
    pub matches: Vec<Match>,
    pub action: Action,
}

/// An address or prefix as `nft` prints it: a full-length prefix as the address.
struct Net<'a>(&'a IpNet);

impl fmt::Display for Net<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.prefix_len() == self.0.max_prefix_len() {
            write!(f, "{}", self.0.addr())
        } else {
            write!(f, "{}", self.0)
        }
    }
}

fn neq(negate: bool) -> &'static str {
    if negate {
        "!= "
    } else {
        ""
    }
}

impl TypedRule {
    pub fn new(family: IpFamily, matches: Vec<Match>, action: Action) -> TypedRule {
        TypedRule {
            family,
            matches,
            action,
        }
    }

    /// The rule as `nft` reads it.
    pub fn text(&self) -> String {
        let ipx = family_keyword(self.family);
        let mut out = String::new();
        for m in &self.matches {
            let _ = match m {
                Match::CtState(CtState::New) => write!(out, "ct state new "),
                Match::CtState(CtState::Invalid) => write!(out, "ct state invalid "),
                Match::CtStatusDnat => write!(out, "ct status dnat "),
                Match::L4Proto(p) => write!(out, "meta l4proto {} ", protocol_keyword(*p)),
                Match::Dport(p, port) => write!(out, "{} dport {port} ", protocol_keyword(*p)),
                Match::Prefix { addr, net, negate } => write!(
                    out,
                    "{ipx} {} {}{} ",
                    addr.keyword(),
                    neq(*negate),
                    Net(net)
                ),
                Match::InSet { addr, set, negate } => {
                    write!(out, "{ipx} {} {}@{set} ", addr.keyword(), neq(*negate))
                }
                Match::PairInSet(set) => write!(out, "{ipx} saddr . {ipx} daddr @{set} "),
                Match::FibLocal(addr) => write!(out, "fib {} type local ", addr.keyword()),
                Match::MarkClear(m) => write!(out, "mark and {m:#x} == 0 "),
                Match::Iifname { name, negate } => {
                    write!(out, "iifname {}\"{name}\" ", neq(*negate))
                }
                Match::NumgenZero(n) => write!(out, "numgen random mod {n} == 0 "),
                Match::TupleInSet(set) => {
                    write!(out, "{ipx} daddr . meta l4proto . th dport @{set} ")
                }
            };
        }
        let _ = match &self.action {
            Action::Jump(c) => write!(out, "jump {c}"),
            Action::Goto(c) => write!(out, "goto {c}"),
            Action::Return => write!(out, "return"),
            Action::Drop => write!(out, "drop"),
            Action::Vmap { daddr, map } => {
                if *daddr {
                    let _ = write!(out, "{ipx} daddr . ");
                }
                write!(out, "meta l4proto . th dport vmap @{map}")
            }
            Action::MarkOr(m) => write!(out, "mark set mark or {m:#x}"),
            Action::MarkXor(m) => write!(out, "mark set mark xor {m:#x}"),
            Action::Reject { tcp_reset: true } => write!(out, "reject with tcp reset"),
            Action::Reject { tcp_reset: false } => write!(out, "reject"),
            Action::CountedReject { tcp_reset: true } => {
                write!(out, "counter reject with tcp reset")
            }
            Action::CountedReject { tcp_reset: false } => write!(out, "counter reject"),
            Action::MasqueradeFullyRandom => write!(out, "masquerade fully-random"),
            Action::UpdateSaddr(set) => write!(out, "update @{set} {{ {ipx} saddr }}"),
            Action::Dnat(to) => match to.ip() {
                IpAddr::V4(a) => write!(out, "dnat {ipx} to {a}:{}", to.port()),
                IpAddr::V6(a) => write!(out, "dnat {ipx} to [{a}]:{}", to.port()),
            },
            Action::MapDnat { n, offset, map } => write!(
                out,
                "dnat {ipx} to numgen random mod {n} offset {offset} map @{map}"
            ),
            Action::Redirect(port) => write!(out, "redirect to :{port}"),
            Action::TupleDnat { n, map } => write!(
                out,
                "dnat {ipx} to {ipx} daddr . meta l4proto . th dport . numgen random mod {n} map @{map}"
            ),
        };
        out
    }
}

/// One statement of a plan, typed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `add table F svcproxy { comment "C" ; }`.
    AddTable {
        family: IpFamily,
    },
    /// `delete table F svcproxy`.
    DeleteTable {
        family: IpFamily,
    },
    /// `flush table F svcproxy` (every rule of the table).
    FlushTable {
        family: IpFamily,
    },
    /// `add chain F svcproxy NAME { comment "C" ; [type ... hook ...] }`.
    AddChain {
        family: IpFamily,
        name: String,
        comment: Option<String>,
        base: Option<BaseChain>,
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
    /// `add set F svcproxy NAME { ... }` (without its elements).
    AddSet {
        family: IpFamily,
        name: String,
        set: Set,
    },
    /// `add map F svcproxy NAME { ... }` (without its elements).
    AddMap {
        family: IpFamily,
        name: String,
        map: Map,
    },
    /// `flush set|map F svcproxy NAME` (every element).
    FlushSet {
        family: IpFamily,
        name: String,
    },
    /// `delete set|map F svcproxy NAME`.
    DeleteSet {
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
    /// `add element F svcproxy SET { PREFIX, ... }` to an interval set, the
    /// prefixes sorted and not overlapping.
    AddIntervals {
        family: IpFamily,
        set: String,
        nets: Vec<IpNet>,
    },
}

impl Op {
    /// The family whose table the statement changes (each statement changes one).
    pub fn family(&self) -> IpFamily {
        match self {
            Op::AddTable { family }
            | Op::DeleteTable { family }
            | Op::FlushTable { family }
            | Op::AddChain { family, .. }
            | Op::FlushChain { family, .. }
            | Op::DeleteChain { family, .. }
            | Op::AddSet { family, .. }
            | Op::AddMap { family, .. }
            | Op::FlushSet { family, .. }
            | Op::DeleteSet { family, .. }
            | Op::AddRule { family, .. }
            | Op::AddIntervals { family, .. } => *family,
            Op::Element(e) => e.family,
        }
    }
}

/// `nets` sorted by address, when no two of them overlap (`None` otherwise).
pub fn disjoint_prefixes(nets: &[IpNet]) -> Option<Vec<IpNet>> {
    let mut sorted = nets.to_vec();
    sorted.sort_by_key(|n| (n.network(), n.prefix_len()));
    let overlap = sorted
        .windows(2)
        .any(|w| w[0].contains(&w[1].network()) || w[1].contains(&w[0].network()));
    (!overlap).then_some(sorted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_print_as_nft_reads_them() {
        let v4 = IpFamily::V4;
        let net: IpNet = "10.0.0.0/8".parse().unwrap();
        let host: IpNet = "::1/128".parse().unwrap();
        let cases = [
            (
                TypedRule::new(
                    v4,
                    vec![
                        Match::Prefix {
                            addr: Addr::Daddr,
                            net: "198.19.0.10/32".parse().unwrap(),
                            negate: false,
                        },
                        Match::Dport(Protocol::Tcp, 80),
                        Match::Prefix {
                            addr: Addr::Saddr,
                            net,
                            negate: true,
                        },
                    ],
                    Action::Jump("mark-for-masquerade".into()),
                ),
                "ip daddr 198.19.0.10 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade",
            ),
            (
                TypedRule::new(
                    IpFamily::V6,
                    vec![
                        Match::FibLocal(Addr::Daddr),
                        Match::Prefix {
                            addr: Addr::Daddr,
                            net: host,
                            negate: true,
                        },
                    ],
                    Action::Vmap {
                        daddr: false,
                        map: "service-nodeports".into(),
                    },
                ),
                "fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @service-nodeports",
            ),
            (
                TypedRule::new(
                    v4,
                    vec![Match::L4Proto(Protocol::Udp)],
                    Action::MapDnat {
                        n: 3,
                        offset: 8,
                        map: "endpoint-dnat-udp-0a".into(),
                    },
                ),
                "meta l4proto udp dnat ip to numgen random mod 3 offset 8 map @endpoint-dnat-udp-0a",
            ),
            (
                TypedRule::new(
                    v4,
                    vec![Match::Iifname {
                        name: "veth*".into(),
                        negate: true,
                    }],
                    Action::Goto("service-1".into()),
                ),
                "iifname != \"veth*\" goto service-1",
            ),
            (
                TypedRule::new(v4, Vec::new(), Action::UpdateSaddr("affinity-1".into())),
                "update @affinity-1 { ip saddr }",
            ),
            (
                TypedRule::new(
                    IpFamily::V6,
                    vec![
                        Match::TupleInSet("clusterip-tcp-3".into()),
                        Match::L4Proto(Protocol::Tcp),
                    ],
                    Action::TupleDnat {
                        n: 3,
                        map: "clusterip-dnat-tcp".into(),
                    },
                ),
                "ip6 daddr . meta l4proto . th dport @clusterip-tcp-3 meta l4proto tcp dnat ip6 to ip6 daddr . meta l4proto . th dport . numgen random mod 3 map @clusterip-dnat-tcp",
            ),
        ];
        for (rule, text) in cases {
            assert_eq!(rule.text(), text);
        }
    }
}
