//! The eBPF mode's kernel side: the socket programs loaded and attached to the
//! cgroup, the packet programs to every Ethernet interface of the node (tcx,
//! ingress and egress), the maps and links pinned under svcproxy's bpffs
//! directory, and a [`Table`] written into the maps.
//!
//! **Pins.** Maps are pinned by name in the pin directory, so a restarted
//! svcproxy finds and reuses them (sockets translated before the restart keep
//! their reverse entries). Links are pinned there too (`link-<program>`), so the
//! programs stay attached while no svcproxy runs (`--once`, a restart); a new
//! process attaches its programs beside the old ones, then releases the old links.
//! The packet programs' links are pinned per interface index
//! (`tc-<index>-ingress`, `tc-<index>-egress`); each write attaches them to
//! interfaces that appeared and releases those of interfaces that went. With
//! `--ebpf-xdp=native` the XDP program is attached (in the driver) to every
//! interface that is not a pod's, its link pinned as `xdp-<index>`; an interface
//! whose driver has no native XDP keeps the tc programs alone.
//!
//! **Writes.** An endpoint list is written under a fresh id before any service
//! entry names it, and an old list is deleted only after no entry names it: a
//! socket never sees a half-written list. A full sync writes everything under
//! new ids, then deletes whatever the maps hold that the table does not (what an
//! earlier process left included).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::{Key as LpmKey, LpmTrie};
use aya::maps::{Array, HashMap, IterableMap, MapData};
use aya::programs::links::{FdLink, LinkOrder, PinnedLink};
use aya::programs::tc::TcAttachOptions;
use aya::programs::xdp::XdpLink;
use aya::programs::{
    CgroupAttachMode, CgroupSock, CgroupSockAddr, CgroupSockAddrAttachType, SchedClassifier,
    TcAttachType, Xdp,
};
use aya::{Ebpf, EbpfLoader};
use ipnet::IpNet;

use super::batch;
use super::wire::{
    self, Backend, Config, CtKey, CtVal, FwData, LocalKey, MemberKey, MhKey, MhVal, PodnetData,
    SlotKey, SvcKey, SvcVal,
};
use super::{EbpfOptions, XdpMode};
use svcproxy_core::model::Scheduler;

type HashMap2<K, V> = std::collections::HashMap<K, V>;

fn local_key(ip: &std::net::IpAddr) -> LocalKey {
    LocalKey {
        addr: wire::addr_words(Some(*ip)),
        family: wire::family_byte(svcproxy_core::model::IpFamily::of(ip)),
        pad: [0; 3],
    }
}
use crate::error::DataPlaneError;
use svcproxy_plan::ebpf::{
    maglev, Changes, Dest, EndpointList, Entry, ListName, PacketRoute, PortName, Route, Table,
};

/// The socket programs, as `bpf/sock.c` names them, with their attach points.
const PROGRAMS: [(&str, CgroupSockAddrAttachType); 8] = [
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
const RELEASE_PROGRAM: &str = "svcproxy_release";

/// Every socket program's name, each pinned as `link-NAME`.
fn socket_programs() -> impl Iterator<Item = &'static str> {
    PROGRAMS
        .iter()
        .map(|(n, _)| *n)
        .chain(std::iter::once(RELEASE_PROGRAM))
}

/// The packet programs, as `bpf/tc.c` names them, with their attach points and
/// the suffix of their links' pins.
const TC_PROGRAMS: [(&str, TcAttachType, &str); 2] = [
    ("svcproxy_tc_ingress", TcAttachType::Ingress, "ingress"),
    ("svcproxy_tc_egress", TcAttachType::Egress, "egress"),
];

/// The XDP fast path's program (`--ebpf-xdp=native`), in `bpf/xdp.c`.
const XDP_PROGRAM: &str = "svcproxy_xdp";

/// The maps, by the names pinned.
pub const MAPS: [&str; 26] = [
    "svcproxy_svc",
    "svcproxy_slot",
    "svcproxy_member",
    "svcproxy_local",
    "svcproxy_aff",
    "svcproxy_rev",
    "svcproxy_peer",
    "svcproxy_flow",
    "svcproxy_cfg",
    "svcproxy_fw",
    "svcproxy_podnet",
    "svcproxy_ifc",
    "svcproxy_ct",
    "svcproxy_affip",
    "svcproxy_vip",
    "svcproxy_guard",
    "svcproxy_rr",
    "svcproxy_mh",
    "svcproxy_conns",
    "svcproxy_flows",
    "svcproxy_timeouts",
    "svcproxy_xdp_tx",
    "svcproxy_xdp_stats",
    "svcproxy_xdp_nat",
    "svcproxy_snat",
    "svcproxy_snat_stats",
];

/// Maps an earlier release pinned whose layout changed under a new name: their
/// pins are removed at start and by cleanup (a program still using one keeps it
/// until that program goes).
const RETIRED_MAPS: [&str; 1] = ["svcproxy_xdp_fwd"];

/// The socket programs, compiled by build.rs (empty when clang was missing).
static SOCK_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sock.o"));
/// The packet programs, likewise.
static TC_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tc.o"));
/// The XDP program, likewise (its maps are the packet programs', by their pins).
static XDP_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/xdp.o"));

/// `statfs(2)`'s magic number of a bpffs.
const BPF_FS_MAGIC: u64 = 0xcafe_4a11;

fn kernel_err(what: impl Into<String>, reason: impl std::fmt::Display) -> DataPlaneError {
    DataPlaneError::Kernel {
        what: what.into(),
        reason: reason.to_string(),
    }
}

/// `statfs(2)`'s magic number of a cgroup v2 file system.
const CGROUP2_SUPER_MAGIC: u64 = 0x6367_7270;

/// Where a bpffs is mounted when none is (the kernel's conventional place).
const BPFFS_HOME: &str = "/sys/fs/bpf";

/// The running kernel's release (`uname -r`).
fn kernel_release() -> String {
    rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned()
}

/// The major and minor version of a kernel release such as `6.12.48+deb13-amd64`;
/// None when it does not start with them.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

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
                    "{} is not on a bpffs: mount one (mount -t bpf bpf DIR) or point \
                     --ebpf-bpffs into one",
                    parent.display()
                ),
            ));
        }
    }
    probe_programs(parent)
}

/// Loads the socket programs, attaches them to `cgroup` and pins their links in
/// `pin_dir` (each pin replaced in place).
fn attach_socket_programs(
    ebpf: &mut Ebpf,
    cgroup_dir: &File,
    cgroup: &Path,
    pin_dir: &Path,
) -> Result<(), DataPlaneError> {
    macro_rules! attach {
        ($ty:ty, $name:expr) => {{
            let name = $name;
            let prog: &mut $ty = program(ebpf, name)?;
            prog.load()
                .map_err(|e| kernel_err(format!("loading {name}"), verifier(e)))?;
            let id = prog
                .attach(cgroup_dir, CgroupAttachMode::Single)
                .map_err(|e| kernel_err(format!("attaching {name} to {}", cgroup.display()), e))?;
            let link: FdLink = prog
                .take_link(id)
                .map_err(|e| kernel_err(name, e))?
                .try_into()
                .map_err(|e| kernel_err(name, e))?;
            pin_in_place(link, &pin_dir.join(format!("link-{name}")))?;
        }};
    }
    for (name, _) in PROGRAMS {
        attach!(CgroupSockAddr, name);
    }
    attach!(CgroupSock, RELEASE_PROGRAM);
    Ok(())
}

/// The packet path's idle timeouts, in whole seconds (a part-second rounds up).
fn write_timeouts(tc: &mut Ebpf, t: &super::IdleTimeouts) -> Result<(), DataPlaneError> {
    let secs = |d: Option<std::time::Duration>| {
        d.map_or(0, |d| {
            u32::try_from(d.as_secs() + u64::from(d.subsec_nanos() > 0)).unwrap_or(u32::MAX)
        })
    };
    let mut timeouts: Array<MapData, wire::Timeouts> = take(tc, "svcproxy_timeouts")?;
    timeouts
        .set(
            0,
            wire::Timeouts {
                tcp: secs(t.tcp),
                tcpfin: secs(t.tcp_fin),
                udp: secs(t.udp),
                pad: 0,
            },
            0,
        )
        .map_err(|e| kernel_err("writing svcproxy_timeouts", e))
}

/// The ports svcproxy's own masquerade takes (the XDP fast path's): those
/// above the node's `ip_local_port_range` up to 65535, so that no socket of the
/// node uses them (the fixed rule keeps the kernel's masquerade out of them
/// too). Set without XDP as well, so that a restart with XDP off still turns
/// back the replies of the connections masqueraded before. None, said in the
/// log, when fewer than 1024 are left there: the kernel's conntrack then
/// masquerades every connection, and the XDP program leaves those connections
/// to the stack. With XDP, a kernel too old for the program's source-address
/// lookup is said in the log too. Read once per process.
pub fn snat_ports(xdp: XdpMode) -> Option<(u16, u16)> {
    let range = local_port_range();
    let high = range.as_deref().and_then(range_high);
    if xdp == XdpMode::Native {
        let release = kernel_release();
        if kernel_version(&release).is_some_and(|v| v < (6, 7)) {
            // The program asks the FIB for the source address with
            // BPF_FIB_LOOKUP_SRC (6.7); an older kernel refuses the lookup, and
            // the program then passes the connection to the stack.
            tracing::warn!(
                kernel = %release,
                "the kernel predates BPF_FIB_LOOKUP_SRC (Linux 6.7), unless its vendor \
                 backported it: the XDP fast path then leaves masqueraded connections \
                 (externalTrafficPolicy: Cluster) to the kernel's conntrack"
            );
        }
    }
    match high {
        Some(high) if high <= 65535 - 1024 => Some((high + 1, 65535)),
        _ if xdp != XdpMode::Native => None,
        _ => {
            tracing::warn!(
                ip_local_port_range = range.as_deref().map(str::trim).unwrap_or("unreadable"),
                "no room above the node's ip_local_port_range for svcproxy's own masquerade \
                 (1024 ports wanted below 65536): the XDP fast path leaves masqueraded \
                 connections (externalTrafficPolicy: Cluster) to the kernel's"
            );
            None
        }
    }
}

/// The node's `ip_local_port_range`, as the kernel prints it.
fn local_port_range() -> Option<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()
}

/// The high end of an `ip_local_port_range` ("32768\t60999").
fn range_high(range: &str) -> Option<u16> {
    range.split_whitespace().nth(1)?.parse().ok()
}

/// The node's `ip_local_port_range` now, when it reaches into the masquerade's
/// ports from `lo` on (None when it does not, or cannot be read).
pub fn local_range_overlapping(lo: u16) -> Option<String> {
    local_port_range().filter(|r| overlaps(r, lo))
}

/// `range` (an `ip_local_port_range`) reaches port `lo`.
fn overlaps(range: &str, lo: u16) -> bool {
    range_high(range).is_some_and(|h| h >= lo)
}

