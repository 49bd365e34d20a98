//! Object names and comments: the only place user strings meet nftables text.
//!
//! Every per-service object (chain or set) is named `<fixed prefix><16 hex digits>`,
//! the digits being the first 64 bits of a SHA-256 over an unambiguous, length-prefixed
//! encoding of the object's identity (family, namespace, name, port name, protocol and,
//! for endpoints, address and port). No user-controlled byte ever reaches a name. The
//! only user text that reaches the ruleset at all is a chain comment, and that goes
//! through [`sanitize_comment`] first.
//!
//! Entry points: [`service_port_hash`], [`EndpointHasher`], [`ObjName`].

use std::fmt;
use std::net::IpAddr;

use sha2::{Digest, Sha256};
use svcproxy_core::model::{IpFamily, Protocol, ServicePortName};

/// The fixed prefixes of hashed object names. Each ends in `-`, and no fixed name
/// of the shared objects is a prefix followed by 16 hex digits, so the two kinds of
/// name cannot collide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Prefix {
    /// Cluster-policy dispatch chain of a service port.
    Service,
    /// Local-policy dispatch chain of a service port.
    Local,
    /// External-traffic chain (NodePort, external IPs, LB IPs) of a service port.
    External,
    /// loadBalancerSourceRanges check of a service port.
    Firewall,
    /// DNAT chain of one endpoint of one service port.
    Endpoint,
    /// Session-affinity set of one endpoint of one service port.
    Affinity,
}

impl Prefix {
    pub const ALL: [Prefix; 6] = [
        Prefix::Service,
        Prefix::Local,
        Prefix::External,
        Prefix::Firewall,
        Prefix::Endpoint,
        Prefix::Affinity,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Prefix::Service => "service-",
            Prefix::Local => "local-",
            Prefix::External => "external-",
            Prefix::Firewall => "firewall-",
            Prefix::Endpoint => "endpoint-",
            Prefix::Affinity => "affinity-",
        }
    }
}

/// A hashed object name: a prefix and 64 bits of hash, printed as 16 hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjName {
    pub prefix: Prefix,
    pub hash: u64,
}

impl ObjName {
    pub fn new(prefix: Prefix, hash: u64) -> Self {
        ObjName { prefix, hash }
    }
}

impl fmt::Display for ObjName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:016x}", self.prefix.as_str(), self.hash)
    }
}

/// Domain-separation tags: a service-port hash can never equal an endpoint hash
/// computed from different fields, whatever the strings contain.
const TAG_SERVICE_PORT: &[u8] = b"svcproxy/service-port/v1\0";
const TAG_ENDPOINT: &[u8] = b"svcproxy/endpoint/v1\0";
const TAG_AFFINITY: &[u8] = b"svcproxy/affinity/v1\0";

fn put_str(h: &mut Sha256, s: &str) {
    // Length-prefixed, so ("a/b", "c") and ("a", "b/c") hash differently.
    h.update((s.len() as u64).to_be_bytes());
    h.update(s.as_bytes());
}

fn put_family(h: &mut Sha256, family: IpFamily) {
    h.update([match family {
        IpFamily::V4 => 4u8,
        IpFamily::V6 => 6u8,
    }]);
}

fn put_protocol(h: &mut Sha256, protocol: Protocol) {
    h.update([match protocol {
        Protocol::Tcp => 6u8,
        Protocol::Udp => 17u8,
        Protocol::Sctp => 132u8,
    }]);
}

fn put_ip(h: &mut Sha256, ip: IpAddr) {
    match ip {
        IpAddr::V4(a) => {
            h.update([4u8]);
            h.update(a.octets());
        }
        IpAddr::V6(a) => {
            h.update([6u8]);
            h.update(a.octets());
        }
    }
}

