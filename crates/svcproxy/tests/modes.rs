//! `--proxy-mode` picks a data plane from the registry: `render` prints the mode's
//! own text for the bundled example. (A mode the configuration accepts but the
//! registry lacks is refused at start naming the implemented ones; today every mode
//! the configuration accepts is implemented.)

use std::path::PathBuf;
use std::process::Command;

fn svcproxy(args: &[&str]) -> std::process::Output {
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster");
    Command::new(env!("CARGO_BIN_EXE_svcproxy"))
        .args(args)
        .arg("--manifests")
        .arg(examples)
        .args(["--hostname-override", "node-a"])
        .output()
        .expect("run svcproxy")
}

#[test]
fn render_in_nftables_mode_prints_the_nft_script() {
    let out = svcproxy(&["render", "--proxy-mode", "nftables"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("add table ip svcproxy"), "{text}");
    assert!(text.contains("table ip6 svcproxy"));
}

/// No mode set means iptables, as kube-proxy 1.37 (KEP-5343), with its warning.
#[test]
fn the_unset_mode_is_iptables_with_a_warning() {
    let out = svcproxy(&["render"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("# iptables-restore --noflush\n"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr.contains("no proxy mode set: running iptables")
            && stderr.contains("will change to nftables"),
        "{stderr}"
    );
    let explicit = svcproxy(&["render", "--proxy-mode", "iptables"]);
    assert_eq!(explicit.stdout, out.stdout);
    assert!(!String::from_utf8_lossy(&explicit.stderr).contains("no proxy mode set"));
}

#[test]
fn render_in_iptables_mode_prints_the_restore_input_of_both_families() {
    let out = svcproxy(&["render", "--proxy-mode", "iptables"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with(
            "# iptables-restore --noflush\n*mangle\n:SVCPROXY-CANARY - [0:0]\nCOMMIT\n*filter\n"
        ),
        "{text}"
    );
    assert!(text.contains("# ip6tables-restore --noflush\n"), "{text}");
    assert!(text.contains("-A SVCPROXY-SERVICES "), "{text}");
    // iptables mode serves NodePorts on every local address by default, as upstream.
    assert!(
        text.contains("-m addrtype --dst-type LOCAL -j SVCPROXY-NODEPORTS"),
        "{text}"
    );
    assert!(!text.contains("KUBE-"), "never kube-proxy's chains");
}
