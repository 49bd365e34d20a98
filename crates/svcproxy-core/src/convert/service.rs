//! A Service converted: its type, cluster IPs and ports, each port a copy of
//! the fields they share ([`port_template`]) with its own name and numbers.
//!
//! Entry point: [`convert_service`].

use super::service_addresses::{parse_ip_list, parse_lb_ingress, parse_source_ranges};
use super::service_policy::{
    affinity_timeout, endpoint_weights, health_check_node_port, maglev_table_size, parse_policy,
    scheduler, topology_keys, traffic_distribution,
};
use super::validation::{check_namespaced_name, forbidden_service_ip, meta_key, parse_ip};
use super::*;

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
    let maglev_table_size = maglev_table_size(ctx, annotations);
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
        maglev_table_size,
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
