//! Real-packet end-to-end tests of svcproxy's nftables data plane: every item of
//! "What the rules must do" (issue 3), in both families, with real TCP / UDP / SCTP
//! connections between network namespaces.
//!
//! Each test builds its own cluster with the harness (node-a and node-b, pods behind each,
//! `ext` outside; address plan in `svcproxy_e2e::plan`), starts echo backends in every pod,
//! writes Service / EndpointSlice / Node / ServiceCIDR manifests into a fresh directory and
//! runs `svcproxy --manifests DIR --hostname-override node-x --cluster-cidr ...` inside each
//! node namespace. Tests are independent and run in parallel.
//!
//! Observations are collected with [`support::Checks`]: a test runs to its end and then
//! fails with the list of everything that did not hold, plus node-a's ruleset and the
//! svcproxy logs.
//!
//! Outcomes, as the probes tell them apart: an answer names the backend pod, the port it was
//! reached on and the client address it saw; REJECT is a refusal (TCP RST / ICMP
//! unreachable), DROP is a timeout. Where a timeout could also mean "no rule at all" (the
//! LAN router blackholes unknown destinations), the test also checks node-a's ruleset.
//!
//! Which test covers which item of "What the rules must do":
//!
//! | item | test |
//! |------|------|
//! | 1 interception (cluster / external / VIP ingress IPs, NodePorts, TCP/UDP/SCTP) | `captures_…`, `nodeport_addresses_…` |
//! | 2 random DNAT to the endpoint's port | `spreads_300_connections_…` |
//! | 3 REJECT / DROP, unexposed ports, unallocated ServiceCIDR addresses | `rejects_without_endpoints_…` |
//! | 4 SNAT exactly where needed, local detection, `--masquerade-all` | `preserves_or_masquerades_…`, `local_traffic_detection_modes_…`, `masquerade_all_…` |
//! | 5 loadBalancerSourceRanges, short circuit | `load_balancer_source_ranges_…` |
//! | 6 affinity, terminating fallback, topology | `session_affinity_…`, `serving_terminating_…`, `topology_keys_…` |
//! | 7 families on their own, IPv4-mapped addresses | `each_family_is_proxied_on_its_own`, `ipv6_sockets_reach_ipv4_services_by_ipv4_mapped_addresses` (and every test runs both) |
//! | partial sync, deletions | `edits_while_running_…` |
//! | `--once`, `cleanup`, `--cleanup`, SIGTERM | `once_cleanup_and_sigterm` |
//!
//! The harness builds `svcproxy` only when `target/<profile>/svcproxy` is missing: run
//! `cargo build -p svcproxy` first so these tests exercise the current code.

#[path = "dataplane/support.rs"]
mod support;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use support::*;
use svcproxy_e2e::plan::{self, Family};
use svcproxy_e2e::{Host, ProbeSpec, Proto, NODE_A, NODE_B};

// Every test below, once per data plane (`<mode>::<test>`).
per_mode!(
    captures_cluster_ips_node_ports_external_ips_and_vip_ingress_but_not_proxy_ingress,
    external_ips_are_not_served_with_their_feature_gate_off,
    spreads_300_connections_over_3_endpoints_with_each_endpoints_port,
    rejects_without_endpoints_and_drops_local_policies_without_local_endpoints,
    preserves_or_masquerades_the_client_ip_exactly_where_needed,
    masquerade_all_snats_pod_traffic_to_cluster_ips,
    a_node_socket_bound_to_an_address_is_masqueraded_where_upstream_masquerades_the_node,
    local_traffic_detection_modes_decide_masquerading,
    nodeport_addresses_select_the_node_ips,
    localhost_is_not_reachable_from_outside_the_node,
    load_balancer_source_ranges_and_short_circuit,
    session_affinity_sticks_and_expires,
    each_family_is_proxied_on_its_own,
    ipv6_sockets_reach_ipv4_services_by_ipv4_mapped_addresses,
    topology_keys_choose_endpoints_per_node,
    edits_while_running_change_what_answers,
    serving_terminating_endpoints_are_the_fallback,
    once_cleanup_and_sigterm,
    a_second_instance_stands_by_and_takes_over_without_a_failed_connection,
    a_client_port_used_toward_two_services_of_one_endpoint_is_answered_both_times,
);

const A0: Host = Host::Pod(NODE_A, 0);
const A1: Host = Host::Pod(NODE_A, 1);
const A2: Host = Host::Pod(NODE_A, 2);
const B0: Host = Host::Pod(NODE_B, 0);
const B1: Host = Host::Pod(NODE_B, 1);

fn pod_ip(h: Host, f: Family) -> IpAddr {
    match h {
        Host::Pod(n, p) => plan::pod_ip(n, p, f),
        other => panic!("{other:?} is not a pod"),
    }
}

/// The usual TCP + UDP (+ SCTP) ports: 80/tcp, 53/udp, 9000/sctp, all to the backends'
/// 8080 (so the service port always differs from the endpoint port).
fn web_ports(svc: Svc, node_ports: Option<[u16; 3]>) -> Svc {
    let np = |i: usize, p: SvcPort| match node_ports {
        Some(ports) => p.node_port(ports[i]),
        None => p,
    };
    svc.port(np(0, SvcPort::new("http", Proto::Tcp, 80, BACKEND_PORT)))
        .port(np(1, SvcPort::new("dns", Proto::Udp, 53, BACKEND_PORT)))
        .port(np(2, SvcPort::new("sctp", Proto::Sctp, 9000, BACKEND_PORT)))
}

fn tcp_only(svc: Svc, node_port: Option<u16>) -> Svc {
    let p = SvcPort::new("http", Proto::Tcp, 80, BACKEND_PORT);
    svc.port(match node_port {
        Some(n) => p.node_port(n),
        None => p,
    })
}

/// Service port per protocol in [`web_ports`].
fn svc_port(proto: Proto) -> u16 {
    match proto {
        Proto::Tcp => 80,
        Proto::Udp => 53,
        Proto::Sctp => 9000,
    }
}

/// One slice per family, with the same pods in each.
fn slices(svc: &Svc, pods: &[Host]) -> Vec<Slice> {
    svc.cluster_ips
        .iter()
        .map(|ip| Slice::of(svc, Family::of(*ip), pods))
        .collect()
}

fn file(svc: &Svc, pods: &[Host]) -> String {
    svc_file(svc, &slices(svc, pods))
}

fn fname(svc: &Svc) -> String {
    format!("svc-{}.yaml", svc.name)
}

/// Whether `text` mentions `ip` as a whole address (not as the prefix of a longer one).
fn mentions(text: &str, ip: IpAddr) -> bool {
    let want = ip.to_string();
    text.split(|c: char| !(c.is_ascii_hexdigit() || c == '.' || c == ':'))
        .any(|tok| tok == want)
}

// -----------------------------------------------------------------------------------------
// 1. Interception: cluster IPs, NodePorts, external IPs, LB ingress IPs (VIP, not Proxy)
// -----------------------------------------------------------------------------------------

fn captures_cluster_ips_node_ports_external_ips_and_vip_ingress_but_not_proxy_ingress(mode: Mode) {
    let web = web_ports(
        Svc::dual("web", 10).node_port(),
        Some([30080, 30053, 30900]),
    );
    let lb = tcp_only(Svc::dual("lb", 11).load_balancer(), Some(30081))
        .external_ips(&Family::BOTH.map(|f| plan::external_ip(10, f)))
        .ingress(plan::external_ip(11, Family::V4), "VIP")
        .ingress(plan::external_ip(11, Family::V6), "VIP")
        .ingress(plan::external_ip(12, Family::V4), "Proxy")
        .ingress(plan::external_ip(12, Family::V6), "Proxy");
    let Some(env) = Env::start(
        mode,
        EnvSpec::default(),
        &[
            (&fname(&web), file(&web, &[A0, B0])),
            (&fname(&lb), file(&lb, &[A0, B0])),
        ],
    ) else {
        return;
    };
    let mut ck = Checks::new("capture");
    // iptables mode says which backend the node's tools drive (and so drives that one).
    if let Some(want) = mode.variant_logged() {
        let logs = env.proxy_logs();
        ck.check(logs.contains(want), || {
            format!("the logs do not say {want:?}")
        });
    }
    if !mode.proxies_sctp() {
        // Not captured, and said so once per service port: a connection to the
        // cluster IP's SCTP port is refused by the guard of the service addresses.
        let logs = env.proxy_logs();
        ck.check(logs.contains(mode.sctp_not_proxied_logged()), || {
            "the logs do not say SCTP is not proxied".to_string()
        });
        if env.c.sctp_mode() != svcproxy_e2e::SctpMode::Unavailable {
            for f in Family::BOTH {
                let got = env.probe(A1, Proto::Sctp, sa(web.cluster_ip(f), 9000), 1, ANSWER);
                ck.not_answered(
                    &format!("{} sctp pod-a1 -> web cluster IP", family_name(f)),
                    &got,
                );
            }
        }
    }
    let allowed = ["pod-a0", "pod-b0"];
    for f in Family::BOTH {
        let fam = family_name(f);
        // ClusterIP from pods on both nodes, every protocol.
        for proto in env.protos() {
            for from in [A1, B1] {
                let got = env.probe(
                    from,
                    proto,
                    sa(web.cluster_ip(f), svc_port(proto)),
                    4,
                    ANSWER,
                );
                let what = format!("{fam} {proto} {from:?} -> web cluster IP");
                ck.answered_by(&what, &got, &allowed);
                ck.backend_port_is(&what, &got, BACKEND_PORT);
            }
        }
        // NodePorts on both nodes' primary IPs, from outside.
        for proto in env.protos() {
            let np = match proto {
                Proto::Tcp => 30080,
                Proto::Udp => 30053,
                Proto::Sctp => 30900,
            };
            for node in [NODE_A, NODE_B] {
                let got = env.probe(Host::Ext, proto, sa(plan::node_ip(node, f), np), 3, ANSWER);
                let what = format!(
                    "{fam} {proto} ext -> {} NodePort {np}",
                    plan::node_name(node)
                );
                ck.answered_by(&what, &got, &allowed);
                ck.backend_port_is(&what, &got, BACKEND_PORT);
            }
        }
        // External IP and VIP-mode ingress IP from outside (routed to node-a).
        for (what, ip) in [
            ("external IP", plan::external_ip(10, f)),
            ("LB ingress IP (ipMode VIP)", plan::external_ip(11, f)),
        ] {
            let got = env.probe(Host::Ext, Proto::Tcp, sa(ip, 80), 3, ANSWER);
            ck.answered_by(&format!("{fam} ext -> {what} {ip}"), &got, &allowed);
        }
        // Pods and the node itself reach them too (short-circuited to the service).
        for from in [A1, B1, Host::Node(NODE_A)] {
            for ip in [plan::external_ip(10, f), plan::external_ip(11, f)] {
                let got = env.probe(from, Proto::Tcp, sa(ip, 80), 2, ANSWER);
                ck.answered_by(
                    &format!("{fam} {from:?} -> external/LB IP {ip}"),
                    &got,
                    &allowed,
                );
            }
        }
        // Proxy-mode ingress: the LB is in the path, the proxy leaves the IP alone, so the
        // packet just follows node-a's routes (into the LAN router's blackhole).
        let proxy_ip = plan::external_ip(12, f);
        let got = env.probe(Host::Ext, Proto::Tcp, sa(proxy_ip, 80), 1, DROP_WAIT);
        ck.not_answered(&format!("{fam} ext -> ipMode Proxy IP {proxy_ip}"), &got);
        let rules = env.ruleset(NODE_A);
        ck.check(!mentions(&rules, proxy_ip), || {
            format!("{fam}: node-a's rules mention the ipMode Proxy IP {proxy_ip}")
        });
        ck.check(mentions(&rules, plan::external_ip(11, f)), || {
            format!("{fam}: node-a's rules do not mention the VIP ingress IP")
        });
    }
    ck.finish(&env);
}

/// kube-proxy 1.37's `AllowServiceExternalIPs=false` (KEP-5707): Services'
/// `spec.externalIPs` are not served (not even named in the rules), while the same
/// service's cluster IP and its LB ingress IP are.
fn external_ips_are_not_served_with_their_feature_gate_off(mode: Mode) {
    let lb = tcp_only(Svc::dual("noext", 13).load_balancer(), Some(30083))
        .external_ips(&Family::BOTH.map(|f| plan::external_ip(13, f)))
        .ingress(plan::external_ip(14, Family::V4), "VIP")
        .ingress(plan::external_ip(14, Family::V6), "VIP");
    let spec = EnvSpec {
        flags: vec!["--feature-gates=AllowServiceExternalIPs=false".into()],
        ..EnvSpec::default()
    };
    let Some(env) = Env::start(mode, spec, &[(&fname(&lb), file(&lb, &[A0, B0]))]) else {
        return;
    };
    let mut ck = Checks::new("external-ips-gate");
    let allowed = ["pod-a0", "pod-b0"];
    let rules = env.ruleset(NODE_A);
    for f in Family::BOTH {
        let fam = family_name(f);
        let ext_ip = plan::external_ip(13, f);
        let got = env.probe(Host::Ext, Proto::Tcp, sa(ext_ip, 80), 1, DROP_WAIT);
        ck.not_answered(&format!("{fam} ext -> external IP {ext_ip}"), &got);
        ck.check(!mentions(&rules, ext_ip), || {
            format!("{fam}: node-a's rules mention the external IP {ext_ip}")
        });
        let vip = plan::external_ip(14, f);
        let got = env.probe(Host::Ext, Proto::Tcp, sa(vip, 80), 3, ANSWER);
        ck.answered_by(&format!("{fam} ext -> LB ingress IP {vip}"), &got, &allowed);
        let got = env.probe(A1, Proto::Tcp, sa(lb.cluster_ip(f), 80), 3, ANSWER);
        ck.answered_by(&format!("{fam} pod-a1 -> cluster IP"), &got, &allowed);
    }
    ck.finish(&env);
}

// -----------------------------------------------------------------------------------------
// 2. Random, uniform DNAT with the endpoint's port
// -----------------------------------------------------------------------------------------

fn spreads_300_connections_over_3_endpoints_with_each_endpoints_port(mode: Mode) {
    // Named target port: two endpoints serve it on 8080, the third on 8081.
    let svc =
        Svc::dual("spread", 20).port(SvcPort::new("http", Proto::Tcp, 80, 0).named_target("http"));
    let mut parts = vec![svc.yaml()];
    for f in Family::BOTH {
        let sfx = if f == Family::V4 { "v4" } else { "v6" };
        parts.push(
            Slice::with_ports(
                &svc,
                &format!("spread-1-{sfx}"),
                f,
                &[("http", Proto::Tcp, BACKEND_PORT)],
                vec![Ep::pod(A0, f), Ep::pod(B0, f)],
            )
            .yaml(),
        );
        parts.push(
            Slice::with_ports(
                &svc,
                &format!("spread-2-{sfx}"),
                f,
                &[("http", Proto::Tcp, BACKEND_PORT_2)],
                vec![Ep::pod(B1, f)],
            )
            .yaml(),
        );
    }
    let Some(env) = Env::start(mode, EnvSpec::default(), &[("spread.yaml", docs(&parts))]) else {
        return;
    };
    let mut ck = Checks::new("spread");
    for f in Family::BOTH {
        let fam = family_name(f);
        let got = env.probe(A1, Proto::Tcp, sa(svc.cluster_ip(f), 80), 300, ANSWER);
        let t = ck.answered_by(
            &format!("{fam} 300 connections"),
            &got,
            &["pod-a0", "pod-b0", "pod-b1"],
        );
        eprintln!("[dataplane] spread {fam}: {t:?}");
        for b in ["pod-a0", "pod-b0", "pod-b1"] {
            let n = t.get(b).copied().unwrap_or(0);
            ck.check(n >= 50, || {
                format!("{fam}: {b} got {n} of 300 connections (< 50): {t:?}")
            });
            // The userspace proxy's round-robin (its default scheduler) is exact.
            if mode == Mode::Userspace {
                ck.check(n == 100, || {
                    format!("{fam}: {b} got {n} of 300 connections, round-robin gives 100: {t:?}")
                });
            }
        }
        for a in &got {
            if let svcproxy_e2e::ProbeResult::Answered {
                backend,
                backend_port,
                backend_ip,
                ..
            } = &a.result
            {
                let want = if backend == "pod-b1" {
                    BACKEND_PORT_2
                } else {
                    BACKEND_PORT
                };
                let ok = ck.check(*backend_port == want, || {
                    format!("{fam}: {backend} reached on port {backend_port}, expected {want}")
                });
                let ip_ok = ck.check(
                    Some(*backend_ip)
                        == match backend.as_str() {
                            "pod-a0" => Some(pod_ip(A0, f)),
                            "pod-b0" => Some(pod_ip(B0, f)),
                            "pod-b1" => Some(pod_ip(B1, f)),
                            _ => None,
                        },
                    || format!("{fam}: {backend} reached on address {backend_ip}"),
                );
                if !ok || !ip_ok {
                    break;
                }
            }
        }
    }
    ck.finish(&env);
}

// -----------------------------------------------------------------------------------------
// 3. REJECT without endpoints; DROP for eTP/iTP Local without local endpoints; wrong ports
// -----------------------------------------------------------------------------------------

