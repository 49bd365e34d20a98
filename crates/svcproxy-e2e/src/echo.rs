//! The echo backend and the probe client behind the `svcproxy-echo` binary.
//!
//! `serve` answers every TCP connection, UDP datagram and SCTP association with one JSON
//! [`Reply`] line naming the backend, the local address and port it was reached on (after
//! DNAT) and the client address it saw (after SNAT). `probe` makes N fresh attempts and
//! prints one [`ProbeLine`] each, telling an answer from an immediate refusal from a
//! timeout, with the elapsed time.
//!
//! Blocking sockets and one thread per listening socket: a test backend serves a few hundred
//! connections, and plain threads keep the tool small and obviously correct.
//!
//! Entry points: [`serve`], [`probe`], [`SctpMode`].

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::process::Command;
use std::str::FromStr;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::probe::{ProbeLine, Proto, Reply};
use crate::sctp_raw;

/// How SCTP is spoken: through the kernel's SCTP sockets, or emulated on raw sockets when
/// the kernel has no SCTP module (see [`crate::sctp_raw`]). Both ends of a probe must use
/// the same mode; `auto` picks the same one on both since it depends only on the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SctpMode {
    Kernel,
    Raw,
    Unavailable,
}

/// Overrides SCTP mode detection (`kernel` or `raw`), e.g. to exercise the raw emulation on
/// a kernel that has SCTP.
pub const SCTP_MODE_ENV: &str = "SVCPROXY_E2E_SCTP";

impl SctpMode {
    /// The mode this kernel supports (or the override in `SVCPROXY_E2E_SCTP`).
    pub fn detect() -> SctpMode {
        match std::env::var(SCTP_MODE_ENV).ok().as_deref() {
            Some("kernel") => return SctpMode::Kernel,
            Some("raw") => return SctpMode::Raw,
            _ => {}
        }
        if Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::from(132))).is_ok() {
            SctpMode::Kernel
        } else if Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(132))).is_ok() {
            SctpMode::Raw
        } else {
            SctpMode::Unavailable
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SctpMode::Kernel => "kernel",
            SctpMode::Raw => "raw",
            SctpMode::Unavailable => "unavailable",
        }
    }
}

impl FromStr for SctpMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(SctpMode::detect()),
            "kernel" => Ok(SctpMode::Kernel),
            "raw" => Ok(SctpMode::Raw),
            other => Err(format!("unknown SCTP mode {other:?} (auto, kernel, raw)")),
        }
    }
}

/// What `serve` listens on.
#[derive(Clone, Debug, Default)]
pub struct ServeConfig {
    pub name: String,
    pub tcp: Vec<u16>,
    pub udp: Vec<u16>,
    pub sctp: Vec<u16>,
    /// Local addresses for UDP and raw SCTP; empty: every global and loopback address of
    /// this namespace.
    pub addrs: Vec<IpAddr>,
    pub sctp_mode: Option<SctpMode>,
    /// Exit after this long, so a leaked server cannot outlive a test run by much.
    pub lifetime: Duration,
}

/// The first stdout line of `serve`, once every socket is bound.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ready {
    pub ready: bool,
    pub name: String,
    pub sctp: SctpMode,
    pub addrs: Vec<IpAddr>,
}

