//! What a ruleset of svcproxy's holds, counted: the rules of each chain and the
//! elements of each set or map. `svcproxy explain --live` compares the shape of
//! what the plan would write with the shape of what the kernel holds: a chain, a
//! rule or an element deleted or added by hand shows as a difference (a rule
//! rewritten in place, same count, does not).
//!
//! Entry points: [`nft_script_shape`] (the planner's block-form script),
//! [`nft_json_shape`] (`nft -j list table`), [`iptables_shape`] (a restore input or
//! `iptables-save` output, svcproxy's chains only), and [`differences`].

use std::collections::BTreeMap;

/// Rules per chain and elements per set or map, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    pub chains: BTreeMap<String, usize>,
    pub elements: BTreeMap<String, usize>,
}

/// The shape of table `family table` in a script in `nft`'s block form, as the
/// planner writes full scripts (`table ip svcproxy { chain X { ... } map Y {
/// ... elements = { a, b, } } }`). Other tables in the script are skipped.
pub fn nft_script_shape(script: &str, family: &str, table: &str) -> Shape {
    #[derive(PartialEq)]
    enum Block {
        Table,
        Chain(String),
        Set(String),
        Elements(String),
        Other,
    }
    let mut shape = Shape::default();
    let mut stack: Vec<Block> = Vec::new();
    let header = format!("table {family} {table} {{");
    for raw in script.lines() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if stack.is_empty() {
            if line == header {
                stack.push(Block::Table);
            }
            continue;
        }
        if line == "}" {
            stack.pop();
            continue;
        }
        let inside = stack.last().expect("not empty");
        match inside {
            Block::Table => {
                let words: Vec<&str> = line.split_whitespace().collect();
                if line.ends_with('{') && words.len() >= 3 {
                    let name = words[1].to_string();
                    match words[0] {
                        "chain" => {
                            shape.chains.entry(name.clone()).or_insert(0);
                            stack.push(Block::Chain(name));
                        }
                        "set" | "map" => {
                            shape.elements.entry(name.clone()).or_insert(0);
                            stack.push(Block::Set(name));
                        }
                        _ => stack.push(Block::Other),
                    }
                } else if line.ends_with('{') {
                    stack.push(Block::Other);
                }
            }
            Block::Chain(name) => {
                if line.ends_with('{') {
                    stack.push(Block::Other);
                } else if !(line.starts_with("type ")
                    || line.starts_with("comment ")
                    || line.starts_with("policy "))
                {
                    *shape.chains.entry(name.clone()).or_insert(0) += 1;
                }
            }
            Block::Set(name) => {
                if line.starts_with("elements = {") {
                    let name = name.clone();
                    // One-line form: `elements = { a, b }`.
                    if let Some(inner) = line
                        .strip_prefix("elements = {")
                        .and_then(|r| r.strip_suffix('}'))
                    {
                        *shape.elements.entry(name).or_insert(0) += count_elements(inner);
                    } else {
                        stack.push(Block::Elements(name));
                    }
                } else if line.ends_with('{') {
                    stack.push(Block::Other);
                }
            }
            Block::Elements(name) => {
                *shape.elements.entry(name.clone()).or_insert(0) += count_elements(line);
            }
            Block::Other => {
                if line.ends_with('{') {
                    stack.push(Block::Other);
                }
            }
        }
    }
    shape
}

/// Elements on one line of an `elements = { ... }` block: comma-separated, a
/// trailing comma allowed.
fn count_elements(line: &str) -> usize {
    line.split(',').filter(|e| !e.trim().is_empty()).count()
}

/// The shape of the table in `nft -j list table FAMILY NAME`'s output.
pub fn nft_json_shape(json: &str) -> Result<Shape, String> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("nft's JSON: {e}"))?;
    let items = v["nftables"]
        .as_array()
        .ok_or("nft's JSON has no \"nftables\" list")?;
    let mut shape = Shape::default();
    for item in items {
        if let Some(chain) = item.get("chain") {
            if let Some(name) = chain["name"].as_str() {
                shape.chains.entry(name.to_string()).or_insert(0);
            }
        } else if let Some(rule) = item.get("rule") {
            if let Some(name) = rule["chain"].as_str() {
                *shape.chains.entry(name.to_string()).or_insert(0) += 1;
            }
        } else if let Some(set) = item.get("set").or_else(|| item.get("map")) {
            if let Some(name) = set["name"].as_str() {
                let n = set["elem"].as_array().map_or(0, Vec::len);
                *shape.elements.entry(name.to_string()).or_insert(0) += n;
            }
        }
    }
    Ok(shape)
}

