//! iptables mode against the real `iptables-restore` in a throwaway network namespace:
//! a first sync adds the jumps and the chains; a partial sync rewrites only what
//! changed (and says so); a deleted service's chains go; a rejected restore leaves
//! the previous rules in force and the next sync is full; a restart finds its own
//! chains and adds no second jump; cleanup removes exactly svcproxy's chains and
//! jumps, leaving another chain in the same tables alone.
//!
//! Without root (or `ip`/`iptables`) the tests print SKIP and pass, unless `CI` is
//! set, in which case they fail.

mod common;

use common::netns::Netns;
use common::*;
use svcproxy_dataplane::iptables::{IptablesCommands, IptablesDataPlane};
use svcproxy_dataplane::{DataPlane, DataPlaneError, SyncKind};
use svcproxy_plan::iptables::SEMANTICS;

const TOOLS: &[&str] = &["iptables", "ip6tables", "iptables-restore", "iptables-save"];

impl Netns {
    fn commands(&self) -> IptablesCommands {
        IptablesCommands::with_prefix(["ip", "netns", "exec", &self.name])
    }

    fn save(&self, tool: &str) -> String {
        self.run_ok(&[tool], None).expect("iptables-save")
    }

    fn ours(&self, tool: &str) -> Vec<String> {
        self.save(tool)
            .lines()
            .filter(|l| l.contains("SVCPROXY-") || l.contains("SVP-"))
            .map(str::to_string)
            .collect()
    }
}

/// Rules in svcproxy's own chains of `table`, and svcproxy's jumps from the
/// built-in chains, as the kernel lists them.
fn kernel_rules(ns: &Netns, tool: &str, table: &str) -> (usize, usize) {
    let saved = ns
        .run_ok(&[tool, "-t", table], None)
        .expect("iptables-save");
    let (mut rules, mut jumps) = (0, 0);
    for rule in saved.lines().filter_map(|l| l.strip_prefix("-A ")) {
        if svcproxy_plan::iptables::is_ours(rule.split(' ').next().unwrap_or("")) {
            rules += 1;
        } else if rule.contains("-j SVCPROXY-") {
            jumps += 1;
        }
    }
    (rules, jumps)
}

/// The report's (total, written) for a family and table.
fn counted(
    report: &common::Synced,
    family: svcproxy_core::model::IpFamily,
    table: &str,
) -> (usize, usize) {
    let c = report
        .rules
        .iter()
        .find(|c| c.family == family && c.table == table)
        .unwrap_or_else(|| panic!("no count for {family:?} {table}: {:?}", report.rules));
    (c.total, c.written)
}

fn proxier(ns: &Netns) -> Syncer<IptablesDataPlane> {
    Syncer::new(
        SEMANTICS.apply(plan_config()),
        IptablesDataPlane::new(ns.commands()),
    )
}

/// A line holding every part (iptables-save orders a rule's matches its own way).
#[track_caller]
fn has_rule(text: &str, parts: &[&str], step: &str) {
    assert!(
        text.lines().any(|l| parts.iter().all(|p| l.contains(p))),
        "{step}: no rule with {parts:?}:\n{text}"
    );
}

/// Fails when a chain of ours is left behind: declared, empty and jumped to by nothing
/// (what a stale chain that was flushed but not deleted looks like).
fn no_orphans(text: &str, step: &str) {
    let orphans: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix(":SVP-"))
        .filter_map(|l| l.split(' ').next())
        .filter(|rest| {
            let name = format!("SVP-{rest}");
            !text.lines().any(|l| {
                l.starts_with(&format!("-A {name} ")) || l.ends_with(&format!("-j {name}"))
            })
        })
        .collect();
    assert!(
        orphans.is_empty(),
        "{step}: chains left behind: {orphans:?}\n{text}"
    );
}

