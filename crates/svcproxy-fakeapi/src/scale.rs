//! Generators of realistic clusters for benchmarks.
//!
//! Address plan: nodes 172.16.0.0/12 (InternalIP) with pod CIDRs 10.64.0.0/10 (a /24
//! each; `node-N` for N in 1..), pods that do not fit their node's /24 in
//! 10.128.0.0/9, ClusterIPs in 10.96.0.0/12 (the ServiceCIDR "kubernetes"),
//! LoadBalancer ingress IPs in 172.31.0.0/16, nodePorts 30000-32767 (services that
//! would not fit get type ClusterIP).

use serde_json::{json, Value};

use crate::util;

const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];
const NAMESPACES: usize = 100;
const SLICE_MAX: usize = 100;

/// The name of node `i` (0-based): `node-{i+1}`.
pub fn node_name(i: usize) -> String {
    format!("node-{}", i + 1)
}

fn zone_of(node: usize) -> &'static str {
    ZONES[node % ZONES.len()]
}

fn ipv4(n: u32) -> String {
    format!(
        "{}.{}.{}.{}",
        n >> 24,
        (n >> 16) & 255,
        (n >> 8) & 255,
        n & 255
    )
}

/// 172.16.0.0/12 + 1 + i.
fn node_ip(i: usize) -> String {
    ipv4((172 << 24 | 16 << 16) + 1 + i as u32)
}

/// 10.64.0.0/10: a /24 per node.
fn node_pod_cidr_base(i: usize) -> u32 {
    (10 << 24 | 64 << 16) + ((i as u32) << 8)
}

/// 10.96.0.0/12 from 10.96.0.10 on.
fn cluster_ip(i: usize) -> String {
    ipv4((10 << 24 | 96 << 16) + 10 + i as u32)
}

fn managed_fields(manager: &str, op: &str) -> Value {
    json!([{
        "manager": manager,
        "operation": op,
        "apiVersion": "v1",
        "time": "2025-01-01T00:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": {".": {}}}, "f:spec": {}}
    }])
}

/// A realistic Node: labels, addresses, pod CIDRs, conditions, capacity.
pub fn node(i: usize) -> Value {
    let name = node_name(i);
    let zone = zone_of(i);
    let cidr = format!("{}/24", ipv4(node_pod_cidr_base(i)));
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": util::uid_for(&format!("node/{name}")),
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": name,
                "node.kubernetes.io/instance-type": "m5.xlarge",
                "topology.kubernetes.io/region": "region-1",
                "topology.kubernetes.io/zone": zone,
                "failure-domain.beta.kubernetes.io/region": "region-1",
                "failure-domain.beta.kubernetes.io/zone": zone,
                "node-pool": format!("pool-{}", i % 4),
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "managedFields": managed_fields("kubelet", "Update"),
        },
        "spec": {
            "podCIDR": cidr,
            "podCIDRs": [cidr],
            "providerID": format!("fake://region-1/{zone}/{name}"),
        },
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": node_ip(i)},
                {"type": "Hostname", "address": name},
            ],
            "capacity": {"cpu": "4", "memory": "16106128Ki", "pods": "110", "ephemeral-storage": "102350Mi"},
            "allocatable": {"cpu": "3920m", "memory": "15064208Ki", "pods": "110", "ephemeral-storage": "94321Mi"},
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
                 "lastHeartbeatTime": "2025-01-01T00:00:00Z", "lastTransitionTime": "2025-01-01T00:00:00Z"},
                {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure",
                 "lastHeartbeatTime": "2025-01-01T00:00:00Z", "lastTransitionTime": "2025-01-01T00:00:00Z"},
                {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID",
                 "lastHeartbeatTime": "2025-01-01T00:00:00Z", "lastTransitionTime": "2025-01-01T00:00:00Z"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                 "lastHeartbeatTime": "2025-01-01T00:00:00Z", "lastTransitionTime": "2025-01-01T00:00:00Z"},
            ],
            "nodeInfo": {
                "architecture": "amd64", "operatingSystem": "linux", "osImage": "Fake Linux",
                "kernelVersion": "6.8.0", "containerRuntimeVersion": "containerd://2.0.0",
                "kubeletVersion": "v1.34.0", "kubeProxyVersion": "",
                "machineID": "", "systemUUID": "", "bootID": "",
            },
        }
    })
}

