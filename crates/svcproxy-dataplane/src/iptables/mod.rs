//! `--proxy-mode iptables`: svcproxy's chains ([`svcproxy_plan::iptables`]) applied with
//! `iptables-restore --noflush` / `ip6tables-restore --noflush`, one transaction per
//! family and sync, through whichever backend (`nf_tables` or `legacy`) the host's
//! `iptables` is.
//!
//! Entry points: [`INFO`], [`IptablesDataPlane`]. A full sync (the first, the first
//! after a failure, a requested resync at most every [`FULL_SYNC_PERIOD`], a node-wide
//! change) reads the kernel with one
//! `iptables-save` per table, then in one restore rewrites every svcproxy chain, deletes
//! svcproxy chains nothing uses any more, and inserts the jumps from the built-in chains
//! that are missing. A partial sync (upstream's
//! `MinimizeIPTablesRestore`) rewrites the fixed chains, which dispatch to every
//! service, and only the chains of the service ports that changed.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use svcproxy_core::model::IpFamily;
use svcproxy_plan::iptables::{self as ipt, is_ours, TableId, JUMPS};
use svcproxy_plan::{Intent, IntentDelta, PlanConfig};

use crate::error::DataPlaneError;
use crate::kernel::command::{run_command, run_command_with_env, scratch_argv};
use crate::kernel::listing::{self, Compared};
use crate::kernel::sysctl::required_sysctls;
use crate::kernel::xtables::legacy_table_names;
use crate::seam::{
    ApplyReport, Comparison, ConfigSection, DataPlane, FailureCounter, FailureKind, KernelObjects,
    LocalhostDefault, ModeDefaults, ModeInfo, NodePortDefault, NodeRequirements, RuleCount,
    SyncKind, LARGE_CLUSTER_ENDPOINTS,
};

/// The `--proxy-mode` name.
pub const MODE: &str = "iptables";

/// The iptables mode in the registry, with upstream iptables mode's counters.
pub const INFO: ModeInfo = ModeInfo {
    mode: MODE,
    aliases: &[],
    gate: None,
    defaults: ModeDefaults {
        config_section: ConfigSection::Iptables,
        // Upstream's iptables mode: every local address, and 127.0.0.1
        // (`--iptables-localhost-nodeports`).
        nodeport_addresses: NodePortDefault::AllLocal,
        localhost_nodeports: LocalhostDefault::IptablesSetting,
    },
    flag_groups: &[],
    counts_rules: true,
    large_cluster_endpoints: Some(LARGE_CLUSTER_ENDPOINTS),
    objects: KernelObjects::IptablesChains,
    failure_counters: &[
        FailureCounter {
            kind: FailureKind::Sync,
            name: "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
            help: "Cumulative proxy iptables restore failures",
        },
        FailureCounter {
            kind: FailureKind::PartialSync,
            name: "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
            help: "Cumulative proxy iptables partial restore failures",
        },
    ],
    semantics: svcproxy_plan::iptables::SEMANTICS,
};

/// What one family's sync did.
struct FamilySync {
    kind: SyncKind,
    bytes: usize,
    in_tools: Duration,
    counts: Vec<RuleCount>,
}

/// The rules (`-A` and `-I` lines) a restore input writes, per table.
fn rules_written(input: &str) -> HashMap<&str, usize> {
    let mut out: HashMap<&str, usize> = HashMap::new();
    let mut table = "";
    for line in input.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.trim();
        } else if line.starts_with("-A ") || line.starts_with("-I ") {
            *out.entry(table).or_default() += 1;
        }
    }
    out
}

/// How one restore may take before it is killed (a restore is one transaction: a
/// killed one applied nothing).
pub const DEFAULT_RESTORE_TIMEOUT: Duration = Duration::from_secs(300);

