//! A Node converted (its labels, addresses, pod CIDRs and whether it is going
//! away), and a ServiceCIDR (the ranges cluster IPs are allocated from).
//!
//! Entry points: [`convert_node`], [`convert_service_cidr`].

use super::validation::{meta_key, parse_cidr, parse_ip};
use super::*;

pub fn convert_node(node: &corev1::Node, problems: &mut Vec<Problem>) -> Option<NodeInfo> {
    let key = meta_key(Kind::Node, &node.metadata);
    let mut ctx = Ctx {
        key: &key,
        problems,
    };
    if !is_dns1123_subdomain(&key.name) {
        let m = format!("invalid name {}", quote(&key.name));
        ctx.reject("metadata.name", m);
        return None;
    }
    let mut labels = BTreeMap::new();
    for (k, v) in node.metadata.labels.iter().flatten() {
        if is_qualified_name(k) && is_label_value(v) {
            labels.insert(Arc::from(k.as_str()), Arc::from(v.as_str()));
        } else {
            ctx.ignore(
                format!("metadata.labels[{}]", quote(k)),
                "invalid label; ignored",
            );
        }
    }
    let status_addrs = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default();
    let mut addresses: Vec<IpAddr> = Vec::new();
    // InternalIPs first: they are the node's primary addresses, as upstream.
    for wanted in ["InternalIP", "ExternalIP"] {
        for (i, a) in status_addrs.iter().enumerate() {
            if a.type_ != wanted {
                continue;
            }
            match parse_ip(&mut ctx, &format!("status.addresses[{i}]"), &a.address) {
                Some(ip) if !addresses.contains(&ip) => addresses.push(ip),
                Some(_) => {}
                None => ctx.ignore(
                    format!("status.addresses[{i}]"),
                    format!("invalid IP address {}", quote(&a.address)),
                ),
            }
        }
    }
    let spec = node.spec.clone().unwrap_or_default();
    let raw_cidrs = match (spec.pod_cidrs, spec.pod_cidr) {
        (Some(c), _) if !c.is_empty() => c,
        (_, Some(c)) if !c.is_empty() => vec![c],
        _ => Vec::new(),
    };
    let mut pod_cidrs = Vec::new();
    for (i, c) in raw_cidrs.iter().enumerate().take(2) {
        match parse_cidr(&mut ctx, &format!("spec.podCIDRs[{i}]"), c) {
            Some(net) => pod_cidrs.push(net),
            None => ctx.ignore(
                format!("spec.podCIDRs[{i}]"),
                format!("invalid CIDR {}", quote(c)),
            ),
        }
    }
    let to_be_deleted = spec
        .taints
        .iter()
        .flatten()
        .any(|t| t.key == TAINT_TO_BE_DELETED);
    Some(NodeInfo {
        name: key.name.clone(),
        labels,
        addresses,
        pod_cidrs,
        deleting: node.metadata.deletion_timestamp.is_some(),
        to_be_deleted,
    })
}

pub fn convert_service_cidr(
    cidr: &networkingv1::ServiceCIDR,
    problems: &mut Vec<Problem>,
) -> Option<Vec<IpNet>> {
    let key = meta_key(Kind::ServiceCidr, &cidr.metadata);
    let mut ctx = Ctx {
        key: &key,
        problems,
    };
    if !is_dns1123_subdomain(&key.name) {
        let m = format!("invalid name {}", quote(&key.name));
        ctx.reject("metadata.name", m);
        return None;
    }
    let raw = cidr
        .spec
        .as_ref()
        .and_then(|s| s.cidrs.as_deref())
        .unwrap_or_default();
    let mut out = Vec::new();
    for (i, c) in raw.iter().enumerate().take(2) {
        match parse_cidr(&mut ctx, &format!("spec.cidrs[{i}]"), c) {
            Some(net) if net.prefix_len() == 0 => ctx.ignore(
                format!("spec.cidrs[{i}]"),
                format!(
                    "{} covers every address: dropping its unallocated addresses would cut \
                     all of the node's traffic",
                    quote(c)
                ),
            ),
            Some(net) => out.push(net),
            None => ctx.ignore(
                format!("spec.cidrs[{i}]"),
                format!("invalid CIDR {}", quote(c)),
            ),
        }
    }
    if out.is_empty() {
        ctx.reject("spec.cidrs", "no valid CIDR");
        return None;
    }
    Some(out)
}
