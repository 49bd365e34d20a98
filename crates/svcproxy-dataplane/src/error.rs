//! The data plane's error type.

use std::io;

/// At most this many bytes of `nft`'s stderr are kept in an error (a rejected
/// script of 30k services can make `nft` print an error per line).
pub const STDERR_LIMIT: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum DataPlaneError {
    /// The command could not be started (missing binary, no permission).
    #[error("cannot start `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: io::Error,
    },
    /// Writing the script to the command or waiting for it failed.
    #[error("talking to `{command}`: {source}")]
    Io {
        command: String,
        #[source]
        source: io::Error,
    },
    /// The command did not finish in time and was killed: nft applies a file as one
    /// transaction, so a killed nft applied nothing.
    #[error("`{command}` did not finish within {after:?} and was killed")]
    TimedOut {
        command: String,
        after: std::time::Duration,
    },
    /// The command ran and failed: the transaction was not applied.
    #[error("`{command}` failed ({status}): {stderr}")]
    Rejected {
        command: String,
        /// How it ended, e.g. `exit status: 1`.
        status: String,
        /// Its stderr, trimmed and bounded to [`STDERR_LIMIT`] bytes.
        stderr: String,
    },
    /// A partial sync failed (for the modes that count those apart, as upstream's
    /// iptables mode does); the next sync is full.
    #[error("partial sync: {0}")]
    Partial(Box<DataPlaneError>),
    /// A kernel call made directly (no command in between) failed: loading or
    /// attaching a BPF program, writing a BPF map.
    #[error("{what}: {reason}")]
    Kernel { what: String, reason: String },
    /// A BPF map has no room for a key (it holds `max_entries`).
    #[error("{what}: the BPF map {map} is full")]
    MapFull { map: &'static str, what: String },
}

impl DataPlaneError {
    /// The command's (bounded) stderr, when it ran and failed.
    pub fn stderr(&self) -> Option<&str> {
        match self {
            DataPlaneError::Rejected { stderr, .. } => Some(stderr),
            DataPlaneError::Partial(inner) => inner.stderr(),
            _ => None,
        }
    }

    /// Whether this is the failure of a partial sync.
    pub fn is_partial(&self) -> bool {
        matches!(self, DataPlaneError::Partial(_))
    }

    /// Whether the kernel (or the tool, in its own words) refused for want of
    /// privilege: EPERM or EACCES.
    pub fn permission_denied(&self) -> bool {
        match self {
            DataPlaneError::Spawn { source, .. } | DataPlaneError::Io { source, .. } => {
                is_permission_error(source)
            }
            DataPlaneError::Rejected { stderr: text, .. }
            | DataPlaneError::Kernel { reason: text, .. } => says_permission_denied(text),
            DataPlaneError::Partial(inner) => inner.permission_denied(),
            DataPlaneError::TimedOut { .. } | DataPlaneError::MapFull { .. } => false,
        }
    }
}

/// An I/O error that is the kernel refusing for want of privilege.
pub fn is_permission_error(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied
        || matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES))
}

/// A tool's or library's message for EPERM or EACCES (`strerror`'s words), the
/// only form some of them give it in.
fn says_permission_denied(text: &str) -> bool {
    text.contains("Operation not permitted") || text.contains("Permission denied")
}

/// `bytes` as text, trailing whitespace trimmed, cut to at most `limit` bytes (on a
/// character boundary) with a note of how much was dropped.
pub(crate) fn bounded_text(bytes: &[u8], limit: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim_end();
    if text.len() <= limit {
        return text.to_string();
    }
    let mut cut = limit;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… [{} more bytes]", &text[..cut], text.len() - cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_and_trimmed() {
        assert_eq!(bounded_text(b"Error: x\n\n", 100), "Error: x");
    }

    #[test]
    fn long_text_is_cut_on_a_char_boundary() {
        let text = "é".repeat(10); // 20 bytes
        let out = bounded_text(text.as_bytes(), 5);
        assert_eq!(out, "éé… [16 more bytes]");
        let huge = vec![b'e'; 1 << 20];
        assert!(bounded_text(&huge, STDERR_LIMIT).len() < STDERR_LIMIT + 64);
    }
}
