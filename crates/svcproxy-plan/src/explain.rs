//! `svcproxy explain`'s tracer: one new connection, followed through this node's
//! intent step by step, to the outcome the rules give it: which frontend it hits,
//! the firewall, the traffic policy and topology decision (with the snapshot's
//! reason), the candidate endpoints with their probabilities, whether it is
//! masqueraded and why, or why it is dropped, rejected or left alone.
//!
//! Entry point: [`explain`]. It reads the backend-neutral [`Intent`] (every mode
//! translates the same intent, so the answer holds for each) and the snapshots the
//! intent was built from (for the endpoint selection's reason). Pure: no I/O.
//! [`Trace`] serializes as `explain --format json`'s stable contract; [`Trace::text`]
//! is the human form, user strings quoted with `{:?}` so none can forge a line.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use serde::Serialize;
use svcproxy_core::model::{IpFamily, Protocol, Scheduler};
use svcproxy_core::snapshot::NodeSnapshot;

use crate::intent::{
    Action, Disposition, EndpointSetId, FamilyIntent, Frontend, FrontendKey, FrontendKind, Intent,
    LocalTraffic, Masquerade, NodeIntent, NodePortDestinations, ServiceIntent,
};

/// Where the connection comes from, as the rules tell sources apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Origin {
    /// The node itself (a host-network process).
    Node,
    /// A pod, as `--detect-local-mode` tells local traffic (this node's pods; with
    /// `ClusterCIDR`, any pod of the cluster CIDR).
    LocalPod,
    /// Anything else: another node, a pod elsewhere, a client outside the cluster.
    External,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Node => "this node",
            Origin::LocalPod => "a pod (local traffic)",
            Origin::External => "outside this node",
        }
    }
}

/// The connection to explain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    pub from: IpAddr,
    pub to: SocketAddr,
    pub protocol: Protocol,
    /// Given by the caller; `None`: told from `from` where the configuration allows
    /// (the node's addresses, the local-traffic CIDRs), else external.
    pub origin: Option<Origin>,
}

/// The frontend a connection hit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FrontendHit {
    /// `namespace/name:port`, or `namespace/name` for an unnamed port.
    pub service_port: String,
    /// `ClusterIP`, `ExternalIP`, `LoadBalancerIP`, `NodePort`.
    pub kind: &'static str,
    /// The destination the frontend matches, e.g. `10.96.0.10:80/TCP` or
    /// `nodePort 30080/TCP`.
    pub destination: String,
}

/// One endpoint the connection may be sent to.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    pub address: String,
    /// Its share of new connections: uniform at random, by weight for the
    /// weighted schedulers; for `lc` and its kin, and the hashing ones, the share
    /// they would have if their counts or hashes were even.
    pub probability: f64,
    /// Masqueraded on this path (true for all when the route masquerades; for a
    /// connection from an endpoint that may be this node's own to itself, always:
    /// hairpin).
    pub masquerade: bool,
}

/// What happens to the connection.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum Verdict {
    /// DNAT to one of `endpoints`.
    #[serde(rename_all = "camelCase")]
    Forward {
        /// `cluster` or `local`.
        endpoint_set: &'static str,
        endpoints: Vec<Candidate>,
        masquerade: bool,
        masquerade_reason: String,
        /// ClientIP session affinity: a client keeps its endpoint this long.
        session_affinity_seconds: Option<u32>,
        /// How a new connection's endpoint is chosen, where not at random
        /// (IPVS's scheduler names: `rr`, `mh`, `lc`, ...).
        #[serde(skip_serializing_if = "Option::is_none")]
        scheduler: Option<&'static str>,
    },
    Drop {
        reason: String,
    },
    Reject {
        reason: String,
    },
    /// Not a destination svcproxy handles: the rules leave it to routing.
    Accept {
        reason: String,
    },
}

/// A connection's path through this node's rules.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Trace {
    pub from: String,
    pub to: String,
    pub protocol: String,
    pub family: &'static str,
    pub origin: Origin,
    pub origin_reason: String,
    pub frontend: Option<FrontendHit>,
    /// The decisions, in order, for people.
    pub steps: Vec<String>,
    pub verdict: Verdict,
    /// With `--live`: how the kernel's rules compare with the plan.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelCheck>,
    /// The hex hashes naming the frontend's service port's chains and sets (its
    /// own, its endpoints', their affinity sets'), for [`Trace::with_kernel`].
    #[serde(skip)]
    pub object_ids: Vec<String>,
}

