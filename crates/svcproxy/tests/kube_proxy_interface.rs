//! kube-proxy's interface on the real binary: a kubeadm DaemonSet's command line with
//! a config file from a newer kube-proxy starts the proxy; kube-up's long flag list
//! is accepted; `--init-only` prepares the node and writes no rule; a changed config
//! file ends the process (the DaemonSet restarts it); `--write-config-to` and
//! `--version`; the userspace mode raises its open files limit. The runs that touch
//! the kernel do so in a network namespace each.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use svcproxy_testkit::netns::Netns;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_svcproxy")
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster")
}

/// kubeadm's kube-proxy ConfigMap (`config.conf`, as `kubeadm init` writes it), plus
/// a field no kube-proxy release has yet.
const KUBEADM_CONFIG_FROM_THE_FUTURE: &str = r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: 0
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  verbosity: 0
metricsBindAddress: ""
mode: nftables
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
futureSection:
  someKnob: true
"#;

/// Runs `cmd`, killing it after `timeout`.
fn output(cmd: &mut Command, timeout: Duration) -> std::process::Output {
    svcproxy_testkit::netns::run(cmd, None, timeout).expect("run svcproxy")
}

fn nft_tables(ns: &Netns) -> String {
    ns.run_ok(&["nft", "list", "tables"], None)
        .unwrap_or_default()
}

