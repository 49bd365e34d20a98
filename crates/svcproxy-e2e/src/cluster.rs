//! A small Kubernetes-like cluster built from network namespaces: nodes on a bridged LAN,
//! pods behind each node, and an external client.
//!
//! ```text
//!                 lan (br0, router .254 / ::fe, blackhole default)
//!          ┌───────────────┼──────────────────────┐
//!   node-a .1 / ::1     node-b .2 / ::2       ext .100 (+.101)
//!    │ p0 │ p1  ...      │ p0 │ p1  ...        routes 198.18.100.0/24 (external / LB IPs)
//!  pod-a0 pod-a1       pod-b0 pod-b1            via node-a (or any node); default → lan
//! ```
//!
//! Nodes forward (IPv4 and IPv6) and route each other's pod CIDRs over the LAN; pods have a
//! /32 (/128) address and a default route to their node; the node routes each pod address to
//! its veth. `ext` has no route to pods or cluster IPs: its default route ends in the LAN
//! router's blackhole, so such traffic times out as it would from outside a real cluster.
//! The LAN router has no other interface, so nothing can leave the namespaces.
//!
//! Entry points: [`Cluster::create`], [`Cluster::probe`], [`Cluster::start_backends`],
//! [`Cluster::spawn`]. Dropping the cluster (also while unwinding from a panic) kills its
//! processes and deletes its namespaces.

use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Output};
use std::sync::{Mutex, OnceLock, Weak};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::bins::echo_bin;
use crate::echo::{Ready, SctpMode};
use crate::netns::{self, ip_batch, ns_command, run, run_ok, sysctl, NsSet, COMMAND_TIMEOUT};
use crate::plan::{self, Family};
use crate::probe::{Attempt, ProbeLine, Proto};
use crate::process::{kill_slot, NsProcess};

/// Index of the first node, `node-a`.
pub const NODE_A: usize = 0;
/// Index of the second node, `node-b`.
pub const NODE_B: usize = 1;

/// A place in the cluster, i.e. one namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    /// Node by index ([`NODE_A`], [`NODE_B`], ...).
    Node(usize),
    /// Pod `j` on node `i`: `Pod(i, j)`.
    Pod(usize, usize),
    /// The external client.
    Ext,
    /// The LAN bridge / router namespace.
    Lan,
}

/// The shape of a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSpec {
    /// Node namespaces (1..=8); node 0 is `node-a`.
    pub nodes: usize,
    /// Pod namespaces behind each node.
    pub pods_per_node: usize,
    /// Give every host an IPv6 address too (IPv4 is always there).
    pub dual_stack: bool,
    /// The node `ext` routes external / load-balancer IPs through.
    pub ext_via: usize,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec {
            nodes: 2,
            pods_per_node: 2,
            dual_stack: true,
            ext_via: NODE_A,
        }
    }
}

/// One pod of the cluster, as a manifest would describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    pub host: Host,
    pub name: String,
    pub node: usize,
    pub node_name: String,
    pub ipv4: IpAddr,
    pub ipv6: Option<IpAddr>,
}

/// Ports the echo backends listen on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendPorts {
    pub tcp: Vec<u16>,
    pub udp: Vec<u16>,
    pub sctp: Vec<u16>,
}

impl BackendPorts {
    /// The same ports for TCP, UDP and SCTP.
    pub fn all(ports: &[u16]) -> BackendPorts {
        BackendPorts {
            tcp: ports.to_vec(),
            udp: ports.to_vec(),
            sctp: ports.to_vec(),
        }
    }
}

/// A probe with every option; [`Cluster::probe`] covers the common case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSpec {
    pub proto: Proto,
    pub target: SocketAddr,
    pub count: usize,
    pub timeout: Duration,
    pub source_ip: Option<IpAddr>,
    pub source_port: Option<u16>,
    pub interval: Duration,
}

impl ProbeSpec {
    pub fn new(proto: Proto, target: SocketAddr) -> ProbeSpec {
        ProbeSpec {
            proto,
            target,
            count: 1,
            timeout: Duration::from_secs(1),
            source_ip: None,
            source_port: None,
            interval: Duration::ZERO,
        }
    }

