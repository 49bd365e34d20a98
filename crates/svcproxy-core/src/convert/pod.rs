//! A Pod converted, for the cluster DNS: its node and addresses.
//!
//! Entry point: [`convert_pod`].

use super::validation::{meta_key, parse_ip};
use super::*;

/// What the cluster DNS reads of a Pod: its node and addresses. `None`, with no
/// problem, while it is not scheduled or has no address (it places nobody).
pub fn convert_pod(pod: &corev1::Pod, problems: &mut Vec<Problem>) -> Option<PodInfo> {
    let key = meta_key(Kind::Pod, &pod.metadata);
    let mut ctx = Ctx {
        key: &key,
        problems,
    };
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())?;
    if !is_dns1123_subdomain(node) {
        ctx.ignore(
            "spec.nodeName",
            format!("invalid node name {}", quote(node)),
        );
        return None;
    }
    let raw = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ips.as_deref())
        .unwrap_or_default();
    let mut ips: Vec<IpAddr> = Vec::new();
    for (i, p) in raw.iter().enumerate().take(2) {
        let field = format!("status.podIPs[{i}]");
        match parse_ip(&mut ctx, &field, &p.ip) {
            Some(ip) if !ips.contains(&ip) => ips.push(ip),
            Some(_) => {}
            None => ctx.ignore(field, format!("invalid IP address {}", quote(&p.ip))),
        }
    }
    if ips.is_empty() {
        return None;
    }
    Some(PodInfo {
        node_name: node.into(),
        ips: ips.into(),
    })
}
