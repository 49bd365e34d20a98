//! `svcproxy snapshot` output: the JSON contract scripts rely on, and a table for people.
//!
//! Entry points: [`write_snapshot_json`] (streamed), [`snapshot_json`] and
//! [`snapshot_table`]. The JSON shape is documented
//! in README.md; fields are only ever added, never renamed or retyped.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::sync::Arc;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{json, Value};

use crate::model::{Endpoint, IpMode, ServicePortName};
use crate::problem::{InputProblem, Problem};
use crate::snapshot::{NodeSnapshot, ServicePortView};

fn endpoint_list(eps: &Option<Arc<[Endpoint]>>) -> Value {
    match eps {
        None => Value::Null,
        Some(v) => Value::Array(v.iter().map(|e| Value::String(e.to_string())).collect()),
    }
}

fn view_json(family: &str, v: &ServicePortView) -> Value {
    let p = &v.port;
    let ips = |it: &mut dyn Iterator<Item = std::net::IpAddr>| -> Vec<String> {
        it.map(|ip| ip.to_string()).collect()
    };
    json!({
        "name": p.name.to_string(),
        "protocol": p.name.protocol.as_str(),
        "family": family,
        "type": format!("{:?}", p.service_type),
        "clusterIPs": ips(&mut p.cluster_ips.iter().copied()),
        "port": p.port,
        "nodePort": p.node_port,
        "externalIPs": ips(&mut p.external_ips.iter().copied()),
        "loadBalancerIPs": ips(&mut p.load_balancer_vips()),
        "loadBalancerProxyModeIPs": ips(&mut p
            .load_balancer_ingress
            .iter()
            .filter(|i| i.ip_mode == IpMode::Proxy)
            .map(|i| i.ip)),
        "loadBalancerSourceRanges": p
            .load_balancer_source_ranges
            .as_ref()
            .map(|r| r.iter().map(|n| n.to_string()).collect::<Vec<_>>()),
        "externalTrafficPolicy": p.external_traffic_policy.as_str(),
        "internalTrafficPolicy": p.internal_traffic_policy.as_str(),
        "sessionAffinityTimeoutSeconds": p.session_affinity_timeout,
        "healthCheckNodePort": p.health_check_node_port,
        "topologyKeys": p
            .topology_keys
            .as_ref()
            .map(|k| k.iter().map(|k| k.to_string()).collect::<Vec<_>>()),
        "clusterEndpoints": endpoint_list(&v.selection.cluster_endpoints),
        "localEndpoints": endpoint_list(&v.selection.local_endpoints),
        "hasAnyEndpoints": v.selection.has_any_endpoints,
        "reason": v.selection.reason,
    })
}

/// The documented JSON object of one node's snapshot (both families), serialized
/// without building it: at 100k endpoints a `Value` tree of it takes well over
/// 100 MiB, while this streams one service port's small `Value` at a time. Keys come
/// out sorted, as `Value`'s maps sort them.
struct SnapshotDoc<'a> {
    snapshots: &'a [&'a NodeSnapshot],
    problems: &'a [&'a Problem],
    input: &'a [InputProblem],
}

impl Serialize for SnapshotDoc<'_> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let first = self.snapshots.first();
        let node = first.map(|s| s.node_name.as_str()).unwrap_or_default();
        let labels = first.and_then(|s| s.node.as_ref()).map(|n| &n.labels);
        // Ordered by printed name, protocol and family; compared without printing
        // (at 20k ports, a String per row was most of this function's memory).
        let mut rows: Vec<(&str, &ServicePortView)> = self
            .snapshots
            .iter()
            .flat_map(|snap| {
                snap.service_ports
                    .values()
                    .map(|v| (snap.family.as_str(), &**v))
            })
            .collect();
        rows.sort_unstable_by(|(fa, a), (fb, b)| {
            printed(&a.port.name)
                .cmp(printed(&b.port.name))
                .then_with(|| {
                    a.port
                        .name
                        .protocol
                        .as_str()
                        .cmp(b.port.name.protocol.as_str())
                })
                .then_with(|| fa.cmp(fb))
        });
        // Input that could not be read comes first: it names no object.
        let unreadable = self.input.iter().map(|p| {
            json!({
                "object": null,
                "origin": p.origin,
                "severity": "unreadable",
                "field": "",
                "message": p.message,
            })
        });
        let problems = unreadable.chain(self.problems.iter().map(|p| {
            json!({
                "object": p.object.to_string(),
                "origin": p.origin,
                "severity": p.severity.as_str(),
                "field": p.field,
                "message": p.message,
            })
        }));
        let ports = rows.iter().map(|(family, v)| view_json(family, v));
        let mut map = ser.serialize_map(Some(4))?;
        map.serialize_entry("node", node)?;
        map.serialize_entry("nodeLabels", &labels)?;
        map.serialize_entry("problems", &Lazy(RefCell::new(Some(problems))))?;
        map.serialize_entry("servicePorts", &Lazy(RefCell::new(Some(ports))))?;
        map.end()
    }
}

