//! The `KubeProxyConfiguration` file (kubeproxy.config.k8s.io/v1alpha1), modelled field
//! for field on upstream's `k8s.io/kube-proxy/config/v1alpha1` types, and its strict
//! decoding.
//!
//! Entry points: [`KubeProxyConfiguration::load`] / [`KubeProxyConfiguration::parse`],
//! then [`KubeProxyConfiguration::unsupported_fields`]. Turning the file into settings
//! (defaults, mode-dependent sections, validation) is the parent module's job.
//!
//! Every field is an `Option` so that "absent or `null`" is distinguishable from a
//! value: upstream defaults absent and zero values alike, but svcproxy warns only about
//! unsupported fields that were actually given a value.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::duration::GoDuration;

pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
pub const KIND: &str = "KubeProxyConfiguration";

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
#[serde(default)]
pub struct KubeProxyConfiguration {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,

    #[serde(skip_serializing_if = "Option::is_none")]
    pub feature_gates: Option<BTreeMap<String, bool>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_connection: Option<ClientConnectionConfiguration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logging: Option<LoggingConfiguration>,

    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname_override: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bind_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub healthz_bind_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_bind_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bind_address_hard_fail: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable_profiling: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub show_hidden_metrics_for_version: Option<String>,

    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iptables: Option<IPTablesConfiguration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipvs: Option<IPVSConfiguration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nftables: Option<NFTablesConfiguration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub winkernel: Option<WinkernelConfiguration>,

    #[serde(skip_serializing_if = "Option::is_none")]
    pub detect_local_mode: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detect_local: Option<DetectLocalConfiguration>,
    /// One CIDR, or a comma-separated dual-stack pair.
    #[serde(rename = "clusterCIDR", skip_serializing_if = "Option::is_none")]
    pub cluster_cidr: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_port_addresses: Option<Vec<String>>,

    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_score_adj: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conntrack: Option<ConntrackConfiguration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_sync_period: Option<GoDuration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_range: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub windows_run_as_service: Option<bool>,

    /// Not in v1alpha1: upstream's internal config (and its unreleased v1alpha2) keeps
    /// the sync periods here rather than per mode. Accepted so such files load; when
    /// set it wins over the active mode's section.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_period: Option<GoDuration>,
    /// See [`Self::sync_period`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_sync_period: Option<GoDuration>,

    /// Removed upstream (userspace proxy); still found in configs written by old
    /// kubeadm versions, so it warns instead of failing as unknown.
    #[serde(skip_serializing)]
    pub udp_idle_timeout: Option<serde_json::Value>,
    /// Removed upstream; see [`Self::udp_idle_timeout`].
    #[serde(skip_serializing)]
    pub resource_container: Option<serde_json::Value>,
}

/// componentbaseconfigv1alpha1.ClientConnectionConfiguration.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
#[serde(default)]
pub struct ClientConnectionConfiguration {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accept_content_types: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qps: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<i32>,
}

/// logsapi.LoggingConfiguration (k8s.io/component-base/logs/api/v1).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
#[serde(default)]
pub struct LoggingConfiguration {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flush_frequency: Option<FlushFrequency>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verbosity: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vmodule: Option<Vec<VModuleItem>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<FormatOptions>,
}