/// REJECT is `reject-chain`: a TCP reset for TCP (an ICMP error can reach a connecting TCP
/// socket before it is ready and cost a SYN retransmit, ~1 s), ICMP port unreachable
/// otherwise. What the planner does with the rest, as upstream nftables mode
/// (`cluster-ips-check`, after DNAT): a service IP on a port it does not expose is rejected
/// (`ip daddr @cluster-ips goto reject-chain`), an unallocated address inside a ServiceCIDR
/// is dropped (`ip daddr { 198.19.0.0/16 } drop`).
fn rejects_without_endpoints_and_drops_local_policies_without_local_endpoints(mode: Mode) {
    let empty = Svc::dual("empty", 30)
        .node_port()
        .port(SvcPort::new("http", Proto::Tcp, 80, BACKEND_PORT).node_port(30180))
        .port(SvcPort::new("dns", Proto::Udp, 53, BACKEND_PORT).node_port(30153));
    let empty_slices: Vec<Slice> = Family::BOTH
        .map(|f| Slice::of(&empty, f, &[]).endpoints(vec![Ep::pod(A0, f).not_ready()]))
        .to_vec();
    let local_np = Svc::dual("local-np", 31)
        .node_port()
        .etp_local(0)
        .port(SvcPort::new("http", Proto::Tcp, 80, BACKEND_PORT).node_port(30181))
        .port(SvcPort::new("dns", Proto::Udp, 53, BACKEND_PORT).node_port(30154));
    let itp = Svc::dual("itp", 32)
        .itp_local()
        .port(SvcPort::new("http", Proto::Tcp, 80, BACKEND_PORT))
        .port(SvcPort::new("dns", Proto::Udp, 53, BACKEND_PORT));
    let web = tcp_only(Svc::dual("web", 33), None);
    let Some(env) = Env::start(
        mode,
        EnvSpec::default(),
        &[
            (&fname(&empty), svc_file(&empty, &empty_slices)),
            (&fname(&local_np), file(&local_np, &[B0])),
            (&fname(&itp), file(&itp, &[B0])),
            (&fname(&web), file(&web, &[B0])),
        ],
    ) else {
        return;
    };
    let mut ck = Checks::new("reject-drop");
    // What `svcproxy explain` must predict for each flow below.
    let mut flows = Vec::new();
    for f in Family::BOTH {
        let fam = family_name(f);
        // No usable endpoint anywhere: REJECT, at once, on every destination.
        for (proto, port, np) in [(Proto::Tcp, 80, 30180), (Proto::Udp, 53, 30153)] {
            let what = format!("{fam} {proto} pod -> cluster IP, no endpoints");
            flows.push((
                what.clone(),
                NODE_A,
                pod_ip(A1, f),
                sa(empty.cluster_ip(f), port),
                proto,
                "reject",
            ));
            flows.push((
                format!("{fam} {proto} ext -> NodePort, no endpoints"),
                NODE_A,
                plan::ext_ip(f),
                sa(plan::node_ip(0, f), np),
                proto,
                "reject",
            ));
            let got = env.probe(A1, proto, sa(empty.cluster_ip(f), port), 2, REFUSE_WAIT);
            ck.refused_fast(&what, &got);
            let got = env.probe(
                Host::Ext,
                proto,
                sa(plan::node_ip(0, f), np),
                2,
                REFUSE_WAIT,
            );
            ck.refused_fast(
                &format!("{fam} {proto} ext -> NodePort, no endpoints"),
                &got,
            );
        }
        // eTP Local, endpoints only on node-b: node-a drops external traffic, node-b serves
        // it with the client IP preserved.
        for (proto, np) in [(Proto::Tcp, 30181), (Proto::Udp, 30154)] {
            flows.push((
                format!(
                    "{fam} {proto} ext -> node-a NodePort, eTP Local, endpoints on node-b only"
                ),
                NODE_A,
                plan::ext_ip(f),
                sa(plan::node_ip(0, f), np),
                proto,
                "drop",
            ));
            flows.push((
                format!("{fam} {proto} ext -> node-b NodePort, eTP Local"),
                NODE_B,
                plan::ext_ip(f),
                sa(plan::node_ip(1, f), np),
                proto,
                "forward",
            ));
            let got = env.probe(Host::Ext, proto, sa(plan::node_ip(0, f), np), 1, DROP_WAIT);
            ck.dropped(
                &format!(
                    "{fam} {proto} ext -> node-a NodePort, eTP Local, endpoints on node-b only"
                ),
                &got,
            );
            let got = env.probe(Host::Ext, proto, sa(plan::node_ip(1, f), np), 2, ANSWER);
            let what = format!("{fam} {proto} ext -> node-b NodePort, eTP Local");
            ck.answered_by(&what, &got, &["pod-b0"]);
            ck.client_kept(mode, &what, &got, plan::ext_ip(f), NODE_B);
        }
        // iTP Local, endpoints only on node-b: pods on node-a are dropped, node-b's served.
        for (proto, port) in [(Proto::Tcp, 80), (Proto::Udp, 53)] {
            let target = sa(itp.cluster_ip(f), port);
            flows.push((
                format!("{fam} {proto} node-a pod -> iTP Local"),
                NODE_A,
                pod_ip(A1, f),
                target,
                proto,
                "drop",
            ));
            flows.push((
                format!("{fam} {proto} node-b pod -> iTP Local"),
                NODE_B,
                pod_ip(B1, f),
                target,
                proto,
                "forward",
            ));
            let got = env.probe(A1, proto, sa(itp.cluster_ip(f), port), 1, DROP_WAIT);
            ck.dropped(
                &format!("{fam} {proto} node-a pod -> iTP Local, endpoints on node-b only"),
                &got,
            );
            let got = env.probe(B1, proto, sa(itp.cluster_ip(f), port), 2, ANSWER);
            ck.answered_by(
                &format!("{fam} {proto} node-b pod -> iTP Local"),
                &got,
                &["pod-b0"],
            );
        }
        // Those timeouts are svcproxy's DROP, not a missing rule (which would also end in
        // the LAN router's blackhole): node-a maps iTP's destinations to `drop`.
        let rules = env.ruleset(NODE_A);
        for (proto, port) in [("tcp", 80), ("udp", 53)] {
            let ip = itp.cluster_ip(f);
            ck.check(mode.shows_drop(&rules, ip, proto, port), || {
                format!("{fam}: node-a's rules do not drop {ip} {proto}/{port} for the iTP Local service")
            });
        }
        // A service IP on a port (or protocol) it does not expose: rejected where the
        // mode guards the service address space (upstream nftables mode); just routed
        // (here into the LAN router's blackhole) where it does not (iptables mode).
        let guarded = mode.guards_service_ips();
        for (proto, port) in [(Proto::Tcp, 81), (Proto::Udp, 80)] {
            let what = format!("{fam} {proto} cluster IP on unexposed port {port}");
            flows.push((
                what.clone(),
                NODE_A,
                pod_ip(A1, f),
                sa(web.cluster_ip(f), port),
                proto,
                if guarded { "reject" } else { "accept" },
            ));
            if guarded {
                let got = env.probe(A1, proto, sa(web.cluster_ip(f), port), 1, REFUSE_WAIT);
                ck.refused_fast(&what, &got);
            } else {
                let got = env.probe(A1, proto, sa(web.cluster_ip(f), port), 1, DROP_WAIT);
                ck.not_answered(&what, &got);
            }
        }
        // And the exposed one works (so the rejections above are about the port).
        let got = env.probe(A1, Proto::Tcp, sa(web.cluster_ip(f), 80), 1, ANSWER);
        ck.answered_by(
            &format!("{fam} web cluster IP on its port"),
            &got,
            &["pod-b0"],
        );
        // An unallocated address inside the ServiceCIDR: dropped (guarded) or routed.
        let unallocated = plan::cluster_ip(250, f);
        let got = env.probe(A1, Proto::Tcp, sa(unallocated, 80), 1, DROP_WAIT);
        let what = format!("{fam} unallocated ServiceCIDR address {unallocated}");
        flows.push((
            what.clone(),
            NODE_A,
            pod_ip(A1, f),
            sa(unallocated, 80),
            Proto::Tcp,
            if guarded { "drop" } else { "accept" },
        ));
        if guarded {
            ck.dropped(&what, &got);
        } else {
            ck.not_answered(&what, &got);
        }
        let cidr = plan::service_cidr(f);
        let drop_rule = mode.shows_cidr_drop(&rules, cidr);
        ck.check(drop_rule == guarded, || {
            format!("{fam}: node-a's rules drop the ServiceCIDR {cidr}: {drop_rule}, expected {guarded}")
        });
    }
    env.check_explained(&mut ck, &flows);
    ck.finish(&env);
}

// -----------------------------------------------------------------------------------------
// 4. Source IP the backend sees: preserved, SNAT to the node, hairpin, --masquerade-all
// -----------------------------------------------------------------------------------------

fn preserves_or_masquerades_the_client_ip_exactly_where_needed(mode: Mode) {
    let same = Svc::dual("same", 40)
        .port(SvcPort::new("http", Proto::Tcp, 80, BACKEND_PORT))
        .port(SvcPort::new("dns", Proto::Udp, 53, BACKEND_PORT));
    let np_cluster = Svc::dual("np-cluster", 41)
        .node_port()
        .port(SvcPort::new("http", Proto::Tcp, 80, BACKEND_PORT).node_port(30280))
        .port(SvcPort::new("dns", Proto::Udp, 53, BACKEND_PORT).node_port(30253));
    let np_local = tcp_only(
        Svc::dual("np-local", 42).node_port().etp_local(0),
        Some(30281),
    );
    let Some(env) = Env::start(
        mode,
        EnvSpec::default(),
        &[
            (&fname(&same), file(&same, &[A0])),
            (&fname(&np_cluster), file(&np_cluster, &[B0])),
            (&fname(&np_local), file(&np_local, &[A0])),
        ],
    ) else {
        return;
    };
    let mut ck = Checks::new("source-ip");
    let mut checks = Vec::new();
    for f in Family::BOTH {
        let fam = family_name(f);
        for (proto, port) in [(Proto::Tcp, 80), (Proto::Udp, 53)] {
            let target = sa(same.cluster_ip(f), port);
            let a0 = pod_ip(A0, f);
            // Pod -> cluster IP -> endpoint on the same node: client IP preserved.
            let got = env.probe(A1, proto, target, 2, ANSWER);
            let what = format!("{fam} {proto} pod-a1 -> cluster IP -> pod-a0 (same node)");
            checks.push((
                what.clone(),
                NODE_A,
                pod_ip(A1, f),
                target,
                proto,
                a0,
                false,
            ));
            ck.answered_by(&what, &got, &["pod-a0"]);
            ck.client_kept(mode, &what, &got, pod_ip(A1, f), NODE_A);
            // From a pod on the other node: still preserved (pod traffic is never SNATed).
            let got = env.probe(B1, proto, target, 2, ANSWER);
            let what = format!("{fam} {proto} pod-b1 -> cluster IP -> pod-a0 (other node)");
            checks.push((
                what.clone(),
                NODE_B,
                pod_ip(B1, f),
                target,
                proto,
                a0,
                false,
            ));
            ck.answered_by(&what, &got, &["pod-a0"]);
            ck.client_kept(mode, &what, &got, pod_ip(B1, f), NODE_B);
            // Hairpin: pod-a0 reaches itself through its service: SNAT to the node (its
            // pod-side gateway address), never its own address.
            let got = env.probe(A0, proto, target, 2, ANSWER);
            let what = format!("{fam} {proto} hairpin pod-a0 -> cluster IP -> pod-a0");
            checks.push((what.clone(), NODE_A, a0, target, proto, a0, true));
            ck.answered_by(&what, &got, &["pod-a0"]);
            ck.client_is(&what, &got, plan::pod_gateway(NODE_A, f));
            // ext -> NodePort (eTP Cluster) on node-a -> endpoint on node-b: SNAT to node-a.
            let np = if proto == Proto::Tcp { 30280 } else { 30253 };
            let np_target = sa(plan::node_ip(0, f), np);
            let got = env.probe(Host::Ext, proto, np_target, 2, ANSWER);
            let what = format!("{fam} {proto} ext -> node-a NodePort (eTP Cluster) -> pod-b0");
            checks.push((
                what.clone(),
                NODE_A,
                plan::ext_ip(f),
                np_target,
                proto,
                pod_ip(B0, f),
                true,
            ));
            ck.answered_by(&what, &got, &["pod-b0"]);
            ck.client_is(&what, &got, plan::node_ip(NODE_A, f));
        }
        // ext -> NodePort (eTP Local) -> local endpoint: client IP preserved.
        let got = env.probe(
            Host::Ext,
            Proto::Tcp,
            sa(plan::node_ip(0, f), 30281),
            2,
            ANSWER,
        );
        let what = format!("{fam} ext -> node-a NodePort (eTP Local) -> pod-a0");
        checks.push((
            what.clone(),
            NODE_A,
            plan::ext_ip(f),
            sa(plan::node_ip(0, f), 30281),
            Proto::Tcp,
            pod_ip(A0, f),
            false,
        ));
        ck.answered_by(&what, &got, &["pod-a0"]);
        ck.client_kept(mode, &what, &got, plan::ext_ip(f), NODE_A);
    }
    // `svcproxy explain` must predict what each flow shows: masqueraded exactly when
    // the backend saw another address than the client's.
    let mut explained = |what: &str,
                         node: usize,
                         from: IpAddr,
                         to: SocketAddr,
                         proto: Proto,
                         endpoint: IpAddr,
                         masqueraded: bool| {
        let predicted = env.explain_masquerades(node, from, to, proto, endpoint);
        ck.check(predicted == Some(masqueraded), || {
            format!(
                "{what}: explain predicts masquerade {predicted:?}, the packets show {masqueraded}"
            )
        });
    };
    for (what, node, from, to, proto, endpoint, masqueraded) in checks {
        explained(&what, node, from, to, proto, endpoint, masqueraded);
    }
    ck.finish(&env);
}

fn masquerade_all_snats_pod_traffic_to_cluster_ips(mode: Mode) {
    masquerade_all(mode, false);
}

/// Issue 52 item 4: in the eBPF modes, with the pods' sockets translated at
/// connect() (as in a cluster: the DaemonSet's cgroup holds every pod), a pod's
/// connection to a cluster IP under `--masquerade-all` is left to the packet path,
/// which masquerades it as upstream does: the endpoint sees the node's address.
/// (Translated at the socket, it kept the pod's: tried.)
#[test]
fn masquerade_all_snats_pod_connections_the_ebpf_modes_would_translate_at_connect() {
    for mode in [Mode::Ebpf, Mode::Ipvs] {
        masquerade_all(mode, true);
    }
}

/// Issue 52 item 4: the node's own connection to a cluster IP from a socket bound
/// to one of its addresses is masqueraded exactly where upstream's rules
/// masquerade the node's packets from that source. Bound to its address on the
/// pods' side (inside the cluster CIDR, which the default detector takes for a
/// pod's source), it is not masqueraded: the endpoint on node-b sees that address.
/// Under `--masquerade-all` it is: the endpoint sees node-a's own. The eBPF modes
/// translate the socket at connect() (node-a's processes are in its cgroup) and
/// masqueraded every bound socket before (tried); the userspace proxy connects
/// from a socket of its own, which the kernel gives node-a's address.
fn a_node_socket_bound_to_an_address_is_masqueraded_where_upstream_masquerades_the_node(
    mode: Mode,
) {
    let remote = tcp_only(Svc::dual("bound", 49), None);
    for masquerade_all in [false, true] {
        let flags = if masquerade_all {
            vec!["--masquerade-all".to_string()]
        } else {
            Vec::new()
        };
        let Some(env) = Env::start(
            mode,
            EnvSpec {
                flags,
                ..EnvSpec::default()
            },
            &[(&fname(&remote), file(&remote, &[B0]))],
        ) else {
            return;
        };
        let mut ck = Checks::new("bound-source");
        for f in Family::BOTH {
            let source = plan::pod_gateway(NODE_A, f);
            let spec = ProbeSpec::new(Proto::Tcp, sa(remote.cluster_ip(f), 80))
                .count(2)
                .timeout(ANSWER)
                .source_ip(source);
            let got = env.c.probe_spec(Host::Node(NODE_A), &spec);
            let what = format!(
                "{} node-a bound to {source} -> cluster IP -> pod-b0{}",
                family_name(f),
                if masquerade_all {
                    " (--masquerade-all)"
                } else {
                    ""
                }
            );
            ck.answered_by(&what, &got, &["pod-b0"]);
            let want = if masquerade_all || mode == Mode::Userspace {
                plan::node_ip(NODE_A, f)
            } else {
                source
            };
            ck.client_is(&what, &got, want);
        }
        ck.finish(&env);
    }
}

fn masquerade_all(mode: Mode, pods_at_connect: bool) {
    let local = tcp_only(Svc::dual("to-local", 43), None);
    let remote = tcp_only(Svc::dual("to-remote", 44), None);
    let Some(env) = Env::start(
        mode,
        EnvSpec {
            flags: vec!["--masquerade-all".into()],
            pods_at_connect,
            ..EnvSpec::default()
        },
        &[
            (&fname(&local), file(&local, &[A0])),
            (&fname(&remote), file(&remote, &[B0])),
        ],
    ) else {
        return;
    };
    let mut ck = Checks::new("masquerade-all");
    for f in Family::BOTH {
        let fam = family_name(f);
        let got = env.probe(A1, Proto::Tcp, sa(local.cluster_ip(f), 80), 2, ANSWER);
        let what = format!("{fam} --masquerade-all pod-a1 -> pod-a0 (same node)");
        ck.answered_by(&what, &got, &["pod-a0"]);
        ck.client_is(&what, &got, plan::pod_gateway(NODE_A, f));
        let got = env.probe(A1, Proto::Tcp, sa(remote.cluster_ip(f), 80), 2, ANSWER);
        let what = format!("{fam} --masquerade-all pod-a1 -> pod-b0 (other node)");
        ck.answered_by(&what, &got, &["pod-b0"]);
        ck.client_is(&what, &got, plan::node_ip(NODE_A, f));
    }
    ck.finish(&env);
}

/// `--detect-local-mode`: which sources count as this node's pods decides whether traffic
/// to a cluster IP is masqueraded. The node itself is never a pod.
fn local_traffic_detection_modes_decide_masquerading(mode: Mode) {
    let remote = tcp_only(Svc::dual("remote", 45), None);
    let detection: [(&str, &[&str], bool); 4] = [
        ("NodeCIDR", &["--detect-local-mode=NodeCIDR"], true),
        (
            "InterfaceNamePrefix p (the pod veths)",
            &[
                "--detect-local-mode=InterfaceNamePrefix",
                "--pod-interface-name-prefix=p",
            ],
            true,
        ),
        (
            "InterfaceNamePrefix veth (no such interface)",
            &[
                "--detect-local-mode=InterfaceNamePrefix",
                "--pod-interface-name-prefix=veth",
            ],
            false,
        ),
        (
            "BridgeInterface cbr0 (no such bridge)",
            &[
                "--detect-local-mode=BridgeInterface",
                "--pod-bridge-interface=cbr0",
            ],
            false,
        ),
    ];
    let mut ck = Checks::new("detect-local");
    let mut last = None;
    for (detect, flags, pods_are_local) in detection {
        let Some(env) = Env::start(
            mode,
            EnvSpec {
                flags: flags.iter().map(|s| s.to_string()).collect(),
                ..EnvSpec::default()
            },
            &[(&fname(&remote), file(&remote, &[B0]))],
        ) else {
            return;
        };
        for f in Family::BOTH {
            let fam = family_name(f);
            let target = sa(remote.cluster_ip(f), 80);
            let got = env.probe(A1, Proto::Tcp, target, 2, ANSWER);
            let what = format!("{fam} {detect}: pod-a1 -> cluster IP -> pod-b0");
            ck.answered_by(&what, &got, &["pod-b0"]);
            let want = if pods_are_local {
                pod_ip(A1, f)
            } else {
                plan::node_ip(NODE_A, f)
            };
            ck.client_kept(mode, &what, &got, want, NODE_A);
            let got = env.probe(Host::Node(NODE_A), Proto::Tcp, target, 2, ANSWER);
            let what = format!("{fam} {detect}: node-a itself -> cluster IP -> pod-b0");
            ck.answered_by(&what, &got, &["pod-b0"]);
            ck.client_is(&what, &got, plan::node_ip(NODE_A, f));
        }
        if !ck.is_ok() {
            ck.finish(&env);
        }
        last = Some(env);
    }
    if let Some(env) = last {
        ck.finish(&env);
    }
}

/// `--nodeport-addresses`: NodePorts are accepted on the node's primary IPs by default (and
/// with `primary`), and on exactly the local addresses inside the given CIDRs otherwise.
fn nodeport_addresses_select_the_node_ips(mode: Mode) {
    let np = tcp_only(Svc::dual("np", 46).node_port(), Some(30600));
    let pod_cidrs = format!(
        "--nodeport-addresses={},{}",
        plan::cluster_cidr(Family::V4),
        plan::cluster_cidr(Family::V6)
    );
    let cases: [(&str, Vec<String>, bool); 3] = [
        ("default", vec![], true),
        ("primary", vec!["--nodeport-addresses=primary".into()], true),
        ("pod-side CIDRs", vec![pod_cidrs], false),
    ];
    let mut ck = Checks::new("nodeport-addresses");
    let mut last = None;
    for (name, flags, on_primary) in cases {
        let Some(env) = Env::start(
            mode,
            EnvSpec {
                flags: flags.clone(),
                ..EnvSpec::default()
            },
            &[(&fname(&np), file(&np, &[B0]))],
        ) else {
            return;
        };
        // Each probe, with whether it is answered: `explain` (run with the same
        // flags) must predict a forward exactly for those.
        let mut flows: Vec<Flow<&'static str>> = Vec::new();
        // What explain says of a probe that is not answered: the packet reaches the
        // node's own stack (nothing listens), or nftables mode rejects it before (a
        // NodePort on loopback not named in --nodeport-addresses, with 1.38's
        // KubeProxyNFTablesLocalhostNodePorts on by default).
        let unanswered = |to: SocketAddr| {
            if to.ip().is_loopback() && mode == Mode::Nftables {
                "reject"
            } else {
                "accept"
            }
        };
        let mut expect = |ck: &mut Checks, flow: (String, Host, usize, SocketAddr), answered| {
            let (what, from, node, to) = flow;
            let got = env.probe(from, Proto::Tcp, to, 1 + usize::from(answered), ANSWER);
            if answered {
                ck.answered_by(&what, &got, &["pod-b0"]);
            } else {
                ck.not_answered(&what, &got);
            }
            let from_ip = match from {
                Host::Ext => plan::ext_ip(Family::of(to.ip())),
                Host::Node(_) => to.ip(),
                pod => pod_ip(pod, Family::of(to.ip())),
            };
            let predicted = if answered { "forward" } else { unanswered(to) };
            flows.push((what, node, from_ip, to, Proto::Tcp, predicted));
        };
        for f in Family::BOTH {
            let fam = family_name(f);
            let primary = sa(plan::node_ip(NODE_A, f), 30600);
            let gateway = sa(plan::pod_gateway(NODE_A, f), 30600);
            let what = format!("{fam} {name}: ext -> node-a primary IP NodePort");
            let what2 = format!("{fam} {name}: pod-a1 -> node-a pod-side address NodePort");
            // Without --nodeport-addresses, iptables mode serves NodePorts on every
            // local address (as upstream's does); nftables mode on the primary IP.
            let every = name == "default" && mode.default_nodeports_on_every_address();
            expect(
                &mut ck,
                (what, Host::Ext, NODE_A, primary),
                every || on_primary,
            );
            expect(&mut ck, (what2, A1, NODE_A, gateway), every || !on_primary);
        }
        // NodePorts on 127.0.0.1, from the node itself: iptables mode serves them by
        // default (`--iptables-localhost-nodeports`; masqueraded, with route_localnet),
        // the userspace mode too (its proxy on loopback), nftables mode only with
        // `--nodeport-localhost`; on ::1 only the userspace mode's proxy can.
        if name == "default" {
            let lo4 = sa(IpAddr::from([127, 0, 0, 1]), 30600);
            let what = "IPv4 default: node-a -> 127.0.0.1 NodePort".to_string();
            let node = Host::Node(NODE_A);
            expect(
                &mut ck,
                (what, node, NODE_A, lo4),
                mode.localhost_nodeports(),
            );
            let lo6 = sa(IpAddr::from(std::net::Ipv6Addr::LOCALHOST), 30600);
            let what = "IPv6 default: node-a -> [::1] NodePort".to_string();
            expect(
                &mut ck,
                (what, node, NODE_A, lo6),
                mode.localhost_nodeports_ipv6(),
            );
        }
        env.check_explained_with(&mut ck, &flags, &flows);
        if !ck.is_ok() {
            ck.finish(&env);
        }
        last = Some(env);
    }
    if let Some(env) = last {
        ck.finish(&env);
    }
}

