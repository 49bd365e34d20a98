//! The effective configuration as a `KubeProxyConfiguration`: what `--write-config-to`
//! writes (YAML) and `/configz` serves (JSON), as kube-proxy does with its resolved
//! config object.
//!
//! Entry point: [`effective_config`]. Loading what it writes with `--config` gives the
//! same [`Settings`] back, except where the file format itself cannot say what a flag
//! can (as upstream): an empty health or metrics address in a file means the default
//! address, not "disabled", and a zero `minSyncPeriod` means the default (1s).

use super::duration::GoDuration;
use super::file::{
    ClientConnectionConfiguration, ConntrackConfiguration, DetectLocalConfiguration,
    IPTablesConfiguration, IPVSConfiguration, KubeProxyConfiguration, LoggingConfiguration,
    NFTablesConfiguration, API_VERSION, KIND,
};
use super::Settings;
use svcproxy_dataplane::ConfigSection;
use svcproxy_plan::{LocalDetection, NodePortAddresses};

/// `settings` as a complete v1alpha1 `KubeProxyConfiguration` (every field svcproxy
/// reads is set; the sync periods and masquerade settings in both the iptables and
/// nftables sections, so the file reads the same whichever mode loads it).
pub fn effective_config(settings: &Settings) -> KubeProxyConfiguration {
    let addr = |a: Option<std::net::SocketAddr>| Some(a.map(|a| a.to_string()).unwrap_or_default());
    let plan = &settings.plan;
    let (detect_local_mode, bridge, prefix) = match &plan.local_detection {
        LocalDetection::None | LocalDetection::ClusterCidr(_) => ("ClusterCIDR", "", ""),
        LocalDetection::NodeCidr(_) => ("NodeCIDR", "", ""),
        LocalDetection::BridgeInterface(b) => ("BridgeInterface", b.as_str(), ""),
        LocalDetection::InterfaceNamePrefix(p) => ("InterfaceNamePrefix", "", p.as_str()),
    };
    KubeProxyConfiguration {
        api_version: Some(API_VERSION.to_string()),
        kind: Some(KIND.to_string()),
        feature_gates: Some(settings.feature_gates.as_set().clone()),
        client_connection: Some(client_connection(settings)),
        logging: Some(LoggingConfiguration {
            format: Some(settings.log_format.as_str().to_string()),
            verbosity: Some(settings.verbosity),
            ..LoggingConfiguration::default()
        }),
        hostname_override: Some(settings.node_name.clone()),
        bind_address: Some(settings.bind_address.to_string()),
        healthz_bind_address: addr(settings.healthz_bind),
        metrics_bind_address: addr(settings.metrics_bind),
        bind_address_hard_fail: Some(settings.bind_address_hard_fail),
        enable_profiling: Some(false),
        show_hidden_metrics_for_version: Some(String::new()),
        mode: Some(settings.proxy_mode.mode.to_string()),
        iptables: Some(IPTablesConfiguration {
            masquerade_bit: Some(i32::from(plan.masquerade_bit)),
            masquerade_all: Some(plan.masquerade_all),
            localhost_node_ports: Some(settings.iptables_localhost_nodeports),
            snat_node_internal_ip: None,
            sync_period: dur(settings.sync_period),
            min_sync_period: dur(settings.min_sync_period),
        }),
        // The ipvs section where the mode reads it: its sync periods and scheduler.
        ipvs: (settings.proxy_mode.defaults.config_section == ConfigSection::Ipvs)
            .then(|| ipvs(settings)),
        nftables: Some(NFTablesConfiguration {
            masquerade_bit: Some(i32::from(plan.masquerade_bit)),
            masquerade_all: Some(plan.masquerade_all),
            sync_period: dur(settings.sync_period),
            min_sync_period: dur(settings.min_sync_period),
        }),
        winkernel: None,
        detect_local_mode: Some(detect_local_mode.to_string()),
        detect_local: Some(DetectLocalConfiguration {
            bridge_interface: Some(bridge.to_string()),
            interface_name_prefix: Some(prefix.to_string()),
        }),
        cluster_cidr: Some(
            settings
                .cluster_cidrs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ),
        node_port_addresses: node_port_addresses(&plan.nodeport_addresses),
        oom_score_adj: Some(settings.oom_score_adj),
        conntrack: Some(conntrack(settings)),
        config_sync_period: dur(settings.config_sync_period),
        port_range: Some(String::new()),
        windows_run_as_service: None,
        sync_period: None,
        min_sync_period: None,
        udp_idle_timeout: None,
        resource_container: None,
    }
}

