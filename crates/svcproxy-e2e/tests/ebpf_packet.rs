//! The eBPF data plane's packet path on real packets: tc programs on node-a's
//! interfaces of a two-node namespace cluster translate connections that no local
//! socket made (from the external client, from a pod) to endpoints on this node
//! and on the other, with masquerade exactly where the intent says.
//!
//! Shown here, IPv4 and IPv6: a NodePort with `externalTrafficPolicy: Cluster`
//! from outside reaches the endpoints of both nodes (the other node's only
//! because the connection is masqueraded) over TCP and UDP; an external IP; a
//! Local policy keeps the client's address and this node's endpoint; a port with
//! no endpoint refuses (the companion reject rule); loadBalancerSourceRanges
//! admit one source and drop another; a pod reaches a cluster IP's endpoints, its
//! own included (the hairpin, masqueraded); the replies carry the service
//! address; ICMP errors about translated packets are translated both ways (an
//! endpoint's port unreachable refuses the client's UDP socket, a client's
//! reaches the endpoint's); a reply to a node's own UDP socket whose port is a
//! NodePort reaches that socket, and so does a masqueraded flow's reply to a
//! client port that is a NodePort; `explain --live`'s comparison from the writing process and from
//! another; an interface that appears gets the programs at the drift check;
//! cleanup removes pins and rules.
//!
//! Safety: the programs attach only to interfaces of node-a's namespace (the
//! driver runs on a thread inside it), cgroup programs to the test's own cgroup,
//! pins live in a bpffs the test mounts; all go with the namespaces and mounts,
//! even when the test fails. Without root, BPF or the tools it prints SKIP (fails
//! under CI).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use svcproxy_core::state::ClusterState;
use svcproxy_dataplane::ebpf::XdpMode;
use svcproxy_dataplane::{DataPlane, EbpfDataPlane, EbpfOptions};
use svcproxy_e2e::plan::{self, Family};
use svcproxy_e2e::xdp::TestXdp;
use svcproxy_e2e::{
    ebpf_options, ebpf_runs_here, Attempt, BackendPorts, Cluster, ClusterSpec, Confinement, Host,
    ProbeSpec, Proto,
};
use svcproxy_plan::{build_intent, LocalDetection, PlanConfig};
use svcproxy_sync::Driver;
use svcproxy_testkit::netns::{self, in_netns};

fn q(ip: IpAddr) -> String {
    format!("\"{ip}\"")
}

/// A service of the test: name, cluster IP index, type, extra spec lines, TCP and
/// UDP NodePorts, the endpoints' port and nodes.
type ServiceRow = (
    &'static str,
    u16,
    &'static str,
    String,
    u16,
    u16,
    u16,
    &'static [usize],
);