/// The kernel side of iptables mode, as commands: real ones ([`IptablesCommands`]) or
/// a recorder in tests.
pub trait IptablesRunner: Send {
    /// `iptables-restore -w --noflush` (or `ip6tables-`) with `input`.
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), DataPlaneError>;
    /// `iptables-save -t TABLE`.
    fn save(&mut self, family: IpFamily, table: TableId) -> Result<String, DataPlaneError>;
    /// `iptables -w ARGS...`; `Ok(Err(stderr))` when the command ran and failed (a
    /// `-C` that did not find its rule).
    fn run(
        &mut self,
        family: IpFamily,
        args: &[String],
    ) -> Result<Result<(), String>, DataPlaneError>;
    /// Which backend the tools drive (`nf_tables`, `legacy`), for the log.
    fn variant(&mut self) -> Option<String> {
        None
    }

    /// The kernel says there is no iptables table at all in this family (so no
    /// chain of ours either), without running a tool; `false` when it cannot
    /// tell.
    fn no_tables(&mut self, family: IpFamily) -> bool {
        let _ = family;
        false
    }

    /// `input` restored into a scratch network namespace, created and gone with
    /// this call, and saved back (`iptables-save`): the plan in the kernel's own
    /// canonical form, to compare with the real tables.
    fn scratch_save(&mut self, family: IpFamily, input: &str) -> Result<String, DataPlaneError> {
        let _ = (family, input);
        Err(DataPlaneError::Io {
            command: "unshare --net iptables-restore".into(),
            source: std::io::Error::other("this iptables stand-in has no scratch namespace"),
        })
    }
}

/// The real `iptables` tools, optionally behind a prefix (`ip netns exec NAME`).
#[derive(Clone, Debug, Default)]
pub struct IptablesCommands {
    prefix: Vec<String>,
    /// Run `iptables-legacy*` rather than whatever `iptables*` points to (benchmarks).
    legacy: bool,
}

impl IptablesCommands {
    /// The tools run as `PREFIX... iptables ...` (e.g. inside a network namespace).
    pub fn with_prefix<I, T>(prefix: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        IptablesCommands {
            prefix: prefix.into_iter().map(Into::into).collect(),
            legacy: false,
        }
    }

    /// The `iptables-legacy` tools explicitly (the default is whichever backend the
    /// plain names point to, as the node's other components use).
    pub fn legacy(mut self) -> Self {
        self.legacy = true;
        self
    }

    fn tool(&self, family: IpFamily, suffix: &str) -> String {
        let legacy = if self.legacy { "-legacy" } else { "" };
        match family {
            IpFamily::V4 => format!("iptables{legacy}{suffix}"),
            IpFamily::V6 => format!("ip6tables{legacy}{suffix}"),
        }
    }

    fn argv(&self, tool: String, args: &[&str]) -> Vec<String> {
        let mut v = self.prefix.clone();
        v.push(tool);
        v.extend(args.iter().map(|a| a.to_string()));
        v
    }

    /// Which backend the host's `iptables` uses (`nf_tables` or `legacy`), from
    /// `iptables --version`.
    pub fn variant(&self) -> Result<String, DataPlaneError> {
        let out = run_command(
            &self.argv(self.tool(IpFamily::V4, ""), &["--version"]),
            None,
            Duration::from_secs(10),
        )?;
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(
            match (text.contains("nf_tables"), text.contains("legacy")) {
                (true, _) => "nf_tables".to_string(),
                (_, true) => "legacy".to_string(),
                _ => text.trim().to_string(),
            },
        )
    }
}

/// The glibc tunable the restore runs with: no malloc fastbins. `iptables-restore`
/// frees large blocks between small allocations for every rule it parses, and each
/// such free consolidates the fastbins: a tenth of a 10k-service full restore's time
/// (`malloc_consolidate`, `unlink_chunk` in a profile). Without fastbins (tcache
/// still serves the small sizes) that work is gone; measured 1.08-1.15x faster at
/// 10k x 10. Added to whatever `GLIBC_TUNABLES` svcproxy itself was given.
const RESTORE_TUNABLE: &str = "glibc.malloc.mxfast=0";

