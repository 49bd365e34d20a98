//! svcproxy's rules as a listing shows them, and how two listings differ:
//! `svcproxy explain --live` compares what the kernel holds with what a full sync
//! of the plan would write.
//!
//! Rule by rule when it can: the plan is loaded into a scratch network namespace
//! and listed back by the same tool (`nft -s list ruleset`, `iptables-save`), so
//! both sides are in the kernel's own canonical form and a rule rewritten in place
//! shows as well as one deleted or added. When no scratch namespace can be made,
//! the plan's own text is compared by counts only (rules per chain, elements per
//! set), which misses a rule rewritten in place.
//!
//! Entry points: [`nft_listing`] (block form: `nft list` output or the planner's
//! script), [`iptables_listing`] (`iptables-save` output or a restore input,
//! svcproxy's chains only), [`differences`], and [`nft_chains_ahead`] (other
//! tables' base chains that see packets before svcproxy's).

use std::collections::{BTreeMap, HashMap};

/// A chain (its declaration lines: hook, priority, policy, comment; and its rules,
/// in order, as listed) or a set or map (its declaration lines and its elements,
/// sorted; none for a set filled by packets, `flags dynamic`: session affinity, as
/// its elements are connections' state, not rules).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Object {
    pub declaration: Vec<String>,
    /// A chain's rules or a set's elements.
    pub items: Vec<String>,
}

/// The chains and sets of svcproxy's tables, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    pub chains: BTreeMap<String, Object>,
    pub sets: BTreeMap<String, Object>,
    /// iptables: per built-in chain holding a jump of svcproxy's, the rules the
    /// kernel evaluates before it (they see every packet first).
    pub ahead_of_jumps: BTreeMap<String, Vec<String>>,
}

/// How two listings were compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compared {
    /// Each declaration, rule and element, as text in the same canonical form.
    Rules,
    /// Rules per chain and elements per set only (the two sides are in different
    /// forms).
    Counts,
}

/// Table `family table` in `text`, in `nft`'s block form: `nft list` output, or
/// a script as the planner writes full ones. Other tables are skipped.
pub fn nft_listing(text: &str, family: &str, table: &str) -> Listing {
    enum Block {
        Table,
        Chain(String),
        Set(String),
        Other,
    }
    let mut out = Listing::default();
    let mut stack: Vec<Block> = Vec::new();
    // An `elements = { ... }` being read, possibly over several lines.
    let mut elements: Option<(String, String)> = None;
    let header = format!("table {family} {table} {{");
    let add_element = format!("add element {family} {table} ");
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some((set, buf)) = &mut elements {
            buf.push(' ');
            buf.push_str(line);
            if let Some(inner) = buf.strip_suffix('}') {
                let set = out.sets.entry(set.clone()).or_default();
                set.items.extend(split_elements(inner));
                elements = None;
            }
            continue;
        }
        if stack.is_empty() {
            if line == header {
                stack.push(Block::Table);
            } else if let Some(rest) = line.strip_prefix(&add_element) {
                added_elements(&mut out, rest);
            }
            continue;
        }
        if line == "}" {
            stack.pop();
            continue;
        }
        let opens = line.ends_with('{');
        match stack.last().expect("not empty") {
            Block::Table if opens => {
                let words: Vec<&str> = line.split_whitespace().collect();
                let name = words.get(1).map(|s| s.to_string()).unwrap_or_default();
                match words[0] {
                    "chain" => {
                        out.chains.entry(name.clone()).or_default();
                        stack.push(Block::Chain(name));
                    }
                    "set" | "map" => {
                        out.sets.entry(name.clone()).or_default();
                        stack.push(Block::Set(name));
                    }
                    _ => stack.push(Block::Other),
                }
            }
            Block::Chain(name) => {
                let chain = out.chains.entry(name.clone()).or_default();
                if is_chain_declaration(line) {
                    chain.declaration.push(line.to_string());
                } else {
                    chain.items.push(unport_redirect(line));
                }
                // A rule never ends with `{` (anonymous sets close on the line).
            }
            Block::Set(name) => {
                if let Some(rest) = line.strip_prefix("elements = {") {
                    let name = name.clone();
                    match rest.strip_suffix('}') {
                        Some(inner) => out
                            .sets
                            .entry(name)
                            .or_default()
                            .items
                            .extend(split_elements(inner)),
                        None => elements = Some((name, rest.to_string())),
                    }
                } else if opens {
                    stack.push(Block::Other);
                } else {
                    let set = out.sets.entry(name.clone()).or_default();
                    set.declaration.push(line.to_string());
                }
            }
            _ if opens => stack.push(Block::Other),
            _ => {}
        }
    }
    settle_sets(&mut out);
    resolve_numbered_maps(&mut out);
    out
}