/// The bytes of a service port name as `Display` prints it (`ns/name:port`).
fn printed(n: &ServicePortName) -> impl Iterator<Item = u8> + '_ {
    let colon = (!n.port.is_empty()).then_some(b':');
    n.service
        .namespace
        .bytes()
        .chain(std::iter::once(b'/'))
        .chain(n.service.name.bytes())
        .chain(colon)
        .chain(n.port.bytes())
}

/// A sequence serialized from an iterator, consumed once.
struct Lazy<I>(RefCell<Option<I>>);

impl<I: Iterator<Item = Value>> Serialize for Lazy<I> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        match self.0.borrow_mut().take() {
            Some(items) => ser.collect_seq(items),
            None => Err(serde::ser::Error::custom("serialized twice")),
        }
    }
}

/// The snapshot of one node (both families) as the documented JSON object.
pub fn snapshot_json(
    snapshots: &[&NodeSnapshot],
    problems: &[&Problem],
    input: &[InputProblem],
) -> Value {
    serde_json::to_value(SnapshotDoc {
        snapshots,
        problems,
        input,
    })
    .unwrap_or(Value::Null)
}

/// Writes [`snapshot_json`]'s document to `out` as it is serialized (compact, or
/// pretty-printed), without holding it in memory.
pub fn write_snapshot_json(
    out: &mut dyn std::io::Write,
    snapshots: &[&NodeSnapshot],
    problems: &[&Problem],
    input: &[InputProblem],
    pretty: bool,
) -> serde_json::Result<()> {
    let doc = SnapshotDoc {
        snapshots,
        problems,
        input,
    };
    if pretty {
        serde_json::to_writer_pretty(out, &doc)
    } else {
        serde_json::to_writer(out, &doc)
    }
}

