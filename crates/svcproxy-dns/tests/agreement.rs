//! The proxy and the cluster DNS agree on what exists: the same hostile and edge
//! objects are fed to the state as the proxy alone keeps it and to the state and
//! catalog the daemon keeps with the DNS on; the proxy's snapshot is the same in
//! both, every service it proxies answers with exactly its cluster IPs, a name the
//! model refused answers NXDOMAIN, and a headless service names exactly the
//! endpoints the proxy uses for a proxied twin with the same slices.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{Name, RData, RecordType};
use serde_json::{json, Value};
use svcproxy_core::model::IpFamily;
use svcproxy_core::objects::{KubeObject, SourceUpdate};
use svcproxy_core::state::{ClusterState, StateConfig};
use svcproxy_dns::{Catalog, DnsConfig};

fn upsert(object: Value) -> SourceUpdate {
    let object = match object["kind"].as_str() {
        Some("Service") => KubeObject::Service(serde_json::from_value(object).unwrap()),
        Some("Endpoints") => KubeObject::Endpoints(serde_json::from_value(object).unwrap()),
        _ => KubeObject::EndpointSlice(serde_json::from_value(object).unwrap()),
    };
    SourceUpdate::Upsert {
        object,
        origin: "test".into(),
    }
}

fn service(ns: &str, name: &str, meta: Value, spec: Value) -> SourceUpdate {
    let mut metadata = json!({"namespace": ns, "name": name});
    if let Value::Object(extra) = meta {
        metadata.as_object_mut().unwrap().extend(extra);
    }
    upsert(json!({"kind": "Service", "metadata": metadata, "spec": spec}))
}

fn slice(ns: &str, name: &str, svc: &str, family: &str, endpoints: Value) -> SourceUpdate {
    labelled_slice(
        ns,
        name,
        json!({"kubernetes.io/service-name": svc}),
        family,
        endpoints,
    )
}

/// A headless service's slice, labelled as the EndpointSlice controller labels it
/// (the proxy passes over such slices).
fn headless_slice(name: &str, svc: &str, endpoints: Value) -> SourceUpdate {
    let labels = json!({"kubernetes.io/service-name": svc, "service.kubernetes.io/headless": ""});
    labelled_slice("demo", name, labels, "IPv4", endpoints)
}

fn labelled_slice(
    ns: &str,
    name: &str,
    labels: Value,
    family: &str,
    endpoints: Value,
) -> SourceUpdate {
    upsert(json!({"kind": "EndpointSlice",
        "metadata": {"namespace": ns, "name": name, "labels": labels},
        "addressType": family, "endpoints": endpoints,
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]}))
}

/// Endpoints with every kind of trouble, and good ones among them.
fn hostile_endpoints() -> Value {
    json!([
        {"addresses": ["10.244.0.1"], "hostname": "good-0"},
        {"addresses": ["10.244.0.2"], "hostname": "x.evil. 0 IN A 6.6.6.6"},
        {"addresses": ["10.244.0.3"], "conditions": {"ready": false}},
        {"addresses": ["10.244.0.4"], "conditions": {"ready": false, "serving": true, "terminating": true}},
        {"addresses": ["10.244.0.5", "10.244.0.55"]},
        {"addresses": ["010.244.000.006"]},
        {"addresses": ["127.0.0.1"]},
        {"addresses": ["169.254.169.254"]},
        {"addresses": ["fd00::1"]},
        {"addresses": ["not-an-ip"]},
        {"addresses": []},
        {"addresses": ["10.244.0.1"], "hostname": "dup"},
        {"addresses": ["10.244.0.7"], "nodeName": "bad node", "zone": "bad zone!"}
    ])
}

