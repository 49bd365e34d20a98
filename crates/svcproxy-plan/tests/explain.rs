//! `svcproxy explain`'s tracer on the intent: for each frontend kind and outcome,
//! the verdict, the endpoint candidates and the reason, on the shared address plan
//! (node-a 198.18.0.1, its pods 198.18.1.0/24; node-b 198.18.0.2, pods
//! 198.18.2.0/24; ServiceCIDR 198.19.0.0/16; LB IPs in 203.0.113.0/24; clients in
//! 198.51.100.0/24).

mod common;

use std::net::{IpAddr, SocketAddr};

use common::*;
use svcproxy_core::model::Protocol;
use svcproxy_plan::explain::{explain, Origin, Packet, Trace, Verdict};

const CLIENT: &str = "198.51.100.7";
const LOCAL_POD: &str = "198.18.1.10";
const REMOTE_POD: &str = "198.18.2.10";

fn trace(yaml: &str, from: &str, to: &str, origin: Option<Origin>) -> Trace {
    let mut sc = Scenario::empty("node-a");
    sc.upsert_yaml(yaml);
    let up = sc.snapshot();
    let intent = svcproxy_plan::build_intent(&up.v4, &up.v6, &sc.cfg);
    let packet = Packet {
        from: from.parse::<IpAddr>().unwrap(),
        to: to.parse::<SocketAddr>().unwrap(),
        protocol: Protocol::Tcp,
        origin,
    };
    explain(&intent, &up.v4, &up.v6, &packet)
}

/// The endpoints and masquerade of a forward, or the verdict.
fn forward(t: &Trace) -> (Vec<String>, bool) {
    match &t.verdict {
        Verdict::Forward {
            endpoints,
            masquerade,
            ..
        } => (
            endpoints.iter().map(|c| c.address.clone()).collect(),
            *masquerade,
        ),
        other => panic!("not a forward: {other:?}\n{}", t.text()),
    }
}