/// A DaemonSet written for kube-proxy 1.37 that sets no mode runs iptables there
/// (KEP-5343): NodePorts on every local address and on 127.0.0.1. svcproxy started
/// without `--proxy-mode` does the same, as real packets show, and warns once that
/// the default will change.
#[test]
fn the_unset_mode_serves_nodeports_as_kube_proxys_iptables_mode() {
    let np = tcp_only(Svc::dual("np", 47).node_port(), Some(30610));
    let Some(env) = Env::start(
        Mode::Iptables,
        EnvSpec {
            flags: vec!["--proxy-mode=".into()],
            ..EnvSpec::default()
        },
        &[(&fname(&np), file(&np, &[B0]))],
    ) else {
        return;
    };
    let mut ck = Checks::new("unset mode");
    let v4 = |ip: IpAddr| sa(ip, 30610);
    for (what, from, to) in [
        (
            "ext -> node-a primary IP NodePort",
            Host::Ext,
            v4(plan::node_ip(NODE_A, Family::V4)),
        ),
        (
            "pod-a1 -> node-a pod-side address NodePort (not the primary IP)",
            A1,
            v4(plan::pod_gateway(NODE_A, Family::V4)),
        ),
        (
            "node-a itself -> 127.0.0.1 NodePort",
            Host::Node(NODE_A),
            v4(IpAddr::from([127, 0, 0, 1])),
        ),
    ] {
        let got = env.probe(from, Proto::Tcp, to, 2, ANSWER);
        ck.answered_by(what, &got, &["pod-b0"]);
    }
    let logs = env.proxy_logs();
    ck.check(logs.contains("no proxy mode set: running iptables"), || {
        format!("no warning that no mode is set in the logs:\n{logs}")
    });
    ck.check(
        Mode::Iptables.programmed(&env.c, NODE_A) == [true, true],
        || "svcproxy's iptables chains are not in node-a".to_string(),
    );
    ck.finish(&env);
}

/// The node's delivered-or-unclaimed UDP datagram count (`Udp: InDatagrams + NoPorts` of
/// its namespace): what reached its UDP layer, listener or not.
fn udp_delivered(env: &Env, node: usize) -> u64 {
    snmp_sum(env, node, "Udp", &["InDatagrams", "NoPorts"])
}

/// The sum of the `fields` of the `proto` lines of the node's `/proc/net/snmp`.
fn snmp_sum(env: &Env, node: usize, proto: &str, fields: &[&str]) -> u64 {
    let snmp = env.c.exec_ok(Host::Node(node), &["cat", "/proc/net/snmp"]);
    let prefix = format!("{proto}: ");
    let mut lines = snmp.lines().filter(|l| l.starts_with(&prefix));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        panic!("no {proto} lines in /proc/net/snmp:\n{snmp}");
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .filter(|(n, _)| fields.contains(n))
        .map(|(_, v)| v.parse::<u64>().expect("a counter"))
        .sum()
}

/// CVE-2020-8558: localhost NodePorts need `route_localnet=1`, which would let a
/// neighbour reach services bound to 127.0.0.1 by sending packets addressed to
/// 127.0.0.1 to the node. A mode that serves them installs upstream's guard (drop
/// packets to 127.0.0.0/8 from other sources unless DNATed); the others leave
/// `route_localnet` off, so the kernel drops them as martians. A real packet from the
/// external host to node-a's 127.0.0.1 shows it; with the guard removed by hand the same
/// packet gets in, so the check can fail.
fn localhost_is_not_reachable_from_outside_the_node(mode: Mode) {
    let np = tcp_only(Svc::dual("np", 47).node_port(), Some(30601));
    let Some(env) = Env::start(mode, EnvSpec::default(), &[(&fname(&np), file(&np, &[B0]))]) else {
        return;
    };
    let mut ck = Checks::new("localnet-guard");
    let localnet = env.c.exec_ok(
        Host::Node(NODE_A),
        &["sysctl", "-n", "net.ipv4.conf.all.route_localnet"],
    );
    let want = if mode.needs_route_localnet() {
        "1"
    } else {
        "0"
    };
    ck.check(localnet.trim() == want, || {
        format!("route_localnet is {:?}, want {want}", localnet.trim())
    });
    route_ext_loopback_via_node_a(&env);
    let send = || {
        let before = udp_delivered(&env, NODE_A);
        let spec = ProbeSpec::new(Proto::Udp, sa(IpAddr::from([127, 0, 0, 1]), 5999))
            .count(3)
            .timeout(Duration::from_millis(200))
            .source_ip(plan::ext_ip(Family::V4));
        env.c.probe_spec(Host::Ext, &spec);
        thread::sleep(Duration::from_millis(200));
        udp_delivered(&env, NODE_A) - before
    };
    let got = send();
    ck.check(got == 0, || {
        format!("{got} datagrams from ext to node-a's 127.0.0.1 reached its UDP layer")
    });
    if mode == Mode::Userspace {
        // The proxy serves localhost NodePorts to the node itself, without
        // route_localnet; a packet from outside to 127.0.0.1:NodePort is not captured
        // (then the kernel drops it as a martian). Without the capture's guard the
        // same packet would be redirected to the proxy.
        let local = sa(IpAddr::from([127, 0, 0, 1]), 30601);
        let got = env.probe(Host::Node(NODE_A), Proto::Tcp, local, 2, ANSWER);
        ck.answered_by("node-a itself -> 127.0.0.1 NodePort", &got, &["pod-b0"]);
        outside_packets_to_a_loopback_nodeport_are_not_captured(&env, &mut ck, local, || {
            mode.remove_localnet_guard(&env.c, NODE_A)
        });
    } else if mode.remove_localnet_guard(&env.c, NODE_A) {
        let got = send();
        ck.check(got > 0, || {
            "with the guard removed, datagrams to 127.0.0.1 still did not arrive: \
             the check above proves nothing"
                .to_string()
        });
    }
    ck.finish(&env);
}

/// Makes ext send packets for 127.0.0.1 to node-a (policy routing ahead of its own
/// local table), as a hostile neighbour would.
fn route_ext_loopback_via_node_a(env: &Env) {
    let node = plan::node_ip(NODE_A, Family::V4).to_string();
    for argv in [
        &["ip", "rule", "add", "pref", "10", "table", "local"][..],
        &["ip", "rule", "del", "pref", "0"][..],
        &[
            "ip",
            "rule",
            "add",
            "pref",
            "5",
            "to",
            "127.0.0.1/32",
            "lookup",
            "100",
        ][..],
        &[
            "ip",
            "route",
            "add",
            "127.0.0.1/32",
            "via",
            &node,
            "table",
            "100",
        ][..],
    ] {
        env.c.exec_ok(Host::Ext, argv);
    }
}

/// With ext routing 127.0.0.1 to node-a ([`route_ext_loopback_via_node_a`]): a TCP
/// connection from ext to node-a's 127.0.0.1 NodePort `local` is not answered and
/// not one segment of it reaches node-a's TCP layer (the capture leaves it alone;
/// the kernel drops it as a martian). With the capture's guard removed by hand
/// (`remove_guard`) the segments arrive, so the check can fail.
fn outside_packets_to_a_loopback_nodeport_are_not_captured(
    env: &Env,
    ck: &mut Checks,
    local: SocketAddr,
    remove_guard: impl Fn() -> bool,
) {
    // TCP segments reaching node-a's TCP layer (the SYN and its retries); the
    // answer could not reach ext anyway (its source would be 127.0.0.1).
    let from_ext = || {
        let before = snmp_sum(env, NODE_A, "Tcp", &["InSegs"]);
        let spec = ProbeSpec::new(Proto::Tcp, local)
            .count(1)
            .timeout(Duration::from_millis(500))
            .source_ip(plan::ext_ip(Family::V4));
        let got = env.c.probe_spec(Host::Ext, &spec);
        (got, snmp_sum(env, NODE_A, "Tcp", &["InSegs"]) - before)
    };
    let (got, segments) = from_ext();
    ck.not_answered("ext -> node-a's 127.0.0.1 NodePort", &got);
    ck.check(segments == 0, || {
        format!(
            "{segments} TCP segments from ext to node-a's 127.0.0.1 NodePort reached its TCP layer"
        )
    });
    if remove_guard() {
        let (_, segments) = from_ext();
        ck.check(segments > 0, || {
            "with the guard removed, segments to 127.0.0.1's NodePort still did not \
             arrive: the check above proves nothing"
                .to_string()
        });
    }
}

/// nftables mode with `--nodeport-localhost`: NodePorts answer on 127.0.0.1 and ::1
/// of the node itself, TCP and UDP, through the userspace proxy's forwarder on
/// loopback (the endpoint sees the node's own address toward it), with `route_localnet` left
/// at 0; the same NodePort on the node's address is still DNATed by the kernel
/// (ext's address kept with `externalTrafficPolicy: Local`), and a packet from
/// outside to 127.0.0.1 is never captured. Upstream's nftables mode has no
/// localhost NodePorts at all; without the flag neither has svcproxy's (the
/// default, checked by `localhost_is_not_reachable_from_outside_the_node`).
#[test]
fn nftables_mode_serves_localhost_nodeports_through_the_proxy() {
    nftables_localhost_nodeports(
        "nftables-localhost-nodeports",
        &["--nodeport-localhost"],
        false,
    );
}

/// kube-proxy 1.37's way to ask for them (KEP-6032): the
/// `KubeProxyNFTablesLocalhostNodePorts` gate, and loopback named among the NodePort
/// addresses. As upstream's, TCP is served and UDP rejected (and counted).
#[test]
fn nftables_mode_serves_localhost_nodeports_with_kube_proxy_s_gate() {
    nftables_localhost_nodeports(
        "nftables-localhost-nodeports-gate",
        &[
            "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true",
            "--nodeport-addresses=primary,localhost",
        ],
        true,
    );
}

/// The gate on, loopback not named: every NodePort on loopback is refused at once
/// (a TCP reset, an ICMP error for UDP) and counted, while the node's own address
/// still answers.
#[test]
fn nftables_mode_rejects_unserved_localhost_nodeports_with_kube_proxy_s_gate() {
    nftables_localhost_rejects(
        "nftables-localhost-nodeports-rejected",
        &["--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true"],
        true,
    );
}

/// kube-proxy 1.38 turns KEP-6032's gate on by default (k/k#142490): a DaemonSet
/// that sets no gate gets the rejects and their counters; setting the gate false
/// keeps 1.37's default, with no reject chain and no counter.
#[test]
fn nftables_mode_rejects_localhost_nodeports_by_default_as_kube_proxy_1_38() {
    nftables_localhost_rejects("nftables-localhost-nodeports-1-38", &[], true);
    nftables_localhost_rejects(
        "nftables-localhost-nodeports-1-37",
        &["--feature-gates=KubeProxyNFTablesLocalhostNodePorts=false"],
        false,
    );
}

/// NodePorts on loopback with `flags`: refused either way (nothing serves them),
/// and, when `rejects`, by svcproxy's rules, counted.
fn nftables_localhost_rejects(name: &'static str, flags: &[&str], rejects: bool) {
    let svc = Svc::dual("lhr", 47)
        .node_port()
        .port(SvcPort::new("http", Proto::Tcp, 80, BACKEND_PORT).node_port(30611))
        .port(SvcPort::new("dns", Proto::Udp, 53, BACKEND_PORT).node_port(30612));
    let spec = EnvSpec {
        flags: flags.iter().map(|f| f.to_string()).collect(),
        ..EnvSpec::default()
    };
    let Some(env) = Env::start(Mode::Nftables, spec, &[(&fname(&svc), file(&svc, &[A0]))]) else {
        return;
    };
    let mut ck = Checks::new(name);
    for f in Family::BOTH {
        let loopback: IpAddr = match f {
            Family::V4 => "127.0.0.1".parse().unwrap(),
            Family::V6 => "::1".parse().unwrap(),
        };
        for (proto, port) in [(Proto::Tcp, 30611), (Proto::Udp, 30612)] {
            let got = env.probe(Host::Node(NODE_A), proto, sa(loopback, port), 2, ANSWER);
            ck.refused_locally(&format!("node-a -> {} {proto:?}", sa(loopback, port)), &got);
        }
        let node = sa(plan::node_ip(NODE_A, f), 30611);
        let got = env.probe(Host::Node(NODE_A), Proto::Tcp, node, 2, ANSWER);
        ck.answered_by(&format!("node-a -> {node}"), &got, &["pod-a0"]);
    }
    let metrics = node_a_metrics(&env);
    for f in ["IPv4", "IPv6"] {
        for p in ["TCP", "UDP"] {
            let n = rejected(&metrics, f, p);
            if rejects {
                ck.check(n.is_some_and(|n| n >= 2), || {
                    format!("{f} {p} rejections counted: {n:?}, want at least the 2 probes")
                });
            } else {
                ck.check(n.is_none(), || {
                    format!("{f} {p} rejections counted ({n:?}) with the gate off")
                });
            }
        }
    }
    let table = env.c.exec_ok(
        Host::Node(NODE_A),
        &["nft", "list", "table", "ip", "svcproxy"],
    );
    ck.check(
        table.contains("localhost-nodeport-reject") == rejects,
        || {
            format!(
                "reject chains {}: {table}",
                if rejects { "missing" } else { "present" }
            )
        },
    );
    ck.finish(&env);
}

/// node-a's own /metrics.
fn node_a_metrics(env: &Env) -> String {
    let loopback: IpAddr = "127.0.0.1".parse().unwrap();
    get(env, Host::Node(NODE_A), loopback, 10249, "/metrics")
        .map(|a| a.body)
        .unwrap_or_default()
}

/// KEP-6032's rejected packets of a family and protocol, from `metrics`.
fn rejected(metrics: &str, family: &str, protocol: &str) -> Option<u64> {
    count_of(
        metrics,
        &format!(
            "kubeproxy_nftables_localhost_nodeport_rejected_packets_total\
             {{ip_family=\"{family}\",protocol=\"{protocol}\"}}"
        ),
    )
}

/// Localhost NodePorts through the forwarder: TCP, and UDP too unless `tcp_only`
/// (then UDP is rejected and counted).
fn nftables_localhost_nodeports(name: &'static str, flags: &[&str], tcp_only: bool) {
    let mode = Mode::Nftables;
    let svc = Svc::dual("lh", 48)
        .node_port()
        .port(SvcPort::new("http", Proto::Tcp, 80, BACKEND_PORT).node_port(30621))
        .port(SvcPort::new("dns", Proto::Udp, 53, BACKEND_PORT).node_port(30622))
        .etp_local(0);
    let spec = EnvSpec {
        flags: flags.iter().map(|f| f.to_string()).collect(),
        ..EnvSpec::default()
    };
    let Some(env) = Env::start(mode, spec, &[(&fname(&svc), file(&svc, &[A0]))]) else {
        return;
    };
    let mut ck = Checks::new(name);
    let localnet = env.c.exec_ok(
        Host::Node(NODE_A),
        &["sysctl", "-n", "net.ipv4.conf.all.route_localnet"],
    );
    ck.check(localnet.trim() == "0", || {
        format!("route_localnet is {:?}, want 0", localnet.trim())
    });
    for f in Family::BOTH {
        let loopback: IpAddr = match f {
            Family::V4 => "127.0.0.1".parse().unwrap(),
            Family::V6 => "::1".parse().unwrap(),
        };
        for (proto, port) in [(Proto::Tcp, 30621), (Proto::Udp, 30622)] {
            let what = format!("node-a itself -> {} NodePort {proto:?}", sa(loopback, port));
            if tcp_only && proto == Proto::Udp {
                let got = env.probe(Host::Node(NODE_A), proto, sa(loopback, port), 2, ANSWER);
                ck.refused_locally(&what, &got);
                continue;
            }
            let got = env.probe(Host::Node(NODE_A), proto, sa(loopback, port), 4, ANSWER);
            ck.answered_by(&what, &got, &["pod-a0"]);
            // The proxy's own connection: from node-a's address toward the pod.
            ck.client_is(&what, &got, plan::pod_gateway(NODE_A, f));
        }
        // The node's own address: the kernel's DNAT, the client's address kept.
        let node = sa(plan::node_ip(NODE_A, f), 30621);
        let got = env.probe(Host::Ext, Proto::Tcp, node, 4, ANSWER);
        let what = format!("ext -> {node} (kernel DNAT)");
        ck.answered_by(&what, &got, &["pod-a0"]);
        ck.client_is(&what, &got, plan::ext_ip(f));
    }
    // kube-proxy 1.37's figures (KEP-6032): the NodePort service ports served on
    // loopback in each family (TCP, and UDP unless `tcp_only`), no listener failed;
    // with `tcp_only` the UDP probes' rejections counted.
    let metrics = node_a_metrics(&env);
    let served = if tcp_only { "1" } else { "2" };
    for f in ["IPv4", "IPv6"] {
        if tcp_only {
            let n = rejected(&metrics, f, "UDP");
            ck.check(n.is_some_and(|n| n >= 2), || {
                format!("{f} udp rejections counted: {n:?}, want at least the 2 probes")
            });
        }
        for (name, want) in [
            ("kubeproxy_nftables_localhost_nodeport_listeners", served),
            (
                "kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total",
                "0",
            ),
        ] {
            let line = format!("{name}{{ip_family=\"{f}\"}} {want}");
            ck.check(metrics.lines().any(|l| l == line), || {
                format!("/metrics lacks {line:?}")
            });
        }
    }
    route_ext_loopback_via_node_a(&env);
    // The guard is the capture's own first rule, as in the userspace mode.
    outside_packets_to_a_loopback_nodeport_are_not_captured(
        &env,
        &mut ck,
        sa(IpAddr::from([127, 0, 0, 1]), 30621),
        || Mode::Userspace.remove_localnet_guard(&env.c, NODE_A),
    );
    ck.finish(&env);
}

// -----------------------------------------------------------------------------------------
// 5. loadBalancerSourceRanges; short circuit of pod -> LB IP
// -----------------------------------------------------------------------------------------

fn load_balancer_source_ranges_and_short_circuit(mode: Mode) {
    // Only the external client's first address may use this LB IP.
    let fenced = tcp_only(Svc::dual("fenced", 50).load_balancer(), Some(30350))
        .ingress(plan::external_ip(50, Family::V4), "VIP")
        .ingress(plan::external_ip(50, Family::V6), "VIP")
        .source_ranges(&Family::BOTH.map(|f| plan::host_cidr(plan::ext_ip(f))));
    // node-a's IP is in the ranges: node-a (from that IP) may use it, and the LB IPs
    // as sources (upstream's allowFromNode); ext may not, nor node-a from another
    // of its addresses.
    let node_fenced = tcp_only(Svc::dual("node-fenced", 51).load_balancer(), Some(30351))
        .ingress(plan::external_ip(51, Family::V4), "VIP")
        .ingress(plan::external_ip(51, Family::V6), "VIP")
        .source_ranges(&Family::BOTH.map(|f| plan::host_cidr(plan::node_ip(NODE_A, f))));
    // eTP Local with endpoints only on node-b.
    let edge = tcp_only(Svc::dual("edge", 52).load_balancer(), Some(30352))
        .etp_local(32052)
        .ingress(plan::external_ip(52, Family::V4), "VIP")
        .ingress(plan::external_ip(52, Family::V6), "VIP");
    let Some(env) = Env::start(
        mode,
        EnvSpec::default(),
        &[
            (&fname(&fenced), file(&fenced, &[A0, B0])),
            (&fname(&node_fenced), file(&node_fenced, &[B0])),
            (&fname(&edge), file(&edge, &[B0])),
        ],
    ) else {
        return;
    };
    let mut ck = Checks::new("source-ranges");
    let mut flows = Vec::new();
    for f in Family::BOTH {
        let fam = family_name(f);
        // What `svcproxy explain` must predict for the flows below, all through node-a.
        let node_a = plan::node_ip(NODE_A, f);
        for (what, from, vip, action) in [
            (
                "ext inside the ranges -> LB IP",
                plan::ext_ip(f),
                50,
                "forward",
            ),
            (
                "ext outside the ranges -> LB IP",
                plan::ext_alt_ip(f),
                50,
                "drop",
            ),
            (
                "node-a -> LB IP whose ranges hold node-a's IP",
                node_a,
                51,
                "forward",
            ),
            (
                "ext -> LB IP whose ranges hold only node-a's IP",
                plan::ext_ip(f),
                51,
                "drop",
            ),
            (
                "node-a from its own address outside the ranges -> LB IP",
                plan::pod_gateway(NODE_A, f),
                51,
                "drop",
            ),
            (
                "pod-a1 -> eTP Local LB IP, endpoints on node-b",
                pod_ip(A1, f),
                52,
                "forward",
            ),
            (
                "node-a -> eTP Local LB IP, endpoints on node-b",
                node_a,
                52,
                "forward",
            ),
            (
                "ext -> eTP Local LB IP via node-a",
                plan::ext_ip(f),
                52,
                "drop",
            ),
        ] {
            flows.push((
                format!("{fam} {what}"),
                NODE_A,
                from,
                sa(plan::external_ip(vip, f), 80),
                Proto::Tcp,
                action,
            ));
        }
        let vip = sa(plan::external_ip(50, f), 80);
        let got = env.probe(Host::Ext, Proto::Tcp, vip, 2, ANSWER);
        ck.answered_by(
            &format!("{fam} ext {} (inside the ranges) -> LB IP", plan::ext_ip(f)),
            &got,
            &["pod-a0", "pod-b0"],
        );
        let got = env.c.probe_spec(
            Host::Ext,
            &ProbeSpec::new(Proto::Tcp, vip)
                .timeout(DROP_WAIT)
                .source_ip(plan::ext_alt_ip(f)),
        );
        ck.dropped(
            &format!(
                "{fam} ext {} (outside the ranges) -> LB IP",
                plan::ext_alt_ip(f)
            ),
            &got,
        );

        let vip = sa(plan::external_ip(51, f), 80);
        let got = env.probe(Host::Node(NODE_A), Proto::Tcp, vip, 2, ANSWER);
        ck.answered_by(
            &format!("{fam} node-a itself -> LB IP whose ranges hold node-a's IP"),
            &got,
            &["pod-b0"],
        );
        let got = env.probe(Host::Ext, Proto::Tcp, vip, 1, DROP_WAIT);
        ck.dropped(
            &format!("{fam} ext -> LB IP whose ranges hold only node-a's IP"),
            &got,
        );
        // As upstream's allowFromNode: node-a's own address outside the ranges is
        // no pass (only the ranges and the LB IPs themselves are).
        let got = env.c.probe_spec(
            Host::Node(NODE_A),
            &ProbeSpec::new(Proto::Tcp, vip)
                .timeout(DROP_WAIT)
                .source_ip(plan::pod_gateway(NODE_A, f)),
        );
        ck.dropped(
            &format!(
                "{fam} node-a from {} (its own, outside the ranges) -> LB IP",
                plan::pod_gateway(NODE_A, f)
            ),
            &got,
        );
        // A VIP-style load balancer puts the LB IP on the node: the node's own
        // connection to it then comes from the LB IP itself, which upstream's
        // allowFromNode admits (it is not in the ranges).
        let host = match f {
            Family::V4 => format!("{}/32", vip.ip()),
            Family::V6 => format!("{}/128", vip.ip()),
        };
        let mut add = vec!["ip", "addr", "add", host.as_str(), "dev", "lo"];
        if f == Family::V6 {
            add.push("nodad");
        }
        env.c.exec_ok(Host::Node(NODE_A), &add);
        let got = env.c.probe_spec(
            Host::Node(NODE_A),
            &ProbeSpec::new(Proto::Tcp, vip)
                .timeout(ANSWER)
                .source_ip(vip.ip()),
        );
        ck.answered_by(
            &format!("{fam} node-a from the LB IP itself (a VIP-style LB) -> LB IP"),
            &got,
            &["pod-b0"],
        );
        env.c.exec_ok(
            Host::Node(NODE_A),
            &["ip", "addr", "del", &host, "dev", "lo"],
        );

        // A pod on node-a (no local endpoint) reaching the eTP Local service by its LB IP:
        // short-circuited to the service, client IP preserved; ext via node-a is dropped.
        let vip = sa(plan::external_ip(52, f), 80);
        let got = env.probe(A1, Proto::Tcp, vip, 3, ANSWER);
        let what = format!("{fam} pod-a1 -> eTP Local LB IP, endpoints on node-b only");
        ck.answered_by(&what, &got, &["pod-b0"]);
        ck.client_kept(mode, &what, &got, pod_ip(A1, f), NODE_A);
        let got = env.probe(Host::Node(NODE_A), Proto::Tcp, vip, 2, ANSWER);
        ck.answered_by(
            &format!("{fam} node-a itself -> eTP Local LB IP, endpoints on node-b only"),
            &got,
            &["pod-b0"],
        );
        let got = env.probe(Host::Ext, Proto::Tcp, vip, 1, DROP_WAIT);
        ck.dropped(
            &format!("{fam} ext -> eTP Local LB IP via node-a (no local endpoint)"),
            &got,
        );
    }
    env.check_explained(&mut ck, &flows);
    ck.finish(&env);
}

