//! svcproxy-core: the pure heart of svcproxy.
//!
//! Owns the model converted from Kubernetes objects ([`model`], [`convert`]), change
//! tracking ([`tracker`]), the cluster state fed by sources ([`state`]), the one
//! endpoint-selection function every data plane uses ([`selection`]) and the per-node,
//! per-family [`snapshot::NodeSnapshot`]. Nothing here touches tokio, the kube client
//! or the kernel; the entry point is [`state::ClusterState`].

pub mod addr;
pub mod chunked;
pub mod convert;
pub mod go_syntax;
pub mod manifest;
pub mod mirror;
pub mod model;
pub mod objects;
pub mod problem;
pub mod quote;
pub mod report;
pub mod selection;
pub mod snapshot;
pub mod state;
pub mod tracker;
