//! kube-proxy's leftovers on a node svcproxy takes over (`svcproxy cleanup
//! --kube-proxy`), as `kube-proxy --cleanup` removes them:
//!
//! - **iptables** (both families; the `iptables`, `iptables-nft` and `iptables-legacy`
//!   tools, whichever exist): the jumps from built-in chains into kube-proxy's chains,
//!   then those chains (`KUBE-SERVICES`, `KUBE-NODEPORTS`, `KUBE-SVC-*`, `KUBE-SEP-*`,
//!   …, [`is_kube_proxy_chain`]) in `nat`, `filter` and `mangle`. A chain some other
//!   (non-built-in) chain still jumps to is left in place with a warning, so another
//!   component's rules never break.
//! - **nftables**: the `kube-proxy` tables of families `ip` and `ip6`.
//! - **IPVS** (where kube-proxy ran in ipvs mode, i.e. `kube-ipvs0` exists): the
//!   `kube-ipvs0` interface, the virtual servers (with `ipvsadm`, as upstream flushes
//!   them) and kube-proxy's `KUBE-*` ipsets (with `ipset`); without those tools what
//!   remains is reported.
//!
//! [`iptables_cleanup`] decides what to remove from one table's `iptables-save` text,
//! purely; the rest runs the tools. [`find_leftovers`] only looks (svcproxy's start-up
//! warning).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::error::DataPlaneError;
use crate::kernel::command::run_command;

/// Built-in chains of the tables kube-proxy writes.
const BUILTIN: &[&str] = &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

/// The tables kube-proxy writes (`mangle`: its canary chain).
const TABLES: &[&str] = &["nat", "filter", "mangle"];

const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// Whether `chain` (in `table`) is one of kube-proxy's (iptables and ipvs modes, every
/// release since 1.2). `KUBE-FIREWALL` and `KUBE-MARK-DROP` in `filter` belong to the
/// kubelet and are never named; `KUBE-FIREWALL` in `nat` was ipvs mode's.
pub fn is_kube_proxy_chain(table: &str, chain: &str) -> bool {
    const EXACT: &[&str] = &[
        "KUBE-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-FORWARD",
        "KUBE-PROXY-FIREWALL",
        "KUBE-SOURCE-RANGES-FIREWALL",
        "KUBE-MARK-MASQ",
        "KUBE-PROXY-CANARY",
        "KUBE-LOAD-BALANCER",
        "KUBE-IPVS-FILTER",
        "KUBE-IPVS-OUT-FILTER",
    ];
    const PREFIXES: &[&str] = &[
        "KUBE-SVC-",
        "KUBE-SVL-",
        "KUBE-EXT-",
        "KUBE-FW-",
        "KUBE-SEP-",
        "KUBE-XLB-",
    ];
    EXACT.contains(&chain)
        || PREFIXES.iter().any(|p| chain.starts_with(p))
        || (table == "nat" && chain == "KUBE-FIREWALL")
}

/// What to do to one table: two `iptables-restore --noflush` inputs (the first
/// flushes kube-proxy's chains and deletes the jumps into them, the second deletes
/// the chains), and the chains kept because another chain still uses them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableCleanup {
    pub removed: Vec<String>,
    pub kept: Vec<String>,
    pub flush_input: String,
    pub delete_input: String,
}

/// Splits an `iptables-save` rule line into arguments as `iptables-restore` does:
/// whitespace separates, double quotes group (with `\"` and `\\` escapes).
fn split_args(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_quotes = false;
    let mut has_token = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_quotes => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            '"' => {
                in_quotes = !in_quotes;
                has_token = true;
            }
            c if c.is_whitespace() && !in_quotes => {
                if has_token || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    has_token = false;
                }
            }
            c => cur.push(c),
        }
    }
    if has_token || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The chain a rule line appends to and the chain it jumps or goes to, if any.
fn rule_chain_and_target(line: &str) -> Option<(String, Option<String>)> {
    let args = split_args(line);
    if args.first().map(String::as_str) != Some("-A") {
        return None;
    }
    let chain = args.get(1)?.clone();
    let target = args
        .windows(2)
        .find(|w| matches!(w[0].as_str(), "-j" | "--jump" | "-g" | "--goto"))
        .map(|w| w[1].clone());
    Some((chain, target))
}

