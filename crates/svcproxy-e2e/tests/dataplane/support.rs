//! Support for the data-plane tests: manifests written the way `examples/cluster/` writes
//! them, svcproxy started in every node namespace, and assertions that collect every
//! failed observation of a test before failing it (so one run tells the whole story).
//!
//! Manifest builders: [`Svc`], [`SvcPort`], [`Slice`], [`Ep`], [`nodes_yaml`],
//! [`service_cidr_yaml`]. Running: [`Env::start`] (cluster + echo backends + manifests +
//! one svcproxy per node, synced), [`Env::write`] / [`Env::remove`] to edit manifests
//! while svcproxy runs. Assertions: [`Checks`].
//!
//! **Modes.** Every test is written once and runs once per data plane: write it as
//! `fn name(mode: Mode)`, list it in the file's [`per_mode!`], and it runs as
//! `<mode>::<name>` for each [`Mode`]. What a test reads back
//! from the kernel (is anything programmed, the rules as text, affinity state, per-service
//! chains, cleanup leaving foreign objects alone) goes through [`Mode`], so a test body
//! never names a mode's tool. Adding a mode: a variant and its arms in [`Mode`], one
//! module in [`per_mode!`]; `every_implemented_mode_runs_the_suite` fails until both exist.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use svcproxy_e2e::plan::{self, Family};
use svcproxy_e2e::{
    svcproxy_bin, tally, Attempt, BackendPorts, Backends, Cluster, ClusterSpec, Host, NsProcess,
    ProbeResult, ProbeSpec, Proto, SctpMode,
};

/// Runs each listed test function (`fn name(mode: Mode)`) once per [`Mode`], as
/// `<mode>::<name>`: `cargo test nftables::` runs one mode's suite, `cargo test captures_`
/// one test in every mode. A test function left out of the list is dead code, which the
/// build rejects.
#[macro_export]
macro_rules! per_mode {
    ($($test:ident),* $(,)?) => {
        mod nftables {
            $(
                #[test]
                fn $test() {
                    super::$test(super::Mode::Nftables)
                }
            )*
        }
        mod iptables {
            $(
                #[test]
                fn $test() {
                    super::$test(super::Mode::Iptables)
                }
            )*
        }
        mod iptables_legacy {
            $(
                #[test]
                fn $test() {
                    super::$test(super::Mode::IptablesLegacy)
                }
            )*
        }
        mod userspace {
            $(
                #[test]
                fn $test() {
                    super::$test(super::Mode::Userspace)
                }
            )*
        }
        mod ebpf {
            $(
                #[test]
                fn $test() {
                    super::$test(super::Mode::Ebpf)
                }
            )*
        }
        mod ipvs {
            $(
                #[test]
                fn $test() {
                    super::$test(super::Mode::Ipvs)
                }
            )*
        }
    };
}

/// [`per_mode!`] for behaviours of flows that outlive a sync or a restart (the
/// kernel's conntrack entries, the ebpf mode's pinned connection table): every mode
/// but the userspace one, whose flows live in the proxy process (its UDP flows moving off a removed endpoint are tested in
/// `svcproxy-dataplane`'s `tests/userspace.rs`).
#[macro_export]
macro_rules! per_kernel_mode {
    ($($test:ident),* $(,)?) => {
        mod nftables {
            $(
                #[test]
                fn $test() {
                    super::$test(super::Mode::Nftables)
                }
            )*
        }
        mod iptables {
            $(
                #[test]
                fn $test() {
                    super::$test(super::Mode::Iptables)
                }
            )*
        }
        mod iptables_legacy {
            $(
                #[test]
                fn $test() {
                    super::$test(super::Mode::IptablesLegacy)
                }
            )*
        }
        mod ebpf {
            $(
                #[test]
                fn $test() {
                    super::$test(super::Mode::Ebpf)
                }
            )*
        }
        mod ipvs {
            $(
                #[test]
                fn $test() {
                    super::$test(super::Mode::Ipvs)
                }
            )*
        }
    };
}

/// A data plane the suite runs in, and how a test reads back what svcproxy programmed
/// there. Only this type names a mode's tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Nftables,
    /// iptables mode with the host's `iptables` (here `nf_tables`, as Debian's default).
    Iptables,
    /// iptables mode on a node whose `iptables` is the legacy (x_tables) backend: svcproxy
    /// runs with a `PATH` whose `iptables*` tools are `iptables-legacy*`, as a node
    /// whose alternatives point there, and must detect and drive that backend.
    IptablesLegacy,
    /// The userspace proxy: the nftables mode's table captures connections to the
    /// proxy's own sockets, and the proxy connects to the endpoint from the node.
    Userspace,
    /// The eBPF data plane: sockets of the node's processes (moved into a cgroup of
    /// the test's, one per node) translated at connect(), packets by tc programs
    /// on the node's interfaces; maps pinned in a bpffs of the test's.
    Ebpf,
    /// kube-proxy's ipvs mode: the eBPF data plane with the ipvs mode's defaults
    /// (round robin, NodePorts on every local address).
    Ipvs,
}

/// A kind of per-service object, for counting what a sync left behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceObject {
    /// One per service port and family (nftables: a `service-<hash>` chain).
    Service,
    /// One per endpoint (nftables: an `endpoint-<hash>` chain).
    Endpoint,
}

