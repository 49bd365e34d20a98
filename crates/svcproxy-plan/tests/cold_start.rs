//! A cold start written in steps (`Planner::set_cold_start`): for every golden
//! scenario, with the cluster DNS and API server Services added, the steps carry
//! exactly the statements of the one-transaction recreate; the first step holds
//! the skeleton and the Services needed first, linked; no step links a chain a
//! later step writes; a Service's links of a family are all in one step (each
//! family's table is its own transaction anyway); and the budgets cut
//! the rest into many steps.
//!
//! The same steps into the kernel: `svcproxy-dataplane`'s
//! `full_syncs_over_netlink_leave_the_tables_nft_leaves`.

mod common;

use std::collections::BTreeSet;

use common::*;
use svcproxy_plan::intent::FrontendKey;
use svcproxy_plan::nft::elements::{Atom, ElemValue, ElemVerdict};
use svcproxy_plan::nft::typed::{Action, Op};
use svcproxy_plan::nft::{ColdStart, PlanKind, Planner, Step};

/// The API server's and the cluster DNS's Services, named as a cluster names them.
const NEEDED_FIRST: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: kubernetes, namespace: default}
spec:
  clusterIP: 198.19.0.1
  ports:
  - {name: https, port: 443, targetPort: 6443}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels: {kubernetes.io/service-name: kubernetes}
addressType: IPv4
ports:
- {name: https, port: 6443}
endpoints:
- {addresses: [198.18.0.1], nodeName: node-a}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system}
spec:
  clusterIP: 198.19.0.254
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-1
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns}
addressType: IPv4
ports:
- {name: dns, port: 53, protocol: UDP}
- {name: dns-tcp, port: 53, protocol: TCP}
endpoints:
- {addresses: [198.18.1.53], nodeName: node-a}
- {addresses: [198.18.2.53], nodeName: node-b}
"#;

/// The steps of a recreate plan of `intent`, each a list of statements.
fn steps(intent: &svcproxy_plan::Intent, cold: Option<ColdStart>) -> Vec<Vec<Op>> {
    let mut planner = Planner::new();
    planner.set_output(svcproxy_plan::nft::Output::Typed);
    planner.set_cold_start(cold);
    let mut steps = vec![Vec::new()];
    let plan =
        planner.plan_steps_into(intent, &intent.delta_from_empty(), true, &mut |s| match s {
            Step::Op(op) => steps.last_mut().unwrap().push(op),
            Step::Commit => steps.push(Vec::new()),
        });
    assert_eq!(plan.kind, PlanKind::Recreate);
    assert!(plan.all_typed);
    steps.retain(|s| !s.is_empty());
    steps
}

/// The chain a statement links to (a verdict element's or a rule's goto or
/// jump), if any.
fn links_to(op: &Op) -> Option<&str> {
    match op {
        Op::Element(e) => match &e.value {
            Some(ElemValue::Verdict(ElemVerdict::Goto(chain))) => Some(chain),
            _ => None,
        },
        Op::AddRule { rule, .. } => match &rule.action {
            Action::Goto(c) | Action::Jump(c) => Some(c),
            _ => None,
        },
        _ => None,
    }
}

fn sorted(ops: impl IntoIterator<Item = Op>) -> Vec<String> {
    let mut v: Vec<String> = ops.into_iter().map(|op| format!("{op:?}")).collect();
    v.sort();
    v
}

