//! The operator-facing servers of a real svcproxy daemon, over real HTTP between network
//! namespaces: healthCheckNodePort servers as a cloud load balancer sees them (from
//! outside the cluster, through the node's nftables), /healthz and /livez on
//! 10256, /metrics on 127.0.0.1:10249, an address already in use, and SIGTERM closing
//! the servers while the rules stay.
//!
//! HTTP requests are made with bash's /dev/tcp inside the client's namespace (no extra
//! tools), one `Connection: close` request each.

// Shared with the other end-to-end test binaries; each uses only part of it.
#[allow(dead_code)]
#[path = "dataplane/support.rs"]
mod support;

use std::net::IpAddr;
use std::thread;
use std::time::{Duration, Instant};

use support::*;
use svcproxy_e2e::plan::{self, Family};
use svcproxy_e2e::{Host, ProbeSpec, Proto, NODE_A, NODE_B};

// Every test below, once per data plane (`<mode>::<test>`).
per_mode!(
    health_check_node_ports_follow_local_endpoints_for_a_load_balancer,
    nodeport_addresses_follow_the_hosts_addresses,
    a_service_cidr_holding_the_nodes_addresses_does_not_cut_them_off,
    rules_taken_away_by_hand_are_put_back_and_healthz_says_so_meanwhile,
    runs_with_only_the_daemonsets_privileges,
    healthz_livez_metrics_address_in_use_and_sigterm,
);

const A0: Host = Host::Pod(NODE_A, 0);
const B0: Host = Host::Pod(NODE_B, 0);
const HC_PORT: u16 = 32100;

/// Polls until `ok` accepts an answer (or none), bounded.
fn get_until(
    env: &Env,
    from: Host,
    ip: IpAddr,
    port: u16,
    path: &str,
    ok: impl Fn(&Option<Answer>) -> bool,
) -> (Option<Answer>, Option<Duration>) {
    let start = Instant::now();
    loop {
        let a = get(env, from, ip, port, path);
        if ok(&a) {
            return (a, Some(start.elapsed()));
        }
        if start.elapsed() > Duration::from_secs(10) {
            return (a, None);
        }
        thread::sleep(Duration::from_millis(100));
    }
}

fn lb_local() -> Svc {
    Svc::dual("lb", 120)
        .port(SvcPort::new("http", Proto::Tcp, 80, BACKEND_PORT).node_port(30120))
        .load_balancer()
        .etp_local(HC_PORT)
}

fn lb_file(svc: &Svc, pods: &[Host]) -> String {
    let slices: Vec<Slice> = svc
        .cluster_ips
        .iter()
        .map(|ip| Slice::of(svc, Family::of(*ip), pods))
        .collect();
    svc_file(svc, &slices)
}

fn local_endpoints(a: &Answer) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(&a.body).ok()?;
    v["localEndpoints"].as_u64()
}

