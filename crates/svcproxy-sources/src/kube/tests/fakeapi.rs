//! [`run`] against a fake API server over real HTTP, with the real kube client:
//! what reaches the runner's channel, in order.
//!
//! Address plan: services 10.96.0.0/16, pods 10.244.N.0/24, nodes 192.168.0.N; this
//! proxy runs as node-a.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use svcproxy_core::objects::Kind;
use svcproxy_fakeapi::FakeApiServer;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::instrument::WithSubscriber;

use super::super::*;
use super::cfg;

const NODE: &str = "node-a";
const T: Duration = Duration::from_secs(10);
/// Longer than the watches' largest backoff (30 s): for a watch that lost its server.
const RETRY_BOUND: Duration = Duration::from_secs(40);

fn service(name: &str, ip: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "labels": labels,
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}
    })
}

fn slice(name: &str, svc: &str, ip: &str, labels: Value) -> Value {
    let mut labels = labels;
    labels["kubernetes.io/service-name"] = json!(svc);
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true}, "nodeName": "node-b"}]
    })
}

fn node(name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name,
                     "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": "zone-1"},
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                     "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
        "spec": {"podCIDRs": ["10.244.1.0/24"], "providerID": "fake://x"},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}],
                   "images": [{"names": ["registry.example/big:1"], "sizeBytes": 1}]}
    })
}

fn service_cidr(name: &str, cidr: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
        "metadata": {"name": name},
        "spec": {"cidrs": [cidr]}
    })
}

fn svc_key(name: &str) -> ObjectKey {
    ObjectKey::new(Kind::Service, "default", name)
}

fn slice_key(name: &str) -> ObjectKey {
    ObjectKey::new(Kind::EndpointSlice, "default", name)
}

/// What the runner would have been told, applied in order.
#[derive(Default)]
struct Model {
    objects: BTreeMap<ObjectKey, KubeObject>,
    upserts: BTreeMap<ObjectKey, usize>,
    deletes: BTreeMap<ObjectKey, usize>,
    /// Each Ready, with how many objects of the watch's kind were held then.
    ready: Vec<(&'static str, usize)>,
    /// Every event in order, summarised.
    log: Vec<String>,
}

impl Model {
    fn count(&self, kind: Kind) -> usize {
        self.objects.keys().filter(|k| k.kind == kind).count()
    }

    fn ready_count(&self, name: &str) -> usize {
        self.ready.iter().filter(|(n, _)| *n == name).count()
    }

    fn all_ready(&self) -> bool {
        WATCHES.iter().all(|w| self.ready_count(w) > 0)
    }

    fn has(&self, key: &ObjectKey) -> bool {
        self.objects.contains_key(key)
    }

    fn apply(&mut self, ev: Event) {
        self.log.extend(super::summary(std::slice::from_ref(&ev)));
        match ev {
            Event::Updates(updates) => {
                for u in updates {
                    match u {
                        SourceUpdate::Upsert { object, origin } => {
                            assert_eq!(origin, ORIGIN);
                            *self.upserts.entry(object.key()).or_default() += 1;
                            self.objects.insert(object.key(), object);
                        }
                        SourceUpdate::Delete(key) => {
                            *self.deletes.entry(key.clone()).or_default() += 1;
                            self.objects.remove(&key);
                        }
                        SourceUpdate::Replace { .. }
                        | SourceUpdate::HostAddresses(_)
                        | SourceUpdate::InputProblems(_) => {
                            panic!("unexpected {u:?}")
                        }
                    }
                }
            }
            Event::Ready(name) => {
                let kind = match name {
                    "services" => Some(Kind::Service),
                    "endpointslices" => Some(Kind::EndpointSlice),
                    "servicecidrs" => Some(Kind::ServiceCidr),
                    _ => None,
                };
                let n = kind.map_or(0, |k| self.count(k));
                self.ready.push((name, n));
            }
            Event::Relisting(_) => {}
            Event::TookOver => panic!("a source announced a take-over"),
        }
    }
}

struct Harness {
    server: FakeApiServer,
    rx: mpsc::Receiver<Event>,
    task: JoinHandle<()>,
    model: Model,
    /// What [`run`] logged.
    logs: Logs,
    _dir: tempfile::TempDir,
}

/// Log lines captured from one [`run`] (tests run in parallel, so not global).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Lines mentioning `watch` and containing `what`.
    fn count(&self, watch: &str, what: &str) -> usize {
        let tag = format!("watch=\"{watch}\"");
        let tag_plain = format!("watch={watch}");
        self.text()
            .lines()
            .filter(|l| {
                (l.contains(&tag) || l.contains(&format!("{tag_plain} "))) && l.contains(what)
            })
            .count()
    }
}

