//! Faults of the eBPF mode (issue 38): a node that cannot run it is refused at
//! start with what is missing named; a missing bpffs at its home is mounted, and a
//! bpffs named itself holds svcproxy's own directory; after
//! a SIGKILL the data path stays, and `svcproxy cleanup` removes every pin and the
//! fixed rules, while a cleanup or an svcproxy run from another network
//! namespace leaves them alone; full maps leave out what does not fit, say so in the log and the
//! metrics, and everything else is served; the masquerade's ports follow the namespace's
//! `ip_local_port_range`, and a later overlap is said.
//!
//! Safety: svcproxy runs only inside network namespaces the test creates (its
//! packet programs attach to their interfaces), its socket programs attach to a
//! cgroup of the test's, its pins live in a bpffs the test mounts, or in one it
//! mounts itself inside `ip netns exec`'s own mount namespace (gone when it exits).
//! Without root, BPF or the tools it prints SKIP (fails under CI).

use std::path::Path;
use std::time::{Duration, Instant};

use svcproxy_core::state::ClusterState;
use svcproxy_dataplane::ebpf::MapSizes;
use svcproxy_dataplane::{DataPlane, EbpfDataPlane};
use svcproxy_e2e::probe::ProbeLine;
use svcproxy_e2e::{
    ebpf_options, ebpf_runs_here, echo_bin, svcproxy_bin, Attempt, Confinement, NsProcess,
};
use svcproxy_plan::{LocalDetection, PlanConfig};
use svcproxy_sync::Driver;
use svcproxy_testkit::netns::{self, in_netns, Netns};

const MANIFESTS: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {kubernetes.io/hostname: node-a}
spec:
  podCIDRs: ["198.18.1.0/24"]