/// `add element ... NAME { ... }` after the table's block (what the planner adds
/// there): the elements, into their set.
fn added_elements(out: &mut Listing, rest: &str) {
    if let Some((name, list)) = rest.split_once(" { ") {
        if let Some(inner) = list.strip_suffix('}') {
            let set = out.sets.entry(name.to_string()).or_default();
            set.items.extend(split_elements(inner));
        }
    }
}

/// Each set's elements in order; a dynamic set's (filled by the packets, not
/// by svcproxy) are not compared.
fn settle_sets(out: &mut Listing) {
    for set in out.sets.values_mut() {
        let dynamic = set
            .declaration
            .iter()
            .any(|d| d.starts_with("flags ") && d.contains("dynamic"));
        if dynamic {
            set.items.clear();
        }
        set.items.sort();
    }
}

/// `redirect to :PORT` for any port: the userspace proxy's sockets take their ports
/// when it starts, so no plan made apart from the running proxy knows them; a
/// redirect is compared by where it is (which set's chain), not by the port.
fn unport_redirect(rule: &str) -> String {
    match rule.find("redirect to :") {
        Some(at) => {
            let start = at + "redirect to :".len();
            let digits = rule[start..]
                .find(|c: char| !c.is_ascii_digit())
                .map_or(rule.len(), |n| start + n);
            format!("{}PORT{}", &rule[..start], &rule[digits..])
        }
        None => rule.to_string(),
    }
}

/// A rule choosing from a map by number (`numgen random mod N offset B map @M`:
/// svcproxy's endpoint maps) is compared by what it chooses from: the numbers are
/// handed out by the planner that wrote the table, so a table written by partial
/// syncs and a fresh plan number the same endpoints differently. The rule's
/// `offset B map @M` becomes `map @M [V, ...]`, the values under keys `B` to
/// `B + N - 1` in order (`<no element K>` for a missing key; `A . P` values
/// shown as `A:P`), and the map keeps only the elements no such rule uses.
fn resolve_numbered_maps(listing: &mut Listing) {
    let mut used: BTreeMap<String, std::collections::BTreeSet<u64>> = BTreeMap::new();
    for chain in listing.chains.values_mut() {
        for rule in &mut chain.items {
            let Some((head, tail)) = rule.split_once(" numgen random mod ") else {
                continue;
            };
            // The last field of a concatenated key (the cluster IP map's `VIP .
            // PROTO . PORT . K`): its keys are the service ports' own, the same
            // in any table, so its elements are compared as they are.
            if head.ends_with(" .") {
                continue;
            }
            let Some((n, rest)) = tail.split_once(' ') else {
                continue;
            };
            let (base, rest) = match rest.strip_prefix("offset ") {
                Some(r) => match r.split_once(' ') {
                    Some((b, rest)) => (b, rest),
                    None => continue,
                },
                None => ("0", rest),
            };
            let Some(map) = rest.strip_prefix("map @") else {
                continue;
            };
            let (Ok(n), Ok(base), Some(set)) =
                (n.parse::<u64>(), base.parse::<u64>(), listing.sets.get(map))
            else {
                continue;
            };
            if n > 1 << 20 {
                continue;
            }
            let values: BTreeMap<u64, &str> = set
                .items
                .iter()
                .filter_map(|e| {
                    let (k, v) = e.split_once(" : ")?;
                    Some((k.trim().parse().ok()?, v.trim()))
                })
                .collect();
            let chosen: Vec<String> = (base..base + n)
                .map(|k| match values.get(&k) {
                    Some(v) => endpoint_text(v),
                    None => format!("<no element {k}>"),
                })
                .collect();
            used.entry(map.to_string())
                .or_default()
                .extend(base..base + n);
            *rule = format!(
                "{head} numgen random mod {n} map @{map} [{}]",
                chosen.join(", ")
            );
        }
    }
    for (map, keys) in used {
        if let Some(set) = listing.sets.get_mut(&map) {
            set.items.retain(|e| {
                e.split_once(" : ")
                    .and_then(|(k, _)| k.trim().parse::<u64>().ok())
                    .is_none_or(|k| !keys.contains(&k))
            });
        }
    }
}

