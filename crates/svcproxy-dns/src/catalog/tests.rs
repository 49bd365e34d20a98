use super::*;
use pretty_assertions::assert_eq;
use serde_json::json;
use svcproxy_core::objects::{Kind, KubeObject, ObjectKey, SourceUpdate};
use svcproxy_core::problem::Severity;
use svcproxy_core::state::StateConfig;

/// The cluster state (as the daemon keeps it with the DNS on) and the catalog that
/// follows it.
struct Fed {
    state: ClusterState,
    catalog: Catalog,
}

impl Fed {
    fn new(cfg: &DnsConfig) -> Fed {
        Fed {
            state: ClusterState::new(StateConfig {
                node_name: "node-a".into(),
                dns: true,
                ..StateConfig::default()
            }),
            catalog: Catalog::new(cfg).unwrap(),
        }
    }

    /// Applies `u`; returns the problems (other than warnings) of the objects it
    /// names, as the state logged them.
    fn apply(&mut self, u: &SourceUpdate) -> Vec<String> {
        let keys: Vec<ObjectKey> = match u {
            SourceUpdate::Upsert { object, .. } => vec![object.key()],
            SourceUpdate::Replace { objects, .. } => objects.iter().map(|(o, _)| o.key()).collect(),
            SourceUpdate::Delete(k) => vec![k.clone()],
            _ => Vec::new(),
        };
        self.state.apply(u.clone());
        self.catalog.follow(&mut self.state);
        let problems = self.state.problems();
        keys.iter()
            .flat_map(|k| problems.get(k).into_iter().flatten())
            .filter(|p| p.severity != Severity::Warning)
            .map(|p| p.to_string())
            .collect()
    }
}

impl std::ops::Deref for Fed {
    type Target = Catalog;
    fn deref(&self) -> &Catalog {
        &self.catalog
    }
}

fn upsert(object: serde_json::Value) -> SourceUpdate {
    let object = match object["kind"].as_str() {
        Some("Service") => KubeObject::Service(serde_json::from_value(object).unwrap()),
        Some("EndpointSlice") => KubeObject::EndpointSlice(serde_json::from_value(object).unwrap()),
        k => panic!("kind {k:?}"),
    };
    SourceUpdate::Upsert {
        object,
        origin: "test".into(),
    }
}

fn service(ns: &str, name: &str, spec: serde_json::Value) -> SourceUpdate {
    upsert(json!({"kind": "Service", "metadata": {"namespace": ns, "name": name}, "spec": spec}))
}

fn slice(ns: &str, name: &str, svc: &str, v6: bool, endpoints: serde_json::Value) -> SourceUpdate {
    upsert(json!({
        "kind": "EndpointSlice",
        "metadata": {"namespace": ns, "name": name, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": if v6 { "IPv6" } else { "IPv4" },
        "endpoints": endpoints,
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}, {"port": 9}]
    }))
}

fn catalog(updates: &[SourceUpdate]) -> Fed {
    let mut c = Fed::new(&DnsConfig::default());
    for u in updates {
        assert_eq!(c.apply(u), Vec::<String>::new());
    }
    c
}

fn ask(c: &Catalog, name: &str, qtype: RecordType) -> (ResponseCode, Vec<String>) {
    let a = c
        .answer(&Name::from_ascii(name).unwrap(), qtype, None)
        .expect("an answer");
    let mut records: Vec<String> = a
        .answers
        .iter()
        .map(|r| format!("{} {}", r.record_type(), r.data))
        .collect();
    records.sort();
    (a.code, records)
}

fn ok(records: &[&str]) -> (ResponseCode, Vec<String>) {
    (
        ResponseCode::NoError,
        records.iter().map(|s| s.to_string()).collect(),
    )
}

const NODATA: (ResponseCode, Vec<String>) = (ResponseCode::NoError, Vec::new());
const NXDOMAIN: (ResponseCode, Vec<String>) = (ResponseCode::NXDomain, Vec::new());

