//! Compiles the eBPF mode's kernel-side programs (`bpf/*.c`) with clang into
//! `$OUT_DIR`, where `src/ebpf/` embeds them. No compiled object is committed.
//!
//! Without clang the build goes on with empty objects and a warning: every other
//! mode works, and `--proxy-mode ebpf` says at start that its programs are missing
//! (`scripts/install-deps.sh` installs clang, llvm and libbpf's headers).

use std::path::PathBuf;
use std::process::Command;

const PROGRAMS: &[&str] = &["sock", "tc", "xdp", "bench", "evict"];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let clang = std::env::var("SVCPROXY_CLANG").unwrap_or_else(|_| "clang".to_string());
    println!("cargo:rerun-if-env-changed=SVCPROXY_CLANG");
    // asm/types.h lives in the multiarch include directory on Debian.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    // Every source and header under bpf/ (cargo scans a directory whole).
    println!("cargo:rerun-if-changed=bpf");
    for name in PROGRAMS {
        let src = format!("bpf/{name}.c");
        let obj = out.join(format!("{name}.o"));
        let result = Command::new(&clang)
            // The default instruction set: the rr scheduler's fetch-and-add
            // (kernel 5.12+) is a 64-bit atomic it has, and v3's 32-bit
            // subregisters spill over pointers in ways the verifier refuses
            // without CAP_PERFMON (the DaemonSet grants BPF, NET_ADMIN, NET_RAW).
            .args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror"])
            .arg(format!("-I{multiarch}"))
            .args(["-c", &src, "-o"])
            .arg(&obj)
            .output();
        match result {
            Ok(o) if o.status.success() => {}
            Ok(o) => panic!(
                "clang failed on {src}:\n{}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => {
                println!(
                    "cargo:warning=svcproxy: cannot run {clang} ({e}): the ebpf mode is built \
                     without its programs; run scripts/install-deps.sh and build again"
                );
                std::fs::write(&obj, []).expect("write an empty object");
            }
        }
    }
}
