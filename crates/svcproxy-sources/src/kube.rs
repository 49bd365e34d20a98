//! The Kubernetes API source: kube-rs watchers on Services, EndpointSlices, Nodes and
//! ServiceCIDRs, turned into [`SourceUpdate`]s for the sync runner.
//!
//! Entry points: [`client`] (configuration as kube-proxy: `--kubeconfig`, in-cluster,
//! `--master`), [`run`] (every watch, until the runner goes away) and
//! [`record_startup_event`].
//!
//! Each watch keeps only the set of keys it has sent, never the objects: the state
//! converts each object once and keeps only what it needs, and everything the proxy
//! never reads (managed fields, most annotations, node images and conditions) is
//! dropped before an object leaves this module. A (re)list streams upserts (a no-op
//! in the state for unchanged objects) and ends with one batch holding the deletions
//! of everything the list no longer has, followed by [`Event::Ready`]: a re-list
//! after an outage or a 410 Gone replaces the picture without anything flapping.
//! While a connection is down the last state stays in force.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::pin::pin;
use std::time::Duration;

use anyhow::Context;
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::{
    Node, NodeSpec, NodeStatus, ObjectReference, Pod, PodSpec, PodStatus, Service, ServiceStatus,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, DefaultBackoff};
use kube::{Api, Client, Config};
use svcproxy_core::convert::{is_dns1123_subdomain, is_label_value};
use svcproxy_core::model::{
    ANNOTATION_LAST_CHANGE_TRIGGER_TIME, ANNOTATION_TOPOLOGY_AWARE_HINTS, ANNOTATION_TOPOLOGY_KEYS,
    ANNOTATION_TOPOLOGY_MODE, LABEL_HEADLESS, LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME,
};
use svcproxy_core::objects::{Kind, KubeObject, ObjectKey, SourceUpdate};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::{ClientConnection, Event};

/// Watch names, for `RunnerConfig::initial_sources`.
/// The Pod watch's name, run only for a central cluster DNS (`dns_pods`).
pub const POD_WATCH: &str = "pods";

pub const WATCHES: [&str; 5] = [
    "services",
    "endpointslices",
    "nodes",
    "own-node",
    "servicecidrs",
];

/// `origin` of every object this source sends.
pub const ORIGIN: &str = "api";

/// Upserts per [`Event::Updates`] while a list streams in.
const BATCH: usize = 500;
/// Objects per list page (client-go's default).
const PAGE_SIZE: u32 = 500;
/// The API server's connect timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request other than a watch may wait for its response, and then for
/// each piece of its body (see `request_timeout`). Watches are long-lived and
/// bounded by kube-runtime's `timeoutSeconds` plus its idle timeout instead, so the
/// connection itself has no read timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// After a failed attempt, a watch that shows no new error for this long has
/// reconnected (a resumed watch yields nothing until something changes). Longer
/// than the largest backoff (30 s) is not needed: the quiet time counts from the
/// retry, and a failing retry fails within the connect timeout.
const RECONNECT_QUIET: Duration = Duration::from_secs(15);
/// How often a resource the API server does not serve (ServiceCIDRs on an older
/// cluster) is tried again.
const UNSERVED_RETRY: Duration = if cfg!(test) {
    Duration::from_millis(300)
} else {
    Duration::from_secs(300)
};
/// Service annotation older clouds use for `spec.loadBalancerSourceRanges`.
const ANNOTATION_LB_SOURCE_RANGES: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";

/// What the API source needs from the settings.
#[derive(Clone, Debug, PartialEq)]
pub struct KubeSourceConfig {
    /// This node's name: its own Node is watched in full, the others by metadata.
    pub node_name: String,
    /// `--service-proxy-name`: when set, only Services labelled with it are watched.
    pub service_proxy_name: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    /// API server URL overriding the kubeconfig's (or the in-cluster one).
    pub master: Option<String>,
    pub client_connection: ClientConnection,
    /// The cluster DNS is fed too: every Service and EndpointSlice is watched,
    /// headless ones and other proxies' included (the proxy's state still leaves
    /// out what it does not proxy), and endpoints keep their `hostname`.
    pub dns: bool,
    /// The cluster DNS places clients by their Pods: Pods are watched too (kept as
    /// their IPs and node only).
    pub dns_pods: bool,
}

