//! Upstream's large cluster mode (`Driver::large_cluster`): more endpoints than the
//! mode's threshold in one family, each service port's counted, stops the periodic
//! full sync (the runner's `a_large_cluster_skips_the_hourly_full_sync_but_not_a_repair`).

// The data plane's test cluster (YAML through the real `ClusterState`).
#[path = "../../svcproxy-dataplane/tests/common/mod.rs"]
mod common;

use common::*;
use svcproxy_dataplane::{NftDataPlane, RecordingSink, LARGE_CLUSTER_ENDPOINTS};
use svcproxy_sync::Driver;

/// A Service `big` with `ports` ports, each served by `endpoints` ready endpoints
/// (in slices of 500: a slice holds at most 1000).
fn big(ports: usize, endpoints: usize) -> String {
    let mut out = String::from(
        "apiVersion: v1\nkind: Service\nmetadata: {name: big, namespace: demo}\nspec:\n  clusterIP: 198.19.0.99\n  ports:\n",
    );
    let mut slice_ports = String::new();
    for p in 0..ports {
        out.push_str(&format!(
            "  - {{name: p{p}, port: {}, targetPort: {}}}\n",
            80 + p,
            8080 + p
        ));
        slice_ports.push_str(&format!("- {{name: p{p}, port: {}}}\n", 8080 + p));
    }
    for (i, first) in (0..endpoints).step_by(500).enumerate() {
        out.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: big-{i}\n  namespace: demo\n  labels: {{kubernetes.io/service-name: big}}\naddressType: IPv4\nports:\n{slice_ports}endpoints:\n"
        ));
        for e in first..endpoints.min(first + 500) {
            out.push_str(&format!(
                "- {{addresses: [10.{}.{}.{}], nodeName: node-b}}\n",
                1 + e / 65536,
                (e / 256) % 256,
                e % 256
            ));
        }
    }
    out
}

fn large_after_sync(yaml: &str, threshold: Option<usize>) -> bool {
    let mut state = cluster(&[yaml]);
    let mut dp =
        Driver::without_conntrack(plan_config(), NftDataPlane::with_sink(RecordingSink::new()))
            .with_large_cluster(threshold);
    assert!(!dp.large_cluster(), "nothing synced yet");
    dp.sync(&snapshot(&mut state), true).expect("sync");
    // A recorder cannot read use counts back: its drift check is not armed, so
    // the periodic full sync, which repairs what the check cannot see, stays.
    assert!(!dp.skips_periodic_full_sync());
    dp.large_cluster()
}

#[test]
fn a_cluster_is_large_above_the_modes_threshold_of_endpoints() {
    assert_eq!(LARGE_CLUSTER_ENDPOINTS, 1000, "upstream's threshold");
    let t = Some(LARGE_CLUSTER_ENDPOINTS);
    assert!(!large_after_sync(&big(1, 1000), t), "1000 is not above");
    assert!(large_after_sync(&big(1, 1001), t));
    // Every service port counts its endpoints, as upstream's sum over its map.
    assert!(large_after_sync(&big(2, 501), t));
    assert!(!large_after_sync(&big(2, 500), t));
    // A mode without the threshold is never large.
    assert!(!large_after_sync(&big(1, 5000), None));
}
