//! Sources: where Kubernetes objects come from.
//!
//! A source reads objects from somewhere and turns them into
//! [`svcproxy_core::objects::SourceUpdate`]s for the cluster state; it does not
//! validate them (the state does, so every source gets the same checks). Today there
//! is the standalone [`manifests`] directory (entry point
//! [`manifests::ManifestDir`]); a Kubernetes API source will live beside it.

pub mod kube;
pub mod manifests;