/// `A . P` as `A:P` (`[A]:P` for IPv6), as a DNAT rule writes it.
fn endpoint_text(value: &str) -> String {
    match value.split_once(" . ") {
        Some((a, p)) if a.contains(':') => format!("[{a}]:{p}"),
        Some((a, p)) => format!("{a}:{p}"),
        None => value.to_string(),
    }
}

fn is_chain_declaration(line: &str) -> bool {
    ["type ", "policy ", "comment ", "devices "]
        .iter()
        .any(|p| line.starts_with(p))
}

/// The elements between `elements = {` and `}`: comma-separated, a trailing comma
/// allowed, each trimmed (none holds a comma).
fn split_elements(inner: &str) -> impl Iterator<Item = String> + '_ {
    inner
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(String::from)
}

/// svcproxy's chains (those `ours` says are) in `iptables-save` output or a
/// restore input: `TABLE/CHAIN` → its `-A` rules. Rules svcproxy adds to built-in
/// chains (its jumps) are listed as the rules of `TABLE/CHAIN jumps`, and the
/// rules in front of the first of them in [`Listing::ahead_of_jumps`].
pub fn iptables_listing(text: &str, ours: impl Fn(&str) -> bool) -> Listing {
    let mut out = Listing::default();
    let mut table = String::new();
    // Per built-in chain: the rules seen so far, until one of ours jumps.
    let mut before: HashMap<String, Option<Vec<String>>> = HashMap::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.trim().to_string();
        } else if let Some(decl) = line.strip_prefix(':') {
            let chain = decl.split_whitespace().next().unwrap_or("");
            if ours(chain) {
                out.chains.entry(format!("{table}/{chain}")).or_default();
            }
        } else if let Some(rule) = line
            .strip_prefix("-A ")
            .or_else(|| line.strip_prefix("-I "))
        {
            let (chain, args) = rule.split_once(' ').unwrap_or((rule, ""));
            if ours(chain) {
                out.chains
                    .entry(format!("{table}/{chain}"))
                    .or_default()
                    .items
                    .push(args.to_string());
                continue;
            }
            let key = format!("{table}/{chain}");
            let jumps_to_ours = args
                .split_whitespace()
                .collect::<Vec<_>>()
                .windows(2)
                .any(|w| w[0] == "-j" && ours(w[1]));
            let seen = before
                .entry(key.clone())
                .or_insert_with(|| Some(Vec::new()));
            if jumps_to_ours {
                if let Some(ahead) = seen.take() {
                    if !ahead.is_empty() {
                        out.ahead_of_jumps.insert(key.clone(), ahead);
                    }
                }
                out.chains
                    .entry(format!("{key} jumps"))
                    .or_default()
                    .items
                    .push(args.to_string());
            } else if let Some(ahead) = seen {
                ahead.push(args.to_string());
            }
        }
    }
    out
}

/// At most this many lines per chain or set; the rest are counted.
const LINES_PER_OBJECT: usize = 5;

