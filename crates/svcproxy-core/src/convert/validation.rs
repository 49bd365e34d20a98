//! The API server's rules, which manifests bypass: valid names (RFC 1123 and
//! 1035 labels and subdomains, label keys and values), the addresses a Service
//! or an endpoint may not have, addresses and CIDRs parsed as upstream does, and
//! an object's key and name checked.
//!
//! Entry points: the `is_*` name checks, [`parse_ip`], [`parse_cidr`],
//! [`meta_key`], [`check_namespaced_name`].

use super::*;

/// RFC 1123 label: lowercase alphanumerics and '-', alphanumeric at both ends, ≤ 63.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// RFC 1123 subdomain: dot-separated labels, ≤ 253.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// RFC 1035 label (Service names): a label that starts with a letter.
pub fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

/// A label key: optional DNS-subdomain prefix, '/', and a name of ≤ 63 characters of
/// alphanumerics, '-', '_' and '.', alphanumeric at both ends.
pub fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix {
        if !is_dns1123_subdomain(p) {
            return false;
        }
    }
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// A label value: empty, or ≤ 63 characters as a qualified name's name part.
pub fn is_label_value(s: &str) -> bool {
    s.is_empty() || (!s.contains('/') && is_qualified_name(s))
}

/// An address an endpoint may not have: loopback, link-local, unspecified or multicast
/// (the API server refuses these for endpoints because the proxy would hijack them).
pub(super) fn forbidden_endpoint_ip(ip: &IpAddr) -> Option<&'static str> {
    match ip {
        _ if ip.is_loopback() => Some("loopback"),
        _ if ip.is_unspecified() => Some("unspecified"),
        _ if ip.is_multicast() => Some("multicast"),
        IpAddr::V4(v4) if v4.is_link_local() => Some("link-local"),
        IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80 => Some("link-local"),
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => Some("IPv4-mapped IPv6"),
        _ => None,
    }
}

/// An address no Service may claim as a cluster, external or load-balancer IP, and
/// why: capturing loopback or link-local addresses would hijack the node's own
/// traffic (its local services, its metadata and neighbour addresses), and
/// unspecified, multicast and broadcast addresses are no unicast destination. The
/// API server refuses these for `externalIPs`; objects from elsewhere (manifests, old
/// clusters) may still hold them.
pub(super) fn forbidden_service_ip(ip: &IpAddr) -> Option<&'static str> {
    match ip {
        _ if ip.is_loopback() => Some("loopback"),
        _ if ip.is_unspecified() => Some("unspecified"),
        _ if ip.is_multicast() => Some("multicast"),
        IpAddr::V4(v4) if v4.is_broadcast() => Some("broadcast"),
        IpAddr::V4(v4) if v4.is_link_local() => Some("link-local"),
        IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80 => Some("link-local"),
        _ => None,
    }
}

/// Parses an IP as upstream's `ParseIPSloppy`: no zones, no surrounding whitespace;
/// IPv4 octets with leading zeros are read as decimal (never octal) and the value
/// normalised, with a warning naming `field` (objects from before the API server
/// refused them still hold such addresses).
pub(super) fn parse_ip(ctx: &mut Ctx<'_>, field: &str, s: &str) -> Option<IpAddr> {
    let parsed = crate::addr::parse_ip_sloppy(s)?;
    if parsed.normalised {
        warn_normalised(ctx, field, s, parsed.value);
    }
    Some(parsed.value)
}

/// The warning for an address written with leading zeros and read as `value`.
fn warn_normalised(ctx: &mut Ctx<'_>, field: &str, raw: &str, value: impl std::fmt::Display) {
    ctx.warn(
        field,
        format!("{} has leading zeros: read as decimal, {value}", quote(raw)),
    );
}

/// Parses a CIDR as upstream's `ParseCIDRSloppy` (see [`parse_ip`]), after trimming
/// surrounding whitespace.
pub(super) fn parse_cidr(ctx: &mut Ctx<'_>, field: &str, s: &str) -> Option<IpNet> {
    let parsed = crate::addr::parse_cidr_sloppy(s.trim())?;
    let net = parsed.value;
    // The API requires the network address (`10.0.0.0/8`, not `10.1.2.3/8`); being
    // lenient here would silently widen or move what the owner wrote.
    if net.network() != net.addr() {
        return None;
    }
    if parsed.normalised {
        warn_normalised(ctx, field, s, net);
    }
    Some(net)
}

pub(super) fn meta_key(
    kind: Kind,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> ObjectKey {
    let namespaced = matches!(
        kind,
        Kind::Service | Kind::EndpointSlice | Kind::Endpoints | Kind::Pod
    );
    ObjectKey {
        kind,
        namespace: if namespaced {
            meta.namespace.clone().unwrap_or_else(|| "default".into())
        } else {
            String::new()
        },
        name: meta.name.clone().unwrap_or_default(),
    }
}

pub(super) fn check_namespaced_name(ctx: &mut Ctx<'_>, name_ok: fn(&str) -> bool) -> bool {
    let ns_ok = is_dns1123_label(&ctx.key.namespace);
    let name_valid = name_ok(&ctx.key.name);
    if !ns_ok {
        let m = format!("invalid namespace {}", quote(&ctx.key.namespace));
        ctx.reject("metadata.namespace", m);
    }
    if !name_valid {
        let m = format!("invalid name {}", quote(&ctx.key.name));
        ctx.reject("metadata.name", m);
    }
    ns_ok && name_valid
}