fn cluster() -> Vec<SourceUpdate> {
    vec![
        service(
            "demo",
            "web",
            json!({"clusterIPs": ["10.96.0.10", "fd00::10"], "ports": [
                {"name": "http", "port": 80}, {"name": "dns", "protocol": "UDP", "port": 53}, {"port": 81}]}),
        ),
        service(
            "demo",
            "db",
            json!({"clusterIP": "None", "ports": [{"name": "http", "port": 80}]}),
        ),
        slice(
            "demo",
            "db-v4",
            "db",
            false,
            json!([
                {"addresses": ["10.244.1.5"], "hostname": "db-0"},
                {"addresses": ["10.244.2.6"]},
                {"addresses": ["10.244.3.7"], "conditions": {"ready": false}},
            ]),
        ),
        slice(
            "demo",
            "db-v6",
            "db",
            true,
            json!([{"addresses": ["fd00:10::5"], "hostname": "db-0"}]),
        ),
        service(
            "demo",
            "ext",
            json!({"type": "ExternalName", "externalName": "www.Example.com"}),
        ),
        service("demo", "empty", json!({"clusterIP": "None"})),
    ]
}

#[test]
fn a_cluster_ip_service_has_its_addresses_srv_per_named_port_and_ptr() {
    let c = catalog(&cluster());
    let web = "web.demo.svc.cluster.local.";
    assert_eq!(ask(&c, web, RecordType::A), ok(&["A 10.96.0.10"]));
    assert_eq!(ask(&c, web, RecordType::AAAA), ok(&["AAAA fd00::10"]));
    assert_eq!(ask(&c, web, RecordType::MX), NODATA);
    assert_eq!(
        ask(&c, "WEB.Demo.SVC.cluster.LOCAL.", RecordType::A),
        ok(&["A 10.96.0.10"]),
        "names are compared case-insensitively"
    );
    assert_eq!(
        ask(
            &c,
            "_http._tcp.web.demo.svc.cluster.local.",
            RecordType::SRV
        ),
        ok(&["SRV 0 100 80 web.demo.svc.cluster.local."])
    );
    assert_eq!(
        ask(&c, "_dns._udp.web.demo.svc.cluster.local.", RecordType::SRV),
        ok(&["SRV 0 100 53 web.demo.svc.cluster.local."])
    );
    assert_eq!(
        ask(&c, "_dns._tcp.web.demo.svc.cluster.local.", RecordType::SRV),
        NXDOMAIN
    );
    assert_eq!(
        ask(&c, "_http._tcp.web.demo.svc.cluster.local.", RecordType::A),
        NODATA
    );
    assert_eq!(
        ask(&c, "_tcp.web.demo.svc.cluster.local.", RecordType::A),
        NODATA,
        "an empty non-terminal exists"
    );
    assert_eq!(
        ask(&c, "_sctp.web.demo.svc.cluster.local.", RecordType::A),
        NXDOMAIN
    );
    assert_eq!(
        ask(&c, "10.0.96.10.in-addr.arpa.", RecordType::PTR),
        ok(&["PTR web.demo.svc.cluster.local."])
    );
    let v6 = Name::from(IpAddr::from("fd00::10".parse::<Ipv6Addr>().unwrap()));
    assert_eq!(
        ask(&c, &v6.to_ascii(), RecordType::PTR),
        ok(&["PTR web.demo.svc.cluster.local."])
    );
    // Additional section: the target's addresses.
    let a = c
        .answer(
            &Name::from_ascii("_http._tcp.web.demo.svc.cluster.local.").unwrap(),
            RecordType::SRV,
            None,
        )
        .unwrap();
    assert_eq!(a.additionals.len(), 2);
}

