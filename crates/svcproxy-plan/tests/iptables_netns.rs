//! Every scenario's iptables rules load into the real `iptables-restore` /
//! `ip6tables-restore` (whichever backend the host's `iptables` uses) inside a
//! throwaway network namespace, with the jumps from the built-in chains, and a second
//! load of the same input replaces rather than duplicates. Without root or the tools
//! the test prints SKIP (and fails under `CI`).

use std::collections::HashMap;

use svcproxy_core::model::IpFamily;
use svcproxy_plan::iptables::{self, restore_command, JUMPS};
use svcproxy_testkit::netns::Netns;
use svcproxy_testkit::scenario::{cases, Scenario};

fn tool(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "iptables",
        IpFamily::V6 => "ip6tables",
    }
}

fn save(ns: &Netns, family: IpFamily) -> String {
    let cmd = format!("{}-save", tool(family));
    ns.run_ok(&[&cmd], None).expect("save")
}

#[test]
fn every_scenario_loads_into_iptables_restore() {
    let tools = [
        "iptables-restore",
        "ip6tables-restore",
        "iptables",
        "ip6tables",
    ];
    let Some(ns) = Netns::create("every_scenario_loads_into_iptables_restore", "ipt", &tools)
    else {
        return;
    };
    let mut loaded = 0;
    for case in cases() {
        let sc = Scenario::load(&case);
        let intent = sc.intent_as(iptables::SEMANTICS);
        for family in IpFamily::BOTH {
            let rules = iptables::rules(&intent, family).expect("family programmed");
            let input = rules.restore(&HashMap::new());
            for round in 0..2 {
                ns.run_ok(&[restore_command(family), "-w", "--noflush"], Some(&input))
                    .unwrap_or_else(|e| panic!("{case} {family:?} round {round}: {e:#}"));
            }
            let saved = save(&ns, family);
            let nat_rules = rules.nat.rule_count();
            let ours = saved
                .lines()
                .filter(|l| l.starts_with("-A SVCPROXY-") || l.starts_with("-A SVP-"))
                .count();
            assert_eq!(
                ours,
                nat_rules + rules.filter.rule_count(),
                "{case} {family:?}: a reload must replace, not add\n{saved}"
            );
            loaded += 1;
        }
        // Jumps from the built-in chains, as the data plane adds them.
        for j in JUMPS {
            for family in IpFamily::BOTH {
                let args = j.args();
                let mut argv = vec![tool(family), "-w", "-t", j.table.name(), "-I", j.from];
                argv.extend(args.iter().map(String::as_str));
                ns.run_ok(&argv, None)
                    .unwrap_or_else(|e| panic!("{case}: jump {j:?}: {e:#}"));
            }
        }
        // Clean for the next scenario: flush and delete ours (jumps first).
        for family in IpFamily::BOTH {
            for t in ["filter", "nat"] {
                for chain in ["INPUT", "FORWARD", "OUTPUT", "PREROUTING", "POSTROUTING"] {
                    let _ = ns.run_ok(&[tool(family), "-w", "-t", t, "-F", chain], None);
                }
                ns.run_ok(&[tool(family), "-w", "-t", t, "-F"], None)
                    .expect("flush");
                ns.run_ok(&[tool(family), "-w", "-t", t, "-X"], None)
                    .expect("delete");
            }
        }
    }
    assert!(loaded >= 20, "{loaded}");
}
