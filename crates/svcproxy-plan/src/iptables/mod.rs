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
//! names (`SVCPROXY-*` for the fixed chains; per service port `SVP-P-<kind>` and per
//! endpoint `SVP-P-E<10 hex digits>`, where `P` is 12 hex digits of the service port's
//! hash, so one service port's chains sort together; hashed as the nftables names
//! are), so it never touches kube-proxy's `KUBE-*` chains or anyone else's. Two
//! departures, both for scale, neither visible to a connection: the dispatch on
//! service addresses is split into [`BUCKETS`] chains, and an endpoint has a chain of
//! its own only when it needs one (the hairpin masquerade for an endpoint that may be
//! this node's, or session affinity); the others are DNATed from the set's chain.
//!
//! | chain | table | does |
//! |-------|-------|------|
//! | `SVCPROXY-SERVICES` | nat | jump to the bucket of the destination's low 6 bits; NodePorts last |
//! | `SVCPROXY-SVC-<bucket>` | nat | dispatch on destination IP, protocol and port |
//! | `SVCPROXY-NODEPORTS` | nat | dispatch on NodePort |
//! | `SVP-P-SVC` / `SVP-P-SVL` | nat | cluster / local endpoint set: masquerade mark for cluster-IP traffic that needs it, affinity (`recent`), random choice (`statistic`), DNAT to endpoints without a chain |
//! | `SVP-P-EXT` | nat | external route: masquerade, or short circuits for pods and the host, then the set |
//! | `SVP-P-FW` | nat | loadBalancerSourceRanges: allowed sources go on to `SVP-P-EXT` |
//! | `SVP-P-E<hash>` | nat | one endpoint that may be this node's, or of a service with affinity: hairpin masquerade mark, affinity update, DNAT |
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

use crate::config::{LocalhostNodePorts, ModeSemantics};
use crate::intent::Intent;

pub use rules::{rules, TranslationCache};

/// How upstream's iptables mode behaves where the modes differ: NodePorts can answer on
/// 127.0.0.1 (`--iptables-localhost-nodeports`, on by default), the service address
/// space is not guarded (unexposed ports and unallocated addresses are just routed),
/// and forwarded conntrack-INVALID packets are dropped.
pub const SEMANTICS: ModeSemantics = ModeSemantics {
    localhost_nodeports: LocalhostNodePorts::KernelNat,
    guard_service_ips: false,
    drop_invalid_forwarded: true,
    schedulers: false,
};

/// Prefix of every fixed chain.
pub const FIXED_PREFIX: &str = "SVCPROXY-";
/// Prefix of every hashed per-service chain.
pub const HASHED_PREFIX: &str = "SVP-";

pub const SERVICES: &str = "SVCPROXY-SERVICES";
/// Prefix of the `nat` dispatch buckets (`SVCPROXY-SVC-00` .. `-3F`): see
/// [`BUCKETS`].
pub const BUCKET_PREFIX: &str = "SVCPROXY-SVC-";
/// How many dispatch buckets `nat`'s [`SERVICES`] splits the service addresses into
/// (on the low bits of the address): a packet walks at most this many bucket rules
/// and its bucket's addresses; a change rewrites only its bucket. 64 keeps both
/// short at 10k services (about 160 addresses a bucket) and keeps the names few
/// (each restore mention walks past every smaller name in `iptables-nft`).
pub const BUCKETS: usize = 64;
pub const EXTERNAL: &str = "SVCPROXY-EXTERNAL";
pub const NODEPORTS: &str = "SVCPROXY-NODEPORTS";
pub const POSTROUTING: &str = "SVCPROXY-POSTROUTING";
pub const MARK_MASQ: &str = "SVCPROXY-MARK-MASQ";
pub const NOT_LOCAL: &str = "SVCPROXY-NOT-LOCAL";
pub const FORWARD: &str = "SVCPROXY-FORWARD";
pub const FIREWALL: &str = "SVCPROXY-FIREWALL";
pub const LOCALNET: &str = "SVCPROXY-LOCALNET";
/// An empty chain in `mangle`, `nat` and `filter` whose disappearance means someone
/// flushed and deleted the tables (a firewalld reload, `iptables -X`): a periodic
/// resync finding it gone in `mangle` (small, so cheap to ask) rewrites everything,
/// as upstream's iptables monitor does with `KUBE-PROXY-CANARY`.
pub const CANARY: &str = "SVCPROXY-CANARY";