// -----------------------------------------------------------------------------------------
// 6. Session affinity ClientIP, with its kernel-side timeout
// -----------------------------------------------------------------------------------------

fn session_affinity_sticks_and_expires(mode: Mode) {
    const TIMEOUT_S: u32 = 2;
    let sticky = tcp_only(Svc::dual("sticky", 60), None).affinity(TIMEOUT_S);
    let endpoints = [A0, A1, Host::Pod(NODE_B, 0), Host::Pod(NODE_B, 1)];
    let Some(env) = Env::start(
        mode,
        EnvSpec {
            pods_per_node: 3,
            ..EnvSpec::default()
        },
        &[(&fname(&sticky), file(&sticky, &endpoints))],
    ) else {
        return;
    };
    let mut ck = Checks::new("affinity");
    let client = A2;
    let mut first: BTreeMap<Family, String> = BTreeMap::new();
    for f in Family::BOTH {
        let fam = family_name(f);
        let got = env.probe(client, Proto::Tcp, sa(sticky.cluster_ip(f), 80), 20, ANSWER);
        let t = ck.answered_by(
            &format!("{fam} 20 connections with ClientIP affinity"),
            &got,
            &["pod-a0", "pod-a1", "pod-b0", "pod-b1"],
        );
        ck.check(t.len() == 1, || {
            format!("{fam}: 20 connections from one client spread over {t:?}")
        });
        if let Some(b) = got.first().and_then(|a| a.backend()) {
            first.insert(f, b.to_string());
        }
        // explain predicts it: any of the four, with ClientIP affinity for the
        // service's timeout.
        let v = env.explain(
            NODE_A,
            &[],
            pod_ip(client, f),
            sa(sticky.cluster_ip(f), 80),
            Proto::Tcp,
        );
        let mut predicted: Vec<String> = v["verdict"]["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["address"].as_str())
            .filter_map(|a| a.parse::<SocketAddr>().ok())
            .map(|a| a.ip().to_string())
            .collect();
        predicted.sort();
        let mut want: Vec<String> = endpoints
            .iter()
            .map(|h| pod_ip(*h, f).to_string())
            .collect();
        want.sort();
        ck.check(
            predicted == want
                && v["verdict"]["sessionAffinitySeconds"] == serde_json::json!(TIMEOUT_S),
            || {
                format!(
                    "{fam}: explain predicts {predicted:?} with affinity {}, the packets show {want:?} sticking for {TIMEOUT_S} s",
                    v["verdict"]["sessionAffinitySeconds"]
                )
            },
        );
    }
    // The kernel holds the client in an affinity set, with the service's timeout (the
    // userspace proxy holds it itself: only where connections go shows it).
    let sets = mode.affinity_state(&env.c, NODE_A);
    for f in Family::BOTH
        .into_iter()
        .filter(|_| mode.has_endpoint_objects())
    {
        let ip = pod_ip(client, f);
        ck.check(
            mentions(&sets, ip) && mode.affinity_timeout_shown(&sets, TIMEOUT_S),
            || {
                format!(
                    "{}: no affinity element for {ip} with timeout {TIMEOUT_S}s in\n{sets}",
                    family_name(f)
                )
            },
        );
    }
    // Idle past the timeout: the elements expire (where the kernel's listing shows
    // expiry)...
    thread::sleep(Duration::from_millis(u64::from(TIMEOUT_S) * 1000 + 1000));
    let sets = mode.affinity_state(&env.c, NODE_A);
    for f in Family::BOTH
        .into_iter()
        .filter(|_| mode.has_endpoint_objects() && mode.affinity_expiry_listed())
    {
        let ip = pod_ip(client, f);
        ck.check(!mentions(&sets, ip), || {
            format!(
                "{}: affinity element for {ip} still there after {}s idle:\n{sets}",
                family_name(f),
                TIMEOUT_S + 1
            )
        });
    }
    // ...and a new connection is free to go elsewhere (3 in 4 chance per try; each try is
    // followed by an idle period longer than the timeout).
    let mut moved: BTreeMap<Family, bool> = BTreeMap::new();
    for round in 0..8 {
        for f in Family::BOTH {
            if moved.get(&f).copied().unwrap_or(false) || !first.contains_key(&f) {
                continue;
            }
            let got = env.probe(client, Proto::Tcp, sa(sticky.cluster_ip(f), 80), 1, ANSWER);
            if let Some(b) = got[0].backend() {
                if b != first[&f] {
                    eprintln!(
                        "[dataplane] affinity {}: moved from {} to {b} after expiry (try {})",
                        family_name(f),
                        first[&f],
                        round + 1
                    );
                    moved.insert(f, true);
                }
            }
        }
        if Family::BOTH
            .iter()
            .all(|f| moved.get(f).copied().unwrap_or(false) || !first.contains_key(f))
        {
            break;
        }
        thread::sleep(Duration::from_millis(u64::from(TIMEOUT_S) * 1000 + 400));
    }
    for f in first.keys() {
        ck.check(moved.get(f).copied().unwrap_or(false), || {
            format!(
                "{}: after the affinity timeout, 8 idle-separated connections all still went to {}",
                family_name(*f),
                first[f]
            )
        });
    }
    ck.finish(&env);
}

// -----------------------------------------------------------------------------------------
// 7. Dual-stack: each family on its own; IPv6-only services
// -----------------------------------------------------------------------------------------

fn each_family_is_proxied_on_its_own(mode: Mode) {
    let dns = Svc::dual("dns", 70)
        .port(SvcPort::new("http", Proto::Tcp, 80, BACKEND_PORT))
        .port(SvcPort::new("dns", Proto::Udp, 53, BACKEND_PORT));
    let dns_slices = vec![Slice::of(&dns, Family::V4, &[B0])];
    let v6only = tcp_only(
        Svc::new("v6only", &[plan::cluster_ip(71, Family::V6)]).node_port(),
        Some(30471),
    );
    let Some(env) = Env::start(
        mode,
        EnvSpec::default(),
        &[
            (&fname(&dns), svc_file(&dns, &dns_slices)),
            (&fname(&v6only), file(&v6only, &[A0, B0])),
        ],
    ) else {
        return;
    };
    let mut ck = Checks::new("dual-stack");
    // What the packets show, for explain to predict: forwards to exactly these
    // endpoints, and the other outcomes.
    let mut forwards: Vec<Flow<Vec<IpAddr>>> = Vec::new();
    let mut others: Vec<Flow<&'static str>> = Vec::new();
    for (proto, port) in [(Proto::Tcp, 80), (Proto::Udp, 53)] {
        let (v4, v6) = (
            sa(dns.cluster_ip(Family::V4), port),
            sa(dns.cluster_ip(Family::V6), port),
        );
        let what = format!("{proto} dual-stack service: IPv4 cluster IP");
        forwards.push((
            what,
            NODE_A,
            pod_ip(A1, Family::V4),
            v4,
            proto,
            vec![pod_ip(B0, Family::V4)],
        ));
        let what = format!("{proto} dual-stack service: IPv6 cluster IP");
        others.push((what, NODE_A, pod_ip(A1, Family::V6), v6, proto, "reject"));
        let got = env.probe(A1, proto, sa(dns.cluster_ip(Family::V4), port), 3, ANSWER);
        ck.answered_by(
            &format!("{proto} dual-stack service, IPv4 endpoints only: its IPv4 cluster IP"),
            &got,
            &["pod-b0"],
        );
        let got = env.probe(
            A1,
            proto,
            sa(dns.cluster_ip(Family::V6), port),
            2,
            REFUSE_WAIT,
        );
        let what = format!("{proto} dual-stack service, IPv4 endpoints only: its IPv6 cluster IP");
        ck.refused_fast(&what, &got);
    }
    // IPv6-only: cluster IP from pods on both nodes, NodePort from outside on both nodes.
    for from in [A1, B1] {
        let got = env.probe(
            from,
            Proto::Tcp,
            sa(v6only.cluster_ip(Family::V6), 80),
            4,
            ANSWER,
        );
        let what = format!("IPv6-only service from {from:?}");
        ck.answered_by(&what, &got, &["pod-a0", "pod-b0"]);
        ck.client_kept(
            mode,
            &what,
            &got,
            pod_ip(from, Family::V6),
            if from == A1 { NODE_A } else { NODE_B },
        );
        let node = if from == A1 { NODE_A } else { NODE_B };
        let to = sa(v6only.cluster_ip(Family::V6), 80);
        let both = vec![pod_ip(A0, Family::V6), pod_ip(B0, Family::V6)];
        forwards.push((what, node, pod_ip(from, Family::V6), to, Proto::Tcp, both));
    }
    for node in [NODE_A, NODE_B] {
        let node_name = plan::node_name(node);
        let got = env.probe(
            Host::Ext,
            Proto::Tcp,
            sa(plan::node_ip(node, Family::V6), 30471),
            3,
            ANSWER,
        );
        let what = format!("IPv6-only NodePort via {node_name}");
        ck.answered_by(&what, &got, &["pod-a0", "pod-b0"]);
        let to = sa(plan::node_ip(node, Family::V6), 30471);
        let both = vec![pod_ip(A0, Family::V6), pod_ip(B0, Family::V6)];
        forwards.push((what, node, plan::ext_ip(Family::V6), to, Proto::Tcp, both));
    }
    // The IPv4 side knows nothing of it: its NodePort is not proxied on IPv4.
    let got = env.probe(
        Host::Ext,
        Proto::Tcp,
        sa(plan::node_ip(NODE_A, Family::V4), 30471),
        1,
        DROP_WAIT,
    );
    let what = "IPv6-only service's NodePort on node-a's IPv4 address";
    ck.not_answered(what, &got);
    others.push((
        what.to_string(),
        NODE_A,
        plan::ext_ip(Family::V4),
        sa(plan::node_ip(NODE_A, Family::V4), 30471),
        Proto::Tcp,
        "accept",
    ));
    env.check_explained_endpoints(&mut ck, &forwards);
    env.check_explained(&mut ck, &others);
    ck.finish(&env);
}

// -----------------------------------------------------------------------------------------
// 8. Topology: per-node endpoint choice (svcproxy.io/topology-keys)
// -----------------------------------------------------------------------------------------

/// An IPv6 socket (not IPV6_V6ONLY) names an IPv4 service as ::ffff:a.b.c.d, as
/// a dual-stack program (Java's, Go's with `tcp`) does: the same service, the same
/// endpoints, its address shown back as the client named it, a refusal where it
/// has no endpoint. From a pod and from the node itself (in ebpf mode the node's
/// connect() is translated by the socket programs, the pod's packets by tc).
fn ipv6_sockets_reach_ipv4_services_by_ipv4_mapped_addresses(mode: Mode) {
    let f = Family::V4;
    let web = Svc::new("mapped", &[plan::cluster_ip(36, f)])
        .node_port()
        .port(SvcPort::new("http", Proto::Tcp, 80, BACKEND_PORT).node_port(30136))
        .port(SvcPort::new("dns", Proto::Udp, 53, BACKEND_PORT).node_port(30137));
    let empty = tcp_only(Svc::new("mapped-empty", &[plan::cluster_ip(37, f)]), None);
    let Some(env) = Env::start(
        mode,
        EnvSpec::default(),
        &[
            (&fname(&web), file(&web, &[A1, B0])),
            (&fname(&empty), file(&empty, &[])),
        ],
    ) else {
        return;
    };
    let mut ck = Checks::new("ipv4-mapped");
    let mapped = |ip: IpAddr, port: u16| match ip {
        IpAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), port),
        IpAddr::V6(_) => unreachable!("an IPv4 service"),
    };
    let allowed = ["pod-a1", "pod-b0"];
    let node_ip = plan::node_ip(NODE_A, f);
    for from in [A0, Host::Node(NODE_A)] {
        for (proto, port, node_port) in [(Proto::Tcp, 80, 30136), (Proto::Udp, 53, 30137)] {
            for target in [mapped(web.cluster_ip(f), port), mapped(node_ip, node_port)] {
                let what = format!("{proto} {from:?} -> {target}");
                let got = env.probe(from, proto, target, 6, ANSWER);
                ck.answered_by(&what, &got, &allowed);
                let peers: Vec<_> = got.iter().filter_map(|a| a.peer).collect();
                ck.check(peers.iter().all(|p| *p == target), || {
                    format!("{what}: the socket's peer is {peers:?}, not the address it named")
                });
            }
        }
        let target = mapped(empty.cluster_ip(f), 80);
        let got = env.probe(from, Proto::Tcp, target, 2, DROP_WAIT);
        ck.refused_fast(&format!("{from:?} -> {target} (no endpoint)"), &got);
    }
    ck.finish(&env);
}

fn topology_keys_choose_endpoints_per_node(mode: Mode) {
    const KEYS: &str = "svcproxy.io/topology-keys";
    let per_node =
        tcp_only(Svc::dual("per-node", 80), None).annotate(KEYS, "kubernetes.io/hostname");
    let zonal =
        tcp_only(Svc::dual("zonal", 81), None).annotate(KEYS, "topology.kubernetes.io/zone, *");
    let fallback =
        tcp_only(Svc::dual("fallback", 82), None).annotate(KEYS, "topology.kubernetes.io/zone, *");
    let hard = tcp_only(Svc::dual("hard", 83), None).annotate(KEYS, "kubernetes.io/hostname");
    let Some(env) = Env::start(
        mode,
        EnvSpec {
            zones: ["zone-1", "zone-2"],
            ..EnvSpec::default()
        },
        &[
            (&fname(&per_node), file(&per_node, &[A0, B0])),
            (&fname(&zonal), file(&zonal, &[A0, B0])),
            (&fname(&fallback), file(&fallback, &[B0, B1])),
            (&fname(&hard), file(&hard, &[B0])),
        ],
    ) else {
        return;
    };
    let mut ck = Checks::new("topology");
    // What `svcproxy explain` must predict: the endpoints that answered, or a refusal.
    let mut forwards = Vec::new();
    let mut refusals = Vec::new();
    for f in Family::BOTH {
        let fam = family_name(f);
        for (svc, what) in [(&per_node, "hostname"), (&zonal, "zone, *")] {
            for (node, from, ep) in [(NODE_A, A1, A0), (NODE_B, B1, B0)] {
                forwards.push((
                    format!("{fam} keys [{what}] from {from:?}"),
                    node,
                    pod_ip(from, f),
                    sa(svc.cluster_ip(f), 80),
                    Proto::Tcp,
                    vec![pod_ip(ep, f)],
                ));
            }
        }
        forwards.push((
            format!("{fam} keys [zone, *], endpoints in the other zone only, from node-a"),
            NODE_A,
            pod_ip(A1, f),
            sa(fallback.cluster_ip(f), 80),
            Proto::Tcp,
            vec![pod_ip(B0, f), pod_ip(B1, f)],
        ));
        forwards.push((
            format!("{fam} keys [hostname], endpoint on node-b, from node-b"),
            NODE_B,
            pod_ip(B1, f),
            sa(hard.cluster_ip(f), 80),
            Proto::Tcp,
            vec![pod_ip(B0, f)],
        ));
        refusals.push((
            format!("{fam} keys [hostname], endpoint on node-b only, from node-a"),
            NODE_A,
            pod_ip(A1, f),
            sa(hard.cluster_ip(f), 80),
            Proto::Tcp,
            "reject",
        ));
        for (svc, what) in [(&per_node, "hostname"), (&zonal, "zone, *")] {
            for (from, only) in [(A1, "pod-a0"), (B1, "pod-b0")] {
                let got = env.probe(from, Proto::Tcp, sa(svc.cluster_ip(f), 80), 30, ANSWER);
                ck.answered_by(
                    &format!("{fam} keys [{what}] from {from:?}: 30 connections"),
                    &got,
                    &[only],
                );
            }
        }
        // zone-1 has no endpoint of `fallback`: `*` lets node-a use node-b's.
        let got = env.probe(A1, Proto::Tcp, sa(fallback.cluster_ip(f), 80), 30, ANSWER);
        let t = ck.answered_by(
            &format!("{fam} keys [zone, *], endpoints in the other zone only, from node-a"),
            &got,
            &["pod-b0", "pod-b1"],
        );
        ck.check(t.len() == 2, || {
            format!("{fam}: fallback to `*` should use both endpoints, got {t:?}")
        });
        // Hard keys with no match on node-a: no endpoints there, so rejected.
        let got = env.probe(A1, Proto::Tcp, sa(hard.cluster_ip(f), 80), 1, REFUSE_WAIT);
        ck.refused_fast(
            &format!("{fam} keys [hostname], endpoint on node-b only, from node-a"),
            &got,
        );
        let got = env.probe(B1, Proto::Tcp, sa(hard.cluster_ip(f), 80), 3, ANSWER);
        ck.answered_by(
            &format!("{fam} keys [hostname], endpoint on node-b, from node-b"),
            &got,
            &["pod-b0"],
        );
    }
    env.check_explained_endpoints(&mut ck, &forwards);
    env.check_explained(&mut ck, &refusals);
    ck.finish(&env);
}

// -----------------------------------------------------------------------------------------
// 9. Partial sync: manifests edited while svcproxy runs
// -----------------------------------------------------------------------------------------

/// Edits must reach every node's rules: svcproxy promises them within min-sync-period (0
/// here) plus a 100 ms debounce; allow its 2 s longest debounce plus slack.
const EDIT_VISIBLE: Duration = Duration::from_secs(3);

/// Probes from a pod on each node until `done` accepts what it sees (bounded by
/// `deadline` since `since`); checks that happened within [`EDIT_VISIBLE`] and logs each
/// node's latency.
fn wait_visible(
    env: &Env,
    ck: &mut Checks,
    what: &str,
    since: Instant,
    spec: &ProbeSpec,
    done: impl Fn(&[svcproxy_e2e::Attempt]) -> bool,
) {
    let deadline = Duration::from_secs(10);
    for from in [A1, B1] {
        let left = deadline.saturating_sub(since.elapsed());
        let (got, took) = env.probe_until(from, spec, left, &done);
        let latency = since.elapsed();
        eprintln!(
            "[dataplane] {what}: visible from {from:?} after {:?}",
            took.map(|_| latency)
        );
        ck.check(took.is_some(), || {
            format!(
                "{what}: not visible from {from:?} within {deadline:?}: {:?}",
                svcproxy_e2e::tally(&got)
            )
        });
        ck.check(took.is_none() || latency <= EDIT_VISIBLE, || {
            format!("{what}: visible from {from:?} only after {latency:?} (> {EDIT_VISIBLE:?})")
        });
    }
}