/// The same, as a table for people.
pub fn snapshot_table(
    snapshots: &[&NodeSnapshot],
    problems: &[&Problem],
    input: &[InputProblem],
) -> String {
    let mut out = String::new();
    if let Some(first) = snapshots.first() {
        let labels = first
            .node
            .as_ref()
            .map(|n| {
                n.labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_else(|| "(no Node object for this node)".into());
        let _ = writeln!(out, "node {}  [{}]\n", first.node_name, labels);
    }
    let header = [
        "SERVICE PORT",
        "PROTO",
        "FAMILY",
        "ADDRESSES",
        "POLICY ext/int",
        "CLUSTER ENDPOINTS",
        "LOCAL ENDPOINTS",
    ];
    let mut rows: Vec<([String; 7], String)> = snapshots
        .iter()
        .flat_map(|snap| snap.service_ports.values().map(|v| table_row(snap, v)))
        .collect();
    rows.sort_by(|a, b| (&a.0[0], &a.0[1], &a.0[2]).cmp(&(&b.0[0], &b.0[1], &b.0[2])));
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for (r, _) in &rows {
        for (w, c) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[&str]| -> String {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                let _ = write!(s, "{c:<w$}  ");
            }
        }
        s.trim_end().to_string()
    };
    let _ = writeln!(out, "{}", line(&header));
    for (r, reason) in &rows {
        let cells: Vec<&str> = r.iter().map(String::as_str).collect();
        let _ = writeln!(out, "{}", line(&cells));
        let _ = writeln!(out, "    ↳ {reason}");
    }
    if rows.is_empty() {
        let _ = writeln!(out, "(no proxied service ports)");
    }
    if !problems.is_empty() || !input.is_empty() {
        let _ = writeln!(
            out,
            "\nproblems in the input ({}):",
            problems.len() + input.len()
        );
        for p in input {
            let _ = writeln!(out, "  {p}");
        }
        for p in problems {
            let _ = writeln!(out, "  {p}");
        }
    }
    out
}

/// One service port's row: its cells, and why its endpoints were chosen.
fn table_row(snap: &NodeSnapshot, v: &ServicePortView) -> ([String; 7], String) {
    let p = &v.port;
    let mut addrs: Vec<String> = p
        .cluster_ips
        .iter()
        .chain(p.external_ips.iter())
        .map(|ip| fmt_addr(*ip, p.port))
        .collect();
    addrs.extend(p.load_balancer_vips().map(|ip| fmt_addr(ip, p.port)));
    if let Some(np) = p.node_port {
        addrs.push(format!("nodePort {np}"));
    }
    let eps = |e: &Option<Arc<[Endpoint]>>| match e {
        None => "-".to_string(),
        Some(v) if v.is_empty() => "(none)".to_string(),
        Some(v) => v
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" "),
    };
    (
        [
            p.name.to_string(),
            p.name.protocol.to_string(),
            snap.family.to_string(),
            addrs.join(" "),
            format!(
                "{}/{}",
                p.external_traffic_policy.as_str(),
                p.internal_traffic_policy.as_str()
            ),
            eps(&v.selection.cluster_endpoints),
            eps(&v.selection.local_endpoints),
        ],
        v.selection.reason.to_string(),
    )
}

fn fmt_addr(ip: std::net::IpAddr, port: u16) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => format!("{v4}:{port}"),
        std::net::IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{test_port, IpFamily, Protocol};
    use crate::selection::Selection;

    fn view(ns: &str, name: &str, port: &str, protocol: Protocol) -> Arc<ServicePortView> {
        Arc::new(ServicePortView {
            port: Arc::new(test_port(ns, name, port, protocol, &["10.96.0.1"])),
            endpoints: Arc::from([]),
            selection: Selection {
                cluster_endpoints: Some(Arc::from([])),
                local_endpoints: None,
                has_any_endpoints: false,
                reason: "".into(),
            },
        })
    }

    #[test]
    fn service_ports_are_listed_by_printed_name_then_protocol_then_family() {
        // The map orders by namespace first ("a" < "a-b"); the printed names order
        // "a-b/x" before "a/x" ('-' < '/'). The JSON follows the printed names.
        let mut v4 = NodeSnapshot::empty("node-a", IpFamily::V4);
        let mut v6 = NodeSnapshot::empty("node-a", IpFamily::V6);
        for (ns, name, port, proto) in [
            ("a", "x", "", Protocol::Tcp),
            ("a-b", "x", "", Protocol::Tcp),
            ("a", "x", "dns", Protocol::Udp),
            ("a", "x", "dns", Protocol::Tcp),
            ("a", "xy", "", Protocol::Tcp),
        ] {
            let v = view(ns, name, port, proto);
            v4.service_ports.insert(v.port.name.clone(), v.clone());
            v6.service_ports.insert(v.port.name.clone(), v);
        }
        let doc = snapshot_json(&[&v4, &v6], &[], &[]);
        let got: Vec<String> = doc["servicePorts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| format!("{} {} {}", p["name"], p["protocol"], p["family"]).replace('"', ""))
            .collect();
        assert_eq!(
            got,
            [
                "a-b/x TCP IPv4",
                "a-b/x TCP IPv6",
                "a/x TCP IPv4",
                "a/x TCP IPv6",
                "a/x:dns TCP IPv4",
                "a/x:dns TCP IPv6",
                "a/x:dns UDP IPv4",
                "a/x:dns UDP IPv6",
                "a/xy TCP IPv4",
                "a/xy TCP IPv6",
            ]
        );
    }
}
