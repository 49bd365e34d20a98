//! Scale probe (ignored by default; not a timed test): plans N services × M
//! endpoints built directly as snapshots, prints how long a full plan, a one-service
//! partial plan and an unchanged plan take, and, as root, how long `nft -f` takes to
//! load the full script and the partial one in a throwaway namespace.
//!
//! `cargo test --release -p svcproxy-plan --test scale -- --ignored --nocapture`
//! (`SCALE_SERVICES`, `SCALE_ENDPOINTS` override 10000 × 10).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Instant;

use common::*;
use svcproxy_core::model::*;
use svcproxy_core::selection::Selection;
use svcproxy_core::snapshot::{NodeSnapshot, ServicePortView};
use svcproxy_plan::nft::PlanKind;
use svcproxy_plan::PlanConfig;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn view(i: usize, endpoints: usize) -> (ServicePortName, Arc<ServicePortView>) {
    let name = ServicePortName::new(
        ServiceName::new("bench", format!("svc-{i}")),
        "http",
        Protocol::Tcp,
    );
    let cluster_ip = IpAddr::V4(Ipv4Addr::from(0xC613_0000u32 + i as u32 + 1)); // 198.19.x.y
    let eps: Vec<Endpoint> = (0..endpoints)
        .map(|e| Endpoint {
            ip: IpAddr::V4(Ipv4Addr::from(0x0A00_0000u32 + (i * endpoints + e) as u32)),
            port: 8080,
            info: Arc::new(EndpointInfo {
                node_name: Some(format!("node-{}", e % 3).into()),
                ready: true,
                serving: true,
                ..EndpointInfo::default()
            }),
        })
        .collect();
    let port = ServicePort {
        name: name.clone(),
        service_type: ServiceType::ClusterIP,
        cluster_ips: vec![cluster_ip].into(),
        port: 80,
        node_port: None,
        external_ips: Vec::new().into(),
        load_balancer_ingress: Vec::new().into(),
        load_balancer_source_ranges: None,
        external_traffic_policy: TrafficPolicy::Cluster,
        internal_traffic_policy: TrafficPolicy::Cluster,
        session_affinity_timeout: None,
        health_check_node_port: None,
        traffic_distribution: None,
        topology_mode: None,
        topology_keys: None,
        scheduler: None,
        endpoint_weights: None,
        maglev_table_size: None,
    };
    let v = ServicePortView {
        port: Arc::new(port),
        endpoints: eps.clone().into(),
        selection: Selection {
            cluster_endpoints: Some(eps.into()),
            local_endpoints: None,
            has_any_endpoints: true,
            reason: "".into(),
        },
    };
    (name, Arc::new(v))
}

#[test]
#[ignore]
fn scale_probe() {
    let n = env("SCALE_SERVICES", 10_000);
    let m = env("SCALE_ENDPOINTS", 10);
    let mut ports = BTreeMap::new();
    for i in 0..n {
        let (k, v) = view(i, m);
        ports.insert(k, v);
    }
    let mut v4 = NodeSnapshot::empty("node-0", IpFamily::V4);
    v4.service_cidrs = vec!["198.19.0.0/16".parse().unwrap()];
    v4.service_ports = ports.into();
    let v6 = NodeSnapshot::empty("node-0", IpFamily::V6);
    let cfg = PlanConfig::default();

    let mut planner = NftPipeline::new();
    let t = Instant::now();
    let full = planner.plan(&v4, &v6, &cfg, false, &BTreeSet::new());
    let full_time = t.elapsed();
    assert_eq!(full.kind, PlanKind::Recreate);
    planner.commit(&full);

    let (k, v) = view(n, m);
    let mut v4b = v4.clone();
    v4b.service_ports.insert(k.clone(), v);
    let t = Instant::now();
    let partial = planner.plan(&v4b, &v6, &cfg, false, &BTreeSet::from([k]));
    let partial_time = t.elapsed();
    assert_eq!(partial.kind, PlanKind::Partial);
    planner.commit(&partial);

    let t = Instant::now();
    let noop = planner.plan(&v4b, &v6, &cfg, false, &BTreeSet::new());
    let noop_time = t.elapsed();
    assert!(noop.is_empty());
    planner.commit(&noop);

    println!(
        "{n} services x {m} endpoints: full plan {:?} ({} bytes, {} chains), \
         one service added {:?} ({} bytes), unchanged {:?}",
        full_time,
        full.script.len(),
        full.stats.chains,
        partial_time,
        partial.script.len(),
        noop_time
    );

    if let Ok(dir) = std::env::var("SCALE_DUMP") {
        std::fs::write(format!("{dir}/full.nft"), &full.script).unwrap();
        std::fs::write(format!("{dir}/partial.nft"), &partial.script).unwrap();
        return;
    }
    if let Some(ns) = Netns::create("scale_probe") {
        let t = Instant::now();
        ns.nft_apply(&full.script).expect("full load");
        println!("nft -f full script: {:?}", t.elapsed());
        let t = Instant::now();
        ns.nft_apply(&partial.script).expect("partial load");
        println!("nft -f partial script: {:?}", t.elapsed());

        let resync = planner.plan(&v4b, &v6, &cfg, true, &BTreeSet::new());
        assert_eq!(resync.kind, PlanKind::Resync);
        let t = Instant::now();
        ns.nft_apply(&resync.script).expect("resync load");
        println!("nft -f resync script over the table: {:?}", t.elapsed());
        planner.abandon();
        let recreate = planner.plan(&v4b, &v6, &cfg, false, &BTreeSet::new());
        let t = Instant::now();
        ns.nft_apply(&recreate.script).expect("recreate load");
        println!("nft -f recreate script over the table: {:?}", t.elapsed());
    }
}
