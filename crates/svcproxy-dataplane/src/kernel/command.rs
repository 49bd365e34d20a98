//! Running the kernel's tools: a command with its input fed and its output read
//! at once, bounded in time, its whole process group ended at the deadline
//! ([`run_command`]); and a script run in a scratch network namespace of its own
//! ([`scratch_argv`]), where `explain --live` loads a plan to list it back.

use std::io::{self, Read, Write};
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{bounded_text, DataPlaneError, STDERR_LIMIT};
/// What a successful [`run_command`] printed.
#[derive(Clone, Debug, Default)]
pub struct CommandOutput {
    pub stdout: Vec<u8>,
    /// Trimmed and bounded to [`STDERR_LIMIT`] bytes.
    pub stderr: String,
}

/// Runs `argv`, feeding `stdin` (if any) while stdout and stderr are read (so neither
/// a large input nor a chatty command can deadlock), killing it after `timeout`. A
/// non-zero exit is [`DataPlaneError::Rejected`] with its stderr.
///
/// The command runs in a process group of its own, and the deadline ends the whole
/// group: a wrapper's children (`ip netns exec` that forks, a script) cannot outlive
/// it holding the pipes and keep the caller, and so the sync, waiting past the
/// deadline. After the command exits, whatever it left behind holding the pipes is
/// ended at the deadline too.
pub fn run_command(
    argv: &[String],
    stdin: Option<&str>,
    timeout: Duration,
) -> Result<CommandOutput, DataPlaneError> {
    run_command_with_env(argv, &[], stdin, timeout)
}

/// [`run_command`] with `env` added to the command's environment.
pub fn run_command_with_env(
    argv: &[String],
    env: &[(&str, String)],
    stdin: Option<&str>,
    timeout: Duration,
) -> Result<CommandOutput, DataPlaneError> {
    let command = argv.join(" ");
    let Some((program, args)) = argv.split_first() else {
        return Err(DataPlaneError::Spawn {
            command,
            source: io::Error::other("empty command line"),
        });
    };
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| DataPlaneError::Spawn {
            command: command.clone(),
            source,
        })?;
    // `process_group(0)`: the group's id is the child's pid.
    let group = child.id();
    let stdin_pipe = child.stdin.take();
    let mut stdout_pipe = child.stdout.take().expect("stdout is piped");
    let mut stderr_pipe = child.stderr.take().expect("stderr is piped");
    let deadline = Instant::now() + timeout;
    let (written, stdout, stderr_bytes, status) = std::thread::scope(|s| {
        let writer = s.spawn(move || match (stdin_pipe, stdin) {
            (Some(mut pipe), Some(text)) => {
                let result = pipe.write_all(text.as_bytes());
                // Closing stdin tells the command the input is complete.
                drop(pipe);
                result
            }
            _ => Ok(()),
        });
        let out_reader = s.spawn(move || {
            let mut buf = Vec::new();
            let _ = stdout_pipe.read_to_end(&mut buf);
            buf
        });
        let err_reader = s.spawn(move || {
            let mut buf = Vec::new();
            let _ = stderr_pipe.read_to_end(&mut buf);
            buf
        });
        // Killing the group closes every copy of the pipes, which ends the threads.
        let status = wait_or_kill(&mut child, group, deadline);
        // Exited: a process it left in its group may still hold a pipe open.
        while !(writer.is_finished() && out_reader.is_finished() && err_reader.is_finished()) {
            if Instant::now() >= deadline {
                kill_group(group);
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("stdin writer panicked")));
        let stdout = out_reader.join().unwrap_or_default();
        let stderr_bytes = err_reader.join().unwrap_or_default();
        (written, stdout, stderr_bytes, status)
    });
    let status = status.map_err(|source| DataPlaneError::Io {
        command: command.clone(),
        source,
    })?;
    let Some(status) = status else {
        return Err(DataPlaneError::TimedOut {
            command,
            after: timeout,
        });
    };
    let stderr = bounded_text(&stderr_bytes, STDERR_LIMIT);
    if !status.success() {
        // A write error here is the command closing its stdin on the way out: the
        // exit status and stderr say why.
        return Err(DataPlaneError::Rejected {
            command,
            status: status.to_string(),
            stderr,
        });
    }
    // It succeeded without reading the whole input: whatever it applied is not ours.
    written.map_err(|source| DataPlaneError::Io {
        command: command.clone(),
        source,
    })?;
    Ok(CommandOutput { stdout, stderr })
}

/// The child's exit status, or `None` once `deadline` passed and its group was
/// killed.
fn wait_or_kill(
    child: &mut std::process::Child,
    group: u32,
    deadline: Instant,
) -> io::Result<Option<std::process::ExitStatus>> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(Some(status)),
            Ok(None) if Instant::now() >= deadline => {
                kill_group(group);
                let _ = child.wait();
                return Ok(None);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(e),
        }
    }
}

/// SIGKILL to every process of group `group` (gone already: nothing to do).
fn kill_group(group: u32) {
    if let Some(pid) = i32::try_from(group)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// `unshare --net -- sh -c SCRIPT ARGS...`: `script` (fixed text, whose `$0`,
/// `$1`... are `args`, never spliced into it) run in a network namespace of its
/// own, which the kernel removes when the last process in it exits.
pub fn scratch_argv(script: &str, args: &[String]) -> Vec<String> {
    let mut argv: Vec<String> = ["unshare", "--net", "--", "sh", "-c", script]
        .iter()
        .map(|s| s.to_string())
        .collect();
    argv.extend(args.iter().cloned());
    argv
}
