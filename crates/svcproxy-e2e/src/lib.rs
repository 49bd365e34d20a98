//! Real-packet end-to-end harness for svcproxy.
//!
//! Tests build a small Kubernetes-like cluster out of Linux network namespaces (nodes on a
//! bridged LAN, pods behind each node, an external client), start echo backends in the
//! pods, run svcproxy inside the node namespaces, and send real TCP / UDP / SCTP traffic
//! to see which backend answered, what client address it saw, and whether a failure was an
//! immediate refusal or a timeout.
//!
//! Safety: everything happens inside namespaces named `svp-<pid>-…` that the harness
//! creates and deletes itself (on drop, also while unwinding from a panic; leftovers of dead
//! processes go with [`cleanup_stale`]). The root namespace's rules, routes, sysctls and
//! interfaces are never touched, and all addresses come from the test ranges in [`plan`].
//!
//! ```no_run
//! use std::time::Duration;
//! use svcproxy_e2e::{BackendPorts, Cluster, ClusterSpec, Family, Host, Proto};
//!
//! if !svcproxy_e2e::require_root_or_skip() {
//!     return;
//! }
//! let cluster = Cluster::create(ClusterSpec::default()).unwrap();
//! let _backends = cluster.start_backends(&BackendPorts::all(&[8080])).unwrap();
//! let target = (cluster.ip(Host::Pod(1, 0), Family::V4), 8080).into();
//! let attempts = cluster.probe(Host::Pod(0, 0), Proto::Tcp, target, 3, Duration::from_secs(1));
//! assert!(attempts.iter().all(|a| a.backend() == Some("pod-b0")));
//! ```
//!
//! # What this kernel taught us (worth knowing when writing data-plane tests)
//!
//! * **SCTP**: kernels without the SCTP socket module (as on this project's machines) still
//!   track and NAT SCTP in netfilter. `svcproxy-echo` then speaks the first SCTP exchange
//!   over raw sockets ([`sctp_raw`]), so SCTP tests run for real instead of skipping;
//!   [`SctpMode`] says which mode is in use.
//! * **REJECT for TCP**: an ICMP port-unreachable answering a SYN over an all-veth path
//!   arrives while `connect()` still holds the socket lock; the kernel drops it
//!   (`TcpExtLockDroppedIcmps`) and the client sees the refusal only at the first SYN
//!   retransmit, ~1 s later (always so for IPv6 here). `reject with tcp reset` is
//!   immediate in both families; UDP and SCTP refusals by ICMP are immediate.
//! * **Masquerade** picks the address of the interface a packet leaves by: a backend on
//!   another node sees the node's LAN IP, a backend on the same node sees the node's pod
//!   gateway address ([`plan::pod_gateway`]).
//! * **IPv6 DAD** is off in every namespace (`accept_dad=0`, `nodad`), so addresses work at
//!   once; bridged frames are kept away from netfilter in the LAN namespace
//!   (`bridge-nf-call-*=0`, where br_netfilter exists).
//!
//! Modules: [`plan`] (addresses), [`cluster`] (topology and probes), [`process`] (processes
//! in namespaces), [`netns`] (namespace lifecycle and the skip rule, from
//! `svcproxy-testkit`), [`echo`] / [`sctp_raw`] (the `svcproxy-echo` tool), [`probe`]
//! (results), [`bins`] (binary locations).

pub mod bins;
pub mod cluster;
pub mod echo;
pub mod plan;
pub mod probe;
pub mod process;
pub mod sctp_raw;
pub mod xdp;

pub mod nodeport_bench;

pub use bins::{demo_bin, echo_bin, loadgen_bin, svcproxy_bin};
pub use cluster::{
    BackendPorts, Backends, Cluster, ClusterSpec, Host, PodInfo, ProbeSpec, NODE_A, NODE_B,
};
pub use echo::SctpMode;
pub use plan::Family;
pub use probe::{tally, Attempt, ProbeResult, Proto, Reply};
pub use process::NsProcess;
pub use svcproxy_testkit::confine::Confinement;
pub use svcproxy_testkit::netns;
pub use svcproxy_testkit::netns::cleanup_stale;

/// The tools the harness needs besides root.
pub const TOOLS: &[&str] = &["ip", "nft", "sysctl"];

/// Returns `true` when the harness can run here; otherwise applies the workspace's one
/// skip rule ([`netns::can_run`]: print `SKIP`, or fail under `CI`).
pub fn require_root_or_skip() -> bool {
    netns::can_run("svcproxy-e2e", TOOLS)
}

/// Returns `true` when SCTP can be probed here (kernel sockets or the raw-socket emulation);
/// otherwise prints why and returns `false` so an SCTP test can return early.
pub fn sctp_available_or_skip() -> bool {
    match SctpMode::detect() {
        SctpMode::Unavailable => {
            eprintln!("skipped: SCTP unavailable (no SCTP sockets and no raw sockets)");
            false
        }
        _ => true,
    }
}

/// Whether this machine can run the eBPF data plane of `opts` in network
/// namespace `ns`, as the mode's own preflight says at start (the kernel's program
/// types, helpers, file systems); otherwise the skip rule, naming what is missing.
/// A test that passes this and then fails to sync has found a bug, not a machine
/// that cannot run it: its sync errors are failures, never skips.
pub fn ebpf_runs_here(test: &str, ns: &str, opts: &svcproxy_dataplane::EbpfOptions) -> bool {
    use svcproxy_dataplane::DataPlane as _;
    let mut plane = svcproxy_dataplane::EbpfDataPlane::new(opts.clone());
    match svcproxy_testkit::netns::in_netns(ns, || plane.preflight()) {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            svcproxy_testkit::netns::skip(
                test,
                &format!("this machine cannot run the ebpf mode: {e}"),
            );
            false
        }
        Err(e) => panic!("{test}: entering {ns}: {e}"),
    }
}

/// The eBPF data plane confined to `c`'s cgroup and bpffs.
pub fn ebpf_options(c: &Confinement) -> svcproxy_dataplane::EbpfOptions {
    svcproxy_dataplane::EbpfOptions {
        cgroup: c.cgroup().to_path_buf(),
        pin_dir: c.pin_dir(),
        host_namespace_only: false,
        xdp: svcproxy_dataplane::ebpf::XdpMode::Off,
        xdp_interfaces: Vec::new(),
        sizes: svcproxy_dataplane::ebpf::MapSizes::DEFAULT,
        timeouts: Default::default(),
    }
}
