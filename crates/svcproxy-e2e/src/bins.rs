//! Finding (and if needed building) the binaries the tests run inside namespaces.
//!
//! Tests run the real executables, not library calls: the point is processes in other
//! network namespaces. Cargo puts binaries in `target/<profile>/`, the directory above the
//! test executable (`target/<profile>/deps/`), so that is where we look; a missing one is
//! built once per test process with the same profile.
//!
//! Entry points: [`echo_bin`], [`demo_bin`], [`loadgen_bin`], [`svcproxy_bin`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// Serialises builds: parallel tests asking for the same binary must not race cargo.
static BUILD: Mutex<()> = Mutex::new(());

/// `target/<profile>/svcproxy-echo`, built if missing.
pub fn echo_bin() -> Result<PathBuf> {
    locate("svcproxy-e2e", "svcproxy-echo")
}

/// `target/<profile>/svcproxy-demo` (the quickstart's demo), built if missing.
pub fn demo_bin() -> Result<PathBuf> {
    locate("svcproxy-e2e", "svcproxy-demo")
}

/// `target/<profile>/svcproxy-loadgen` (the benchmark's load, and the checked bulk
/// transfer of the real-packet tests), built if missing.
pub fn loadgen_bin() -> Result<PathBuf> {
    locate("svcproxy-e2e", "svcproxy-loadgen")
}

/// `target/<profile>/svcproxy`, the proxy under test, built if missing. Panics with the
/// build error, since no end-to-end test can do anything without it.
pub fn svcproxy_bin() -> PathBuf {
    locate("svcproxy", "svcproxy").unwrap_or_else(|e| panic!("{e:#}"))
}

/// `target/<profile>/svcproxy-fakeapi` (a fake API server serving a generated
/// cluster), built if missing.
pub fn fakeapi_bin() -> Result<PathBuf> {
    locate("svcproxy-fakeapi", "svcproxy-fakeapi")
}

/// The directory holding the workspace's binaries for the running test's profile.
pub fn bin_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the test executable")?;
    let mut dir = exe.parent().context("test executable has no directory")?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent().context("deps directory has no parent")?;
    }
    Ok(dir.to_path_buf())
}

fn locate(package: &str, bin: &str) -> Result<PathBuf> {
    let dir = bin_dir()?;
    let path = dir.join(bin);
    if path.is_file() {
        return Ok(path);
    }
    let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    if path.is_file() {
        return Ok(path);
    }
    build(package, bin, &dir)?;
    if !path.is_file() {
        bail!(
            "built {bin} but it is not at {}; run `cargo build -p {package} --bin {bin}` with \
             the test's profile and target directory",
            path.display()
        );
    }
    Ok(path)
}

fn build(package: &str, bin: &str, dir: &Path) -> Result<()> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&workspace)
        .args(["build", "--quiet", "-p", package, "--bin", bin]);
    // Same profile as the test (`debug` is the dev profile), same target directory, so the
    // binary lands where `locate` looks.
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(profile) => {
            cmd.args(["--profile", profile]);
        }
    }
    if let Some(target_dir) = dir.parent() {
        cmd.arg("--target-dir").arg(target_dir);
    }
    // Bounded like every other command: a cargo blocked on the build-directory lock must
    // fail the test with a message, not hang it.
    let out = crate::netns::run(&mut cmd, None, Duration::from_secs(900))
        .with_context(|| format!("running cargo to build {bin}"))?;
    if !out.status.success() {
        bail!(
            "`cargo build -p {package} --bin {bin}` failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
