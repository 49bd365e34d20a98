//! The sync runner: turns a stream of source updates into bounded-frequency syncs.
//!
//! Entry point: [`run`]. Bursts of updates are coalesced so that syncs happen at most
//! once per `min_sync_period`; a sync happens at least once per `sync_period`, and it
//! is partial (only what changed, often nothing) unless [`FULL_SYNC_PERIOD`] has
//! passed since the last full one, as upstream (rewriting every rule each
//! `sync_period` costs seconds at 10k services and disturbs traffic; drift is caught
//! by the cheap check instead), and not at all in a large cluster where the mode
//! follows upstream's large cluster mode ([`Syncer::skips_periodic_full_sync`]);
//! a failed sync is retried with exponential backoff
//! (and the retry is a full sync, since the kernel state is then unknown) while the
//! last good rules stay in force.
//! While a source re-lists ([`Event::Relisting`] to [`Event::Ready`]) syncs wait, so
//! the kernel never sees a half-old, half-new picture (bounded by `relist_hold`).
//! Time comes from tokio's clock, so tests run it with paused time.

use std::time::Duration;

use svcproxy_core::objects::SourceUpdate;
use tokio::sync::mpsc;
use tokio::time::Instant;

#[derive(Clone, Debug)]
pub struct RunnerConfig {
    pub min_sync_period: Duration,
    pub sync_period: Duration,
    /// First retry delay after a failed sync; doubles per failure up to `retry_max`.
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// Sources whose initial list must be complete ([`Event::Ready`]) before the first
    /// sync: programming from a partial picture would black-hole live traffic.
    pub initial_sources: Vec<&'static str>,
    /// The longest syncs wait for a re-list to complete: past it, updates are synced
    /// anyway (a server that keeps failing mid-list must not freeze the rules).
    pub relist_hold: Duration,
    /// How often [`Syncer::check_drift`] asks whether the kernel still holds the
    /// rules; a drift found is repaired by a full sync at once.
    pub drift_check_period: Duration,
    /// The longest time between two full syncs (upstream's `FullSyncPeriod`).
    pub full_sync_period: Duration,
}

/// Upstream kube-proxy's `FullSyncPeriod`: a sync after this long since the last
/// full one rewrites everything, repairing what the drift check cannot see (a rule
/// changed by hand inside svcproxy's own table).
pub const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

/// The longest time between two drift checks: a table deleted or flushed by hand is
/// noticed within this (or the sync period, if shorter) and repaired at once.
pub const DRIFT_CHECK_PERIOD: Duration = Duration::from_secs(5);

impl RunnerConfig {
    pub fn new(min_sync_period: Duration, sync_period: Duration) -> Self {
        RunnerConfig {
            min_sync_period,
            sync_period,
            retry_min: Duration::from_secs(1),
            retry_max: sync_period.max(Duration::from_secs(1)),
            initial_sources: Vec::new(),
            relist_hold: Duration::from_secs(30),
            drift_check_period: sync_period
                .min(DRIFT_CHECK_PERIOD)
                .max(Duration::from_millis(100)),
            full_sync_period: FULL_SYNC_PERIOD,
        }
    }

    fn backoff(&self, failures: u32) -> Duration {
        let factor = 1u32
            .checked_shl(failures.saturating_sub(1).min(20))
            .unwrap_or(u32::MAX);
        self.retry_min.saturating_mul(factor).min(self.retry_max)
    }
}

/// What the runner drives: a state that takes updates and a data plane that syncs.
pub trait Syncer {
    /// Records updates from a source; called as they arrive, between syncs.
    fn apply(&mut self, updates: Vec<SourceUpdate>);
    /// Programs the data plane from the current state. `full` asks for a complete
    /// rewrite rather than a partial one.
    fn sync(&mut self, full: bool) -> anyhow::Result<()>;
    /// Called when updates are queued but not yet synced (for health and metrics).
    fn queued(&mut self) {}
    /// Whether the kernel lost what the last sync wrote (tables deleted or flushed
    /// behind svcproxy's back): if so, a full sync follows at once.
    fn check_drift(&mut self) -> bool {
        false
    }
    /// Whether this process has synced as the node's owner already: a take-over
    /// announced after that sync (the owner handed over while this process was
    /// still listing) asks for nothing more.
    fn synced_as_owner(&self) -> bool {
        false
    }
    /// Whether the periodic full sync is skipped now (upstream's large cluster
    /// mode): asked only when one is due by time.
    fn skips_periodic_full_sync(&self) -> bool {
        false
    }
}