fn manifests() -> String {
    let mut out = String::new();
    for n in 0..2 {
        let name = plan::node_name(n);
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels: \
             {{kubernetes.io/hostname: {name}}}\nspec:\n  podCIDRs: [\"{}\", \"{}\"]\n\
             status:\n  addresses:\n  - {{type: InternalIP, address: {}}}\n  \
             - {{type: InternalIP, address: {}}}\n",
            plan::pod_cidr(n, Family::V4),
            plan::pod_cidr(n, Family::V6),
            q(plan::node_ip(n, Family::V4)),
            q(plan::node_ip(n, Family::V6)),
        );
    }
    let services: [ServiceRow; 8] = [
        (
            "web",
            10,
            "NodePort",
            format!(
                "  externalIPs: [{}, {}]\n",
                q(plan::external_ip(10, Family::V4)),
                q(plan::external_ip(10, Family::V6))
            ),
            30080,
            30090,
            8080,
            &[0, 1],
        ),
        (
            "local",
            11,
            "NodePort",
            "  externalTrafficPolicy: Local\n".to_string(),
            30081,
            30091,
            8080,
            &[0, 1],
        ),
        (
            "empty",
            12,
            "NodePort",
            String::new(),
            30082,
            30092,
            8080,
            &[],
        ),
        (
            "fenced",
            13,
            "LoadBalancer",
            format!(
                "  loadBalancerSourceRanges: [\"{}/32\", \"{}/128\"]\n",
                plan::ext_ip(Family::V4),
                plan::ext_ip(Family::V6)
            ),
            30083,
            30093,
            8080,
            &[0, 1],
        ),
        // Nothing listens on the endpoints' port: the pods answer UDP with an
        // ICMP port unreachable.
        (
            "closed",
            14,
            "NodePort",
            String::new(),
            30084,
            30094,
            8081,
            &[0, 1],
        ),
        // For the test's own endpoint sockets (ICMP errors about replies):
        // masqueraded from outside (the other node's endpoint), and not.
        (
            "remote",
            15,
            "NodePort",
            String::new(),
            30085,
            30095,
            8082,
            &[1],
        ),
        (
            "near",
            16,
            "NodePort",
            "  externalTrafficPolicy: Local\n".to_string(),
            30086,
            30096,
            8082,
            &[0],
        ),
        // A test socket behind a narrow link (node-a's side of pod-a0's veth
        // has MTU 1280), masqueraded from outside.
        (
            "narrow",
            17,
            "NodePort",
            String::new(),
            30087,
            30097,
            8083,
            &[0],
        ),
    ];
    for (name, n, ty, extra, tcp_np, udp_np, target, nodes) in &services {
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: demo}}\n\
             spec:\n  type: {ty}\n  clusterIP: {v4}\n  clusterIPs: [{v4}, {v6}]\n  \
             ipFamilies: [IPv4, IPv6]\n  ipFamilyPolicy: RequireDualStack\n{extra}  ports:\n  \
             - {{name: http, port: 80, targetPort: {target}, protocol: TCP, nodePort: {tcp_np}}}\n  \
             - {{name: echo, port: 90, targetPort: {target}, protocol: UDP, nodePort: {udp_np}}}\n",
            v4 = q(plan::cluster_ip(*n, Family::V4)),
            v6 = q(plan::cluster_ip(*n, Family::V6)),
        );
        if *ty == "LoadBalancer" {
            let _ = write!(
                out,
                "status:\n  loadBalancer:\n    ingress: [{{ip: {}}}, {{ip: {}}}]\n",
                q(plan::external_ip(13, Family::V4)),
                q(plan::external_ip(13, Family::V6))
            );
        }
        if nodes.is_empty() {
            continue;
        }
        for f in Family::BOTH {
            let eps: String = nodes
                .iter()
                .map(|&node| {
                    format!(
                        "- {{addresses: [{}], nodeName: {}}}\n",
                        q(plan::pod_ip(node, 0, f)),
                        plan::node_name(node)
                    )
                })
                .collect();
            let (ty, low) = if f == Family::V4 {
                ("IPv4", "v4")
            } else {
                ("IPv6", "v6")
            };
            let _ = write!(
                out,
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  \
                 name: {name}-{low}\n  namespace: demo\n  labels: {{kubernetes.io/service-name: {name}}}\n\
                 addressType: {ty}\nports:\n- {{name: http, port: {target}, protocol: TCP}}\n\
                 - {{name: echo, port: {target}, protocol: UDP}}\nendpoints:\n{eps}"
            );
        }
    }
    out
}

fn state() -> ClusterState {
    svcproxy_testkit::objects::state(&plan::node_name(0), &[manifests()])
}

fn plan_config() -> PlanConfig {
    PlanConfig {
        local_detection: LocalDetection::NodeCidr(Vec::new()),
        ..PlanConfig::default()
    }
}