fn restore_env() -> Vec<(&'static str, String)> {
    let current = std::env::var("GLIBC_TUNABLES").ok();
    vec![("GLIBC_TUNABLES", restore_tunables(current.as_deref()))]
}

/// `GLIBC_TUNABLES` for the restore, given svcproxy's own (an operator's choice of
/// `mxfast` wins).
fn restore_tunables(current: Option<&str>) -> String {
    match current {
        Some(v) if v.contains("glibc.malloc.mxfast") => v.to_string(),
        Some(v) if !v.is_empty() => format!("{v}:{RESTORE_TUNABLE}"),
        _ => RESTORE_TUNABLE.to_string(),
    }
}

impl IptablesRunner for IptablesCommands {
    fn no_tables(&mut self, family: IpFamily) -> bool {
        // Only in this process's own namespace (no `ip netns exec` prefix), and
        // whichever backend the tools drive: no legacy table and no nf_tables
        // table of theirs (asked over netlink), mangle included (the canary).
        self.prefix.is_empty()
            && legacy_table_names(family).is_some_and(|names| names.trim().is_empty())
            && TableId::ALL
                .iter()
                .map(|t| t.name())
                .chain(["mangle"])
                .all(|t| {
                    matches!(
                        crate::kernel::nft::table_state(None, family, t),
                        Ok(crate::kernel::nft::TableState::Missing)
                    )
                })
    }

    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), DataPlaneError> {
        let argv = self.argv(self.tool(family, "-restore"), &["-w", "--noflush"]);
        let out =
            run_command_with_env(&argv, &restore_env(), Some(input), DEFAULT_RESTORE_TIMEOUT)?;
        if !out.stderr.is_empty() {
            tracing::warn!(stderr = %out.stderr, "{} succeeded with messages", argv.join(" "));
        }
        Ok(())
    }

    fn save(&mut self, family: IpFamily, table: TableId) -> Result<String, DataPlaneError> {
        let argv = self.argv(self.tool(family, "-save"), &["-t", table.name()]);
        let out = run_command(&argv, None, DEFAULT_RESTORE_TIMEOUT)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn scratch_save(&mut self, family: IpFamily, input: &str) -> Result<String, DataPlaneError> {
        // No prefix: any new namespace starts empty. The tools are `$0` and `$1`.
        let argv = scratch_argv(
            r#""$0" -w && "$1""#,
            &[self.tool(family, "-restore"), self.tool(family, "-save")],
        );
        let out = run_command(&argv, Some(input), DEFAULT_RESTORE_TIMEOUT)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn variant(&mut self) -> Option<String> {
        match IptablesCommands::variant(self) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!("cannot tell which backend iptables uses: {e}");
                None
            }
        }
    }

    fn run(
        &mut self,
        family: IpFamily,
        args: &[String],
    ) -> Result<Result<(), String>, DataPlaneError> {
        let mut all = vec!["-w"];
        all.extend(args.iter().map(String::as_str));
        match run_command(
            &self.argv(self.tool(family, ""), &all),
            None,
            Duration::from_secs(60),
        ) {
            Ok(_) => Ok(Ok(())),
            Err(DataPlaneError::Rejected { stderr, .. }) => Ok(Err(stderr)),
            Err(e) => Err(e),
        }
    }
}

/// What `iptables-save` shows of svcproxy in one family.
#[derive(Default)]
struct KernelState {
    chains: HashMap<TableId, BTreeSet<String>>,
    missing_jumps: Vec<&'static svcproxy_plan::iptables::Jump>,
}

/// svcproxy's iptables chains, applied through an [`IptablesRunner`].
pub struct IptablesDataPlane<R = IptablesCommands> {
    runner: R,
    /// Per family: a digest of each fixed chain's rules as svcproxy's last
    /// successful restore left them (a partial sync rewrites those that differ).
    /// Absent: unknown (first sync, or a restore failed), so the next is full.
    written: HashMap<IpFamily, HashMap<(TableId, String), u64>>,
    /// Per family: the translations of the service ports, reused while their intent
    /// does not change (cleared for a full sync).
    translations: HashMap<IpFamily, ipt::TranslationCache>,
    /// When the last full restore of every family succeeded.
    last_full: Option<Instant>,
}

