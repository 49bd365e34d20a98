//! The quickstart's demo ends cleanly however it ends: `--help` prints its help and
//! builds nothing; a reader that goes away after five lines (`| head -5`, stdout and
//! stderr both) and SIGINT both end it with no namespace and no process of it left
//! behind.
//!
//! Every process the demo starts inherits a marker in its environment; after the
//! demo has exited, no process may carry it and no namespace may be named after the
//! demo's pid.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use svcproxy_e2e::demo_bin;
use svcproxy_e2e::netns::{self, list_ours};

const MARKER: &str = "SVCPROXY_DEMO_TEST";

/// What the demo (pid `pid`, started with marker value `mark`) left behind.
fn leftovers(pid: u32, mark: &str) -> Vec<String> {
    let mut left: Vec<String> = list_ours()
        .into_iter()
        .filter(|n| n.starts_with(&format!("svp-{pid}-")))
        .map(|n| format!("namespace {n}"))
        .collect();
    let needle = format!("{MARKER}={mark}");
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.filter_map(|e| e.ok()) {
            let Ok(env) = std::fs::read(e.path().join("environ")) else {
                continue;
            };
            if env.split(|&b| b == 0).any(|v| v == needle.as_bytes()) {
                let cmd = std::fs::read_to_string(e.path().join("cmdline")).unwrap_or_default();
                left.push(format!(
                    "process {:?}: {}",
                    e.file_name(),
                    cmd.replace('\0', " ")
                ));
            }
        }
    }
    left
}

fn wait_exit(
    child: &mut std::process::Child,
    within: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[test]
fn help_prints_the_help_and_builds_nothing() {
    let demo = demo_bin().expect("svcproxy-demo");
    let mark = format!("help-{}", std::process::id());
    let out = Command::new(&demo)
        .arg("--help")
        .env(MARKER, &mark)
        .output()
        .expect("run svcproxy-demo --help");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("Usage: svcproxy-demo"), "{stdout}");
    assert!(stdout.contains("throwaway cluster"), "{stdout}");
}

#[test]
fn a_reader_that_goes_away_ends_the_demo_and_everything_is_removed() {
    let test = "a_reader_that_goes_away_ends_the_demo_and_everything_is_removed";
    if !netns::can_run(test, &["ip", "nft"]) {
        return;
    }
    let demo = demo_bin().expect("svcproxy-demo");
    let mark = format!("pipe-{}", std::process::id());
    // As `svcproxy-demo 2>&1 | head -5`: one pipe for both, closed after five lines.
    let (reader, writer) = std::io::pipe().expect("pipe");
    let mut child = Command::new(&demo)
        .env(MARKER, &mark)
        .stdout(writer.try_clone().expect("dup"))
        .stderr(writer)
        .stdin(Stdio::null())
        .spawn()
        .expect("start svcproxy-demo");
    let pid = child.id();
    let mut lines = Vec::new();
    let mut r = BufReader::new(reader);
    for _ in 0..5 {
        let mut l = String::new();
        if r.read_line(&mut l).unwrap_or(0) == 0 {
            break;
        }
        lines.push(l);
    }
    drop(r);
    let status = wait_exit(&mut child, Duration::from_secs(120));
    let left = leftovers(pid, &mark);
    assert!(
        status.is_some(),
        "the demo did not end after its reader went away"
    );
    assert!(
        left.is_empty(),
        "left behind after a closed pipe ({status:?}; read {lines:?}):\n{}",
        left.join("\n")
    );
}

#[test]
fn sigint_ends_the_demo_and_everything_is_removed() {
    let test = "sigint_ends_the_demo_and_everything_is_removed";
    if !netns::can_run(test, &["ip", "nft", "kill"]) {
        return;
    }
    let demo = demo_bin().expect("svcproxy-demo");
    let mark = format!("sigint-{}", std::process::id());
    let mut child = Command::new(&demo)
        .env(MARKER, &mark)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::null())
        .spawn()
        .expect("start svcproxy-demo");
    let pid = child.id();
    // Interrupted once the cluster and its backends are up.
    let mut r = BufReader::new(child.stdout.take().expect("stdout"));
    let mut seen = String::new();
    while !seen.contains("backend pod-b1") {
        let mut l = String::new();
        if r.read_line(&mut l).unwrap_or(0) == 0 {
            break;
        }
        seen.push_str(&l);
    }
    let _ = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status();
    let status = wait_exit(&mut child, Duration::from_secs(60));
    drop(r);
    let left = leftovers(pid, &mark);
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(130),
        "exit after SIGINT (read {seen:?})"
    );
    assert!(
        left.is_empty(),
        "left behind after SIGINT:\n{}",
        left.join("\n")
    );
}
