//! The iptables restore input keeps `iptables-nft` linear. `iptables-nft` (1.8.x) keeps
//! every chain name a restore mentions in a sorted linked list, walked from the smallest
//! name at each mention (`cache_chain_list_insert`), so the order of the input decides
//! whether a restore costs O(n) or O(n²) string compares. This test replays that list
//! over the input svcproxy writes (full, partial, with stale chains) and bounds the
//! compares per mention; a control shows the same rules in the usual "declare every
//! chain, then every rule" order cost far more, so the model can tell them apart.

use std::collections::HashMap;

use svcproxy_core::model::IpFamily;
use svcproxy_plan::iptables::{self, stale_deletion, TableId};
use svcproxy_testkit::objects;
use svcproxy_testkit::scenario::Scenario;

/// `n` services of `m` endpoints, ClusterIP, one of them with affinity and a NodePort.
/// The endpoints are this node's, so each has its chain (the hairpin masquerade): the
/// most chains a restore can name.
fn services(n: usize, m: usize) -> String {
    let mut y = String::new();
    for i in 0..n {
        let extra = if i == 0 {
            "  type: NodePort\n  sessionAffinity: ClientIP\n"
        } else {
            ""
        };
        y.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: order}}\n\
             spec:\n{extra}  clusterIP: 198.19.{}.{}\n  ports:\n  - {{name: http, port: 80, targetPort: 8080}}\n\
             ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc-{i}-1\n  \
             namespace: order\n  labels: {{kubernetes.io/service-name: svc-{i}}}\naddressType: IPv4\n\
             ports:\n- {{name: http, port: 8080}}\nendpoints:\n",
            i / 250,
            i % 250 + 1
        ));
        for e in 0..m {
            let k = i * m + e;
            y.push_str(&format!(
                "- {{addresses: [10.{}.{}.{}], nodeName: node-a}}\n",
                k / 62500 % 250,
                k / 250 % 250,
                k % 250 + 1
            ));
        }
    }
    y
}

fn rules(n: usize, m: usize) -> iptables::FamilyRules {
    let mut sc = Scenario::cluster_only("node-a");
    for o in objects::parse(&services(n, m)) {
        sc.objects.push(("generated.yaml".into(), o));
    }
    let intent = sc.intent_as(iptables::SEMANTICS);
    iptables::rules(&intent, IpFamily::V4).expect("v4 rules")
}

/// String compares `iptables-nft` spends on the chain names of `input`, and how many
/// names it mentions (per table, as each `COMMIT` starts a new list).
fn compares(input: &str) -> (usize, usize) {
    let (mut total, mut mentions) = (0, 0);
    let mut list: Vec<String> = Vec::new();
    let mut mention = |list: &mut Vec<String>, name: &str| {
        mentions += 1;
        // Walk from the smallest until equal (found) or greater (insert before).
        let mut i = 0;
        while i < list.len() {
            total += 1;
            match list[i].as_str().cmp(name) {
                std::cmp::Ordering::Equal => return,
                std::cmp::Ordering::Greater => break,
                std::cmp::Ordering::Less => i += 1,
            }
        }
        list.insert(i, name.to_string());
    };
    for line in input.lines() {
        if line.starts_with('*') || line == "COMMIT" {
            list.clear();
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if let Some(name) = words.first().and_then(|w| w.strip_prefix(':')) {
            mention(&mut list, name);
            continue;
        }
        if let ["-A" | "-I" | "-X", chain, ..] = words[..] {
            mention(&mut list, chain);
        }
        if let Some(j) = words.iter().position(|w| *w == "-j") {
            mention(&mut list, words[j + 1]);
        }
    }
    (total, mentions)
}

/// The same rules as "every chain declared, then every chain's rules" (what
/// `iptables-save` prints).
fn declared_first(r: &iptables::FamilyRules) -> String {
    let mut out = String::new();
    for id in TableId::ALL {
        let t = r.table(id);
        out.push_str(&format!("*{}\n", id.name()));
        for (name, _) in t.chains() {
            out.push_str(&format!(":{name} - [0:0]\n"));
        }
        for (name, rules) in t.chains() {
            for rule in rules {
                out.push_str(&format!("-A {name} {rule}\n"));
            }
        }
        out.push_str("COMMIT\n");
    }
    out
}

#[test]
fn restores_mention_chain_names_in_an_order_iptables_nft_handles_linearly() {
    let (n, m) = (600, 8);
    let r = rules(n, m);
    let chains = r.nat.chains().count();
    assert!(chains > n * m, "{chains} nat chains");
    // Every mention walks past the fixed chains and the dispatch buckets (whose
    // `SVCPROXY-` names sort first), then its own service port's chains.
    let bound = 24.0 + iptables::BUCKETS as f64;

    // Full restore.
    let full = r.restore(&HashMap::new());
    let (cost, mentions) = compares(&full);
    let per = cost as f64 / mentions as f64;
    assert!(
        per < bound,
        "full restore: {cost} compares for {mentions} mentions ({per:.1} each)"
    );
    // The control: the same rules, declared first, cost hundreds per mention.
    let (slow, slow_mentions) = compares(&declared_first(&r));
    let slow_per = slow as f64 / slow_mentions as f64;
    eprintln!("compares per mention: {per:.1} as written, {slow_per:.1} declared first");
    assert!(
        slow_per > 20.0 * per,
        "control: {slow_per:.1} vs {per:.1} compares per mention"
    );

    // A partial restore: one service port changed (every dispatch rule still names
    // every service's chain), with the chains of a removed service flushed.
    let changed = r.groups[n / 2].clone();
    let gone: Vec<String> = r.group_chains(7).map(str::to_string).collect();
    assert!(!gone.is_empty());
    let stale = HashMap::from([(TableId::Nat, gone.clone())]);
    let partial = r.restore_changed(|name| *name == changed, |_, _| true, &stale);
    let (cost, mentions) = compares(&partial);
    let per = cost as f64 / mentions as f64;
    assert!(
        per < bound,
        "partial restore: {cost} compares for {mentions} mentions ({per:.1} each)"
    );
    assert!(
        !partial.contains(&format!(":{} ", r.group_chains(1).next().unwrap())),
        "an unchanged service's chains are not rewritten"
    );

    // Deleting every chain (cleanup, or every service gone) stays linear too.
    let all: Vec<String> = r.nat.chains().map(|(c, _)| c.to_string()).collect();
    let deletion = stale_deletion(&HashMap::from([(TableId::Nat, all)])).expect("input");
    let (cost, mentions) = compares(&deletion);
    assert!(
        cost <= 2 * mentions,
        "deletion: {cost} compares for {mentions} mentions"
    );
}
