//! Tests of the API source: the pure parts (selectors, stripping, the per-watch
//! bookkeeping) here; [`fakeapi`] runs [`run`] against a fake API server over HTTP.

use k8s_openapi::api::core::v1::{NodeAddress, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};
use serde_json::json;
use svcproxy_core::objects::Kind;

use super::*;

fn cfg(proxy_name: Option<&str>) -> KubeSourceConfig {
    KubeSourceConfig {
        node_name: "node-a".into(),
        service_proxy_name: proxy_name.map(str::to_string),
        kubeconfig: None,
        master: None,
        client_connection: ClientConnection {
            // Unlimited: these tests time reconnections, not the rate limit (which
            // has its own tests in rate_limit.rs).
            qps: -1.0,
            burst: 10,
            content_type: "application/vnd.kubernetes.protobuf".into(),
            accept_content_types: String::new(),
        },
        dns: false,
        dns_pods: false,
    }
}

fn node(name: &str) -> KubeObject {
    KubeObject::Node(Box::new(Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }))
}

fn node_key(name: &str) -> ObjectKey {
    ObjectKey::new(Kind::Node, "", name)
}

/// The updates and Ready markers of a batch of events, as short strings.
fn summary(events: &[Event]) -> Vec<String> {
    let mut out = Vec::new();
    for ev in events {
        match ev {
            Event::Ready(name) => out.push(format!("ready {name}")),
            Event::Relisting(name) => out.push(format!("relisting {name}")),
            Event::TookOver => out.push("took over".into()),
            Event::Updates(updates) => out.push(
                updates
                    .iter()
                    .map(|u| match u {
                        SourceUpdate::Upsert { object, .. } => format!("+{}", object.key().name),
                        SourceUpdate::Delete(key) => format!("-{}", key.name),
                        SourceUpdate::Replace { .. } => "replace".into(),
                        SourceUpdate::HostAddresses(_) => "host addresses".into(),
                        SourceUpdate::InputProblems(_) => "input problems".into(),
                    })
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
        }
    }
    out
}

#[test]
fn selectors_leave_out_headless_and_other_proxies() {
    assert_eq!(
        cfg(None).label_selector(),
        "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name"
    );
    assert_eq!(
        cfg(Some("svcproxy")).label_selector(),
        "!service.kubernetes.io/headless,service.kubernetes.io/service-proxy-name=svcproxy"
    );
    // The cluster DNS answers for every Service: nothing is left out at the server.
    let every = KubeSourceConfig {
        dns: true,
        ..cfg(Some("svcproxy"))
    };
    assert_eq!(every.label_selector(), "");
}

#[test]
fn values_that_would_change_a_selector_are_rejected() {
    assert!(cfg(Some("svcproxy")).validate().is_ok());
    for bad in ["a,b", "x=y", "a b", "-a", &"a".repeat(64)] {
        let err = cfg(Some(bad)).validate().unwrap_err().to_string();
        assert!(err.contains("--service-proxy-name"), "{bad}: {err}");
    }
    let mut c = cfg(None);
    c.node_name = "node-a,metadata.name!=x".into();
    assert!(c.validate().unwrap_err().to_string().contains("node name"));
}

#[test]
fn initial_list_streams_upserts_then_ready() {
    let mut w = WatchState::new("nodes");
    w.on_event(watcher::Event::Init);
    w.on_event(watcher::Event::InitApply(node("a")));
    assert_eq!(summary(&w.take_outbox()), ["+a"]);
    w.on_event(watcher::Event::InitApply(node("b")));
    w.on_event(watcher::Event::InitDone);
    assert_eq!(summary(&w.take_outbox()), ["+b", "ready nodes"]);
    w.on_event(watcher::Event::Apply(node("c")));
    w.on_event(watcher::Event::Delete(node("a")));
    assert_eq!(summary(&w.take_outbox()), ["+c -a"]);
}

#[test]
fn large_lists_are_sent_in_batches() {
    let mut w = WatchState::new("nodes");
    w.on_event(watcher::Event::Init);
    for i in 0..(BATCH + 10) {
        w.on_event(watcher::Event::InitApply(node(&format!("n{i}"))));
    }
    w.on_event(watcher::Event::InitDone);
    let out = w.take_outbox();
    let sizes: Vec<usize> = out
        .iter()
        .map(|e| match e {
            Event::Updates(u) => u.len(),
            Event::Ready(_) | Event::Relisting(_) | Event::TookOver => 0,
        })
        .collect();
    assert_eq!(sizes, [BATCH, 10, 0]);
}

#[test]
fn a_relist_deletes_what_vanished_in_the_same_batch_as_its_end() {
    let mut w = WatchState::new("nodes");
    w.on_event(watcher::Event::Init);
    for n in ["a", "b", "c"] {
        w.on_event(watcher::Event::InitApply(node(n)));
    }
    w.on_event(watcher::Event::InitDone);
    w.take_outbox();

    w.on_event(watcher::Event::Init);
    w.on_event(watcher::Event::InitApply(node("a")));
    w.on_event(watcher::Event::InitApply(node("c")));
    w.on_event(watcher::Event::InitApply(node("d")));
    w.on_event(watcher::Event::InitDone);
    // The runner holds syncs from "relisting" to "ready": the deletions and the new
    // objects take effect together.
    assert_eq!(
        summary(&w.take_outbox()),
        ["relisting nodes", "+a +c +d -b", "ready nodes"]
    );
    let mut known: Vec<_> = w.known.iter().map(Key::object_key).collect();
    known.sort();
    assert_eq!(known, [node_key("a"), node_key("c"), node_key("d")]);
}

#[test]
fn an_interrupted_list_does_not_lose_track_of_what_it_sent() {
    let mut w = WatchState::new("nodes");
    w.on_event(watcher::Event::Init);
    w.on_event(watcher::Event::InitApply(node("a")));
    w.on_event(watcher::Event::InitApply(node("b")));
    // The list fails half-way; the watcher starts over, and "b" is gone by then.
    w.on_event(watcher::Event::Init);
    w.on_event(watcher::Event::InitApply(node("a")));
    w.on_event(watcher::Event::InitDone);
    assert_eq!(summary(&w.take_outbox()), ["+a +b +a -b", "ready nodes"]);
}

#[test]
fn ready_is_sent_again_after_each_relist() {
    let mut w = WatchState::new("services");
    for _ in 0..2 {
        w.on_event(watcher::Event::Init);
        w.on_event(watcher::Event::InitDone);
    }
    assert_eq!(
        summary(&w.take_outbox()),
        ["ready services", "relisting services", "ready services"]
    );
}

#[test]
fn services_keep_only_what_the_state_reads() {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {
            "name": "web", "namespace": "demo", "uid": "u-1", "resourceVersion": "7",
            "labels": {"app": "web", "service.kubernetes.io/service-proxy-name": "svcproxy"},
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{\"huge\": true}",
                "svcproxy.io/topology-keys": "kubernetes.io/hostname, *",
                "service.kubernetes.io/topology-mode": "Auto",
            },
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
        },
        "spec": {"clusterIP": "10.0.0.1", "selector": {"app": "web"},
                 "ports": [{"port": 80, "protocol": "TCP"}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]},
                   "conditions": [{"type": "x", "status": "True", "lastTransitionTime": "2024-01-01T00:00:00Z", "reason": "r", "message": "m"}]},
    }))
    .unwrap();
    let s = strip_service(svc);
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(
        v["metadata"],
        json!({
            "name": "web", "namespace": "demo",
            "labels": {"service.kubernetes.io/service-proxy-name": "svcproxy"},
            "annotations": {
                "svcproxy.io/topology-keys": "kubernetes.io/hostname, *",
                "service.kubernetes.io/topology-mode": "Auto",
            },
        })
    );
    assert_eq!(
        v["status"],
        json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}})
    );
    assert_eq!(
        s.spec,
        Some(ServiceSpec {
            cluster_ip: Some("10.0.0.1".into()),
            ports: s.spec.as_ref().unwrap().ports.clone(),
            ..ServiceSpec::default()
        })
    );
}