#[test]
fn a_headless_service_answers_with_its_ready_endpoints_by_name_and_port() {
    let c = catalog(&cluster());
    let db = "db.demo.svc.cluster.local.";
    assert_eq!(
        ask(&c, db, RecordType::A),
        ok(&["A 10.244.1.5", "A 10.244.2.6"]),
        "not the endpoint that is not ready"
    );
    assert_eq!(ask(&c, db, RecordType::AAAA), ok(&["AAAA fd00:10::5"]));
    assert_eq!(
        ask(&c, "db-0.db.demo.svc.cluster.local.", RecordType::A),
        ok(&["A 10.244.1.5"])
    );
    assert_eq!(
        ask(&c, "db-0.db.demo.svc.cluster.local.", RecordType::AAAA),
        ok(&["AAAA fd00:10::5"]),
        "one hostname, an address per family"
    );
    assert_eq!(
        ask(&c, "10-244-2-6.db.demo.svc.cluster.local.", RecordType::A),
        ok(&["A 10.244.2.6"]),
        "no hostname: the address, dashed"
    );
    assert_eq!(
        ask(&c, "10-244-3-7.db.demo.svc.cluster.local.", RecordType::A),
        NXDOMAIN
    );
    // N ready endpoints (by hostname) x M named ports; the slice's unnamed port has none.
    assert_eq!(
        ask(&c, "_http._tcp.db.demo.svc.cluster.local.", RecordType::SRV),
        ok(&[
            "SRV 0 50 8080 10-244-2-6.db.demo.svc.cluster.local.",
            "SRV 0 50 8080 db-0.db.demo.svc.cluster.local.",
        ])
    );
    assert_eq!(
        ask(&c, "5.1.244.10.in-addr.arpa.", RecordType::PTR),
        ok(&["PTR db-0.db.demo.svc.cluster.local."])
    );
    assert!(
        c.answer(
            &Name::from_ascii("7.3.244.10.in-addr.arpa.").unwrap(),
            RecordType::PTR,
            None
        )
        .is_none(),
        "an address it does not know is not its to answer"
    );
    // No ready endpoints: NXDOMAIN, as the specification says.
    assert_eq!(
        ask(&c, "empty.demo.svc.cluster.local.", RecordType::A),
        NXDOMAIN
    );
}

#[test]
fn publish_not_ready_addresses_includes_every_endpoint() {
    let mut updates = cluster();
    updates.push(service(
        "demo",
        "db",
        json!({"clusterIP": "None", "publishNotReadyAddresses": true}),
    ));
    let c = catalog(&updates);
    assert_eq!(
        ask(&c, "db.demo.svc.cluster.local.", RecordType::A),
        ok(&["A 10.244.1.5", "A 10.244.2.6", "A 10.244.3.7"])
    );
}

#[test]
fn external_names_version_pods_and_what_does_not_exist() {
    let c = catalog(&cluster());
    for qtype in [RecordType::A, RecordType::AAAA, RecordType::CNAME] {
        assert_eq!(
            ask(&c, "ext.demo.svc.cluster.local.", qtype),
            ok(&["CNAME www.example.com."])
        );
    }
    assert_eq!(
        ask(&c, "dns-version.cluster.local.", RecordType::TXT),
        ok(&["TXT 1.1.0"])
    );
    assert_eq!(
        ask(&c, "10-244-9-9.demo.pod.cluster.local.", RecordType::A),
        ok(&["A 10.244.9.9"])
    );
    assert_eq!(
        ask(&c, "fd00-10--9.demo.pod.cluster.local.", RecordType::AAAA),
        ok(&["AAAA fd00:10::9"])
    );
    assert_eq!(
        ask(&c, "not-an-ip.demo.pod.cluster.local.", RecordType::A),
        NXDOMAIN
    );
    assert_eq!(ask(&c, "demo.svc.cluster.local.", RecordType::A), NODATA);
    assert_eq!(ask(&c, "nope.svc.cluster.local.", RecordType::A), NXDOMAIN);
    assert_eq!(ask(&c, "svc.cluster.local.", RecordType::A), NODATA);
    assert_eq!(ask(&c, "cluster.local.", RecordType::A), NODATA);
    assert_eq!(
        ask(&c, "cluster.local.", RecordType::SOA).1.len(),
        1,
        "the apex has its SOA"
    );
    assert_eq!(
        ask(&c, "nope.demo.svc.cluster.local.", RecordType::A),
        NXDOMAIN
    );
    assert_eq!(
        ask(&c, "a.b.c.demo.svc.cluster.local.", RecordType::A),
        NXDOMAIN
    );
    // Negative answers carry the zone's SOA for negative caching.
    let a = c
        .answer(
            &Name::from_ascii("nope.demo.svc.cluster.local.").unwrap(),
            RecordType::A,
            None,
        )
        .unwrap();
    assert_eq!(a.authority.len(), 1);
    assert_eq!(a.authority[0].record_type(), RecordType::SOA);
    // Outside the zone: not this catalog's.
    assert!(c
        .answer(
            &Name::from_ascii("example.com.").unwrap(),
            RecordType::A,
            None
        )
        .is_none());
}