impl KubeSourceConfig {
    /// Checks the values that end up inside label and field selectors: a value that
    /// is not a valid label value or node name would change the selector's meaning.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !is_dns1123_subdomain(&self.node_name) {
            anyhow::bail!(
                "invalid node name {:?}: not a DNS subdomain (set --hostname-override)",
                self.node_name
            );
        }
        if let Some(name) = &self.service_proxy_name {
            if name.is_empty() || !is_label_value(name) {
                anyhow::bail!(
                    "invalid --service-proxy-name {name:?}: not a label value (at most 63 \
                     characters: letters, digits, '-', '_' and '.', starting and ending \
                     with a letter or digit)"
                );
            }
        }
        Ok(())
    }

    /// The label selector for Services and EndpointSlices (the EndpointSlice
    /// controller copies a Service's labels onto its slices).
    pub fn label_selector(&self) -> String {
        if self.dns {
            return String::new();
        }
        match &self.service_proxy_name {
            None => format!("!{LABEL_HEADLESS},!{LABEL_SERVICE_PROXY_NAME}"),
            Some(name) => format!("!{LABEL_HEADLESS},{LABEL_SERVICE_PROXY_NAME}={name}"),
        }
    }
}

/// A client configured as kube-proxy's: the `--kubeconfig` file if given, else the
/// in-cluster service account when running in a pod, else the default kubeconfig
/// (`$KUBECONFIG`, `~/.kube/config`); `--master` overrides the server URL.
#[cfg(test)]
pub async fn client(cfg: &KubeSourceConfig) -> anyhow::Result<Client> {
    client_with_metrics(cfg, client_metrics::RestClientMetrics::new()).await
}

/// [`client`], observing every request in `metrics` (client-go's REST client metrics).
pub async fn client_with_metrics(
    cfg: &KubeSourceConfig,
    metrics: client_metrics::RestClientMetrics,
) -> anyhow::Result<Client> {
    cfg.validate()?;
    let options = KubeConfigOptions::default();
    let mut config = if let Some(path) = &cfg.kubeconfig {
        // `read_from` resolves the file's relative paths (certificates, token
        // files) against its directory, as client-go; its read error quotes the
        // path twice and repeats its cause, so that one is said again plainly.
        let kubeconfig = Kubeconfig::read_from(path).map_err(|e| match e {
            kube::config::KubeconfigError::ReadConfig(source, _) => {
                anyhow::anyhow!("reading kubeconfig {}: {source}", path.display())
            }
            other => anyhow::anyhow!("loading kubeconfig {}: {other}", path.display()),
        })?;
        Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .with_context(|| format!("loading kubeconfig {}", path.display()))?
    } else if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        Config::incluster().context("loading the in-cluster configuration")?
    } else if let Some(m) = cfg.master.as_deref() {
        // As kube-proxy: a bare --master is talked to without credentials (never
        // with those of some default kubeconfig meant for another server).
        Config::new(
            m.parse()
                .with_context(|| format!("invalid --master {m:?}"))?,
        )
    } else {
        Config::from_kubeconfig(&options).await.map_err(|err| {
            anyhow::anyhow!(
                "no Kubernetes API server configured: not running in a pod \
                 (KUBERNETES_SERVICE_HOST is unset), neither --kubeconfig nor --master \
                 given, and no default kubeconfig ($KUBECONFIG, ~/.kube/config): {err}"
            )
        })?
    };
    if let Some(m) = cfg.master.as_deref() {
        config.cluster_url = m
            .parse()
            .with_context(|| format!("invalid --master {m:?}"))?;
    }
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = None;
    // client-go's retries instead (server_retry.rs): kube-rs' would hide a watch's
    // "Too large resource version" for minutes.
    config.default_retry = false;
    let cc = &cfg.client_connection;
    warn_content_type(cc);
    let host = config
        .cluster_url
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let client = kube::client::ClientBuilder::try_from(config)
        .context("building the Kubernetes client")?
        // Innermost (each later layer wraps the ones before): a request waiting for
        // the rate limiter is not yet a request. (A request the timeout layer ends is
        // recorded as `<error>` when it is dropped.)
        .with_layer(&client_metrics::ClientMetricsLayer::new(metrics, host))
        .with_layer(&rate_limit::RateLimitLayer::new(cc.qps, cc.burst))
        // One task polls the limiter (a retry resends through the queue).
        .with_layer(&tower::buffer::BufferLayer::new(1024))
        .with_layer(&server_retry::ServerRetryLayer::new(
            server_retry::MAX_RETRIES,
        ))
        .with_layer(&request_timeout::RequestTimeoutLayer::new(REQUEST_TIMEOUT))
        .build();
    tracing::debug!(qps = cc.qps, burst = cc.burst, "API client rate limit");
    Ok(client)
}

