//! What a probe saw: the JSON lines `svcproxy-echo` speaks, and their typed reading.
//!
//! A backend answers every TCP connection / UDP datagram / SCTP association with one
//! [`Reply`] line; `svcproxy-echo probe` prints one [`ProbeLine`] per attempt; the library
//! turns those into [`Attempt`]s whose [`ProbeResult`] tests match on. Keeping the wire types
//! here, shared by the binary and the library, means the two cannot drift apart.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Transport protocols the proxy handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    pub const ALL: [Proto; 3] = [Proto::Tcp, Proto::Udp, Proto::Sctp];

    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Proto {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Ok(Proto::Tcp),
            "udp" => Ok(Proto::Udp),
            "sctp" => Ok(Proto::Sctp),
            other => Err(format!("unknown protocol {other:?} (tcp, udp, sctp)")),
        }
    }
}

/// A backend's answer: who answered, on which address and port (after any DNAT), and the
/// client address it saw (after any SNAT).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub backend: String,
    pub ip: IpAddr,
    pub port: u16,
    pub client: SocketAddr,
    pub proto: Proto,
}

/// One attempt as `svcproxy-echo probe` prints it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeLine {
    /// Attempt number, from 0.
    pub n: usize,
    /// `answered`, `refused`, `unreachable`, `timeout` or `error`.
    pub result: String,
    pub elapsed_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<Reply>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The client's own address for this attempt, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<SocketAddr>,
    /// The peer the client's socket reports (`getpeername(2)`, or where an
    /// unconnected UDP reply came from): the service address when a proxy
    /// translated the connection at the socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<SocketAddr>,
}

/// The outcome of one connection attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeResult {
    /// A backend answered.
    Answered {
        backend: String,
        backend_ip: IpAddr,
        backend_port: u16,
        client_seen: SocketAddr,
    },
    /// Actively refused: TCP RST, ICMP port unreachable, SCTP ABORT. Immediate.
    Refused,
    /// ICMP host / network unreachable or administratively prohibited, or no route here.
    Unreachable(String),
    /// Nothing came back within the timeout (what a DROP looks like).
    TimedOut,
    /// Anything else (a reset after connecting, a garbled reply, a local error).
    Other(String),
}

/// One attempt with its timing, as returned by `Cluster::probe`.
#[derive(Clone, Debug, PartialEq)]
pub struct Attempt {
    pub result: ProbeResult,
    pub elapsed: Duration,
    pub local: Option<SocketAddr>,
    /// See [`ProbeLine::peer`].
    pub peer: Option<SocketAddr>,
}

impl Attempt {
    pub fn backend(&self) -> Option<&str> {
        match &self.result {
            ProbeResult::Answered { backend, .. } => Some(backend),
            _ => None,
        }
    }

    pub fn client_seen(&self) -> Option<SocketAddr> {
        match &self.result {
            ProbeResult::Answered { client_seen, .. } => Some(*client_seen),
            _ => None,
        }
    }

    pub fn is_refused(&self) -> bool {
        self.result == ProbeResult::Refused
    }

    pub fn is_timeout(&self) -> bool {
        self.result == ProbeResult::TimedOut
    }

    /// A short label for tallies: the backend name, or `refused` / `unreachable` /
    /// `timeout` / `other`.
    pub fn label(&self) -> String {
        match &self.result {
            ProbeResult::Answered { backend, .. } => backend.clone(),
            ProbeResult::Refused => "refused".into(),
            ProbeResult::Unreachable(_) => "unreachable".into(),
            ProbeResult::TimedOut => "timeout".into(),
            ProbeResult::Other(_) => "other".into(),
        }
    }
}

impl From<ProbeLine> for Attempt {
    fn from(line: ProbeLine) -> Attempt {
        let result = match (line.result.as_str(), line.reply) {
            ("answered", Some(r)) => ProbeResult::Answered {
                backend: r.backend,
                backend_ip: r.ip,
                backend_port: r.port,
                client_seen: r.client,
            },
            ("refused", _) => ProbeResult::Refused,
            ("unreachable", _) => ProbeResult::Unreachable(line.error.unwrap_or_default()),
            ("timeout", _) => ProbeResult::TimedOut,
            (other, _) => ProbeResult::Other(line.error.unwrap_or_else(|| other.to_string())),
        };
        Attempt {
            result,
            elapsed: Duration::from_secs_f64(line.elapsed_ms.max(0.0) / 1000.0),
            local: line.local,
            peer: line.peer,
        }
    }
}

/// Counts attempts per [`Attempt::label`], e.g. `{"pod-a0": 97, "pod-a1": 103}`: the shape
/// spread and "only allowed backends" assertions want.
pub fn tally(attempts: &[Attempt]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for a in attempts {
        *counts.entry(a.label()).or_insert(0) += 1;
    }
    counts
}

/// `svcproxy-echo probe`'s arguments (after the binary) for a resolver-like UDP
/// client of `target`: one connected socket kept across attempts, a new one
/// after an error; 300 attempts 50 ms apart at most, each waiting 500 ms.
pub fn kept_udp_probe_args(target: &str) -> Vec<String> {
    [
        "probe",
        "--proto",
        "udp",
        "--target",
        target,
        "--keep-socket",
        "--count",
        "300",
        "--interval-ms",
        "50",
        "--timeout-ms",
        "500",
    ]
    .map(String::from)
    .to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answered_line_reads_as_answered_with_timing() {
        let line = r#"{"n":0,"result":"answered","elapsed_ms":1.5,"reply":{"backend":"pod-a0","ip":"198.18.17.1","port":8080,"client":"198.18.0.100:40000","proto":"tcp"}}"#;
        let a: Attempt = serde_json::from_str::<ProbeLine>(line).unwrap().into();
        assert_eq!(a.backend(), Some("pod-a0"));
        assert_eq!(a.client_seen(), Some("198.18.0.100:40000".parse().unwrap()));
        assert_eq!(a.elapsed, Duration::from_micros(1500));
    }

    #[test]
    fn refusals_and_timeouts_tally_by_label() {
        let mk = |r: &str| -> Attempt {
            ProbeLine {
                n: 0,
                result: r.into(),
                elapsed_ms: 0.0,
                reply: None,
                error: None,
                local: None,
                peer: None,
            }
            .into()
        };
        let t = tally(&[mk("refused"), mk("timeout"), mk("timeout"), mk("weird")]);
        assert_eq!(t["refused"], 1);
        assert_eq!(t["timeout"], 2);
        assert_eq!(t["other"], 1);
    }
}
