//! Golden rulesets: each scenario directory under `testdata/` renders, through the
//! real `ClusterState` and a fresh planner, exactly its `expected.nft` (the script a
//! first sync applies, which is what `svcproxy render` prints).
//!
//! `UPDATE_GOLDEN=1 cargo test -p svcproxy-plan --test golden` rewrites the files;
//! review the diff like code. `tests/nft_netns.rs` loads every golden file into the
//! real `nft` inside a throwaway network namespace.

mod common;

use common::*;
use pretty_assertions::assert_eq;
use svcproxy_plan::nft::PlanKind;

#[test]
fn every_scenario_renders_its_golden_ruleset() {
    let cases = cases();
    assert!(cases.len() >= 11, "scenario directories missing: {cases:?}");
    for case in cases {
        let mut sc = Scenario::load(&case);
        let up = sc.snapshot();
        assert_golden(&case, "expected.nft", &render_full(&up.v4, &up.v6, &sc.cfg));
    }
}

/// The drift check watches every base chain a scenario's skeleton has
/// (`DRIFT_WATCHED_CHAINS`), and the dispatch chain.
#[test]
fn the_drift_check_watches_every_base_chain() {
    let watched = svcproxy_plan::nft::DRIFT_WATCHED_CHAINS;
    let mut seen = std::collections::BTreeSet::new();
    for case in cases() {
        let mut sc = Scenario::load(&case);
        let up = sc.snapshot();
        let text = render_full(&up.v4, &up.v6, &sc.cfg);
        let lines: Vec<&str> = text.lines().collect();
        for w in lines.windows(2) {
            let (Some(name), true) = (
                w[0].trim()
                    .strip_prefix("chain ")
                    .and_then(|n| n.strip_suffix(" {")),
                w[1].contains(" hook "),
            ) else {
                continue;
            };
            assert!(
                watched.contains(&name),
                "{case:?}: base chain {name} is not watched"
            );
            seen.insert(name.to_string());
        }
        assert!(text.contains(&format!("chain {} {{", svcproxy_plan::nft::SERVICES_CHAIN)));
    }
    // Every watched base chain is one some scenario has.
    for name in &watched[1..] {
        assert!(
            seen.contains(*name),
            "{name} is watched but no scenario has it"
        );
    }
}

#[test]
fn rendering_is_deterministic_and_matches_the_first_sync() {
    for case in cases() {
        let mut sc = Scenario::load(&case);
        let up = sc.snapshot();
        let once = render_full(&up.v4, &up.v6, &sc.cfg);
        let twice = render_full(&up.v4, &up.v6, &sc.cfg);
        assert_eq!(once, twice, "{case}");

        // A sync's first script is the same text, and so is the planner's render.
        let mut planner = NftPipeline::new();
        let plan = planner.plan(&up.v4, &up.v6, &sc.cfg, false, &up.changed);
        assert_eq!(plan.kind, PlanKind::Recreate, "{case}");
        assert_eq!(plan.script, once, "{case}");
        assert_eq!(planner.render(), once, "{case}");

        // The typed model renders deterministically too, and holds every chain
        // the text declares.
        for family in svcproxy_core::model::IpFamily::BOTH {
            let rs = planner.ruleset(family).expect("family programmed");
            assert_eq!(rs.render(), rs.clone().render());
            for name in rs.chains.keys() {
                assert!(
                    once.contains(&format!("\tchain {name} {{\n")),
                    "{case}: {name}"
                );
            }
        }
    }
}

