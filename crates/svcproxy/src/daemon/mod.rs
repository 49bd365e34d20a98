//! Running the proxy: a source, the state, the sync loop ([`crate::runner`]), a
//! sync target ([`svcproxy_sync::Target`]), and the HTTP servers around them.
//!
//! Entry points: [`run`] (the daemon, `--once`, and the `snapshot`/`render`/`explain`
//! tools, which share everything but the target), and [`cleanup`].
//! The data plane comes from the registry (`Settings::proxy_mode`); nothing here
//! knows which modes exist. Sources hand
//! updates to the runner over a channel; the runner owns the state and the target, so
//! no lock is needed around them. Health and metrics are shared with the HTTP servers.
//!
//! Here: the run's target chosen ([`run`]), the kernel's preparation, and
//! cleanup. Beside it: [`serve`] (one run from start to stop), [`syncer`] (what
//! each sync does), [`sources`] (the state's input) and [`http`] (the health and
//! metrics servers).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use svcproxy_core::model::IpFamily;
use svcproxy_core::objects::SourceUpdate;
use svcproxy_core::snapshot::SnapshotTallies;
use svcproxy_core::state::{ClusterState, SnapshotUpdate, StateConfig};
use svcproxy_dataplane::Backend;
use svcproxy_plan::intent::{nodeport_destinations, NodePortDestinations};
use svcproxy_plan::{NodePortAddresses, PlanConfig};
use svcproxy_sync::print::{ExplainPrinter, RenderPrinter, SnapshotPrinter};
use svcproxy_sync::Driver;
use tokio::sync::{mpsc, watch};

use crate::config::{self, Settings};
use crate::owner::{HandOver, Ownership, Role};
use crate::runner::{self, Event, RunnerConfig, Syncer};
use svcproxy_http::health::ProxyHealth;
use svcproxy_http::metrics::Metrics;
use svcproxy_http::service_health::{Listen, ServiceHealthServers};
use svcproxy_sources::kube::{self as kube_source, KubeSourceConfig};
use svcproxy_sources::manifests::ManifestDir;
use svcproxy_sync::{Checked, DnsOnly, SyncDone, Target};

mod http;
mod serve;
mod sources;
mod syncer;

use http::*;
use serve::*;
use sources::*;
use syncer::*;

/// What each sync does with the snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Program this node's nftables (the proxy).
    Kernel,
    /// Print the snapshot (`svcproxy snapshot`); with `watch`, again after every sync
    /// that changed it.
    Snapshot { json: bool, watch: bool },
    /// Print the full nftables script a first sync would apply (`svcproxy render`).
    Render,
    /// Follow one connection through the rules a first sync would apply
    /// (`svcproxy explain`).
    Explain {
        packet: svcproxy_plan::explain::Packet,
        json: bool,
        /// Also compare the kernel's rules (this network namespace's) with the plan.
        live: bool,
    },
    /// Serve the cluster DNS only (`svcproxy dns`), on `--dns-bind-address`.
    Dns,
}

/// Which HTTP servers to run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Servers {
    pub healthz: Option<SocketAddr>,
    pub metrics: Option<SocketAddr>,
    /// healthCheckNodePort servers (only when programming the kernel).
    pub health_check_node_ports: bool,
}

/// How a run ended well.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finished {
    Clean,
    /// A one-shot tool (`snapshot`, `render`, `explain`) ran, and its input had
    /// errors: objects or fields rejected or ignored, or input it could not read.
    InputErrors,
}

/// Runs until SIGTERM/SIGINT (rules stay in place for a successor), or syncs once
/// (`--once`, and the one-shot tools); says whether a one-shot tool's input had
/// errors.
pub fn run(settings: Settings, output: Output, servers: Servers) -> anyhow::Result<Finished> {
    let errors = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let one_shot = matches!(
        output,
        Output::Snapshot { watch: false, .. } | Output::Explain { .. } | Output::Render
    );
    run_target(settings, output, servers, errors.clone())?;
    Ok(
        if one_shot && errors.load(std::sync::atomic::Ordering::Relaxed) {
            Finished::InputErrors
        } else {
            Finished::Clean
        },
    )
}

fn run_target(
    settings: Settings,
    output: Output,
    servers: Servers,
    input_errors: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match output {
        Output::Kernel => run_kernel(&rt, settings, servers),
        Output::Snapshot { json, watch } => {
            let target = Checked {
                inner: SnapshotPrinter {
                    json,
                    compact: watch,
                    last: None,
                },
                input_errors: input_errors.clone(),
            };
            rt.block_on(serve(Serving::printer(settings, servers, target, !watch)))
        }
        Output::Explain { packet, json, live } => {
            let backend = settings.proxy_mode;
            let cfg = settings.plan.clone();
            let live = live.then(|| (backend.new)(&cfg, &settings.mode_options));
            let target = Checked {
                inner: ExplainPrinter {
                    cfg: cfg.clone(),
                    packet,
                    json,
                    live,
                },
                input_errors: input_errors.clone(),
            };
            rt.block_on(serve(Serving {
                plan: Some(cfg),
                ..Serving::printer(settings, servers, target, true)
            }))
        }
        Output::Dns => rt.block_on(serve(Serving::printer(settings, servers, DnsOnly, false))),
        Output::Render => {
            let backend = settings.proxy_mode;
            let plan_cfg = settings.plan.clone();
            let plane = (backend.new)(&plan_cfg, &settings.mode_options);
            let target = Checked {
                inner: RenderPrinter {
                    cfg: plan_cfg.clone(),
                    plane,
                },
                input_errors: input_errors.clone(),
            };
            rt.block_on(serve(Serving {
                plan: Some(plan_cfg),
                backend: Some(backend),
                ..Serving::printer(settings, servers, target, true)
            }))
        }
    }
}

