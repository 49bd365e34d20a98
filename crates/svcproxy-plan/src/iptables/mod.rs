//! The iptables translation of the intent: svcproxy's chains in the `filter` and `nat`
//! tables, as `iptables-restore --noflush` input per family, plus the jump rules from
//! the built-in chains that make them reachable.
//!
//! Entry points: [`rules`] (one family's chains from the intent), [`FamilyRules::restore`]
//! (the restore input, optionally deleting stale chains), [`render_full`] (what a first
//! sync applies, for `svcproxy render`), [`JUMPS`] (the rules svcproxy keeps in the
//! built-in chains), [`is_ours`] (whether a chain name is svcproxy's).
//!
//! The shape follows upstream kube-proxy's iptables mode, with svcproxy's own chain
//! names (`SVCPROXY-*` for the fixed chains, `SVP-<kind>-<16 hex digits>` per service
//! port and endpoint, hashed as the nftables names are), so it never touches
//! kube-proxy's `KUBE-*` chains or anyone else's:
//!
//! | chain | table | does |
//! |-------|-------|------|
//! | `SVCPROXY-SERVICES` | nat | dispatch on destination IP, protocol and port; NodePorts last |
//! | `SVCPROXY-NODEPORTS` | nat | dispatch on NodePort |
//! | `SVP-SVC-H` / `SVP-SVL-H` | nat | cluster / local endpoint set: masquerade mark for cluster-IP traffic that needs it, affinity (`recent`), random choice (`statistic`) |
//! | `SVP-EXT-H` | nat | external route: masquerade, or short circuits for pods and the host, then the set |
//! | `SVP-FW-H` | nat | loadBalancerSourceRanges: allowed sources go on to `SVP-EXT-H` |
//! | `SVP-SEP-E` | nat | one endpoint: hairpin masquerade mark, affinity update, DNAT |
//! | `SVCPROXY-MARK-MASQ`, `SVCPROXY-POSTROUTING` | nat | mark, then masquerade marked packets |
//! | `SVCPROXY-NOT-LOCAL` | nat | masquerade unless from a local pod, when pods span several CIDRs |
//! | `SVCPROXY-SERVICES` | filter | reject / drop cluster-IP traffic with no usable endpoint |
//! | `SVCPROXY-EXTERNAL` | filter | reject / drop external traffic with no usable endpoint |
//! | `SVCPROXY-FIREWALL` | filter | drop load-balancer traffic the firewall chain did not DNAT |
//! | `SVCPROXY-NODEPORTS` | filter | accept healthCheckNodePorts |
//! | `SVCPROXY-FORWARD` | filter | drop conntrack-INVALID forwarded packets (unless `tcp_be_liberal`), accept marked and established forwarded traffic |
//! | `SVCPROXY-LOCALNET` | filter | the CVE-2020-8558 guard when NodePorts answer on 127.0.0.1 |
//!
//! Refusals use a TCP reset for TCP (an ICMP error can reach a connecting socket
//! before it is ready and cost a SYN retry), ICMP port unreachable otherwise. Nothing
//! here decides a behaviour: every choice is read from the [`crate::intent`].

mod rules;

use std::collections::HashMap;
use std::fmt::Write as _;

use svcproxy_core::model::{IpFamily, ServicePortName};

use crate::config::ModeSemantics;
use crate::intent::Intent;

pub use rules::rules;

/// How upstream's iptables mode behaves where the modes differ: NodePorts can answer on
/// 127.0.0.1 (`--iptables-localhost-nodeports`, on by default), the service address
/// space is not guarded (unexposed ports and unallocated addresses are just routed),
/// and forwarded conntrack-INVALID packets are dropped.
pub const SEMANTICS: ModeSemantics = ModeSemantics {
    localhost_nodeports: true,
    guard_service_ips: false,
    drop_invalid_forwarded: true,
};

/// Prefix of every fixed chain.
pub const FIXED_PREFIX: &str = "SVCPROXY-";
/// Prefix of every hashed per-service chain.
pub const HASHED_PREFIX: &str = "SVP-";

pub const SERVICES: &str = "SVCPROXY-SERVICES";
pub const EXTERNAL: &str = "SVCPROXY-EXTERNAL";
pub const NODEPORTS: &str = "SVCPROXY-NODEPORTS";
pub const POSTROUTING: &str = "SVCPROXY-POSTROUTING";
pub const MARK_MASQ: &str = "SVCPROXY-MARK-MASQ";
pub const NOT_LOCAL: &str = "SVCPROXY-NOT-LOCAL";
pub const FORWARD: &str = "SVCPROXY-FORWARD";
pub const FIREWALL: &str = "SVCPROXY-FIREWALL";
pub const LOCALNET: &str = "SVCPROXY-LOCALNET";