/// `flushFrequency` is a Go duration string or, for backwards compatibility, an integer
/// number of nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum FlushFrequency {
    Nanos(i64),
    Duration(GoDuration),
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
#[serde(default)]
pub struct VModuleItem {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_pattern: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verbosity: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct FormatOptions {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<OutputRoutingOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json: Option<OutputRoutingOptions>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
#[serde(default)]
pub struct OutputRoutingOptions {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split_stream: Option<bool>,
    /// A resource.Quantity: a string such as `"0"` or `"64Ki"`, or a number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub info_buffer_size: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
#[serde(default)]
pub struct IPTablesConfiguration {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub masquerade_bit: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub masquerade_all: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub localhost_node_ports: Option<bool>,
    #[serde(rename = "snatNodeInternalIP", skip_serializing_if = "Option::is_none")]
    pub snat_node_internal_ip: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_period: Option<GoDuration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_sync_period: Option<GoDuration>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
#[serde(default)]
pub struct IPVSConfiguration {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_period: Option<GoDuration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_sync_period: Option<GoDuration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<String>,
    #[serde(rename = "excludeCIDRs", skip_serializing_if = "Option::is_none")]
    pub exclude_cidrs: Option<Vec<String>>,
    #[serde(rename = "strictARP", skip_serializing_if = "Option::is_none")]
    pub strict_arp: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_timeout: Option<GoDuration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_fin_timeout: Option<GoDuration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub udp_timeout: Option<GoDuration>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
#[serde(default)]
pub struct NFTablesConfiguration {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub masquerade_bit: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub masquerade_all: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_period: Option<GoDuration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_sync_period: Option<GoDuration>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
#[serde(default)]
pub struct WinkernelConfiguration {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_vip: Option<String>,
    #[serde(rename = "enableDSR", skip_serializing_if = "Option::is_none")]
    pub enable_dsr: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root_hns_endpoint_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forward_health_check_vip: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
#[serde(default)]
pub struct DetectLocalConfiguration {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bridge_interface: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface_name_prefix: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
#[serde(default)]
pub struct ConntrackConfiguration {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_per_core: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_established_timeout: Option<GoDuration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_close_wait_timeout: Option<GoDuration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_be_liberal: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub udp_timeout: Option<GoDuration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub udp_stream_timeout: Option<GoDuration>,
    /// Removed upstream (replaced by maxPerCore/min); see
    /// [`KubeProxyConfiguration::udp_idle_timeout`].
    #[serde(skip_serializing)]
    pub max: Option<serde_json::Value>,
}

/// Only the type header, read first so that a file of the wrong kind is reported as
/// such rather than as a pile of unknown fields.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeMeta {
    api_version: Option<String>,
    kind: Option<String>,
}

impl KubeProxyConfiguration {
    /// Reads and decodes a config file (see [`Self::parse`]); errors name the file.
    pub fn load(path: &Path) -> anyhow::Result<(Self, Vec<String>)> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("loading config file {}", path.display()))
    }

    /// Decodes YAML or JSON as upstream does: strictly first, then leniently. The type
    /// header must be `kubeproxy.config.k8s.io/v1alpha1` / `KubeProxyConfiguration`
    /// and every known field must have a value of its type (errors name the field);
    /// unknown fields (a config written for a newer kube-proxy, or a typo) are
    /// returned, each with its path, for the caller to warn about, and otherwise
    /// ignored: a node's proxy must not stop over a field it does not know.
    pub fn parse(text: &str) -> anyhow::Result<(Self, Vec<String>)> {
        if text.trim().is_empty() {
            anyhow::bail!("the config file is empty (expected a {KIND})");
        }
        let doc = parse_document(text)?;
        if !doc.is_object() {
            anyhow::bail!("expected a {KIND} object, found {}", json_kind(&doc));
        }
        let mut ignored = Vec::new();
        let meta: TypeMeta = decode(&doc, &mut ignored)?;
        match (meta.api_version.as_deref(), meta.kind.as_deref()) {
            (_, None) | (_, Some("")) => anyhow::bail!("missing kind (expected kind: {KIND})"),
            (_, Some(k)) if k != KIND => {
                anyhow::bail!("wrong kind {k:?}: expected {KIND:?}")
            }
            (None, _) | (Some(""), _) => {
                anyhow::bail!("missing apiVersion (expected apiVersion: {API_VERSION})")
            }
            (Some(v), _) if v != API_VERSION => {
                anyhow::bail!("unsupported apiVersion {v:?}: expected {API_VERSION:?}")
            }
            _ => {}
        }
        ignored.clear();
        let config: Self = decode(&doc, &mut ignored)?;
        Ok((config, ignored))
    }

    /// Fields that are known but that svcproxy does not implement, and that the file
    /// sets to something other than upstream's default: each entry names the field and
    /// says why it is ignored. Mode-dependent choices (which section's sync periods
    /// apply) are reported by the resolver, which knows the mode in force.
    pub fn unsupported_fields(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut warn = |field: &str, why: &str| out.push(format!("{field}: {why}"));
        self.unsupported_top_level(&mut warn);
        self.unsupported_in_sections(&mut warn);
        if let Some(log) = &self.logging {
            unsupported_logging(log, &mut warn);
        }
        out
    }

