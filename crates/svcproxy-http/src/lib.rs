//! svcproxy's HTTP servers, answering as kube-proxy's do (load balancers, probes and
//! dashboards depend on the exact behaviour).
//!
//! - [`health`]: proxy health ([`health::ProxyHealth`]) and the `--healthz-bind-address`
//!   server (`/healthz`, `/livez`);
//! - [`service_health`]: one server per `healthCheckNodePort`
//!   ([`service_health::ServiceHealthServers`]);
//! - [`metrics`]: the Prometheus metrics ([`metrics::Metrics`]) and the
//!   `--metrics-bind-address` server (`/metrics`, `/healthz`, `/proxyMode`).
//!
//! Entry point for the fixed-address servers: [`bind`] at start-up (so that an address
//! in use is a clear start-up error), then the module's `serve`.

pub mod health;
pub mod metrics;
pub mod service_health;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use tokio::net::TcpListener;

/// Binds a TCP listener for `what` (the flag, e.g. "--healthz-bind-address"). An address
/// in use is a clear error naming the flag and the address. With `shared`, another
/// svcproxy may listen on the same address ([`listen`]).
///
/// `0.0.0.0` listens on IPv6 too, as Go's `net.Listen("tcp", "0.0.0.0:port")` does for
/// kube-proxy (one dual-stack socket): load balancers of dual-stack clusters check
/// nodes' IPv6 addresses on 10256. Where IPv6 wildcards are IPv6-only or the host has
/// no IPv6, it is IPv4 only.
pub async fn bind(addr: SocketAddr, what: &str, shared: bool) -> anyhow::Result<TcpListener> {
    let in_use = || {
        anyhow::anyhow!(
            "{what} {addr}: address already in use (is kube-proxy or another svcproxy \
             running on this node?)"
        )
    };
    if addr.ip() == IpAddr::V4(Ipv4Addr::UNSPECIFIED) && !service_health::ipv6_wildcard_is_v6_only()
    {
        let any6 = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), addr.port());
        match listen(any6, shared) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => return Err(in_use()),
            Err(_) => {} // no IPv6 here
        }
    }
    match listen(addr, shared) {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(in_use()),
        Err(e) => Err(e).with_context(|| format!("{what} {addr}: cannot listen")),
    }
}

/// A listener on `addr`; with `shared`, `SO_REUSEPORT`, so that a warm standby
/// svcproxy (the binary's owner hand-over) answers on the same port as the owner (the kernel
/// spreads connections over both; only sockets of the same user can share).
fn listen(addr: SocketAddr, shared: bool) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    if shared {
        socket.set_reuseport(true)?;
    }
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Signed nanoseconds since the Unix epoch.
fn unix_nanos(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    }
}