impl Mode {
    /// Every mode the suite runs in (must equal svcproxy's implemented modes).
    pub const ALL: &'static [Mode] = &[
        Mode::Nftables,
        Mode::Iptables,
        Mode::IptablesLegacy,
        Mode::Userspace,
        Mode::Ebpf,
        Mode::Ipvs,
    ];

    /// The `--proxy-mode` value.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Nftables => "nftables",
            Mode::Iptables | Mode::IptablesLegacy => "iptables",
            Mode::Userspace => "userspace",
            Mode::Ebpf => "ebpf",
            Mode::Ipvs => "ipvs",
        }
    }

    /// The mode and, for iptables, the backend of the tools (for messages).
    pub fn label(self) -> &'static str {
        match self {
            Mode::Nftables => "nftables",
            Mode::Iptables => "iptables",
            Mode::IptablesLegacy => "iptables (legacy)",
            Mode::Userspace => "userspace",
            Mode::Ebpf => "ebpf",
            Mode::Ipvs => "ipvs",
        }
    }

    /// Whether the mode runs on the eBPF data plane (ebpf, ipvs).
    pub fn ebpf_data_plane(self) -> bool {
        matches!(self, Mode::Ebpf | Mode::Ipvs)
    }

    /// The `iptables` tool `base` (`iptables`, `ip6tables-save`, ...) of this mode's backend.
    pub fn tool(self, base: &str) -> String {
        match self {
            Mode::IptablesLegacy => match base.split_once('-') {
                Some((family, rest)) => format!("{family}-legacy-{rest}"),
                None => format!("{base}-legacy"),
            },
            _ => base.to_string(),
        }
    }

    /// The argv that runs svcproxy's binary `bin` in this mode (before its arguments):
    /// for the legacy backend, under a `PATH` whose `iptables*` are `iptables-legacy*`.
    pub fn launch(self, bin: &Path) -> Vec<String> {
        let bin = bin.to_string_lossy().into_owned();
        match self {
            Mode::IptablesLegacy => {
                let dir = legacy_tools_dir();
                let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin".into());
                vec!["env".into(), format!("PATH={}:{path}", dir.display()), bin]
            }
            _ => vec![bin],
        }
    }

    /// What svcproxy logs at its first sync about the tools' backend, if anything.
    pub fn variant_logged(self) -> Option<&'static str> {
        match self {
            Mode::Nftables | Mode::Userspace | Mode::Ebpf | Mode::Ipvs => None,
            Mode::Iptables => Some("the host's iptables uses nf_tables"),
            Mode::IptablesLegacy => Some("the host's iptables uses legacy"),
        }
    }

    /// Whether the mode guards the service address space (rejects a cluster IP's
    /// unexposed ports, drops unallocated ServiceCIDR addresses), as the registry says.
    pub fn guards_service_ips(self) -> bool {
        self.semantics().guard_service_ips
    }

    /// Where the mode behaves as upstream's same mode does, as the registry says.
    pub fn semantics(self) -> svcproxy_plan::ModeSemantics {
        self.backend().semantics
    }

    /// The mode's entry in the registry.
    pub fn backend(self) -> &'static svcproxy_dataplane::Backend {
        svcproxy_dataplane::resolve_mode(self.name())
            .expect("a registered mode")
            .backend
    }

    /// Whether NodePorts answer on 127.0.0.1 with the default flags (on by default
    /// in the iptables and userspace modes, as upstream's iptables mode; nftables
    /// mode serves them only with `--nodeport-localhost`).
    pub fn localhost_nodeports(self) -> bool {
        self.backend().defaults.localhost_nodeports
            == svcproxy_dataplane::LocalhostDefault::IptablesSetting
    }

    /// Whether NodePorts answer on ::1 with the default flags: only where the proxy
    /// serves them (the kernel cannot DNAT from ::1 at all).
    pub fn localhost_nodeports_ipv6(self) -> bool {
        self.localhost_nodeports()
            && self.semantics().localhost_nodeports == svcproxy_plan::LocalhostNodePorts::Proxy
    }

    /// Whether the mode sets `route_localnet` by default (localhost NodePorts DNATed
    /// by the kernel); the userspace proxy serves them on loopback itself.
    pub fn needs_route_localnet(self) -> bool {
        self.localhost_nodeports()
            && self.semantics().localhost_nodeports == svcproxy_plan::LocalhostNodePorts::KernelNat
    }

    /// Whether NodePorts answer on every local address when `--nodeport-addresses` is
    /// not given (upstream iptables mode), rather than on the primary IP (nftables).
    pub fn default_nodeports_on_every_address(self) -> bool {
        self.backend().defaults.nodeport_addresses == svcproxy_dataplane::NodePortDefault::AllLocal
    }

    /// Whether the endpoint sees the client's own address where the kernel modes keep
    /// it; the userspace proxy connects to the endpoint from the node itself.
    /// Whether the rules go on forwarding once svcproxy has exited (`--once`,
    /// SIGTERM): the kernel's modes do; the userspace mode's capture has nobody to
    /// hand connections to.
    #[allow(dead_code)] // dataplane.rs only
    pub fn forwards_without_the_process(self) -> bool {
        self != Mode::Userspace
    }

    /// Whether a successor takes the rules (the eBPF data plane's maps) a
    /// stopping owner sealed as they are (issues 38 and 56): the kernel's modes,
    /// whose rules do not point at the process.
    #[allow(dead_code)] // dataplane.rs only
    pub fn adopts_sealed_rules(self) -> bool {
        self != Mode::Userspace
    }

    /// Whether the kernel holds per-endpoint objects (endpoint chains, affinity
    /// sets); the userspace mode's are in the proxy.
    #[allow(dead_code)] // dataplane.rs only
    pub fn has_endpoint_objects(self) -> bool {
        self != Mode::Userspace
    }

    /// Whether an endpoint of a service without affinity has its own kernel object
    /// on a node (an endpoint that is `local` to it, or on another node): the
    /// iptables modes give a chain to endpoints that may be the node's own (the
    /// hairpin); the nftables mode serves a cluster IP port alone without a chain,
    /// each of its endpoints (a lone one too) an element of the cluster IP map
    /// (counted as objects); the userspace mode has none.
    #[allow(dead_code)] // dataplane.rs only
    pub fn has_endpoint_object(self, local: bool) -> bool {
        match self {
            Mode::Iptables | Mode::IptablesLegacy => local,
            Mode::Nftables => true,
            Mode::Userspace => false,
            // Every endpoint of a list is a slot of the list.
            Mode::Ebpf | Mode::Ipvs => true,
        }
    }

    /// What the mode logs about SCTP service ports it does not proxy.
    pub fn sctp_not_proxied_logged(self) -> &'static str {
        match self {
            Mode::Ebpf | Mode::Ipvs => {
                "SCTP is translated at connect() only on the ebpf data plane"
            }
            _ => "SCTP is not proxied in userspace mode",
        }
    }

    /// Whether the mode's UDP flows are the kernel's conntrack entries, which
    /// svcproxy deletes when their endpoint leaves; the ebpf mode keeps its own
    /// connection table, where the programs move such a flow themselves.
    #[allow(dead_code)] // conntrack.rs only
    pub fn flows_in_kernel_conntrack(self) -> bool {
        !self.ebpf_data_plane()
    }

    /// Whether the mode proxies SCTP (the userspace proxy does not, as upstream's;
    /// the ebpf mode's packet path cannot rewrite SCTP's CRC32c-covered ports).
    pub fn proxies_sctp(self) -> bool {
        !matches!(self, Mode::Userspace | Mode::Ebpf | Mode::Ipvs)
    }

    #[allow(dead_code)] // dataplane.rs only
    pub fn keeps_client_ip(self) -> bool {
        self != Mode::Userspace
    }

    /// Whether a dump shows a drop of the whole ServiceCIDR `cidr`.
    pub fn shows_cidr_drop(self, dump: &str, cidr: &str) -> bool {
        match self {
            Mode::Ebpf | Mode::Ipvs => dump.lines().any(|l| l == format!("guard-cidr {cidr}")),
            Mode::Nftables | Mode::Userspace => dump
                .lines()
                .any(|l| l.contains(cidr) && l.trim_end().ends_with("drop")),
            Mode::Iptables | Mode::IptablesLegacy => dump
                .lines()
                .any(|l| l.contains(&format!("-d {cidr} ")) && l.ends_with("-j DROP")),
        }
    }

    /// The node's commands that list everything svcproxy owns, one per family.
    fn listings(self) -> [Vec<String>; 2] {
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        match self {
            // The fixed companion table (the maps are read by `ebpf_dump`).
            Mode::Ebpf | Mode::Ipvs => [
                argv(&["nft", "list", "table", "inet", "svcproxy-ebpf"]),
                argv(&["true"]),
            ],
            Mode::Nftables | Mode::Userspace => [
                argv(&["nft", "list", "table", "ip", "svcproxy"]),
                argv(&["nft", "list", "table", "ip6", "svcproxy"]),
            ],
            Mode::Iptables | Mode::IptablesLegacy => [
                vec![self.tool("iptables-save")],
                vec![self.tool("ip6tables-save")],
            ],
        }
    }

    /// Whether svcproxy's objects exist in `node`, per family (v4, v6).
    pub fn programmed(self, c: &Cluster, node: usize) -> [bool; 2] {
        if self.ebpf_data_plane() {
            // One write for both families; the generation counts successful ones.
            let written = ebpf_dump(c, node)
                .lines()
                .next()
                .and_then(|l| l.strip_prefix("generation "))
                .and_then(|l| l.split(' ').next())
                .is_some_and(|g| g != "0");
            return [written; 2];
        }
        self.listings().map(|argv| {
            let out = exec_owned(c, node, &argv);
            match self {
                Mode::Nftables | Mode::Userspace | Mode::Ebpf | Mode::Ipvs => out.status.success(),
                // The jumps from the built-in chains are added after the restore:
                // the last one in place means the whole sync is.
                Mode::Iptables | Mode::IptablesLegacy => String::from_utf8_lossy(&out.stdout)
                    .contains(
                        "-A POSTROUTING -m comment --comment svcproxy -j SVCPROXY-POSTROUTING",
                    ),
            }
        })
    }

    /// Everything svcproxy programmed in `node`, as the mode's own tool lists it.
    pub fn dump(self, c: &Cluster, node: usize) -> String {
        let mut out = String::new();
        if self.ebpf_data_plane() {
            out.push_str(&ebpf_dump(c, node));
        }
        for argv in self.listings() {
            let o = exec_owned(c, node, &argv);
            out.push_str(&String::from_utf8_lossy(&o.stdout));
        }
        out
    }

    /// Whether a dump shows `ip`/`proto`/`port` explicitly dropped (the "no local endpoint"
    /// verdict, told apart from "no rule at all", which also ends in a timeout).
    pub fn shows_drop(self, dump: &str, ip: IpAddr, proto: &str, port: u16) -> bool {
        match self {
            Mode::Ebpf | Mode::Ipvs => {
                let dest = format!("service {ip} {port}/{proto} ");
                dump.lines()
                    .any(|l| l.starts_with(&dest) && l.contains("packet-other: drop"))
            }
            Mode::Nftables | Mode::Userspace => {
                dump.contains(&format!("{ip} . {proto} . {port} : drop"))
            }
            Mode::Iptables | Mode::IptablesLegacy => {
                let host = match ip {
                    IpAddr::V4(_) => format!("-d {ip}/32 "),
                    IpAddr::V6(_) => format!("-d {ip}/128 "),
                };
                dump.lines().any(|l| {
                    l.contains(&host)
                        && l.contains(&format!("-p {proto} "))
                        && l.contains(&format!("--dport {port} "))
                        && l.ends_with("-j DROP")
                })
            }
        }
    }

    /// The session-affinity state the kernel keeps in `node`, as text naming the clients.
    pub fn affinity_state(self, c: &Cluster, node: usize) -> String {
        match self {
            // The entries, then the service entries that hold the timeout.
            Mode::Ebpf | Mode::Ipvs => {
                let dump = ebpf_dump(c, node);
                let mut out: Vec<&str> = dump
                    .lines()
                    .filter(|l| l.starts_with("affinity "))
                    .collect();
                out.extend(dump.lines().filter(|l| l.contains(" affinity: ")));
                out.join("\n") + "\n"
            }
            Mode::Nftables | Mode::Userspace => {
                let mut out = String::new();
                let mut inside = false;
                for line in self.dump(c, node).lines() {
                    let t = line.trim();
                    if t.starts_with("set affinity-") {
                        inside = true;
                    }
                    if inside {
                        out.push_str(t);
                        out.push('\n');
                        if t == "}" {
                            inside = false;
                        }
                    }
                }
                out
            }
            // The `recent` lists (the clients), then the rules that check them (the
            // timeout lives in the rule, not in the list).
            Mode::Iptables | Mode::IptablesLegacy => {
                let lists = c.exec(
                    Host::Node(node),
                    &[
                        "sh",
                        "-c",
                        "for f in /proc/net/xt_recent/*; do echo \"$f\"; cat \"$f\"; done",
                    ],
                );
                // The lists print IPv6 sources in full (`2001:0db8:0011:...`): write
                // them the canonical way the tests compare.
                let mut out = String::new();
                for line in String::from_utf8_lossy(&lists.stdout).lines() {
                    let canonical = line
                        .strip_prefix("src=")
                        .and_then(|rest| rest.split(' ').next())
                        .and_then(|a| a.parse::<IpAddr>().ok());
                    match canonical {
                        Some(ip) => out.push_str(&format!(
                            "src={ip}{}",
                            &line[4 + line[4..].find(' ').unwrap_or(line.len() - 4)..]
                        )),
                        None => out.push_str(line),
                    }
                    out.push('\n');
                }
                for line in self.dump(c, node).lines() {
                    if line.contains("--rcheck") {
                        out.push_str(line);
                        out.push('\n');
                    }
                }
                out
            }
        }
    }

    /// Whether affinity state shows the service's timeout of `seconds`.
    pub fn affinity_timeout_shown(self, state: &str, seconds: u32) -> bool {
        match self {
            Mode::Ebpf | Mode::Ipvs => state.contains(&format!(" affinity: {seconds}s")),
            Mode::Nftables | Mode::Userspace => state.contains(&format!("timeout {seconds}s")),
            Mode::Iptables | Mode::IptablesLegacy => {
                state.contains(&format!("--seconds {seconds} "))
            }
        }
    }

    /// Whether expired affinity entries leave the kernel's listing. nftables' set
    /// elements time out; iptables' `recent` entries stay listed until a check reaps
    /// them, and only stop matching (which the tests see in where traffic goes).
    pub fn affinity_expiry_listed(self) -> bool {
        match self {
            Mode::Nftables | Mode::Userspace => true,
            // LRU entries stay until evicted; a stale one stops matching.
            Mode::Ebpf | Mode::Ipvs => false,
            Mode::Iptables | Mode::IptablesLegacy => false,
        }
    }

    /// How many per-service objects of `kind` svcproxy holds in `node` for family `f`.
    pub fn service_objects(
        self,
        c: &Cluster,
        node: usize,
        f: Family,
        kind: ServiceObject,
    ) -> usize {
        let argv = &self.listings()[usize::from(f == Family::V6)];
        let out = exec_owned(c, node, argv);
        let text = String::from_utf8_lossy(&out.stdout);
        match self {
            Mode::Ebpf | Mode::Ipvs => ebpf_service_objects(c, node, f, kind),
            Mode::Nftables | Mode::Userspace => {
                let prefix = match kind {
                    ServiceObject::Service => "service-",
                    ServiceObject::Endpoint => "endpoint-",
                };
                let chains = text
                    .lines()
                    .filter_map(|l| l.trim().strip_prefix("chain "))
                    .filter_map(|rest| rest.split_whitespace().next())
                    .filter_map(|name| name.strip_prefix(prefix))
                    .filter(|hash| hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()))
                    .count();
                // A cluster IP port served without a chain: an element `VIP .
                // PROTO . PORT` of its count's `clusterip-PROTO-N` set, and its
                // endpoints elements of the cluster IP maps (`VIP . PROTO . PORT
                // . K : ADDRESS . PORT`); others' endpoints are elements of the
                // endpoint maps (`KEY : ADDRESS . PORT`). Each block from its
                // declaration line to its closing brace.
                let counted_set = |name: &str| {
                    name.strip_prefix("clusterip-")
                        .and_then(|r| r.split_once('-'))
                        .is_some_and(|(p, n)| {
                            ["tcp", "udp", "sctp"].contains(&p) && n.parse::<u32>().is_ok()
                        })
                };
                let mut elements = 0;
                let mut block: Option<bool> = None;
                for line in text.lines().map(str::trim) {
                    if let Some(rest) = line
                        .strip_prefix("map ")
                        .or_else(|| line.strip_prefix("set "))
                    {
                        let name = rest.split_whitespace().next().unwrap_or("");
                        block = match kind {
                            ServiceObject::Service => counted_set(name).then_some(false),
                            ServiceObject::Endpoint => (name.starts_with("endpoint-dnat-")
                                || name.starts_with("clusterip-dnat-"))
                            .then_some(true),
                        };
                    } else if block.is_some() && line == "}" {
                        block = None;
                    } else if let Some(map) = block {
                        if line.starts_with("typeof ") || line.starts_with("type ") {
                            continue;
                        }
                        elements += if map {
                            line.matches(" : ").count()
                        } else {
                            line.matches(" . ").count() / 2
                        };
                    }
                }
                chains + elements
            }
            Mode::Iptables | Mode::IptablesLegacy => {
                // `:SVP-<12 hex>-SVC` per service port, `:SVP-<12 hex>-E<10 hex>` per
                // endpoint.
                text.lines()
                    .filter_map(|l| l.strip_prefix(":SVP-"))
                    .filter_map(|l| l.split(' ').next())
                    .filter_map(|name| name.split_once('-'))
                    .filter(|(hash, _)| hash.len() == 12)
                    .filter(|(_, tail)| match kind {
                        ServiceObject::Service => *tail == "SVC",
                        ServiceObject::Endpoint => {
                            tail.len() == 11
                                && tail.starts_with('E')
                                && tail[1..].bytes().all(|b| b.is_ascii_hexdigit())
                        }
                    })
                    .count()
            }
        }
    }

    /// Removes the CVE-2020-8558 guard (drop of outside packets to 127.0.0.0/8) from
    /// `node` by hand, for a test to show what it stops; `false` when the mode has none.
    pub fn remove_localnet_guard(self, c: &Cluster, node: usize) -> bool {
        match self {
            // Outside packets to loopback are never translated: no guard to remove.
            Mode::Nftables | Mode::Ebpf | Mode::Ipvs => false,
            // The capture's first rule leaves packets to loopback alone when they come
            // from outside: the chain without it.
            Mode::Userspace => {
                c.nft(
                    Host::Node(node),
                    "flush chain ip svcproxy nat-prerouting\nadd rule ip svcproxy nat-prerouting jump services\n",
                )
                .expect("rewrite nat-prerouting");
                true
            }
            Mode::Iptables | Mode::IptablesLegacy => {
                let tool = self.tool("iptables");
                c.exec_ok(
                    Host::Node(node),
                    &[&tool, "-w", "-F", svcproxy_plan::iptables::LOCALNET],
                );
                true
            }
        }
    }

    /// The flags this mode needs in a container without privileges (read-only
    /// `/proc/sys`), as deploy/README.md says: iptables mode's localhost NodePorts
    /// need `route_localnet`, which such a container cannot set.
    #[allow(dead_code)] // operations.rs's least-privilege test only
    pub fn unprivileged_flags(self) -> &'static [&'static str] {
        match self {
            Mode::Nftables | Mode::Userspace | Mode::Ebpf => &[],
            // The XDP fast path too: its program passes the verifier, and
            // attaches, with the DaemonSet's capabilities.
            Mode::Ipvs => &["--ebpf-xdp=native"],
            Mode::Iptables | Mode::IptablesLegacy => &["--iptables-localhost-nodeports=false"],
        }
    }

    /// The capabilities the DaemonSet's container keeps for this mode (setpriv's
    /// spelling): deploy/base/daemonset.yaml's `NET_ADMIN` and `NET_RAW`, and `BPF`
    /// for the ebpf and ipvs modes' maps and programs, as deploy/components/ebpf adds
    /// it (crates/svcproxy/tests/deploy.rs checks the manifests grant exactly these).
    #[allow(dead_code)] // operations.rs's least-privilege test only
    pub fn capabilities(self) -> &'static str {
        match self {
            Mode::Ebpf | Mode::Ipvs => "+net_admin,+net_raw,+bpf",
            _ => "+net_admin,+net_raw",
        }
    }

    /// The ways of taking svcproxy's rules away behind its back that this mode's drift
    /// check must notice, by name, for [`Mode::break_rules`].
    #[allow(dead_code)] // operations.rs's drift test only
    pub fn breakages(self) -> &'static [&'static str] {
        match self {
            Mode::Nftables | Mode::Userspace => {
                &["tables deleted", "tables dormant", "tables flushed"]
            }
            Mode::Iptables | Mode::IptablesLegacy => &["every table flushed"],
            Mode::Ebpf | Mode::Ipvs => &["links unpinned"],
        }
    }

    /// Takes svcproxy's rules in `node` away by hand, as [`Mode::breakages`] names it,
    /// in both families. Returns what the log says about it.
    #[allow(dead_code)] // operations.rs's drift test only
    pub fn break_rules(self, c: &Cluster, node: usize, how: &str) -> &'static str {
        match (self, how) {
            (Mode::Nftables | Mode::Userspace, _) => {
                // Each family's table: deleted; made dormant; every rule gone, the
                // table and its handle kept. Then what the drift check says.
                let (each, said) = match how {
                    "tables deleted" => ("delete table {} svcproxy\n", "was deleted"),
                    "tables dormant" => (
                        "add table {} svcproxy { flags dormant; }\n",
                        "was made dormant",
                    ),
                    "tables flushed" => {
                        ("flush table {} svcproxy\n", "lost rules or the jumps to it")
                    }
                    _ => panic!("{self:?} cannot break its rules by {how:?}"),
                };
                let script: String = ["ip", "ip6"]
                    .iter()
                    .map(|family| each.replace("{}", family))
                    .collect();
                c.nft(Host::Node(node), &script).expect(how);
                said
            }
            (Mode::Iptables | Mode::IptablesLegacy, "every table flushed") => {
                // What a firewall reload does: every rule and user chain gone.
                for base in ["iptables", "ip6tables"] {
                    let tool = self.tool(base);
                    for table in ["mangle", "nat", "filter"] {
                        for op in ["-F", "-X"] {
                            c.exec_ok(Host::Node(node), &[&tool, "-w", "-t", table, op]);
                        }
                    }
                }
                "is gone"
            }
            (Mode::Ebpf | Mode::Ipvs, "links unpinned") => {
                // What a careless `rm` of the pin directory's links does: the
                // socket and packet programs detached.
                let (_, pins) = c.node_confinement(node).expect("an ebpf node is confined");
                for e in std::fs::read_dir(&pins).expect("pin directory").flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if name.starts_with("link-") || name.starts_with("tc-") {
                        std::fs::remove_file(e.path()).expect("unpin a link");
                    }
                }
                // The kernel puts a link whose last reference went from a
                // workqueue: the programs come off a moment later.
                thread::sleep(Duration::from_secs(1));
                "pinned links removed"
            }
            _ => panic!("{self:?} has no breakage {how:?}"),
        }
    }

    /// Adds an object of the mode's kind that svcproxy does not own, for cleanup to leave.
    pub fn add_foreign(self, c: &Cluster, node: usize) {
        match self {
            Mode::Nftables | Mode::Userspace | Mode::Ebpf | Mode::Ipvs => {
                let keep = "table inet keepme {\n chain input {\n  type filter hook input priority 0; policy accept;\n  tcp dport 1 counter\n }\n}\n";
                c.nft(Host::Node(node), keep).expect("add a foreign table");
            }
            Mode::Iptables | Mode::IptablesLegacy => {
                for args in [
                    &["-N", "KEEPME"][..],
                    &["-A", "KEEPME", "-p", "tcp", "--dport", "1", "-j", "RETURN"][..],
                    &["-A", "PREROUTING", "-j", "KEEPME"][..],
                ] {
                    let tool = self.tool("iptables");
                    let mut argv = vec![tool.as_str(), "-w", "-t", "nat"];
                    argv.extend_from_slice(args);
                    c.exec_ok(Host::Node(node), &argv);
                }
            }
        }
    }

    /// `Err` with what is wrong when the object of [`Mode::add_foreign`] is gone or changed.
    pub fn foreign_intact(self, c: &Cluster, node: usize) -> Result<(), String> {
        match self {
            Mode::Nftables | Mode::Userspace | Mode::Ebpf | Mode::Ipvs => {
                let out = c.exec(
                    Host::Node(node),
                    &["nft", "list", "table", "inet", "keepme"],
                );
                let text = String::from_utf8_lossy(&out.stdout);
                if out.status.success() && text.contains("tcp dport 1 counter") {
                    Ok(())
                } else {
                    let all = c.exec(Host::Node(node), &["nft", "list", "tables"]);
                    Err(format!(
                        "table inet keepme: {text}; tables: {}",
                        String::from_utf8_lossy(&all.stdout)
                    ))
                }
            }
            Mode::Iptables | Mode::IptablesLegacy => {
                let out = c.exec(
                    Host::Node(node),
                    &[&self.tool("iptables-save"), "-t", "nat"],
                );
                let text = String::from_utf8_lossy(&out.stdout);
                let want = [
                    "-A PREROUTING -j KEEPME",
                    "-A KEEPME -p tcp -m tcp --dport 1 -j RETURN",
                ];
                if want.iter().all(|w| text.contains(w)) {
                    Ok(())
                } else {
                    Err(format!("nat table: {text}"))
                }
            }
        }
    }
}