fn eps(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_cluster_ip_forwards_to_every_endpoint_uniformly_and_masquerades_off_node_sources() {
    let yaml = service(
        "web",
        10,
        "",
        &[ready("198.18.1.5", "node-a"), ready("198.18.2.5", "node-b")],
    );
    let t = trace(&yaml, CLIENT, "198.19.0.10:80", None);
    assert_eq!(t.origin, Origin::External);
    assert_eq!(t.frontend.as_ref().unwrap().kind, "ClusterIP");
    assert_eq!(
        forward(&t),
        (eps(&["198.18.1.5:8080", "198.18.2.5:8080"]), true)
    );
    let Verdict::Forward {
        endpoints,
        endpoint_set,
        ..
    } = &t.verdict
    else {
        unreachable!()
    };
    assert_eq!(*endpoint_set, "cluster");
    assert!(endpoints.iter().all(|c| (c.probability - 0.5).abs() < 1e-9));

    // From this node's pod (told by the pod CIDR): not masqueraded.
    let t = trace(&yaml, LOCAL_POD, "198.19.0.10:80", None);
    assert_eq!(t.origin, Origin::LocalPod, "{}", t.origin_reason);
    assert!(!forward(&t).1);
    // From an endpoint to itself: that path only is masqueraded (hairpin).
    let t = trace(&yaml, "198.18.1.5", "198.19.0.10:80", None);
    let Verdict::Forward { endpoints, .. } = &t.verdict else {
        panic!("{}", t.text())
    };
    assert_eq!(
        endpoints.iter().map(|c| c.masquerade).collect::<Vec<_>>(),
        [true, false]
    );
    assert!(t.text().contains("hairpin"), "{}", t.text());
    // An endpoint on another node never reaches this node's rules as a source: no
    // hairpin here (its own node's proxy handles its connections). (Told to come
    // from a pod, so that the route itself does not masquerade.)
    let t = trace(
        &yaml,
        "198.18.2.5",
        "198.19.0.10:80",
        Some(Origin::LocalPod),
    );
    let Verdict::Forward { endpoints, .. } = &t.verdict else {
        panic!("{}", t.text())
    };
    assert!(endpoints.iter().all(|c| !c.masquerade), "{}", t.text());
}

#[test]
fn no_endpoint_rejects_and_an_unexposed_port_or_unallocated_address_is_refused() {
    let yaml = service("empty", 11, "", &[]);
    let t = trace(&yaml, CLIENT, "198.19.0.11:80", None);
    match &t.verdict {
        Verdict::Reject { reason } => assert!(reason.contains("no usable endpoint"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let t = trace(&yaml, CLIENT, "198.19.0.11:81", None);
    match &t.verdict {
        Verdict::Reject { reason } => assert!(reason.contains("not exposed"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let t = trace(&yaml, CLIENT, "198.19.0.99:80", None);
    match &t.verdict {
        Verdict::Drop { reason } => assert!(reason.contains("ServiceCIDR"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let t = trace(&yaml, CLIENT, "192.0.2.1:80", None);
    assert!(matches!(t.verdict, Verdict::Accept { .. }), "{t:?}");
    assert!(t.frontend.is_none());
}

#[test]
fn a_local_policy_without_local_endpoints_drops_external_traffic_but_not_the_nodes() {
    let yaml = service(
        "lb",
        12,
        "  type: NodePort\n  externalTrafficPolicy: Local",
        &[ready("198.18.2.5", "node-b")],
    );
    let t = trace(&yaml, CLIENT, "198.18.0.1:30012", None);
    assert_eq!(t.frontend.as_ref().unwrap().kind, "NodePort");
    match &t.verdict {
        Verdict::Drop { reason } => assert!(reason.contains("Local"), "{reason}"),
        other => panic!("{other:?}\n{}", t.text()),
    }
    // From the node itself: to the cluster-wide endpoints, masqueraded.
    let t = trace(&yaml, "198.18.0.1", "198.18.0.1:30012", None);
    assert_eq!(t.origin, Origin::Node);
    assert_eq!(forward(&t), (eps(&["198.18.2.5:8080"]), true));
    // From this node's pod: the short circuit, client address kept.
    let t = trace(&yaml, LOCAL_POD, "198.18.0.1:30012", None);
    assert_eq!(forward(&t), (eps(&["198.18.2.5:8080"]), false));
    // The cluster IP is not affected by the external policy.
    let t = trace(&yaml, REMOTE_POD, "198.19.0.12:80", None);
    assert_eq!(forward(&t), (eps(&["198.18.2.5:8080"]), true));
}

#[test]
fn a_local_policy_with_local_endpoints_keeps_the_client_address() {
    let yaml = service(
        "np",
        13,
        "  type: NodePort\n  externalTrafficPolicy: Local",
        &[ready("198.18.1.5", "node-a"), ready("198.18.2.5", "node-b")],
    );
    let t = trace(&yaml, CLIENT, "198.18.0.1:30013", None);
    let Verdict::Forward {
        endpoint_set,
        masquerade,
        ..
    } = &t.verdict
    else {
        panic!("{}", t.text())
    };
    assert_eq!((*endpoint_set, *masquerade), ("local", false));
    assert_eq!(forward(&t).0, eps(&["198.18.1.5:8080"]));
    // Not a NodePort destination of this node: left alone.
    let t = trace(&yaml, CLIENT, "198.18.0.2:30013", None);
    assert!(matches!(t.verdict, Verdict::Accept { .. }), "{}", t.text());
}

#[test]
fn load_balancer_source_ranges_drop_other_sources_first() {
    let yaml = service(
        "fw",
        14,
        "  type: LoadBalancer\n  loadBalancerSourceRanges: [198.51.100.0/28]\nstatus:\n  loadBalancer:\n    ingress: [{ip: 203.0.113.14}]",
        &[ready("198.18.2.5", "node-b")],
    );
    let t = trace(&yaml, CLIENT, "203.0.113.14:80", None);
    assert_eq!(t.frontend.as_ref().unwrap().kind, "LoadBalancerIP");
    assert_eq!(forward(&t), (eps(&["198.18.2.5:8080"]), true));
    let t = trace(&yaml, "198.51.100.77", "203.0.113.14:80", None);
    match &t.verdict {
        Verdict::Drop { reason } => {
            assert!(reason.contains("loadBalancerSourceRanges"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_json_form_is_a_stable_contract() {
    let yaml = service(
        "web",
        10,
        "  sessionAffinity: ClientIP",
        &[ready("198.18.2.5", "node-b")],
    );
    let t = trace(&yaml, CLIENT, "198.19.0.10:80", Some(Origin::External));
    let v = serde_json::to_value(&t).unwrap();
    assert_eq!(v["from"], CLIENT);
    assert_eq!(v["to"], "198.19.0.10:80");
    assert_eq!(v["protocol"], "TCP");
    assert_eq!(v["family"], "IPv4");
    assert_eq!(v["origin"], "external");
    assert_eq!(v["originReason"], "as given");
    assert_eq!(v["frontend"]["servicePort"], "demo/web:http");
    assert_eq!(v["frontend"]["kind"], "ClusterIP");
    assert_eq!(v["frontend"]["destination"], "198.19.0.10:80/TCP");
    assert_eq!(v["verdict"]["action"], "forward");
    assert_eq!(v["verdict"]["endpointSet"], "cluster");
    assert_eq!(v["verdict"]["masquerade"], true);
    assert_eq!(v["verdict"]["sessionAffinitySeconds"], 10800);
    assert_eq!(v["verdict"]["endpoints"][0]["address"], "198.18.2.5:8080");
    assert_eq!(v["verdict"]["endpoints"][0]["probability"], 1.0);
    assert!(v["steps"].as_array().is_some_and(|s| !s.is_empty()));
    let t = trace(&yaml, CLIENT, "192.0.2.1:80", None);
    let v = serde_json::to_value(&t).unwrap();
    assert_eq!(v["verdict"]["action"], "accept");
    assert!(v["frontend"].is_null());
}

#[test]
fn no_input_can_forge_a_line_of_the_text_form() {
    // Names are quoted; whatever else reaches a step or a reason (validated label
    // keys and values today) is printed on its line with control characters escaped.
    let yaml = service("odd", 15, "", &[]);
    let mut t = trace(&yaml, CLIENT, "198.19.0.15:80", None);
    t.steps.push("zone\n=> ACCEPT (forged)".to_string());
    if let Verdict::Reject { reason } = &mut t.verdict {
        reason.push_str("\n=> FORWARD (forged)");
    } else {
        panic!("{t:?}");
    }
    let text = t.text();
    assert!(text.contains("zone\\n=> ACCEPT"), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("=> ")).count(),
        1,
        "{text}"
    );
}

#[test]
fn a_weighted_scheduler_is_named_and_shares_by_weight() {
    let yaml = service(
        "weighted",
        60,
        "",
        &[ready("198.18.1.5", "node-a"), ready("198.18.2.5", "node-b")],
    )
    .replace(
        "metadata: {name: weighted, namespace: demo}",
        "metadata: {name: weighted, namespace: demo, annotations: {svcproxy.io/scheduler: wrr, svcproxy.io/endpoint-weights: 'node-b=3'}}",
    );
    let mut sc = Scenario::empty("node-a");
    sc.cfg.schedulers = true;
    sc.upsert_yaml(&yaml);
    let up = sc.snapshot();
    let intent = svcproxy_plan::build_intent(&up.v4, &up.v6, &sc.cfg);
    let packet = Packet {
        from: CLIENT.parse().unwrap(),
        to: "198.19.0.60:80".parse().unwrap(),
        protocol: Protocol::Tcp,
        origin: None,
    };
    let t = explain(&intent, &up.v4, &up.v6, &packet);
    match &t.verdict {
        Verdict::Forward {
            endpoints,
            scheduler,
            ..
        } => {
            assert_eq!(*scheduler, Some("wrr"));
            let p: Vec<f64> = endpoints.iter().map(|c| c.probability).collect();
            assert_eq!(p, [0.25, 0.75]);
        }
        other => panic!("not a forward: {other:?}"),
    }
    assert!(t.text().contains(", chosen by wrr;"), "{}", t.text());
    let json = serde_json::to_string(&t).unwrap();
    assert!(json.contains(r#""scheduler":"wrr""#), "{json}");
    // At random (every mode but ebpf and ipvs): no scheduler named.
    let t = trace(&yaml, CLIENT, "198.19.0.60:80", None);
    assert!(!serde_json::to_string(&t).unwrap().contains("scheduler"));
}
