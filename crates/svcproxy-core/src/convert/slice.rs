//! An EndpointSlice converted: the service it belongs to, its address family,
//! its ports and its endpoints with their conditions, names and hints.
//!
//! Entry points: [`convert_slice`], [`convert_slice_with`]; the result is a
//! [`Slice`].

use super::validation::{check_namespaced_name, forbidden_endpoint_ip, meta_key, parse_ip};
use super::*;

/// A converted EndpointSlice: which service it belongs to, its ports and endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    pub service: ServiceName,
    pub name: Arc<str>,
    pub family: IpFamily,
    pub ports: Box<[SlicePort]>,
    pub endpoints: Box<[SliceEndpoint]>,
    /// `endpoints.kubernetes.io/last-change-trigger-time`, verbatim (RFC 3339).
    pub last_change_trigger_time: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicePort {
    pub name: Arc<str>,
    pub port: u16,
    pub protocol: Protocol,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceEndpoint {
    pub ip: IpAddr,
    /// Shared with every service port's [`Endpoint`](crate::model::Endpoint) of this address.
    pub info: Arc<EndpointInfo>,
    /// `hostname` (a DNS label): the cluster DNS names a headless service's
    /// endpoint by it, else by its address. Kept only for the DNS
    /// ([`ConvertOptions::keep_unproxied`]).
    pub hostname: Option<Box<str>>,
}

impl std::ops::Deref for SliceEndpoint {
    type Target = EndpointInfo;
    fn deref(&self) -> &EndpointInfo {
        &self.info
    }
}

/// Converts an EndpointSlice. `None` when it is not proxied (headless, FQDN) or
/// unusable (no service label, bad address type, bad name).
pub fn convert_slice(
    slice: &discoveryv1::EndpointSlice,
    problems: &mut Vec<Problem>,
) -> Option<Slice> {
    convert_slice_with(slice, &ConvertOptions::default(), problems)
}

/// [`convert_slice`] under `opts` (`keep_unproxied` keeps headless services' slices).
pub fn convert_slice_with(
    slice: &discoveryv1::EndpointSlice,
    opts: &ConvertOptions,
    problems: &mut Vec<Problem>,
) -> Option<Slice> {
    let key = meta_key(Kind::EndpointSlice, &slice.metadata);
    let mut ctx = Ctx {
        key: &key,
        problems,
    };
    if !check_namespaced_name(&mut ctx, is_dns1123_subdomain) {
        return None;
    }
    let empty = BTreeMap::new();
    let labels = slice.metadata.labels.as_ref().unwrap_or(&empty);
    if labels.contains_key(LABEL_HEADLESS) && !opts.keep_unproxied {
        return None;
    }
    let family = slice_family(&mut ctx, slice)?;
    let service_name = slice_service_name(&mut ctx, labels)?;
    let (raw_ports, raw_endpoints) = slice_contents(&mut ctx, slice)?;
    let ports = slice_ports(&mut ctx, raw_ports);
    let endpoints: Vec<SliceEndpoint> = raw_endpoints
        .iter()
        .enumerate()
        .filter_map(|(i, ep)| {
            let field = format!("endpoints[{i}]");
            slice_endpoint(&mut ctx, &field, ep, family, opts.keep_unproxied)
        })
        .collect();
    Some(Slice {
        service: ServiceName::new(key.namespace.clone(), service_name.clone()),
        name: key.name.as_str().into(),
        family,
        ports: ports.into(),
        endpoints: endpoints.into(),
        last_change_trigger_time: slice
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_LAST_CHANGE_TRIGGER_TIME))
            .cloned(),
    })
}

/// The slice's address family; `None` for FQDN slices (not proxied) and unknown
/// types (rejected).
fn slice_family(ctx: &mut Ctx<'_>, slice: &discoveryv1::EndpointSlice) -> Option<IpFamily> {
    match slice.address_type.as_str() {
        "IPv4" => Some(IpFamily::V4),
        "IPv6" => Some(IpFamily::V6),
        "FQDN" => None,
        other => {
            ctx.reject(
                "addressType",
                format!("unknown address type {}", quote(other)),
            );
            None
        }
    }
}

