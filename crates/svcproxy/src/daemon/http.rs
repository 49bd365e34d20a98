//! The health and metrics servers: their listeners, bound at start-up or retried
//! ([`Listener`], [`bind_http`]), and their tasks ([`spawn_http`]).

use super::*;

/// A fixed-address HTTP server's listener: bound at start-up, or (without
/// `bindAddressHardFail`, as upstream) bound later by a retry every 5 seconds after a
/// failure that is logged, or bound once this process owns the node (a warm
/// standby's metrics server: the owner's holds the port meanwhile).
pub(super) enum Listener {
    Bound(tokio::net::TcpListener),
    Retrying(SocketAddr, &'static str, bool),
    WhenOwner(SocketAddr, &'static str, watch::Receiver<Role>),
}

pub(super) async fn listener(
    addr: SocketAddr,
    what: &'static str,
    hard_fail: bool,
    shared: bool,
) -> anyhow::Result<Listener> {
    match svcproxy_http::bind(addr, what, shared).await {
        Ok(l) => Ok(Listener::Bound(l)),
        Err(e) if hard_fail => Err(e.context("bindAddressHardFail is set")),
        Err(e) => {
            tracing::error!(
                "{e:#}; retrying every 5s (set --bind-address-hard-fail to exit instead)"
            );
            Ok(Listener::Retrying(addr, what, shared))
        }
    }
}

impl Listener {
    async fn get(self) -> tokio::net::TcpListener {
        let (addr, what, shared) = match self {
            Listener::Bound(l) => return l,
            Listener::Retrying(addr, what, shared) => (addr, what, shared),
            Listener::WhenOwner(addr, what, mut role) => {
                // Closed: the process is stopping; the caller's stop wins the race.
                if role.wait_for(Role::is_owner).await.is_err() {
                    std::future::pending::<()>().await;
                }
                match svcproxy_http::bind(addr, what, false).await {
                    Ok(l) => return l,
                    // The old owner may hold it for a moment longer.
                    Err(e) => tracing::debug!("{e:#}; retrying every 5s"),
                }
                (addr, what, false)
            }
        };
        let mut attempts = 1u32;
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            attempts += 1;
            match svcproxy_http::bind(addr, what, shared).await {
                Ok(l) => {
                    tracing::info!(%addr, attempts, "{what}: listening now");
                    return l;
                }
                Err(e) => tracing::debug!(attempts, "{e:#}"),
            }
        }
    }
}
/// Binds the health and metrics listeners first: with bindAddressHardFail an
/// address in use is a start-up error, before anything else runs; otherwise it is
/// logged and retried. /healthz and /livez are shared with a standby (or an owner)
/// on the same node; the metrics of a standby wait until it owns the node.
pub(super) async fn bind_http(
    settings: &Settings,
    servers: &Servers,
    role: Option<&watch::Receiver<Role>>,
) -> anyhow::Result<(Option<Listener>, Option<Listener>)> {
    let hard_fail = settings.bind_address_hard_fail;
    let healthz = match servers.healthz {
        Some(addr) => Some(listener(addr, "--healthz-bind-address", hard_fail, true).await?),
        None => None,
    };
    let standby = role.filter(|r| !r.borrow().is_owner());
    let metrics = match (servers.metrics, standby) {
        (Some(addr), Some(role)) => Some(Listener::WhenOwner(
            addr,
            "--metrics-bind-address",
            role.clone(),
        )),
        (Some(addr), None) => {
            Some(listener(addr, "--metrics-bind-address", hard_fail, false).await?)
        }
        (None, _) => None,
    };
    Ok((healthz, metrics))
}

/// The health and metrics servers, each on its own task until `stop`.
pub(super) fn spawn_http(
    healthz: Option<Listener>,
    metrics_listener: Option<Listener>,
    health: &Arc<ProxyHealth>,
    metrics: &Arc<Metrics>,
    stop: &watch::Receiver<bool>,
) -> Vec<ServerTask> {
    let mut tasks = Vec::new();
    if let Some(l) = healthz {
        let (health, metrics, stop) = (health.clone(), metrics.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let l = tokio::select! {
                l = l.get() => l,
                _ = stopped(stop.clone()) => return Ok(()),
            };
            svcproxy_http::health::serve(l, health, Some(metrics), stopped(stop)).await
        }));
    }
    if let Some(l) = metrics_listener {
        let (metrics, stop) = (metrics.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let l = tokio::select! {
                l = l.get() => l,
                _ = stopped(stop.clone()) => return Ok(()),
            };
            svcproxy_http::metrics::serve(l, metrics, stopped(stop)).await
        }));
    }
    tasks
}
