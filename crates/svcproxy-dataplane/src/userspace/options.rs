//! The userspace mode's own options ([`UserspaceConfig`]), which the binary
//! resolves from its flags (kube-proxy's port range syntax: [`parse_port_range`]).
//! The nftables mode's loopback forwarder (localhost NodePorts) reads them too.

use std::time::Duration;

/// How the userspace proxy chooses an endpoint for a new connection
/// (`--userspace-scheduler`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scheduler {
    /// Each endpoint in turn (`rr`).
    #[default]
    RoundRobin,
    /// The endpoint with the fewest connections open through this proxy, ties in
    /// turn (`lc`, as IPVS's).
    LeastConnections,
}

/// The userspace proxy's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserspaceConfig {
    pub scheduler: Scheduler,
    /// How long an endpoint may take to accept a connection before the next one is
    /// tried (`--userspace-connect-timeout`).
    pub connect_timeout: Duration,
    /// How long connections to a removed endpoint may go on; zero keeps them
    /// (`--userspace-drain-timeout`).
    pub drain_timeout: Duration,
    /// How long a UDP flow with no datagram either way keeps its upstream socket
    /// (`--udp-timeout`, upstream's userspace flag).
    pub udp_timeout: Duration,
    /// The ports the proxy's own sockets take (`--proxy-port-range`); `None`: the
    /// kernel chooses.
    pub port_range: Option<(u16, u16)>,
    /// At SIGTERM, how long open connections may go on once the listeners are
    /// closed (`--userspace-shutdown-timeout`).
    pub shutdown_timeout: Duration,
    /// Move TCP bytes with `splice(2)` rather than through a buffer
    /// (`--userspace-zero-copy`).
    pub zero_copy: bool,
}

impl Default for UserspaceConfig {
    fn default() -> Self {
        UserspaceConfig {
            scheduler: Scheduler::RoundRobin,
            connect_timeout: Duration::from_secs(1),
            drain_timeout: Duration::ZERO,
            udp_timeout: Duration::from_millis(250),
            port_range: None,
            shutdown_timeout: Duration::from_secs(25),
            zero_copy: true,
        }
    }
}

/// kube-proxy's port range syntax: `BEGIN-END`, `BEGIN+OFFSET` or `PORT`, inclusive;
/// empty, `0` or `0-0` for none (the kernel chooses).
pub fn parse_port_range(s: &str) -> Result<Option<(u16, u16)>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    let port = |p: &str| -> Result<u16, String> {
        p.trim()
            .parse::<u16>()
            .map_err(|_| format!("{p:?} is not a port (0-65535)"))
    };
    let (lo, hi) = if let Some((a, b)) = s.split_once('-') {
        (port(a)?, port(b)?)
    } else if let Some((a, b)) = s.split_once('+') {
        let lo = port(a)?;
        let hi = lo
            .checked_add(port(b)?)
            .ok_or_else(|| format!("{s:?} goes past port 65535"))?;
        (lo, hi)
    } else {
        let p = port(s)?;
        (p, p)
    };
    match (lo, hi) {
        (0, 0) => Ok(None),
        (0, _) => Err(format!("{s:?}: a range cannot start at port 0")),
        (lo, hi) if hi < lo => Err(format!("{s:?}: the end is before the beginning")),
        r => Ok(Some(r)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ranges_are_read_as_kube_proxy_reads_them() {
        let p = parse_port_range;
        assert_eq!(p(""), Ok(None));
        assert_eq!(p("0"), Ok(None));
        assert_eq!(p("0-0"), Ok(None));
        assert_eq!(p("30000-32767"), Ok(Some((30000, 32767))));
        assert_eq!(p("30000+10"), Ok(Some((30000, 30010))));
        assert_eq!(p("8080"), Ok(Some((8080, 8080))));
        for bad in ["0-10", "10-5", "65535+1", "a-b", "70000", "1-2-3"] {
            assert!(p(bad).is_err(), "{bad}");
        }
    }
}
