//! The programs, by name, and their objects (compiled by build.rs); the checks
//! before anything is loaded ([`preflight`]: the programs built, the kernel, the
//! cgroup, the bpffs, then every program loaded once for the verifier); and the
//! programs loaded with their maps opened or created under the pin directory at
//! the flags' sizes ([`load_programs`]).

use std::path::Path;

use aya::programs::{CgroupSockAddrAttachType, SchedClassifier, TcAttachType, Xdp};
use aya::{Ebpf, EbpfLoader};

use super::host::{
    cgroup2_root, kernel_release, kernel_version, netns_cookie, on_bpffs, BPFFS_HOME,
    CGROUP2_SUPER_MAGIC,
};
use super::kernel_err;
use super::maps::{pinned_owner, MAPS};
use crate::ebpf::{EbpfOptions, XdpMode};
use crate::error::DataPlaneError;

/// The socket programs, as `bpf/sock.c` names them, with their attach points.
pub(super) const PROGRAMS: [(&str, CgroupSockAddrAttachType); 8] = [
    ("svcproxy_connect4", CgroupSockAddrAttachType::Connect4),
    ("svcproxy_connect6", CgroupSockAddrAttachType::Connect6),
    ("svcproxy_sendmsg4", CgroupSockAddrAttachType::UDPSendMsg4),
    ("svcproxy_sendmsg6", CgroupSockAddrAttachType::UDPSendMsg6),
    ("svcproxy_recvmsg4", CgroupSockAddrAttachType::UDPRecvMsg4),
    ("svcproxy_recvmsg6", CgroupSockAddrAttachType::UDPRecvMsg6),
    (
        "svcproxy_getpeername4",
        CgroupSockAddrAttachType::GetPeerName4,
    ),
    (
        "svcproxy_getpeername6",
        CgroupSockAddrAttachType::GetPeerName6,
    ),
];

/// The socket program that gives back a released socket's connection count
/// (`cgroup/sock_release`, the lc scheduler's).
pub(super) const RELEASE_PROGRAM: &str = "svcproxy_release";

/// Every socket program's name, each pinned as `link-NAME`.
pub(super) fn socket_programs() -> impl Iterator<Item = &'static str> {
    PROGRAMS
        .iter()
        .map(|(n, _)| *n)
        .chain(std::iter::once(RELEASE_PROGRAM))
}

/// The packet programs, as `bpf/tc.c` names them, with their attach points and
/// the suffix of their links' pins.
pub(super) const TC_PROGRAMS: [(&str, TcAttachType, &str); 2] = [
    ("svcproxy_tc_ingress", TcAttachType::Ingress, "ingress"),
    ("svcproxy_tc_egress", TcAttachType::Egress, "egress"),
];

/// The XDP fast path's program (`--ebpf-xdp=native`), in `bpf/xdp.c`.
pub(super) const XDP_PROGRAM: &str = "svcproxy_xdp";

/// The socket programs, compiled by build.rs (empty when clang was missing).
pub(super) static SOCK_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sock.o"));
/// The packet programs, likewise.
pub(super) static TC_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tc.o"));
/// The XDP program, likewise (its maps are the packet programs', by their pins).
static XDP_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/xdp.o"));

/// What the mode needs before anything is loaded: the programs built, a kernel
/// with tcx (6.6+: the packet programs' links), `cgroup` a cgroup v2
/// directory, and `pin_dir`'s parent on a bpffs, one mounted at `/sys/fs/bpf`
/// when the default place has none. Each failure names what is missing.
pub fn preflight(cgroup: &Path, pin_dir: &Path) -> Result<(), DataPlaneError> {
    if SOCK_OBJECT.is_empty() || TC_OBJECT.is_empty() {
        return Err(kernel_err(
            "the ebpf mode's programs",
            "svcproxy was built without clang; run scripts/install-deps.sh and build again",
        ));
    }
    let release = kernel_release();
    if kernel_version(&release).is_some_and(|v| v < (6, 6)) {
        return Err(kernel_err(
            format!("kernel {release}"),
            "the ebpf mode needs tcx links for its packet programs (Linux 6.6 or later)",
        ));
    }
    match rustix::fs::statfs(cgroup) {
        Ok(s) if s.f_type as u64 == CGROUP2_SUPER_MAGIC => {}
        Ok(_) => {
            let hint = cgroup2_root().map_or_else(
                || "no cgroup v2 hierarchy is mounted".to_string(),
                |r| format!("the cgroup v2 hierarchy is mounted at {}", r.display()),
            );
            return Err(kernel_err(
                format!("--ebpf-cgroup {}", cgroup.display()),
                format!("not a cgroup v2 directory ({hint})"),
            ));
        }
        Err(e) => {
            return Err(kernel_err(format!("--ebpf-cgroup {}", cgroup.display()), e));
        }
    }
    if let Some(owner) = pinned_owner(pin_dir) {
        if owner != netns_cookie()? {
            return Err(kernel_err(
                format!("--ebpf-bpffs {}", pin_dir.display()),
                "it holds the pins of svcproxy in another network namespace; give this one \
                 its own directory",
            ));
        }
    }
    let parent = pin_dir.parent().unwrap_or(pin_dir);
    if !on_bpffs(parent) {
        if parent == Path::new(BPFFS_HOME) {
            rustix::mount::mount(
                "bpf",
                parent,
                "bpf",
                rustix::mount::MountFlags::empty(),
                None,
            )
            .map_err(|e| kernel_err(format!("mounting a bpffs at {BPFFS_HOME}"), e))?;
            tracing::info!(dir = BPFFS_HOME, "no bpffs was mounted: mounted one");
        } else {
            return Err(kernel_err(
                format!("--ebpf-bpffs {}", pin_dir.display()),
                format!(
                    "{} is not on a bpffs: --ebpf-bpffs names a bpffs (svcproxy then pins \
                     into its own svcproxy/ inside it) or a directory inside one, such as \
                     /sys/fs/bpf/svcproxy; mount one (mount -t bpf bpf DIR) or point \
                     --ebpf-bpffs into one",
                    parent.display()
                ),
            ));
        }
    }
    probe_programs(parent)
}

