//! Watching: the filesystem's events, debounced into bursts, each followed by a
//! rescan; the directory re-armed when it is replaced.

use super::*;

// ---------------------------------------------------------------------------
// Watching

pub(super) enum Msg {
    Event(notify::Result<notify::Event>),
    Stop,
}

/// Stops the watch when dropped; once `drop` returns, `on_change` is not called again.
pub struct WatchHandle {
    stop: mpsc::Sender<Msg>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        let _ = self.stop.send(Msg::Stop);
        if let Some(thread) = self.thread.take() {
            // Dropping the handle from inside `on_change` must not wait for itself.
            if thread.thread().id() != thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// Watches `dir` recursively and calls `on_change` on a background thread with the
/// updates from a rescan after each burst of filesystem events (a burst ends after
/// 100 ms of quiet), and every `rescan_period` without events (zero: never). Runs one
/// rescan straight away to catch changes made since the caller's own first rescan.
/// When the directory is replaced (deleted and re-created, renamed over, or the
/// symlink naming it re-pointed), the watch follows the new one. `on_change` is not
/// called when nothing changed, and should not block for long: it holds up the next
/// rescan and dropping the handle.
pub fn watch(
    dir: ManifestDir,
    rescan_period: Duration,
    on_change: impl FnMut(Vec<SourceUpdate>) + Send + 'static,
) -> anyhow::Result<WatchHandle> {
    let (tx, rx) = mpsc::channel();
    let events = tx.clone();
    let mut watcher = notify::recommended_watcher(move |event| {
        let _ = events.send(Msg::Event(event));
    })
    .context("cannot start a filesystem watcher")?;
    watcher
        .watch(dir.root(), RecursiveMode::Recursive)
        .with_context(|| format!("cannot watch manifests directory {}", dir.root().display()))?;
    // A symlink naming the directory is re-pointed in its parent: watch that too
    // (its other entries' events are filtered out by `relevant`).
    if let Some(parent) = symlink_parent(dir.root()) {
        if let Err(e) = watcher.watch(&parent, RecursiveMode::NonRecursive) {
            tracing::warn!(dir = %parent.display(), "cannot watch the directory of the manifests symlink; a re-pointed link is noticed at the next rescan: {e}");
        }
    }
    let armed = DirIdentity::of(dir.root());
    let thread = thread::Builder::new()
        .name("manifests-watch".to_string())
        .spawn(move || {
            let rearm = move |root: &Path| {
                // The old watch may be gone already (the directory was deleted).
                let _ = watcher.unwatch(root);
                watcher.watch(root, RecursiveMode::Recursive)
            };
            watch_loop(dir, &rx, rescan_period, armed, rearm, on_change)
        })
        .context("cannot start the manifests watch thread")?;
    Ok(WatchHandle {
        stop: tx,
        thread: Some(thread),
    })
}

/// The directory holding `root` when `root` is a symlink.
pub(super) fn symlink_parent(root: &Path) -> Option<PathBuf> {
    let is_link = fs::symlink_metadata(root).is_ok_and(|m| m.file_type().is_symlink());
    is_link
        .then(|| root.parent().map(Path::to_path_buf))
        .flatten()
        .map(|p| {
            if p.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                p
            }
        })
}

/// Which directory a path names now (symlinks followed): when it changes, the
/// directory was replaced and the watch must follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct DirIdentity {
    dev: u64,
    ino: u64,
}