    /// The top level's unsupported fields (profiling, Windows, removed ones).
    fn unsupported_top_level(&self, warn: &mut dyn FnMut(&str, &str)) {
        let unsupported = "not supported by svcproxy; ignored";
        if self.enable_profiling == Some(true) {
            warn("enableProfiling", unsupported);
        }
        if non_empty(&self.show_hidden_metrics_for_version) {
            warn("showHiddenMetricsForVersion", unsupported);
        }
        if non_empty(&self.port_range) {
            warn(
                "portRange",
                "unused (also upstream, since the userspace proxy was removed); ignored",
            );
        }
        if self.windows_run_as_service == Some(true) {
            warn("windowsRunAsService", unsupported);
        }
        if self.udp_idle_timeout.as_ref().is_some_and(|v| !v.is_null()) {
            warn(
                "udpIdleTimeout",
                "removed upstream (userspace proxy); ignored",
            );
        }
        if self
            .resource_container
            .as_ref()
            .is_some_and(|v| !v.is_null())
        {
            warn("resourceContainer", "removed upstream; ignored");
        }
        if let Some(ct) = &self.conntrack {
            if ct
                .max
                .as_ref()
                .is_some_and(|v| !v.is_null() && v.as_i64() != Some(0))
            {
                warn(
                    "conntrack.max",
                    "removed upstream (use maxPerCore and min); ignored",
                );
            }
        }
    }

