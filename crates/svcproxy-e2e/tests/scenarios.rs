//! Real packets against the shared scenario directories (`testdata/scenarios/`): the same
//! objects the golden tests render, run by the real svcproxy in every mode, and every
//! frontend of the scenario's intent probed to show the verdict the intent promises.
//!
//! Per scenario and mode: the intent is built from the scenario (and must equal its
//! `expected.intent`, so the oracle is the golden file); a three-node cluster gets one
//! pod per endpoint address of the intent (the scenario's own addresses, added to the
//! pod and routed) running an echo server on the endpoint's ports, plus a client pod with
//! an address in the scenario node's pod CIDR; svcproxy runs on the scenario's node with
//! the scenario's configuration as flags and the scenario's files as `--manifests`. Then:
//!
//! - a cluster-IP frontend, probed from the client pod: `forward` is answered by one of the
//!   endpoints of the internal route's set, `reject` refused at once, `drop` a timeout;
//! - an external-IP, load-balancer-IP or NodePort frontend, probed from `ext` (outside the
//!   cluster): first the firewall (`loadBalancerSourceRanges`: a source outside them is
//!   dropped), then the action, and for `forward` the external route's last step (to the
//!   cluster or local set, or drop);
//! - a cluster IP on a port no service exposes: refused (where the mode guards the
//!   service address space; the intent says, from the mode's semantics).
//!
//! For every probe, `svcproxy explain`'s tracer (on the same intent and snapshots, the
//! origin told from the probe's source as the rules tell it) must predict the outcome
//! the packets are checked against: the same endpoints, or the same drop or refusal.
//!
//! What this does not check (the hand-written suite in `dataplane.rs` does): which client
//! address the backend sees (the scenario configurations are not all expressible as
//! flags, e.g. several ClusterCIDRs per family), unallocated ServiceCIDR addresses,
//! traffic from the node itself, affinity and spreading.

// Shared with the other end-to-end test binaries; each uses only part of it.
#[allow(dead_code)]
#[path = "dataplane/support.rs"]
mod support;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Instant;

use support::*;
use svcproxy_core::model::{IpFamily, Protocol};
use svcproxy_e2e::plan::{self, Family};
use svcproxy_e2e::{
    svcproxy_bin, BackendPorts, Backends, Cluster, ClusterSpec, Host, ProbeSpec, Proto, SctpMode,
};
use svcproxy_plan::intent::{
    describe, Action, Disposition, FrontendKey, FrontendKind, NodePortDestinations,
};
use svcproxy_testkit::scenario::{self, Detect, NodePorts, Scenario, ScenarioConfig};

/// One test per scenario directory, each run once per mode.
macro_rules! scenarios {
    ($($name:ident => $case:literal),* $(,)?) => {
        const SCENARIOS: &[&str] = &[$($case),*];
        $(
            fn $name(mode: Mode) {
                run_scenario(mode, $case)
            }
        )*
        per_mode!($($name),*);
    };
}

scenarios! {
    clusterip_basic => "clusterip-basic",
    conflicting_vips => "conflicting-vips",
    dualstack_v4_endpoints => "dualstack-v4-endpoints",
    etp_local_remote_only_drop => "etp-local-remote-only-drop",
    external_ips => "external-ips",
    hostile_names => "hostile-names",
    itp_local => "itp-local",
    loadbalancer_source_ranges_etp_local => "loadbalancer-source-ranges-etp-local",
    masquerade_all_bridge => "masquerade-all-bridge",
    no_endpoints_reject => "no-endpoints-reject",
    nodeport => "nodeport",
    session_affinity => "session-affinity",
    sloppy_addresses => "sloppy-addresses",
    terminating_fallback => "terminating-fallback",
    topology_keys_no_match => "topology-keys-no-match",
}

/// A scenario directory without a real-packet run here fails this test.
#[test]
fn every_scenario_runs_with_real_packets() {
    assert_eq!(SCENARIOS.to_vec(), scenario::cases());
}

/// External and load-balancer IPs of the scenarios' address plan (`cluster.yaml`).
const SCENARIO_EXTERNAL: [&str; 2] = ["203.0.113.0/24", "2001:db8:ee::/64"];

/// The node a scenario address belongs to, by the scenarios' address plan: pods of node
/// n (a = 1) are 198.18.n.0/24 and 2001:db8:n::/64.
fn node_of(ip: IpAddr) -> usize {
    let n = match ip {
        IpAddr::V4(a) => usize::from(a.octets()[2]),
        IpAddr::V6(a) => usize::from(a.segments()[2]),
    };
    assert!(
        (1..=3).contains(&n),
        "{ip} is outside the scenarios' pod CIDRs"
    );
    n - 1
}