fn edits_while_running_change_what_answers(mode: Mode) {
    let web = Svc::dual("web", 90)
        .port(SvcPort::new("http", Proto::Tcp, 80, BACKEND_PORT))
        .port(SvcPort::new("dns", Proto::Udp, 53, BACKEND_PORT));
    let other = tcp_only(Svc::dual("other", 91), None);
    let late = tcp_only(Svc::dual("late", 92), None);
    let Some(env) = Env::start(
        mode,
        EnvSpec::default(),
        &[
            ("web.yaml", web.yaml()),
            (
                "web-slices.yaml",
                docs(
                    &slices(&web, &[A0, B0])
                        .iter()
                        .map(Slice::yaml)
                        .collect::<Vec<_>>(),
                ),
            ),
            (&fname(&other), file(&other, &[B1])),
        ],
    ) else {
        return;
    };
    let mut ck = Checks::new("partial-sync");
    for f in Family::BOTH {
        let got = env.probe(A1, Proto::Tcp, sa(web.cluster_ip(f), 80), 30, ANSWER);
        let t = ck.answered_by(
            &format!("{} web before the edit", family_name(f)),
            &got,
            &["pod-a0", "pod-b0"],
        );
        ck.check(t.len() == 2, || format!("web before the edit: {t:?}"));
    }
    if mode == Mode::Nftables {
        // What the count of endpoint objects after web's deletion below drops
        // from: web's two ports' two endpoints each and other's one, elements of
        // the cluster IP maps (all three ports are served without a chain).
        for node in [NODE_A, NODE_B] {
            for fam in Family::BOTH {
                let n = mode.service_objects(&env.c, node, fam, ServiceObject::Endpoint);
                ck.check(n == 5, || {
                    format!(
                        "{} {}: {n} endpoint objects before the edit, expected 5",
                        plan::node_name(node),
                        family_name(fam)
                    )
                });
            }
        }
    }

    // Remove pod-b0 from web's endpoints.
    let edited = Instant::now();
    env.write(
        "web-slices.yaml",
        &docs(
            &slices(&web, &[A0])
                .iter()
                .map(Slice::yaml)
                .collect::<Vec<_>>(),
        ),
    );
    wait_visible(
        &env,
        &mut ck,
        "endpoint removal",
        edited,
        &ProbeSpec::new(Proto::Tcp, sa(web.cluster_ip(Family::V4), 80))
            .count(20)
            .timeout(ANSWER),
        |g| g.iter().all(|a| a.backend() == Some("pod-a0")),
    );
    for f in Family::BOTH {
        for from in [A1, B1] {
            for (proto, port) in [(Proto::Tcp, 80), (Proto::Udp, 53)] {
                let got = env.probe(from, proto, sa(web.cluster_ip(f), port), 20, ANSWER);
                ck.answered_by(
                    &format!(
                        "{} {proto} {from:?} -> web after removing pod-b0",
                        family_name(f)
                    ),
                    &got,
                    &["pod-a0"],
                );
            }
        }
        let got = env.probe(A1, Proto::Tcp, sa(other.cluster_ip(f), 80), 3, ANSWER);
        ck.answered_by(
            &format!("{} other service untouched", family_name(f)),
            &got,
            &["pod-b1"],
        );
    }

    // Add a service.
    let edited = Instant::now();
    env.write(&fname(&late), &file(&late, &[B0]));
    wait_visible(
        &env,
        &mut ck,
        "new service",
        edited,
        &ProbeSpec::new(Proto::Tcp, sa(late.cluster_ip(Family::V6), 80))
            .count(1)
            .timeout(Duration::from_millis(200)),
        |g| g[0].backend() == Some("pod-b0"),
    );

    // Delete web (service and slices): its cluster IP becomes an unallocated address of
    // the ServiceCIDR, which is dropped, as upstream.
    let edited = Instant::now();
    env.remove("web.yaml");
    env.remove("web-slices.yaml");
    wait_visible(
        &env,
        &mut ck,
        "service deletion",
        edited,
        &ProbeSpec::new(Proto::Tcp, sa(web.cluster_ip(Family::V4), 80))
            .count(1)
            .timeout(Duration::from_millis(300)),
        |g| g[0].backend().is_none(),
    );
    for f in Family::BOTH {
        let fam = family_name(f);
        for (proto, port) in [(Proto::Tcp, 80), (Proto::Udp, 53)] {
            for from in [A1, B1] {
                let got = env.probe(from, proto, sa(web.cluster_ip(f), port), 1, DROP_WAIT);
                ck.dropped(
                    &format!("{fam} {proto} {from:?} -> deleted service's cluster IP"),
                    &got,
                );
            }
        }
        let got = env.probe(A1, Proto::Tcp, sa(other.cluster_ip(f), 80), 3, ANSWER);
        ck.answered_by(
            &format!("{fam} other service after web's deletion"),
            &got,
            &["pod-b1"],
        );
        let got = env.probe(A1, Proto::Tcp, sa(late.cluster_ip(f), 80), 3, ANSWER);
        ck.answered_by(
            &format!("{fam} late service after web's deletion"),
            &got,
            &["pod-b0"],
        );
    }
    // No stale chains: two TCP services with one endpoint each (both on node-b)
    // remain, per family, per node.
    for node in [NODE_A, NODE_B] {
        let node_name = plan::node_name(node);
        for fam in Family::BOTH {
            for kind in [ServiceObject::Service, ServiceObject::Endpoint] {
                let n = mode.service_objects(&env.c, node, fam, kind);
                // Not every mode has a kernel object per endpoint (see there).
                let want = if kind == ServiceObject::Endpoint
                    && !mode.has_endpoint_object(node == NODE_B)
                {
                    0
                } else {
                    2
                };
                ck.check(n == want, || {
                    format!(
                        "{node_name} {}: {n} {kind:?} objects after deleting web, expected {want}",
                        family_name(fam)
                    )
                });
            }
            let rules = env.ruleset(node);
            for f in Family::BOTH {
                ck.check(!mentions(&rules, web.cluster_ip(f)), || {
                    format!(
                        "{node_name}: rules still mention deleted web's {}",
                        web.cluster_ip(f)
                    )
                });
            }
        }
    }
    for p in &env.proxies {
        ck.check(p.is_running(), || {
            format!("{} exited:\n{}", p.label(), p.logs())
        });
    }
    ck.finish(&env);
}

// -----------------------------------------------------------------------------------------
// 10. Terminating endpoints as the fallback
// -----------------------------------------------------------------------------------------

fn serving_terminating_endpoints_are_the_fallback(mode: Mode) {
    let drain = tcp_only(Svc::dual("drain", 100), None);
    let drain_slices: Vec<Slice> = Family::BOTH
        .map(|f| Slice::of(&drain, f, &[]).endpoints(vec![Ep::pod(B0, f).terminating()]))
        .to_vec();
    let drain_local = tcp_only(
        Svc::dual("drain-local", 101).node_port().etp_local(0),
        Some(30501),
    );
    let drain_local_slices: Vec<Slice> = Family::BOTH
        .map(|f| {
            Slice::of(&drain_local, f, &[])
                .endpoints(vec![Ep::pod(A0, f).terminating(), Ep::pod(B0, f)])
        })
        .to_vec();
    let gone = tcp_only(Svc::dual("gone", 102), None);
    let gone_slices: Vec<Slice> = Family::BOTH
        .map(|f| {
            let mut ep = Ep::pod(B0, f).terminating();
            ep.serving = false;
            Slice::of(&gone, f, &[]).endpoints(vec![ep])
        })
        .to_vec();
    let Some(env) = Env::start(
        mode,
        EnvSpec::default(),
        &[
            (&fname(&drain), svc_file(&drain, &drain_slices)),
            (
                &fname(&drain_local),
                svc_file(&drain_local, &drain_local_slices),
            ),
            (&fname(&gone), svc_file(&gone, &gone_slices)),
        ],
    ) else {
        return;
    };
    let mut ck = Checks::new("terminating");
    // What `svcproxy explain` must predict: the endpoints that answered, or a refusal.
    let mut forwards = Vec::new();
    let mut refusals = Vec::new();
    for f in Family::BOTH {
        let fam = family_name(f);
        let (a1, a0, b0) = (pod_ip(A1, f), pod_ip(A0, f), pod_ip(B0, f));
        let node_port = sa(plan::node_ip(0, f), 30501);
        for (what, from, to, eps) in [
            (
                "only a serving+terminating endpoint",
                a1,
                sa(drain.cluster_ip(f), 80),
                vec![b0],
            ),
            (
                "eTP Local NodePort, local endpoint terminating",
                plan::ext_ip(f),
                node_port,
                vec![a0],
            ),
            (
                "cluster traffic prefers the ready endpoint",
                a1,
                sa(drain_local.cluster_ip(f), 80),
                vec![b0],
            ),
        ] {
            forwards.push((format!("{fam} {what}"), NODE_A, from, to, Proto::Tcp, eps));
        }
        refusals.push((
            format!("{fam} terminating and not serving"),
            NODE_A,
            a1,
            sa(gone.cluster_ip(f), 80),
            Proto::Tcp,
            "reject",
        ));
        let got = env.probe(A1, Proto::Tcp, sa(drain.cluster_ip(f), 80), 3, ANSWER);
        ck.answered_by(
            &format!("{fam} only a serving+terminating endpoint"),
            &got,
            &["pod-b0"],
        );
        let got = env.probe(
            Host::Ext,
            Proto::Tcp,
            sa(plan::node_ip(0, f), 30501),
            3,
            ANSWER,
        );
        let what = format!("{fam} eTP Local NodePort, local endpoint terminating");
        ck.answered_by(&what, &got, &["pod-a0"]);
        ck.client_kept(mode, &what, &got, plan::ext_ip(f), NODE_A);
        let got = env.probe(
            A1,
            Proto::Tcp,
            sa(drain_local.cluster_ip(f), 80),
            20,
            ANSWER,
        );
        ck.answered_by(
            &format!("{fam} cluster traffic prefers the ready endpoint over the terminating one"),
            &got,
            &["pod-b0"],
        );
        let got = env.probe(A1, Proto::Tcp, sa(gone.cluster_ip(f), 80), 1, REFUSE_WAIT);
        ck.refused_fast(
            &format!("{fam} terminating and not serving: no usable endpoint"),
            &got,
        );
    }
    env.check_explained_endpoints(&mut ck, &forwards);
    env.check_explained(&mut ck, &refusals);
    ck.finish(&env);
}

// -----------------------------------------------------------------------------------------
// 11. --once, cleanup, SIGTERM
// -----------------------------------------------------------------------------------------

