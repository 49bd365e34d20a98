//! The modeled fields as a `--config` file gives them ([`from_file`]), with
//! upstream's file defaults for absent fields and the configured mode's section.

use super::*;

pub(super) fn from_file(
    file: &KubeProxyConfiguration,
    errors: &mut Errors,
    warnings: &mut Vec<String>,
) -> Modeled {
    warnings.extend(file.unsupported_fields());
    let feature_gates = feature_gates(
        "featureGates",
        Ok(file.feature_gates.clone().unwrap_or_default()),
        errors,
        warnings,
    );
    let mode = errors.check(
        "mode",
        svcproxy_dataplane::resolve_mode(file.mode.as_deref().unwrap_or("")),
        default_mode(),
    );
    let (mode_rule_warning, mode_warning) = split_mode_warning(&mode);
    warnings.extend(mode_warning.map(|w| format!("mode: {w}")));
    let sections = FileSections::of(file);
    let (sync_period, min_sync_period) = sections.sync_periods(file, &mode, warnings);
    let (masq_all, masquerade_bit) =
        sections.masquerade(&mode, (sync_period, min_sync_period), errors, warnings);
    let cluster_cidrs = errors.check(
        "clusterCIDR",
        parse_cluster_cidrs(file.cluster_cidr.as_deref().unwrap_or("")),
        Vec::new(),
    );
    let nodeport_addresses = errors.check(
        "nodePortAddresses",
        parse_nodeport_addresses(file.node_port_addresses.as_deref().unwrap_or(&[])),
        None,
    );
    let (bind_address, healthz_bind, metrics_bind) = file_servers(file, errors);
    let (client_connection, kubeconfig) = file_client_connection(file, errors);
    let mut rule_warnings: Vec<String> = mode_rule_warning.into_iter().collect();
    let detect_local = file_detect_local(file, &cluster_cidrs, errors, &mut rule_warnings);
    let ipvs = &sections.ipvs;
    Modeled {
        proxy_mode: mode.backend,
        mode_gate: mode.gate.map(|g| (g, mode.asked)),
        ipvs_scheduler: ("ipvs.scheduler", ipvs.scheduler.clone()),
        ipvs_timeouts: [
            ("ipvs.tcpTimeout", ipvs.tcp_timeout.map(|d| d.0)),
            ("ipvs.tcpFinTimeout", ipvs.tcp_fin_timeout.map(|d| d.0)),
            ("ipvs.udpTimeout", ipvs.udp_timeout.map(|d| d.0)),
        ],
        feature_gates,
        bind_address,
        cluster_cidrs,
        nodeport_addresses,
        masquerade_all: masq_all.unwrap_or(false),
        masquerade_bit,
        localhost_nodeports: sections.ipt.localhost_node_ports.unwrap_or(true),
        healthz_bind,
        metrics_bind,
        min_sync_period,
        sync_period,
        config_sync_period: nonzero_duration(file.config_sync_period)
            .unwrap_or(DEFAULT_CONFIG_SYNC_PERIOD),
        kubeconfig,
        client_connection,
        detect_local,
        rule_warnings,
        mode_defaulted: mode.asked.is_empty(),
        conntrack: file_conntrack(file, errors),
        hostname_override: file.hostname_override.clone().filter(|h| !h.is_empty()),
        verbosity: file.logging.as_ref().and_then(|l| l.verbosity),
        log_format: file
            .logging
            .as_ref()
            .and_then(|l| l.format.as_deref())
            .and_then(|f| errors.check("logging.format", LogFormat::parse(f).map(Some), None)),
        oom_score_adj: match file.oom_score_adj {
            None => DEFAULT_OOM_SCORE_ADJ,
            Some(n) => errors.check(
                "oomScoreAdj",
                Some(n)
                    .filter(|n| (-1000..=1000).contains(n))
                    .ok_or_else(|| format!("{n} must be within the range [-1000, 1000]")),
                DEFAULT_OOM_SCORE_ADJ,
            ),
        },
        bind_address_hard_fail: file.bind_address_hard_fail.unwrap_or(false),
    }
}

/// A duration of the file, where upstream's defaulting treats zero as unset.
pub(super) fn nonzero_duration(d: Option<GoDuration>) -> Option<Duration> {
    d.map(|d| d.0).filter(|d| !d.is_zero())
}

/// The config file's per-mode sections (absent ones as empty).
pub(super) struct FileSections {
    ipt: file::IPTablesConfiguration,
    nft: file::NFTablesConfiguration,
    ipvs: file::IPVSConfiguration,
}

impl FileSections {
    fn of(file: &KubeProxyConfiguration) -> FileSections {
        FileSections {
            ipt: file.iptables.clone().unwrap_or_default(),
            nft: file.nftables.clone().unwrap_or_default(),
            ipvs: file.ipvs.clone().unwrap_or_default(),
        }
    }