fn write_snat(
    tc: &mut Ebpf,
    ports: Option<(u16, u16)>,
    xdp: XdpMode,
) -> Result<(), DataPlaneError> {
    let mut map: Array<MapData, wire::SnatRange> = take(tc, "svcproxy_snat")?;
    let (lo, hi) = ports.unwrap_or((0, 0));
    let flags = if xdp == XdpMode::Native {
        wire::SNAT_XDP
    } else {
        0
    };
    map.set(0, wire::SnatRange { lo, hi, flags }, 0)
        .map_err(|e| kernel_err("writing svcproxy_snat", e))
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

/// Whether `dir` is on a bpffs.
pub fn on_bpffs(dir: &Path) -> bool {
    rustix::fs::statfs(dir).is_ok_and(|s| s.f_type as u64 == BPF_FS_MAGIC)
}

/// The cookie of the calling thread's network namespace (`SO_NETNS_COOKIE`), as
/// the programs' `bpf_get_netns_cookie` reads it for a socket of that namespace.
/// No crate of ours wraps this socket option: one `getsockopt(2)`.
#[allow(unsafe_code)]
fn netns_cookie() -> Result<u64, DataPlaneError> {
    use std::os::fd::AsRawFd;
    const SO_NETNS_COOKIE: libc::c_int = 71;
    let sock = std::net::UdpSocket::bind("127.0.0.1:0")
        .or_else(|_| std::net::UdpSocket::bind("[::1]:0"))
        .map_err(|e| kernel_err("a socket to read the network namespace's cookie", e))?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: a valid socket, and a buffer of the length given.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(kernel_err(
            "getsockopt(SO_NETNS_COOKIE)",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(cookie)
}

/// The maps as last written: each list's id and contents, and each entry's key
/// and encoded value.
#[derive(Default)]
struct Written {
    lists: HashMap2<ListName, (u32, EndpointList)>,
    entries: HashMap2<Dest, (SvcKey, SvcVal)>,
    local: BTreeSet<LocalKey>,
    /// The guard's cluster IPs and ServiceCIDRs.
    vips: BTreeSet<LocalKey>,
    guard: BTreeSet<IpNet>,
    /// Each fenced port's admitted sources, by the port's id.
    firewalls: BTreeMap<u64, (PortName, Vec<IpNet>)>,
    pod_cidrs: BTreeSet<IpNet>,
}

/// Lists' keys and values gathered for batched writes.
#[derive(Default)]
struct ListBatch {
    slots: Vec<SlotKey>,
    backends: Vec<Backend>,
    members: Vec<MemberKey>,
    /// Round-robin lists' turns, from 0.
    turns: Vec<u32>,
    /// Maglev lists' tables.
    mh_keys: Vec<MhKey>,
    mh_vals: Vec<MhVal>,
}

impl ListBatch {
    fn add(&mut self, id: u32, list: &EndpointList) {
        match wire::sched_bytes(list.scheduler, list.endpoints.len()).0 {
            wire::SCHED_RR | wire::SCHED_WRR => self.turns.push(id),
            wire::SCHED_MH => {
                if let Some(table) = maglev::table(&list.endpoints) {
                    for (k, v) in wire::mh_entries(id, &table) {
                        self.mh_keys.push(k);
                        self.mh_vals.push(v);
                    }
                }
            }
            _ => {}
        }
        // A weighted list holds an endpoint in several slots: one member each.
        let mut seen = std::collections::HashSet::new();
        for (slot, ep) in list.endpoints.iter().enumerate() {
            let mut be = Backend::of(*ep);
            be.pad = list.weights.get(slot).copied().unwrap_or(0);
            if list.remembered && seen.insert(*ep) {
                self.members.push(MemberKey::of(id, &be));
            }
            self.slots.push(SlotKey {
                list: id,
                slot: slot as u32,
            });
            self.backends.push(be);
        }
    }
}

/// The programs attached and the maps open.
pub struct Kernel {
    pin_dir: PathBuf,
    cfg: Array<MapData, Config>,
    config: Config,
    svc: HashMap<MapData, SvcKey, SvcVal>,
    fw: LpmTrie<MapData, FwData, u8>,
    podnet: LpmTrie<MapData, PodnetData, u8>,
    ifc: HashMap<MapData, u32, u32>,
    vip: HashMap<MapData, LocalKey, u8>,
    guard: LpmTrie<MapData, PodnetData, u8>,
    /// The interfaces the packet programs are attached to: index → name and
    /// the flags written for it.
    attached: BTreeMap<u32, (String, u32)>,
    /// `--ebpf-xdp`, and the interfaces the XDP program was tried on: index →
    /// attached (false: the driver refused it; not tried again while the
    /// interface stays).
    xdp: XdpMode,
    xdp_links: BTreeMap<u32, bool>,
    /// The interfaces the XDP program may send frames to, with their MTUs, as
    /// the map holds them.
    xdp_tx: HashMap<MapData, u32, u32>,
    xdp_targets: BTreeMap<u32, u32>,
    /// `--ebpf-xdp-interfaces`: where the XDP program goes (empty: every
    /// interface that is not a pod's).
    xdp_interfaces: Vec<String>,
    /// The kernel could not say which interfaces take redirected frames, and
    /// the log said so.
    xdp_features_warned: bool,
    slot: HashMap<MapData, SlotKey, Backend>,
    member: HashMap<MapData, MemberKey, u8>,
    /// The schedulers' state: round-robin turns and Maglev tables, by list.
    rr: HashMap<MapData, u32, u64>,
    mh: HashMap<MapData, MhKey, MhVal>,
    /// The packet path's connections, and its live-connection counts, which
    /// [`Kernel::reconcile_flows`] brings back to them.
    ct: HashMap<MapData, CtKey, CtVal>,
    flows: HashMap<MapData, Backend, i64>,
    timeouts: super::IdleTimeouts,
    local: HashMap<MapData, LocalKey, u8>,
    /// The next list id to give (ids only grow: an id is never reused while a
    /// socket may still read it).
    next_list: u32,
    /// `None` until the first full write, and after a failed one.
    written: Option<Written>,
    /// The maps may hold keys no write of this process made (they were pinned
    /// before it opened them, or a write failed part-way): the next full write
    /// sweeps them.
    unknown_keys: bool,
    /// What did not fit at the last write.
    pub overflow: Overflow,
    sizes: super::MapSizes,
    /// Held so the programs stay loaded while the process runs (the packet
    /// programs also to be attached to interfaces that appear).
    _ebpf: Ebpf,
    tc: Ebpf,
    /// The XDP program's object, loaded with `--ebpf-xdp=native` alone.
    xdp_ebpf: Option<Ebpf>,
}

impl Kernel {
    /// Loads the programs, opens (or creates) the pinned maps under `pin_dir` and
    /// attaches the programs to `cgroup`, releasing any earlier process's links.
    /// `snat`: the ports svcproxy's own masquerade takes ([`snat_ports`], read
    /// once per process: a reload of the programs keeps them).
    pub fn open(opts: &EbpfOptions, snat: Option<(u16, u16)>) -> Result<Kernel, DataPlaneError> {
        let (cgroup, pin_dir, host_only) = (&opts.cgroup, &opts.pin_dir, opts.host_namespace_only);
        if SOCK_OBJECT.is_empty() || TC_OBJECT.is_empty() {
            return Err(kernel_err(
                "the ebpf mode's programs",
                "svcproxy was built without clang; run scripts/install-deps.sh and build again",
            ));
        }
        prepare_pin_dir(opts)?;
        let reused = MAPS.iter().any(|m| pin_dir.join(m).exists());
        let cgroup_dir = File::open(cgroup)
            .map_err(|e| kernel_err(format!("opening cgroup {}", cgroup.display()), e))?;
        let (mut ebpf, mut tc, xdp_ebpf) = load_programs(opts)?;
        for name in RETIRED_MAPS {
            let _ = std::fs::remove_file(pin_dir.join(name));
        }

        let cookie = netns_cookie()?;
        let xdp_tx: HashMap<MapData, u32, u32> = take(&mut tc, "svcproxy_xdp_tx")?;
        let mut cfg: Array<MapData, Config> = take(&mut ebpf, "svcproxy_cfg")?;
        // A predecessor's marks stay in force until this process's first write.
        let before = cfg.get(&0, 0).unwrap_or_default();
        let config = Config {
            host_netns_cookie: cookie,
            host_only: u32::from(host_only),
            masquerade_mark: before.masquerade_mark,
            reject_mark: before.reject_mark,
            generation: 0,
        };
        cfg.set(0, config, 0)
            .map_err(|e| kernel_err("writing svcproxy_cfg", e))?;

        attach_socket_programs(&mut ebpf, &cgroup_dir, cgroup, pin_dir)?;
        write_timeouts(&mut tc, &opts.timeouts)?;
        write_snat(&mut tc, snat, opts.xdp)?;

        let slot: HashMap<MapData, SlotKey, Backend> = take(&mut ebpf, "svcproxy_slot")?;
        let svc: HashMap<MapData, SvcKey, SvcVal> = take(&mut ebpf, "svcproxy_svc")?;
        let next_list = next_list_id(&slot, &svc);
        Ok(Kernel {
            pin_dir: pin_dir.to_path_buf(),
            cfg,
            config,
            fw: take(&mut tc, "svcproxy_fw")?,
            podnet: take(&mut tc, "svcproxy_podnet")?,
            ifc: take(&mut tc, "svcproxy_ifc")?,
            vip: take(&mut ebpf, "svcproxy_vip")?,
            guard: take(&mut ebpf, "svcproxy_guard")?,
            attached: BTreeMap::new(),
            xdp: opts.xdp,
            xdp_links: BTreeMap::new(),
            // What an earlier process left is brought to what the kernel says at
            // the first write.
            xdp_targets: xdp_tx.iter().filter_map(Result::ok).collect(),
            xdp_tx,
            xdp_interfaces: opts.xdp_interfaces.clone(),
            xdp_features_warned: false,
            svc,
            slot,
            member: take(&mut ebpf, "svcproxy_member")?,
            rr: take(&mut ebpf, "svcproxy_rr")?,
            mh: take(&mut ebpf, "svcproxy_mh")?,
            ct: take(&mut tc, "svcproxy_ct")?,
            flows: take(&mut ebpf, "svcproxy_flows")?,
            timeouts: opts.timeouts,
            local: take(&mut ebpf, "svcproxy_local")?,
            next_list,
            written: None,
            unknown_keys: reused,
            overflow: Overflow::default(),
            sizes: opts.sizes,
            _ebpf: ebpf,
            tc,
            xdp_ebpf,
        })
    }
}

/// The pin directory made ready: on a bpffs, not another network namespace's,
/// and without a pinned map of another size than the flags say (the kernel cannot
/// resize one: it is made afresh).
fn prepare_pin_dir(opts: &EbpfOptions) -> Result<(), DataPlaneError> {
    let pin_dir = &opts.pin_dir;
    let parent = pin_dir.parent().unwrap_or(pin_dir);
    if !on_bpffs(parent) {
        return Err(kernel_err(
            format!("pin directory {}", pin_dir.display()),
            format!(
                "{} is not on a bpffs (mount -t bpf bpf DIR)",
                parent.display()
            ),
        ));
    }
    std::fs::create_dir_all(pin_dir)
        .map_err(|e| kernel_err(format!("creating {}", pin_dir.display()), e))?;
    // Pins another network namespace's svcproxy made are not taken over.
    if let Some(owner) = pinned_owner(pin_dir) {
        if owner != netns_cookie()? {
            return Err(kernel_err(
                format!("pin directory {}", pin_dir.display()),
                "it holds the pins of svcproxy in another network namespace; give this \
                 one its own --ebpf-bpffs",
            ));
        }
    }
    // A pinned map of another size (the flags changed) is made afresh: the
    // kernel cannot resize one.
    for (name, size) in opts.sizes.by_map() {
        let pin = pin_dir.join(name);
        let pinned = MapData::from_pin(&pin)
            .ok()
            .and_then(|m| m.info().ok())
            .map(|i| i.max_entries());
        if let Some(old) = pinned.filter(|old| *old != size) {
            tracing::warn!(map = name, from = old, to = size, "resizing a pinned map: it is made afresh (the packet path's connections through it are forgotten)");
            std::fs::remove_file(&pin)
                .map_err(|e| kernel_err(format!("unpinning {}", pin.display()), e))?;
        }
    }
    Ok(())
}

/// The socket programs and the packet programs (the XDP program too with
/// `--ebpf-xdp=native`) loaded, their maps opened or created under the pin
/// directory at the flags' sizes.
fn load_programs(opts: &EbpfOptions) -> Result<(Ebpf, Ebpf, Option<Ebpf>), DataPlaneError> {
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

/// The first list id to give: past every id in use, the entries' included (a
/// slot map made afresh, resized, must not hand out an id the pinned entries
/// still name).
fn next_list_id(
    slot: &HashMap<MapData, SlotKey, Backend>,
    svc: &HashMap<MapData, SvcKey, SvcVal>,
) -> u32 {
    slot.keys()
        .filter_map(Result::ok)
        .map(|k| k.list)
        .chain(
            svc.iter()
                .filter_map(Result::ok)
                .flat_map(|(_, v)| [v.pod, v.host, v.pkt_pod, v.pkt_other])
                .map(|r| r.list),
        )
        .max()
        .map_or(1, |m| m.wrapping_add(1).max(1))
}

impl Kernel {
    /// The marks in the programs' configuration follow the table's.
    fn write_marks(&mut self, table: &Table) -> Result<usize, DataPlaneError> {
        if (self.config.masquerade_mark, self.config.reject_mark)
            == (table.masquerade_mark, table.reject_mark)
        {
            return Ok(0);
        }
        self.set_config(Config {
            masquerade_mark: table.masquerade_mark,
            reject_mark: table.reject_mark,
            ..self.config
        })?;
        Ok(1)
    }

    /// The programs' configuration written, and remembered.
    fn set_config(&mut self, config: Config) -> Result<(), DataPlaneError> {
        self.cfg
            .set(0, config, 0)
            .map_err(|e| kernel_err("writing svcproxy_cfg", e))?;
        self.config = config;
        Ok(())
    }

    /// The packet programs on every Ethernet interface there is now, each
    /// interface flagged as the table says (its packets come from this node's
    /// pods, or not); the links of interfaces gone are released. An interface
    /// that goes while it is being attached is skipped (the next write sees it
    /// gone). Returns the number of map writes and attachments.
    pub fn attach_interfaces(&mut self, table: &Table) -> Result<usize, DataPlaneError> {
        let links = crate::kernel::host_addrs::ether_links()
            .map_err(|e| kernel_err("listing the node's interfaces", e))?;
        let mut ops = 0;
        let present: BTreeMap<u32, String> =
            links.iter().map(|l| (l.index, l.name.clone())).collect();
        let mtus: BTreeMap<u32, u32> = links.iter().map(|l| (l.index, l.mtu)).collect();
        let masters: BTreeMap<u32, u32> = links
            .iter()
            .filter_map(|l| l.master.map(|m| (l.index, m)))
            .collect();
        for (&index, name) in &present {
            // A pod's packets arrive on its veth before the bridge it is a port
            // of: the bridge's ports are the pods' interfaces too
            // (`--detect-local-mode=BridgeInterface`).
            let bridge = masters.get(&index).and_then(|m| present.get(m));
            let pods = table
                .pod_interfaces
                .iter()
                .any(|p| p.matches(name) || bridge.is_some_and(|b| p.matches(b)));
            let flags = if pods { wire::IFC_PODS } else { 0 };
            match self.attached.get(&index) {
                Some((n, f)) if n == name && *f == flags => continue,
                Some((n, _)) if n == name => {}
                _ => {
                    // Flagged before the first packet meets the programs.
                    self.ifc
                        .insert(index, flags, 0)
                        .map_err(|e| kernel_err(format!("flagging interface {name}"), e))?;
                    match self.attach_interface(index, name) {
                        Ok(()) => ops += TC_PROGRAMS.len(),
                        Err(e) if !still_there(index, name) => {
                            tracing::debug!(interface = %name, error = %e, "an interface went while being attached");
                            continue;
                        }
                        // One interface must not keep every service from the
                        // maps: logged, and tried again at the next write.
                        Err(e) => {
                            tracing::warn!(interface = %name, error = %e, "cannot attach the packet programs to an interface; its packets are not translated");
                            continue;
                        }
                    }
                }
            }
            self.ifc
                .insert(index, flags, 0)
                .map_err(|e| kernel_err(format!("flagging interface {name}"), e))?;
            ops += 1;
            self.attached.insert(index, (name.clone(), flags));
            ops += self.xdp_interface(index, name, flags & wire::IFC_PODS == 0)?;
        }
        // Interfaces gone: this process's, and any pinned by an earlier one.
        let gone: Vec<u32> = self
            .attached
            .keys()
            .copied()
            .chain(pinned_interfaces(&self.pin_dir))
            .filter(|i| !present.contains_key(i))
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .collect();
        for index in gone {
            release_interface(&self.pin_dir, index)?;
            ops += remove(&mut self.ifc, &index)?;
            self.attached.remove(&index);
            self.xdp_links.remove(&index);
        }
        ops += self.write_xdp_targets(&mtus)?;
        Ok(ops)
    }

    /// The XDP program on interface `name` when `--ebpf-xdp=native` and it
    /// `wanted` (not a pod's), off it otherwise. A driver without native XDP
    /// is said once; its packets meet the tc programs alone.
    fn xdp_interface(
        &mut self,
        index: u32,
        name: &str,
        wanted: bool,
    ) -> Result<usize, DataPlaneError> {
        let named = self.xdp_interfaces.is_empty() || self.xdp_interfaces.iter().any(|n| n == name);
        let wanted = wanted && named && self.xdp == XdpMode::Native;
        match (wanted, self.xdp_links.get(&index).copied()) {
            (true, None) => match self.attach_xdp(index, name) {
                Ok(()) => {
                    self.xdp_links.insert(index, true);
                    Ok(1)
                }
                Err(e) if !still_there(index, name) => {
                    tracing::debug!(interface = %name, error = %e, "an interface went while being attached");
                    Ok(0)
                }
                Err(e) => {
                    tracing::warn!(interface = %name, error = %e, "no native XDP on this interface: its packets meet the tc programs alone");
                    self.xdp_links.insert(index, false);
                    Ok(0)
                }
            },
            (false, Some(attached)) => {
                self.xdp_links.remove(&index);
                if attached {
                    release_xdp(&self.pin_dir, index)?;
                }
                Ok(usize::from(attached))
            }
            // An earlier process's XDP program, with the XDP path off now.
            (false, None) if self.pin_dir.join(format!("xdp-{index}")).exists() => {
                release_xdp(&self.pin_dir, index)?;
                Ok(1)
            }
            _ => Ok(0),
        }
    }

    /// Attaches the XDP program to interface `index` in its driver: in place
    /// of an earlier process's program when its link is pinned (the link is
    /// updated, never detached), pinned as `xdp-<index>`.
    fn attach_xdp(&mut self, index: u32, name: &str) -> Result<(), DataPlaneError> {
        let pin = self.pin_dir.join(format!("xdp-{index}"));
        let xdp = self
            .xdp_ebpf
            .as_mut()
            .ok_or_else(|| kernel_err(XDP_PROGRAM, "not loaded (--ebpf-xdp is not native)"))?;
        let prog: &mut Xdp = program(xdp, XDP_PROGRAM)?;
        let id = match PinnedLink::from_pin(&pin) {
            Ok(old) => {
                let old = XdpLink::try_from(FdLink::from(old))
                    .map_err(|e| kernel_err(format!("the XDP link pinned for {name}"), e))?;
                prog.attach_to_link(old)
            }
            Err(_) => prog.attach_to_if_index(index, aya::programs::XdpMode::Driver),
        }
        .map_err(|e| kernel_err(format!("attaching {XDP_PROGRAM} to {name}"), e))?;
        let link: FdLink = prog
            .take_link(id)
            .map_err(|e| kernel_err(XDP_PROGRAM, e))?
            .try_into()
            .map_err(|e| kernel_err(XDP_PROGRAM, e))?;
        pin_in_place(link, &pin)
    }

    /// The XDP program may send frames to the interfaces present (`mtus`: each
    /// one's MTU) that the kernel says take them (none while the XDP path is
    /// off). A change makes the XDP program's cache stale at once (the maps'
    /// generation moves). Returns the number of map writes.
    fn write_xdp_targets(&mut self, mtus: &BTreeMap<u32, u32>) -> Result<usize, DataPlaneError> {
        let targets: BTreeMap<u32, u32> = if self.xdp_links.values().any(|a| *a) {
            match crate::kernel::xdp_features::redirect_targets() {
                Ok(t) => t
                    .into_iter()
                    .filter_map(|i| mtus.get(&i).filter(|m| **m > 0).map(|m| (i, *m)))
                    .collect(),
                Err(e) => {
                    // Said once (a kernel before 6.3 has no netdev family at all).
                    if !std::mem::replace(&mut self.xdp_features_warned, true) {
                        tracing::warn!(error = %e, "cannot read the interfaces' XDP features: the XDP program sends no frame on itself, it only drops");
                    }
                    BTreeMap::new()
                }
            }
        } else {
            BTreeMap::new()
        };
        if targets == self.xdp_targets {
            return Ok(0);
        }
        let mut ops = 0;
        for (index, mtu) in &targets {
            if self.xdp_targets.get(index) != Some(mtu) {
                self.xdp_tx
                    .insert(index, mtu, 0)
                    .map_err(|e| kernel_err("writing svcproxy_xdp_tx", e))?;
                ops += 1;
            }
        }
        for index in self.xdp_targets.keys().filter(|i| !targets.contains_key(i)) {
            ops += remove(&mut self.xdp_tx, index)?;
        }
        self.xdp_targets = targets;
        // (Before the first write, the write's own count serves: the generation
        // stays 0 until the maps are written.)
        if self.written.is_some() {
            self.bump_generation()?;
        }
        Ok(ops)
    }

    /// The maps' generation moves on (the XDP program's cache goes stale).
    fn bump_generation(&mut self) -> Result<(), DataPlaneError> {
        self.set_config(Config {
            generation: self.config.generation.wrapping_add(1).max(1),
            ..self.config
        })
    }

    /// The entries the maps svcproxy fills hold now, by map.
    pub fn fill(&self) -> Vec<(&'static str, usize)> {
        let Some(w) = self.written.as_ref() else {
            return Vec::new();
        };
        let slots: usize = w.lists.values().map(|(_, l)| l.endpoints.len()).sum();
        let members: usize = w
            .lists
            .values()
            .filter(|(_, l)| l.remembered)
            .map(|(_, l)| l.endpoints.len())
            .sum();
        vec![
            ("svcproxy_svc", w.entries.len()),
            ("svcproxy_slot", slots),
            ("svcproxy_member", members),
        ]
    }

    /// The packet programs' links that should be pinned for the interfaces
    /// they were attached to, and are not.
    pub fn missing_links(&self) -> Vec<String> {
        self.attached
            .keys()
            .flat_map(|i| {
                TC_PROGRAMS
                    .iter()
                    .map(move |(_, _, s)| format!("tc-{i}-{s}"))
            })
            .chain(
                self.xdp_links
                    .iter()
                    .filter(|(_, attached)| **attached)
                    .map(|(i, _)| format!("xdp-{i}")),
            )
            .filter(|n| !self.pin_dir.join(n).exists())
            .collect()
    }

    /// Attaches both packet programs to interface `name` (tcx, after any program
    /// already there), pinning each link under a new name, then over the old.
    fn attach_interface(&mut self, index: u32, name: &str) -> Result<(), DataPlaneError> {
        for (prog_name, attach_type, suffix) in TC_PROGRAMS {
            let prog: &mut SchedClassifier = program(&mut self.tc, prog_name)?;
            let id = prog
                .attach_with_options(
                    name,
                    attach_type,
                    TcAttachOptions::TcxOrder(LinkOrder::default()),
                )
                .map_err(|e| kernel_err(format!("attaching {prog_name} to {name}"), e))?;
            let link: FdLink = prog
                .take_link(id)
                .map_err(|e| kernel_err(prog_name, e))?
                .try_into()
                .map_err(|e| kernel_err(prog_name, e))?;
            pin_in_place(link, &self.pin_dir.join(format!("tc-{index}-{suffix}")))?;
        }
        Ok(())
    }

    /// Brings the maps to `table`. With `changes` (and a known last write), only
    /// the entries and lists named there are compared and written; otherwise
    /// everything is written under fresh list ids and whatever else the maps hold
    /// is deleted. Returns the number of map writes and deletions.
    pub fn write(
        &mut self,
        table: &Table,
        changes: Option<&Changes>,
    ) -> Result<usize, DataPlaneError> {
        // Until this write succeeds, the maps hold what nobody recorded.
        let unknown = std::mem::replace(&mut self.unknown_keys, true);
        let result = self.write_marks(table).and_then(|marks| {
            let ifaces = self.attach_interfaces(table)?;
            let maps = match (changes, self.written.take()) {
                (Some(changes), Some(written)) => self.write_changes(table, changes, written),
                (_, before) => self.write_all(table, before, unknown),
            }?;
            self.bump_generation()?;
            Ok(marks + ifaces + maps + 1)
        });
        self.unknown_keys = result.is_err();
        result
    }

    /// Everything under fresh ids; then what the last write left (or, when it is
    /// unknown, anything else the maps hold) is deleted.
    fn write_all(
        &mut self,
        table: &Table,
        before: Option<Written>,
        unknown: bool,
    ) -> Result<usize, DataPlaneError> {
        let mut ops = 0usize;
        if unknown {
            // Lists no entry names (a failed write's, or a predecessor's leftovers)
            // go first: the new lists need room beside the ones in use.
            ops += self.drop_unnamed_lists()?;
        }
        let mut w = Written::default();
        self.overflow = Overflow::default();
        ops += self.write_all_lists(table, &mut w)?;
        ops += self.write_all_fences(table, &mut w)?;
        ops += self.write_all_entries(table, &mut w)?;
        ops += self.write_all_addresses(table, &mut w)?;
        match before {
            Some(before) if !unknown => ops += self.remove_stale(&before, &w)?,
            _ if unknown => ops += self.sweep(&w)?,
            _ => {}
        }
        self.overflow.report(&self.sizes);
        self.written = Some(w);
        Ok(ops)
    }

    /// Every endpoint list under a fresh id: in one batch, else (no room for them
    /// all) list by list, each whole or not at all (a list that does not fit
    /// leaves its entries rejecting).
    fn write_all_lists(&mut self, table: &Table, w: &mut Written) -> Result<usize, DataPlaneError> {
        let mut ops = 0usize;
        let mut batch = ListBatch::default();
        let mut fresh = Vec::new();
        for (name, list) in &table.lists {
            let id = self.fresh_id();
            batch.add(id, list);
            fresh.push((name, id, list));
        }
        match self.write_lists(&batch) {
            Ok(n) => {
                ops += n;
                for (name, id, list) in fresh {
                    w.lists.insert(name.clone(), (id, list.clone()));
                }
            }
            // No room for them all: list by list, each whole or not at all (a
            // list that does not fit leaves its entries rejecting).
            Err(DataPlaneError::MapFull { .. }) => {
                for (name, id, list) in fresh {
                    match self.write_list(id, list) {
                        Ok(n) => {
                            ops += n;
                            w.lists.insert(name.clone(), (id, list.clone()));
                        }
                        Err(DataPlaneError::MapFull { map, .. }) => {
                            self.delete_list(id, list)?;
                            self.overflow.note(map, list.endpoints.len(), &name.service);
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            Err(e) => return Err(e),
        }
        Ok(ops)
    }

    /// The sources fenced entries admit, and the pod CIDRs, before the entries.
    fn write_all_fences(
        &mut self,
        table: &Table,
        w: &mut Written,
    ) -> Result<usize, DataPlaneError> {
        let mut ops = 0usize;
        for (port, nets) in &table.firewalls {
            ops += self.write_firewall(port, nets, &[])?;
            w.firewalls.insert(port.id(), (port.clone(), nets.clone()));
        }
        for net in &table.pod_cidrs {
            self.podnet
                .insert(&wire::podnet_key(net), 1, 0)
                .map_err(|e| kernel_err(format!("writing pod CIDR {net}"), e))?;
            ops += 1;
            w.pod_cidrs.insert(*net);
        }
        Ok(ops)
    }

    /// Every service entry: in one batch, then one by one those that fit when
    /// the map has no room for the batch.
    fn write_all_entries(
        &mut self,
        table: &Table,
        w: &mut Written,
    ) -> Result<usize, DataPlaneError> {
        let mut ops = 0usize;
        let (mut keys, mut values, mut dests) = (Vec::new(), Vec::new(), Vec::new());
        for (dest, entry) in &table.entries {
            let (k, v) = encode(dest, entry, &w.lists);
            keys.push(k);
            values.push(v);
            dests.push((dest, entry));
        }
        let written = match batch::update(self.svc.map(), &keys, &values) {
            Ok(()) => keys.len(),
            Err((n, e)) if e.raw_os_error() == Some(libc::E2BIG) => n,
            Err((n, e)) => {
                return Err(kernel_err(
                    format!("writing service entries (after {n})"),
                    e,
                ));
            }
        };
        ops += written;
        for i in 0..keys.len() {
            if i >= written {
                // No room left for the batch: one by one, those that fit.
                match self.svc.insert(keys[i], values[i], 0) {
                    Ok(()) => ops += 1,
                    Err(e) if map_full(&e) => {
                        self.overflow
                            .note("svcproxy_svc", 1, &entry_port(dests[i].1));
                        continue;
                    }
                    Err(e) => return Err(kernel_err(format!("writing service {}", dests[i].0), e)),
                }
            }
            w.entries.insert(*dests[i].0, (keys[i], values[i]));
        }
        Ok(ops)
    }

    /// This node's addresses, the cluster IPs (to refuse their unexposed ports)
    /// and the ServiceCIDRs.
    fn write_all_addresses(
        &mut self,
        table: &Table,
        w: &mut Written,
    ) -> Result<usize, DataPlaneError> {
        let mut ops = 0usize;
        for ip in &table.local_addrs {
            let k = local_key(ip);
            self.local
                .insert(k, 1, 0)
                .map_err(|e| kernel_err(format!("writing local address {ip}"), e))?;
            ops += 1;
            w.local.insert(k);
        }
        for ip in table.cluster_ips.keys() {
            let k = local_key(ip);
            match self.vip.insert(k, 1, 0) {
                Ok(()) => {
                    ops += 1;
                    w.vips.insert(k);
                }
                // No room: that cluster IP's unexposed ports are not refused.
                Err(e) if map_full(&e) => self.overflow.note_keys("svcproxy_vip", 1),
                Err(e) => return Err(kernel_err(format!("writing cluster IP {ip}"), e)),
            }
        }
        for net in &table.guard_cidrs {
            self.guard
                .insert(&wire::podnet_key(net), 1, 0)
                .map_err(|e| kernel_err(format!("writing ServiceCIDR {net}"), e))?;
            ops += 1;
            w.guard.insert(*net);
        }
        Ok(ops)
    }

    /// What the previous write held and this one does not.
    fn remove_stale(&mut self, before: &Written, w: &Written) -> Result<usize, DataPlaneError> {
        let mut ops = 0usize;
        let keys: BTreeSet<SvcKey> = w.entries.values().map(|(k, _)| *k).collect();
        for (k, _) in before.entries.values().filter(|(k, _)| !keys.contains(k)) {
            ops += remove(&mut self.svc, k)?;
        }
        for k in before.local.iter().filter(|k| !w.local.contains(k)) {
            ops += remove(&mut self.local, k)?;
        }
        for (id, list) in before.lists.values() {
            ops += self.delete_list(*id, list)?;
        }
        for (id, (_, nets)) in &before.firewalls {
            let now = w.firewalls.get(id).map_or(&[][..], |(_, n)| n);
            ops += self.delete_firewall(*id, nets, now)?;
        }
        for net in before.pod_cidrs.difference(&w.pod_cidrs) {
            ops += removed(self.podnet.remove(&wire::podnet_key(net)), net)?;
        }
        for k in before.vips.difference(&w.vips) {
            ops += remove(&mut self.vip, k)?;
        }
        for net in before.guard.difference(&w.guard) {
            ops += removed(self.guard.remove(&wire::podnet_key(net)), net)?;
        }
        Ok(ops)
    }

    /// Only what `changes` names: a list that differs is written whole under a
    /// fresh id before the entries switch to it, and deleted after.
    fn write_changes(
        &mut self,
        table: &Table,
        changes: &Changes,
        mut w: Written,
    ) -> Result<usize, DataPlaneError> {
        let overflow_before = self.overflow.clone();
        // Sources admitted before the entries that need them; those no longer
        // admitted go after.
        let (mut ops, fenced) = self.write_changed_fences(table, changes, &mut w)?;
        let (n, retired) = self.write_changed_lists(table, changes, &mut w)?;
        ops += n;
        ops += self.write_changed_entries(table, changes, &mut w)?;
        ops += self.write_changed_addresses(table, changes, &mut w)?;
        for (id, list) in &retired {
            ops += self.delete_list(*id, list)?;
        }
        for (id, old) in fenced {
            let now = w.firewalls.get(&id).map_or(&[][..], |(_, n)| n);
            ops += self.delete_firewall(id, &old, now)?;
        }
        if self.overflow != overflow_before {
            self.overflow.report(&self.sizes);
        }
        self.written = Some(w);
        Ok(ops)
    }

    /// The changed ports' admitted sources, written; returns what each admitted
    /// before, to be taken away once the entries no longer need it.
    #[allow(clippy::type_complexity)]
    fn write_changed_fences(
        &mut self,
        table: &Table,
        changes: &Changes,
        w: &mut Written,
    ) -> Result<(usize, Vec<(u64, Vec<IpNet>)>), DataPlaneError> {
        let mut ops = 0usize;
        let mut fenced: Vec<(u64, Vec<IpNet>)> = Vec::new();
        for port in &changes.firewalls {
            let id = port.id();
            let new = table.firewalls.get(port);
            let old = w.firewalls.remove(&id).map(|(_, n)| n).unwrap_or_default();
            if let Some(nets) = new {
                ops += self.write_firewall(port, nets, &old)?;
                w.firewalls.insert(id, (port.clone(), nets.clone()));
            }
            fenced.push((id, old));
        }
        Ok((ops, fenced))
    }

    /// The changed endpoint lists, each under a fresh id; returns the lists they
    /// replace, to be deleted once no entry names them.
    fn write_changed_lists(
        &mut self,
        table: &Table,
        changes: &Changes,
        w: &mut Written,
    ) -> Result<(usize, Vec<(u32, EndpointList)>), DataPlaneError> {
        let mut ops = 0usize;
        let mut retired: Vec<(u32, EndpointList)> = Vec::new();
        for name in &changes.lists {
            let new = table.lists.get(name);
            match (w.lists.get(name), new) {
                (Some((_, old)), Some(new)) if old == new => {}
                (_, Some(new)) => {
                    let id = self.fresh_id();
                    match self.write_list(id, new) {
                        Ok(n) => {
                            ops += n;
                            retired.extend(w.lists.insert(name.clone(), (id, new.clone())));
                        }
                        // No room: the entries keep the list they name (its old
                        // endpoints) until there is; a new list is not written and
                        // its entries refuse.
                        Err(DataPlaneError::MapFull { map, .. }) => {
                            self.delete_list(id, new)?;
                            self.overflow.note(map, new.endpoints.len(), &name.service);
                        }
                        Err(e) => return Err(e),
                    }
                }
                (Some(_), None) => retired.extend(w.lists.remove(name)),
                (None, None) => {}
            }
        }
        Ok((ops, retired))
    }

    /// The changed service entries, written or removed.
    fn write_changed_entries(
        &mut self,
        table: &Table,
        changes: &Changes,
        w: &mut Written,
    ) -> Result<usize, DataPlaneError> {
        let mut ops = 0usize;
        for dest in &changes.entries {
            match table.entries.get(dest) {
                Some(entry) => {
                    let (k, v) = encode(dest, entry, &w.lists);
                    if w.entries.get(dest) != Some(&(k, v)) {
                        match self.svc.insert(k, v, 0) {
                            Ok(()) => {
                                ops += 1;
                                w.entries.insert(*dest, (k, v));
                            }
                            Err(e) if map_full(&e) => {
                                self.overflow.note("svcproxy_svc", 1, &entry_port(entry));
                            }
                            Err(e) => {
                                return Err(kernel_err(format!("writing service {dest}"), e));
                            }
                        }
                    }
                }
                None => {
                    if let Some((k, _)) = w.entries.remove(dest) {
                        ops += remove(&mut self.svc, &k)?;
                    }
                }
            }
        }
        Ok(ops)
    }

    /// This node's addresses, and the changed cluster IPs.
    fn write_changed_addresses(
        &mut self,
        table: &Table,
        changes: &Changes,
        w: &mut Written,
    ) -> Result<usize, DataPlaneError> {
        let mut ops = 0usize;
        let local: BTreeSet<LocalKey> = table.local_addrs.iter().map(local_key).collect();
        for k in local.difference(&w.local) {
            self.local
                .insert(*k, 1, 0)
                .map_err(|e| kernel_err("writing a local address", e))?;
            ops += 1;
        }
        for k in w.local.difference(&local) {
            ops += remove(&mut self.local, k)?;
        }
        w.local = local;
        for ip in &changes.cluster_ips {
            let k = local_key(ip);
            match (table.cluster_ips.contains_key(ip), w.vips.contains(&k)) {
                (true, false) => match self.vip.insert(k, 1, 0) {
                    Ok(()) => {
                        ops += 1;
                        w.vips.insert(k);
                    }
                    Err(e) if map_full(&e) => self.overflow.note_keys("svcproxy_vip", 1),
                    Err(e) => return Err(kernel_err(format!("writing cluster IP {ip}"), e)),
                },
                (false, true) => {
                    ops += remove(&mut self.vip, &k)?;
                    w.vips.remove(&k);
                }
                _ => {}
            }
        }
        Ok(ops)
    }

    /// Brings the packet path's live-connection counts (`svcproxy_flows`, the lc
    /// schedulers') back to the connections its table holds that count: one the
    /// LRU forgot, or whose FIN was lost, no longer counts, and one idle past its
    /// timeout (`--ipvs-tcp-timeout`, `-tcpfin-`) is forgotten. Programs counting
    /// meanwhile may leave the count off by the connections opened or closed
    /// during the pass, until the next. Returns the map writes and deletions.
    pub fn reconcile_flows(&mut self) -> Result<usize, DataPlaneError> {
        let (counts, expired) = flow_counts(
            self.ct.iter().filter_map(Result::ok),
            monotonic_secs(),
            &self.timeouts,
        );
        let mut ops = 0;
        for k in &expired {
            ops += remove(&mut self.ct, k)?;
        }
        let stale: Vec<Backend> = self
            .flows
            .keys()
            .filter_map(Result::ok)
            .filter(|be| !counts.contains_key(be))
            .collect();
        for be in &stale {
            ops += remove(&mut self.flows, be)?;
        }
        for (be, n) in counts {
            self.flows
                .insert(be, n, 0)
                .map_err(|e| kernel_err("writing svcproxy_flows", e))?;
            ops += 1;
        }
        Ok(ops)
    }

    /// The sources of fenced `port` that `old` lacks.
    fn write_firewall(
        &mut self,
        port: &PortName,
        nets: &[IpNet],
        old: &[IpNet],
    ) -> Result<usize, DataPlaneError> {
        let id = port.id();
        let mut ops = 0;
        for net in nets.iter().filter(|n| !old.contains(n)) {
            self.fw
                .insert(&wire::fw_key(id, net), 1, 0)
                .map_err(|e| kernel_err(format!("writing source range {net} of {port}"), e))?;
            ops += 1;
        }
        Ok(ops)
    }

    /// The sources of fenced port `id` in `old` that `now` lacks.
    fn delete_firewall(
        &mut self,
        id: u64,
        old: &[IpNet],
        now: &[IpNet],
    ) -> Result<usize, DataPlaneError> {
        let mut ops = 0;
        for net in old.iter().filter(|n| !now.contains(n)) {
            ops += removed(self.fw.remove(&wire::fw_key(id, net)), net)?;
        }
        Ok(ops)
    }

    fn fresh_id(&mut self) -> u32 {
        let id = self.next_list;
        self.next_list = self.next_list.wrapping_add(1).max(1);
        id
    }

    /// The list's slots, and its members when clients remember endpoints of it.
    fn write_list(&mut self, id: u32, list: &EndpointList) -> Result<usize, DataPlaneError> {
        let mut batch = ListBatch::default();
        batch.add(id, list);
        self.write_lists(&batch)
    }

    fn write_lists(&mut self, b: &ListBatch) -> Result<usize, DataPlaneError> {
        let err = |map: &'static str, what: &str, n: usize, e: std::io::Error| {
            if e.raw_os_error() == Some(libc::E2BIG) {
                DataPlaneError::MapFull {
                    map,
                    what: format!("writing {what} (after {n})"),
                }
            } else {
                kernel_err(format!("writing {what} (after {n})"), e)
            }
        };
        batch::update(self.slot.map(), &b.slots, &b.backends)
            .map_err(|(n, e)| err("svcproxy_slot", "endpoints", n, e))?;
        let ones = vec![1u8; b.members.len()];
        batch::update(self.member.map(), &b.members, &ones)
            .map_err(|(n, e)| err("svcproxy_member", "endpoint members", n, e))?;
        let zeros = vec![0u64; b.turns.len()];
        batch::update(self.rr.map(), &b.turns, &zeros)
            .map_err(|(n, e)| err("svcproxy_rr", "round-robin turns", n, e))?;
        batch::update(self.mh.map(), &b.mh_keys, &b.mh_vals)
            .map_err(|(n, e)| err("svcproxy_mh", "Maglev tables", n, e))?;
        Ok(b.slots.len() + b.members.len() + b.turns.len() + b.mh_keys.len())
    }

    fn delete_list(&mut self, id: u32, list: &EndpointList) -> Result<usize, DataPlaneError> {
        let mut ops = 0;
        for (slot, ep) in list.endpoints.iter().enumerate() {
            let key = SlotKey {
                list: id,
                slot: slot as u32,
            };
            ops += remove(&mut self.slot, &key)?;
            if list.remembered {
                ops += remove(&mut self.member, &MemberKey::of(id, &Backend::of(*ep)))?;
            }
        }
        match wire::sched_bytes(list.scheduler, list.endpoints.len()) {
            (wire::SCHED_RR | wire::SCHED_WRR, _) => ops += remove(&mut self.rr, &id)?,
            (wire::SCHED_MH, size) => {
                for chunk in 0..wire::mh_chunks(size) {
                    ops += remove(&mut self.mh, &MhKey { list: id, chunk })?;
                }
            }
            _ => {}
        }
        Ok(ops)
    }

    /// Deletes the slots and members of every list no service entry names.
    fn drop_unnamed_lists(&mut self) -> Result<usize, DataPlaneError> {
        let named: BTreeSet<u32> = self
            .svc
            .iter()
            .filter_map(Result::ok)
            .flat_map(|(_, v)| [v.pod, v.host, v.pkt_pod, v.pkt_other])
            .filter(|r| r.action == wire::ACT_FORWARD)
            .map(|r| r.list)
            .collect();
        self.drop_lists_but(&named)
    }

    /// Deletes the slots and members of every list but `ids`.
    fn drop_lists_but(&mut self, ids: &BTreeSet<u32>) -> Result<usize, DataPlaneError> {
        Ok(remove_unless(&mut self.slot, |k| ids.contains(&k.list))?
            + remove_unless(&mut self.member, |k| ids.contains(&k.list))?
            + remove_unless(&mut self.rr, |k| ids.contains(k))?
            + remove_unless(&mut self.mh, |k| ids.contains(&k.list))?)
    }

    /// Deletes every key the maps hold beyond what `w` wrote.
    fn sweep(&mut self, w: &Written) -> Result<usize, DataPlaneError> {
        let entries: BTreeSet<SvcKey> = w.entries.values().map(|(k, _)| *k).collect();
        let ids: BTreeSet<u32> = w.lists.values().map(|(id, _)| *id).collect();
        let fw: BTreeSet<(u32, FwData)> = w
            .firewalls
            .iter()
            .flat_map(|(id, (_, nets))| nets.iter().map(|n| lpm_parts(&wire::fw_key(*id, n))))
            .collect();
        let pod: BTreeSet<(u32, PodnetData)> = w
            .pod_cidrs
            .iter()
            .map(|n| lpm_parts(&wire::podnet_key(n)))
            .collect();
        let guard: BTreeSet<(u32, PodnetData)> = w
            .guard
            .iter()
            .map(|n| lpm_parts(&wire::podnet_key(n)))
            .collect();
        Ok(remove_unless(&mut self.svc, |k| entries.contains(k))?
            + remove_unless(&mut self.local, |k| w.local.contains(k))?
            + self.drop_lists_but(&ids)?
            + lpm_remove_unless(&mut self.fw, |k| fw.contains(&lpm_parts(k)))?
            + lpm_remove_unless(&mut self.podnet, |k| pod.contains(&lpm_parts(k)))?
            + remove_unless(&mut self.vip, |k| w.vips.contains(k))?
            + lpm_remove_unless(&mut self.guard, |k| guard.contains(&lpm_parts(k)))?)
    }

    /// The maps' contents read back as a table (lists named by the entries that
    /// point at them), for `explain --live`; lines for what cannot be read so.
    pub fn read(&self) -> (Table, Vec<String>) {
        let mut problems = Vec::new();
        let lists = ReadBack {
            kernel: self,
            lists: self.read_lists(&mut problems),
            names: self
                .written
                .iter()
                .flat_map(|w| w.lists.iter().map(|(n, (id, _))| (*id, n.clone())))
                .collect(),
        };
        let mut t = Table {
            masquerade_mark: self.config.masquerade_mark,
            reject_mark: self.config.reject_mark,
            ..Table::default()
        };
        let ports: BTreeMap<u64, PortName> = self
            .written
            .iter()
            .flat_map(|w| w.firewalls.iter().map(|(id, (p, _))| (*id, p.clone())))
            .collect();
        t.firewalls = self.read_firewalls(&ports, &mut problems);
        t.pod_cidrs = nets_in(&self.podnet, "svcproxy_podnet", &mut problems);
        t.guard_cidrs = nets_in(&self.guard, "svcproxy_guard", &mut problems);
        t.cluster_ips = addrs_in(&self.vip, "svcproxy_vip", &mut problems)
            .into_iter()
            .map(|ip| (ip, 1))
            .collect();
        for kv in self.svc.iter() {
            let (k, v) = match kv {
                Ok(kv) => kv,
                Err(e) => {
                    problems.push(format!("reading svcproxy_svc: {e}"));
                    continue;
                }
            };
            let Some(dest) = dest_of(&k) else {
                problems.push(format!("service entry {k:?} is not one svcproxy writes"));
                continue;
            };
            let entry = lists.entry(&dest, &v, &ports, &mut t, &mut problems);
            t.entries.insert(dest, entry);
        }
        t.local_addrs = addrs_in(&self.local, "svcproxy_local", &mut problems);
        (t, problems)
    }

    /// The endpoint lists' slots, weights and member counts, by list id.
    fn read_lists(&self, problems: &mut Vec<String>) -> ReadLists {
        let mut slots: BTreeMap<u32, BTreeMap<u32, SocketAddr>> = BTreeMap::new();
        // Each weighted list's slots' weights (every slot of one carries its own).
        let mut slot_weights: BTreeMap<u32, BTreeMap<u32, u8>> = BTreeMap::new();
        for kv in self.slot.iter() {
            match kv {
                Ok((k, be)) => {
                    if let Some(a) = be.socket_addr() {
                        slots.entry(k.list).or_default().insert(k.slot, a);
                    }
                    if be.pad != 0 {
                        slot_weights
                            .entry(k.list)
                            .or_default()
                            .insert(k.slot, be.pad);
                    }
                }
                Err(e) => problems.push(format!("reading svcproxy_slot: {e}")),
            }
        }
        let mut members: BTreeMap<u32, usize> = BTreeMap::new();
        for k in self.member.keys() {
            match k {
                Ok(k) => *members.entry(k.list).or_default() += 1,
                Err(e) => problems.push(format!("reading svcproxy_member: {e}")),
            }
        }
        ReadLists {
            slots,
            members,
            weights: slot_weights
                .into_iter()
                .map(|(list, w)| (list, w.into_values().collect()))
                .collect(),
        }
    }

    /// The admitted source ranges, by the port that `ports` names for their id.
    fn read_firewalls(
        &self,
        ports: &BTreeMap<u64, PortName>,
        problems: &mut Vec<String>,
    ) -> BTreeMap<PortName, Vec<IpNet>> {
        let mut firewalls: BTreeMap<PortName, Vec<IpNet>> = BTreeMap::new();
        for k in self.fw.keys() {
            let k = match k {
                Ok(k) => k,
                Err(e) => {
                    problems.push(format!("reading svcproxy_fw: {e}"));
                    continue;
                }
            };
            let id = wire::fw_id(&k);
            let Some(port) = ports.get(&id) else {
                problems.push(format!(
                    "source range of port id {id:#x} is no port svcproxy wrote"
                ));
                continue;
            };
            match wire::fw_of(&k, port.family == svcproxy_core::model::IpFamily::V4) {
                Some((_, net)) => firewalls.entry(port.clone()).or_default().push(net),
                None => problems.push(format!("source range key of {port} is malformed")),
            }
        }
        for nets in firewalls.values_mut() {
            nets.sort();
        }
        firewalls
    }
}

/// The endpoint lists as read back from the maps, by list id.
struct ReadLists {
    slots: BTreeMap<u32, BTreeMap<u32, SocketAddr>>,
    members: BTreeMap<u32, usize>,
    weights: BTreeMap<u32, Vec<u8>>,
}

/// What [`Kernel::read`] resolves entries' routes with: the lists read back, and
/// the names this process wrote them under.
struct ReadBack<'k> {
    kernel: &'k Kernel,
    lists: ReadLists,
    names: BTreeMap<u32, ListName>,
}

impl ReadBack<'_> {
    /// A service entry read back: its four routes resolved, its affinity and
    /// source ranges.
    fn entry(
        &self,
        dest: &Dest,
        v: &SvcVal,
        ports: &BTreeMap<u64, PortName>,
        t: &mut Table,
        problems: &mut Vec<String>,
    ) -> Entry {
        let mut packet = |r: &wire::Route, t: &mut Table| PacketRoute {
            route: self.route(r, t, problems),
            masquerade: r.flags & wire::ROUTE_MASQUERADE != 0,
        };
        let packet_pod = packet(&v.pkt_pod, t);
        let packet_other = packet(&v.pkt_other, t);
        let firewall = match v.fw_id {
            0 => None,
            id => match ports.get(&id) {
                Some(p) => Some(p.clone()),
                None => {
                    problems.push(format!(
                        "service entry {dest} names source ranges {id:#x} svcproxy did not write"
                    ));
                    None
                }
            },
        };
        Entry {
            pod: self.route(&v.pod, t, problems),
            host: self.route(&v.host, t, problems),
            packet_pod,
            packet_other,
            affinity: (v.affinity_secs > 0).then_some((v.affinity_id, v.affinity_secs)),
            firewall,
        }
    }

    /// A route read back; a forward's list resolved to its endpoints (checked
    /// against the entry's count, its members and its scheduler's state) and put in
    /// `t` under the name it was written with.
    fn route(&self, r: &wire::Route, t: &mut Table, problems: &mut Vec<String>) -> Route {
        match r.action {
            wire::ACT_FORWARD => {}
            wire::ACT_DROP => return Route::Drop,
            wire::ACT_PASS => return Route::Pass,
            _ => return Route::Reject,
        }
        let list: Vec<SocketAddr> = self
            .lists
            .slots
            .get(&r.list)
            .map(|s| s.values().copied().collect())
            .unwrap_or_default();
        if list.len() != r.count as usize {
            problems.push(format!(
                "endpoint list {} has {} endpoints, its entries say {}",
                r.list,
                list.len(),
                r.count
            ));
        }
        let member_count = self.lists.members.get(&r.list).copied().unwrap_or(0);
        let distinct = list.iter().collect::<BTreeSet<_>>().len();
        if member_count != 0 && member_count != distinct {
            problems.push(format!(
                "endpoint list {} has {distinct} endpoints and {member_count} members",
                r.list,
            ));
        }
        let scheduler = wire::scheduler_of(r.sched);
        if !self.scheduler_state(r) {
            problems.push(format!(
                "endpoint list {} lacks its {scheduler} scheduler's state",
                r.list
            ));
        }
        let list = EndpointList {
            endpoints: list,
            remembered: member_count > 0,
            scheduler,
            weights: self.lists.weights.get(&r.list).cloned().unwrap_or_default(),
        };
        match self.names.get(&r.list) {
            Some(name) => {
                t.lists.insert(name.clone(), list);
                Route::Forward(name.clone())
            }
            None => {
                problems.push(format!(
                    "endpoint list {} is no list svcproxy wrote",
                    r.list
                ));
                Route::Reject
            }
        }
    }

    /// Whether a list's scheduler has its state in the maps: rr's turn counter,
    /// every chunk of mh's table.
    fn scheduler_state(&self, r: &wire::Route) -> bool {
        let k = self.kernel;
        match r.sched {
            wire::SCHED_RR | wire::SCHED_WRR => k.rr.get(&r.list, 0).is_ok(),
            wire::SCHED_MH => (0..wire::mh_chunks(r.mh_size)).all(|chunk| {
                k.mh.get(
                    &MhKey {
                        list: r.list,
                        chunk,
                    },
                    0,
                )
                .is_ok()
            }),
            _ => true,
        }
    }
}

/// The service address a `svcproxy_svc` key names; `None` for a key svcproxy
/// does not write (an unknown protocol or family).
fn dest_of(k: &SvcKey) -> Option<Dest> {
    let (protocol, family) = (wire::proto_of(k.proto)?, family_of(k.family)?);
    Some(Dest {
        family,
        ip: wire::addr_of(k.addr, k.family),
        protocol,
        port: wire::port_of(k.port),
    })
}

fn family_of(b: u8) -> Option<svcproxy_core::model::IpFamily> {
    match b {
        wire::FAMILY_V4 => Some(svcproxy_core::model::IpFamily::V4),
        wire::FAMILY_V6 => Some(svcproxy_core::model::IpFamily::V6),
        _ => None,
    }
}

fn encode(
    dest: &Dest,
    entry: &Entry,
    lists: &HashMap2<ListName, (u32, EndpointList)>,
) -> (SvcKey, SvcVal) {
    let key = SvcKey {
        addr: wire::addr_words(dest.ip),
        port: wire::port_word(dest.port),
        proto: wire::proto_byte(dest.protocol),
        family: wire::family_byte(dest.family),
    };
    let route = |r: &Route, masquerade: bool| {
        let (action, list, count, (sched, mh_size)) = match r {
            Route::Forward(name) => match lists.get(name) {
                Some((id, list)) => (
                    wire::ACT_FORWARD,
                    *id,
                    list.endpoints.len() as u32,
                    wire::sched_bytes(list.scheduler, list.endpoints.len()),
                ),
                None => (wire::ACT_REJECT, 0, 0, (0, 0)),
            },
            Route::Drop => (wire::ACT_DROP, 0, 0, (0, 0)),
            Route::Reject => (wire::ACT_REJECT, 0, 0, (0, 0)),
            Route::Pass => (wire::ACT_PASS, 0, 0, (0, 0)),
        };
        wire::Route {
            list,
            count,
            action,
            flags: if masquerade && action == wire::ACT_FORWARD {
                wire::ROUTE_MASQUERADE
            } else {
                0
            },
            sched,
            mh_size,
        }
    };
    let (affinity_id, affinity_secs) = entry.affinity.unwrap_or((0, 0));
    (
        key,
        SvcVal {
            pod: route(&entry.pod, false),
            host: route(&entry.host, false),
            pkt_pod: route(&entry.packet_pod.route, entry.packet_pod.masquerade),
            pkt_other: route(&entry.packet_other.route, entry.packet_other.masquerade),
            affinity_id,
            fw_id: entry.firewall.as_ref().map_or(0, PortName::id),
            affinity_secs,
            pad: 0,
        },
    )
}

/// What the packet path's connection table says the live-connection counts are
/// (`now` in the programs' seconds): each counted connection's endpoint once,
/// but for those idle past their timeout, which are returned to be forgotten.
fn flow_counts(
    entries: impl Iterator<Item = (CtKey, CtVal)>,
    now: u64,
    timeouts: &super::IdleTimeouts,
) -> (HashMap2<Backend, i64>, Vec<CtKey>) {
    let secs = |d: Option<std::time::Duration>| d.map_or(0, |d| d.as_secs().max(1));
    let (tcp, fin) = (secs(timeouts.tcp), secs(timeouts.tcp_fin));
    let mut counts: HashMap2<Backend, i64> = HashMap2::new();
    let mut expired = Vec::new();
    for (k, v) in entries {
        if k.dir != wire::CT_ORIGINAL || v.counted == 0 {
            continue;
        }
        let limit = if v.flags & wire::CT_CLOSING != 0 {
            fin
        } else {
            tcp
        };
        if limit != 0 && v.seen_s != 0 && now.saturating_sub(u64::from(v.seen_s)) > limit {
            expired.push(k);
            continue;
        }
        let be = Backend {
            addr: v.addr,
            port: v.port,
            family: k.family,
            pad: 0,
        };
        *counts.entry(be).or_default() += 1;
    }
    (counts, expired)
}

/// The monotonic clock in seconds, as the programs' `bpf_ktime_get_ns`.
fn monotonic_secs() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(ts.tv_sec).unwrap_or(0)
}

/// Whether a map update failed for want of room.
fn map_full(e: &aya::maps::MapError) -> bool {
    matches!(e, aya::maps::MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::E2BIG))
}

/// The service port an entry's routes belong to, for overflow reports.
fn entry_port(entry: &Entry) -> String {
    [
        &entry.pod,
        &entry.host,
        &entry.packet_pod.route,
        &entry.packet_other.route,
    ]
    .into_iter()
    .find_map(|r| match r {
        Route::Forward(l) => Some(l.service.to_string()),
        _ => None,
    })
    .or_else(|| entry.firewall.as_ref().map(|p| p.service.to_string()))
    .unwrap_or_else(|| "a service without endpoints".to_string())
}

/// What did not fit in the maps at the last write: keys per map, and the
/// service ports left out or rejecting because of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overflow {
    pub keys: BTreeMap<&'static str, usize>,
    pub ports: BTreeSet<String>,
}

impl Overflow {
    fn note(&mut self, map: &'static str, keys: usize, port: &dyn std::fmt::Display) {
        self.note_keys(map, keys);
        self.ports.insert(port.to_string());
    }

    /// Keys that did not fit without a service port left out for it (the
    /// guard's cluster IPs: their unexposed ports are not refused).
    fn note_keys(&mut self, map: &'static str, keys: usize) {
        *self.keys.entry(map).or_default() += keys;
    }

    /// Logs what did not fit, once per write.
    fn report(&self, sizes: &super::MapSizes) {
        if self.keys.is_empty() {
            return;
        }
        let first: Vec<&str> = self.ports.iter().take(10).map(String::as_str).collect();
        tracing::error!(
            maps = ?self.keys,
            sizes = ?sizes.by_map(),
            service_ports = self.ports.len(),
            first = ?first,
            "BPF maps are full: these service ports are not served as planned (their addresses not translated, or refused for want of room for their endpoints); everything else is; raise --ebpf-map-size-services / --ebpf-map-size-endpoints (svcproxy_rr and svcproxy_mh, the schedulers' state, hold 262,144 entries each, a Maglev list up to 256 of them: fewer or smaller endpoint weights, or fewer mh services, make room)"
        );
    }
}

/// Removes every key of `map` but those `keep` accepts; the number removed.
fn remove_unless<K: aya::Pod + std::fmt::Debug, V: aya::Pod>(
    map: &mut HashMap<MapData, K, V>,
    keep: impl Fn(&K) -> bool,
) -> Result<usize, DataPlaneError> {
    let stale: Vec<K> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|k| !keep(k))
        .collect();
    let mut ops = 0;
    for k in &stale {
        ops += remove(map, k)?;
    }
    Ok(ops)
}

/// Removes `key`; a key already gone is no error. 1 when one was removed.
fn remove<K: aya::Pod + std::fmt::Debug, V: aya::Pod>(
    map: &mut HashMap<MapData, K, V>,
    key: &K,
) -> Result<usize, DataPlaneError> {
    removed(map.remove(key), key)
}

/// An LPM trie key as plain parts (aya's key type compares nothing).
fn lpm_parts<K: aya::Pod>(k: &LpmKey<K>) -> (u32, K) {
    (k.prefix_len(), k.data())
}

/// [`remove_unless`] for an LPM trie.
fn lpm_remove_unless<K: aya::Pod + std::fmt::Debug, V: aya::Pod>(
    map: &mut LpmTrie<MapData, K, V>,
    keep: impl Fn(&LpmKey<K>) -> bool,
) -> Result<usize, DataPlaneError> {
    let stale: Vec<LpmKey<K>> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|k| !keep(k))
        .collect();
    let mut ops = 0;
    for k in &stale {
        ops += removed(map.remove(k), &lpm_parts(k))?;
    }
    Ok(ops)
}

