//! `--proxy-mode iptables`: svcproxy's chains ([`svcproxy_plan::iptables`]) applied with
//! `iptables-restore --noflush` / `ip6tables-restore --noflush`, one transaction per
//! family and sync, through whichever backend (`nf_tables` or `legacy`) the host's
//! `iptables` is.
//!
//! Entry points: [`BACKEND`], [`IptablesDataPlane`]. A full sync (the first, the first
//! after a failure, a periodic resync, a node-wide change) ensures the jumps from the
//! built-in chains (`-C`, then `-I` when missing), rewrites every svcproxy chain, and
//! deletes svcproxy chains nothing uses any more (found with `iptables-save` on the
//! first sync, from what it wrote since). A partial sync (upstream's
//! `MinimizeIPTablesRestore`) rewrites the fixed chains, which dispatch to every
//! service, and only the chains of the service ports that changed.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use svcproxy_core::model::{IpFamily, ServicePortName};
use svcproxy_plan::iptables::{self as ipt, is_ours, TableId, JUMPS};
use svcproxy_plan::{Intent, IntentDelta, PlanConfig};

use crate::backend::{
    ApplyReport, Backend, DataPlane, FailureCounter, FailureKind, NodeRequirements, SyncKind,
};
use crate::error::DataPlaneError;
use crate::node::required_sysctls;
use crate::sink::run_command;

/// The iptables mode in the registry, with upstream iptables mode's counters.
pub const BACKEND: Backend = Backend {
    mode: "iptables",
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
    new: |_| Box::new(IptablesDataPlane::new(IptablesCommands::default())),
};

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
}

/// The real `iptables` tools, optionally behind a prefix (`ip netns exec NAME`).
#[derive(Clone, Debug, Default)]
pub struct IptablesCommands {
    prefix: Vec<String>,
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
            &self.argv("iptables".into(), &["--version"]),
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

fn tool(family: IpFamily, suffix: &str) -> String {
    match family {
        IpFamily::V4 => format!("iptables{suffix}"),
        IpFamily::V6 => format!("ip6tables{suffix}"),
    }
}

impl IptablesRunner for IptablesCommands {
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), DataPlaneError> {
        let argv = self.argv(tool(family, "-restore"), &["-w", "--noflush"]);
        let out = run_command(&argv, Some(input), DEFAULT_RESTORE_TIMEOUT)?;
        if !out.stderr.is_empty() {
            tracing::warn!(stderr = %out.stderr, "{} succeeded with messages", argv.join(" "));
        }
        Ok(())
    }

    fn save(&mut self, family: IpFamily, table: TableId) -> Result<String, DataPlaneError> {
        let argv = self.argv(tool(family, "-save"), &["-t", table.name()]);
        let out = run_command(&argv, None, DEFAULT_RESTORE_TIMEOUT)?;
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
            &self.argv(tool(family, ""), &all),
            None,
            Duration::from_secs(60),
        ) {
            Ok(_) => Ok(Ok(())),
            Err(DataPlaneError::Rejected { stderr, .. }) => Ok(Err(stderr)),
            Err(e) => Err(e),
        }
    }
}

/// svcproxy's iptables chains, applied through an [`IptablesRunner`].
pub struct IptablesDataPlane<R = IptablesCommands> {
    runner: R,
    /// Per family: the chains the kernel holds from svcproxy's last successful
    /// restore, per table. `None`: unknown (first sync, or a restore failed).
    written: HashMap<IpFamily, HashMap<TableId, BTreeSet<String>>>,
}

impl<R: IptablesRunner> IptablesDataPlane<R> {
    pub fn new(runner: R) -> Self {
        IptablesDataPlane {
            runner,
            written: HashMap::new(),
        }
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }

    pub fn runner_mut(&mut self) -> &mut R {
        &mut self.runner
    }

    /// Puts every jump from the built-in chains in place (checked first: a restart
    /// must not add a second copy).
    fn ensure_jumps(&mut self, family: IpFamily) -> Result<(), DataPlaneError> {
        for j in JUMPS {
            let args = j.args();
            let mut check = vec![
                "-t".to_string(),
                j.table.name().into(),
                "-C".into(),
                j.from.into(),
            ];
            check.extend(args.iter().cloned());
            if self.runner.run(family, &check)?.is_ok() {
                continue;
            }
            let mut insert = vec![
                "-t".to_string(),
                j.table.name().into(),
                "-I".into(),
                j.from.into(),
            ];
            insert.extend(args);
            if let Err(stderr) = self.runner.run(family, &insert)? {
                return Err(DataPlaneError::Rejected {
                    command: format!("{} {}", tool(family, ""), insert.join(" ")),
                    status: "failed".into(),
                    stderr,
                });
            }
        }
        Ok(())
    }

