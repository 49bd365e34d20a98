//! `svcproxy snapshot` on the bundled example cluster, through the real binary: the
//! JSON contract, and two nodes with different labels choosing different endpoints.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster")
}

fn snapshot(node: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_svcproxy"))
        .args(["snapshot", "--format", "json", "--hostname-override", node])
        .arg("--manifests")
        .arg(examples())
        .output()
        .expect("run svcproxy");
    assert!(
        out.status.success(),
        "svcproxy snapshot failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

fn port<'a>(snap: &'a Value, name: &str, proto: &str, family: &str) -> &'a Value {
    snap["servicePorts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name && p["protocol"] == proto && p["family"] == family)
        .unwrap_or_else(|| panic!("no {name} {proto} {family} in {snap:#}"))
}

fn eps(v: &Value) -> Option<Vec<String>> {
    v.as_array()
        .map(|a| a.iter().map(|e| e.as_str().unwrap().to_string()).collect())
}

fn list(items: &[&str]) -> Option<Vec<String>> {
    Some(items.iter().map(|s| s.to_string()).collect())
}

#[test]
fn the_example_snapshot_follows_the_json_contract() {
    let snap = snapshot("node-a");
    assert_eq!(snap["node"], "node-a");
    assert_eq!(
        snap["problems"],
        serde_json::json!([]),
        "the example is clean"
    );
    let web = port(&snap, "demo/web:http", "TCP", "IPv4");
    for field in [
        "clusterIPs",
        "port",
        "nodePort",
        "externalIPs",
        "loadBalancerIPs",
        "externalTrafficPolicy",
        "internalTrafficPolicy",
        "clusterEndpoints",
        "localEndpoints",
        "hasAnyEndpoints",
        "reason",
    ] {
        assert!(web.get(field).is_some(), "{field} missing from {web:#}");
    }
    assert_eq!(web["clusterIPs"], serde_json::json!(["198.19.0.10"]));
    assert_eq!(web["port"], 80);
    assert_eq!(web["nodePort"], 30080);
    assert_eq!(
        eps(&web["clusterEndpoints"]),
        list(&[
            "198.18.17.10:8080",
            "198.18.18.10:8080",
            "198.18.19.10:8080"
        ])
    );
    assert_eq!(web["localEndpoints"], Value::Null);
    // Sorted by name, protocol, family.
    let keys: Vec<(String, String, String)> = snap["servicePorts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().into(),
                p["protocol"].as_str().unwrap().into(),
                p["family"].as_str().unwrap().into(),
            )
        })
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
}