/// How `live` differs from `expected`, `what` naming the table (e.g. `table ip
/// svcproxy`): chains and sets missing or extra, and, as `how` says, their
/// declarations, rules and elements, or only their counts.
pub fn differences(what: &str, expected: &Listing, live: &Listing, how: Compared) -> Vec<String> {
    let mut out = Vec::new();
    let kinds = [
        ("chain", ("rule", "rules"), &expected.chains, &live.chains),
        (
            "set/map",
            ("element", "elements"),
            &expected.sets,
            &live.sets,
        ),
    ];
    for (kind, (item, items), expected, live) in kinds {
        for (name, want) in expected {
            match live.get(name) {
                None => out.push(format!("{what}: {kind} {name} is missing")),
                Some(got) => out.extend(object_differences(
                    what,
                    &format!("{kind} {name}"),
                    (item, items),
                    want,
                    got,
                    how,
                )),
            }
        }
        for (name, got) in live {
            if !expected.contains_key(name) {
                out.push(format!(
                    "{what}: {kind} {name} ({} {items}) is not in the plan",
                    got.items.len()
                ));
            }
        }
    }
    out
}

/// The differences of one chain or set, planned and live.
fn object_differences(
    what: &str,
    object: &str,
    (item, items): (&str, &str),
    want: &Object,
    got: &Object,
    how: Compared,
) -> Vec<String> {
    let want = (&want.declaration, &want.items);
    let got = (&got.declaration, &got.items);
    let mut out = Vec::new();
    if how == Compared::Counts {
        if got.1.len() != want.1.len() {
            out.push(format!(
                "{what}: {object} holds {} {items}, the plan has {}",
                got.1.len(),
                want.1.len()
            ));
        }
        return out;
    }
    if want.0 != got.0 {
        out.push(format!(
            "{what}: {object} is declared `{}`, the plan has `{}`",
            got.0.join("; "),
            want.0.join("; ")
        ));
    }
    if want.1 == got.1 {
        return out;
    }
    let lacking = multiset_minus(want.1, got.1);
    let extra = multiset_minus(got.1, want.1);
    if lacking.is_empty() && extra.is_empty() {
        out.push(format!(
            "{what}: {object} holds the plan's {items} in another order"
        ));
        return out;
    }
    let mut lines: Vec<String> = lacking
        .iter()
        .map(|r| format!("{what}: {object} lacks the plan's {item} `{r}`"))
        .chain(extra.iter().map(|r| {
            let a = if item.starts_with(['a', 'e', 'i', 'o', 'u']) {
                "an"
            } else {
                "a"
            };
            format!("{what}: {object} holds `{r}`, {a} {item} not in the plan")
        }))
        .collect();
    if lines.len() > LINES_PER_OBJECT {
        let more = lines.len() - (LINES_PER_OBJECT - 1);
        lines.truncate(LINES_PER_OBJECT - 1);
        lines.push(format!(
            "{what}: {object} differs from the plan in {more} more {items}"
        ));
    }
    out.extend(lines);
    out
}

/// The items of `a` not matched one for one in `b`, in `a`'s order.
fn multiset_minus<'a>(a: &'a [String], b: &[String]) -> Vec<&'a str> {
    let mut left: HashMap<&str, usize> = HashMap::new();
    for x in b {
        *left.entry(x.as_str()).or_default() += 1;
    }
    a.iter()
        .filter(|x| match left.get_mut(x.as_str()) {
            Some(n) if *n > 0 => {
                *n -= 1;
                false
            }
            _ => true,
        })
        .map(String::as_str)
        .collect()
}

/// A base chain as `nft -j list chains` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseChain {
    pub family: String,
    pub table: String,
    pub name: String,
    pub hook: String,
    pub priority: i64,
    pub policy: String,
}