/// The fixed chains of each table, declared (and so flushed and rewritten) by every
/// full restore, in this order.
pub const FILTER_CHAINS: [&str; 7] = [
    SERVICES, EXTERNAL, FIREWALL, NODEPORTS, FORWARD, LOCALNET, CANARY,
];
pub const NAT_CHAINS: [&str; 6] = [
    SERVICES,
    NODEPORTS,
    POSTROUTING,
    MARK_MASQ,
    NOT_LOCAL,
    CANARY,
];

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
/// `-A <chain>`), plus the order the rules were written in and which service port's
/// translation wrote each one: [`FamilyRules::restore`] writes the restore input in
/// that order (see there for why).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    chains: Vec<(String, Vec<String>)>,
    index: HashMap<String, usize>,
    /// The group (service port, index into [`FamilyRules::groups`]) owning each chain;
    /// `None` for the fixed chains.
    chain_group: Vec<Option<u32>>,
    /// Every rule as written: the group being translated then, and its chain.
    log: Vec<(Option<u32>, u32)>,
    /// The group being translated now.
    current: Option<u32>,
}

impl Table {
    /// Declares `chain` (idempotent; a new hashed chain belongs to the group being
    /// translated) and returns its index.
    pub fn declare(&mut self, chain: &str) -> usize {
        match self.index.get(chain) {
            Some(i) => *i,
            None => {
                self.chains.push((chain.to_string(), Vec::new()));
                self.chain_group.push(if chain.starts_with(HASHED_PREFIX) {
                    self.current
                } else {
                    None
                });
                self.index.insert(chain.to_string(), self.chains.len() - 1);
                self.chains.len() - 1
            }
        }
    }

    /// Appends one rule to `chain` (declaring it).
    pub fn add(&mut self, chain: &str, rule: String) {
        let i = self.declare(chain);
        self.chains[i].1.push(rule);
        self.log.push((self.current, i as u32));
    }

    /// Whether `chain` holds exactly `rule`.
    pub fn contains(&self, chain: &str, rule: &str) -> bool {
        self.rules(chain)
            .is_some_and(|r| r.iter().any(|x| x == rule))
    }

    /// Whether `chain` is declared.
    pub fn has(&self, chain: &str) -> bool {
        self.index.contains_key(chain)
    }

    /// The rules of `chain`, if declared.
    pub fn rules(&self, chain: &str) -> Option<&[String]> {
        self.index.get(chain).map(|i| self.chains[*i].1.as_slice())
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
    /// The service ports, in translation order (descending chain-name prefix); a
    /// group's index is its position here.
    pub groups: Vec<ServicePortName>,
    /// Per group: translated now (its own chains and their rules are in the
    /// tables), or replayed from a [`TranslationCache`] (only its rules in the fixed
    /// chains are: it did not change, and its chains stay as the kernel has them).
    pub translated: Vec<bool>,
    /// Per group, the rules it writes in fixed chains: (table, chain, rule).
    dispatch: Vec<Vec<(TableId, String, String)>>,
    /// Rules in the replayed groups' own chains, per table (filter, nat): not in
    /// the tables, but in the kernel.
    replayed_rules: [usize; 2],
    /// Chains the service ports had at the cache's previous translation and no
    /// longer have (a port gone, an endpoint chain dropped), per table.
    pub replaced: HashMap<TableId, Vec<String>>,
}

impl FamilyRules {
    pub fn new(family: IpFamily) -> FamilyRules {
        FamilyRules {
            family,
            filter: Table::default(),
            nat: Table::default(),
            groups: Vec::new(),
            translated: Vec::new(),
            dispatch: Vec::new(),
            replayed_rules: [0; 2],
            replaced: HashMap::new(),
        }
    }

    fn table_mut(&mut self, id: TableId) -> &mut Table {
        match id {
            TableId::Filter => &mut self.filter,
            TableId::Nat => &mut self.nat,
        }
    }

    /// Every rule of table `id` in the kernel after this translation is written,
    /// including the replayed groups' own chains.
    pub fn total_rules(&self, id: TableId) -> usize {
        self.table(id).rule_count() + self.replayed_rules[id as usize]
    }

    /// Adds `rule` to the fixed chain `chain` for the current group, recording it as
    /// the group's (a healthCheckNodePort accept shared by a Service's ports is
    /// written once, but recorded by each).
    pub fn dispatch(&mut self, id: TableId, chain: &str, rule: String) {
        if let Some(g) = self.table(id).current {
            self.dispatch[g as usize].push((id, chain.to_string(), rule.clone()));
        }
        self.add_fixed(id, chain, rule);
    }