#[test]
fn two_nodes_with_different_labels_get_different_endpoints() {
    let a = snapshot("node-a");
    let c = snapshot("node-c");
    let cluster =
        |s: &Value, name: &str, proto: &str| eps(&port(s, name, proto, "IPv4")["clusterEndpoints"]);
    // Hard same-node key: node-c has no logger, so it rejects (endpoints exist elsewhere).
    assert_eq!(
        cluster(&a, "demo/logger:syslog", "UDP"),
        list(&["198.18.17.20:5514"])
    );
    assert_eq!(cluster(&c, "demo/logger:syslog", "UDP"), list(&[]));
    assert_eq!(
        port(&c, "demo/logger:syslog", "UDP", "IPv4")["hasAnyEndpoints"],
        true
    );
    // Same node, else zone, else anywhere.
    assert_eq!(
        cluster(&a, "demo/cache:redis", "TCP"),
        list(&["198.18.18.21:6379", "198.18.18.22:6379"])
    );
    assert_eq!(
        cluster(&c, "demo/cache:redis", "TCP"),
        list(&["198.18.18.21:6379", "198.18.18.22:6379"])
    );
    assert!(port(&a, "demo/cache:redis", "TCP", "IPv4")["reason"]
        .as_str()
        .unwrap()
        .contains("topology key topology.kubernetes.io/zone"));
    assert!(port(&c, "demo/cache:redis", "TCP", "IPv4")["reason"]
        .as_str()
        .unwrap()
        .contains("topology key *"));
    // Zone hints.
    assert_eq!(
        cluster(&a, "demo/zonal:grpc", "TCP"),
        list(&["198.18.17.30:9000"])
    );
    assert_eq!(
        cluster(&c, "demo/zonal:grpc", "TCP"),
        list(&["198.18.19.30:9000"])
    );
    // externalTrafficPolicy Local: node-c has no local endpoint, node-a has one.
    let api_a = port(&a, "demo/api:https", "TCP", "IPv4");
    let api_c = port(&c, "demo/api:https", "TCP", "IPv4");
    assert_eq!(eps(&api_a["localEndpoints"]), list(&["198.18.17.40:8443"]));
    assert_eq!(eps(&api_c["localEndpoints"]), list(&[]));
    assert_eq!(api_c["hasAnyEndpoints"], true, "DROP, not REJECT");
    assert_eq!(
        api_a["loadBalancerIPs"],
        serde_json::json!(["198.18.100.10"])
    );
    // A terminating local endpoint is node-b's fallback.
    let b = snapshot("node-b");
    assert_eq!(
        eps(&port(&b, "demo/api:https", "TCP", "IPv4")["localEndpoints"]),
        list(&["198.18.18.40:8443"])
    );
    // internalTrafficPolicy Local: no cluster-policy traffic at all.
    let m_a = port(&a, "demo/node-metrics:metrics", "TCP", "IPv4");
    assert_eq!(m_a["clusterEndpoints"], Value::Null);
    assert_eq!(eps(&m_a["localEndpoints"]), list(&["198.18.17.50:9100"]));
    assert_eq!(
        eps(&port(&c, "demo/node-metrics:metrics", "TCP", "IPv4")["localEndpoints"]),
        list(&["198.18.19.50:9100"])
    );
}

#[test]
fn dual_stack_named_ports_and_legacy_endpoints() {
    let a = snapshot("node-a");
    let v4 = port(&a, "demo/dns:dns", "UDP", "IPv4");
    assert_eq!(
        eps(&v4["clusterEndpoints"]),
        list(&["198.18.17.53:5353", "198.18.18.53:53"]),
        "each backend keeps its own named target port"
    );
    let v6 = port(&a, "demo/dns:dns", "UDP", "IPv6");
    assert_eq!(v6["clusterIPs"], serde_json::json!(["2001:db8:ffff::53"]));
    assert_eq!(eps(&v6["clusterEndpoints"]), list(&[]));
    assert_eq!(v6["hasAnyEndpoints"], false, "IPv6 rejects on its own");
    let legacy = port(&a, "demo/legacy", "TCP", "IPv4");
    assert_eq!(
        eps(&legacy["clusterEndpoints"]),
        list(&["198.18.19.60:8000"])
    );
    assert_eq!(legacy["externalIPs"], serde_json::json!(["198.18.100.60"]));
}

#[test]
fn bad_input_is_reported_and_the_rest_still_served() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("mixed.yaml"),
        r#"
apiVersion: v1
kind: Service
metadata: {name: good, namespace: ns}
spec:
  clusterIP: 198.19.0.1
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: bad, namespace: ns}
spec:
  clusterIP: 300.1.1.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: good-1, namespace: ns, labels: {kubernetes.io/service-name: good}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [198.18.17.1]
- addresses: [127.0.0.1]
"#,
    )
    .unwrap();
    std::fs::write(dir.path().join("broken.yaml"), "kind: [unclosed").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_svcproxy"))
        .args([
            "snapshot",
            "--format",
            "json",
            "--hostname-override",
            "node-a",
        ])
        .arg("--manifests")
        .arg(dir.path())
        .output()
        .unwrap();
    // The input had errors: listed, and exit code 3.
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("broken.yaml"),
        "file error names the file: {stderr}"
    );
    let snap: Value = serde_json::from_slice(&out.stdout).unwrap();
    let good = port(&snap, "ns/good:http", "TCP", "IPv4");
    assert_eq!(eps(&good["clusterEndpoints"]), list(&["198.18.17.1:8080"]));
    let problems = snap["problems"].as_array().unwrap();
    assert!(problems.iter().any(|p| p["object"] == "Service ns/bad"
        && p["severity"] == "rejected"
        && p["origin"].as_str().unwrap().ends_with("mixed.yaml")));
    assert!(problems
        .iter()
        .any(|p| p["object"] == "EndpointSlice ns/good-1"
            && p["field"] == "endpoints[1].addresses[0]"));
}