    pub fn count(mut self, count: usize) -> Self {
        self.count = count;
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn source_ip(mut self, ip: IpAddr) -> Self {
        self.source_ip = Some(ip);
        self
    }

    pub fn source_port(mut self, port: u16) -> Self {
        self.source_port = Some(port);
        self
    }

    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }
}

/// Echo servers started by [`Cluster::start_backends`]; killed on drop.
#[derive(Debug)]
pub struct Backends {
    pub procs: Vec<NsProcess>,
}

impl Backends {
    pub fn logs(&self) -> String {
        self.procs
            .iter()
            .map(NsProcess::logs)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The running cluster. Dropping it kills everything it started and deletes its namespaces.
#[derive(Debug)]
pub struct Cluster {
    spec: ClusterSpec,
    lan: String,
    ext: String,
    nodes: Vec<String>,
    pods: Vec<Vec<String>>,
    ext_via: Mutex<usize>,
    /// Processes started through [`Cluster::spawn`]; weak so a guard dropped early is gone.
    children: Mutex<Vec<Weak<Mutex<Option<Child>>>>>,
    log_dir: Option<tempfile::TempDir>,
    sctp_mode: OnceLock<SctpMode>,
    /// Per node, the cgroup its processes start in and its data plane's pin
    /// directory ([`Cluster::confine_node`]).
    node_cgroups: Mutex<Vec<Option<(PathBuf, PathBuf)>>>,
    /// Pods' processes start in their node's cgroup too
    /// ([`Cluster::translate_pods_at_connect`]).
    pods_at_connect: std::sync::atomic::AtomicBool,
    // Last: its Drop runs after ours has killed the processes.
    nsset: NsSet,
}

impl Cluster {
    /// Builds the namespaces and wiring. Call [`crate::require_root_or_skip`] first.
    pub fn create(spec: ClusterSpec) -> Result<Cluster> {
        if spec.nodes == 0 || spec.nodes > plan::MAX_NODES {
            bail!("nodes must be 1..={}, got {}", plan::MAX_NODES, spec.nodes);
        }
        if spec.pods_per_node > plan::MAX_PODS_PER_NODE {
            bail!("pods_per_node must be <= {}", plan::MAX_PODS_PER_NODE);
        }
        if spec.ext_via >= spec.nodes {
            bail!("ext_via {} is not a node", spec.ext_via);
        }
        netns::cleanup_stale();
        let started = Instant::now();
        let mut nsset = NsSet::new();
        let mut roles = vec!["lan".to_string(), "ext".to_string()];
        for n in 0..spec.nodes {
            roles.push(plan::node_name(n));
            for p in 0..spec.pods_per_node {
                roles.push(plan::pod_name(n, p));
            }
        }
        let names = nsset.add(&roles)?;
        let mut it = names.into_iter();
        let lan = it.next().context("lan namespace")?;
        let ext = it.next().context("ext namespace")?;
        let mut nodes = Vec::new();
        let mut pods = Vec::new();
        for _ in 0..spec.nodes {
            nodes.push(it.next().context("node namespace")?);
            pods.push(
                (0..spec.pods_per_node)
                    .map(|_| it.next().context("pod namespace"))
                    .collect::<Result<Vec<_>>>()?,
            );
        }
        let log_dir = tempfile::Builder::new()
            .prefix(&format!("{}logs-", nsset.prefix()))
            .tempdir()
            .context("creating the log directory")?;
        let cluster = Cluster {
            ext_via: Mutex::new(spec.ext_via),
            spec,
            lan,
            ext,
            nodes,
            pods,
            children: Mutex::new(Vec::new()),
            log_dir: Some(log_dir),
            sctp_mode: OnceLock::new(),
            node_cgroups: Mutex::new(Vec::new()),
            pods_at_connect: std::sync::atomic::AtomicBool::new(false),
            nsset,
        };
        // On error `cluster` drops here and removes what was built so far.
        cluster.wire().context("wiring the cluster")?;
        if std::env::var_os("SVCPROXY_E2E_VERBOSE").is_some() {
            eprintln!(
                "svcproxy-e2e: cluster {} ready in {:?}",
                cluster.nsset.prefix(),
                started.elapsed()
            );
        }
        Ok(cluster)
    }

    fn families(&self) -> Vec<Family> {
        if self.spec.dual_stack {
            Family::BOTH.to_vec()
        } else {
            vec![Family::V4]
        }
    }

    fn wire(&self) -> Result<()> {
        let families = self.families();
        self.wire_sysctls()?;
        self.wire_lan(&families)?;
        self.wire_nodes(&families)?;
        self.wire_pods(&families)?;
        self.wire_ext(&families)
    }

    fn wire_sysctls(&self) -> Result<()> {
        // Sysctls first: interfaces created afterwards inherit `default`, so no address is
        // ever tentative (no DAD wait) and no host rp_filter setting leaks in (new
        // namespaces copy the root namespace's IPv4 settings).
        let base: [(&str, &str); 4] = [
            ("net.ipv6.conf.all.accept_dad", "0"),
            ("net.ipv6.conf.default.accept_dad", "0"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
        ];
        let mut jobs: Vec<(String, Vec<(&str, &str)>)> = Vec::new();
        let forwarding = |on: &'static str| {
            let mut s = base.to_vec();
            s.push(("net.ipv4.ip_forward", on));
            s.push(("net.ipv6.conf.all.forwarding", on));
            s
        };
        jobs.push((self.lan.clone(), forwarding("0")));
        jobs.push((self.ext.clone(), forwarding("0")));
        for (n, node) in self.nodes.iter().enumerate() {
            jobs.push((node.clone(), forwarding("1")));
            for pod in &self.pods[n] {
                jobs.push((pod.clone(), forwarding("0")));
            }
        }
        parallel(jobs, |(ns, settings)| sysctl(&ns, &settings))?;
        // Bridged frames must not be handed to any netfilter hook in the LAN namespace; the
        // knobs exist only where br_netfilter is built in or loaded, hence best effort.
        let _ = sysctl(
            &self.lan,
            &[
                ("net.bridge.bridge-nf-call-iptables", "0"),
                ("net.bridge.bridge-nf-call-ip6tables", "0"),
                ("net.bridge.bridge-nf-call-arptables", "0"),
            ],
        );
        Ok(())
    }

    fn wire_lan(&self, families: &[Family]) -> Result<()> {
        let v6 = self.spec.dual_stack;
        // LAN: a bridge with the router address and blackhole defaults, plus one veth per
        // node and one for ext, whose other ends are created directly in those namespaces.
        let mut lan = vec![
            "link set lo up".to_string(),
            "link add br0 type bridge forward_delay 0 mcast_snooping 0".into(),
        ];
        for f in families {
            lan.push(format!(
                "addr add {}/{} dev br0{}",
                plan::lan_router_ip(*f),
                plan::lan_prefix(*f),
                nodad(*f)
            ));
        }
        lan.push("link set br0 up".into());
        lan.push("route add blackhole 0.0.0.0/0".into());
        if v6 {
            lan.push("route add blackhole ::/0".into());
        }
        let mut ports: Vec<(String, &str)> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(n, ns)| (format!("n-{}", node_letter(n)), ns.as_str()))
            .collect();
        ports.push(("ext".into(), self.ext.as_str()));
        for (port, peer_ns) in &ports {
            lan.push(format!(
                "link add {port} type veth peer name eth0 netns {peer_ns}"
            ));
            lan.push(format!("link set {port} master br0"));
            lan.push(format!("link set {port} up"));
        }
        ip_batch(&self.lan, &lan)?;
        Ok(())
    }

    fn wire_nodes(&self, families: &[Family]) -> Result<()> {
        // Nodes: LAN address, default via the LAN router (so node-originated traffic to
        // service IPs has a route before DNAT), routes to the other nodes' pod CIDRs, and a
        // veth per pod.
        let mut node_jobs = Vec::new();
        for (n, ns) in self.nodes.iter().enumerate() {
            let mut b = vec!["link set lo up".to_string()];
            for f in families {
                b.push(format!(
                    "addr add {}/{} dev eth0{}",
                    plan::node_ip(n, *f),
                    plan::lan_prefix(*f),
                    nodad(*f)
                ));
            }
            b.push("link set eth0 up".into());
            for f in families {
                b.push(format!(
                    "route add {} via {}",
                    default_route(*f),
                    plan::lan_router_ip(*f)
                ));
                for other in (0..self.spec.nodes).filter(|o| *o != n) {
                    b.push(format!(
                        "route add {} via {}",
                        plan::pod_cidr(other, *f),
                        plan::node_ip(other, *f)
                    ));
                }
            }
            for (p, pod_ns) in self.pods[n].iter().enumerate() {
                b.push(format!(
                    "link add p{p} type veth peer name eth0 netns {pod_ns}"
                ));
                for f in families {
                    // The same gateway address on every pod veth: each pod sees one
                    // on-link gateway, and the node answers ARP / ND for it on each veth.
                    b.push(format!(
                        "addr add {} dev p{p}{}",
                        plan::host_cidr(plan::pod_gateway(n, *f)),
                        nodad(*f)
                    ));
                }
                b.push(format!("link set p{p} up"));
                for f in families {
                    b.push(format!(
                        "route add {} dev p{p}",
                        plan::host_cidr(plan::pod_ip(n, p, *f))
                    ));
                }
            }
            node_jobs.push((ns.clone(), b));
        }
        parallel(node_jobs, |(ns, b)| ip_batch(&ns, &b))?;
        Ok(())
    }

    fn wire_pods(&self, families: &[Family]) -> Result<()> {
        // Pods: one address per family, an on-link route to the gateway and a default via it.
        let mut pod_jobs = Vec::new();
        for (n, pods) in self.pods.iter().enumerate() {
            for (p, ns) in pods.iter().enumerate() {
                let mut b = vec!["link set lo up".to_string()];
                for f in families {
                    b.push(format!(
                        "addr add {} dev eth0{}",
                        plan::host_cidr(plan::pod_ip(n, p, *f)),
                        nodad(*f)
                    ));
                }
                b.push("link set eth0 up".into());
                for f in families {
                    let gw = plan::pod_gateway(n, *f);
                    b.push(format!(
                        "route add {} dev eth0 scope link",
                        plan::host_cidr(gw)
                    ));
                    b.push(format!("route add {} via {gw} dev eth0", default_route(*f)));
                }
                pod_jobs.push((ns.clone(), b));
            }
        }
        parallel(pod_jobs, |(ns, b)| ip_batch(&ns, &b))?;
        Ok(())
    }

    fn wire_ext(&self, families: &[Family]) -> Result<()> {
        // ext: two LAN addresses per family (the second for source-range tests), default
        // into the LAN router's blackhole, external / LB IPs via the chosen node.
        let mut b = vec!["link set lo up".to_string()];
        for f in families {
            b.push(format!(
                "addr add {}/{} dev eth0{}",
                plan::ext_ip(*f),
                plan::lan_prefix(*f),
                nodad(*f)
            ));
            // Deprecated (preferred_lft 0) on IPv6 so source selection keeps choosing the
            // first address; IPv4 makes the second one secondary anyway.
            let alt_flags = match f {
                Family::V4 => String::new(),
                Family::V6 => " nodad preferred_lft 0".into(),
            };
            b.push(format!(
                "addr add {}/{} dev eth0{alt_flags}",
                plan::ext_alt_ip(*f),
                plan::lan_prefix(*f)
            ));
        }
        b.push("link set eth0 up".into());
        for f in families {
            b.push(format!(
                "route add {} via {}",
                default_route(*f),
                plan::lan_router_ip(*f)
            ));
            b.push(format!(
                "route add {} via {}",
                plan::external_ips_cidr(*f),
                plan::node_ip(self.spec.ext_via, *f)
            ));
        }
        ip_batch(&self.ext, &b)?;
        Ok(())
    }

    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// The namespace name of a host.
    pub fn ns(&self, host: Host) -> &str {
        match host {
            Host::Lan => &self.lan,
            Host::Ext => &self.ext,
            Host::Node(n) => self
                .nodes
                .get(n)
                .unwrap_or_else(|| panic!("no node {n} in this cluster")),
            Host::Pod(n, p) => self
                .pods
                .get(n)
                .and_then(|pods| pods.get(p))
                .unwrap_or_else(|| panic!("no pod {p} on node {n} in this cluster")),
        }
    }

    /// The Kubernetes-style name: `node-a`, `pod-a0`, `ext`, `lan`.
    pub fn name(&self, host: Host) -> String {
        let _ = self.ns(host);
        match host {
            Host::Lan => "lan".into(),
            Host::Ext => "ext".into(),
            Host::Node(n) => plan::node_name(n),
            Host::Pod(n, p) => plan::pod_name(n, p),
        }
    }

    /// A host's primary address in `family` (the LAN router's for `Lan`).
    pub fn ip(&self, host: Host, family: Family) -> IpAddr {
        let _ = self.ns(host);
        assert!(
            family == Family::V4 || self.spec.dual_stack,
            "IPv6 asked of a single-stack cluster"
        );
        match host {
            Host::Lan => plan::lan_router_ip(family),
            Host::Ext => plan::ext_ip(family),
            Host::Node(n) => plan::node_ip(n, family),
            Host::Pod(n, p) => plan::pod_ip(n, p, family),
        }
    }

    pub fn nodes(&self) -> Vec<Host> {
        (0..self.spec.nodes).map(Host::Node).collect()
    }

    pub fn pods(&self) -> Vec<PodInfo> {
        let mut out = Vec::new();
        for n in 0..self.spec.nodes {
            for p in 0..self.spec.pods_per_node {
                out.push(PodInfo {
                    host: Host::Pod(n, p),
                    name: plan::pod_name(n, p),
                    node: n,
                    node_name: plan::node_name(n),
                    ipv4: plan::pod_ip(n, p, Family::V4),
                    ipv6: self.spec.dual_stack.then(|| plan::pod_ip(n, p, Family::V6)),
                });
            }
        }
        out
    }

    /// Every namespace of this cluster.
    pub fn namespaces(&self) -> &[String] {
        self.nsset.names()
    }

    /// Where process logs go (removed with the cluster unless a test panics).
    pub fn log_dir(&self) -> &Path {
        self.log_dir
            .as_ref()
            .map(tempfile::TempDir::path)
            .expect("log dir exists while the cluster lives")
    }

    /// How SCTP is spoken here: kernel sockets, raw-socket emulation, or not at all.
    pub fn sctp_mode(&self) -> SctpMode {
        *self.sctp_mode.get_or_init(SctpMode::detect)
    }

    /// From now on, every process [`Cluster::exec`], [`Cluster::spawn`] and
    /// [`Cluster::probe`] start on `node` starts in `cgroup` (a cgroup v2
    /// directory the test owns): the node's own processes, for a data plane that
    /// translates sockets by cgroup (the ebpf mode), which pins in `pin_dir`.
    pub fn confine_node(&self, node: usize, cgroup: PathBuf, pin_dir: PathBuf) {
        let mut cgroups = self.node_cgroups.lock().unwrap_or_else(|e| e.into_inner());
        if cgroups.len() <= node {
            cgroups.resize(node + 1, None);
        }
        cgroups[node] = Some((cgroup, pin_dir));
    }

    /// From now on, the processes started in a pod of a confined node start in
    /// that node's cgroup as well, as a DaemonSet's `--ebpf-cgroup` (the cgroup
    /// v2 root) holds every pod: the ebpf mode translates their sockets at
    /// connect(), where otherwise their connections take the packet path.
    pub fn translate_pods_at_connect(&self) {
        self.pods_at_connect
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The nodes' indexes.
    pub fn nodes_indexes(&self) -> std::ops::Range<usize> {
        0..self.nodes.len()
    }

    /// The cgroup and pin directory of `node`'s data plane, if it is confined.
    pub fn node_confinement(&self, node: usize) -> Option<(PathBuf, PathBuf)> {
        self.node_cgroups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(node)
            .cloned()
            .flatten()
    }

    /// `argv` inside the host's namespace, in its node's cgroup if it has one.
    fn command(&self, host: Host, argv: &[&str]) -> std::process::Command {
        let cgroup = match host {
            Host::Node(n) => self.node_confinement(n).map(|(cg, _)| cg),
            Host::Pod(n, _)
                if self
                    .pods_at_connect
                    .load(std::sync::atomic::Ordering::SeqCst) =>
            {
                self.node_confinement(n).map(|(cg, _)| cg)
            }
            _ => None,
        };
        match cgroup {
            Some(cg) => {
                let procs = cg.join("cgroup.procs");
                let procs = procs.to_string_lossy();
                let mut v = vec!["sh", "-c", "echo $$ > \"$0\" && exec \"$@\"", &*procs];
                v.extend_from_slice(argv);
                ns_command(self.ns(host), &v)
            }
            None => ns_command(self.ns(host), argv),
        }
    }

    /// Runs `argv` inside the host's namespace and waits (bounded) for it. Panics only if
    /// the command cannot be run at all; check `status` for its own failure.
    pub fn exec(&self, host: Host, argv: &[&str]) -> Output {
        run(&mut self.command(host, argv), None, COMMAND_TIMEOUT)
            .unwrap_or_else(|e| panic!("exec in {}: {e:#}", self.name(host)))
    }

    /// Like [`Cluster::exec`], returning stdout and panicking with stderr on failure.
    pub fn exec_ok(&self, host: Host, argv: &[&str]) -> String {
        run_ok(&mut self.command(host, argv), None)
            .unwrap_or_else(|e| panic!("in {}: {e:#}", self.name(host)))
    }

    /// Loads an nftables script (`nft -f -`) inside the host's namespace.
    pub fn nft(&self, host: Host, script: &str) -> Result<String> {
        run_ok(
            &mut ns_command(self.ns(host), &["nft", "-f", "-"]),
            Some(script),
        )
    }

    /// Starts a long-running process inside the host's namespace, its output in
    /// `<log_dir>/<label>.out|.err`; killed when the guard or the cluster drops.
    pub fn spawn(&self, host: Host, label: &str, argv: &[&str]) -> Result<NsProcess> {
        let proc = NsProcess::spawn_command(&mut self.command(host, argv), label, self.log_dir())?;
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        children.retain(|w| w.strong_count() > 0);
        children.push(proc.slot());
        Ok(proc)
    }

    /// Starts an echo server named `name` on `host` and waits until it has bound its ports.
    pub fn start_backend(&self, host: Host, name: &str, ports: &BackendPorts) -> Result<NsProcess> {
        let procs = self.start_echo_servers(&[(host, name.to_string())], ports)?;
        procs.into_iter().next().context("no backend started")
    }

    /// Starts an echo server in every pod, each answering with its pod name.
    pub fn start_backends(&self, ports: &BackendPorts) -> Result<Backends> {
        let hosts: Vec<(Host, String)> =
            self.pods().into_iter().map(|p| (p.host, p.name)).collect();
        Ok(Backends {
            procs: self.start_echo_servers(&hosts, ports)?,
        })
    }

    fn start_echo_servers(
        &self,
        hosts: &[(Host, String)],
        ports: &BackendPorts,
    ) -> Result<Vec<NsProcess>> {
        let bin = echo_bin()?;
        let bin = bin.to_string_lossy().into_owned();
        let list = |p: &[u16]| p.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
        let (tcp, udp, sctp) = (list(&ports.tcp), list(&ports.udp), list(&ports.sctp));
        let mode = self.sctp_mode().as_str();
        let mut procs = Vec::new();
        // Start all, then wait for all: the servers come up in parallel.
        for (host, name) in hosts {
            let mut argv = vec![bin.as_str(), "serve", "--name", name.as_str()];
            for (flag, value) in [("--tcp", &tcp), ("--udp", &udp), ("--sctp", &sctp)] {
                if !value.is_empty() {
                    argv.extend([flag, value.as_str()]);
                }
            }
            if !sctp.is_empty() && mode != "unavailable" {
                argv.extend(["--sctp-mode", mode]);
            }
            procs.push(self.spawn(*host, &format!("echo-{name}"), &argv)?);
        }
        for proc in &procs {
            let out = proc.wait_for_stdout("\"ready\":true", Duration::from_secs(10))?;
            let ready: Ready = serde_json::from_str(out.lines().next().unwrap_or_default())
                .with_context(|| format!("bad ready line from {}", proc.label()))?;
            debug_assert!(ready.ready);
        }
        Ok(procs)
    }

    /// `count` fresh attempts from `from` to `target`, each with its own source port.
    pub fn probe(
        &self,
        from: Host,
        proto: Proto,
        target: SocketAddr,
        count: usize,
        timeout: Duration,
    ) -> Vec<Attempt> {
        self.probe_spec(
            from,
            &ProbeSpec::new(proto, target).count(count).timeout(timeout),
        )
    }

    /// A probe with every option. Panics if the probe tool itself fails (not on refusals or
    /// timeouts, which are results).
    pub fn probe_spec(&self, from: Host, spec: &ProbeSpec) -> Vec<Attempt> {
        self.try_probe(from, spec)
            .unwrap_or_else(|e| panic!("probe from {}: {e:#}", self.name(from)))
    }

    pub fn try_probe(&self, from: Host, spec: &ProbeSpec) -> Result<Vec<Attempt>> {
        let bin = echo_bin()?;
        let mut args: Vec<String> = vec![
            bin.to_string_lossy().into_owned(),
            "probe".into(),
            "--proto".into(),
            spec.proto.to_string(),
            "--target".into(),
            spec.target.to_string(),
            "--count".into(),
            spec.count.to_string(),
            "--timeout-ms".into(),
            spec.timeout.as_millis().to_string(),
            "--interval-ms".into(),
            spec.interval.as_millis().to_string(),
        ];
        if let Some(ip) = spec.source_ip {
            args.extend(["--source-ip".into(), ip.to_string()]);
        }
        if let Some(port) = spec.source_port {
            args.extend(["--source-port".into(), port.to_string()]);
        }
        if spec.proto == Proto::Sctp && self.sctp_mode() != SctpMode::Unavailable {
            args.extend(["--sctp-mode".into(), self.sctp_mode().as_str().into()]);
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        // Each attempt is bounded by its timeout, plus slack for process start-up.
        let per = spec.timeout + spec.interval + Duration::from_millis(50);
        let limit = per * spec.count.max(1) as u32 + Duration::from_secs(10);
        let out = run(&mut self.command(from, &argv), None, limit)?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let attempts: Vec<Attempt> = stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str::<ProbeLine>(l)
                    .map(Attempt::from)
                    .with_context(|| format!("bad probe line {l:?}"))
            })
            .collect::<Result<_>>()?;
        if !out.status.success() || attempts.len() != spec.count {
            bail!(
                "probe {:?} {} gave {} of {} lines ({}): {}",
                spec.proto,
                spec.target,
                attempts.len(),
                spec.count,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(attempts)
    }

    /// Routes external / load-balancer IPs from `ext` through `node` instead.
    pub fn route_ext_via(&self, node: usize) -> Result<()> {
        let _ = self.ns(Host::Node(node));
        let lines: Vec<String> = self
            .families()
            .into_iter()
            .map(|f| {
                format!(
                    "route replace {} via {}",
                    plan::external_ips_cidr(f),
                    plan::node_ip(node, f)
                )
            })
            .collect();
        ip_batch(&self.ext, &lines)?;
        *self.ext_via.lock().unwrap_or_else(|e| e.into_inner()) = node;
        Ok(())
    }

    /// Gives a pod one more address (a scenario's endpoint or client IP outside the
    /// address plan) and routes it: on the pod's node through the pod's veth, on every
    /// other node via the pod's node.
    pub fn add_pod_address(&self, pod: Host, ip: IpAddr) -> Result<()> {
        let Host::Pod(n, p) = pod else {
            bail!("{pod:?} is not a pod");
        };
        let f = Family::of(ip);
        ip_batch(
            self.ns(pod),
            &[format!(
                "addr add {} dev eth0{}",
                plan::host_cidr(ip),
                nodad(f)
            )],
        )?;
        ip_batch(
            self.ns(Host::Node(n)),
            &[format!("route add {} dev p{p}", plan::host_cidr(ip))],
        )?;
        for other in (0..self.spec.nodes).filter(|o| *o != n) {
            ip_batch(
                self.ns(Host::Node(other)),
                &[format!(
                    "route add {} via {}",
                    plan::host_cidr(ip),
                    plan::node_ip(n, f)
                )],
            )?;
        }
        Ok(())
    }

    /// Routes `cidr` (service addresses outside the address plan) from `ext` through `node`.
    pub fn route_ext(&self, cidr: &str, node: usize) -> Result<()> {
        let f = if cidr.contains(':') {
            Family::V6
        } else {
            Family::V4
        };
        ip_batch(
            &self.ext,
            &[format!(
                "route replace {cidr} via {}",
                plan::node_ip(node, f)
            )],
        )
    }

    /// The node `ext` currently routes external IPs through.
    pub fn ext_via(&self) -> usize {
        *self.ext_via.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tears down now and reports failures (drop does the same but can only log them).
    pub fn close(mut self) -> Result<()> {
        self.kill_children();
        self.nsset.delete()
    }

    fn kill_children(&self) {
        let children =
            std::mem::take(&mut *self.children.lock().unwrap_or_else(|e| e.into_inner()));
        for slot in children.iter().filter_map(Weak::upgrade) {
            kill_slot(&slot);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill_children();
        if thread::panicking() {
            // Keep the logs of a failed test for a post-mortem.
            if let Some(dir) = self.log_dir.take() {
                let path: PathBuf = dir.keep();
                // Never a panic here (a closed stderr while unwinding would abort
                // before the namespaces below are deleted).
                let _ = writeln!(
                    std::io::stderr(),
                    "svcproxy-e2e: logs kept in {}",
                    path.display()
                );
            }
        }
        if let Err(e) = self.nsset.delete() {
            let _ = writeln!(
                std::io::stderr(),
                "svcproxy-e2e: tearing down {}: {e:#}",
                self.nsset.prefix()
            );
        }
    }
}

fn node_letter(n: usize) -> char {
    (b'a' + n as u8) as char
}

fn nodad(f: Family) -> &'static str {
    match f {
        Family::V4 => "",
        Family::V6 => " nodad",
    }
}

fn default_route(f: Family) -> &'static str {
    match f {
        Family::V4 => "0.0.0.0/0",
        Family::V6 => "::/0",
    }
}

/// Runs independent setup jobs (one per namespace) on a few threads: on 2 cores the
/// `ip` / `sysctl` process start-ups overlap well.
fn parallel<T: Send>(jobs: Vec<T>, f: impl Fn(T) -> Result<()> + Sync) -> Result<()> {
    const WORKERS: usize = 4;
    let queue = Mutex::new(jobs);
    let errors = Mutex::new(Vec::new());
    thread::scope(|s| {
        for _ in 0..WORKERS {
            s.spawn(|| loop {
                let job = queue.lock().unwrap_or_else(|e| e.into_inner()).pop();
                let Some(job) = job else { break };
                if let Err(e) = f(job) {
                    errors
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(format!("{e:#}"));
                }
            });
        }
    });
    let errors = errors.into_inner().unwrap_or_else(|e| e.into_inner());
    if !errors.is_empty() {
        bail!("{}", errors.join("\n"));
    }
    Ok(())
}