/// The client pod's address in node `n`'s scenario pod CIDR.
fn client_ip(n: usize, f: Family) -> IpAddr {
    let n = u8::try_from(n + 1).expect("node");
    match f {
        Family::V4 => IpAddr::V4(Ipv4Addr::new(198, 18, n, 250)),
        Family::V6 => IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, n.into(), 0, 0, 0, 0, 0x250)),
    }
}

fn proto(p: Protocol) -> Proto {
    match p {
        Protocol::Tcp => Proto::Tcp,
        Protocol::Udp => Proto::Udp,
        Protocol::Sctp => Proto::Sctp,
    }
}

fn family(f: IpFamily) -> Family {
    match f {
        IpFamily::V4 => Family::V4,
        IpFamily::V6 => Family::V6,
    }
}

/// The echo server name of the pod holding `ip`.
fn backend_name(ip: IpAddr) -> String {
    format!("ep-{ip}")
}

/// svcproxy flags that give the daemon the scenario's configuration, as far as flags can.
fn config_flags(c: &ScenarioConfig) -> Vec<String> {
    let mut flags = Vec::new();
    if c.masquerade_all {
        flags.push("--masquerade-all".to_string());
    }
    match &c.detect_local {
        None | Some(Detect::NodeCIDR) => flags.push("--detect-local-mode=NodeCIDR".into()),
        // ClusterCIDR without --cluster-cidr: nothing counts as local.
        Some(Detect::None) => flags.push("--detect-local-mode=ClusterCIDR".into()),
        Some(Detect::ClusterCIDR { cidrs }) => {
            // One CIDR per family is all the flag takes: the first of each.
            let first = |v6: bool| {
                cidrs
                    .iter()
                    .find(|c| matches!(c, ipnet::IpNet::V6(_)) == v6)
            };
            let pair: Vec<String> = [first(false), first(true)]
                .into_iter()
                .flatten()
                .map(ToString::to_string)
                .collect();
            flags.push("--detect-local-mode=ClusterCIDR".into());
            flags.push(format!("--cluster-cidr={}", pair.join(",")));
        }
        Some(Detect::BridgeInterface { interface }) => {
            flags.push("--detect-local-mode=BridgeInterface".into());
            flags.push(format!("--pod-bridge-interface={interface}"));
        }
        Some(Detect::InterfaceNamePrefix { interface }) => {
            flags.push("--detect-local-mode=InterfaceNamePrefix".into());
            flags.push(format!("--pod-interface-name-prefix={interface}"));
        }
    }
    match &c.node_port_addresses {
        None | Some(NodePorts::Primary) => flags.push("--nodeport-addresses=primary".into()),
        Some(NodePorts::AllLocal) => flags.push("--nodeport-addresses=0.0.0.0/0,::/0".into()),
        Some(NodePorts::Ips { ips }) => {
            let cidrs: Vec<String> = ips.iter().map(|ip| plan::host_cidr(*ip)).collect();
            flags.push(format!("--nodeport-addresses={}", cidrs.join(",")));
        }
    }
    flags
}

/// What a probe must see.
#[derive(Debug)]
enum Expect {
    /// Answered, by one of these echo servers only.
    Answer(Vec<String>),
    Refuse,
    Drop,
}

/// What `svcproxy explain` predicts for a probe.
#[derive(Debug)]
enum Predicted {
    Answer(Vec<String>),
    Refuse,
    Drop,
    /// Not proxied: no probe expects this.
    Accept(String),
}

impl Predicted {
    /// For a failure message.
    fn show(&self) -> String {
        match self {
            Predicted::Accept(reason) => format!("not proxied ({reason})"),
            other => format!("{other:?}"),
        }
    }

    fn agrees(&self, expect: &Expect) -> bool {
        match (self, expect) {
            (Predicted::Answer(a), Expect::Answer(b)) => {
                let (mut a, mut b) = (a.clone(), b.clone());
                a.sort();
                b.sort();
                a == b
            }
            (Predicted::Refuse, Expect::Refuse) | (Predicted::Drop, Expect::Drop) => true,
            _ => false,
        }
    }
}

/// The tracer's prediction for `p`.
fn explained(
    intent: &svcproxy_plan::Intent,
    update: &svcproxy_core::state::SnapshotUpdate,
    p: &Probe,
) -> Predicted {
    use svcproxy_plan::explain::{explain, Packet, Verdict};
    let packet = Packet {
        from: p.source,
        to: p.target,
        protocol: match p.proto {
            Proto::Tcp => Protocol::Tcp,
            Proto::Udp => Protocol::Udp,
            Proto::Sctp => Protocol::Sctp,
        },
        origin: None,
    };
    match explain(intent, &update.v4, &update.v6, &packet).verdict {
        Verdict::Forward { endpoints, .. } => Predicted::Answer(
            endpoints
                .iter()
                .map(|c| {
                    let addr: SocketAddr = c.address.parse().expect("an endpoint address");
                    backend_name(addr.ip())
                })
                .collect(),
        ),
        Verdict::Reject { .. } => Predicted::Refuse,
        Verdict::Drop { .. } => Predicted::Drop,
        Verdict::Accept { reason } => Predicted::Accept(reason),
    }
}

