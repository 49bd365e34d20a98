//! The settings a Service's ports share besides their addresses: session
//! affinity, traffic policies, the health check node port, traffic
//! distribution, topology keys, and svcproxy's scheduler and endpoint weights
//! annotations.
//!
//! Entry points: one function per setting, from `port_template`
//! ([`affinity_timeout`], [`parse_policy`], [`topology_keys`], ...).

use super::*;

/// ClientIP affinity's timeout, `None` without affinity.
pub(super) fn affinity_timeout(ctx: &mut Ctx<'_>, spec: &corev1::ServiceSpec) -> Option<u32> {
    match spec.session_affinity.as_deref() {
        None | Some("None") | Some("") => None,
        Some("ClientIP") => {
            let t = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            match t {
                None => Some(DEFAULT_AFFINITY_TIMEOUT_SECONDS),
                Some(t) if t >= 1 && t as i64 <= MAX_AFFINITY_TIMEOUT_SECONDS as i64 => {
                    Some(t as u32)
                }
                Some(t) => {
                    ctx.ignore(
                        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                        format!(
                            "{t} is outside 1..={MAX_AFFINITY_TIMEOUT_SECONDS}; using the default {DEFAULT_AFFINITY_TIMEOUT_SECONDS}"
                        ),
                    );
                    Some(DEFAULT_AFFINITY_TIMEOUT_SECONDS)
                }
            }
        }
        Some(other) => {
            ctx.ignore(
                "spec.sessionAffinity",
                format!("unknown value {}; no affinity", quote(other)),
            );
            None
        }
    }
}

/// The topology keys annotation's keys; none where the service keeps traffic
/// from outside on its node (`local_external`: externalTrafficPolicy Local and
/// reachable from outside), the two being mutually exclusive.
pub(super) fn topology_keys(
    ctx: &mut Ctx<'_>,
    annotations: &BTreeMap<String, String>,
    local_external: bool,
) -> Option<Vec<TopologyKey>> {
    let keys = annotations
        .get(ANNOTATION_TOPOLOGY_KEYS)
        .and_then(|raw| parse_topology_keys(ctx, raw))?;
    if local_external {
        ctx.warn(
            format!("metadata.annotations[{ANNOTATION_TOPOLOGY_KEYS}]"),
            "ignored: topology keys and externalTrafficPolicy Local are mutually exclusive",
        );
        return None;
    }
    Some(keys)
}

/// `svcproxy.io/scheduler`: the Service's scheduler; an unknown or unimplemented
/// one is ignored (the node's scheduler applies).
pub(super) fn scheduler(
    ctx: &mut Ctx<'_>,
    annotations: &BTreeMap<String, String>,
) -> Option<Scheduler> {
    let raw = annotations.get(ANNOTATION_SCHEDULER)?;
    match Scheduler::parse(raw.trim()) {
        Ok(s) => Some(s),
        Err(why) => {
            ctx.ignore(
                format!("metadata.annotations[{ANNOTATION_SCHEDULER}]"),
                format!("{why}; the node's scheduler applies"),
            );
            None
        }
    }
}

/// `svcproxy.io/maglev-table-size`: the Service's Maglev table size; one that is
/// not one of the sizes is ignored (the node's applies).
pub(super) fn maglev_table_size(
    ctx: &mut Ctx<'_>,
    annotations: &BTreeMap<String, String>,
) -> Option<u32> {
    let raw = annotations.get(ANNOTATION_MAGLEV_TABLE_SIZE)?;
    match parse_maglev_table_size(raw) {
        Ok(n) => Some(n),
        Err(why) => {
            ctx.ignore(
                format!("metadata.annotations[{ANNOTATION_MAGLEV_TABLE_SIZE}]"),
                format!("{why}; the node's size applies"),
            );
            None
        }
    }
}

/// The most entries `svcproxy.io/endpoint-weights` may have.
const MAX_ENDPOINT_WEIGHTS: usize = 1024;