#[test]
fn deletes_replaces_and_moved_slices_take_records_away() {
    let mut c = catalog(&cluster());
    c.apply(&SourceUpdate::Delete(ObjectKey::new(
        Kind::EndpointSlice,
        "demo",
        "db-v4",
    )));
    assert_eq!(
        ask(&c, "db.demo.svc.cluster.local.", RecordType::A),
        NODATA,
        "still an IPv6 endpoint"
    );
    assert!(c
        .answer(
            &Name::from_ascii("5.1.244.10.in-addr.arpa.").unwrap(),
            RecordType::PTR,
            None
        )
        .is_none());
    // The IPv6 slice moves to another service.
    c.apply(&slice(
        "demo",
        "db-v6",
        "empty",
        true,
        json!([{"addresses": ["fd00:10::5"]}]),
    ));
    assert_eq!(
        ask(&c, "db.demo.svc.cluster.local.", RecordType::AAAA),
        NXDOMAIN
    );
    assert_eq!(
        ask(&c, "empty.demo.svc.cluster.local.", RecordType::AAAA),
        ok(&["AAAA fd00:10::5"])
    );
    // A re-list without the web service removes it, and its PTR.
    let kept: Vec<(KubeObject, String)> = cluster()
        .into_iter()
        .filter_map(|u| match u {
            SourceUpdate::Upsert { object, origin } if object.key().name != "web" => {
                Some((object, origin))
            }
            _ => None,
        })
        .collect();
    c.apply(&SourceUpdate::Replace {
        kinds: vec![Kind::Service],
        objects: kept
            .into_iter()
            .filter(|(o, _)| o.kind() == Kind::Service)
            .collect(),
    });
    assert_eq!(
        ask(&c, "web.demo.svc.cluster.local.", RecordType::A),
        NXDOMAIN
    );
    assert!(c
        .answer(
            &Name::from_ascii("10.0.96.10.in-addr.arpa.").unwrap(),
            RecordType::PTR,
            None
        )
        .is_none());
    assert_eq!(
        ask(&c, "empty.demo.svc.cluster.local.", RecordType::AAAA),
        ok(&["AAAA fd00:10::5"]),
        "slices were not re-listed"
    );
}