/// The default ServiceCIDR (10.96.0.0/12), Ready.
pub fn service_cidr() -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": {"name": "kubernetes", "labels": {"kubernetes.io/service-managed-by": "kube-apiserver"}},
        "spec": {"cidrs": ["10.96.0.0/12"]},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "",
                                    "message": "Kubernetes Service CIDR is ready",
                                    "lastTransitionTime": "2025-01-01T00:00:00Z"}]}
    })
}

const PORTS: [(&str, u16, u16); 3] = [
    ("http", 80, 8080),
    ("https", 443, 8443),
    ("metrics", 9090, 9090),
];

/// A whole cluster: `nodes` Nodes, the default ServiceCIDR, `services` Services
/// (ClusterIP, NodePort and LoadBalancer; 1-3 ports) spread over 100 namespaces, and
/// their EndpointSlices (`endpoints_per_service` endpoints each, at most 100 per
/// slice) on those nodes. Objects come nodes first, then each service followed by its
/// slices.
pub fn cluster(services: usize, endpoints_per_service: usize, nodes: usize) -> Vec<Value> {
    let slices_per_service = endpoints_per_service.div_ceil(SLICE_MAX);
    let mut out = Vec::with_capacity(nodes + 1 + services * (1 + slices_per_service));
    out.extend((0..nodes).map(node));
    out.push(service_cidr());
    let mut next_node_port: u32 = 30000;
    let mut pod: usize = 0;
    // Pods per node placed so far (for addresses in the node's /24).
    let mut per_node = vec![0u32; nodes];
    let mut overflow: u32 = 0;
    for i in 0..services {
        let ns = format!("ns-{}", i % NAMESPACES);
        let name = format!("svc-{i}");
        let n_ports = i % 3 + 1;
        let mut ty = match i % 20 {
            0 => "LoadBalancer",
            1..=3 => "NodePort",
            _ => "ClusterIP",
        };
        let local = ty == "LoadBalancer" && i % 40 == 0;
        let needed = match ty {
            "ClusterIP" => 0,
            _ => n_ports as u32 + u32::from(local),
        };
        if next_node_port + needed > 32768 {
            ty = "ClusterIP";
        }
        let mut ports = Vec::new();
        for (name, port, target) in PORTS.iter().take(n_ports) {
            let mut p =
                json!({"name": name, "port": port, "protocol": "TCP", "targetPort": target});
            if ty != "ClusterIP" {
                p["nodePort"] = json!(next_node_port);
                next_node_port += 1;
            }
            ports.push(p);
        }
        let ip = cluster_ip(i);
        let uid = util::uid_for(&format!("svc/{ns}/{name}"));
        let mut spec = json!({
            "type": ty,
            "clusterIP": ip,
            "clusterIPs": [ip],
            "ports": ports,
            "selector": {"app": name},
            "sessionAffinity": if i % 50 == 7 { "ClientIP" } else { "None" },
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "internalTrafficPolicy": "Cluster",
        });
        if spec["sessionAffinity"] == "ClientIP" {
            spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": 10800}});
        }
        let mut status = json!({"loadBalancer": {}});
        if ty != "ClusterIP" {
            spec["externalTrafficPolicy"] = json!(if local { "Local" } else { "Cluster" });
        }
        if ty == "LoadBalancer" {
            spec["allocateLoadBalancerNodePorts"] = json!(true);
            if local {
                spec["healthCheckNodePort"] = json!(next_node_port);
                next_node_port += 1;
            }
            let lb = ipv4((172 << 24 | 31 << 16) + 1 + i as u32);
            status = json!({"loadBalancer": {"ingress": [{"ip": lb, "ipMode": "VIP"}]}});
        }
        out.push(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": uid,
                "labels": {"app": name, "app.kubernetes.io/part-of": format!("team-{}", i % 17)},
                "annotations": {"owner": format!("team-{}", i % 17)},
                "managedFields": managed_fields("kubectl-client-side-apply", "Update"),
            },
            "spec": spec,
            "status": status,
        }));
        for s in 0..slices_per_service {
            let count = (endpoints_per_service - s * SLICE_MAX).min(SLICE_MAX);
            let mut endpoints = Vec::with_capacity(count);
            for _ in 0..count {
                let (addr, node_idx) = if nodes > 0 {
                    let n = pod % nodes;
                    if per_node[n] < 254 {
                        per_node[n] += 1;
                        (ipv4(node_pod_cidr_base(n) + per_node[n]), Some(n))
                    } else {
                        overflow += 1;
                        (ipv4((10 << 24 | 128 << 16) + overflow), Some(n))
                    }
                } else {
                    overflow += 1;
                    (ipv4((10 << 24 | 128 << 16) + overflow), None)
                };
                let pod_name = format!(
                    "{name}-{}-{}",
                    util::suffix(i as u64, 10),
                    util::suffix(pod as u64 ^ 0xabc, 5)
                );
                let ready = pod % 97 != 13;
                let mut ep = json!({
                    "addresses": [addr],
                    "conditions": {"ready": ready, "serving": ready, "terminating": false},
                    "targetRef": {"kind": "Pod", "namespace": ns, "name": pod_name,
                                  "uid": util::uid_for(&format!("pod/{ns}/{pod_name}"))},
                });
                if let Some(n) = node_idx {
                    ep["nodeName"] = json!(node_name(n));
                    ep["zone"] = json!(zone_of(n));
                }
                endpoints.push(ep);
                pod += 1;
            }
            let slice_ports: Vec<Value> = PORTS
                .iter()
                .take(n_ports)
                .map(|(n, _, t)| json!({"name": n, "port": t, "protocol": "TCP"}))
                .collect();
            let slice_name = format!("{name}-{}", util::suffix((i * 1000 + s) as u64, 5));
            out.push(json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": slice_name,
                    "namespace": ns,
                    "generateName": format!("{name}-"),
                    "labels": {
                        "kubernetes.io/service-name": name,
                        "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                        "app": name,
                    },
                    "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2025-01-01T00:00:00Z"},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name, "uid": uid,
                                         "controller": true, "blockOwnerDeletion": true}],
                    "managedFields": managed_fields("kube-controller-manager", "Update"),
                },
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": slice_ports,
            }));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn a_cluster_has_what_was_asked_for() {
        let objs = cluster(200, 150, 10);
        let count = |k: &str| objs.iter().filter(|o| o["kind"] == k).count();
        assert_eq!(count("Node"), 10);
        assert_eq!(count("Service"), 200);
        assert_eq!(count("ServiceCIDR"), 1);
        assert_eq!(count("EndpointSlice"), 400, "150 endpoints: 2 slices each");
        let mut eps = 0;
        let mut addrs = HashSet::new();
        for s in objs.iter().filter(|o| o["kind"] == "EndpointSlice") {
            let e = s["endpoints"].as_array().unwrap();
            assert!(e.len() <= 100);
            assert!(s["metadata"]["labels"]["kubernetes.io/service-name"].is_string());
            for ep in e {
                assert!(addrs.insert(ep["addresses"][0].as_str().unwrap().to_string()));
                assert!(ep["nodeName"].is_string() && ep["zone"].is_string());
            }
            eps += e.len();
        }
        assert_eq!(eps, 200 * 150);
        let node_ports: Vec<u64> = objs
            .iter()
            .filter(|o| o["kind"] == "Service")
            .flat_map(|s| s["spec"]["ports"].as_array().unwrap().clone())
            .filter_map(|p| p["nodePort"].as_u64())
            .collect();
        assert!(!node_ports.is_empty());
        let unique: HashSet<_> = node_ports.iter().collect();
        assert_eq!(unique.len(), node_ports.len());
        let types: HashSet<&str> = objs
            .iter()
            .filter_map(|o| o["spec"]["type"].as_str())
            .collect();
        assert_eq!(types.len(), 3);
    }

    #[test]
    fn node_ports_never_run_out() {
        let objs = cluster(12_000, 0, 0);
        let node_ports: Vec<u64> = objs
            .iter()
            .filter(|o| o["kind"] == "Service")
            .flat_map(|s| {
                let mut v: Vec<u64> = s["spec"]["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|p| p["nodePort"].as_u64())
                    .collect();
                v.extend(s["spec"]["healthCheckNodePort"].as_u64());
                v
            })
            .collect();
        let unique: HashSet<_> = node_ports.iter().collect();
        assert_eq!(unique.len(), node_ports.len());
        assert!(node_ports.iter().all(|p| (30000..=32767).contains(p)));
        assert_eq!(
            objs.iter().filter(|o| o["kind"] == "EndpointSlice").count(),
            0
        );
    }
}