/// kube-rs speaks JSON only, and the API server serves every resource in JSON too.
/// Protobuf (kube-proxy's default for `--kube-api-content-type`) is quietly replaced;
/// anything else is probably a mistake worth a word.
fn warn_content_type(cc: &ClientConnection) {
    let ct = cc.content_type.trim();
    if ct == PROTOBUF {
        tracing::debug!("clientConnection.contentType {PROTOBUF}: svcproxy uses JSON instead");
    } else if !ct.is_empty() && ct != "application/json" {
        tracing::warn!(
            content_type = ct,
            "clientConnection.contentType is not supported: svcproxy speaks JSON to the \
             API server (set it to application/json to silence this)"
        );
    }
}

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// Runs every watch until `tx` closes. Sends [`Event::Updates`] and, once a watch's
/// initial list is complete (and again after each re-list), [`Event::Ready`] with
/// its name from [`WATCHES`].
pub async fn run(client: Client, cfg: KubeSourceConfig, tx: mpsc::Sender<Event>) {
    if let Err(err) = cfg.validate() {
        tracing::error!(error = %format!("{err:#}"), "the API source cannot start");
        return;
    }
    let selector = cfg.label_selector();
    let node = cfg.node_name.as_str();
    let listed = || watcher::Config::default().page_size(PAGE_SIZE);

    // Factories, not streams: a watch whose resourceVersion the server no longer
    // knows of (ahead of it, after a restore) starts again from a fresh list.
    let services = || {
        watcher::watcher(
            Api::<Service>::all(client.clone()),
            listed().labels(&selector),
        )
    };
    let slices = || {
        watcher::watcher(
            Api::<EndpointSlice>::all(client.clone()),
            listed().labels(&selector),
        )
    };
    // Thousands of Nodes: metadata only (labels are all the state reads of them).
    let others = format!("metadata.name!={node}");
    let nodes = || {
        watcher::watcher(
            Api::<PartialObjectMeta<Node>>::all(client.clone()),
            listed().fields(&others),
        )
    };
    let own = format!("metadata.name={node}");
    let own_node = || watcher::watcher(Api::<Node>::all(client.clone()), listed().fields(&own));
    let cidrs = || watcher::watcher(Api::<ServiceCIDR>::all(client.clone()), listed());
    let pods = || watcher::watcher(Api::<Pod>::all(client.clone()), listed());
    let keep_hostnames = cfg.dns;

    tokio::join!(
        drive(
            WATCHES[0],
            services,
            |s| KubeObject::Service(strip_service(s)),
            &tx
        ),
        drive(
            WATCHES[1],
            slices,
            |s| KubeObject::EndpointSlice(strip_slice(s, keep_hostnames)),
            &tx
        ),
        drive(
            WATCHES[2],
            nodes,
            |n| KubeObject::Node(Box::new(node_from_meta(n))),
            &tx
        ),
        drive(
            WATCHES[3],
            own_node,
            |n| KubeObject::Node(Box::new(strip_own_node(n))),
            &tx
        ),
        drive(
            WATCHES[4],
            cidrs,
            |c| KubeObject::ServiceCidr(strip_cidr(c)),
            &tx
        ),
        async {
            if cfg.dns_pods {
                drive(
                    POD_WATCH,
                    pods,
                    |p| KubeObject::Pod(Box::new(strip_pod(p))),
                    &tx,
                )
                .await;
            }
        },
    );
}

/// How long the start-up Event is retried for (an API server still coming up at
/// boot), and the first and largest delays between tries.
const STARTUP_EVENT_FOR: Duration = Duration::from_secs(600);
const STARTUP_EVENT_RETRY: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_secs(60));

/// A Warning Event about this proxy's configuration, posted on its Node with the
/// start-up Event (kube-proxy's defaulted-mode and deprecated-mode warnings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeWarning {
    /// The Event's reason, one CamelCase word.
    pub reason: &'static str,
    /// What the Event's action was (upstream's mode warnings say `ProxyModeCheck`).
    pub action: &'static str,
    /// The message, as logged.
    pub note: String,
}

