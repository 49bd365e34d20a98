//! `svcproxy explain --live` against a real kernel, in a throwaway network namespace
//! per mode: after `svcproxy --once` programmed the example cluster, the kernel holds
//! what the plan writes, compared rule by rule; a rule deleted by hand in one
//! service port's endpoint chain, or rewritten in place, is reported, as that
//! service port's, and only there (in nftables mode also for a port served
//! without a chain, whose endpoints are elements of the cluster IP map); someone
//! else's rule that sees packets first is reported apart.
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
    /// The differences an endpoint deleted by hand makes: iptables, the lacking
    /// DNAT rule; nftables, the rule choosing from the endpoint map, lacking as
    /// planned and present with the element missing.
    deletion_differences: usize,
}

const NFTABLES: Mode = Mode {
    name: "nftables",
    flags: &["--proxy-mode", "nftables"],
    tools: &["nft"],
    deletion_differences: 2,
};

const IPTABLES: Mode = Mode {
    name: "iptables",
    flags: &[
        "--proxy-mode",
        "iptables",
        "--iptables-localhost-nodeports=false",
    ],
    tools: &["iptables", "iptables-save", "iptables-restore", "ip6tables"],
    deletion_differences: 1,
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

#[derive(Clone, Copy)]
enum Edit {
    Delete,
    /// Same place, same count: the DNAT goes to 198.18.18.99 instead.
    Rewrite,
}

/// The map of `ip svcproxy` holding the element whose value ends the way
/// `suffix` (` : VALUE`) says, and that element's key.
fn map_element(ns: &Netns, suffix: &str) -> (String, String) {
    let listing = ns
        .run_ok(&["nft", "list", "table", "ip", "svcproxy"], None)
        .expect("nft list");
    let mut map = "";
    let mut found = None;
    for line in listing.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("map ") {
            map = rest.split_whitespace().next().unwrap_or("");
        }
        if let Some(key) = line
            .split(['{', ',', '}'])
            .map(str::trim)
            .find_map(|e| e.strip_suffix(suffix))
        {
            found = Some((map.to_string(), key.to_string()));
        }
    }
    found.unwrap_or_else(|| panic!("an element `KEY{suffix}`:\n{listing}"))
}

/// Deletes the element `key` of `map` of `ip svcproxy` by hand.
fn delete_element(ns: &Netns, map: &str, key: &str) {
    ns.run_ok(
        &[
            "nft",
            "delete",
            "element",
            "ip",
            "svcproxy",
            map,
            &format!("{{ {key} }}"),
        ],
        None,
    )
    .expect("nft delete element");
}

/// Edits, by hand, what DNATs to 198.18.18.10:8080 (one of demo/web's
/// endpoints): iptables, its rule; nftables, the endpoint's element of the
/// endpoint map (the comparison shows it as the rule choosing from the map
/// changed, see `listing::resolve_numbered_maps`).
fn edit_an_endpoint_rule(ns: &Netns, mode: &Mode, edit: Edit) {
    match mode.name {
        "nftables" => {
            // The endpoint is an element of the TCP endpoint map, `K : 198.18.18.10 .
            // 8080`, which the service chain's rule `... numgen random mod N offset B
            // map @endpoint-dnat-tcp` chooses from (B <= K < B + N).
            let (map, key) = map_element(ns, " : 198.18.18.10 . 8080");
            assert!(map.starts_with("endpoint-dnat-tcp-"), "{map}");
            let map = map.as_str();
            match edit {
                Edit::Delete => delete_element(ns, map, &key),
                Edit::Rewrite => {
                    let script = format!(
                        "delete element ip svcproxy {map} {{ {key} }}\n\
                         add element ip svcproxy {map} {{ {key} : 198.18.18.99 . 8080 }}\n"
                    );
                    ns.run_ok(&["nft", "-f", "-"], Some(&script))
                        .expect("nft edit");
                }
            }
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
            let (chain, args) = rule.split_once(' ').expect("chain and rule");
            let number = saved
                .lines()
                .filter(|l| l.starts_with(&format!("-A {chain} ")))
                .position(|l| l.ends_with(args))
                .expect("its place")
                + 1;
            let number = number.to_string();
            let rewritten = args.replace("198.18.18.10:8080", "198.18.18.99:8080");
            let mut argv = vec!["iptables", "-t", "nat"];
            match edit {
                Edit::Delete => argv.extend(["-D", chain, &number]),
                Edit::Rewrite => {
                    argv.extend(["-R", chain, &number]);
                    argv.extend(rewritten.split_whitespace());
                }
            }
            ns.run_ok(&argv, None).expect("iptables edit");
        }
    }
}

/// Puts, by hand, a rule of someone else's where it sees packets before
/// svcproxy's: an earlier base chain at the same hook (nftables), a rule above
/// svcproxy's jump (iptables).
fn put_a_rule_ahead(ns: &Netns, mode: &Mode) {
    match mode.name {
        "nftables" => {
            let script = "table inet fw {
  chain early {
    type filter hook prerouting priority -200; policy accept;
    tcp dport 9 drop
  }
}
";
            ns.run_ok(&["nft", "-f", "-"], Some(script))
                .expect("nft -f");
        }
        _ => {
            ns.run_ok(
                &[
                    "iptables",
                    "-t",
                    "nat",
                    "-I",
                    "PREROUTING",
                    "1",
                    "-p",
                    "tcp",
                    "--dport",
                    "9",
                    "-j",
                    "RETURN",
                ],
                None,
            )
            .expect("iptables -I");
        }
    }
}

