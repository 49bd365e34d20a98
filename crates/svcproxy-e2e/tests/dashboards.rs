//! The dashboards and alerts operators already have for kube-proxy work on svcproxy
//! unchanged: a real Prometheus (Debian's `prometheus`) scrapes svcproxy as the job
//! `kube-proxy`, while svcproxy runs in nftables mode against a fake API server whose
//! endpoints churn, all inside a network namespace of the test's own. Every query of
//! kubernetes-mixin's "Kubernetes / Proxy" dashboard and of its kube-proxy alerts is
//! then asked of that Prometheus, and each must return series (the alerts: none, as
//! svcproxy is up), except the ones svcproxy cannot answer, which must be the ones
//! docs/operations.md names with the reason.
//!
//! The queries are the mixin's (kubernetes-monitoring/kubernetes-mixin,
//! `dashboards/proxy.libsonnet` and `alerts/kube_proxy.libsonnet`, release 1.5.6) with
//! its default selectors (`job="kube-proxy"`, a single cluster), Grafana's variables
//! given the values a single-cluster install has: `$cluster` empty (no cluster label),
//! `$instance` all, `$__rate_interval` 15s (four scrapes at this test's 1s interval).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use svcproxy_testkit::netns::Netns;

/// The dashboard's panels: (panel title, query).
const DASHBOARD: &[(&str, &str)] = &[
    ("Up", r#"sum(up{cluster="$cluster", job="kube-proxy"})"#),
    (
        "Rules Sync Rate",
        r#"sum(rate(kubeproxy_sync_proxy_rules_duration_seconds_count{cluster="$cluster", job="kube-proxy", instance=~"$instance"}[$__rate_interval]))"#,
    ),
    (
        "Rules Sync Latency 99th Quantile",
        r#"histogram_quantile(0.99,rate(kubeproxy_sync_proxy_rules_duration_seconds_bucket{cluster="$cluster", job="kube-proxy", instance=~"$instance"}[$__rate_interval]))"#,
    ),
    (
        "Network Programming Rate",
        r#"sum(rate(kubeproxy_network_programming_duration_seconds_count{cluster="$cluster", job="kube-proxy", instance=~"$instance"}[$__rate_interval]))"#,
    ),
    (
        "Network Programming Latency 99th Quantile",
        r#"histogram_quantile(0.99, sum(rate(kubeproxy_network_programming_duration_seconds_bucket{cluster="$cluster", job="kube-proxy", instance=~"$instance"}[$__rate_interval])) by (instance, le))"#,
    ),
    (
        "Kube API Request Rate (2xx)",
        r#"sum(rate(rest_client_requests_total{cluster="$cluster",job="kube-proxy", instance=~"$instance",code=~"2.."}[$__rate_interval]))"#,
    ),
    (
        "Post Request Latency 99th Quantile",
        r#"histogram_quantile(0.99, sum(rate(rest_client_request_duration_seconds_bucket{cluster="$cluster", job="kube-proxy",instance=~"$instance",verb="POST"}[$__rate_interval])) by (verb, le))"#,
    ),
    (
        "Get Request Latency 99th Quantile",
        r#"histogram_quantile(0.99, sum(rate(rest_client_request_duration_seconds_bucket{cluster="$cluster", job="kube-proxy", instance=~"$instance", verb="GET"}[$__rate_interval])) by (verb, le))"#,
    ),
    (
        "Memory",
        r#"process_resident_memory_bytes{cluster="$cluster", job="kube-proxy",instance=~"$instance"}"#,
    ),
    (
        "CPU usage",
        r#"rate(process_cpu_seconds_total{cluster="$cluster", job="kube-proxy",instance=~"$instance"}[$__rate_interval])"#,
    ),
    (
        "Goroutines",
        r#"go_goroutines{cluster="$cluster", job="kube-proxy",instance=~"$instance"}"#,
    ),
];

/// The dashboard's template variables' queries (as `label_values(...)` becomes a
/// series query).
const VARIABLES: &[(&str, &str)] = &[(
    "instance",
    r#"up{job="kube-proxy", cluster="$cluster", job="kube-proxy"}"#,
)];

/// The mixin's kube-proxy alerts: (alert, expression). Both must be silent while
/// svcproxy is scraped.
const ALERTS: &[(&str, &str)] = &[
    ("KubeProxyDown", r#"absent(up{job="kube-proxy"})"#),
    (
        "KubeProxyInstanceUnreachable",
        r#"up{job="kube-proxy"} == 0"#,
    ),
];

/// Panels svcproxy cannot fill, each named with its reason in docs/operations.md.
const CANNOT: &[&str] = &["Goroutines"];

fn substitute(query: &str) -> String {
    query
        .replace("$cluster", "")
        .replace("$instance", ".+")
        .replace("$__rate_interval", "15s")
}

/// A child process killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(ns: &Netns, what: &'static str, argv: &[&str], dir: &Path) -> Running {
    let log = std::fs::File::create(dir.join(format!("{what}.log"))).unwrap();
    let child = ns
        .command(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    Running(child)
}

/// Asks the test's Prometheus; the result's lines (empty: no series).
fn query(ns: &Netns, expr: &str) -> Vec<String> {
    let out = svcproxy_testkit::netns::run(
        &mut ns.command(&[
            "promtool",
            "query",
            "instant",
            "http://127.0.0.1:9090",
            expr,
        ]),
        None,
        Duration::from_secs(20),
    )
    .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool query {expr}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn kube_proxy_dashboards_and_alerts_see_svcproxy() {
    let test = "kube_proxy_dashboards_and_alerts_see_svcproxy";
    let Some(ns) = Netns::create(test, "dash", &["prometheus", "promtool", "nft"]) else {
        return;
    };
    ns.run_ok(&["ip", "link", "set", "lo", "up"], None)
        .expect("loopback up");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let fakeapi = svcproxy_e2e::bins::fakeapi_bin().expect("the fake API server's binary");
    let mut api = start(
        &ns,
        "fakeapi",
        &[
            fakeapi.to_str().unwrap(),
            "--listen=127.0.0.1:16443",
            "--kubeconfig-out",
            kubeconfig.to_str().unwrap(),
            "--services=300",
            "--endpoints-per-service=3",
            "--nodes=2",
            "--churn=10",
        ],
        dir.path(),
    );
    let ready = BufReader::new(api.0.stdout.take().unwrap())
        .lines()
        .next()
        .and_then(Result::ok);
    assert_eq!(
        ready.as_deref(),
        Some("ready"),
        "the fake API server did not start"
    );
    let bin = svcproxy_e2e::bins::svcproxy_bin();
    let _proxy = start(
        &ns,
        "svcproxy",
        &[
            bin.to_str().unwrap(),
            "--proxy-mode=nftables",
            "--hostname-override=node-1",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--metrics-bind-address=127.0.0.1:10249",
            "--healthz-bind-address=127.0.0.1:10256",
            "--min-sync-period=200ms",
        ],
        dir.path(),
    );
    // The alerting rules deploy/monitoring ships (kube-proxy's and svcproxy's own),
    // as the Prometheus Operator hands them to Prometheus: the PrometheusRule's spec.
    let rule: yaml_serde::Value = yaml_serde::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../deploy/monitoring/prometheusrule.yaml"),
        )
        .unwrap(),
    )
    .unwrap();
    let rules = dir.path().join("rules.yml");
    std::fs::write(&rules, yaml_serde::to_string(&rule["spec"]).unwrap()).unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: ['{}']\n\
             scrape_configs:\n- job_name: kube-proxy\n  static_configs:\n  \
             - targets: ['127.0.0.1:10249']\n\
             - job_name: prometheus\n  static_configs:\n  - targets: ['127.0.0.1:9090']\n",
            rules.display()
        ),
    )
    .unwrap();
    let data = dir.path().join("data");
    let _prometheus = start(
        &ns,
        "prometheus",
        &[
            "prometheus",
            &format!("--config.file={}", config.display()),
            &format!("--storage.tsdb.path={}", data.display()),
            "--web.listen-address=127.0.0.1:9090",
        ],
        dir.path(),
    );
    // Prometheus answers once it has loaded its configuration and storage.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = svcproxy_testkit::netns::run(
            &mut ns.command(&[
                "promtool",
                "query",
                "instant",
                "http://127.0.0.1:9090",
                "up",
            ]),
            None,
            Duration::from_secs(20),
        )
        .expect("run promtool");
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus does not answer: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Endpoints change from now on: network programming latency has something to
    // measure.
    let pid = api.0.id().to_string();
    svcproxy_testkit::netns::run_ok(
        std::process::Command::new("kill").args(["-USR1", &pid]),
        None,
    )
    .expect("start the churn");

    // Until every panel that can have series has them (or the deadline).
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut empty: Vec<&str>;
    loop {
        empty = DASHBOARD
            .iter()
            .filter(|(title, _)| !CANNOT.contains(title))
            .filter(|(_, q)| query(&ns, &substitute(q)).is_empty())
            .map(|(title, _)| *title)
            .collect();
        if empty.is_empty() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    let logs = |what: &str| {
        std::fs::read_to_string(dir.path().join(format!("{what}.log"))).unwrap_or_default()
    };
    assert!(
        empty.is_empty(),
        "panels without series: {empty:?}\nsvcproxy:\n{}\nprometheus:\n{}",
        logs("svcproxy"),
        logs("prometheus")
    );
    for (var, q) in VARIABLES {
        assert!(
            !query(&ns, &substitute(q)).is_empty(),
            "the dashboard's ${var} has no values"
        );
    }
    for (alert, expr) in ALERTS {
        let firing = query(&ns, expr);
        assert!(firing.is_empty(), "{alert} would fire: {firing:?}");
    }
    // deploy/monitoring's rules loaded (Prometheus's own metrics, scraped as the job
    // "prometheus", count them) and evaluated: none pending or firing while svcproxy
    // syncs.
    let alerts = query(&ns, "ALERTS");
    assert!(alerts.is_empty(), "alerts while svcproxy works: {alerts:?}");
    let evaluated = query(&ns, "prometheus_rule_group_rules");
    assert!(
        evaluated.iter().any(|l| l.contains("svcproxy")),
        "deploy/monitoring's rule groups are not loaded: {evaluated:?}"
    );
    // Each family's sync figures are its own: the generated services are IPv4
    // only, so IPv4's syncs took longer in all than IPv6's.
    let sums = query(
        &ns,
        r#"kubeproxy_sync_proxy_rules_duration_seconds_sum{job="kube-proxy"}"#,
    );
    let sum_of = |family: &str| {
        sums.iter()
            .find(|l| l.contains(&format!("ip_family=\"{family}\"")))
            .and_then(|l| l.split("=> ").nth(1))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    let (v4, v6) = (sum_of("IPv4"), sum_of("IPv6"));
    assert!(
        matches!((v4, v6), (Some(a), Some(b)) if a > b),
        "per-family sync time: IPv4 {v4:?}, IPv6 {v6:?} (want IPv4's larger):\n{sums:#?}"
    );
    // What cannot be filled is empty, and said so where operators look.
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md"),
    )
    .unwrap();
    for title in CANNOT {
        let (_, q) = DASHBOARD.iter().find(|(t, _)| t == title).unwrap();
        assert!(
            query(&ns, &substitute(q)).is_empty(),
            "{title} has series now: take it off CANNOT and the docs"
        );
        assert!(
            doc.contains(&format!("\"{title}\"")),
            "docs/operations.md does not say why \"{title}\" stays empty"
        );
    }
    // Taken away, svcproxy is missed: the alert's expression answers.
    drop(_proxy);
    let deadline = Instant::now() + Duration::from_secs(30);
    while query(&ns, r#"up{job="kube-proxy"} == 0"#).is_empty() {
        assert!(
            Instant::now() < deadline,
            "up stays 1 after svcproxy stopped"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}
