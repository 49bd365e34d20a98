//! What the healthCheckNodePort servers and the no-local-endpoints metric read from
//! a snapshot: per service, this node's ready endpoints (distinct IPs across ports,
//! per family, the larger family's count; terminating ones excluded), and the Local-policy ports with
//! endpoints elsewhere but none here.
//!
//! This node is node-a (see tests/common).

mod common;

use common::*;
use svcproxy_core::model::{IpFamily, ServiceName};
use svcproxy_core::snapshot::{health_checks, no_local_endpoints, HealthCheck};

const LB_LOCAL: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: default}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  ipFamilyPolicy: PreferDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIPs: [10.96.0.20, "fd00:96::20"]
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: 30080}
  - {name: https, port: 443, targetPort: 8443, nodePort: 30443}
"#;

fn lb_slice(name: &str, family: &str, endpoints: &str) -> String {
    format!(
        r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}
  namespace: default
  labels: {{kubernetes.io/service-name: lb}}
addressType: {family}
ports:
- {{name: http, port: 8080}}
- {{name: https, port: 8443}}
endpoints:
{endpoints}
"#
    )
}

fn checks(state: &mut svcproxy_core::state::ClusterState) -> Vec<(ServiceName, HealthCheck)> {
    let update = state.snapshot();
    health_checks(&[&update.v4, &update.v6])
        .into_iter()
        .collect()
}

fn lb() -> ServiceName {
    ServiceName::new("default", "lb")
}

#[test]
fn local_ready_endpoints_are_counted_once_per_ip_across_ports_and_per_family() {
    let mut state = new_state();
    upsert(&mut state, service(LB_LOCAL));
    upsert(
        &mut state,
        slice(&lb_slice(
            "lb-v4",
            "IPv4",
            r#"
- {addresses: [10.244.1.5], nodeName: node-a, conditions: {ready: true}}
- {addresses: [10.244.1.7], nodeName: node-a, conditions: {ready: true}}
- {addresses: [10.244.1.6], nodeName: node-a, conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.244.2.5], nodeName: node-b, conditions: {ready: true}}
"#,
        )),
    );
    upsert(
        &mut state,
        slice(&lb_slice(
            "lb-v6",
            "IPv6",
            r#"
- {addresses: ["fd00:244::1:5"], nodeName: node-a, conditions: {ready: true}}
"#,
        )),
    );
    // IPv4: two (each on both ports, the terminating one left out); IPv6: one, the
    // same pods' other addresses. Not 3: a dual-stack pod is one endpoint, as each of
    // upstream's per-family proxiers reports.
    assert_eq!(
        checks(&mut state),
        vec![(
            lb(),
            HealthCheck {
                node_port: 32000,
                local_endpoints: 2
            }
        )]
    );
}

#[test]
fn a_service_losing_its_last_local_endpoint_counts_zero_and_disappears_with_the_service() {
    let mut state = new_state();
    upsert(&mut state, service(LB_LOCAL));
    upsert(
        &mut state,
        slice(&lb_slice(
            "lb-v4",
            "IPv4",
            "- {addresses: [10.244.2.5], nodeName: node-b, conditions: {ready: true}}",
        )),
    );
    assert_eq!(checks(&mut state)[0].1.local_endpoints, 0);
    let (internal, external) = {
        let u = state.snapshot();
        no_local_endpoints(&[&u.v4, &u.v6])
    };
    // Both ports of the IPv4 family have endpoints only on node-b; IPv6 has none at
    // all (rejected, not "no local").
    assert_eq!((internal, external), (0, 2));

    delete(
        &mut state,
        svcproxy_core::objects::Kind::Service,
        "default",
        "lb",
    );
    assert_eq!(checks(&mut state), vec![]);
}

#[test]
fn cluster_policy_services_have_no_health_check() {
    let mut state = new_state();
    upsert(
        &mut state,
        service(&LB_LOCAL.replace(
            "externalTrafficPolicy: Local",
            "externalTrafficPolicy: Cluster",
        )),
    );
    assert_eq!(checks(&mut state), vec![]);
}

#[test]
fn internal_local_without_local_endpoints_is_counted() {
    let mut state = new_state();
    upsert(
        &mut state,
        service(
            r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  internalTrafficPolicy: Local
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
"#,
        ),
    );
    upsert(
        &mut state,
        slice(
            r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.2.5], nodeName: node-b, conditions: {ready: true}}
"#,
        ),
    );
    let u = state.snapshot();
    assert_eq!(no_local_endpoints(&[&u.v4, &u.v6]), (1, 0));
}

/// Service `s<i>`: every third a LoadBalancer with a Local external policy and a
/// health check port, every third an internal Local policy, the rest Cluster.
fn many_service(i: usize) -> String {
    let policy = match i % 3 {
        0 => format!(
            "  type: LoadBalancer\n  externalTrafficPolicy: Local\n  healthCheckNodePort: {}\n",
            31000 + i
        ),
        1 => "  internalTrafficPolicy: Local\n".to_string(),
        _ => String::new(),
    };
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: default}}\nspec:\n{policy}  \
         clusterIP: 10.96.{}.{}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n",
        i / 250,
        i % 250 + 1
    )
}

/// Its slice, with `n` endpoints on `node`.
fn many_slice(i: usize, node: &str, n: usize) -> String {
    let mut y = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: s{i}-1, \
         namespace: default, labels: {{kubernetes.io/service-name: s{i}}}}}\naddressType: IPv4\n\
         ports: [{{name: http, port: 8080}}]\nendpoints:\n"
    );
    for e in 0..n {
        y.push_str(&format!(
            "- {{addresses: [10.{}.{}.{}], nodeName: {node}, conditions: {{ready: true}}}}\n",
            100 + i / 250,
            i % 250,
            e + 1
        ));
    }
    if n == 0 {
        y = y.replace("endpoints:\n", "endpoints: []\n");
    }
    y
}

#[test]
fn tallies_kept_from_snapshot_to_snapshot_equal_a_walk_of_every_port() {
    let mut state = new_state();
    let n = 700;
    for i in 0..n {
        upsert(&mut state, service(&many_service(i)));
        upsert(&mut state, slice(&many_slice(i, "node-b", 2)));
    }
    let mut tallies = svcproxy_core::snapshot::SnapshotTallies::default();
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    for round in 0..40 {
        let u = state.snapshot();
        tallies.update([&u.v4, &u.v6]);
        assert_eq!(
            tallies.health_checks(),
            health_checks(&[&u.v4, &u.v6]),
            "round {round}"
        );
        for (family, snap) in [(IpFamily::V4, &u.v4), (IpFamily::V6, &u.v6)] {
            assert_eq!(
                tallies.no_local_endpoints(family),
                no_local_endpoints(&[snap]),
                "round {round} {family:?}"
            );
        }
        // A few services change: endpoints move here or away, go, or the service
        // goes and comes back.
        for _ in 0..5 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let i = (seed % n as u64) as usize;
            match seed / 7 % 4 {
                0 => upsert(&mut state, slice(&many_slice(i, "node-a", 1 + i % 3))),
                1 => upsert(&mut state, slice(&many_slice(i, "node-b", 2))),
                2 => upsert(&mut state, slice(&many_slice(i, "node-b", 0))),
                _ => {
                    delete(
                        &mut state,
                        svcproxy_core::objects::Kind::Service,
                        "default",
                        &format!("s{i}"),
                    );
                    if round % 2 == 0 {
                        upsert(&mut state, service(&many_service(i)));
                    }
                }
            }
        }
    }
}