/// The shape of svcproxy's chains (those `ours` says are) in an iptables-restore
/// input or `iptables-save` output: `TABLE/CHAIN` → its `-A` rules. Rules svcproxy
/// adds to built-in chains (its jumps) count under `TABLE/CHAIN jumps`.
pub fn iptables_shape(text: &str, ours: impl Fn(&str) -> bool) -> Shape {
    let mut shape = Shape::default();
    let mut table = String::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.trim().to_string();
        } else if let Some(decl) = line.strip_prefix(':') {
            let chain = decl.split_whitespace().next().unwrap_or("");
            if ours(chain) {
                shape.chains.entry(format!("{table}/{chain}")).or_insert(0);
            }
        } else if let Some(rule) = line
            .strip_prefix("-A ")
            .or_else(|| line.strip_prefix("-I "))
        {
            let chain = rule.split_whitespace().next().unwrap_or("");
            if ours(chain) {
                *shape.chains.entry(format!("{table}/{chain}")).or_insert(0) += 1;
            } else if rule
                .split_whitespace()
                .collect::<Vec<_>>()
                .windows(2)
                .any(|w| w[0] == "-j" && ours(w[1]))
            {
                *shape
                    .chains
                    .entry(format!("{table}/{chain} jumps"))
                    .or_insert(0) += 1;
            }
        }
    }
    shape
}

/// How `live` differs from `expected`, one line per chain or set, `what` naming
/// the table (e.g. `ip svcproxy`).
pub fn differences(what: &str, expected: &Shape, live: &Shape) -> Vec<String> {
    let mut out = Vec::new();
    let mut compare =
        |kind: &str, unit: &str, e: &BTreeMap<String, usize>, l: &BTreeMap<String, usize>| {
            for (name, want) in e {
                match l.get(name) {
                    None => out.push(format!("{what}: {kind} {name} is missing")),
                    Some(got) if got != want => out.push(format!(
                        "{what}: {kind} {name} holds {got} {unit}, the plan has {want}"
                    )),
                    Some(_) => {}
                }
            }
            for (name, got) in l {
                if !e.contains_key(name) {
                    out.push(format!(
                        "{what}: {kind} {name} ({got} {unit}) is not in the plan"
                    ));
                }
            }
        };
    compare("chain", "rules", &expected.chains, &live.chains);
    compare("set/map", "elements", &expected.elements, &live.elements);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = "add table ip svcproxy { comment \"managed-by-svcproxy\" ; }
delete table ip svcproxy
table ip svcproxy {
\tcomment \"managed-by-svcproxy\"

\tset cluster-ips {
\t\ttype ipv4_addr
\t\telements = {
\t\t\t198.19.0.10,
\t\t\t198.19.0.20,
\t\t}
\t}

\tmap empty {
\t\ttype inet_proto . inet_service : verdict
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

    #[test]
    fn a_script_counts_rules_per_chain_and_elements_per_set() {
        let s = nft_script_shape(SCRIPT, "ip", "svcproxy");
        assert_eq!(
            s.chains,
            BTreeMap::from([("services".to_string(), 2), ("svc-a".to_string(), 1)])
        );
        assert_eq!(
            s.elements,
            BTreeMap::from([("cluster-ips".to_string(), 2), ("empty".to_string(), 0)])
        );
        assert_eq!(
            nft_script_shape(SCRIPT, "ip6", "svcproxy").chains["services"],
            1
        );
    }

    #[test]
    fn nft_json_counts_the_same() {
        let json = r#"{"nftables": [{"metainfo": {}}, {"table": {"family": "ip", "name": "svcproxy"}},
            {"set": {"name": "cluster-ips", "elem": ["198.19.0.10", "198.19.0.20"]}},
            {"map": {"name": "empty"}},
            {"chain": {"name": "services"}}, {"chain": {"name": "svc-a"}},
            {"rule": {"chain": "services"}}, {"rule": {"chain": "svc-a"}}]}"#;
        let live = nft_json_shape(json).unwrap();
        let expected = nft_script_shape(SCRIPT, "ip", "svcproxy");
        assert_eq!(
            differences("ip svcproxy", &expected, &live),
            ["ip svcproxy: chain services holds 1 rules, the plan has 2"]
        );
        assert!(nft_json_shape("not json").is_err());
    }

    #[test]
    fn iptables_counts_our_chains_and_jumps() {
        let ours = |c: &str| c.starts_with("SVP-") || c.starts_with("SVCPROXY-");
        let saved = "*nat
:PREROUTING ACCEPT [0:0]
:SVCPROXY-SERVICES - [0:0]
:SVP-AAAA-SVC - [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -m comment --comment svcproxy -j SVCPROXY-SERVICES
-A PREROUTING -j KUBE-SERVICES
-A SVCPROXY-SERVICES -d 198.19.0.10/32 -p tcp --dport 80 -j SVP-AAAA-SVC
-A SVP-AAAA-SVC -j DNAT --to-destination 198.18.2.10:8080
COMMIT
";
        let s = iptables_shape(saved, ours);
        assert_eq!(
            s.chains,
            BTreeMap::from([
                ("nat/PREROUTING jumps".to_string(), 1),
                ("nat/SVCPROXY-SERVICES".to_string(), 1),
                ("nat/SVP-AAAA-SVC".to_string(), 1),
            ])
        );
        let mut live = s.clone();
        live.chains.remove("nat/SVP-AAAA-SVC");
        live.chains.insert("nat/SVP-BBBB-SVC".into(), 2);
        assert_eq!(
            differences("iptables", &s, &live),
            [
                "iptables: chain nat/SVP-AAAA-SVC is missing",
                "iptables: chain nat/SVP-BBBB-SVC (2 rules) is not in the plan"
            ]
        );
    }
}
