//! `svcproxy explain --live` against a real kernel, in a throwaway network namespace
//! per mode: after `svcproxy --once` programmed the example cluster, the kernel holds
//! what the plan writes; a rule deleted by hand in one service port's endpoint chain
//! is reported, as that service port's, and only there.
//!
//! Without root (or `ip`/`nft`/`iptables`) the tests print SKIP and pass, unless `CI`
//! is set, in which case they fail.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use svcproxy_testkit::netns::Netns;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster")
}

/// The mode's flags, and how to delete one rule of demo/web's endpoint chain for
/// 198.18.18.10 by hand.
struct Mode {
    name: &'static str,
    flags: &'static [&'static str],
    tools: &'static [&'static str],
}

const NFTABLES: Mode = Mode {
    name: "nftables",
    flags: &["--proxy-mode", "nftables"],
    tools: &["nft"],
};

const IPTABLES: Mode = Mode {
    name: "iptables",
    flags: &[
        "--proxy-mode",
        "iptables",
        "--iptables-localhost-nodeports=false",
    ],
    tools: &["iptables", "iptables-save", "iptables-restore", "ip6tables"],
};

fn svcproxy(ns: &Netns, mode: &Mode, args: &[&str]) -> std::process::Output {
    let examples = examples();
    let mut argv = vec![env!("CARGO_BIN_EXE_svcproxy")];
    argv.extend(args);
    argv.extend(mode.flags);
    argv.extend(["--hostname-override", "node-a", "--manifests"]);
    argv.push(examples.to_str().unwrap());
    let mut cmd = ns.command(&argv);
    svcproxy_testkit::netns::run(&mut cmd, None, Duration::from_secs(60)).expect("run svcproxy")
}

fn explain_live(ns: &Netns, mode: &Mode, to: &str) -> Value {
    let out = svcproxy(
        ns,
        mode,
        &[
            "explain",
            "--live",
            "--format",
            "json",
            "--from",
            "198.51.100.7",
            "--to",
            to,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("explain's JSON")
}

/// Deletes, by hand, the rule that DNATs to 198.18.18.10:8080 (one of demo/web's
/// endpoints).
fn delete_an_endpoint_rule(ns: &Netns, mode: &Mode) {
    match mode.name {
        "nftables" => {
            let listing = ns
                .run_ok(&["nft", "-a", "list", "table", "ip", "svcproxy"], None)
                .expect("nft list");
            let mut chain = "";
            let mut found = None;
            for line in listing.lines() {
                let line = line.trim();
                if let Some(rest) = line.strip_prefix("chain ") {
                    chain = rest.split_whitespace().next().unwrap_or("");
                } else if line.contains("dnat to 198.18.18.10:8080") {
                    let handle = line.rsplit("# handle ").next().unwrap_or("").trim();
                    found = Some((chain.to_string(), handle.to_string()));
                }
            }
            let (chain, handle) = found.expect("the endpoint's DNAT rule");
            ns.run_ok(
                &[
                    "nft", "delete", "rule", "ip", "svcproxy", &chain, "handle", &handle,
                ],
                None,
            )
            .expect("nft delete rule");
        }
        _ => {
            let saved = ns
                .run_ok(&["iptables-save", "-t", "nat"], None)
                .expect("save");
            let rule = saved
                .lines()
                .find(|l| l.contains("--to-destination 198.18.18.10:8080"))
                .expect("the endpoint's DNAT rule")
                .strip_prefix("-A ")
                .expect("a rule");
            let mut argv = vec!["iptables", "-t", "nat", "-D"];
            argv.extend(rule.split_whitespace());
            ns.run_ok(&argv, None).expect("iptables -D");
        }
    }
}

fn a_rule_deleted_by_hand_is_reported_for_its_service_port(mode: Mode) {
    let test = format!("explain_live_{}", mode.name);
    let Some(ns) = Netns::create(&test, "live", mode.tools) else {
        return;
    };
    let out = svcproxy(&ns, &mode, &["--once"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let v = explain_live(&ns, &mode, "198.19.0.10:80");
    assert_eq!(v["kernel"]["mode"], mode.name);
    assert_eq!(v["kernel"]["agrees"], true, "{:#}", v["kernel"]);

    delete_an_endpoint_rule(&ns, &mode);
    let v = explain_live(&ns, &mode, "198.19.0.10:80");
    let k = &v["kernel"];
    assert_eq!(k["agrees"], false, "{k:#}");
    let diffs = k["differences"].as_array().unwrap();
    assert_eq!(diffs.len(), 1, "exactly the changed chain: {k:#}");
    assert_eq!(
        k["thisServicePort"], k["differences"],
        "it is demo/web's: {k:#}"
    );
    // Another service's trace sees the same difference, not as its own.
    let v = explain_live(&ns, &mode, "198.19.0.21:6379");
    assert_eq!(v["kernel"]["differences"].as_array().unwrap().len(), 1);
    assert!(v["kernel"]["thisServicePort"]
        .as_array()
        .unwrap()
        .is_empty());
    // The text form says so too.
    let out = svcproxy(
        &ns,
        &mode,
        &[
            "explain",
            "--live",
            "--from",
            "198.51.100.7",
            "--to",
            "198.19.0.10:80",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("differs from the plan in 1 place(s), 1 of them this service port's"),
        "{text}"
    );
}

#[test]
fn nftables_a_rule_deleted_by_hand_is_reported_for_its_service_port() {
    a_rule_deleted_by_hand_is_reported_for_its_service_port(NFTABLES);
}

#[test]
fn iptables_a_rule_deleted_by_hand_is_reported_for_its_service_port() {
    a_rule_deleted_by_hand_is_reported_for_its_service_port(IPTABLES);
}
