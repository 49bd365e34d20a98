//! Network namespaces the tests own, bounded command execution, and the one skip rule.
//!
//! Every namespace is named `svp-<pid>-<set>-<role>`: the pid keeps concurrent test
//! processes apart and lets [`cleanup_stale`] recognise leftovers of dead processes (a test
//! binary killed by SIGKILL never runs its destructors). Nothing here touches the root
//! namespace: commands either run with `ip -n NS` / `ip netns exec NS` or only add and delete
//! our own namespaces.
//!
//! Entry points: [`can_run`] (the skip rule), [`Netns`] (one namespace for a test),
//! [`NsSet`] (a group of namespaces), [`run`] (a command with a deadline),
//! [`cleanup_stale`].

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Prefix of every namespace the tests create.
pub const NS_PREFIX: &str = "svp-";

/// Where `ip netns` keeps its named namespaces.
const NETNS_DIR: &str = "/run/netns";

/// Default deadline of one setup or teardown command; generous because `ip netns add` can
/// take a while on a loaded 2-core machine, yet bounded so a hung tool cannot hang a test.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `cmd` with `stdin` fed to it, killing it once `timeout` passes.
///
/// Output is drained on threads so a chatty command cannot block on a full pipe while we
/// wait for it.
pub fn run(cmd: &mut Command, stdin: Option<&str>, timeout: Duration) -> Result<Output> {
    let desc = describe(cmd);
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start `{desc}`"))?;
    // Drained before stdin is written: a large input (a whole ruleset) must not deadlock
    // against a command that answers while it reads.
    let out = child.stdout.take().map(drain);
    let err = child.stderr.take().map(drain);
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        if let Err(e) = pipe.write_all(text.as_bytes()) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e).with_context(|| format!("cannot feed `{desc}`"));
        }
    }
    let deadline = Instant::now() + timeout;
    let status: ExitStatus = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("`{desc}` did not finish within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(2));
    };
    let stdout = out
        .map(|h| h.join().unwrap_or_default())
        .unwrap_or_default();
    let stderr = err
        .map(|h| h.join().unwrap_or_default())
        .unwrap_or_default();
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

fn drain<R: Read + Send + 'static>(mut pipe: R) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        buf
    })
}

/// Like [`run`], but a non-zero exit is an error carrying the command's stderr.
pub fn run_ok(cmd: &mut Command, stdin: Option<&str>) -> Result<String> {
    let desc = describe(cmd);
    let out = run(cmd, stdin, COMMAND_TIMEOUT)?;
    if !out.status.success() {
        bail!(
            "`{desc}` failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            stdin
                .map(|s| format!("\n--- input ---\n{s}"))
                .unwrap_or_default()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// A command that runs `argv` inside namespace `ns`.
pub fn ns_command(ns: &str, argv: &[&str]) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns]).args(argv);
    cmd
}

/// Runs an `ip` batch (one command per line) inside `ns`: one process instead of dozens
/// keeps cluster setup fast.
pub fn ip_batch(ns: &str, lines: &[String]) -> Result<()> {
    if lines.is_empty() {
        return Ok(());
    }
    let text = lines.join("\n") + "\n";
    run_ok(
        Command::new("ip").args(["-n", ns, "-batch", "-"]),
        Some(&text),
    )?;
    Ok(())
}

/// Sets sysctls inside `ns` (never in the root namespace).
pub fn sysctl(ns: &str, settings: &[(&str, &str)]) -> Result<()> {
    let mut argv = vec!["sysctl".to_string(), "-q".into(), "-w".into()];
    argv.extend(settings.iter().map(|(k, v)| format!("{k}={v}")));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    run_ok(&mut ns_command(ns, &argv), None)?;
    Ok(())
}

/// Names of all namespaces that look like ours, of any process.
pub fn list_ours() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    let mut names: Vec<String> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(NS_PREFIX))
        .collect();
    names.sort();
    names
}

/// The creating pid encoded in one of our namespace names.
fn owner_pid(name: &str) -> Option<u32> {
    name.strip_prefix(NS_PREFIX)?
        .split('-')
        .next()?
        .parse()
        .ok()
}