/// Emits the start-up Event on this node's object, as kube-proxy does, then each of
/// `warnings` as a Warning Event: best effort, each retried with backoff until
/// [`STARTUP_EVENT_FOR`] after the start (then tried once); a failure is logged,
/// never fatal.
pub async fn record_startup_event(client: Client, node_name: String, warnings: Vec<NodeWarning>) {
    let deadline = Instant::now() + STARTUP_EVENT_FOR;
    let starting = KubeEvent {
        type_: EventType::Normal,
        reason: "Starting".into(),
        note: Some("Starting svcproxy.".into()),
        action: "StartSvcproxy".into(),
        secondary: None,
    };
    let events = std::iter::once(starting).chain(warnings.into_iter().map(|w| KubeEvent {
        type_: EventType::Warning,
        reason: w.reason.into(),
        note: Some(w.note),
        action: w.action.into(),
        secondary: None,
    }));
    let mut reference = None;
    for event in events {
        let mut delay = STARTUP_EVENT_RETRY.0;
        loop {
            if reference.is_none() {
                reference = Some(node_reference(&client, &node_name).await);
            }
            let regarding = reference.as_ref().expect("set above");
            match publish(client.clone(), &node_name, &event, regarding).await {
                Ok(()) => {
                    tracing::debug!(node = node_name, reason = event.reason, "recorded an event");
                    break;
                }
                Err(err) if Instant::now() + delay < deadline => {
                    tracing::debug!(error = %err, retry_in = ?delay, reason = event.reason,
                        "recording an event on this node's object");
                    // The Node may appear meanwhile: read its UID again.
                    if reference.as_ref().is_some_and(|r| r.uid.is_none()) {
                        reference = None;
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(STARTUP_EVENT_RETRY.1);
                }
                Err(err) => {
                    tracing::warn!(
                        error = %err,
                        node = node_name,
                        reason = event.reason,
                        "could not record an event on this node's object"
                    );
                    // Past the deadline each remaining event gets one try.
                    break;
                }
            }
        }
    }
}

/// This node's object as an Event's subject. kube-proxy refers to the node by name
/// (it uses the name as UID); the real UID is better when it can be read.
async fn node_reference(client: &Client, node_name: &str) -> ObjectReference {
    let uid = match Api::<Node>::all(client.clone())
        .get_metadata_opt(node_name)
        .await
    {
        Ok(Some(meta)) => meta.metadata.uid,
        Ok(None) => None,
        Err(err) => {
            tracing::debug!(error = %err, node = node_name, "reading the Node for its UID");
            None
        }
    };
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node_name.into()),
        uid,
        ..ObjectReference::default()
    }
}

async fn publish(
    client: Client,
    node_name: &str,
    event: &KubeEvent,
    regarding: &ObjectReference,
) -> Result<(), kube::Error> {
    let reporter = Reporter {
        controller: "svcproxy".into(),
        instance: Some(format!("svcproxy-{node_name}")),
    };
    Recorder::new(client, reporter)
        .publish(event, regarding)
        .await
}

// ---------------------------------------------------------------------------
// Driving one watch

