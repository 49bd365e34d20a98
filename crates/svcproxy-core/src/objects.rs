//! The Kubernetes objects a source feeds into the state, and the updates it sends.
//!
//! Every source (the manifests directory, the Kubernetes API) speaks this one
//! vocabulary: [`SourceUpdate`]s carrying raw k8s-openapi objects. Validation and
//! conversion happen in the state, so every source gets the same checks.

use std::fmt;

use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;

/// The kinds of object svcproxy consumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Service,
    EndpointSlice,
    Node,
    ServiceCidr,
    /// Legacy core/v1 Endpoints; sources convert them to slices (see [`crate::mirror`]).
    Endpoints,
    /// Pods: only the cluster DNS reads them (a client's pod IP → its node); the
    /// proxy ignores them.
    Pod,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Node,
        Kind::ServiceCidr,
        Kind::Endpoints,
        Kind::Pod,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Node => "Node",
            Kind::ServiceCidr => "ServiceCIDR",
            Kind::Endpoints => "Endpoints",
            Kind::Pod => "Pod",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identity of one object: kind, namespace ("" for cluster-scoped kinds) and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(kind: Kind, namespace: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        ObjectKey {
            kind,
            namespace: namespace.as_ref().to_string(),
            name: name.as_ref().to_string(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys of rejected objects can hold anything; print those quoted and bounded
        // so a hostile name cannot forge or flood log lines.
        let show = |s: &str| -> String {
            let plain = !s.is_empty()
                && s.len() <= 253
                && s.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'
                });
            if plain {
                s.to_string()
            } else {
                crate::quote::quote(s)
            }
        };
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, show(&self.name))
        } else {
            write!(
                f,
                "{} {}/{}",
                self.kind,
                show(&self.namespace),
                show(&self.name)
            )
        }
    }
}

/// One raw object as a source read it.
// A Service (824 bytes) is the largest variant held inline: boxing it and the
// slices too would cost an allocation per object for little; the Pod (2.4 kB) and
// Node (1.5 kB) are boxed, or every object of a list would take a Pod's size.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum KubeObject {
    Service(Service),
    EndpointSlice(EndpointSlice),
    /// Boxed, as [`KubeObject::Pod`]: a Node is twice the size of a Service.
    Node(Box<Node>),
    ServiceCidr(ServiceCIDR),
    Endpoints(Endpoints),
    /// Boxed: a Pod is three times the size of a Service, and every object of a
    /// list or a manifests directory would take its size.
    Pod(Box<Pod>),
}

impl KubeObject {
    pub fn kind(&self) -> Kind {
        match self {
            KubeObject::Service(_) => Kind::Service,
            KubeObject::EndpointSlice(_) => Kind::EndpointSlice,
            KubeObject::Node(_) => Kind::Node,
            KubeObject::ServiceCidr(_) => Kind::ServiceCidr,
            KubeObject::Endpoints(_) => Kind::Endpoints,
            KubeObject::Pod(_) => Kind::Pod,
        }
    }

    /// The object's key. Missing names become "", which the state rejects with a
    /// clear error rather than guessing.
    pub fn key(&self) -> ObjectKey {
        let meta = match self {
            KubeObject::Service(o) => &o.metadata,
            KubeObject::EndpointSlice(o) => &o.metadata,
            KubeObject::Node(o) => &o.metadata,
            KubeObject::ServiceCidr(o) => &o.metadata,
            KubeObject::Endpoints(o) => &o.metadata,
            KubeObject::Pod(o) => &o.metadata,
        };
        let namespaced = matches!(
            self.kind(),
            Kind::Service | Kind::EndpointSlice | Kind::Endpoints | Kind::Pod
        );
        ObjectKey {
            kind: self.kind(),
            namespace: if namespaced {
                meta.namespace
                    .clone()
                    .unwrap_or_else(|| "default".to_string())
            } else {
                String::new()
            },
            name: meta.name.clone().unwrap_or_default(),
        }
    }
}

/// What a source tells the state.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum SourceUpdate {
    /// Add or replace one object. `origin` names where it came from (a file path,
    /// "api") so errors about it can say so.
    Upsert { object: KubeObject, origin: String },
    /// Remove one object (a no-op if unknown).
    Delete(ObjectKey),
    /// Replace every object of these kinds at once (a re-list): objects not in
    /// `objects` disappear, others are upserted, and nothing in between is seen.
    Replace {
        kinds: Vec<Kind>,
        objects: Vec<(KubeObject, String)>,
    },
    /// This host's own addresses (every interface, both families), as the kernel
    /// lists them now: replaces the previous list. `--nodeport-addresses` CIDRs select
    /// NodePort addresses among them.
    HostAddresses(Vec<std::net::IpAddr>),
    /// Every piece of input the source could not read as objects, now: replaces
    /// the previous list (reports list them beside the objects' problems).
    InputProblems(Vec<InputProblem>),
}

/// Input a source could not turn into objects at all (a document that is not
/// YAML, an unreadable file, a definition passed over for another): where, and
/// why. Its objects, if any, are not proxied (a file that stops parsing keeps the
/// objects it last yielded: the message says so).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputProblem {
    /// The file (or other place) the input came from.
    pub origin: String,
    pub message: String,
}

impl fmt::Display for InputProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} [unreadable]",
            crate::quote::quote_path(&self.origin),
            self.message
        )
    }
}