static CLEANUP: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The lock [`cleanup_stale`] holds while it scans and deletes. `ip netns add` is not atomic
/// (the name appears before the namespace is mounted), so whoever deliberately creates a
/// stale-looking namespace, as the cleanup test does, holds this meanwhile.
pub fn cleanup_lock() -> std::sync::MutexGuard<'static, ()> {
    CLEANUP.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes leftover `svp-<pid>-*` namespaces whose creating process is gone (for example a
/// test binary killed by a timeout). Namespaces of live processes are left alone, so
/// concurrent test runs never delete each other's clusters. Returns what was removed.
pub fn cleanup_stale() -> Vec<String> {
    let _guard = cleanup_lock();
    let stale: Vec<String> = list_ours()
        .into_iter()
        .filter(|n| match owner_pid(n) {
            Some(pid) => !Path::new(&format!("/proc/{pid}")).exists(),
            None => false,
        })
        .collect();
    if !stale.is_empty() {
        if let Err(e) = delete_namespaces(&stale) {
            eprintln!("svcproxy-testkit: cleaning stale namespaces: {e:#}");
        }
    }
    // Log directories a failed run kept (`svp-<pid>-<n>-logs-*`) live until the next run.
    if let Ok(dir) = std::fs::read_dir(std::env::temp_dir()) {
        for entry in dir.filter_map(|e| e.ok()) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let dead =
                owner_pid(&name).is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
            if dead && name.contains("-logs-") {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    stale
}

/// Deletes every namespace this process created (and the processes in them):
/// the last resort of a program interrupted by a signal, whose namespace sets
/// cannot be dropped in order. Returns what was removed.
pub fn delete_own() -> Result<Vec<String>> {
    let own: Vec<String> = list_ours()
        .into_iter()
        .filter(|n| owner_pid(n) == Some(std::process::id()))
        .collect();
    if !own.is_empty() {
        delete_namespaces(&own)?;
    }
    Ok(own)
}

/// Kills every process still inside the namespaces, then deletes them.
///
/// Processes must go first: a namespace lives on while any process is in it, so a leftover
/// server would keep its veths and addresses alive after `ip netns del`.
pub fn delete_namespaces(names: &[String]) -> Result<()> {
    for name in names {
        kill_all_in(name);
    }
    let lines: Vec<String> = names.iter().map(|n| format!("netns del {n}")).collect();
    // -force: continue past a namespace that is already gone, delete the rest.
    let text = lines.join("\n") + "\n";
    let out = run(
        Command::new("ip").args(["-force", "-batch", "-"]),
        Some(&text),
        COMMAND_TIMEOUT,
    )?;
    let left: Vec<String> = list_ours()
        .into_iter()
        .filter(|n| names.contains(n))
        .collect();
    if !left.is_empty() {
        bail!(
            "namespaces not deleted: {left:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// SIGKILLs the processes whose network namespace is `ns` (and only those).
pub fn kill_all_in(ns: &str) {
    // Bounded: a process that respawns children could otherwise keep us here.
    for _ in 0..5 {
        let Ok(out) = run(
            Command::new("ip").args(["netns", "pids", ns]),
            None,
            COMMAND_TIMEOUT,
        ) else {
            return;
        };
        let pids: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter(|p| p.parse::<u32>().is_ok())
            .map(str::to_owned)
            .collect();
        if pids.is_empty() {
            return;
        }
        let mut cmd = Command::new("kill");
        cmd.arg("-KILL").args(&pids);
        let _ = run(&mut cmd, None, COMMAND_TIMEOUT);
        thread::sleep(Duration::from_millis(20));
    }
}

static NEXT_SET: AtomicUsize = AtomicUsize::new(0);

/// A group of namespaces created together and deleted together (on drop too).
#[derive(Debug)]
pub struct NsSet {
    prefix: String,
    names: Vec<String>,
}

impl NsSet {
    /// A new, empty group with a process-unique prefix `svp-<pid>-<n>-`.
    pub fn new() -> NsSet {
        let n = NEXT_SET.fetch_add(1, Ordering::Relaxed);
        NsSet {
            prefix: format!("{NS_PREFIX}{}-{n}-", std::process::id()),
            names: Vec::new(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Creates one namespace per role (one `ip` process for all of them); returns the full
    /// names in the same order.
    pub fn add(&mut self, roles: &[String]) -> Result<Vec<String>> {
        let names: Vec<String> = roles
            .iter()
            .map(|r| format!("{}{r}", self.prefix))
            .collect();
        // Recorded before creation so a half-done batch is still cleaned up.
        self.names.extend(names.iter().cloned());
        let lines: Vec<String> = names.iter().map(|n| format!("netns add {n}")).collect();
        run_ok(
            Command::new("ip").args(["-batch", "-"]),
            Some(&(lines.join("\n") + "\n")),
        )?;
        Ok(names)
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Deletes the group now, reporting failures (drop only logs them).
    pub fn delete(&mut self) -> Result<()> {
        let names = std::mem::take(&mut self.names);
        if names.is_empty() {
            return Ok(());
        }
        delete_namespaces(&names)
    }
}

impl Default for NsSet {
    fn default() -> Self {
        NsSet::new()
    }
}

impl Drop for NsSet {
    fn drop(&mut self) {
        if let Err(e) = self.delete() {
            // Never a panic in a drop: a closed stderr would abort the unwinding.
            let _ = writeln!(std::io::stderr(), "svcproxy-testkit: {e:#}");
        }
    }
}

/// Why tests needing `tools` cannot run here, or `None` when they can: root (euid 0)
/// and every tool on `PATH`.
pub fn missing(tools: &[&str]) -> Option<String> {
    let mut missing = Vec::new();
    if effective_uid() != Some(0) {
        missing.push("root (euid 0)".to_string());
    }
    for tool in tools {
        if !on_path(tool) {
            missing.push(format!("`{tool}`"));
        }
    }
    if missing.is_empty() {
        None
    } else {
        Some(format!("missing {}", missing.join(", ")))
    }
}

fn on_path(tool: &str) -> bool {
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| {
        std::fs::metadata(dir.join(tool)).is_ok_and(|m| {
            use std::os::unix::fs::PermissionsExt;
            m.is_file() && m.permissions().mode() & 0o111 != 0
        })
    })
}

fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Environment variable that turns a skip into a failure (CI must never skip silently).
pub const REQUIRE_ENV: &str = "SVCPROXY_E2E_REQUIRED";

/// Whether skipping is forbidden: `CI` or `SVCPROXY_E2E_REQUIRED` set (and not `0`/`false`).
pub fn skipping_forbidden() -> bool {
    forbids_skipping(|v| std::env::var(v).ok())
}

fn forbids_skipping(var: impl Fn(&str) -> Option<String>) -> bool {
    [REQUIRE_ENV, "CI"]
        .iter()
        .any(|v| var(v).is_some_and(|s| !s.is_empty() && s != "0" && s != "false"))
}

/// Environment variable naming a file each skip is also written to, one line
/// each: the suite's summary counts them (`scripts/test.sh`), since a passing
/// test's output is not shown.
pub const SKIP_LOG_ENV: &str = "SVCPROXY_SKIP_LOG";

/// The one skip rule. A test that cannot run (`why`) prints `SKIP <test>: <why>` and
/// should return; under `CI` / `SVCPROXY_E2E_REQUIRED` it panics instead, because CI must
/// really run it. Each skip is also a line of [`SKIP_LOG_ENV`]'s file, when set.
pub fn skip(test: &str, why: &str) {
    if skipping_forbidden() {
        panic!("{test}: cannot run ({why}) and CI / {REQUIRE_ENV} forbids skipping");
    }
    eprintln!("SKIP {test}: {why}");
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV) {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "SKIP {test}: {why}");
        }
    }
}

/// `true` when a test needing root and `tools` can run; otherwise [`skip`] and `false`.
pub fn can_run(test: &str, tools: &[&str]) -> bool {
    match missing(tools) {
        None => true,
        Some(why) => {
            skip(test, &why);
            false
        }
    }
}

/// Runs `f` on a thread of its own inside network namespace `ns` (setns(2) moves
/// only the calling thread, so the test's other threads stay where they are), for
/// in-process code that must see the namespace: a data plane driven directly,
/// netlink, tc attachments by interface name. Child processes `f` starts are in
/// `ns` too.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
    let path = format!("/run/netns/{ns}");
    let file = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    std::thread::scope(|s| {
        s.spawn(move || {
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&file),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .with_context(|| format!("entering {ns}"))?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// One namespace for one test, deleted (with every process in it) when dropped.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
    _set: NsSet,
}

impl Netns {
    /// A new namespace `svp-<pid>-<n>-<tag>` if [`can_run`] allows (root, `ip` and every
    /// tool in `tools`); `None` after a skip. Failing to create it is a skip too (a
    /// container without the privilege), under the same rule.
    pub fn create(test: &str, tag: &str, tools: &[&str]) -> Option<Netns> {
        let mut needed = vec!["ip"];
        needed.extend_from_slice(tools);
        if !can_run(test, &needed) {
            return None;
        }
        let mut set = NsSet::new();
        match set.add(&[tag.to_string()]) {
            Ok(mut names) => Some(Netns {
                name: names.pop().expect("one namespace"),
                _set: set,
            }),
            Err(e) => {
                skip(test, &format!("cannot create a network namespace: {e:#}"));
                None
            }
        }
    }

    /// A command that runs `argv` inside this namespace.
    pub fn command(&self, argv: &[&str]) -> Command {
        ns_command(&self.name, argv)
    }

    /// Runs `argv` inside the namespace with `stdin`; its stdout, or an error with its
    /// stderr when it fails.
    pub fn run_ok(&self, argv: &[&str], stdin: Option<&str>) -> Result<String> {
        run_ok(&mut self.command(argv), stdin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_or_the_require_variable_forbids_skipping() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(!forbids_skipping(env(&[])));
        assert!(forbids_skipping(env(&[("CI", "true")])));
        assert!(forbids_skipping(env(&[(REQUIRE_ENV, "1")])));
        assert!(!forbids_skipping(env(&[
            ("CI", "false"),
            (REQUIRE_ENV, "0")
        ])));
        assert!(!forbids_skipping(env(&[("CI", "")])));
    }

    #[test]
    fn missing_names_each_absent_tool() {
        let why = missing(&["sh", "svcproxy-no-such-tool"]).expect("a tool is missing");
        assert!(why.contains("`svcproxy-no-such-tool`"), "{why}");
        assert!(!why.contains("`sh`"), "{why}");
    }

    #[test]
    fn owner_pid_reads_our_names_only() {
        assert_eq!(owner_pid("svp-1234-0-node-a"), Some(1234));
        assert_eq!(owner_pid("svp-x-0-node-a"), None);
        assert_eq!(owner_pid("other-1234"), None);
    }

    #[test]
    fn run_kills_a_command_past_its_deadline() {
        let start = Instant::now();
        let err = run(
            Command::new("sleep").arg("5"),
            None,
            Duration::from_millis(100),
        )
        .unwrap_err();
        assert!(err.to_string().contains("did not finish"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(2));
    }
}