    /// Adds `rule` to the fixed chain `chain`, unless it is a healthCheckNodePort
    /// accept already there.
    fn add_fixed(&mut self, id: TableId, chain: &str, rule: String) {
        let t = self.table_mut(id);
        if id == TableId::Filter && chain == NODEPORTS && t.contains(chain, &rule) {
            return;
        }
        t.add(chain, rule);
    }

    pub fn table(&self, id: TableId) -> &Table {
        match id {
            TableId::Filter => &self.filter,
            TableId::Nat => &self.nat,
        }
    }

    /// From now on, chains declared and rules written belong to `name`'s group
    /// (`None`: node-wide again).
    pub fn begin_group(&mut self, name: Option<&ServicePortName>) {
        let g = name.map(|n| {
            self.groups.push(n.clone());
            self.translated.push(true);
            self.dispatch.push(Vec::new());
            (self.groups.len() - 1) as u32
        });
        self.filter.current = g;
        self.nat.current = g;
    }

    /// The chains (both tables) of the `g`-th service port of [`FamilyRules::groups`].
    pub fn group_chains(&self, g: usize) -> impl Iterator<Item = &str> {
        [&self.filter, &self.nat].into_iter().flat_map(move |t| {
            t.chains
                .iter()
                .zip(&t.chain_group)
                .filter(move |(_, owner)| **owner == Some(g as u32))
                .map(|((name, _), _)| name.as_str())
        })
    }

    /// `iptables-restore --noflush` input replacing every svcproxy chain of this family
    /// (each declared chain is flushed and rewritten) and flushing `stale` chains
    /// (per table), which [`stale_deletion`] then deletes.
    pub fn restore(&self, stale: &HashMap<TableId, Vec<String>>) -> String {
        self.restore_only(|_| true, |_, _| true, stale, Some(&[]))
    }

    /// [`FamilyRules::restore`] that also inserts `jumps` at the top of their built-in
    /// chains, in the same transaction (after the chains they jump to exist).
    pub fn restore_with_jumps(
        &self,
        stale: &HashMap<TableId, Vec<String>>,
        jumps: &[&Jump],
    ) -> String {
        self.restore_only(|_| true, |_, _| true, stale, Some(jumps))
    }

    /// [`FamilyRules::restore`] limited to the chains of the service ports `changed`
    /// accepts (only translated ones can be) and the fixed chains `fixed` accepts
    /// (each rewritten whole): a partial sync. Chains left out stay as the kernel
    /// has them.
    pub fn restore_changed(
        &self,
        changed: impl Fn(&ServicePortName) -> bool,
        fixed: impl Fn(TableId, &str) -> bool,
        stale: &HashMap<TableId, Vec<String>>,
    ) -> String {
        self.restore_only(changed, fixed, stale, None)
    }

    /// The fixed chains of table `id` (node-wide and dispatch), each with its rules.
    pub fn fixed_chains(&self, id: TableId) -> impl Iterator<Item = (&str, &[String])> {
        let t = self.table(id);
        t.chains
            .iter()
            .zip(&t.chain_group)
            .filter(|(_, g)| g.is_none())
            .map(|((n, r), _)| (n.as_str(), r.as_slice()))
    }