/// Decides what removing kube-proxy's chains from one table takes, from that table's
/// `iptables-save` output. `None`: kube-proxy has nothing there.
pub fn iptables_cleanup(table: &str, save: &str) -> Option<TableCleanup> {
    let mut chains: BTreeSet<String> = BTreeSet::new();
    let mut rules: Vec<(String, Option<String>, &str)> = Vec::new();
    for line in save.lines() {
        if let Some(decl) = line.strip_prefix(':') {
            if let Some(name) = decl.split_whitespace().next() {
                chains.insert(name.to_string());
            }
        } else if let Some((chain, target)) = rule_chain_and_target(line) {
            rules.push((chain, target, line));
        }
    }
    let mut ours: BTreeSet<String> = chains
        .iter()
        .filter(|c| !BUILTIN.contains(&c.as_str()) && is_kube_proxy_chain(table, c))
        .cloned()
        .collect();
    if ours.is_empty() {
        return None;
    }
    // A chain another user-defined chain jumps to stays (with everything it jumps
    // to): removing it would break that chain's owner, or fail the restore.
    let mut kept = BTreeSet::new();
    loop {
        let in_use: Vec<String> = rules
            .iter()
            .filter(|(chain, _, _)| !ours.contains(chain) && !BUILTIN.contains(&chain.as_str()))
            .filter_map(|(_, target, _)| target.clone())
            .filter(|t| ours.contains(t))
            .collect();
        if in_use.is_empty() {
            break;
        }
        for c in in_use {
            ours.remove(&c);
            kept.insert(c);
        }
    }
    if ours.is_empty() {
        return Some(TableCleanup {
            kept: kept.into_iter().collect(),
            ..TableCleanup::default()
        });
    }
    let mut flush = format!("*{table}\n");
    for c in &ours {
        flush.push_str(&format!(":{c} - [0:0]\n"));
    }
    for (chain, target, line) in &rules {
        if BUILTIN.contains(&chain.as_str()) && target.as_ref().is_some_and(|t| ours.contains(t)) {
            // The saved line itself, as a deletion: iptables-restore parses it the
            // way it printed it.
            flush.push_str(&format!("-D{}\n", &line[2..]));
        }
    }
    flush.push_str("COMMIT\n");
    let mut delete = format!("*{table}\n");
    for c in ours.iter().rev() {
        delete.push_str(&format!("-X {c}\n"));
    }
    delete.push_str("COMMIT\n");
    Some(TableCleanup {
        removed: ours.into_iter().collect(),
        kept: kept.into_iter().collect(),
        flush_input: flush,
        delete_input: delete,
    })
}

/// The iptables tools to clean through: every backend a node may have used.
fn iptables_tools() -> Vec<(&'static str, &'static str)> {
    vec![
        ("iptables", "ip6tables"),
        ("iptables-nft", "ip6tables-nft"),
        ("iptables-legacy", "ip6tables-legacy"),
    ]
}

/// What kube-proxy left on this node (or what a cleanup removed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// `tool table: chains`.
    pub iptables: BTreeMap<String, Vec<String>>,
    /// Chains kept because another chain uses them.
    pub kept: BTreeMap<String, Vec<String>>,
    /// `ip kube-proxy`, `ip6 kube-proxy`.
    pub nft_tables: Vec<String>,
    /// `kube-ipvs0` exists (kube-proxy's ipvs mode).
    pub ipvs: bool,
    /// What could not be looked at or removed.
    pub errors: Vec<String>,
    /// What was left because a tool is missing (`ipvsadm`, `ipset`).
    pub warnings: Vec<String>,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.iptables.is_empty() && self.nft_tables.is_empty() && !self.ipvs
    }
}

fn prefixed(prefix: &[String], argv: &[&str]) -> Vec<String> {
    prefix
        .iter()
        .cloned()
        .chain(argv.iter().map(|s| s.to_string()))
        .collect()
}