/// Runs one watch until `tx` closes: converts its events with `to_object`, forwards
/// them, and applies backoff and logging on errors. `watch` makes the watcher stream,
/// again when the watch must start over from a fresh list.
async fn drive<K, S>(
    name: &'static str,
    watch_stream: impl Fn() -> S,
    to_object: impl Fn(K) -> KubeObject,
    tx: &mpsc::Sender<Event>,
) where
    S: Stream<Item = watcher::Result<watcher::Event<K>>>,
{
    let mut stream = pin!(watch_stream());
    let mut watch = WatchState::new(name);
    let mut health = Health::new(name);
    loop {
        let quiet_deadline = health.quiet_deadline();
        let first = tokio::select! {
            item = stream.next() => item,
            _ = tx.closed() => return,
            _ = sleep_until_opt(quiet_deadline) => {
                health.quiet();
                continue;
            }
        };
        let mut item = first;
        let mut failure = None;
        let mut taken = 0;
        // Take whatever else is ready (the rest of a list page, a burst of changes)
        // into the same batch.
        loop {
            match item {
                None => {
                    // watcher streams never end; treat an end as the source stopping.
                    tracing::error!(watch = name, "the watch stream ended");
                    flush(&mut watch, tx).await;
                    return;
                }
                Some(Ok(ev)) => {
                    // Init comes before the list request is even made: not a sign
                    // that the server answers.
                    if !matches!(ev, watcher::Event::Init) {
                        health.event();
                    }
                    watch.on_event(ev.map_object(&to_object));
                }
                Some(Err(err)) => {
                    failure = Some(err);
                    break;
                }
            }
            taken += 1;
            if taken >= BATCH {
                break;
            }
            match stream.next().now_or_never() {
                Some(next) => item = next,
                None => break,
            }
        }
        if !flush(&mut watch, tx).await {
            return;
        }
        if let Some(err) = failure {
            let delay = match health.error(&err) {
                Retry::Backoff => health.backoff(),
                Retry::Now => Duration::ZERO,
                Retry::Relist { backoff } => {
                    // kube-rs' watcher would resume from the same resourceVersion
                    // forever: a new one lists afresh.
                    stream.set(watch_stream());
                    if backoff {
                        health.backoff()
                    } else {
                        Duration::ZERO
                    }
                }
                Retry::Unserved => {
                    // Count it as listed (with nothing) so the first sync goes ahead.
                    if !watch.ready_sent() {
                        watch.mark_ready();
                        if !flush(&mut watch, tx).await {
                            return;
                        }
                    }
                    UNSERVED_RETRY
                }
            };
            if !delay.is_zero() {
                tracing::debug!(watch = name, retry_in = ?delay, "retrying the watch");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = tx.closed() => return,
                }
            }
            health.retrying();
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Sends what the watch has queued; false when the runner is gone.
async fn flush(watch: &mut WatchState, tx: &mpsc::Sender<Event>) -> bool {
    for ev in watch.take_outbox() {
        if tx.send(ev).await.is_err() {
            return false;
        }
    }
    true
}

trait MapObject<K> {
    fn map_object(self, f: &impl Fn(K) -> KubeObject) -> watcher::Event<KubeObject>;
}

impl<K> MapObject<K> for watcher::Event<K> {
    fn map_object(self, f: &impl Fn(K) -> KubeObject) -> watcher::Event<KubeObject> {
        match self {
            watcher::Event::Apply(o) => watcher::Event::Apply(f(o)),
            watcher::Event::Delete(o) => watcher::Event::Delete(f(o)),
            watcher::Event::Init => watcher::Event::Init,
            watcher::Event::InitApply(o) => watcher::Event::InitApply(f(o)),
            watcher::Event::InitDone => watcher::Event::InitDone,
        }
    }
}

/// An [`ObjectKey`] in one allocation (the namespace and name back to back): a
/// watch of 10k objects holds 10k of these.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    kind: Kind,
    namespace_len: u32,
    text: Box<str>,
}

impl Key {
    fn of(key: &ObjectKey) -> Key {
        Key {
            kind: key.kind,
            namespace_len: key.namespace.len() as u32,
            text: [key.namespace.as_str(), key.name.as_str()].concat().into(),
        }
    }

    fn object_key(&self) -> ObjectKey {
        let (namespace, name) = self.text.split_at(self.namespace_len as usize);
        ObjectKey::new(self.kind, namespace, name)
    }
}

/// What one watch has sent, and what it is about to send.
struct WatchState {
    name: &'static str,
    /// Every key upserted and not since deleted, apart from those of the list in
    /// progress (an interrupted list's keys are merged in, so that a later list can
    /// still delete them).
    known: HashSet<Key>,
    /// Keys seen by the list in progress.
    listing: Option<HashSet<Key>>,
    lists_done: u64,
    ready_sent: bool,
    pending: Vec<SourceUpdate>,
    outbox: Vec<Event>,
}

impl WatchState {
    fn new(name: &'static str) -> Self {
        WatchState {
            name,
            known: HashSet::new(),
            listing: None,
            lists_done: 0,
            ready_sent: false,
            pending: Vec::new(),
            outbox: Vec::new(),
        }
    }

    fn on_event(&mut self, ev: watcher::Event<KubeObject>) {
        match ev {
            watcher::Event::Init => {
                if self.lists_done > 0 {
                    tracing::debug!(
                        watch = self.name,
                        "re-listing (the watch could not resume); objects gone meanwhile \
                         are removed when the list completes"
                    );
                    // Syncs wait until the list is complete: the state is a mix of
                    // the old and the new picture until then.
                    self.seal();
                    self.outbox.push(Event::Relisting(self.name));
                }
                if let Some(interrupted) = self.listing.replace(HashSet::new()) {
                    self.known.extend(interrupted);
                }
            }
            watcher::Event::InitApply(obj) => {
                let key = Key::of(&obj.key());
                self.listing.get_or_insert_with(HashSet::new).insert(key);
                self.send_upsert(obj);
            }
            watcher::Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let mut gone: Vec<ObjectKey> = self
                    .known
                    .difference(&listed)
                    .map(Key::object_key)
                    .collect();
                gone.sort();
                if self.lists_done > 0 || !gone.is_empty() {
                    tracing::info!(
                        watch = self.name,
                        objects = listed.len(),
                        removed = gone.len(),
                        "list complete"
                    );
                } else {
                    tracing::debug!(
                        watch = self.name,
                        objects = listed.len(),
                        "initial list complete"
                    );
                }
                self.pending
                    .extend(gone.into_iter().map(SourceUpdate::Delete));
                self.known = listed;
                self.lists_done += 1;
                self.mark_ready();
            }
            watcher::Event::Apply(obj) => self.upsert(obj),
            watcher::Event::Delete(obj) => {
                let key = obj.key();
                let packed = Key::of(&key);
                self.known.remove(&packed);
                if let Some(listing) = &mut self.listing {
                    listing.remove(&packed);
                }
                self.pending.push(SourceUpdate::Delete(key));
            }
        }
        if self.pending.len() >= BATCH {
            self.seal();
        }
    }

    fn upsert(&mut self, object: KubeObject) {
        self.known.insert(Key::of(&object.key()));
        self.send_upsert(object);
    }

    fn send_upsert(&mut self, object: KubeObject) {
        self.pending.push(SourceUpdate::Upsert {
            object,
            origin: ORIGIN.to_string(),
        });
    }

    /// Queues [`Event::Ready`] after everything pending.
    fn mark_ready(&mut self) {
        self.seal();
        self.outbox.push(Event::Ready(self.name));
        self.ready_sent = true;
    }

    fn ready_sent(&self) -> bool {
        self.ready_sent
    }

    fn seal(&mut self) {
        if !self.pending.is_empty() {
            self.outbox
                .push(Event::Updates(std::mem::take(&mut self.pending)));
        }
    }

    fn take_outbox(&mut self) -> Vec<Event> {
        self.seal();
        std::mem::take(&mut self.outbox)
    }
}