impl DirIdentity {
    pub(super) fn of(path: &Path) -> Option<DirIdentity> {
        use std::os::unix::fs::MetadataExt as _;
        fs::metadata(path).ok().map(|m| DirIdentity {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

pub(super) fn watch_loop(
    mut dir: ManifestDir,
    rx: &mpsc::Receiver<Msg>,
    rescan_period: Duration,
    mut armed: Option<DirIdentity>,
    mut rearm: impl FnMut(&Path) -> notify::Result<()>,
    mut on_change: impl FnMut(Vec<SourceUpdate>),
) {
    let mut unsettled = rescan_and_send(&mut dir, None, &mut on_change);
    loop {
        // Without events: settle a file caught mid-write, look for a missing
        // directory, or the periodic safety-net rescan.
        let idle = if unsettled {
            Some(SETTLE)
        } else if armed.is_none() {
            Some(REARM_POLL)
        } else {
            (!rescan_period.is_zero()).then_some(rescan_period)
        };
        // Events that are not ours (other processes reading the directory: other
        // proxies' rescans, tools) neither end the wait nor restart it: a file
        // left unsettled is read SETTLE after, however busy the directory.
        let deadline = idle.map(|wait| Instant::now() + wait);
        let first = loop {
            let got = match deadline {
                Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match got {
                Ok(Msg::Event(event)) if !relevant(&event, dir.root()) => continue,
                other => break other,
            }
        };
        // What the burst named; `None` (a timer, or an event naming nothing) is a
        // full rescan.
        let mut touched: Touched = None;
        match first {
            Ok(Msg::Event(event)) => {
                touched = Some(BTreeSet::new());
                note(&mut touched, &event);
                if debounce(rx, dir.root(), &mut touched).is_err() {
                    return;
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = DirIdentity::of(dir.root());
        if now != armed {
            match now {
                Some(_) => match rearm(dir.root()) {
                    Ok(()) => {
                        tracing::info!(dir = %dir.root().display(), "manifests directory replaced; watching the new one");
                        armed = now;
                    }
                    Err(e) => {
                        tracing::warn!(dir = %dir.root().display(), "cannot watch the replaced manifests directory (retrying): {e}")
                    }
                },
                None => {
                    if armed.is_some() {
                        tracing::warn!(dir = %dir.root().display(), "manifests directory gone; its objects stay in force until it is back");
                    }
                    armed = None;
                }
            }
            touched = None;
        }
        unsettled = rescan_and_send(&mut dir, touched.as_ref(), &mut on_change);
    }
}

/// The paths a burst of events named, or `None` when one named none (a missed
/// event, an error): then only a full rescan will do.
pub(super) type Touched = Option<BTreeSet<PathBuf>>;

pub(super) fn note(touched: &mut Touched, event: &notify::Result<notify::Event>) {
    match (touched.as_mut(), event) {
        (Some(paths), Ok(e)) if !e.paths.is_empty() && !e.need_rescan() => {
            paths.extend(e.paths.iter().cloned());
            if paths.len() > MAX_EVENT_PATHS {
                *touched = None;
            }
        }
        _ => *touched = None,
    }
}

/// Waits for the end of a burst of events (`DEBOUNCE` of quiet, at most
/// `MAX_DEBOUNCE`), noting the paths they name in `touched`. `Err` when the watch
/// is stopping.
pub(super) fn debounce(
    rx: &mpsc::Receiver<Msg>,
    root: &Path,
    touched: &mut Touched,
) -> Result<(), ()> {
    let burst = Instant::now();
    let mut quiet_until = burst + DEBOUNCE;
    loop {
        // Only relevant events restart the quiet window: other processes merely
        // reading the directory must not hold our edits back.
        let deadline = quiet_until.min(burst + MAX_DEBOUNCE);
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        match rx.recv_timeout(left) {
            Ok(Msg::Event(event)) => {
                if relevant(&event, root) {
                    quiet_until = Instant::now() + DEBOUNCE;
                    note(touched, &event);
                }
            }
            Err(RecvTimeoutError::Timeout) => return Ok(()),
            Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => return Err(()),
        }
    }
}

/// Rescans (only `touched`, when given) and sends what changed; returns whether
/// some file was left unsettled.
pub(super) fn rescan_and_send(
    dir: &mut ManifestDir,
    touched: Option<&BTreeSet<PathBuf>>,
    on_change: &mut impl FnMut(Vec<SourceUpdate>),
) -> bool {
    let result = match touched {
        Some(paths) => dir.rescan_paths(paths),
        None => dir.rescan(),
    };
    match result {
        Ok(mut result) => {
            tracing::debug!(
                paths = touched.map(BTreeSet::len),
                updates = result.updates.len(),
                unsettled = result.unsettled,
                "manifests rescanned"
            );
            result.updates.extend(result.input_problems);
            if !result.updates.is_empty() {
                on_change(result.updates);
            }
            result.unsettled
        }
        Err(e) => {
            tracing::error!("manifests: {e:#}; keeping the objects read before");
            false
        }
    }
}

/// Opening and closing files without writing is what our own rescans do; letting
/// those through would rescan forever. Events about other entries of the symlink's
/// parent directory are not ours either.
pub(super) fn relevant(event: &notify::Result<notify::Event>, root: &Path) -> bool {
    match event {
        Ok(event) => {
            let ours = event.paths.is_empty() || event.paths.iter().any(|p| p.starts_with(root));
            ours && match event.kind {
                EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
                EventKind::Access(_) => false,
                _ => true,
            }
        }
        Err(e) => {
            // Missed events (a queue overflow) are caught up by rescanning.
            tracing::warn!("manifests watch: {e}");
            true
        }
    }
}