fn the_kernel_is_compared_rule_by_rule_with_the_plan(mode: Mode) {
    let test = format!("explain_live_{}", mode.name);
    let Some(ns) = Netns::create(&test, "live", mode.tools) else {
        return;
    };
    let once = || {
        let out = svcproxy(&ns, &mode, &["--once"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    once();

    let v = explain_live(&ns, &mode, "198.19.0.10:80");
    let k = &v["kernel"];
    assert_eq!(k["mode"], mode.name);
    assert_eq!(k["compared"], "rules", "{k:#}");
    assert_eq!(k["agrees"], true, "{k:#}");
    assert_eq!(k["ahead"], serde_json::json!([]), "{k:#}");

    // An endpoint deleted by hand.
    edit_an_endpoint_rule(&ns, &mode, Edit::Delete);
    let v = explain_live(&ns, &mode, "198.19.0.10:80");
    let k = &v["kernel"];
    assert_eq!(k["agrees"], false, "{k:#}");
    let diffs = k["differences"].as_array().unwrap();
    let n = mode.deletion_differences;
    assert_eq!(diffs.len(), n, "exactly the deleted endpoint: {k:#}");
    assert!(
        diffs[0].as_str().unwrap().contains("lacks the plan's rule")
            && diffs[0].as_str().unwrap().contains("198.18.18.10"),
        "{k:#}"
    );
    assert_eq!(
        k["thisServicePort"], k["differences"],
        "it is demo/web's: {k:#}"
    );
    // Another service's trace sees the same difference, not as its own.
    let v = explain_live(&ns, &mode, "198.19.0.21:6379");
    assert_eq!(v["kernel"]["differences"].as_array().unwrap().len(), n);
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
        text.contains(&format!(
            "compared rule by rule): differs from the plan in {n} place(s), {n} of them this service port's"
        )),
        "{text}"
    );

    // A full sync repairs it; then a rule rewritten in place (same count) shows
    // as the plan's rule lacking and another in its place.
    once();
    assert_eq!(
        explain_live(&ns, &mode, "198.19.0.10:80")["kernel"]["agrees"],
        true
    );
    edit_an_endpoint_rule(&ns, &mode, Edit::Rewrite);
    let v = explain_live(&ns, &mode, "198.19.0.10:80");
    let k = &v["kernel"];
    let diffs: Vec<&str> = k["differences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert_eq!(diffs.len(), 2, "{k:#}");
    assert!(
        diffs[0].contains("lacks the plan's rule") && diffs[0].contains("198.18.18.10:8080"),
        "{k:#}"
    );
    assert!(
        diffs[1].contains("198.18.18.99:8080") && diffs[1].contains("not in the plan"),
        "{k:#}"
    );
    assert_eq!(k["thisServicePort"], k["differences"], "{k:#}");

    // Someone else's rule where it sees packets first.
    once();
    put_a_rule_ahead(&ns, &mode);
    let v = explain_live(&ns, &mode, "198.19.0.10:80");
    let k = &v["kernel"];
    assert_eq!(
        k["agrees"], true,
        "not a difference in svcproxy's rules: {k:#}"
    );
    let ahead = k["ahead"].as_array().unwrap();
    assert_eq!(ahead.len(), 1, "{k:#}");
    let ahead = ahead[0].as_str().unwrap();
    match mode.name {
        "nftables" => assert!(
            ahead.starts_with("table inet fw chain early (hook prerouting, priority -200, policy accept, 1 rules) sees ip and ip6 packets before svcproxy's chain filter-prerouting (priority -110)"),
            "{ahead}"
        ),
        _ => assert!(
            ahead.contains("-t nat -A PREROUTING -p tcp -m tcp --dport 9 -j RETURN` runs before svcproxy's jump"),
            "{ahead}"
        ),
    }
    if mode.name == "nftables" {
        a_chainless_ports_element_is_its_own(&ns, &mode);
    }
}

/// nftables serves demo/cache (a cluster IP port alone) without a chain: one of
/// its endpoints deleted by hand from the cluster IP map is a difference of
/// demo/cache's, an element, and not demo/web's.
fn a_chainless_ports_element_is_its_own(ns: &Netns, mode: &Mode) {
    let out = svcproxy(ns, mode, &["--once"]);
    assert!(out.status.success());
    let (map, key) = map_element(ns, " : 198.18.18.22 . 6379");
    assert_eq!(map, "clusterip-dnat-tcp");
    assert!(key.starts_with("198.19.0.21 . tcp . 6379 . "), "{key}");
    delete_element(ns, &map, &key);
    let v = explain_live(ns, mode, "198.19.0.21:6379");
    let k = &v["kernel"];
    let diffs = k["differences"].as_array().unwrap();
    assert_eq!(diffs.len(), 1, "{k:#}");
    let diff = diffs[0].as_str().unwrap();
    assert!(
        diff.contains("set/map clusterip-dnat-tcp lacks the plan's element")
            && diff.contains(&format!("`{key} : 198.18.18.22 . 6379`")),
        "{k:#}"
    );
    assert_eq!(k["thisServicePort"], k["differences"], "{k:#}");
    let v = explain_live(ns, mode, "198.19.0.10:80");
    assert_eq!(v["kernel"]["differences"].as_array().unwrap().len(), 1);
    assert!(v["kernel"]["thisServicePort"]
        .as_array()
        .unwrap()
        .is_empty());
}

#[test]
fn nftables_the_kernel_is_compared_rule_by_rule_with_the_plan() {
    the_kernel_is_compared_rule_by_rule_with_the_plan(NFTABLES);
}

#[test]
fn iptables_the_kernel_is_compared_rule_by_rule_with_the_plan() {
    the_kernel_is_compared_rule_by_rule_with_the_plan(IPTABLES);
}