/// What `--live` found in the kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KernelCheck {
    pub mode: String,
    /// How the kernel's rules were compared with the plan: `rules` (each
    /// declaration, rule and element, in the kernel's listing form) or `counts`
    /// (rules per chain, elements per set: a rule rewritten in place goes unseen).
    pub compared: &'static str,
    /// Why only counts were compared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counted_because: Option<String>,
    /// The kernel holds what a full sync of the plan would write (as compared).
    pub agrees: bool,
    /// Every difference: a chain or set missing or extra, a rule or element
    /// lacking or added, a declaration changed.
    pub differences: Vec<String>,
    /// Those of the traced service port's own chains.
    pub this_service_port: Vec<String>,
    /// Others' rules that see packets before svcproxy's (other tables' base
    /// chains at the same hook, rules in front of svcproxy's jumps): they may
    /// drop, accept or rewrite the packet first.
    pub ahead: Vec<String>,
    /// kube-proxy's rules still installed (they answer for the same Services).
    pub kube_proxy_leftovers: Vec<String>,
}

/// What the data plane's comparison found, for [`Trace::with_kernel`].
#[derive(Clone, Debug, Default)]
pub struct KernelFindings {
    pub mode: String,
    /// `Some(why)` when only counts were compared.
    pub counted_only: Option<String>,
    pub differences: Vec<String>,
    pub ahead: Vec<String>,
    pub kube_proxy_leftovers: Vec<String>,
}

impl Trace {
    /// Adds what `--live` found: `differences` from the data plane's comparison,
    /// those naming this service port's chains picked out.
    pub fn with_kernel(&mut self, found: KernelFindings) {
        let KernelFindings {
            mode,
            counted_only,
            differences,
            ahead,
            kube_proxy_leftovers,
        } = found;
        // iptables names carry the service port's hash's first 12 digits in every
        // chain of it; nftables names the endpoint chains by their own hash.
        let this_service_port = differences
            .iter()
            .filter(|d| {
                let d = d.to_lowercase();
                self.object_ids.iter().any(|id| d.contains(id.as_str()))
            })
            .cloned()
            .collect();
        self.kernel = Some(KernelCheck {
            mode,
            compared: if counted_only.is_some() {
                "counts"
            } else {
                "rules"
            },
            counted_because: counted_only,
            agrees: differences.is_empty(),
            differences,
            this_service_port,
            ahead,
            kube_proxy_leftovers,
        });
    }