fn health_check_node_ports_follow_local_endpoints_for_a_load_balancer(mode: Mode) {
    let lb = lb_local();
    let Some(env) = Env::start(
        mode,
        EnvSpec::default(),
        &[("svc-lb.yaml", lb_file(&lb, &[A0]))],
    ) else {
        return;
    };
    let mut ck = Checks::new("health-check-node-ports");
    let node_ip = |n, f| plan::node_ip(n, f);

    // node-a has the only endpoint: 200 there, 503 on node-b; both families.
    for f in Family::BOTH {
        let (a, _) = get_until(&env, Host::Ext, node_ip(NODE_A, f), HC_PORT, "/", |a| {
            a.as_ref().is_some_and(|a| a.code == 200)
        });
        match &a {
            Some(a) => {
                ck.check(a.code == 200, || format!("{f:?} node-a: {a:?}"));
                ck.check(
                    a.header("x-load-balancing-endpoint-weight") == Some("1"),
                    || format!("{f:?} node-a weight header: {a:?}"),
                );
                ck.check(a.header("content-type") == Some("application/json"), || {
                    format!("{f:?} content type: {a:?}")
                });
                let v: serde_json::Value =
                    serde_json::from_str(&a.body).unwrap_or(serde_json::Value::Null);
                ck.check(
                    v["service"]["namespace"] == NS
                        && v["service"]["name"] == "lb"
                        && v["localEndpoints"] == 1
                        && v["serviceProxyHealthy"] == true,
                    || format!("{f:?} node-a body: {}", a.body),
                );
            }
            None => {
                ck.check(false, || format!("{f:?} node-a:{HC_PORT} did not answer"));
            }
        }
        let b = get(&env, Host::Ext, node_ip(NODE_B, f), HC_PORT, "/");
        ck.check(
            b.as_ref()
                .is_some_and(|b| b.code == 503 && local_endpoints(b) == Some(0)),
            || format!("{f:?} node-b: {b:?}"),
        );
    }

    // The endpoint moves to node-b: node-a 200 → 503, node-b 503 → 200.
    env.write("svc-lb.yaml", &lb_file(&lb, &[B0]));
    for f in Family::BOTH {
        let (a, took) = get_until(&env, Host::Ext, node_ip(NODE_A, f), HC_PORT, "/", |a| {
            a.as_ref().is_some_and(|a| a.code == 503)
        });
        ck.check(took.is_some(), || {
            format!("{f:?} node-a did not turn 503: {a:?}")
        });
        let (b, took) = get_until(&env, Host::Ext, node_ip(NODE_B, f), HC_PORT, "/", |a| {
            a.as_ref().is_some_and(|a| a.code == 200)
        });
        ck.check(took.is_some(), || {
            format!("{f:?} node-b did not turn 200: {b:?}")
        });
    }

    // The service goes away: the servers close.
    env.remove("svc-lb.yaml");
    let (a, took) = get_until(
        &env,
        Host::Ext,
        node_ip(NODE_B, Family::V4),
        HC_PORT,
        "/",
        Option::is_none,
    );
    ck.check(took.is_some(), || {
        format!("node-b still answers on {HC_PORT} after the service was deleted: {a:?}")
    });
    ck.finish(&env);
}

/// An address node-a gains while svcproxy runs, inside the `--nodeport-addresses`
/// CIDRs of [`nodeport_addresses_follow_the_hosts_addresses`] (its primary IP is not).
fn extra_address(f: Family) -> IpAddr {
    match f {
        Family::V4 => IpAddr::from([198, 18, 0, 11]),
        Family::V6 => "2001:db8::b".parse().unwrap(),
    }
}

/// Whether `text` mentions `ip` as a whole address (not inside a longer one).
fn mentions(text: &str, ip: IpAddr) -> bool {
    let want = ip.to_string();
    text.split(|c: char| !(c.is_ascii_hexdigit() || c == '.' || c == ':'))
        .any(|tok| tok == want)
}