    /// A section's `syncPeriod` and `minSyncPeriod`.
    fn sync_of(&self, s: ConfigSection) -> (Option<GoDuration>, Option<GoDuration>) {
        match s {
            ConfigSection::Ipvs => (self.ipvs.sync_period, self.ipvs.min_sync_period),
            ConfigSection::Iptables => (self.ipt.sync_period, self.ipt.min_sync_period),
            ConfigSection::Nftables => (self.nft.sync_period, self.nft.min_sync_period),
        }
    }

    /// A section's `masqueradeAll` and `masqueradeBit`: upstream's ipvs mode
    /// reads the iptables section's.
    fn masquerade_of(&self, s: ConfigSection) -> (Option<bool>, Option<i32>) {
        match s {
            ConfigSection::Iptables | ConfigSection::Ipvs => {
                (self.ipt.masquerade_all, self.ipt.masquerade_bit)
            }
            ConfigSection::Nftables => (self.nft.masquerade_all, self.nft.masquerade_bit),
        }
    }

    /// The sync periods. Upstream's v1alpha1 conversion reads them from the section
    /// of the configured mode (ipvs included); an empty mode is iptables, as
    /// kube-proxy 1.37's, and reads that section. The top-level fields win.
    fn sync_periods(
        &self,
        file: &KubeProxyConfiguration,
        mode: &svcproxy_dataplane::ModeChoice,
        warnings: &mut Vec<String>,
    ) -> (Duration, Duration) {
        let section = mode.sync_section.name();
        let (sec_sync, sec_min) = self.sync_of(mode.sync_section);
        let mut pick = |top: Option<GoDuration>, sec: Option<GoDuration>, name: &str, default| {
            // Upstream defaulting treats zero as unset, so `0s` in the file also
            // means "default" (a file cannot ask for minSyncPeriod 0; the flag can).
            match (nonzero_duration(top), nonzero_duration(sec)) {
                (Some(t), Some(s)) if t != s => {
                    warnings.push(format!(
                        "{section}.{name}: ignored, the top-level {name} ({}) takes precedence",
                        format_go_duration(t)
                    ));
                    t
                }
                (Some(t), _) => t,
                (None, Some(s)) => s,
                (None, None) => default,
            }
        };
        (
            pick(
                file.sync_period,
                sec_sync,
                "syncPeriod",
                DEFAULT_SYNC_PERIOD,
            ),
            pick(
                file.min_sync_period,
                sec_min,
                "minSyncPeriod",
                DEFAULT_MIN_SYNC_PERIOD,
            ),
        )
    }