#[test]
fn slices_keep_only_what_the_state_reads() {
    let slice = EndpointSlice {
        metadata: ObjectMeta {
            name: Some("web-abc".into()),
            namespace: Some("demo".into()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/service-name".to_string(), "web".to_string()),
                ("app".to_string(), "web".to_string()),
            ])),
            annotations: Some(BTreeMap::from([
                (
                    ANNOTATION_LAST_CHANGE_TRIGGER_TIME.to_string(),
                    "2024-01-01T00:00:00Z".to_string(),
                ),
                ("other".to_string(), "x".to_string()),
            ])),
            generate_name: Some("web-".into()),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".into(),
        endpoints: Some(vec![Endpoint {
            addresses: vec!["10.1.0.5".into()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                ..EndpointConditions::default()
            }),
            hostname: Some("pod-1".into()),
            node_name: Some("node-a".into()),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                name: Some("pod-1".into()),
                ..ObjectReference::default()
            }),
            ..Endpoint::default()
        }]),
        ports: None,
    };
    // The cluster DNS answers endpoints by their hostname: kept for it.
    assert_eq!(
        strip_slice(slice.clone(), true).endpoints.unwrap()[0]
            .hostname
            .as_deref(),
        Some("pod-1")
    );
    let s = strip_slice(slice, false);
    assert_eq!(
        s.metadata,
        ObjectMeta {
            name: Some("web-abc".into()),
            namespace: Some("demo".into()),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/service-name".to_string(),
                "web".to_string()
            )])),
            annotations: Some(BTreeMap::from([(
                ANNOTATION_LAST_CHANGE_TRIGGER_TIME.to_string(),
                "2024-01-01T00:00:00Z".to_string(),
            )])),
            ..ObjectMeta::default()
        }
    );
    assert_eq!(s.endpoints.as_ref().unwrap()[0].target_ref, None);
    assert_eq!(s.endpoints.as_ref().unwrap()[0].hostname, None);
    assert_eq!(
        s.endpoints.as_ref().unwrap()[0].node_name.as_deref(),
        Some("node-a")
    );
}

