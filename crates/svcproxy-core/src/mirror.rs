//! Mirroring of legacy core/v1 Endpoints into discovery.k8s.io/v1 EndpointSlices.
//!
//! Entry point: [`endpoints_to_slices`]. It does what the upstream EndpointSlice
//! mirroring controller does for an Endpoints object, minus the API calls, so that a
//! Service backed by hand-written Endpoints (a selector-less Service) gets the same
//! endpoints here as it would through kube-proxy. The output is deterministic: the
//! same Endpoints always give the same slices with the same names, so re-mirroring an
//! unchanged object changes nothing downstream.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort, Endpoints};
use k8s_openapi::api::discovery::v1 as discoveryv1;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::convert::is_dns1035_label;
use crate::problem::quote;

/// Label that keeps an Endpoints object out of mirroring when set to "true".
pub const LABEL_SKIP_MIRROR: &str = "endpointslice.kubernetes.io/skip-mirror";
/// Label naming the Service a slice belongs to.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Label naming the controller that manages a slice.
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// The value of [`LABEL_MANAGED_BY`] on mirrored slices.
pub const MANAGED_BY_MIRRORING: &str = "endpointslicemirroring-controller.k8s.io";

/// Leader-election records used to live in Endpoints annotations; such objects are
/// locks, not endpoints, and upstream never mirrors them.
const ANNOTATION_LEADER_ELECTION: &str = "control-plane.alpha.kubernetes.io/leader";
const ANNOTATION_LAST_CHANGE_TRIGGER_TIME: &str =
    "endpoints.kubernetes.io/last-change-trigger-time";
const ANNOTATION_LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// Upstream's `maxEndpointsPerSubset`: addresses beyond it are not mirrored. It also
/// keeps every slice within the API's 1000-endpoint limit.
const MAX_ENDPOINTS_PER_SUBSET: usize = 1000;