    /// `masqueradeAll` and the masquerade bit from the mode's section, with a
    /// warning for each other section's setting this mode does not read.
    fn masquerade(
        &self,
        mode: &svcproxy_dataplane::ModeChoice,
        (sync_period, min_sync_period): (Duration, Duration),
        errors: &mut Errors,
        warnings: &mut Vec<String>,
    ) -> (Option<bool>, u8) {
        let (masq_all, masq_bit) = self.masquerade_of(mode.sync_section);
        let active = mode.backend.mode;
        for other in [ConfigSection::Iptables, ConfigSection::Nftables] {
            if other == mode.sync_section {
                continue;
            }
            let ((sync, min), (masq, bit)) = (self.sync_of(other), self.masquerade_of(other));
            let mut fields = Vec::new();
            if nonzero_duration(sync).is_some_and(|d| d != DEFAULT_SYNC_PERIOD && d != sync_period)
            {
                fields.push("syncPeriod");
            }
            if nonzero_duration(min)
                .is_some_and(|d| d != DEFAULT_MIN_SYNC_PERIOD && d != min_sync_period)
            {
                fields.push("minSyncPeriod");
            }
            if masq == Some(true) && masq_all != Some(true) {
                fields.push("masqueradeAll");
            }
            if bit.is_some_and(|b| b != i32::from(DEFAULT_MASQUERADE_BIT) && Some(b) != masq_bit) {
                fields.push("masqueradeBit");
            }
            if !fields.is_empty() {
                let name = other.name();
                warnings.push(format!(
                    "{}: ignored in {active} mode",
                    fields
                        .iter()
                        .map(|f| format!("{name}.{f}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                ));
            }
        }
        if mode.sync_section != ConfigSection::Ipvs {
            let mut fields = Vec::new();
            if nonzero_duration(self.ipvs.sync_period).is_some_and(|d| d != DEFAULT_SYNC_PERIOD) {
                fields.push("ipvs.syncPeriod");
            }
            if nonzero_duration(self.ipvs.min_sync_period).is_some() {
                fields.push("ipvs.minSyncPeriod");
            }
            if !fields.is_empty() {
                warnings.push(format!("{}: ipvs mode only; ignored", fields.join(", ")));
            }
        }
        let bit = match masq_bit {
            None => DEFAULT_MASQUERADE_BIT,
            Some(b) => errors.check(
                &format!("{active}.masqueradeBit"),
                u8::try_from(b)
                    .ok()
                    .filter(|b| *b <= 31)
                    .ok_or_else(|| format!("{b} must be within the range [0, 31]")),
                DEFAULT_MASQUERADE_BIT,
            ),
        };
        (masq_all, bit)
    }
}

/// `bindAddress` and the health and metrics servers' addresses. Upstream's
/// SetDefaults_KubeProxyConfiguration: an empty server address means the default
/// for bindAddress's family (so a file cannot disable these servers; the flags
/// can).
pub(super) fn file_servers(
    file: &KubeProxyConfiguration,
    errors: &mut Errors,
) -> (IpAddr, Option<SocketAddr>, Option<SocketAddr>) {
    let bind_address = match file.bind_address.as_deref().unwrap_or("") {
        "" => Ipv4Addr::UNSPECIFIED.into(),
        s => errors.check("bindAddress", parse_ip(s), Ipv4Addr::UNSPECIFIED.into()),
    };
    let (healthz_default, metrics_default): (IpAddr, IpAddr) = if bind_address.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED.into(), Ipv4Addr::LOCALHOST.into())
    } else {
        (Ipv6Addr::UNSPECIFIED.into(), Ipv6Addr::LOCALHOST.into())
    };
    let mut bind = |field: &str, value: &Option<String>, default_ip: IpAddr, port: u16| match value
        .as_deref()
        .unwrap_or("")
    {
        "" => Some(SocketAddr::new(default_ip, port)),
        s => errors.check(field, parse_bind_address(s, port), None),
    };
    let healthz_bind = bind(
        "healthzBindAddress",
        &file.healthz_bind_address,
        healthz_default,
        HEALTHZ_PORT,
    );
    let metrics_bind = bind(
        "metricsBindAddress",
        &file.metrics_bind_address,
        metrics_default,
        METRICS_PORT,
    );
    (bind_address, healthz_bind, metrics_bind)
}

/// `clientConnection`, and its kubeconfig.
pub(super) fn file_client_connection(
    file: &KubeProxyConfiguration,
    errors: &mut Errors,
) -> (ClientConnection, Option<PathBuf>) {
    let cc = file.client_connection.clone().unwrap_or_default();
    let burst = match cc.burst.unwrap_or(0) {
        0 => 10,
        b => errors.check(
            "clientConnection.burst",
            u32::try_from(b).map_err(|_| format!("{b} must be greater than or equal to 0")),
            10,
        ),
    };
    let connection = ClientConnection {
        qps: cc.qps.filter(|q| *q != 0.0).unwrap_or(5.0),
        burst,
        content_type: cc
            .content_type
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| DEFAULT_CONTENT_TYPE.to_string()),
        accept_content_types: cc.accept_content_types.unwrap_or_default(),
    };
    let kubeconfig = cc.kubeconfig.filter(|k| !k.is_empty()).map(PathBuf::from);
    (connection, kubeconfig)
}

/// The node's conntrack settings (`conntrack`).
pub(super) fn file_conntrack(
    file: &KubeProxyConfiguration,
    errors: &mut Errors,
) -> ConntrackSettings {
    let ct = file.conntrack.clone().unwrap_or_default();
    let mut count = |field: &str, v: Option<i32>, default: u32| match v {
        None => default,
        Some(n) => errors.check(
            field,
            u32::try_from(n).map_err(|_| format!("{n} must be greater than or equal to 0")),
            default,
        ),
    };
    let max_per_core = count("conntrack.maxPerCore", ct.max_per_core, 32 * 1024);
    let min = count("conntrack.min", ct.min, 128 * 1024);
    // The TCP timeouts are pointers upstream: null means the default, 0 "leave as is".
    let tcp_timeout = |d: Option<GoDuration>, default: Duration| {
        Some(d.map_or(default, |d| d.0)).filter(|d| !d.is_zero())
    };
    ConntrackSettings {
        max_per_core,
        min,
        tcp_established_timeout: tcp_timeout(
            ct.tcp_established_timeout,
            Duration::from_secs(24 * 3600),
        ),
        tcp_close_wait_timeout: tcp_timeout(ct.tcp_close_wait_timeout, Duration::from_secs(3600)),
        tcp_be_liberal: ct.tcp_be_liberal.unwrap_or(false),
        udp_timeout: nonzero_duration(ct.udp_timeout),
        udp_stream_timeout: nonzero_duration(ct.udp_stream_timeout),
    }
}

/// `detectLocalMode` and `detectLocal`.
pub(super) fn file_detect_local(
    file: &KubeProxyConfiguration,
    cluster_cidrs: &[IpNet],
    errors: &mut Errors,
    rule_warnings: &mut Vec<String>,
) -> LocalDetection {
    let dl = file.detect_local.clone().unwrap_or_default();
    errors.check(
        "detectLocalMode",
        detect_local(
            file.detect_local_mode.as_deref().unwrap_or(""),
            cluster_cidrs,
            dl.bridge_interface.as_deref().unwrap_or(""),
            dl.interface_name_prefix.as_deref().unwrap_or(""),
            (
                "detectLocal.bridgeInterface",
                "detectLocal.interfaceNamePrefix",
                "clusterCIDR",
            ),
            rule_warnings,
        ),
        LocalDetection::None,
    )
}