    /// The winkernel, ipvs and iptables sections' unsupported fields.
    fn unsupported_in_sections(&self, warn: &mut dyn FnMut(&str, &str)) {
        let unsupported = "not supported by svcproxy; ignored";
        if let Some(w) = &self.winkernel {
            for (name, set) in [
                ("networkName", non_empty(&w.network_name)),
                ("sourceVip", non_empty(&w.source_vip)),
                ("enableDSR", w.enable_dsr == Some(true)),
                ("rootHnsEndpointName", non_empty(&w.root_hns_endpoint_name)),
                (
                    "forwardHealthCheckVip",
                    w.forward_health_check_vip == Some(true),
                ),
            ] {
                if set {
                    warn(&format!("winkernel.{name}"), "Windows only; ignored");
                }
            }
        }

        // ipvs.scheduler and the timeouts are read in ipvs mode (and warned
        // about in the others) where the mode is known.
        if let Some(ipvs) = &self.ipvs {
            for (name, set, why) in [
                (
                    "excludeCIDRs",
                    ipvs.exclude_cidrs.as_ref().is_some_and(|v| !v.is_empty()),
                    &*format!("{}; ignored", super::flags::IPVS_EXCLUDE_CIDRS),
                ),
                (
                    "strictARP",
                    ipvs.strict_arp == Some(true),
                    &*format!("{}; ignored", super::flags::IPVS_STRICT_ARP),
                ),
            ] {
                if set {
                    warn(&format!("ipvs.{name}"), why);
                }
            }
        }

        if let Some(ipt) = &self.iptables {
            if ipt.snat_node_internal_ip == Some(true) {
                warn("iptables.snatNodeInternalIP", unsupported);
            }
        }
    }
}

/// The logging section's unsupported fields: svcproxy logs through its own logger.
fn unsupported_logging(log: &LoggingConfiguration, warn: &mut dyn FnMut(&str, &str)) {
    let svc = "svcproxy logs through its own logger (only logging.verbosity and \
                   logging.format are used); ignored";
    let default_flush = |f: &FlushFrequency| match f {
        FlushFrequency::Nanos(n) => *n == 0 || *n == 5_000_000_000,
        FlushFrequency::Duration(d) => d.0.is_zero() || d.0.as_secs_f64() == 5.0,
    };
    if log
        .flush_frequency
        .as_ref()
        .is_some_and(|f| !default_flush(f))
    {
        warn("logging.flushFrequency", svc);
    }
    if log.vmodule.as_ref().is_some_and(|v| !v.is_empty()) {
        warn("logging.vmodule", svc);
    }
    if let Some(opts) = &log.options {
        for (name, o) in [("text", &opts.text), ("json", &opts.json)] {
            let Some(o) = o else { continue };
            if o.split_stream == Some(true) {
                warn(&format!("logging.options.{name}.splitStream"), svc);
            }
            let zero = |v: &serde_json::Value| {
                v.is_null() || v.as_str() == Some("0") || v.as_f64() == Some(0.0)
            };
            if o.info_buffer_size.as_ref().is_some_and(|v| !zero(v)) {
                warn(&format!("logging.options.{name}.infoBufferSize"), svc);
            }
        }
    }
}

/// `iptables.masqueradeAll2`, `logging.vmodule[0].level`: serde_ignored's own
/// rendering shows every `Option` layer as `?`, which no user wrote.
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => match field_path(parent) {
            p if p.is_empty() => key.clone(),
            p => format!("{p}.{key}"),
        },
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "nothing (null)",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

fn non_empty(s: &Option<String>) -> bool {
    s.as_deref().is_some_and(|s| !s.is_empty())
}

/// Parses `text` as JSON if it starts with `{`, else as YAML (of which JSON is nearly
/// a subset; JSON's own parser avoids YAML's quirks with tabs). Syntax errors carry the
/// line and column.
fn parse_document(text: &str) -> anyhow::Result<serde_json::Value> {
    if text.trim_start().starts_with('{') {
        Ok(serde_json::from_str(text)?)
    } else {
        Ok(yaml_serde::from_str(text)?)
    }
}

/// Decodes `doc` into `T`, pushing the path of every field `T` does not know onto
/// `ignored`. A badly typed value fails with its path (going through a `Value` rather
/// than the YAML parser keeps paths exact: the YAML parser prefixes its own, coarser one).
fn decode<T: DeserializeOwned>(
    doc: &serde_json::Value,
    ignored: &mut Vec<String>,
) -> anyhow::Result<T> {
    let mut track = serde_path_to_error::Track::new();
    serde_ignored::deserialize(
        serde_path_to_error::Deserializer::new(doc, &mut track),
        |path| ignored.push(field_path(&path)),
    )
    .map_err(|e| {
        let e = svcproxy_core::go_syntax::plain_serde_message(&e.to_string());
        match track.path().to_string() {
            p if p.is_empty() || p == "." => anyhow::anyhow!("{e}"),
            p => anyhow::anyhow!("{p}: {e}"),
        }
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::time::Duration;

    /// What `kubeadm init` writes into the kube-proxy ConfigMap (config.conf), with
    /// every field at its default, plus fields newer upstream versions add.
    pub(crate) const KUBEADM_DEFAULT: &str = r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"#;

    /// What `kube-proxy --write-config-to` writes: upstream's defaults filled in.
    const UPSTREAM_DEFAULTED: &str = r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 10
  contentType: application/vnd.kubernetes.protobuf
  kubeconfig: ""
  qps: 5
clusterCIDR: ""
configSyncPeriod: 15m0s
conntrack:
  maxPerCore: 32768
  min: 131072
  tcpBeLiberal: false
  tcpCloseWaitTimeout: 1h0m0s
  tcpEstablishedTimeout: 24h0m0s
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: 0.0.0.0:10256
hostnameOverride: ""
iptables:
  localhostNodePorts: true
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 1s
  syncPeriod: 30s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 30s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 5s
  format: text
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: 127.0.0.1:10249
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 1s
  syncPeriod: 30s
nodePortAddresses: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"#;

    fn err(text: &str) -> String {
        format!("{:#}", KubeProxyConfiguration::parse(text).unwrap_err())
    }

    #[test]
    fn kubeadm_default_parses_without_warnings() {
        let c = KubeProxyConfiguration::parse(KUBEADM_DEFAULT).unwrap().0;
        assert_eq!(c.cluster_cidr.as_deref(), Some("10.244.0.0/16"));
        assert_eq!(
            c.client_connection.as_ref().unwrap().kubeconfig.as_deref(),
            Some("/var/lib/kube-proxy/kubeconfig.conf")
        );
        assert_eq!(c.conntrack.as_ref().unwrap().max_per_core, None);
        assert_eq!(
            c.iptables.as_ref().unwrap().sync_period,
            Some(GoDuration(Duration::ZERO))
        );
        assert_eq!(c.node_port_addresses, None);
        assert_eq!(c.unsupported_fields(), Vec::<String>::new());
    }

    #[test]
    fn upstream_defaulted_parses_without_warnings() {
        let c = KubeProxyConfiguration::parse(UPSTREAM_DEFAULTED).unwrap().0;
        assert_eq!(
            c.conntrack.as_ref().unwrap().tcp_established_timeout,
            Some(GoDuration(Duration::from_secs(24 * 3600)))
        );
        assert_eq!(
            c.config_sync_period,
            Some(GoDuration(Duration::from_secs(900)))
        );
        assert_eq!(c.unsupported_fields(), Vec::<String>::new());
    }

    #[test]
    fn json_parses() {
        let c = KubeProxyConfiguration::parse(
            "{\n\t\"apiVersion\": \"kubeproxy.config.k8s.io/v1alpha1\",\n\t\"kind\": \"KubeProxyConfiguration\",\n\t\"mode\": \"nftables\",\n\t\"nftables\": {\"syncPeriod\": \"1m30s\", \"minSyncPeriod\": null}\n}",
        )
        .unwrap()
        .0;
        assert_eq!(c.mode.as_deref(), Some("nftables"));
        let nft = c.nftables.unwrap();
        assert_eq!(nft.sync_period, Some(GoDuration(Duration::from_secs(90))));
        assert_eq!(nft.min_sync_period, None);
    }

    /// The unknown fields `text` decodes with (it must decode).
    fn unknown(text: &str) -> String {
        let (_, unknown) = KubeProxyConfiguration::parse(text).unwrap();
        unknown.join(", ")
    }

    #[test]
    fn every_unknown_field_is_named_with_its_path() {
        let e = unknown(
            r#"
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bogus: 1
iptables:
  masqueradeAll2: true
  syncPeriod: 30s
detectLocal:
  bridge: br0
logging:
  vmodule:
  - filePattern: foo
    level: 3
anotherBogus: {a: 1}
"#,
        );
        for want in [
            "bogus",
            "iptables.masqueradeAll2",
            "detectLocal.bridge",
            "logging.vmodule[0].level",
            "anotherBogus",
        ] {
            assert!(e.contains(want), "{want:?} missing from: {e}");
        }
    }

    #[test]
    fn unknown_fields_in_json_too() {
        let e = unknown(
            r#"{"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration", "conntrack": {"maxPerCpu": 1}, "x": null}"#,
        );
        assert!(e.contains("conntrack.maxPerCpu") && e.contains("x"), "{e}");
    }

    #[test]
    fn wrong_type_header_fails() {
        let e = err("apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n");
        assert!(
            e.contains("unsupported apiVersion \"kubeproxy.config.k8s.io/v1alpha2\""),
            "{e}"
        );
        let e = err(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\nfoo: 1\n",
        );
        assert!(e.contains("wrong kind \"KubeletConfiguration\""), "{e}");
        let e = err("kind: KubeProxyConfiguration\n");
        assert!(e.contains("missing apiVersion"), "{e}");
        let e = err("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n");
        assert!(e.contains("missing kind"), "{e}");
        assert!(err("").contains("empty"));
        let e = err("- a\n- b\n");
        assert!(e.contains("found a list"), "{e}");
        let e = err("a: [\n");
        assert!(e.contains("line"), "{e}");
    }

    #[test]
    fn bad_values_name_their_path() {
        let head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
        let e = err(&format!("{head}iptables:\n  syncPeriod: 30\n"));
        assert!(e.contains("iptables.syncPeriod"), "{e}");
        let e = err(&format!("{head}conntrack:\n  tcpCloseWaitTimeout: 1x\n"));
        assert!(
            e.contains("conntrack.tcpCloseWaitTimeout") && e.contains("1x"),
            "{e}"
        );
        let e = err(&format!("{head}nftables:\n  masqueradeBit: fourteen\n"));
        assert!(e.contains("nftables.masqueradeBit"), "{e}");
    }

    #[test]
    fn unsupported_fields_warn() {
        let c = KubeProxyConfiguration::parse(
            r#"
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddressHardFail: true
enableProfiling: true
showHiddenMetricsForVersion: "1.30"
oomScoreAdj: -999
portRange: 30000-32767
windowsRunAsService: true
featureGates: {SomeGate: true}
udpIdleTimeout: 250ms
ipvs:
  scheduler: rr
  strictARP: true
winkernel:
  networkName: flannel
logging:
  format: json
  flushFrequency: 1s
"#,
        )
        .unwrap()
        .0;
        let w = c.unsupported_fields().join("\n");
        for field in [
            "enableProfiling",
            "showHiddenMetricsForVersion",
            "portRange",
            "windowsRunAsService",
            "udpIdleTimeout",
            "ipvs.strictARP",
            "winkernel.networkName",
            "logging.flushFrequency",
        ] {
            assert!(w.contains(field), "{field:?} missing from:\n{w}");
        }
        // Implemented: the process's OOM score, hard bind failures, JSON logs, feature
        // gates (checked when the configuration is resolved).
        for field in [
            "oomScoreAdj",
            "bindAddressHardFail",
            "logging.format",
            "featureGates",
        ] {
            assert!(
                !w.lines().any(|l| l.starts_with(field)),
                "{field:?} is implemented:\n{w}"
            );
        }
    }

    #[test]
    fn flush_frequency_takes_nanos_or_duration() {
        let head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
        for v in ["5000000000", "5s", "\"5s\""] {
            let c =
                KubeProxyConfiguration::parse(&format!("{head}logging:\n  flushFrequency: {v}\n"))
                    .unwrap()
                    .0;
            assert!(c.unsupported_fields().is_empty(), "{v}");
        }
    }
}