    /// The trace for people: the steps, then the outcome.
    pub fn text(&self) -> String {
        let mut out = format!(
            "{} -> {} {} ({}), from {} ({})\n",
            self.from,
            self.to,
            self.protocol,
            self.family,
            self.origin.as_str(),
            self.origin_reason
        );
        for (i, s) in self.steps.iter().enumerate() {
            out.push_str(&format!("  {}. {}\n", i + 1, one_line(s)));
        }
        let outcome = match &self.verdict {
            Verdict::Forward {
                endpoint_set,
                endpoints,
                masquerade,
                masquerade_reason,
                session_affinity_seconds,
                scheduler,
            } => {
                let head = format!(
                    "FORWARD to one of {} endpoint(s) of the {endpoint_set} set{}{}; {}masqueraded: {masquerade_reason}",
                    endpoints.len(),
                    scheduler.map(|s| format!(", chosen by {s}")).unwrap_or_default(),
                    session_affinity_seconds
                        .map(|t| format!(" (ClientIP affinity: a client keeps its endpoint for {t} s)"))
                        .unwrap_or_default(),
                    if *masquerade { "" } else { "not " },
                );
                let mut s = one_line(&head);
                s.push('\n');
                for c in endpoints {
                    s.push_str(&format!(
                        "     {:<40} {:>6.2}%{}\n",
                        c.address,
                        c.probability * 100.0,
                        if c.masquerade && !masquerade {
                            "  (hairpin: masqueraded)"
                        } else {
                            ""
                        }
                    ));
                }
                s
            }
            Verdict::Drop { reason } => format!("DROP: {}\n", one_line(reason)),
            Verdict::Reject { reason } => format!("REJECT: {}\n", one_line(reason)),
            Verdict::Accept { reason } => format!("ACCEPT (not proxied): {}\n", one_line(reason)),
        };
        out.push_str("=> ");
        out.push_str(&outcome);
        if let Some(k) = &self.kernel {
            let compared = match &k.counted_because {
                None => "rule by rule".to_string(),
                Some(why) => format!("by counts only, as {}", one_line(why)),
            };
            if k.agrees {
                out.push_str(&format!(
                    "kernel ({} mode, --live, compared {compared}): holds what the plan writes\n",
                    k.mode
                ));
            } else {
                out.push_str(&format!(
                    "kernel ({} mode, --live, compared {compared}): differs from the plan in {} place(s), {} of them this service port's own chains: the packet may not get the verdict above\n",
                    k.mode,
                    k.differences.len(),
                    k.this_service_port.len()
                ));
                for d in &k.differences {
                    let marker = if k.this_service_port.contains(d) {
                        "*"
                    } else {
                        "-"
                    };
                    out.push_str(&format!("   {marker} {}\n", one_line(d)));
                }
            }
            for a in &k.ahead {
                out.push_str(&format!(
                    "   ! seen before svcproxy's rules: {}\n",
                    one_line(a)
                ));
            }
            for l in &k.kube_proxy_leftovers {
                out.push_str(&format!(
                    "   ! kube-proxy's rules are installed too: {}\n",
                    one_line(l)
                ));
            }
        }
        out
    }
}

/// `s` on one line: control characters (a newline in a user's topology key, say)
/// are escaped, so no input can forge a line of the text form.
fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn set_name(id: EndpointSetId) -> &'static str {
    match id {
        EndpointSetId::Cluster => "cluster",
        EndpointSetId::Local => "local",
    }
}

fn socket(ip: IpAddr, port: u16) -> String {
    SocketAddr::new(ip, port).to_string()
}