/// How often a requested full sync (the runner's `--sync-period` resync) really
/// rewrites everything; in between it is partial. Upstream's iptables mode does the
/// same (a full restore of a large ruleset takes seconds to minutes).
pub const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

impl<R: IptablesRunner> IptablesDataPlane<R> {
    pub fn new(runner: R) -> Self {
        IptablesDataPlane {
            runner,
            written: HashMap::new(),
            translations: HashMap::new(),
            last_full: None,
        }
    }

    /// The families svcproxy has written whose `mangle` canary is gone: the tables
    /// were flushed behind its back (asked of `mangle` only, as upstream does: it is
    /// small, so cheap to list with either backend).
    fn canary_missing(&mut self) -> Result<Vec<IpFamily>, DataPlaneError> {
        let mut families: Vec<IpFamily> = self.written.keys().copied().collect();
        families.sort();
        self.canary_missing_in(families)
    }

    /// Those of `families` whose `mangle` canary is gone.
    fn canary_missing_in(
        &mut self,
        families: Vec<IpFamily>,
    ) -> Result<Vec<IpFamily>, DataPlaneError> {
        let args: Vec<String> = ["-t", "mangle", "-S", ipt::CANARY]
            .map(String::from)
            .to_vec();
        let mut missing = Vec::new();
        for family in families {
            if self.runner.run(family, &args)?.is_err() {
                missing.push(family);
            }
        }
        Ok(missing)
    }

    /// svcproxy's chains in the kernel now, per table, and the jumps from the built-in
    /// chains that are missing (from one `iptables-save` per table: `iptables -C` per
    /// jump would fetch the whole ruleset each time).
    /// A full sync's restore of `family`, after a look at the kernel (someone may
    /// have flushed the built-in chains, or left chains of ours behind): the
    /// chains of ours no longer wanted, and the restore's input. The look's time
    /// is added to `in_tools`.
    #[allow(clippy::type_complexity)]
    fn full_restore(
        &mut self,
        family: IpFamily,
        rules: &ipt::FamilyRules,
        kind: SyncKind,
        in_tools: &mut Duration,
    ) -> Result<(HashMap<TableId, Vec<String>>, String), DataPlaneError> {
        if kind == SyncKind::Recreate {
            if let Some(variant) = self.runner.variant() {
                tracing::info!(%variant, ?family, "iptables mode: the host's iptables uses {variant}");
            }
        }
        let t = Instant::now();
        let state = self.kernel_state(family)?;
        *in_tools += t.elapsed();
        let stale: HashMap<TableId, Vec<String>> = TableId::ALL
            .into_iter()
            .map(|t| {
                let now: HashSet<&str> = rules.table(t).chains().map(|(n, _)| n).collect();
                let gone = state.chains.get(&t).map_or_else(Vec::new, |b| {
                    b.iter()
                        .filter(|c| !now.contains(c.as_str()))
                        .cloned()
                        .collect()
                });
                (t, gone)
            })
            .collect();
        let input = rules.restore_with_jumps(&stale, &state.missing_jumps);
        Ok((stale, input))
    }

    fn kernel_state(&mut self, family: IpFamily) -> Result<KernelState, DataPlaneError> {
        let mut state = KernelState::default();
        for table in TableId::ALL {
            let text = self.runner.save(family, table)?;
            let chains: BTreeSet<String> = text
                .lines()
                .filter_map(|l| l.strip_prefix(':'))
                .filter_map(|l| l.split(' ').next())
                .filter(|c| is_ours(c))
                .map(str::to_string)
                .collect();
            state.chains.insert(table, chains);
            let lines: HashSet<&str> = text.lines().collect();
            for j in JUMPS.iter().filter(|j| j.table == table) {
                if !lines.contains(j.saved_line().as_str()) {
                    state.missing_jumps.push(j);
                }
            }
        }
        Ok(state)
    }