/// `svcproxy.io/endpoint-weights`: `KEY=WEIGHT` entries, KEY an endpoint's
/// address or a node's name, WEIGHT 1..=255. A malformed list is ignored as a
/// whole (every endpoint weighs 1), with a problem naming the first bad entry.
pub(super) fn endpoint_weights(
    ctx: &mut Ctx<'_>,
    annotations: &BTreeMap<String, String>,
) -> Option<Vec<(WeightKey, u8)>> {
    let raw = annotations.get(ANNOTATION_ENDPOINT_WEIGHTS)?;
    let field = format!("metadata.annotations[{ANNOTATION_ENDPOINT_WEIGHTS}]");
    let parts: Vec<&str> = raw
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if parts.len() > MAX_ENDPOINT_WEIGHTS {
        ctx.ignore(
            field,
            format!(
                "{} entries; at most {MAX_ENDPOINT_WEIGHTS}; every endpoint weighs 1",
                parts.len()
            ),
        );
        return None;
    }
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        let parsed = part.split_once('=').and_then(|(k, w)| {
            let w: u8 = w.trim().parse().ok().filter(|w| *w >= 1)?;
            let k = k.trim();
            let key = match k.parse::<IpAddr>() {
                Ok(ip) => WeightKey::Ip(ip),
                Err(_) if is_dns1123_subdomain(k) => WeightKey::Node(k.into()),
                Err(_) => return None,
            };
            Some((key, w))
        });
        match parsed {
            Some(entry) => out.push(entry),
            None => {
                ctx.ignore(
                    field,
                    format!(
                        "entry {} is not ADDRESS=WEIGHT or NODE=WEIGHT with a weight of \
                         1..={MAX_ENDPOINT_WEIGHT}; every endpoint weighs 1",
                        quote(part)
                    ),
                );
                return None;
            }
        }
    }
    if out.is_empty() {
        ctx.ignore(field, "no entries; every endpoint weighs 1");
        return None;
    }
    Some(out)
}

/// The healthCheckNodePort, for a LoadBalancer with externalTrafficPolicy Local.
pub(super) fn health_check_node_port(
    ctx: &mut Ctx<'_>,
    spec: &corev1::ServiceSpec,
    service_type: ServiceType,
    external_traffic_policy: TrafficPolicy,
) -> Option<u16> {
    match spec.health_check_node_port {
        None | Some(0) => None,
        Some(p)
            if service_type == ServiceType::LoadBalancer
                && external_traffic_policy == TrafficPolicy::Local =>
        {
            match u16::try_from(p) {
                Ok(p) if p > 0 => Some(p),
                _ => {
                    ctx.ignore(
                        "spec.healthCheckNodePort",
                        format!("port {p} is out of range"),
                    );
                    None
                }
            }
        }
        Some(_) => {
            ctx.ignore(
                "spec.healthCheckNodePort",
                "only used by LoadBalancer services with externalTrafficPolicy Local",
            );
            None
        }
    }
}

pub(super) fn traffic_distribution(
    ctx: &mut Ctx<'_>,
    spec: &corev1::ServiceSpec,
) -> Option<TrafficDistribution> {
    match spec.traffic_distribution.as_deref() {
        None | Some("") => None,
        Some(s) => match TrafficDistribution::parse(s) {
            Some(td) => Some(td),
            None => {
                ctx.ignore(
                    "spec.trafficDistribution",
                    format!("unknown value {}", quote(s)),
                );
                None
            }
        },
    }
}

pub(super) fn parse_policy(ctx: &mut Ctx<'_>, field: &str, raw: Option<&str>) -> TrafficPolicy {
    match raw {
        None | Some("") | Some("Cluster") => TrafficPolicy::Cluster,
        Some("Local") => TrafficPolicy::Local,
        Some(other) => {
            ctx.ignore(
                field,
                format!("unknown policy {}; using Cluster", quote(other)),
            );
            TrafficPolicy::Cluster
        }
    }
}

/// Parses `svcproxy.io/topology-keys`. A malformed list is ignored as a whole (the
/// service routes as if it had none) with an error: guessing at the owner's intent
/// from a partial list could route further than they allowed.
fn parse_topology_keys(ctx: &mut Ctx<'_>, raw: &str) -> Option<Vec<TopologyKey>> {
    let field = format!("metadata.annotations[{ANNOTATION_TOPOLOGY_KEYS}]");
    let mut keys = Vec::new();
    let parts: Vec<&str> = raw.split(',').map(str::trim).collect();
    if parts.len() > MAX_TOPOLOGY_KEYS {
        ctx.ignore(
            field,
            format!(
                "{} keys; at most {MAX_TOPOLOGY_KEYS}; annotation ignored",
                parts.len()
            ),
        );
        return None;
    }
    for (i, part) in parts.iter().enumerate() {
        let key = if *part == "*" {
            if i + 1 != parts.len() {
                ctx.ignore(field, "\"*\" must be the last key; annotation ignored");
                return None;
            }
            TopologyKey::Any
        } else if is_qualified_name(part) {
            TopologyKey::Label(part.to_string())
        } else {
            ctx.ignore(
                field,
                format!("invalid topology key {}; annotation ignored", quote(part)),
            );
            return None;
        };
        if keys.contains(&key) {
            ctx.ignore(
                field,
                format!("duplicate topology key {}; annotation ignored", quote(part)),
            );
            return None;
        }
        keys.push(key);
    }
    Some(keys)
}