/// Loads every program once (the kernel verifies it) with small maps pinned in a
/// scratch directory beside the pin directory, then lets everything go: a kernel
/// that refuses one (a helper or hook it lacks) is named now, not at every sync.
fn probe_programs(bpffs: &Path) -> Result<(), DataPlaneError> {
    // (A bpffs takes no dot in a name.)
    let scratch = bpffs.join(format!("svcproxy-probe-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)
        .map_err(|e| kernel_err(format!("creating {}", scratch.display()), e))?;
    let result = (|| {
        for object in [SOCK_OBJECT, TC_OBJECT] {
            let mut loader = EbpfLoader::new();
            loader.default_map_pin_directory(&scratch);
            // Small maps: the probe costs no memory worth naming (socket storage
            // takes no size).
            for name in MAPS
                .iter()
                .filter(|m| **m != "svcproxy_peer" && **m != "svcproxy_cfg")
            {
                loader.map_max_entries(name, 64);
            }
            let mut ebpf = loader
                .load(object)
                .map_err(|e| kernel_err("the kernel refuses the ebpf mode's maps", e))?;
            let names: Vec<String> = ebpf.programs().map(|(n, _)| n.to_string()).collect();
            for name in names {
                let program = ebpf
                    .program_mut(&name)
                    .ok_or_else(|| kernel_err(name.as_str(), "missing from the object"))?;
                let loaded = match program {
                    aya::programs::Program::CgroupSockAddr(p) => p.load(),
                    aya::programs::Program::CgroupSock(p) => p.load(),
                    aya::programs::Program::SchedClassifier(p) => p.load(),
                    _ => continue,
                };
                loaded.map_err(|e| {
                    kernel_err(
                        format!("the kernel refuses the ebpf mode's program {name}"),
                        verifier(e),
                    )
                })?;
            }
        }
        Ok(())
    })();
    if let Ok(dir) = std::fs::read_dir(&scratch) {
        for e in dir.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let _ = std::fs::remove_dir(&scratch);
    result
}

/// The socket programs and the packet programs (the XDP program too with
/// `--ebpf-xdp=native`) loaded, their maps opened or created under the pin
/// directory at the flags' sizes.
pub(super) fn load_programs(
    opts: &EbpfOptions,
) -> Result<(Ebpf, Ebpf, Option<Ebpf>), DataPlaneError> {
    let pin_dir = &opts.pin_dir;
    let loader = || {
        let mut l = EbpfLoader::new();
        l.default_map_pin_directory(pin_dir);
        for (name, size) in opts.sizes.by_map() {
            l.map_max_entries(name, size);
        }
        l
    };
    let ebpf = loader()
        .load(SOCK_OBJECT)
        .map_err(|e| kernel_err("loading the socket programs", e))?;

    // The same pinned maps, and the packet programs.
    let mut tc = loader()
        .load(TC_OBJECT)
        .map_err(|e| kernel_err("loading the packet programs", e))?;
    for (name, _, _) in TC_PROGRAMS {
        let prog: &mut SchedClassifier = program(&mut tc, name)?;
        prog.load()
            .map_err(|e| kernel_err(format!("loading {name}"), verifier(e)))?;
    }
    // The XDP program, its maps the same pinned maps.
    let mut xdp = None;
    if opts.xdp == XdpMode::Native {
        let xdp = xdp.insert(
            loader()
                .load(XDP_OBJECT)
                .map_err(|e| kernel_err("loading the XDP program", e))?,
        );
        let prog: &mut Xdp = program(xdp, XDP_PROGRAM)?;
        prog.load()
            .map_err(|e| kernel_err(format!("loading {XDP_PROGRAM}"), verifier(e)))?;
    }
    Ok((ebpf, tc, xdp))
}

/// Program `name` of `ebpf`, as the type its section says.
pub(super) fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, DataPlaneError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or_else(|| kernel_err(name, "missing from the object"))?
        .try_into()
        .map_err(|e| kernel_err(name, e))
}

/// A program load error with the verifier's log when there is one.
pub(super) fn verifier(e: aya::programs::ProgramError) -> String {
    match e {
        aya::programs::ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            format!("{io_error}\n{verifier_log}")
        }
        other => other.to_string(),
    }
}
