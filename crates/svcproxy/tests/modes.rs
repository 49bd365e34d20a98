//! `--proxy-mode` picks a data plane from the registry: `render` prints the
//! mode's own text for the bundled example, and a mode that is not implemented is
//! refused at start, naming the ones that are.

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
    for args in [&["render"][..], &["render", "--proxy-mode", "nftables"][..]] {
        let out = svcproxy(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.starts_with("add table ip svcproxy"), "{text}");
        assert!(text.contains("table ip6 svcproxy"));
    }
}

#[test]
fn a_mode_that_is_not_implemented_is_refused_naming_the_implemented_ones() {
    let out = svcproxy(&["render", "--proxy-mode", "iptables"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--proxy-mode iptables is not implemented yet; implemented: nftables"),
        "{err}"
    );
}