status:
  addresses:
  - {type: InternalIP, address: 198.18.0.1}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  clusterIP: 198.19.0.10
  ports:
  - {name: http, port: 80, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: demo
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
- {name: http, port: 8080}
endpoints:
- {addresses: [198.18.1.10], nodeName: node-a}
"#;

/// The test's world: a namespace with an interface, a manifests directory, a
/// cgroup and a bpffs.
struct World {
    ns: Netns,
    conf: Confinement,
    manifests: tempfile::TempDir,
    logs: tempfile::TempDir,
}

impl World {
    fn new(test: &str) -> Option<World> {
        let ns = Netns::create(test, "ebpf-faults", &["nft", "mount", "umount"])?;
        let conf = match Confinement::new() {
            Ok(c) => c,
            Err(e) => {
                netns::skip(test, &format!("cannot confine BPF programs: {e}"));
                return None;
            }
        };
        netns::ip_batch(
            &ns.name,
            &[
                "link set lo up".into(),
                "link add node0 type veth peer name node1".into(),
                "link set node0 up".into(),
                "link set node1 up".into(),
                "addr add 198.18.0.1/24 dev node0".into(),
            ],
        )
        .expect("links");
        let manifests = tempfile::tempdir().expect("manifests");
        std::fs::write(manifests.path().join("web.yaml"), MANIFESTS).expect("write manifests");
        Some(World {
            ns,
            conf,
            manifests,
            logs: tempfile::tempdir().expect("logs"),
        })
    }

    /// svcproxy's arguments in ebpf mode with `cgroup` and `pin_dir`.
    fn args(&self, cgroup: &Path, pin_dir: &Path) -> Vec<String> {
        let bin = svcproxy_bin().to_string_lossy().into_owned();
        [
            bin.as_str(),
            "--proxy-mode",
            "ebpf",
            "--manifests",
            &self.manifests.path().to_string_lossy(),
            "--hostname-override",
            "node-a",
            "--ebpf-cgroup",
            &cgroup.to_string_lossy(),
            "--ebpf-bpffs",
            &pin_dir.to_string_lossy(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// svcproxy started in the namespace with `extra` arguments, once it has
    /// written its maps; None (said as SKIP) when this machine cannot run the
    /// mode.
    fn start(&self, test: &str, extra: &[&str]) -> Option<NsProcess> {
        let pins = self.conf.pin_dir();
        let mut args = self.args(self.conf.cgroup(), &pins);
        args.extend(extra.iter().map(|a| a.to_string()));
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let proxy =
            NsProcess::spawn(&self.ns.name, &argv, "svcproxy", self.logs.path()).expect("spawn");
        let start = Instant::now();
        while generation(&pins) == 0
            && proxy.is_running()
            && start.elapsed() < Duration::from_secs(30)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        if generation(&pins) == 0 {
            let logs = proxy.logs();
            if logs.contains("cannot run on this node") {
                netns::skip(
                    test,
                    &format!("this machine cannot run the ebpf mode: {logs}"),
                );
                return None;
            }
            panic!("svcproxy never wrote its maps:\n{logs}");
        }
        Some(proxy)
    }

    /// `svcproxy cleanup` of the test's pins in the namespace: what failed.
    fn cleanup(&self) -> Option<String> {
        let pins = self.conf.pin_dir().to_string_lossy().into_owned();
        let bin = svcproxy_bin().to_string_lossy().into_owned();
        let out = self.run(&[bin, "cleanup".into(), "--ebpf-bpffs".into(), pins]);
        (!out.status.success()).then(|| {
            format!(
                "cleanup: {} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// Runs svcproxy to its end in the namespace.
    fn run(&self, args: &[String]) -> std::process::Output {
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        netns::run(&mut self.ns.command(&argv), None, Duration::from_secs(60))
            .expect("svcproxy ran")
    }
}

fn generation(pins: &Path) -> u64 {
    svcproxy_dataplane::ebpf::kernel::dump(pins)
        .ok()
        .and_then(|d| {
            d.lines()
                .next()
                .and_then(|l| l.strip_prefix("generation "))
                .and_then(|g| g.parse().ok())
        })
        .unwrap_or(0)
}

#[test]
fn a_node_that_cannot_run_the_mode_is_refused_naming_what_is_missing() {
    let test = "a_node_that_cannot_run_the_mode_is_refused_naming_what_is_missing";
    let Some(w) = World::new(test) else { return };
    let not_a_cgroup = tempfile::tempdir().expect("dir");
    let mut failures = Vec::new();
    for (what, cgroup, pins, want) in [
        (
            "a cgroup that is no cgroup v2 directory",
            not_a_cgroup.path().to_path_buf(),
            w.conf.pin_dir(),
            "not a cgroup v2 directory",
        ),
        (
            "a pin directory off any bpffs",
            w.conf.cgroup().to_path_buf(),
            not_a_cgroup.path().join("svcproxy"),
            "is not on a bpffs",
        ),
    ] {
        let mut args = w.args(&cgroup, &pins);
        args.push("--once".into());
        let out = w.run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success()
            || !stderr.contains("the ebpf mode cannot run on this node")
            || !stderr.contains(want)
        {
            failures.push(format!("{what}: {} {stderr}", out.status));
        }
        if pins.exists() {
            failures.push(format!("{what}: {} was created", pins.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_missing_bpffs_at_its_home_is_mounted() {
    let test = "a_missing_bpffs_at_its_home_is_mounted";
    let Some(w) = World::new(test) else { return };
    // Inside `ip netns exec`, /sys is the namespace's own sysfs in a mount
    // namespace of its own: /sys/fs/bpf has no bpffs there, and one mounted
    // there goes when svcproxy exits.
    let mut args = w.args(w.conf.cgroup(), Path::new("/sys/fs/bpf/svcproxy"));
    args.push("--once".into());
    let out = w.run(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.contains("no bpffs was mounted: mounted one"),
        "{} {stderr}",
        out.status
    );
}

/// `--ebpf-bpffs` naming a bpffs itself (its mount point, Cilium's habit, or
/// `/sys/fs/bpf` where none is mounted yet) pins into svcproxy's own `svcproxy/`
/// inside it, and `cleanup` with the same flag removes that directory alone.
#[test]
fn a_bpffs_itself_is_taken_as_where_svcproxy_s_directory_goes() {
    let test = "a_bpffs_itself_is_taken_as_where_svcproxy_s_directory_goes";
    let Some(w) = World::new(test) else { return };
    let mut failures = Vec::new();
    // The kernel's conventional place, unmounted inside `ip netns exec`'s own
    // mount namespace: mounted, and svcproxy's directory made inside it.
    let mut args = w.args(w.conf.cgroup(), Path::new("/sys/fs/bpf"));
    args.push("--once".into());
    let out = w.run(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        failures.push(format!("--ebpf-bpffs /sys/fs/bpf was refused: {stderr}"));
    }
    // The test's own bpffs, by its mount point.
    let root = w.conf.pin_dir().parent().expect("the bpffs").to_path_buf();
    std::fs::create_dir(root.join("someone-else")).expect("a directory of another's");
    let mut args = w.args(w.conf.cgroup(), &root);
    args.push("--once".into());
    let out = w.run(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        failures.push(format!(
            "--ebpf-bpffs at a bpffs's mount point was refused: {stderr}"
        ));
    }
    let dump = svcproxy_dataplane::ebpf::kernel::dump(&root.join("svcproxy")).unwrap_or_default();
    if !dump.contains("service 198.19.0.10 80/tcp") {
        failures.push(format!(
            "the pins should be in {}/svcproxy:\n{dump}",
            root.display()
        ));
    }
    let bin = svcproxy_bin().to_string_lossy().into_owned();
    let root_arg = root.to_string_lossy().into_owned();
    let out = w.run(&[bin, "cleanup".into(), "--ebpf-bpffs".into(), root_arg]);
    if !out.status.success() {
        failures.push(format!(
            "cleanup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    if root.join("svcproxy").exists() {
        failures.push("cleanup left svcproxy's directory".into());
    }
    if !root.join("someone-else").exists() {
        failures.push("cleanup removed a directory that was not svcproxy's".into());
    }
    let _ = std::fs::remove_dir(root.join("someone-else"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn after_a_kill_the_data_path_stays_and_cleanup_removes_every_pin() {
    let test = "after_a_kill_the_data_path_stays_and_cleanup_removes_every_pin";
    let Some(w) = World::new(test) else { return };
    let pins = w.conf.pin_dir();
    let Some(proxy) = w.start(test, &[]) else {
        return;
    };
    proxy.kill();

    let mut failures = Vec::new();
    // The start's probe of the programs (in a scratch directory beside the pins)
    // left nothing behind.
    let beside: Vec<String> = std::fs::read_dir(pins.parent().expect("a parent"))
        .expect("the bpffs")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    // (`maps.debug` and `progs.debug` are the bpffs's own.)
    if beside.iter().any(|n| n.starts_with("svcproxy-probe"))
        || !beside.iter().any(|n| n == "svcproxy")
    {
        failures.push(format!(
            "the bpffs holds {beside:?}: a probe left behind, or no pins"
        ));
    }
    let dump = svcproxy_dataplane::ebpf::kernel::dump(&pins).unwrap_or_default();
    if !dump.contains("service 198.19.0.10 80/tcp") {
        failures.push(format!("after SIGKILL the maps should stay:\n{dump}"));
    }
    let tables = w.ns.run_ok(&["nft", "list", "tables"], None).expect("nft");
    if !tables.contains("svcproxy-ebpf") {
        failures.push(format!(
            "after SIGKILL the fixed rules should stay: {tables}"
        ));
    }

    // From another network namespace, the same pin directory is someone else's.
    if let Some(other) = Netns::create(test, "ebpf-other", &[]) {
        let bin = svcproxy_bin().to_string_lossy().into_owned();
        let pins_arg = pins.to_string_lossy().into_owned();
        let out = netns::run(
            &mut other.command(&[&bin, "cleanup", "--ebpf-bpffs", &pins_arg]),
            None,
            Duration::from_secs(60),
        )
        .expect("cleanup ran");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success()
            || !stderr.contains("belong to svcproxy in another network namespace")
            || generation(&pins) == 0
        {
            failures.push(format!(
                "a cleanup from another namespace must leave the pins: {} {stderr}",
                out.status
            ));
        }
        // Nor may an svcproxy there take them over.
        let mut args = w.args(w.conf.cgroup(), &pins);
        args.push("--once".into());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = netns::run(&mut other.command(&argv), None, Duration::from_secs(60))
            .expect("svcproxy ran");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !stderr.contains("pins of svcproxy in another network namespace")
        {
            failures.push(format!(
                "an svcproxy in another namespace must not take the pins over: {} {stderr}",
                out.status
            ));
        }
    }

    failures.extend(w.cleanup());
    if pins.exists() {
        let left: Vec<String> = std::fs::read_dir(&pins)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        failures.push(format!("cleanup left {}: {left:?}", pins.display()));
    }
    let tables = w.ns.run_ok(&["nft", "list", "tables"], None).expect("nft");
    if tables.contains("svcproxy-ebpf") {
        failures.push(format!("cleanup left the fixed rules: {tables}"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The node's `ip_local_port_range`, written in the test's namespace (the
/// setting is a network namespace's own); false (said as SKIP) where `/proc/sys`
/// is read-only (a container).
fn set_local_port_range(test: &str, ns: &str, range: &str) -> bool {
    let written = in_netns(ns, || {
        std::fs::write("/proc/sys/net/ipv4/ip_local_port_range", range)
    })
    .expect("netns");
    match written {
        Ok(()) => true,
        Err(e)
            if e.raw_os_error() == Some(libc::EROFS)
                || e.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            netns::skip(test, &format!("cannot set ip_local_port_range: {e}"));
            false
        }
        Err(e) => panic!("ip_local_port_range: {e}"),
    }
}

/// The syncs svcproxy has logged so far.
fn syncs(proxy: &NsProcess) -> usize {
    proxy
        .stderr()
        .lines()
        .filter(|l| l.contains("svcproxy_sync::driver: synced"))
        .count()
}

/// Waits (up to `limit`) until svcproxy has logged `n` more syncs than `since`.
fn wait_for_syncs(proxy: &NsProcess, since: usize, n: usize, limit: Duration) -> bool {
    let start = Instant::now();
    while syncs(proxy) < since + n && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(100));
    }
    syncs(proxy) >= since + n
}

/// svcproxy's own masquerade (the XDP fast path's) takes the ports above the
/// namespace's `ip_local_port_range`, read at start (the fixed rule keeps the
/// kernel's masquerade below them); when the range later grows into them, the
/// log says so, once, and only with XDP.
#[test]
fn the_masquerade_ports_lie_above_the_local_port_range_and_a_later_overlap_is_said() {
    let test = "the_masquerade_ports_lie_above_the_local_port_range_and_a_later_overlap_is_said";
    let Some(w) = World::new(test) else { return };
    // Not Linux's default: the range is read from the node, not assumed (its
    // ends of different parity, as the kernel prefers).
    if !set_local_port_range(test, &w.ns.name, "32768 59999") {
        return;
    }
    let Some(proxy) = w.start(test, &["--sync-period", "1s", "--ebpf-xdp", "native"]) else {
        return;
    };
    let overlap = "now reaches into the ports svcproxy's own masquerade took at start";
    let mut failures = Vec::new();
    let rules =
        w.ns.run_ok(&["nft", "list", "table", "inet", "svcproxy-ebpf"], None)
            .expect("nft");
    if !rules.contains("masquerade to :1024-59999") {
        failures.push(format!(
            "the kernel's masquerade should keep below 60000:\n{rules}"
        ));
    }
    // A range that still ends below the masquerade's ports is no news, at the
    // next two syncs.
    set_local_port_range(test, &w.ns.name, "30000 59999");
    let before = syncs(&proxy);
    if !wait_for_syncs(&proxy, before, 2, Duration::from_secs(20)) {
        failures.push(format!("no periodic syncs:\n{}", proxy.logs()));
    }
    if proxy.stderr().contains(overlap) {
        failures.push("a range below the masquerade's ports was said to overlap".into());
    }
    // Its first port, 60000, is enough.
    set_local_port_range(test, &w.ns.name, "32769 60000");
    let start = Instant::now();
    while !proxy.stderr().contains(overlap) && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = syncs(&proxy);
    wait_for_syncs(&proxy, before, 2, Duration::from_secs(20));
    match proxy.stderr().matches(overlap).count() {
        1 => {}
        n => failures.push(format!(
            "the overlap should be said once, was said {n} times:\n{}",
            proxy.logs()
        )),
    }
    proxy.kill();
    failures.extend(w.cleanup());

    // Without XDP nothing takes those ports: a range grown into them is no news.
    let Some(proxy) = w.start(test, &["--sync-period", "1s"]) else {
        return;
    };
    set_local_port_range(test, &w.ns.name, "32769 62000");
    let before = syncs(&proxy);
    if !wait_for_syncs(&proxy, before, 2, Duration::from_secs(20)) {
        failures.push(format!("no periodic syncs without XDP:\n{}", proxy.logs()));
    }
    if proxy.stderr().contains(overlap) {
        failures.push(format!(
            "without XDP an overlap was said:\n{}",
            proxy.logs()
        ));
    }
    proxy.kill();
    failures.extend(w.cleanup());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Six cluster IPs (198.19.0.1-6:80), each with one endpoint, 198.18.1.10:8080.
fn six_services() -> ClusterState {
    let mut docs = vec![MANIFESTS
        .split("---")
        .next()
        .unwrap_or_default()
        .to_string()];
    for n in 1..=6 {
        docs.push(format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: s{n}, namespace: demo}}\nspec:\n  \
             clusterIP: 198.19.0.{n}\n  ports:\n  - {{name: http, port: 80, targetPort: 8080}}\n"
        ));
        docs.push(format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: s{n}-1\n  \
             namespace: demo\n  labels: {{kubernetes.io/service-name: s{n}}}\naddressType: IPv4\n\
             ports:\n- {{name: http, port: 8080}}\nendpoints:\n- {{addresses: [198.18.1.10], nodeName: node-a}}\n"
        ));
    }
    svcproxy_testkit::objects::state("node-a", &docs)
}

#[test]
fn full_maps_leave_out_what_does_not_fit_say_so_and_serve_the_rest() {
    let test = "full_maps_leave_out_what_does_not_fit_say_so_and_serve_the_rest";
    let Some(w) = World::new(test) else { return };
    netns::ip_batch(&w.ns.name, &["addr add 198.18.1.10/32 dev lo".into()]).expect("address");
    let echo = echo_bin().expect("svcproxy-echo");
    let e = echo.to_string_lossy().into_owned();
    let server = NsProcess::spawn(
        &w.ns.name,
        &[
            &e,
            "serve",
            "--name",
            "pod-a",
            "--tcp",
            "8080",
            "--lifetime-secs",
            "120",
        ],
        "echo",
        w.logs.path(),
    )
    .expect("echo");
    server
        .wait_for_stdout("\"ready\"", Duration::from_secs(10))
        .expect("echo ready");
    let probe = |target: &str| -> Attempt {
        let argv = [
            "ip",
            "netns",
            "exec",
            &w.ns.name,
            &e,
            "probe",
            "--proto",
            "tcp",
            "--target",
            target,
            "--count",
            "1",
            "--timeout-ms",
            "800",
        ];
        let out =
            netns::run(&mut w.conf.command(&argv), None, Duration::from_secs(30)).expect("probe");
        let line = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        serde_json::from_str::<ProbeLine>(&line)
            .unwrap_or_else(|err| panic!("probe line {line:?}: {err}"))
            .into()
    };
    // The six addresses probed once each: how many pod-a answered, how many refused.
    let tally = || {
        let attempts: Vec<Attempt> = (1..=6)
            .map(|n| probe(&format!("198.19.0.{n}:80")))
            .collect();
        (
            attempts
                .iter()
                .filter(|a| a.backend() == Some("pod-a"))
                .count(),
            attempts.iter().filter(|a| a.is_refused()).count(),
        )
    };
    let cfg = PlanConfig {
        local_detection: LocalDetection::NodeCidr(Vec::new()),
        ..PlanConfig::default()
    };
    let mut st = six_services();
    let snap = st.snapshot();
    let mut failures = Vec::new();

    // Room for four service addresses of six.
    let mut opts = ebpf_options(&w.conf);
    opts.sizes = MapSizes {
        services: 4,
        ..MapSizes::DEFAULT
    };
    if !ebpf_runs_here(test, &w.ns.name, &opts) {
        return;
    }
    let mut driver = Driver::without_conntrack(cfg.clone(), EbpfDataPlane::new(opts));
    let synced = in_netns(&w.ns.name, || driver.sync(&snap, true)).expect("netns");
    if let Err(e) = synced {
        failures.push(format!("a full service map fails the sync: {e}"));
    }
    let metrics = text_of(driver.plane_mut().collectors());
    for want in [
        "svcproxy_ebpf_map_overflow_keys{map=\"svcproxy_svc\"} 2",
        "svcproxy_ebpf_map_entries{map=\"svcproxy_svc\"} 4",
        "svcproxy_ebpf_map_max_entries{map=\"svcproxy_svc\"} 4",
        "svcproxy_ebpf_unprogrammed_service_ports 2",
    ] {
        if !metrics.contains(want) {
            failures.push(format!("metrics lack {want:?}:\n{metrics}"));
        }
    }
    let served: Vec<bool> = (1..=6)
        .map(|n| probe(&format!("198.19.0.{n}:80")).backend() == Some("pod-a"))
        .collect();
    if served != [true, true, true, true, false, false] {
        failures.push(format!(
            "the four that fit are served, the two others not: {served:?}"
        ));
    }
    w.run_cleanup(&mut driver);

    // Room for the six addresses, and for three endpoints of six.
    let mut opts = ebpf_options(&w.conf);
    opts.sizes = MapSizes {
        endpoints: 3,
        ..MapSizes::DEFAULT
    };
    let mut driver = Driver::without_conntrack(cfg.clone(), EbpfDataPlane::new(opts));
    if let Err(e) = in_netns(&w.ns.name, || driver.sync(&snap, true)).expect("netns") {
        failures.push(format!("a full endpoint map fails the sync: {e}"));
    }
    let (answered, refused) = tally();
    if (answered, refused) != (3, 3) {
        failures.push(format!(
            "three lists fit and are served, three refuse: answered {answered}, refused {refused}"
        ));
    }
    let metrics = text_of(driver.plane_mut().collectors());
    if !metrics.contains("svcproxy_ebpf_map_overflow_keys{map=\"svcproxy_slot\"} 3") {
        failures.push(format!("metrics lack the endpoint overflow:\n{metrics}"));
    }
    w.run_cleanup(&mut driver);

    // Room for exactly the six lists (one endpoint each): a full sync at the
    // edge writes what it can under fresh ids and keeps the others' ids (their
    // endpoints unchanged), so every address stays served, sync after sync.
    let mut opts = ebpf_options(&w.conf);
    opts.sizes = MapSizes {
        endpoints: 6,
        ..MapSizes::DEFAULT
    };
    let mut driver = Driver::without_conntrack(cfg.clone(), EbpfDataPlane::new(opts));
    for round in 1..=3 {
        if let Err(e) = in_netns(&w.ns.name, || driver.sync(&snap, true)).expect("netns") {
            failures.push(format!(
                "full sync {round} at the edge of the slot map: {e}"
            ));
        }
        let (answered, _) = tally();
        if answered != 6 {
            failures.push(format!(
                "full sync {round} at the edge of the slot map: {answered} of 6 answered"
            ));
        }
        let metrics = text_of(driver.plane_mut().collectors());
        for want in [
            "svcproxy_ebpf_map_entries{map=\"svcproxy_slot\"} 6",
            "svcproxy_ebpf_unprogrammed_service_ports 0",
        ] {
            if !metrics.contains(want) {
                failures.push(format!(
                    "full sync {round}: metrics lack {want:?}:\n{metrics}"
                ));
            }
        }
    }
    w.run_cleanup(&mut driver);

    // The Maglev tables (mh, as ipvs mode's --ipvs-scheduler mh): room for three
    // tables of the default 16,381 cells (64 entries each) of six. Three lists
    // are written whole and served; the three others refuse, counted.
    let mut opts = ebpf_options(&w.conf);
    opts.sizes = MapSizes {
        maglev: 3 * 64,
        ..MapSizes::DEFAULT
    };
    let mh = PlanConfig {
        scheduler: svcproxy_core::model::Scheduler::parse("mh").expect("mh"),
        schedulers: true,
        ..cfg
    };
    let mut driver = Driver::without_conntrack(mh, EbpfDataPlane::new(opts));
    if let Err(e) = in_netns(&w.ns.name, || driver.sync(&snap, true)).expect("netns") {
        failures.push(format!("a full Maglev map fails the sync: {e}"));
    }
    let (answered, refused) = tally();
    if (answered, refused) != (3, 3) {
        failures.push(format!(
            "three Maglev lists fit and are served, three refuse: answered {answered}, \
             refused {refused}"
        ));
    }
    let metrics = text_of(driver.plane_mut().collectors());
    for want in [
        "svcproxy_ebpf_map_overflow_keys{map=\"svcproxy_mh\"} 3",
        "svcproxy_ebpf_map_max_entries{map=\"svcproxy_mh\"} 192",
        "svcproxy_ebpf_unprogrammed_service_ports 3",
    ] {
        if !metrics.contains(want) {
            failures.push(format!(
                "a full Maglev map: metrics lack {want:?}:\n{metrics}"
            ));
        }
    }
    w.run_cleanup(&mut driver);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The collectors' samples as Prometheus text.
fn text_of(collectors: Vec<Box<dyn prometheus::core::Collector>>) -> String {
    use prometheus::Encoder;
    let families: Vec<_> = collectors.iter().flat_map(|c| c.collect()).collect();
    let mut out = Vec::new();
    prometheus::TextEncoder::new()
        .encode(&families, &mut out)
        .expect("encode");
    String::from_utf8(out).expect("utf-8")
}

impl World {
    fn run_cleanup<C>(&self, driver: &mut Driver<EbpfDataPlane, C>)
    where
        C: svcproxy_dataplane::ConntrackCleaner + Send,
    {
        in_netns(&self.ns.name, || driver.plane_mut().cleanup())
            .expect("netns")
            .expect("cleanup");
    }
}

/// `--detect-local-mode=BridgeInterface`: a pod's packets arrive on its veth, a
/// port of the bridge, before the bridge: the bridge's ports are flagged as the
/// pods' interfaces, as the bridge is; other interfaces are not.
#[test]
fn a_bridges_ports_are_its_pods_interfaces() {
    let test = "a_bridges_ports_are_its_pods_interfaces";
    let Some(w) = World::new(test) else { return };
    netns::ip_batch(
        &w.ns.name,
        &[
            "link add cbr0 type bridge".into(),
            "link add vp0 type veth peer name vp1".into(),
            "link set vp0 master cbr0".into(),
            "link set cbr0 up".into(),
            "link set vp0 up".into(),
        ],
    )
    .expect("bridge");
    let index = |name: &str| {
        w.ns.run_ok(&["cat", &format!("/sys/class/net/{name}/ifindex")], None)
            .expect("ifindex")
            .trim()
            .to_string()
    };
    let cfg = PlanConfig {
        local_detection: LocalDetection::BridgeInterface(
            svcproxy_plan::InterfaceName::parse("cbr0").expect("a name"),
        ),
        ..PlanConfig::default()
    };
    let mut st = six_services();
    let snap = st.snapshot();
    let opts = ebpf_options(&w.conf);
    if !ebpf_runs_here(test, &w.ns.name, &opts) {
        return;
    }
    let mut driver = Driver::without_conntrack(cfg, EbpfDataPlane::new(opts));
    if let Err(e) = in_netns(&w.ns.name, || driver.sync(&snap, true)).expect("netns") {
        panic!("the first sync failed: {e}");
    }
    let dump = svcproxy_dataplane::ebpf::kernel::dump(&w.conf.pin_dir()).expect("dump");
    let mut failures = Vec::new();
    for (name, want) in [
        ("cbr0", "pods"),
        ("vp0", "pods"),
        ("vp1", "other"),
        ("node0", "other"),
    ] {
        let line = format!("interface {} {want}", index(name));
        if !dump.lines().any(|l| l == line) {
            failures.push(format!("{name}: no {line:?}"));
        }
    }
    w.run_cleanup(&mut driver);
    assert!(failures.is_empty(), "{}\n{dump}", failures.join("\n"));
}
