//! Conntrack kernel settings applied at start, as kube-proxy's
//! `KubeProxyConntrackConfiguration`: table size, TCP and UDP timeouts, TCP liberal
//! mode.
//!
//! Entry points: [`apply_conntrack_sysctls`] (the real `/proc/sys` and `/sys`, in the
//! calling process's network namespace) and [`apply_conntrack_sysctls_at`] (any roots
//! and CPU count, for tests). As upstream: the table size is
//! `max(maxPerCore × CPUs, min)` when `maxPerCore > 0` (0 leaves it alone), except
//! that a `maxPerCore × CPUs` above 1,048,576 gives 1,048,576 (kube-proxy 1.36,
//! k/k#137002); `nf_conntrack_max` is written only when it is smaller (kube-proxy
//! 1.38, k/k#142035: a table someone made larger is theirs, and a container that may
//! not write the file has nothing to fail on), and the hash table
//! (`/sys/module/nf_conntrack/parameters/hashsize`, global and writable only from the
//! initial namespace) is raised to a quarter of it when smaller. Timeouts are written
//! when set (whole seconds). Nothing here is fatal: a container without a writable
//! `/proc/sys` or with a read-only `/sys` gets warnings naming the file and value.
//! The `nf_conntrack` module must be loaded for the files to exist (svcproxy's rules
//! load it, so the first sync is a good moment).

use std::path::Path;
use std::time::Duration;

use crate::kernel::sysctl::NodePreparation;

/// The conntrack settings to apply; zero / `None` / `false` leave the kernel's value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConntrackSettings {
    /// Entries per CPU; 0 leaves `nf_conntrack_max` alone (and ignores `min`).
    pub max_per_core: u32,
    /// Lower bound of the table size computed from `max_per_core`.
    pub min: u32,
    /// `nf_conntrack_tcp_timeout_established`.
    pub tcp_established_timeout: Option<Duration>,
    /// `nf_conntrack_tcp_timeout_close_wait`.
    pub tcp_close_wait_timeout: Option<Duration>,
    /// `nf_conntrack_tcp_be_liberal=1`.
    pub tcp_be_liberal: bool,
    /// `nf_conntrack_udp_timeout`.
    pub udp_timeout: Option<Duration>,
    /// `nf_conntrack_udp_timeout_stream`.
    pub udp_stream_timeout: Option<Duration>,
}

/// The most `max_per_core × CPUs` gives, as upstream's cap (k/k#137002); `min` may
/// still ask for more when the scaled size is below the cap.
pub const SCALED_TABLE_SIZE_CAP: u64 = 1_048_576;

impl ConntrackSettings {
    /// The table size wanted, if any: `max_per_core × cpus` capped at
    /// [`SCALED_TABLE_SIZE_CAP`], and when not capped at least `min`.
    pub fn table_size(&self, cpus: usize) -> Option<u64> {
        (self.max_per_core > 0).then(|| {
            let scaled = u64::from(self.max_per_core).saturating_mul(cpus.max(1) as u64);
            if scaled > SCALED_TABLE_SIZE_CAP {
                SCALED_TABLE_SIZE_CAP
            } else {
                scaled.max(u64::from(self.min))
            }
        })
    }
}

const HASHSIZE: &str = "module/nf_conntrack/parameters/hashsize";

/// Applies `settings` to `/proc/sys` and `/sys` in the current network namespace,
/// with the number of online CPUs (from `/sys`, else what the scheduler allows).
pub fn apply_conntrack_sysctls(settings: &ConntrackSettings) -> NodePreparation {
    let sys = Path::new("/sys");
    let cpus = online_cpus(sys)
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1);
    apply_conntrack_sysctls_at(Path::new("/proc/sys"), sys, cpus, settings)
}