#[test]
fn a_cold_start_in_steps_writes_the_whole_table_each_step_whole() {
    let tiny = ColdStart {
        objects_per_commit: 1,
        links_per_commit: 1,
    };
    for case in cases() {
        let mut sc = Scenario::load(&case);
        sc.upsert_yaml(NEEDED_FIRST);
        let intent = sc.intent();
        let whole = steps(&intent, None);
        assert_eq!(
            whole.len(),
            1,
            "{case}: one transaction without a cold start"
        );
        let small = ColdStart {
            objects_per_commit: 32,
            links_per_commit: 32,
        };
        for cold in [tiny, small, ColdStart::default()] {
            let staged = steps(&intent, Some(cold));
            let what = format!("{case} {cold:?}");
            assert_eq!(
                sorted(staged.iter().flatten().cloned()),
                sorted(whole[0].iter().cloned()),
                "{what}: the same statements"
            );
            // Chains written so far; links so far must name one of them.
            let mut chains = BTreeSet::new();
            for (i, step) in staged.iter().enumerate() {
                for op in step {
                    if let Op::AddChain { family, name, .. } = op {
                        chains.insert((*family, name.clone()));
                    }
                }
                for op in step {
                    if let Some(target) = links_to(op) {
                        assert!(
                            chains.contains(&(op.family(), target.to_string())),
                            "{what}: step {i} links {target} before it is written"
                        );
                    }
                }
            }
            // No other Service is linked before every service port's rules and
            // endpoint elements are in (a linked Service's endpoints are there).
            let first_link = staged.iter().position(|step| {
                step.iter().any(|op| {
                    linked_service(&intent, &whole[0], op).is_some_and(|service| {
                        !["default/kubernetes", "kube-system/kube-dns"].contains(&service.as_str())
                    })
                })
            });
            if let Some(l) = first_link {
                for (i, step) in staged.iter().enumerate().skip(l + 1) {
                    for op in step {
                        let late = match op {
                            Op::AddRule { .. } => true,
                            Op::Element(e) => {
                                e.set.starts_with("endpoint-dnat")
                                    || e.set.starts_with("clusterip-dnat")
                            }
                            _ => false,
                        };
                        assert!(
                            !late || op.family() != staged[l][0].family(),
                            "{what}: step {i} writes {op:?} after step {l} linked a Service"
                        );
                    }
                }
            }
            // The first step of IPv4: the Services needed first, linked.
            for needle in ["default/kubernetes", "kube-system/kube-dns"] {
                assert!(
                    staged[0]
                        .iter()
                        .any(|op| linked_service(&intent, &whole[0], op).as_deref() == Some(needle)),
                    "{what}: {needle} linked in the first step"
                );
            }
            // Every other Service's links in one step.
            let mut service_step = std::collections::BTreeMap::new();
            for (i, step) in staged.iter().enumerate() {
                for op in step {
                    if let Some(service) = linked_service(&intent, &whole[0], op) {
                        let key = (op.family(), service.clone());
                        let at = service_step.entry(key).or_insert(i);
                        assert_eq!(*at, i, "{what}: {service} linked in two steps");
                    }
                }
            }
            // Bounded: a step past a family's first (the skeleton) holds at most
            // its budget and what one service port or Service adds past it.
            for (i, step) in staged.iter().enumerate() {
                let skeleton = step.iter().any(|op| matches!(op, Op::AddTable { .. }));
                let budget = cold.objects_per_commit.max(cold.links_per_commit);
                assert!(
                    skeleton || step.len() <= budget + 48,
                    "{what}: step {i} holds {} statements",
                    step.len()
                );
            }
            if cold == tiny {
                assert!(
                    staged.len() > service_step.len(),
                    "{what}: {} steps for {} Services",
                    staged.len(),
                    service_step.len()
                );
            }
        }
    }
}

/// The Service (`namespace/name`) a statement links, if it links one: the owner
/// of a `service-ips` element's chain, or of a cluster IP port put in a
/// `clusterip-PROTO-N` set (a port served without a chain of its own).
fn linked_service(intent: &svcproxy_plan::Intent, whole: &[Op], op: &Op) -> Option<String> {
    let Op::Element(e) = op else {
        return None;
    };
    if !e.add {
        return None;
    }
    if e.set == "service-ips" {
        return match &e.value {
            Some(ElemValue::Verdict(ElemVerdict::Goto(chain))) => Some(chain_service(whole, chain)),
            _ => None,
        };
    }
    let counted = e
        .set
        .strip_prefix("clusterip-")
        .and_then(|rest| rest.split_once('-'))
        .is_some_and(|(proto, n)| {
            ["tcp", "udp", "sctp"].contains(&proto) && n.parse::<u32>().is_ok()
        });
    if !counted {
        return None;
    }
    let [Atom::Ip(ip), Atom::Proto(protocol), Atom::Port(port)] = e.key[..] else {
        panic!("a cluster IP port's key: {e:?}");
    };
    let key = FrontendKey::Vip { ip, protocol, port };
    let (owner, _) = intent.family(e.family).frontend(&key)?;
    Some(owner.name.service.to_string())
}

/// The Service (`namespace/name`) whose chain `chain` is, from the chain's
/// comment (`namespace/name:port/protocol`).
fn chain_service(ops: &[Op], chain: &str) -> String {
    ops.iter()
        .find_map(|op| match op {
            Op::AddChain { name, comment, .. } if name == chain => comment.clone(),
            _ => None,
        })
        .and_then(|c| c.split(':').next().map(str::to_string))
        .unwrap_or_else(|| panic!("chain {chain} has a comment"))
}