/// The base chains in `nft -j list chains` output (regular chains are skipped).
pub fn nft_base_chains(json: &str) -> Result<Vec<BaseChain>, String> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("nft's JSON: {e}"))?;
    let items = v["nftables"]
        .as_array()
        .ok_or("nft's JSON has no \"nftables\" list")?;
    Ok(items
        .iter()
        .filter_map(|item| {
            let c = item.get("chain")?;
            Some(BaseChain {
                family: c["family"].as_str()?.to_string(),
                table: c["table"].as_str()?.to_string(),
                name: c["name"].as_str()?.to_string(),
                hook: c["hook"].as_str()?.to_string(),
                priority: c["prio"].as_i64()?,
                policy: c["policy"].as_str().unwrap_or("accept").to_string(),
            })
        })
        .collect())
}

/// Other tables' base chains that see a packet of `family` (`ip` or `ip6`) at a
/// hook where table `ours` has a base chain, no later than it (a lower priority
/// runs first; at an equal one the order is not defined): each once, with the
/// first chain of ours it comes before.
pub fn nft_chains_ahead<'a>(
    chains: &'a [BaseChain],
    family: &str,
    ours: &str,
) -> Vec<(&'a BaseChain, &'a BaseChain)> {
    let is_ours = |c: &BaseChain| c.family == family && c.table == ours;
    let sees = |c: &BaseChain| c.family == family || c.family == "inet";
    chains
        .iter()
        .filter(|c| sees(c) && !is_ours(c))
        .filter_map(|other| {
            let first_of_ours = chains
                .iter()
                .filter(|c| is_ours(c) && c.hook == other.hook && c.priority >= other.priority)
                .min_by_key(|c| c.priority)?;
            Some((other, first_of_ours))
        })
        .collect()
}

/// The rules in `nft -j list chain ...` output.
pub fn nft_rule_count(json: &str) -> usize {
    serde_json::from_str::<serde_json::Value>(json)
        .ok()
        .and_then(|v| {
            v["nftables"]
                .as_array()
                .map(|items| items.iter().filter(|i| i.get("rule").is_some()).count())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table choosing endpoints from a numbered map, numbered from `base`, with
    /// `extra` elements after.
    fn numbered(base: u32, second: &str, extra: &str) -> String {
        format!(
            "table ip svcproxy {{
\tmap endpoint-dnat-tcp {{
\t\ttypeof numgen random mod 1 : ip daddr . tcp dport
\t\telements = {{ {base} : 10.0.0.1 . 80, {} : {second} . 80{extra} }}
\t}}
\tchain service-1 {{
\t\tmeta l4proto tcp dnat ip to numgen random mod 2 offset {base} map @endpoint-dnat-tcp
\t}}
}}
",
            base + 1
        )
    }

    #[test]
    fn redirects_compare_by_place_not_port() {
        assert_eq!(
            unport_redirect("meta l4proto tcp redirect to :40029"),
            "meta l4proto tcp redirect to :PORT"
        );
        assert_eq!(
            unport_redirect("redirect to :0 comment \"x\""),
            "redirect to :PORT comment \"x\""
        );
        assert_eq!(unport_redirect("jump services"), "jump services");
    }

    #[test]
    fn numbered_maps_compare_by_what_a_rule_chooses_not_by_the_numbers() {
        let a = nft_listing(&numbered(1, "10.0.0.2", ""), "ip", "svcproxy");
        let b = nft_listing(&numbered(7, "10.0.0.2", ""), "ip", "svcproxy");
        assert_eq!(
            a.chains["service-1"].items,
            vec!["meta l4proto tcp dnat ip to numgen random mod 2 map @endpoint-dnat-tcp [10.0.0.1:80, 10.0.0.2:80]"]
        );
        assert!(a.sets["endpoint-dnat-tcp"].items.is_empty());
        assert!(differences("t", &a, &b, Compared::Rules).is_empty());

        // Another endpoint under a key: the rule differs, in its chain.
        let c = nft_listing(&numbered(7, "10.0.0.9", ""), "ip", "svcproxy");
        let d = differences("t", &a, &c, Compared::Rules);
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[0].contains("chain service-1 lacks") && d[0].contains("10.0.0.2:80"));
        assert!(d[1].contains("chain service-1 holds") && d[1].contains("10.0.0.9:80"));

        // An element no rule uses is a difference of the map's.
        let e = nft_listing(
            &numbered(7, "10.0.0.2", ", 99 : 10.0.0.5 . 80"),
            "ip",
            "svcproxy",
        );
        let d = differences("t", &a, &e, Compared::Rules);
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(
            d[0].contains("endpoint-dnat-tcp holds `99 : 10.0.0.5 . 80`"),
            "{d:?}"
        );

        // The planner's form: the elements added after the table's block.
        let script = numbered(7, "10.0.0.2", "")
            .replace(
                "\t\telements = { 7 : 10.0.0.1 . 80, 8 : 10.0.0.2 . 80 }\n",
                "",
            )
            + "add element ip svcproxy endpoint-dnat-tcp { 7 : 10.0.0.1 . 80, 8 : 10.0.0.2 . 80 }\n";
        assert!(!script.contains("elements ="), "{script}");
        let g = nft_listing(&script, "ip", "svcproxy");
        assert!(differences("t", &a, &g, Compared::Rules).is_empty());

        // A key the rule uses and the map lacks.
        let f = nft_listing(
            &numbered(7, "10.0.0.2", "").replace("8 : 10.0.0.2 . 80", "9 : 10.0.0.2 . 80"),
            "ip",
            "svcproxy",
        );
        assert!(f.chains["service-1"].items[0].contains("[10.0.0.1:80, <no element 8>]"));
    }

    /// The planner's form of a script.
    const SCRIPT: &str = "add table ip svcproxy { comment \"managed-by-svcproxy\" ; }