/// [`apply_conntrack_sysctls`] under other roots, with a given CPU count.
pub fn apply_conntrack_sysctls_at(
    proc_sys: &Path,
    sys: &Path,
    cpus: usize,
    settings: &ConntrackSettings,
) -> NodePreparation {
    let mut out = NodePreparation::default();
    let max_path = proc_sys.join("net/netfilter/nf_conntrack_max");
    match (settings.table_size(cpus), read_int(&max_path)) {
        (None, _) => {}
        (Some(max), Some(current)) if current > max => {
            tracing::info!(
                nf_conntrack_max = current,
                wanted = max,
                "the conntrack table is already larger than svcproxy's size: left as it is"
            );
            out.unchanged
                .push(format!("net.netfilter.nf_conntrack_max={current}"));
        }
        (Some(max), _) => grow_table(&mut out, proc_sys, sys, max),
    }
    let timeouts = [
        (
            "net.netfilter.nf_conntrack_tcp_timeout_established",
            settings.tcp_established_timeout,
        ),
        (
            "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
            settings.tcp_close_wait_timeout,
        ),
        (
            "net.netfilter.nf_conntrack_udp_timeout",
            settings.udp_timeout,
        ),
        (
            "net.netfilter.nf_conntrack_udp_timeout_stream",
            settings.udp_stream_timeout,
        ),
    ];
    for (name, timeout) in timeouts {
        let Some(timeout) = timeout.filter(|t| !t.is_zero()) else {
            continue;
        };
        if timeout < Duration::from_secs(1) {
            warn(
                &mut out,
                format!("not setting {name} to {timeout:?}: the kernel counts whole seconds"),
            );
            continue;
        }
        set(
            &mut out,
            proc_sys,
            name,
            timeout.as_secs(),
            "a conntrack timeout",
        );
    }
    if settings.tcp_be_liberal {
        set(
            &mut out,
            proc_sys,
            "net.netfilter.nf_conntrack_tcp_be_liberal",
            1,
            "liberal TCP tracking",
        );
    }
    out
}

/// Sets `nf_conntrack_max` to `max` and, once it has it, raises the hash table to a
/// quarter of it.
fn grow_table(out: &mut NodePreparation, proc_sys: &Path, sys: &Path, max: u64) {
    let written = set(
        out,
        proc_sys,
        "net.netfilter.nf_conntrack_max",
        max,
        "the conntrack table size",
    );
    if written {
        raise_hashsize(out, sys, max / 4);
    }
}

fn warn(out: &mut NodePreparation, warning: String) {
    tracing::warn!("{warning}");
    out.warnings.push(warning);
}

/// Sets one integer sysctl unless it already has `value`; whether it now has it.
fn set(out: &mut NodePreparation, proc_sys: &Path, name: &str, value: u64, what: &str) -> bool {
    let path = proc_sys.join(name.replace('.', "/"));
    let setting = format!("{name}={value}");
    if read_int(&path) == Some(value) {
        out.unchanged.push(setting);
        return true;
    }
    match std::fs::write(&path, format!("{value}\n")) {
        Ok(()) => {
            tracing::info!(sysctl = name, value, "conntrack setting changed");
            out.changed.push(setting);
            true
        }
        Err(e) => {
            warn(
                out,
                format!(
                    "cannot set {setting} ({}): {e}; {what} stays as it is",
                    path.display()
                ),
            );
            false
        }
    }
}

/// Raises the conntrack hash table to `buckets` if it is smaller (upstream skips the
/// write when not needed: it fails outside the initial network namespace).
fn raise_hashsize(out: &mut NodePreparation, sys: &Path, buckets: u64) {
    let path = sys.join(HASHSIZE);
    let setting = format!("nf_conntrack hashsize={buckets}");
    match read_int(&path) {
        Some(current) if current >= buckets => {
            out.unchanged
                .push(format!("nf_conntrack hashsize={current}"));
            return;
        }
        Some(_) => {}
        None => {
            warn(
                out,
                format!(
                    "cannot read {} to raise it to {buckets}; the conntrack hash table \
                     stays as it is",
                    path.display()
                ),
            );
            return;
        }
    }
    match std::fs::write(&path, format!("{buckets}\n")) {
        Ok(()) => {
            tracing::info!(hashsize = buckets, "conntrack hash table resized");
            out.changed.push(setting);
        }
        Err(e) => warn(
            out,
            format!(
                "cannot set {setting} ({}): {e} (a read-only /sys, as some container \
                 runtimes mount it?); problems may arise with a large table",
                path.display()
            ),
        ),
    }
}