/// The service the slice belongs to (its `kubernetes.io/service-name` label).
fn slice_service_name<'a>(
    ctx: &mut Ctx<'_>,
    labels: &'a BTreeMap<String, String>,
) -> Option<&'a String> {
    let Some(service_name) = labels.get(LABEL_SERVICE_NAME) else {
        ctx.reject(
            format!("metadata.labels[{LABEL_SERVICE_NAME}]"),
            "missing: the slice belongs to no service",
        );
        return None;
    };
    if !is_dns1035_label(service_name) {
        ctx.reject(
            format!("metadata.labels[{LABEL_SERVICE_NAME}]"),
            format!("invalid service name {}", quote(service_name)),
        );
        return None;
    }
    Some(service_name)
}

/// The slice's ports and endpoints, within the API's limits (a slice beyond
/// them is rejected whole).
fn slice_contents<'a>(
    ctx: &mut Ctx<'_>,
    slice: &'a discoveryv1::EndpointSlice,
) -> Option<(&'a [discoveryv1::EndpointPort], &'a [discoveryv1::Endpoint])> {
    let raw_ports = slice.ports.as_deref().unwrap_or_default();
    if raw_ports.len() > MAX_SLICE_PORTS {
        ctx.reject(
            "ports",
            format!("{} ports; at most {MAX_SLICE_PORTS}", raw_ports.len()),
        );
        return None;
    }
    // Optional since API 1.35: a slice without the field has no endpoints.
    let raw_endpoints = slice.endpoints.as_deref().unwrap_or_default();
    if raw_endpoints.len() > MAX_SLICE_ENDPOINTS {
        ctx.reject(
            "endpoints",
            format!(
                "{} endpoints; at most {MAX_SLICE_ENDPOINTS}",
                raw_endpoints.len()
            ),
        );
        return None;
    }
    Some((raw_ports, raw_endpoints))
}

/// The slice's usable ports; each bad one is ignored with a problem.
fn slice_ports(ctx: &mut Ctx<'_>, raw_ports: &[discoveryv1::EndpointPort]) -> Vec<SlicePort> {
    let mut ports: Vec<SlicePort> = Vec::new();
    for (i, p) in raw_ports.iter().enumerate() {
        let field = format!("ports[{i}]");
        let name = p.name.clone().unwrap_or_default();
        if !name.is_empty() && !is_dns1123_label(&name) {
            ctx.ignore(
                format!("{field}.name"),
                format!("invalid port name {}", quote(&name)),
            );
            continue;
        }
        let Some(protocol) = Protocol::parse(p.protocol.as_deref()) else {
            ctx.ignore(
                format!("{field}.protocol"),
                format!(
                    "unknown protocol {}",
                    quote(p.protocol.as_deref().unwrap_or(""))
                ),
            );
            continue;
        };
        let port = match p.port.map(u16::try_from) {
            Some(Ok(port)) if port > 0 => port,
            None => {
                ctx.ignore(format!("{field}.port"), "port not set");
                continue;
            }
            Some(_) => {
                ctx.ignore(
                    format!("{field}.port"),
                    format!(
                        "port {} is out of range 1-65535",
                        p.port.unwrap_or_default()
                    ),
                );
                continue;
            }
        };
        if ports
            .iter()
            .any(|q| *q.name == *name && q.protocol == protocol)
        {
            ctx.ignore(
                field,
                format!("duplicate port {} for {protocol}", quote(&name)),
            );
            continue;
        }
        ports.push(SlicePort {
            name: name.into(),
            port,
            protocol,
        });
    }
    ports
}

