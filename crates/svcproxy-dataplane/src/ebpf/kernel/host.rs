//! What the node offers the mode, asked of the kernel: its release
//! ([`kernel_release`], [`kernel_version`]), where the cgroup v2 hierarchy is
//! mounted ([`cgroup2_root`]), whether a directory is on a bpffs
//! ([`on_bpffs`]) and which svcproxy pins into ([`own_pin_dir`]), and the cookie of this network namespace ([`netns_cookie`]),
//! the pins' owner.

use std::path::{Path, PathBuf};

use super::kernel_err;
use crate::error::DataPlaneError;

/// `statfs(2)`'s magic number of a bpffs.
const BPF_FS_MAGIC: u64 = 0xcafe_4a11;

/// `statfs(2)`'s magic number of a cgroup v2 file system.
pub(super) const CGROUP2_SUPER_MAGIC: u64 = 0x6367_7270;

/// Where a bpffs is mounted when none is (the kernel's conventional place).
pub(super) const BPFFS_HOME: &str = "/sys/fs/bpf";

/// The running kernel's release (`uname -r`).
pub(super) fn kernel_release() -> String {
    rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned()
}

/// The major and minor version of a kernel release such as `6.12.48+deb13-amd64`;
/// None when it does not start with them.
pub(super) fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether `dir` is on a bpffs.
pub fn on_bpffs(dir: &Path) -> bool {
    rustix::fs::statfs(dir).is_ok_and(|s| s.f_type as u64 == BPF_FS_MAGIC)
}

/// The directory svcproxy pins into for `--ebpf-bpffs DIR`: `DIR` itself when it
/// lies inside a bpffs, and `DIR/svcproxy` when `DIR` is a bpffs (its mount point,
/// as Cilium's `--bpf-root` takes it) or the kernel's conventional place for one
/// (`/sys/fs/bpf`, which preflight mounts when nothing is): svcproxy owns a
/// directory of its own, never a whole bpffs.
pub fn own_pin_dir(dir: &Path) -> PathBuf {
    let parent = dir.parent().unwrap_or(dir);
    let is_root = dir == Path::new(BPFFS_HOME) || (on_bpffs(dir) && !on_bpffs(parent));
    if is_root {
        dir.join("svcproxy")
    } else {
        dir.to_path_buf()
    }
}

/// The cookie of the calling thread's network namespace (`SO_NETNS_COOKIE`), as
/// the programs' `bpf_get_netns_cookie` reads it for a socket of that namespace.
/// No crate of ours wraps this socket option: one `getsockopt(2)`.
#[allow(unsafe_code)]
pub(super) fn netns_cookie() -> Result<u64, DataPlaneError> {
    use std::os::fd::AsRawFd;
    const SO_NETNS_COOKIE: libc::c_int = 71;
    let sock = std::net::UdpSocket::bind("127.0.0.1:0")
        .or_else(|_| std::net::UdpSocket::bind("[::1]:0"))
        .map_err(|e| kernel_err("a socket to read the network namespace's cookie", e))?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: a valid socket, and a buffer of the length given.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(kernel_err(
            "getsockopt(SO_NETNS_COOKIE)",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(cookie)
}

/// Where a cgroup v2 hierarchy is mounted, from `/proc/self/mountinfo`.
pub fn cgroup2_root() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))
            .flatten()
    })
}

/// Whether any of the capabilities `mask` names (bit `1 << CAP_*`) is among this
/// process's effective ones.
pub(super) fn has_any_capability(mask: u64) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & mask != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_are_read_from_releases() {
        assert_eq!(kernel_version("6.12.48+deb13-amd64"), Some((6, 12)));
        assert_eq!(kernel_version("6.6.0"), Some((6, 6)));
        assert_eq!(kernel_version("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(kernel_version("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(kernel_version("4.18.0-513.el8.x86_64"), Some((4, 18)));
        assert!(kernel_version("6.6.0").is_some_and(|v| v < (6, 7)));
        assert!(kernel_version("6.10.0").is_some_and(|v| v >= (6, 7)));
        assert_eq!(kernel_version("6"), None);
        assert_eq!(kernel_version(""), None);
        assert_eq!(kernel_version("linux-6.6"), None);
    }
}