fn seen(a: &[Attempt]) -> BTreeSet<String> {
    a.iter().map(Attempt::label).collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// An endpoint socket (port 8082 of `backend`) answers a datagram from outside
/// sent to `target`; the client has gone by then, so its node answers the reply
/// with an ICMP port unreachable. `Ok` with the client as the endpoint saw it
/// when that error reaches the endpoint's connected socket as ECONNREFUSED (its
/// quoted packet translated back to the endpoint's own addresses).
fn error_about_a_reply(
    cluster: &Cluster,
    backend: Host,
    f: Family,
    target: SocketAddr,
) -> Result<SocketAddr, String> {
    let any: IpAddr = match f {
        Family::V4 => Ipv4Addr::UNSPECIFIED.into(),
        Family::V6 => Ipv6Addr::UNSPECIFIED.into(),
    };
    let server = in_netns(cluster.ns(backend), || UdpSocket::bind((any, 8082)))
        .map_err(|e| format!("{e:#}"))?
        .map_err(|e| format!("bind in {backend:?}: {e}"))?;
    server
        .set_read_timeout(Some(Duration::from_secs(3)))
        .map_err(|e| e.to_string())?;
    in_netns(cluster.ns(Host::Ext), || {
        let client = UdpSocket::bind((plan::ext_ip(f), 0))?;
        client.send_to(b"svcproxy icmp test\n", target)
        // Closed here, before any reply.
    })
    .map_err(|e| format!("{e:#}"))?
    .map_err(|e| format!("send from outside: {e}"))?;
    let mut buf = [0u8; 64];
    let (_, from) = server
        .recv_from(&mut buf)
        .map_err(|e| format!("no datagram at the endpoint: {e}"))?;
    server.connect(from).map_err(|e| e.to_string())?;
    server.send(b"reply\n").map_err(|e| format!("reply: {e}"))?;
    match server.recv(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(from),
        other => Err(format!("the endpoint (peer {from}) saw {other:?}")),
    }
}

/// The external client sends 64 KiB over TCP to `target`, whose endpoint is a
/// socket on port 8083 of pod-a0, behind node-a's side of its veth with MTU
/// 1280: the client's full-sized segments meet the node's "fragmentation
/// needed" (IPv6: "packet too big"), which must reach the client translated
/// (it quotes the client's packet sent to the service address) for it to send
/// smaller ones. `Ok` with the peer the endpoint saw, once all the bytes came.
fn upload_through_a_narrow_link(
    cluster: &Cluster,
    f: Family,
    target: SocketAddr,
) -> Result<SocketAddr, String> {
    use std::io::{Read, Write};
    const SIZE: usize = 64 * 1024;
    let any: IpAddr = match f {
        Family::V4 => Ipv4Addr::UNSPECIFIED.into(),
        Family::V6 => Ipv6Addr::UNSPECIFIED.into(),
    };
    let listener = in_netns(cluster.ns(Host::Pod(0, 0)), || {
        std::net::TcpListener::bind((any, 8083))
    })
    .map_err(|e| format!("{e:#}"))?
    .map_err(|e| format!("bind in pod-a0: {e}"))?;
    let server = std::thread::spawn(move || -> Result<(SocketAddr, usize), String> {
        let (mut conn, peer) = listener.accept().map_err(|e| e.to_string())?;
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let mut got = Vec::new();
        conn.read_to_end(&mut got)
            .map_err(|e| format!("reading from {peer}: {e}"))?;
        conn.write_all(format!("{}\n", got.len()).as_bytes())
            .map_err(|e| e.to_string())?;
        Ok((peer, got.len()))
    });
    let sent = in_netns(cluster.ns(Host::Ext), || {
        std::net::TcpStream::connect_timeout(&target, Duration::from_secs(3))
    })
    .map_err(|e| format!("{e:#}"))
    .and_then(|c| c.map_err(|e| format!("connect {target}: {e}")))
    .and_then(|mut c| {
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        c.write_all(&vec![b'x'; SIZE])
            .map_err(|e| format!("write: {e}"))?;
        c.shutdown(std::net::Shutdown::Write)
            .map_err(|e| e.to_string())?;
        let mut answer = String::new();
        c.read_to_string(&mut answer)
            .map_err(|e| format!("read: {e}"))?;
        Ok(answer)
    });
    if sent.is_err() {
        // The server may wait for a connection that never came: a connection
        // to it from here ends its accept().
        let _ = in_netns(cluster.ns(Host::Pod(0, 0)), || {
            std::net::TcpStream::connect((plan::pod_ip(0, 0, f), 8083))
        });
    }
    let served = server.join().map_err(|_| "server panicked".to_string())?;
    let answer = sent?;
    let (peer, n) = served?;
    if n != SIZE || answer.trim() != SIZE.to_string() {
        return Err(format!("{n} bytes arrived, the client heard {answer:?}"));
    }
    Ok(peer)
}

/// A process on node-a talks UDP to the external client from the node's address
/// and port 30090, which is also a NodePort: the client's answer is a reply
/// (conntrack would say so), and must reach that socket, not an endpoint.
fn reply_to_a_node_socket_on_a_node_port(cluster: &Cluster, f: Family) -> Result<(), String> {
    let node = SocketAddr::new(plan::node_ip(0, f), 30090);
    let local = in_netns(cluster.ns(Host::Node(0)), || UdpSocket::bind(node))
        .map_err(|e| format!("{e:#}"))?
        .map_err(|e| format!("bind {node} on node-a: {e}"))?;
    let peer = in_netns(cluster.ns(Host::Ext), || {
        UdpSocket::bind((plan::ext_ip(f), 0))
    })
    .map_err(|e| format!("{e:#}"))?
    .map_err(|e| format!("bind outside: {e}"))?;
    for s in [&local, &peer] {
        s.set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
    }
    let to = peer.local_addr().map_err(|e| e.to_string())?;
    local.connect(to).map_err(|e| e.to_string())?;
    local.send(b"question\n").map_err(|e| e.to_string())?;
    let mut buf = [0u8; 64];
    let (_, from) = peer
        .recv_from(&mut buf)
        .map_err(|e| format!("nothing arrived outside: {e}"))?;
    peer.send_to(b"answer\n", from).map_err(|e| e.to_string())?;
    match local.recv(&mut buf) {
        Ok(n) if &buf[..n] == b"answer\n" => Ok(()),
        other => {
            // Where the answer went instead: translated to an endpoint, whose
            // echo comes back to the peer.
            let _ = peer.set_read_timeout(Some(Duration::from_millis(500)));
            let echoed = peer
                .recv_from(&mut buf)
                .map(|(n, from)| (from, String::from_utf8_lossy(&buf[..n]).into_owned()));
            Err(format!(
                "the node's socket ({node}, connected to {to}) got {other:?}; the peer then got {echoed:?}"
            ))
        }
    }
}

#[test]
fn packets_from_outside_and_from_pods_reach_endpoints_through_tc() {
    run(
        "packets_from_outside_and_from_pods_reach_endpoints_through_tc",
        XdpMode::Off,
    );
}

/// The same packets with the XDP fast path on node-a's interfaces
/// (`--ebpf-xdp=native`): the same verdicts, the Local policy's connections
/// sent on to pod-a0 by the XDP program itself (pod-a0's side of its veth runs
/// an XDP program, so the kernel says the node's side takes redirected frames),
/// the fenced port's drops made there.
#[test]
fn packets_from_outside_and_from_pods_reach_endpoints_through_xdp() {
    run(
        "packets_from_outside_and_from_pods_reach_endpoints_through_xdp",
        XdpMode::Native,
    );
}

fn run(test: &str, xdp: XdpMode) {
    let tools: &[&str] = match xdp {
        XdpMode::Off => &["ip", "nft", "mount", "umount"],
        XdpMode::Native => &["ip", "nft", "mount", "umount", "ethtool"],
    };
    if !netns::can_run(test, tools) {
        return;
    }
    let conf = match Confinement::new() {
        Ok(c) => c,
        Err(e) => {
            netns::skip(test, &format!("cannot confine BPF programs: {e}"));
            return;
        }
    };
    let cluster = Cluster::create(ClusterSpec {
        nodes: 2,
        pods_per_node: 1,
        dual_stack: true,
        ext_via: 0,
    })
    .expect("cluster");
    let _backends = cluster
        .start_backends(&BackendPorts {
            tcp: vec![8080],
            udp: vec![8080],
            sctp: Vec::new(),
        })
        .expect("backends");
    // The pods answer every datagram to a closed port with an error: the kernel's
    // ICMP rate limit (per destination, a burst of about six) would turn some of
    // the refusals checked below into timeouts. In the pods' own namespaces.
    for pod in [Host::Pod(0, 0), Host::Pod(1, 0)] {
        cluster.exec_ok(
            pod,
            &[
                "sysctl",
                "-qw",
                "net.ipv4.icmp_ratelimit=0",
                "net.ipv6.icmp.ratelimit=0",
            ],
        );
    }
    let node_a = cluster.ns(Host::Node(0)).to_string();
    // pod-a0's side of its veth takes redirected frames (an XDP program there),
    // and the external client's packets carry whole checksums, as from a wire
    // (a veth leaves them partial, and XDP leaves such packets to the stack).
    // So does the LAN's side of node-a's link, which node-b's endpoint is
    // reached by (node-a sends those back out of eth0, masqueraded).
    // node-b's endpoint's replies, which node-a sends on from XDP too, carry
    // whole checksums for the same reason.
    let _pod_xdp = (xdp == XdpMode::Native).then(|| {
        cluster.exec_ok(Host::Ext, &["ethtool", "-K", "eth0", "tx", "off"]);
        cluster.exec_ok(Host::Pod(1, 0), &["ethtool", "-K", "eth0", "tx", "off"]);
        [
            TestXdp::attach(cluster.ns(Host::Pod(0, 0)), "eth0", "bench_pass").expect("pod XDP"),
            TestXdp::attach(cluster.ns(Host::Lan), "n-a", "bench_pass").expect("LAN XDP"),
        ]
    });
    // A narrow link: node-a's side of pod-a0's veth (upload_through_a_narrow_link).
    cluster.exec_ok(Host::Node(0), &["ip", "link", "set", "p0", "mtu", "1280"]);
    // A CNI's masquerade of the pods' traffic to outside the cluster (flannel's,
    // kindnet's): replies the kernel's conntrack takes for new flows would be
    // masqueraded by it, and reach the client from the wrong address.
    cluster
        .nft(
            Host::Node(0),
            &format!(
                "table inet cni-like {{\n\tchain postrouting {{\n\t\ttype nat hook postrouting \
                 priority srcnat + 10; policy accept;\n\t\tip saddr {v4} ip daddr != {v4} \
                 masquerade\n\t\tip6 saddr {v6} ip6 daddr != {v6} masquerade\n\t}}\n}}\n",
                v4 = plan::cluster_cidr(Family::V4),
                v6 = plan::cluster_cidr(Family::V6),
            ),
        )
        .expect("the CNI-like masquerade");
    // The node's external interface named, as a CIDR --detect-local-mode needs
    // (the pods' veths are not told apart by it).
    let options = EbpfOptions {
        xdp,
        xdp_interfaces: vec!["eth0".to_string()],
        ..ebpf_options(&conf)
    };
    let mut st = state();
    if !ebpf_runs_here(test, &node_a, &options) {
        return;
    }
    let mut driver = Driver::without_conntrack(plan_config(), EbpfDataPlane::new(options.clone()));
    let snap = st.snapshot();
    let synced = in_netns(&node_a, || driver.sync(&snap, true)).expect("netns");
    if let Err(e) = synced {
        panic!("{test}: the first sync failed: {e}");
    }

    let mut failures = Vec::new();
    let mut check = |what: String, ok: bool, detail: String| {
        if !ok {
            failures.push(format!("{what}: {detail}"));
        }
    };
    let probe = |from: Host, proto: Proto, target: SocketAddr, count: usize| {
        cluster.probe(from, proto, target, count, Duration::from_millis(1500))
    };
    let both = set(&["pod-a0", "pod-b0"]);
    for f in Family::BOTH {
        let node = plan::node_ip(0, f);
        let ext = plan::ext_ip(f);
        for (proto, port) in [(Proto::Tcp, 30080), (Proto::Udp, 30090)] {
            let target = SocketAddr::new(node, port);
            let before = svcproxy_dataplane::ebpf::kernel::xdp_packets(&conf.pin_dir());
            let a = probe(Host::Ext, proto, target, 30);
            let after = svcproxy_dataplane::ebpf::kernel::xdp_packets(&conf.pin_dir());
            check(
                format!(
                    "{proto} {target} from outside (Cluster policy) reaches both nodes' endpoints"
                ),
                seen(&a) == both,
                format!("{:?}", seen(&a)),
            );
            // The masquerade: the kernel's through tc (the client's own port,
            // below 61000, kept), svcproxy's own through XDP (a port above the
            // node's ip_local_port_range, 32768-60999 in a new namespace), the
            // packets sent on from XDP. (Through XDP, the first connections to
            // an endpoint whose neighbour is not known yet take the stack's way,
            // and the kernel's masquerade.)
            let ours = a
                .iter()
                .filter(|x| x.client_seen().is_some_and(|c| c.port() >= 61000))
                .count();
            let by_xdp = xdp == XdpMode::Native;
            check(
                format!(
                    "{proto} {target}: masqueraded by {}",
                    if by_xdp {
                        "the XDP program"
                    } else {
                        "the kernel"
                    }
                ),
                // A UDP probe is one datagram each way: more packets sent on
                // than connections masqueraded are node-b's endpoint's replies,
                // sent on from XDP too.
                if by_xdp {
                    // node-b's endpoint's replies, but for the first (its way
                    // to the client may not be known yet) and one of margin.
                    let replies = if proto == Proto::Udp {
                        a.iter()
                            .filter(|x| x.backend() == Some("pod-b0"))
                            .count()
                            .saturating_sub(2)
                    } else {
                        0
                    };
                    ours >= a.len() * 2 / 3
                        && after
                            .zip(before)
                            .is_some_and(|(a, b)| a[0] >= b[0] + (ours + replies) as u64)
                } else {
                    ours == 0
                },
                format!(
                    "{:?} xdp {before:?} then {after:?}",
                    a.iter().map(|x| x.client_seen()).collect::<Vec<_>>()
                ),
            );
            let peers: BTreeSet<Option<SocketAddr>> = a.iter().map(|x| x.peer).collect();
            check(
                format!("{proto} {target}: replies come from the NodePort"),
                peers == BTreeSet::from([Some(target)]),
                format!("{peers:?}"),
            );
        }
        let target = SocketAddr::new(plan::external_ip(10, f), 80);
        let a = probe(Host::Ext, Proto::Tcp, target, 20);
        check(
            format!("external IP {target} from outside"),
            seen(&a) == both,
            format!("{:?}", seen(&a)),
        );

        let target = SocketAddr::new(node, 30081);
        let a = probe(Host::Ext, Proto::Tcp, target, 10);
        let clients: BTreeSet<Option<IpAddr>> =
            a.iter().map(|x| x.client_seen().map(|c| c.ip())).collect();
        check(
            format!("{target} (Local policy) goes to this node's endpoint only"),
            seen(&a) == set(&["pod-a0"]),
            // With the XDP program's counters (forwarded, dropped, passed): a
            // connection lost once in CI under load is to be told apart.
            format!(
                "{:?} {:?} xdp {:?}",
                seen(&a),
                a.iter().map(|x| &x.result).collect::<Vec<_>>(),
                svcproxy_dataplane::ebpf::kernel::xdp_packets(&conf.pin_dir())
            ),
        );
        check(
            format!("{target} (Local policy) keeps the client's address"),
            clients == BTreeSet::from([Some(ext)]),
            format!("{clients:?}"),
        );

        let target = SocketAddr::new(node, 30082);
        let a = probe(Host::Ext, Proto::Tcp, target, 3);
        check(
            format!("{target} (no endpoint) is refused"),
            a.iter().all(Attempt::is_refused),
            format!("{:?}", seen(&a)),
        );

        let target = SocketAddr::new(plan::external_ip(13, f), 80);
        let a = probe(Host::Ext, Proto::Tcp, target, 10);
        check(
            format!("{target} admits a source in loadBalancerSourceRanges"),
            seen(&a) == both,
            format!("{:?}", seen(&a)),
        );
        let spec = ProbeSpec::new(Proto::Tcp, target)
            .count(2)
            .timeout(Duration::from_millis(800))
            .source_ip(plan::ext_alt_ip(f));
        let a = cluster.probe_spec(Host::Ext, &spec);
        check(
            format!("{target} drops a source outside loadBalancerSourceRanges"),
            a.iter().all(Attempt::is_timeout),
            format!("{:?}", seen(&a)),
        );

        let target = SocketAddr::new(plan::cluster_ip(10, f), 80);
        let a = probe(Host::Pod(0, 0), Proto::Tcp, target, 30);
        check(
            format!("{target} from pod-a0 reaches both endpoints, its own included"),
            seen(&a) == both,
            format!("{:?}", seen(&a)),
        );
        let peers: BTreeSet<Option<SocketAddr>> = a.iter().map(|x| x.peer).collect();
        check(
            format!("{target} from pod-a0: replies come from the cluster IP"),
            peers == BTreeSet::from([Some(target)]),
            format!("{peers:?}"),
        );

        // ICMP errors about translated packets are translated too: a pod's port
        // unreachable reaches the client's socket as a refusal (its quoted
        // packet names the service address), from outside and from a pod.
        for (from, target) in [
            (Host::Ext, SocketAddr::new(node, 30094)),
            (
                Host::Pod(0, 0),
                SocketAddr::new(plan::cluster_ip(14, f), 90),
            ),
        ] {
            let a = probe(from, Proto::Udp, target, 4);
            check(
                format!("UDP {target} from {from:?}: the endpoints' port unreachable is a refusal"),
                a.iter().all(Attempt::is_refused),
                format!("{:?}", a.iter().map(|x| &x.result).collect::<Vec<_>>()),
            );
        }
        // A client whose own port is a NodePort's: the masquerade keeps it, so
        // the endpoint's replies come to the node on that NodePort, and are
        // replies all the same.
        let target = SocketAddr::new(node, 30090);
        let spec = ProbeSpec::new(Proto::Udp, target)
            .count(3)
            .timeout(Duration::from_millis(1500))
            .source_port(30090);
        let a = cluster.probe_spec(Host::Ext, &spec);
        let peers: BTreeSet<Option<SocketAddr>> = a.iter().map(|x| x.peer).collect();
        check(
            format!("UDP {target} from client port 30090 (masqueraded) is answered"),
            a.iter().all(|x| x.backend().is_some()) && peers == BTreeSet::from([Some(target)]),
            format!(
                "{:?} {peers:?}",
                a.iter().map(|x| &x.result).collect::<Vec<_>>()
            ),
        );

        // A path MTU learnt through the masquerade: svcproxy's own through XDP
        // (a segment too long for the XDP program takes the stack's way, and
        // the egress program gives it the connection's source), the kernel's
        // through tc.
        let target = SocketAddr::new(node, 30087);
        let got = upload_through_a_narrow_link(&cluster, f, target);
        check(
            format!("TCP {target}: 64 KiB from outside through a link of MTU 1280"),
            got.as_ref()
                .is_ok_and(|peer| (peer.port() >= 61000) == (xdp == XdpMode::Native)),
            format!("{got:?}"),
        );
        let cached = cluster.exec_ok(Host::Ext, &["ip", "route", "get", &node.to_string()]);
        check(
            format!("the client learnt the path MTU to {node} from the translated error"),
            cached.contains("mtu 1280"),
            cached,
        );

        // A client whose own port is in svcproxy's masquerade's range: the
        // kernel's masquerade (through tc) gives it another port below the
        // range (the fixed rule's `to :1024-60999`), svcproxy's (through XDP) one
        // of its own.
        let spec = ProbeSpec::new(Proto::Udp, SocketAddr::new(node, 30090))
            .count(3)
            .timeout(Duration::from_millis(1500))
            .source_port(62000);
        let a = cluster.probe_spec(Host::Ext, &spec);
        let ports: Vec<Option<u16>> = a
            .iter()
            .map(|x| x.client_seen().map(|c| c.port()))
            .collect();
        check(
            "UDP from client port 62000: masqueraded to a port of the right range".to_string(),
            ports
                .iter()
                .all(|p| p.is_some_and(|p| (p >= 61000) == (xdp == XdpMode::Native))),
            format!("{ports:?}"),
        );

        // Asked again (up to three times, a new client port each) before it
        // counts as failed: once in CI, in both tests at once, the answer did
        // not reach the socket (not seen since in dozens of runs); the error
        // says where it went.
        let mut got = reply_to_a_node_socket_on_a_node_port(&cluster, f);
        for _ in 0..2 {
            if got.is_ok() {
                break;
            }
            eprintln!("[ebpf_packet] a reply to the node's socket, again after: {got:?}");
            got = reply_to_a_node_socket_on_a_node_port(&cluster, f);
        }
        check(
            "a reply to a node's own UDP socket on a NodePort's port reaches it".to_string(),
            got.is_ok(),
            format!("{got:?}"),
        );

        // And the other way: the client's port unreachable about a reply reaches
        // the endpoint's socket, masqueraded (the other node's endpoint) or not.
        // Masqueraded through XDP: by svcproxy (the endpoint knows the client
        // by a port above ip_local_port_range).
        for (backend, port) in [(Host::Pod(1, 0), 30095), (Host::Pod(0, 0), 30096)] {
            let target = SocketAddr::new(node, port);
            // The client's kernel rate-limits its ICMP errors per destination
            // (`net.ipv6.icmp.ratelimit`, `net.ipv4.icmp_ratelimit`), and this one
            // has sent several to the node: an error it held back is asked for
            // again, a second later, up to three times.
            let mut got = error_about_a_reply(&cluster, backend, f, target);
            for _ in 0..2 {
                if got.is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_secs(1));
                got = error_about_a_reply(&cluster, backend, f, target);
            }
            let masqueraded_here = backend == Host::Pod(1, 0) && xdp == XdpMode::Native;
            check(
                format!("UDP {target}: the client's port unreachable reaches {backend:?}'s socket"),
                got.as_ref()
                    .is_ok_and(|from| (from.port() >= 61000) == masqueraded_here),
                format!("{got:?}"),
            );
        }
    }

    if xdp == XdpMode::Native {
        let eth0 = cluster
            .exec_ok(Host::Node(0), &["cat", "/sys/class/net/eth0/ifindex"])
            .trim()
            .to_string();
        let p0 = cluster
            .exec_ok(Host::Node(0), &["cat", "/sys/class/net/p0/ifindex"])
            .trim()
            .to_string();
        check(
            "the XDP program's link is pinned for node-a's eth0, and for no pod's veth \
             (--ebpf-xdp-interfaces eth0)"
                .to_string(),
            conf.pin_dir().join(format!("xdp-{eth0}")).exists()
                && !conf.pin_dir().join(format!("xdp-{p0}")).exists(),
            String::new(),
        );
        let counts = svcproxy_dataplane::ebpf::kernel::xdp_packets(&conf.pin_dir());
        check(
            "the XDP program forwarded the Local policy's packets and made the drops".to_string(),
            counts.is_some_and(|[forwarded, dropped, _]| forwarded > 0 && dropped > 0),
            format!("{counts:?}"),
        );
        let ports = svcproxy_dataplane::ebpf::kernel::masquerade_ports(&conf.pin_dir());
        check(
            "the masquerade's counters: ports taken, none exhausted".to_string(),
            ports.is_some_and(|[taken, exhausted]| taken >= 60 && exhausted == 0),
            format!("{ports:?}"),
        );
    }

    let intent = build_intent(&snap.v4, &snap.v6, &plan_config());
    let cmp = in_netns(&node_a, || driver.plane_mut().compare(&intent))
        .expect("netns")
        .expect("compare");
    check(
        "explain --live finds the maps as planned".to_string(),
        cmp.differences.is_empty(),
        cmp.differences.join("\n"),
    );

    // From another process (`svcproxy explain --live` beside the daemon): the
    // pinned maps compared by content.
    let cmp = in_netns(&node_a, || {
        EbpfDataPlane::new(options.clone()).compare(&intent)
    })
    .expect("netns")
    .expect("compare from a fresh plane");
    check(
        "explain --live from another process finds the maps as planned".to_string(),
        cmp.differences.is_empty(),
        cmp.differences.join("\n"),
    );

    // An interface that appears (a new pod's veth) gets the packet programs at the
    // next drift check.
    cluster.exec_ok(
        Host::Node(0),
        &[
            "ip", "link", "add", "late0", "type", "veth", "peer", "name", "late1",
        ],
    );
    let index = cluster
        .exec_ok(Host::Node(0), &["cat", "/sys/class/net/late0/ifindex"])
        .trim()
        .to_string();
    let drift = in_netns(&node_a, || driver.plane_mut().drift())
        .expect("netns")
        .expect("drift check");
    check(
        "a new interface is no drift".to_string(),
        drift.is_none(),
        format!("{drift:?}"),
    );
    let dump = svcproxy_dataplane::ebpf::kernel::dump(&conf.pin_dir()).expect("dump");
    check(
        format!("the drift check attaches the programs to the new interface {index}"),
        dump.lines()
            .any(|l| l == format!("interface {index} other"))
            && conf.pin_dir().join(format!("tc-{index}-ingress")).exists()
            && conf.pin_dir().join(format!("tc-{index}-egress")).exists(),
        dump,
    );

    // The fixed rules deleted by hand: the drift check says so, and the next
    // (full) sync writes them again.
    cluster
        .nft(Host::Node(0), "delete table inet svcproxy-ebpf\n")
        .expect("delete the fixed rules");
    let drift = in_netns(&node_a, || driver.plane_mut().drift())
        .expect("netns")
        .expect("drift check");
    check(
        "the drift check notices the fixed rules gone".to_string(),
        drift
            .as_deref()
            .is_some_and(|d| d.contains("svcproxy-ebpf was deleted")),
        format!("{drift:?}"),
    );
    in_netns(&node_a, || driver.sync(&snap, true))
        .expect("netns")
        .expect("repair sync");
    let tables = cluster.exec_ok(Host::Node(0), &["nft", "list", "tables"]);
    check(
        "the repair writes the fixed rules again".to_string(),
        tables.contains("svcproxy-ebpf"),
        tables,
    );

    if xdp == XdpMode::Native {
        // A restart: the next process's program takes the pinned link's place
        // (the link updated, never detached), and goes on forwarding.
        let eth0 = cluster
            .exec_ok(Host::Node(0), &["cat", "/sys/class/net/eth0/ifindex"])
            .trim()
            .to_string();
        let counts = svcproxy_dataplane::ebpf::kernel::xdp_packets(&conf.pin_dir());
        let xdp_prog = || {
            let link = cluster.exec_ok(Host::Node(0), &["ip", "-d", "link", "show", "dev", "eth0"]);
            link.split_once("prog/xdp id ")
                .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string))
        };
        let before = xdp_prog();
        let mut next =
            Driver::without_conntrack(plan_config(), EbpfDataPlane::new(options.clone()));
        let synced = in_netns(&node_a, || next.sync(&snap, true)).expect("netns");
        let now = xdp_prog();
        check(
            "a second process's XDP program takes the pinned link's place".to_string(),
            synced.is_ok()
                && conf.pin_dir().join(format!("xdp-{eth0}")).exists()
                && before.is_some()
                && now.is_some()
                && now != before,
            format!("{:?} program {before:?} then {now:?}", synced.err()),
        );
        let target = SocketAddr::new(plan::node_ip(0, Family::V4), 30081);
        let a = probe(Host::Ext, Proto::Tcp, target, 5);
        let after = svcproxy_dataplane::ebpf::kernel::xdp_packets(&conf.pin_dir());
        check(
            "after the takeover the XDP program forwards the Local policy's connections"
                .to_string(),
            seen(&a) == set(&["pod-a0"]) && after.zip(counts).is_some_and(|(a, b)| a[0] > b[0]),
            format!("{:?} {after:?}", seen(&a)),
        );
    }

    in_netns(&node_a, || driver.plane_mut().cleanup())
        .expect("netns")
        .expect("cleanup");
    let tables = cluster.exec_ok(Host::Node(0), &["nft", "list", "tables"]);
    check(
        "cleanup removes the companion rules".to_string(),
        !tables.contains("svcproxy-ebpf"),
        tables,
    );
    check(
        "cleanup removes the pins".to_string(),
        !conf.pin_dir().exists(),
        format!("{:?}", std::fs::read_dir(conf.pin_dir()).map(|d| d.count())),
    );
    let target = SocketAddr::new(plan::node_ip(0, Family::V4), 30080);
    let a = probe(Host::Ext, Proto::Tcp, target, 2);
    check(
        "after cleanup nothing answers the NodePort".to_string(),
        a.iter().all(|x| x.backend().is_none()),
        format!("{:?}", seen(&a)),
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