fn explain(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_svcproxy"))
        .args(["explain", "--hostname-override", "node-a"])
        .args(args)
        .arg("--manifests")
        .arg(examples())
        .output()
        .expect("run svcproxy")
}

/// `svcproxy explain` on the example cluster: the same topology decision the
/// snapshot shows, in the JSON contract and as text, and clear errors for bad input.
#[test]
fn explain_follows_a_connection_through_the_example_rules() {
    let out = explain(&[
        "--from",
        "198.51.100.7:40000",
        "--to",
        "198.19.0.21:6379",
        "--format",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    assert_eq!(v["frontend"]["servicePort"], "demo/cache:redis");
    assert_eq!(v["origin"], "external");
    assert_eq!(v["verdict"]["action"], "forward");
    let addrs: Vec<&str> = v["verdict"]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["address"].as_str().unwrap())
        .collect();
    // As the snapshot: the zone's endpoints only (topology keys).
    let snap = snapshot("node-a");
    let want = eps(&port(&snap, "demo/cache:redis", "TCP", "IPv4")["clusterEndpoints"]).unwrap();
    assert_eq!(addrs, want);
    assert!(v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s.as_str().unwrap().contains("topology key")));

    let out = explain(&["--from", "198.51.100.7", "--to", "198.18.100.10:443"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains("LoadBalancerIP")
            && text.contains("=> DROP")
            && text.contains("loadBalancerSourceRanges"),
        "{text}"
    );

    for bad in [
        ["--from", "nope", "--to", "198.19.0.21:6379"],
        ["--from", "198.51.100.7", "--to", "198.19.0.21"],
    ] {
        let out = explain(&bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("not"),
            "{bad:?}"
        );
    }
}

/// Logs written to a pipe or a file (`kubectl logs`) carry no terminal escapes.
#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    // A document that is not YAML: the source logs an error for it.
    std::fs::write(dir.path().join("bad.yaml"), "kind: [unclosed\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_svcproxy"))
        .args(["snapshot", "--hostname-override", "node-a", "--manifests"])
        .arg(dir.path())
        .env_remove("NO_COLOR")
        .output()
        .expect("run svcproxy");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bad.yaml"),
        "something is logged:\n{stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "escape codes in piped logs:\n{stderr:?}"
    );
}

/// A document that is not YAML is listed with the problems of the input (table and
/// JSON), the objects beside it are still read, and the exit code (3) says the input
/// had errors; a clean input exits 0.
#[test]
fn unreadable_input_is_listed_and_the_exit_code_says_so() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.yaml"), "kind: [unclosed\n").unwrap();
    std::fs::write(
        dir.path().join("good.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{name: http, port: 80}]\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_svcproxy"))
            .args(args)
            .args(["--hostname-override", "node-a", "--manifests"])
            .arg(dir.path())
            .output()
            .expect("run svcproxy")
    };
    let out = run(&["snapshot"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{table}");
    assert!(table.contains("problems in the input (1):"), "{table}");
    assert!(table.contains("bad.yaml"), "{table}");
    assert!(table.contains("[unreadable]"), "{table}");
    assert!(
        table.contains("demo/web:http"),
        "the good file is read:\n{table}"
    );

    let out = run(&["snapshot", "--format", "json"]);
    assert_eq!(out.status.code(), Some(3));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let problems = doc["problems"].as_array().expect("problems");
    assert_eq!(problems.len(), 1, "{doc:#}");
    assert_eq!(problems[0]["severity"], "unreadable");
    assert_eq!(problems[0]["object"], Value::Null);
    assert!(problems[0]["origin"]
        .as_str()
        .unwrap()
        .ends_with("bad.yaml"));

    let out = run(&["render"]);
    assert_eq!(out.status.code(), Some(3), "render: {out:?}");

    std::fs::remove_file(dir.path().join("bad.yaml")).unwrap();
    let out = run(&["snapshot"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}