/// Every dispatch chain (`service-`, `local-`) in every golden file picks each of
/// its endpoints with probability exactly 1/n: rule k of n is `numgen random mod
/// (n-k) == 0 goto ...` and the last is a plain `goto`, so endpoint k is taken with
/// probability prod_{j<k} (1 - 1/(n-j)) * 1/(n-k) = 1/n.
#[test]
fn endpoint_dispatch_is_uniform() {
    let mut checked = 0;
    let mut mapped = 0;
    for case in cases() {
        let text = std::fs::read_to_string(testdata().join(&case).join("expected.nft")).unwrap();
        // The endpoint maps' elements, added after each table's block:
        // (family, map, key) → value.
        let mut elements = std::collections::BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("add element ") else {
                continue;
            };
            let mut words = rest.splitn(4, ' ');
            let (family, _, map, list) = (
                words.next().unwrap(),
                words.next().unwrap(),
                words.next().unwrap(),
                words.next().unwrap(),
            );
            if !map.starts_with("endpoint-dnat-") {
                continue;
            }
            let list = list.trim_start_matches("{ ").trim_end_matches(" }");
            for e in list.split(", ") {
                let (k, v) = e.split_once(" : ").unwrap();
                elements.insert(
                    (
                        family.to_string(),
                        map.to_string(),
                        k.parse::<u32>().unwrap(),
                    ),
                    v.to_string(),
                );
            }
        }
        // The family of the table a block is in: a block that starts with a chain
        // may end with the next table's start.
        let mut next_family = "";
        for block in text.split("\n\n") {
            let family = next_family;
            for line in block.lines() {
                if let Some(rest) = line.strip_prefix("table ") {
                    next_family = rest.split(' ').next().unwrap();
                }
            }
            let Some(head) = block.trim_start().strip_prefix("chain ") else {
                continue;
            };
            let name = head.split(' ').next().unwrap_or("");
            let hashed = |prefix: &str| {
                name.strip_prefix(prefix)
                    .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            };
            if !(hashed("service-") || hashed("local-")) {
                continue;
            }
            // A pick goes to the endpoint's chain, or (an endpoint with no chain of
            // its own) DNATs to it.
            let to_endpoint = |r: &str| {
                r.starts_with("goto endpoint-")
                    || r.starts_with("meta l4proto ") && r.contains(" dnat ")
            };
            let picks: Vec<&str> = block
                .lines()
                .map(str::trim)
                .filter(|l| {
                    !l.contains(" @affinity-")
                        && (l.contains("goto endpoint-") || l.contains(" dnat "))
                })
                .collect();
            let n = picks.len() as u64;
            assert!(n > 0, "{case}: {head}");
            // One lookup: `numgen random mod N offset B` into the endpoint map, whose
            // keys B..B+N must each hold a different endpoint.
            if let [pick] = picks[..] {
                if let Some(rest) = pick.split_once(" to numgen random mod ").map(|x| x.1) {
                    let (n, rest) = rest.split_once(" offset ").unwrap();
                    let (base, map) = rest.split_once(' ').unwrap();
                    let proto = pick.split(' ').nth(2).unwrap();
                    let map = map.strip_prefix("map @").unwrap();
                    assert!(
                        map.starts_with(&format!("endpoint-dnat-{proto}-")),
                        "{case}: {pick}"
                    );
                    let (n, base): (u32, u32) = (n.parse().unwrap(), base.parse().unwrap());
                    assert!(n >= 2, "{case}: {pick}");
                    let values: std::collections::BTreeSet<&String> = (base..base + n)
                        .map(|k| {
                            elements
                                .get(&(family.to_string(), map.to_string(), k))
                                .unwrap_or_else(|| panic!("{case}: {pick}: no key {k}"))
                        })
                        .collect();
                    assert_eq!(values.len(), n as usize, "{case}: {pick}");
                    checked += 1;
                    mapped += 1;
                    continue;
                }
            }
            // Probability of reaching rule k, as a fraction num/den.
            let (mut num, mut den) = (1u64, 1u64);
            for (k, rule) in picks.iter().enumerate() {
                let k = k as u64;
                let (p_num, p_den) = if k + 1 == n {
                    assert!(to_endpoint(rule), "{case}: {rule}");
                    (1, 1)
                } else {
                    let want = format!("numgen random mod {} == 0 ", n - k);
                    let rest = rule.strip_prefix(&want);
                    assert!(rest.is_some_and(to_endpoint), "{case}: {rule}");
                    (1, n - k)
                };
                // P(endpoint k) = reach * p must be 1/n.
                assert_eq!(num * p_num * n, den * p_den, "{case}: {head} rule {k}");
                num *= p_den - p_num;
                den *= p_den;
            }
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} dispatch chains found");
    assert!(
        mapped >= 5,
        "only {mapped} chains dispatch through the endpoint map"
    );
}

/// Golden iptables-restore input: each scenario, run as iptables mode runs it (its
/// semantics folded into the scenario's configuration), renders exactly its
/// `expected.iptables` (what `svcproxy --proxy-mode iptables render` prints).
#[test]
fn every_scenario_renders_its_golden_iptables_rules() {
    for case in cases() {
        let sc = svcproxy_testkit::scenario::Scenario::load(&case);
        let intent = sc.intent_as(svcproxy_plan::iptables::SEMANTICS);
        let text = svcproxy_plan::iptables::render_full(&intent);
        assert_golden(&case, "expected.iptables", &text);
        // Names are the kernel's to check, but the length limit is ours to keep.
        for line in text.lines().filter(|l| l.starts_with(':')) {
            let name = line[1..].split(' ').next().unwrap_or("");
            assert!(
                name.len() <= 28,
                "{case}: chain {name} is too long for iptables"
            );
            assert!(svcproxy_plan::iptables::is_ours(name), "{case}: {name}");
        }
    }
}

/// Golden eBPF map contents: each scenario, run as the ebpf mode runs it, gives
/// exactly its `expected.ebpf` (what `svcproxy --proxy-mode ebpf render` prints:
/// the entries with their socket and packet routes, the lists, the admitted
/// sources, how pods are told, the marks).
#[test]
fn every_scenario_renders_its_golden_ebpf_table() {
    for case in cases() {
        let sc = svcproxy_testkit::scenario::Scenario::load(&case);
        let intent = sc.intent_as(svcproxy_plan::ebpf::SEMANTICS);
        let text = svcproxy_plan::ebpf::Table::build(&intent, &[]).render();
        assert_golden(&case, "expected.ebpf", &text);
    }
}