    fn sync_family(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        family: IpFamily,
        full: bool,
    ) -> Result<Option<FamilySync>, DataPlaneError> {
        let partial =
            self.written.contains_key(&family) && !full && !delta.family(family).node_changed;
        let cache = self.translations.entry(family).or_default();
        if !partial {
            // A full restore writes every chain: translate everything.
            cache.clear();
        }
        let Some(rules) = cache.rules(intent, family) else {
            return Ok(None);
        };
        // Time in the tools (saves and the restore), apart from translation.
        let mut in_tools = Duration::ZERO;
        let known = self.written.remove(&family);
        let fixed_now = fixed_digests(&rules);
        let (kind, stale, input) = match known {
            Some(before) if partial => {
                // The chains the service ports dropped, and the fixed chains (dispatch
                // buckets) no longer used; the fixed chains whose rules changed.
                let mut stale = rules.replaced.clone();
                for (t, name) in before.keys().filter(|k| !fixed_now.contains_key(*k)) {
                    stale.entry(*t).or_default().push(name.clone());
                }
                let changed = |t: TableId, name: &str| {
                    let key = (t, name.to_string());
                    before.get(&key) != fixed_now.get(&key)
                };
                let nothing = !rules.translated.iter().any(|t| *t)
                    && stale.values().all(Vec::is_empty)
                    && fixed_now.keys().all(|(t, n)| !changed(*t, n));
                if nothing {
                    // Nothing to write in this family: no restore at all.
                    self.written.insert(family, fixed_now);
                    return Ok(Some(FamilySync {
                        kind: SyncKind::Partial,
                        bytes: 0,
                        in_tools: Duration::ZERO,
                        counts: rule_counts(&rules, &HashMap::new()),
                    }));
                }
                let input = rules.restore_changed(|_| true, changed, &stale);
                (SyncKind::Partial, stale, input)
            }
            known => {
                let kind = if known.is_some() {
                    SyncKind::Resync
                } else {
                    SyncKind::Recreate
                };
                let (stale, input) = self.full_restore(family, &rules, kind, &mut in_tools)?;
                (kind, stale, input)
            }
        };
        let t = Instant::now();
        let restored = self.runner.restore(family, &input);
        in_tools += t.elapsed();
        // The chains that went away were flushed by that restore: nothing jumps to
        // them any more, and a second one deletes them.
        let deletion = ipt::stale_deletion(&stale);
        let restored = restored.and_then(|()| match &deletion {
            Some(input) => {
                let t = Instant::now();
                let done = self.runner.restore(family, input);
                in_tools += t.elapsed();
                done
            }
            None => Ok(()),
        });
        if let Err(e) = restored {
            return Err(if kind == SyncKind::Partial {
                DataPlaneError::Partial(Box::new(e))
            } else {
                e
            });
        }
        self.written.insert(family, fixed_now);
        let bytes = input.len() + deletion.map_or(0, |d| d.len());
        Ok(Some(FamilySync {
            kind,
            bytes,
            in_tools,
            counts: rule_counts(&rules, &rules_written(&input)),
        }))
    }
}

/// The rule gauges of one family: every rule in svcproxy's chains per table, and
/// those a restore wrote (`written`, per table name).
fn rule_counts(rules: &ipt::FamilyRules, written: &HashMap<&str, usize>) -> Vec<RuleCount> {
    TableId::ALL
        .into_iter()
        .map(|t| RuleCount {
            family: rules.family,
            table: t.name(),
            total: rules.total_rules(t),
            written: written.get(t.name()).copied().unwrap_or(0),
        })
        .collect()
}

/// The digests of a family's fixed chains (what a restore of `rules` leaves).
fn fixed_digests(rules: &ipt::FamilyRules) -> HashMap<(TableId, String), u64> {
    TableId::ALL
        .into_iter()
        .flat_map(|t| {
            rules
                .fixed_chains(t)
                .map(move |(name, r)| ((t, name.to_string()), digest(r)))
        })
        .collect()
}