/// What to do after a watch error.
#[derive(Debug, PartialEq, Eq)]
enum Retry {
    Backoff,
    /// The watcher re-lists by itself (410 Gone).
    Now,
    /// The API server does not serve (or lets us see) this resource.
    Unserved,
    /// The watch's resourceVersion is ahead of the server's (an etcd restored from a
    /// backup): start again from a fresh list, as client-go's reflector does, after a
    /// backoff if the last error was this too.
    Relist {
        backoff: bool,
    },
}

/// Connection health of one watch: logs loss and recovery once each.
struct Health {
    name: &'static str,
    down_since: Option<Instant>,
    /// When the last retry started, while down.
    retry_at: Option<Instant>,
    unserved_logged: bool,
    /// The last error was a 410 Gone (a second one in a row backs off).
    gone: bool,
    /// The last error was a resourceVersion ahead of the server's (likewise).
    ahead: bool,
    backoff: DefaultBackoff,
}

impl Health {
    fn new(name: &'static str) -> Self {
        Health {
            name,
            down_since: None,
            retry_at: None,
            unserved_logged: false,
            gone: false,
            ahead: false,
            backoff: DefaultBackoff::default(),
        }
    }

    fn error(&mut self, err: &watcher::Error) -> Retry {
        let status = api_status(err);
        let gone_again = std::mem::replace(&mut self.gone, status == Some(410));
        if status == Some(410) {
            // The server answered: if it was unreachable, it is back.
            self.recovered("the server answered 410 Gone");
            tracing::info!(
                watch = self.name,
                "resourceVersion expired (410 Gone); re-listing"
            );
            return if gone_again {
                Retry::Backoff
            } else {
                Retry::Now
            };
        }
        let ahead_again = std::mem::replace(&mut self.ahead, resource_version_too_large(err));
        if self.ahead {
            self.recovered("the server answered that the resourceVersion is too large");
            if !ahead_again {
                tracing::warn!(
                    watch = self.name,
                    error = %chain(err),
                    "the API server is behind this watch's resourceVersion (was its etcd \
                     restored from a backup?); re-listing from scratch: objects that no longer \
                     exist are removed when the list completes"
                );
            }
            return Retry::Relist {
                backoff: ahead_again,
            };
        }
        let list_failed = matches!(
            err,
            watcher::Error::InitialListFailed(_) | watcher::Error::WatchStartFailed(_)
        );
        // ServiceCIDRs are optional (older clusters, or RBAC from before they
        // existed): never let them hold up the first sync.
        if self.name == "servicecidrs" && list_failed && matches!(status, Some(404 | 403)) {
            if !self.unserved_logged {
                self.unserved_logged = true;
                tracing::info!(
                    watch = self.name,
                    error = %err,
                    retry_every = ?UNSERVED_RETRY,
                    "ServiceCIDRs are not available from this API server; continuing without them"
                );
            } else {
                tracing::debug!(watch = self.name, error = %err, "ServiceCIDRs still not available");
            }
            return Retry::Unserved;
        }
        match self.down_since {
            None => {
                self.down_since = Some(Instant::now());
                tracing::warn!(
                    watch = self.name,
                    error = %chain(err),
                    "{}",
                    failure_message(status)
                );
            }
            Some(_) => {
                tracing::debug!(watch = self.name, error = %chain(err), "watch still failing")
            }
        }
        self.retry_at = None;
        Retry::Backoff
    }

