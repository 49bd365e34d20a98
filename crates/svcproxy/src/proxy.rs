//! Running the proxy: the state, the sync runner and the nftables data plane together.
//!
//! Entry points: [`run`] (the daemon, or one sync with `--once`), [`render`] and
//! [`cleanup`]. Sources hand updates to the runner over a channel; the runner owns the
//! state and the data plane, so no lock is ever needed.

use std::net::IpAddr;
use std::process::Command;

use anyhow::{bail, Context};
use svcproxy_core::objects::SourceUpdate;
use svcproxy_core::state::{ClusterState, SnapshotUpdate};
use svcproxy_dataplane::NftDataPlane;
use svcproxy_plan::{InterfaceName, LocalDetection, NodePortAddresses, PlanConfig};
use tokio::sync::mpsc;

use crate::config::{self, DetectLocal, ProxyMode, Settings};
use crate::runner::{self, Event, RunnerConfig, Syncer};

/// The planner's configuration from the resolved settings.
pub fn plan_config(settings: &Settings) -> anyhow::Result<PlanConfig> {
    let local_detection = match &settings.detect_local {
        DetectLocal::None => LocalDetection::None,
        DetectLocal::ClusterCidr(c) => LocalDetection::ClusterCidr(c.clone()),
        DetectLocal::NodeCidr => LocalDetection::NodeCidr(Vec::new()),
        DetectLocal::BridgeInterface(i) => LocalDetection::BridgeInterface(
            InterfaceName::parse(i).context("--pod-bridge-interface")?,
        ),
        DetectLocal::InterfaceNamePrefix(i) => LocalDetection::InterfaceNamePrefix(
            InterfaceName::parse(i).context("--pod-interface-name-prefix")?,
        ),
    };
    let nodeport_addresses = match &settings.nodeport_addresses {
        config::NodePortAddresses::Primary => NodePortAddresses::Primary,
        config::NodePortAddresses::All => NodePortAddresses::AllLocal,
        config::NodePortAddresses::Cidrs(cidrs) => {
            let ips: Vec<IpAddr> = local_ips()?
                .into_iter()
                .filter(|ip| cidrs.iter().any(|c| c.contains(ip)))
                .collect();
            if ips.is_empty() {
                tracing::warn!(?cidrs, "no local address is inside --nodeport-addresses: NodePorts are not reachable on this node");
            }
            NodePortAddresses::Ips(ips)
        }
    };
    let cfg = PlanConfig {
        masquerade_all: settings.masquerade_all,
        masquerade_bit: settings.masquerade_bit,
        local_detection,
        node_ips: if settings.bind_address.is_unspecified() {
            Vec::new()
        } else {
            vec![settings.bind_address]
        },
        nodeport_addresses,
        // As upstream nftables mode: NodePorts on 127.0.0.1 would need route_localnet,
        // which exposes localhost-bound services to the network (CVE-2020-8558).
        localhost_nodeports: settings.localhost_nodeports
            && settings.proxy_mode != ProxyMode::Nftables,
        ..PlanConfig::default()
    };
    cfg.validate()?;
    Ok(cfg)
}

/// This host's addresses, from `ip -j addr` (iproute2).
fn local_ips() -> anyhow::Result<Vec<IpAddr>> {
    let out = Command::new("ip")
        .args(["-j", "addr", "show"])
        .output()
        .context("running `ip -j addr show` to resolve --nodeport-addresses")?;
    if !out.status.success() {
        bail!(
            "`ip -j addr show` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let links: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let mut ips = Vec::new();
    for link in links.as_array().into_iter().flatten() {
        for a in link["addr_info"].as_array().into_iter().flatten() {
            if let Some(ip) = a["local"].as_str().and_then(|s| s.parse().ok()) {
                ips.push(ip);
            }
        }
    }
    Ok(ips)
}

struct ProxySyncer {
    state: ClusterState,
    dataplane: NftDataPlane,
}

impl Syncer for ProxySyncer {
    fn apply(&mut self, updates: Vec<SourceUpdate>) {
        for u in updates {
            self.state.apply(u);
        }
    }

    fn sync(&mut self, full: bool) -> anyhow::Result<()> {
        // The snapshot is always complete; `changed` only lets the planner skip work.
        // After a failed apply the data plane re-plans everything regardless.
        let update = self.state.snapshot();
        let report = self.dataplane.sync(&update, full)?;
        tracing::info!(
            kind = ?report.kind,
            duration_ms = report.duration.as_secs_f64() * 1000.0,
            script_bytes = report.script_bytes,
            changed = update.changed.len(),
            "synced"
        );
        Ok(())
    }
}

fn check_mode(settings: &Settings) -> anyhow::Result<()> {
    if settings.proxy_mode != ProxyMode::Nftables {
        bail!(
            "--proxy-mode {} is not implemented yet; use nftables",
            settings.proxy_mode.as_str()
        );
    }
    Ok(())
}

/// Runs the proxy until SIGTERM/SIGINT (rules stay in place for a successor), or
/// syncs once with `--once`.
pub fn run(settings: Settings) -> anyhow::Result<()> {
    check_mode(&settings)?;
    let plan_cfg = plan_config(&settings)?;
    // Every source's initial list is applied before the first sync.
    let (state, manifests) = crate::initial_state(&settings)?;
    svcproxy_dataplane::prepare_node(&plan_cfg);
    let dataplane = NftDataPlane::new(plan_cfg);
    let mut syncer = ProxySyncer { state, dataplane };
    let runner_cfg = RunnerConfig::new(settings.min_sync_period, settings.sync_period);
    let (tx, rx) = mpsc::channel::<Event>(64);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let _watch = match (manifests, settings.once) {
            (Some(dir), false) => {
                let tx = tx.clone();
                Some(crate::sources::manifests::watch(dir, move |updates| {
                    // Blocking send from the watcher thread: backpressure, never loss.
                    let _ = tx.blocking_send(Event::Updates(updates));
                })?)
            }
            _ => None,
        };
        tracing::info!(node = %settings.node_name, "svcproxy started");
        let run = runner::run(runner_cfg, &mut syncer, rx, settings.once);
        tokio::select! {
            r = run => r,
            _ = shutdown_signal() => {
                tracing::info!("shutting down; the rules stay in place");
                Ok(())
            }
        }
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The full ruleset a first sync would apply.
pub fn render(settings: &Settings, update: &SnapshotUpdate) -> anyhow::Result<String> {
    check_mode(settings)?;
    let dp = NftDataPlane::new(plan_config(settings)?);
    Ok(dp.render(update))
}

/// Removes svcproxy's nftables tables (and nothing else).
pub fn cleanup() -> anyhow::Result<()> {
    svcproxy_dataplane::cleanup("nft").context("removing svcproxy's nftables tables")?;
    tracing::info!("removed svcproxy's nftables tables");
    Ok(())
}
