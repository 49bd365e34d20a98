//! Where scripts go: the real `nft`, or a recorder for tests.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::time::Duration;

use std::collections::BTreeMap;
use std::path::PathBuf;

use svcproxy_core::model::IpFamily;

use super::netlink::{Batch, NetlinkWriter};
use super::table::{chain_exists, chain_use, table_state, TableState};
use crate::error::{bounded_text, DataPlaneError, STDERR_LIMIT};
use crate::kernel::command::{run_command, scratch_argv};

/// Applies `nft -f` scripts, each as one atomic transaction, and says what the
/// kernel holds of a table (the drift check).
pub trait ScriptSink {
    /// Applies `script`. On error nothing of it is in force (`nft` applies a whole
    /// file or nothing).
    fn apply(&mut self, script: &str) -> Result<(), DataPlaneError>;

    /// Applies a plan whose every statement is typed: `batch`, or `script`, the
    /// same as text. A sink that cannot write the batch itself applies the script.
    fn apply_batch(&mut self, batch: Batch, script: &str) -> Result<(), DataPlaneError> {
        let _ = batch;
        self.apply(script)
    }

    /// Whether [`ScriptSink::apply_batch`] writes the batch itself (and so needs
    /// no script).
    fn writes_typed(&self) -> bool {
        false
    }

    /// Table `name` of `family` as the kernel holds it now.
    fn table_state(&mut self, family: IpFamily, name: &str) -> Result<TableState, DataPlaneError>;

    /// Whether chain `chain` of table `table` of `family` exists (a missing table:
    /// no). A sink that cannot ask says so with an error.
    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<bool, DataPlaneError> {
        Err(DataPlaneError::Io {
            command: format!("netlink NFT_MSG_GETCHAIN {family} {table} {chain}"),
            source: io::Error::other("this nft stand-in cannot ask for a chain"),
        })
    }

    /// Chain `chain` of table `table` of `family`'s use count (its rules and the
    /// references to it; `None`: no such chain). A sink that cannot ask says so
    /// with an error.
    fn chain_use(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<Option<u32>, DataPlaneError> {
        Err(DataPlaneError::Io {
            command: format!("netlink NFT_MSG_GETCHAIN {family} {table} {chain}"),
            source: io::Error::other("this nft stand-in cannot ask for a chain"),
        })
    }

    /// `nft ARGS`'s output (a listing: `-s list table ip svcproxy`, `-j list
    /// chains`); `None` when what it lists does not exist.
    fn list(&mut self, args: &[&str]) -> Result<Option<String>, DataPlaneError> {
        Err(DataPlaneError::Io {
            command: format!("nft {}", args.join(" ")),
            source: io::Error::other("this nft stand-in cannot list"),
        })
    }

    /// `script` loaded into a scratch network namespace, created and gone with
    /// this call, and listed back by `nft -s list ruleset`: the plan in the
    /// kernel's own canonical form, to compare with a listing of the real tables.
    fn scratch_listing(&mut self, script: &str) -> Result<String, DataPlaneError> {
        let _ = script;
        Err(DataPlaneError::Io {
            command: "unshare --net nft".into(),
            source: io::Error::other("this nft stand-in has no scratch namespace"),
        })
    }
}

impl<S: ScriptSink + ?Sized> ScriptSink for &mut S {
    fn apply(&mut self, script: &str) -> Result<(), DataPlaneError> {
        (**self).apply(script)
    }

    fn apply_batch(&mut self, batch: Batch, script: &str) -> Result<(), DataPlaneError> {
        (**self).apply_batch(batch, script)
    }

    fn writes_typed(&self) -> bool {
        (**self).writes_typed()
    }

    fn table_state(&mut self, family: IpFamily, name: &str) -> Result<TableState, DataPlaneError> {
        (**self).table_state(family, name)
    }

    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<bool, DataPlaneError> {
        (**self).chain_exists(family, table, chain)
    }

    fn chain_use(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<Option<u32>, DataPlaneError> {
        (**self).chain_use(family, table, chain)
    }

    fn list(&mut self, args: &[&str]) -> Result<Option<String>, DataPlaneError> {
        (**self).list(args)
    }

    fn scratch_listing(&mut self, script: &str) -> Result<String, DataPlaneError> {
        (**self).scratch_listing(script)
    }
}

impl<S: ScriptSink + ?Sized> ScriptSink for Box<S> {
    fn apply(&mut self, script: &str) -> Result<(), DataPlaneError> {
        (**self).apply(script)
    }

    fn apply_batch(&mut self, batch: Batch, script: &str) -> Result<(), DataPlaneError> {
        (**self).apply_batch(batch, script)
    }