delete table ip svcproxy
table ip svcproxy {
\tcomment \"managed-by-svcproxy\"

\tset cluster-ips {
\t\ttype ipv4_addr
\t\telements = {
\t\t\t198.19.0.20,
\t\t\t198.19.0.10,
\t\t}
\t}

\tmap empty {
\t\ttype inet_proto . inet_service : verdict
\t}

\tset affinity-1 {
\t\ttype ipv4_addr
\t\tflags dynamic,timeout
\t\ttimeout 10m
\t}

\tchain services {
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tip daddr 198.19.0.10 tcp dport 80 goto svc-a
\t\tip daddr 198.19.0.20 tcp dport 80 goto svc-b
\t}

\tchain svc-a {
\t\tcomment \"ns/a:http\"
\t\tjump mark-for-masquerade
\t}
}
table ip6 svcproxy {
\tchain services {
\t\tjump x
\t}
}
";

    /// `nft -s list table`'s form of the same, with an element the kernel learnt
    /// from a packet in the affinity set.
    const LISTED: &str = "table ip svcproxy {
\tcomment \"managed-by-svcproxy\"
\tset cluster-ips {
\t\ttype ipv4_addr
\t\telements = { 198.19.0.10,
\t\t\t     198.19.0.20 }
\t}

\tmap empty {
\t\ttype inet_proto . inet_service : verdict
\t}

\tset affinity-1 {
\t\ttype ipv4_addr
\t\tflags dynamic,timeout
\t\ttimeout 10m
\t\telements = { 198.51.100.7 timeout 10m expires 9m58s }
\t}

\tchain services {
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tip daddr 198.19.0.10 tcp dport 80 goto svc-a
\t\tip daddr 198.19.0.20 tcp dport 80 goto svc-b
\t}