/// `--nodeport-addresses` CIDRs select among the host's addresses as they are now:
/// node-a's LAN interface gains an address inside them while svcproxy runs, and its
/// NodePort and healthCheckNodePort answer there without a restart; the address goes
/// away and so do the rules naming it.
fn nodeport_addresses_follow_the_hosts_addresses(mode: Mode) {
    let lb = lb_local();
    let flags = vec!["--nodeport-addresses=198.18.0.8/29,2001:db8::8/125".to_string()];
    let Some(env) = Env::start(
        mode,
        EnvSpec {
            flags,
            ..EnvSpec::default()
        },
        &[("svc-lb.yaml", lb_file(&lb, &[A0]))],
    ) else {
        return;
    };
    let mut ck = Checks::new("nodeport-addresses-follow");
    let node_port = lb.ports[0].node_port.expect("a NodePort");
    let lan_dev = |f: Family| {
        let ip = plan::node_ip(NODE_A, f);
        let out = env.c.exec_ok(
            Host::Node(NODE_A),
            &["ip", "-o", "addr", "show", "to", &ip.to_string()],
        );
        out.split_whitespace()
            .nth(1)
            .unwrap_or_else(|| panic!("no interface holds {ip}: {out:?}"))
            .to_string()
    };
    let prefix = |f: Family| match f {
        Family::V4 => plan::NODE_LAN_PREFIX_V4,
        Family::V6 => plan::NODE_LAN_PREFIX_V6,
    };

    // The primary IP is outside the CIDRs: neither the NodePort nor the health check
    // answers there.
    for f in Family::BOTH {
        let primary = sa(plan::node_ip(NODE_A, f), node_port);
        let got = env.probe(Host::Ext, Proto::Tcp, primary, 1, ANSWER);
        ck.not_answered(&format!("{f:?} primary IP NodePort before"), &got);
        let hc = get(&env, Host::Ext, plan::node_ip(NODE_A, f), HC_PORT, "/");
        ck.check(hc.is_none(), || {
            format!("{f:?} primary IP health check answered: {hc:?}")
        });
    }

    // node-a gains an address inside the CIDRs (no DAD wait for IPv6).
    for f in Family::BOTH {
        let addr = format!("{}/{}", extra_address(f), prefix(f));
        env.c.exec_ok(
            Host::Node(NODE_A),
            &["ip", "addr", "add", &addr, "dev", &lan_dev(f), "nodad"],
        );
    }
    for f in Family::BOTH {
        let target = sa(extra_address(f), node_port);
        let (got, took) = env.probe_until(
            Host::Ext,
            &ProbeSpec::new(Proto::Tcp, target),
            Duration::from_secs(10),
            |a| a.iter().all(|a| a.backend() == Some("pod-a0")),
        );
        ck.check(took.is_some(), || {
            format!("{f:?} NodePort on the new address {target} never answered: {got:?}")
        });
        let (hc, took) = get_until(&env, Host::Ext, extra_address(f), HC_PORT, "/", |a| {
            a.as_ref().is_some_and(|a| a.code == 200)
        });
        ck.check(took.is_some(), || {
            format!("{f:?} health check on the new address never answered 200: {hc:?}")
        });
        // Still nothing on the primary IP.
        let primary = sa(plan::node_ip(NODE_A, f), node_port);
        let got = env.probe(Host::Ext, Proto::Tcp, primary, 1, ANSWER);
        ck.not_answered(&format!("{f:?} primary IP NodePort after"), &got);
    }

    // The addresses go away: so do the rules that name them.
    for f in Family::BOTH {
        let addr = format!("{}/{}", extra_address(f), prefix(f));
        env.c.exec_ok(
            Host::Node(NODE_A),
            &["ip", "addr", "del", &addr, "dev", &lan_dev(f)],
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut rules = env.ruleset(NODE_A);
    while Family::BOTH
        .iter()
        .any(|f| mentions(&rules, extra_address(*f)))
        && Instant::now() < deadline
    {
        thread::sleep(Duration::from_millis(100));
        rules = env.ruleset(NODE_A);
    }
    for f in Family::BOTH {
        ck.check(!mentions(&rules, extra_address(f)), || {
            format!(
                "{f:?} rules still name the removed {}:\n{rules}",
                extra_address(f)
            )
        });
    }
    ck.finish(&env);
}

/// A ServiceCIDR that holds the nodes' own LAN (a typo away from the real one) must
/// not make svcproxy drop traffic to the nodes' addresses as "unallocated service
/// addresses": the range is refused with an error and the nodes stay reachable.
fn a_service_cidr_holding_the_nodes_addresses_does_not_cut_them_off(mode: Mode) {
    let bad = format!(
        "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {{name: typo}}\n\
         spec:\n  cidrs: [\"{}\", \"{}\"]\n",
        plan::NODE_LAN_V4,
        plan::NODE_LAN_V6
    );
    let lb = lb_local();
    let Some(env) = Env::start(
        mode,
        EnvSpec::default(),
        &[
            ("00-servicecidr-typo.yaml", bad),
            ("svc-lb.yaml", lb_file(&lb, &[A0])),
        ],
    ) else {
        return;
    };
    let mut ck = Checks::new("service-cidr-holding-node-addresses");
    for f in Family::BOTH {
        let ip = plan::node_ip(NODE_A, f);
        // From outside, and from node-b (both inside the bad range too).
        for from in [Host::Ext, Host::Node(NODE_B)] {
            let (a, _) = get_until(&env, from, ip, 10256, "/healthz", |a| {
                a.as_ref().is_some_and(|a| a.code == 200)
            });
            ck.check(a.as_ref().is_some_and(|a| a.code == 200), || {
                format!("{f:?} {from:?} -> node-a {ip}:10256/healthz: {a:?}")
            });
        }
    }
    // The service's own cluster IPs still work.
    for f in Family::BOTH {
        let vip = sa(lb.cluster_ip(f), 80);
        let got = env.probe(Host::Pod(NODE_B, 0), Proto::Tcp, vip, 1, ANSWER);
        ck.answered_by(&format!("{f:?} pod-b0 -> cluster IP"), &got, &["pod-a0"]);
    }
    let logs = env.proxies[NODE_A].logs();
    ck.check(
        logs.contains("a ServiceCIDR holds an address of this node"),
        || "no error logged for the refused ServiceCIDR".to_string(),
    );
    ck.finish(&env);
}

/// The value of the counter `name` on node-a's /metrics (0 when absent).
fn counter(env: &Env, name: &str) -> f64 {
    let loopback: IpAddr = "127.0.0.1".parse().unwrap();
    let text = get(env, Host::Node(NODE_A), loopback, 10249, "/metrics")
        .map(|a| a.body)
        .unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Polls node-a's /healthz (from node-a) until it answers `code`, for up to `bound`;
/// how long that took.
fn healthz_until(env: &Env, code: u16, bound: Duration) -> Option<Duration> {
    let ip = plan::node_ip(NODE_A, Family::V4);
    let start = Instant::now();
    while start.elapsed() < bound {
        if get(env, Host::Node(NODE_A), ip, 10256, "/healthz").is_some_and(|a| a.code == code) {
            return Some(start.elapsed());
        }
        thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Issue 15's fault test: the rules deleted, made dormant or flushed by hand (as a
/// firewall reload does) are noticed by the periodic drift check (every 5 s), /healthz
/// answers 503 from then until a full sync has put them back, and connections work
/// again. `--min-sync-period 20s` holds that sync back long enough to see the 503.
fn rules_taken_away_by_hand_are_put_back_and_healthz_says_so_meanwhile(mode: Mode) {
    let web = Svc::dual("web", 130).port(SvcPort::new("http", Proto::Tcp, 80, BACKEND_PORT));
    let Some(env) = Env::start(
        mode,
        EnvSpec {
            flags: vec!["--min-sync-period".into(), "20s".into()],
            ..EnvSpec::default()
        },
        &[("svc-web.yaml", lb_file(&web, &[A0]))],
    ) else {
        return;
    };
    let mut ck = Checks::new("drift-repaired");
    let client = Host::Pod(NODE_A, 1);
    let reaches = |f: Family| {
        let vip = sa(web.cluster_ip(f), 80);
        env.probe(client, Proto::Tcp, vip, 1, ANSWER)
    };
    for how in mode.breakages() {
        for f in Family::BOTH {
            ck.answered_by(&format!("{how}: {f:?} before"), &reaches(f), &["pod-a0"]);
        }
        let drifts = counter(&env, "svcproxy_kernel_drift_total");
        let said = mode.break_rules(&env.c, NODE_A, how);
        let broken = reaches(Family::V4);
        ck.check(!broken.iter().any(|a| a.backend().is_some()), || {
            format!("{how}: the cluster IP still answered with the rules gone: {broken:?}")
        });
        let unhealthy = healthz_until(&env, 503, Duration::from_secs(10));
        ck.check(unhealthy.is_some(), || {
            format!("{how}: /healthz never said 503 within 10 s of the drift")
        });
        let repaired = healthz_until(&env, 200, Duration::from_secs(30));
        ck.check(repaired.is_some(), || {
            format!("{how}: /healthz did not say 200 again within 30 s")
        });
        eprintln!("[operations] {how}: 503 after {unhealthy:?}, 200 again after {repaired:?}");
        for f in Family::BOTH {
            let got = reaches(f);
            ck.answered_by(&format!("{how}: {f:?} after the repair"), &got, &["pod-a0"]);
        }
        let after = counter(&env, "svcproxy_kernel_drift_total");
        ck.check(after > drifts, || {
            format!("{how}: svcproxy_kernel_drift_total stayed at {after}")
        });
        let logs = env.proxies[NODE_A].logs();
        ck.check(logs.contains(said), || {
            format!("{how}: the log does not say {said:?}")
        });
    }
    ck.finish(&env);
}

/// How the DaemonSet's container runs, emulated around one process (the argv that
/// follows): a private mount namespace whose root filesystem is read-only (and so
/// `/run` and `/tmp`, which are part of it in a container) and whose `/proc/sys` is
/// read-only (as a runtime mounts it for an unprivileged container), with
/// `/run/xtables.lock` bind-mounted writable (the hostPath deploy/README.md asks for
/// in iptables mode); then uid 0 with every capability dropped but `$CAPS` (`NET_ADMIN`
/// and `NET_RAW`, and `BPF` in ebpf mode: [`Mode::capabilities`]) (bounding,
/// inheritable and ambient sets), and no_new_privs
/// (`allowPrivilegeEscalation: false`). The OOM score adjustment is -997, as the
/// kubelet sets it for a `system-node-critical` pod, where the machine lets the test
/// lower it (it needs CAP_SYS_RESOURCE), and `--oom-score-adj` is the value the
/// process has, as deploy/base/configmap.yaml's -997 is in a real pod. A write to the root
/// filesystem is checked to fail first. Not emulated: seccomp's RuntimeDefault profile (svcproxy makes no
/// syscall outside it: no namespace, mount, module or BPF calls).
const CONTAINER: &str = r#"set -e
echo -997 > /proc/self/oom_score_adj 2>/dev/null || true
touch /run/xtables.lock
mount --bind /run/xtables.lock /run/xtables.lock
mount -o remount,bind,ro /
for m in /run /tmp; do
  if mountpoint -q "$m"; then mount -o remount,bind,ro "$m"; fi
done
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
if touch /.svcproxy-rw-probe 2>/dev/null; then echo "root filesystem" "still writable" >&2; exit 97; fi
exec setpriv --inh-caps=-all --ambient-caps=-all --bounding-set=-all,$CAPS --no-new-privs "$@" --oom-score-adj="$(cat /proc/self/oom_score_adj)"
"#;

/// Issue 15's least-privilege proof: svcproxy as deploy/base/daemonset.yaml (with components/ebpf in the ebpf and ipvs modes) runs it (read-only
/// root filesystem, read-only /proc/sys, only NET_ADMIN and NET_RAW, no privilege
/// escalation, the ConfigMap's conntrack settings that leave the node's alone) programs
/// the node, serves real connections and /healthz, and its drift checks work. NET_RAW is
/// what the legacy iptables tools need (their raw socket to x_tables); nftables and
/// `iptables-nft` use netlink alone.
fn runs_with_only_the_daemonsets_privileges(mode: Mode) {
    let web = Svc::dual("web", 140).port(SvcPort::new("http", Proto::Tcp, 80, BACKEND_PORT));
    let dns = Svc::dual("dns", 141).port(SvcPort::new("dns", Proto::Udp, 53, BACKEND_PORT));
    let Some(mut env) = Env::start(
        mode,
        EnvSpec {
            start_proxies: false,
            ..EnvSpec::default()
        },
        &[
            ("svc-web.yaml", lb_file(&web, &[A0])),
            ("svc-dns.yaml", lb_file(&dns, &[A0, B0])),
        ],
    ) else {
        return;
    };
    let mut ck = Checks::new("least-privilege");
    let bin = svcproxy_e2e::svcproxy_bin();
    // The capabilities deploy/ adds for the mode (crates/svcproxy/tests/deploy.rs checks them).
    let caps = format!("CAPS={}", mode.capabilities());
    let mut argv: Vec<String> = [
        "env",
        &caps,
        "unshare",
        "--mount",
        "sh",
        "-c",
        CONTAINER,
        "container",
    ]
    .map(String::from)
    .to_vec();
    argv.extend(mode.launch(&bin));
    argv.extend(env.proxy_args(NODE_A));
    // deploy/base/configmap.yaml's settings that keep svcproxy off /proc/sys and its OOM
    // score, and what deploy/README.md says a mode needs in such a container.
    for flag in [
        "--conntrack-max-per-core=0",
        "--conntrack-min=0",
        "--conntrack-tcp-timeout-established=0s",
        "--conntrack-tcp-timeout-close-wait=0s",
    ]
    .into_iter()
    .chain(mode.unprivileged_flags().iter().copied())
    {
        argv.push(flag.into());
    }
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let proxy = env
        .c
        .spawn(
            Host::Node(NODE_A),
            &format!("svcproxy-{}", plan::node_name(NODE_A)),
            &argv,
        )
        .expect("spawn svcproxy");
    env.proxies.push(proxy);
    env.wait_synced(NODE_A);
    for f in Family::BOTH {
        let vip = sa(web.cluster_ip(f), 80);
        let got = env.probe(Host::Pod(NODE_A, 1), Proto::Tcp, vip, 1, ANSWER);
        ck.answered_by(&format!("{f:?} pod-a1 -> cluster IP"), &got, &["pod-a0"]);
    }
    connected_udp_leaves_with_its_endpoint(&env, &dns, &mut ck);
    // Past the first drift checks (every 5 s).
    thread::sleep(Duration::from_secs(6));
    let healthy = healthz_until(&env, 200, Duration::from_secs(10));
    ck.check(healthy.is_some(), || "/healthz never said 200".into());
    let proxy = &env.proxies[0];
    ck.check(proxy.is_running(), || {
        format!("svcproxy exited: {}", proxy.logs())
    });
    let logs = proxy.logs();
    for bad in [
        "root filesystem still writable",
        "sync failed",
        "cannot check that the kernel",
        "kernel lost svcproxy's rules",
        "Permission denied",
        "Operation not permitted",
        "Read-only file system",
    ] {
        ck.check(!logs.contains(bad), || {
            format!("the log says {bad:?}:\n{logs}")
        });
    }
    ck.finish(&env);
}

/// A connected UDP socket of node-a's own (a resolver's, to a cluster IP) is never
/// answered by an endpoint that left once the sync is done: the kernel modes
/// delete its conntrack entry (the same socket reaches the endpoint that stays),
/// the eBPF modes destroy the socket translated at connect() (a call fails, and
/// the client's new socket reaches the endpoint that stays). Under the
/// DaemonSet's privileges: its log must show no permission error after.
fn connected_udp_leaves_with_its_endpoint(env: &Env, dns: &Svc, ck: &mut Checks) {
    let echo = svcproxy_e2e::bins::echo_bin().expect("svcproxy-echo");
    let echo = echo.to_string_lossy();
    let target = sa(dns.cluster_ip(Family::V4), 53).to_string();
    let args = svcproxy_e2e::probe::kept_udp_probe_args(&target);
    let mut argv = vec![&*echo];
    argv.extend(args.iter().map(String::as_str));
    let client = env
        .c
        .spawn(Host::Node(NODE_A), "udp-client", &argv)
        .expect("start the UDP client");
    let lines = || -> Vec<serde_json::Value> {
        client
            .stdout()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let backend = |v: &serde_json::Value| v["reply"]["backend"].as_str().map(str::to_string);
    let wait = |what: &str, f: &dyn Fn() -> bool| -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if f() {
                return true;
            }
            thread::sleep(Duration::from_millis(20));
        }
        eprintln!("[operations] gave up waiting for {what}");
        false
    };
    wait("a first answer", &|| {
        lines().iter().any(|l| backend(l).is_some())
    });
    let Some(left) = lines().iter().find_map(backend) else {
        ck.check(false, || {
            format!("{target}: no answer at first: {}", client.logs())
        });
        return;
    };
    let stays = if left == "pod-a0" { B0 } else { A0 };
    let stays_name = env.c.name(stays).to_string();
    let proxy = &env.proxies[env.proxy_index(NODE_A)];
    let syncs =
        |p: &svcproxy_e2e::NsProcess| p.logs().matches("svcproxy_sync::driver: synced").count();
    let before = syncs(proxy);
    env.write("svc-dns.yaml", &lb_file(dns, &[stays]));
    let synced = wait("the sync of the endpoint's leaving", &|| {
        syncs(proxy) > before
    });
    let at_sync = lines().len();
    let moved = wait("an answer from the endpoint that stays", &|| {
        lines()
            .iter()
            .skip(at_sync)
            .any(|l| backend(l).as_deref() == Some(&stays_name))
    });
    let seen = lines();
    // One attempt may have been in flight when the sync was seen done.
    let late: Vec<String> = seen
        .iter()
        .skip(at_sync + 1)
        .filter_map(backend)
        .filter(|b| *b == left)
        .collect();
    ck.check(synced && moved && late.is_empty(), || {
        format!(
            "{}: a connected UDP socket to {target} on {left}, which left: answered by it {} times after the sync, reached {stays_name}: {moved}\n{}",
            env.mode.label(),
            late.len(),
            client.stdout()
        )
    });
    if matches!(env.mode, Mode::Ebpf | Mode::Ipvs) {
        let destroyed = seen.iter().any(|l| l["result"] == "error");
        ck.check(destroyed, || {
            format!(
                "{}: the socket on {left} was not destroyed (no failed call)\n{}",
                env.mode.label(),
                client.stdout()
            )
        });
    }
    client.kill();
}

/// Whether this process holds CAP_SYS_RESOURCE (bit 24 of its effective set).
fn has_cap_sys_resource() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

fn healthz_livez_metrics_address_in_use_and_sigterm(mode: Mode) {
    let lb = lb_local();
    let Some(env) = Env::start(
        mode,
        EnvSpec::default(),
        &[("svc-lb.yaml", lb_file(&lb, &[A0]))],
    ) else {
        return;
    };
    let mut ck = Checks::new("health-and-metrics");
    let a4 = plan::node_ip(NODE_A, Family::V4);
    let a6 = plan::node_ip(NODE_A, Family::V6);

    // /healthz and /livez answer on every address (0.0.0.0:10256 is dual-stack, as
    // kube-proxy's), here from outside, on both of the node's families.
    for (path, ip) in [
        ("/healthz", a4),
        ("/livez", a4),
        ("/healthz", a6),
        ("/livez", a6),
    ] {
        let (a, _) = get_until(&env, Host::Ext, ip, 10256, path, |a| {
            a.as_ref().is_some_and(|a| a.code == 200)
        });
        let body: serde_json::Value = a
            .as_ref()
            .and_then(|a| serde_json::from_str(&a.body).ok())
            .unwrap_or_default();
        ck.check(
            a.as_ref().is_some_and(|a| a.code == 200)
                && body["lastUpdated"].is_string()
                && body["currentTime"].is_string(),
            || format!("{path} on node-a {ip}: {a:?}"),
        );
    }

    // /metrics only on the node's loopback.
    let loopback: IpAddr = "127.0.0.1".parse().unwrap();
    let m = get(&env, Host::Node(NODE_A), loopback, 10249, "/metrics");
    let text = m.as_ref().map(|m| m.body.clone()).unwrap_or_default();
    for name in [
        "kubeproxy_sync_proxy_rules_duration_seconds_count",
        "kubeproxy_sync_full_proxy_rules_duration_seconds_count",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
    ] {
        ck.check(text.contains(name), || {
            format!("/metrics lacks {name}: {m:?}")
        });
    }
    // iptables mode's rule gauges, from the restores it ran.
    if mode.name() == "iptables" {
        let nat = text.lines().find_map(|l| {
            l.strip_prefix(
                "kubeproxy_sync_proxy_rules_iptables_total{ip_family=\"IPv4\",table=\"nat\"} ",
            )
        });
        ck.check(
            nat.and_then(|v| v.trim().parse::<f64>().ok())
                .is_some_and(|v| v > 0.0),
            || format!("/metrics lacks the iptables rule count: {text}"),
        );
    }
    // node-b has no local endpoint for the eTP Local service, in both families: one
    // per family, under upstream's ip_family label.
    let mb = get(&env, Host::Node(NODE_B), loopback, 10249, "/metrics");
    let text_b = mb.map(|m| m.body).unwrap_or_default();
    for family in ["IPv4", "IPv6"] {
        let want = format!(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{{ip_family=\"{family}\",traffic_policy=\"external\"}} 1"
        );
        ck.check(text_b.lines().any(|l| l == want), || {
            format!("node-b's no-local-endpoint gauge ({want}): {text_b}")
        });
    }
    ck.check(
        get(&env, Host::Ext, a4, 10249, "/metrics").is_none(),
        || "/metrics answered from outside the node".to_string(),
    );

    // The operators' endpoints kube-proxy has: the effective configuration, the
    // process's own metrics, client metrics (zero requests with --manifests, but the
    // families exist only once observed, so only the process ones are checked here).
    let z = get(&env, Host::Node(NODE_A), loopback, 10249, "/configz");
    let configz: serde_json::Value = z
        .as_ref()
        .and_then(|a| serde_json::from_str(&a.body).ok())
        .unwrap_or_default();
    ck.check(
        configz["kubeproxy.config.k8s.io"]["mode"] == mode.name()
            && configz["kubeproxy.config.k8s.io"]["hostnameOverride"]
                == plan::node_name(NODE_A).as_str()
            && configz["svcproxy"]["kubeProxyCompatibility"] == "v1.38",
        || format!("/configz: {z:?}"),
    );
    for name in [
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        ck.check(text.contains(name), || format!("/metrics lacks {name}"));
    }

    // kube-proxy's OOM score adjustment by default.
    let proxy = env
        .proxies
        .iter()
        .find(|p| p.label() == "svcproxy-node-a")
        .expect("node-a's svcproxy");
    let pid = proxy.pid().expect("pid").to_string();
    // Lowering it needs CAP_SYS_RESOURCE, which some sandboxes drop even for root:
    // there the failure must be logged instead.
    let oom = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap_or_default();
    let logged = env
        .proxy_logs()
        .contains("cannot set the OOM score adjustment");
    ck.check(
        oom.trim() == "-999" || (!has_cap_sys_resource() && logged),
        || format!("svcproxy's oom_score_adj is {oom:?}, not kube-proxy's -999 (logged: {logged})"),
    );

    // SIGTERM: the servers close, the rules stay.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.exit_status().is_none() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    let status = proxy.exit_status();
    ck.check(status.is_some_and(|s| s.success()), || {
        format!("svcproxy after SIGTERM: {status:?}")
    });
    ck.check(
        get(&env, Host::Ext, a4, 10256, "/healthz").is_none(),
        || "/healthz still answers after SIGTERM".to_string(),
    );
    ck.check(env.programmed(NODE_A), || {
        "SIGTERM removed the rules".to_string()
    });
    // A port held by another program (kube-proxy, say) and not shared: with
    // --bind-address-hard-fail a clear error and exit, not a panic. (Another svcproxy
    // shares /healthz and waits as a standby instead: the dataplane hand-over test.)
    let echo = svcproxy_e2e::bins::echo_bin().expect("svcproxy-echo");
    let squatter = env
        .c
        .spawn(
            Host::Node(NODE_A),
            "port-10256",
            &[
                echo.to_str().unwrap(),
                "serve",
                "--name",
                "squatter",
                "--tcp",
                "10256",
            ],
        )
        .expect("a listener on 10256");
    let listening = {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let open = env
                .c
                .exec(
                    Host::Node(NODE_A),
                    &[
                        "timeout",
                        "2",
                        "bash",
                        "-c",
                        "exec 3<>/dev/tcp/127.0.0.1/10256",
                    ],
                )
                .status
                .success();
            if open || Instant::now() >= deadline {
                break open;
            }
            thread::sleep(Duration::from_millis(50));
        }
    };
    ck.check(listening, || {
        "the squatter does not listen on 10256".to_string()
    });
    let mut args = env.proxy_args(NODE_A);
    args.push("--bind-address-hard-fail".into());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.run_svcproxy(NODE_A, &argv);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ck.check(
        !out.status.success()
            && stderr.contains("10256")
            && stderr.contains("healthz-bind-address")
            && !stderr.contains("panicked"),
        || {
            format!(
                "svcproxy beside a holder of 10256, hard fail: {}\n{stderr}",
                out.status
            )
        },
    );
    // Without it (kube-proxy's default) the failure is logged and the bind retried
    // while the proxy works: here one sync (--once, the same rules), then exit 0.
    let mut args = env.proxy_args(NODE_A);
    args.push("--once".into());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.run_svcproxy(NODE_A, &argv);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ck.check(
        out.status.success() && stderr.contains("10256") && stderr.contains("retrying every 5s"),
        || {
            format!(
                "svcproxy beside a holder of 10256, soft fail: {}\n{stderr}",
                out.status
            )
        },
    );
    squatter.kill();
    ck.finish(&env);
}
