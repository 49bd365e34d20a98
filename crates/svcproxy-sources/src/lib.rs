//! Sources: where Kubernetes objects come from.
//!
//! A source reads objects from somewhere and turns them into
//! [`svcproxy_core::objects::SourceUpdate`]s for the cluster state, sent to the
//! sync loop as [`Event`]s; it does not validate them (the state does, so every
//! source gets the same checks). Two: the standalone [`manifests`] directory (entry
//! point [`manifests::ManifestDir`]) and the Kubernetes API ([`kube`]). A crate of
//! its own, tested without the binary.

use svcproxy_core::objects::SourceUpdate;

pub mod kube;
pub mod manifests;

/// Messages sources send to the sync loop.
#[derive(Debug)]
pub enum Event {
    Updates(Vec<SourceUpdate>),
    /// The named source has delivered its complete initial list (repeats, e.g. after
    /// a re-list, are harmless).
    Ready(&'static str),
    /// The named source (already [`Event::Ready`] once) is re-listing: its picture is
    /// incomplete until it is `Ready` again.
    Relisting(&'static str),
    /// This process has just become the node's owner (a standby took over): a full
    /// sync is due at once, `--min-sync-period` notwithstanding.
    TookOver,
}

/// The Kubernetes API client's settings (kube-proxy's `clientConnection`).
#[derive(Debug, Clone, PartialEq)]
pub struct ClientConnection {
    pub qps: f32,
    pub burst: u32,
    pub content_type: String,
    /// Accept header; empty means the client's default (application/json).
    pub accept_content_types: String,
}