/// Hostile input is refused (or its bad field ignored) per object, by the state's
/// one conversion: an object refused is gone for the proxy and the DNS alike, and
/// no string in it reaches an answer.
#[test]
fn hostile_input_is_refused_per_object_and_reaches_no_answer() {
    let mut c = catalog(&cluster());
    let ports = json!([{"name": "http", "port": 80}]);
    // (update, problems it must cause)
    let bad = [
        (
            service(
                "demo",
                "web",
                json!({"clusterIP": "10.96.0.999", "ports": ports}),
            ),
            2,
        ),
        (
            service(
                "demo",
                "ext",
                json!({"type": "ExternalName", "externalName": "evil.com. 0 IN A 6.6.6.6"}),
            ),
            1,
        ),
        (
            service(
                "Demo",
                "x",
                json!({"clusterIP": "10.96.0.11", "ports": ports}),
            ),
            1,
        ),
        (
            service(
                "demo",
                "bad.name",
                json!({"clusterIP": "10.96.0.12", "ports": ports}),
            ),
            1,
        ),
        (
            service(
                "demo",
                "api",
                json!({"clusterIP": "10.96.0.13", "ports": [{"name": "a b", "port": 1}]}),
            ),
            2,
        ),
        (
            slice(
                "demo",
                "db-v4",
                "db",
                false,
                json!([{"addresses": ["10.244.1.5"], "hostname": "x.evil"}]),
            ),
            1,
        ),
    ];
    for (u, problems) in &bad {
        let errors = c.apply(u);
        assert_eq!(errors.len(), *problems, "{u:?}: {errors:?}");
    }
    // Refused: gone, for the DNS as for the proxy (the same model).
    for name in ["web", "ext", "api", "x", "bad.name"] {
        assert_eq!(
            ask(
                &c,
                &format!("{name}.demo.svc.cluster.local."),
                RecordType::A
            ),
            NXDOMAIN,
            "{name}"
        );
    }
    // A bad hostname is ignored: the endpoint is named by its address.
    assert_eq!(
        ask(&c, "db-0.db.demo.svc.cluster.local.", RecordType::A),
        NODATA,
        "db-0 is the IPv6 endpoint's name alone now"
    );
    assert_eq!(
        ask(&c, "x.evil.db.demo.svc.cluster.local.", RecordType::A),
        NXDOMAIN
    );
    assert_eq!(
        ask(&c, "10-244-1-5.db.demo.svc.cluster.local.", RecordType::A),
        ok(&["A 10.244.1.5"])
    );
    // An endpoint of the wrong family is no endpoint.
    assert_eq!(
        c.apply(&slice(
            "demo",
            "db-v4",
            "db",
            false,
            json!([{"addresses": ["fd00::1"]}]),
        ))
        .len(),
        1
    );
    assert_eq!(
        ask(&c, "db.demo.svc.cluster.local.", RecordType::A),
        NODATA,
        "the IPv6 slice's endpoint is still there"
    );
    assert_eq!(c.services(), 2, "db and empty");
    assert!(Catalog::new(&DnsConfig {
        zone: "evil zone".into(),
        ttl: 5,
        clients_node: None,
    })
    .is_err());
}