/// [`Mode::service_objects`] in ebpf mode: the distinct endpoint lists the
/// family's entries forward to, and their endpoints.
fn ebpf_service_objects(c: &Cluster, node: usize, f: Family, kind: ServiceObject) -> usize {
    let dump = ebpf_dump(c, node);
    let mut lists = std::collections::BTreeSet::new();
    for line in dump.lines().filter(|l| l.starts_with("service ")) {
        let v6 = line
            .split(' ')
            .nth(1)
            .is_some_and(|a| a.contains(':') || a == "IPv6-local");
        if (f == Family::V6) != v6 {
            continue;
        }
        for part in line.split("forward [").skip(1) {
            if let Some((eps, _)) = part.split_once(']') {
                lists.insert(eps.to_string());
            }
        }
    }
    match kind {
        ServiceObject::Service => lists.len(),
        ServiceObject::Endpoint => lists
            .iter()
            .map(|l| l.split(' ').filter(|e| !e.is_empty()).count())
            .sum(),
    }
}

/// What the maps pinned by `node`'s ebpf data plane hold, as text (empty when
/// nothing is pinned yet).
fn ebpf_dump(c: &Cluster, node: usize) -> String {
    let Some((_, pins)) = c.node_confinement(node) else {
        return String::new();
    };
    svcproxy_dataplane::ebpf::kernel::dump(&pins).unwrap_or_default()
}