    fn backoff(&mut self) -> Duration {
        self.backoff.next().unwrap_or(Duration::from_secs(30))
    }

    /// The watcher is polled again after an error.
    fn retrying(&mut self) {
        if self.down_since.is_some() {
            self.retry_at = Some(Instant::now());
        }
    }

    /// A successful event: the connection is back if it was down.
    fn event(&mut self) {
        self.gone = false;
        self.ahead = false;
        self.recovered("events flow again");
        if self.unserved_logged {
            self.unserved_logged = false;
            tracing::info!(watch = self.name, "ServiceCIDRs are now served");
        }
    }

    fn quiet_deadline(&self) -> Option<Instant> {
        self.retry_at.map(|t| t + RECONNECT_QUIET)
    }

    /// No error since the last retry for [`RECONNECT_QUIET`]: the watch resumed.
    fn quiet(&mut self) {
        self.recovered("the resumed watch has been quiet without errors");
    }

    fn recovered(&mut self, how: &str) {
        if let Some(since) = self.down_since.take() {
            tracing::info!(
                watch = self.name,
                down_for = ?since.elapsed(),
                "reconnected to the API server ({how})"
            );
        }
        self.retry_at = None;
    }
}

/// What a watch failure means, for the one warning it gets.
fn failure_message(status: Option<u16>) -> &'static str {
    match status {
        Some(401 | 403) => {
            "the API server refuses this watch: check svcproxy's credentials and its \
             ClusterRole (deploy/base/rbac.yaml); the last known state stays in force while it \
             retries with backoff"
        }
        _ => {
            "lost the connection to the API server; the last known state stays in force \
             while the watch reconnects with backoff"
        }
    }
}

/// An error with its sources ("client error (Connect): tcp connect error: ...").
fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        let s = e.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        source = e.source();
    }
    out
}

/// The API status of an error, if the error is one.
fn status_of(err: &watcher::Error) -> Option<&kube::core::Status> {
    match err {
        watcher::Error::WatchError(status) => Some(status),
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => match e {
            kube::Error::Api(status) => Some(status),
            _ => None,
        },
        watcher::Error::NoResourceVersion => None,
    }
}

/// The HTTP status of an API error, if the error is one.
fn api_status(err: &watcher::Error) -> Option<u16> {
    status_of(err).map(|s| s.code)
}

/// The API server's "Too large resource version" (a 504 Timeout whose cause is
/// `ResourceVersionTooLarge`, or an older server's message saying so): what it answers
/// a watch from a resourceVersion it has not reached, as after an etcd restore.
/// client-go's `isTooLargeResourceVersionError` reads it the same way.
fn resource_version_too_large(err: &watcher::Error) -> bool {
    let Some(status) = status_of(err) else {
        return false;
    };
    if status.code != 504 && status.reason != "Timeout" {
        return false;
    }
    let cause = status.details.as_ref().is_some_and(|d| {
        d.causes
            .iter()
            .any(|c| c.reason == "ResourceVersionTooLarge")
    });
    cause || status.message.contains("Too large resource version")
}