/// A removal's result: 1 removed, 0 already gone, or the error.
fn removed(
    r: Result<(), aya::maps::MapError>,
    key: &dyn std::fmt::Debug,
) -> Result<usize, DataPlaneError> {
    match r {
        Ok(()) => Ok(1),
        Err(aya::maps::MapError::KeyNotFound) => Ok(0),
        Err(aya::maps::MapError::SyscallError(e))
            if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
        {
            Ok(0)
        }
        Err(e) => Err(kernel_err(format!("deleting {key:?}"), e)),
    }
}

/// Program `name` of `ebpf`, as the type its section says.
fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, DataPlaneError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or_else(|| kernel_err(name, "missing from the object"))?
        .try_into()
        .map_err(|e| kernel_err(name, e))
}

/// Pins `link` at `pin` under a new name, then renames it over whatever is
/// pinned there (an earlier process's link): the old link stays attached until
/// the new one is in its place, and a failure leaves the old one in force.
fn pin_in_place(link: FdLink, pin: &Path) -> Result<(), DataPlaneError> {
    let mut fresh = pin.as_os_str().to_owned();
    fresh.push("-new");
    let fresh = PathBuf::from(fresh);
    let _ = std::fs::remove_file(&fresh);
    link.pin(&fresh)
        .map_err(|e| kernel_err(format!("pinning {}", fresh.display()), e))?;
    std::fs::rename(&fresh, pin).map_err(|e| kernel_err(format!("pinning {}", pin.display()), e))
}

