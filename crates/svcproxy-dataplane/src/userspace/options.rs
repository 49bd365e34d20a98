//! The userspace mode's own options: its flags ([`UserspaceFlags`], part of
//! [`crate::ModeFlags`]) and what they resolve to ([`UserspaceConfig`]). The
//! nftables mode reads them too for its loopback forwarder (localhost NodePorts).

use std::time::Duration;

use svcproxy_core::go_syntax::{parse_duration_arg, parse_go_bool};

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

/// The userspace mode's flags, as the command line gives them.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct UserspaceFlags {
    /// userspace mode only: the ports the proxy's own sockets take, BEGIN-END, BEGIN+OFFSET or PORT (inclusive); empty or 0: the kernel chooses, as kube-proxy's userspace proxy.
    #[arg(long, value_name = "RANGE", help_heading = "kube-proxy")]
    pub proxy_port_range: Option<String>,

    /// userspace mode only: how long an idle UDP flow keeps its upstream socket, greater than 0 (kube-proxy's userspace default).
    #[arg(long, value_name = "DURATION", default_value = "250ms", value_parser = parse_duration_arg, help_heading = "kube-proxy")]
    pub udp_timeout: Duration,

    /// userspace mode only: how an endpoint is chosen for a new connection, rr (round-robin) or lc (least active connections) (svcproxy only).
    #[arg(long, value_name = "rr|lc", default_value = "rr", value_parser = ["rr", "lc"], help_heading = "svcproxy")]
    pub userspace_scheduler: String,

    /// userspace mode only: how long an endpoint may take to accept a connection before the next is tried; 1s by default, the TCP initial retransmission timeout: an endpoint that has not answered the SYN by then has lost it or is gone (svcproxy only).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration_arg, help_heading = "svcproxy")]
    pub userspace_connect_timeout: Duration,

    /// userspace mode only: connections to an endpoint that left its service are closed this long after it left; 0s keeps them to their end (svcproxy only).
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_duration_arg, help_heading = "svcproxy")]
    pub userspace_drain_timeout: Duration,

    /// userspace mode only: at SIGTERM the proxy stops accepting and lets open connections finish for at most this long; 25s by default, within a pod's default 30s grace period (svcproxy only).
    #[arg(long, value_name = "DURATION", default_value = "25s", value_parser = parse_duration_arg, help_heading = "svcproxy")]
    pub userspace_shutdown_timeout: Duration,

    /// userspace mode only: move TCP bytes between a client and its endpoint with splice(2), never through the proxy's memory; false copies them through a buffer (svcproxy only).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true",
          value_parser = parse_go_bool, action = clap::ArgAction::Set, help_heading = "svcproxy")]
    pub userspace_zero_copy: bool,
}

impl UserspaceFlags {
    /// The proxy's settings, or every invalid value (as `--flag: why`).
    pub fn config(&self) -> Result<UserspaceConfig, Vec<String>> {
        let mut errors = Vec::new();
        if self.udp_timeout.is_zero() {
            errors.push("--udp-timeout: must be greater than 0".to_string());
        }
        if self.userspace_connect_timeout.is_zero() {
            errors.push("--userspace-connect-timeout: must be greater than 0".to_string());
        }
        let port_range = match &self.proxy_port_range {
            Some(r) => parse_port_range(r).unwrap_or_else(|e| {
                errors.push(format!("--proxy-port-range: {e}"));
                None
            }),
            None => None,
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(UserspaceConfig {
            scheduler: match self.userspace_scheduler.as_str() {
                "lc" => Scheduler::LeastConnections,
                _ => Scheduler::RoundRobin,
            },
            connect_timeout: self.userspace_connect_timeout,
            drain_timeout: self.userspace_drain_timeout,
            udp_timeout: self.udp_timeout,
            port_range,
            shutdown_timeout: self.userspace_shutdown_timeout,
            zero_copy: self.userspace_zero_copy,
        })
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