// ---------------------------------------------------------------------------
// Keeping only what the state reads

fn keep(map: Option<BTreeMap<String, String>>, keys: &[&str]) -> Option<BTreeMap<String, String>> {
    let kept: BTreeMap<String, String> = map?
        .into_iter()
        .filter(|(k, _)| keys.contains(&k.as_str()))
        .collect();
    (!kept.is_empty()).then_some(kept)
}

fn identity(meta: &mut ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        ..ObjectMeta::default()
    }
}

fn strip_service(mut svc: Service) -> Service {
    let mut meta = identity(&mut svc.metadata);
    meta.labels = keep(
        svc.metadata.labels.take(),
        &[LABEL_SERVICE_PROXY_NAME, LABEL_HEADLESS],
    );
    meta.annotations = keep(
        svc.metadata.annotations.take(),
        &[
            ANNOTATION_TOPOLOGY_MODE,
            ANNOTATION_TOPOLOGY_AWARE_HINTS,
            ANNOTATION_TOPOLOGY_KEYS,
            ANNOTATION_LB_SOURCE_RANGES,
        ],
    );
    let spec = svc.spec.map(|mut s| {
        s.selector = None;
        s
    });
    let status = svc
        .status
        .and_then(|s| s.load_balancer)
        .map(|lb| ServiceStatus {
            load_balancer: Some(lb),
            conditions: None,
        });
    Service {
        metadata: meta,
        spec,
        status,
    }
}

/// A slice as the state reads it; `keep_hostnames` for the cluster DNS.
fn strip_slice(mut slice: EndpointSlice, keep_hostnames: bool) -> EndpointSlice {
    let mut meta = identity(&mut slice.metadata);
    meta.labels = keep(
        slice.metadata.labels.take(),
        &[LABEL_SERVICE_NAME, LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME],
    );
    meta.annotations = keep(
        slice.metadata.annotations.take(),
        &[ANNOTATION_LAST_CHANGE_TRIGGER_TIME],
    );
    slice.metadata = meta;
    for ep in slice.endpoints.iter_mut().flatten() {
        ep.target_ref = None;
        if !keep_hostnames {
            ep.hostname = None;
        }
        ep.deprecated_topology = None;
    }
    slice
}

/// Another node: name, labels and whether it is being deleted.
fn node_from_meta(meta: PartialObjectMeta<Node>) -> Node {
    let m = meta.metadata;
    Node {
        metadata: ObjectMeta {
            name: m.name,
            labels: m.labels,
            deletion_timestamp: m.deletion_timestamp,
            ..ObjectMeta::default()
        },
        spec: None,
        status: None,
    }
}

/// This node: also its addresses, pod CIDRs and taints.
fn strip_own_node(node: Node) -> Node {
    let m = node.metadata;
    Node {
        metadata: ObjectMeta {
            name: m.name,
            labels: m.labels,
            deletion_timestamp: m.deletion_timestamp,
            ..ObjectMeta::default()
        },
        spec: node.spec.map(|s| NodeSpec {
            pod_cidr: s.pod_cidr,
            pod_cidrs: s.pod_cidrs,
            taints: s.taints,
            ..NodeSpec::default()
        }),
        status: node.status.map(|s| NodeStatus {
            addresses: s.addresses,
            ..NodeStatus::default()
        }),
    }
}

/// A Pod as the cluster DNS reads it: where it runs and its addresses.
fn strip_pod(mut pod: Pod) -> Pod {
    Pod {
        metadata: identity(&mut pod.metadata),
        spec: pod.spec.map(|s| PodSpec {
            node_name: s.node_name,
            ..PodSpec::default()
        }),
        status: pod.status.map(|s| PodStatus {
            pod_ips: s.pod_ips,
            ..PodStatus::default()
        }),
    }
}

fn strip_cidr(mut cidr: ServiceCIDR) -> ServiceCIDR {
    cidr.metadata = identity(&mut cidr.metadata);
    cidr.status = None;
    cidr
}

pub mod client_metrics;
mod rate_limit;
mod request_timeout;
mod server_retry;

#[cfg(test)]
mod tests;
