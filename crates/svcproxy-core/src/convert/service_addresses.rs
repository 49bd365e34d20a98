//! The addresses a Service is reached at besides its cluster IPs:
//! `spec.externalIPs`, `status.loadBalancer.ingress`, and the load balancer's
//! source ranges (the field, or the annotation older clouds use).
//!
//! Entry points: [`parse_ip_list`], [`parse_lb_ingress`],
//! [`parse_source_ranges`], from `port_template`.

use super::validation::{forbidden_service_ip, parse_cidr, parse_ip};
use super::*;

pub(super) fn parse_ip_list(ctx: &mut Ctx<'_>, field: &str, raw: &[String]) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for (i, s) in raw.iter().enumerate() {
        if i == MAX_ADDRESS_LIST {
            ctx.ignore(
                field,
                format!("more than {MAX_ADDRESS_LIST} entries; the rest ignored"),
            );
            break;
        }
        match parse_ip(ctx, &format!("{field}[{i}]"), s) {
            Some(ip) if forbidden_service_ip(&ip).is_some() => ctx.ignore(
                format!("{field}[{i}]"),
                format!(
                    "{} is not usable here ({} address)",
                    quote(s),
                    forbidden_service_ip(&ip).unwrap_or_default()
                ),
            ),
            Some(ip) => {
                if !out.contains(&ip) {
                    out.push(ip)
                }
            }
            None => ctx.ignore(
                format!("{field}[{i}]"),
                format!("invalid IP address {}", quote(s)),
            ),
        }
    }
    out
}

pub(super) fn parse_lb_ingress(
    ctx: &mut Ctx<'_>,
    svc: &corev1::Service,
) -> Vec<LoadBalancerIngress> {
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default();
    let mut out: Vec<LoadBalancerIngress> = Vec::new();
    for (i, ing) in ingress.iter().enumerate() {
        if i == MAX_ADDRESS_LIST {
            ctx.ignore(
                "status.loadBalancer.ingress",
                format!("more than {MAX_ADDRESS_LIST} entries; the rest ignored"),
            );
            break;
        }
        let field = format!("status.loadBalancer.ingress[{i}]");
        // Hostname-only entries (some clouds) carry no IP for the proxy to capture.
        let Some(raw) = ing.ip.as_deref().filter(|s| !s.is_empty()) else {
            continue;
        };
        let Some(ip) = parse_ip(ctx, &format!("{field}.ip"), raw) else {
            ctx.ignore(
                format!("{field}.ip"),
                format!("invalid IP address {}", quote(raw)),
            );
            continue;
        };
        if let Some(why) = forbidden_service_ip(&ip) {
            ctx.ignore(
                format!("{field}.ip"),
                format!("{} is not usable here ({why} address)", quote(raw)),
            );
            continue;
        }
        let ip_mode = match ing.ip_mode.as_deref() {
            None | Some("VIP") => IpMode::Vip,
            Some("Proxy") => IpMode::Proxy,
            Some(other) => {
                ctx.ignore(
                    format!("{field}.ipMode"),
                    format!("unknown ipMode {}; entry ignored", quote(other)),
                );
                continue;
            }
        };
        if !out.iter().any(|o| o.ip == ip) {
            out.push(LoadBalancerIngress { ip, ip_mode });
        }
    }
    out
}

pub(super) fn parse_source_ranges(
    ctx: &mut Ctx<'_>,
    spec: &corev1::ServiceSpec,
    annotations: &BTreeMap<String, String>,
) -> Option<Vec<IpNet>> {
    let (field, raw): (String, Vec<String>) = match spec.load_balancer_source_ranges.as_deref() {
        Some(r) if !r.is_empty() => ("spec.loadBalancerSourceRanges".into(), r.to_vec()),
        _ => match annotations.get(ANNOTATION_LB_SOURCE_RANGES) {
            Some(a) if !a.trim().is_empty() => (
                format!("metadata.annotations[{ANNOTATION_LB_SOURCE_RANGES}]"),
                a.split(',').map(|s| s.trim().to_string()).collect(),
            ),
            _ => return None,
        },
    };
    let mut out = Vec::new();
    for (i, s) in raw.iter().enumerate() {
        if i == MAX_ADDRESS_LIST {
            ctx.ignore(
                field.as_str(),
                format!("more than {MAX_ADDRESS_LIST} entries; the rest ignored"),
            );
            break;
        }
        match parse_cidr(ctx, &format!("{field}[{i}]"), s) {
            Some(net) => out.push(net),
            None => ctx.ignore(
                format!("{field}[{i}]"),
                format!("invalid CIDR {}", quote(s)),
            ),
        }
    }
    if out.is_empty() {
        // The owner asked for a restriction we cannot read: fail closed, not open.
        ctx.warn(
            field,
            "no valid source range: the load balancer IPs accept no source",
        );
    }
    Some(out)
}