fn take<T>(ebpf: &mut Ebpf, name: &str) -> Result<T, DataPlaneError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .take_map(name)
        .ok_or_else(|| kernel_err(name, "missing from the object"))?;
    T::try_from(map).map_err(|e| kernel_err(name, e))
}

/// A program load error with the verifier's log when there is one.
fn verifier(e: aya::programs::ProgramError) -> String {
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

/// A pinned map of `pin_dir` opened as `T`.
fn open_pinned<T>(pin_dir: &Path, name: &str) -> Result<T, DataPlaneError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let pin = pin_dir.join(name);
    let data =
        MapData::from_pin(&pin).map_err(|e| kernel_err(format!("opening {}", pin.display()), e))?;
    let map = match name {
        "svcproxy_cfg" => aya::maps::Map::Array(data),
        "svcproxy_aff" | "svcproxy_affip" => aya::maps::Map::LruHashMap(data),
        "svcproxy_fw" | "svcproxy_podnet" | "svcproxy_guard" => aya::maps::Map::LpmTrie(data),
        _ => aya::maps::Map::HashMap(data),
    };
    T::try_from(map).map_err(|e| kernel_err(name, e))
}

/// The XDP program's packets so far, summed over CPUs: sent on to an endpoint,
/// dropped, and left to the stack (the tc programs); zeros when it never ran,
/// `None` when the programs' maps are not pinned in `pin_dir`.
pub fn xdp_packets(pin_dir: &Path) -> Option<[u64; 3]> {
    per_cpu_sums(pin_dir, "svcproxy_xdp_stats")
}