/// The fixed chains of each table, declared (and so flushed and rewritten) by every
/// full restore, in this order.
pub const FILTER_CHAINS: [&str; 6] = [SERVICES, EXTERNAL, FIREWALL, NODEPORTS, FORWARD, LOCALNET];
pub const NAT_CHAINS: [&str; 5] = [SERVICES, NODEPORTS, POSTROUTING, MARK_MASQ, NOT_LOCAL];

/// `filter` or `nat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TableId {
    Filter,
    Nat,
}

impl TableId {
    pub const ALL: [TableId; 2] = [TableId::Filter, TableId::Nat];

    pub fn name(self) -> &'static str {
        match self {
            TableId::Filter => "filter",
            TableId::Nat => "nat",
        }
    }
}

/// A rule svcproxy keeps at the top of a built-in chain, jumping to one of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Jump {
    pub table: TableId,
    /// The built-in chain (`PREROUTING`, `INPUT`, ...).
    pub from: &'static str,
    pub to: &'static str,
    /// Extra matches, as `iptables` arguments.
    pub matches: &'static [&'static str],
}

impl Jump {
    /// The line `iptables-save` prints for this rule.
    pub fn saved_line(&self) -> String {
        format!("-A {} {}", self.from, self.args().join(" "))
    }

    /// The rule's arguments after `-A/-C/-D/-I <chain>`: matches, the comment that
    /// marks it as svcproxy's, and the jump.
    pub fn args(&self) -> Vec<String> {
        let mut v: Vec<String> = self.matches.iter().map(|s| s.to_string()).collect();
        v.extend([
            "-m".into(),
            "comment".into(),
            "--comment".into(),
            JUMP_COMMENT.into(),
            "-j".into(),
            self.to.into(),
        ]);
        v
    }
}

/// The comment on every jump rule svcproxy owns in a built-in chain.
pub const JUMP_COMMENT: &str = "svcproxy";

const NEW: &[&str] = &["-m", "conntrack", "--ctstate", "NEW"];

/// Every jump svcproxy keeps in the built-in chains (each family), as upstream's
/// iptables mode places them.
pub const JUMPS: &[Jump] = &[
    Jump {
        table: TableId::Filter,
        from: "INPUT",
        to: FIREWALL,
        matches: NEW,
    },
    Jump {
        table: TableId::Filter,
        from: "FORWARD",
        to: FIREWALL,
        matches: NEW,
    },
    Jump {
        table: TableId::Filter,
        from: "OUTPUT",
        to: FIREWALL,
        matches: NEW,
    },
    Jump {
        table: TableId::Filter,
        from: "INPUT",
        to: NODEPORTS,
        matches: &[],
    },
    Jump {
        table: TableId::Filter,
        from: "INPUT",
        to: EXTERNAL,
        matches: NEW,
    },
    Jump {
        table: TableId::Filter,
        from: "FORWARD",
        to: EXTERNAL,
        matches: NEW,
    },
    Jump {
        table: TableId::Filter,
        from: "FORWARD",
        to: SERVICES,
        matches: NEW,
    },
    Jump {
        table: TableId::Filter,
        from: "OUTPUT",
        to: SERVICES,
        matches: NEW,
    },
    Jump {
        table: TableId::Filter,
        from: "FORWARD",
        to: FORWARD,
        matches: &[],
    },
    Jump {
        table: TableId::Filter,
        from: "INPUT",
        to: LOCALNET,
        matches: &[],
    },
    Jump {
        table: TableId::Filter,
        from: "OUTPUT",
        to: LOCALNET,
        matches: &[],
    },
    Jump {
        table: TableId::Nat,
        from: "PREROUTING",
        to: SERVICES,
        matches: &[],
    },
    Jump {
        table: TableId::Nat,
        from: "OUTPUT",
        to: SERVICES,
        matches: &[],
    },
    Jump {
        table: TableId::Nat,
        from: "POSTROUTING",
        to: POSTROUTING,
        matches: &[],
    },
];

/// Whether `chain` is one of svcproxy's (fixed or hashed) chains.
pub fn is_ours(chain: &str) -> bool {
    chain.starts_with(FIXED_PREFIX) || chain.starts_with(HASHED_PREFIX)
}

/// One table's chains, in declaration order, each with its rules (the arguments after
/// `-A <chain>`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    chains: Vec<(String, Vec<String>)>,
    index: HashMap<String, usize>,
}