#[test]
fn this_node_keeps_addresses_cidrs_and_taints_only() {
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "z1"},
                     "annotations": {"big": "x"}, "uid": "u"},
        "spec": {"podCIDR": "10.1.0.0/24", "podCIDRs": ["10.1.0.0/24"], "providerID": "p",
                 "taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.10"}],
                   "images": [{"names": ["registry/image:1"], "sizeBytes": 1}],
                   "capacity": {"cpu": "4"}},
    }))
    .unwrap();
    let s = strip_own_node(n);
    assert_eq!(
        serde_json::to_value(&s).unwrap(),
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "z1"}},
            "spec": {"podCIDR": "10.1.0.0/24", "podCIDRs": ["10.1.0.0/24"],
                     "taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.10"}]},
        })
    );
    assert_eq!(
        s.status.unwrap().addresses,
        Some(vec![NodeAddress {
            type_: "InternalIP".into(),
            address: "192.0.2.10".into()
        }])
    );
}

#[test]
fn other_nodes_are_name_labels_and_deletion_only() {
    let meta: PartialObjectMeta<Node> = serde_json::from_value(json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": "node-b", "labels": {"topology.kubernetes.io/zone": "z2"},
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                     "managedFields": [{"manager": "kubelet"}],
                     "deletionTimestamp": "2024-01-01T00:00:00Z"},
    }))
    .unwrap();
    let n = node_from_meta(meta);
    assert_eq!(
        serde_json::to_value(&n).unwrap(),
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "node-b", "labels": {"topology.kubernetes.io/zone": "z2"},
                            "deletionTimestamp": "2024-01-01T00:00:00Z"}})
    );
}

