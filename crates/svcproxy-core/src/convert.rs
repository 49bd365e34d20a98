//! Conversion from raw k8s-openapi objects to the validated [`crate::model`].
//!
//! Entry points: [`convert_service`], [`convert_slice`], [`convert_node`],
//! [`convert_service_cidr`], [`convert_pod`]. Each returns the converted value (or `None` when the
//! object is not proxied or is unusable) and pushes every [`Problem`] it found. The
//! rules mirror what the API server would have enforced, because manifests reach us
//! without that validation: anything the API would refuse is refused here, with a
//! message naming the field.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1 as corev1;
use k8s_openapi::api::discovery::v1 as discoveryv1;
use k8s_openapi::api::networking::v1 as networkingv1;

use crate::model::*;
use crate::objects::{Kind, ObjectKey};
use crate::problem::{quote, Problem, Severity};

/// What the state needs to decide whether a Service is ours.
#[derive(Clone, Debug, Default)]
pub struct ConvertOptions {
    /// `--service-proxy-name`: when set, only Services labelled with exactly this
    /// value are ours; when unset, only Services without the label are.
    pub service_proxy_name: Option<String>,
    /// Services the proxy leaves alone are converted too, marked
    /// [`Service::not_proxied`] (headless and ExternalName Services, other proxies'
    /// Services, headless services' slices): the cluster DNS answers for all of
    /// them, from the same model. Off, they are `None`, with no problem.
    pub keep_unproxied: bool,
    /// `spec.externalIPs` are dropped (still checked): the `AllowServiceExternalIPs`
    /// feature gate is off.
    pub ignore_external_ips: bool,
}

/// Annotation older clouds use instead of `spec.loadBalancerSourceRanges`.
const ANNOTATION_LB_SOURCE_RANGES: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";
/// Taint the cluster autoscaler puts on nodes it is about to remove.
const TAINT_TO_BE_DELETED: &str = "ToBeDeletedByClusterAutoscaler";
/// API limits, applied so that absurd manifests cannot make us allocate without bound.
const MAX_SLICE_ENDPOINTS: usize = 1000;
const MAX_SLICE_PORTS: usize = 100;
const MAX_SERVICE_PORTS: usize = 1000;
const MAX_ADDRESS_LIST: usize = 1000;
const MAX_TOPOLOGY_KEYS: usize = 16;

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

struct Ctx<'a> {
    key: &'a ObjectKey,
    problems: &'a mut Vec<Problem>,
}

impl Ctx<'_> {
    fn push(&mut self, severity: Severity, field: impl Into<String>, message: impl Into<String>) {
        self.problems
            .push(Problem::new(self.key, severity, field, message));
    }
    fn reject(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.push(Severity::Rejected, field, message)
    }
    fn ignore(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.push(Severity::Ignored, field, message)
    }
    fn warn(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.push(Severity::Warning, field, message)
    }
}