/// svcproxy's own masquerade so far, summed over CPUs: ports taken for new
/// connections, and new connections that found none free (left to the kernel's
/// masquerade); `None` when the map is not pinned.
pub fn masquerade_ports(pin_dir: &Path) -> Option<[u64; 2]> {
    per_cpu_sums(pin_dir, "svcproxy_snat_stats")
}

/// The first `N` counters of a pinned per-CPU array, summed over CPUs.
fn per_cpu_sums<const N: usize>(pin_dir: &Path, map: &str) -> Option<[u64; N]> {
    let data = MapData::from_pin(pin_dir.join(map)).ok()?;
    let stats: aya::maps::PerCpuArray<MapData, u64> =
        aya::maps::PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data)).ok()?;
    let mut out = [0u64; N];
    for (i, n) in out.iter_mut().enumerate() {
        *n = stats.get(&(i as u32), 0).ok()?.iter().sum();
    }
    Some(out)
}

/// What the maps pinned in `pin_dir` hold, as text: the configuration, each
/// service entry with its routes' endpoints resolved, the admitted sources, the
/// pods' CIDRs and interfaces, and the affinity entries (age in seconds). Read
/// without loading anything; for tests and operators (`svcproxy render` prints
/// the plan, this the kernel).
pub fn dump(pin_dir: &Path) -> Result<String, DataPlaneError> {
    use std::fmt::Write as _;
    let cfg: Array<MapData, Config> = open_pinned(pin_dir, "svcproxy_cfg")?;
    let mut out = String::new();
    let c = cfg
        .get(&0, 0)
        .map_err(|e| kernel_err("reading svcproxy_cfg", e))?;
    let _ = writeln!(out, "generation {}", c.generation);
    let _ = writeln!(out, "host-only {}", c.host_only);
    if let Some([forwarded, dropped, passed]) = xdp_packets(pin_dir) {
        let _ = writeln!(
            out,
            "xdp forwarded {forwarded} dropped {dropped} passed {passed}"
        );
    }
    let mut lines = vec![marks_line(c.masquerade_mark, c.reject_mark)];
    lines.extend(service_lines(pin_dir)?);
    lines.extend(address_lines(pin_dir)?);
    lines.extend(affinity_lines(pin_dir)?);
    lines.extend(connection_lines(pin_dir));
    lines.sort();
    for l in lines {
        out.push_str(&l);
        out.push('\n');
    }
    Ok(out)
}

