//! Kubernetes objects for tests, read with the proxy's own manifest parser.
//!
//! Entry points: [`parse`] (YAML text), [`load`] (a YAML file), [`one`] (exactly one object),
//! [`state`] (a node's `ClusterState` of YAML documents).

use std::path::Path;

use svcproxy_core::manifest::{self, Format};
use svcproxy_core::objects::KubeObject;

/// Every object in `yaml` (a YAML stream; `kind: List` and typed lists expanded, Endpoints
/// mirrored to EndpointSlices), in document order. Panics, naming `origin` and the
/// problem, on anything the proxy would skip: test data must mean what it says.
pub fn parse_named(yaml: &str, origin: &str) -> Vec<KubeObject> {
    let parsed = manifest::parse(yaml, Format::Yaml, origin)
        .unwrap_or_else(|e| panic!("{origin}: {e}\n{yaml}"));
    if !parsed.errors.is_empty() {
        panic!("{origin}: {}\n{yaml}", parsed.errors.join("\n"));
    }
    parsed
        .objects
        .into_iter()
        .map(|o| std::sync::Arc::unwrap_or_clone(o.object))
        .collect()
}

/// [`parse_named`] for inline test YAML.
pub fn parse(yaml: &str) -> Vec<KubeObject> {
    parse_named(yaml, "test YAML")
}

/// The objects of one YAML file (see [`parse_named`]).
pub fn load(path: &Path) -> Vec<KubeObject> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    parse_named(&text, &path.display().to_string())
}

/// The state node `node` holds once every object of `docs` (YAML texts) is
/// applied, in order; its own services not filtered by a proxy name.
pub fn state<S: AsRef<str>>(node: &str, docs: &[S]) -> svcproxy_core::state::ClusterState {
    use svcproxy_core::objects::SourceUpdate;
    let mut st = svcproxy_core::state::ClusterState::new(svcproxy_core::state::StateConfig {
        node_name: node.to_string(),
        service_proxy_name: None,
        ignore_external_ips: false,
        dns: false,
        without_snapshots: false,
    });
    for doc in docs {
        for object in parse(doc.as_ref()) {
            st.apply(SourceUpdate::Upsert {
                object,
                origin: "test".to_string(),
            });
        }
    }
    st
}

/// The one object in `yaml`; panics if there are none or several.
pub fn one(yaml: &str) -> KubeObject {
    let mut objects = parse(yaml);
    assert_eq!(objects.len(), 1, "want exactly one object in:\n{yaml}");
    objects.pop().expect("one object")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_expand_and_endpoints_are_mirrored() {
        let objects = parse(
            "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: a, namespace: ns}\n---\napiVersion: v1\nkind: Endpoints\nmetadata: {name: a, namespace: ns}\nsubsets:\n- addresses: [{ip: 10.0.0.1}]\n  ports: [{port: 80}]\n",
        );
        assert!(matches!(objects[0], KubeObject::Service(_)));
        assert!(matches!(objects[1], KubeObject::EndpointSlice(_)));
        assert_eq!(objects.len(), 2);
    }

    #[test]
    #[should_panic(expected = "no metadata.name")]
    fn an_object_the_proxy_would_skip_fails_the_test() {
        parse("apiVersion: v1\nkind: Service\nmetadata: {namespace: ns}\n");
    }

    #[test]
    #[should_panic(expected = "exactly one object")]
    fn one_wants_exactly_one() {
        one("apiVersion: v1\nkind: Node\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: b}\n");
    }
}