impl Table {
    /// Declares `chain` (idempotent) and returns its rules.
    pub fn chain(&mut self, chain: &str) -> &mut Vec<String> {
        let i = match self.index.get(chain) {
            Some(i) => *i,
            None => {
                self.chains.push((chain.to_string(), Vec::new()));
                self.index.insert(chain.to_string(), self.chains.len() - 1);
                self.chains.len() - 1
            }
        };
        &mut self.chains[i].1
    }

    /// Appends one rule to `chain` (declaring it).
    pub fn add(&mut self, chain: &str, rule: String) {
        self.chain(chain).push(rule);
    }

    pub fn chains(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.chains.iter().map(|(n, r)| (n.as_str(), r.as_slice()))
    }

    pub fn rule_count(&self) -> usize {
        self.chains.iter().map(|(_, r)| r.len()).sum()
    }
}

/// One family's svcproxy chains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FamilyRules {
    pub family: IpFamily,
    pub filter: Table,
    pub nat: Table,
    /// The service port each per-service chain belongs to (fixed chains have none).
    pub owners: HashMap<String, ServicePortName>,
}

impl FamilyRules {
    pub fn table(&self, id: TableId) -> &Table {
        match id {
            TableId::Filter => &self.filter,
            TableId::Nat => &self.nat,
        }
    }

    /// `iptables-restore --noflush` input replacing every svcproxy chain of this family
    /// (each declared chain is flushed and rewritten) and deleting `stale` chains
    /// (per table; declared, so flushed, then `-X`).
    pub fn restore(&self, stale: &HashMap<TableId, Vec<String>>) -> String {
        self.restore_only(|_| true, stale, &[])
    }

    /// [`FamilyRules::restore`] that also inserts `jumps` at the top of their built-in
    /// chains, in the same transaction (after the chains they jump to exist).
    pub fn restore_with_jumps(
        &self,
        stale: &HashMap<TableId, Vec<String>>,
        jumps: &[&Jump],
    ) -> String {
        self.restore_only(|_| true, stale, jumps)
    }

    /// [`FamilyRules::restore`] limited to the fixed chains (which dispatch to every
    /// service, so are always rewritten whole) and the chains of the service ports
    /// `changed` accepts: a partial sync. Chains left out stay as the kernel has them.
    pub fn restore_changed(
        &self,
        changed: impl Fn(&ServicePortName) -> bool,
        stale: &HashMap<TableId, Vec<String>>,
    ) -> String {
        self.restore_only(
            |chain| self.owners.get(chain).is_none_or(&changed),
            stale,
            &[],
        )
    }

    fn restore_only(
        &self,
        include: impl Fn(&str) -> bool,
        stale: &HashMap<TableId, Vec<String>>,
        jumps: &[&Jump],
    ) -> String {
        let mut out = String::new();
        for id in TableId::ALL {
            let table = self.table(id);
            let _ = writeln!(out, "*{}", id.name());
            let gone = stale.get(&id).map(Vec::as_slice).unwrap_or_default();
            for (name, _) in table.chains().filter(|(n, _)| include(n)) {
                let _ = writeln!(out, ":{name} - [0:0]");
            }
            for name in gone {
                let _ = writeln!(out, ":{name} - [0:0]");
            }
            for (name, rules) in table.chains().filter(|(n, _)| include(n)) {
                for rule in rules {
                    let _ = writeln!(out, "-A {name} {rule}");
                }
            }
            for name in gone {
                let _ = writeln!(out, "-X {name}");
            }
            for j in jumps.iter().filter(|j| j.table == id) {
                let _ = writeln!(out, "-I {} {}", j.from, j.args().join(" "));
            }
            out.push_str("COMMIT\n");
        }
        out
    }
}

/// The restore command for a family.
pub fn restore_command(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "iptables-restore",
        IpFamily::V6 => "ip6tables-restore",
    }
}

/// What a first sync applies, both families, each under a `# <command> --noflush`
/// header (`svcproxy render` in iptables mode), followed by the jump rules.
pub fn render_full(intent: &Intent) -> String {
    let mut out = String::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        let Some(r) = rules(intent, family) else {
            continue;
        };
        let _ = writeln!(out, "# {} --noflush", restore_command(family));
        out.push_str(&r.restore(&HashMap::new()));
    }
    out.push_str("# jumps from the built-in chains, kept at their top (both families)\n");
    for j in JUMPS {
        let _ = writeln!(
            out,
            "# -t {} -I {} {}",
            j.table.name(),
            j.from,
            j.args().join(" ")
        );
    }
    out
}