fn objects() -> Vec<SourceUpdate> {
    let http = json!([{"name": "http", "port": 80}]);
    let none = json!({});
    let mut u = vec![
        // Plain, dual-stack, and leading-zero cluster IPs.
        service(
            "demo",
            "web",
            none.clone(),
            json!({"clusterIP": "10.96.0.10", "ports": http}),
        ),
        service(
            "demo",
            "dual",
            none.clone(),
            json!({"clusterIPs": ["10.96.0.11", "fd00::11"], "ports": http}),
        ),
        service(
            "demo",
            "zeros",
            none.clone(),
            json!({"clusterIP": "010.096.000.012", "ports": http}),
        ),
        // Refused, whole.
        service(
            "demo",
            "bad-ip",
            none.clone(),
            json!({"clusterIP": "10.96.0.999", "ports": http}),
        ),
        service(
            "demo",
            "loop",
            none.clone(),
            json!({"clusterIP": "127.0.0.1", "ports": http}),
        ),
        service(
            "demo",
            "no-ports",
            none.clone(),
            json!({"clusterIP": "10.96.0.13"}),
        ),
        service(
            "demo",
            "1digit",
            none.clone(),
            json!({"clusterIP": "10.96.0.14", "ports": http}),
        ),
        service(
            "demo",
            "UPPER",
            none.clone(),
            json!({"clusterIP": "10.96.0.15", "ports": http}),
        ),
        service(
            "Bad_ns",
            "web",
            none.clone(),
            json!({"clusterIP": "10.96.0.16", "ports": http}),
        ),
        service(
            "demo",
            "bad-port",
            none.clone(),
            json!({"clusterIP": "10.96.0.17", "ports": [{"name": "a b", "port": 80}]}),
        ),
        service(
            "demo",
            "bad-type",
            none.clone(),
            json!({"type": "Magic", "clusterIP": "10.96.0.18", "ports": http}),
        ),
        service(
            "demo",
            "evil-alias",
            none.clone(),
            json!({"type": "ExternalName", "externalName": "evil.com. 0 IN A 6.6.6.6"}),
        ),
        // Not proxied, yet named by the DNS.
        service(
            "demo",
            "alias",
            none.clone(),
            json!({"type": "ExternalName", "externalName": "db.example.com."}),
        ),
        service(
            "demo",
            "other",
            json!({"labels": {"service.kubernetes.io/service-proxy-name": "someone-else"}}),
            json!({"clusterIP": "10.96.0.19", "ports": http}),
        ),
        service(
            "demo",
            "labelled",
            json!({"labels": {"service.kubernetes.io/headless": ""}}),
            json!({"clusterIP": "10.96.0.20", "ports": http}),
        ),
        service("demo", "bare", none.clone(), json!({"clusterIP": "None"})),
        service(
            "demo",
            "db",
            none.clone(),
            json!({"clusterIP": "None", "ports": http}),
        ),
        service(
            "demo",
            "all",
            none.clone(),
            json!({"clusterIP": "None", "ports": http, "publishNotReadyAddresses": true}),
        ),
        // Proxied twins of the headless ones: the same slices.
        service(
            "demo",
            "twin-db",
            none.clone(),
            json!({"clusterIP": "10.96.0.21", "ports": http}),
        ),
        service(
            "demo",
            "twin-all",
            none.clone(),
            json!({"clusterIP": "10.96.0.22", "ports": http}),
        ),
        // Slices: a slice of a missing service, one without a service, an
        // oversized one, and one of an unknown address type.
        slice(
            "demo",
            "ghost-1",
            "ghost",
            "IPv4",
            json!([{"addresses": ["10.244.9.1"]}]),
        ),
        upsert(
            json!({"kind": "EndpointSlice", "metadata": {"namespace": "demo", "name": "orphan"},
            "addressType": "IPv4", "endpoints": [{"addresses": ["10.244.9.2"]}]}),
        ),
        slice(
            "demo",
            "huge",
            "web",
            "IPv4",
            Value::Array(
                (0..1001)
                    .map(|i| json!({"addresses": [format!("10.245.{}.{}", i / 250, i % 250 + 1)]}))
                    .collect(),
            ),
        ),
        slice(
            "demo",
            "fqdn",
            "web",
            "FQDN",
            json!([{"addresses": ["example.com"]}]),
        ),
        slice(
            "demo",
            "web-1",
            "web",
            "IPv4",
            json!([{"addresses": ["10.244.1.1"]}]),
        ),
    ];
    for svc in ["db", "all"] {
        u.push(headless_slice(
            &format!("{svc}-1"),
            svc,
            hostile_endpoints(),
        ));
        let twin = format!("twin-{svc}");
        u.push(slice(
            "demo",
            &format!("{twin}-1"),
            &twin,
            "IPv4",
            hostile_endpoints(),
        ));
    }
    u
}

fn state(dns: bool) -> ClusterState {
    ClusterState::new(StateConfig {
        node_name: "node-a".into(),
        dns,
        ..StateConfig::default()
    })
}

/// The proxy's view: per service, its cluster IPs and the endpoints its ports
/// reach (all, and the ready ones), both families.
type View = BTreeMap<String, (BTreeSet<IpAddr>, BTreeSet<IpAddr>, BTreeSet<IpAddr>)>;

fn proxy_view(state: &mut ClusterState) -> View {
    let update = state.snapshot();
    let mut view = View::new();
    for family in IpFamily::BOTH {
        for (name, port) in update.family(family).service_ports.iter() {
            let entry = view.entry(name.service.name.to_string()).or_default();
            entry.0.extend(port.port.cluster_ips.iter());
            entry.1.extend(port.endpoints.iter().map(|e| e.ip));
            entry
                .2
                .extend(port.endpoints.iter().filter(|e| e.ready).map(|e| e.ip));
        }
    }
    view
}

/// A/AAAA at `name`: the code and the addresses (or the CNAME's target).
fn ask(catalog: &Catalog, name: &str) -> (ResponseCode, BTreeSet<String>) {
    let qname = Name::from_ascii(format!("{name}.demo.svc.cluster.local.")).unwrap();
    let mut code = ResponseCode::NoError;
    let mut records = BTreeSet::new();
    for qtype in [RecordType::A, RecordType::AAAA] {
        let a = catalog.answer(&qname, qtype, None).unwrap();
        code = a.code;
        records.extend(a.answers.iter().map(|r| match &r.data {
            RData::A(a) => a.to_string(),
            RData::AAAA(a) => a.to_string(),
            other => other.to_string(),
        }));
    }
    (code, records)
}

