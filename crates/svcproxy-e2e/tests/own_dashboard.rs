//! svcproxy's own dashboard (`deploy/monitoring/svcproxy-dashboard.json`) and its own
//! alerts (`deploy/monitoring/prometheusrule.yaml`) against a real Prometheus: every
//! query of every panel, and of the `$instance` variable, must return series.
//!
//! The cluster is the data-plane harness's (two nodes, pods, an external client),
//! svcproxy in ebpf mode with the XDP fast path and the cluster DNS on, so that each
//! family of series the dashboard reads exists: sync steps and start-up, the BPF
//! maps, the masquerade and XDP counters, the DNS server's. A Prometheus in node-a's
//! namespace scrapes node-a's svcproxy as the job `kube-proxy` every second, with
//! deploy/monitoring's rules loaded. Traffic goes through (NodePort connections from
//! outside, DNS queries from a pod), then node-a's svcproxy hands over to a standby,
//! so the hand-over panels show the new owner's figures. Grafana's variables get the
//! values a single-cluster install has: `$instance` all, `$__rate_interval` 15s (15
//! scrapes at this test's interval).
//!
//! Needs root (skips otherwise, fails in CI), the ebpf mode's kernel features (as
//! every ebpf test of the harness), and Debian's `prometheus` (with `promtool`), as
//! `tests/dashboards.rs`.

// Shared with the other end-to-end test binaries; each uses only part of it.
#[allow(dead_code)]
#[path = "dataplane/support.rs"]
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::*;
use svcproxy_e2e::plan::{self, Family};
use svcproxy_e2e::{Host, Proto, NODE_A};

const NODE_PORT: u16 = 30080;
const DNS_PORT: u16 = 5353;
const METRICS: &str = "127.0.0.1:10249";
const PROMETHEUS: &str = "http://127.0.0.1:9090";

fn repo_file(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every query of the dashboard: (panel title, expression), the variables' too.
fn dashboard_queries() -> Vec<(String, String)> {
    let dash: serde_json::Value =
        serde_json::from_str(&repo_file("deploy/monitoring/svcproxy-dashboard.json"))
            .expect("the dashboard is JSON");
    let mut out = Vec::new();
    for panel in dash["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("?").to_string();
            let expr = target["expr"]
                .as_str()
                .expect("a target's expr")
                .to_string();
            out.push((title, expr));
        }
    }
    for var in dash["templating"]["list"].as_array().expect("variables") {
        if let Some(q) = var["query"]["query"].as_str() {
            // label_values(SERIES, LABEL): asked as SERIES.
            let series = q
                .strip_prefix("label_values(")
                .and_then(|r| r.rsplit_once(','))
                .map(|(s, _)| s.to_string())
                .unwrap_or_else(|| q.to_string());
            out.push((format!("${}", var["name"].as_str().unwrap_or("?")), series));
        }
    }
    out
}

fn substitute(query: &str) -> String {
    query
        .replace("$instance", ".+")
        .replace("$__rate_interval", "15s")
}

/// Asks node-a's Prometheus; the result's lines (empty: no series). `None` while it
/// does not answer.
fn query(env: &Env, expr: &str) -> Option<Vec<String>> {
    let out = env.c.exec(
        Host::Node(NODE_A),
        &["promtool", "query", "instant", PROMETHEUS, expr],
    );
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    })
}

fn prometheus_config(dir: &Path) -> std::path::PathBuf {
    // The alerting rules as the Prometheus Operator hands them over: the spec.
    let rule: yaml_serde::Value =
        yaml_serde::from_str(&repo_file("deploy/monitoring/prometheusrule.yaml")).unwrap();
    let rules = dir.join("rules.yml");
    std::fs::write(&rules, yaml_serde::to_string(&rule["spec"]).unwrap()).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: ['{}']\n\
             scrape_configs:\n- job_name: kube-proxy\n  static_configs:\n  \
             - targets: ['{METRICS}']\n\
             - job_name: prometheus\n  static_configs:\n  - targets: ['127.0.0.1:9090']\n",
            rules.display()
        ),
    )
    .unwrap();
    config
}

