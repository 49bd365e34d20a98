//! `svcproxy-echo`: the backend and client of the end-to-end tests.
//!
//! `serve` runs in every pod namespace and answers with its name and the addresses it saw;
//! `probe` runs in a client namespace and prints one JSON line per attempt. The logic lives
//! in `svcproxy_e2e::echo`; this file only parses arguments.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use clap::{Parser, Subcommand};
use svcproxy_e2e::echo::{self, ProbeConfig, SctpMode, ServeConfig};
use svcproxy_e2e::probe::Proto;

#[derive(Parser)]
#[command(
    name = "svcproxy-echo",
    about = "Echo backend and probe client for svcproxy e2e tests"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Answer TCP connections, UDP datagrams and SCTP associations with one JSON line.
    Serve {
        /// Backend name reported in every reply (the pod name).
        #[arg(long)]
        name: String,
        /// TCP ports, comma separated.
        #[arg(long, value_delimiter = ',')]
        tcp: Vec<u16>,
        /// UDP ports, comma separated.
        #[arg(long, value_delimiter = ',')]
        udp: Vec<u16>,
        /// SCTP ports, comma separated.
        #[arg(long, value_delimiter = ',')]
        sctp: Vec<u16>,
        /// Local addresses for UDP / raw SCTP (default: every global and loopback address).
        #[arg(long, value_delimiter = ',')]
        addr: Vec<IpAddr>,
        /// auto, kernel or raw.
        #[arg(long, default_value = "auto")]
        sctp_mode: SctpMode,
        /// Exit after this many seconds: a safety net for leaked servers.
        #[arg(long, default_value_t = 900)]
        lifetime_secs: u64,
    },
    /// Make N attempts and print one JSON line per attempt.
    Probe {
        #[arg(long)]
        proto: Proto,
        #[arg(long)]
        target: SocketAddr,
        #[arg(long, default_value_t = 1)]
        count: usize,
        #[arg(long, default_value_t = 1000)]
        timeout_ms: u64,
        /// Bind this source address.
        #[arg(long)]
        source_ip: Option<IpAddr>,
        /// Bind this source port on every attempt.
        #[arg(long)]
        source_port: Option<u16>,
        /// Pause between attempts.
        #[arg(long, default_value_t = 0)]
        interval_ms: u64,
        /// auto, kernel or raw.
        #[arg(long, default_value = "auto")]
        sctp_mode: SctpMode,
        /// UDP: sendto() from an unconnected socket instead of connecting.
        #[arg(long)]
        unconnected: bool,
        /// UDP: one connected socket for every attempt, as a resolver keeps one;
        /// after an error other than a timeout, the next attempt opens a new one.
        #[arg(long, conflicts_with = "unconnected")]
        keep_socket: bool,
    },
    /// One DNS query over UDP (or TCP); prints the answer as one JSON line: the
    /// response code and the answer section's data, sorted.
    Dns {
        #[arg(long)]
        server: SocketAddr,
        #[arg(long)]
        name: String,
        /// A, AAAA, SRV, PTR, ...
        #[arg(long, default_value = "A")]
        qtype: String,
        #[arg(long)]
        tcp: bool,
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Serve {
            name,
            tcp,
            udp,
            sctp,
            addr,
            sctp_mode,
            lifetime_secs,
        } => echo::serve(ServeConfig {
            name,
            tcp,
            udp,
            sctp,
            addrs: addr,
            sctp_mode: Some(sctp_mode),
            lifetime: Duration::from_secs(lifetime_secs),
        }),
        Cmd::Probe {
            proto,
            target,
            count,
            timeout_ms,
            source_ip,
            source_port,
            interval_ms,
            sctp_mode,
            unconnected,
            keep_socket,
        } => {
            let cfg = ProbeConfig {
                proto,
                target,
                count,
                timeout: Duration::from_millis(timeout_ms),
                source_ip,
                source_port,
                interval: Duration::from_millis(interval_ms),
                sctp_mode: Some(sctp_mode),
                unconnected,
                keep_socket,
            };
            echo::probe(&cfg, |line| {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{}", serde_json::to_string(line).unwrap_or_default());
                let _ = out.flush();
            });
            Ok(())
        }
        Cmd::Dns {
            server,
            name,
            qtype,
            tcp,
            timeout_ms,
        } => {
            use svcproxy_dns::probe;
            let qtype: hickory_proto::rr::RecordType = qtype
                .parse()
                .map_err(|e| anyhow::anyhow!("--qtype {qtype:?}: {e}"))?;
            let q = probe::query(&name, qtype, None);
            let timeout = Duration::from_millis(timeout_ms);
            let answer = if tcp {
                probe::tcp(server, &q, timeout)?
            } else {
                probe::udp(server, &q, timeout)?.0
            };
            println!(
                "{}",
                serde_json::json!({
                    "code": answer.metadata.response_code.to_string(),
                    "answers": probe::answers(&answer),
                })
            );
            Ok(())
        }
    }
}