fn strings(ips: &BTreeSet<IpAddr>) -> BTreeSet<String> {
    ips.iter().map(IpAddr::to_string).collect()
}

#[test]
fn the_proxy_and_the_dns_agree_on_what_exists() {
    let mut alone = state(false);
    let mut both = state(true);
    let mut catalog = Catalog::new(&DnsConfig::default()).unwrap();
    for u in objects() {
        alone.apply(u.clone());
        both.apply(u);
        catalog.follow(&mut both);
    }
    catalog.set_ready();

    // The DNS on changes nothing the proxy does, nor what it reports, but for the
    // objects only the DNS reads (an ExternalName's target, headless services'
    // slices).
    let proxied = proxy_view(&mut alone);
    assert_eq!(proxy_view(&mut both), proxied);
    let (problems, dns_only): (BTreeMap<_, _>, BTreeMap<_, _>) = both
        .problems()
        .into_iter()
        .partition(|(k, _)| alone.problems().contains_key(k));
    let mut dns_only: Vec<String> = dns_only.keys().map(ToString::to_string).collect();
    dns_only.sort();
    assert_eq!(problems, alone.problems());
    assert_eq!(
        dns_only,
        [
            "EndpointSlice demo/all-1",
            "EndpointSlice demo/db-1",
            "Service demo/evil-alias"
        ]
    );

    // Every proxied service answers with exactly its cluster IPs.
    let expected_proxied = ["web", "dual", "zeros", "twin-db", "twin-all"];
    assert_eq!(
        proxied.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        BTreeSet::from(expected_proxied)
    );
    for (name, (cluster_ips, _, _)) in &proxied {
        assert_eq!(
            ask(&catalog, name),
            (ResponseCode::NoError, strings(cluster_ips)),
            "{name}"
        );
    }
    assert_eq!(
        proxied["zeros"].0,
        BTreeSet::from(["10.96.0.12".parse().unwrap()])
    );
    // The oversized, FQDN and service-less slices reach neither.
    assert_eq!(
        strings(&proxied["web"].1),
        BTreeSet::from(["10.244.1.1".to_string()])
    );

    // What the model refused exists for neither.
    for name in [
        "bad-ip",
        "loop",
        "no-ports",
        "1digit",
        "bad-port",
        "bad-type",
        "evil-alias",
        "ghost",
    ] {
        assert_eq!(ask(&catalog, name).0, ResponseCode::NXDomain, "{name}");
    }

    // Not proxied, yet named: the aliases, other proxies' services, the
    // headless ones.
    assert_eq!(
        ask(&catalog, "alias"),
        (
            ResponseCode::NoError,
            BTreeSet::from(["db.example.com.".to_string()])
        )
    );
    assert_eq!(
        ask(&catalog, "other"),
        (
            ResponseCode::NoError,
            BTreeSet::from(["10.96.0.19".to_string()])
        )
    );
    assert_eq!(
        ask(&catalog, "labelled"),
        (
            ResponseCode::NoError,
            BTreeSet::from(["10.96.0.20".to_string()])
        )
    );
    assert_eq!(
        ask(&catalog, "bare").0,
        ResponseCode::NXDomain,
        "a headless service without endpoints"
    );
    // A headless service names the endpoints the proxy reaches for its twin: the
    // ready ones, or every one with publishNotReadyAddresses.
    let (_, all, ready) = &proxied["twin-db"];
    assert_eq!(ask(&catalog, "db"), (ResponseCode::NoError, strings(ready)));
    assert_eq!(
        ask(&catalog, "all"),
        (ResponseCode::NoError, strings(&proxied["twin-all"].1))
    );
    assert_eq!(
        strings(all),
        ["10.244.0.1", "10.244.0.2", "10.244.0.3", "10.244.0.4", "10.244.0.5", "10.244.0.6", "10.244.0.7"]
            .map(String::from)
            .into(),
        "the first address of each endpoint, leading zeros read as decimal; no loopback, link-local or other family"
    );
    // By name: a valid hostname, else the address; an invalid one names nothing.
    let by_name = |host: &str| ask(&catalog, &format!("{host}.db"));
    assert_eq!(
        by_name("good-0"),
        (
            ResponseCode::NoError,
            BTreeSet::from(["10.244.0.1".to_string()])
        )
    );
    assert_eq!(
        by_name("10-244-0-2"),
        (
            ResponseCode::NoError,
            BTreeSet::from(["10.244.0.2".to_string()])
        )
    );
    assert_eq!(by_name("x").0, ResponseCode::NXDomain);
    assert_eq!(by_name("10-244-0-3").0, ResponseCode::NXDomain, "not ready");
}