#[test]
fn svcproxy_s_own_dashboard_fills_and_its_alerts_stay_quiet() {
    let test = "svcproxy_s_own_dashboard_fills_and_its_alerts_stay_quiet";
    if !svcproxy_testkit::netns::can_run(test, &["prometheus", "promtool", "ethtool"]) {
        return;
    }
    let web = Svc::new("web", &[plan::cluster_ip(80, Family::V4)])
        .port(SvcPort::new("http", Proto::Tcp, 80, BACKEND_PORT).node_port(NODE_PORT))
        .node_port();
    let file = svc_file(
        &web,
        &[Slice::of(
            &web,
            Family::V4,
            &[Host::Pod(0, 0), Host::Pod(1, 0)],
        )],
    );
    let flags: Vec<String> = [
        "--ebpf-xdp=native",
        "--dns-bind-address=0.0.0.0:5353",
        "--dns-upstream=none",
    ]
    .map(String::from)
    .to_vec();
    let spec = EnvSpec {
        flags: flags.clone(),
        ..EnvSpec::default()
    };
    let Some(mut env) = Env::start(Mode::Ebpf, spec, &[("svc-web.yaml", file)]) else {
        return;
    };
    let mut ck = Checks::new("svcproxy's dashboard");
    let dir = tempfile::tempdir().unwrap();
    let config = prometheus_config(dir.path());
    let data = dir.path().join("data");
    let prometheus = env
        .c
        .spawn(
            Host::Node(NODE_A),
            "prometheus",
            &[
                "prometheus",
                &format!("--config.file={}", config.display()),
                &format!("--storage.tsdb.path={}", data.display()),
                "--web.listen-address=127.0.0.1:9090",
            ],
        )
        .expect("start Prometheus");
    let deadline = Instant::now() + Duration::from_secs(60);
    while query(&env, "up").is_none() {
        assert!(
            Instant::now() < deadline,
            "Prometheus does not answer:\n{}",
            prometheus.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // Traffic: connections from outside to the NodePort on node-a (through its XDP
    // program), DNS queries from a pod to node-a's server, over UDP and TCP.
    let node_port = sa(plan::node_ip(NODE_A, Family::V4), NODE_PORT);
    let answered = env
        .probe(Host::Ext, Proto::Tcp, node_port, 6, ANSWER)
        .iter()
        .filter(|a| a.backend().is_some())
        .count();
    let echo = svcproxy_e2e::bins::echo_bin().expect("svcproxy-echo");
    let server = sa(plan::node_ip(NODE_A, Family::V4), DNS_PORT).to_string();
    for tcp in [false, false, true] {
        let mut argv = vec![
            echo.to_str().unwrap(),
            "dns",
            "--server",
            &server,
            "--name",
            "web.default.svc.cluster.local.",
        ];
        if tcp {
            argv.push("--tcp");
        }
        env.c.exec(Host::Pod(0, 1), &argv);
    }

    // The hand-over: a standby on node-a, then the owner stopped.
    let bin = svcproxy_e2e::bins::svcproxy_bin();
    let standby = env.spawn_svcproxy(&bin, NODE_A, &flags);
    ck.check(
        wait_log(&standby, "waiting as a warm standby", SYNC_DEADLINE),
        || format!("no standby:\n{}", standby.logs()),
    );
    // A standby for a while: its figure says how long.
    std::thread::sleep(Duration::from_secs(2));
    let owner = env.proxies.remove(env.proxy_index(NODE_A));
    let status = owner.terminate(Duration::from_secs(30));
    ck.check(status.is_some_and(|s| s.success()), || {
        format!("the owner at SIGTERM: {status:?}\n{}", owner.logs())
    });
    ck.check(wait_log(&standby, "took over", SYNC_DEADLINE), || {
        format!("the standby never took over:\n{}", standby.logs())
    });
    env.proxies.push(standby);

    // Until every query has series (or the deadline).
    // The eviction counter is a tracing program: on a kernel without them its
    // series is absent, and svcproxy's log says so (the panel says so too).
    let counted = tracing_programs();
    let queries: Vec<(String, String)> = dashboard_queries()
        .into_iter()
        .filter(|(_, q)| counted || !q.contains("svcproxy_ebpf_map_evictions_total"))
        .collect();
    if !counted {
        ck.check(
            env.proxy_logs()
                .contains("the LRU maps' evictions are not counted"),
            || "no tracing programs here, and the log does not say evictions go uncounted".into(),
        );
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    let empty = loop {
        let empty: Vec<&(String, String)> = queries
            .iter()
            .filter(|(_, q)| query(&env, &substitute(q)).unwrap_or_default().is_empty())
            .collect();
        if empty.is_empty() || Instant::now() > deadline {
            break empty;
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    ck.check(empty.is_empty(), || {
        format!(
            "queries without series: {empty:#?}\nsvcproxy:\n{}",
            env.proxy_logs()
        )
    });
    // The figures are the new owner's: it was handed the node, after waiting.
    let handed = query(&env, r#"svcproxy_ownership{how="handed_over"} == 1"#).unwrap_or_default();
    ck.check(!handed.is_empty(), || {
        format!(
            "the new owner does not say it was handed over: {:?}",
            query(&env, "svcproxy_ownership")
        )
    });
    let standby_secs = query(
        &env,
        r#"svcproxy_ownership_duration_seconds{phase="standby"} >= 1.5"#,
    )
    .unwrap_or_default();
    ck.check(!standby_secs.is_empty(), || {
        format!(
            "the new owner's standby time is well under the 2 s it waited: {:?}",
            query(&env, "svcproxy_ownership_duration_seconds")
        )
    });
    // deploy/monitoring's rules loaded, and svcproxy's own quiet while it works.
    let groups = query(&env, "prometheus_rule_group_rules").unwrap_or_default();
    ck.check(groups.iter().any(|l| l.contains("svcproxy")), || {
        format!("deploy/monitoring's rule groups are not loaded: {groups:?}")
    });
    let own_alerts = query(&env, r#"ALERTS{alertname=~"Svcproxy.*"}"#).unwrap_or_default();
    ck.check(own_alerts.is_empty(), || {
        format!("svcproxy's alerts while it works: {own_alerts:?}")
    });
    let firing = query(&env, r#"ALERTS{alertstate="firing"}"#).unwrap_or_default();
    ck.check(firing.is_empty(), || format!("alerts firing: {firing:?}"));
    eprintln!(
        "[own dashboard] {} queries with series; {answered}/6 NodePort connections answered \
         through XDP",
        queries.len()
    );
    ck.finish(&env);
}