    fn writes_typed(&self) -> bool {
        (**self).writes_typed()
    }

    fn table_state(&mut self, family: IpFamily, name: &str) -> Result<TableState, DataPlaneError> {
        (**self).table_state(family, name)
    }

    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<bool, DataPlaneError> {
        (**self).chain_exists(family, table, chain)
    }

    fn chain_use(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<Option<u32>, DataPlaneError> {
        (**self).chain_use(family, table, chain)
    }

    fn list(&mut self, args: &[&str]) -> Result<Option<String>, DataPlaneError> {
        (**self).list(args)
    }

    fn scratch_listing(&mut self, script: &str) -> Result<String, DataPlaneError> {
        (**self).scratch_listing(script)
    }
}

/// The real `nft`: runs `ARGV... -f -` with the script on stdin.
///
/// `ARGV` is the `nft` binary (default `nft`, looked up in `PATH`), optionally behind
/// a prefix: `["ip", "netns", "exec", "NAME", "nft"]` applies inside a network
/// namespace, in which case [`NftCommand::in_netns`] names that namespace for the
/// tables' drift check (over netlink, not through `ARGV`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftCommand {
    argv: Vec<String>,
    timeout: Duration,
    netns: Option<PathBuf>,
    /// The netlink writer and its socket, kept from one sync to the next.
    netlink: WriterSlot,
}

/// A command's netlink writer: not part of what the command is (a clone starts
/// without a socket, and any two compare equal).
#[derive(Default)]
struct WriterSlot(NetlinkWriter);

impl Clone for WriterSlot {
    fn clone(&self) -> Self {
        WriterSlot::default()
    }
}

impl PartialEq for WriterSlot {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for WriterSlot {}

impl fmt::Debug for WriterSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// How long one `nft -f` may take before it is killed. A full load of 10k services
/// with 10 endpoints each takes 7-9 s on a 2-core machine; a hung nft must not stall
/// syncs forever (the runner retries with backoff).
pub const DEFAULT_NFT_TIMEOUT: Duration = Duration::from_secs(300);

impl Default for NftCommand {
    fn default() -> Self {
        NftCommand::new("nft")
    }
}

impl NftCommand {
    /// `ask` about chain `chain` over netlink (`NFT_MSG_GETCHAIN`), only where
    /// `nft` itself writes (see `writes_typed`).
    fn ask_chain<T>(
        &self,
        family: IpFamily,
        table: &str,
        chain: &str,
        ask: fn(
            Option<&std::path::Path>,
            IpFamily,
            &str,
            &str,
        ) -> Result<T, crate::kernel::netfilter::NetlinkError>,
    ) -> Result<T, DataPlaneError> {
        let command = format!("netlink NFT_MSG_GETCHAIN {family} {table} {chain}");
        if !self.writes_typed() {
            return Err(DataPlaneError::Io {
                command,
                source: io::Error::other("the namespace nft writes to is not named"),
            });
        }
        ask(self.netns.as_deref(), family, table, chain).map_err(|e| DataPlaneError::Io {
            command,
            source: io::Error::other(e.to_string()),
        })
    }

    /// The `nft` binary at `program` (a path, or a name looked up in `PATH`).
    pub fn new(program: impl Into<String>) -> Self {
        NftCommand {
            argv: vec![program.into()],
            timeout: DEFAULT_NFT_TIMEOUT,
            netns: None,
            netlink: WriterSlot::default(),
        }
    }

    /// A command line that ends in `nft`, e.g. `ip netns exec NAME nft`; `-f -` is
    /// appended. An empty `argv` means plain `nft`.
    pub fn from_argv<I, T>(argv: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        let argv: Vec<String> = argv.into_iter().map(Into::into).collect();
        if argv.is_empty() {
            NftCommand::default()
        } else {
            NftCommand {
                argv,
                timeout: DEFAULT_NFT_TIMEOUT,
                netns: None,
                netlink: WriterSlot::default(),
            }
        }
    }

    /// The tables' state is read in the network namespace `path` names (e.g.
    /// `/run/netns/NAME`, where a prefix runs `nft`) rather than in the caller's.
    pub fn in_netns(mut self, path: impl Into<PathBuf>) -> Self {
        self.netns = Some(path.into());
        self
    }

    /// The last batch sent over netlink: its bytes, its messages, and the time
    /// the kernel took to process and commit it (the one `sendmsg` carrying it).
    pub fn last_batch(&self) -> Option<crate::kernel::nft::netlink::BatchStats> {
        self.netlink.0.last
    }

