//! XDP benchmark (issue 34; ignored by default: a benchmark, not a timed test).
//! Packets per second for a UDP NodePort from outside (`externalTrafficPolicy:
//! Local`, its endpoint on this node), in the same run:
//!
//! - `floor`: a bare XDP program on the node's interface rewrites each packet to
//!   the endpoint's address and port and redirects it to the endpoint's veth,
//!   with no lookup at all (`bench_floor` of `bpf/bench.c`);
//! - `xdp`: the ebpf mode with `--ebpf-xdp=native`: its XDP program finds the
//!   service and the connection, translates and redirects;
//! - `tc`: the ebpf mode with the XDP path off: the packets meet the stack, and
//!   the tc program translates them;
//! - `nftables`: the mode's rules DNAT them in the node's namespace;
//! - `xdp-cluster`, `tc-cluster`, `nftables-cluster`: the same three for a
//!   NodePort with `externalTrafficPolicy: Cluster` (the same endpoint), whose
//!   packets are masqueraded too: by the XDP program itself, by the kernel's
//!   conntrack (the fixed rule) after the tc program, by the mode's rules.
//!
//! The packets come from a generator in the client's namespace
//! (`BPF_PROG_RUN` in live-frames mode, `bench_gen`): 64-byte IPv4 UDP
//! datagrams out of its veth, over `BENCH_FLOWS` (default 256) source ports, so
//! the node's interface receives them in its driver as from a wire. The
//! endpoint's side of its veth counts what arrives and drops it (`bench_sink`).
//! Each row sends `BENCH_FRAMES` (default 2,000,000) frames `BENCH_REPEAT`
//! (default 3) times in turn; a figure is the median of the packets delivered
//! per second of the generator's run, and its ratio to the floor's.
//!
//! The node's interface runs an XDP program in every row (a veth must, to take
//! frames redirected to it): `bench_pass` in the `tc` and `nftables` rows.
//!
//! `cargo test --release -p svcproxy-e2e --test bench_xdp -- --ignored --nocapture`
//! (root; `ip`, `nft`).

use std::net::Ipv4Addr;
use std::time::Duration;

use svcproxy_core::objects::SourceUpdate;
use svcproxy_core::state::{ClusterState, StateConfig};
use svcproxy_dataplane::ebpf::XdpMode;
use svcproxy_dataplane::{
    DataPlane, EbpfDataPlane, EbpfOptions, NftCommand, NftDataPlane, NoConntrackCleanup,
};
use svcproxy_e2e::nodeport_bench::{self, env, median, BACKEND, CLIENT, NODE};
use svcproxy_e2e::xdp::{mac, udp_frame, Generator, TestXdp};
use svcproxy_e2e::{ebpf_options, Confinement};
use svcproxy_plan::{LocalDetection, PlanConfig};
use svcproxy_sync::Driver;
use svcproxy_testkit::netns::{self, NsSet};

const ENDPOINT: Ipv4Addr = BACKEND;
const NODE_PORT: u16 = 30090;
/// The Cluster policy's NodePort (the same endpoint).
const CLUSTER_NODE_PORT: u16 = 30091;
const TARGET_PORT: u16 = 8080;

fn plan_config() -> PlanConfig {
    PlanConfig {
        local_detection: LocalDetection::NodeCidr(Vec::new()),
        ..PlanConfig::default()
    }
}

fn state() -> ClusterState {
    let yaml = format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: node-a}}\nspec: {{podCIDRs: [10.72.0.0/24]}}\nstatus:\n  addresses: [{{type: InternalIP, address: {NODE}}}]\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: bench}}\nspec:\n  type: NodePort\n  externalTrafficPolicy: Local\n  clusterIP: 198.19.0.1\n  ports: [{{name: echo, port: 90, protocol: UDP, targetPort: {TARGET_PORT}, nodePort: {NODE_PORT}}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: bench, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: echo, port: {TARGET_PORT}, protocol: UDP}}]\nendpoints:\n- {{addresses: [{ENDPOINT}], nodeName: node-a}}\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: wide, namespace: bench}}\nspec:\n  type: NodePort\n  clusterIP: 198.19.0.2\n  ports: [{{name: echo, port: 90, protocol: UDP, targetPort: {TARGET_PORT}, nodePort: {CLUSTER_NODE_PORT}}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: wide-1, namespace: bench, labels: {{kubernetes.io/service-name: wide}}}}\naddressType: IPv4\nports: [{{name: echo, port: {TARGET_PORT}, protocol: UDP}}]\nendpoints:\n- {{addresses: [{ENDPOINT}], nodeName: node-a}}\n"
    );
    let mut st = ClusterState::new(StateConfig {
        node_name: "node-a".to_string(),
        service_proxy_name: None,
        ignore_external_ips: false,
        dns: false,
        without_snapshots: false,
    });
    for object in svcproxy_testkit::objects::parse(&yaml) {
        st.apply(SourceUpdate::Upsert {
            object,
            origin: "bench".to_string(),
        });
    }
    st
}

/// What a row leaves in place while it is measured, and takes away after.
enum Row {
    Floor(TestXdp),
    Ebpf(
        Box<Driver<EbpfDataPlane, NoConntrackCleanup>>,
        Option<TestXdp>,
    ),
    Nft(Box<Driver<NftDataPlane, NoConntrackCleanup>>, TestXdp),
}