/// Runs `argv` in `node`'s namespace.
fn exec_owned(c: &Cluster, node: usize, argv: &[String]) -> std::process::Output {
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    c.exec(Host::Node(node), &argv)
}

/// A directory whose `iptables`, `iptables-save`, `iptables-restore` and `ip6tables*`
/// are the `*-legacy*` tools (created once, beside the test binaries).
fn legacy_tools_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = svcproxy_e2e::bins::bin_dir()
            .expect("test binary directory")
            .join("iptables-legacy-tools");
        std::fs::create_dir_all(&dir).expect("create the legacy tools directory");
        for base in ["iptables", "ip6tables"] {
            for suffix in ["", "-save", "-restore"] {
                let target = Mode::IptablesLegacy.tool(&format!("{base}{suffix}"));
                let Some(found) = ["/usr/sbin", "/sbin", "/usr/bin"]
                    .iter()
                    .map(|d| Path::new(d).join(&target))
                    .find(|p| p.exists())
                else {
                    panic!("{target} not found: install Debian's iptables package");
                };
                // Atomic and idempotent: test processes run side by side.
                let link = dir.join(format!("{base}{suffix}"));
                if std::fs::read_link(&link).is_ok_and(|t| t == found) {
                    continue;
                }
                let tmp = dir.join(format!(".{base}{suffix}.{}", std::process::id()));
                let _ = std::fs::remove_file(&tmp);
                std::os::unix::fs::symlink(&found, &tmp).expect("link a legacy tool");
                std::fs::rename(&tmp, &link).expect("move a legacy tool link in place");
            }
        }
        dir
    })
    .clone()
}

/// The namespace every test object lives in.
pub const NS: &str = "e2e";
/// The port every echo backend listens on (TCP, UDP and SCTP).
pub const BACKEND_PORT: u16 = 8080;
/// A second TCP port of every backend, for per-endpoint ports.
pub const BACKEND_PORT_2: u16 = 8081;

/// How long an answer may take (answers come in milliseconds; this is slack for load).
pub const ANSWER: Duration = Duration::from_secs(2);
/// How long a probe waits before calling it a DROP. Longer than the ~1 s a TCP SYN needs to
/// see an ICMP refusal that the kernel dropped the first time (see the harness docs), so a
/// late refusal is never mistaken for a drop.
pub const DROP_WAIT: Duration = Duration::from_millis(1500);
/// How long a probe waits for a refusal: long enough to see a late one and report it.
pub const REFUSE_WAIT: Duration = Duration::from_secs(3);
/// What "refused at once" means.
pub const FAST_REFUSAL: Duration = Duration::from_secs(1);
/// Bound on waiting for svcproxy's first sync in a node.
pub const SYNC_DEADLINE: Duration = Duration::from_secs(30);

pub fn sa(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

pub fn family_name(f: Family) -> &'static str {
    match f {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    }
}

pub fn proto_name(p: Proto) -> &'static str {
    match p {
        Proto::Tcp => "TCP",
        Proto::Udp => "UDP",
        Proto::Sctp => "SCTP",
    }
}

fn q(s: impl std::fmt::Display) -> String {
    format!("\"{s}\"")
}

fn list(items: impl IntoIterator<Item = String>) -> String {
    format!("[{}]", items.into_iter().collect::<Vec<_>>().join(", "))
}

// ---------------------------------------------------------------------------------------
// Manifests
// ---------------------------------------------------------------------------------------