/// Binds everything, prints the [`Ready`] line, then serves until `lifetime` passes.
pub fn serve(cfg: ServeConfig) -> Result<()> {
    let addrs = if cfg.addrs.is_empty() {
        local_addrs()?
    } else {
        cfg.addrs.clone()
    };
    let sctp_mode = cfg.sctp_mode.unwrap_or_else(SctpMode::detect);
    let wildcards = [
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    ];
    // Bind everything before reporting ready, so a bind error fails the start, not a probe.
    let mut stream_listeners = Vec::new();
    for &port in &cfg.tcp {
        for ip in wildcards {
            stream_listeners.push((
                Proto::Tcp,
                listen(Protocol::TCP, SocketAddr::new(ip, port))?,
            ));
        }
    }
    let mut raw_sctp = false;
    if !cfg.sctp.is_empty() {
        match sctp_mode {
            SctpMode::Kernel => {
                for &port in &cfg.sctp {
                    for ip in wildcards {
                        let addr = SocketAddr::new(ip, port);
                        stream_listeners.push((Proto::Sctp, listen(Protocol::from(132), addr)?));
                    }
                }
            }
            SctpMode::Raw => raw_sctp = true,
            SctpMode::Unavailable => eprintln!("svcproxy-echo: SCTP unavailable in this kernel"),
        }
    }
    let mut udp_sockets = Vec::new();
    for &port in &cfg.udp {
        // One socket per address rather than a wildcard: the reply then leaves from the
        // address the datagram was sent to (after DNAT), which conntrack needs to un-NAT it,
        // and the socket's own address is the "ip" we report.
        for &ip in &addrs {
            let sock = UdpSocket::bind(SocketAddr::new(ip, port))
                .with_context(|| format!("binding udp {ip} port {port}"))?;
            udp_sockets.push(sock);
        }
    }

    for (proto, listener) in stream_listeners {
        let name = cfg.name.clone();
        thread::spawn(move || accept_loop(&name, proto, listener));
    }
    for sock in udp_sockets {
        let name = cfg.name.clone();
        thread::spawn(move || udp_loop(&name, sock));
    }
    if raw_sctp {
        for &ip in &addrs {
            let (name, ports) = (cfg.name.clone(), cfg.sctp.clone());
            thread::spawn(move || {
                if let Err(e) = sctp_raw::serve(&name, ip, &ports) {
                    eprintln!("svcproxy-echo: raw sctp on {ip}: {e}");
                }
            });
        }
    }

    let ready = Ready {
        ready: true,
        name: cfg.name.clone(),
        sctp: sctp_mode,
        addrs,
    };
    let mut out = io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(&ready)?)?;
    out.flush()?;
    drop(out);
    thread::sleep(cfg.lifetime);
    Ok(())
}

fn listen(proto: Protocol, addr: SocketAddr) -> Result<Socket> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(proto))
        .with_context(|| format!("creating {proto:?} socket"))?;
    if addr.is_ipv6() {
        // Separate v4 and v6 listeners: a dual-stack socket would report IPv4 clients as
        // ::ffff:a.b.c.d, which no test expects.
        sock.set_only_v6(true)?;
    }
    sock.set_reuse_address(true)?;
    sock.bind(&addr.into())
        .with_context(|| format!("binding {proto:?} {addr}"))?;
    sock.listen(1024)?;
    Ok(sock)
}

fn accept_loop(name: &str, proto: Proto, listener: Socket) {
    loop {
        let (conn, peer) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("svcproxy-echo: accept ({proto}): {e}");
                thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let (Some(local), Some(peer)) = (
            conn.local_addr().ok().and_then(|a| a.as_socket()),
            peer.as_socket(),
        ) else {
            continue;
        };
        let reply = Reply {
            backend: name.to_string(),
            ip: local.ip(),
            port: local.port(),
            client: peer,
            proto,
        };
        let mut stream: TcpStream = conn.into();
        let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
        let line = serde_json::to_string(&reply).unwrap_or_default() + "\n";
        let _ = stream.write_all(line.as_bytes());
        let _ = stream.shutdown(std::net::Shutdown::Write);
    }
}

fn udp_loop(name: &str, sock: UdpSocket) {
    let local = match sock.local_addr() {
        Ok(a) => a,
        Err(_) => return,
    };
    let mut buf = [0u8; 2048];
    loop {
        let (_, peer) = match sock.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e) => {
                // ECONNREFUSED from an earlier reply's ICMP error, or an interrupt: keep going.
                if e.kind() != io::ErrorKind::ConnectionRefused {
                    thread::sleep(Duration::from_millis(5));
                }
                continue;
            }
        };
        let reply = Reply {
            backend: name.to_string(),
            ip: local.ip(),
            port: local.port(),
            client: peer,
            proto: Proto::Udp,
        };
        let line = serde_json::to_string(&reply).unwrap_or_default() + "\n";
        let _ = sock.send_to(line.as_bytes(), peer);
    }
}