/// Runs `argv`; `Ok(None)` when the tool is not installed.
fn run(
    prefix: &[String],
    argv: &[&str],
    stdin: Option<&str>,
) -> Result<Option<String>, DataPlaneError> {
    match run_command(&prefixed(prefix, argv), stdin, TOOL_TIMEOUT) {
        Ok(out) => Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned())),
        Err(DataPlaneError::Spawn { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Whether the legacy (x_tables) `table` of `tool`'s family exists, from
/// `/proc/net/ip{,6}_tables_names` (read where the tools run).
fn legacy_table_exists(prefix: &[String], tool: &str, table: &str) -> bool {
    let list = if prefix.is_empty() {
        crate::kernel::xtables::legacy_table_names(tool_family(tool))
    } else {
        let names = if tool.starts_with("ip6") {
            "/proc/net/ip6_tables_names"
        } else {
            "/proc/net/ip_tables_names"
        };
        run(prefix, &["cat", names], None).ok().flatten()
    };
    list.is_some_and(|list| list.lines().any(|l| l.trim() == table))
}

/// The family of an iptables tool (`ip6tables-save`) or an nft family (`ip6`).
fn tool_family(tool: &str) -> svcproxy_core::model::IpFamily {
    if tool.starts_with("ip6") {
        svcproxy_core::model::IpFamily::V6
    } else {
        svcproxy_core::model::IpFamily::V4
    }
}

/// Whether the kernel says (over netlink, in this process's namespace: only
/// without a command prefix) that the nftables table an nft-backed iptables
/// `tool` keeps `table` in does not exist. `false` when it cannot tell: the tool
/// is run.
fn nft_backed_table_missing(prefix: &[String], tool: &str, table: &str) -> bool {
    if !prefix.is_empty() {
        return false;
    }
    matches!(
        crate::kernel::nft::table::table_state(None, tool_family(tool), table),
        Ok(crate::kernel::nft::table::TableState::Missing)
    )
}

/// Whether the `kube-proxy` nftables table of `family` exists.
fn nft_table_exists(prefix: &[String], family: &str) -> Result<bool, DataPlaneError> {
    if prefix.is_empty() {
        // Over netlink in this thread's namespace; `nft` only when it cannot tell.
        match crate::kernel::nft::table::table_state(None, tool_family(family), "kube-proxy") {
            Ok(crate::kernel::nft::table::TableState::Missing) => return Ok(false),
            Ok(crate::kernel::nft::table::TableState::Present { .. }) => return Ok(true),
            Err(_) => {}
        }
    }
    match run(
        prefix,
        &["nft", "list", "table", family, "kube-proxy"],
        None,
    ) {
        Ok(Some(_)) => Ok(true),
        Ok(None) => Ok(false),
        Err(DataPlaneError::Rejected { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

fn ipvs_link_exists(prefix: &[String]) -> bool {
    if prefix.is_empty() {
        // Asked of this thread's network namespace itself (not of /sys, which
        // may be another namespace's).
        return nix::net::if_::if_nametoindex("kube-ipvs0").is_ok();
    }
    matches!(
        run(prefix, &["ip", "-o", "link", "show", "kube-ipvs0"], None),
        Ok(Some(_))
    )
}

/// Looks for kube-proxy's leftovers without changing anything. `prefix` runs the tools
/// elsewhere (e.g. `ip netns exec NAME`).
pub fn find_leftovers(prefix: &[String]) -> Leftovers {
    walk(prefix, false)
}

/// Removes kube-proxy's leftovers (see the module documentation); returns what was
/// removed, what was kept and what failed.
pub fn cleanup_kube_proxy(prefix: &[String]) -> Leftovers {
    walk(prefix, true)
}

fn walk(prefix: &[String], remove: bool) -> Leftovers {
    let mut out = Leftovers::default();
    let mut seen_saves: BTreeSet<String> = BTreeSet::new();
    for (v4, v6) in iptables_tools() {
        for tool in [v4, v6] {
            for table in TABLES {
                if tool.ends_with("-legacy") && !legacy_table_exists(prefix, tool, table) {
                    // Listing it would load the legacy table's module (and so create
                    // it): only a table that exists can hold kube-proxy's chains.
                    continue;
                }
                if !tool.ends_with("-legacy")
                    && nft_backed_table_missing(prefix, tool, table)
                    && (tool.ends_with("-nft") || !legacy_table_exists(prefix, tool, table))
                {
                    // Nothing to list (the plain tool may drive either backend),
                    // and no iptables-save run to find that out.
                    continue;
                }
                let save_tool = format!("{tool}-save");
                let save = match run(prefix, &[&save_tool, "-t", table], None) {
                    Ok(Some(s)) => s,
                    Ok(None) => break,
                    // No such table in this family or backend (module not loaded).
                    Err(DataPlaneError::Rejected { .. }) => continue,
                    Err(e) => {
                        out.errors.push(format!("{save_tool} -t {table}: {e}"));
                        continue;
                    }
                };
                let Some(plan) = iptables_cleanup(table, &save) else {
                    continue;
                };
                // `iptables` is one of the other two: the same rules seen twice.
                let family = if tool == v4 { "v4" } else { "v6" };
                if !seen_saves.insert(format!("{family}\n{table}\n{save}")) {
                    continue;
                }
                let key = format!("{tool} -t {table}");
                if !plan.kept.is_empty() {
                    out.kept.insert(key.clone(), plan.kept.clone());
                }
                if plan.removed.is_empty() {
                    continue;
                }
                if remove {
                    let restore = format!("{tool}-restore");
                    let result = run(
                        prefix,
                        &[&restore, "-w", "--noflush"],
                        Some(&plan.flush_input),
                    )
                    .and_then(|_| {
                        run(
                            prefix,
                            &[&restore, "-w", "--noflush"],
                            Some(&plan.delete_input),
                        )
                    });
                    if let Err(e) = result {
                        out.errors.push(format!("{key}: {e}"));
                        continue;
                    }
                }
                out.iptables.insert(key, plan.removed);
            }
        }
    }
    for family in ["ip", "ip6"] {
        match nft_table_exists(prefix, family) {
            Ok(false) => {}
            Ok(true) => {
                if remove {
                    let script = format!("delete table {family} kube-proxy\n");
                    if let Err(e) = run(prefix, &["nft", "-f", "-"], Some(&script)) {
                        out.errors
                            .push(format!("nft table {family} kube-proxy: {e}"));
                        continue;
                    }
                }
                out.nft_tables.push(format!("{family} kube-proxy"));
            }
            Err(e) => out
                .errors
                .push(format!("nft table {family} kube-proxy: {e}")),
        }
    }
    if ipvs_link_exists(prefix) {
        out.ipvs = true;
        if remove {
            remove_ipvs(prefix, &mut out);
        }
    }
    out
}

/// kube-proxy's ipvs mode state: its dummy interface, the virtual servers and its
/// ipsets (after the iptables rules that used them are gone).
fn remove_ipvs(prefix: &[String], out: &mut Leftovers) {
    if let Err(e) = run(prefix, &["ip", "link", "del", "kube-ipvs0"], None) {
        out.errors.push(format!("deleting kube-ipvs0: {e}"));
    }
    match run(prefix, &["ipvsadm", "--clear"], None) {
        Ok(Some(_)) => {}
        Ok(None) => out
            .warnings
            .push("ipvsadm is not installed: IPVS virtual servers were not flushed".into()),
        Err(e) => out.errors.push(format!("ipvsadm --clear: {e}")),
    }
    match run(prefix, &["ipset", "list", "-n"], None) {
        Ok(Some(names)) => {
            for name in names
                .lines()
                .map(str::trim)
                .filter(|n| n.starts_with("KUBE-"))
            {
                if let Err(e) = run(prefix, &["ipset", "destroy", name], None) {
                    out.errors.push(format!("ipset destroy {name}: {e}"));
                }
            }
        }
        Ok(None) => out
            .warnings
            .push("ipset is not installed: kube-proxy's KUBE-* ipsets were not destroyed".into()),
        Err(e) => out.errors.push(format!("ipset list: {e}")),
    }
}

/// Whether a process named `kube-proxy` runs in this PID namespace (its
/// `/proc/PID/comm`), with its PID.
pub fn kube_proxy_running() -> Option<u32> {
    kube_proxy_running_in(std::path::Path::new("/proc"))
}

fn kube_proxy_running_in(proc: &std::path::Path) -> Option<u32> {
    let own = std::process::id();
    std::fs::read_dir(proc).ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (pid != own && comm.trim_end() == "kube-proxy").then_some(pid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kube-proxy (iptables mode) nat table with one service and one endpoint,
    /// beside a CNI's chain and the kubelet's.
    const NAT: &str = r#"# Generated by iptables-save
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-SEP-ABCDEF - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-XYZ - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -s 10.0.0.0/8 -m comment --comment "not ours: -j KUBE-SERVICES" -j MASQUERADE
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MASQUERADE --random-fully
-A KUBE-SEP-ABCDEF -s 10.1.0.5/32 -m comment --comment "default/web:http" -j KUBE-MARK-MASQ
-A KUBE-SEP-ABCDEF -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.1.0.5:8080
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-XYZ
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-XYZ -m comment --comment "default/web:http -> 10.1.0.5:8080" -j KUBE-SEP-ABCDEF
COMMIT
"#;

    #[test]
    fn the_arguments_of_a_saved_rule_split_as_iptables_restore_reads_them() {
        assert_eq!(
            split_args(r#"-A X -m comment --comment "a \"b\" -j Y" -j Z"#),
            vec![
                "-A",
                "X",
                "-m",
                "comment",
                "--comment",
                r#"a "b" -j Y"#,
                "-j",
                "Z"
            ]
        );
        assert_eq!(split_args(r#"--comment """#), vec!["--comment", ""]);
    }

    #[test]
    fn kube_proxys_chains_go_with_the_jumps_into_them_and_nothing_else() {
        let plan = iptables_cleanup("nat", NAT).expect("kube-proxy's chains");
        assert_eq!(
            plan.removed,
            vec![
                "KUBE-MARK-MASQ",
                "KUBE-NODEPORTS",
                "KUBE-POSTROUTING",
                "KUBE-PROXY-CANARY",
                "KUBE-SEP-ABCDEF",
                "KUBE-SERVICES",
                "KUBE-SVC-XYZ"
            ]
        );
        assert!(plan.kept.is_empty());
        let deletions: Vec<&str> = plan
            .flush_input
            .lines()
            .filter(|l| l.starts_with("-D"))
            .collect();
        assert_eq!(
            deletions,
            vec![
                r#"-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#,
                r#"-D OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#,
                r#"-D POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING"#,
            ],
            "a comment that mentions a chain is not a jump"
        );
        assert!(!plan.flush_input.contains("CNI-HOSTPORT-DNAT"));
        assert!(!plan.flush_input.contains("KUBE-KUBELET-CANARY"));
        assert!(plan.flush_input.starts_with("*nat\n") && plan.flush_input.ends_with("COMMIT\n"));
        assert!(plan.delete_input.contains("-X KUBE-SVC-XYZ\n"));
        assert!(!plan.delete_input.contains("CNI"));
    }

    #[test]
    fn a_chain_another_chain_still_uses_stays() {
        let nat = NAT.replace(
            "COMMIT\n",
            "-A CNI-HOSTPORT-DNAT -p tcp --dport 80 -j KUBE-MARK-MASQ\nCOMMIT\n",
        );
        let plan = iptables_cleanup("nat", &nat).unwrap();
        assert_eq!(plan.kept, vec!["KUBE-MARK-MASQ"]);
        assert!(!plan.removed.contains(&"KUBE-MARK-MASQ".to_string()));
        assert!(!plan.delete_input.contains("KUBE-MARK-MASQ"));
        // Its flush would break the CNI's rule too.
        assert!(!plan.flush_input.contains(":KUBE-MARK-MASQ"));
    }

    #[test]
    fn nothing_of_kube_proxys_means_nothing_to_do() {
        let filter = "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-FIREWALL - [0:0]\n\
                      -A INPUT -j KUBE-FIREWALL\nCOMMIT\n";
        assert_eq!(iptables_cleanup("filter", filter), None, "the kubelet's");
        assert!(is_kube_proxy_chain("nat", "KUBE-FIREWALL"));
        assert!(!is_kube_proxy_chain("filter", "KUBE-MARK-DROP"));
        assert!(
            !is_kube_proxy_chain("nat", "SVP-SERVICES"),
            "svcproxy's own"
        );
    }

    #[test]
    fn a_process_named_kube_proxy_is_found_by_its_comm() {
        let dir = tempfile::tempdir().unwrap();
        for (pid, comm) in [("1", "systemd\n"), ("42", "kube-proxy\n"), ("self", "x\n")] {
            std::fs::create_dir(dir.path().join(pid)).unwrap();
            std::fs::write(dir.path().join(pid).join("comm"), comm).unwrap();
        }
        assert_eq!(kube_proxy_running_in(dir.path()), Some(42));
        std::fs::write(dir.path().join("42/comm"), "kube-proxy-x\n").unwrap();
        assert_eq!(kube_proxy_running_in(dir.path()), None);
    }
}