/// Each service entry with its routes (the endpoints of each list).
fn service_lines(pin_dir: &Path) -> Result<Vec<String>, DataPlaneError> {
    let svc: HashMap<MapData, SvcKey, SvcVal> = open_pinned(pin_dir, "svcproxy_svc")?;
    let slot: HashMap<MapData, SlotKey, Backend> = open_pinned(pin_dir, "svcproxy_slot")?;
    let mut lines = Vec::new();
    let mut lists: BTreeMap<u32, BTreeMap<u32, SocketAddr>> = BTreeMap::new();
    for (k, be) in slot.iter().filter_map(Result::ok) {
        if let Some(a) = be.socket_addr() {
            lists.entry(k.list).or_default().insert(k.slot, a);
        }
    }
    let route = |r: &wire::Route, packet: bool| {
        let eps: Vec<SocketAddr> = lists
            .get(&r.list)
            .map(|l| l.values().copied().collect())
            .unwrap_or_default();
        let masq = packet && r.flags & wire::ROUTE_MASQUERADE != 0;
        route_text(r.action, &eps, masq, r.sched)
    };
    for (k, v) in svc.iter().filter_map(Result::ok) {
        let Some(dest) = dest_of(&k) else {
            continue;
        };
        let routes = [
            route(&v.pod, false),
            route(&v.host, false),
            route(&v.pkt_pod, true),
            route(&v.pkt_other, true),
        ];
        let affinity = (v.affinity_secs > 0).then_some(v.affinity_secs);
        lines.push(service_line(&dest, &routes, affinity, v.fw_id));
    }
    Ok(lines)
}