pub use svcproxy_sources::Event;

/// Runs until `events` closes (every source is gone) or, with `once`, after the first
/// sync. Returns the result of the last sync attempt. The first sync waits until every
/// source in `cfg.initial_sources` is [`Event::Ready`]; sources not listed there must
/// have been applied before calling.
pub async fn run<S: Syncer>(
    mut cfg: RunnerConfig,
    syncer: &mut S,
    mut events: mpsc::Receiver<Event>,
    once: bool,
) -> anyhow::Result<()> {
    let mut schedule = Schedule::new();
    let mut events_open = true;
    let mut next_check = Instant::now() + cfg.drift_check_period;
    let waiting = std::mem::take(&mut cfg.initial_sources);
    initial_lists(waiting, &mut events, syncer, &mut schedule).await?;
    loop {
        let now = Instant::now();
        let due = schedule.due(now, &cfg);
        if now >= next_check {
            next_check = now + cfg.drift_check_period;
            if blocking(|| syncer.check_drift()) {
                schedule.repair();
            }
            continue;
        }
        if due <= now {
            let full = schedule.full(now, &cfg, syncer);
            match blocking(|| syncer.sync(full)) {
                Ok(()) => {
                    schedule.synced(now, full);
                    if once {
                        return Ok(());
                    }
                }
                Err(err) => {
                    if once {
                        // The caller reports it (once), with what to do about it.
                        return Err(err.context("sync failed; the previous rules stay in force"));
                    }
                    let delay = schedule.failed(now, &cfg);
                    let failures = schedule.failures;
                    tracing::error!(error = %format!("{err:#}"), failures, retry_in = ?delay, "sync failed; the previous rules stay in force");
                }
            }
            continue;
        }
        let wake = due.min(next_check);
        if !events_open {
            tokio::time::sleep_until(wake).await;
            continue;
        }
        tokio::select! {
            ev = events.recv() => match ev {
                Some(ev) => schedule.event(ev, syncer),
                None => {
                    events_open = false;
                    tracing::debug!("all sources closed; periodic syncs continue");
                }
            },
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Applies the sources' updates until every source in `waiting` has delivered
/// its initial list; the first sync (full) is due then.
async fn initial_lists<S: Syncer>(
    mut waiting: Vec<&'static str>,
    events: &mut mpsc::Receiver<Event>,
    syncer: &mut S,
    schedule: &mut Schedule,
) -> anyhow::Result<()> {
    if !waiting.is_empty() {
        tracing::info!(sources = ?waiting, "waiting for the initial lists before the first sync");
    }
    while !waiting.is_empty() {
        match events.recv().await {
            Some(Event::Updates(updates)) => {
                if !updates.is_empty() {
                    syncer.apply(updates);
                }
            }
            // The first sync is full and comes as soon as the lists are in.
            Some(Event::Relisting(_) | Event::TookOver) => {}
            Some(Event::Ready(name)) => {
                waiting.retain(|w| *w != name);
                if waiting.is_empty() {
                    tracing::info!("every initial list is complete; first sync");
                    schedule.last_full = Instant::now();
                }
            }
            None => anyhow::bail!("the sources stopped before their initial lists completed"),
        }
    }
    Ok(())
}

/// When the next sync is due and whether it must be full: the runner's state
/// between syncs.
struct Schedule {
    /// Updates (or a repair) wait for a sync.
    pending: bool,
    force_full: bool,
    last_sync: Option<Instant>,
    last_full: Instant,
    /// Failed syncs in a row, and when the next may be tried.
    failures: u32,
    retry_at: Option<Instant>,
    /// Sources re-listing, and since when.
    relisting: Vec<(&'static str, Instant)>,
    hold_expired_logged: bool,
    /// The syncer last said it skips the periodic full sync (logged on change).
    skipping_full: bool,
}

impl Schedule {
    /// The first sync is due at once and is full.
    fn new() -> Schedule {
        Schedule {
            pending: true,
            force_full: true,
            last_sync: None,
            last_full: Instant::now(),
            failures: 0,
            retry_at: None,
            relisting: Vec::new(),
            hold_expired_logged: false,
            skipping_full: false,
        }
    }

    /// When the next sync is due. No sync, periodic ones included, comes sooner
    /// than min_sync_period after the last one, nor before a failed sync's retry
    /// time, nor (for up to relist_hold) while a source re-lists.
    fn due(&mut self, now: Instant, cfg: &RunnerConfig) -> Instant {
        let earliest = self.last_sync.map_or(now, |t| t + cfg.min_sync_period);
        let periodic_due =
            (self.last_sync.unwrap_or(self.last_full) + cfg.sync_period).max(earliest);
        let mut due = periodic_due;
        if self.pending {
            due = due.min(earliest);
        }
        if let Some(retry) = self.retry_at {
            due = due.max(retry);
        }
        if let Some(since) = self.relisting.iter().map(|(_, t)| *t).min() {
            let hold = since + cfg.relist_hold;
            if hold > now {
                due = due.max(hold);
            } else if !self.hold_expired_logged {
                self.hold_expired_logged = true;
                let names: Vec<_> = self.relisting.iter().map(|(n, _)| *n).collect();
                tracing::warn!(sources = ?names, hold = ?cfg.relist_hold, "a re-list is taking too long; syncing what has arrived");
            }
        }
        due
    }

    /// Whether the sync due at `now` must be full: a start, a failure or a drift
    /// asked for one, or `full_sync_period` has passed since the last and the
    /// syncer does not skip the periodic one.
    fn full<S: Syncer>(&mut self, now: Instant, cfg: &RunnerConfig, syncer: &S) -> bool {
        if self.force_full {
            return true;
        }
        if now < self.last_full + cfg.full_sync_period {
            return false;
        }
        let skip = syncer.skips_periodic_full_sync();
        if skip != self.skipping_full {
            self.skipping_full = skip;
            if skip {
                tracing::info!(period = ?cfg.full_sync_period, "large cluster: the periodic full sync is skipped, as upstream's large cluster mode; starts, failures, drifts and node-wide changes still rewrite everything");
            } else {
                tracing::info!("no longer a large cluster: the periodic full sync resumes");
            }
        }
        !skip
    }

    /// The kernel lost what was written: a full sync, at once.
    fn repair(&mut self) {
        self.pending = true;
        self.force_full = true;
    }

    /// A sync at `now` succeeded.
    fn synced(&mut self, now: Instant, full: bool) {
        if self.failures > 0 {
            tracing::info!(after_failures = self.failures, "sync succeeded again");
        }
        self.failures = 0;
        self.retry_at = None;
        self.pending = false;
        self.force_full = false;
        if full {
            self.last_full = now;
        }
        self.last_sync = Some(now);
    }

    /// A sync at `now` failed: a full one is retried after the backoff, which
    /// is returned.
    fn failed(&mut self, now: Instant, cfg: &RunnerConfig) -> Duration {
        self.failures += 1;
        let delay = cfg.backoff(self.failures);
        self.retry_at = Some(now + delay);
        self.pending = true;
        self.force_full = true;
        self.last_sync = Some(now);
        delay
    }

    /// A source's event between syncs.
    fn event<S: Syncer>(&mut self, ev: Event, syncer: &mut S) {
        match ev {
            Event::Updates(updates) => {
                tracing::debug!(updates = updates.len(), "source updates received");
                if !updates.is_empty() {
                    syncer.apply(updates);
                    self.pending = true;
                    syncer.queued();
                }
            }
            Event::Relisting(name) => {
                if !self.relisting.iter().any(|(n, _)| *n == name) {
                    tracing::debug!(source = name, "re-listing: syncs wait for it");
                    self.relisting.push((name, Instant::now()));
                }
            }
            // Announced after this process's first sync as owner already came
            // (full, or an adoption of the sealed rules): a second full one would
            // only rewrite what that sync took or wrote.
            Event::TookOver if syncer.synced_as_owner() => {}
            Event::TookOver => {
                self.pending = true;
                self.force_full = true;
                self.last_sync = None;
                self.retry_at = None;
            }
            Event::Ready(name) => {
                self.relisting.retain(|(n, _)| *n != name);
                if self.relisting.is_empty() {
                    self.hold_expired_logged = false;
                }
            }
        }
    }
}

/// Runs `work` (a sync or a drift check), which blocks (it waits for the kernel's
/// tools). On a multi-threaded runtime the worker hands its other duties (its queued
/// tasks, and the I/O and timer driver it may hold) to another thread first, so the
/// HTTP servers answer and sources keep delivering while a sync takes long or hangs.
fn blocking<T>(work: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Log {
        syncs: Vec<(Duration, bool)>,
        applied: usize,
        fail_next: u32,
        /// When drift checks ran.
        checks: Vec<Duration>,
        /// The next check finds drift.
        drift_next: bool,
        /// The syncer has synced as the node's owner (from its first sync on).
        owner_from_start: bool,
        /// The syncer skips the periodic full sync (a large cluster).
        large: bool,
    }

    struct FakeSyncer {
        start: Instant,
        log: Arc<Mutex<Log>>,
    }

    impl Syncer for FakeSyncer {
        fn apply(&mut self, updates: Vec<SourceUpdate>) {
            self.log.lock().unwrap().applied += updates.len();
        }
        fn sync(&mut self, full: bool) -> anyhow::Result<()> {
            let mut log = self.log.lock().unwrap();
            log.syncs.push((self.start.elapsed(), full));
            if log.fail_next > 0 {
                log.fail_next -= 1;
                anyhow::bail!("injected failure");
            }
            Ok(())
        }
        fn check_drift(&mut self) -> bool {
            let mut log = self.log.lock().unwrap();
            log.checks.push(self.start.elapsed());
            std::mem::take(&mut log.drift_next)
        }
        fn synced_as_owner(&self) -> bool {
            let log = self.log.lock().unwrap();
            log.owner_from_start && !log.syncs.is_empty()
        }
        fn skips_periodic_full_sync(&self) -> bool {
            self.log.lock().unwrap().large
        }
    }

    /// One update event (a Service deleted), for tests that drive the runner.
    pub(crate) fn update() -> Event {
        Event::Updates(vec![SourceUpdate::Delete(
            svcproxy_core::objects::ObjectKey::new(
                svcproxy_core::objects::Kind::Service,
                "ns",
                "x",
            ),
        )])
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    /// Spawns the runner and returns its log and event sender.
    fn start(
        cfg: RunnerConfig,
        fail_first: u32,
    ) -> (Arc<Mutex<Log>>, mpsc::Sender<Event>, Instant) {
        let log = Arc::new(Mutex::new(Log {
            fail_next: fail_first,
            ..Log::default()
        }));
        let (tx, rx) = mpsc::channel(16);
        let start = Instant::now();
        let mut syncer = FakeSyncer {
            start,
            log: log.clone(),
        };
        tokio::spawn(async move { run(cfg, &mut syncer, rx, false).await });
        (log, tx, start)
    }

    #[tokio::test(start_paused = true)]
    async fn bursts_are_coalesced_to_one_sync_per_min_sync_period() {
        let cfg = RunnerConfig::new(secs(1.0), secs(30.0));
        let (log, tx, _) = start(cfg, 0);
        tokio::time::sleep(secs(0.1)).await;
        for _ in 0..50 {
            tx.send(update()).await.unwrap();
            tokio::time::sleep(secs(0.01)).await;
        }
        tokio::time::sleep(secs(3.0)).await;
        let log = log.lock().unwrap();
        assert_eq!(log.applied, 50);
        // The initial full sync at 0, then one partial sync at 1s for the whole burst.
        assert_eq!(log.syncs, vec![(secs(0.0), true), (secs(1.0), false)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_drift_found_by_the_periodic_check_brings_a_full_sync_at_once() {
        let cfg = RunnerConfig::new(secs(1.0), secs(30.0));
        assert_eq!(cfg.drift_check_period, DRIFT_CHECK_PERIOD);
        let (log, _tx, _) = start(cfg, 0);
        tokio::time::sleep(secs(12.0)).await;
        log.lock().unwrap().drift_next = true;
        tokio::time::sleep(secs(10.0)).await;
        let log = log.lock().unwrap();
        assert_eq!(
            log.checks,
            vec![secs(5.0), secs(10.0), secs(15.0), secs(20.0)]
        );
        // Found at 15 s, repaired at once by a full sync, long before the periodic one.
        assert_eq!(log.syncs, vec![(secs(0.0), true), (secs(15.0), true)]);
        // A short sync period checks as often as it syncs.
        assert_eq!(
            RunnerConfig::new(secs(0.0), secs(2.0)).drift_check_period,
            secs(2.0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn taking_over_brings_a_full_sync_at_once_whatever_the_min_sync_period() {
        let cfg = RunnerConfig::new(secs(10.0), secs(30.0));
        let (log, tx, _) = start(cfg, 0);
        tokio::time::sleep(secs(1.0)).await;
        tx.send(Event::TookOver).await.unwrap();
        tokio::time::sleep(secs(0.1)).await;
        assert_eq!(
            log.lock().unwrap().syncs,
            vec![(secs(0.0), true), (secs(1.0), true)]
        );
    }

    /// The owner handed over while this process was still listing: its first
    /// sync was already the owner's (full, or an adoption), and the take-over
    /// announced after it brings no second full sync.
    #[tokio::test(start_paused = true)]
    async fn a_take_over_announced_after_the_first_owner_sync_asks_for_nothing() {
        let cfg = RunnerConfig::new(secs(10.0), secs(30.0));
        let (log, tx, _) = start(cfg, 0);
        log.lock().unwrap().owner_from_start = true;
        tokio::time::sleep(secs(1.0)).await;
        tx.send(Event::TookOver).await.unwrap();
        tokio::time::sleep(secs(0.1)).await;
        assert_eq!(log.lock().unwrap().syncs, vec![(secs(0.0), true)]);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_min_sync_period_syncs_immediately() {
        let cfg = RunnerConfig::new(Duration::ZERO, secs(30.0));
        let (log, tx, _) = start(cfg, 0);
        tokio::time::sleep(secs(0.5)).await;
        tx.send(update()).await.unwrap();
        tokio::time::sleep(secs(0.1)).await;
        assert_eq!(
            log.lock().unwrap().syncs,
            vec![(secs(0.0), true), (secs(0.5), false)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_sync_runs_every_sync_period_and_a_full_one_hourly() {
        let cfg = RunnerConfig::new(secs(1.0), secs(30.0));
        let (log, tx, _) = start(cfg, 0);
        tokio::time::sleep(secs(95.0)).await;
        assert_eq!(
            log.lock().unwrap().syncs,
            vec![
                (secs(0.0), true),
                (secs(30.0), false),
                (secs(60.0), false),
                (secs(90.0), false)
            ]
        );
        // An update's sync restarts the period.
        tx.send(update()).await.unwrap();
        tokio::time::sleep(secs(40.0)).await;
        assert_eq!(
            log.lock().unwrap().syncs[4..],
            [(secs(95.0), false), (secs(125.0), false)]
        );
        // The first sync an hour after the last full one is full.
        tokio::time::sleep(secs(3600.0)).await;
        let syncs = log.lock().unwrap().syncs.clone();
        let full: Vec<Duration> = syncs.iter().filter(|s| s.1).map(|s| s.0).collect();
        assert_eq!(full, [secs(0.0), secs(3605.0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_cluster_skips_the_hourly_full_sync_but_not_a_repair() {
        let cfg = RunnerConfig::new(secs(1.0), secs(30.0));
        let (log, _tx, _) = start(cfg, 0);
        log.lock().unwrap().large = true;
        tokio::time::sleep(secs(2.0 * 3600.0 + 10.0)).await;
        {
            let log = log.lock().unwrap();
            let full: Vec<Duration> = log.syncs.iter().filter(|s| s.1).map(|s| s.0).collect();
            // Only the first sync was full; the periodic syncs went on, partial.
            assert_eq!(full, [secs(0.0)]);
            assert_eq!(log.syncs.len(), 2 * 120 + 1);
        }
        // A drift still brings a full sync at once.
        log.lock().unwrap().drift_next = true;
        tokio::time::sleep(secs(6.0)).await;
        let last = *log.lock().unwrap().syncs.last().unwrap();
        assert!(last.1, "the repair is full: {last:?}");
        // An hour after the repair the periodic full sync is due, and skipped.
        log.lock().unwrap().syncs.clear();
        tokio::time::sleep(secs(3600.0 + 60.0)).await;
        assert!(
            log.lock().unwrap().syncs.iter().all(|s| !s.1),
            "still skipped"
        );
        // Back under the threshold, the overdue full sync is the next sync.
        log.lock().unwrap().large = false;
        log.lock().unwrap().syncs.clear();
        tokio::time::sleep(secs(31.0)).await;
        let syncs = log.lock().unwrap().syncs.clone();
        assert_eq!(syncs.len(), 1, "{syncs:?}");
        assert!(
            syncs[0].1,
            "the first sync back under the threshold is full: {syncs:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failed_syncs_are_retried_with_backoff_as_full_syncs() {
        let cfg = RunnerConfig::new(secs(1.0), secs(30.0));
        let (log, _tx, _) = start(cfg, 3);
        tokio::time::sleep(secs(10.0)).await;
        assert_eq!(
            log.lock().unwrap().syncs,
            vec![
                (secs(0.0), true),
                (secs(1.0), true),
                (secs(3.0), true),
                (secs(7.0), true)
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn syncs_failing_for_longer_than_sync_period_keep_backing_off() {
        let cfg = RunnerConfig::new(secs(1.0), secs(30.0));
        let (log, _tx, _) = start(cfg, 1000);
        tokio::time::sleep(secs(100.0)).await;
        let times: Vec<Duration> = log.lock().unwrap().syncs.iter().map(|s| s.0).collect();
        // Backoff doubles to its cap (sync_period): the periodic resync does not
        // turn into a retry loop once it is overdue.
        let want: Vec<Duration> = [0.0, 1.0, 3.0, 7.0, 15.0, 31.0, 61.0, 91.0]
            .into_iter()
            .map(secs)
            .collect();
        assert_eq!(times, want);
    }

    #[tokio::test(start_paused = true)]
    async fn the_periodic_sync_respects_min_sync_period_too() {
        // A sync period shorter than the min sync period: the periodic syncs come
        // at the min sync period's pace, and an update's sync restarts the period.
        let cfg = RunnerConfig::new(secs(5.0), secs(2.0));
        let (log, tx, _) = start(cfg, 0);
        tokio::time::sleep(secs(11.0)).await;
        tx.send(update()).await.unwrap();
        tokio::time::sleep(secs(6.0)).await;
        assert_eq!(
            log.lock().unwrap().syncs,
            vec![
                (secs(0.0), true),
                (secs(5.0), false),
                (secs(10.0), false),
                (secs(15.0), false)
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_sync_waits_for_every_initial_list() {
        let mut cfg = RunnerConfig::new(secs(1.0), secs(30.0));
        cfg.initial_sources = vec!["services", "nodes"];
        let (log, tx, _) = start(cfg, 0);
        tx.send(update()).await.unwrap();
        tx.send(Event::Ready("services")).await.unwrap();
        tokio::time::sleep(secs(100.0)).await;
        assert_eq!(log.lock().unwrap().syncs, vec![]);
        assert_eq!(log.lock().unwrap().applied, 1);
        tx.send(update()).await.unwrap();
        tx.send(Event::Ready("nodes")).await.unwrap();
        tokio::time::sleep(secs(0.5)).await;
        let log = log.lock().unwrap();
        assert_eq!(log.applied, 2);
        assert_eq!(log.syncs, vec![(secs(100.0), true)]);
    }

    #[tokio::test(start_paused = true)]
    async fn syncs_wait_for_a_relist_to_complete() {
        let cfg = RunnerConfig::new(secs(1.0), secs(30.0));
        let (log, tx, _) = start(cfg, 0);
        tokio::time::sleep(secs(2.0)).await;
        tx.send(Event::Relisting("services")).await.unwrap();
        tx.send(update()).await.unwrap();
        tokio::time::sleep(secs(5.0)).await;
        tx.send(update()).await.unwrap();
        tokio::time::sleep(secs(1.0)).await;
        // Nothing synced mid-list (it started at 2s)...
        assert_eq!(log.lock().unwrap().syncs, vec![(secs(0.0), true)]);
        tx.send(Event::Ready("services")).await.unwrap();
        tokio::time::sleep(secs(0.5)).await;
        // ...and the whole re-list goes in one sync once it is complete.
        assert_eq!(
            log.lock().unwrap().syncs,
            vec![(secs(0.0), true), (secs(8.0), false)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_relist_that_never_completes_holds_syncs_for_relist_hold_only() {
        let mut cfg = RunnerConfig::new(secs(1.0), secs(300.0));
        cfg.relist_hold = secs(10.0);
        let (log, tx, _) = start(cfg, 0);
        tokio::time::sleep(secs(2.0)).await;
        tx.send(Event::Relisting("endpointslices")).await.unwrap();
        tx.send(update()).await.unwrap();
        tokio::time::sleep(secs(15.0)).await;
        tx.send(update()).await.unwrap();
        tokio::time::sleep(secs(0.5)).await;
        assert_eq!(
            log.lock().unwrap().syncs,
            vec![(secs(0.0), true), (secs(12.0), false), (secs(17.0), false)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn once_returns_the_first_sync_result() {
        let cfg = RunnerConfig::new(secs(1.0), secs(30.0));
        let log = Arc::new(Mutex::new(Log {
            fail_next: 1,
            ..Log::default()
        }));
        let (_tx, rx) = mpsc::channel(1);
        let mut syncer = FakeSyncer {
            start: Instant::now(),
            log,
        };
        assert!(run(cfg.clone(), &mut syncer, rx, true).await.is_err());
        let (_tx, rx) = mpsc::channel(1);
        assert!(run(cfg, &mut syncer, rx, true).await.is_ok());
    }
}