#[test]
fn syncs_partial_syncs_failures_restarts_and_cleanup() {
    let Some(ns) = Netns::create("iptables_syncs", "ipt-sync", TOOLS) else {
        return;
    };
    // Someone else's chain in the same table, which nothing of ours may touch.
    ns.run_ok(&["iptables", "-w", "-t", "nat", "-N", "OTHER"], None)
        .unwrap();
    ns.run_ok(
        &[
            "iptables",
            "-w",
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-j",
            "OTHER",
        ],
        None,
    )
    .unwrap();

    let mut state = cluster(&[WEB, DB]);
    let mut dp = proxier(&ns);
    let report = dp.sync(&snapshot(&mut state), true).expect("first sync");
    assert_eq!(report.kind, SyncKind::Recreate);
    // The rule gauges (upstream's kubeproxy_sync_proxy_rules_iptables_total and
    // _last) count what the kernel holds in svcproxy's chains, and what a sync wrote.
    use svcproxy_core::model::IpFamily::{V4, V6};
    for (family, tool) in [(V4, "iptables-save"), (V6, "ip6tables-save")] {
        for table in ["nat", "filter"] {
            let (total, written) = counted(&report, family, table);
            let (rules, jumps) = kernel_rules(&ns, tool, table);
            assert_eq!(total, rules, "{family:?} {table}");
            assert_eq!(
                written,
                total + jumps,
                "{family:?} {table}: the first sync writes every rule and the jumps to them"
            );
        }
    }
    assert!(counted(&report, V4, "nat").0 > 0);
    let v4 = ns.save("iptables-save");
    for needle in [
        "-A PREROUTING -m comment --comment svcproxy -j SVCPROXY-SERVICES",
        "-A POSTROUTING -m comment --comment svcproxy -j SVCPROXY-POSTROUTING",
        "--to-destination 198.18.2.10:8080",
        "--to-destination 198.18.2.20:5432",
    ] {
        has(&v4, needle, "first sync");
    }
    has_rule(
        &v4,
        &["-d 198.19.0.10/32", "--dport 80 -j SVP-", "-SVC"],
        "first sync",
    );
    has_rule(
        &v4,
        &["-d 203.0.113.20/32", "--dport 5432 -j SVP-", "-EXT"],
        "first sync",
    );
    has(
        &ns.save("ip6tables-save"),
        ":SVCPROXY-SERVICES",
        "first sync v6",
    );

    // A requested resync within the hour of the last full one is partial, as
    // upstream's iptables mode does (a full restore at scale takes minutes).
    let report = dp.sync(&snapshot(&mut state), true).expect("resync");
    assert_eq!(report.kind, SyncKind::Partial);

    // web's endpoints move: a partial restore, and only web's chains were sent.
    upsert(&mut state, WEB_MOVED);
    let report = dp.sync(&snapshot(&mut state), false).expect("partial");
    assert_eq!(report.kind, SyncKind::Partial);
    let (total, written) = counted(&report, V4, "nat");
    assert_eq!(total, kernel_rules(&ns, "iptables-save", "nat").0);
    assert!(
        written > 0 && written < total,
        "a partial sync writes only the changed chains: {written} of {total}"
    );
    let v4 = ns.save("iptables-save");
    has(&v4, "--to-destination 198.18.3.10:8080", "partial");
    lacks(&v4, "198.18.2.10", "partial");
    has(
        &v4,
        "--to-destination 198.18.2.20:5432",
        "partial: db untouched",
    );

    // db deleted: its chains go.
    delete_service(&mut state, "db");
    dp.sync(&snapshot(&mut state), false).expect("delete");
    let v4 = ns.save("iptables-save");
    lacks(&v4, "198.19.0.20", "db deleted");
    lacks(&v4, "198.18.2.20", "db deleted");
    no_orphans(&v4, "db deleted");

    // The kernel loses a chain behind our back (someone flushes our dispatch chain
    // and deletes web's dispatch bucket): the next partial restore, which adds db
    // back and so rewrites the dispatch chain (db's bucket returns) but not web's
    // unchanged bucket, names the missing bucket and is rejected as a whole (a
    // partial failure); then a full sync repairs everything.
    let svc = v4
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split(' ').next())
        .find(|name| name.starts_with("SVP-") && name.ends_with("-SVC"))
        .map(str::to_string)
        .expect("web's set chain");
    let bucket = v4
        .lines()
        .find(|l| l.contains("-d 198.19.0.10/32") && l.starts_with("-A SVCPROXY-SVC-"))
        .and_then(|l| l.split(' ').nth(1))
        .map(str::to_string)
        .expect("web's dispatch bucket");
    for args in [
        &["-F", "SVCPROXY-SERVICES"][..],
        &["-F", bucket.as_str()][..],
        &["-X", bucket.as_str()][..],
    ] {
        let mut argv = vec!["iptables", "-w", "-t", "nat"];
        argv.extend_from_slice(args);
        ns.run_ok(&argv, None).expect("break the rules");
    }
    upsert(&mut state, DB);
    let err = dp.sync(&snapshot(&mut state), false).unwrap_err();
    assert!(err.is_partial(), "{err:?}");
    lacks(
        &ns.save("iptables-save"),
        "198.19.0.20",
        "rejected restore applied nothing",
    );
    let report = dp
        .sync(&snapshot(&mut state), false)
        .expect("full after failure");
    assert_eq!(report.kind, SyncKind::Recreate);
    let v4 = ns.save("iptables-save");
    has(&v4, &format!(":{bucket}"), "repaired");
    has_rule(
        &v4,
        &[
            &format!("-A {bucket}"),
            "-d 198.19.0.10/32",
            &format!("-j {svc}"),
        ],
        "repaired",
    );
    has(&v4, "--to-destination 198.18.2.20:5432", "repaired");

    // A restart: a new data plane finds its chains, and adds no second jump.
    let before = ns.ours("iptables-save");
    let mut restarted = proxier(&ns);
    restarted
        .sync(&snapshot(&mut state), true)
        .expect("restart");
    assert_eq!(
        ns.ours("iptables-save"),
        before,
        "a restart changes nothing"
    );

    // Cleanup: every chain and jump of ours goes, OTHER stays.
    restarted.plane_mut().cleanup().expect("cleanup");
    for tool in ["iptables-save", "ip6tables-save"] {
        assert!(ns.ours(tool).is_empty(), "{tool}: {:?}", ns.ours(tool));
    }
    let v4 = ns.save("iptables-save");
    has(&v4, ":OTHER", "cleanup keeps others");
    has(&v4, "-A PREROUTING -j OTHER", "cleanup keeps others");
    // Cleaning up twice is fine.
    restarted.plane_mut().cleanup().expect("second cleanup");

    // A firewalld-style reload: every table flushed, every chain deleted, the jumps
    // from the built-in chains with them. The next requested resync, though within
    // the hour of the last full one, sees the canary gone and rewrites everything.
    let mut p = proxier(&ns);
    p.sync(&snapshot(&mut state), true).expect("first");
    let report = p.sync(&snapshot(&mut state), true).expect("resync");
    assert_eq!(report.kind, SyncKind::Partial, "canary in place: partial");
    let before = ns.ours("iptables-save");
    assert!(
        before.iter().any(|l| l.starts_with(":SVCPROXY-CANARY")),
        "{before:?}"
    );
    for table in ["mangle", "nat", "filter"] {
        for op in ["-F", "-X"] {
            ns.run_ok(&["iptables", "-w", "-t", table, op], None)
                .expect("reload");
        }
    }
    assert!(ns.ours("iptables-save").is_empty());
    let report = p.sync(&snapshot(&mut state), true).expect("after reload");
    assert_eq!(report.kind, SyncKind::Resync, "the reload is noticed");
    assert_eq!(ns.ours("iptables-save"), before, "everything is back");
}

#[test]
fn a_missing_tool_is_an_error_that_names_it() {
    let mut dp = IptablesDataPlane::new(IptablesCommands::with_prefix(["/nonexistent/svcproxy"]));
    let mut state = cluster(&[WEB]);
    let mut p = Syncer::new(SEMANTICS.apply(plan_config()), dp);
    let err = p.sync(&snapshot(&mut state), true).unwrap_err();
    assert!(matches!(err, DataPlaneError::Spawn { .. }), "{err:?}");
    assert!(err.to_string().contains("/nonexistent/svcproxy"), "{err}");
    dp = IptablesDataPlane::new(IptablesCommands::with_prefix(["/nonexistent/svcproxy"]));
    // Cleanup where the tools do not exist: nothing of ours can exist either.
    dp.cleanup().expect("cleanup without iptables");
}