    /// svcproxy's chains in the kernel now, per table (from `iptables-save`).
    fn chains_in_kernel(
        &mut self,
        family: IpFamily,
    ) -> Result<HashMap<TableId, BTreeSet<String>>, DataPlaneError> {
        let mut out = HashMap::new();
        for table in TableId::ALL {
            let text = self.runner.save(family, table)?;
            let chains: BTreeSet<String> = text
                .lines()
                .filter_map(|l| l.strip_prefix(':'))
                .filter_map(|l| l.split(' ').next())
                .filter(|c| is_ours(c))
                .map(str::to_string)
                .collect();
            out.insert(table, chains);
        }
        Ok(out)
    }

    fn sync_family(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        family: IpFamily,
        full: bool,
    ) -> Result<Option<(SyncKind, usize)>, DataPlaneError> {
        let Some(rules) = ipt::rules(intent, family) else {
            return Ok(None);
        };
        let fd = delta.family(family);
        let known = self.written.remove(&family);
        let (kind, before) = match known {
            Some(before) if !full && !fd.node_changed => (SyncKind::Partial, before),
            Some(before) => (SyncKind::Resync, before),
            None => {
                if let Some(variant) = self.runner.variant() {
                    tracing::info!(%variant, ?family, "iptables mode: the host's iptables uses {variant}");
                }
                (SyncKind::Recreate, self.chains_in_kernel(family)?)
            }
        };
        let now: HashMap<TableId, BTreeSet<String>> = TableId::ALL
            .into_iter()
            .map(|t| {
                (
                    t,
                    rules
                        .table(t)
                        .chains()
                        .map(|(n, _)| n.to_string())
                        .collect(),
                )
            })
            .collect();
        let stale: HashMap<TableId, Vec<String>> = TableId::ALL
            .into_iter()
            .map(|t| {
                let gone = before
                    .get(&t)
                    .map(|b| b.difference(&now[&t]).cloned().collect())
                    .unwrap_or_default();
                (t, gone)
            })
            .collect();
        let input = if kind == SyncKind::Partial {
            let changed: HashSet<&ServicePortName> = fd.services.iter().map(|c| &c.name).collect();
            rules.restore_changed(|name| changed.contains(name), &stale)
        } else {
            rules.restore(&stale)
        };
        if let Err(e) = self.runner.restore(family, &input) {
            return Err(if kind == SyncKind::Partial {
                DataPlaneError::Partial(Box::new(e))
            } else {
                e
            });
        }
        if kind != SyncKind::Partial {
            // After the restore, which creates the chains they jump to; on every full
            // sync, since someone may have flushed the built-in chains.
            self.ensure_jumps(family)?;
        }
        self.written.insert(family, now);
        Ok(Some((kind, input.len())))
    }
}

impl<R: IptablesRunner> DataPlane for IptablesDataPlane<R> {
    fn mode(&self) -> &'static str {
        BACKEND.mode
    }

    fn sync(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        full: bool,
    ) -> Result<ApplyReport, DataPlaneError> {
        let start = Instant::now();
        let mut kind = SyncKind::Partial;
        let mut bytes = 0;
        for family in IpFamily::BOTH {
            match self.sync_family(intent, delta, family, full) {
                Ok(Some((k, b))) => {
                    bytes += b;
                    // The report's kind is the fullest of the families'.
                    kind = match (kind, k) {
                        (SyncKind::Recreate, _) | (_, SyncKind::Recreate) => SyncKind::Recreate,
                        (SyncKind::Resync, _) | (_, SyncKind::Resync) => SyncKind::Resync,
                        _ => SyncKind::Partial,
                    };
                }
                Ok(None) => {}
                Err(e) => {
                    // Unknown kernel state: the next sync of every family is full.
                    self.written.clear();
                    return Err(e);
                }
            }
        }
        Ok(ApplyReport {
            kind,
            apply_duration: start.elapsed(),
            script_bytes: bytes,
        })
    }

    fn render(&self, intent: &Intent) -> String {
        ipt::render_full(intent)
    }

    fn cleanup(&mut self) -> Result<(), DataPlaneError> {
        self.written.clear();
        for family in IpFamily::BOTH {
            // No iptables for this family here: nothing of ours can exist either.
            let chains = match self.chains_in_kernel(family) {
                Ok(c) => c,
                Err(DataPlaneError::Spawn { .. }) => continue,
                Err(e) => return Err(e),
            };
            // The jumps first (a chain still referenced cannot be deleted); each
            // may have been added more than once by hand.
            for j in JUMPS {
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
            let mut input = String::new();
            for table in TableId::ALL {
                let ours = &chains[&table];
                input.push_str(&format!("*{}\n", table.name()));
                for c in ours {
                    input.push_str(&format!(":{c} - [0:0]\n"));
                }
                for c in ours {
                    input.push_str(&format!("-X {c}\n"));
                }
                input.push_str("COMMIT\n");
            }
            if chains.values().any(|c| !c.is_empty()) {
                self.runner.restore(family, &input)?;
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
