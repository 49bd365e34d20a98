//! The Kubernetes API source end to end: the real `svcproxy` binary, its real kube-rs
//! client, and a fake API server speaking the real wire protocol over HTTP
//! (`svcproxy-fakeapi`). svcproxy runs as `snapshot --watch --format json`, which
//! prints the node snapshot (one JSON document per line) after every sync that changes
//! it, so each test observes exactly what the data plane would be programmed with.
//!
//! Address plan: services 10.96.0.0/16, pods 10.244.N.0/24 on node-N, nodes
//! 192.168.0.N; this proxy runs as node-a.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use svcproxy_fakeapi::FakeApiServer;

const NODE: &str = "node-a";

/// A running `svcproxy snapshot --watch` and the snapshots it printed.
struct Proxy {
    child: Child,
    lines: mpsc::Receiver<Value>,
    last: Option<Value>,
    /// Every snapshot received so far, in order.
    seen: Vec<Value>,
    _dir: tempfile::TempDir,
}

impl Proxy {
    fn start(server_url: &str, extra: &[&str]) -> Proxy {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(server_url)).unwrap();
        let mut child = svcproxy_testkit::process::die_with_test(&mut Command::new(env!(
            "CARGO_BIN_EXE_svcproxy"
        )))
        .args(["snapshot", "--watch", "--format", "json"])
        .args(["--hostname-override", NODE])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(extra)
        // A test's own --min-sync-period wins over this default.
        .args(if extra.contains(&"--min-sync-period") {
            &[][..]
        } else {
            &["--min-sync-period", "200ms"][..]
        })
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start svcproxy");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not one JSON document per line ({e}): {line}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Proxy {
            child,
            lines,
            last: None,
            seen: Vec::new(),
            _dir: dir,
        }
    }

    /// The next snapshot printed within `timeout`, if any.
    fn next(&mut self, timeout: Duration) -> Option<Value> {
        let v = self.lines.recv_timeout(timeout).ok()?;
        self.last = Some(v.clone());
        self.seen.push(v.clone());
        Some(v)
    }

    /// Waits (up to `timeout`) for a snapshot satisfying `pred`; returns it and when
    /// it arrived.
    fn wait_for(&mut self, timeout: Duration, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        if let Some(last) = &self.last {
            if pred(last) {
                return last.clone();
            }
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left) {
                Some(v) if pred(&v) => return v,
                Some(_) => {}
                None => panic!(
                    "no snapshot with {what} within {timeout:?}; last: {:#}",
                    self.last.clone().unwrap_or(Value::Null)
                ),
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn kubeconfig_yaml(server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {server}\n\
         users:\n- name: fake\n  user:\n    token: test\ncontexts:\n- name: fake\n  context:\n    \
         cluster: fake\n    user: fake\ncurrent-context: fake\n"
    )
}

fn service(name: &str, ip: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}
    })
}

fn slice(name: &str, svc: &str, ips: &[&str], labels: Value) -> Value {
    let mut labels = labels;
    labels["kubernetes.io/service-name"] = json!(svc);
    let endpoints: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": "node-b"}))
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints
    })
}

fn node(name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": "zone-1"}},
        "spec": {"podCIDRs": []},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]}
    })
}

/// Service name → cluster endpoints, of the IPv4 service ports in a snapshot.
fn services(snap: &Value) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = snap["servicePorts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["family"] == "IPv4")
        .map(|p| {
            let eps = p["clusterEndpoints"]
                .as_array()
                .map(|a| a.iter().map(|e| e.as_str().unwrap().to_string()).collect())
                .unwrap_or_default();
            (p["name"].as_str().unwrap().to_string(), eps)
        })
        .collect();
    out.sort();
    out
}

fn names(snap: &Value) -> Vec<String> {
    services(snap).into_iter().map(|(n, _)| n).collect()
}

fn has(snap: &Value, name: &str, eps: &[&str]) -> bool {
    let want: Vec<String> = eps.iter().map(|s| s.to_string()).collect();
    services(snap)
        .iter()
        .any(|(n, e)| n == &format!("default/{name}:http") && *e == want)
}