/// The sets of addresses and networks, the source ranges and the interfaces;
/// what cannot be read, as problems.
fn address_lines(pin_dir: &Path) -> Result<Vec<String>, DataPlaneError> {
    let fw: LpmTrie<MapData, FwData, u8> = open_pinned(pin_dir, "svcproxy_fw")?;
    let podnet: LpmTrie<MapData, PodnetData, u8> = open_pinned(pin_dir, "svcproxy_podnet")?;
    let ifc: HashMap<MapData, u32, u32> = open_pinned(pin_dir, "svcproxy_ifc")?;
    let local: HashMap<MapData, LocalKey, u8> = open_pinned(pin_dir, "svcproxy_local")?;
    let vip: HashMap<MapData, LocalKey, u8> = open_pinned(pin_dir, "svcproxy_vip")?;
    let guard: LpmTrie<MapData, PodnetData, u8> = open_pinned(pin_dir, "svcproxy_guard")?;
    let mut lines = Vec::new();
    let mut problems = Vec::new();
    for (label, map) in [("local-address", &local), ("cluster-ip", &vip)] {
        let addrs = addrs_in(map, label, &mut problems);
        lines.extend(addrs.iter().map(|ip| format!("{label} {ip}")));
    }
    for (label, map) in [("pod-cidr", &podnet), ("guard-cidr", &guard)] {
        let nets = nets_in(map, label, &mut problems);
        lines.extend(nets.iter().map(|net| format!("{label} {net}")));
    }
    lines.extend(problems.into_iter().map(|p| format!("problem {p}")));
    for k in fw.keys().filter_map(Result::ok) {
        let len = k.prefix_len().saturating_sub(64);
        let d = k.data();
        let v4 = len <= 32 && d.addr[1..] == [0, 0, 0];
        if let Some((id, net)) = wire::fw_of(&k, v4) {
            lines.push(format!("source-range {id:#x} {net}"));
        }
    }
    for (index, flags) in ifc.iter().filter_map(Result::ok) {
        let what = if flags & wire::IFC_PODS != 0 {
            "pods"
        } else {
            "other"
        };
        lines.push(format!("interface {index} {what}"));
    }
    Ok(lines)
}

/// The ClientIP affinities held, by client address (packets) and by socket
/// namespace (connects), with their age.
fn affinity_lines(pin_dir: &Path) -> Result<Vec<String>, DataPlaneError> {
    let aff: HashMap<MapData, wire::AffKey, wire::AffVal> = open_pinned(pin_dir, "svcproxy_aff")?;
    let affip: HashMap<MapData, wire::AffIpKey, wire::AffVal> =
        open_pinned(pin_dir, "svcproxy_affip")?;
    let mut lines = Vec::new();
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let now_ns = now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64;
    let age = |last: u64| now_ns.saturating_sub(last) / 1_000_000_000;
    for (k, v) in affip.iter().filter_map(Result::ok) {
        let family = if k.client[1..] == [0, 0, 0] {
            wire::FAMILY_V4
        } else {
            wire::FAMILY_V6
        };
        let client = wire::addr_of(k.client, family).map_or("?".to_string(), |a| a.to_string());
        let be =
            v.be.socket_addr()
                .map_or("?".to_string(), |a| a.to_string());
        lines.push(format!(
            "affinity {:#x} client {client} endpoint {be} age {}s",
            k.affinity_id,
            age(v.last_ns)
        ));
    }
    for (k, v) in aff.iter().filter_map(Result::ok) {
        let be =
            v.be.socket_addr()
                .map_or("?".to_string(), |a| a.to_string());
        lines.push(format!(
            "affinity {:#x} netns {:#x} endpoint {be} age {}s",
            k.affinity_id,
            k.client,
            age(v.last_ns)
        ));
    }
    Ok(lines)
}

/// The lc scheduler's live connections per endpoint.
fn connection_lines(pin_dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    // The lc scheduler's live connections per endpoint (none before a release
    // that has the map).
    for (map, label) in [
        ("svcproxy_conns", "connections"),
        ("svcproxy_flows", "packet-connections"),
    ] {
        let counts: Option<HashMap<MapData, Backend, i64>> = open_pinned(pin_dir, map).ok();
        for (be, n) in counts.iter().flat_map(|m| m.iter().filter_map(Result::ok)) {
            if let Some(a) = be.socket_addr() {
                lines.push(format!("{label} {a} {n}"));
            }
        }
    }
    lines
}

/// The addresses a set of addresses (`svcproxy_local`, `svcproxy_vip`) holds;
/// what cannot be read, as problems.
fn addrs_in(
    map: &HashMap<MapData, LocalKey, u8>,
    name: &str,
    problems: &mut Vec<String>,
) -> BTreeSet<std::net::IpAddr> {
    let mut out = BTreeSet::new();
    for k in map.keys() {
        match k {
            Ok(k) => out.extend(wire::addr_of(k.addr, k.family)),
            Err(e) => problems.push(format!("reading {name}: {e}")),
        }
    }
    out
}

/// The prefixes a set of prefixes (`svcproxy_podnet`, `svcproxy_guard`) holds;
/// what cannot be read, as problems.
fn nets_in(
    map: &LpmTrie<MapData, PodnetData, u8>,
    name: &str,
    problems: &mut Vec<String>,
) -> BTreeSet<IpNet> {
    let mut out = BTreeSet::new();
    for k in map.keys() {
        match k.map(|k| wire::podnet_of(&k)) {
            Ok(Some(net)) => {
                out.insert(net);
            }
            Ok(None) => problems.push(format!("a key of {name} is malformed")),
            Err(e) => problems.push(format!("reading {name}: {e}")),
        }
    }
    out
}

/// A route as [`dump`] writes it: `forward [ENDPOINTS]` (` masquerade` on the
/// packet path), `drop`, `reject` or `pass`.
fn route_text(action: u8, endpoints: &[SocketAddr], masquerade: bool, sched: u8) -> String {
    match action {
        wire::ACT_FORWARD => {
            let eps: Vec<String> = endpoints.iter().map(|a| a.to_string()).collect();
            let masq = if masquerade { " masquerade" } else { "" };
            let by = match wire::scheduler_of(sched) {
                Scheduler::Random => String::new(),
                s => format!(" [{s}]"),
            };
            format!("forward [{}]{masq}{by}", eps.join(" "))
        }
        wire::ACT_DROP => "drop".to_string(),
        wire::ACT_PASS => "pass".to_string(),
        _ => "reject".to_string(),
    }
}