/// Node objects for every node of the plan: hostname and zone labels, pod CIDRs and
/// InternalIPs (both families) from the harness address plan.
pub fn nodes_yaml(zones: &[&str]) -> String {
    let mut out = String::new();
    for (n, zone) in zones.iter().enumerate() {
        let name = plan::node_name(n);
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels: \
             {{kubernetes.io/hostname: {name}, topology.kubernetes.io/zone: {zone}}}\n\
             spec:\n  podCIDRs: {cidrs}\nstatus:\n  addresses:\n  \
             - {{type: InternalIP, address: {v4}}}\n  - {{type: InternalIP, address: {v6}}}\n  \
             - {{type: Hostname, address: {name}}}\n",
            cidrs = list(Family::BOTH.map(|f| q(plan::pod_cidr(n, f)))),
            v4 = q(plan::node_ip(n, Family::V4)),
            v6 = q(plan::node_ip(n, Family::V6)),
        );
    }
    out
}

pub fn service_cidr_yaml() -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {{name: kubernetes}}\n\
         spec:\n  cidrs: {}\n",
        list(Family::BOTH.map(|f| q(plan::service_cidr(f))))
    )
}

/// One port of a Service.
#[derive(Clone, Debug)]
pub struct SvcPort {
    pub name: String,
    pub proto: Proto,
    pub port: u16,
    /// A number or a port name.
    pub target: String,
    pub node_port: Option<u16>,
}

impl SvcPort {
    pub fn new(name: &str, proto: Proto, port: u16, target: u16) -> SvcPort {
        SvcPort {
            name: name.into(),
            proto,
            port,
            target: target.to_string(),
            node_port: None,
        }
    }

    pub fn named_target(mut self, target: &str) -> SvcPort {
        self.target = target.into();
        self
    }

    pub fn node_port(mut self, p: u16) -> SvcPort {
        self.node_port = Some(p);
        self
    }
}

/// A Service; `yaml()` renders it as the examples write them.
#[derive(Clone, Debug)]
pub struct Svc {
    pub name: String,
    pub type_: &'static str,
    pub cluster_ips: Vec<IpAddr>,
    pub ports: Vec<SvcPort>,
    pub external_ips: Vec<IpAddr>,
    /// Load-balancer ingress IPs with their ipMode (`VIP` or `Proxy`).
    pub ingress: Vec<(IpAddr, &'static str)>,
    pub etp_local: bool,
    pub itp_local: bool,
    pub health_check_node_port: Option<u16>,
    pub source_ranges: Vec<String>,
    pub affinity_timeout: Option<u32>,
    pub annotations: Vec<(String, String)>,
}

impl Svc {
    /// A ClusterIP service with the given cluster IPs (one per family, first is primary).
    pub fn new(name: &str, cluster_ips: &[IpAddr]) -> Svc {
        Svc {
            name: name.into(),
            type_: "ClusterIP",
            cluster_ips: cluster_ips.to_vec(),
            ports: Vec::new(),
            external_ips: Vec::new(),
            ingress: Vec::new(),
            etp_local: false,
            itp_local: false,
            health_check_node_port: None,
            source_ranges: Vec::new(),
            affinity_timeout: None,
            annotations: Vec::new(),
        }
    }

    /// A dual-stack service whose cluster IPs are `plan::cluster_ip(n, _)` in both families.
    pub fn dual(name: &str, n: u16) -> Svc {
        Svc::new(name, &Family::BOTH.map(|f| plan::cluster_ip(n, f)))
    }

    pub fn port(mut self, p: SvcPort) -> Svc {
        self.ports.push(p);
        self
    }

    pub fn node_port(mut self) -> Svc {
        self.type_ = "NodePort";
        self
    }

    pub fn load_balancer(mut self) -> Svc {
        self.type_ = "LoadBalancer";
        self
    }

    pub fn external_ips(mut self, ips: &[IpAddr]) -> Svc {
        self.external_ips.extend_from_slice(ips);
        self
    }

    pub fn ingress(mut self, ip: IpAddr, mode: &'static str) -> Svc {
        self.ingress.push((ip, mode));
        self
    }

    pub fn etp_local(mut self, health_check_node_port: u16) -> Svc {
        self.etp_local = true;
        if self.type_ == "LoadBalancer" {
            self.health_check_node_port = Some(health_check_node_port);
        }
        self
    }

    pub fn itp_local(mut self) -> Svc {
        self.itp_local = true;
        self
    }

    pub fn source_ranges(mut self, cidrs: &[String]) -> Svc {
        self.source_ranges.extend_from_slice(cidrs);
        self
    }

    pub fn affinity(mut self, timeout_seconds: u32) -> Svc {
        self.affinity_timeout = Some(timeout_seconds);
        self
    }

    pub fn annotate(mut self, key: &str, value: &str) -> Svc {
        self.annotations.push((key.into(), value.into()));
        self
    }

    pub fn cluster_ip(&self, f: Family) -> IpAddr {
        *self
            .cluster_ips
            .iter()
            .find(|ip| Family::of(**ip) == f)
            .unwrap_or_else(|| panic!("{} has no {} cluster IP", self.name, family_name(f)))
    }

    pub fn yaml(&self) -> String {
        let mut y = String::new();
        let _ = writeln!(y, "apiVersion: v1\nkind: Service\nmetadata:");
        let _ = writeln!(y, "  name: {}\n  namespace: {NS}", self.name);
        if !self.annotations.is_empty() {
            let a: Vec<String> = self
                .annotations
                .iter()
                .map(|(k, v)| format!("{}: {}", q(k), q(v)))
                .collect();
            let _ = writeln!(y, "  annotations: {{{}}}", a.join(", "));
        }
        let _ = writeln!(y, "spec:\n  type: {}", self.type_);
        let _ = writeln!(y, "  clusterIP: {}", q(self.cluster_ips[0]));
        let _ = writeln!(y, "  clusterIPs: {}", list(self.cluster_ips.iter().map(q)));
        let fams: Vec<String> = self
            .cluster_ips
            .iter()
            .map(|ip| family_name(Family::of(*ip)).to_string())
            .collect();
        let _ = writeln!(y, "  ipFamilies: [{}]", fams.join(", "));
        let policy = if self.cluster_ips.len() > 1 {
            "RequireDualStack"
        } else {
            "SingleStack"
        };
        let _ = writeln!(y, "  ipFamilyPolicy: {policy}");
        if self.type_ != "ClusterIP" {
            let etp = if self.etp_local { "Local" } else { "Cluster" };
            let _ = writeln!(y, "  externalTrafficPolicy: {etp}");
        }
        if let Some(p) = self.health_check_node_port {
            let _ = writeln!(y, "  healthCheckNodePort: {p}");
        }
        if self.itp_local {
            let _ = writeln!(y, "  internalTrafficPolicy: Local");
        }
        if !self.external_ips.is_empty() {
            let _ = writeln!(
                y,
                "  externalIPs: {}",
                list(self.external_ips.iter().map(q))
            );
        }
        if !self.source_ranges.is_empty() {
            let _ = writeln!(
                y,
                "  loadBalancerSourceRanges: {}",
                list(self.source_ranges.iter().map(q))
            );
        }
        if let Some(t) = self.affinity_timeout {
            let _ = writeln!(
                y,
                "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: {t}}}}}"
            );
        }
        let _ = writeln!(y, "  ports:");
        for p in &self.ports {
            let target = if p.target.parse::<u16>().is_ok() {
                p.target.clone()
            } else {
                q(&p.target)
            };
            let node_port = p
                .node_port
                .map(|n| format!(", nodePort: {n}"))
                .unwrap_or_default();
            let _ = writeln!(
                y,
                "  - {{name: {}, protocol: {}, port: {}, targetPort: {target}{node_port}}}",
                p.name,
                proto_name(p.proto),
                p.port
            );
        }
        if !self.ingress.is_empty() {
            let _ = writeln!(y, "status:\n  loadBalancer:\n    ingress:");
            for (ip, mode) in &self.ingress {
                let _ = writeln!(y, "    - {{ip: {}, ipMode: {mode}}}", q(ip));
            }
        }
        y
    }
}

/// One endpoint of a slice.
#[derive(Clone, Debug)]
pub struct Ep {
    pub ip: IpAddr,
    pub node: String,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

impl Ep {
    /// The pod `host` (a `Host::Pod`) as a ready endpoint in `family`.
    pub fn pod(host: Host, family: Family) -> Ep {
        let Host::Pod(n, p) = host else {
            panic!("{host:?} is not a pod")
        };
        Ep {
            ip: plan::pod_ip(n, p, family),
            node: plan::node_name(n),
            ready: true,
            serving: true,
            terminating: false,
        }
    }

    /// Serving but terminating (what a draining pod looks like).
    pub fn terminating(mut self) -> Ep {
        self.ready = false;
        self.serving = true;
        self.terminating = true;
        self
    }