\tchain svc-a {
\t\tcomment \"ns/a:http\"
\t\tjump mark-for-masquerade
\t}
}
";

    #[test]
    fn both_forms_read_alike_and_learnt_affinity_is_not_a_difference() {
        let planned = nft_listing(SCRIPT, "ip", "svcproxy");
        let listed = nft_listing(LISTED, "ip", "svcproxy");
        assert_eq!(planned, listed);
        assert_eq!(
            planned.chains["services"].declaration,
            ["type nat hook prerouting priority dstnat; policy accept;"]
        );
        assert_eq!(planned.chains["services"].items.len(), 2);
        assert_eq!(
            planned.chains["svc-a"].declaration,
            ["comment \"ns/a:http\""]
        );
        assert_eq!(
            planned.sets["cluster-ips"].items,
            ["198.19.0.10", "198.19.0.20"]
        );
        assert!(planned.sets["affinity-1"].items.is_empty());
        assert_eq!(
            nft_listing(SCRIPT, "ip6", "svcproxy").chains["services"].items,
            ["jump x"]
        );
        assert_eq!(
            differences("t", &planned, &listed, Compared::Rules),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_rule_rewritten_in_place_shows_by_rule_and_not_by_count() {
        let planned = nft_listing(SCRIPT, "ip", "svcproxy");
        let rewritten = LISTED.replace("tcp dport 80 goto svc-b", "tcp dport 80 drop");
        let live = nft_listing(&rewritten, "ip", "svcproxy");
        assert_eq!(
            differences("table ip svcproxy", &planned, &live, Compared::Rules),
            [
                "table ip svcproxy: chain services lacks the plan's rule `ip daddr 198.19.0.20 tcp dport 80 goto svc-b`",
                "table ip svcproxy: chain services holds `ip daddr 198.19.0.20 tcp dport 80 drop`, a rule not in the plan",
            ]
        );
        assert!(differences("t", &planned, &live, Compared::Counts).is_empty());
    }

    #[test]
    fn deletions_declarations_order_and_extras_are_each_reported() {
        let planned = nft_listing(SCRIPT, "ip", "svcproxy");
        let mut live = planned.clone();
        live.chains.get_mut("services").unwrap().items.reverse();
        live.chains.get_mut("svc-a").unwrap().declaration.clear();
        live.sets.get_mut("cluster-ips").unwrap().items.pop();
        live.sets.remove("empty");
        live.chains.insert("stray".into(), Object::default());
        assert_eq!(
            differences("t", &planned, &live, Compared::Rules),
            [
                "t: chain services holds the plan's rules in another order",
                "t: chain svc-a is declared ``, the plan has `comment \"ns/a:http\"`",
                "t: chain stray (0 rules) is not in the plan",
                "t: set/map cluster-ips lacks the plan's element `198.19.0.20`",
                "t: set/map empty is missing",
            ]
        );
        assert_eq!(
            differences("t", &planned, &live, Compared::Counts),
            [
                "t: chain stray (0 rules) is not in the plan",
                "t: set/map cluster-ips holds 1 elements, the plan has 2",
                "t: set/map empty is missing",
            ]
        );
        // Many differences in one object are summed up after a few.
        let mut many = planned.clone();
        many.sets.get_mut("cluster-ips").unwrap().items =
            (0..9).map(|i| format!("198.51.100.{i}")).collect();
        let lines = differences("t", &planned, &many, Compared::Rules);
        assert_eq!(lines.len(), LINES_PER_OBJECT);
        assert_eq!(
            lines.last().unwrap(),
            "t: set/map cluster-ips differs from the plan in 7 more elements"
        );
    }

    #[test]
    fn iptables_lists_our_chains_our_jumps_and_what_runs_before_them() {
        let ours = |c: &str| c.starts_with("SVP-") || c.starts_with("SVCPROXY-");
        let saved = "*nat
:PREROUTING ACCEPT [0:0]
:SVCPROXY-SERVICES - [0:0]
:SVP-AAAA-SVC - [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -j CALICO-PREROUTING
-A PREROUTING -m comment --comment svcproxy -j SVCPROXY-SERVICES
-A PREROUTING -j KUBE-SERVICES
-A OUTPUT -m comment --comment svcproxy -j SVCPROXY-SERVICES
-A SVCPROXY-SERVICES -d 198.19.0.10/32 -p tcp --dport 80 -j SVP-AAAA-SVC
-A SVP-AAAA-SVC -j DNAT --to-destination 198.18.2.10:8080
COMMIT
";
        let l = iptables_listing(saved, ours);
        assert_eq!(
            l.chains.keys().collect::<Vec<_>>(),
            [
                "nat/OUTPUT jumps",
                "nat/PREROUTING jumps",
                "nat/SVCPROXY-SERVICES",
                "nat/SVP-AAAA-SVC"
            ]
        );
        assert_eq!(
            l.chains["nat/SVP-AAAA-SVC"].items,
            ["-j DNAT --to-destination 198.18.2.10:8080"]
        );
        assert_eq!(
            l.ahead_of_jumps,
            BTreeMap::from([(
                "nat/PREROUTING".to_string(),
                vec!["-j CALICO-PREROUTING".to_string()]
            )])
        );
        let mut live = l.clone();
        live.chains.remove("nat/SVP-AAAA-SVC");
        live.chains.insert(
            "nat/SVP-BBBB-SVC".into(),
            Object {
                declaration: vec![],
                items: vec!["-j DROP".into(), "-j DROP".into()],
            },
        );
        assert_eq!(
            differences("iptables", &l, &live, Compared::Rules),
            [
                "iptables: chain nat/SVP-AAAA-SVC is missing",
                "iptables: chain nat/SVP-BBBB-SVC (2 rules) is not in the plan"
            ]
        );
    }

    #[test]
    fn base_chains_ahead_of_ours_are_those_at_the_same_hook_no_later() {
        let json = r#"{"nftables": [{"metainfo": {}},
            {"chain": {"family": "ip", "table": "svcproxy", "name": "nat-prerouting", "hook": "prerouting", "prio": -100, "type": "nat", "policy": "accept"}},
            {"chain": {"family": "ip", "table": "svcproxy", "name": "services"}},
            {"chain": {"family": "ip", "table": "svcproxy", "name": "filter-prerouting", "hook": "prerouting", "prio": -110, "type": "filter", "policy": "accept"}},
            {"chain": {"family": "inet", "table": "fw", "name": "early", "hook": "prerouting", "prio": -150, "type": "filter", "policy": "accept"}},
            {"chain": {"family": "inet", "table": "fw", "name": "idle", "hook": "prerouting", "prio": -200, "type": "filter", "policy": "accept"}},
            {"chain": {"family": "ip", "table": "nat", "name": "PREROUTING", "hook": "prerouting", "prio": -100, "type": "nat", "policy": "accept"}},
            {"chain": {"family": "ip", "table": "late", "name": "x", "hook": "prerouting", "prio": 0, "type": "filter", "policy": "drop"}},
            {"chain": {"family": "ip6", "table": "v6", "name": "x", "hook": "prerouting", "prio": -300, "type": "filter", "policy": "drop"}},
            {"chain": {"family": "inet", "table": "fw", "name": "in", "hook": "input", "prio": -300, "type": "filter", "policy": "drop"}}
        ]}"#;
        let chains = nft_base_chains(json).unwrap();
        assert_eq!(chains.len(), 8, "the regular chain is left out");
        let ahead: Vec<(&str, &str, &str)> = nft_chains_ahead(&chains, "ip", "svcproxy")
            .iter()
            .map(|(o, m)| (o.table.as_str(), o.name.as_str(), m.name.as_str()))
            .collect();
        assert_eq!(
            ahead,
            [
                ("fw", "early", "filter-prerouting"),
                ("fw", "idle", "filter-prerouting"),
                ("nat", "PREROUTING", "nat-prerouting")
            ],
            "same hook, same packets, no later, each once with the first of ours it precedes; \
             not a later chain, another family's or another hook's"
        );
        assert!(nft_base_chains("[").is_err());
        let chain = r#"{"nftables": [{"metainfo": {}}, {"chain": {"name": "x"}},
            {"rule": {"chain": "x"}}, {"rule": {"chain": "x"}}]}"#;
        assert_eq!(nft_rule_count(chain), 2);
        assert_eq!(nft_rule_count("not json"), 0);
    }
}