#[test]
#[ignore]
fn bench_xdp_nodeport_pps() {
    let test = "bench_xdp_nodeport_pps";
    if !netns::can_run(test, &["ip", "nft", "mount", "umount"]) {
        return;
    }
    let frames = env("BENCH_FRAMES", 2_000_000) as u32;
    let repeat = env("BENCH_REPEAT", 3);
    let flows = env("BENCH_FLOWS", 256) as u32;
    let mut set = NsSet::new();
    let (ext, node, backend) = nodeport_bench::namespaces(&mut set).expect("namespaces");
    // The endpoint counts and drops what arrives (no ARP answered): the node
    // knows its address for good.
    let sink = TestXdp::attach(&backend, "eth0", "bench_sink").expect("sink");
    let endpoint_mac = mac(&backend, "eth0").expect("endpoint MAC");
    let lladdr = endpoint_mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    netns::ip_batch(
        &node,
        &[format!(
            "neigh replace {ENDPOINT} lladdr {lladdr} dev p0 nud permanent"
        )],
    )
    .expect("neighbour");

    let frame = udp_frame(
        mac(&node, "eth0").expect("node MAC"),
        mac(&ext, "eth0").expect("client MAC"),
        (CLIENT, 40000),
        (NODE, NODE_PORT),
    );
    let cluster_frame = udp_frame(
        mac(&node, "eth0").expect("node MAC"),
        mac(&ext, "eth0").expect("client MAC"),
        (CLIENT, 40000),
        (NODE, CLUSTER_NODE_PORT),
    );
    let mut generator = Generator::new(&ext, "eth0", frame, flows).expect("generator");
    let snap = state().snapshot();
    let conf = Confinement::new().expect("cgroup and bpffs");

    let only = std::env::var("BENCH_ROWS").unwrap_or_default();
    let rows: Vec<&str> = [
        "floor",
        "xdp",
        "tc",
        "nftables",
        "xdp-cluster",
        "tc-cluster",
        "nftables-cluster",
    ]
    .into_iter()
    .filter(|r| only.is_empty() || only.split(',').any(|o| o == *r))
    .collect();
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut delivered: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    for _ in 0..repeat {
        for (ri, row) in rows.iter().enumerate() {
            let ebpf = |xdp: XdpMode| {
                let options = EbpfOptions {
                    xdp,
                    ..ebpf_options(&conf)
                };
                let mut d = Driver::without_conntrack(plan_config(), EbpfDataPlane::new(options));
                netns::in_netns(&node, || d.sync(&snap, true))
                    .expect("netns")
                    .expect("ebpf sync");
                d
            };
            let pass = || TestXdp::attach(&node, "eth0", "bench_pass").expect("bench_pass");
            let (mode, frame) = match row.strip_suffix("-cluster") {
                Some(mode) => (mode, &cluster_frame),
                None => (*row, &frame),
            };
            let setup = match mode {
                "floor" => Row::Floor(
                    TestXdp::floor(&node, "eth0", "p0", (ENDPOINT, TARGET_PORT), endpoint_mac)
                        .expect("floor"),
                ),
                "xdp" => Row::Ebpf(Box::new(ebpf(XdpMode::Native)), None),
                "tc" => {
                    let p = pass();
                    Row::Ebpf(Box::new(ebpf(XdpMode::Off)), Some(p))
                }
                _ => {
                    let p = pass();
                    let cmd = NftCommand::from_argv(["ip", "netns", "exec", &node, "nft"])
                        .in_netns(format!("/run/netns/{node}"));
                    let mut d =
                        Driver::without_conntrack(plan_config(), NftDataPlane::with_sink(cmd));
                    d.sync(&snap, true).expect("nft sync");
                    Row::Nft(Box::new(d), p)
                }
            };
            // Warm: the connections (or conntrack entries) of every flow exist.
            generator.run(flows * 4, frame).expect("warm-up");
            std::thread::sleep(Duration::from_millis(200));
            let before = sink.count().expect("sink count");
            let took = generator.run(frames, frame).expect("generator");
            std::thread::sleep(Duration::from_millis(200));
            let got = sink.count().expect("sink count") - before;
            if mode == "xdp" {
                // The XDP program sent them on itself (masqueraded, in the
                // Cluster row), not the stack.
                let sent = svcproxy_dataplane::ebpf::kernel::xdp_packets(&conf.pin_dir())
                    .map_or(0, |[forwarded, _, _]| forwarded);
                assert!(
                    sent >= u64::from(frames),
                    "{row}: the XDP program forwarded {sent} of {frames}"
                );
            }
            results[ri].push(got as f64 / took.as_secs_f64());
            delivered[ri].push(got as f64 / f64::from(frames));
            match setup {
                Row::Floor(x) => drop(x),
                Row::Ebpf(mut d, p) => {
                    netns::in_netns(&node, || d.plane_mut().cleanup())
                        .expect("netns")
                        .expect("ebpf cleanup");
                    drop(p);
                }
                Row::Nft(mut d, p) => {
                    d.plane_mut().cleanup().expect("nft cleanup");
                    drop(p);
                }
            }
        }
    }
    let floor = median(results[0].clone());
    println!(
        "\nUDP NodePort from outside (Local policy; -cluster: Cluster policy, masqueraded), {frames} frames of 64 bytes over {flows} flows, {repeat} runs each (median):"
    );
    println!("| row | packets/s | x floor | delivered |");
    println!("|---|---|---|---|");
    for (ri, row) in rows.iter().enumerate() {
        let pps = median(results[ri].clone());
        println!(
            "| {row} | {pps:.0} | {:.3} | {:.3} |",
            pps / floor,
            median(delivered[ri].clone())
        );
    }
}