    /// The same command with another time limit.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The command line without the trailing `-f -`.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// Runs `ARGV... -f -`, feeding `script` on stdin while stderr is read (so a
    /// chatty failure cannot deadlock against a large script).
    pub fn run(&self, script: &str) -> Result<(), DataPlaneError> {
        let mut argv = self.argv.clone();
        argv.extend(["-f".to_string(), "-".to_string()]);
        let out = run_command(&argv, Some(script), self.timeout)?;
        if !out.stderr.is_empty() {
            tracing::warn!(command = %self, stderr = %out.stderr, "nft succeeded with messages");
        }
        Ok(())
    }
}

impl fmt::Display for NftCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for arg in &self.argv {
            write!(f, "{arg} ")?;
        }
        f.write_str("-f -")
    }
}

impl ScriptSink for NftCommand {
    fn apply(&mut self, script: &str) -> Result<(), DataPlaneError> {
        self.run(script)
    }

    /// One nf_tables batch over netlink, in the namespace the command writes to:
    /// its [`NftCommand::in_netns`], or this process's when it runs `nft` itself
    /// (a command behind a prefix, e.g. `ip netns exec`, without the namespace
    /// named, gets the script).
    fn apply_batch(&mut self, batch: Batch, script: &str) -> Result<(), DataPlaneError> {
        if !self.writes_typed() {
            return self.run(script);
        }
        let netns = self.netns.clone();
        self.netlink.0.apply(batch, netns.as_deref(), self.timeout)
    }

    /// When it knows the namespace `nft` would write to: named, or its own.
    fn writes_typed(&self) -> bool {
        self.netns.is_some() || self.argv.len() == 1
    }

    fn table_state(&mut self, family: IpFamily, name: &str) -> Result<TableState, DataPlaneError> {
        table_state(self.netns.as_deref(), family, name).map_err(|e| DataPlaneError::Io {
            command: format!("netlink NFT_MSG_GETTABLE {family} {name}"),
            source: io::Error::other(e.to_string()),
        })
    }

    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<bool, DataPlaneError> {
        self.ask_chain(family, table, chain, chain_exists)
    }