/// Global and loopback addresses of this namespace (link-local ones need a scope id and are
/// never a service's endpoint).
fn local_addrs() -> Result<Vec<IpAddr>> {
    let out = Command::new("ip")
        .args(["-j", "addr", "show"])
        .output()
        .context("running `ip -j addr show`")?;
    if !out.status.success() {
        bail!(
            "`ip -j addr show` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let links: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let mut addrs = Vec::new();
    for link in links.as_array().into_iter().flatten() {
        for info in link["addr_info"].as_array().into_iter().flatten() {
            if info["scope"] == "link" {
                continue;
            }
            if let Some(ip) = info["local"].as_str().and_then(|s| s.parse().ok()) {
                addrs.push(ip);
            }
        }
    }
    addrs.sort();
    addrs.dedup();
    Ok(addrs)
}

/// What `probe` does.
#[derive(Clone, Debug)]
pub struct ProbeConfig {
    pub proto: Proto,
    pub target: SocketAddr,
    pub count: usize,
    pub timeout: Duration,
    pub source_ip: Option<IpAddr>,
    pub source_port: Option<u16>,
    pub interval: Duration,
    pub sctp_mode: Option<SctpMode>,
    /// UDP: send with `sendto(2)` from an unconnected socket and take the reply
    /// with `recvfrom(2)`, instead of connecting.
    pub unconnected: bool,
    /// UDP: one connected socket kept across attempts (a new one after an
    /// error other than a timeout).
    pub keep_socket: bool,
}

/// Runs `count` attempts, calling `emit` with each line as soon as it is known.
pub fn probe(cfg: &ProbeConfig, mut emit: impl FnMut(&ProbeLine)) {
    let sctp_mode = cfg.sctp_mode.unwrap_or_else(SctpMode::detect);
    let mut kept: Option<UdpSocket> = None;
    for n in 0..cfg.count {
        if n > 0 && !cfg.interval.is_zero() {
            thread::sleep(cfg.interval);
        }
        let start = Instant::now();
        let mut peer = None;
        let (outcome, local) = match cfg.proto {
            Proto::Tcp => stream_attempt(cfg, Protocol::TCP, &mut peer),
            Proto::Udp if cfg.keep_socket => kept_udp_attempt(cfg, &mut kept, &mut peer),
            Proto::Udp => udp_attempt(cfg, &mut peer),
            Proto::Sctp => match sctp_mode {
                SctpMode::Kernel => stream_attempt(cfg, Protocol::from(132), &mut peer),
                SctpMode::Raw => raw_sctp_attempt(cfg),
                SctpMode::Unavailable => (
                    Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        "SCTP unavailable in this kernel",
                    )),
                    None,
                ),
            },
        };
        let elapsed_ms = start.elapsed().as_secs_f64() * 1000.0;
        let mut line = ProbeLine {
            n,
            result: String::new(),
            elapsed_ms: (elapsed_ms * 1000.0).round() / 1000.0,
            reply: None,
            error: None,
            local,
            peer,
        };
        match outcome {
            Ok(reply) => {
                line.result = "answered".into();
                line.reply = Some(reply);
            }
            Err(e) => {
                let (result, detail) = classify(&e);
                line.result = result.into();
                line.error = detail.then(|| e.to_string());
            }
        }
        emit(&line);
    }
}

/// Maps a socket error to a probe result, and whether the error text is worth keeping.
fn classify(e: &io::Error) -> (&'static str, bool) {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => ("refused", false),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => ("timeout", false),
        io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => ("unreachable", true),
        _ => ("error", true),
    }
}

type Attempted = (io::Result<Reply>, Option<SocketAddr>);

fn source_addr(cfg: &ProbeConfig) -> Option<SocketAddr> {
    if cfg.source_ip.is_none() && cfg.source_port.is_none() {
        return None;
    }
    let ip = cfg.source_ip.unwrap_or(match cfg.target {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    });
    Some(SocketAddr::new(ip, cfg.source_port.unwrap_or(0)))
}

/// `peer`: the address `getpeername(2)` gives once connected.
fn stream_attempt(cfg: &ProbeConfig, proto: Protocol, peer: &mut Option<SocketAddr>) -> Attempted {
    let start = Instant::now();
    let sock = match Socket::new(Domain::for_address(cfg.target), Type::STREAM, Some(proto)) {
        Ok(s) => s,
        Err(e) => return (Err(e), None),
    };
    if let Some(src) = source_addr(cfg) {
        // A fixed source port is reused attempt after attempt; the previous connection may
        // still be closing.
        let bound = sock
            .set_reuse_address(true)
            .and_then(|_| sock.bind(&SockAddr::from(src)));
        if let Err(e) = bound {
            return (Err(e), None);
        }
    }
    if let Err(e) = sock.connect_timeout(&cfg.target.into(), cfg.timeout) {
        return (Err(e), None);
    }
    let local = sock.local_addr().ok().and_then(|a| a.as_socket());
    *peer = sock.peer_addr().ok().and_then(|a| a.as_socket());
    let left = cfg.timeout.saturating_sub(start.elapsed());
    let mut stream: TcpStream = sock.into();
    if let Err(e) = stream.set_read_timeout(Some(left.max(Duration::from_millis(1)))) {
        return (Err(e), local);
    }
    let mut buf = Vec::new();
    // A reply is one short line; the cap bounds a misbehaving peer.
    let read = (&mut stream).take(4096).read_to_end(&mut buf);
    let result = match read {
        Ok(_) => parse_reply(&buf),
        Err(e) if !buf.is_empty() => parse_reply(&buf).map_err(|_| e),
        Err(e) => Err(e),
    };
    (result, local)
}

