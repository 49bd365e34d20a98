//! The values flags and file share, parsed and checked as upstream does: CIDRs,
//! NodePort addresses (with kube-proxy 1.37's keywords), bind addresses, feature
//! gates and how local traffic is detected.

use super::*;

/// One CIDR or a dual-stack pair (`10.0.0.0/16,fd00::/48`), as upstream validates
/// clusterCIDR. Host bits are cleared, as Go's ParseCIDR does.
pub fn parse_cluster_cidrs(s: &str) -> Result<Vec<IpNet>, String> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    let cidrs = s
        .split(',')
        .map(|c| parse_cidr(c.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    match cidrs.as_slice() {
        [_] => Ok(cidrs),
        [a, b] if a.addr().is_ipv4() != b.addr().is_ipv4() => Ok(cidrs),
        [_, _] => Err(format!(
            "{s:?} must be one CIDR or a dual-stack pair (one IPv4, one IPv6), e.g. 10.100.0.0/16,fde4:8dba:82e1::/48"
        )),
        _ => Err(format!("{s:?}: at most two CIDRs (one per IP family) are allowed")),
    }
}

pub(super) fn parse_cidr(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .map(|n| n.trunc())
        .map_err(|_| format!("invalid CIDR {s:?} (expected e.g. 10.0.0.0/8 or fd00::/64)"))
}

/// nodePortAddresses / --nodeport-addresses, as kube-proxy 1.37 reads it: CIDRs and
/// the keywords `primary` (the Node's primary IPs), `localhost` (127.0.0.0/8 and
/// ::1/128) and `all` (0.0.0.0/0 and ::/0), in any combination; a keyword listed
/// twice is refused. `None` when empty (the mode's default applies).
pub fn parse_nodeport_addresses(items: &[String]) -> Result<Option<NodePortAddresses>, String> {
    if items.is_empty() {
        return Ok(None);
    }
    let mut primary = false;
    let mut cidrs = Vec::new();
    let mut keywords = std::collections::BTreeSet::new();
    for item in items {
        let item = item.trim();
        let keyword = matches!(item, "primary" | "localhost" | "all");
        if keyword && !keywords.insert(item) {
            return Err(format!("{:?}: {item:?} is listed twice", items.join(",")));
        }
        match item {
            "primary" => primary = true,
            "localhost" => cidrs.extend([
                net(Ipv4Addr::new(127, 0, 0, 0).into(), 8),
                net(Ipv6Addr::LOCALHOST.into(), 128),
            ]),
            "all" => cidrs.extend([
                net(Ipv4Addr::UNSPECIFIED.into(), 0),
                net(Ipv6Addr::UNSPECIFIED.into(), 0),
            ]),
            _ => cidrs.push(parse_cidr(item).map_err(|e| {
                format!("{e}; entries must be CIDRs or the keywords 'primary', 'localhost', 'all'")
            })?),
        }
    }
    Ok(Some(match (primary, cidrs.is_empty()) {
        (true, true) => NodePortAddresses::Primary,
        (true, false) => NodePortAddresses::PrimaryAnd(cidrs),
        (false, _) => NodePortAddresses::Cidrs(cidrs),
    }))
}

/// The CIDR `ip/len` (valid lengths only: the keywords' own).
pub(super) fn net(ip: IpAddr, len: u8) -> IpNet {
    IpNet::new(ip, len).expect("a valid prefix length")
}

pub(super) fn parse_ip(s: &str) -> Result<IpAddr, String> {
    s.parse().map_err(|_| format!("invalid IP address {s:?}"))
}

/// `IP:PORT` or a bare `IP` meaning `default_port` (upstream's AppendPortIfNeeded and
/// validateHostPort); empty disables the server.
pub fn parse_bind_address(s: &str, default_port: u16) -> Result<Option<SocketAddr>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    let addr = match (s.parse::<SocketAddr>(), s.parse::<IpAddr>()) {
        (Ok(a), _) => a,
        (_, Ok(ip)) => SocketAddr::new(ip, default_port),
        _ => {
            return Err(format!(
                "invalid address {s:?}: must be IP:PORT ([IPv6]:PORT) or an IP"
            ))
        }
    };
    if addr.port() == 0 {
        return Err(format!("invalid address {s:?}: port must be 1-65535"));
    }
    Ok(Some(addr))
}

/// The gates `set` (from `field`) asks for, refusals recorded in `errors` and
/// GA/deprecated gates' warnings in `warnings`; the defaults when refused.
pub(super) fn feature_gates(
    field: &str,
    set: Result<BTreeMap<String, bool>, String>,
    errors: &mut Errors,
    warnings: &mut Vec<String>,
) -> FeatureGates {
    match set
        .map_err(|e| vec![e])
        .and_then(|set| FeatureGates::new(&set))
    {
        Ok((gates, w)) => {
            warnings.extend(w.into_iter().map(|w| format!("{field}: {w}")));
            gates
        }
        Err(refused) => {
            refused
                .into_iter()
                .for_each(|e| errors.push(format!("{field}: {e}")));
            FeatureGates::default()
        }
    }
}

/// detectLocalMode and its companions, as upstream's validation and
/// getLocalDetectors: ClusterCIDR without a CIDR degrades to no detection (with a
/// warning); BridgeInterface and InterfaceNamePrefix require their name.
pub(super) fn detect_local(
    mode: &str,
    cluster_cidrs: &[IpNet],
    bridge: &str,
    prefix: &str,
    (bridge_field, prefix_field, cidr_field): (&str, &str, &str),
    warnings: &mut Vec<String>,
) -> Result<LocalDetection, String> {
    match mode {
        "" | "ClusterCIDR" => {
            if cluster_cidrs.is_empty() {
                warnings.push(format!(
                    "detect-local-mode is ClusterCIDR but {cidr_field} is not set: no traffic is \
                     treated as local (as kube-proxy)"
                ));
                Ok(LocalDetection::None)
            } else {
                Ok(LocalDetection::ClusterCidr(cluster_cidrs.to_vec()))
            }
        }
        // The node's spec.podCIDRs, from the snapshot.
        "NodeCIDR" => Ok(LocalDetection::NodeCidr(Vec::new())),
        "BridgeInterface" => {
            let name = bridge.trim();
            if name.is_empty() {
                return Err(format!("BridgeInterface requires {bridge_field}"));
            }
            validate_interface_name(name).map_err(|e| format!("{bridge_field}: {e}"))?;
            let name = InterfaceName::parse(name).map_err(|e| format!("{bridge_field}: {e}"))?;
            Ok(LocalDetection::BridgeInterface(name))
        }
        "InterfaceNamePrefix" => {
            let p = prefix.trim();
            if p.is_empty() {
                return Err(format!("InterfaceNamePrefix requires {prefix_field}"));
            }
            let p = InterfaceName::parse(p).map_err(|e| format!("{prefix_field}: {e}"))?;
            Ok(LocalDetection::InterfaceNamePrefix(p))
        }
        _ => Err(format!(
            "unknown mode {mode:?}: must be ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix"
        )),
    }
}

/// Linux interface-name rules (IFNAMSIZ - 1 bytes, no '/' or whitespace).
pub(super) fn validate_interface_name(name: &str) -> Result<(), String> {
    if name.len() > 15 {
        return Err(format!("{name:?} is longer than 15 characters"));
    }
    if name == "." || name == ".." || name.contains('/') || name.chars().any(char::is_whitespace) {
        return Err(format!("{name:?} is not a valid interface name"));
    }
    Ok(())
}