/// The kernel's data plane: the mode's preflight and node preparation, then the
/// daemon (or, with `--init-only`, the preparation alone).
fn run_kernel(
    rt: &tokio::runtime::Runtime,
    settings: Settings,
    servers: Servers,
) -> anyhow::Result<()> {
    set_oom_score_adj(settings.oom_score_adj);
    // A look at the node for kube-proxy's rules (a dozen iptables-save
    // runs, about 0.1 s): beside the start rather than before it.
    let _leftovers = (!settings.init_only && settings.service_proxy_name.is_none())
        .then(|| JoinOnDrop(Some(std::thread::spawn(warn_about_kube_proxy_leftovers))));
    let backend = settings.proxy_mode;
    let plan_cfg = settings.plan.clone();
    let mut plane = Driver::new(
        plan_cfg.clone(),
        (backend.new)(&plan_cfg, &settings.mode_options),
    )
    .with_large_cluster(backend.large_cluster_endpoints);
    if !settings.init_only {
        // A node that cannot run the mode at all: refused now, naming why,
        // rather than a sync retried for ever.
        plane
            .preflight()
            .with_context(|| format!("the {} mode cannot run on this node", backend.mode))?;
    }
    let needs = plane.node_requirements();
    if settings.init_only {
        prepare_only(&settings, &needs, backend);
        return Ok(());
    }
    for module in &needs.modules {
        if !std::path::Path::new("/sys/module").join(module).exists() {
            tracing::warn!(
                module,
                mode = backend.mode,
                "a kernel module this mode needs is not loaded"
            );
        }
    }
    let target = plane.with_conntrack_sysctls(settings.conntrack.clone());
    rt.block_on(serve(Serving {
        once: settings.once,
        plan: Some(plan_cfg),
        backend: Some(backend),
        claim: Some(backend.mode),
        ..Serving::printer(settings, servers, target, false)
    }))
}

/// kube-proxy's `--init-only`: what needs full privileges (the mode's sysctls, the
/// conntrack ones), then exit; the proxy itself then runs with NET_ADMIN only (no
/// rule is written here).
fn prepare_only(
    settings: &Settings,
    needs: &svcproxy_dataplane::NodeRequirements,
    backend: &'static Backend,
) {
    let prepared = svcproxy_dataplane::prepare_node(&needs.sysctls);
    let conntrack = svcproxy_dataplane::apply_conntrack_sysctls(&settings.conntrack.clone());
    let warnings: Vec<_> = prepared
        .warnings
        .iter()
        .chain(&conntrack.warnings)
        .collect();
    tracing::info!(
        changed = ?prepared.changed.iter().chain(&conntrack.changed).collect::<Vec<_>>(),
        warnings = warnings.len(),
        mode = backend.mode,
        "--init-only: node prepared; exiting"
    );
}

/// Writes the process's OOM score adjustment (kube-proxy's `oomScoreAdj`): a failure
/// (no CAP_SYS_RESOURCE for a negative value, no procfs) is logged, never fatal, as
/// upstream.
fn set_oom_score_adj(value: i32) {
    let path = "/proc/self/oom_score_adj";
    match std::fs::read_to_string(path) {
        Ok(current) if current.trim() == value.to_string() => {}
        _ => match std::fs::write(path, value.to_string()) {
            Ok(()) => tracing::debug!(value, "OOM score adjustment set"),
            // As upstream (at its verbosity 2): lowering it needs CAP_SYS_RESOURCE,
            // which a container without privileges lacks.
            Err(e) => tracing::info!(value, error = %e, "cannot set the OOM score adjustment"),
        },
    }
}

