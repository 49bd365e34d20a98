//! The intent as plain text, one line per decision: what golden `expected.intent`
//! files hold, and what a person reads to see what this node will do without
//! reading any backend's rules.
//!
//! Entry point: [`describe`]. Names of services are printed with `{:?}` quoting,
//! so no user string can forge a line.

use std::fmt::Write as _;
use std::net::SocketAddr;
use svcproxy_core::model::Scheduler;

use super::{
    Action, Disposition, EndpointSetId, ExternalRoute, FamilyIntent, Intent, LocalTraffic,
    Masquerade, NodeIntent, NodePortDestinations, ServiceIntent,
};

fn list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let v: Vec<String> = items.into_iter().map(|i| i.to_string()).collect();
    format!("[{}]", v.join(" "))
}

fn set_name(id: EndpointSetId) -> &'static str {
    match id {
        EndpointSetId::Cluster => "cluster",
        EndpointSetId::Local => "local",
    }
}

fn endpoints(svc: &ServiceIntent, id: EndpointSetId) -> String {
    let eps: Vec<SocketAddr> = svc.set(id).unwrap_or_default();
    format!("{} {}", set_name(id), list(eps))
}

fn node_line(n: &NodeIntent) -> String {
    let local = match &n.local_traffic {
        None => "unknown".to_string(),
        Some(LocalTraffic::Cidrs(c)) => format!("from {}", list(c)),
        Some(LocalTraffic::Interface(i)) => format!("on interface {:?}", i.as_str()),
        Some(LocalTraffic::InterfacePrefix(i)) => format!("on interfaces {:?}*", i.as_str()),
    };
    let nodeports = match &n.nodeports {
        NodePortDestinations::Ips(ips) => list(ips),
        NodePortDestinations::AllLocal => "every local address".to_string(),
    };
    format!(
        "node: masquerade mark {:#x}{}; local pods {local}; nodePorts on {nodeports}{}; node IPs {}; ServiceCIDRs {} (unallocated: {})",
        n.masquerade_mark,
        if n.masquerade_all { ", masquerade all" } else { "" },
        match (n.localhost_nodeports, n.family) {
            (false, _) => "",
            (true, svcproxy_core::model::IpFamily::V4) => " and 127.0.0.0/8",
            (true, svcproxy_core::model::IpFamily::V6) => " and ::1",
        },
        list(&n.node_ips),
        list(&n.service_cidrs),
        if n.guard_service_ips { "drop" } else { "routed" },
    ) + if n.drop_invalid_forwarded {
        "; forwarded conntrack-INVALID: drop"
    } else {
        ""
    } + &refused_cidrs(n)
}

/// ServiceCIDRs the guard leaves out, if any.
fn refused_cidrs(n: &NodeIntent) -> String {
    if n.refused_service_cidrs.is_empty() {
        return String::new();
    }
    let each: Vec<String> = n
        .refused_service_cidrs
        .iter()
        .map(|(cidr, ip)| format!("{cidr} (holds {ip})"))
        .collect();
    format!("; ServiceCIDRs refused: {}", each.join(", "))
}

fn external_route(svc: &ServiceIntent, r: &ExternalRoute) -> String {
    let mut steps = Vec::new();
    if r.masquerade {
        steps.push("masquerade".to_string());
    }
    if r.pods_to_cluster {
        steps.push(format!(
            "local pods -> {}",
            endpoints(svc, EndpointSetId::Cluster)
        ));
    }
    match (r.host_masquerade, r.host_to_cluster) {
        (true, true) => steps.push(format!(
            "host (masqueraded) -> {}",
            endpoints(svc, EndpointSetId::Cluster)
        )),
        (true, false) => steps.push("host masqueraded".to_string()),
        _ => {}
    }
    steps.push(match r.rest {
        Disposition::Forward(id) => format!("forward {}", endpoints(svc, id)),
        Disposition::Drop => "others drop".to_string(),
    });
    steps.join("; ")
}

fn internal_route(svc: &ServiceIntent) -> String {
    let masq = match svc.internal.masquerade {
        Masquerade::Never => "",
        Masquerade::Always => "; masquerade",
        Masquerade::UnlessFromLocalPod => "; masquerade unless from a local pod",
    };
    format!("forward {}{masq}", endpoints(svc, svc.internal.set))
}

fn family(out: &mut String, fam: &FamilyIntent) {
    let _ = writeln!(out, "{}", fam.family());
    let Some(node) = fam.node() else {
        let _ = writeln!(out, "  not programmed");
        return;
    };
    let _ = writeln!(out, "  {}", node_line(node));
    let _ = writeln!(
        out,
        "  cluster IPs {} (other ports: {})",
        list(fam.cluster_ips()),
        if node.guard_service_ips {
            "reject"
        } else {
            "routed"
        }
    );
    for (svc, f) in fam.frontends() {
        let action = match (f.action, f.kind.is_external()) {
            (Action::Drop, _) => "drop".to_string(),
            (Action::Reject, _) => "reject".to_string(),
            (Action::Forward, false) => internal_route(svc),
            (Action::Forward, true) => match &svc.external {
                Some(r) => external_route(svc, r),
                None => "reject".to_string(),
            },
        };
        let firewall = match (&svc.firewall, f.firewall) {
            (Some(fw), true) => format!(
                "only from {}{}; ",
                list(&fw.ranges),
                if fw.lb_sources.is_empty() {
                    String::new()
                } else {
                    format!(" and the load balancer's own {}", list(&fw.lb_sources))
                }
            ),
            _ => String::new(),
        };
        let affinity = svc
            .affinity_timeout
            .map(|t| format!("; ClientIP affinity {t}s"))
            .unwrap_or_default();
        let scheduler = match (svc.scheduler, svc.maglev_table_size) {
            (Scheduler::Random, _) => String::new(),
            (s, Some(cells)) => format!("; scheduler {s} ({cells} cells)"),
            (s, None) => format!("; scheduler {s}"),
        };
        let scheduler = if svc.weights.is_empty() {
            scheduler
        } else {
            let w: Vec<String> = svc.weights.iter().map(u8::to_string).collect();
            format!("{scheduler}; weights {}", w.join(","))
        };
        let _ = writeln!(
            out,
            "  {} {} {:?}: {firewall}{action}{affinity}{scheduler}",
            f.key,
            f.kind.as_str(),
            svc.name.to_string(),
        );
    }
    for c in fam.conflicts() {
        let ignored: Vec<String> = c
            .ignored
            .iter()
            .map(|n| format!("{:?}", n.to_string()))
            .collect();
        let _ = writeln!(
            out,
            "  conflict {}: {:?} kept, {} ignored",
            c.destination,
            c.kept.to_string(),
            ignored.join(" ")
        );
    }
}

/// The whole intent as text, IPv4 then IPv6.
pub fn describe(intent: &Intent) -> String {
    let mut out = String::new();
    for fam in intent.families() {
        family(&mut out, fam);
    }
    out
}