/// `peer`: the connected socket's `getpeername(2)`, or the address the reply
/// came from (unconnected).
fn udp_attempt(cfg: &ProbeConfig, peer: &mut Option<SocketAddr>) -> Attempted {
    let bind = source_addr(cfg).unwrap_or(match cfg.target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    });
    let sock = match Socket::new(
        Domain::for_address(cfg.target),
        Type::DGRAM,
        Some(Protocol::UDP),
    )
    .and_then(|s| {
        s.set_reuse_address(true)?;
        s.bind(&bind.into())?;
        Ok(s)
    }) {
        Ok(s) => UdpSocket::from(s),
        Err(e) => return (Err(e), None),
    };
    if cfg.unconnected {
        let local = sock.local_addr().ok();
        let result = (|| {
            sock.set_read_timeout(Some(cfg.timeout))?;
            sock.send_to(b"svcproxy-echo probe\n", cfg.target)?;
            let mut buf = [0u8; 2048];
            let (n, from) = sock.recv_from(&mut buf)?;
            *peer = Some(from);
            parse_reply(&buf[..n])
        })();
        return (result, local);
    }
    // Connected, so an ICMP port unreachable comes back as ECONNREFUSED on recv instead of
    // being silently discarded (which would look like a timeout).
    if let Err(e) = sock.connect(cfg.target) {
        return (Err(e), None);
    }
    let local = sock.local_addr().ok();
    *peer = sock.peer_addr().ok();
    let result = (|| {
        sock.set_read_timeout(Some(cfg.timeout))?;
        sock.send(b"svcproxy-echo probe\n")?;
        let mut buf = [0u8; 2048];
        let n = sock.recv(&mut buf)?;
        parse_reply(&buf[..n])
    })();
    (result, local)
}

/// An attempt on the connected socket `kept` holds (opened first if none): the
/// socket is given up after an error other than a timeout, so the next attempt
/// opens another, as a resolver does.
fn kept_udp_attempt(
    cfg: &ProbeConfig,
    kept: &mut Option<UdpSocket>,
    peer: &mut Option<SocketAddr>,
) -> Attempted {
    if kept.is_none() {
        let bind: SocketAddr = match cfg.target {
            SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        match UdpSocket::bind(bind).and_then(|s| {
            s.connect(cfg.target)?;
            s.set_read_timeout(Some(cfg.timeout))?;
            Ok(s)
        }) {
            Ok(s) => *kept = Some(s),
            Err(e) => return (Err(e), None),
        }
    }
    let sock = kept.as_ref().expect("opened above");
    let local = sock.local_addr().ok();
    *peer = sock.peer_addr().ok();
    let result = (|| {
        sock.send(b"svcproxy-echo probe\n")?;
        let mut buf = [0u8; 2048];
        let n = sock.recv(&mut buf)?;
        parse_reply(&buf[..n])
    })();
    if let Err(e) = &result {
        if !matches!(
            e.kind(),
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
        ) {
            *kept = None;
        }
    }
    (result, local)
}

const EPROTO: i32 = 71;
const ENOPROTOOPT: i32 = 92;

fn raw_sctp_attempt(cfg: &ProbeConfig) -> Attempted {
    let (outcome, local) = sctp_raw::probe_once(cfg.target, source_addr(cfg), cfg.timeout);
    let result = match outcome {
        sctp_raw::Outcome::Answered(r) => Ok(r),
        sctp_raw::Outcome::Aborted => Err(io::ErrorKind::ConnectionRefused.into()),
        // No SCTP stack at all on the target: IPv4 answers ICMP protocol-unreachable
        // (ENOPROTOOPT), IPv6 parameter-problem "unrecognized next header" (EPROTO). For a
        // client that is a refusal, like a kernel stack's ABORT for a closed port.
        sctp_raw::Outcome::Error(e) if matches!(e.raw_os_error(), Some(ENOPROTOOPT | EPROTO)) => {
            Err(io::Error::new(io::ErrorKind::ConnectionRefused, e))
        }
        sctp_raw::Outcome::Error(e) => Err(e),
    };
    (result, local)
}

fn parse_reply(buf: &[u8]) -> io::Result<Reply> {
    if buf.is_empty() {
        return Err(io::Error::other("closed without a reply"));
    }
    let text = String::from_utf8_lossy(buf);
    let line = text.lines().next().unwrap_or_default();
    serde_json::from_str(line).map_err(|e| io::Error::other(format!("bad reply {line:?}: {e}")))
}