fn node(name: &str, zone: &str) -> SourceUpdate {
    SourceUpdate::Upsert {
        object: KubeObject::Node(
            serde_json::from_value(
                json!({"kind": "Node", "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone}}}),
            )
            .unwrap(),
        ),
        origin: "test".into(),
    }
}

/// A headless service `name` with topology `keys` (or a `trafficDistribution` and
/// the hints the controller writes for it), and one endpoint on each of node-a
/// (zone a), node-b and node-c (zone b): 10.244.<i>.10.
fn zonal(name: &str, keys: Option<&str>, distribution: Option<&str>) -> Vec<SourceUpdate> {
    let mut meta = json!({"namespace": "demo", "name": name});
    if let Some(k) = keys {
        meta["annotations"] = json!({"svcproxy.io/topology-keys": k});
    }
    let mut spec = json!({"clusterIP": "None", "ports": [{"name": "http", "port": 80}]});
    if let Some(d) = distribution {
        spec["trafficDistribution"] = json!(d);
    }
    let endpoints: Vec<serde_json::Value> = [("node-a", "a"), ("node-b", "b"), ("node-c", "b")]
        .iter()
        .enumerate()
        .map(|(i, (n, z))| {
            let mut ep = json!({"addresses": [format!("10.244.{i}.10")], "nodeName": n,
                                "zone": z, "conditions": {"ready": true}});
            // The EndpointSlice controller writes hints for a trafficDistribution;
            // selection follows the hints, as upstream's kube-proxy does.
            if distribution.is_some() {
                ep["hints"] = json!({"forNodes": [{"name": n}], "forZones": [{"name": z}]});
            }
            ep
        })
        .collect();
    vec![
        upsert(json!({"kind": "Service", "metadata": meta, "spec": spec})),
        upsert(json!({"kind": "EndpointSlice",
            "metadata": {"namespace": "demo", "name": format!("{name}-1"),
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4", "endpoints": endpoints,
            "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]})),
    ]
}

fn on_node(clients_node: Option<&str>, updates: &[SourceUpdate]) -> Fed {
    let mut c = Fed::new(&DnsConfig {
        clients_node: clients_node.map(String::from),
        ..DnsConfig::default()
    });
    for u in [
        node("node-a", "a"),
        node("node-b", "b"),
        node("node-c", "b"),
        node("node-d", "d"),
    ]
    .iter()
    .chain(updates)
    {
        assert_eq!(c.apply(u), Vec::<String>::new());
    }
    // As the server does once the sources have listed everything.
    c.catalog.set_ready();
    c
}

#[test]
fn headless_answers_are_what_endpoint_selection_chooses_for_the_clients_node() {
    let mut updates = zonal("zonal", Some("topology.kubernetes.io/zone, *"), None);
    updates.extend(zonal("hard", Some("kubernetes.io/hostname"), None));
    updates.extend(zonal("close", None, Some("PreferSameNode")));
    updates.extend(zonal("plain", None, None));
    let a =
        |c: &Catalog, svc: &str| ask(c, &format!("{svc}.demo.svc.cluster.local."), RecordType::A);

    // Clients on node-b (zone b): the zone's two endpoints; its own by hostname.
    let c = on_node(Some("node-b"), &updates);
    assert_eq!(a(&c, "zonal"), ok(&["A 10.244.1.10", "A 10.244.2.10"]));
    assert_eq!(a(&c, "hard"), ok(&["A 10.244.1.10"]));
    assert_eq!(a(&c, "close"), ok(&["A 10.244.1.10"]));
    assert_eq!(
        a(&c, "plain"),
        ok(&["A 10.244.0.10", "A 10.244.1.10", "A 10.244.2.10"]),
        "a service that did not opt in is not filtered"
    );
    assert_eq!(
        ask(
            &c,
            "_http._tcp.hard.demo.svc.cluster.local.",
            RecordType::SRV
        ),
        ok(&["SRV 0 100 8080 10-244-1-10.hard.demo.svc.cluster.local."])
    );
    assert_eq!(
        ask(
            &c,
            "10-244-0-10.hard.demo.svc.cluster.local.",
            RecordType::A
        ),
        ok(&["A 10.244.0.10"]),
        "an endpoint's own name answers wherever the client is"
    );

    // Clients on node-d (zone d, no endpoint): `*` falls back to all; hard keys
    // match nothing: NODATA, not NXDOMAIN.
    let c = on_node(Some("node-d"), &updates);
    assert_eq!(
        a(&c, "zonal"),
        ok(&["A 10.244.0.10", "A 10.244.1.10", "A 10.244.2.10"])
    );
    assert_eq!(a(&c, "hard"), NODATA);

    // Clients anywhere (no node): everything.
    let c = on_node(None, &updates);
    assert_eq!(
        a(&c, "hard"),
        ok(&["A 10.244.0.10", "A 10.244.1.10", "A 10.244.2.10"])
    );

    // node-d's zone label changes to b: its clients now get zone b's endpoints.
    let mut c = on_node(Some("node-d"), &updates);
    c.apply(&node("node-d", "b"));
    assert_eq!(a(&c, "zonal"), ok(&["A 10.244.1.10", "A 10.244.2.10"]));
}

fn pod(ns: &str, name: &str, node: &str, ips: &[&str]) -> SourceUpdate {
    let ips: Vec<serde_json::Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    SourceUpdate::Upsert {
        object: KubeObject::Pod(
            serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name},
                "spec": {"nodeName": node, "containers": []}, "status": {"podIPs": ips}}))
            .unwrap(),
        ),
        origin: "test".into(),
    }
}

#[test]
fn a_central_server_finds_each_clients_node_from_its_pod_or_the_nodes() {
    let mut updates = zonal("hard", Some("kubernetes.io/hostname"), None);
    updates.push(pod(
        "apps",
        "client-b",
        "node-b",
        &["10.1.0.5", "fd00:1::5"],
    ));
    updates.push(SourceUpdate::Upsert {
        object: KubeObject::Node(
            serde_json::from_value(json!({"metadata": {"name": "node-d",
                "labels": {"topology.kubernetes.io/zone": "d"}},
                "spec": {"podCIDRs": ["10.4.0.0/24"]},
                "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.4"}]}}))
            .unwrap(),
        ),
        origin: "test".into(),
    });
    let mut c = on_node(None, &updates);
    let hard = Name::from_ascii("hard.demo.svc.cluster.local.").unwrap();
    let from = |c: &Catalog, ip: &str| {
        let a = c
            .answer(&hard, RecordType::A, Some(ip.parse().unwrap()))
            .unwrap();
        let mut v: Vec<String> = a.answers.iter().map(|r| r.data.to_string()).collect();
        v.sort();
        (a.code, v)
    };
    let all = ["10.244.0.10", "10.244.1.10", "10.244.2.10"].map(String::from);
    // By its Pod (either of its addresses): node-b's own endpoint.
    assert_eq!(from(&c, "10.1.0.5").1, ["10.244.1.10"]);
    assert_eq!(from(&c, "fd00:1::5").1, ["10.244.1.10"]);
    // By a Node's podCIDRs, or a Node's own address (host-network clients): node-d,
    // where the hard key matches nothing.
    assert_eq!(from(&c, "10.4.0.9"), NODATA);
    assert_eq!(from(&c, "192.0.2.4"), NODATA);
    // Unknown: everything.
    assert_eq!(from(&c, "203.0.113.9").1, all);
    // The pod goes: its address places nobody any more.
    c.apply(&SourceUpdate::Delete(ObjectKey::new(
        Kind::Pod,
        "apps",
        "client-b",
    )));
    assert_eq!(from(&c, "10.1.0.5").1, all);
    assert_eq!(
        c.client_node(Some("10.4.0.1".parse().unwrap())),
        Some("node-d")
    );
}

