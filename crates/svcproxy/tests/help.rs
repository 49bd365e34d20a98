//! `--help` on the real binary: each subcommand shows the flags it uses (every
//! command still accepts every flag: `kube_proxy_interface.rs`), the daemon's help
//! groups them under headings with the accepted-but-ignored ones last, and `-h` is
//! the brief form.

use std::process::Command;

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_svcproxy"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run svcproxy");
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8 help")
}

fn headings(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| !l.starts_with(' ') && l.ends_with(':'))
        .map(|l| l.trim_end_matches(':'))
        .collect()
}

fn lines(text: &str) -> usize {
    text.lines().count()
}

/// Whether `text` lists `flag` (a line starting with it, as clap writes an option:
/// `--flag <V>`, `--flag[=<V>]`, `-v, --v <V>`).
fn lists(text: &str, flag: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim_start();
        let l = l.strip_prefix("-v, ").unwrap_or(l);
        l.strip_prefix(flag)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '[', '=']))
    })
}

#[test]
fn the_daemon_s_help_groups_every_flag_and_puts_the_ignored_ones_last() {
    let full = help(&["--help"]);
    let h = headings(&full);
    assert_eq!(
        h.iter().position(|x| *x == "Where services come from"),
        Some(h.iter().position(|x| *x == "Options").unwrap() + 1),
        "{h:?}"
    );
    assert_eq!(
        h.last(),
        Some(&"kube-proxy flags accepted without effect"),
        "{h:?}"
    );
    for expected in [
        "Proxy mode and service addresses",
        "Rules",
        "Syncing",
        "Conntrack (the node's settings)",
        "Health and metrics servers",
        "Cluster DNS (svcproxy only)",
        "Logging",
        "Process",
        "nftables mode",
        "userspace mode",
    ] {
        assert!(h.contains(&expected), "no heading {expected:?} in {h:?}");
    }
    for flag in [
        "--conntrack-min",
        "--nft-writer",
        "--nft-cold-start",
        "--userspace-scheduler",
        "--ipvs-scheduler",
        "--dns-ttl",
    ] {
        assert!(lists(&full, flag), "{flag} missing from --help");
    }
    let brief = help(&["-h"]);
    assert!(
        lines(&brief) * 10 < lines(&full) * 7,
        "-h ({}) should be well under --help ({})",
        lines(&brief),
        lines(&full)
    );
    assert!(brief.contains("see more with '--help'"));
}

#[test]
fn each_subcommand_shows_only_the_flags_it_uses() {
    let daemon = lines(&help(&["--help"]));
    let cleanup = help(&["cleanup", "--help"]);
    assert!(lines(&cleanup) <= 40, "cleanup --help:\n{cleanup}");
    for shown in ["--kube-proxy", "--config", "--v"] {
        assert!(lists(&cleanup, shown), "cleanup --help lacks {shown}");
    }
    // It names every kind of object it removes, the eBPF pins among them.
    for named in [
        "nftables tables",
        "iptables chains",
        "pinned under --ebpf-bpffs",
        "inet svcproxy-ebpf",
    ] {
        assert!(
            cleanup.contains(named),
            "cleanup --help does not name {named}:\n{cleanup}"
        );
    }
    let cases: &[(&str, &[&str], &[&str])] = &[
        (
            "snapshot",
            &[
                "--format",
                "--watch",
                "--manifests",
                "--nodeport-addresses",
                "--feature-gates",
            ],
            &[
                "--conntrack-min",
                "--masquerade-all",
                "--dns-ttl",
                "--nft-writer",
            ],
        ),
        (
            "render",
            &["--proxy-mode", "--masquerade-all", "--cluster-cidr"],
            &["--conntrack-min", "--dns-ttl", "--healthz-bind-address"],
        ),
        (
            "explain",
            &["--from", "--to", "--live", "--detect-local-mode"],
            &["--conntrack-min", "--dns-ttl", "--oom-score-adj"],
        ),
        (
            "dns",
            &["--dns-ttl", "--cluster-domain", "--metrics-bind-address"],
            &["--masquerade-all", "--conntrack-min", "--proxy-mode"],
        ),
        (
            "cleanup",
            &[],
            &["--manifests", "--proxy-mode", "--ipvs-scheduler"],
        ),
    ];
    for (cmd, shown, hidden) in cases {
        let text = help(&[cmd, "--help"]);
        for f in *shown {
            assert!(lists(&text, f), "{cmd} --help lacks {f}");
        }
        for f in *hidden {
            assert!(!lists(&text, f), "{cmd} --help shows {f}");
        }
        assert!(
            !text.contains("accepted without effect"),
            "{cmd} --help lists the ignored flags"
        );
        assert!(
            text.contains("Every other flag of 'svcproxy --help' is accepted and checked"),
            "{cmd} --help does not say the others are accepted"
        );
        assert!(
            lines(&text) * 2 < daemon,
            "{cmd} --help is {} lines, the daemon's {daemon}",
            lines(&text)
        );
    }
}

#[test]
fn render_s_help_names_every_mode_s_output() {
    let text = help(&["render", "--help"]);
    for mode in ["nftables", "iptables", "userspace"] {
        assert!(text.contains(&format!("{mode},")), "render --help: {mode}");
    }
}
