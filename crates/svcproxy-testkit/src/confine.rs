//! A cgroup and a bpffs of a test's own, for the eBPF data plane: the programs
//! attach only to that cgroup (under a cgroup2 mount the test makes, so processes
//! started through `ip netns exec`, which remounts /sys, can still be moved in),
//! and pin only in that bpffs. Everything goes when the value is dropped, even
//! after a failure: the pins (detaching the programs), the mounts, the cgroup.
//! (A test's own data plane cleans up first; this is the safety net.)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A cgroup2 mount, a cgroup under it and a bpffs mount, all the test's own;
/// removed when dropped.
pub struct Confinement {
    cgroup_mount: tempfile::TempDir,
    cgroup: PathBuf,
    /// Cgroups made below `cgroup` ([`Confinement::child`]), removed first.
    children: std::sync::Mutex<Vec<PathBuf>>,
    bpffs: tempfile::TempDir,
}

impl Confinement {
    pub fn new() -> Result<Confinement, String> {
        let cgroup_mount = tempfile::tempdir().map_err(|e| e.to_string())?;
        mount("cgroup2", cgroup_mount.path())?;
        static N: AtomicUsize = AtomicUsize::new(0);
        let cgroup = cgroup_mount.path().join(format!(
            "svcproxy-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let bpffs = tempfile::tempdir().map_err(|e| e.to_string())?;
        let c = Confinement {
            cgroup_mount,
            cgroup,
            children: std::sync::Mutex::new(Vec::new()),
            bpffs,
        };
        std::fs::create_dir(&c.cgroup)
            .map_err(|e| format!("creating {}: {e}", c.cgroup.display()))?;
        mount("bpf", c.bpffs.path())?;
        Ok(c)
    }

    /// The directory the data plane pins into, inside the test's bpffs.
    pub fn pin_dir(&self) -> PathBuf {
        self.bpffs.path().join("svcproxy")
    }

    /// A cgroup `name` below the test's, and a pin directory `name` in its bpffs:
    /// one data plane's confinement when a test runs several (one per node).
    pub fn child(&self, name: &str) -> Result<(PathBuf, PathBuf), String> {
        let cgroup = self.cgroup.join(name);
        std::fs::create_dir(&cgroup).map_err(|e| format!("creating {}: {e}", cgroup.display()))?;
        self.children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(cgroup.clone());
        Ok((cgroup, self.bpffs.path().join(name)))
    }
}

fn mount(fstype: &str, dir: &Path) -> Result<(), String> {
    let out = Command::new("mount")
        .args(["-t", fstype, fstype])
        .arg(dir)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "mount -t {fstype}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Drop for Confinement {
    fn drop(&mut self) {
        // Whatever a failed test left pinned goes with the bpffs: unmounting it
        // releases the pinned links (detaching the programs) and maps.
        let _ = Command::new("umount").arg(self.bpffs.path()).status();
        // The cgroups empty as their processes exit.
        let children =
            std::mem::take(&mut *self.children.lock().unwrap_or_else(|e| e.into_inner()));
        for dir in children.iter().chain(std::iter::once(&self.cgroup)) {
            for _ in 0..50 {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        }
        let _ = Command::new("umount")
            .arg(self.cgroup_mount.path())
            .status();
    }
}

impl Confinement {
    /// The cgroup's directory.
    pub fn cgroup(&self) -> &Path {
        &self.cgroup
    }

    /// `argv` as a command that first moves itself into the cgroup (then execs).
    pub fn command(&self, argv: &[&str]) -> Command {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo $$ > \"$0\" && exec \"$@\""])
            .arg(self.cgroup.join("cgroup.procs"))
            .args(argv);
        cmd
    }
}