/// A service entry as [`dump`] writes it: address and port apart (as rule
/// listings write them), then the socket and packet routes.
fn service_line(dest: &Dest, routes: &[String; 4], affinity: Option<u32>, fw_id: u64) -> String {
    use std::fmt::Write as _;
    let ip = dest
        .ip
        .map_or(format!("{}-local", dest.family), |ip| ip.to_string());
    let mut line = format!(
        "service {ip} {}/{} pod: {} host: {} packet-pod: {} packet-other: {}",
        dest.port,
        dest.protocol.as_str().to_ascii_lowercase(),
        routes[0],
        routes[1],
        routes[2],
        routes[3]
    );
    if let Some(secs) = affinity {
        let _ = write!(line, " affinity: {secs}s");
    }
    if fw_id != 0 {
        let _ = write!(line, " source-ranges: {fw_id:#x}");
    }
    line
}

fn marks_line(masquerade: u32, reject: u32) -> String {
    format!("marks masquerade {masquerade:#x} reject {reject:#x}")
}

/// The lines of [`dump`] that `table` says the maps must hold (entries with
/// their lists resolved, admitted sources, pods' CIDRs, local addresses, marks):
/// what a process that did not write the maps compares them with.
pub fn expected_lines(table: &Table) -> BTreeSet<String> {
    let text = |r: &Route, masquerade: bool| match r {
        // A forward to a list the table lacks is written as a reject ([`encode`]).
        Route::Forward(name) => match table.lists.get(name) {
            Some(l) => route_text(
                wire::ACT_FORWARD,
                &l.endpoints,
                masquerade,
                wire::sched_bytes(l.scheduler, l.endpoints.len()).0,
            ),
            None => route_text(wire::ACT_REJECT, &[], false, 0),
        },
        Route::Drop => route_text(wire::ACT_DROP, &[], false, 0),
        Route::Reject => route_text(wire::ACT_REJECT, &[], false, 0),
        Route::Pass => route_text(wire::ACT_PASS, &[], false, 0),
    };
    let mut out = BTreeSet::new();
    out.insert(marks_line(table.masquerade_mark, table.reject_mark));
    for (dest, e) in &table.entries {
        let routes = [
            text(&e.pod, false),
            text(&e.host, false),
            text(&e.packet_pod.route, e.packet_pod.masquerade),
            text(&e.packet_other.route, e.packet_other.masquerade),
        ];
        let fw = e.firewall.as_ref().map_or(0, PortName::id);
        out.insert(service_line(dest, &routes, e.affinity.map(|(_, s)| s), fw));
    }
    for (port, nets) in &table.firewalls {
        for net in nets {
            out.insert(format!("source-range {:#x} {net}", port.id()));
        }
    }
    for net in &table.pod_cidrs {
        out.insert(format!("pod-cidr {net}"));
    }
    for ip in &table.local_addrs {
        out.insert(format!("local-address {ip}"));
    }
    for ip in table.cluster_ips.keys() {
        out.insert(format!("cluster-ip {ip}"));
    }
    for net in &table.guard_cidrs {
        out.insert(format!("guard-cidr {net}"));
    }
    out
}

/// The network namespace cookie the pinned configuration names as the host's.
fn pinned_owner(pin_dir: &Path) -> Option<u64> {
    let pin = pin_dir.join("svcproxy_cfg");
    if !pin.exists() {
        return None;
    }
    let data = match MapData::from_pin(&pin) {
        Ok(d) => d,
        Err(e) => {
            tracing::debug!(pin = %pin.display(), error = %e, "cannot open the pinned configuration");
            return None;
        }
    };
    let cfg: Array<MapData, Config> = Array::try_from(aya::maps::Map::Array(data)).ok()?;
    cfg.get(&0, 0).ok().map(|c| c.host_netns_cookie)
}

/// The interface indexes whose packet-program links are pinned in `pin_dir`.
fn pinned_interfaces(pin_dir: &Path) -> BTreeSet<u32> {
    let Ok(dir) = std::fs::read_dir(pin_dir) else {
        return BTreeSet::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_prefix("tc-")
                .or_else(|| name.strip_prefix("xdp-"))?
                .split('-')
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// Releases the packet programs' links of interface `index` (detaching them,
/// when the interface is still there).
fn release_interface(pin_dir: &Path, index: u32) -> Result<(), DataPlaneError> {
    for (_, _, suffix) in TC_PROGRAMS {
        release_pin(pin_dir, &format!("tc-{index}-{suffix}"))?;
    }
    release_xdp(pin_dir, index)
}

/// Releases the XDP program's link of interface `index`.
fn release_xdp(pin_dir: &Path, index: u32) -> Result<(), DataPlaneError> {
    release_pin(pin_dir, &format!("xdp-{index}"))
}

/// Releases the link pinned as `name` (and one left half-pinned beside it).
fn release_pin(pin_dir: &Path, name: &str) -> Result<(), DataPlaneError> {
    for name in [format!("{name}-new"), name.to_string()] {
        let pin = pin_dir.join(name);
        if !pin.exists() {
            continue;
        }
        let link = PinnedLink::from_pin(&pin)
            .map_err(|e| kernel_err(format!("opening {}", pin.display()), e))?;
        link.unpin()
            .map_err(|e| kernel_err(format!("unpinning {}", pin.display()), e))?;
    }
    Ok(())
}

/// Whether interface `index` still has `name`.
fn still_there(index: u32, name: &str) -> bool {
    crate::kernel::host_addrs::ether_links()
        .is_ok_and(|l| l.iter().any(|l| l.index == index && l.name == name))
}

/// Removes what svcproxy pinned in `pin_dir`: the links first (detaching the
/// programs), then the maps, then the directory. Nothing there is no error.
///
/// Pins another network namespace's svcproxy made (the host's, seen from a
/// namespace sharing its filesystem) are left alone: the cookie of the namespace
/// whose processes count as the host, pinned in `svcproxy_cfg`, must be this one's.
pub fn cleanup(pin_dir: &Path) -> Result<(), DataPlaneError> {
    if !pin_dir.exists() {
        return Ok(());
    }
    if let Some(owner) = pinned_owner(pin_dir) {
        let here = netns_cookie()?;
        if owner != here {
            tracing::warn!(
                pin_dir = %pin_dir.display(),
                "the eBPF pins there belong to svcproxy in another network namespace; left alone"
            );
            return Ok(());
        }
    }
    for index in pinned_interfaces(pin_dir) {
        release_interface(pin_dir, index)?;
    }
    for name in socket_programs() {
        let _ = std::fs::remove_file(pin_dir.join(format!("link-{name}-new")));
        let pin = pin_dir.join(format!("link-{name}"));
        if pin.exists() {
            let link = PinnedLink::from_pin(&pin)
                .map_err(|e| kernel_err(format!("opening {}", pin.display()), e))?;
            link.unpin()
                .map_err(|e| kernel_err(format!("unpinning {}", pin.display()), e))?;
        }
    }
    for name in MAPS.iter().chain(&RETIRED_MAPS) {
        let pin = pin_dir.join(name);
        match std::fs::remove_file(&pin) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(kernel_err(format!("unpinning {}", pin.display()), e)),
        }
    }
    match std::fs::remove_dir(pin_dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(kernel_err(format!("removing {}", pin_dir.display()), e)),
    }
}

/// What is pinned in `pin_dir` of svcproxy's: links and maps present, by name.
pub fn pinned(pin_dir: &Path) -> Vec<String> {
    socket_programs()
        .map(|n| format!("link-{n}"))
        .chain(MAPS.iter().map(|m| m.to_string()))
        .filter(|n| pin_dir.join(n).exists())
        .collect()
}

/// The links that should be pinned and are not.
pub fn missing_links(pin_dir: &Path) -> Vec<String> {
    socket_programs()
        .map(|n| format!("link-{n}"))
        .filter(|n| !pin_dir.join(n).exists())
        .collect()
}

/// Where a cgroup v2 hierarchy is mounted, from `/proc/self/mountinfo`.
pub fn cgroup2_root() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn kernel_versions_are_read_from_releases() {
        assert_eq!(kernel_version("6.12.48+deb13-amd64"), Some((6, 12)));
        assert_eq!(kernel_version("6.6.0"), Some((6, 6)));
        assert_eq!(kernel_version("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(kernel_version("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(kernel_version("4.18.0-513.el8.x86_64"), Some((4, 18)));
        assert!(kernel_version("6.6.0").is_some_and(|v| v < (6, 7)));
        assert!(kernel_version("6.10.0").is_some_and(|v| v >= (6, 7)));
        assert_eq!(kernel_version("6"), None);
        assert_eq!(kernel_version(""), None);
        assert_eq!(kernel_version("linux-6.6"), None);
    }

    #[test]
    fn the_port_range_high_end_is_read_as_the_kernel_prints_it() {
        assert_eq!(range_high("32768\t60999\n"), Some(60999));
        assert_eq!(range_high("1024 65535"), Some(65535));
        assert_eq!(range_high("32768"), None);
        assert_eq!(range_high("32768\t70000\n"), None);
        assert_eq!(range_high(""), None);
    }

    #[test]
    fn a_range_overlaps_the_masquerade_from_its_first_port_on() {
        assert!(!overlaps("32768\t60999\n", 61000));
        assert!(overlaps("32768\t61000\n", 61000));
        assert!(overlaps("1024 65535", 61000));
        assert!(!overlaps("unreadable", 61000));
    }

    fn flow(
        client_port: u16,
        endpoint: &str,
        counted: bool,
        flags: u8,
        seen_s: u32,
    ) -> (CtKey, CtVal) {
        let be = Backend::of(endpoint.parse().unwrap());
        (
            CtKey {
                saddr: wire::addr_words(Some("198.51.100.7".parse().unwrap())),
                daddr: wire::addr_words(Some("198.19.0.10".parse().unwrap())),
                sport: client_port,
                dport: 80,
                proto: 6,
                family: wire::FAMILY_V4,
                dir: wire::CT_ORIGINAL,
                pad: 0,
            },
            CtVal {
                addr: be.addr,
                port: be.port,
                flags,
                counted: u8::from(counted),
                seen_s,
                created_ns: 0,
            },
        )
    }

    #[test]
    fn the_packet_paths_counts_are_what_its_connection_table_holds() {
        let a = "10.244.1.5:8080";
        let b = "10.244.2.5:8080";
        let mut reply = flow(9, a, true, 0, 1000);
        reply.0.dir = 1;
        let entries = vec![
            flow(1, a, true, 0, 1000),
            flow(2, a, true, 0, 1000),
            // Released at its FIN: no longer counted.
            flow(3, a, false, wire::CT_CLOSING, 1000),
            flow(4, b, true, 0, 1000),
            // Idle for 500 s, past a 300 s tcp timeout: forgotten.
            flow(5, b, true, 0, 500),
            // Closing and idle past a 60 s tcpfin timeout.
            flow(6, b, true, wire::CT_CLOSING, 900),
            // Never touched (a release without idle timeouts wrote it): kept.
            flow(7, b, true, 0, 0),
            // A reply entry counts nothing.
            reply,
        ];
        let timeouts = crate::IdleTimeouts {
            tcp: Some(Duration::from_secs(300)),
            tcp_fin: Some(Duration::from_secs(60)),
            udp: None,
        };
        let (counts, expired) = flow_counts(entries.clone().into_iter(), 1001, &timeouts);
        let be = |s: &str| Backend::of(s.parse().unwrap());
        assert_eq!(counts.get(&be(a)), Some(&2));
        assert_eq!(counts.get(&be(b)), Some(&2));
        let gone: Vec<u16> = expired.iter().map(|k| k.sport).collect();
        assert_eq!(gone, [5, 6]);
        // Without timeouts nothing idles out.
        let (counts, expired) =
            flow_counts(entries.into_iter(), 1001, &crate::IdleTimeouts::default());
        assert_eq!(counts.get(&be(b)), Some(&4));
        assert!(expired.is_empty());
    }
}