    /// Neither ready nor serving (a pod that is not up).
    pub fn not_ready(mut self) -> Ep {
        self.ready = false;
        self.serving = false;
        self
    }
}

/// An EndpointSlice of one family.
#[derive(Clone, Debug)]
pub struct Slice {
    pub name: String,
    pub service: String,
    pub family: Family,
    /// (name, protocol, port)
    pub ports: Vec<(String, Proto, u16)>,
    pub endpoints: Vec<Ep>,
}

impl Slice {
    /// A slice for `svc` in `family` whose ports are the service's ports with their numeric
    /// target ports (named targets must use [`Slice::with_ports`]).
    pub fn of(svc: &Svc, family: Family, pods: &[Host]) -> Slice {
        let ports = svc
            .ports
            .iter()
            .map(|p| {
                let port = p
                    .target
                    .parse::<u16>()
                    .unwrap_or_else(|_| panic!("named target {}: use with_ports", p.target));
                (p.name.clone(), p.proto, port)
            })
            .collect();
        Slice {
            name: format!(
                "{}-{}",
                svc.name,
                match family {
                    Family::V4 => "v4",
                    Family::V6 => "v6",
                }
            ),
            service: svc.name.clone(),
            family,
            ports,
            endpoints: pods.iter().map(|h| Ep::pod(*h, family)).collect(),
        }
    }

    pub fn with_ports(
        svc: &Svc,
        name: &str,
        family: Family,
        ports: &[(&str, Proto, u16)],
        endpoints: Vec<Ep>,
    ) -> Slice {
        Slice {
            name: name.into(),
            service: svc.name.clone(),
            family,
            ports: ports
                .iter()
                .map(|(n, p, port)| (n.to_string(), *p, *port))
                .collect(),
            endpoints,
        }
    }

    pub fn endpoints(mut self, endpoints: Vec<Ep>) -> Slice {
        self.endpoints = endpoints;
        self
    }

    pub fn yaml(&self) -> String {
        let mut y = String::new();
        let _ = writeln!(
            y,
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:"
        );
        let _ = writeln!(
            y,
            "  name: {}\n  namespace: {NS}\n  labels: {{kubernetes.io/service-name: {}}}",
            self.name, self.service
        );
        let _ = writeln!(y, "addressType: {}", family_name(self.family));
        let _ = writeln!(y, "ports:");
        for (name, proto, port) in &self.ports {
            let _ = writeln!(
                y,
                "- {{name: {name}, protocol: {}, port: {port}}}",
                proto_name(*proto)
            );
        }
        if self.endpoints.is_empty() {
            let _ = writeln!(y, "endpoints: []");
        } else {
            let _ = writeln!(y, "endpoints:");
        }
        for ep in &self.endpoints {
            let _ = writeln!(
                y,
                "- addresses: [{}]\n  nodeName: {}\n  conditions: {{ready: {}, serving: {}, terminating: {}}}",
                q(ep.ip),
                ep.node,
                ep.ready,
                ep.serving,
                ep.terminating
            );
        }
        y
    }
}

/// Several objects as one multi-document YAML file.
pub fn docs(parts: &[String]) -> String {
    parts
        .iter()
        .map(|p| format!("---\n{p}"))
        .collect::<Vec<_>>()
        .join("")
}

/// A service and its slices, one file's worth.
pub fn svc_file(svc: &Svc, slices: &[Slice]) -> String {
    let mut parts = vec![svc.yaml()];
    parts.extend(slices.iter().map(Slice::yaml));
    docs(&parts)
}

// ---------------------------------------------------------------------------------------
// The environment: cluster, backends, manifests, svcproxy per node
// ---------------------------------------------------------------------------------------

/// What a test wants besides its manifests.
#[derive(Clone, Debug)]
pub struct EnvSpec {
    pub pods_per_node: usize,
    /// Zone label of node-a, node-b.
    pub zones: [&'static str; 2],
    /// Extra svcproxy flags, for every node.
    pub flags: Vec<String>,
    /// Start a long-running svcproxy in each node (and wait for its first sync).
    pub start_proxies: bool,
    /// The ebpf data plane translates the pods' sockets at connect() (their
    /// processes start in their node's cgroup), as in a cluster; otherwise the
    /// pods' connections take the packet path.
    pub pods_at_connect: bool,
}

impl Default for EnvSpec {
    fn default() -> Self {
        EnvSpec {
            pods_per_node: 2,
            zones: ["zone-1", "zone-1"],
            flags: Vec::new(),
            start_proxies: true,
            pods_at_connect: false,
        }
    }
}

/// A running test environment. Field order matters for drop: svcproxy and backends are
/// killed before the cluster deletes the namespaces, and the manifests go last.
/// A flow for `explain` to predict: what it is, the node whose rules it goes
/// through, its source, destination and protocol, and the outcome the packets showed.
pub type Flow<T> = (String, usize, IpAddr, SocketAddr, Proto, T);

pub struct Env {
    pub mode: Mode,
    pub proxies: Vec<NsProcess>,
    /// Echo servers in every pod (kept alive with the environment).
    pub _backends: Backends,
    pub c: Cluster,
    pub manifests: tempfile::TempDir,
    pub started: Instant,
    /// The ebpf mode's cgroups and bpffs (one per node); after the cluster, whose
    /// processes must be gone before the cgroups can go.
    pub _confinement: Option<svcproxy_e2e::Confinement>,
}

/// For the ebpf mode: a cgroup and a pin directory of the test's own per node,
/// the node's processes started in its cgroup. `None` for the other modes.
pub fn confine_for(mode: Mode, c: &Cluster) -> Option<svcproxy_e2e::Confinement> {
    if !mode.ebpf_data_plane() {
        return None;
    }
    let conf = svcproxy_e2e::Confinement::new().expect("a cgroup and a bpffs for the ebpf mode");
    for n in c.nodes_indexes() {
        let (cgroup, pins) = conf.child(&plan::node_name(n)).expect("a node's cgroup");
        c.confine_node(n, cgroup, pins);
    }
    Some(conf)
}

/// The flags confining `node`'s svcproxy in the ebpf mode (see [`confine_for`]).
pub fn confinement_args(c: &Cluster, node: usize) -> Vec<String> {
    match c.node_confinement(node) {
        Some((cgroup, pins)) => vec![
            "--ebpf-cgroup".into(),
            cgroup.to_string_lossy().into_owned(),
            "--ebpf-bpffs".into(),
            pins.to_string_lossy().into_owned(),
        ],
        None => Vec::new(),
    }
}

impl Env {
    /// Builds the cluster, starts echo backends in every pod (TCP 8080 and 8081, UDP 8080,
    /// SCTP 8080 where available), writes `files` (plus nodes and ServiceCIDR) into a fresh
    /// manifests directory, starts svcproxy in each node namespace and waits until each has
    /// programmed both families, in `mode`. `None` when namespace tests cannot run here.
    pub fn start(mode: Mode, spec: EnvSpec, files: &[(&str, String)]) -> Option<Env> {
        if !svcproxy_e2e::require_root_or_skip() {
            return None;
        }
        let started = Instant::now();
        let bin = svcproxy_bin();
        let c = Cluster::create(ClusterSpec {
            nodes: 2,
            pods_per_node: spec.pods_per_node,
            dual_stack: true,
            ext_via: 0,
        })
        .expect("create cluster");
        let sctp = if c.sctp_mode() == SctpMode::Unavailable {
            vec![]
        } else {
            vec![BACKEND_PORT]
        };
        let backends = c
            .start_backends(&BackendPorts {
                tcp: vec![BACKEND_PORT, BACKEND_PORT_2],
                udp: vec![BACKEND_PORT],
                sctp,
            })
            .expect("start echo backends");
        let manifests = tempfile::Builder::new()
            .prefix("svcproxy-dataplane-")
            .tempdir()
            .expect("manifests dir");
        let confinement = confine_for(mode, &c);
        // SVCPROXY_E2E_PODS_AT_CONNECT=1: every test so (docs/testing.md).
        let pods_at_connect =
            spec.pods_at_connect || std::env::var_os("SVCPROXY_E2E_PODS_AT_CONNECT").is_some();
        if pods_at_connect && confinement.is_some() {
            c.translate_pods_at_connect();
        }
        let mut env = Env {
            mode,
            proxies: Vec::new(),
            _backends: backends,
            c,
            manifests,
            started,
            _confinement: confinement,
        };
        env.write("00-nodes.yaml", &nodes_yaml(&spec.zones));
        env.write("00-servicecidr.yaml", &service_cidr_yaml());
        for (name, text) in files {
            env.write(name, text);
        }
        if spec.start_proxies {
            for n in 0..2 {
                let proc = env.spawn_svcproxy(&bin, n, &spec.flags);
                env.proxies.push(proc);
            }
            for n in 0..2 {
                env.wait_synced(n);
            }
        }
        eprintln!(
            "[dataplane] {} environment ready in {:?} (sctp: {:?})",
            mode.label(),
            env.started.elapsed(),
            env.c.sctp_mode()
        );
        Some(env)
    }

    /// The run-mode arguments of svcproxy for `node` (without the binary).
    pub fn proxy_args(&self, node: usize) -> Vec<String> {
        let mut args = vec![
            "--proxy-mode".into(),
            self.mode.name().into(),
            "--manifests".into(),
            self.manifests.path().to_string_lossy().into_owned(),
            "--hostname-override".into(),
            plan::node_name(node),
            "--cluster-cidr".into(),
            format!(
                "{},{}",
                plan::cluster_cidr(Family::V4),
                plan::cluster_cidr(Family::V6)
            ),
            "--min-sync-period".into(),
            "0s".into(),
        ];
        args.extend(confinement_args(&self.c, node));
        args
    }