/// `svcproxy cleanup --kube-proxy`: removes kube-proxy's leftovers from this node, as
/// `kube-proxy --cleanup` does, unless kube-proxy still runs (it would put them back
/// at its next sync, and both would answer for the same Services).
pub fn cleanup_kube_proxy() -> anyhow::Result<()> {
    use svcproxy_dataplane::kernel::kube_proxy;
    if let Some(pid) = kube_proxy::kube_proxy_running() {
        bail!(
            "kube-proxy is running (PID {pid}): stop it first (scale its DaemonSet off \
             this node or delete it), or it re-creates its rules at its next sync"
        );
    }
    let done = kube_proxy::cleanup_kube_proxy(&[]);
    for (place, chains) in &done.iptables {
        tracing::info!(%place, chains = chains.len(), "removed kube-proxy's iptables chains");
    }
    for (place, chains) in &done.kept {
        tracing::warn!(%place, ?chains, "kept kube-proxy chains that another chain still jumps to");
    }
    for table in &done.nft_tables {
        tracing::info!(table = %table, "removed kube-proxy's nftables table");
    }
    if done.ipvs {
        tracing::info!("removed kube-proxy's IPVS state (kube-ipvs0)");
    }
    for w in &done.warnings {
        tracing::warn!("{w}");
    }
    if done.is_empty() && done.kept.is_empty() {
        tracing::info!("no kube-proxy leftovers found");
    }
    match done.errors.as_slice() {
        [] => Ok(()),
        errors => {
            for e in errors {
                tracing::error!("{e}");
            }
            bail!(
                "{} part(s) of kube-proxy's leftovers could not be removed",
                errors.len()
            )
        }
    }
}

/// A thread waited for when it goes out of scope, whichever way: the look for
/// kube-proxy's leftovers, whose warning belongs in the log of a short run (or a
/// failed start) too.
struct JoinOnDrop(Option<std::thread::JoinHandle<()>>);

impl Drop for JoinOnDrop {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            let _ = handle.join();
        }
    }
}

/// At start (no `--service-proxy-name`): kube-proxy's rules still in the kernel would
/// answer for the same Services as svcproxy's (stale once kube-proxy is stopped), so
/// say so and how to remove them.
fn warn_about_kube_proxy_leftovers() {
    let found = svcproxy_dataplane::kernel::kube_proxy::find_leftovers(&[]);
    if found.is_empty() {
        return;
    }
    let running = svcproxy_dataplane::kernel::kube_proxy::kube_proxy_running();
    tracing::warn!(
        iptables = ?found.iptables.keys().collect::<Vec<_>>(),
        nftables = ?found.nft_tables,
        ipvs = found.ipvs,
        kube_proxy_pid = ?running,
        "kube-proxy's rules are installed on this node: they answer for the same Services \
         (stale once kube-proxy is stopped); stop kube-proxy and run `svcproxy cleanup \
         --kube-proxy`, or run beside it with --service-proxy-name"
    );
}

/// Removes what every svcproxy mode created (each mode's own objects, and only
/// those, where `options` say they are: the ebpf mode's pin directory). Every mode
/// is tried; the first failure is returned.
pub fn cleanup(options: &svcproxy_dataplane::ModeOptions) -> anyhow::Result<()> {
    let failures = svcproxy_dataplane::cleanup_all(&PlanConfig::default(), options);
    for b in svcproxy_dataplane::BACKENDS {
        match failures.iter().find(|(mode, _)| *mode == b.mode) {
            Some((mode, e)) => tracing::error!(mode, error = %e, "cleanup failed"),
            None => tracing::info!(mode = b.mode, "removed svcproxy's objects"),
        }
    }
    match failures.into_iter().next() {
        Some((mode, e)) => Err(e).with_context(|| format!("removing svcproxy's {mode} objects")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// A syncer whose syncs after the first block until released (a hung apply), as
    /// the runner runs them: on its own task, taking events only between syncs.
    struct Hanging {
        health: Arc<ProxyHealth>,
        release: Arc<AtomicBool>,
        syncs: u32,
        received: u64,
    }

    impl Syncer for Hanging {
        fn apply(&mut self, _updates: Vec<SourceUpdate>) {
            self.received += 1;
        }

        fn sync(&mut self, _full: bool) -> anyhow::Result<()> {
            self.syncs += 1;
            if self.syncs > 1 {
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                while !self.release.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            self.health.updated_through(self.received);
            Ok(())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_update_waiting_behind_a_hung_sync_makes_the_proxy_unhealthy() {
        let timeout = Duration::from_millis(300);
        let health = ProxyHealth::new(timeout);
        let (tx, rx) = event_channel(health.clone(), Metrics::new());
        let release = Arc::new(AtomicBool::new(false));
        let mut syncer = Hanging {
            health: health.clone(),
            release: release.clone(),
            syncs: 0,
            received: 0,
        };
        // The first sync at once; the periodic one 100 ms later hangs.
        let cfg = RunnerConfig::new(Duration::ZERO, Duration::from_millis(100));
        let runner = tokio::spawn(async move {
            let _ = runner::run(cfg, &mut syncer, rx, false).await;
        });
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(health.status().healthy, "nothing is waiting yet");
        // An update arrives while the periodic sync hangs: nothing takes it from the
        // runner's channel, yet it counts from now.
        tx.send(runner::tests::update()).await.unwrap();
        tokio::time::sleep(timeout + Duration::from_millis(200)).await;
        assert!(
            !health.status().healthy,
            "an update has waited past the timeout behind a hung sync"
        );
        // The sync finishes; the next one takes the update and health comes back.
        release.store(true, Ordering::SeqCst);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !health.status().healthy && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(health.status().healthy);
        drop(tx);
        runner.abort();
    }
}