/// One probe the intent asks for.
struct Probe {
    what: String,
    from: Host,
    source: IpAddr,
    proto: Proto,
    target: SocketAddr,
    expect: Expect,
}

fn run_scenario(mode: Mode, case: &'static str) {
    if !svcproxy_e2e::require_root_or_skip() {
        return;
    }
    let started = Instant::now();
    let sc = Scenario::load(case);
    assert_eq!(
        describe(&sc.intent()),
        sc.expected("expected.intent"),
        "{case}: the intent differs from expected.intent (the golden test says more)"
    );
    // The intent as this mode runs it: the golden one with the mode's semantics (e.g.
    // iptables mode leaves the service address space unguarded, as upstream's does).
    let intent = sc.intent_as(mode.semantics());
    let node = (0..3)
        .find(|n| plan::node_name(*n) == sc.node)
        .unwrap_or_else(|| panic!("{case}: unknown node {}", sc.node));

    // One pod per endpoint address, with the ports the intent sends to it.
    let mut ports: BTreeMap<IpAddr, BackendPorts> = BTreeMap::new();
    for fam in intent.families() {
        for svc in fam.services().values() {
            for ep in svc.endpoints.iter() {
                let p = ports.entry(ep.ip()).or_default();
                let list = match svc.protocol {
                    Protocol::Tcp => &mut p.tcp,
                    Protocol::Udp => &mut p.udp,
                    Protocol::Sctp => &mut p.sctp,
                };
                if !list.contains(&ep.port()) {
                    list.push(ep.port());
                }
            }
        }
    }
    let mut per_node = [0usize; 3];
    let mut pod_of: BTreeMap<IpAddr, Host> = BTreeMap::new();
    for ip in ports.keys() {
        let n = node_of(*ip);
        pod_of.insert(*ip, Host::Pod(n, per_node[n]));
        per_node[n] += 1;
    }
    let client = Host::Pod(node, per_node[node]);
    let pods_per_node = per_node
        .iter()
        .max()
        .copied()
        .unwrap_or(0)
        .max(per_node[node] + 1);

    let c = Cluster::create(ClusterSpec {
        nodes: 3,
        pods_per_node,
        dual_stack: true,
        ext_via: node,
    })
    .expect("create cluster");
    for (ip, pod) in &pod_of {
        c.add_pod_address(*pod, *ip).expect("endpoint address");
    }
    for f in Family::BOTH {
        c.add_pod_address(client, client_ip(node, f))
            .expect("client address");
    }
    for cidr in SCENARIO_EXTERNAL {
        c.route_ext(cidr, node).expect("route external IPs");
    }
    let sctp_ok = c.sctp_mode() != SctpMode::Unavailable;
    let mut procs = Vec::new();
    for (ip, p) in &ports {
        let mut p = p.clone();
        if !sctp_ok {
            p.sctp.clear();
        }
        procs.push(
            c.start_backend(pod_of[ip], &backend_name(*ip), &p)
                .expect("start echo backend"),
        );
    }

    let manifests = tempfile::Builder::new()
        .prefix("svcproxy-scenario-")
        .tempdir()
        .expect("manifests dir");
    for (i, file) in sc.files.iter().enumerate() {
        let name = file.file_name().expect("file name").to_string_lossy();
        std::fs::copy(file, manifests.path().join(format!("{i:02}-{name}")))
            .expect("copy manifest");
    }
    let confinement = support::confine_for(mode, &c);
    let mut env = Env {
        mode,
        proxies: Vec::new(),
        _backends: Backends { procs },
        c,
        manifests,
        started,
        _confinement: confinement,
    };
    let mut argv: Vec<String> = mode.launch(&svcproxy_bin());
    argv.extend([
        "--proxy-mode".into(),
        mode.name().into(),
        "--manifests".into(),
        env.manifests.path().to_string_lossy().into_owned(),
        "--hostname-override".into(),
        sc.node.clone(),
        "--min-sync-period".into(),
        "0s".into(),
    ]);
    argv.extend(support::confinement_args(&env.c, node));
    argv.extend(config_flags(&sc.config));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let proxy = env
        .c
        .spawn(Host::Node(node), &format!("svcproxy-{}", sc.node), &argv)
        .expect("spawn svcproxy");
    env.proxies.push(proxy);
    env.wait_synced(node);

    // The userspace mode does not proxy SCTP (the data-plane suite checks it says so).
    let probes = probes(&intent, node, client, sctp_ok && mode.proxies_sctp());
    let update = sc.state().snapshot();
    let mut ck = Checks::new(case);
    ck.check(!probes.is_empty(), || {
        format!("{case}: the intent asks for no probe")
    });
    for p in &probes {
        let predicted = explained(&intent, &update, p);
        ck.check(predicted.agrees(&p.expect), || {
            format!("explain predicts {} for {}", predicted.show(), p.what)
        });
        let wait = match p.expect {
            Expect::Answer(_) => ANSWER,
            Expect::Refuse => REFUSE_WAIT,
            Expect::Drop => DROP_WAIT,
        };
        let spec = ProbeSpec::new(p.proto, p.target)
            .count(2)
            .timeout(wait)
            .source_ip(p.source);
        let got = env.c.probe_spec(p.from, &spec);
        match &p.expect {
            Expect::Answer(names) => {
                let allowed: Vec<&str> = names.iter().map(String::as_str).collect();
                ck.answered_by(&p.what, &got, &allowed);
            }
            Expect::Refuse => ck.refused_fast(&p.what, &got),
            Expect::Drop => ck.dropped(&p.what, &got),
        }
    }
    eprintln!(
        "[scenarios] {case} ({}): {} probes",
        mode.label(),
        probes.len()
    );
    ck.finish(&env);
}