    fn chain_use(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<Option<u32>, DataPlaneError> {
        self.ask_chain(family, table, chain, chain_use)
    }

    fn list(&mut self, args: &[&str]) -> Result<Option<String>, DataPlaneError> {
        let mut argv = self.argv.clone();
        argv.extend(args.iter().map(|a| a.to_string()));
        match run_command(&argv, None, self.timeout) {
            Ok(out) => Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned())),
            Err(DataPlaneError::Rejected { stderr, .. })
                if stderr.contains("No such file or directory") =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn scratch_listing(&mut self, script: &str) -> Result<String, DataPlaneError> {
        // A prefix (`ip netns exec NAME`) is not needed: any new namespace starts
        // empty. The binary is the command line's last word, passed as `$0`.
        let nft = self.argv.last().cloned().unwrap_or_else(|| "nft".into());
        let argv = scratch_argv(r#""$0" -f - && "$0" -s list ruleset"#, &[nft]);
        let out = run_command(&argv, Some(script), self.timeout)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// A fake `nft` for tests: records every script and fails when told to.
#[derive(Clone, Debug, Default)]
pub struct RecordingSink {
    /// Every script handed to [`ScriptSink::apply`], accepted or not, in order.
    pub attempts: Vec<String>,
    /// The scripts accepted, in order.
    pub applied: Vec<String>,
    failures: VecDeque<String>,
    always: Option<String>,
    /// What [`ScriptSink::table_state`] answers per family; a family not set answers
    /// present and active (handle 1).
    pub tables: BTreeMap<IpFamily, TableState>,
}

impl RecordingSink {
    /// The command name in the errors it returns.
    pub const COMMAND: &'static str = "fake-nft -f -";

    pub fn new() -> Self {
        RecordingSink::default()
    }

    /// The next apply fails with this stderr (queued: call twice to fail twice).
    pub fn fail_next(&mut self, stderr: impl Into<String>) {
        self.failures.push_back(stderr.into());
    }

    /// Every apply fails with this stderr until called with `None`.
    pub fn fail_always(&mut self, stderr: Option<String>) {
        self.always = stderr;
    }

    /// The last accepted script.
    pub fn last_applied(&self) -> Option<&str> {
        self.applied.last().map(String::as_str)
    }
}

impl ScriptSink for RecordingSink {
    fn apply(&mut self, script: &str) -> Result<(), DataPlaneError> {
        self.attempts.push(script.to_string());
        let failure = self.failures.pop_front().or_else(|| self.always.clone());
        if let Some(stderr) = failure {
            return Err(DataPlaneError::Rejected {
                command: Self::COMMAND.to_string(),
                status: "exit status: 1".to_string(),
                stderr: bounded_text(stderr.as_bytes(), STDERR_LIMIT),
            });
        }
        self.applied.push(script.to_string());
        Ok(())
    }

    fn table_state(&mut self, family: IpFamily, _name: &str) -> Result<TableState, DataPlaneError> {
        Ok(self
            .tables
            .get(&family)
            .copied()
            .unwrap_or(TableState::Present {
                handle: 1,
                dormant: false,
            }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A stand-in for `nft` run through `sh -c`: `-f -` become `$1 $2`.
    fn sh(body: &str) -> NftCommand {
        NftCommand::from_argv(["sh", "-c", body, "fake-nft"])
    }

    /// Runs `body` as a fake `nft` with a 300 ms time limit and returns its result,
    /// asserting that the call ended within 5 s (well before `body`'s 30 s sleeps).
    fn run_with_deadline(body: &str) -> Result<(), DataPlaneError> {
        let cmd = sh(body).with_timeout(Duration::from_millis(300));
        let started = Instant::now();
        let result = cmd.run("add table ip x\n");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        result
    }

    #[test]
    fn a_hung_nft_is_killed_at_the_time_limit() {
        let err = run_with_deadline("exec sleep 30").unwrap_err();
        assert!(matches!(err, DataPlaneError::TimedOut { .. }), "{err}");
    }

    #[test]
    fn a_hung_wrappers_children_are_killed_with_it() {
        // The shell forks `sleep` (which inherits the pipes) and waits: killing the
        // shell alone would leave the readers waiting 30 s for `sleep`.
        let err = run_with_deadline("sleep 30; true").unwrap_err();
        assert!(matches!(err, DataPlaneError::TimedOut { .. }), "{err}");
    }

    #[test]
    fn what_a_finished_command_leaves_holding_its_pipes_ends_at_the_deadline() {
        // It reads its input first, as nft does: a shell that exits without reading
        // would fail the write (EPIPE) whenever it exits before the writer runs.
        run_with_deadline("cat >/dev/null; sleep 30 & echo applied")
            .expect("the command itself succeeded");
    }

    #[test]
    fn the_script_arrives_on_stdin_after_dash_f_dash() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("got");
        let cmd = sh(&format!(
            "test \"$1 $2\" = '-f -' || exit 9; cat > '{}'",
            out.display()
        ));
        let script = "add table ip svcproxy\n".repeat(50_000);
        cmd.run(&script).expect("applied");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), script);
    }

    #[test]
    fn failure_reports_status_and_bounded_stderr_without_deadlock() {
        // Floods stderr before reading stdin: reading stderr only after the write
        // would deadlock on a script larger than the pipe buffer.
        let cmd = sh("head -c 300000 /dev/zero | tr '\\0' x >&2; cat >/dev/null; exit 3");
        let err = cmd.run(&"x".repeat(1 << 20)).unwrap_err();
        let DataPlaneError::Rejected { status, stderr, .. } = &err else {
            panic!("{err:?}");
        };
        assert!(status.contains('3'), "{status}");
        assert!(stderr.starts_with("xxxx"));
        assert!(stderr.len() < STDERR_LIMIT + 64, "{}", stderr.len());
        assert!(stderr.ends_with("more bytes]"));
    }

    #[test]
    fn early_exit_is_a_rejection_not_a_broken_pipe() {
        let cmd = sh("echo 'Error: syntax error' >&2; exit 1");
        let err = cmd.run(&"y".repeat(4 << 20)).unwrap_err();
        assert_eq!(err.stderr(), Some("Error: syntax error"), "{err}");
    }

    #[test]
    fn a_missing_binary_is_a_spawn_error() {
        let err = NftCommand::new("/nonexistent/nft").run("").unwrap_err();
        assert!(matches!(err, DataPlaneError::Spawn { .. }), "{err:?}");
        assert!(err.to_string().contains("/nonexistent/nft -f -"), "{err}");
    }

    #[test]
    fn the_recorder_fails_on_request() {
        let mut sink = RecordingSink::new();
        sink.fail_next("Error: one");
        assert_eq!(sink.apply("a").unwrap_err().stderr(), Some("Error: one"));
        sink.apply("b").unwrap();
        sink.fail_always(Some("Error: all".into()));
        assert!(sink.apply("c").is_err());
        assert!(sink.apply("d").is_err());
        sink.fail_always(None);
        sink.apply("e").unwrap();
        assert_eq!(sink.attempts, ["a", "b", "c", "d", "e"]);
        assert_eq!(sink.applied, ["b", "e"]);
    }
}