fn read_int(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The number of online CPUs in `sys/devices/system/cpu/online` (`0-3,6,8-9`).
pub fn online_cpus(sys: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(sys.join("devices/system/cpu/online")).ok()?;
    parse_cpu_list(text.trim())
}

fn parse_cpu_list(list: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let count = match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                b.checked_sub(a)?.checked_add(1)?
            }
            None => {
                part.trim().parse::<usize>().ok()?;
                1
            }
        };
        n = n.checked_add(count)?;
    }
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fake `/proc/sys` and `/sys` with the conntrack files at the kernel defaults.
    struct Roots {
        _dir: tempfile::TempDir,
        proc_sys: PathBuf,
        sys: PathBuf,
    }

    const FILES: [(&str, &str); 7] = [
        ("nf_conntrack_max", "262144"),
        ("nf_conntrack_tcp_timeout_established", "432000"),
        ("nf_conntrack_tcp_timeout_close_wait", "60"),
        ("nf_conntrack_tcp_be_liberal", "0"),
        ("nf_conntrack_udp_timeout", "30"),
        ("nf_conntrack_udp_timeout_stream", "120"),
        ("nf_conntrack_buckets", "65536"),
    ];

    fn roots(hashsize: &str) -> Roots {
        let dir = tempfile::tempdir().unwrap();
        let proc_sys = dir.path().join("proc/sys");
        let sys = dir.path().join("sys");
        let nf = proc_sys.join("net/netfilter");
        std::fs::create_dir_all(&nf).unwrap();
        for (f, v) in FILES {
            std::fs::write(nf.join(f), format!("{v}\n")).unwrap();
        }
        let hs = sys.join(HASHSIZE);
        std::fs::create_dir_all(hs.parent().unwrap()).unwrap();
        std::fs::write(&hs, format!("{hashsize}\n")).unwrap();
        Roots {
            _dir: dir,
            proc_sys,
            sys,
        }
    }

    impl Roots {
        fn read(&self, name: &str) -> String {
            std::fs::read_to_string(self.proc_sys.join("net/netfilter").join(name))
                .unwrap()
                .trim()
                .to_string()
        }

        fn hashsize(&self) -> String {
            std::fs::read_to_string(self.sys.join(HASHSIZE))
                .unwrap()
                .trim()
                .to_string()
        }
    }

    fn secs(s: u64) -> Option<Duration> {
        Some(Duration::from_secs(s))
    }

    #[test]
    fn defaults_touch_nothing() {
        let r = roots("65536");
        let done =
            apply_conntrack_sysctls_at(&r.proc_sys, &r.sys, 8, &ConntrackSettings::default());
        assert_eq!(done, NodePreparation::default());
        for (f, v) in FILES {
            assert_eq!(r.read(f), v);
        }
    }

    #[test]
    fn max_is_per_core_times_cpus_with_a_floor_and_hashsize_follows() {
        let r = roots("65536");
        let s = ConntrackSettings {
            max_per_core: 32768,
            min: 131072,
            ..ConntrackSettings::default()
        };
        // 16 CPUs: 524288 > min; hashsize raised to a quarter.
        let done = apply_conntrack_sysctls_at(&r.proc_sys, &r.sys, 16, &s);
        assert_eq!(
            done.changed,
            [
                "net.netfilter.nf_conntrack_max=524288",
                "nf_conntrack hashsize=131072"
            ]
        );
        assert!(done.warnings.is_empty(), "{:?}", done.warnings);
        assert_eq!(r.read("nf_conntrack_max"), "524288");
        assert_eq!(r.hashsize(), "131072");
        // Again: nothing to do.
        let again = apply_conntrack_sysctls_at(&r.proc_sys, &r.sys, 16, &s);
        assert!(again.changed.is_empty(), "{again:?}");
        assert_eq!(again.unchanged.len(), 2);
        // 2 CPUs: 65536 < min, so min; hashsize 131072 is already larger.
        let r = roots("131072");
        std::fs::write(r.proc_sys.join("net/netfilter/nf_conntrack_max"), "65536\n").unwrap();
        let done = apply_conntrack_sysctls_at(&r.proc_sys, &r.sys, 2, &s);
        assert_eq!(done.changed, ["net.netfilter.nf_conntrack_max=131072"]);
        assert_eq!(done.unchanged, ["nf_conntrack hashsize=131072"]);
        assert_eq!(r.hashsize(), "131072");
    }

    #[test]
    fn a_larger_table_is_never_lowered() {
        // The kernel's 262144 is more than 2 × 32768 and min 131072 ask for: left
        // as it is, and nothing written (kube-proxy 1.38, k/k#142035).
        let r = roots("65536");
        let s = ConntrackSettings {
            max_per_core: 32768,
            min: 131072,
            ..ConntrackSettings::default()
        };
        let done = apply_conntrack_sysctls_at(&r.proc_sys, &r.sys, 2, &s);
        assert!(done.changed.is_empty(), "{done:?}");
        assert!(done.warnings.is_empty(), "{done:?}");
        assert_eq!(done.unchanged, ["net.netfilter.nf_conntrack_max=262144"]);
        assert_eq!(r.read("nf_conntrack_max"), "262144");
        assert_eq!(r.hashsize(), "65536");
    }

    #[test]
    fn the_scaled_size_is_capped_at_a_mebi_entries_as_upstream() {
        let s = |per_core: u32, min: u32| ConntrackSettings {
            max_per_core: per_core,
            min,
            ..ConntrackSettings::default()
        };
        // 512 CPUs × 32768 = 16 Mi: capped.
        assert_eq!(s(32768, 131072).table_size(512), Some(1_048_576));
        // Exactly at the cap: kept; just above: capped.
        assert_eq!(s(32768, 0).table_size(32), Some(1_048_576));
        assert_eq!(s(32769, 0).table_size(32), Some(1_048_576));
        // Below the cap, min still wins when larger, even above the cap.
        assert_eq!(s(1000, 2_000_000).table_size(4), Some(2_000_000));
        // Above the cap, the cap wins over min (upstream returns it first).
        assert_eq!(s(32768, 2_000_000).table_size(64), Some(1_048_576));
    }

    #[test]
    fn zero_per_core_leaves_the_table_alone_whatever_min_says() {
        let r = roots("1024");
        let s = ConntrackSettings {
            max_per_core: 0,
            min: 1_000_000,
            ..ConntrackSettings::default()
        };
        let done = apply_conntrack_sysctls_at(&r.proc_sys, &r.sys, 4, &s);
        assert_eq!(done, NodePreparation::default());
        assert_eq!(r.read("nf_conntrack_max"), "262144");
        assert_eq!(r.hashsize(), "1024");
        assert_eq!(s.table_size(4), None);
    }

    #[test]
    fn timeouts_and_liberal_mode_are_written_in_seconds() {
        let r = roots("65536");
        let s = ConntrackSettings {
            tcp_established_timeout: secs(86400),
            tcp_close_wait_timeout: secs(3600),
            tcp_be_liberal: true,
            udp_timeout: secs(45),
            udp_stream_timeout: Some(Duration::from_millis(180_900)),
            ..ConntrackSettings::default()
        };
        let done = apply_conntrack_sysctls_at(&r.proc_sys, &r.sys, 4, &s);
        assert!(done.warnings.is_empty(), "{:?}", done.warnings);
        assert_eq!(done.changed.len(), 5, "{:?}", done.changed);
        assert_eq!(r.read("nf_conntrack_tcp_timeout_established"), "86400");
        assert_eq!(r.read("nf_conntrack_tcp_timeout_close_wait"), "3600");
        assert_eq!(r.read("nf_conntrack_tcp_be_liberal"), "1");
        assert_eq!(r.read("nf_conntrack_udp_timeout"), "45");
        assert_eq!(r.read("nf_conntrack_udp_timeout_stream"), "180");
        // Zero means unset; a value already right is unchanged.
        let s2 = ConntrackSettings {
            tcp_established_timeout: Some(Duration::ZERO),
            udp_timeout: secs(45),
            ..ConntrackSettings::default()
        };
        let again = apply_conntrack_sysctls_at(&r.proc_sys, &r.sys, 4, &s2);
        assert_eq!(
            again.unchanged,
            ["net.netfilter.nf_conntrack_udp_timeout=45"]
        );
        assert!(again.changed.is_empty());
        // Sub-second: a warning, not a 0 written.
        let s3 = ConntrackSettings {
            udp_timeout: Some(Duration::from_millis(500)),
            ..ConntrackSettings::default()
        };
        let w = apply_conntrack_sysctls_at(&r.proc_sys, &r.sys, 4, &s3);
        assert_eq!(w.warnings.len(), 1);
        assert_eq!(r.read("nf_conntrack_udp_timeout"), "45");
    }

    #[test]
    fn failures_are_warnings_naming_the_file_and_value() {
        let dir = tempfile::tempdir().unwrap();
        // Nothing exists: every write fails.
        let s = ConntrackSettings {
            max_per_core: 1000,
            min: 0,
            udp_timeout: secs(60),
            tcp_be_liberal: true,
            ..ConntrackSettings::default()
        };
        let missing = dir.path().join("missing");
        let done = apply_conntrack_sysctls_at(&missing, &missing, 2, &s);
        assert!(done.changed.is_empty());
        assert_eq!(done.warnings.len(), 3, "{:?}", done.warnings);
        assert!(done.warnings[0].contains("nf_conntrack_max=2000"));
        assert!(done.warnings[0].contains("missing/net/netfilter/nf_conntrack_max"));
        assert!(done.warnings[1].contains("nf_conntrack_udp_timeout=60"));
        // The table was resized but hashsize cannot be read: a warning.
        let r = roots("1");
        std::fs::write(r.proc_sys.join("net/netfilter/nf_conntrack_max"), "1000\n").unwrap();
        std::fs::remove_file(r.sys.join(HASHSIZE)).unwrap();
        let done = apply_conntrack_sysctls_at(&r.proc_sys, &r.sys, 2, &s);
        assert!(done
            .changed
            .contains(&"net.netfilter.nf_conntrack_max=2000".to_string()));
        assert!(
            done.warnings.iter().any(|w| w.contains("hashsize")),
            "{:?}",
            done.warnings
        );
    }

    #[test]
    fn read_only_sys_is_a_warning() {
        let r = roots("16");
        // A directory where the file should be: reading and writing both fail the
        // way a read-only or odd /sys would, as root too.
        let hs = r.sys.join(HASHSIZE);
        std::fs::remove_file(&hs).unwrap();
        std::fs::create_dir(&hs).unwrap();
        std::fs::write(r.proc_sys.join("net/netfilter/nf_conntrack_max"), "64\n").unwrap();
        let s = ConntrackSettings {
            max_per_core: 100,
            ..ConntrackSettings::default()
        };
        let done = apply_conntrack_sysctls_at(&r.proc_sys, &r.sys, 1, &s);
        assert_eq!(done.changed, ["net.netfilter.nf_conntrack_max=100"]);
        assert_eq!(done.warnings.len(), 1, "{:?}", done.warnings);
    }

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(parse_cpu_list("0-3"), Some(4));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-3,6,8-9"), Some(7));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(parse_cpu_list("0-18446744073709551615"), None);
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("devices/system/cpu/online");
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(&f, "0-1\n").unwrap();
        assert_eq!(online_cpus(dir.path()), Some(2));
    }
}
