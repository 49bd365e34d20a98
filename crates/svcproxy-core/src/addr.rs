//! Address parsing as upstream's `netutils.ParseIPSloppy` / `ParseCIDRSloppy`: IPv4
//! octets (and a CIDR's prefix length) may carry leading zeros, read as **decimal**
//! (never octal): `172.30.0.041` is 172.30.0.41. The API server refused such values
//! only from Kubernetes 1.20 on, so older objects still hold them, and kube-proxy
//! keeps reading them; so does svcproxy, and says so (the `Parsed::normalised` flag
//! lets the caller warn, naming the field).
//!
//! Entry points: [`parse_ip_sloppy`], [`parse_cidr_sloppy`].

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

/// A parsed value and whether it had to be normalised (leading zeros dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parsed<T> {
    pub value: T,
    pub normalised: bool,
}

/// An IP address, strictly or with leading zeros in IPv4 octets. No zones, no
/// surrounding whitespace (upstream's parser takes none either).
pub fn parse_ip_sloppy(s: &str) -> Option<Parsed<IpAddr>> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(Parsed {
            value: ip,
            normalised: false,
        });
    }
    parse_v4_leading_zeros(s).map(|v4| Parsed {
        value: IpAddr::V4(v4),
        normalised: true,
    })
}

/// A CIDR (`address/prefix`), strictly or with leading zeros in the IPv4 octets or the
/// prefix length. Surrounding whitespace is not trimmed here (callers that accept it,
/// as upstream does for `loadBalancerSourceRanges`, trim first). The address is kept
/// as written (the caller decides whether host bits are allowed).
pub fn parse_cidr_sloppy(s: &str) -> Option<Parsed<IpNet>> {
    if let Ok(net) = s.parse::<IpNet>() {
        return Some(Parsed {
            value: net,
            normalised: false,
        });
    }
    let (addr, prefix) = s.split_once('/')?;
    let ip = parse_ip_sloppy(addr)?;
    if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let len: u8 = prefix.parse().ok()?;
    let net = IpNet::new(ip.value, len).ok()?;
    Some(Parsed {
        value: net,
        normalised: true,
    })
}

/// Dotted-quad IPv4 whose octets are 1-3 decimal digits each, leading zeros allowed.
fn parse_v4_leading_zeros(s: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    parts.next().is_none().then(|| Ipv4Addr::from(octets))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<(String, bool)> {
        parse_ip_sloppy(s).map(|p| (p.value.to_string(), p.normalised))
    }

    fn cidr(s: &str) -> Option<(String, bool)> {
        parse_cidr_sloppy(s).map(|p| (p.value.to_string(), p.normalised))
    }

    #[test]
    fn leading_zeros_are_decimal_never_octal() {
        assert_eq!(ip("172.30.0.041"), Some(("172.30.0.41".into(), true)));
        assert_eq!(ip("010.000.000.010"), Some(("10.0.0.10".into(), true)));
        assert_eq!(ip("10.0.0.8"), Some(("10.0.0.8".into(), false)));
        assert_eq!(ip("fd00::0001"), Some(("fd00::1".into(), false)));
        assert_eq!(
            cidr("203.0.113.000/025"),
            Some(("203.0.113.0/25".into(), true))
        );
        // (ipnet itself reads a prefix length with leading zeros.)
        assert_eq!(cidr("10.0.0.0/08").unwrap().0, "10.0.0.0/8");
        assert_eq!(cidr("10.0.0.0/8"), Some(("10.0.0.0/8".into(), false)));
    }

    #[test]
    fn still_refuses_what_is_not_an_address() {
        for bad in [
            "",
            "1.2.3",
            "1.2.3.4.5",
            "256.0.0.1",
            "0256.0.0.1",
            "1.2.3.x",
            " 1.2.3.4",
            "1.2.3.4 ",
            "+1.2.3.4",
            "1..2.3",
            "0x1.2.3.4",
        ] {
            assert_eq!(ip(bad), None, "{bad:?}");
        }
        for bad in [
            "10.0.0.0/33",
            "10.0.0.0/",
            "10.0.0.0/0033",
            "10.0.0.0/-1",
            "010.0.0.0",
            "10.0.0.0/8/8",
        ] {
            assert_eq!(cidr(bad), None, "{bad:?}");
        }
    }
}