/// One endpoint of a slice of `family`; `None`, with a problem, when its address
/// is unusable (its other bad fields are ignored one by one).
fn slice_endpoint(
    ctx: &mut Ctx<'_>,
    field: &str,
    ep: &discoveryv1::Endpoint,
    family: IpFamily,
    keep_hostname: bool,
) -> Option<SliceEndpoint> {
    // Only the first address is used, as upstream: the rest are reserved.
    let Some(raw) = ep.addresses.first() else {
        ctx.ignore(format!("{field}.addresses"), "no address");
        return None;
    };
    let Some(ip) = parse_ip(ctx, &format!("{field}.addresses[0]"), raw) else {
        ctx.ignore(
            format!("{field}.addresses[0]"),
            format!("invalid IP address {}", quote(raw)),
        );
        return None;
    };
    if IpFamily::of(&ip) != family {
        ctx.ignore(
            format!("{field}.addresses[0]"),
            format!("{} is not an {family} address", quote(raw)),
        );
        return None;
    }
    if let Some(why) = forbidden_endpoint_ip(&ip) {
        ctx.ignore(
            format!("{field}.addresses[0]"),
            format!("{why} address {} cannot be an endpoint", quote(raw)),
        );
        return None;
    }
    let node_name = checked(
        ctx,
        field,
        ("nodeName", "node name"),
        ep.node_name.as_deref(),
        is_dns1123_subdomain,
    )
    .map(Arc::from);
    let zone = checked(
        ctx,
        field,
        ("zone", "zone"),
        ep.zone.as_deref(),
        is_label_value,
    )
    .map(Arc::from);
    // Checked either way (the API's rule), kept for the cluster DNS only.
    let hostname = checked(
        ctx,
        field,
        ("hostname", "hostname"),
        ep.hostname.as_deref(),
        is_dns1123_label,
    )
    .filter(|_| keep_hostname)
    .map(Box::from);
    let cond = ep.conditions.clone().unwrap_or_default();
    // Upstream defaulting: unset ready means ready; unset serving means "same as
    // ready"; unset terminating means not terminating.
    let ready = cond.ready.unwrap_or(true);
    let serving = cond.serving.unwrap_or(ready);
    let terminating = cond.terminating.unwrap_or(false);
    let hints = ep.hints.clone().unwrap_or_default();
    let zone_hints = hint_list(
        ctx,
        &format!("{field}.hints.forZones"),
        hints
            .for_zones
            .unwrap_or_default()
            .into_iter()
            .map(|z| z.name),
    );
    let node_hints = hint_list(
        ctx,
        &format!("{field}.hints.forNodes"),
        hints
            .for_nodes
            .unwrap_or_default()
            .into_iter()
            .map(|n| n.name),
    );
    Some(SliceEndpoint {
        ip,
        info: Arc::new(EndpointInfo {
            node_name,
            zone,
            ready,
            serving,
            terminating,
            zone_hints,
            node_hints,
        }),
        hostname,
    })
}

/// An optional name field of an endpoint (`(field name, what it is called in
/// messages)`): `None` when unset or empty, and, with a problem, when `valid`
/// refuses it.
fn checked<'a>(
    ctx: &mut Ctx<'_>,
    field: &str,
    (name, what): (&str, &str),
    value: Option<&'a str>,
    valid: fn(&str) -> bool,
) -> Option<&'a str> {
    match value {
        None | Some("") => None,
        Some(v) if valid(v) => Some(v),
        Some(v) => {
            ctx.ignore(
                format!("{field}.{name}"),
                format!("invalid {what} {}", quote(v)),
            );
            None
        }
    }
}

fn hint_list(
    ctx: &mut Ctx<'_>,
    field: &str,
    names: impl Iterator<Item = String>,
) -> Box<[Arc<str>]> {
    let mut out: Vec<String> = Vec::new();
    for (i, n) in names.enumerate() {
        if i == 64 {
            ctx.ignore(field, "more than 64 hints; the rest ignored");
            break;
        }
        if is_dns1123_subdomain(&n) || is_label_value(&n) {
            if !out.contains(&n) {
                out.push(n);
            }
        } else {
            ctx.ignore(
                format!("{field}[{i}]"),
                format!("invalid hint {}", quote(&n)),
            );
        }
    }
    out.sort();
    out.into_iter().map(Arc::from).collect()
}
