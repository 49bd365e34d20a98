//! kube-proxy's interface on the real binary: a kubeadm DaemonSet's command line with
//! a config file from a newer kube-proxy starts the proxy; kube-up's long flag list
//! is accepted; `--init-only` prepares the node and writes no rule; a changed config
//! file ends the process (the DaemonSet restarts it); `--write-config-to` and
//! `--version`. The runs that touch the kernel do so in a network namespace each.

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
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("add table ip svcproxy"));
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