/// Every probe the intent of `node` asks for (see the module docs).
fn probes(intent: &svcproxy_plan::Intent, node: usize, client: Host, sctp_ok: bool) -> Vec<Probe> {
    let mut out = Vec::new();
    for fam in intent.families() {
        let f = family(fam.family());
        let ext_ip = plan::ext_ip(f);
        for (svc, fr) in fam.frontends() {
            if svc.protocol == Protocol::Sctp && !sctp_ok {
                continue;
            }
            let external = fr.kind.is_external();
            let (from, source) = if external {
                (Host::Ext, ext_ip)
            } else {
                (client, client_ip(node, f))
            };
            let target = match fr.key {
                FrontendKey::Vip { ip, port, .. } => SocketAddr::new(ip, port),
                FrontendKey::NodePort { port, .. } => {
                    let node_ip = plan::node_ip(node, f);
                    let served = match fam.node().map(|n| &n.nodeports) {
                        Some(NodePortDestinations::AllLocal) => true,
                        Some(NodePortDestinations::Ips(ips)) => ips.contains(&node_ip),
                        None => false,
                    };
                    if !served {
                        continue;
                    }
                    SocketAddr::new(node_ip, port)
                }
            };
            let blocked = external
                && fr.firewall
                && svc
                    .firewall
                    .as_ref()
                    .is_some_and(|fw| !fw.ranges.iter().any(|r| r.contains(&ext_ip)));
            let set = if !external {
                Some(svc.internal.set)
            } else {
                match svc.external.as_ref().map(|e| e.rest) {
                    Some(Disposition::Forward(id)) => Some(id),
                    Some(Disposition::Drop) | None => None,
                }
            };
            let expect = match (blocked, fr.action, set) {
                (true, _, _) => Expect::Drop,
                (false, Action::Reject, _) => Expect::Refuse,
                (false, Action::Drop, _) | (false, Action::Forward, None) => Expect::Drop,
                (false, Action::Forward, Some(id)) => Expect::Answer(
                    svc.set(id)
                        .unwrap_or_default()
                        .iter()
                        .map(|ep| backend_name(ep.ip()))
                        .collect(),
                ),
            };
            let kind = match fr.kind {
                FrontendKind::ClusterIp => "cluster IP",
                FrontendKind::ExternalIp => "external IP",
                FrontendKind::LoadBalancerIp => "load-balancer IP",
                FrontendKind::NodePort => "NodePort",
            };
            out.push(Probe {
                what: format!(
                    "{} {from:?} -> {kind} {} of {} (expect {expect:?})",
                    family_name(f),
                    fr.key,
                    svc.name
                ),
                from,
                source,
                proto: proto(svc.protocol),
                target,
                expect,
            });
        }
        // A cluster IP on a port nothing exposes: refused, where the mode guards the
        // service address space.
        let guarded = fam.node().is_some_and(|n| n.guard_service_ips);
        for ip in fam.cluster_ips().filter(|_| guarded) {
            let key = FrontendKey::Vip {
                ip,
                protocol: Protocol::Tcp,
                port: 1,
            };
            if fam.frontend(&key).is_none() {
                out.push(Probe {
                    what: format!("{} cluster IP {ip} on unexposed TCP port 1", family_name(f)),
                    from: client,
                    source: client_ip(node, f),
                    proto: Proto::Tcp,
                    target: SocketAddr::new(ip, 1),
                    expect: Expect::Refuse,
                });
            }
        }
    }
    out
}