fn dur(d: std::time::Duration) -> Option<GoDuration> {
    Some(GoDuration(d))
}

/// A duration unset as zero, as upstream writes it.
fn zero_if_none(d: Option<std::time::Duration>) -> Option<GoDuration> {
    dur(d.unwrap_or_default())
}

fn i32_of(n: u32) -> Option<i32> {
    Some(i32::try_from(n).unwrap_or(i32::MAX))
}

fn client_connection(settings: &Settings) -> ClientConnectionConfiguration {
    let cc = &settings.client_connection;
    ClientConnectionConfiguration {
        kubeconfig: Some(
            settings
                .kubeconfig
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        ),
        accept_content_types: Some(cc.accept_content_types.clone()),
        content_type: Some(cc.content_type.clone()),
        qps: Some(cc.qps),
        burst: i32_of(cc.burst),
    }
}

/// The ipvs section: its sync periods, scheduler and timeouts.
fn ipvs(settings: &Settings) -> IPVSConfiguration {
    IPVSConfiguration {
        sync_period: dur(settings.sync_period),
        min_sync_period: dur(settings.min_sync_period),
        scheduler: Some(settings.plan.scheduler.as_str().to_string()),
        tcp_timeout: zero_if_none(settings.mode_options.ebpf.timeouts.tcp),
        tcp_fin_timeout: zero_if_none(settings.mode_options.ebpf.timeouts.tcp_fin),
        udp_timeout: zero_if_none(settings.mode_options.ebpf.timeouts.udp),
        ..IPVSConfiguration::default()
    }
}

fn node_port_addresses(addresses: &NodePortAddresses) -> Option<Vec<String>> {
    match addresses {
        NodePortAddresses::Primary => Some(vec!["primary".to_string()]),
        // Only iptables mode's default, which an absent field gives back.
        NodePortAddresses::AllLocal => None,
        NodePortAddresses::Cidrs(c) => Some(c.iter().map(ToString::to_string).collect()),
        NodePortAddresses::PrimaryAnd(c) => Some(
            std::iter::once("primary".to_string())
                .chain(c.iter().map(ToString::to_string))
                .collect(),
        ),
    }
}

fn conntrack(settings: &Settings) -> ConntrackConfiguration {
    let c = &settings.conntrack;
    ConntrackConfiguration {
        max_per_core: i32_of(c.max_per_core),
        min: i32_of(c.min),
        tcp_established_timeout: zero_if_none(c.tcp_established_timeout),
        tcp_close_wait_timeout: zero_if_none(c.tcp_close_wait_timeout),
        tcp_be_liberal: Some(c.tcp_be_liberal),
        udp_timeout: zero_if_none(c.udp_timeout),
        udp_stream_timeout: zero_if_none(c.udp_stream_timeout),
        max: None,
    }
}

/// The effective configuration as YAML (`--write-config-to`).
pub fn to_yaml(settings: &Settings) -> anyhow::Result<String> {
    Ok(yaml_serde::to_string(&effective_config(settings))?)
}

/// `/configz`'s body: the configuration under its API group, as upstream's configz
/// handler serves it, and svcproxy's own section (its version and the kube-proxy
/// release it follows).
pub fn configz_json(settings: &Settings) -> serde_json::Value {
    serde_json::json!({
        "kubeproxy.config.k8s.io": effective_config(settings),
        // A section of svcproxy's own beside kube-proxy's (configz is a map of
        // sections): which release it follows.
        "svcproxy": {
            "version": env!("CARGO_PKG_VERSION"),
            "kubeProxyCompatibility": super::KUBE_PROXY_RELEASE,
        },
    })
}
