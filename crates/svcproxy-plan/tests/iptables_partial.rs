//! iptables mode's translation cache: a warm [`TranslationCache`] translates again
//! only the service ports whose intent changed, and what it assembles (fixed chains,
//! rule totals) is exactly what a cold translation of the same intent gives; the
//! chains a port no longer has are reported as replaced, and a partial restore names
//! only the changed ports' chains and the dispatch chains whose rules changed.

mod common;

use std::collections::{BTreeSet, HashMap};

use common::*;
use svcproxy_core::model::IpFamily;
use svcproxy_core::objects::{Kind, ObjectKey, SourceUpdate};
use svcproxy_plan::iptables::{self, FamilyRules, TableId, TranslationCache};
use svcproxy_plan::{Intent, IntentBuilder};

/// Service `svc-i`: cluster IP 198.19.0.<i+1>, three endpoints from 10.1.0.0/16 on node-b (DNATed from the
/// set's chain), except `local` ones on node-a (a chain each, for the hairpin).
fn service(i: usize, first_endpoint: usize, local: bool) -> String {
    let node = if local { "node-a" } else { "node-b" };
    let mut y = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: demo}}\n\
         spec:\n  clusterIP: 198.19.0.{}\n  ports:\n  - {{name: http, port: 80, targetPort: 8080}}\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc-{i}-1\n  \
         namespace: demo\n  labels: {{kubernetes.io/service-name: svc-{i}}}\naddressType: IPv4\n\
         ports:\n- {{name: http, port: 8080}}\nendpoints:\n",
        i + 1
    );
    for e in first_endpoint..first_endpoint + 3 {
        y.push_str(&format!(
            "- {{addresses: [10.1.{}.{}], nodeName: {node}}}\n",
            e / 250,
            e % 250 + 1
        ));
    }
    y
}

struct Pipeline {
    sc: Scenario,
    cfg: svcproxy_plan::PlanConfig,
    builder: IntentBuilder,
    cache: TranslationCache,
}

impl Pipeline {
    fn new() -> Pipeline {
        let sc = Scenario::empty("node-a");
        let cfg = iptables::SEMANTICS.apply(sc.cfg.clone());
        Pipeline {
            sc,
            cfg,
            builder: IntentBuilder::new(),
            cache: TranslationCache::default(),
        }
    }

    /// Brings the intent up to the state (reusing unchanged ports' intents) and
    /// translates it with the cache; checks it against a cold translation.
    fn sync(&mut self) -> FamilyRules {
        let up = self.sc.snapshot();
        self.builder.update(&up.v4, &up.v6, &self.cfg, &up.changed);
        let intent: &Intent = self.builder.intent();
        let warm = self.cache.rules(intent, IpFamily::V4).expect("v4");
        let cold = iptables::rules(intent, IpFamily::V4).expect("v4");
        for t in TableId::ALL {
            let a: Vec<_> = warm.fixed_chains(t).collect();
            let b: Vec<_> = cold.fixed_chains(t).collect();
            assert_eq!(
                a, b,
                "{t:?}: the fixed chains as a cold translation has them"
            );
            assert_eq!(warm.total_rules(t), cold.table(t).rule_count(), "{t:?}");
        }
        warm
    }
}

/// The service ports translated this time.
fn translated(r: &FamilyRules) -> Vec<String> {
    r.groups
        .iter()
        .zip(&r.translated)
        .filter(|(_, t)| **t)
        .map(|(g, _)| g.service.name.to_string())
        .collect()
}

/// The fixed chains whose rules differ between two translations.
fn changed_fixed(before: &FamilyRules, after: &FamilyRules) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for t in TableId::ALL {
        let b: HashMap<&str, &[String]> = before.fixed_chains(t).collect();
        let a: HashMap<&str, &[String]> = after.fixed_chains(t).collect();
        for (name, rules) in &a {
            if b.get(name) != Some(rules) {
                out.insert(name.to_string());
            }
        }
        for name in b.keys().filter(|n| !a.contains_key(*n)) {
            out.insert(name.to_string());
        }
    }
    out
}

#[test]
fn a_warm_translation_redoes_only_what_changed_and_assembles_what_a_cold_one_does() {
    let mut p = Pipeline::new();
    for i in 0..100 {
        p.sc.upsert_yaml(&service(i, 3 * i, i == 7));
    }
    let first = p.sync();
    assert_eq!(translated(&first).len(), 100, "a cold cache translates all");
    assert!(first.replaced.is_empty());

    // Nothing changed: nothing translated, nothing replaced.
    let same = p.sync();
    assert!(translated(&same).is_empty(), "{:?}", translated(&same));
    assert!(changed_fixed(&first, &same).is_empty());

    // One service added: only it is translated, and only its dispatch bucket (new:
    // so the dispatch chain too) changes. 198.19.0.101: bucket 0x25, which
    // 198.19.0.37 (svc-36) already uses.
    p.sc.upsert_yaml(&service(100, 900, false));
    let added = p.sync();
    assert_eq!(translated(&added), ["svc-100"]);
    assert_eq!(
        changed_fixed(&same, &added),
        BTreeSet::from(["SVCPROXY-SVC-25".to_string()])
    );
    let stale = HashMap::new();
    let input = added.restore_changed(
        |_| true,
        |_, name| changed_fixed(&same, &added).contains(name),
        &stale,
    );
    assert!(input.contains(":SVCPROXY-SVC-25 - [0:0]"), "{input}");
    assert!(!input.contains(":SVCPROXY-SERVICES "), "{input}");
    assert!(!input.contains(":SVCPROXY-SVC-24 "), "{input}");
    // The bucket names the other service in it, whose chains are not rewritten:
    // only the new port's set chain is declared.
    assert!(input.contains("\"demo/svc-36:http/tcp\""), "{input}");
    assert_eq!(input.matches("-SVC - [0:0]").count(), 1, "{input}");

    // The local service's endpoints change: its old endpoint chains are replaced,
    // the dispatch stays.
    p.sc.upsert_yaml(&service(7, 500, true));
    let moved = p.sync();
    assert_eq!(translated(&moved), ["svc-7"]);
    assert!(changed_fixed(&added, &moved).is_empty());
    let replaced = &moved.replaced[&TableId::Nat];
    assert_eq!(replaced.len(), 3, "{replaced:?}");
    assert!(
        replaced.iter().all(|c| c.starts_with("SVP-")),
        "{replaced:?}"
    );
    let now: Vec<&str> = moved.nat.chains().map(|(n, _)| n).collect();
    assert!(replaced.iter().all(|c| !now.contains(&c.as_str())));

    // A service deleted: its chain is replaced, its bucket changes (198.19.0.65
    // stays in it, so the dispatch chain does not), nothing is translated.
    for kind in [Kind::Service, Kind::EndpointSlice] {
        let name = if kind == Kind::Service {
            "svc-0"
        } else {
            "svc-0-1"
        };
        p.sc.state
            .apply(SourceUpdate::Delete(ObjectKey::new(kind, "demo", name)));
    }
    let deleted = p.sync();
    assert!(translated(&deleted).is_empty());
    assert_eq!(deleted.replaced[&TableId::Nat].len(), 1, "its set chain");
    assert_eq!(
        changed_fixed(&moved, &deleted),
        BTreeSet::from(["SVCPROXY-SVC-01".to_string()])
    );

    // A different node intent starts over.
    p.cfg.masquerade_all = true;
    let again = p.sync();
    assert_eq!(translated(&again).len(), 100);
}
