//! Conversion from raw k8s-openapi objects to the validated [`crate::model`].
//!
//! Entry points: [`convert_service`], [`convert_slice`], [`convert_node`],
//! [`convert_service_cidr`], [`convert_pod`]. Each returns the converted value (or `None` when the
//! object is not proxied or is unusable) and pushes every [`Problem`] it found. The
//! rules mirror what the API server would have enforced, because manifests reach us
//! without that validation: anything the API would refuse is refused here, with a
//! message naming the field.
//!
//! The parts, by kind of object: `service` (a Service and its ports), with
//! `service_addresses` (external IPs, load-balancer ingress and source ranges)
//! and `service_policy` (traffic policies, affinity, topology and the other
//! settings its ports share); `slice` (an EndpointSlice and its endpoints);
//! `pod`; `node` (a Node and a ServiceCIDR); `validation` (the API server's
//! rules for names and addresses, shared by all). Here: the options, the API
//! limits, and `Ctx`, which collects one object's problems.

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

mod node;
mod pod;
mod service;
mod service_addresses;
mod service_policy;
mod slice;
mod validation;

pub use node::{convert_node, convert_service_cidr};
pub use pod::convert_pod;
pub use service::convert_service;
pub use slice::{convert_slice, convert_slice_with, Slice, SliceEndpoint, SlicePort};
pub use validation::{
    is_dns1035_label, is_dns1123_label, is_dns1123_subdomain, is_label_value, is_qualified_name,
};

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