/// A small cluster: nodes a and b, services web (2 endpoints) and api (1).
fn seed(server: &FakeApiServer) {
    server.apply(node("node-a", "192.168.0.1"));
    server.apply(node("node-b", "192.168.0.2"));
    server.apply(service("web", "10.96.0.10", json!({})));
    server.apply(slice(
        "web-1",
        "web",
        &["10.244.2.5", "10.244.2.6"],
        json!({}),
    ));
    server.apply(service("api", "10.96.0.11", json!({})));
    server.apply(slice("api-1", "api", &["10.244.2.7"], json!({})));
}

const T: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_sync_waits_for_every_initial_list_even_across_pages() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply(node("node-a", "192.168.0.1"));
    // 1200 services and slices: three pages each at kube-rs' page size of 500.
    for i in 0..1200 {
        let ip = format!("10.96.{}.{}", 10 + i / 200, i % 200 + 1);
        let name = format!("svc-{i:04}");
        server.apply(service(&name, &ip, json!({})));
        let ep = format!("10.244.{}.{}", 2 + i / 200, i % 200 + 1);
        server.apply(slice(
            &format!("{name}-1"),
            &name,
            &[ep.as_str()],
            json!({}),
        ));
    }
    // EndpointSlices cannot be listed yet: nothing may be printed (or programmed).
    server.set_served("EndpointSlice", false);
    let mut proxy = Proxy::start(&server.url(), &["--min-sync-period", "0s"]);
    assert!(
        proxy.next(Duration::from_secs(3)).is_none(),
        "a snapshot was printed before the EndpointSlice list succeeded"
    );
    server.set_served("EndpointSlice", true);
    // kube-runtime's watcher retries a failed list with backoff (up to a few seconds).
    let first = proxy
        .next(Duration::from_secs(30))
        .expect("a first snapshot");
    let all = services(&first);
    assert_eq!(all.len(), 1200, "the first snapshot is partial");
    assert!(
        all.iter().all(|(_, eps)| eps.len() == 1),
        "a service in the first snapshot lacks its endpoints"
    );
    let lists: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api/v1/services" && r.query.contains("continue="))
        .collect();
    assert!(!lists.is_empty(), "the service list was not paginated");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_reach_the_snapshot_within_min_sync_period() {
    let server = FakeApiServer::start().await.unwrap();
    seed(&server);
    let mut proxy = Proxy::start(&server.url(), &["--min-sync-period", "1s"]);
    proxy.wait_for(T, "the seed", |s| {
        has(s, "web", &["10.244.2.5:8080", "10.244.2.6:8080"])
    });
    // min-sync-period plus a margin for the watch round trip and process start.
    let bound = Duration::from_millis(1000 + 1500);

    let start = Instant::now();
    server.apply(service("new", "10.96.0.12", json!({})));
    server.apply(slice("new-1", "new", &["10.244.2.8"], json!({})));
    proxy.wait_for(bound, "the created service", |s| {
        has(s, "new", &["10.244.2.8:8080"])
    });
    let created = start.elapsed();

    let start = Instant::now();
    server.apply(slice("new-1", "new", &["10.244.2.9"], json!({})));
    proxy.wait_for(bound, "the updated slice", |s| {
        has(s, "new", &["10.244.2.9:8080"])
    });
    let updated = start.elapsed();

    let start = Instant::now();
    server.delete("Service", Some("default"), "new");
    server.delete("EndpointSlice", Some("default"), "new-1");
    proxy.wait_for(bound, "the deletion", |s| {
        !names(s).contains(&"default/new:http".to_string())
    });
    let deleted = start.elapsed();
    eprintln!("create {created:?}, update {updated:?}, delete {deleted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headless_and_other_proxies_services_are_filtered_by_label() {
    let server = FakeApiServer::start().await.unwrap();
    seed(&server);
    let headless = json!({"service.kubernetes.io/headless": ""});
    server.apply(service("hl", "10.96.0.20", headless.clone()));
    server.apply(slice("hl-1", "hl", &["10.244.2.20"], headless));
    let ours = json!({"service.kubernetes.io/service-proxy-name": "svcproxy"});
    server.apply(service("mine", "10.96.0.21", ours.clone()));
    server.apply(slice("mine-1", "mine", &["10.244.2.21"], ours));
    let theirs = json!({"service.kubernetes.io/service-proxy-name": "other"});
    server.apply(service("theirs", "10.96.0.22", theirs.clone()));
    server.apply(slice("theirs-1", "theirs", &["10.244.2.22"], theirs));

    let mut default = Proxy::start(&server.url(), &[]);
    let snap = default.wait_for(T, "the seed", |s| has(s, "api", &["10.244.2.7:8080"]));
    assert_eq!(names(&snap), vec!["default/api:http", "default/web:http"]);

    let mut named = Proxy::start(&server.url(), &["--service-proxy-name", "svcproxy"]);
    let snap = named.wait_for(T, "its own service", |s| {
        has(s, "mine", &["10.244.2.21:8080"])
    });
    assert_eq!(names(&snap), vec!["default/mine:http"]);

    // The filtering happens on the server (svcproxy-core would also drop these
    // services, so the snapshots alone cannot tell): exactly these selectors were
    // sent, by each proxy, for Services and EndpointSlices alike.
    let want = [
        "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name",
        "!service.kubernetes.io/headless,service.kubernetes.io/service-proxy-name=svcproxy",
    ];
    for path in [
        "/api/v1/services",
        "/apis/discovery.k8s.io/v1/endpointslices",
    ] {
        let mut sent: Vec<String> = server
            .requests()
            .into_iter()
            .filter(|r| r.path == path)
            .map(|r| label_selector(&r.query).unwrap_or_else(|| format!("none in {}", r.query)))
            .collect();
        sent.sort();
        sent.dedup();
        assert_eq!(sent, want, "{path}");
    }
}

/// The decoded `labelSelector` of a query string.
fn label_selector(query: &str) -> Option<String> {
    let raw = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("labelSelector="))?;
    let bytes = raw.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_watches_converge_without_loss_or_duplicates() {
    let server = FakeApiServer::start().await.unwrap();
    seed(&server);
    let mut proxy = Proxy::start(&server.url(), &["--min-sync-period", "100ms"]);
    proxy.wait_for(T, "the seed", |s| has(s, "api", &["10.244.2.7:8080"]));
    for round in 0..5 {
        server.drop_watches();
        let name = format!("churn-{round}");
        server.apply(service(&name, &format!("10.96.1.{}", round + 1), json!({})));
        server.apply(slice(
            &format!("{name}-1"),
            &name,
            &[&format!("10.244.3.{}", round + 1)],
            json!({}),
        ));
        server.drop_watches();
        server.apply(slice(
            "web-1",
            "web",
            &[&format!("10.244.2.{}", 50 + round)],
            json!({}),
        ));
    }
    server.delete("Service", Some("default"), "api");
    let snap = proxy.wait_for(T, "every change", |s| {
        has(s, "web", &["10.244.2.54:8080"])
            && (0..5).all(|r| {
                has(
                    s,
                    &format!("churn-{r}"),
                    &[&format!("10.244.3.{}:8080", r + 1)],
                )
            })
            && !names(s).contains(&"default/api:http".to_string())
    });
    let all = names(&snap);
    let mut dedup = all.clone();
    dedup.dedup();
    assert_eq!(all, dedup, "duplicate service ports");
    assert_eq!(all.len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_resource_version_relists_and_removes_what_was_deleted_meanwhile() {
    let server = FakeApiServer::start().await.unwrap();
    seed(&server);
    let mut proxy = Proxy::start(&server.url(), &["--min-sync-period", "100ms"]);
    proxy.wait_for(T, "the seed", |s| has(s, "api", &["10.244.2.7:8080"]));
    let seen_before = proxy.seen.len();
    let lists_before = count_lists(&server);
    // While the watches are down, api goes away and the history is compacted: the
    // reconnecting watches get 410 Gone and must re-list.
    server.set_watches_refused(true);
    server.drop_watches();
    server.delete("Service", Some("default"), "api");
    server.delete("EndpointSlice", Some("default"), "api-1");
    server.compact();
    server.set_watches_refused(false);
    proxy.wait_for(T, "api gone", |s| {
        !names(s).contains(&"default/api:http".to_string())
    });
    assert!(
        count_lists(&server) > lists_before,
        "the deletion arrived without a re-list"
    );
    // Nothing flapped: every snapshot printed since kept web's endpoints, and api,
    // once gone, never came back.
    proxy.next(Duration::from_millis(500));
    let since = &proxy.seen[seen_before..];
    assert!(!since.is_empty());
    for snap in since {
        assert!(
            has(snap, "web", &["10.244.2.5:8080", "10.244.2.6:8080"]),
            "web flapped: {snap:#}"
        );
    }
    let gone_at = since
        .iter()
        .position(|s| !names(s).contains(&"default/api:http".to_string()))
        .unwrap();
    assert!(since[gone_at..]
        .iter()
        .all(|s| !names(s).contains(&"default/api:http".to_string())));
}

fn count_lists(server: &FakeApiServer) -> usize {
    server
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api/v1/services" && !r.query.contains("watch"))
        .count()
}

/// A loopback address whose port is free, and below the kernel's ephemeral range
/// (`ip_local_port_range`): a test stops and restarts its fake API server on it,
/// and a port from that range (what binding port 0 gives) can meanwhile become the
/// local port of any outgoing connection on the machine (CI runs other tests beside
/// this one); the restart then failed with "address in use" once. Ports are taken
/// in turn from a start that differs per process.
fn free_port() -> SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static TAKEN: AtomicU32 = AtomicU32::new(0);
    let low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let (first, span) = (10_000u32, low.saturating_sub(10_000).max(1));
    loop {
        let n = TAKEN.fetch_add(1, Ordering::Relaxed);
        assert!(n < span, "no free port below {low}");
        let port = first + (std::process::id().wrapping_mul(7919) + n) % span;
        let addr = SocketAddr::from(([127, 0, 0, 1], u16::try_from(port).unwrap()));
        if TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
}

async fn healthz(addr: SocketAddr) -> Option<u16> {
    let r = reqwest::get(format!("http://{addr}/healthz")).await.ok()?;
    Some(r.status().as_u16())
}

/// `/healthz` once the sync that printed a snapshot has finished: the snapshot is
/// printed inside the sync and health is recorded after it, so a read between the
/// two sees the updates still pending, and 503 when they have waited longer than
/// the health timeout (a first list slower than two sync periods on a loaded
/// machine: CI saw it once). Asks for up to 5 s; the last answer.
async fn healthz_after_sync(addr: SocketAddr) -> Option<u16> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let code = healthz(addr).await;
        if code == Some(200) || Instant::now() >= deadline {
            return code;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_at_start_up_is_retried_and_healthz_turns_ready_when_it_returns() {
    let api = free_port();
    let health = free_port();
    let metrics = free_port();
    let health_arg = health.to_string();
    let metrics_arg = metrics.to_string();
    let mut proxy = Proxy::start(
        &format!("http://{api}"),
        &[
            "--healthz-bind-address",
            &health_arg,
            "--metrics-bind-address",
            &metrics_arg,
        ],
    );
    // Not ready while nothing could be listed.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut answered = 0;
    while Instant::now() < deadline && answered < 5 {
        if let Some(code) = healthz(health).await {
            assert_eq!(
                code, 503,
                "/healthz must not be ready before the first sync"
            );
            answered += 1;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(answered, 5, "the health server did not answer");
    assert!(proxy.next(Duration::from_millis(100)).is_none());

    let server = FakeApiServer::start_on(api).await.unwrap();
    seed(&server);
    proxy.wait_for(Duration::from_secs(60), "the seed", |s| {
        has(s, "web", &["10.244.2.5:8080", "10.244.2.6:8080"])
    });
    assert_eq!(healthz_after_sync(health).await, Some(200));

    // client-go's REST client metrics saw both: the refused connections and the lists.
    let text = reqwest::get(format!("http://{metrics}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let count = |code: &str| -> f64 {
        let prefix =
            format!("rest_client_requests_total{{code=\"{code}\",host=\"{api}\",method=\"GET\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    assert!(count("<error>") >= 1.0 && count("200") >= 4.0, "{text}");
    assert!(
        text.contains(&format!(
            "rest_client_request_duration_seconds_count{{host=\"{api}\",verb=\"GET\"}}"
        )),
        "{text}"
    );
}

/// Issue 15's fault: the API server gone for a while (20 s here; set
/// `SVCPROXY_API_OUTAGE_SECS` for minutes) changes nothing the proxy programs, and
/// `/healthz` stays 200 throughout (no update is waiting: the last known state is
/// the best one); when the server answers again (restarted, its store kept as etcd
/// keeps it: resource versions go on from where they were), with changes made
/// meanwhile, the proxy converges to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_gone_for_a_while_changes_nothing_and_its_return_is_followed() {
    let outage = Duration::from_secs(
        std::env::var("SVCPROXY_API_OUTAGE_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20),
    );
    let api = free_port();
    let health = free_port();
    let health_arg = health.to_string();
    let server = FakeApiServer::start_on(api).await.unwrap();
    seed(&server);
    let mut proxy = Proxy::start(
        &format!("http://{api}"),
        &["--healthz-bind-address", &health_arg, "--sync-period", "2s"],
    );
    proxy.wait_for(Duration::from_secs(60), "the seed", |s| {
        has(s, "web", &["10.244.2.5:8080", "10.244.2.6:8080"])
    });
    assert_eq!(healthz_after_sync(health).await, Some(200));

    let last_version = server.resource_version();
    server.shutdown().await;
    let gone = Instant::now();
    while gone.elapsed() < outage {
        assert_eq!(
            healthz(health).await,
            Some(200),
            "/healthz after {:?} without an API server",
            gone.elapsed()
        );
        if let Some(changed) = proxy.next(Duration::from_millis(500)) {
            panic!(
                "the snapshot changed {:?} into the outage: {changed}",
                gone.elapsed()
            );
        }
    }

    // Back (the fake's new store first catches up with the old one: the same objects,
    // and resource versions past the old ones), then what changed meanwhile arrives:
    // web moved, api deleted.
    let server = FakeApiServer::start_on(api).await.unwrap();
    while server.resource_version() <= last_version {
        server.apply(node("node-x", "192.168.0.99"));
        server.delete("Node", None, "node-x");
    }
    seed(&server);
    server.apply(slice("web-1", "web", &["10.244.2.9"], json!({})));
    server.delete("Service", Some("default"), "api");
    server.delete("EndpointSlice", Some("default"), "api-1");
    let back = Instant::now();
    let snap = proxy.wait_for(Duration::from_secs(60), "the state after the outage", |s| {
        has(s, "web", &["10.244.2.9:8080"])
            && !services(s)
                .iter()
                .any(|(n, _)| n.starts_with("default/api"))
    });
    eprintln!(
        "[api] {outage:?} outage: followed the returned server in {:?}: {snap}",
        back.elapsed()
    );
    assert_eq!(healthz_after_sync(health).await, Some(200));
    drop(server);
}

/// An API server whose etcd was restored from an older backup answers with resource
/// versions below those the watches resume from ("Too large resource version"):
/// kube-rs' watcher would ask again from the same version forever, a silent stall
/// with `/healthz` at 200. The watches start over from a fresh list instead (as
/// client-go's reflector does), and the restored state, older objects back and newer
/// ones gone, is followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_restored_from_an_older_backup_is_listed_afresh() {
    let api = free_port();
    let server = FakeApiServer::start_on(api).await.unwrap();
    seed(&server);
    // Changes the backup will not have.
    server.apply(service("new", "10.96.0.12", json!({})));
    server.apply(slice("new-1", "new", &["10.244.2.8"], json!({})));
    for _ in 0..20 {
        server.apply(node("node-x", "192.168.0.99"));
        server.delete("Node", None, "node-x");
    }
    let mut proxy = Proxy::start(&format!("http://{api}"), &[]);
    proxy.wait_for(
        Duration::from_secs(60),
        "the seed and the new service",
        |s| {
            has(s, "web", &["10.244.2.5:8080", "10.244.2.6:8080"])
                && has(s, "new", &["10.244.2.8:8080"])
        },
    );
    let last_version = server.resource_version();
    server.shutdown().await;

    // The restored server: the seed only, with web's endpoints as they were then
    // changed once, at resource versions well below what the watches hold.
    let restored = FakeApiServer::start_on(api).await.unwrap();
    seed(&restored);
    restored.apply(slice("web-1", "web", &["10.244.2.9"], json!({})));
    assert!(restored.resource_version() < last_version);
    let back = Instant::now();
    let snap = proxy.wait_for(Duration::from_secs(60), "the restored state", |s| {
        has(s, "web", &["10.244.2.9:8080"])
            && !names(s).iter().any(|n| n.starts_with("default/new"))
    });
    eprintln!(
        "[api] restored from a backup: followed in {:?}: {snap}",
        back.elapsed()
    );
    // Later changes are watched again.
    restored.apply(slice("api-1", "api", &["10.244.2.10"], json!({})));
    proxy.wait_for(Duration::from_secs(30), "a change after the re-list", |s| {
        has(s, "api", &["10.244.2.10:8080"])
    });
    drop(restored);
}