#[test]
fn errors_are_classified() {
    let status = |code: u16| {
        kube::core::Status {
            code,
            ..kube::core::Status::default()
        }
        .boxed()
    };
    let mut h = Health::new("servicecidrs");
    let unserved = watcher::Error::InitialListFailed(kube::Error::Api(status(404)));
    assert_eq!(h.error(&unserved), Retry::Unserved);
    assert!(h.down_since.is_none());

    let mut h = Health::new("services");
    assert_eq!(h.error(&unserved), Retry::Backoff);
    assert!(h.down_since.is_some());

    let mut h = Health::new("services");
    let gone = watcher::Error::WatchError(status(410));
    assert_eq!(h.error(&gone), Retry::Now);
    assert_eq!(
        h.error(&gone),
        Retry::Backoff,
        "a second 410 in a row backs off"
    );
    h.event();
    assert_eq!(h.error(&gone), Retry::Now);
}

#[test]
fn a_resource_version_ahead_of_the_server_relists() {
    // As the API server (and the fake) answer a watch from a resourceVersion it has
    // not reached.
    let too_large = |with_cause: bool| {
        let status = kube::core::Status {
            code: 504,
            reason: "Timeout".into(),
            message: if with_cause {
                "Timeout: too large resource version".into()
            } else {
                "Too large resource version: 99, current: 7".into()
            },
            details: with_cause.then(|| kube::core::response::StatusDetails {
                causes: vec![kube::core::response::StatusCause {
                    reason: "ResourceVersionTooLarge".into(),
                    message: "Too large resource version".into(),
                    field: String::new(),
                }],
                name: String::new(),
                group: String::new(),
                kind: String::new(),
                uid: String::new(),
                retry_after_seconds: 1,
            }),
            ..kube::core::Status::default()
        };
        watcher::Error::WatchStartFailed(kube::Error::Api(status.boxed()))
    };
    for with_cause in [true, false] {
        let err = too_large(with_cause);
        assert!(resource_version_too_large(&err));
        let mut h = Health::new("services");
        assert_eq!(h.error(&err), Retry::Relist { backoff: false });
        assert_eq!(
            h.error(&err),
            Retry::Relist { backoff: true },
            "a second one in a row backs off before the list"
        );
        h.event();
        assert_eq!(h.error(&err), Retry::Relist { backoff: false });
    }
    // Other timeouts are connection trouble: backoff, same watch.
    let timeout = watcher::Error::WatchError(
        kube::core::Status {
            code: 504,
            reason: "Timeout".into(),
            message: "the server was unable to return a response in the time allotted".into(),
            ..kube::core::Status::default()
        }
        .boxed(),
    );
    assert!(!resource_version_too_large(&timeout));
    assert_eq!(Health::new("services").error(&timeout), Retry::Backoff);
}

#[test]
fn a_refused_watch_points_at_credentials_and_rbac() {
    for code in [401, 403] {
        assert!(failure_message(Some(code)).contains("ClusterRole"));
    }
    for code in [None, Some(500)] {
        assert!(failure_message(code).contains("lost the connection"));
    }
}

mod fakeapi;

#[test]
fn packed_keys_give_back_the_object_key() {
    for (kind, ns, name) in [
        (Kind::Service, "demo", "web"),
        (Kind::Node, "", "node-1"),
        // Whatever a broken server sends, namespace and name stay apart.
        (Kind::EndpointSlice, "a/b", "c/d"),
        (Kind::EndpointSlice, "ab", "cd"),
    ] {
        let key = ObjectKey::new(kind, ns, name);
        assert_eq!(Key::of(&key).object_key(), key);
    }
    let ab_cd = Key::of(&ObjectKey::new(Kind::Service, "ab", "cd"));
    assert_ne!(ab_cd, Key::of(&ObjectKey::new(Kind::Service, "a", "bcd")));
    assert_ne!(ab_cd, Key::of(&ObjectKey::new(Kind::Node, "ab", "cd")));
}
