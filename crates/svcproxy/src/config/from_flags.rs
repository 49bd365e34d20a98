//! The modeled fields as kube-proxy's flags give them ([`from_flags`]): used
//! when no `--config` file is given, as upstream binds its flags into the same
//! configuration struct the file would fill.

use super::*;

pub(super) fn from_flags(
    flags: &ProxyFlags,
    errors: &mut Errors,
    warnings: &mut Vec<String>,
) -> Modeled {
    let mode = errors.check(
        "--proxy-mode",
        svcproxy_dataplane::resolve_mode(&flags.proxy_mode),
        default_mode(),
    );
    // The unset mode concerns the commands that write or show rules only.
    let (mode_rule_warning, mode_warning) = split_mode_warning(&mode);
    warnings.extend(mode_warning.map(|w| format!("--proxy-mode: {w}")));
    let cluster_cidrs = errors.check(
        "--cluster-cidr",
        parse_cluster_cidrs(flags.cluster_cidr.as_deref().unwrap_or("")),
        Vec::new(),
    );
    let nodeport_addresses = flag_nodeport_addresses(flags, errors);
    let (sync_period, min_sync_period) = flag_sync_periods(flags, &mode, errors, warnings);
    let feature_gates = feature_gates(
        "--feature-gates",
        flags
            .feature_gates
            .as_deref()
            .map(gates::parse_flag)
            .unwrap_or_else(|| Ok(BTreeMap::new())),
        errors,
        warnings,
    );
    let mut rule_warnings: Vec<String> = mode_rule_warning.into_iter().collect();
    let detect_local = errors.check(
        "--detect-local-mode",
        detect_local(
            &flags.detect_local_mode,
            &cluster_cidrs,
            &flags.pod_bridge_interface,
            &flags.pod_interface_name_prefix,
            (
                "--pod-bridge-interface",
                "--pod-interface-name-prefix",
                "--cluster-cidr",
            ),
            &mut rule_warnings,
        ),
        LocalDetection::None,
    );
    let (healthz_bind, metrics_bind) = flag_servers(flags, errors);
    Modeled {
        proxy_mode: mode.backend,
        mode_gate: mode.gate.map(|g| (g, mode.asked)),
        ipvs_scheduler: ("--ipvs-scheduler", flags.ignored.ipvs_scheduler.clone()),
        ipvs_timeouts: [
            ("--ipvs-tcp-timeout", flags.ignored.ipvs_tcp_timeout),
            ("--ipvs-tcpfin-timeout", flags.ignored.ipvs_tcpfin_timeout),
            ("--ipvs-udp-timeout", flags.ignored.ipvs_udp_timeout),
        ],
        feature_gates,
        bind_address: errors.check(
            "--bind-address",
            parse_ip(&flags.bind_address),
            Ipv4Addr::UNSPECIFIED.into(),
        ),
        cluster_cidrs,
        nodeport_addresses,
        masquerade_all: flags.masquerade_all,
        masquerade_bit: flags.iptables_masquerade_bit,
        localhost_nodeports: flags.iptables_localhost_nodeports,
        healthz_bind,
        metrics_bind,
        min_sync_period,
        sync_period,
        config_sync_period: flags.config_sync_period,
        kubeconfig: flags
            .kubeconfig
            .clone()
            .filter(|p| !p.as_os_str().is_empty()),
        client_connection: ClientConnection {
            qps: flags.kube_api_qps,
            burst: flags.kube_api_burst,
            content_type: flags.kube_api_content_type.clone(),
            accept_content_types: String::new(),
        },
        detect_local,
        rule_warnings,
        mode_defaulted: mode.asked.is_empty(),
        conntrack: flag_conntrack(flags),
        hostname_override: None,
        verbosity: None,
        log_format: None,
        oom_score_adj: flags.oom_score_adj,
        bind_address_hard_fail: flags.bind_address_hard_fail,
    }
}