/// The time `nanos` after (or before, if negative) the Unix epoch.
fn from_unix_nanos(nanos: i128) -> SystemTime {
    let magnitude = Duration::new(
        (nanos.unsigned_abs() / 1_000_000_000) as u64,
        (nanos.unsigned_abs() % 1_000_000_000) as u32,
    );
    if nanos >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian date `days` after 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `t` as Go's `time.Time.String()` prints a UTC time (layout
/// `2006-01-02 15:04:05.999999999 -0700 MST`: trailing zeros of the fraction dropped),
/// which is what kube-proxy's health bodies carry. `None` is Go's zero time.
fn go_time_string(t: Option<SystemTime>) -> String {
    let Some(t) = t else {
        return "0001-01-01 00:00:00 +0000 UTC".to_string();
    };
    let nanos = unix_nanos(t);
    let secs = nanos.div_euclid(1_000_000_000) as i64;
    let frac = nanos.rem_euclid(1_000_000_000) as u32;
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    let fraction = if frac == 0 {
        String::new()
    } else {
        format!(".{frac:09}").trim_end_matches('0').to_string()
    };
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}{fraction} +0000 UTC",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Parses an RFC 3339 time as Go's `time.Parse(time.RFC3339Nano, s)` accepts it
/// (`2006-01-02T15:04:05.999999999Z07:00`, fraction optional).
fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Option<u32> {
        let digits = b.get(range)?;
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    };
    let sep = |i: usize, c: u8| b.get(i) == Some(&c);
    if !(sep(4, b'-') && sep(7, b'-') && sep(10, b'T') && sep(13, b':') && sep(16, b':')) {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if day == 0 || day > month_days || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let mut i = 19;
    let mut frac_nanos: i128 = 0;
    if sep(i, b'.') {
        let start = i + 1;
        let mut end = start;
        while b.get(end).is_some_and(u8::is_ascii_digit) {
            end += 1;
        }
        if end == start || end - start > 9 {
            return None;
        }
        let digits = num(start..end)?;
        frac_nanos = i128::from(digits) * 10i128.pow(9 - (end - start) as u32);
        i = end;
    }
    let offset_secs: i64 = match b.get(i) {
        Some(b'Z') if b.len() == i + 1 => 0,
        Some(&sign @ (b'+' | b'-')) if b.len() == i + 6 && sep(i + 3, b':') => {
            let (h, m) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if h > 23 || m > 59 {
                return None;
            }
            let off = i64::from(h * 3600 + m * 60);
            if sign == b'-' {
                -off
            } else {
                off
            }
        }
        _ => return None,
    };
    let secs = days_from_civil(i64::from(year), month, day) * 86_400
        + i64::from(hour * 3600 + minute * 60 + second)
        - offset_secs;
    Some(from_unix_nanos(
        i128::from(secs) * 1_000_000_000 + frac_nanos,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_time_strings_match_go() {
        assert_eq!(go_time_string(None), "0001-01-01 00:00:00 +0000 UTC");
        assert_eq!(
            go_time_string(Some(UNIX_EPOCH)),
            "1970-01-01 00:00:00 +0000 UTC"
        );
        let t = UNIX_EPOCH + Duration::new(1_709_251_199, 120_000_000);
        assert_eq!(go_time_string(Some(t)), "2024-02-29 23:59:59.12 +0000 UTC");
        let t = UNIX_EPOCH + Duration::new(951_782_400, 1);
        assert_eq!(
            go_time_string(Some(t)),
            "2000-02-29 00:00:00.000000001 +0000 UTC"
        );
        let before = UNIX_EPOCH - Duration::new(1, 500_000_000);
        assert_eq!(
            go_time_string(Some(before)),
            "1969-12-31 23:59:58.5 +0000 UTC"
        );
    }

    #[test]
    fn rfc3339_times_parse_as_go_parses_them() {
        let at = |s: u64, n: u32| Some(UNIX_EPOCH + Duration::new(s, n));
        assert_eq!(parse_rfc3339("2024-02-29T23:59:59Z"), at(1_709_251_199, 0));
        assert_eq!(
            parse_rfc3339("2024-02-29T23:59:59.5Z"),
            at(1_709_251_199, 500_000_000)
        );
        assert_eq!(
            parse_rfc3339("2024-03-01T01:59:59.123456789+02:00"),
            at(1_709_251_199, 123_456_789)
        );
        assert_eq!(
            parse_rfc3339("2024-02-29T20:29:59-03:30"),
            at(1_709_251_199, 0)
        );
        for bad in [
            "",
            "2024-02-30T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2024-01-01 00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:00:00",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00.1234567890Z",
            "2024-01-01T00:00:00+0100",
            "2024-01-01T00:00:00Zjunk",
            "yesterday",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn an_address_in_use_is_an_error_naming_the_flag_and_address() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        // Shared or not: a listener that does not share (kube-proxy's) keeps it.
        for shared in [false, true] {
            let err = bind(addr, "--healthz-bind-address", shared)
                .await
                .unwrap_err();
            let msg = format!("{err:#}");
            assert!(msg.contains("--healthz-bind-address"), "{msg}");
            assert!(msg.contains(&addr.to_string()), "{msg}");
            assert!(msg.contains("address already in use"), "{msg}");
        }
        drop(taken);
        let first = bind(addr, "--healthz-bind-address", true).await.unwrap();
        // Another svcproxy (a warm standby) shares it; a listener that does not
        // share does not get it.
        let second = bind(addr, "--healthz-bind-address", true).await.unwrap();
        assert!(bind(addr, "--healthz-bind-address", false).await.is_err());
        drop((first, second));
        assert!(bind(addr, "--healthz-bind-address", false).await.is_ok());
    }
}