    /// The input, in an order that keeps `iptables-restore` linear.
    ///
    /// `iptables-nft` (1.8.x) keeps every chain name a restore mentions (declared,
    /// appended to, jumped to) in a sorted linked list, and each mention walks it
    /// from the smallest name: a name costs as many string compares as the smaller
    /// names mentioned before it. Declaring all chains first and then writing their
    /// rules makes that quadratic (1k services x 10 endpoints took 3.8 s, 4k took 72
    /// s, and 10k did not finish in 300 s). So the input mentions names in descending
    /// order, each group (service port) at once: a group's chains share a name prefix
    /// ([`rules`] names them `SVP-<service hash>-...`, and translates groups in
    /// descending hash order), and its chains, its rules and its dispatch rules in the
    /// fixed chains are written together, right after the fixed chains (whose
    /// `SVCPROXY-` names sort before every `SVP-` name). Every mention then walks past
    /// the fixed names and its own group only. The kernel sees the same rules in the
    /// same chains; the dispatch chains hold services in the translation order.
    ///
    /// `jumps`: `Some` for a full restore, which also (re)creates the `mangle` canary
    /// ([`CANARY`]) and inserts these jumps.
    fn restore_only(
        &self,
        include: impl Fn(&ServicePortName) -> bool,
        fixed: impl Fn(TableId, &str) -> bool,
        stale: &HashMap<TableId, Vec<String>>,
        jumps: Option<&[&Jump]>,
    ) -> String {
        let included: Vec<bool> = self
            .groups
            .iter()
            .zip(&self.translated)
            .map(|(g, t)| *t && include(g))
            .collect();
        let mut out = String::new();
        if jumps.is_some() {
            let _ = write!(out, "*mangle\n:{CANARY} - [0:0]\nCOMMIT\n");
        }
        let jumps = jumps.unwrap_or_default();
        for id in TableId::ALL {
            let table = self.table(id);
            let written: Vec<bool> = table
                .chains
                .iter()
                .zip(&table.chain_group)
                .map(|((name, _), g)| match g {
                    Some(g) => included[*g as usize],
                    None => fixed(id, name),
                })
                .collect();
            let _ = writeln!(out, "*{}", id.name());
            for (c, (name, _)) in table.chains.iter().enumerate() {
                if table.chain_group[c].is_none() && written[c] {
                    let _ = writeln!(out, ":{name} - [0:0]");
                }
            }
            // Stale chains are flushed here, in descending order, and deleted by a
            // second restore ([`stale_deletion`]) once nothing jumps to them.
            for name in descending(stale.get(&id).into_iter().flatten()) {
                let _ = writeln!(out, ":{name} - [0:0]");
            }
            // Chains of each included group, declared when the group's rules begin.
            let mut group_chains: Vec<Vec<usize>> = vec![Vec::new(); self.groups.len()];
            for (c, g) in table.chain_group.iter().enumerate() {
                if let Some(g) = g {
                    group_chains[*g as usize].push(c);
                }
            }
            let mut cursor = vec![0usize; table.chains.len()];
            let mut started = vec![false; self.groups.len()];
            let mut current: Option<u32> = None;
            let declare = |out: &mut String, g: usize| {
                if included[g] {
                    for name in descending(group_chains[g].iter().map(|&c| &table.chains[c].0)) {
                        let _ = writeln!(out, ":{name} - [0:0]");
                    }
                }
            };
            for &(g, c) in &table.log {
                let c = c as usize;
                let rule = &table.chains[c].1[cursor[c]];
                cursor[c] += 1;
                if g != current {
                    current = g;
                    if let Some(g) = g.map(|g| g as usize).filter(|g| !started[*g]) {
                        started[g] = true;
                        declare(&mut out, g);
                    }
                }
                if !written[c] {
                    continue;
                }
                let _ = writeln!(out, "-A {} {rule}", table.chains[c].0);
            }
            // A group that wrote no rule in this table still has its (empty) chains.
            for g in (0..self.groups.len()).filter(|g| !started[*g]) {
                declare(&mut out, g);
            }
            for j in jumps.iter().filter(|j| j.table == id) {
                let _ = writeln!(out, "-I {} {}", j.from, j.args().join(" "));
            }
            out.push_str("COMMIT\n");
        }
        out
    }
}

/// Chain names in descending order: the order a restore mentions them in (see
/// [`FamilyRules::restore`]).
fn descending<'a>(names: impl IntoIterator<Item = &'a String>) -> Vec<&'a String> {
    let mut v: Vec<&String> = names.into_iter().collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v
}

/// Restore input running `op` (`:NAME - [0:0]` or `-X NAME`) on each chain of `chains`,
/// per table, in descending order; `None` when there is none.
fn per_chain(
    chains: &HashMap<TableId, Vec<String>>,
    op: impl Fn(&str) -> String,
) -> Option<String> {
    if chains.values().all(Vec::is_empty) {
        return None;
    }
    let mut out = String::new();
    for id in TableId::ALL {
        let Some(names) = chains.get(&id).filter(|c| !c.is_empty()) else {
            continue;
        };
        let _ = writeln!(out, "*{}", id.name());
        for name in descending(names) {
            out.push_str(&op(name));
        }
        out.push_str("COMMIT\n");
    }
    Some(out)
}

/// A restore flushing every chain of `chains` (what [`FamilyRules::restore`] does for
/// stale chains; cleanup's first step). `None` when there is none.
pub fn flush(chains: &HashMap<TableId, Vec<String>>) -> Option<String> {
    per_chain(chains, |name| format!(":{name} - [0:0]\n"))
}

/// The second restore of a sync that left `stale` chains (flushed by the first, so
/// empty and unreferenced): `-X` for each, in descending order (each name mentioned
/// once, so linear; see [`FamilyRules::restore`]). `None` when there is none.
pub fn stale_deletion(stale: &HashMap<TableId, Vec<String>>) -> Option<String> {
    per_chain(stale, |name| format!("-X {name}\n"))
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