/// The chain a sealed family carries whatever its seal: in `nat`, among svcproxy's
/// own chains, so that any full sync (which deletes chains of ours it does not
/// write) and any cleanup removes a seal nobody adopted.
const SEALED_CHAIN: &str = "SVCPROXY-SEALED";

/// Whether `chain` is a seal's.
fn is_seal(chain: &str) -> bool {
    chain == SEALED_CHAIN || chain.starts_with("SVCPROXY-SEAL-")
}

/// The chain naming a family's seal ([`DataPlane::seal`]): within iptables' 28
/// characters, so the seal's first 12 digits.
fn seal_chain(seal: &str) -> String {
    format!("SVCPROXY-SEAL-{}", &seal[..seal.len().min(12)])
}

/// A digest of a chain's rules (to tell whether a fixed chain must be rewritten).
fn digest(rules: &[String]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    rules.hash(&mut h);
    h.finish()
}

impl<R: IptablesRunner> DataPlane for IptablesDataPlane<R> {
    fn mode(&self) -> &'static str {
        MODE
    }

    fn compare(&mut self, intent: &Intent) -> Result<Comparison, DataPlaneError> {
        let mut out = Comparison::default();
        let jumps: Vec<&ipt::Jump> = JUMPS.iter().collect();
        let mut programmed = Vec::new();
        for family in IpFamily::BOTH {
            let Some(rules) = ipt::rules(intent, family) else {
                continue;
            };
            programmed.push(family);
            let what = ipt::restore_command(family).trim_end_matches("-restore");
            let input = rules.restore_with_jumps(&HashMap::new(), &jumps);
            // The plan in the kernel's form, or else in the planner's (counts only).
            let (planned, how) = match self.runner.scratch_save(family, &input) {
                Ok(saved) => (saved, Compared::Rules),
                Err(e) => {
                    out.counted_only.get_or_insert(format!(
                        "the plan could not be listed in the kernel's form (restoring it into a scratch network namespace failed: {e})"
                    ));
                    (input, Compared::Counts)
                }
            };
            let mut expected = listing::iptables_listing(&planned, is_ours);
            // The mangle canary is looked at below, as the drift check does.
            expected.chains.retain(|k, _| !k.starts_with("mangle/"));
            let mut saved = String::new();
            for table in TableId::ALL {
                saved.push_str(&self.runner.save(family, table)?);
            }
            let live = listing::iptables_listing(&saved, is_ours);
            out.differences
                .extend(listing::differences(what, &expected, &live, how));
            for (chain, rules) in &live.ahead_of_jumps {
                let (table, builtin) = chain.split_once('/').unwrap_or(("", chain));
                out.ahead.extend(rules.iter().map(|r| {
                    format!("{what}: `-t {table} -A {builtin} {r}` runs before svcproxy's jump in {chain}")
                }));
            }
        }
        for family in self.canary_missing_in(programmed)? {
            out.differences.push(format!(
                "{}: the mangle canary chain is missing (the tables were flushed)",
                ipt::restore_command(family).trim_end_matches("-restore")
            ));
        }
        Ok(out)
    }

    fn sync(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        full: bool,
    ) -> Result<ApplyReport, DataPlaneError> {
        let start = Instant::now();
        // A requested resync within the hour is partial, unless the tables were
        // flushed behind our back (the canary is gone): then the jumps from the
        // built-in chains are gone too, which only a full restore puts back.
        let full = full
            && (self
                .last_full
                .is_none_or(|t| t.elapsed() >= FULL_SYNC_PERIOD)
                || match self.canary_missing() {
                    Ok(missing) => !missing.is_empty(),
                    // Cannot ask: the hourly full sync and failed restores still repair.
                    Err(e) => {
                        tracing::warn!("iptables mode: cannot check the canary: {e}");
                        false
                    }
                });
        let mut kind = SyncKind::Partial;
        let mut bytes = 0;
        let mut in_tools = Duration::ZERO;
        let mut family_apply = Vec::new();
        let mut rules = Vec::new();
        for family in IpFamily::BOTH {
            match self.sync_family(intent, delta, family, full) {
                Ok(Some(FamilySync {
                    kind: k,
                    bytes: b,
                    in_tools: t,
                    counts,
                })) => {
                    bytes += b;
                    in_tools += t;
                    family_apply.push((family, t));
                    rules.extend(counts);
                    // The report's kind is the fullest of the families'.
                    kind = match (kind, k) {
                        (SyncKind::Recreate, _) | (_, SyncKind::Recreate) => SyncKind::Recreate,
                        (SyncKind::Resync, _) | (_, SyncKind::Resync) => SyncKind::Resync,
                        _ => SyncKind::Partial,
                    };
                }
                Ok(None) => family_apply.push((family, Duration::ZERO)),
                Err(e) => {
                    // Unknown kernel state: the next sync of every family is full.
                    self.written.clear();
                    return Err(e);
                }
            }
        }
        if kind.is_full() {
            self.last_full = Some(start);
        }
        Ok(ApplyReport {
            kind,
            apply_duration: in_tools,
            family_apply,
            script_bytes: bytes,
            rules,
            stale_flows: Vec::new(),
        })
    }

    fn render(&self, intent: &Intent) -> String {
        ipt::render_full(intent)
    }

    fn seal(&mut self, seal: &str) -> Result<bool, DataPlaneError> {
        let mut families: Vec<IpFamily> = self.written.keys().copied().collect();
        families.sort();
        if families.is_empty() {
            return Ok(false);
        }
        let input = format!(
            "*nat\n:{SEALED_CHAIN} - [0:0]\n:{} - [0:0]\nCOMMIT\n",
            seal_chain(seal)
        );
        for family in families {
            self.runner.restore(family, &input)?;
        }
        Ok(true)
    }

    fn sealed(&mut self) -> Result<bool, DataPlaneError> {
        let args: Vec<String> = ["-t", "nat", "-S", SEALED_CHAIN].map(String::from).to_vec();
        for family in IpFamily::BOTH {
            match self.runner.run(family, &args) {
                Ok(Ok(())) => return Ok(true),
                Ok(Err(_)) => {}
                // No tools for this family here: nothing of ours either.
                Err(DataPlaneError::Spawn { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    fn adopt(
        &mut self,
        intent: &Intent,
        _delta: &IntentDelta,
        seal: &str,
    ) -> Result<bool, DataPlaneError> {
        // Every family the intent programs carries the seal (a first sync writes
        // nothing in the others), and holds what a full restore would leave: the
        // canary, every jump from the built-in chains, exactly the plan's chains.
        let chain = seal_chain(seal);
        let mut adopted = HashMap::new();
        for family in IpFamily::BOTH {
            // Translated as a full sync would, kept for the next partial one (a
            // full sync clears it anyway, should this not adopt).
            let cache = self.translations.entry(family).or_default();
            cache.clear();
            let Some(rules) = cache.rules(intent, family) else {
                continue;
            };
            let state = self.kernel_state(family)?;
            let nat = state.chains.get(&TableId::Nat);
            if !nat.is_some_and(|c| c.contains(&chain)) || !state.missing_jumps.is_empty() {
                return Ok(false);
            }
            let same_chains = TableId::ALL.into_iter().all(|t| {
                let planned: BTreeSet<&str> = rules.table(t).chains().map(|(n, _)| n).collect();
                let held: BTreeSet<&str> = state
                    .chains
                    .get(&t)
                    .into_iter()
                    .flatten()
                    .map(String::as_str)
                    .filter(|c| !is_seal(c))
                    .collect();
                planned == held
            });
            if !same_chains || !self.canary_missing_in(vec![family])?.is_empty() {
                return Ok(false);
            }
            adopted.insert(family, fixed_digests(&rules));
        }
        if adopted.is_empty() {
            return Ok(false);
        }
        // The kernel holds what a full restore of the intent writes (the layout is
        // the intent's alone): the state of one, and the seal goes.
        let deletion = format!("*nat\n-X {chain}\n-X {SEALED_CHAIN}\nCOMMIT\n");
        for family in adopted.keys() {
            self.runner.restore(*family, &deletion)?;
        }
        self.written = adopted;
        self.last_full = Some(Instant::now());
        Ok(true)
    }

    fn drift(&mut self) -> Result<Option<String>, DataPlaneError> {
        let missing = self.canary_missing()?;
        if missing.is_empty() {
            return Ok(None);
        }
        // Unknown kernel state: the next sync of every family is full.
        self.written.clear();
        self.last_full = None;
        let what: Vec<String> = missing
            .iter()
            .map(|f| {
                let tool = match f {
                    IpFamily::V4 => "iptables",
                    IpFamily::V6 => "ip6tables",
                };
                format!(
                    "{tool} chain mangle {} is gone (tables flushed?)",
                    ipt::CANARY
                )
            })
            .collect();
        Ok(Some(what.join("; ")))
    }

    fn cleanup(&mut self) -> Result<(), DataPlaneError> {
        self.written.clear();
        self.last_full = None;
        for family in IpFamily::BOTH {
            if self.runner.no_tables(family) {
                continue;
            }
            // No iptables for this family here: nothing of ours can exist either.
            let chains = match self.kernel_state(family) {
                Ok(state) => state.chains,
                Err(DataPlaneError::Spawn { .. }) => continue,
                Err(e) => return Err(e),
            };
            // No chain of ours, so no jump to one either (a jump needs its target):
            // only the canary may be left (the mode switch runs this at every start).
            let none = chains.values().all(BTreeSet::is_empty);
            // The jumps first (a chain still referenced cannot be deleted); each
            // may have been added more than once by hand.
            for j in JUMPS.iter().filter(|_| !none) {
                let mut del = vec![
                    "-t".to_string(),
                    j.table.name().into(),
                    "-D".into(),
                    j.from.into(),
                ];
                del.extend(j.args());
                for _ in 0..8 {
                    if self.runner.run(family, &del)?.is_err() {
                        break;
                    }
                }
            }
            // The mangle canary (nothing jumps to it); absent is fine.
            let canary: Vec<String> = ["-t", "mangle", "-X", ipt::CANARY]
                .map(String::from)
                .to_vec();
            let _ = self.runner.run(family, &canary)?;
            // Flush them all, then delete them all: two restores, each naming every
            // chain once in descending order (linear in `iptables-nft`).
            let all: HashMap<TableId, Vec<String>> = chains
                .into_iter()
                .map(|(t, c)| (t, c.into_iter().collect()))
                .collect();
            if let (Some(flush), Some(delete)) = (ipt::flush(&all), ipt::stale_deletion(&all)) {
                self.runner.restore(family, &flush)?;
                self.runner.restore(family, &delete)?;
            }
        }
        Ok(())
    }

    fn node_requirements(&self, cfg: &PlanConfig) -> NodeRequirements {
        NodeRequirements {
            sysctls: required_sysctls(cfg),
            // The matches and targets load with the tools on demand.
            modules: Vec::new(),
        }
    }
}

impl Default for IptablesDataPlane<IptablesCommands> {
    fn default() -> Self {
        IptablesDataPlane::new(IptablesCommands::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_restore_runs_without_malloc_fastbins_unless_told_otherwise() {
        assert_eq!(restore_tunables(None), "glibc.malloc.mxfast=0");
        assert_eq!(restore_tunables(Some("")), "glibc.malloc.mxfast=0");
        assert_eq!(
            restore_tunables(Some("glibc.malloc.arena_max=2")),
            "glibc.malloc.arena_max=2:glibc.malloc.mxfast=0"
        );
        assert_eq!(
            restore_tunables(Some("glibc.malloc.mxfast=64")),
            "glibc.malloc.mxfast=64"
        );
    }
}