fn finish(h: Sha256) -> u64 {
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

fn service_port_state(tag: &[u8], family: IpFamily, name: &ServicePortName) -> Sha256 {
    let mut h = Sha256::new();
    h.update(tag);
    put_family(&mut h, family);
    put_str(&mut h, &name.service.namespace);
    put_str(&mut h, &name.service.name);
    put_str(&mut h, &name.port);
    put_protocol(&mut h, name.protocol);
    h
}

/// The hash naming a service port's chains (`service-`, `local-`, `external-`,
/// `firewall-`) in one family.
pub fn service_port_hash(family: IpFamily, name: &ServicePortName) -> u64 {
    finish(service_port_state(TAG_SERVICE_PORT, family, name))
}

/// Hashes the endpoints of one service port; the service-port part of the input is
/// hashed once and the hasher state cloned per endpoint.
pub struct EndpointHasher {
    endpoint: Sha256,
    affinity: Sha256,
}

impl EndpointHasher {
    pub fn new(family: IpFamily, name: &ServicePortName) -> Self {
        EndpointHasher {
            endpoint: service_port_state(TAG_ENDPOINT, family, name),
            affinity: service_port_state(TAG_AFFINITY, family, name),
        }
    }

    /// The hash naming the endpoint's chain.
    pub fn endpoint(&self, ip: IpAddr, port: u16) -> u64 {
        let mut h = self.endpoint.clone();
        put_ip(&mut h, ip);
        h.update(port.to_be_bytes());
        finish(h)
    }

    /// The hash naming the endpoint's affinity set. The timeout is part of the
    /// identity: a set's timeout cannot be changed in place, so a new timeout means
    /// a new set (added before, and the old one deleted after, the rules move over).
    pub fn affinity(&self, ip: IpAddr, port: u16, timeout_seconds: u32) -> u64 {
        let mut h = self.affinity.clone();
        put_ip(&mut h, ip);
        h.update(port.to_be_bytes());
        h.update(timeout_seconds.to_be_bytes());
        finish(h)
    }
}

/// Longest comment svcproxy writes (nft allows 128 bytes).
pub const MAX_COMMENT_LEN: usize = 96;

/// Reduces any text to a comment that cannot alter rule syntax: only `[a-z0-9-./:]`
/// survive (ASCII capitals are lowered, everything else becomes `-`), at most
/// [`MAX_COMMENT_LEN`] characters.
pub fn sanitize_comment(text: &str) -> String {
    text.chars()
        .take(MAX_COMMENT_LEN)
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '.' | '/' | ':' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect()
}

/// Whether a comment is in the sanitized subset (for defensive checks and tests).
pub fn is_sanitized_comment(text: &str) -> bool {
    text.len() <= MAX_COMMENT_LEN
        && text
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'/' | b':'))
}

/// The comment on a service port's chains: `namespace/name:port/protocol`, sanitized.
pub fn service_port_comment(name: &ServicePortName) -> String {
    sanitize_comment(&format!(
        "{}/{}:{}/{}",
        name.service.namespace,
        name.service.name,
        name.port,
        protocol_keyword(name.protocol)
    ))
}

/// The nftables spelling of a protocol (`inet_proto` values and `<proto> dport`).
pub fn protocol_keyword(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use svcproxy_core::model::ServiceName;

    fn spn(ns: &str, name: &str, port: &str) -> ServicePortName {
        ServicePortName::new(ServiceName::new(ns, name), port, Protocol::Tcp)
    }

    #[test]
    fn names_are_prefix_and_sixteen_hex_digits() {
        let n = ObjName::new(Prefix::Endpoint, 0xab);
        assert_eq!(n.to_string(), "endpoint-00000000000000ab");
    }

    #[test]
    fn field_boundaries_are_part_of_the_identity() {
        let a = service_port_hash(IpFamily::V4, &spn("a-b", "c", ""));
        let b = service_port_hash(IpFamily::V4, &spn("a", "b-c", ""));
        assert_ne!(a, b);
        let c = service_port_hash(IpFamily::V6, &spn("a-b", "c", ""));
        assert_ne!(a, c, "families never share names");
    }

    #[test]
    fn endpoint_and_affinity_hashes_differ_by_every_field() {
        let h = EndpointHasher::new(IpFamily::V4, &spn("ns", "svc", "p"));
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        assert_ne!(h.endpoint(ip, 80), h.endpoint(ip, 81));
        assert_ne!(h.endpoint(ip, 80), h.endpoint(other, 80));
        assert_ne!(h.affinity(ip, 80, 10), h.affinity(ip, 80, 11));
        assert_ne!(h.endpoint(ip, 80), h.affinity(ip, 80, 0));
    }

    #[test]
    fn comments_keep_only_the_safe_subset() {
        let s = sanitize_comment("Ns/\"x\";{drop}\n:é");
        assert_eq!(s, "ns/-x---drop--:-");
        assert!(is_sanitized_comment(&s));
        assert_eq!(sanitize_comment(&"a".repeat(500)).len(), MAX_COMMENT_LEN);
    }
}
