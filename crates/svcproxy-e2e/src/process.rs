//! Long-running processes inside a namespace (svcproxy, echo servers), killed on drop.
//!
//! Output goes to files rather than pipes: nobody has to drain them, a process that logs a
//! lot never blocks, and when a test fails the files are what explains it. A guard dropped
//! during a panic prints the tail of its logs to stderr, which the test runner shows next to
//! the failure.
//!
//! Entry point: [`NsProcess::spawn`] (usually through `Cluster::spawn`).

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::netns::{describe, ns_command};

/// Shared so the owning cluster can kill whatever is still running before it deletes the
/// namespaces, even if a test leaked a guard.
pub(crate) type ChildSlot = Arc<Mutex<Option<Child>>>;

/// A process running inside a network namespace; SIGKILLed when dropped.
#[derive(Debug)]
pub struct NsProcess {
    label: String,
    command: String,
    child: ChildSlot,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl NsProcess {
    /// Starts `argv` inside `ns`, with stdout / stderr written to `<log_dir>/<label>.out` and
    /// `.err`.
    pub fn spawn(ns: &str, argv: &[&str], label: &str, log_dir: &Path) -> Result<NsProcess> {
        let mut cmd = ns_command(ns, argv);
        Self::spawn_command(&mut cmd, label, log_dir)
    }

    pub(crate) fn spawn_command(cmd: &mut Command, label: &str, log_dir: &Path) -> Result<Self> {
        let safe: String = label
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        // A label used twice (a restarted svcproxy) gets `-2`, `-3`, ... so no log is lost.
        let mut stem = safe.clone();
        for n in 2..1000 {
            if !log_dir.join(format!("{stem}.out")).exists() {
                break;
            }
            stem = format!("{safe}-{n}");
        }
        let stdout = log_dir.join(format!("{stem}.out"));
        let stderr = log_dir.join(format!("{stem}.err"));
        let command = describe(cmd);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).context("creating stdout log")?)
            .stderr(File::create(&stderr).context("creating stderr log")?)
            .spawn()
            .with_context(|| format!("cannot start `{command}`"))?;
        Ok(NsProcess {
            label: label.to_string(),
            command,
            child: Arc::new(Mutex::new(Some(child))),
            stdout,
            stderr,
        })
    }

    pub(crate) fn slot(&self) -> Weak<Mutex<Option<Child>>> {
        Arc::downgrade(&self.child)
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn pid(&self) -> Option<u32> {
        lock(&self.child).as_ref().map(Child::id)
    }

    pub fn stdout_path(&self) -> &Path {
        &self.stdout
    }

    pub fn stderr_path(&self) -> &Path {
        &self.stderr
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// `None` while running, the exit status once it ended (or was killed).
    pub fn exit_status(&self) -> Option<ExitStatus> {
        let mut slot = lock(&self.child);
        match slot.as_mut() {
            Some(child) => child.try_wait().ok().flatten(),
            None => None,
        }
    }

    pub fn is_running(&self) -> bool {
        lock(&self.child).is_some() && self.exit_status().is_none()
    }

    /// Waits until stdout contains `needle`, failing early if the process exits. Polls the
    /// log file, bounded by `timeout`.
    pub fn wait_for_stdout(&self, needle: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.stdout();
            if out.contains(needle) {
                return Ok(out);
            }
            if let Some(status) = self.exit_status() {
                bail!(
                    "{} exited ({status}) before printing {needle:?}\n{}",
                    self.label,
                    self.logs()
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} did not print {needle:?} within {timeout:?}\n{}",
                    self.label,
                    self.logs()
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the process to exit by itself, bounded by `timeout` (then kills it).
    pub fn wait(&self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exit_status() {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                self.kill();
                bail!(
                    "{} still running after {timeout:?}\n{}",
                    self.label,
                    self.logs()
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Command line and both logs, for assertion messages.
    pub fn logs(&self) -> String {
        format!(
            "=== {} ({}) ===\n--- stdout ({}) ---\n{}\n--- stderr ({}) ---\n{}",
            self.label,
            self.command,
            self.stdout.display(),
            tail(&self.stdout(), 60),
            self.stderr.display(),
            tail(&self.stderr(), 60)
        )
    }

    /// SIGTERM, then waits up to `grace` for a clean exit (e.g. svcproxy removing its
    /// tables) before falling back to SIGKILL. Returns the exit status if it exited by itself.
    pub fn terminate(&self, grace: Duration) -> Option<ExitStatus> {
        let pid = self.pid()?;
        if let Some(status) = self.exit_status() {
            return Some(status);
        }
        let _ = crate::netns::run(
            Command::new("kill").args(["-TERM", &pid.to_string()]),
            None,
            Duration::from_secs(5),
        );
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = self.exit_status() {
                return Some(status);
            }
            thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        None
    }

    /// SIGKILL and reap; idempotent.
    pub fn kill(&self) {
        kill_slot(&self.child);
    }
}

impl Drop for NsProcess {
    fn drop(&mut self) {
        self.kill();
        if thread::panicking() {
            // Never a panic in a drop: a closed stderr would abort the unwinding.
            let _ = writeln!(std::io::stderr(), "{}", self.logs());
        }
    }
}

pub(crate) fn kill_slot(slot: &Mutex<Option<Child>>) {
    let mut slot = lock(slot);
    if let Some(mut child) = slot.take() {
        // `ip netns exec` execs the command in place, so this pid is the process itself.
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock leaves the child handle intact; keep using it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    let mut out = String::new();
    if start > 0 {
        out.push_str(&format!("[... {start} earlier lines]\n"));
    }
    out.push_str(&all[start..].join("\n"));
    out
}