impl Harness {
    /// Runs the source with a client built by [`client`] from the server's kubeconfig.
    async fn start(server: FakeApiServer, proxy_name: Option<&str>) -> Harness {
        Harness::start_with(server, cfg(proxy_name)).await
    }

    /// [`Harness::start`] with a whole configuration.
    async fn start_with(server: FakeApiServer, mut c: KubeSourceConfig) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, server.kubeconfig_yaml()).unwrap();
        c.kubeconfig = Some(path);
        let client = client(&c).await.expect("client");
        let (tx, rx) = mpsc::channel(16);
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let task = tokio::spawn(run(client, c, tx).with_subscriber(subscriber));
        Harness {
            server,
            rx,
            task,
            model: Model::default(),
            logs,
            _dir: dir,
        }
    }

    /// Applies events until `pred` holds; panics after [`T`].
    async fn until(&mut self, what: &str, pred: impl Fn(&Model) -> bool) {
        self.until_within(what, T, pred).await
    }

    /// [`Harness::until`], panicking after `bound`.
    async fn until_within(&mut self, what: &str, bound: Duration, pred: impl Fn(&Model) -> bool) {
        let deadline = tokio::time::Instant::now() + bound;
        while !pred(&self.model) {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(ev)) => self.model.apply(ev),
                Ok(None) => panic!("the source stopped while waiting for {what}"),
                Err(_) => panic!(
                    "timed out waiting for {what}; events: {:#?}",
                    self.model.log
                ),
            }
        }
    }

    /// Applies whatever arrives within `d` (to catch what must not happen).
    async fn settle(&mut self, d: Duration) {
        let deadline = tokio::time::Instant::now() + d;
        while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
            self.model.apply(ev);
        }
    }

    /// Drops the receiver: [`run`] must return.
    async fn stop(self) {
        drop(self.rx);
        tokio::time::timeout(T, self.task)
            .await
            .expect("run() returns once the channel closes")
            .unwrap();
    }
}

