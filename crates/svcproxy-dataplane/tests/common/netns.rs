//! A throwaway network namespace for the kernel-facing tests: created only as root
//! with the tools a test needs, deleted when dropped (even when the test panics).
//! Without root or a tool the test prints SKIP and passes, unless `CI` is set, in
//! which case it fails.

use std::process::Command;

/// The namespace `<prefix>-<pid>-<tag>`, until dropped.
pub struct Netns {
    pub name: String,
}

/// Prints SKIP (or, under `CI`, fails the test) and yields no namespace.
pub fn skip(test: &str, why: &str) -> Option<Netns> {
    if std::env::var_os("CI").is_some() {
        panic!("{test}: cannot run under CI: {why}");
    }
    eprintln!("SKIP {test}: {why}");
    None
}

fn found(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

impl Netns {
    /// Creates `<prefix>-<pid>-<tag>` if running as root with every tool in `tools`.
    pub fn create(test: &str, prefix: &str, tag: &str, tools: &[&str]) -> Option<Netns> {
        let uid = Command::new("id").arg("-u").output();
        if !uid.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0") {
            return skip(test, "not root, cannot create a network namespace");
        }
        for tool in tools {
            if !found(tool) {
                return skip(test, &format!("{tool} not installed"));
            }
        }
        let name = format!("{prefix}-{}-{tag}", std::process::id());
        let out = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .expect("run ip");
        if !out.status.success() {
            return skip(
                test,
                &format!(
                    "ip netns add {name} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ),
            );
        }
        Some(Netns { name })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}
