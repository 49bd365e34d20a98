//! Resolution tests: flags alone, file alone, and the precedence between them.

use super::*;
use clap::{CommandFactory, FromArgMatches, Parser};
use std::io::Write as _;
use std::path::Path;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    flags: ProxyFlags,
}

const HEAD: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

/// Parses `args` as the binary would and resolves them, with "host-a" as the host
/// name so tests do not depend on the machine.
fn run(args: &[&str]) -> anyhow::Result<(Settings, Vec<String>)> {
    let argv = std::iter::once("svcproxy").chain(args.iter().copied());
    let matches = Cli::command().try_get_matches_from(argv)?;
    let flags = Cli::from_arg_matches(&matches)?.flags;
    let set = explicitly_set_in(&matches);
    resolve_with(&flags, &set, &|| Ok("host-a".to_string()))
}

fn ok(args: &[&str]) -> (Settings, Vec<String>) {
    run(args).unwrap_or_else(|e| panic!("{args:?}: {e:#}"))
}

fn err(args: &[&str]) -> String {
    match run(args) {
        Ok(s) => panic!("{args:?} should fail, got {s:?}"),
        Err(e) => format!("{e:#}"),
    }
}

fn write_config(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

fn config_arg(f: &tempfile::NamedTempFile) -> String {
    format!("--config={}", f.path().display())
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn warned(warnings: &[String], needle: &str) -> bool {
    warnings.iter().any(|w| w.contains(needle))
}

#[test]
fn flags_only_defaults() {
    let (s, w) = ok(&[]);
    assert_eq!(s.node_name, "host-a");
    // kube-proxy 1.37: an unset mode is iptables, with a warning that the default
    // will change (KEP-5343).
    assert_eq!(s.proxy_mode.mode, "iptables");
    assert_eq!(s.plan.nodeport_addresses, NodePortAddresses::AllLocal);
    assert_eq!(s.healthz_bind, Some("0.0.0.0:10256".parse().unwrap()));
    assert_eq!(s.metrics_bind, Some("127.0.0.1:10249".parse().unwrap()));
    assert_eq!(s.sync_period, Duration::from_secs(30));
    assert_eq!(s.min_sync_period, Duration::from_secs(1));
    assert_eq!(s.plan.masquerade_bit, 14);
    assert_eq!(s.plan.local_detection, LocalDetection::None);
    assert_eq!(
        s.conntrack,
        ConntrackSettings {
            max_per_core: 32768,
            min: 131072,
            tcp_established_timeout: Some(Duration::from_secs(86400)),
            tcp_close_wait_timeout: Some(Duration::from_secs(3600)),
            tcp_be_liberal: false,
            udp_timeout: None,
            udp_stream_timeout: None,
        }
    );
    assert_eq!(s.kubeconfig, None);
    // No warning but, for the commands that write rules, the unset mode's and
    // ClusterCIDR local detection without a cluster CIDR.
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(s.rule_warnings.len(), 2, "{:?}", s.rule_warnings);
    assert!(
        warned(&s.rule_warnings, "no proxy mode set: running iptables")
            && warned(&s.rule_warnings, "will change to nftables"),
        "{:?}",
        s.rule_warnings
    );
    assert!(warned(&s.rule_warnings, "--cluster-cidr is not set"));
    assert!(
        s.mode_defaulted,
        "the defaulted mode posts its Warning Event"
    );
    let (s, _) = ok(&["--proxy-mode=nftables"]);
    assert!(
        !warned(&s.rule_warnings, "no proxy mode set"),
        "an explicit mode is not warned about"
    );
    assert!(!s.mode_defaulted);
    // The file alike: no `mode:` is defaulted, `mode: iptables` is not.
    for (text, defaulted) in [("", true), ("mode: iptables\n", false)] {
        let f = write_config(&format!("{HEAD}{text}"));
        let (s, _) = ok(&["--config", f.path().to_str().unwrap()]);
        assert_eq!(s.mode_defaulted, defaulted, "{text:?}");
    }
}

#[test]
fn flags_only_values() {
    let (s, w) = ok(&[
        "--proxy-mode=iptables",
        "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56",
        "--hostname-override=  Node-1 ",
        "--healthz-bind-address=",
        "--metrics-bind-address=::1",
        "--min-sync-period=0",
        "--sync-period=1m30s",
        "--kubeconfig=/etc/kubeconfig",
        "--master=https://10.0.0.1:6443",
        "--manifests=/tmp/m",
        "--service-proxy-name=svcproxy",
        "--once",
        "--cleanup",
        "-v=5",
    ]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(s.proxy_mode.mode, "iptables");
    assert_eq!(
        s.cluster_cidrs,
        vec![net("10.244.0.0/16"), net("fd00:10:244::/56")]
    );
    assert_eq!(
        s.plan.local_detection,
        LocalDetection::ClusterCidr(s.cluster_cidrs.clone())
    );
    assert_eq!(s.node_name, "node-1");
    assert_eq!(
        s.plan.nodeport_addresses,
        NodePortAddresses::AllLocal,
        "iptables default"
    );
    assert_eq!(s.healthz_bind, None, "empty disables");
    assert_eq!(
        s.metrics_bind,
        Some("[::1]:10249".parse().unwrap()),
        "bare IP gets the port"
    );
    assert_eq!(s.min_sync_period, Duration::ZERO);
    assert_eq!(s.sync_period, Duration::from_secs(90));
    assert_eq!(s.kubeconfig.as_deref(), Some(Path::new("/etc/kubeconfig")));
    assert_eq!(s.master.as_deref(), Some("https://10.0.0.1:6443"));
    assert_eq!(s.manifests.as_deref(), Some(Path::new("/tmp/m")));
    assert_eq!(s.service_proxy_name.as_deref(), Some("svcproxy"));
    assert!(s.once && s.cleanup);
    assert_eq!(s.verbosity, 5);
}

#[test]
fn nodeport_addresses_flag() {
    let (s, _) = ok(&["--nodeport-addresses=primary"]);
    assert_eq!(s.plan.nodeport_addresses, NodePortAddresses::Primary);
    let (s, _) = ok(&["--nodeport-addresses=10.0.0.5/8,fd00::/64"]);
    assert_eq!(
        s.plan.nodeport_addresses,
        NodePortAddresses::Cidrs(vec![net("10.0.0.0/8"), net("fd00::/64")])
    );
    let e = err(&["--nodeport-addresses=10.0.0.0/8,bogus"]);
    assert!(
        e.contains("--nodeport-addresses") && e.contains("\"bogus\""),
        "{e}"
    );
    // kube-proxy 1.37: keywords in any combination with each other and CIDRs.
    let (s, _) = ok(&["--nodeport-addresses=primary,10.0.0.0/8"]);
    assert_eq!(
        s.plan.nodeport_addresses,
        NodePortAddresses::PrimaryAnd(vec![net("10.0.0.0/8")])
    );
    let (s, _) = ok(&["--nodeport-addresses=primary,localhost"]);
    assert_eq!(
        s.plan.nodeport_addresses,
        NodePortAddresses::PrimaryAnd(vec![net("127.0.0.0/8"), net("::1/128")])
    );
    let (s, _) = ok(&["--nodeport-addresses=all"]);
    assert_eq!(
        s.plan.nodeport_addresses,
        NodePortAddresses::Cidrs(vec![net("0.0.0.0/0"), net("::/0")])
    );
    let (s, _) = ok(&["--nodeport-addresses=localhost,192.168.0.0/16"]);
    assert_eq!(
        s.plan.nodeport_addresses,
        NodePortAddresses::Cidrs(vec![
            net("127.0.0.0/8"),
            net("::1/128"),
            net("192.168.0.0/16")
        ])
    );
    // Keywords are case-sensitive, and one listed twice is refused.
    let e = err(&["--nodeport-addresses=Localhost"]);
    assert!(e.contains("'primary', 'localhost', 'all'"), "{e}");
    let e = err(&["--nodeport-addresses=localhost,localhost"]);
    assert!(e.contains("listed twice"), "{e}");
    // The config file reads the same way.
    let f = write_config(&format!(
        "{HEAD}nodePortAddresses: [primary, \"10.0.0.0/8\"]\n"
    ));
    let (s, _) = ok(&[&config_arg(&f)]);
    assert_eq!(
        s.plan.nodeport_addresses,
        NodePortAddresses::PrimaryAnd(vec![net("10.0.0.0/8")])
    );
}

#[test]
fn bad_flag_values_are_all_reported() {
    let e = err(&[
        "--cluster-cidr=10.0.0.0/33",
        "--healthz-bind-address=localhost:10256",
        "--metrics-bind-address=127.0.0.1:0",
        "--proxy-mode=bpf",
        "--sync-period=0s",
        "--detect-local-mode=BridgeInterface",
        "--feature-gates=A=maybe",
    ]);
    for want in [
        "--cluster-cidr: invalid CIDR \"10.0.0.0/33\"",
        "--healthz-bind-address: invalid address \"localhost:10256\"",
        "--metrics-bind-address: invalid address \"127.0.0.1:0\"",
        "--proxy-mode: unknown proxy mode \"bpf\"",
        "--sync-period: must be greater than 0",
        "--detect-local-mode: BridgeInterface requires --pod-bridge-interface",
        "--feature-gates: invalid value of A: maybe, use true or false",
    ] {
        assert!(e.contains(want), "{want:?} missing from:\n{e}");
    }
    let e = err(&["--cluster-cidr=10.0.0.0/8,10.1.0.0/16"]);
    assert!(e.contains("dual-stack pair"), "{e}");
    let e = err(&["--hostname-override=   "]);
    assert!(e.contains("--hostname-override"), "{e}");
}

#[test]
fn detect_local_modes() {
    // The default, ClusterCIDR, without a CIDR: no detection, with a warning for
    // the commands that write rules only (not `svcproxy dns`).
    let (s, w) = ok(&[]);
    assert_eq!(s.plan.local_detection, LocalDetection::None);
    assert!(
        warned(&s.rule_warnings, "--cluster-cidr is not set"),
        "{s:?}"
    );
    assert!(!warned(&w, "detect-local-mode"), "{w:?}");
    let (s, _) = ok(&["--cluster-cidr=10.244.0.0/16"]);
    assert!(
        s.rule_warnings
            .iter()
            .all(|w| w.contains("no proxy mode set")),
        "{:?}",
        s.rule_warnings
    );
    let (s, _) = ok(&["--detect-local-mode=NodeCIDR"]);
    assert_eq!(s.plan.local_detection, LocalDetection::NodeCidr(vec![]));
    assert!(
        s.rule_warnings
            .iter()
            .all(|w| w.contains("no proxy mode set")),
        "{:?}",
        s.rule_warnings
    );
    let (s, _) = ok(&[
        "--detect-local-mode=BridgeInterface",
        "--pod-bridge-interface=cbr0",
    ]);
    assert_eq!(
        s.plan.local_detection,
        LocalDetection::BridgeInterface(InterfaceName::parse("cbr0").unwrap())
    );
    let (s, _) = ok(&[
        "--detect-local-mode=InterfaceNamePrefix",
        "--pod-interface-name-prefix=veth",
    ]);
    assert_eq!(
        s.plan.local_detection,
        LocalDetection::InterfaceNamePrefix(InterfaceName::parse("veth").unwrap())
    );
    let e = err(&["--detect-local-mode=InterfaceNamePrefix"]);
    assert!(e.contains("requires --pod-interface-name-prefix"), "{e}");
    let e = err(&[
        "--detect-local-mode=BridgeInterface",
        "--pod-bridge-interface=a-very-long-bridge-name",
    ]);
    assert!(e.contains("longer than 15"), "{e}");
    let e = err(&["--detect-local-mode=clustercidr"]);
    assert!(e.contains("unknown mode \"clustercidr\""), "{e}");
}

#[test]
fn proxy_mode_ipvs_runs_the_ebpf_data_plane_with_ipvs_defaults() {
    let (s, w) = ok(&["--proxy-mode=ipvs", "--cluster-cidr=10.0.0.0/8"]);
    assert_eq!(s.proxy_mode.mode, "ipvs");
    assert!(s.proxy_mode.semantics.schedulers);
    assert_eq!(
        s.proxy_mode.objects,
        svcproxy_dataplane::KernelObjects::EbpfMaps
    );
    assert!(w.is_empty(), "{w:?}");
    // Upstream's ipvs defaults: rr, NodePorts on every local address.
    assert_eq!(s.plan.scheduler, Scheduler::RoundRobin);
    assert_eq!(s.plan.nodeport_addresses, NodePortAddresses::AllLocal);
    // kube-proxy's Windows mode still falls back to nftables.
    let (s, w) = ok(&["--proxy-mode=kernelspace"]);
    assert_eq!(s.proxy_mode.mode, "nftables");
    assert!(warned(&w, "\"kernelspace\" mode is not supported"), "{w:?}");
}

#[test]
fn ipvs_idle_timeouts_reach_the_data_plane_in_ipvs_mode() {
    let (s, w) = ok(&[
        "--proxy-mode=ipvs",
        "--ipvs-tcp-timeout=15m",
        "--ipvs-tcpfin-timeout=0s",
        "--ipvs-udp-timeout=5m",
    ]);
    assert!(w.is_empty(), "{w:?}");
    let t = s.mode_options.ebpf.timeouts;
    assert_eq!(t.tcp, Some(Duration::from_secs(900)));
    assert_eq!(t.tcp_fin, None, "0: leave as is");
    assert_eq!(t.udp, Some(Duration::from_secs(300)));
    let f = write_config(&format!(
        "{HEAD}mode: ipvs\nipvs:\n  tcpFinTimeout: 30s\n  udpTimeout: 0s\n"
    ));
    let t = ok(&[&config_arg(&f)]).0.mode_options.ebpf.timeouts;
    assert_eq!(
        (t.tcp, t.tcp_fin, t.udp),
        (None, Some(Duration::from_secs(30)), None)
    );
    let yaml = effective::to_yaml(&ok(&[&config_arg(&f)]).0).unwrap();
    assert!(yaml.contains("tcpFinTimeout: 30s"), "{yaml}");
    // Outside ipvs mode: ignored, each with one warning.
    let (s, w) = ok(&["--proxy-mode=ebpf", "--ipvs-udp-timeout=5m"]);
    assert_eq!(s.mode_options.ebpf.timeouts, Default::default());
    assert!(
        warned(&w, "--ipvs-udp-timeout: ignored in ebpf mode"),
        "{w:?}"
    );
}

#[test]
fn schedulers_by_mode() {
    let sched = |args: &[&str]| ok(args).0.plan.scheduler;
    // ipvs mode: --ipvs-scheduler (empty: rr), then --scheduler.
    assert_eq!(
        sched(&["--proxy-mode=ipvs", "--ipvs-scheduler=mh"]),
        Scheduler::Maglev
    );
    assert_eq!(
        sched(&["--proxy-mode=ipvs", "--ipvs-scheduler="]),
        Scheduler::RoundRobin
    );
    assert_eq!(
        sched(&["--proxy-mode=ipvs", "--ipvs-scheduler=sh", "--scheduler=dh"]),
        Scheduler::SourceHash
    );
    assert_eq!(
        sched(&["--proxy-mode=ipvs", "--scheduler=dh"]),
        Scheduler::DestinationHash
    );
    // ebpf mode: --scheduler, random by default; --ipvs-scheduler is ignored.
    assert_eq!(sched(&["--proxy-mode=ebpf"]), Scheduler::Random);
    assert_eq!(
        sched(&["--proxy-mode=ebpf", "--scheduler=mh"]),
        Scheduler::Maglev
    );
    let (s, w) = ok(&["--proxy-mode=ebpf", "--ipvs-scheduler=rr"]);
    assert_eq!(s.plan.scheduler, Scheduler::Random);
    assert!(
        warned(&w, "--ipvs-scheduler: ignored in ebpf mode"),
        "{w:?}"
    );
    // The modes that choose at random refuse another scheduler.
    let e = err(&["--proxy-mode=nftables", "--scheduler=rr"]);
    assert!(
        e.contains("nftables mode chooses endpoints at random only"),
        "{e}"
    );
    assert_eq!(
        sched(&["--proxy-mode=nftables", "--scheduler=random"]),
        Scheduler::Random
    );
    // Unknown and unimplemented names are refused, naming the flag.
    let e = err(&["--proxy-mode=ipvs", "--ipvs-scheduler=bogus\u{1b}[2J"]);
    assert!(
        e.contains("--ipvs-scheduler: unknown scheduler \"bogus\\u{1b}[2J\""),
        "{e}"
    );
    let e = err(&["--proxy-mode=ipvs", "--ipvs-scheduler=lblc"]);
    assert!(e.contains("\"lblc\" is not implemented"), "{e}");
    // lc and its weighted kin.
    for (name, s) in [
        ("wrr", Scheduler::WeightedRoundRobin),
        ("lc", Scheduler::LeastConnection),
        ("wlc", Scheduler::WeightedLeastConnection),
        ("sed", Scheduler::ShortestExpectedDelay),
        ("nq", Scheduler::NeverQueue),
    ] {
        assert_eq!(
            sched(&["--proxy-mode=ipvs", &format!("--ipvs-scheduler={name}")]),
            s
        );
    }
    // The config file's ipvs.scheduler, in ipvs mode.
    let f = write_config(&format!("{HEAD}mode: ipvs\nipvs:\n  scheduler: sh\n"));
    assert_eq!(sched(&[&config_arg(&f)]), Scheduler::SourceHash);
    let yaml = effective::to_yaml(&ok(&[&config_arg(&f)]).0).unwrap();
    assert!(yaml.contains("scheduler: sh"), "{yaml}");
    let f = write_config(&format!("{HEAD}mode: nftables\nipvs:\n  scheduler: sh\n"));
    let (s, w) = ok(&[&config_arg(&f)]);
    assert_eq!(s.plan.scheduler, Scheduler::Random);
    assert!(
        warned(&w, "ipvs.scheduler: ignored in nftables mode"),
        "{w:?}"
    );
}

#[test]
fn kubeadm_config_file_resolves() {
    let f = write_config(super::file::tests::KUBEADM_DEFAULT);
    let (s, w) = ok(&[&config_arg(&f)]);
    // kubeadm's older default has `mode: ""`: iptables, with the unset mode's warning.
    assert!(w.is_empty(), "{w:?}");
    assert!(warned(&s.rule_warnings, "no proxy mode set"));
    // Upstream's file defaults fill every zero/null field.
    assert_eq!(s.proxy_mode.mode, "iptables");
    assert_eq!(s.cluster_cidrs, vec![net("10.244.0.0/16")]);
    assert_eq!(
        s.plan.local_detection,
        LocalDetection::ClusterCidr(vec![net("10.244.0.0/16")])
    );
    assert_eq!(s.plan.nodeport_addresses, NodePortAddresses::AllLocal);
    assert_eq!(s.healthz_bind, Some("0.0.0.0:10256".parse().unwrap()));
    assert_eq!(s.metrics_bind, Some("127.0.0.1:10249".parse().unwrap()));
    assert_eq!(s.sync_period, Duration::from_secs(30));
    assert_eq!(s.min_sync_period, Duration::from_secs(1));
    assert_eq!(s.config_sync_period, Duration::from_secs(900));
    assert_eq!(s.plan.masquerade_bit, 14);
    assert_eq!(s.conntrack.max_per_core, 32768);
    assert_eq!(s.conntrack.min, 131072);
    assert_eq!(
        s.conntrack.tcp_established_timeout,
        Some(Duration::from_secs(86400))
    );
    assert_eq!(
        s.conntrack.tcp_close_wait_timeout,
        Some(Duration::from_secs(3600))
    );
    assert_eq!(
        s.kubeconfig.as_deref(),
        Some(Path::new("/var/lib/kube-proxy/kubeconfig.conf"))
    );
    assert_eq!(
        s.client_connection,
        ClientConnection {
            qps: 5.0,
            burst: 10,
            content_type: "application/vnd.kubernetes.protobuf".into(),
            accept_content_types: String::new(),
        }
    );
    assert_eq!(s.node_name, "host-a");
    assert_eq!(s.config_file.as_deref(), Some(f.path()));
}

#[test]
fn example_config_loads() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/kube-proxy-config.yaml"
    );
    let (s, w) = ok(&[&format!("--config={path}"), "--hostname-override=node-a"]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(s.proxy_mode.mode, "nftables");
    assert_eq!(s.node_name, "node-a");
    assert_eq!(
        s.cluster_cidrs,
        vec![net("10.244.0.0/16"), net("fd00:10:244::/56")]
    );
    assert_eq!(s.plan.nodeport_addresses, NodePortAddresses::Primary);
    assert_eq!(s.verbosity, 2);
}

#[test]
fn file_wins_over_flags_and_says_so() {
    let f = write_config(&format!(
        "{HEAD}mode: iptables\nclusterCIDR: 10.1.0.0/16\nhostnameOverride: From-File\n\
         iptables:\n  syncPeriod: 10s\n  masqueradeAll: true\n"
    ));
    let (s, w) = ok(&[
        &config_arg(&f),
        "--proxy-mode=nftables",
        "--cluster-cidr=10.2.0.0/16",
        "--sync-period=20s",
        "--min-sync-period=5s",
        "--master=https://api:6443",
        "--once",
    ]);
    assert_eq!(s.proxy_mode.mode, "iptables");
    assert_eq!(s.cluster_cidrs, vec![net("10.1.0.0/16")]);
    assert_eq!(s.sync_period, Duration::from_secs(10));
    // Not in the file: the file default, not the flag.
    assert_eq!(s.min_sync_period, Duration::from_secs(1));
    assert!(s.plan.masquerade_all);
    assert_eq!(s.node_name, "from-file");
    // Flags outside the config still apply.
    assert_eq!(s.master.as_deref(), Some("https://api:6443"));
    assert!(s.once);
    let ignored = w
        .iter()
        .find(|w| w.starts_with("ignoring "))
        .expect("warning");
    for flag in [
        "--proxy-mode",
        "--cluster-cidr",
        "--sync-period",
        "--min-sync-period",
    ] {
        assert!(ignored.contains(flag), "{flag} missing from {ignored}");
    }
    assert!(
        !ignored.contains("--master") && !ignored.contains("--once"),
        "{ignored}"
    );
}

#[test]
fn hostname_override_flag_wins_over_file() {
    let f = write_config(&format!("{HEAD}hostnameOverride: from-file\n"));
    let (s, w) = ok(&[&config_arg(&f), "--hostname-override=From-Flag"]);
    assert_eq!(s.node_name, "from-flag");
    assert!(!warned(&w, "--hostname-override"), "{w:?}");
    // An empty flag does not override.
    let (s, _) = ok(&[&config_arg(&f), "--hostname-override="]);
    assert_eq!(s.node_name, "from-file");
    let f = write_config(HEAD);
    let (s, _) = ok(&[&config_arg(&f)]);
    assert_eq!(s.node_name, "host-a");
}

#[test]
fn verbosity_flag_wins_over_file() {
    let f = write_config(&format!("{HEAD}logging:\n  verbosity: 3\n"));
    assert_eq!(ok(&[&config_arg(&f)]).0.verbosity, 3);
    assert_eq!(ok(&[&config_arg(&f), "-v", "1"]).0.verbosity, 1);
}

#[test]
fn file_sync_periods_by_mode() {
    // nftables reads the nftables section.
    let f = write_config(&format!(
        "{HEAD}mode: nftables\nnftables:\n  syncPeriod: 1m\n  minSyncPeriod: 2s\niptables:\n  syncPeriod: 30s\n  minSyncPeriod: 1s\n"
    ));
    let (s, w) = ok(&[&config_arg(&f)]);
    assert_eq!(
        (s.sync_period, s.min_sync_period),
        (Duration::from_secs(60), Duration::from_secs(2))
    );
    assert!(
        !warned(&w, "iptables."),
        "upstream-default values are not worth a warning: {w:?}"
    );

    // A non-default value in the inactive section is reported.
    let f = write_config(&format!(
        "{HEAD}mode: nftables\niptables:\n  syncPeriod: 5s\n  masqueradeAll: true\n"
    ));
    let (s, w) = ok(&[&config_arg(&f)]);
    assert_eq!(s.sync_period, Duration::from_secs(30));
    assert!(!s.plan.masquerade_all);
    assert!(
        warned(
            &w,
            "iptables.syncPeriod, iptables.masqueradeAll: ignored in nftables mode"
        ),
        "{w:?}"
    );
    // Unset, the mode is iptables and reads that section.
    let f = write_config(&format!(
        "{HEAD}iptables:\n  syncPeriod: 5s\n  masqueradeAll: true\n"
    ));
    let (s, w) = ok(&[&config_arg(&f)]);
    assert_eq!(s.sync_period, Duration::from_secs(5));
    assert!(s.plan.masquerade_all);
    assert!(w.is_empty(), "{w:?}");

    // Top-level periods (internal/v1alpha2 layout) win over the section.
    let f = write_config(&format!(
        "{HEAD}mode: nftables\nsyncPeriod: 45s\nnftables:\n  syncPeriod: 1m\n  minSyncPeriod: 3s\n"
    ));
    let (s, w) = ok(&[&config_arg(&f)]);
    assert_eq!(
        (s.sync_period, s.min_sync_period),
        (Duration::from_secs(45), Duration::from_secs(3))
    );
    assert!(
        warned(
            &w,
            "nftables.syncPeriod: ignored, the top-level syncPeriod (45s)"
        ),
        "{w:?}"
    );

    // ipvs: the ipvs section's periods and scheduler.
    let f = write_config(&format!(
        "{HEAD}mode: ipvs\nipvs:\n  syncPeriod: 20s\n  minSyncPeriod: 0s\n  scheduler: rr\n"
    ));
    let (s, w) = ok(&[&config_arg(&f)]);
    assert_eq!(s.proxy_mode.mode, "ipvs");
    assert_eq!(s.sync_period, Duration::from_secs(20));
    assert_eq!(s.plan.scheduler, Scheduler::RoundRobin);
    assert!(w.is_empty(), "{w:?}");
}

#[test]
fn file_nodeport_addresses_and_bind_addresses() {
    let f = write_config(&format!(
        "{HEAD}mode: iptables\nnodePortAddresses: [primary]\nbindAddress: \"::\"\n\
         healthzBindAddress: \"\"\nmetricsBindAddress: 0.0.0.0\n"
    ));
    let (s, _) = ok(&[&config_arg(&f)]);
    assert_eq!(s.plan.nodeport_addresses, NodePortAddresses::Primary);
    assert_eq!(s.bind_address, "::".parse::<IpAddr>().unwrap());
    // Empty in the file means the default for bindAddress's family.
    assert_eq!(s.healthz_bind, Some("[::]:10256".parse().unwrap()));
    assert_eq!(s.metrics_bind, Some("0.0.0.0:10249".parse().unwrap()));

    let f = write_config(&format!("{HEAD}mode: iptables\n"));
    assert_eq!(
        ok(&[&config_arg(&f)]).0.plan.nodeport_addresses,
        NodePortAddresses::AllLocal
    );
}

#[test]
fn bad_file_values_name_field_and_value() {
    let f = write_config(&format!(
        "{HEAD}clusterCIDR: 10.0.0.0/8,not-a-cidr\nnodePortAddresses: [10.0.0.0/8, 300.0.0.0/8]\n\
         iptables:\n  masqueradeBit: 32\nhealthzBindAddress: 1.2.3.4:99999\n\
         detectLocalMode: InterfaceNamePrefix\nconntrack:\n  maxPerCore: -1\nmode: bpf\n\
         clientConnection:\n  burst: -5\n"
    ));
    let e = err(&[&config_arg(&f)]);
    for want in [
        "clusterCIDR: invalid CIDR \"not-a-cidr\"",
        "nodePortAddresses: invalid CIDR \"300.0.0.0/8\"",
        "iptables.masqueradeBit: 32 must be within the range [0, 31]",
        "healthzBindAddress: invalid address \"1.2.3.4:99999\"",
        "detectLocalMode: InterfaceNamePrefix requires detectLocal.interfaceNamePrefix",
        "conntrack.maxPerCore: -1 must be greater than or equal to 0",
        "mode: unknown proxy mode \"bpf\"",
        "clientConnection.burst: -5",
    ] {
        assert!(e.contains(want), "{want:?} missing from:\n{e}");
    }
    assert!(e.contains(&f.path().display().to_string()), "{e}");
}

#[test]
fn unknown_file_fields_are_decoded_leniently_with_one_warning() {
    // A field from a newer kube-proxy, beside known ones: as upstream (strict, then
    // lenient), the known fields apply and the unknown ones are named in a warning.
    let f = write_config(&format!(
        "{HEAD}mode: iptables\niptables:\n  masqueradeAll2: true\n  syncPeriod: 10s\nfutureFeature: {{enabled: true}}\n"
    ));
    let (s, w) = ok(&[&config_arg(&f)]);
    assert_eq!(s.proxy_mode.mode, "iptables");
    assert_eq!(s.sync_period, Duration::from_secs(10));
    let unknown: Vec<_> = w.iter().filter(|w| w.contains("unknown field")).collect();
    assert_eq!(unknown.len(), 1, "{w:?}");
    assert!(
        unknown[0].contains("futureFeature, iptables.masqueradeAll2")
            && unknown[0].contains(&f.path().display().to_string()),
        "{w:?}"
    );
}

#[test]
fn file_errors_from_decoding_name_the_file() {
    let f = write_config(&format!("{HEAD}iptables:\n  masqueradeAll: maybe\n"));
    let e = err(&[&config_arg(&f)]);
    assert!(e.contains("iptables.masqueradeAll"), "{e}");
    assert!(e.contains(&f.path().display().to_string()), "{e}");
    let e = err(&["--config=/nonexistent/kube-proxy.yaml"]);
    assert!(e.contains("/nonexistent/kube-proxy.yaml"), "{e}");
}

#[test]
fn file_conntrack_pointers() {
    let f = write_config(&format!(
        "{HEAD}conntrack:\n  maxPerCore: 0\n  tcpEstablishedTimeout: 0s\n  tcpCloseWaitTimeout: 30m\n  udpTimeout: 30s\n"
    ));
    let c = ok(&[&config_arg(&f)]).0.conntrack;
    assert_eq!(c.max_per_core, 0, "explicit 0 leaves the limit alone");
    assert_eq!(c.min, 131072);
    assert_eq!(
        c.tcp_established_timeout, None,
        "explicit 0s leaves it alone"
    );
    assert_eq!(c.tcp_close_wait_timeout, Some(Duration::from_secs(1800)));
    assert_eq!(c.udp_timeout, Some(Duration::from_secs(30)));
}

#[test]
fn system_hostname_is_lowercase_and_trimmed() {
    if let Ok(name) = system_hostname() {
        assert_eq!(name, name.trim().to_lowercase());
        assert!(!name.is_empty());
    }
}

/// kube-up's (GCE) kube-proxy command line, the longest upstream ships, plus the
/// deprecated and removed flags still found in older manifests: every one is
/// accepted; those without effect get one warning each.
#[test]
fn every_kube_proxy_flag_is_accepted() {
    let args = [
        "--master=https://10.0.0.1",
        "--kubeconfig=/var/lib/kube-proxy/kubeconfig",
        "--cluster-cidr=10.64.0.0/14",
        "--oom-score-adj=-998",
        "--v=2",
        "--iptables-sync-period=1m",
        "--iptables-min-sync-period=10s",
        "--ipvs-sync-period=1m",
        "--ipvs-min-sync-period=10s",
        "--feature-gates=AllAlpha=false",
        "--profiling",
        "--bind-address-hard-fail=true",
        "--show-hidden-metrics-for-version=1.33",
        "--ipvs-scheduler=rr",
        "--ipvs-exclude-cidrs=10.0.0.0/8",
        "--ipvs-strict-arp",
        "--ipvs-tcp-timeout=900s",
        "--ipvs-tcpfin-timeout=120s",
        "--ipvs-udp-timeout=300s",
        "--healthz-port=10256",
        "--metrics-port=10249",
        "--logging-format=json",
        "--vmodule=proxier*=4",
        "--log-flush-frequency=5s",
        "--log-text-split-stream=false",
        "--log-text-info-buffer-size=0",
        "--log-json-split-stream",
        "--log-json-info-buffer-size=64Ki",
        "--logtostderr=false",
        "--alsologtostderr",
        "--log-dir=/var/log",
        "--log-file=/var/log/kube-proxy.log",
        "--log-file-max-size=1800",
        "--skip-headers",
        "--stderrthreshold=2",
        "--init-only=false",
        "--masquerade-all=false",
        "--conntrack-max-per-core=0",
    ];
    let (s, w) = ok(&args);
    assert_eq!(s.sync_period, Duration::from_secs(60));
    assert_eq!(s.min_sync_period, Duration::from_secs(10));
    assert_eq!(s.oom_score_adj, -998);
    assert_eq!(s.log_format, LogFormat::Json);
    assert!(s.bind_address_hard_fail && !s.init_only);
    assert_eq!(s.verbosity, 2);
    for flag in [
        "--profiling",
        "--show-hidden-metrics-for-version",
        "--ipvs-scheduler",
        "--ipvs-exclude-cidrs",
        "--ipvs-strict-arp",
        "--ipvs-tcp-timeout",
        "--ipvs-tcpfin-timeout",
        "--ipvs-udp-timeout",
        "--ipvs-sync-period",
        "--ipvs-min-sync-period",
        "--vmodule",
        "--log-flush-frequency",
        "--log-json-info-buffer-size",
        "--logtostderr",
        "--log-file-max-size",
        "--stderrthreshold",
    ] {
        let n = w
            .iter()
            .filter(|w| w.starts_with(&format!("{flag}:")))
            .count();
        assert_eq!(n, 1, "{flag}: {n} warnings in {w:#?}");
    }
    // Flags with an effect are not reported as ignored.
    for flag in [
        "--oom-score-adj",
        "--iptables-sync-period",
        "--logging-format",
        "--healthz-port",
    ] {
        assert!(!warned(&w, flag), "{flag} has an effect: {w:#?}");
    }
    // A bad value is still an error, as kube-proxy's flag parsing makes it.
    assert!(run(&["--ipvs-tcp-timeout=soon"]).is_err());
    assert!(run(&["--oom-score-adj=-1001"]).is_err());
    assert!(err(&["--logging-format=xml"]).contains("--logging-format"));
}

#[test]
fn mode_specific_sync_period_flags_as_upstream() {
    // Outside ipvs mode the iptables names apply (and win over --sync-period).
    let (s, w) = ok(&[
        "--sync-period=5s",
        "--iptables-sync-period=7s",
        "--ipvs-min-sync-period=3s",
    ]);
    assert_eq!(s.sync_period, Duration::from_secs(7));
    assert_eq!(s.min_sync_period, Duration::from_secs(1));
    assert!(warned(&w, "--ipvs-min-sync-period: ignored"), "{w:?}");
    // In ipvs mode, the ipvs names apply.
    let (s, w) = ok(&[
        "--proxy-mode=ipvs",
        "--iptables-sync-period=7s",
        "--ipvs-sync-period=9s",
    ]);
    assert_eq!(s.sync_period, Duration::from_secs(9));
    assert!(warned(&w, "--iptables-sync-period: ignored"), "{w:?}");
    assert!(err(&["--iptables-sync-period=0s"]).contains("greater than 0"));
}

#[test]
fn deprecated_port_flags_as_upstream() {
    // 0 disables the server.
    let (s, _) = ok(&["--healthz-port=0", "--metrics-port=0"]);
    assert_eq!((s.healthz_bind, s.metrics_bind), (None, None));
    // Another port only fills in an address given without one.
    let (s, _) = ok(&["--healthz-port=1234", "--metrics-port=4321"]);
    assert_eq!(s.healthz_bind, Some("0.0.0.0:10256".parse().unwrap()));
    assert_eq!(s.metrics_bind, Some("127.0.0.1:10249".parse().unwrap()));
    let (s, _) = ok(&["--healthz-bind-address=10.0.0.5", "--healthz-port=1234"]);
    assert_eq!(s.healthz_bind, Some("10.0.0.5:1234".parse().unwrap()));
}

#[test]
fn oom_score_logging_and_hard_fail_from_the_file() {
    let f = write_config(&format!(
        "{HEAD}oomScoreAdj: -500\nbindAddressHardFail: true\nlogging:\n  format: json\n"
    ));
    let (s, w) = ok(&[&config_arg(&f)]);
    assert_eq!(s.oom_score_adj, -500);
    assert!(s.bind_address_hard_fail);
    assert_eq!(s.log_format, LogFormat::Json);
    assert!(
        !warned(&w, "oomScoreAdj") && !warned(&w, "logging.format"),
        "{w:?}"
    );
    // The logging flags win over the file (upstream copies them over it).
    let (s, _) = ok(&[&config_arg(&f), "--logging-format=text"]);
    assert_eq!(s.log_format, LogFormat::Text);
    // Defaults: kube-proxy's OOM score, text logs, soft bind failures.
    let (s, _) = ok(&[]);
    assert_eq!((s.oom_score_adj, s.log_format), (-999, LogFormat::Text));
    assert!(!s.bind_address_hard_fail);
    let f = write_config(&format!("{HEAD}oomScoreAdj: 2000\n"));
    assert!(err(&[&config_arg(&f)]).contains("oomScoreAdj: 2000"));
}

/// `--write-config-to` writes a file that, loaded with `--config`, resolves to the
/// same settings as the flags it came from.
#[test]
fn the_effective_config_round_trips_through_the_file_format() {
    let cases: &[&[&str]] = &[
        &[],
        &["--proxy-mode=iptables"],
        &[
            "--proxy-mode=iptables",
            "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56",
            "--nodeport-addresses=10.0.0.0/8,fd00::/8",
            "--masquerade-all",
            "--iptables-masquerade-bit=5",
            "--iptables-localhost-nodeports=false",
            "--sync-period=45s",
            "--min-sync-period=2s",
            "--config-sync-period=20m",
            "--kubeconfig=/etc/kubeconfig",
            "--kube-api-qps=50",
            "--kube-api-burst=100",
            "--kube-api-content-type=application/json",
            "--detect-local-mode=InterfaceNamePrefix",
            "--pod-interface-name-prefix=veth",
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0s",
            "--conntrack-tcp-be-liberal",
            "--conntrack-udp-timeout=30s",
            "--conntrack-udp-timeout-stream=2m",
            "--bind-address=10.0.0.7",
            "--healthz-bind-address=10.0.0.7:10256",
            "--metrics-bind-address=0.0.0.0:9999",
            "--oom-score-adj=-10",
            "--bind-address-hard-fail",
            "--logging-format=json",
            "--hostname-override=Node-B",
            "-v=4",
        ],
        &[
            "--nodeport-addresses=primary",
            "--detect-local-mode=NodeCIDR",
        ],
        &[
            "--detect-local-mode=BridgeInterface",
            "--pod-bridge-interface=cbr0",
        ],
    ];
    for args in cases {
        let (want, _) = ok(args);
        let yaml = effective::to_yaml(&want).unwrap();
        let f = write_config(&yaml);
        let (mut got, w) = ok(&[&config_arg(&f)]);
        assert!(
            !w.iter()
                .any(|w| w.contains("unknown") || w.contains("ignored")),
            "{args:?}: {w:#?}\n{yaml}"
        );
        got.config_file = None;
        // The same warnings, naming the file's fields rather than the flags (the
        // effective config names its mode: no unset mode's warning).
        let unset = |w: &[String]| {
            w.iter()
                .filter(|w| !w.contains("no proxy mode set"))
                .count()
        };
        assert_eq!(unset(&got.rule_warnings), unset(&want.rule_warnings));
        got.rule_warnings = want.rule_warnings.clone();
        got.mode_defaulted = want.mode_defaulted;
        assert_eq!(got, want, "{args:?}:\n{yaml}");
    }
    // /configz serves the same object under its API group.
    let (s, _) = ok(&["--proxy-mode=iptables"]);
    let z = effective::configz_json(&s);
    assert_eq!(z["kubeproxy.config.k8s.io"]["mode"], "iptables");
    assert_eq!(
        z["kubeproxy.config.k8s.io"]["kind"],
        "KubeProxyConfiguration"
    );
}

#[test]
fn userspace_mode_takes_its_flags_and_other_modes_warn_about_them() {
    use svcproxy_dataplane::userspace::{Scheduler, UserspaceConfig};
    let (s, w) = ok(&[
        "--proxy-mode=userspace",
        "--proxy-port-range=40000+99",
        "--udp-timeout=2s",
        "--userspace-scheduler=lc",
        "--userspace-connect-timeout=300ms",
        "--userspace-drain-timeout=30s",
    ]);
    assert_eq!(s.proxy_mode.mode, "userspace");
    let u = s.mode_options.userspace.clone();
    assert_eq!(u.port_range, Some((40000, 40099)));
    assert_eq!(u.udp_timeout, Duration::from_secs(2));
    assert_eq!(u.scheduler, Scheduler::LeastConnections);
    assert_eq!(u.connect_timeout, Duration::from_millis(300));
    assert_eq!(u.drain_timeout, Duration::from_secs(30));
    // NodePorts on every local address, as the userspace proxy listened.
    assert_eq!(s.plan.nodeport_addresses, NodePortAddresses::AllLocal);
    assert!(w.is_empty(), "{w:?}");
    // Defaults: kube-proxy's 250ms UDP timeout, round-robin, 1s, keep.
    let (d, _) = ok(&["--proxy-mode=userspace"]);
    assert_eq!(d.mode_options.userspace.clone(), UserspaceConfig::default());
    // In another mode: one warning per flag given.
    let (_, w) = ok(&[
        "--proxy-mode=nftables",
        "--proxy-port-range=40000-40010",
        "--userspace-scheduler=lc",
    ]);
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w.iter()
            .all(|w| w.contains("ignored in nftables mode (userspace mode only)")),
        "{w:?}"
    );
    for bad in [
        "--udp-timeout=0s",
        "--userspace-connect-timeout=0s",
        "--proxy-port-range=40010-40000",
        "--userspace-scheduler=wrr",
    ] {
        err(&["--proxy-mode=userspace", bad]);
    }
}

#[test]
fn localhost_nodeports_by_mode_and_flag() {
    let served = |args: &[&str]| ok(args).0.plan.localhost_nodeports;
    // Upstream's defaults: iptables (and the userspace mode) on, nftables never.
    assert!(served(&["--proxy-mode=iptables"]));
    assert!(served(&["--proxy-mode=userspace"]));
    assert!(!served(&["--proxy-mode=nftables"]));
    assert!(!served(&[
        "--proxy-mode=nftables",
        "--iptables-localhost-nodeports=true"
    ]));
    // The unset mode is iptables.
    assert!(served(&[]));
    // --nodeport-localhost wins in every mode.
    assert!(served(&["--nodeport-localhost"]));
    assert!(served(&["--nodeport-localhost=true"]));
    assert!(!served(&[
        "--proxy-mode=iptables",
        "--nodeport-localhost=false"
    ]));
    assert!(!served(&[
        "--proxy-mode=userspace",
        "--nodeport-localhost=false"
    ]));
    assert!(!served(&[
        "--proxy-mode=iptables",
        "--iptables-localhost-nodeports=false"
    ]));
    assert!(served(&[
        "--proxy-mode=iptables",
        "--iptables-localhost-nodeports=false",
        "--nodeport-localhost"
    ]));
    // The effective configuration keeps upstream's own field as it was set.
    let (s, _) = ok(&["--nodeport-localhost"]);
    assert!(s.iptables_localhost_nodeports);
}

#[test]
fn feature_gates_are_checked_as_kube_proxy_checks_them() {
    // Known gates of any component are accepted; GA and deprecated ones warn.
    let (s, w) = ok(&[
        "--feature-gates=InPlacePodVerticalScaling=true,KubeProxyNFTablesLocalhostNodePorts=true,\
         AllowServiceExternalIPs=false",
    ]);
    assert!(!s.feature_gates.service_external_ips());
    assert!(warned(
        &w,
        "--feature-gates: Setting GA feature gate AllowServiceExternalIPs=false"
    ));
    assert_eq!(s.feature_gates.as_set().len(), 3);
    // Unknown and locked gates are refused, every one named.
    let e = err(&["--feature-gates=TopologyAwareHints=true,NFTablesProxyMode=false"]);
    assert!(
        e.contains("--feature-gates: unrecognized feature gate: TopologyAwareHints"),
        "{e}"
    );
    assert!(
        e.contains("cannot set feature gate NFTablesProxyMode to false, feature is locked to true"),
        "{e}"
    );
    assert!(err(&["--feature-gates=KubeProxyIPVS"]).contains("malformed pair"));
    // The file's featureGates, the same way; the flag is then ignored (the file
    // models it).
    let f = write_config(&format!(
        "{HEAD}mode: nftables\nfeatureGates:\n  KubeProxyNFTablesLocalhostNodePorts: true\n"
    ));
    let (s, w) = ok(&[
        &config_arg(&f),
        "--feature-gates=AllowServiceExternalIPs=false",
    ]);
    assert!(s.feature_gates.service_external_ips());
    assert_eq!(s.feature_gates.as_set().len(), 1);
    assert!(warned(
        &w,
        "ignoring --feature-gates because --config is set"
    ));
    let f = write_config(&format!("{HEAD}featureGates:\n  NoSuchGate: true\n"));
    let e = err(&[&config_arg(&f)]);
    assert!(
        e.contains("featureGates: unrecognized feature gate: NoSuchGate"),
        "{e}"
    );
    // The effective configuration carries them.
    let (s, _) = ok(&["--feature-gates=AllowServiceExternalIPs=false"]);
    let yaml = effective::to_yaml(&s).unwrap();
    assert!(yaml.contains("AllowServiceExternalIPs: false"), "{yaml}");
}

#[test]
fn ipvs_is_refused_with_its_gate_off() {
    let (s, _) = ok(&["--proxy-mode=ipvs"]);
    assert_eq!(s.proxy_mode.mode, "ipvs");
    let e = err(&["--proxy-mode=ipvs", "--feature-gates=KubeProxyIPVS=false"]);
    assert!(
        e.contains("proxy mode \"ipvs\" needs the KubeProxyIPVS feature gate, which is off"),
        "{e}"
    );
    let f = write_config(&format!(
        "{HEAD}mode: ipvs\nfeatureGates:\n  KubeProxyIPVS: false\n"
    ));
    assert!(err(&[&config_arg(&f)]).contains("needs the KubeProxyIPVS feature gate"));
    // Other modes do not care.
    ok(&[
        "--proxy-mode=nftables",
        "--feature-gates=KubeProxyIPVS=false",
    ]);
}

#[test]
fn nftables_localhost_nodeports_follow_their_gate_and_the_addresses_named() {
    let served = |args: &[&str]| {
        let mut all = vec!["--proxy-mode=nftables"];
        all.extend_from_slice(args);
        ok(&all).0.plan.localhost_nodeports
    };
    let gate = "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true";
    // Gate off (1.37's default, still selectable): never, whatever the addresses say.
    let off = "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=false";
    assert!(!served(&[off, "--nodeport-addresses=primary,localhost"]));
    // Gate on (1.38's default): when loopback is named.
    assert!(served(&["--nodeport-addresses=primary,localhost"]));
    assert!(served(&[gate, "--nodeport-addresses=primary,localhost"]));
    assert!(served(&[gate, "--nodeport-addresses=127.0.0.1/32"]));
    assert!(served(&[gate, "--nodeport-addresses=::1/128"]));
    assert!(served(&[
        "--feature-gates=AllBeta=true",
        "--nodeport-addresses=localhost"
    ]));
    // Its rejects follow the gate: on by default (every protocol on loopback when
    // loopback is not named), none with 1.37's default.
    let gated = |args: &[&str]| {
        let mut all = vec!["--proxy-mode=nftables"];
        all.extend_from_slice(args);
        ok(&all).0.plan.localhost_gate.is_some()
    };
    assert!(gated(&[]));
    assert!(!gated(&[off]));
    // ... and not otherwise: the default (primary), `all`, a /0, other CIDRs.
    assert!(!served(&[gate]));
    assert!(!served(&[gate, "--nodeport-addresses=all"]));
    assert!(!served(&[gate, "--nodeport-addresses=0.0.0.0/0"]));
    assert!(!served(&[gate, "--nodeport-addresses=10.0.0.0/8"]));
    // --nodeport-localhost still wins.
    assert!(!served(&[
        gate,
        "--nodeport-addresses=localhost",
        "--nodeport-localhost=false"
    ]));
    // Other modes keep their own defaults.
    let (s, _) = ok(&[
        "--proxy-mode=iptables",
        "--iptables-localhost-nodeports=false",
        gate,
        "--nodeport-addresses=localhost",
    ]);
    assert!(!s.plan.localhost_nodeports);
}

#[test]
fn ipvs_reads_the_iptables_section_s_masquerade_settings_as_upstream() {
    let f = write_config(&format!(
        "{HEAD}mode: ipvs\niptables:\n  masqueradeAll: true\n  masqueradeBit: 13\n\
         nftables:\n  masqueradeAll: false\n"
    ));
    let (s, _) = ok(&[&config_arg(&f)]);
    assert!(s.plan.masquerade_all);
    assert_eq!(s.plan.masquerade_bit, 13);
    let f = write_config(&format!(
        "{HEAD}mode: nftables\niptables:\n  masqueradeAll: true\nnftables:\n  masqueradeAll: false\n"
    ));
    let (s, _) = ok(&[&config_arg(&f)]);
    assert!(!s.plan.masquerade_all);
}