/// node-a, node-b; web and api with a slice each.
fn seed(server: &FakeApiServer) {
    server.apply(node(NODE, "192.168.0.1"));
    server.apply(node("node-b", "192.168.0.2"));
    server.apply(service("web", "10.96.0.10", json!({})));
    server.apply(slice("web-1", "web", "10.244.2.5", json!({})));
    server.apply(service("api", "10.96.0.11", json!({})));
    server.apply(slice("api-1", "api", "10.244.2.7", json!({})));
    server.apply(service_cidr("kubernetes", "10.96.0.0/16"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_watch_is_ready_only_after_its_whole_list_even_across_pages() {
    let server = FakeApiServer::start().await.unwrap();
    seed(&server);
    for i in 0..600 {
        let name = format!("svc-{i:04}");
        server.apply(service(
            &name,
            &format!("10.96.{}.{}", 10 + i / 200, i % 200 + 1),
            json!({}),
        ));
        server.apply(slice(
            &format!("{name}-1"),
            &name,
            &format!("10.244.{}.{}", 3 + i / 200, i % 200 + 1),
            json!({}),
        ));
    }
    let mut h = Harness::start(server, None).await;
    h.until("every initial list", Model::all_ready).await;
    // Each Ready came with the whole list already delivered.
    for (name, held) in &h.model.ready {
        match *name {
            "services" | "endpointslices" => assert_eq!(*held, 602, "{name}"),
            "servicecidrs" => assert_eq!(*held, 1),
            _ => {}
        }
    }
    assert!(h.model.has(&ObjectKey::new(Kind::Node, "", NODE)));
    assert!(h.model.has(&ObjectKey::new(Kind::Node, "", "node-b")));
    // Batched: 600-odd objects per kind in a handful of messages, not one each.
    assert!(h.model.log.len() < 40, "{} messages", h.model.log.len());
    let paged = h
        .server
        .requests()
        .into_iter()
        .any(|r| r.path == "/api/v1/services" && r.query.contains("continue="));
    assert!(paged, "the service list was not paginated");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_dns_gets_every_service_hostnames_and_the_pods() {
    let server = FakeApiServer::start().await.unwrap();
    seed(&server);
    let headless = json!({"service.kubernetes.io/headless": ""});
    server.apply(service("hl", "10.96.0.20", headless.clone()));
    let mut hl = slice("hl-1", "hl", "10.244.2.20", headless);
    hl["endpoints"][0]["hostname"] = json!("db-0");
    server.apply(hl);
    let theirs = json!({"service.kubernetes.io/service-proxy-name": "other"});
    server.apply(service("theirs", "10.96.0.22", theirs));
    server.apply(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": "apps", "name": "client", "labels": {"app": "x"}},
        "spec": {"nodeName": "node-b", "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "podIPs": [{"ip": "10.244.2.7"}]}}));

    let mut h = Harness::start_with(
        server,
        KubeSourceConfig {
            dns: true,
            dns_pods: true,
            ..cfg(None)
        },
    )
    .await;
    h.until("every initial list and the pods", |m| {
        m.all_ready() && m.ready_count(POD_WATCH) > 0
    })
    .await;
    let keys = |m: &Model, kind| -> Vec<String> {
        m.objects
            .keys()
            .filter(|k| k.kind == kind)
            .map(|k| k.name.clone())
            .collect()
    };
    assert_eq!(
        keys(&h.model, Kind::Service),
        ["api", "hl", "theirs", "web"]
    );
    let KubeObject::EndpointSlice(hl) =
        &h.model.objects[&ObjectKey::new(Kind::EndpointSlice, "default", "hl-1")]
    else {
        panic!()
    };
    assert_eq!(
        hl.endpoints.as_ref().unwrap()[0].hostname.as_deref(),
        Some("db-0")
    );
    // The Pod arrives as where it runs and its addresses, nothing else.
    let KubeObject::Pod(pod) = &h.model.objects[&ObjectKey::new(Kind::Pod, "apps", "client")]
    else {
        panic!()
    };
    assert_eq!(pod.metadata.labels, None);
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.node_name.as_deref(), Some("node-b"));
    assert!(spec.containers.is_empty());
    let status = pod.status.as_ref().unwrap();
    assert_eq!(status.pod_ips.as_ref().unwrap()[0].ip, "10.244.2.7");
    assert_eq!(status.phase, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headless_and_other_proxies_objects_are_left_out_by_the_server() {
    let server = FakeApiServer::start().await.unwrap();
    seed(&server);
    let headless = json!({"service.kubernetes.io/headless": ""});
    server.apply(service("hl", "10.96.0.20", headless.clone()));
    server.apply(slice("hl-1", "hl", "10.244.2.20", headless));
    let ours = json!({"service.kubernetes.io/service-proxy-name": "svcproxy"});
    server.apply(service("mine", "10.96.0.21", ours.clone()));
    server.apply(slice("mine-1", "mine", "10.244.2.21", ours));
    let theirs = json!({"service.kubernetes.io/service-proxy-name": "other"});
    server.apply(service("theirs", "10.96.0.22", theirs.clone()));
    server.apply(slice("theirs-1", "theirs", "10.244.2.22", theirs));

    let mut h = Harness::start(server, None).await;
    h.until("every initial list", Model::all_ready).await;
    let keys = |m: &Model, kind| -> Vec<String> {
        m.objects
            .keys()
            .filter(|k| k.kind == kind)
            .map(|k| k.name.clone())
            .collect()
    };
    assert_eq!(keys(&h.model, Kind::Service), ["api", "web"]);
    assert_eq!(keys(&h.model, Kind::EndpointSlice), ["api-1", "web-1"]);
    let server = h.server;
    drop(h.rx);

    let mut h = Harness::start(server, Some("svcproxy")).await;
    h.until("every initial list", Model::all_ready).await;
    assert_eq!(keys(&h.model, Kind::Service), ["mine"]);
    assert_eq!(keys(&h.model, Kind::EndpointSlice), ["mine-1"]);
    // Only what the state reads arrives: no last-applied-configuration.
    let KubeObject::Service(mine) = &h.model.objects[&svc_key("mine")] else {
        panic!()
    };
    assert_eq!(mine.metadata.annotations, None);
    assert_eq!(
        mine.metadata.labels,
        Some(BTreeMap::from([(
            LABEL_SERVICE_PROXY_NAME.to_string(),
            "svcproxy".to_string()
        )]))
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_propagate_and_dropped_watches_lose_and_repeat_nothing() {
    let server = FakeApiServer::start().await.unwrap();
    seed(&server);
    let mut h = Harness::start(server, None).await;
    h.until("every initial list", Model::all_ready).await;

    h.server.apply(service("new", "10.96.0.12", json!({})));
    h.server
        .apply(slice("new-1", "new", "10.244.2.8", json!({})));
    h.until("the new service", |m| {
        m.has(&svc_key("new")) && m.has(&slice_key("new-1"))
    })
    .await;
    h.server
        .apply(slice("new-1", "new", "10.244.2.9", json!({})));
    h.until("the updated slice", |m| {
        m.upserts.get(&slice_key("new-1")) == Some(&2)
    })
    .await;
    h.server.delete("Service", Some("default"), "new");
    h.until("the deletion", |m| !m.has(&svc_key("new"))).await;

    for round in 0..3 {
        h.server.drop_watches();
        let name = format!("churn-{round}");
        h.server
            .apply(service(&name, &format!("10.96.1.{}", round + 1), json!({})));
        h.server.drop_watches();
        h.server.apply(slice(
            "web-1",
            "web",
            &format!("10.244.2.{}", 50 + round),
            json!({}),
        ));
    }
    h.server.delete("EndpointSlice", Some("default"), "new-1");
    h.until("every change after the drops", |m| {
        (0..3).all(|r| m.has(&svc_key(&format!("churn-{r}"))))
            && !m.has(&slice_key("new-1"))
            && m.upserts.get(&slice_key("web-1")) == Some(&4)
    })
    .await;
    h.settle(Duration::from_millis(500)).await;
    // Resumed, not re-listed: nothing was sent twice and no watch re-listed.
    assert_eq!(h.model.upserts[&slice_key("web-1")], 4);
    assert_eq!(h.model.upserts[&svc_key("web")], 1);
    assert_eq!(h.model.upserts[&svc_key("churn-0")], 1);
    assert_eq!(h.model.deletes.get(&slice_key("new-1")), Some(&1));
    assert_eq!(h.model.ready.len(), WATCHES.len(), "{:?}", h.model.ready);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_resource_version_relists_and_deletes_what_vanished_at_once() {
    let server = FakeApiServer::start().await.unwrap();
    seed(&server);
    let mut h = Harness::start(server, None).await;
    h.until("every initial list", Model::all_ready).await;
    let seen = h.model.log.len();

    // While the watches are down, api goes away and the history is compacted: the
    // reconnecting watches get 410 Gone and must re-list.
    h.server.set_watches_refused(true);
    h.server.drop_watches();
    h.server.delete("Service", Some("default"), "api");
    h.server.delete("EndpointSlice", Some("default"), "api-1");
    h.server.compact();
    h.server.set_watches_refused(false);
    h.until("the re-lists", |m| {
        m.ready_count("services") == 2 && m.ready_count("endpointslices") == 2
    })
    .await;
    assert!(!h.model.has(&svc_key("api")));
    assert!(!h.model.has(&slice_key("api-1")));
    assert!(h.model.has(&svc_key("web")));
    // Nothing else was deleted (nothing flapped), and each deletion came in the
    // batch that ends the re-list, just before its Ready.
    let deleted: Vec<&ObjectKey> = h.model.deletes.keys().collect();
    assert_eq!(deleted, [&svc_key("api"), &slice_key("api-1")]);
    let after = &h.model.log[seen..];
    for (gone, watch) in [("-api", "services"), ("-api-1", "endpointslices")] {
        let i = after
            .iter()
            .position(|l| l.split(' ').any(|w| w == gone))
            .unwrap_or_else(|| panic!("no {gone} in {after:#?}"));
        assert_eq!(
            after.get(i + 1),
            Some(&format!("ready {watch}")),
            "{after:#?}"
        );
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_with_a_compacted_history_is_relisted_and_logged_once() {
    let server = FakeApiServer::start().await.unwrap();
    seed(&server);
    let mut h = Harness::start(server, None).await;
    h.until("every initial list", Model::all_ready).await;
    let addr = h.server.addr();
    let rv = h.server.resource_version();
    h.server.clone().shutdown().await;
    // Down long enough for every watch to fail to reconnect at least once.
    h.settle(Duration::from_millis(500)).await;
    assert_eq!(h.model.ready.len(), WATCHES.len(), "nothing re-listed yet");
    assert!(h.model.deletes.is_empty(), "the last state stays in force");

    // It comes back without api, and with history newer than what we saw compacted
    // away: resuming is impossible, the watches must re-list.
    let server = FakeApiServer::start_on(addr).await.unwrap();
    seed(&server);
    while server.resource_version() <= rv {
        server.apply(service("filler", "10.96.0.99", json!({})));
    }
    server.delete("Service", Some("default"), "filler");
    server.delete("Service", Some("default"), "api");
    server.delete("EndpointSlice", Some("default"), "api-1");
    server.compact();
    h.server = server;
    // Each watch retries with kube-rs's default backoff (0.8 s doubling, with
    // jitter, at most 30 s): one that failed three or four times while the server
    // was down may wait more than `T` for its next try (a CI run saw it).
    h.until_within("the re-lists", RETRY_BOUND, |m| {
        WATCHES.iter().all(|w| m.ready_count(w) == 2) && !m.has(&svc_key("api"))
    })
    .await;
    let deleted: Vec<&ObjectKey> = h.model.deletes.keys().collect();
    assert_eq!(deleted, [&svc_key("api"), &slice_key("api-1")]);
    // The warning names the cause (refused, reset, or a pooled connection the server
    // closed as it went down), not only "client error".
    let text = h.logs.text();
    assert!(
        text.contains("Connection re") || text.contains("connection closed"),
        "no refused/reset cause: {text}"
    );
    for watch in WATCHES {
        assert_eq!(
            h.logs.count(watch, "lost the connection to the API server"),
            1,
            "{watch}: {}",
            h.logs.text()
        );
        assert_eq!(
            h.logs.count(watch, "reconnected"),
            1,
            "{watch}: {}",
            h.logs.text()
        );
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unserved_service_cidrs_do_not_hold_up_the_first_sync() {
    let server = FakeApiServer::start().await.unwrap();
    seed(&server);
    server.set_served("ServiceCIDR", false);
    let mut h = Harness::start(server, None).await;
    h.until("every initial list", Model::all_ready).await;
    assert_eq!(h.model.count(Kind::ServiceCidr), 0);
    assert_eq!(
        h.logs.count("servicecidrs", "not available"),
        1,
        "{}",
        h.logs.text()
    );
    // Served later (an upgraded cluster): picked up by the slow retry.
    h.server.set_served("ServiceCIDR", true);
    h.until("the ServiceCIDR", |m| m.count(Kind::ServiceCidr) == 1)
        .await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_nodes_come_as_metadata_and_this_node_in_full_but_trimmed() {
    let server = FakeApiServer::start().await.unwrap();
    seed(&server);
    let mut h = Harness::start(server, None).await;
    h.until("every initial list", Model::all_ready).await;
    let node_obj = |m: &Model, name: &str| match &m.objects[&ObjectKey::new(Kind::Node, "", name)] {
        KubeObject::Node(n) => n.clone(),
        other => panic!("{other:?}"),
    };
    let b = node_obj(&h.model, "node-b");
    assert_eq!(b.spec, None);
    assert_eq!(b.status, None);
    assert_eq!(b.metadata.annotations, None);
    assert_eq!(b.metadata.managed_fields, None);
    assert_eq!(
        b.metadata.labels.as_ref().unwrap()["topology.kubernetes.io/zone"],
        "zone-1"
    );
    let a = node_obj(&h.model, NODE);
    let status = a.status.unwrap();
    assert_eq!(status.addresses.unwrap()[0].address, "192.168.0.1");
    assert_eq!(status.images, None);
    assert_eq!(a.spec.unwrap().provider_id, None);
    assert_eq!(a.metadata.annotations, None);

    // A label change on another node arrives.
    let mut b2 = node("node-b", "192.168.0.2");
    b2["metadata"]["labels"]["topology.kubernetes.io/zone"] = json!("zone-2");
    h.server.apply(b2);
    h.until("the relabelled node", |m| {
        matches!(&m.objects[&ObjectKey::new(Kind::Node, "", "node-b")],
            KubeObject::Node(n) if n.metadata.labels.as_ref().unwrap()["topology.kubernetes.io/zone"] == "zone-2")
    })
    .await;

    let requests = h.server.requests();
    let node_queries: Vec<String> = requests
        .iter()
        .filter(|r| r.path == "/api/v1/nodes")
        .map(|r| r.query.clone())
        .collect();
    let has = |needle: &str| node_queries.iter().any(|q| q.contains(needle));
    // Other nodes by metadata only; this one in full.
    for r in requests.iter().filter(|r| r.path == "/api/v1/nodes") {
        let others = r.query.contains("%21%3D") || r.query.contains("!=");
        assert_eq!(r.is_metadata(), others, "{r:?}");
    }
    assert!(
        has("metadata.name%21%3Dnode-a") || has("metadata.name!=node-a"),
        "{node_queries:?}"
    );
    assert!(
        has("metadata.name%3Dnode-a") || has("metadata.name=node-a"),
        "{node_queries:?}"
    );
    h.stop().await;
}

/// A seeded fake API server and a client of it (through a kubeconfig in the
/// returned directory, which must live as long as the client is used).
async fn seeded_server_and_client() -> (FakeApiServer, tempfile::TempDir, Client) {
    let server = FakeApiServer::start().await.unwrap();
    seed(&server);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, server.kubeconfig_yaml()).unwrap();
    let mut c = cfg(None);
    c.kubeconfig = Some(path);
    let client = client(&c).await.unwrap();
    (server, dir, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_startup_event_is_posted_on_this_node() {
    let (server, _dir, client) = seeded_server_and_client().await;
    record_startup_event(client, NODE.to_string(), vec![]).await;
    let events = server.events();
    assert_eq!(events.len(), 1, "{events:#?}");
    let ev = &events[0];
    assert_eq!(ev["reason"], "Starting");
    assert_eq!(ev["note"], "Starting svcproxy.");
    assert_eq!(ev["type"], "Normal");
    assert_eq!(ev["reportingController"], "svcproxy");
    assert_eq!(ev["regarding"]["kind"], "Node");
    assert_eq!(ev["regarding"]["name"], NODE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_warning_follows_the_startup_event_as_a_warning_event() {
    let (server, _dir, client) = seeded_server_and_client().await;
    let warning = NodeWarning {
        reason: "ProxyModeDefaulted",
        action: "ProxyModeCheck",
        note: "no proxy mode set: running iptables".into(),
    };
    record_startup_event(client, NODE.to_string(), vec![warning]).await;
    let events = server.events();
    assert_eq!(events.len(), 2, "{events:#?}");
    assert_eq!(events[0]["reason"], "Starting");
    let ev = &events[1];
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["reason"], "ProxyModeDefaulted");
    assert_eq!(ev["action"], "ProxyModeCheck");
    assert_eq!(ev["note"], "no proxy mode set: running iptables");
    assert_eq!(ev["regarding"]["kind"], "Node");
    assert_eq!(ev["regarding"]["name"], NODE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_startup_event_is_retried_until_the_server_answers() {
    let server = FakeApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, server.kubeconfig_yaml()).unwrap();
    let addr = server.addr();
    server.shutdown().await;
    let mut c = cfg(None);
    c.kubeconfig = Some(path);
    let client = client(&c).await.unwrap();
    let task = tokio::spawn(record_startup_event(client, NODE.to_string(), vec![]));
    // Down for the first tries (0, 0.5, 1.5 s...).
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!task.is_finished(), "gave up while the server was down");
    let server = FakeApiServer::start_on(addr).await.unwrap();
    seed(&server);
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the event was retried within 10 s")
        .unwrap();
    let events = server.events();
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["regarding"]["name"], NODE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_overrides_the_kubeconfig_server() {
    let server = FakeApiServer::start().await.unwrap();
    seed(&server);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    // A kubeconfig pointing nowhere; --master names the real server.
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let yaml = server
        .kubeconfig_yaml()
        .replace(&server.url(), &format!("http://{nowhere}"));
    std::fs::write(&path, yaml).unwrap();
    let mut c = cfg(None);
    c.kubeconfig = Some(path);
    c.master = Some(server.url());
    let client = client(&c).await.unwrap();
    let nodes = Api::<Node>::all(client)
        .list(&Default::default())
        .await
        .unwrap();
    assert_eq!(nodes.items.len(), 2);
}

#[tokio::test]
async fn invalid_configuration_is_refused_with_a_clear_error() {
    let mut c = cfg(Some("a,b"));
    c.master = Some("http://127.0.0.1:1".into());
    let Err(err) = client(&c).await else {
        panic!("accepted")
    };
    let err = err.to_string();
    assert!(err.contains("--service-proxy-name"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(None);
    c.kubeconfig = Some(dir.path().join("missing"));
    let Err(err) = client(&c).await else {
        panic!("accepted")
    };
    let err = format!("{err:#}");
    assert!(err.contains("reading kubeconfig"), "{err}");
}