fn once_cleanup_and_sigterm(mode: Mode) {
    let web = tcp_only(Svc::dual("web", 110), None);
    let Some(env) = Env::start(
        mode,
        EnvSpec {
            start_proxies: false,
            ..EnvSpec::default()
        },
        &[(&fname(&web), file(&web, &[A0, B0]))],
    ) else {
        return;
    };
    let mut ck = Checks::new("once-cleanup");
    for node in [NODE_A, NODE_B] {
        let node_name = plan::node_name(node);
        mode.add_foreign(&env.c, node);
        let args = env.proxy_args(node);
        let mut argv: Vec<&str> = args.iter().map(String::as_str).collect();
        argv.push("--once");
        let t = Instant::now();
        let out = env.run_svcproxy(node, &argv);
        eprintln!(
            "[dataplane] --once on {node_name}: {} in {:?}",
            out.status,
            t.elapsed()
        );
        ck.check(out.status.success(), || {
            format!(
                "svcproxy --once on {node_name}: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
        ck.check(env.programmed(node), || {
            format!(
                "after --once, {node_name} lacks svcproxy's objects: {}",
                env.ruleset(node)
            )
        });
    }
    // The rules stay after --once exits: the kernel modes go on forwarding; in the
    // userspace mode the capture stays and, with no proxy behind it, refuses at once.
    for f in Family::BOTH {
        let got = env.probe(A1, Proto::Tcp, sa(web.cluster_ip(f), 80), 4, ANSWER);
        let what = format!("{} after --once", family_name(f));
        if mode.forwards_without_the_process() {
            ck.answered_by(&what, &got, &["pod-a0", "pod-b0"]);
        } else {
            ck.refused_fast(&what, &got);
        }
    }

    // `svcproxy cleanup` on node-a, `svcproxy --cleanup` on node-b: exactly svcproxy's
    // tables go.
    for (node, how) in [(NODE_A, "cleanup"), (NODE_B, "--cleanup")] {
        let node_name = plan::node_name(node);
        // With the flags saying where the mode's objects are (the ebpf mode's pins).
        let mut args = vec![how.to_string()];
        args.extend(confinement_args(&env.c, node));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = env.run_svcproxy(node, &args);
        ck.check(out.status.success(), || {
            format!(
                "svcproxy {how} on {node_name}: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
        ck.check(env.nothing_programmed(node), || {
            format!(
                "after svcproxy {how}, {node_name} still has: {}",
                env.ruleset(node)
            )
        });
        if let Err(e) = mode.foreign_intact(&env.c, node) {
            ck.check(false, || {
                format!("svcproxy {how} removed or changed a foreign object on {node_name}: {e}")
            });
        }
    }
    // Without rules the cluster IP is just an address routed into the LAN router's blackhole.
    let got = env.probe(
        A1,
        Proto::Tcp,
        sa(web.cluster_ip(Family::V4), 80),
        1,
        DROP_WAIT,
    );
    ck.not_answered("cluster IP after cleanup", &got);

    // A long-running svcproxy: SIGTERM ends it and leaves the rules in force.
    let bin = svcproxy_e2e::svcproxy_bin();
    let proxy = env.spawn_svcproxy(&bin, NODE_A, &[]);
    env.wait_programmed(NODE_A, Some(&proxy));
    let status = proxy.terminate(Duration::from_secs(10));
    ck.check(status.is_some(), || {
        format!("svcproxy ignored SIGTERM for 10 s\n{}", proxy.logs())
    });
    eprintln!("[dataplane] svcproxy exit status after SIGTERM: {status:?}");
    ck.check(env.programmed(NODE_A), || {
        format!(
            "after SIGTERM svcproxy's objects are gone: {}",
            env.ruleset(NODE_A)
        )
    });
    // node-a DNATs; replies from pod-b0 come back through node-a without any rules on
    // node-b (whose tables were cleaned up above).
    for f in Family::BOTH {
        let got = env.probe(A1, Proto::Tcp, sa(web.cluster_ip(f), 80), 4, ANSWER);
        let what = format!("{} after SIGTERM", family_name(f));
        if mode.forwards_without_the_process() {
            ck.answered_by(&what, &got, &["pod-a0", "pod-b0"]);
        } else {
            ck.refused_fast(&what, &got);
        }
    }
    let mut args = vec!["cleanup".to_string()];
    args.extend(confinement_args(&env.c, NODE_A));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.run_svcproxy(NODE_A, &args);
    ck.check(
        out.status.success() && env.nothing_programmed(NODE_A),
        || format!("final cleanup: {}", out.status),
    );
    ck.finish(&env);
}

/// How `node`'s kernel differs from the plan, as `explain --live` tells it: the
/// number of differences (`usize::MAX` when it could not tell) and what it said.
fn live_differences(env: &Env, node: usize) -> (usize, String) {
    let mut args: Vec<String> = vec!["explain".into()];
    args.extend(env.proxy_args(node));
    args.extend(
        [
            "--format",
            "json",
            "--live",
            "--from",
            "198.51.100.7",
            "--to",
            "198.51.100.8:80",
        ]
        .map(String::from),
    );
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let live = env.run_svcproxy(node, &argv);
    let v: serde_json::Value = serde_json::from_slice(&live.stdout).unwrap_or_default();
    let diffs = v["kernel"]["differences"]
        .as_array()
        .map_or(usize::MAX, Vec::len);
    let shown = format!(
        "{:#}\n{}",
        v["kernel"],
        String::from_utf8_lossy(&live.stderr)
    );
    (diffs, shown)
}

/// Issue 56, item 2: established TCP connections carrying data and a UDP flow keep
/// flowing across a SIGKILL of node-a's svcproxy and its restart, then across a
/// hand-over to a new process: from pod-a1 to a cluster IP (both families) and from
/// outside to a NodePort of node-a (which the XDP fast path, where on, masquerades
/// itself), two connections each echoing a 64-byte request every 20 ms, every echo
/// within 2 s; and a datagram every 250 ms from one client port, every one answered.
/// The endpoint is on node-b. In the eBPF data plane the connections live in its
/// maps (svcproxy_ct, the masquerade's ports) and the programs stay attached while no
/// process runs; in the other kernel modes conntrack holds them. Each kernel mode,
/// the eBPF ones with and without XDP.
#[test]
fn connections_carry_data_across_a_kill_and_a_hand_over() {
    let cases: [(Mode, &[&str]); 6] = [
        (Mode::Ebpf, &[]),
        (Mode::Ebpf, &["--ebpf-xdp=native"]),
        (Mode::Ipvs, &[]),
        (Mode::Ipvs, &["--ebpf-xdp=native"]),
        (Mode::Nftables, &[]),
        (Mode::Iptables, &[]),
    ];
    for (mode, flags) in cases {
        carry_across_restarts(mode, flags);
    }
}

/// The two-node environment in `mode` with node svcproxy's extra `flags`, serving
/// `svc` with `slices` (`None`: the machine cannot run it, as [`Env::start`]).
fn start_with_flags(mode: Mode, flags: &[String], svc: &Svc, slices: &[Slice]) -> Option<Env> {
    Env::start(
        mode,
        EnvSpec {
            flags: flags.to_vec(),
            ..EnvSpec::default()
        },
        &[(&fname(svc), svc_file(svc, slices))],
    )
}

/// Echo streams (`loadgen rr`, 64 bytes every 20 ms, `concurrency` connections
/// each, for `seconds`) from pod-a1 to `svc`'s cluster IPs (port 80) in both
/// families and from `ext` to its NodePort on node-a: each stream's name and
/// process.
fn rr_streams(
    env: &Env,
    svc: &Svc,
    node_port: u16,
    load: &str,
    concurrency: u32,
    seconds: u32,
) -> Vec<(String, svcproxy_e2e::NsProcess)> {
    let clients: Vec<(Host, SocketAddr)> = vec![
        (A1, sa(svc.cluster_ip(Family::V4), 80)),
        (A1, sa(svc.cluster_ip(Family::V6), 80)),
        (Host::Ext, sa(plan::node_ip(NODE_A, Family::V4), node_port)),
    ];
    let (concurrency, seconds) = (concurrency.to_string(), seconds.to_string());
    clients
        .iter()
        .enumerate()
        .map(|(i, (from, target))| {
            let target = target.to_string();
            let argv = [
                load,
                "rr",
                "--target",
                &target,
                "--concurrency",
                &concurrency,
                "--seconds",
                &seconds,
                "--interval-ms",
                "20",
            ];
            let p = env
                .c
                .spawn(*from, &format!("rr-{i}"), &argv)
                .expect("start a client");
            (format!("{} -> {target}", env.c.name(*from)), p)
        })
        .collect()
}

fn carry_across_restarts(mode: Mode, flags: &[&str]) {
    const PORT: u16 = 9100;
    const NODE_PORT: u16 = 30160;
    let svc = Svc::dual("steady", 160)
        .node_port()
        .port(SvcPort::new("echo", Proto::Tcp, 80, PORT).node_port(NODE_PORT))
        .port(SvcPort::new("dns", Proto::Udp, 53, BACKEND_PORT));
    let slices: Vec<Slice> = Family::BOTH
        .iter()
        .map(|f| {
            Slice::with_ports(
                &svc,
                &format!("steady-{}", family_name(*f).to_ascii_lowercase()),
                *f,
                &[
                    ("echo", Proto::Tcp, PORT),
                    ("dns", Proto::Udp, BACKEND_PORT),
                ],
                vec![Ep::pod(B0, *f)],
            )
        })
        .collect();
    let flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    let Some(mut env) = start_with_flags(mode, &flags, &svc, &slices) else {
        return;
    };
    let what = format!("{} {}", mode.label(), flags.join(" "));
    let mut ck = Checks::new("carry");
    let (load, _server) = loadgen_server(&env, B0, PORT);
    let load = load.to_string_lossy();
    let streams = rr_streams(&env, &svc, NODE_PORT, &load, 2, 9);
    let bin = svcproxy_e2e::bins::svcproxy_bin();
    let mut owner = env.proxies.remove(env.proxy_index(NODE_A));
    let udp = sa(svc.cluster_ip(Family::V4), 53);
    let datagrams = thread::scope(|scope| {
        let env_ref = &env;
        let flow = scope.spawn(move || {
            let spec = ProbeSpec::new(Proto::Udp, udp)
                .count(34)
                .timeout(ANSWER)
                .interval(Duration::from_millis(250))
                .source_port(43053);
            env_ref.c.probe_spec(A1, &spec)
        });
        thread::sleep(Duration::from_secs(2));
        owner.kill();
        let restarted = env.spawn_svcproxy(&bin, NODE_A, &[]);
        ck.check(
            wait_log(&restarted, "svcproxy_sync::driver: synced", SYNC_DEADLINE),
            || format!("{what}: no sync after the restart\n{}", restarted.logs()),
        );
        thread::sleep(Duration::from_millis(1500));
        let new = env.spawn_svcproxy(&bin, NODE_A, &[]);
        ck.check(
            wait_log(&new, "waiting as a warm standby", SYNC_DEADLINE),
            || format!("{what}: no standby\n{}", new.logs()),
        );
        let status = restarted.terminate(Duration::from_secs(30));
        ck.check(status.is_some_and(|s| s.success()), || {
            format!("{what}: the owner at SIGTERM: {status:?}")
        });
        ck.check(wait_log(&new, "took over", Duration::from_secs(5)), || {
            format!("{what}: the standby never took over\n{}", new.logs())
        });
        owner = new;
        flow.join().expect("the UDP flow")
    });
    env.proxies.push(owner);
    for (name, p) in &streams {
        let status = p.wait(Duration::from_secs(30));
        let out = p.stdout();
        ck.check(
            status.as_ref().is_ok_and(|s| s.success()) && out.contains("\"count\""),
            || {
                format!(
                    "{what}: {name}: every echo within 2 s: {status:?}\n{}",
                    p.logs()
                )
            },
        );
        eprintln!("[dataplane] carry {what}: {name}: {}", out.trim());
    }
    ck.answered_by(
        &format!("{what}: pod-a1's UDP flow from port 43053 to {udp}"),
        &datagrams,
        &["pod-b0"],
    );
    ck.finish(&env);
}

/// Issue 56, item 2: `svcproxy cleanup` while connections flow. The eBPF data
/// plane's programs and maps go, so the connections translated by its packet path
/// cannot go on (the kernel modes' go on: conntrack holds their translation). They
/// must end cleanly: each client's next request fails (at once: reset or aborted),
/// and no packet reaches a client half-translated, that is from the endpoint's own
/// address instead of the service's (counted by a rule in each client's
/// namespace, before and after). Clients: pod-a1 to a cluster IP in both families
/// (its sockets are on node-a), and `ext` to a NodePort of node-a; the endpoint on
/// node-b, each stream echoing 64 bytes every 20 ms. ebpf and ipvs modes, with and
/// without the XDP fast path.
#[test]
fn a_cleanup_while_connections_flow_ends_them_cleanly() {
    let cases: [(Mode, &[&str]); 4] = [
        (Mode::Ebpf, &[]),
        (Mode::Ebpf, &["--ebpf-xdp=native"]),
        (Mode::Ipvs, &[]),
        (Mode::Ipvs, &["--ebpf-xdp=native"]),
    ];
    for (mode, flags) in cases {
        cleanup_under_traffic(mode, flags);
    }
}

fn cleanup_under_traffic(mode: Mode, flags: &[&str]) {
    const PORT: u16 = 9100;
    const NODE_PORT: u16 = 30162;
    let (svc, slices) = b0_echo_service("ending", 162, PORT, NODE_PORT);
    let flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    let Some(mut env) = start_with_flags(mode, &flags, &svc, &slices) else {
        return;
    };
    let what = format!("{} {}", mode.label(), flags.join(" "));
    let mut ck = Checks::new("cleanup-traffic");
    // Packets from the endpoint's own address and port, as each client sees them.
    let half = format!(
        "table inet halfcheck {{\n chain pre {{\n  type filter hook prerouting priority -300;\n  \
         ip saddr {} tcp sport {PORT} counter\n  ip6 saddr {} tcp sport {PORT} counter\n }}\n}}\n",
        env.c.ip(B0, Family::V4),
        env.c.ip(B0, Family::V6)
    );
    for host in [A1, Host::Ext] {
        env.c.nft(host, &half).expect("the counting rules");
    }
    let half_seen = |host: Host| -> u64 {
        let listing = env
            .c
            .nft(host, "list table inet halfcheck")
            .unwrap_or_default();
        listing
            .split("packets ")
            .skip(1)
            .filter_map(|t| t.split_whitespace().next()?.parse::<u64>().ok())
            .sum::<u64>()
    };
    let (load, _server) = loadgen_server(&env, B0, PORT);
    let load = load.to_string_lossy();
    let streams = rr_streams(&env, &svc, NODE_PORT, &load, 1, 12);
    // The operator's order: the DaemonSet's pod goes (SIGTERM leaves the data
    // path running), then `svcproxy cleanup` runs on the node.
    thread::sleep(Duration::from_secs(1));
    let owner = env.proxies.remove(env.proxy_index(NODE_A));
    let status = owner.terminate(Duration::from_secs(30));
    ck.check(status.is_some_and(|s| s.success()), || {
        format!("{what}: node-a's svcproxy at SIGTERM: {status:?}")
    });
    thread::sleep(Duration::from_secs(1));
    let before = (half_seen(A1), half_seen(Host::Ext));
    ck.check(before == (0, 0), || {
        format!("{what}: packets from the endpoint's own address before the cleanup: {before:?}")
    });
    let mut args = vec!["cleanup".to_string()];
    args.extend(confinement_args(&env.c, NODE_A));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let cleaned = Instant::now();
    let out = env.run_svcproxy(NODE_A, &args);
    ck.check(out.status.success(), || {
        format!(
            "{what}: svcproxy cleanup: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    });
    for (name, p) in &streams {
        let status = p.wait(Duration::from_secs(30));
        let ended = cleaned.elapsed();
        let err = p.stderr();
        eprintln!(
            "[dataplane] cleanup under traffic {what}: {name}: {status:?} after {ended:?}: {}",
            err.trim()
        );
        // Ended by the cleanup, at once, with the kernel's word for it.
        ck.check(
            status.as_ref().is_ok_and(|s| !s.success())
                && ended < Duration::from_secs(3)
                && ["reset", "abort", "Broken pipe"]
                    .iter()
                    .any(|w| err.contains(w)),
            || format!("{what}: {name}: not ended cleanly by the cleanup: {status:?} after {ended:?}\n{}", p.logs()),
        );
    }
    // Late packets of the endpoint (its retransmissions) would come now.
    thread::sleep(Duration::from_secs(2));
    let after = (half_seen(A1), half_seen(Host::Ext));
    ck.check(after == (0, 0), || {
        format!("{what}: packets from the endpoint's own address reached the clients after the cleanup (pod-a1, ext): {after:?}")
    });
    ck.check(env.nothing_programmed(NODE_A), || {
        format!(
            "{what}: after the cleanup node-a still has: {}",
            env.ruleset(NODE_A)
        )
    });
    ck.finish(&env);
}

/// Issue 56 item 3, issue 52 item 5: the eBPF connection map filled past its size
/// under live traffic. node-a's `svcproxy_ct` holds 1,024 entries (two a
/// connection); 150 connections from `ext` to a NodePort are opened and left idle
/// while 4 s of new connections (thousands) pass through the same NodePort. What
/// happens, as docs/ebpf.md says: every new connection is served (the LRU makes
/// room); the idle connections whose entries were evicted are broken (their next
/// packet meets no translation); and each eviction is counted
/// (`svcproxy_ebpf_map_evictions_total{map="svcproxy_ct"}`), at least one for each
/// connection broken. The tc path (ebpf mode) and the XDP path (ipvs mode).
#[test]
fn a_connection_map_filled_past_its_size_serves_new_connections_and_counts_its_evictions() {
    let cases: [(Mode, &[&str]); 2] = [(Mode::Ebpf, &[]), (Mode::Ipvs, &["--ebpf-xdp=native"])];
    for (mode, flags) in cases {
        connection_map_pressure(mode, flags);
    }
}

fn connection_map_pressure(mode: Mode, flags: &[&str]) {
    const PORT: u16 = 9100;
    const NODE_PORT: u16 = 30161;
    let (svc, slices) = b0_echo_service("full", 161, PORT, NODE_PORT);
    let mut all_flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    all_flags.extend(["--ebpf-map-size-connections".into(), "1024".into()]);
    let Some(env) = start_with_flags(mode, &all_flags, &svc, &slices) else {
        return;
    };
    let what = format!("{} {}", mode.label(), flags.join(" "));
    let mut ck = Checks::new("ct-pressure");
    let (load, _server) = loadgen_server(&env, B0, PORT);
    let load = load.to_string_lossy();
    let target = sa(plan::node_ip(NODE_A, Family::V4), NODE_PORT).to_string();
    let before = series(
        &node_a_metrics(&env),
        "svcproxy_ebpf_map_evictions_total",
        "svcproxy_ct",
    );
    let held = env
        .c
        .spawn(
            Host::Ext,
            "hold",
            &[
                &*load,
                "hold",
                "--target",
                &target,
                "--connections",
                "150",
                "--pause-secs",
                "7",
            ],
        )
        .expect("start the idle connections");
    let opened = held.wait_for_stdout("open ", Duration::from_secs(30));
    let (churned, churn_out) = churn_from_ext(&env, &load, &target, 4);
    let held_status = held.wait(Duration::from_secs(30));
    let held_out = held.stdout();
    let metrics = node_a_metrics(&env);
    let after = series(&metrics, "svcproxy_ebpf_map_evictions_total", "svcproxy_ct");
    eprintln!(
        "[dataplane] ct pressure {what}: {opened:?}; churn {}; held {}; evictions {before:?} -> {after:?}",
        churn_out.trim(),
        held_out.trim()
    );
    let (churn, held) = (report_of(&churn_out), report_of(&held_out));
    let field = |v: &serde_json::Value, k: &str| v[k].as_u64();
    // Every new connection served: the LRU makes room, and a SYN retransmitted
    // after its connection's reply entry went (the LRU may take an entry just
    // made) makes that entry again.
    ck.check(
        churned.is_ok_and(|s| s.success())
            && field(&churn, "errors") == Some(0)
            && field(&churn, "count").is_some_and(|n| n > 2_000),
        || format!("{what}: every new connection served, over 2,000 of them: {churn}"),
    );
    ck.check(
        held_status.is_ok_and(|s| s.success()) && field(&held, "opened") == Some(150),
        || format!("{what}: 150 idle connections opened before the churn: {held}"),
    );
    let broken = field(&held, "opened")
        .zip(field(&held, "answered"))
        .map(|(o, a)| o - a);
    // The map full: its fill, counted from the pin, near its size (an LRU map
    // evicts before it is quite full: each CPU keeps some free entries of its
    // own).
    let fill = series(&metrics, "svcproxy_ebpf_map_entries", "svcproxy_ct");
    let size = series(&metrics, "svcproxy_ebpf_map_max_entries", "svcproxy_ct");
    ck.check(
        size == Some(1024) && fill.is_some_and(|n| (700..=1024).contains(&n)),
        || {
            format!(
                "{what}: svcproxy_ct's fill near its size after the churn: {fill:?} of {size:?}"
            )
        },
    );
    // The evictions, counted where the kernel runs tracing programs (the
    // counter's fexit program); elsewhere the counter is absent and the log
    // says why.
    if tracing_programs() {
        let counted = before.zip(after).map(|(b, a)| a - b);
        ck.check(
            counted.is_some_and(|c| c > 1_000) && counted >= broken,
            || {
                format!(
                "{what}: svcproxy_ct's evictions counted ({before:?} -> {after:?}): over 1,000, \
                 and at least one for each idle connection broken ({broken:?})\n{metrics}"
            )
            },
        );
    } else {
        let proxy = &env.proxies[env.proxy_index(NODE_A)];
        ck.check(
            after.is_none() && proxy.logs().contains("evictions are not counted"),
            || {
                format!(
                    "{what}: a kernel without tracing programs: no eviction counter ({after:?}), \
                     and the log says so\n{}",
                    proxy.logs()
                )
            },
        );
    }
    ck.finish(&env);
}

/// Issue 56 item 3: svcproxy's own masquerade (the XDP fast path's) out of ports
/// under live traffic. node-a's `ip_local_port_range` ends at 64511, which leaves
/// svcproxy the least it takes, 1,024 ports (64512-65535); each stays a
/// connection's while a packet of it passed within conntrack's time (120 s once
/// closed). 3 s of new connections from `ext` to a NodePort whose endpoint is on
/// node-b (masqueraded) take them all within a fraction of a second. What
/// happens, as docs/ebpf.md says: every connection is served, those that found
/// no free port by the kernel's masquerade; the ports taken and the connections
/// that found none are counted (`svcproxy_ebpf_masquerade_ports_total`), which
/// `SvcproxyMasqueradePortsExhausted` alerts on.
#[test]
fn masquerade_ports_run_out_under_live_traffic_and_connections_go_on_through_the_kernel() {
    for mode in [Mode::Ebpf, Mode::Ipvs] {
        masquerade_port_pressure(mode);
    }
}

fn masquerade_port_pressure(mode: Mode) {
    const PORT: u16 = 9100;
    const NODE_PORT: u16 = 30162;
    let (svc, slices) = b0_echo_service("snat", 162, PORT, NODE_PORT);
    let Some(mut env) = Env::start(
        mode,
        EnvSpec {
            start_proxies: false,
            ..EnvSpec::default()
        },
        &[(&fname(&svc), svc_file(&svc, &slices))],
    ) else {
        return;
    };
    let what = mode.label();
    let mut ck = Checks::new("snat-pressure");
    // Read by svcproxy at its start.
    env.c.exec_ok(
        Host::Node(NODE_A),
        &[
            "sh",
            "-c",
            "echo '1024 64511' > /proc/sys/net/ipv4/ip_local_port_range",
        ],
    );
    // XDP sends a connection on, masqueraded, out of node-a's LAN link when the
    // LAN's side takes redirected frames (an XDP program there), and takes only
    // packets with whole checksums, as from a wire (a veth leaves them partial):
    // the client's and the endpoint's (as ebpf_packet.rs sets them up).
    env.c
        .exec_ok(Host::Ext, &["ethtool", "-K", "eth0", "tx", "off"]);
    env.c.exec_ok(B0, &["ethtool", "-K", "eth0", "tx", "off"]);
    let _lan_xdp = svcproxy_e2e::xdp::TestXdp::attach(env.c.ns(Host::Lan), "n-a", "bench_pass")
        .expect("an XDP program on the LAN's side of node-a's link");
    let bin = svcproxy_e2e::bins::svcproxy_bin();
    let xdp = ["--ebpf-xdp=native".to_string()];
    for node in [NODE_A, NODE_B] {
        let p = env.spawn_svcproxy(&bin, node, &xdp);
        env.proxies.push(p);
        env.wait_synced(node);
    }
    let (load, _server) = loadgen_server(&env, B0, PORT);
    let load = load.to_string_lossy();
    let target = sa(plan::node_ip(NODE_A, Family::V4), NODE_PORT).to_string();
    let pins = env
        .c
        .node_confinement(NODE_A)
        .map(|(_, pins)| svcproxy_dataplane::ebpf::kernel::own_pin_dir(&pins));
    let ports = || {
        pins.as_ref()
            .and_then(|p| svcproxy_dataplane::ebpf::kernel::masquerade_ports(p))
    };
    let before = ports();
    let (churned, out) = churn_from_ext(&env, &load, &target, 3);
    let after = ports();
    let metrics = node_a_metrics(&env);
    eprintln!(
        "[dataplane] masquerade-port pressure {what}: {}; ports (taken, exhausted) {before:?} -> {after:?}",
        out.trim()
    );
    let churn = report_of(&out);
    let count = churn["count"].as_u64().unwrap_or(0);
    ck.check(
        churned.is_ok_and(|s| s.success()) && churn["errors"].as_u64() == Some(0) && count > 2_000,
        || format!("{what}: every new connection served, over 2,000 of them: {churn}"),
    );
    let [taken, exhausted] = match (before, after) {
        (Some(b), Some(a)) => [a[0] - b[0], a[1] - b[1]],
        _ => [0, 0],
    };
    // Each of the 1,024 ports taken once (none is free again within the run),
    // and every other connection found none.
    // (A connection whose first packet took the stack's way, its neighbour not
    // yet known, is the kernel's to masquerade and in neither count: a few.)
    ck.check(
        (1_000..=1_024).contains(&taken)
            && exhausted > 0
            && taken + exhausted <= count
            && (taken + exhausted) * 10 >= count * 9,
        || {
            format!(
                "{what}: of {count} connections, masquerade ports taken {taken} (want 1,000 to \
                 1,024), connections that found none {exhausted} (want nearly all the others)"
            )
        },
    );
    ck.check(
        count_of(
            &metrics,
            "svcproxy_ebpf_masquerade_ports_total{result=\"exhausted\"}",
        )
        .is_some_and(|n| n >= exhausted && n > 0),
        || format!("{what}: the exhausted connections in node-a's metrics\n{metrics}"),
    );
    ck.finish(&env);
}

/// A dual-stack NodePort Service `name` (number `n`) whose TCP port 80 (NodePort
/// `node_port`) goes to `port` of pod-b0 (a loadgen server there), and its slices.
fn b0_echo_service(name: &str, n: u16, port: u16, node_port: u16) -> (Svc, Vec<Slice>) {
    let svc = Svc::dual(name, n)
        .node_port()
        .port(SvcPort::new("echo", Proto::Tcp, 80, port).node_port(node_port));
    let slices = Family::BOTH
        .iter()
        .map(|f| {
            Slice::with_ports(
                &svc,
                &format!("{name}-{}", family_name(*f).to_ascii_lowercase()),
                *f,
                &[("echo", Proto::Tcp, port)],
                vec![Ep::pod(B0, *f)],
            )
        })
        .collect();
    (svc, slices)
}

/// `seconds` of new connections from `ext` to `target` (`loadgen connect`, two
/// threads): how it exited, and what it printed.
fn churn_from_ext(
    env: &Env,
    load: &str,
    target: &str,
    seconds: u32,
) -> (anyhow::Result<std::process::ExitStatus>, String) {
    let seconds = seconds.to_string();
    let argv = [
        load,
        "connect",
        "--target",
        target,
        "--concurrency",
        "2",
        "--seconds",
        &seconds,
    ];
    let churn = env
        .c
        .spawn(Host::Ext, "churn", &argv)
        .expect("start the new connections");
    let status = churn.wait(Duration::from_secs(30));
    (status, churn.stdout())
}

/// A loadgen client's report: the last JSON line it printed (null if none).
fn report_of(out: &str) -> serde_json::Value {
    out.lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_default()
}

/// Series `name` of `map` (a gauge or a counter), from `metrics`.
fn series(metrics: &str, name: &str, map: &str) -> Option<u64> {
    count_of(metrics, &format!("{name}{{map=\"{map}\"}}"))
}

/// The whole-number value of the sample `series` (name and labels, as printed) in
/// `metrics`, when there is one.
fn count_of(metrics: &str, series: &str) -> Option<u64> {
    sample_of(metrics, series).map(|v| v as u64)
}

/// One client port, two service addresses, one endpoint: two connections there.
/// The endpoint closes first (as HTTP servers do), so it still holds the first
/// connection's tuple in TIME_WAIT when the second comes from the same client port
/// through the other Service. Kept as one tuple, the second's SYN meets that
/// TIME_WAIT and, about half the time (its sequence number and timestamp owe nothing
/// to the first's), an ACK of the old connection: the client's reset of it clears
/// the way for its next SYN, unless that SYN is sent to another endpoint holding the
/// tuple as well (the chaos runs' one timeout in 35,000). The kernel modes' conntrack
/// gives the second connection another source port; the eBPF packet path (the test's
/// pods take it) remaps the client port likewise. 8 ports, both families, an endpoint
/// on the other node and the client itself (the hairpin): each connection answered,
/// and seen by the endpoint from another address or port than the first.
fn a_client_port_used_toward_two_services_of_one_endpoint_is_answered_both_times(mode: Mode) {
    let pairs = [
        (
            [
                tcp_only(Svc::dual("twin-a", 150), None),
                tcp_only(Svc::dual("twin-b", 151), None),
            ],
            B0,
            "pod-b0",
        ),
        (
            [
                tcp_only(Svc::dual("self-a", 152), None),
                tcp_only(Svc::dual("self-b", 153), None),
            ],
            A1,
            "pod-a1",
        ),
    ];
    let files: Vec<(String, String)> = pairs
        .iter()
        .flat_map(|(svcs, ep, _)| svcs.iter().map(move |s| (fname(s), file(s, &[*ep]))))
        .collect();
    let files: Vec<(&str, String)> = files.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let Some(env) = Env::start(mode, EnvSpec::default(), &files) else {
        return;
    };
    let mut ck = Checks::new("port-reuse");
    let mut port = 42000;
    for (svcs, _, endpoint) in &pairs {
        for f in Family::BOTH {
            for _ in 0..8 {
                port += 1;
                let mut seen = Vec::new();
                for svc in svcs {
                    let spec = ProbeSpec::new(Proto::Tcp, sa(svc.cluster_ip(f), 80))
                        .count(1)
                        .timeout(ANSWER)
                        .source_port(port);
                    let got = env.c.probe_spec(A1, &spec);
                    ck.answered_by(
                        &format!("pod-a1 from port {port} to {} ({f:?})", svc.name),
                        &got,
                        &[endpoint],
                    );
                    seen.extend(got.iter().filter_map(|a| a.client_seen()));
                }
                // Two connections at the endpoint: two client addresses and ports
                // (one tuple would meet the first's TIME_WAIT; Linux's reset of it
                // often hides that, the tuple shows it).
                ck.check(seen.len() != 2 || seen[0] != seen[1], || {
                    format!(
                        "pod-a1 from port {port} to {} and {} ({f:?}): {endpoint} saw both \
                         as {}, one tuple",
                        svcs[0].name, svcs[1].name, seen[0]
                    )
                });
            }
        }
    }
    // The eBPF data plane counts what it remapped: each second connection.
    if let Some((_, pins)) = env.c.node_confinement(NODE_A) {
        let pins = svcproxy_dataplane::ebpf::kernel::own_pin_dir(&pins);
        let counts = svcproxy_dataplane::ebpf::kernel::remapped_client_ports(&pins);
        ck.check(
            counts.is_some_and(|[remapped, shared]| remapped >= 32 && shared == 0),
            || {
                format!(
                    "node-a's remap counters (remapped, shared): {counts:?}, want 32 or more, 0"
                )
            },
        );
    }
    ck.finish(&env);
}

/// Issue 38, item 1: a rolling update with `maxSurge` runs two svcproxy processes on
/// a node. The second waits as a warm standby (writing nothing: the owner sees no
/// drift, `/healthz` answers for both), takes over at the owner's SIGTERM under a
/// steady stream of connections with none failing, and within a few seconds of a
/// SIGKILL.
fn a_second_instance_stands_by_and_takes_over_without_a_failed_connection(mode: Mode) {
    let web = tcp_only(Svc::dual("web", 130), None);
    let Some(env) = Env::start(
        mode,
        // pod-a2 is the stream's client.
        EnvSpec {
            pods_per_node: 3,
            ..EnvSpec::default()
        },
        &[(&fname(&web), file(&web, &[A0, B0]))],
    ) else {
        return;
    };
    let mut ck = Checks::new("hand-over");
    let old = &env.proxies[env.proxy_index(NODE_A)];
    // The new release: another binary (the same build under another path).
    let dir = tempfile::tempdir().expect("temporary directory");
    let new_bin = dir.path().join("svcproxy-next");
    std::fs::copy(svcproxy_e2e::bins::svcproxy_bin(), &new_bin).expect("copy svcproxy");
    let new = env.spawn_svcproxy(&new_bin, NODE_A, &[]);
    let standing_by = wait_log(&new, "waiting as a warm standby", SYNC_DEADLINE);
    ck.check(standing_by, || {
        format!("the second svcproxy did not stand by\n{}", new.logs())
    });
    // Both answer /healthz on the one port (the kernel spreads connections): 200
    // from each, the standby's saying so. 40 tries all reaching one process would
    // be a 1-in-10^12 chance.
    let loopback: IpAddr = "127.0.0.1".parse().unwrap();
    // Ready once its sources have listed (503 before, as an owner before its first
    // sync).
    let deadline = Instant::now() + SYNC_DEADLINE;
    while Instant::now() < deadline {
        let a = get(&env, Host::Node(NODE_A), loopback, 10256, "/healthz");
        if a.is_some_and(|a| a.code == 200 && a.body.contains(r#""role": "standby""#)) {
            break;
        }
    }
    let answers: Vec<_> = (0..40)
        .map(|_| get(&env, Host::Node(NODE_A), loopback, 10256, "/healthz"))
        .collect();
    let standby_answers = answers
        .iter()
        .flatten()
        .filter(|a| a.body.contains(r#""role": "standby""#))
        .count();
    ck.check(
        answers
            .iter()
            .all(|a| a.as_ref().is_some_and(|a| a.code == 200)),
        || format!("/healthz with a standby: {answers:?}"),
    );
    ck.check(
        standby_answers > 0 && standby_answers < answers.len(),
        || {
            format!(
                "{standby_answers} of {} /healthz answers from the standby",
                answers.len()
            )
        },
    );
    // An edit while both run: the owner applies it, the standby writes nothing
    // (the owner's drift check would see its writes).
    let since = Instant::now();
    env.write(&fname(&web), &file(&web, &[A0, A1, B0]));
    let spec = ProbeSpec::new(Proto::Tcp, sa(web.cluster_ip(Family::V4), 80)).count(12);
    wait_visible(
        &env,
        &mut ck,
        "pod-a1 added, standby waiting",
        since,
        &spec,
        |got| got.iter().any(|a| a.backend() == Some("pod-a1")),
    );
    thread::sleep(Duration::from_millis(500));

    // The upgrade under a steady stream of connections, both families.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (attempts, handed_over, took_over) = thread::scope(|s| {
        let stream = s.spawn(|| {
            let mut all = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(90);
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < deadline {
                for f in Family::BOTH {
                    all.extend(env.probe(A2, Proto::Tcp, sa(web.cluster_ip(f), 80), 5, ANSWER));
                }
            }
            all
        });
        thread::sleep(Duration::from_secs(1));
        let t = Instant::now();
        let status = old.terminate(Duration::from_secs(30));
        let handed_over = t.elapsed();
        ck.check(status.is_some_and(|s| s.success()), || {
            format!("the old svcproxy at SIGTERM: {status:?}\n{}", old.logs())
        });
        let took_over = wait_log(&new, "took over", Duration::from_secs(5));
        // An edit after the hand-over reaches the kernel through the new owner.
        let since = Instant::now();
        env.write(&fname(&web), &file(&web, &[A0, B0]));
        wait_visible(
            &env,
            &mut ck,
            "pod-a1 removed by the new owner",
            since,
            &spec,
            |got| {
                !got.is_empty()
                    && got
                        .iter()
                        .all(|a| matches!(a.backend(), Some("pod-a0" | "pod-b0")))
            },
        );
        thread::sleep(Duration::from_secs(1));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        (stream.join().expect("the stream"), handed_over, took_over)
    });
    let failed: Vec<_> = attempts.iter().filter(|a| a.backend().is_none()).collect();
    eprintln!(
        "[dataplane] {}: hand-over at SIGTERM in {handed_over:?}; {} connections during \
         the upgrade, {} failed",
        mode.label(),
        attempts.len(),
        failed.len()
    );
    ck.check(took_over, || {
        format!("the standby never took over\n{}", new.logs())
    });
    ck.check(
        old.stderr()
            .contains("handed over: the successor's first sync is in"),
        || {
            format!(
                "the old owner did not wait for its successor's sync\n{}",
                old.logs()
            )
        },
    );
    ck.check(attempts.len() >= 20 && failed.is_empty(), || {
        format!(
            "{} of {} connections failed during the upgrade: {:?}",
            failed.len(),
            attempts.len(),
            svcproxy_e2e::tally(&attempts)
        )
    });
    // Nothing changed between the old owner's last sync and the hand-over: where
    // the mode can, the new owner took the sealed rules as they were (and the
    // edit since was written in place, the kernel equal to the plan).
    let adopted = new.stderr().contains("adopted, nothing written");
    ck.check(adopted == mode.adopts_sealed_rules(), || {
        format!(
            "the new owner adopted the sealed rules: {adopted}, expected {}\n{}",
            mode.adopts_sealed_rules(),
            new.logs()
        )
    });
    let (diffs, shown) = live_differences(&env, NODE_A);
    ck.check(diffs == 0, || {
        format!("after the hand-over and an edit, explain --live: {diffs} differences: {shown}")
    });
    for (who, p) in [("old", old), ("new", &new)] {
        ck.check(!p.stderr().contains("behind its back"), || {
            format!(
                "the {who} svcproxy saw the other's writes as drift\n{}",
                p.logs()
            )
        });
    }

    // SIGKILL: a standby of the new owner takes over within a few seconds.
    let third = env.spawn_svcproxy(&svcproxy_e2e::bins::svcproxy_bin(), NODE_A, &[]);
    ck.check(
        wait_log(&third, "waiting as a warm standby", SYNC_DEADLINE),
        || format!("the third svcproxy did not stand by\n{}", third.logs()),
    );
    let t = Instant::now();
    new.kill();
    // "owner lock taken" in both ways it can go: the owner killed after the
    // standby's start ("took over" follows), or while the standby still starts
    // (it then starts as the owner, and says nothing of taking over).
    let took_over = wait_log(&third, "owner lock taken", Duration::from_secs(10));
    let took = t.elapsed();
    eprintln!(
        "[dataplane] {}: taken over {took:?} after a SIGKILL",
        mode.label()
    );
    ck.check(took_over && took < Duration::from_secs(3), || {
        format!(
            "after a SIGKILL the standby took over: {took_over} in {took:?}\n{}",
            third.logs()
        )
    });
    let since = Instant::now();
    env.write(&fname(&web), &file(&web, &[B0]));
    wait_visible(
        &env,
        &mut ck,
        "pod-a0 removed by the third owner",
        since,
        &spec,
        |got| !got.is_empty() && got.iter().all(|a| a.backend() == Some("pod-b0")),
    );
    // A one-shot sync would fight the owner: refused, saying who owns the node.
    let args = env.proxy_args(NODE_A);
    let mut argv: Vec<&str> = args.iter().map(String::as_str).collect();
    argv.push("--once");
    let out = env.run_svcproxy(NODE_A, &argv);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ck.check(
        !out.status.success() && stderr.contains("--once would fight it"),
        || format!("--once beside a running owner: {}\n{stderr}", out.status),
    );
    // Stopped with no standby, the owner seals anyway; a later start (no hand-over)
    // must not adopt a seal, and its first sync removes it.
    let status = third.terminate(Duration::from_secs(30));
    ck.check(status.is_some_and(|s| s.success()), || {
        format!("the third svcproxy at SIGTERM: {status:?}")
    });
    let sealed = env.ruleset(NODE_A).to_lowercase().contains("seal");
    ck.check(sealed == mode.adopts_sealed_rules(), || {
        format!("sealed with no standby: {sealed}\n{}", env.ruleset(NODE_A))
    });
    let fourth = env.spawn_svcproxy(&svcproxy_e2e::bins::svcproxy_bin(), NODE_A, &[]);
    ck.check(wait_log(&fourth, "synced", SYNC_DEADLINE), || {
        format!("the fourth svcproxy never synced\n{}", fourth.logs())
    });
    ck.check(!fourth.stderr().contains("adopted"), || {
        format!("a restart adopted a seal\n{}", fourth.logs())
    });
    ck.check(!env.ruleset(NODE_A).to_lowercase().contains("seal"), || {
        format!(
            "the seal outlived the restart's first sync\n{}",
            env.ruleset(NODE_A)
        )
    });
    if !ck.is_ok() {
        eprintln!(
            "[dataplane] new svcproxy:\n{}\n[dataplane] third svcproxy:\n{}",
            new.logs(),
            third.logs()
        );
    }
    ck.finish(&env);
}

/// A mode switch by a rolling update: the new owner, of another kind of mode than
/// the old (iptables to nftables and back), removes the old mode's rules once its
/// own are in, as kube-proxy does at start; connections are answered throughout.
#[test]
fn a_mode_switch_by_hand_over_removes_the_old_modes_rules() {
    for (from, to) in [
        (Mode::Iptables, Mode::Nftables),
        (Mode::Nftables, Mode::Iptables),
    ] {
        let web = tcp_only(Svc::dual("web", 140), None);
        let Some(env) = Env::start(
            from,
            EnvSpec::default(),
            &[(&fname(&web), file(&web, &[A0, B0]))],
        ) else {
            return;
        };
        let mut ck = Checks::new("mode-switch");
        let old = &env.proxies[env.proxy_index(NODE_A)];
        let bin = svcproxy_e2e::bins::svcproxy_bin();
        let new = env.spawn_svcproxy(&bin, NODE_A, &[format!("--proxy-mode={}", to.name())]);
        ck.check(
            wait_log(&new, "waiting as a warm standby", SYNC_DEADLINE),
            || {
                format!(
                    "the {} svcproxy did not stand by\n{}",
                    to.label(),
                    new.logs()
                )
            },
        );
        ck.check(from.programmed(&env.c, NODE_A) == [true, true], || {
            format!("the standby removed the owner's {} rules", from.label())
        });
        let status = old.terminate(Duration::from_secs(30));
        ck.check(status.is_some_and(|s| s.success()), || {
            format!("the old svcproxy at SIGTERM: {status:?}\n{}", old.logs())
        });
        ck.check(wait_log(&new, "took over", Duration::from_secs(5)), || {
            format!("the standby never took over\n{}", new.logs())
        });
        let deadline = Instant::now() + SYNC_DEADLINE;
        let switched = loop {
            let done = to.programmed(&env.c, NODE_A) == [true, true]
                && from.programmed(&env.c, NODE_A) == [false, false];
            if done || Instant::now() >= deadline {
                break done;
            }
            thread::sleep(Duration::from_millis(50));
        };
        eprintln!(
            "[dataplane] {} to {}: the old rules removed: {switched}",
            from.label(),
            to.label()
        );
        ck.check(switched, || {
            format!(
                "after the switch from {} to {}: {} rules {:?}, {} rules {:?}\n{}",
                from.label(),
                to.label(),
                to.label(),
                to.programmed(&env.c, NODE_A),
                from.label(),
                from.programmed(&env.c, NODE_A),
                new.logs()
            )
        });
        for f in Family::BOTH {
            let got = env.probe(A1, Proto::Tcp, sa(web.cluster_ip(f), 80), 6, ANSWER);
            ck.answered_by(
                &format!("{} after the switch to {}", family_name(f), to.label()),
                &got,
                &["pod-a0", "pod-b0"],
            );
        }
        ck.finish(&env);
    }
}

/// The suite runs in exactly the modes svcproxy implements: a new backend in the registry
/// without a [`Mode`] here (or the reverse) fails this test. (iptables mode runs twice,
/// once per backend of the tools.)
#[test]
fn every_implemented_mode_runs_the_suite() {
    let mut suite: Vec<&str> = Mode::ALL.iter().map(|m| m.name()).collect();
    suite.dedup();
    let registry: Vec<&str> = svcproxy_dataplane::BACKENDS
        .iter()
        .map(|b| b.mode)
        .collect();
    assert_eq!(suite, registry);
}

// -----------------------------------------------------------------------------------------
// What only the userspace proxy does: retries, its metrics, draining at SIGTERM
// -----------------------------------------------------------------------------------------

/// The value of the sample `series` (name and labels, as printed) in `text`; 0 when
/// absent.
fn sample(text: &str, series: &str) -> f64 {
    sample_of(text, series).unwrap_or(0.0)
}

/// The value of the sample `series` (name and labels, as printed) in `text`.
fn sample_of(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The userspace proxy hides a dead endpoint: one of two endpoints refuses (pod-b1 on
/// a port nothing listens on), and every one of 20 connections is answered by the
/// live one, each refusal retried once (round-robin starts on the dead one every
/// other time: exactly 10 retries), as its metrics count per service port. At
/// SIGTERM it stops accepting (a new connection is refused at once) and lets an open
/// connection finish: the process ends only after that connection closed.
#[test]
fn the_userspace_proxy_retries_a_dead_endpoint_counts_it_and_drains_at_sigterm() {
    let mode = Mode::Userspace;
    let svc = tcp_only(Svc::dual("retry", 120), None);
    let mut slices = Vec::new();
    for f in Family::BOTH {
        slices.push(Slice::of(&svc, f, &[A0]));
        slices.push(Slice::with_ports(
            &svc,
            &format!("retry-dead-{}", family_name(f).to_ascii_lowercase()),
            f,
            &[("http", Proto::Tcp, 9)],
            vec![Ep::pod(B1, f)],
        ));
    }
    let Some(env) = Env::start(
        mode,
        EnvSpec::default(),
        &[(&fname(&svc), svc_file(&svc, &slices))],
    ) else {
        return;
    };
    let mut ck = Checks::new("userspace-proxy");
    for f in Family::BOTH {
        let got = env.probe(A1, Proto::Tcp, sa(svc.cluster_ip(f), 80), 20, ANSWER);
        ck.answered_by(
            &format!(
                "{} 20 connections, one of two endpoints dead",
                family_name(f)
            ),
            &got,
            &["pod-a0"],
        );
    }
    let loopback: IpAddr = "127.0.0.1".parse().unwrap();
    let metrics = get(&env, Host::Node(NODE_A), loopback, 10249, "/metrics")
        .map(|a| a.body)
        .unwrap_or_default();
    for f in Family::BOTH {
        let labels = format!(
            "{{ip_family=\"{}\",service_port=\"e2e/retry:http/tcp\"}}",
            family_name(f)
        );
        for (name, want) in [
            ("svcproxy_userspace_connections_accepted_total", 20.0),
            ("svcproxy_userspace_connect_retries_total", 10.0),
            ("svcproxy_userspace_connections_failed_total", 0.0),
        ] {
            let got = sample(&metrics, &format!("{name}{labels}"));
            ck.check(got == want, || {
                format!("{name}{labels} is {got}, want {want}:\n{metrics}")
            });
        }
    }

    // A connection held open from pod-a1 (it read the answer, then keeps its half
    // open for 3 s), then SIGTERM to node-a's proxy.
    let target = svc.cluster_ip(Family::V4);
    let holder = env
        .c
        .spawn(
            A1,
            "holder",
            &[
                "bash",
                "-c",
                &format!("exec 3<>/dev/tcp/{target}/80 && head -c 200 <&3 | head -1 && sleep 3"),
            ],
        )
        .expect("spawn the holder");
    if let Err(e) = holder.wait_for_stdout("pod-a0", ANSWER * 4) {
        ck.check(false, || {
            format!("the held connection was not answered: {e}")
        });
    }
    let proxy = &env.proxies[NODE_A];
    let sent = Instant::now();
    let (status, refused) = thread::scope(|s| {
        let stopping = s.spawn(|| proxy.terminate(Duration::from_secs(20)));
        thread::sleep(Duration::from_millis(800));
        let refused = env.probe(A1, Proto::Tcp, sa(target, 80), 2, ANSWER);
        (stopping.join().expect("terminate"), refused)
    });
    let took = sent.elapsed();
    ck.refused_fast("a new connection after SIGTERM", &refused);
    ck.check(status.is_some_and(|s| s.success()), || {
        format!(
            "svcproxy did not exit cleanly after SIGTERM: {status:?}\n{}",
            proxy.logs()
        )
    });
    ck.check(took >= Duration::from_millis(1500) && took < Duration::from_secs(10), || {
        format!(
            "svcproxy exited {took:?} after SIGTERM; the held connection ended about 3 s after it opened"
        )
    });
    ck.check(
        proxy.logs().contains("letting open connections finish"),
        || format!("the drain is not logged:\n{}", proxy.logs()),
    );
    ck.finish(&env);
}

/// `svcproxy-loadgen serve` in `pod` on `port` of both its families, ready; with
/// the binary's path, for the clients.
fn loadgen_server(
    env: &Env,
    pod: Host,
    port: u16,
) -> (std::path::PathBuf, svcproxy_e2e::NsProcess) {
    let load = svcproxy_e2e::loadgen_bin().expect("svcproxy-loadgen");
    let listen = Family::BOTH
        .map(|f| sa(pod_ip(pod, f), port).to_string())
        .join(",");
    let server = env
        .c
        .spawn(
            pod,
            "loadgen",
            &[&load.to_string_lossy(), "serve", "--listen", &listen],
        )
        .expect("start the echo server");
    server
        .wait_for_stdout("ready", ANSWER * 10)
        .expect("the echo server is ready");
    (load, server)
}

/// 1 GiB to an echoing pod and back through the userspace proxy (1 GiB each way,
/// relayed with splice), every byte checked by the client, which half-closes
/// after sending: the echo still comes back in full, so the proxy passed the
/// half-close on and kept the other half. From pod-a1 to pod-b0 across the nodes,
/// in both families.
#[test]
fn the_userspace_proxy_carries_a_gibibyte_each_way_intact() {
    let mode = Mode::Userspace;
    const PORT: u16 = 9100;
    let svc = Svc::dual("bulk", 121).port(SvcPort::new("echo", Proto::Tcp, 80, PORT));
    let slices: Vec<Slice> = Family::BOTH
        .iter()
        .map(|f| {
            Slice::with_ports(
                &svc,
                &format!("bulk-{}", family_name(*f).to_ascii_lowercase()),
                *f,
                &[("echo", Proto::Tcp, PORT)],
                vec![Ep::pod(B0, *f)],
            )
        })
        .collect();
    let Some(env) = Env::start(
        mode,
        EnvSpec::default(),
        &[(&fname(&svc), svc_file(&svc, &slices))],
    ) else {
        return;
    };
    let mut ck = Checks::new("userspace-gibibyte");
    let (load, _server) = loadgen_server(&env, B0, PORT);
    let load = load.to_string_lossy();
    for f in Family::BOTH {
        let target = sa(svc.cluster_ip(f), 80).to_string();
        let out = env.c.exec(
            A1,
            &[
                &load,
                "transfer",
                "--target",
                &target,
                "--bytes",
                "1073741824",
            ],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        ck.check(
            out.status.success() && stdout.contains("\"intact\":true"),
            || {
                format!(
                    "{} 1 GiB through {target}: {stdout} {}",
                    family_name(f),
                    String::from_utf8_lossy(&out.stderr)
                )
            },
        );
        eprintln!("[dataplane] 1 GiB each way, {}: {stdout}", family_name(f));
    }
    ck.finish(&env);
}

// -----------------------------------------------------------------------------------------
// The cluster DNS served by the proxy daemon itself (`--dns-bind-address`): not a data-plane
// behaviour, so once, in nftables mode.
// -----------------------------------------------------------------------------------------

/// Each node's proxy also serves the cluster DNS on its addresses, port 5353. A headless
/// service with zone topology keys has one endpoint per zone (pod-a0 in zone-1 on
/// node-a, pod-b0 in zone-2 on node-b). Pods of each node, each from its own namespace
/// and address, ask over UDP and TCP: the answer holds their own zone's endpoint,
/// whichever node's server they ask (a server places a client by the Nodes' podCIDRs).
#[test]
fn the_daemon_serves_topology_aware_dns_to_pods_by_their_node() {
    let endpoint = |h: Host, node: usize, zone: &str| {
        format!(
            "- {{addresses: [\"{}\"], nodeName: {}, zone: {zone}}}\n",
            pod_ip(h, Family::V4),
            plan::node_name(node)
        )
    };
    let db = format!(
        "apiVersion: v1
kind: Service
metadata:
  name: db
  namespace: demo
  annotations: {{svcproxy.io/topology-keys: \"topology.kubernetes.io/zone\"}}
spec:
  clusterIP: None
  ports: [{{name: pg, port: 5432}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: db-1
  namespace: demo
  labels: {{kubernetes.io/service-name: db}}
addressType: IPv4
ports: [{{name: pg, port: 5432, protocol: TCP}}]
endpoints:
{}{}",
        endpoint(A0, NODE_A, "zone-1"),
        endpoint(B0, NODE_B, "zone-2"),
    );
    let Some(env) = Env::start(
        Mode::Nftables,
        EnvSpec {
            zones: ["zone-1", "zone-2"],
            flags: vec![
                "--dns-bind-address=0.0.0.0:5353".into(),
                "--dns-upstream=none".into(),
            ],
            ..EnvSpec::default()
        },
        &[("db.yaml", db)],
    ) else {
        return;
    };
    let echo = svcproxy_e2e::bins::echo_bin().expect("svcproxy-echo");
    let echo = echo.to_str().unwrap();
    let mut ck = Checks::new("dns");
    let ask = |client: Host, node: usize, tcp: bool| -> serde_json::Value {
        let server = sa(plan::node_ip(node, Family::V4), 5353).to_string();
        let mut argv = vec![
            echo,
            "dns",
            "--server",
            &server,
            "--name",
            "db.demo.svc.cluster.local.",
        ];
        if tcp {
            argv.push("--tcp");
        }
        let out = env.c.exec(client, &argv);
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| serde_json::json!({"error": String::from_utf8_lossy(&out.stderr)}))
    };
    let a0 = pod_ip(A0, Family::V4).to_string();
    let b0 = pod_ip(B0, Family::V4).to_string();
    for (client, want) in [(A1, &a0), (B1, &b0)] {
        for node in [NODE_A, NODE_B] {
            for tcp in [false, true] {
                let got = ask(client, node, tcp);
                let what = format!(
                    "{client:?} asks {} over {}",
                    plan::node_name(node),
                    if tcp { "TCP" } else { "UDP" }
                );
                ck.check(got["answers"] == serde_json::json!([want]), || {
                    format!("{what}: {got}, want [{want}]")
                });
            }
        }
    }
    ck.finish(&env);
}

// -----------------------------------------------------------------------------------------
// The chaos run (not part of the suite: `scripts/chaos.sh`)
// -----------------------------------------------------------------------------------------

/// `CHAOS_SOURCE=api`: node-a's svcproxy reads a fake API server in node-a's
/// namespace (`--kubeconfig`) rather than the manifests. Each change of the churn
/// goes to it as well as to the files (node-b's source, and `explain`'s).
struct ApiSource {
    server: svcproxy_fakeapi::FakeApiServer,
    kubeconfig: tempfile::NamedTempFile,
    /// The server's tasks run on it (after the server in the drop order).
    _rt: tokio::runtime::Runtime,
}

impl ApiSource {
    /// The server started in node-a's namespace, holding every object of the
    /// manifests.
    fn start(env: &Env) -> ApiSource {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        // Its listening socket made in node-a's namespace, where svcproxy reaches it.
        let server = svcproxy_testkit::netns::in_netns(env.c.ns(Host::Node(NODE_A)), || {
            rt.block_on(svcproxy_fakeapi::FakeApiServer::start())
        })
        .expect("node-a's namespace")
        .expect("the fake API server");
        let kubeconfig = tempfile::NamedTempFile::new().expect("a kubeconfig file");
        std::fs::write(kubeconfig.path(), server.kubeconfig_yaml()).expect("the kubeconfig");
        let api = ApiSource {
            server,
            kubeconfig,
            _rt: rt,
        };
        let dir = std::fs::read_dir(env.manifests.path()).expect("the manifests");
        for entry in dir.flatten() {
            if !entry.file_name().to_string_lossy().starts_with('.') {
                api.apply(&std::fs::read_to_string(entry.path()).expect("a manifest"));
            }
        }
        api
    }

    /// Every object of the YAML `text` that svcproxy watches, created or updated.
    fn apply(&self, text: &str) {
        for doc in text.split("\n---") {
            let obj: serde_json::Value = yaml_serde::from_str(doc).expect("a YAML document");
            let watched = ["Service", "EndpointSlice", "Node", "ServiceCIDR"];
            if obj["kind"].as_str().is_some_and(|k| watched.contains(&k)) {
                self.server.apply(obj);
            }
        }
    }

    /// svcproxy's flags for it.
    fn flags(&self) -> Vec<String> {
        vec![
            "--kubeconfig".into(),
            self.kubeconfig.path().to_string_lossy().into_owned(),
        ]
    }
}

/// The chaos runs' shared part: 12 services in a two-node cluster, their endpoints
/// changed at random (never to none) by a small deterministic generator
/// (`CHAOS_SEED`), and the checks after each disruption.
struct Chaos {
    /// `CHAOS_SOURCE=api`: node-a reads the API; otherwise the manifests.
    api: Option<ApiSource>,
    mode: Mode,
    seconds: u64,
    services: Vec<Svc>,
    /// Each service's current endpoints (indices into [`Chaos::PODS`]).
    current: Vec<Vec<usize>>,
    seed: u64,
    changes: usize,
    probes: usize,
    failed: usize,
    mismatches: usize,
}

impl Chaos {
    const PODS: [Host; 4] = [A0, A1, B0, B1];
    const NAMES: [&'static str; 4] = ["pod-a0", "pod-a1", "pod-b0", "pod-b1"];

    /// `CHAOS_MODE`, `CHAOS_SECONDS` and `CHAOS_SEED`, and the cluster.
    fn start() -> Option<(Chaos, Env)> {
        let mode = match std::env::var("CHAOS_MODE").as_deref() {
            Ok("iptables") => Mode::Iptables,
            Ok("iptables-legacy") => Mode::IptablesLegacy,
            Ok("userspace") => Mode::Userspace,
            Ok("ebpf") => Mode::Ebpf,
            Ok("ipvs") => Mode::Ipvs,
            Ok("nftables") | Err(_) => Mode::Nftables,
            Ok(other) => panic!("CHAOS_MODE={other}: not a mode this run knows"),
        };
        let number = |var: &str, default: u64| {
            std::env::var(var)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(default)
        };
        let services: Vec<Svc> = (0..12u16)
            .map(|i| {
                Svc::dual(&format!("chaos{i}"), 60 + i).port(SvcPort::new(
                    "http",
                    Proto::Tcp,
                    80,
                    BACKEND_PORT,
                ))
            })
            .collect();
        let files: Vec<(String, String)> = services
            .iter()
            .map(|s| (fname(s), file(s, &Self::PODS)))
            .collect();
        let files: Vec<(&str, String)> =
            files.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let mut env = Env::start(mode, EnvSpec::default(), &files)?;
        let api = match std::env::var("CHAOS_SOURCE").as_deref() {
            Ok("api") => {
                // node-a's svcproxy started again on the API.
                let api = ApiSource::start(&env);
                let first = env.proxies.remove(env.proxy_index(NODE_A));
                first.kill();
                let bin = svcproxy_e2e::bins::svcproxy_bin();
                let proc = env.spawn_svcproxy(&bin, NODE_A, &api.flags());
                assert!(
                    wait_log(&proc, "svcproxy_sync::driver: synced", SYNC_DEADLINE)
                        && proc.stderr().lines().any(|l| {
                            l.contains("waiting for the initial lists") && l.contains("own-node")
                        }),
                    "node-a's svcproxy on the API source never synced from it\n{}",
                    proc.logs()
                );
                env.proxies.push(proc);
                Some(api)
            }
            Ok("manifests") | Err(_) => None,
            Ok(other) => panic!("CHAOS_SOURCE={other}: api or manifests"),
        };
        let chaos = Chaos {
            api,
            mode,
            seconds: number("CHAOS_SECONDS", 120),
            current: vec![(0..4).collect(); services.len()],
            services,
            seed: number("CHAOS_SEED", 0x5eed_cafe),
            changes: 0,
            probes: 0,
            failed: 0,
            mismatches: 0,
        };
        Some((chaos, env))
    }

    /// xorshift: the run is repeatable by its seed.
    fn next(&mut self, n: u64) -> u64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        self.seed % n
    }

    /// Changes endpoints every 50-250 ms for 1-5 s.
    fn churn(&mut self, env: &Env) {
        let until = Instant::now() + Duration::from_millis(1000 + self.next(4000));
        while Instant::now() < until {
            let s = self.next(self.services.len() as u64) as usize;
            let mask = 1 + self.next(15) as usize;
            self.current[s] = (0..4).filter(|p| mask & (1 << p) != 0).collect();
            let chosen: Vec<Host> = self.current[s].iter().map(|&p| Self::PODS[p]).collect();
            let svc = &self.services[s];
            let text = file(svc, &chosen);
            env.write(&fname(svc), &text);
            if let Some(api) = &self.api {
                api.apply(&text);
            }
            self.changes += 1;
            let pause = 50 + self.next(200);
            thread::sleep(Duration::from_millis(pause));
        }
    }

    /// node-a's svcproxy's flags for its source (none: the manifests).
    fn source_flags(&self) -> Vec<String> {
        self.api.as_ref().map(ApiSource::flags).unwrap_or_default()
    }

    /// What the run is, for its report: the mode, and the API source.
    fn label(&self) -> String {
        match self.api {
            Some(_) => format!("{} (API source)", self.mode.label()),
            None => self.mode.label().to_string(),
        }
    }

    /// Every cluster IP and port, both families.
    fn cluster_ips(&self) -> Vec<SocketAddr> {
        self.services
            .iter()
            .flat_map(|s| Family::BOTH.map(|f| sa(s.cluster_ip(f), 80)))
            .collect()
    }

    /// After a disruption (the churn paused): node-a's kernel equal to the plan, and
    /// every service answering a pod of node-a from its current endpoints.
    fn check(&mut self, env: &Env, ck: &mut Checks, what: &str) {
        // The new owner has read every file and later syncs follow within
        // --min-sync-period 0s.
        thread::sleep(Duration::from_millis(500));
        let (diffs, shown) = live_differences(env, NODE_A);
        if diffs != 0 {
            self.mismatches += 1;
            ck.check(false, || {
                format!("{what}: explain --live found {diffs} differences: {shown}")
            });
        }
        for s in 0..self.services.len() {
            let allowed: Vec<&str> = self.current[s].iter().map(|&p| Self::NAMES[p]).collect();
            let f = if self.next(2) == 0 {
                Family::V4
            } else {
                Family::V6
            };
            let svc = &self.services[s];
            let got = env.probe(A1, Proto::Tcp, sa(svc.cluster_ip(f), 80), 1, ANSWER);
            self.probes += 1;
            if !got
                .iter()
                .all(|a| a.backend().is_some_and(|b| allowed.contains(&b)))
            {
                self.failed += 1;
                ck.answered_by(
                    &format!("{what}: pod-a1 -> {} ({f:?})", svc.name),
                    &got,
                    &allowed,
                );
            }
        }
    }
}

/// For `CHAOS_SECONDS` (default 120), in `CHAOS_MODE` (default nftables): 12 services'
/// endpoints change every 50-250 ms while node-a's svcproxy is killed with SIGKILL at
/// random moments (every 1-5 s) and started again, and a pod of node-a connects to
/// the services all along (each connection must be answered, but in userspace mode,
/// whose proxy is the process). After each restart's own first sync, with the churn
/// paused, `explain --live` must find node-a's kernel equal to the plan and every
/// service must answer a pod of node-a from its current endpoints. Prints the counts;
/// fails on any mismatch or failed probe.
#[test]
#[ignore]
fn chaos_kill_9_under_endpoint_churn() {
    let Some((mut chaos, mut env)) = Chaos::start() else {
        return;
    };
    let bin = svcproxy_e2e::bins::svcproxy_bin();
    let deadline = Instant::now() + Duration::from_secs(chaos.seconds);
    let mut ck = Checks::new("chaos");
    let mut restarts = 0;
    let mut slowest = Duration::ZERO;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let cluster_ips = chaos.cluster_ips();
    let source = chaos.source_flags();
    let timeline = Timeline::new();
    // Node-a's proxy, out of `env` while the stream borrows it.
    let mut owner = env.proxies.remove(env.proxy_index(NODE_A));
    let streamed = thread::scope(|scope| {
        let env_ref = &env;
        let stream = scope.spawn(|| connect_all_along(env_ref, &cluster_ips, &stop, &timeline));
        while Instant::now() < deadline {
            chaos.churn(&env);
            // SIGKILL node-a's proxy mid-whatever and start it again; the kernel's
            // objects stay (and keep forwarding) while it is down.
            owner.kill();
            timeline.note(format!("restart {}: SIGKILL", restarts + 1));
            let t = Instant::now();
            let proc = env.spawn_svcproxy(&bin, NODE_A, &source);
            // Its own first sync (the kernel's objects are there already).
            let synced = wait_log(&proc, "svcproxy_sync::driver: synced", SYNC_DEADLINE);
            timeline.note(format!("restart {}: first sync seen", restarts + 1));
            slowest = slowest.max(t.elapsed());
            ck.check(synced, || {
                format!("restart {restarts}: no sync\n{}", proc.logs())
            });
            owner = proc;
            restarts += 1;
            chaos.check(&env, &mut ck, &format!("restart {restarts}"));
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        stream.join().expect("the stream")
    });
    env.proxies.push(owner);
    // The userspace mode's proxy is the process: while it is down its capture
    // refuses (counted, not a failure of the run).
    let failed = if chaos.mode.forwards_without_the_process() {
        failed_connections(&mut ck, &streamed, &timeline)
    } else {
        streamed
            .iter()
            .filter(|s| s.attempt.backend().is_none())
            .count()
    };
    eprintln!(
        "[chaos] {}: {} s: {restarts} SIGKILL restarts (the slowest start to its first sync \
         {slowest:?}), {} endpoint changes, {} connections during the run with {failed} \
         failed, {} kernel/plan mismatches after a restart, {} probes after a restart, {} \
         failed",
        chaos.label(),
        chaos.seconds,
        chaos.changes,
        streamed.len(),
        chaos.mismatches,
        chaos.probes,
        chaos.failed
    );
    ck.finish(&env);
}

/// What happened when during a chaos run (restarts, hand-overs, first syncs), to
/// place a failed connection of the stream among them.
struct Timeline {
    start: Instant,
    events: std::sync::Mutex<Vec<(Duration, String)>>,
}

impl Timeline {
    fn new() -> Timeline {
        Timeline {
            start: Instant::now(),
            events: Default::default(),
        }
    }

    fn note(&self, what: impl Into<String>) {
        let at = self.start.elapsed();
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((at, what.into()));
    }

    /// The events within two seconds before `at` and one after, as text.
    fn around(&self, at: Duration) -> String {
        let events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let near: Vec<String> = events
            .iter()
            .filter(|(t, _)| *t + Duration::from_secs(2) >= at && *t <= at + Duration::from_secs(1))
            .map(|(t, w)| format!("{:.3}s {w}", t.as_secs_f64()))
            .collect();
        near.join("; ")
    }
}

/// One connection of the stream: when its probe began, to where, and how it went.
struct Streamed {
    at: Duration,
    target: SocketAddr,
    attempt: svcproxy_e2e::Attempt,
}

/// Connections from pod-a1 (a pod of node-a) all along, one cluster IP after another,
/// until `stop`.
fn connect_all_along(
    env: &Env,
    cluster_ips: &[SocketAddr],
    stop: &std::sync::atomic::AtomicBool,
    timeline: &Timeline,
) -> Vec<Streamed> {
    let mut all = Vec::new();
    let mut i = 0;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let target = cluster_ips[i % cluster_ips.len()];
        let at = timeline.start.elapsed();
        all.extend(
            env.probe(A1, Proto::Tcp, target, 3, ANSWER)
                .into_iter()
                .map(|attempt| Streamed {
                    at,
                    target,
                    attempt,
                }),
        );
        i += 1;
    }
    all
}

/// Every connection of the stream must have been answered: the failed ones
/// (checked), each placed among the run's events.
fn failed_connections(ck: &mut Checks, streamed: &[Streamed], timeline: &Timeline) -> usize {
    let failed: Vec<&Streamed> = streamed
        .iter()
        .filter(|s| s.attempt.backend().is_none())
        .collect();
    let attempts: Vec<svcproxy_e2e::Attempt> = streamed.iter().map(|s| s.attempt.clone()).collect();
    ck.check(failed.is_empty(), || {
        let each: Vec<String> = failed
            .iter()
            .map(|s| {
                format!(
                    "at {:.3}s to {} ({:?} after {:?}, local {:?}, peer {:?}); around it: {}",
                    s.at.as_secs_f64(),
                    s.target,
                    s.attempt.result,
                    s.attempt.elapsed,
                    s.attempt.local,
                    s.attempt.peer,
                    timeline.around(s.at)
                )
            })
            .collect();
        format!(
            "{} of {} connections failed: {:?}\n{}",
            failed.len(),
            streamed.len(),
            svcproxy_e2e::tally(&attempts),
            each.join("\n")
        )
    });
    failed.len()
}

/// The same churn, with rolling upgrades instead of kills: at random moments (every
/// 1-5 s; every other time after a second's pause, so that the sealed rules can be
/// adopted) a new svcproxy (two binaries, alternately) starts beside node-a's, waits
/// as a standby, and takes over at the owner's SIGTERM, while a pod of node-a connects
/// to the services all along (each connection must be answered). After each hand-over,
/// with the churn paused, the kernel must equal the plan and every service answer
/// from its current endpoints. Prints the counts (hand-overs, adoptions, connections
/// and failures); fails on any.
#[test]
#[ignore]
fn chaos_rolling_hand_overs_under_endpoint_churn() {
    let Some((mut chaos, mut env)) = Chaos::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temporary directory");
    let next = dir.path().join("svcproxy-next");
    std::fs::copy(svcproxy_e2e::bins::svcproxy_bin(), &next).expect("copy svcproxy");
    let bins = [svcproxy_e2e::bins::svcproxy_bin(), next];
    let deadline = Instant::now() + Duration::from_secs(chaos.seconds);
    let mut ck = Checks::new("chaos-hand-over");
    let (mut hand_overs, mut adopted, mut slowest) = (0, 0, Duration::ZERO);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let cluster_ips = chaos.cluster_ips();
    let source = chaos.source_flags();
    let timeline = Timeline::new();
    // Node-a's owner, out of `env` while the stream borrows it.
    let mut owner = env.proxies.remove(env.proxy_index(NODE_A));
    let env = env;
    let streamed = thread::scope(|scope| {
        let env_ref = &env;
        let stream = scope.spawn(|| connect_all_along(env_ref, &cluster_ips, &stop, &timeline));
        while Instant::now() < deadline {
            chaos.churn(&env);
            // Every other time the owner is given a second to sync the last change
            // (then the new owner usually adopts its sealed rules); otherwise the
            // hand-over comes mid-change (then it writes everything).
            if hand_overs % 2 == 1 {
                thread::sleep(Duration::from_secs(1));
            }
            let bin = &bins[hand_overs % 2];
            let new = env.spawn_svcproxy(bin, NODE_A, &source);
            if !wait_log(&new, "waiting as a warm standby", SYNC_DEADLINE) {
                ck.check(false, || {
                    format!("hand-over {hand_overs}: no standby\n{}", new.logs())
                });
                break;
            }
            timeline.note(format!("hand-over {}: SIGTERM", hand_overs + 1));
            let t = Instant::now();
            let status = owner.terminate(Duration::from_secs(30));
            timeline.note(format!("hand-over {}: the old owner gone", hand_overs + 1));
            slowest = slowest.max(t.elapsed());
            ck.check(status.is_some_and(|s| s.success()), || {
                format!("hand-over {hand_overs}: the old owner at SIGTERM: {status:?}")
            });
            ck.check(wait_log(&new, "took over", Duration::from_secs(5)), || {
                format!("hand-over {hand_overs}: never took over\n{}", new.logs())
            });
            hand_overs += 1;
            chaos.check(&env, &mut ck, &format!("hand-over {hand_overs}"));
            if new.stderr().contains("adopted, nothing written") {
                adopted += 1;
            }
            owner = new;
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        stream.join().expect("the stream")
    });
    if !ck.is_ok() {
        eprintln!("[chaos] node-a's last owner:\n{}", owner.logs());
    }
    let failed = failed_connections(&mut ck, &streamed, &timeline);
    eprintln!(
        "[chaos] {}: {} s: {hand_overs} hand-overs ({adopted} adopted the sealed rules, \
         the slowest SIGTERM-to-exit {slowest:?}), {} endpoint changes, {} connections \
         during the run with {} failed, {} kernel/plan mismatches after a hand-over, {} \
         probes after a hand-over, {} failed",
        chaos.label(),
        chaos.seconds,
        chaos.changes,
        streamed.len(),
        failed,
        chaos.mismatches,
        chaos.probes,
        chaos.failed
    );
    ck.finish(&env);
}