    /// `svcproxy explain --format json` for a connection through `node`'s rules, run
    /// in `node`'s namespace with the inputs and flags its proxy runs with (plus
    /// `flags`); the origin is told from `from`, as the rules tell it.
    pub fn explain(
        &self,
        node: usize,
        flags: &[String],
        from: IpAddr,
        to: SocketAddr,
        proto: Proto,
    ) -> serde_json::Value {
        let mut args = vec!["explain".to_string()];
        args.extend(self.proxy_args(node));
        args.extend(flags.iter().cloned());
        args.extend([
            "--format".into(),
            "json".into(),
            "--from".into(),
            from.to_string(),
            "--to".into(),
            to.to_string(),
            "--proto".into(),
            proto.to_string().to_lowercase(),
        ]);
        // In the node's namespace, as an operator runs it on the node: this
        // host's addresses are the node's.
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = self.run_svcproxy(node, &args);
        assert!(
            out.status.success(),
            "svcproxy explain: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("explain's JSON")
    }

    /// `explain`'s verdict for a connection through `node`'s rules, its proxy
    /// running with `flags` too: `forward`, `drop`, `reject` or `accept`.
    pub fn explain_action(
        &self,
        node: usize,
        flags: &[String],
        from: IpAddr,
        to: SocketAddr,
        proto: Proto,
    ) -> String {
        self.explain(node, flags, from, to, proto)["verdict"]["action"]
            .as_str()
            .unwrap_or("none")
            .to_string()
    }

    /// Checks, for each `(what, node, from, to, proto, action)`, that `explain`
    /// predicts the action the packets showed.
    pub fn check_explained(&self, ck: &mut Checks, flows: &[Flow<&'static str>]) {
        self.check_explained_with(ck, &[], flows);
    }

    /// [`Env::check_explained`] for a proxy that runs with `flags` too.
    pub fn check_explained_with(
        &self,
        ck: &mut Checks,
        flags: &[String],
        flows: &[Flow<&'static str>],
    ) {
        for (what, node, from, to, proto, want) in flows {
            let got = self.explain_action(*node, flags, *from, *to, *proto);
            ck.check(got == *want, || {
                format!("{what}: explain predicts {got}, the packets show {want}")
            });
        }
    }

    /// Checks, for each `(what, node, from, to, proto, endpoints)`, that `explain`
    /// predicts a forward to exactly those endpoint addresses (the ones the packets
    /// were answered by).
    pub fn check_explained_endpoints(&self, ck: &mut Checks, flows: &[Flow<Vec<IpAddr>>]) {
        for (what, node, from, to, proto, want) in flows {
            let v = self.explain(*node, &[], *from, *to, *proto);
            let mut got: Vec<IpAddr> = v["verdict"]["endpoints"]
                .as_array()
                .map(|eps| {
                    eps.iter()
                        .filter_map(|c| c["address"].as_str())
                        .filter_map(|a| a.parse::<SocketAddr>().ok())
                        .map(|a| a.ip())
                        .collect()
                })
                .unwrap_or_default();
            got.sort();
            let mut want = want.clone();
            want.sort();
            ck.check(got == want, || {
                format!(
                    "{what}: explain predicts {} to {got:?}, the packets show {want:?}",
                    v["verdict"]["action"]
                )
            });
        }
    }

    /// Whether `explain` says the connection reaches `endpoint` masqueraded (None: it
    /// does not say the connection reaches `endpoint` at all).
    pub fn explain_masquerades(
        &self,
        node: usize,
        from: IpAddr,
        to: SocketAddr,
        proto: Proto,
        endpoint: IpAddr,
    ) -> Option<bool> {
        let v = self.explain(node, &[], from, to, proto);
        v["verdict"]["endpoints"]
            .as_array()?
            .iter()
            .find(|c| {
                c["address"]
                    .as_str()
                    .and_then(|a| a.parse::<SocketAddr>().ok())
                    .is_some_and(|a| a.ip() == endpoint)
            })
            .and_then(|c| c["masquerade"].as_bool())
    }

    /// Starts a long-running svcproxy in `node` (not waiting for it to sync). A
    /// `--min-sync-period` in `flags` replaces the default `0s`, and a
    /// `--kubeconfig` the manifests.
    pub fn spawn_svcproxy(&self, bin: &Path, node: usize, flags: &[String]) -> NsProcess {
        let launch = self.mode.launch(bin);
        let mut args = self.proxy_args(node);
        // A test's own `--proxy-mode=...` (`--proxy-mode=`: the unset mode) replaces
        // the environment's.
        if flags.iter().any(|f| f.starts_with("--proxy-mode")) {
            args.drain(0..2);
        }
        // A test's own `--kubeconfig` (the API source) replaces the manifests, and
        // its `--min-sync-period` the default: the environment's flag and value go.
        for (theirs, ours) in [
            ("--kubeconfig", "--manifests"),
            ("--min-sync-period", "--min-sync-period"),
        ] {
            if flags.iter().any(|f| f == theirs) {
                let at = args
                    .iter()
                    .position(|a| a == ours)
                    .expect("the environment's flag");
                args.drain(at..at + 2);
            }
        }
        let mut argv: Vec<&str> = launch.iter().map(String::as_str).collect();
        argv.extend(args.iter().map(String::as_str));
        argv.extend(flags.iter().map(String::as_str));
        self.c
            .spawn(
                Host::Node(node),
                &format!("svcproxy-{}", plan::node_name(node)),
                &argv,
            )
            .expect("spawn svcproxy")
    }

    /// Waits until svcproxy in `node` has programmed both families (its first sync is a
    /// full, atomic one, so the kernel then holds the whole initial snapshot).
    pub fn wait_synced(&self, node: usize) {
        self.wait_programmed(node, Some(&self.proxies[self.proxy_index(node)]));
    }

    /// Where the svcproxy of `node` last started is in [`Env::proxies`].
    #[allow(dead_code)] // not every test binary
    pub fn proxy_index(&self, node: usize) -> usize {
        let label = format!("svcproxy-{}", plan::node_name(node));
        self.proxies
            .iter()
            .rposition(|p| p.label() == label)
            .unwrap_or_else(|| panic!("no {label} started"))
    }

    /// Waits (bounded) until svcproxy's objects exist in `node` for both families, failing
    /// early if `proxy` exits.
    pub fn wait_programmed(&self, node: usize, proxy: Option<&NsProcess>) {
        let deadline = Instant::now() + SYNC_DEADLINE;
        let logs = || proxy.map(NsProcess::logs).unwrap_or_default();
        loop {
            if let Some(status) = proxy.and_then(NsProcess::exit_status) {
                panic!(
                    "svcproxy on {} exited ({status}) before syncing\n{}",
                    plan::node_name(node),
                    logs()
                );
            }
            if self.programmed(node) {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "svcproxy ({}) on {} did not program both families within {SYNC_DEADLINE:?}\n{}",
                    self.mode.label(),
                    plan::node_name(node),
                    logs()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether svcproxy's objects exist in `node` for both families.
    pub fn programmed(&self, node: usize) -> bool {
        self.mode.programmed(&self.c, node) == [true, true]
    }

    /// Whether no svcproxy object exists in `node`, in either family.
    pub fn nothing_programmed(&self, node: usize) -> bool {
        self.mode.programmed(&self.c, node) == [false, false]
    }

    /// Writes a manifest atomically (a temporary name svcproxy ignores, then a rename), so
    /// the watcher never reads half a file.
    pub fn write(&self, name: &str, text: &str) {
        let path = self.path(name);
        let tmp = self.path(&format!(".{name}.tmp"));
        std::fs::write(&tmp, text).expect("write manifest");
        std::fs::rename(&tmp, &path).expect("rename manifest");
    }

    pub fn remove(&self, name: &str) {
        std::fs::remove_file(self.path(name)).expect("remove manifest");
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.manifests.path().join(name)
    }

    /// Everything svcproxy programmed in a node, as the mode's tool lists it.
    pub fn ruleset(&self, node: usize) -> String {
        self.mode.dump(&self.c, node)
    }

    pub fn probe(
        &self,
        from: Host,
        proto: Proto,
        target: SocketAddr,
        count: usize,
        timeout: Duration,
    ) -> Vec<Attempt> {
        self.c.probe(from, proto, target, count, timeout)
    }

    /// Protocols to exercise: SCTP only where this kernel (or the raw emulation) allows it.
    pub fn protos(&self) -> Vec<Proto> {
        if !self.mode.proxies_sctp() {
            // Checked once, by the capture test: not served, and said so.
            vec![Proto::Tcp, Proto::Udp]
        } else if self.c.sctp_mode() == SctpMode::Unavailable {
            eprintln!("[dataplane] SCTP unavailable here: SCTP cases skipped");
            vec![Proto::Tcp, Proto::Udp]
        } else {
            Proto::ALL.to_vec()
        }
    }

    /// Probes with `spec` every 50 ms until `done` accepts a batch, or `deadline` passes;
    /// returns the last batch and, if accepted, how long that took.
    pub fn probe_until(
        &self,
        from: Host,
        spec: &ProbeSpec,
        deadline: Duration,
        done: impl Fn(&[Attempt]) -> bool,
    ) -> (Vec<Attempt>, Option<Duration>) {
        let start = Instant::now();
        loop {
            let got = self.c.probe_spec(from, spec);
            if done(&got) {
                return (got, Some(start.elapsed()));
            }
            if start.elapsed() >= deadline {
                return (got, None);
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs the svcproxy binary to completion inside a node namespace.
    pub fn run_svcproxy(&self, node: usize, args: &[&str]) -> std::process::Output {
        let launch = self.mode.launch(&svcproxy_bin());
        let mut argv: Vec<&str> = launch.iter().map(String::as_str).collect();
        argv.extend_from_slice(args);
        self.c.exec(Host::Node(node), &argv)
    }

    /// svcproxy's logs, for failure messages.
    pub fn proxy_logs(&self) -> String {
        self.proxies
            .iter()
            .map(NsProcess::logs)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// One HTTP answer: status code, headers (lowercased names) and body.
#[allow(dead_code)] // operations.rs and dataplane.rs
#[derive(Debug, Default)]
pub struct Answer {
    pub code: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    #[allow(dead_code)] // operations.rs only
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// GET `path` from `ip:port`, made inside `from`'s namespace. `None`: no answer
/// (refused, timed out).
#[allow(dead_code)] // operations.rs and dataplane.rs
pub fn get(env: &Env, from: Host, ip: IpAddr, port: u16, path: &str) -> Option<Answer> {
    let script = format!(
        "exec 3<>/dev/tcp/{ip}/{port} || exit 7; \
         printf 'GET {path} HTTP/1.1\\r\\nHost: svcproxy\\r\\nConnection: close\\r\\n\\r\\n' >&3; \
         cat <&3"
    );
    let out = env.c.exec(from, &["timeout", "3", "bash", "-c", &script]);
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let code = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some(Answer {
        code,
        headers,
        body: body.to_string(),
    })
}

// ---------------------------------------------------------------------------------------
// Assertions that collect
// ---------------------------------------------------------------------------------------

/// Collects failed observations; [`Checks::finish`] fails the test with all of them.
pub struct Checks {
    test: &'static str,
    passed: usize,
    failures: Vec<String>,
}

fn show(attempts: &[Attempt]) -> String {
    let t = tally(attempts);
    let first_bad = attempts
        .iter()
        .find(|a| a.backend().is_none())
        .map(|a| format!(", e.g. {:?} after {:?}", a.result, a.elapsed))
        .unwrap_or_default();
    format!("{t:?}{first_bad}")
}

impl Checks {
    pub fn new(test: &'static str) -> Checks {
        Checks {
            test,
            passed: 0,
            failures: Vec::new(),
        }
    }

    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) -> bool {
        if ok {
            self.passed += 1;
        } else {
            let msg = what();
            eprintln!("[dataplane] {}: FAILED: {msg}", self.test);
            self.failures.push(msg);
        }
        ok
    }

    /// Whether every observation so far held.
    pub fn is_ok(&self) -> bool {
        self.failures.is_empty()
    }

    /// Every attempt answered, each by one of `allowed`; returns the tally.
    pub fn answered_by(
        &mut self,
        what: &str,
        attempts: &[Attempt],
        allowed: &[&str],
    ) -> BTreeMap<String, usize> {
        let t = tally(attempts);
        let ok = !attempts.is_empty()
            && attempts
                .iter()
                .all(|a| a.backend().is_some_and(|b| allowed.contains(&b)));
        self.check(ok, || {
            format!(
                "{what}: expected answers from {allowed:?} only, got {}",
                show(attempts)
            )
        });
        t
    }

    /// Every answered attempt saw `client` as its source address.
    pub fn client_is(&mut self, what: &str, attempts: &[Attempt], client: IpAddr) {
        let seen: Vec<IpAddr> = attempts
            .iter()
            .filter_map(|a| a.client_seen().map(|s| s.ip()))
            .collect();
        self.check(
            !seen.is_empty() && seen.iter().all(|ip| *ip == client),
            || format!("{what}: expected the backend to see client {client}, saw {seen:?}"),
        );
    }

    /// Every answered attempt saw `client` as its source address, in the modes that
    /// keep it; in the userspace mode, one of the addresses of `proxy`, the node
    /// whose proxy connected to the endpoint.
    #[allow(dead_code)] // dataplane.rs only
    pub fn client_kept(
        &mut self,
        mode: Mode,
        what: &str,
        attempts: &[Attempt],
        client: IpAddr,
        proxy: usize,
    ) {
        if mode.keeps_client_ip() {
            return self.client_is(what, attempts, client);
        }
        let f = Family::of(client);
        let node = [plan::node_ip(proxy, f), plan::pod_gateway(proxy, f)];
        let seen: Vec<IpAddr> = attempts
            .iter()
            .filter_map(|a| a.client_seen().map(|s| s.ip()))
            .collect();
        self.check(
            !seen.is_empty() && seen.iter().all(|ip| node.contains(ip)),
            || {
                format!(
                    "{what}: expected the backend to see {} (the userspace proxy connects from the node), saw {seen:?}",
                    plan::node_name(proxy)
                )
            },
        );
    }

    /// Every answered attempt reached the backend on `port`.
    pub fn backend_port_is(&mut self, what: &str, attempts: &[Attempt], port: u16) {
        let ports: Vec<u16> = attempts
            .iter()
            .filter_map(|a| match &a.result {
                ProbeResult::Answered { backend_port, .. } => Some(*backend_port),
                _ => None,
            })
            .collect();
        self.check(
            !ports.is_empty() && ports.iter().all(|p| *p == port),
            || format!("{what}: expected backend port {port}, saw {ports:?}"),
        );
    }

    /// Every attempt refused; and (a separate observation) each refusal came at once.
    pub fn refused_fast(&mut self, what: &str, attempts: &[Attempt]) {
        let refused = attempts.iter().all(Attempt::is_refused);
        if self.check(refused && !attempts.is_empty(), || {
            format!("{what}: expected a refusal, got {}", show(attempts))
        }) {
            let slowest = attempts.iter().map(|a| a.elapsed).max().unwrap_or_default();
            self.check(slowest < FAST_REFUSAL, || {
                format!(
                    "{what}: refused, but only after {slowest:?} (not at once: an ICMP \
                     refusal of a TCP SYN dropped by the kernel and seen at the SYN retransmit)"
                )
            });
        }
    }

    /// Every attempt of a client on the node itself was refused at once: a TCP
    /// reset or an ICMP error, or, for a datagram the output path rejected, the
    /// send itself failing with EPERM (how Linux reports a netfilter verdict
    /// against a local packet to its sender).
    pub fn refused_locally(&mut self, what: &str, attempts: &[Attempt]) {
        let refused = |a: &Attempt| {
            a.is_refused()
                || matches!(&a.result, ProbeResult::Other(e) if e.contains("Operation not permitted"))
        };
        self.check(
            !attempts.is_empty()
                && attempts
                    .iter()
                    .all(|a| refused(a) && a.elapsed < FAST_REFUSAL),
            || format!("{what}: expected a refusal at once, got {}", show(attempts)),
        );
    }

    /// Every attempt timed out (a DROP).
    pub fn dropped(&mut self, what: &str, attempts: &[Attempt]) {
        self.check(
            !attempts.is_empty() && attempts.iter().all(Attempt::is_timeout),
            || format!("{what}: expected a drop (timeout), got {}", show(attempts)),
        );
    }

    /// No attempt answered.
    pub fn not_answered(&mut self, what: &str, attempts: &[Attempt]) {
        self.check(attempts.iter().all(|a| a.backend().is_none()), || {
            format!("{what}: expected no answer, got {}", show(attempts))
        });
    }

    /// Fails the test with every failed observation, or reports how many passed.
    pub fn finish(&self, env: &Env) {
        if self.failures.is_empty() {
            eprintln!(
                "[dataplane] {}: {} checks passed in {:?}",
                self.test,
                self.passed,
                env.started.elapsed()
            );
            return;
        }
        panic!(
            "{} ({}): {} of {} checks failed:\n  - {}\n\nnode-a ruleset:\n{}\n{}",
            self.test,
            env.mode.label(),
            self.failures.len(),
            self.failures.len() + self.passed,
            self.failures.join("\n  - "),
            env.ruleset(0),
            env.proxy_logs()
        );
    }
}

/// Waits (bounded) until `proc`'s log (stderr) contains `needle`; says whether it did.
pub fn wait_log(proc: &svcproxy_e2e::NsProcess, needle: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if proc.stderr().contains(needle) {
            return true;
        }
        if Instant::now() >= deadline || proc.exit_status().is_some() {
            return proc.stderr().contains(needle);
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Whether this kernel runs tracing programs (fentry/fexit), as bpftool probes it:
/// where it does not, the LRU maps' eviction counter cannot run.
pub fn tracing_programs() -> bool {
    std::process::Command::new("bpftool")
        .args(["feature", "probe", "kernel"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("program_type tracing is available"))
        .unwrap_or(false)
}