// ---------------------------------------------------------------------------
// Name validation (the API server's rules, which manifests bypass).

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
fn forbidden_endpoint_ip(ip: &IpAddr) -> Option<&'static str> {
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
fn forbidden_service_ip(ip: &IpAddr) -> Option<&'static str> {
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
fn parse_ip(ctx: &mut Ctx<'_>, field: &str, s: &str) -> Option<IpAddr> {
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
fn parse_cidr(ctx: &mut Ctx<'_>, field: &str, s: &str) -> Option<IpNet> {
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

fn meta_key(
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

fn check_namespaced_name(ctx: &mut Ctx<'_>, name_ok: fn(&str) -> bool) -> bool {
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

// ---------------------------------------------------------------------------
// Service

/// Converts a Service. `None` when it is not proxied: deliberately (ExternalName,
/// headless, another proxy's) with no problem pushed, or because it is unusable,
/// with a [`Severity::Rejected`] problem saying why.
pub fn convert_service(
    svc: &corev1::Service,
    opts: &ConvertOptions,
    problems: &mut Vec<Problem>,
) -> Option<Service> {
    let key = meta_key(Kind::Service, &svc.metadata);
    let mut ctx = Ctx {
        key: &key,
        problems,
    };
    if !check_namespaced_name(&mut ctx, is_dns1035_label) {
        return None;
    }
    let mut not_proxied = not_proxied_by_labels(svc, opts);
    if not_proxied.is_some() && !opts.keep_unproxied {
        return None;
    }

    let Some(spec) = svc.spec.as_ref() else {
        ctx.reject("spec", "missing spec");
        return None;
    };
    let name = ServiceName::new(key.namespace.clone(), key.name.clone());
    let publish_not_ready_addresses = spec.publish_not_ready_addresses == Some(true);
    let Some(service_type) = service_type(&mut ctx, spec)? else {
        // ExternalName: an alias, nothing to proxy.
        if !opts.keep_unproxied {
            return None;
        }
        return Some(Service {
            name,
            ports: Vec::new(),
            kind: ServiceKind::ExternalName(external_name(&mut ctx, spec)?),
            publish_not_ready_addresses,
            not_proxied: Some(NotProxied::ExternalName),
        });
    };

    let cluster_ips = cluster_ips(&mut ctx, spec, opts.keep_unproxied)?;
    let headless = cluster_ips.is_none();
    if headless {
        not_proxied = not_proxied.or(Some(NotProxied::Headless));
    }
    let cluster_ips = cluster_ips.unwrap_or_default();

    let cluster_ips: Arc<[IpAddr]> = cluster_ips.into();
    let template = port_template(
        &mut ctx,
        svc,
        spec,
        service_type,
        &name,
        cluster_ips.clone(),
        opts,
    );
    let ports = service_ports(&mut ctx, spec, &template, headless)?;
    Some(Service {
        name,
        ports,
        kind: if headless {
            ServiceKind::Headless
        } else {
            ServiceKind::ClusterIp(cluster_ips)
        },
        publish_not_ready_addresses,
        not_proxied,
    })
}

/// Why the Service's labels leave it to another: `service.kubernetes.io/headless`,
/// or a `service.kubernetes.io/service-proxy-name` that is not ours.
fn not_proxied_by_labels(svc: &corev1::Service, opts: &ConvertOptions) -> Option<NotProxied> {
    let labels = svc.metadata.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    if label(LABEL_HEADLESS).is_some() {
        Some(NotProxied::HeadlessLabel)
    } else if label(LABEL_SERVICE_PROXY_NAME) != opts.service_proxy_name.as_deref() {
        Some(NotProxied::OtherProxy)
    } else {
        None
    }
}

/// Every field a Service's ports share, in a port of its own (no name, port 0):
/// each port is this one with its name and numbers.
fn port_template(
    ctx: &mut Ctx<'_>,
    svc: &corev1::Service,
    spec: &corev1::ServiceSpec,
    service_type: ServiceType,
    name: &ServiceName,
    cluster_ips: Arc<[IpAddr]>,
    opts: &ConvertOptions,
) -> ServicePort {
    let empty = BTreeMap::new();
    let annotations = svc.metadata.annotations.as_ref().unwrap_or(&empty);
    let mut external_ips = parse_ip_list(
        ctx,
        "spec.externalIPs",
        spec.external_ips.as_deref().unwrap_or_default(),
    );
    if opts.ignore_external_ips {
        external_ips.clear();
    }

    let load_balancer_ingress = if service_type == ServiceType::LoadBalancer {
        parse_lb_ingress(ctx, svc)
    } else {
        Vec::new()
    };

    let load_balancer_source_ranges = if service_type == ServiceType::LoadBalancer {
        parse_source_ranges(ctx, spec, annotations)
    } else {
        None
    };

    let external_traffic_policy = parse_policy(
        ctx,
        "spec.externalTrafficPolicy",
        spec.external_traffic_policy.as_deref(),
    );
    let internal_traffic_policy = parse_policy(
        ctx,
        "spec.internalTrafficPolicy",
        spec.internal_traffic_policy.as_deref(),
    );

    let session_affinity_timeout = affinity_timeout(ctx, spec);

    let health_check_node_port =
        health_check_node_port(ctx, spec, service_type, external_traffic_policy);

    let traffic_distribution = traffic_distribution(ctx, spec);

    let topology_mode = annotations
        .get(ANNOTATION_TOPOLOGY_MODE)
        .or_else(|| annotations.get(ANNOTATION_TOPOLOGY_AWARE_HINTS))
        .cloned();

    let externally_accessible = service_type != ServiceType::ClusterIP
        || !external_ips.is_empty()
        || !load_balancer_ingress.is_empty();
    let topology_keys = topology_keys(
        ctx,
        annotations,
        external_traffic_policy == TrafficPolicy::Local && externally_accessible,
    );

    let scheduler = scheduler(ctx, annotations);
    let endpoint_weights: Option<Arc<[(WeightKey, u8)]>> =
        endpoint_weights(ctx, annotations).map(Into::into);

    ServicePort {
        name: ServicePortName::new(name.clone(), "", Protocol::Tcp),
        service_type,
        cluster_ips,
        port: 0,
        node_port: None,
        external_ips: external_ips.into(),
        load_balancer_ingress: load_balancer_ingress.into(),
        load_balancer_source_ranges: load_balancer_source_ranges.map(Into::into),
        external_traffic_policy,
        internal_traffic_policy,
        session_affinity_timeout,
        health_check_node_port,
        traffic_distribution,
        topology_mode: topology_mode.map(Into::into),
        topology_keys: topology_keys.map(Into::into),
        scheduler,
        endpoint_weights,
    }
}

/// The Service's ports, each `template` with its own name and numbers; `None`
/// (rejected) when it has none (but for a headless service, which needs none), too
/// many, or none usable.
fn service_ports(
    ctx: &mut Ctx<'_>,
    spec: &corev1::ServiceSpec,
    template: &ServicePort,
    headless: bool,
) -> Option<Vec<Arc<ServicePort>>> {
    let raw_ports = spec.ports.as_deref().unwrap_or_default();
    // A headless service needs no port (the API's rule): its name still answers.
    if raw_ports.is_empty() && !headless {
        ctx.reject("spec.ports", "no ports");
        return None;
    }
    if raw_ports.len() > MAX_SERVICE_PORTS {
        ctx.reject(
            "spec.ports",
            format!("{} ports; at most {MAX_SERVICE_PORTS}", raw_ports.len()),
        );
        return None;
    }
    let mut seen: HashSet<(String, Protocol)> = HashSet::new();
    let mut ports = Vec::with_capacity(raw_ports.len());
    for (i, p) in raw_ports.iter().enumerate() {
        let Some((port_name, protocol, port, node_port)) =
            port_fields(ctx, i, p, template.service_type, &mut seen)
        else {
            continue;
        };
        ports.push(Arc::new(ServicePort {
            name: ServicePortName::new(template.name.service.clone(), port_name, protocol),
            port,
            node_port,
            ..template.clone()
        }));
    }
    if ports.is_empty() && !raw_ports.is_empty() {
        ctx.reject("spec.ports", "no usable port");
        return None;
    }
    Some(ports)
}

/// The service's type: `Some(None)` for ExternalName (not proxied), `None` for an
/// unknown type (rejected).
fn service_type(ctx: &mut Ctx<'_>, spec: &corev1::ServiceSpec) -> Option<Option<ServiceType>> {
    match spec.type_.as_deref() {
        None | Some("") | Some("ClusterIP") => Some(Some(ServiceType::ClusterIP)),
        Some("NodePort") => Some(Some(ServiceType::NodePort)),
        Some("LoadBalancer") => Some(Some(ServiceType::LoadBalancer)),
        Some("ExternalName") => Some(None),
        Some(other) => {
            ctx.reject(
                "spec.type",
                format!("unknown service type {}", quote(other)),
            );
            None
        }
    }
}

/// An ExternalName service's target: a domain name as the API requires (RFC 1123
/// subdomain; a final dot allowed), lowercased; `None`, rejected, otherwise.
fn external_name(ctx: &mut Ctx<'_>, spec: &corev1::ServiceSpec) -> Option<Arc<str>> {
    let raw = spec.external_name.as_deref().unwrap_or_default();
    let target = raw.strip_suffix('.').unwrap_or(raw).to_ascii_lowercase();
    if target.is_empty() || !is_dns1123_subdomain(&target) {
        ctx.reject(
            "spec.externalName",
            format!("{} is not a domain name", quote(raw)),
        );
        return None;
    }
    Some(target.into())
}

/// The cluster IPs, at most one per family: `Some(None)` for a headless service
/// (kept only with `keep_headless`), `None` when the service is dropped (headless
/// without `keep_headless`, or rejected).
fn cluster_ips(
    ctx: &mut Ctx<'_>,
    spec: &corev1::ServiceSpec,
    keep_headless: bool,
) -> Option<Option<Vec<IpAddr>>> {
    // Cluster IPs: clusterIPs when set (it is the dual-stack list and its first entry
    // equals clusterIP), else the legacy single clusterIP.
    let raw_ips: Vec<String> = match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(ips), _) if !ips.is_empty() => ips.clone(),
        (_, Some(ip)) if !ip.is_empty() => vec![ip.clone()],
        _ => Vec::new(),
    };
    let headless = raw_ips.first().map(String::as_str) == Some("None");
    if headless {
        return keep_headless.then_some(None);
    }
    if raw_ips.is_empty() {
        ctx.reject(
            "spec.clusterIP",
            "not set: svcproxy proxies only Services with an allocated cluster IP",
        );
        return None;
    }
    if raw_ips.len() > 2 {
        ctx.ignore(
            "spec.clusterIPs",
            format!(
                "{} entries; at most one per IP family is used",
                raw_ips.len()
            ),
        );
    }
    let mut cluster_ips: Vec<IpAddr> = Vec::new();
    for (i, raw) in raw_ips.iter().enumerate().take(2) {
        let field = format!("spec.clusterIPs[{i}]");
        match parse_ip(ctx, &field, raw) {
            Some(ip) if forbidden_service_ip(&ip).is_some() => ctx.ignore(
                field,
                format!(
                    "{} cannot be a cluster IP ({} address)",
                    quote(raw),
                    forbidden_service_ip(&ip).unwrap_or_default()
                ),
            ),
            Some(ip)
                if cluster_ips
                    .iter()
                    .any(|c| IpFamily::of(c) == IpFamily::of(&ip)) =>
            {
                ctx.ignore(
                    field,
                    format!("second {} cluster IP {}", IpFamily::of(&ip), quote(raw)),
                )
            }
            Some(ip) => cluster_ips.push(ip),
            None => ctx.ignore(field, format!("invalid IP address {}", quote(raw))),
        }
    }
    if cluster_ips.is_empty() {
        ctx.reject("spec.clusterIPs", "no valid cluster IP");
        return None;
    }
    Some(Some(cluster_ips))
}

/// ClientIP affinity's timeout, `None` without affinity.
fn affinity_timeout(ctx: &mut Ctx<'_>, spec: &corev1::ServiceSpec) -> Option<u32> {
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
fn topology_keys(
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
fn scheduler(ctx: &mut Ctx<'_>, annotations: &BTreeMap<String, String>) -> Option<Scheduler> {
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

/// The most entries `svcproxy.io/endpoint-weights` may have.
const MAX_ENDPOINT_WEIGHTS: usize = 1024;

/// `svcproxy.io/endpoint-weights`: `KEY=WEIGHT` entries, KEY an endpoint's
/// address or a node's name, WEIGHT 1..=255. A malformed list is ignored as a
/// whole (every endpoint weighs 1), with a problem naming the first bad entry.
fn endpoint_weights(
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
fn health_check_node_port(
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

fn traffic_distribution(
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

/// Port `i`'s name, protocol, port and node port; `None` when it is skipped
/// (each reason recorded). `seen`: the (name, protocol) pairs of the ports
/// before it.
fn port_fields(
    ctx: &mut Ctx<'_>,
    i: usize,
    p: &corev1::ServicePort,
    service_type: ServiceType,
    seen: &mut HashSet<(String, Protocol)>,
) -> Option<(String, Protocol, u16, Option<u16>)> {
    let field = format!("spec.ports[{i}]");
    let port_name = p.name.clone().unwrap_or_default();
    if !port_name.is_empty() && !is_dns1123_label(&port_name) {
        ctx.ignore(
            format!("{field}.name"),
            format!("invalid port name {}; port skipped", quote(&port_name)),
        );
        return None;
    }
    // The API server defaults an empty service port protocol to TCP.
    let Some(protocol) = Protocol::parse(p.protocol.as_deref().filter(|s| !s.is_empty())) else {
        ctx.ignore(
            format!("{field}.protocol"),
            format!(
                "unknown protocol {}; port skipped",
                quote(p.protocol.as_deref().unwrap_or(""))
            ),
        );
        return None;
    };
    let port = match u16::try_from(p.port) {
        Ok(port) if port > 0 => port,
        _ => {
            ctx.ignore(
                format!("{field}.port"),
                format!("port {} is out of range 1-65535; port skipped", p.port),
            );
            return None;
        }
    };
    if !seen.insert((port_name.clone(), protocol)) {
        ctx.ignore(
            field,
            format!(
                "duplicate port name {} for {protocol}; port skipped",
                quote(&port_name)
            ),
        );
        return None;
    }
    let node_port = match (service_type, p.node_port) {
        (_, None | Some(0)) => None,
        (ServiceType::ClusterIP, Some(_)) => {
            ctx.ignore(
                format!("{field}.nodePort"),
                "ignored: only NodePort and LoadBalancer services have node ports",
            );
            None
        }
        (_, Some(np)) => match u16::try_from(np) {
            Ok(np) if np > 0 => Some(np),
            _ => {
                ctx.ignore(
                    format!("{field}.nodePort"),
                    format!("node port {np} is out of range 1-65535; ignored"),
                );
                None
            }
        },
    };
    Some((port_name, protocol, port, node_port))
}

fn parse_ip_list(ctx: &mut Ctx<'_>, field: &str, raw: &[String]) -> Vec<IpAddr> {
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

fn parse_lb_ingress(ctx: &mut Ctx<'_>, svc: &corev1::Service) -> Vec<LoadBalancerIngress> {
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

fn parse_source_ranges(
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

fn parse_policy(ctx: &mut Ctx<'_>, field: &str, raw: Option<&str>) -> TrafficPolicy {
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

// ---------------------------------------------------------------------------
// EndpointSlice

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

// ---------------------------------------------------------------------------
// Pod

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

// ---------------------------------------------------------------------------
// Node and ServiceCIDR

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