/// `_<proto>.<svc>` exists when some slice has a named port of that protocol and
/// an endpoint the DNS names; not when the named port's endpoints are not ready
/// and the ready ones sit in a slice without it.
#[test]
fn a_protocol_name_needs_a_named_endpoint_behind_such_a_port() {
    let slice = |name: &str, ip: &str, ready: bool, ports: serde_json::Value| {
        upsert(json!({
            "kind": "EndpointSlice",
            "metadata": {"namespace": "demo", "name": name,
                         "labels": {"kubernetes.io/service-name": "half"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}}],
            "ports": ports
        }))
    };
    let mut updates = vec![
        service(
            "demo",
            "half",
            json!({"clusterIP": "None", "ports": [{"name": "http", "port": 80}]}),
        ),
        slice(
            "half-a",
            "10.244.7.1",
            false,
            json!([{"name": "http", "protocol": "TCP", "port": 8080}]),
        ),
        slice("half-b", "10.244.7.2", true, json!([{"port": 9}])),
    ];
    let c = catalog(&updates);
    assert_eq!(
        ask(&c, "_tcp.half.demo.svc.cluster.local.", RecordType::SRV),
        NXDOMAIN
    );
    assert_eq!(
        ask(
            &c,
            "_http._tcp.half.demo.svc.cluster.local.",
            RecordType::SRV
        ),
        NXDOMAIN
    );
    assert_eq!(
        ask(&c, "half.demo.svc.cluster.local.", RecordType::A),
        ok(&["A 10.244.7.2"])
    );
    // The named port's endpoint ready: both exist.
    updates[1] = slice(
        "half-a",
        "10.244.7.1",
        true,
        json!([{"name": "http", "protocol": "TCP", "port": 8080}]),
    );
    let c = catalog(&updates);
    assert_eq!(
        ask(&c, "_tcp.half.demo.svc.cluster.local.", RecordType::SRV),
        NODATA
    );
    assert_eq!(
        ask(
            &c,
            "_http._tcp.half.demo.svc.cluster.local.",
            RecordType::SRV
        ),
        ok(&["SRV 0 100 8080 10-244-7-1.half.demo.svc.cluster.local."])
    );
}