/// Who sent the packet, and how that was told.
fn origin_of(packet: &Packet, node: Option<&NodeIntent>) -> (Origin, String) {
    if let Some(o) = packet.origin {
        return (o, "as given".to_string());
    }
    let Some(node) = node else {
        return (Origin::External, "not one of this node's addresses".into());
    };
    if packet.from.is_loopback() || node.node_ips.contains(&packet.from) {
        return (Origin::Node, "one of this node's addresses".into());
    }
    match &node.local_traffic {
        Some(LocalTraffic::Cidrs(cidrs)) => match cidrs.iter().find(|c| c.contains(&packet.from)) {
            Some(c) => (
                Origin::LocalPod,
                format!("inside {c}, local traffic to --detect-local-mode"),
            ),
            None => (
                Origin::External,
                format!(
                    "neither this node's address nor inside the local-traffic CIDRs {}",
                    cidrs
                        .iter()
                        .map(|c| c.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
        },
        Some(LocalTraffic::Interface(_) | LocalTraffic::InterfacePrefix(_)) => (
            Origin::External,
            "not this node's address; local pods are told by interface here: pass --from-pod for one"
                .into(),
        ),
        None => (
            Origin::External,
            "not this node's address; local pods cannot be told apart (--detect-local-mode gives nothing)"
                .into(),
        ),
    }
}

/// Whether `ip` takes NodePorts on this node, and how that was decided; `host`
/// is the snapshot of `ip`'s family (its `host_ips`: this host's addresses, when
/// they were read).
fn nodeport_destination(
    node: &NodeIntent,
    host: &NodeSnapshot,
    ip: IpAddr,
) -> Option<&'static str> {
    if node.localhost_nodeports && ip.is_loopback() {
        return Some(match ip {
            IpAddr::V4(_) => "127.0.0.0/8 (localhost NodePorts)",
            IpAddr::V6(_) => "::1 (localhost NodePorts)",
        });
    }
    match &node.nodeports {
        NodePortDestinations::Ips(ips) if ips.contains(&ip) => {
            Some("one of the nodePortAddresses of this node")
        }
        NodePortDestinations::Ips(_) => None,
        // The rules match every local address (`fib daddr type local`, `-m
        // addrtype --dst-type LOCAL`) but loopback: those of the host as read,
        // and the node's own in case they were not.
        NodePortDestinations::AllLocal
            if !ip.is_loopback()
                && (host.host_ips.contains(&ip) || node.node_ips.contains(&ip)) =>
        {
            Some("a local address of this node (nodePortAddresses: every local address)")
        }
        NodePortDestinations::AllLocal => None,
    }
}

/// Follows `packet` through `intent` (built from `v4` and `v6`).
pub fn explain(intent: &Intent, v4: &NodeSnapshot, v6: &NodeSnapshot, packet: &Packet) -> Trace {
    let family = IpFamily::of(&packet.to.ip());
    let fam = intent.family(family);
    let node = fam.node().map(|n| n.as_ref());
    let (origin, origin_reason) = origin_of(packet, node);
    let mut trace = Trace {
        from: packet.from.to_string(),
        to: packet.to.to_string(),
        protocol: packet.protocol.to_string(),
        family: family.as_str(),
        origin,
        origin_reason,
        frontend: None,
        steps: Vec::new(),
        verdict: Verdict::Accept {
            reason: String::new(),
        },
        kernel: None,
        object_ids: Vec::new(),
    };
    let Some(node) = node else {
        trace.verdict = Verdict::Accept {
            reason: format!(
                "svcproxy programs no {} rules on this node",
                family.as_str()
            ),
        };
        return trace;
    };
    let snap = match family {
        IpFamily::V4 => v4,
        IpFamily::V6 => v6,
    };
    let path = Path {
        fam,
        node,
        snap,
        packet,
        origin,
    };
    trace.verdict = match path.follow(&mut trace) {
        Ok(verdict) | Err(verdict) => verdict,
    };
    trace
}

/// One connection's way through one family's intent: each step either says what
/// it found (in the trace's steps) and passes the connection on, or ends it with
/// its verdict (`Err`).
struct Path<'a> {
    fam: &'a FamilyIntent,
    node: &'a NodeIntent,
    snap: &'a NodeSnapshot,
    packet: &'a Packet,
    origin: Origin,
}

/// A step's result: the connection goes on with `T`, or ends with a verdict.
type Step<T> = Result<T, Verdict>;

impl<'a> Path<'a> {
    /// The steps in the order the rules take them.
    fn follow(&self, trace: &mut Trace) -> Step<Verdict> {
        if IpFamily::of(&self.packet.from) != self.fam.family() {
            trace.steps.push(format!(
                "the source {} is not {}: no such packet exists; explained as if it were",
                self.packet.from,
                self.fam.family().as_str()
            ));
        }
        self.loopback_nodeport()?;
        let (svc, frontend) = self.frontend(&mut trace.steps)?;
        self.record_frontend(trace, svc, frontend);
        self.firewall(svc, frontend, &mut trace.steps)?;
        self.policy(svc, frontend, &mut trace.steps)?;
        let (set, masquerade, why) = self.endpoint_set(svc, frontend, &mut trace.steps)?;
        self.forward(svc, frontend, set, masquerade, why)
    }

    /// Rejects a NodePort on loopback that is not served there, under KEP-6032's
    /// gate: the node's own output filter rejects it (and counts it) before
    /// anything else sees it. Only the node itself sends to its loopback.
    fn loopback_nodeport(&self) -> Step<()> {
        let packet = self.packet;
        let on_loopback = FrontendKey::NodePort {
            protocol: packet.protocol,
            port: packet.to.port(),
        };
        if self.origin == Origin::Node
            && packet.to.ip().is_loopback()
            && self.node.localhost_rejects.contains(&packet.protocol)
            && self.fam.frontend(&on_loopback).is_some()
        {
            return Err(Verdict::Reject {
                reason: format!(
                    "NodePort {}/{} is not served on loopback here, and \
                     KubeProxyNFTablesLocalhostNodePorts rejects it (counted in \
                     kubeproxy_nftables_localhost_nodeport_rejected_packets_total)",
                    packet.to.port(),
                    packet.protocol
                ),
            });
        }
        Ok(())
    }

    /// Step 1, which frontend: a service address, else a NodePort on an address that
    /// takes NodePorts; with none, the guards of the service ranges, or nothing.
    fn frontend(&self, steps: &mut Vec<String>) -> Step<(&'a Arc<ServiceIntent>, &'a Frontend)> {
        let packet = self.packet;
        let vip = FrontendKey::Vip {
            ip: packet.to.ip(),
            protocol: packet.protocol,
            port: packet.to.port(),
        };
        let hit = self.fam.frontend(&vip).or_else(|| {
            let why = nodeport_destination(self.node, self.snap, packet.to.ip())?;
            let key = FrontendKey::NodePort {
                protocol: packet.protocol,
                port: packet.to.port(),
            };
            let hit = self.fam.frontend(&key)?;
            steps.push(format!("{} takes NodePorts: {why}", packet.to.ip()));
            Some(hit)
        });
        hit.ok_or_else(|| self.no_frontend(steps))
    }

    /// The verdict for a destination no frontend matches.
    fn no_frontend(&self, steps: &mut Vec<String>) -> Verdict {
        let (packet, node) = (self.packet, self.node);
        let ip = packet.to.ip();
        if node.guard_service_ips && self.fam.cluster_ips().any(|c| c == ip) {
            steps.push(format!(
                "{ip} is a cluster IP, but no service port of it is {}/{}",
                packet.to.port(),
                packet.protocol
            ));
            return Verdict::Reject {
                reason: format!(
                    "port {}/{} is not exposed on cluster IP {ip} (upstream rejects a cluster IP's other ports)",
                    packet.to.port(),
                    packet.protocol
                ),
            };
        }
        if node.guard_service_ips {
            if let Some(cidr) = node.service_cidrs.iter().find(|c| c.contains(&ip)) {
                return Verdict::Drop {
                    reason: format!(
                        "{ip} is inside ServiceCIDR {cidr} but allocated to no service (unallocated service addresses are dropped)"
                    ),
                };
            }
        }
        Verdict::Accept {
            reason: format!(
                "{} is no service frontend on this node: routed as any other packet",
                packet.to
            ),
        }
    }

    /// The frontend hit, its objects' ids, and who else claims it.
    fn record_frontend(&self, trace: &mut Trace, svc: &ServiceIntent, frontend: &Frontend) {
        trace.object_ids = object_ids(svc);
        trace.frontend = Some(FrontendHit {
            service_port: svc.name.to_string(),
            kind: frontend.kind.as_str(),
            destination: frontend.key.to_string(),
        });
        trace.steps.push(format!(
            "frontend: {} {} of service port {:?}",
            frontend.kind.as_str(),
            frontend.key,
            svc.name.to_string()
        ));
        let conflicted = self
            .fam
            .conflicts()
            .into_iter()
            .find(|c| c.destination == frontend.key.to_string());
        if let Some(c) = conflicted {
            trace.steps.push(format!(
                "also claimed by {}: ignored, {:?} holds it (a cluster IP first, then the first by name)",
                c.ignored
                    .iter()
                    .map(|n| format!("{:?}", n.to_string()))
                    .collect::<Vec<_>>()
                    .join(", "),
                c.kept.to_string()
            ));
        }
    }

    /// Step 2, the firewall (loadBalancerSourceRanges), before anything else.
    fn firewall(
        &self,
        svc: &ServiceIntent,
        frontend: &Frontend,
        steps: &mut Vec<String>,
    ) -> Step<()> {
        let from = self.packet.from;
        let Some(fw) = svc.firewall.as_ref().filter(|_| frontend.firewall) else {
            return Ok(());
        };
        match fw.ranges.iter().find(|r| r.contains(&from)) {
            Some(r) => steps.push(format!(
                "loadBalancerSourceRanges: {from} is inside {r}: allowed"
            )),
            None if fw.lb_sources.contains(&from) => steps.push(format!(
                "loadBalancerSourceRanges: from the load balancer's own IP {from} (one of this \
                 node's addresses is in the ranges, so a VIP-style load balancer's loop back \
                 is allowed, as upstream)"
            )),
            None => {
                let ranges = fw
                    .ranges
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(Verdict::Drop {
                    reason: format!("{from} is not in the loadBalancerSourceRanges [{ranges}]"),
                });
            }
        }
        Ok(())
    }

    /// Step 3, the traffic policy and topology decision.
    fn policy(
        &self,
        svc: &ServiceIntent,
        frontend: &Frontend,
        steps: &mut Vec<String>,
    ) -> Step<()> {
        let selection_reason = self
            .snap
            .service_ports
            .get(&svc.name)
            .map(|v| v.selection.reason.clone())
            .unwrap_or_default();
        if !selection_reason.is_empty() {
            steps.push(format!("endpoint selection: {selection_reason}"));
        }
        let policy = if frontend.kind.is_external() {
            "externalTrafficPolicy"
        } else {
            "internalTrafficPolicy"
        };
        match frontend.action {
            Action::Forward => Ok(()),
            Action::Reject => Err(Verdict::Reject {
                reason: no_endpoints(svc, policy),
            }),
            Action::Drop => Err(Verdict::Drop {
                reason: format!(
                    "{policy} Local and no endpoint on this node, while some exist elsewhere (a client or load balancer should use another node)"
                ),
            }),
        }
    }

    /// Step 4, which endpoint set, whether masqueraded, and why.
    fn endpoint_set(
        &self,
        svc: &ServiceIntent,
        frontend: &Frontend,
        steps: &mut Vec<String>,
    ) -> Step<(EndpointSetId, bool, String)> {
        let (packet, origin) = (self.packet, self.origin);
        if frontend.kind == FrontendKind::ClusterIp {
            let r = svc.internal;
            let (masq, why) = match r.masquerade {
                Masquerade::Always => (true, "--masquerade-all".to_string()),
                Masquerade::UnlessFromLocalPod if origin == Origin::LocalPod => {
                    (false, "local (pod) traffic is not masqueraded".into())
                }
                Masquerade::UnlessFromLocalPod => (
                    true,
                    "to a cluster IP from outside the pods (not local traffic): the reply must come back through this node"
                        .into(),
                ),
                Masquerade::Never => (
                    false,
                    "local traffic cannot be told apart (--detect-local-mode), so cluster IP traffic is not masqueraded"
                        .into(),
                ),
            };
            return Ok((r.set, masq, why));
        }
        let Some(route) = svc.external else {
            return Err(Verdict::Reject {
                reason: no_endpoints(svc, "externalTrafficPolicy"),
            });
        };
        let localhost = frontend.kind == FrontendKind::NodePort && packet.to.ip().is_loopback();
        if route.masquerade {
            return Ok((
                EndpointSetId::Cluster,
                true,
                "externalTrafficPolicy Cluster: the endpoint may be on another node".to_string(),
            ));
        }
        if route.pods_to_cluster && origin == Origin::LocalPod {
            steps.push(
                "externalTrafficPolicy Local, but from a pod: short-circuited to the cluster-wide endpoints"
                    .into(),
            );
            return Ok((
                EndpointSetId::Cluster,
                false,
                "pod traffic keeps its address".to_string(),
            ));
        }
        if origin == Origin::Node && (route.host_to_cluster || route.host_masquerade) {
            steps.push(
                "externalTrafficPolicy Local, but from the node itself: short-circuited to the cluster-wide endpoints"
                    .into(),
            );
            let set = if route.host_to_cluster {
                EndpointSetId::Cluster
            } else {
                match route.rest {
                    Disposition::Forward(s) => s,
                    Disposition::Drop => EndpointSetId::Cluster,
                }
            };
            return Ok((
                set,
                route.host_masquerade,
                "from the node itself, whose source address an endpoint could not answer"
                    .to_string(),
            ));
        }
        match route.rest {
            Disposition::Forward(s) => Ok((
                s,
                localhost,
                if localhost {
                    "a localhost NodePort: a loopback source cannot leave the node".to_string()
                } else {
                    "externalTrafficPolicy Local: the client's address is kept".to_string()
                },
            )),
            Disposition::Drop => Err(Verdict::Drop {
                reason: "externalTrafficPolicy Local and no endpoint on this node, while some exist elsewhere (a load balancer should use another node)".into(),
            }),
        }
    }

    /// Step 5, the candidates of the set, each with its chance.
    fn forward(
        &self,
        svc: &ServiceIntent,
        frontend: &Frontend,
        set: EndpointSetId,
        masquerade: bool,
        why: String,
    ) -> Step<Verdict> {
        let masquerade = masquerade
            || (frontend.kind == FrontendKind::NodePort
                && matches!(self.packet.to.ip(), IpAddr::V4(v4) if v4.is_loopback()));
        let endpoints = candidates(svc, set, self.packet.from, masquerade);
        if endpoints.is_empty() {
            return Err(Verdict::Reject {
                reason: no_endpoints(svc, "traffic policy"),
            });
        }
        Ok(Verdict::Forward {
            endpoint_set: set_name(set),
            endpoints,
            masquerade,
            masquerade_reason: why,
            session_affinity_seconds: svc.affinity_timeout,
            scheduler: (svc.scheduler != Scheduler::Random).then(|| svc.scheduler.as_str()),
        })
    }
}

/// Why a connection finds no endpoint, under `policy`.
fn no_endpoints(svc: &ServiceIntent, policy: &str) -> String {
    if svc.has_any_endpoints {
        format!(
            "{policy}: none of the service's usable endpoints may take this traffic from this node"
        )
    } else {
        "no usable endpoint (ready, or serving and terminating) anywhere".to_string()
    }
}

/// The hex hashes in the names of `svc`'s chains and sets: the service port's (its
/// first 12 digits, which iptables names carry), each endpoint's, and each
/// endpoint's affinity set's; and, for a port nftables serves without a chain of
/// its own, its cluster IP ports as elements are listed (`` `VIP . PROTO . PORT` ``,
/// and its endpoints' `` `VIP . PROTO . PORT . K : ...` ``).
fn object_ids(svc: &ServiceIntent) -> Vec<String> {
    let own = format!(
        "{:016x}",
        crate::names::service_port_hash(svc.family, &svc.name)
    );
    let mut ids = vec![own[..12].to_string()];
    for f in svc.frontends.iter() {
        if let (FrontendKind::ClusterIp, FrontendKey::Vip { ip, protocol, port }) = (f.kind, f.key)
        {
            let key = format!(
                "{ip} . {} . {port}",
                crate::names::protocol_keyword(protocol)
            );
            ids.push(format!("`{key}`"));
            ids.push(format!("`{key} . "));
        }
    }
    let hasher = crate::names::EndpointHasher::new(svc.family, &svc.name);
    for e in svc.endpoints.iter() {
        ids.push(format!("{:016x}", hasher.endpoint(e.ip(), e.port())));
        if let Some(t) = svc.affinity_timeout {
            ids.push(format!("{:016x}", hasher.affinity(e.ip(), e.port(), t)));
        }
    }
    ids
}

fn candidates(
    svc: &ServiceIntent,
    set: EndpointSetId,
    from: IpAddr,
    masquerade: bool,
) -> Vec<Candidate> {
    let eps = svc.set(set).unwrap_or_default();
    let weights = svc.set_weights(set);
    let total: f64 = if weights.is_empty() {
        eps.len() as f64
    } else {
        weights.iter().map(|w| f64::from(*w)).sum()
    };
    let p = |i: usize| {
        if total == 0.0 {
            0.0
        } else {
            weights.get(i).map_or(1.0, |w| f64::from(*w)) / total
        }
    };
    // A connection from an endpoint to itself is masqueraded (hairpin), where the
    // intent says the endpoint may be this node's own (one on another node never
    // sends through this node's rules).
    let hairpin = |e: &std::net::SocketAddr| {
        svc.endpoints
            .position(e)
            .is_some_and(|i| svc.endpoints.hairpin(i))
    };
    eps.iter()
        .enumerate()
        .map(|(i, e)| Candidate {
            address: socket(e.ip(), e.port()),
            probability: p(i),
            masquerade: masquerade || (e.ip() == from && hairpin(e)),
        })
        .collect()
}
