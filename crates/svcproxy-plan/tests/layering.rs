//! The backend translations (nftables, iptables, eBPF) decide nothing: it reads the intent and prints.
//! This checks the source for what a decision would need — the snapshot, the
//! endpoint selection, traffic policies, topology, endpoint conditions — so that
//! a policy branch added to a renderer fails here rather than in review.

use std::path::Path;

/// Words that only policy code has reason to use. (`policy accept` in a base
/// chain's declaration is nftables syntax, matched separately.)
const FORBIDDEN: &[&str] = &[
    "svcproxy_core::snapshot",
    "svcproxy_core::selection",
    "ServicePortView",
    "traffic_policy",
    "policy_local",
    "topology",
    "hints",
    "has_any_endpoints",
    "ready",
    "terminating",
    "serving",
    "PlanConfig",
    "LocalDetection",
];

#[test]
fn the_nftables_translation_contains_no_policy_decision() {
    check("nft", 4);
}

#[test]
fn the_ebpf_translation_contains_no_policy_decision() {
    check("ebpf", 1);
}

#[test]
fn the_iptables_translation_contains_no_policy_decision() {
    check("iptables", 2);
}

fn check(module: &str, files: usize) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(module);
    let mut checked = 0;
    // A module split into a folder (`nft/planner/`) is checked file by file too.
    let mut dirs = vec![dir.clone()];
    while let Some(next) = dirs.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                let code = code.replace("policy accept", "");
                for word in FORBIDDEN {
                    assert!(
                        !code.contains(word),
                        "{}:{}: `{word}` in a backend translation: decide it in the intent\n{line}",
                        path.display(),
                        n + 1
                    );
                }
            }
            checked += 1;
        }
    }
    assert!(
        checked >= files,
        "expected the {module} modules in {}",
        dir.display()
    );
}