/// The slices mirrored from one Endpoints object, and what could not be mirrored.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Mirrored {
    pub slices: Vec<discoveryv1::EndpointSlice>,
    /// One line per thing left out, naming the field (`subsets[0].addresses[2].ip`).
    pub problems: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn address_type(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

/// Converts one Endpoints object into slices: one per subset and address family that
/// has at least one usable address, named `<name>-mirror-<n>` in order of subset, then
/// IPv4 before IPv6.
pub fn endpoints_to_slices(ep: &Endpoints) -> Mirrored {
    let mut out = Mirrored::default();
    let meta = &ep.metadata;
    let labels = meta.labels.clone().unwrap_or_default();
    let annotations = meta.annotations.clone().unwrap_or_default();
    if labels.get(LABEL_SKIP_MIRROR).map(String::as_str) == Some("true")
        || annotations.contains_key(ANNOTATION_LEADER_ELECTION)
    {
        return out;
    }
    // Upstream mirrors only for an existing Service of the same name, so the name must
    // be one a Service can have; it also keeps `<name>-mirror-<n>` a valid slice name.
    let name = match meta.name.as_deref() {
        None | Some("") => {
            out.problems
                .push("metadata.name is missing; nothing mirrored".to_string());
            return out;
        }
        Some(n) if !is_dns1035_label(n) => {
            out.problems.push(format!(
                "metadata.name {} is not a valid Service name; nothing mirrored",
                quote(n)
            ));
            return out;
        }
        Some(n) => n,
    };

    let template = slice_meta(meta, name, labels, annotations);
    for (s, subset) in ep.subsets.iter().flatten().enumerate() {
        let ports: Vec<discoveryv1::EndpointPort> =
            subset.ports.iter().flatten().map(mirror_port).collect();
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        let mut seen = HashSet::new();
        let ready = subset.addresses.iter().flatten().map(|a| (a, true));
        let not_ready = subset
            .not_ready_addresses
            .iter()
            .flatten()
            .map(|a| (a, false));
        let (mut i_ready, mut i_not_ready) = (0usize, 0usize);
        let mut mirrored = 0usize;
        let total = subset.addresses.as_ref().map_or(0, Vec::len)
            + subset.not_ready_addresses.as_ref().map_or(0, Vec::len);
        for (addr, is_ready) in ready.chain(not_ready) {
            let field = if is_ready {
                i_ready += 1;
                format!("subsets[{s}].addresses[{}]", i_ready - 1)
            } else {
                i_not_ready += 1;
                format!("subsets[{s}].notReadyAddresses[{}]", i_not_ready - 1)
            };
            if mirrored == MAX_ENDPOINTS_PER_SUBSET {
                out.problems.push(format!(
                    "subsets[{s}]: {total} addresses; only the first \
                     {MAX_ENDPOINTS_PER_SUBSET} are mirrored"
                ));
                break;
            }
            let Some(ip) = parse_ip_sloppy(&addr.ip) else {
                out.problems.push(format!(
                    "{field}.ip: {} is not an IP address; skipped",
                    quote(&addr.ip)
                ));
                continue;
            };
            // The same address twice in one subset would be two endpoints for one
            // backend; the first (a ready one, if any) is kept, as upstream's set does.
            if !seen.insert(ip) {
                out.problems.push(format!(
                    "{field}.ip: {} is listed twice in the subset; the first is kept",
                    quote(&addr.ip)
                ));
                continue;
            }
            mirrored += 1;
            let endpoint = mirror_address(addr, ip, is_ready);
            match ip {
                IpAddr::V4(_) => v4.push(endpoint),
                IpAddr::V6(_) => v6.push(endpoint),
            }
        }
        for (family, endpoints) in [(Family::V4, v4), (Family::V6, v6)] {
            if endpoints.is_empty() {
                continue;
            }
            let mut metadata = template.clone();
            metadata.name = Some(format!("{name}-mirror-{}", out.slices.len()));
            out.slices.push(discoveryv1::EndpointSlice {
                metadata,
                address_type: family.address_type().to_string(),
                endpoints: Some(endpoints),
                ports: Some(ports.clone()),
            });
        }
    }
    out
}

/// The metadata every slice of `name` shares, as upstream's `newEndpointSlice` builds
/// it: the Endpoints' labels with the two mirroring labels forced, its annotations
/// minus the ones that describe the Endpoints object itself.
fn slice_meta(
    meta: &ObjectMeta,
    name: &str,
    mut labels: BTreeMap<String, String>,
    mut annotations: BTreeMap<String, String>,
) -> ObjectMeta {
    labels.insert(LABEL_SERVICE_NAME.to_string(), name.to_string());
    labels.insert(
        LABEL_MANAGED_BY.to_string(),
        MANAGED_BY_MIRRORING.to_string(),
    );
    annotations.remove(ANNOTATION_LAST_CHANGE_TRIGGER_TIME);
    annotations.remove(ANNOTATION_LAST_APPLIED);
    // Manifests rarely carry a uid; an owner reference without one would point nowhere.
    let owner_references = meta.uid.as_ref().map(|uid| {
        vec![OwnerReference {
            api_version: "v1".to_string(),
            kind: "Endpoints".to_string(),
            name: name.to_string(),
            uid: uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]
    });
    ObjectMeta {
        namespace: meta.namespace.clone(),
        labels: Some(labels),
        annotations: (!annotations.is_empty()).then_some(annotations),
        owner_references,
        ..ObjectMeta::default()
    }
}

fn mirror_address(addr: &EndpointAddress, ip: IpAddr, ready: bool) -> discoveryv1::Endpoint {
    discoveryv1::Endpoint {
        // Re-stringified, as upstream does, so irregular spellings become canonical.
        addresses: vec![ip.to_string()],
        conditions: Some(discoveryv1::EndpointConditions {
            ready: Some(ready),
            serving: Some(ready),
            terminating: Some(false),
        }),
        hostname: addr.hostname.clone().filter(|h| !h.is_empty()),
        node_name: addr.node_name.clone(),
        target_ref: addr.target_ref.clone(),
        ..discoveryv1::Endpoint::default()
    }
}

fn mirror_port(p: &EndpointPort) -> discoveryv1::EndpointPort {
    discoveryv1::EndpointPort {
        name: Some(p.name.clone().unwrap_or_default()),
        port: Some(p.port),
        // The API server defaults an unset protocol to TCP; manifests skip that step.
        protocol: Some(
            p.protocol
                .clone()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "TCP".to_string()),
        ),
        app_protocol: p.app_protocol.clone(),
    }
}

/// Parses an address the way upstream's `ParseIPSloppy` + `To4` does: IPv4 octets may
/// carry leading zeros (read as decimal), and an IPv4-mapped IPv6 address is IPv4.
fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    Some(match crate::addr::parse_ip_sloppy(s)?.value {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints(yaml: &str) -> Endpoints {
        yaml_serde::from_str(yaml).expect("test Endpoints parse")
    }

    fn addresses(slice: &discoveryv1::EndpointSlice) -> Vec<&str> {
        slice
            .endpoints
            .iter()
            .flatten()
            .map(|e| e.addresses[0].as_str())
            .collect()
    }

    fn ready(slice: &discoveryv1::EndpointSlice) -> Vec<(bool, bool, bool)> {
        slice
            .endpoints
            .iter()
            .flatten()
            .map(|e| {
                let c = e.conditions.clone().unwrap_or_default();
                (
                    c.ready.unwrap_or_default(),
                    c.serving.unwrap_or_default(),
                    c.terminating.unwrap_or(true),
                )
            })
            .collect()
    }

    #[test]
    fn ipv4_subset_becomes_one_labelled_slice() {
        let m = endpoints_to_slices(&endpoints(
            r#"
metadata:
  name: web
  namespace: shop
  labels: {app: web}
  annotations:
    note: kept
    endpoints.kubernetes.io/last-change-trigger-time: "2024-01-01T00:00:00Z"
subsets:
- addresses:
  - {ip: 10.0.0.1, nodeName: node-a, hostname: web-0,
     targetRef: {kind: Pod, name: web-0, namespace: shop}}
  - {ip: 10.0.0.2}
  ports: [{name: http, port: 8080}]
"#,
        ));
        assert!(m.problems.is_empty(), "{:?}", m.problems);
        assert_eq!(m.slices.len(), 1);
        let s = &m.slices[0];
        assert_eq!(s.metadata.name.as_deref(), Some("web-mirror-0"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(s.address_type, "IPv4");
        let labels = s.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get(LABEL_SERVICE_NAME).map(String::as_str),
            Some("web")
        );
        assert_eq!(
            labels.get(LABEL_MANAGED_BY).map(String::as_str),
            Some(MANAGED_BY_MIRRORING)
        );
        assert_eq!(labels.get("app").map(String::as_str), Some("web"));
        let annotations = s.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations.get("note").map(String::as_str), Some("kept"));
        assert!(!annotations.contains_key(ANNOTATION_LAST_CHANGE_TRIGGER_TIME));
        assert_eq!(addresses(s), ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(ready(s), [(true, true, false), (true, true, false)]);
        let first = &s.endpoints.as_deref().unwrap_or_default()[0];
        assert_eq!(first.node_name.as_deref(), Some("node-a"));
        assert_eq!(first.hostname.as_deref(), Some("web-0"));
        assert_eq!(
            first.target_ref.as_ref().and_then(|r| r.name.as_deref()),
            Some("web-0")
        );
        assert_eq!(
            s.endpoints.as_deref().unwrap_or_default()[1].node_name,
            None
        );
        assert_eq!(s.endpoints.as_deref().unwrap_or_default()[1].hostname, None);
    }

    #[test]
    fn ipv6_subset_becomes_an_ipv6_slice() {
        let m = endpoints_to_slices(&endpoints(
            r#"
metadata: {name: web}
subsets:
- addresses: [{ip: "fd00::1"}, {ip: "FD00:0::2"}]
  ports: [{port: 80}]
"#,
        ));
        assert!(m.problems.is_empty(), "{:?}", m.problems);
        assert_eq!(m.slices.len(), 1);
        assert_eq!(m.slices[0].address_type, "IPv6");
        assert_eq!(
            addresses(&m.slices[0]),
            ["fd00::1", "fd00::2"],
            "addresses are re-stringified canonically"
        );
        assert_eq!(m.slices[0].metadata.namespace, None);
    }

    #[test]
    fn dual_family_subset_splits_by_family_v4_first() {
        let m = endpoints_to_slices(&endpoints(
            r#"
metadata: {name: web, namespace: default}
subsets:
- addresses: [{ip: "fd00::1"}, {ip: 10.0.0.1}, {ip: "::ffff:10.0.0.2"}, {ip: 010.000.000.003}]
  notReadyAddresses: [{ip: "fd00::2"}]
  ports: [{name: http, port: 80}]
"#,
        ));
        assert!(m.problems.is_empty(), "{:?}", m.problems);
        let names: Vec<_> = m
            .slices
            .iter()
            .map(|s| {
                (
                    s.metadata.name.as_deref().unwrap_or(""),
                    s.address_type.as_str(),
                )
            })
            .collect();
        assert_eq!(names, [("web-mirror-0", "IPv4"), ("web-mirror-1", "IPv6")]);
        // IPv4-mapped and zero-padded addresses are IPv4, as upstream's sloppy parse.
        assert_eq!(
            addresses(&m.slices[0]),
            ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
        );
        assert_eq!(addresses(&m.slices[1]), ["fd00::1", "fd00::2"]);
        assert_eq!(
            ready(&m.slices[1]),
            [(true, true, false), (false, false, false)]
        );
        for s in &m.slices {
            assert_eq!(s.ports.as_ref().map(Vec::len), Some(1));
        }
    }

    #[test]
    fn not_ready_addresses_are_not_ready_nor_serving() {
        let m = endpoints_to_slices(&endpoints(
            r#"
metadata: {name: web}
subsets:
- addresses: [{ip: 10.0.0.1}]
  notReadyAddresses: [{ip: 10.0.0.2, nodeName: node-b}, {ip: 10.0.0.1}]
  ports: [{port: 80}]
"#,
        ));
        assert_eq!(m.slices.len(), 1);
        assert_eq!(addresses(&m.slices[0]), ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(
            ready(&m.slices[0]),
            [(true, true, false), (false, false, false)]
        );
        assert_eq!(
            m.slices[0].endpoints.as_deref().unwrap_or_default()[1]
                .node_name
                .as_deref(),
            Some("node-b")
        );
        assert_eq!(
            m.problems.len(),
            1,
            "the duplicate is reported: {:?}",
            m.problems
        );
        assert!(m.problems[0].contains("subsets[0].notReadyAddresses[1].ip"));
    }

    #[test]
    fn skip_mirror_and_leader_election_yield_nothing() {
        for yaml in [
            r#"
metadata:
  name: web
  labels: {endpointslice.kubernetes.io/skip-mirror: "true"}
subsets: [{addresses: [{ip: 10.0.0.1}], ports: [{port: 80}]}]
"#,
            r#"
metadata:
  name: kube-scheduler
  annotations: {control-plane.alpha.kubernetes.io/leader: "{}"}
subsets: [{addresses: [{ip: 10.0.0.1}], ports: [{port: 80}]}]
"#,
        ] {
            assert_eq!(endpoints_to_slices(&endpoints(yaml)), Mirrored::default());
        }
        // Any other value of the label mirrors as usual.
        let m = endpoints_to_slices(&endpoints(
            r#"
metadata:
  name: web
  labels: {endpointslice.kubernetes.io/skip-mirror: "false"}
subsets: [{addresses: [{ip: 10.0.0.1}], ports: [{port: 80}]}]
"#,
        ));
        assert_eq!(m.slices.len(), 1);
    }

    #[test]
    fn ports_are_copied_with_protocol_defaulting_to_tcp() {
        let m = endpoints_to_slices(&endpoints(
            r#"
metadata: {name: web}
subsets:
- addresses: [{ip: 10.0.0.1}]
  ports:
  - {name: http, port: 8080, appProtocol: http}
  - {name: dns, port: 53, protocol: UDP}
  - {port: 9090}
"#,
        ));
        let ports = m.slices[0].ports.clone().unwrap_or_default();
        let got: Vec<_> = ports
            .iter()
            .map(|p| {
                (
                    p.name.as_deref().unwrap_or("?"),
                    p.port.unwrap_or(-1),
                    p.protocol.as_deref().unwrap_or("?"),
                    p.app_protocol.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("http", 8080, "TCP", Some("http")),
                ("dns", 53, "UDP", None),
                ("", 9090, "TCP", None),
            ]
        );
    }

    #[test]
    fn multiple_subsets_give_one_slice_each_with_their_own_ports() {
        let m = endpoints_to_slices(&endpoints(
            r#"
metadata: {name: web}
subsets:
- addresses: [{ip: 10.0.0.1}]
  ports: [{name: a, port: 80}]
- addresses: []
  ports: [{name: empty, port: 81}]
- addresses: [{ip: 10.0.0.2}, {ip: "fd00::2"}]
  ports: [{name: b, port: 90}]
"#,
        ));
        assert!(m.problems.is_empty(), "{:?}", m.problems);
        let got: Vec<_> = m
            .slices
            .iter()
            .map(|s| {
                (
                    s.metadata.name.clone().unwrap_or_default(),
                    s.address_type.clone(),
                    addresses(s).join(","),
                    s.ports.clone().unwrap_or_default()[0].port,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "web-mirror-0".into(),
                    "IPv4".into(),
                    "10.0.0.1".into(),
                    Some(80)
                ),
                (
                    "web-mirror-1".into(),
                    "IPv4".into(),
                    "10.0.0.2".into(),
                    Some(90)
                ),
                (
                    "web-mirror-2".into(),
                    "IPv6".into(),
                    "fd00::2".into(),
                    Some(90)
                ),
            ]
        );
    }

    #[test]
    fn unparsable_addresses_are_left_out_and_reported() {
        let m = endpoints_to_slices(&endpoints(
            r#"
metadata: {name: web}
subsets:
- addresses: [{ip: bogus}, {ip: 10.0.0.1}, {ip: " 10.0.0.2"}, {ip: "fe80::1%eth0"}]
  notReadyAddresses: [{ip: ""}]
  ports: [{port: 80}]
"#,
        ));
        assert_eq!(m.slices.len(), 1);
        assert_eq!(addresses(&m.slices[0]), ["10.0.0.1"]);
        assert_eq!(m.problems.len(), 4, "{:?}", m.problems);
        assert!(m.problems[0].starts_with("subsets[0].addresses[0].ip: \"bogus\""));
        assert!(m.problems[3].starts_with("subsets[0].notReadyAddresses[0].ip"));
    }

    #[test]
    fn nameless_or_invalid_names_are_reported() {
        let m = endpoints_to_slices(&Endpoints::default());
        assert!(m.slices.is_empty());
        assert_eq!(m.problems.len(), 1);
        let m = endpoints_to_slices(&endpoints(
            "metadata: {name: Not.A.Service}\nsubsets: [{addresses: [{ip: 10.0.0.1}]}]",
        ));
        assert!(m.slices.is_empty());
        assert!(m.problems[0].contains("not a valid Service name"));
    }

    #[test]
    fn oversized_subsets_are_cut_at_the_upstream_limit() {
        let ep = Endpoints {
            metadata: ObjectMeta {
                name: Some("big".into()),
                ..ObjectMeta::default()
            },
            subsets: Some(vec![k8s_openapi::api::core::v1::EndpointSubset {
                addresses: Some(
                    (0..1200u32)
                        .map(|i| EndpointAddress {
                            ip: std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string(),
                            ..EndpointAddress::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }]),
        };
        let m = endpoints_to_slices(&ep);
        assert_eq!(m.slices.len(), 1);
        assert_eq!(
            m.slices[0].endpoints.as_deref().unwrap_or_default().len(),
            MAX_ENDPOINTS_PER_SUBSET
        );
        assert_eq!(m.problems.len(), 1, "{:?}", m.problems);
    }

    #[test]
    fn mirroring_is_deterministic() {
        let ep = endpoints(
            r#"
metadata: {name: web, uid: abc}
subsets:
- addresses: [{ip: 10.0.0.1}, {ip: "fd00::1"}]
  ports: [{port: 80}]
"#,
        );
        let a = endpoints_to_slices(&ep);
        assert_eq!(a, endpoints_to_slices(&ep));
        let owner = a.slices[0]
            .metadata
            .owner_references
            .clone()
            .unwrap_or_default();
        assert_eq!(owner.len(), 1);
        assert_eq!(owner[0].uid, "abc");
    }
}