/// `--nodeport-addresses`, a comma-separated list (`None`: unset).
pub(super) fn flag_nodeport_addresses(
    flags: &ProxyFlags,
    errors: &mut Errors,
) -> Option<NodePortAddresses> {
    let items: Vec<String> = flags
        .nodeport_addresses
        .as_deref()
        .unwrap_or("")
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    errors.check(
        "--nodeport-addresses",
        parse_nodeport_addresses(&items),
        None,
    )
}

/// The sync period and the minimum one: kube-proxy's mode-specific names
/// (processV1Alpha1Flags): --ipvs-* in ipvs mode, --iptables-* in every other mode;
/// each wins over svcproxy's mode-neutral flag, and the other mode's warn.
pub(super) fn flag_sync_periods(
    flags: &ProxyFlags,
    mode: &svcproxy_dataplane::ModeChoice,
    errors: &mut Errors,
    warnings: &mut Vec<String>,
) -> (Duration, Duration) {
    let (mode_sync, mode_min, other) = if mode.sync_section == ConfigSection::Ipvs {
        (
            flags.ipvs_sync_period,
            flags.ipvs_min_sync_period,
            [
                ("--iptables-sync-period", flags.iptables_sync_period),
                ("--iptables-min-sync-period", flags.iptables_min_sync_period),
            ],
        )
    } else {
        (
            flags.iptables_sync_period,
            flags.iptables_min_sync_period,
            [
                ("--ipvs-sync-period", flags.ipvs_sync_period),
                ("--ipvs-min-sync-period", flags.ipvs_min_sync_period),
            ],
        )
    };
    for (flag, value) in other {
        if value.is_some() {
            warnings.push(format!(
                "{flag}: ignored, --proxy-mode is {} (as kube-proxy)",
                mode.name()
            ));
        }
    }
    let sync_period = mode_sync.unwrap_or(flags.sync_period);
    let min_sync_period = mode_min.unwrap_or(flags.min_sync_period);
    if sync_period.is_zero() {
        errors.push("--sync-period: must be greater than 0".to_string());
    }
    if flags.config_sync_period.is_zero() {
        errors.push("--config-sync-period: must be greater than 0".to_string());
    }
    (sync_period, min_sync_period)
}

/// The health and metrics servers' addresses. The deprecated --healthz-port and
/// --metrics-port (addressFromDeprecatedFlags): 0 disables the server; another
/// port only fills in an address without one.
pub(super) fn flag_servers(
    flags: &ProxyFlags,
    errors: &mut Errors,
) -> (Option<SocketAddr>, Option<SocketAddr>) {
    let mut server = |flag: &str, addr: &str, port: Option<u16>, default: u16| match port {
        Some(0) => None,
        port => errors.check(
            flag,
            parse_bind_address(addr, port.unwrap_or(default)),
            None,
        ),
    };
    let healthz = server(
        "--healthz-bind-address",
        &flags.healthz_bind_address,
        flags.healthz_port,
        HEALTHZ_PORT,
    );
    let metrics = server(
        "--metrics-bind-address",
        &flags.metrics_bind_address,
        flags.metrics_port,
        METRICS_PORT,
    );
    (healthz, metrics)
}

/// The conntrack settings the flags give (0: leave the kernel's).
pub(super) fn flag_conntrack(flags: &ProxyFlags) -> ConntrackSettings {
    let nonzero = |d: Duration| Some(d).filter(|d| !d.is_zero());
    ConntrackSettings {
        max_per_core: flags.conntrack_max_per_core,
        min: flags.conntrack_min,
        tcp_established_timeout: nonzero(flags.conntrack_tcp_timeout_established),
        tcp_close_wait_timeout: nonzero(flags.conntrack_tcp_timeout_close_wait),
        tcp_be_liberal: flags.conntrack_tcp_be_liberal,
        udp_timeout: nonzero(flags.conntrack_udp_timeout),
        udp_stream_timeout: nonzero(flags.conntrack_udp_timeout_stream),
    }
}