#[test]
fn a_kubeadm_command_line_with_a_config_from_the_future_starts_the_proxy() {
    let Some(ns) = Netns::create(
        "a_kubeadm_command_line_with_a_config_from_the_future_starts_the_proxy",
        "kubeadm",
        &["nft"],
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.conf");
    std::fs::write(&config, KUBEADM_CONFIG_FROM_THE_FUTURE).unwrap();
    // The kubeadm DaemonSet's arguments, then svcproxy's source (no API server here)
    // and one sync.
    let config_arg = format!("--config={}", config.display());
    let examples = examples();
    let mut cmd = ns.command(&[
        bin(),
        &config_arg,
        "--hostname-override=node-a",
        "--manifests",
        examples.to_str().unwrap(),
        "--once",
    ]);
    let out = output(&mut cmd, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stderr}", out.status);
    assert!(
        stderr.contains("unknown field ignored") && stderr.contains("futureSection"),
        "the unknown field is named in a warning:\n{stderr}"
    );
    assert!(
        nft_tables(&ns).contains("table ip svcproxy"),
        "the proxy programmed the node"
    );
}

#[test]
fn kube_up_flags_are_accepted_by_every_command() {
    // kube-up's (GCE) kube-proxy manifest flags, and deprecated ones.
    let flags = [
        "--v=2",
        "--iptables-sync-period=1m",
        "--iptables-min-sync-period=10s",
        "--ipvs-sync-period=1m",
        "--ipvs-min-sync-period=10s",
        "--feature-gates=AllAlpha=false",
        "--oom-score-adj=-998",
        "--profiling",
        "--logtostderr=false",
        "--log-file=/var/log/kube-proxy.log",
        "--log-file-max-size=1800",
        "--healthz-port=10256",
        "--cluster-cidr=10.64.0.0/14",
        "--hostname-override=node-a",
    ];
    let examples = examples();
    let out = Command::new(bin())
        .arg("render")
        .args(flags)
        .arg("--manifests")
        .arg(&examples)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // No mode among kube-up's flags: iptables, as kube-proxy 1.37 (with a warning).
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("# iptables-restore"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr.contains("no proxy mode set: running iptables"),
        "{stderr}"
    );
    for flag in [
        "--profiling",
        "--logtostderr",
        "--log-file",
        "--ipvs-sync-period",
    ] {
        assert!(
            stderr.contains(&format!("{flag}: ")),
            "{flag} warned about:\n{stderr}"
        );
    }
}

/// As pflag parses kube-proxy's command line: a repeated flag's last value wins, and
/// repeated list flags add up (a DaemonSet whose args were patched by appending one
/// must start unchanged, not be refused).
#[test]
fn repeated_flags_mean_what_they_mean_to_kube_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("written.yaml");
    let out = Command::new(bin())
        .args([
            "--hostname-override=node-x",
            "--cluster-cidr=10.1.0.0/16",
            "--nodeport-addresses=10.0.0.0/8",
            "--feature-gates=AllowServiceExternalIPs=false",
            "--hostname-override=node-a",
            "--cluster-cidr=10.244.0.0/16",
            "--nodeport-addresses",
            "192.168.0.0/16",
            "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true",
        ])
        .arg(format!("--write-config-to={}", file.display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let yaml = std::fs::read_to_string(&file).unwrap();
    for line in [
        "  AllowServiceExternalIPs: false\n  KubeProxyNFTablesLocalhostNodePorts: true\n",
        "hostnameOverride: node-a",
        "clusterCIDR: 10.244.0.0/16",
        "nodePortAddresses:\n- 10.0.0.0/8\n- 192.168.0.0/16\n",
    ] {
        assert!(yaml.contains(line), "{line:?} in:\n{yaml}");
    }
    // In a subcommand too.
    let out = Command::new(bin())
        .args([
            "render",
            "--hostname-override=x",
            "--hostname-override=node-a",
        ])
        .arg("--manifests")
        .arg(examples())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn version_names_the_kube_proxy_release_it_follows() {
    let out = Command::new(bin()).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.starts_with("svcproxy ") && text.contains("kube-proxy v1."),
        "{text}"
    );
    let out = Command::new(bin()).arg("--version=raw").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("kubeProxyCompatibility: v1."));
}

#[test]
fn write_config_to_writes_a_config_that_loads_without_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("written.yaml");
    let out = Command::new(bin())
        .args([
            "--proxy-mode=iptables",
            "--cluster-cidr=10.244.0.0/16",
            "--hostname-override=node-a",
            "--masquerade-all",
        ])
        .arg(format!("--write-config-to={}", file.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(bin())
        .arg("render")
        .arg(format!("--config={}", file.display()))
        .arg("--manifests")
        .arg(examples())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("WARN"), "{stderr}");
    let rules = String::from_utf8_lossy(&out.stdout);
    assert!(
        rules.starts_with("# iptables-restore"),
        "iptables mode came back"
    );
}

#[test]
fn init_only_prepares_the_node_and_writes_no_rule() {
    let Some(ns) = Netns::create(
        "init_only_prepares_the_node_and_writes_no_rule",
        "initonly",
        &["nft", "iptables-save"],
    ) else {
        return;
    };
    let sysctl = |name: &str| {
        ns.run_ok(
            &["cat", &format!("/proc/sys/{}", name.replace('.', "/"))],
            None,
        )
        .unwrap_or_default()
        .trim()
        .to_string()
    };
    assert_eq!(sysctl("net.ipv4.conf.all.route_localnet"), "0");
    let examples = examples();
    let mut cmd = ns.command(&[
        bin(),
        "--init-only",
        "--proxy-mode=iptables",
        "--hostname-override=node-a",
        "--manifests",
        examples.to_str().unwrap(),
    ]);
    let out = output(&mut cmd, Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // iptables mode's localhost NodePorts need route_localnet: set by --init-only.
    assert_eq!(sysctl("net.ipv4.conf.all.route_localnet"), "1", "{stderr}");
    let saved = ns.run_ok(&["iptables-save"], None).unwrap_or_default();
    assert!(!saved.contains("SVCPROXY"), "no rule written:\n{saved}");
    assert!(!nft_tables(&ns).contains("svcproxy"));
}

/// A ConfigMap volume: `config.conf -> ..data/config.conf`, `..data -> ..<version>`,
/// updated by swapping the `..data` link (as the kubelet does).
fn configmap_volume(dir: &Path, version: &str, text: &str) {
    let versioned = dir.join(format!("..{version}"));
    std::fs::create_dir_all(&versioned).unwrap();
    std::fs::write(versioned.join("config.conf"), text).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("..{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    let link = dir.join("config.conf");
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink("..data/config.conf", &link).unwrap();
    }
}

#[test]
fn a_changed_config_file_ends_the_proxy_so_that_it_restarts_with_it() {
    let Some(ns) = Netns::create(
        "a_changed_config_file_ends_the_proxy_so_that_it_restarts_with_it",
        "cfgchange",
        &["nft"],
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
    configmap_volume(
        dir.path(),
        "v1",
        &format!("{head}mode: nftables\noomScoreAdj: 500\n"),
    );
    let config_arg = format!("--config={}", dir.path().join("config.conf").display());
    let examples = examples();
    let mut child = ns
        .command(&[
            bin(),
            &config_arg,
            "--hostname-override=node-a",
            "--manifests",
            examples.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let wait_for = |what: &str, deadline: Duration, ok: &mut dyn FnMut() -> bool| {
        let start = Instant::now();
        while !ok() {
            assert!(start.elapsed() < deadline, "{what} within {deadline:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_for("the first sync", Duration::from_secs(30), &mut || {
        nft_tables(&ns).contains("svcproxy")
    });
    // The file's oomScoreAdj (raising it needs no privilege).
    let oom = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", child.id())).unwrap();
    assert_eq!(oom.trim(), "500");
    // Still running a while later: an unchanged file is not a change.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "exited without a change"
    );

    configmap_volume(
        dir.path(),
        "v2",
        &format!("{head}mode: nftables\nclusterCIDR: 10.0.0.0/8\n"),
    );
    let mut status = None;
    wait_for(
        "the exit after the change",
        Duration::from_secs(10),
        &mut || {
            status = child.try_wait().unwrap();
            status.is_some()
        },
    );
    let mut stderr = String::new();
    use std::io::Read as _;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(!status.unwrap().success(), "{stderr}");
    assert!(
        stderr.contains("config file") && stderr.contains("changed"),
        "{stderr}"
    );
    // The rules stay for the successor.
    assert!(nft_tables(&ns).contains("svcproxy"));
}

/// kube-proxy's iptables-mode rules for one family: its chains in `nat` and `filter`
/// with the jumps into them, beside another component's chain that uses
/// `KUBE-MARK-MASQ` and a built-in rule that is not kube-proxy's.
fn kube_proxy_iptables(cluster_ip: &str, masq_src: &str) -> String {
    format!(
        r#"*nat
:CNI-HOSTPORT-SETMARK - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-ABCDEFGHIJKLMNOP - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-ABCDEFGHIJKLMNOP - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -s {masq_src} -m comment --comment "not kube-proxy: -j KUBE-SERVICES" -j MASQUERADE
-A CNI-HOSTPORT-SETMARK -m comment --comment "CNI portfwd masquerade mark" -j KUBE-MARK-MASQ
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MASQUERADE --random-fully
-A KUBE-SEP-ABCDEFGHIJKLMNOP -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination {cluster_ip}
-A KUBE-SERVICES -d {cluster_ip} -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-ABCDEFGHIJKLMNOP
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-ABCDEFGHIJKLMNOP -m comment --comment "default/web:http -> endpoint" -j KUBE-SEP-ABCDEFGHIJKLMNOP
COMMIT
*filter
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SERVICES - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-FIREWALL -m comment --comment "kubelet rule" -j RETURN
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
COMMIT
"#
    )
}

/// Every kube-proxy chain name the rules above use, and the ones they must keep.
const KUBE_PROXY_CHAINS: &[&str] = &[
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-SEP-",
    "KUBE-SERVICES",
    "KUBE-SVC-",
    "KUBE-FORWARD",
    "KUBE-PROXY-FIREWALL",
];

#[test]
fn cleanup_kube_proxy_removes_kube_proxys_leftovers_and_nothing_else() {
    let Some(ns) = Netns::create(
        "cleanup_kube_proxy_removes_kube_proxys_leftovers_and_nothing_else",
        "kpcleanup",
        &[
            "nft",
            "iptables-restore",
            "ip6tables-restore",
            "iptables-legacy-restore",
        ],
    ) else {
        return;
    };
    // kube-proxy's leftovers: iptables (both families, default backend; IPv4 also in
    // the legacy one), its nftables tables, ipvs mode's kube-ipvs0. Beside them:
    // another table and svcproxy's own (from a --once run below).
    let v4 = kube_proxy_iptables("10.96.0.10", "10.0.0.0/8");
    let v6 = kube_proxy_iptables("fd00::10", "fd00::/8");
    ns.run_ok(&["iptables-restore", "--noflush"], Some(&v4))
        .unwrap();
    ns.run_ok(&["ip6tables-restore", "--noflush"], Some(&v6))
        .unwrap();
    ns.run_ok(&["iptables-legacy-restore", "--noflush"], Some(&v4))
        .unwrap();
    let nft = "table ip kube-proxy {\n chain services {\n  type nat hook prerouting priority dstnat;\n }\n}\n\
               table ip6 kube-proxy {\n chain services {\n  type nat hook prerouting priority dstnat;\n }\n}\n\
               table inet other {\n chain c {\n }\n}\n";
    ns.run_ok(&["nft", "-f", "-"], Some(nft)).unwrap();
    ns.run_ok(
        &[
            "ip",
            "link",
            "add",
            "kube-ipvs0",
            "type",
            "veth",
            "peer",
            "name",
            "kpx-peer",
        ],
        None,
    )
    .unwrap();

    // svcproxy warns at start while they are there (not with --service-proxy-name).
    let examples = examples();
    let once = |extra: &[&str]| {
        let mut argv = vec![
            bin(),
            "--hostname-override=node-a",
            "--proxy-mode=nftables",
            "--manifests",
            examples.to_str().unwrap(),
            "--once",
        ];
        argv.extend_from_slice(extra);
        let out = output(&mut ns.command(&argv), Duration::from_secs(60));
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        stderr
    };
    let stderr = once(&[]);
    assert!(
        stderr.contains("kube-proxy's rules are installed")
            && stderr.contains("cleanup --kube-proxy"),
        "{stderr}"
    );
    assert!(!once(&["--service-proxy-name=svcproxy"]).contains("kube-proxy's rules"));

    // Refused while a process named kube-proxy runs.
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("kube-proxy");
    std::fs::copy("/bin/sleep", &fake).unwrap();
    let mut kube_proxy = Command::new(&fake)
        .arg("30")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let out = output(
        &mut ns.command(&[bin(), "cleanup", "--kube-proxy"]),
        Duration::from_secs(60),
    );
    let _ = kube_proxy.kill();
    let _ = kube_proxy.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("kube-proxy is running"),
        "{stderr}"
    );
    assert!(
        nft_tables(&ns).contains("table ip kube-proxy"),
        "nothing removed"
    );

    let out = output(
        &mut ns.command(&[bin(), "cleanup", "--kube-proxy"]),
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("kept kube-proxy chains") && stderr.contains("KUBE-MARK-MASQ"),
        "{stderr}"
    );

    for save in ["iptables-save", "ip6tables-save", "iptables-legacy-save"] {
        let rules = ns.run_ok(&[save], None).unwrap();
        for chain in KUBE_PROXY_CHAINS {
            let left = rules.lines().any(|l| {
                l.starts_with(&format!(":{chain}"))
                    || l.starts_with(&format!("-A {chain}"))
                    || l.ends_with(&format!("-j {chain}"))
            });
            assert!(!left, "{save} still has {chain}:\n{rules}");
        }
        // Not kube-proxy's, or still used by another chain: kept, with their rules.
        for kept in [
            "-A CNI-HOSTPORT-SETMARK -m comment --comment \"CNI portfwd masquerade mark\" -j KUBE-MARK-MASQ",
            "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
            "-A INPUT -j KUBE-FIREWALL",
            "-A KUBE-FIREWALL -m comment --comment \"kubelet rule\" -j RETURN",
            "--comment \"not kube-proxy: -j KUBE-SERVICES\" -j MASQUERADE",
        ] {
            assert!(rules.contains(kept), "{save} lost {kept:?}:\n{rules}");
        }
    }
    let tables = nft_tables(&ns);
    assert!(!tables.contains("kube-proxy"), "{tables}");
    assert!(
        tables.contains("table inet other") && tables.contains("table ip svcproxy"),
        "other tables survive:\n{tables}"
    );
    let links = ns.run_ok(&["ip", "-o", "link"], None).unwrap();
    assert!(!links.contains("kube-ipvs0"), "{links}");

    // A second run finds nothing left to do.
    let out = output(
        &mut ns.command(&[bin(), "cleanup", "--kube-proxy"]),
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("removed kube-proxy"), "{stderr}");
}

/// The userspace mode raises its soft open files limit to the hard one (each relayed
/// connection holds up to six descriptors), as Go does for every program, kube-proxy
/// included: started with 1024 of 4096, it runs with 4096.
#[test]
fn the_userspace_mode_raises_its_open_files_limit() {
    let Some(ns) = Netns::create(
        "the_userspace_mode_raises_its_open_files_limit",
        "nofile",
        &["nft", "prlimit"],
    ) else {
        return;
    };
    let examples = examples();
    let mut cmd = ns.command(&[
        "prlimit",
        "--nofile=1024:4096",
        bin(),
        "--proxy-mode=userspace",
        "--hostname-override=node-a",
        "--manifests",
        examples.to_str().unwrap(),
        "--once",
    ]);
    let out = output(&mut cmd, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stderr}", out.status);
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("open files limit raised") && l.contains("Some(4096)")),
        "the limit is raised to the hard one:\n{stderr}"
    );
}

/// Without the privilege to program the kernel, svcproxy says so once and says what
/// it needs (run as an unprivileged user inside a namespace of the test's own, so
/// nothing could be written anywhere even if it tried).
#[test]
fn without_privileges_the_error_says_what_is_needed_once() {
    let test = "without_privileges_the_error_says_what_is_needed_once";
    let Some(ns) = Netns::create(test, "noperm", &["nft", "setpriv"]) else {
        return;
    };
    let examples = examples();
    let out = output(
        &mut ns.command(&[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            bin(),
            "--proxy-mode=nftables",
            "--once",
            "--hostname-override=node-a",
            "--healthz-bind-address=",
            "--metrics-bind-address=",
            "--manifests",
            examples.to_str().unwrap(),
        ]),
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr
            .matches("run it as root, or with the capabilities")
            .count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("NET_ADMIN"), "{stderr}");
    assert_eq!(
        stderr.matches("Operation not permitted").count(),
        1,
        "the kernel's refusal, once: {stderr}"
    );
}

/// Bad values are refused in the words of the flag, file or manifest they came from:
/// no Rust type names or range syntax, the value quoted once, the cause said once.
/// `snapshot` touches no kernel, so these run anywhere.
#[test]
fn errors_speak_the_users_words_and_quote_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
         clientConnection:\n  qps: fast\n",
    )
    .unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(
        manifests.join("svc.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: default}\n\
         spec:\n  clusterIP: 10.96.0.10\n  ports: [{port: http, protocol: TCP}]\n",
    )
    .unwrap();
    let missing = dir.path().join("no-such-kubeconfig");
    // A kubeconfig naming a CA file that is not there: kube's error repeats its
    // cause and quotes the path twice; svcproxy says it once.
    let no_ca = dir.path().join("no-ca-kubeconfig");
    std::fs::write(
        &no_ca,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    \
         server: https://127.0.0.1:1\n    certificate-authority: no-such-ca.crt\nusers:\n\
         - name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    \
         cluster: c\n    user: u\ncurrent-context: x\n",
    )
    .unwrap();
    let no_ca_arg = format!("--kubeconfig={}", no_ca.display());
    let config_arg = format!("--config={}", config.display());
    let manifests_arg = format!("--manifests={}", manifests.display());
    let kubeconfig_arg = format!("--kubeconfig={}", missing.display());
    let cases: &[(&[&str], &str)] = &[
        (&["--conntrack-min=many"], "not a whole number"),
        (&["--iptables-masquerade-bit=40"], "must be from 0 to 31"),
        (&["--oom-score-adj=5000"], "must be from -1000 to 1000"),
        (&["--kube-api-qps=fast"], "not a number"),
        (
            &[&config_arg],
            "clientConnection.qps: invalid type: string \"fast\", expected a number",
        ),
        (
            &[&manifests_arg],
            "spec.ports[0].port: invalid type: string \"http\", expected a whole number",
        ),
        (&[&kubeconfig_arg], "No such file or directory"),
        (&[&no_ca_arg], "no-such-ca.crt': No such file or directory"),
    ];
    for (args, expected) in cases {
        let mut cmd = Command::new(bin());
        cmd.arg("snapshot")
            .arg("--hostname-override=node-a")
            .args(*args)
            .env("NO_COLOR", "1");
        let out = output(&mut cmd, Duration::from_secs(30));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains(expected),
            "{args:?}: want {expected:?} in\n{text}"
        );
        for rustism in [
            "i32",
            "u32",
            "u8",
            "f32",
            "0..=",
            "invalid digit",
            "float literal",
            "'\"",
            "`",
        ] {
            assert!(!text.contains(rustism), "{args:?}: {rustism:?} in\n{text}");
        }
        if args[0].starts_with("--kubeconfig") {
            assert_eq!(text.matches("No such file").count(), 1, "{text}");
        }
        if args[0] == kubeconfig_arg {
            assert_eq!(text.matches("no-such-kubeconfig").count(), 1, "{text}");
        }
    }
}

/// A kubeconfig's relative paths (its CA certificate here) are read relative to the
/// kubeconfig's own directory, as client-go reads them, whatever directory
/// svcproxy runs in.
#[test]
fn a_kubeconfig_s_relative_paths_are_its_directory_s() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.crt"), "not a certificate\n").unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    \
         server: https://127.0.0.1:1\n    certificate-authority: ca.crt\nusers:\n- name: u\n  \
         user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
         current-context: x\n",
    )
    .unwrap();
    let log = dir.path().join("stderr");
    let mut child = Command::new(bin())
        .current_dir("/")
        .args(["snapshot", "--hostname-override=node-a"])
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // Long enough to load the kubeconfig and try the (absent) server.
    std::thread::sleep(Duration::from_secs(2));
    let _ = child.kill();
    let _ = child.wait();
    let stderr = std::fs::read_to_string(&log).unwrap();
    // The certificate file was found, not looked for in /.
    assert!(!stderr.contains("No such file"), "{stderr}");
    assert!(!stderr.contains("kubeconfig"), "{stderr}");
}
