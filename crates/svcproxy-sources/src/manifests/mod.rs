//! The standalone source: a directory of Kubernetes manifests.
//!
//! Entry points: [`ManifestDir::rescan`], which reads every `*.yaml`, `*.yml` and
//! `*.json` file under the directory and returns the [`SourceUpdate`]s that move the
//! state from what this source last yielded to what the files hold now, and [`watch`],
//! which does that after every burst of filesystem events.
//!
//! Files are read as a person editing them would expect: a file that does not parse
//! (half-saved, a typo) is reported and the objects it last yielded stay in force
//! until it is fixed; one bad object in a file skips that object only; and when two
//! files define the same object, the first in path order wins, whatever order the
//! filesystem lists them in.

use std::collections::{btree_map, BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::Context;
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use svcproxy_core::manifest::{self, Format, Manifest, ManifestObject};
use svcproxy_core::objects::{KubeObject, ObjectKey, SourceUpdate};
use svcproxy_core::problem::InputProblem;

mod first;
mod read;
mod walk;
mod watch;

pub use read::MAX_READERS;
use read::*;
use walk::*;
pub use watch::{watch, WatchHandle};

/// Larger files are skipped: no real manifest is this big, and reading one whole
/// into memory must stay cheap.
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// Directory nesting followed at most; deeper directories are reported and skipped.
const MAX_DEPTH: usize = 64;
/// Messages quote user input; this keeps one absurd value from flooding the log.
const MAX_MESSAGE_CHARS: usize = 1024;
/// Quiet time that ends a burst of filesystem events.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// A directory that never stops changing is still rescanned this often.
const MAX_DEBOUNCE: Duration = Duration::from_secs(2);
/// A file that has yielded objects and was written less than this long ago is left
/// as it was (its objects stay in force) and read once it has been quiet this long:
/// a file caught in the middle of an in-place rewrite (truncated, half written) must
/// not delete its services, even for a moment.
const SETTLE: Duration = Duration::from_millis(500);
/// While the directory is missing (deleted before being re-created), how often to
/// look for it.
const REARM_POLL: Duration = Duration::from_secs(1);

/// Something wrong with one file: it could not be read or parsed (its previous
/// objects stay in force), or one of its objects was skipped.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FileError {
    pub path: PathBuf,
    pub message: String,
}

impl FileError {
    fn new(path: &Path, message: impl Into<String>) -> Self {
        FileError {
            path: path.to_path_buf(),
            message: clean_message(&message.into()),
        }
    }
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

/// The outcome of one [`ManifestDir::rescan`].
#[derive(Clone, Debug, Default)]
pub struct RescanResult {
    /// Deletes first, then upserts, each in key order.
    pub updates: Vec<SourceUpdate>,
    /// [`SourceUpdate::InputProblems`] with every problem, when they changed since
    /// the last rescan: the state keeps them for the reports.
    pub input_problems: Option<SourceUpdate>,
    /// Every problem the directory has now (not only new ones), in path order and,
    /// within a file, in document order. (The state gets them as
    /// `input_problems`; the tests read them here.)
    #[cfg_attr(not(test), allow(dead_code))]
    pub errors: Vec<FileError>,
    /// Some file was written too recently to be read (see `SETTLE`): its previous
    /// objects stand, and a rescan shortly will read it.
    pub unsettled: bool,
}

/// A directory of manifests and what this source last yielded from it.
#[derive(Debug)]
pub struct ManifestDir {
    root: PathBuf,
    /// Objects each file last yielded while it parsed, as digests (the objects
    /// themselves are handed on, not kept); a file that stops parsing keeps its
    /// entry here, which is what keeps its objects in force.
    files: HashMap<Arc<Path>, Vec<Entry>>,
    /// The keys of `files` in path order (the order that picks the definition used
    /// when two files define one object).
    order: Vec<Arc<Path>>,
    /// The merged view of `files` as last yielded: each object's digest and file.
    yielded: BTreeMap<ObjectKey, (Digest, Arc<Path>)>,
    /// Errors of the last rescan, so that an unchanged error is logged once.
    reported: BTreeSet<FileError>,
    /// See `SETTLE`.
    settle: Duration,
    /// Files as they were when last parsed, settled: a file that still looks the
    /// same is not read again (a rescan of an unchanged directory, such as the
    /// first one after the watch is armed, parses nothing).
    parsed: HashMap<Arc<Path>, Stamp>,
    /// The problems of each listed file that has some (parse errors, skipped
    /// objects, a failed read), in document order, as of its last read.
    file_errors: HashMap<Arc<Path>, Vec<FileError>>,
    /// The last full listing, when the paths of filesystem events can stand in
    /// for the next one ([`ManifestDir::rescan_paths`]); `None` forces a full one.
    tree: Option<Tree>,
    /// Files read and parsed, ever.
    reads: u64,
    /// The problems last handed on as [`SourceUpdate::InputProblems`].
    sent_errors: Vec<FileError>,
}

/// What a full listing found beside the files, kept for the rescans that follow
/// events instead of listing: only for a tree without symlinks, unreadable
/// directories or a file reached twice, where a path names one file and a file
/// has one path.
#[derive(Debug)]
struct Tree {
    /// Every directory walked (by its listed path), the root included.
    dirs: HashSet<PathBuf>,
    /// The listing's own problems (too deep, not a regular file).
    errors: Vec<FileError>,
}

/// More paths than this in one burst of events: a full rescan is as cheap.
const MAX_EVENT_PATHS: usize = 4096;

/// What tells an object's content from another's: a SHA-256 (truncated) of its
/// JSON form.
type Digest = [u8; 16];

fn digest(object: &KubeObject) -> Digest {
    use sha2::Digest as _;
    struct Hashing(sha2::Sha256);
    impl std::io::Write for Hashing {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.update(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut h = Hashing(sha2::Sha256::new());
    // Serializing a typed object cannot fail (no maps with non-string keys); the
    // kind goes first, so two kinds' equal JSON cannot collide.
    let _ = std::io::Write::write_all(&mut h, object.kind().as_str().as_bytes());
    let _ = match object {
        KubeObject::Service(o) => serde_json::to_writer(&mut h, o),
        KubeObject::EndpointSlice(o) => serde_json::to_writer(&mut h, o),
        KubeObject::Node(o) => serde_json::to_writer(&mut h, o),
        KubeObject::ServiceCidr(o) => serde_json::to_writer(&mut h, o),
        KubeObject::Endpoints(o) => serde_json::to_writer(&mut h, o),
        KubeObject::Pod(o) => serde_json::to_writer(&mut h, o),
    };
    let full = h.0.finalize();
    let mut d = [0u8; 16];
    d.copy_from_slice(&full[..16]);
    d
}

/// One object of a file: its key, where in the file, its digest, and, during the
/// rescan that parsed it, the object itself.
#[derive(Debug)]
struct Entry {
    key: ObjectKey,
    at: String,
    mirrored_from: Option<ObjectKey>,
    digest: Digest,
    object: Option<Arc<KubeObject>>,
}

/// What is said of a definition passed over for an earlier one of the same
/// object, at `first_at`: in the same file (`other_file` `None`) or in another.
fn passed_over(entry: &Entry, other_file: Option<&Arc<Path>>, first_at: &str) -> String {
    match other_file {
        None => format!(
            "{}: {} is defined twice in this file ({first_at} and {}); the first is used",
            entry.at,
            entry.describe(),
            entry.at
        ),
        Some(first_path) => format!(
            "{}: {} is also defined in {} ({first_at}); that definition is used",
            entry.at,
            entry.describe(),
            first_path.display()
        ),
    }
}

impl Entry {
    fn parsed(o: ManifestObject) -> Self {
        Entry {
            digest: digest(&o.object),
            key: o.key,
            at: o.at,
            mirrored_from: o.mirrored_from,
            object: Some(o.object),
        }
    }

    /// The object's key, and the Endpoints object it was mirrored from if any.
    fn describe(&self) -> String {
        match &self.mirrored_from {
            Some(ep) => format!("{} (mirrored from {ep})", self.key),
            None => self.key.to_string(),
        }
    }
}

impl ManifestDir {
    /// A source for `root`; nothing is read until [`ManifestDir::rescan`].
    pub fn new(root: PathBuf) -> Self {
        ManifestDir {
            root,
            files: HashMap::new(),
            order: Vec::new(),
            yielded: BTreeMap::new(),
            reported: BTreeSet::new(),
            settle: SETTLE,
            parsed: HashMap::new(),
            file_errors: HashMap::new(),
            sent_errors: Vec::new(),
            tree: None,
            reads: 0,
        }
    }

    /// The same, reading files however recently they were written (tests that
    /// rewrite a file and rescan at once).
    #[cfg(test)]
    fn unsettled_reads(mut self) -> Self {
        self.settle = Duration::ZERO;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Re-reads the directory and returns the updates that move the state from what
    /// this source last yielded to what the directory holds now: an upsert (origin =
    /// file path) for each new or changed object, a delete for each vanished one, and
    /// nothing for unchanged ones. The first call's upserts are the initial list.
    ///
    /// Problems with single files are logged (once while they persist) and returned
    /// in [`RescanResult::errors`]. Only a missing or unreadable root is an `Err`, and
    /// then nothing changes.
    pub fn rescan(&mut self) -> anyhow::Result<RescanResult> {
        let listing = list_files(&self.root)?;
        let mut previous = std::mem::take(&mut self.files);
        let mut previous_errors = std::mem::take(&mut self.file_errors);
        let mut files: HashMap<Arc<Path>, Vec<Entry>> = HashMap::with_capacity(listing.files.len());
        let mut order: Vec<Arc<Path>> = Vec::with_capacity(listing.files.len());
        let mut unsettled = false;
        // The files this walk will read, read first by up to MAX_READERS threads
        // (a cold start reads them all); the walk itself stays in order.
        let wanted: Vec<&Path> = listing
            .files
            .iter()
            .filter(|(path, meta)| {
                self.must_read(path, meta.as_ref(), previous.contains_key(path.as_path()))
            })
            .map(|(path, _)| path.as_path())
            .collect();
        let mut read: HashMap<PathBuf, Result<Manifest, ReadError>> = wanted
            .iter()
            .map(|p| p.to_path_buf())
            .zip(read_manifests(&wanted))
            .collect();
        for (path, meta) in listing.files {
            let manifest = read.remove(&path);
            let (path, before) = match previous.remove_entry(path.as_path()) {
                Some((path, entries)) => (path, Some(entries)),
                None => (Arc::from(path), None),
            };
            if let Some(errors) = previous_errors.remove(&path) {
                self.file_errors.insert(path.clone(), errors);
            }
            // The listing's `stat`, one per file and rescan.
            if let Some(entries) =
                self.refresh(&path, meta.as_ref(), before, manifest, &mut unsettled)
            {
                order.push(path.clone());
                files.insert(path, entries);
            }
        }
        // What is left of the previous files was not listed now. Files under a
        // directory we could not list are unknown, not gone; the others are gone.
        let mut kept_unlisted = false;
        for (path, entries) in previous {
            if listing.unreadable_dirs.iter().any(|d| path.starts_with(d)) {
                if let Some(errors) = previous_errors.remove(&path) {
                    self.file_errors.insert(path.clone(), errors);
                }
                order.push(path.clone());
                files.insert(path, entries);
                kept_unlisted = true;
            } else {
                self.parsed.remove(&path);
            }
        }
        if kept_unlisted {
            order.sort();
        }
        self.files = files;
        self.order = order;
        self.tree = listing.simple.then(|| Tree {
            dirs: listing.dirs,
            errors: listing.errors.clone(),
        });
        Ok(self.merge(listing.errors, unsettled))
    }

    /// What [`ManifestDir::rescan`] returns, reading only `paths` (the files and
    /// directories a burst of filesystem events named) instead of listing the whole
    /// directory: a change costs what it touches, not what the directory holds.
    /// Falls back to the full rescan whenever the events cannot stand for a listing:
    /// before the first full one, in a tree with symlinks, hard links or unreadable
    /// directories, and when a directory itself appeared, went or changed.
    pub fn rescan_paths(&mut self, paths: &BTreeSet<PathBuf>) -> anyhow::Result<RescanResult> {
        let Some(work) = self.event_work(paths) else {
            return self.rescan();
        };
        let mut unsettled = false;
        for (path, meta) in work {
            let (path, before) = match self.files.remove_entry(path.as_path()) {
                Some((path, entries)) => (path, Some(entries)),
                None => (Arc::from(path), None),
            };
            let listed = before.is_some();
            let now = match meta {
                Some(meta) => self.refresh(&path, Some(&meta), before, None, &mut unsettled),
                // Gone: its objects with it.
                None => {
                    self.file_errors.remove(&path);
                    self.parsed.remove(&path);
                    None
                }
            };
            match (listed, now) {
                (true, Some(entries)) => {
                    self.files.insert(path, entries);
                }
                (true, None) => {
                    if let Ok(i) = self.order.binary_search(&path) {
                        self.order.remove(i);
                    }
                }
                (false, Some(entries)) => {
                    if let Err(i) = self.order.binary_search(&path) {
                        self.order.insert(i, path.clone());
                    }
                    self.files.insert(path, entries);
                }
                (false, None) => {}
            }
        }
        let errors = self
            .tree
            .as_ref()
            .map(|t| t.errors.clone())
            .unwrap_or_default();
        Ok(self.merge(errors, unsettled))
    }

    /// The manifest files `paths` name, each with what `stat` says of it now
    /// (`None`: gone), when the events can stand in for a listing; `None` when a
    /// full rescan is needed.
    fn event_work(
        &self,
        paths: &BTreeSet<PathBuf>,
    ) -> Option<Vec<(PathBuf, Option<fs::Metadata>)>> {
        let tree = self.tree.as_ref()?;
        if paths.len() > MAX_EVENT_PATHS {
            return None;
        }
        let mut work = Vec::new();
        for path in paths {
            let rel = path.strip_prefix(&self.root).ok()?;
            let mut hidden = false;
            for c in rel.components() {
                match c {
                    std::path::Component::Normal(name) => {
                        hidden |= name.to_string_lossy().starts_with('.');
                    }
                    // The root itself, or a path not in the listing's form.
                    _ => return None,
                }
            }
            if rel.as_os_str().is_empty() {
                return None;
            }
            // Never listed, and in a tree without symlinks nothing listed goes
            // through it: an editor's swap file, a hidden directory.
            if hidden {
                continue;
            }
            // A file in a directory the listing did not walk (a new one): list.
            if !tree.dirs.contains(path.parent()?) {
                return None;
            }
            let name = path.file_name()?.to_string_lossy();
            match fs::symlink_metadata(path) {
                Ok(meta) if meta.file_type().is_file() => {
                    use std::os::unix::fs::MetadataExt as _;
                    // A second name of a listed file is read once, under its first
                    // path: only a listing knows which is first.
                    if meta.nlink() > 1 {
                        return None;
                    }
                    if is_manifest_name(&name) {
                        work.push((path.clone(), Some(meta)));
                    }
                }
                // A directory, a symlink, a FIFO: the listing decides.
                Ok(_) => return None,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if tree.dirs.contains(path) {
                        return None;
                    }
                    if is_manifest_name(&name) {
                        work.push((path.clone(), None));
                    }
                }
                Err(_) => return None,
            }
        }
        Some(work)
    }

    /// One listed file, given what `stat` said of it and the entries it had
    /// (`before`): its entries now (`None`: it holds nothing in force). A file
    /// that still looks as when it was parsed is not read; one that has objects
    /// in force and was written too recently is left as it was (`unsettled`);
    /// one that cannot be read or parsed keeps its previous objects. Records its
    /// errors and, once settled, its stamp.
    /// `read`: the file, read already (by [`read_manifests`]), if it was.
    fn refresh(
        &mut self,
        path: &Arc<Path>,
        meta: Option<&fs::Metadata>,
        before: Option<Vec<Entry>>,
        read: Option<Result<Manifest, ReadError>>,
        unsettled: &mut bool,
    ) -> Option<Vec<Entry>> {
        let listed = before.is_some();
        if !self.must_read(path, meta, listed) {
            // Written too recently (held back), or unchanged since it was parsed.
            *unsettled |= listed && meta.is_some_and(|m| written_within(m, self.settle));
            return before;
        }
        let stamp = meta.and_then(|m| Stamp::settled(m, self.settle));
        self.parsed.remove(path);
        self.reads += 1;
        match read.unwrap_or_else(|| read_manifest(path)) {
            Ok(parsed) => {
                let errors: Vec<FileError> = parsed
                    .errors
                    .into_iter()
                    .map(|m| FileError::new(path, m))
                    .collect();
                if errors.is_empty() {
                    self.file_errors.remove(path);
                } else {
                    self.file_errors.insert(path.clone(), errors);
                }
                if let Some(stamp) = stamp {
                    self.parsed.insert(path.clone(), stamp);
                }
                Some(parsed.objects.into_iter().map(Entry::parsed).collect())
            }
            Err(message) => {
                self.file_errors.insert(
                    path.clone(),
                    vec![FileError::new(
                        path,
                        format!("{message}; its previous objects stay in force"),
                    )],
                );
                before
            }
        }
    }

    /// Whether [`ManifestDir::refresh`] reads a listed file (`listed`: it was
    /// listed before): not one with objects in force written too recently, nor
    /// one that still looks as when it was parsed.
    fn must_read(&self, path: &Path, meta: Option<&fs::Metadata>, listed: bool) -> bool {
        if listed && meta.is_some_and(|m| written_within(m, self.settle)) {
            return false;
        }
        let stamp = meta.and_then(|m| Stamp::settled(m, self.settle));
        !(listed && stamp.is_some() && stamp.as_ref() == self.parsed.get(path))
    }

    /// The updates from what was yielded to what `files` define now (each key's
    /// first definition in path order), with every problem: `errors` (the
    /// listing's), each file's, and each definition passed over.
    fn merge(&mut self, mut errors: Vec<FileError>, unsettled: bool) -> RescanResult {
        errors.extend(self.file_errors.values().flatten().cloned());
        // Each key's first definition (file and entry index): keys and paths are
        // borrowed, not cloned, for the objects that did not change.
        let files = &self.files;
        let order = &self.order;
        let mut wanted: BTreeMap<&ObjectKey, (usize, usize)> = BTreeMap::new();
        for (fi, path) in order.iter().enumerate() {
            for (ei, entry) in files[path].iter().enumerate() {
                match wanted.entry(&entry.key) {
                    btree_map::Entry::Occupied(first) => {
                        let (first_fi, first_ei) = *first.get();
                        let first_path = &order[first_fi];
                        let first_at = &files[first_path][first_ei].at;
                        let message =
                            passed_over(entry, (first_fi != fi).then_some(first_path), first_at);
                        errors.push(FileError::new(path, message));
                    }
                    btree_map::Entry::Vacant(v) => {
                        v.insert((fi, ei));
                    }
                }
            }
        }
        // A merge walk of what was yielded and what is wanted, both in key order:
        // vanished keys, and definitions that are new or differ (content or file).
        let mut deleted: Vec<ObjectKey> = Vec::new();
        let mut changed: Vec<(usize, usize)> = Vec::new();
        {
            let mut before = self.yielded.iter().peekable();
            for (key, &(fi, ei)) in &wanted {
                while let Some((k, _)) = before.next_if(|(k, _)| *k < *key) {
                    deleted.push(k.clone());
                }
                let path = &order[fi];
                let same = before
                    .next_if(|(k, _)| *k == *key)
                    .is_some_and(|(_, (d, p))| {
                        *d == files[path][ei].digest && (Arc::ptr_eq(p, path) || p == path)
                    });
                if !same {
                    changed.push((fi, ei));
                }
            }
            deleted.extend(before.map(|(k, _)| k.clone()));
        }
        drop(wanted);
        for key in &deleted {
            self.yielded.remove(key);
        }
        let mut updates: Vec<SourceUpdate> =
            deleted.into_iter().map(SourceUpdate::Delete).collect();
        // Changed objects whose file was not read now (a definition in another
        // file went, and this one, unchanged, takes over): read those files again.
        let mut missing: BTreeMap<Arc<Path>, Vec<ObjectKey>> = BTreeMap::new();
        for (fi, ei) in changed {
            let path = &self.order[fi];
            let Some(entry) = self.files.get_mut(path).and_then(|e| e.get_mut(ei)) else {
                continue;
            };
            match entry.object.take() {
                Some(object) => {
                    self.yielded
                        .insert(entry.key.clone(), (entry.digest, path.clone()));
                    // Held once (taken from its entry): handed on without a copy.
                    updates.push(SourceUpdate::Upsert {
                        object: Arc::try_unwrap(object).unwrap_or_else(|o| (*o).clone()),
                        origin: path.display().to_string(),
                    });
                }
                None => missing
                    .entry(path.clone())
                    .or_default()
                    .push(entry.key.clone()),
            }
        }
        // The objects of unchanged definitions are not kept (only their digests).
        for entry in self.files.values_mut().flatten() {
            entry.object = None;
        }
        let reread = !missing.is_empty();
        for (path, keys) in missing {
            self.reads += 1;
            // A key defined twice in the file is its first definition.
            let mut objects: BTreeMap<ObjectKey, Arc<KubeObject>> = BTreeMap::new();
            for o in read_manifest(&path).map(|m| m.objects).unwrap_or_default() {
                objects.entry(o.key).or_insert(o.object);
            }
            for key in keys {
                // Changed or gone since: what was yielded stands until the rescan
                // that reads the file anew.
                if let Some(object) = objects.remove(&key) {
                    self.yielded.insert(key, (digest(&object), path.clone()));
                    updates.push(SourceUpdate::Upsert {
                        object: Arc::try_unwrap(object).unwrap_or_else(|o| (*o).clone()),
                        origin: path.display().to_string(),
                    });
                }
            }
        }
        if reread {
            // Deletes first, then upserts, each in key order.
            let deletes = updates
                .iter()
                .take_while(|u| matches!(u, SourceUpdate::Delete(_)))
                .count();
            updates[deletes..].sort_by_cached_key(|u| match u {
                SourceUpdate::Upsert { object, .. } => Some(object.key()),
                _ => None,
            });
        }

        self.finish(errors, updates, unsettled)
    }

    /// A rescan's result: `errors` logged (those not logged before) and handed to
    /// the state when they changed.
    fn finish(
        &mut self,
        mut errors: Vec<FileError>,
        updates: Vec<SourceUpdate>,
        unsettled: bool,
    ) -> RescanResult {
        // Stable: within a file, errors stay in document order.
        errors.sort_by(|a, b| a.path.cmp(&b.path));
        self.log_errors(&errors);
        // The problems go to the state when they change, for the reports.
        let input_problems = (errors != self.sent_errors).then(|| {
            self.sent_errors = errors.clone();
            SourceUpdate::InputProblems(
                errors
                    .iter()
                    .map(|e| InputProblem {
                        origin: e.path.display().to_string(),
                        message: e.message.clone(),
                    })
                    .collect(),
            )
        });
        RescanResult {
            updates,
            input_problems,
            errors,
            unsettled,
        }
    }

    fn log_errors(&mut self, errors: &[FileError]) {
        let now: BTreeSet<FileError> = errors.iter().cloned().collect();
        for e in now.difference(&self.reported) {
            tracing::error!("manifests: {e}");
        }
        let still_failing: HashSet<&Path> = now.iter().map(|e| e.path.as_path()).collect();
        let cleared: BTreeSet<&Path> = self
            .reported
            .iter()
            .map(|e| e.path.as_path())
            .filter(|p| !still_failing.contains(p))
            .collect();
        for path in cleared {
            tracing::info!("manifests: {} has no more errors", path.display());
        }
        self.reported = now;
    }
}

#[cfg(test)]
mod tests {
    use super::watch::*;
    use super::*;
    use svcproxy_core::manifest::MAX_OBJECTS_PER_FILE;
    use svcproxy_core::objects::Kind;

    struct Dir {
        tmp: tempfile::TempDir,
        src: ManifestDir,
    }

    impl Dir {
        fn new() -> Self {
            let tmp = tempfile::tempdir().expect("tempdir");
            let src = ManifestDir::new(tmp.path().to_path_buf()).unsettled_reads();
            Dir { tmp, src }
        }

        fn path(&self, rel: &str) -> PathBuf {
            self.tmp.path().join(rel)
        }

        fn write(&self, rel: &str, text: &str) {
            let path = self.path(rel);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).expect("mkdir");
            }
            fs::write(path, text).expect("write");
        }

        fn remove(&self, rel: &str) {
            fs::remove_file(self.path(rel)).expect("remove");
        }

        fn rescan(&mut self) -> RescanResult {
            self.src.rescan().expect("rescan")
        }
    }

    fn svc(name: &str, ip: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\n\
             spec: {{clusterIP: {ip}, ports: [{{port: 80}}]}}\n"
        )
    }

    fn key(kind: Kind, ns: &str, name: &str) -> ObjectKey {
        ObjectKey::new(kind, ns, name)
    }

    fn svc_key(name: &str) -> ObjectKey {
        key(Kind::Service, "default", name)
    }

    /// Upserted keys with their origin file name, and deleted keys, in update order.
    fn summary(updates: &[SourceUpdate]) -> (Vec<(ObjectKey, String)>, Vec<ObjectKey>) {
        let mut upserts = Vec::new();
        let mut deletes = Vec::new();
        for u in updates {
            match u {
                SourceUpdate::Upsert { object, origin } => {
                    let file = Path::new(origin)
                        .file_name()
                        .map(|f| f.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    upserts.push((object.key(), file));
                }
                SourceUpdate::Delete(k) => deletes.push(k.clone()),
                SourceUpdate::Replace { .. }
                | SourceUpdate::HostAddresses(_)
                | SourceUpdate::InputProblems(_) => {
                    panic!("a rescan only upserts and deletes: {u:?}")
                }
            }
        }
        (upserts, deletes)
    }

    fn upserted(updates: &[SourceUpdate]) -> Vec<ObjectKey> {
        summary(updates).0.into_iter().map(|(k, _)| k).collect()
    }

    fn cluster_ip(updates: &[SourceUpdate], name: &str) -> Option<String> {
        updates.iter().find_map(|u| match u {
            SourceUpdate::Upsert {
                object: KubeObject::Service(s),
                ..
            } if s.metadata.name.as_deref() == Some(name) => {
                s.spec.as_ref().and_then(|s| s.cluster_ip.clone())
            }
            _ => None,
        })
    }

    /// Not a timed test: prints what a rescan costs with one file per object
    /// (`SCALE_FILES`, default 20,000), unchanged, and after two new files, listing
    /// the directory or reading the paths their events name (as the watch does).
    /// Run with
    /// `cargo test --release -p svcproxy rescan_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn rescan_cost_at_scale() {
        let n: usize = std::env::var("SCALE_FILES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        let tmp = tempfile::tempdir().expect("tempdir");
        for i in 0..n {
            let name = format!("svc-{i}");
            let ip = format!("10.{}.{}.{}", 96 + i / 65536, (i / 256) % 256, i % 256);
            fs::write(
                tmp.path().join(format!("service-{name}.yaml")),
                svc(&name, &ip),
            )
            .expect("write");
        }
        // Old enough for their stamps to count (see `SETTLE`).
        thread::sleep(SETTLE + Duration::from_millis(100));
        let mut dir = ManifestDir::new(tmp.path().to_path_buf());
        let t = Instant::now();
        let first = dir.rescan().expect("rescan");
        eprintln!(
            "[rescan] {n} files: first rescan {:?} ({} updates)",
            t.elapsed(),
            first.updates.len()
        );
        for round in 0..5 {
            let t = Instant::now();
            let same = dir.rescan().expect("rescan");
            let unchanged = t.elapsed();
            assert!(same.updates.is_empty());
            let mut timed = Vec::new();
            for by_events in [false, true] {
                let mut touched = BTreeSet::new();
                for k in 0..2 {
                    let name = format!("probe-{round}-{by_events}-{k}");
                    let path = tmp.path().join(format!("{name}.yaml"));
                    fs::write(&path, svc(&name, "10.200.0.1")).expect("write");
                    touched.insert(path);
                }
                let t = Instant::now();
                let changed = if by_events {
                    dir.rescan_paths(&touched)
                } else {
                    dir.rescan()
                }
                .expect("rescan");
                assert_eq!(changed.updates.len(), 2);
                timed.push(t.elapsed());
            }
            eprintln!(
                "[rescan] {n} files: unchanged {unchanged:?}, two new files: listed {:?}, \
                 by their events {:?}",
                timed[0], timed[1]
            );
        }
    }

    #[test]
    fn an_unchanged_file_is_not_read_again() {
        let mut d = Dir::new();
        d.write("a.yaml", &svc("a", "10.96.0.1"));
        d.write(
            "b.yaml",
            &format!(
                "{}---\nkind: Service\nmetadata: [1]\n",
                svc("b", "10.96.0.2")
            ),
        );
        assert_eq!(upserted(&d.rescan().updates).len(), 2);
        assert_eq!(d.src.reads, 2);
        // Just written: read again, whatever their stamps say.
        let r = d.rescan();
        assert!(r.updates.is_empty());
        assert_eq!(d.src.reads, 4);
        // Once their last change is old enough, not read; their errors still stand.
        std::thread::sleep(STAMP_AGE);
        d.rescan();
        let reads = d.src.reads;
        let r = d.rescan();
        assert!(r.updates.is_empty());
        assert_eq!(d.src.reads, reads);
        assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
        assert!(r.errors[0].path.ends_with("b.yaml"));
        // A change (same size) is read; only that file.
        d.write("a.yaml", &svc("a", "10.96.0.3"));
        let r = d.rescan();
        assert_eq!(cluster_ip(&r.updates, "a").as_deref(), Some("10.96.0.3"));
        assert_eq!(d.src.reads, reads + 1);
        // A file removed and another written in its place (a new inode): read.
        std::thread::sleep(STAMP_AGE);
        d.rescan();
        d.remove("b.yaml");
        d.write("b.yaml", &svc("b", "10.96.0.4"));
        let r = d.rescan();
        assert_eq!(cluster_ip(&r.updates, "b").as_deref(), Some("10.96.0.4"));
        assert!(r.errors.is_empty());
    }

    #[test]
    fn a_definition_that_takes_over_from_a_file_not_read_again_is_read_for_it() {
        let mut d = Dir::new();
        d.write("a.yaml", &svc("web", "10.96.0.1"));
        d.write("b.yaml", &svc("web", "10.96.0.2"));
        let r = d.rescan();
        assert_eq!(cluster_ip(&r.updates, "web").as_deref(), Some("10.96.0.1"));
        // Settled: from the next rescan on, neither file is read again.
        std::thread::sleep(STAMP_AGE);
        d.rescan();
        let reads = d.src.reads;
        assert!(d.rescan().updates.is_empty());
        assert_eq!(d.src.reads, reads);
        // a.yaml goes: b.yaml's definition (kept as a digest only) takes over, so
        // b.yaml is read again for the object.
        d.remove("a.yaml");
        let r = d.rescan();
        assert_eq!(summary(&r.updates).1, Vec::<ObjectKey>::new());
        assert_eq!(cluster_ip(&r.updates, "web").as_deref(), Some("10.96.0.2"));
        assert_eq!(d.src.reads, reads + 1);
        assert!(d.rescan().updates.is_empty());
    }

    #[test]
    fn a_definition_taking_over_from_a_file_not_read_again_is_its_first_one() {
        let mut d = Dir::new();
        d.write("a.yaml", &svc("web", "10.96.0.1"));
        d.write(
            "b.yaml",
            &format!(
                "{}---\n{}",
                svc("web", "10.96.0.2"),
                svc("web", "10.96.0.3")
            ),
        );
        d.rescan();
        std::thread::sleep(STAMP_AGE);
        d.rescan();
        d.remove("a.yaml");
        let r = d.rescan();
        assert_eq!(cluster_ip(&r.updates, "web").as_deref(), Some("10.96.0.2"));
    }

    #[test]
    fn multi_document_yaml_with_empty_documents() {
        let mut d = Dir::new();
        d.write(
            "all.yaml",
            &format!(
                "---\n# only a comment\n---\n{}---\n{}\n---\n",
                svc("a", "10.96.0.1"),
                svc("b", "10.96.0.2")
            ),
        );
        let r = d.rescan();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(upserted(&r.updates), [svc_key("a"), svc_key("b")]);
    }

    #[test]
    fn lists_are_expanded_including_nested_and_typed_lists() {
        let mut d = Dir::new();
        d.write(
            "list.yaml",
            r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: a}
  spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}
- apiVersion: v1
  kind: List
  items:
  - apiVersion: v1
    kind: Node
    metadata: {name: node-a}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSliceList
  items:
  - metadata: {name: a-1, labels: {kubernetes.io/service-name: a}}
    addressType: IPv4
    endpoints: [{addresses: [10.0.0.1]}]
"#,
        );
        let r = d.rescan();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let mut got = upserted(&r.updates);
        got.sort();
        assert_eq!(
            got,
            [
                svc_key("a"),
                key(Kind::EndpointSlice, "default", "a-1"),
                key(Kind::Node, "", "node-a"),
            ]
        );
    }

    #[test]
    fn nested_directories_are_read_in_path_order_and_hidden_ones_skipped() {
        let mut d = Dir::new();
        d.write("z/deep/er/svc.yml", &svc("deep", "10.96.0.3"));
        d.write("a.yaml", &svc("top", "10.96.0.4"));
        d.write(".hidden/svc.yaml", &svc("hidden", "10.96.0.5"));
        d.write(".dotfile.yaml", &svc("dotfile", "10.96.0.6"));
        d.write("notes.txt", &svc("txt", "10.96.0.7"));
        let r = d.rescan();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(
            summary(&r.updates).0,
            [
                (svc_key("deep"), "svc.yml".to_string()),
                (svc_key("top"), "a.yaml".to_string()),
            ]
        );
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_are_followed_without_looping() {
        let mut d = Dir::new();
        d.write("real/svc.yaml", &svc("a", "10.96.0.1"));
        std::os::unix::fs::symlink(d.path("real"), d.path("real/loop")).expect("symlink");
        std::os::unix::fs::symlink(d.path("real"), d.path("alias")).expect("symlink");
        std::os::unix::fs::symlink(d.path("real/svc.yaml"), d.path("link.yaml")).expect("symlink");
        let r = d.rescan();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(upserted(&r.updates), [svc_key("a")]);
    }

    /// The state a rescan of only the event paths leaves: what each object is and
    /// where it comes from, and the problems.
    fn view(src: &ManifestDir) -> (Vec<(ObjectKey, Digest, PathBuf)>, Vec<FileError>) {
        let yielded = src
            .yielded
            .iter()
            .map(|(k, (d, p))| (k.clone(), *d, p.to_path_buf()))
            .collect();
        let mut errors: Vec<FileError> = src.reported.iter().cloned().collect();
        errors.sort();
        (yielded, errors)
    }

    #[test]
    fn a_rescan_of_the_event_paths_ends_where_a_full_one_would() {
        // Random edits (new, rewritten, broken, duplicated, removed and renamed
        // files, in two directories); after each round, the source fed only the
        // paths touched must hold what a source listing everything at each round
        // holds (the same history: a broken file keeps what it yielded before).
        let mut d = Dir::new();
        d.write("sub/keep.yaml", &svc("keep", "10.96.1.1"));
        d.rescan();
        let mut full = ManifestDir::new(d.tmp.path().to_path_buf()).unsettled_reads();
        full.rescan().expect("rescan");
        assert!(d.src.tree.is_some(), "a plain tree takes event rescans");
        let mut rng = svcproxy_testkit::rng::XorShift::new(0x9e37_79b9_7f4a_7c15);
        let mut next = |n: u64| rng.below(n);
        let names: Vec<String> = (0..8)
            .flat_map(|i| [format!("f{i}.yaml"), format!("sub/g{i}.yaml")])
            .collect();
        for round in 0..60 {
            let mut touched = BTreeSet::new();
            for _ in 0..1 + next(4) {
                let name = &names[next(names.len() as u64) as usize];
                let path = d.path(name);
                match next(6) {
                    0 | 1 => {
                        let svc_name = format!("s{}", next(6));
                        let ip = format!("10.96.2.{}", next(200) + 1);
                        d.write(name, &svc(&svc_name, &ip));
                    }
                    2 => d.write(
                        name,
                        &format!(
                            "{}---\n{}",
                            svc("dup", "10.96.3.1"),
                            svc("dup", "10.96.3.2")
                        ),
                    ),
                    3 => d.write(name, "kind: Service\nmetadata: [unclosed\n"),
                    4 => {
                        let _ = fs::remove_file(&path);
                    }
                    _ => {
                        let to = &names[next(names.len() as u64) as usize];
                        if fs::rename(&path, d.path(to)).is_ok() {
                            touched.insert(d.path(to));
                        }
                    }
                }
                touched.insert(path);
            }
            let by_events = d.src.rescan_paths(&touched).expect("rescan");
            let listed = full.rescan().expect("rescan");

            assert_eq!(
                view(&d.src),
                view(&full),
                "round {round}, touched {touched:?}"
            );
            assert_eq!(
                summary(&by_events.updates),
                summary(&listed.updates),
                "round {round}"
            );
        }
    }

    #[test]
    fn a_rescan_of_the_event_paths_reads_only_them() {
        let mut d = Dir::new();
        for i in 0..20 {
            d.write(&format!("s{i}.yaml"), &svc(&format!("s{i}"), "10.96.0.1"));
        }
        d.rescan();
        let reads = d.src.reads;
        d.write("s3.yaml", &svc("s3", "10.96.0.3"));
        d.write("new.yaml", &svc("new", "10.96.0.4"));
        d.write(".s4.yaml.swp", "not yaml: [");
        d.remove("s5.yaml");
        let touched: BTreeSet<PathBuf> = ["s3.yaml", "new.yaml", ".s4.yaml.swp", "s5.yaml"]
            .iter()
            .map(|n| d.path(n))
            .collect();
        let r = d.src.rescan_paths(&touched).expect("rescan");
        assert_eq!(d.src.reads, reads + 2);
        let (upserts, deletes) = summary(&r.updates);
        assert_eq!(
            upserts,
            [
                (svc_key("new"), "new.yaml".to_string()),
                (svc_key("s3"), "s3.yaml".to_string())
            ]
        );
        assert_eq!(deletes, [svc_key("s5")]);
        assert_eq!(cluster_ip(&r.updates, "s3").as_deref(), Some("10.96.0.3"));
    }

    #[test]
    fn event_rescans_list_everything_where_a_path_may_not_name_one_file() {
        // A symlink: an edit of its target is an event for the target's path only.
        let mut d = Dir::new();
        d.write("real/svc.yaml", &svc("a", "10.96.0.1"));
        std::os::unix::fs::symlink(d.path("real/svc.yaml"), d.path("link.yaml")).expect("symlink");
        d.rescan();
        assert!(d.src.tree.is_none());
        // A new directory, and a file in it, named by their events: listed.
        let mut d = Dir::new();
        d.write("a.yaml", &svc("a", "10.96.0.1"));
        d.rescan();
        assert!(d.src.tree.is_some());
        d.write("new/b.yaml", &svc("b", "10.96.0.2"));
        let touched = BTreeSet::from([d.path("new")]);
        let r = d.src.rescan_paths(&touched).expect("rescan");
        assert_eq!(upserted(&r.updates), [svc_key("b")]);
        // A hard link to a listed file.
        fs::hard_link(d.path("a.yaml"), d.path("z.yaml")).expect("link");
        let touched = BTreeSet::from([d.path("z.yaml")]);
        let r = d.src.rescan_paths(&touched).expect("rescan");
        assert!(
            r.errors.is_empty(),
            "read once, under its first path: {:?}",
            r.errors
        );
        // A directory removed with its files, named by its own event only.
        fs::remove_dir_all(d.path("new")).expect("rm");
        let touched = BTreeSet::from([d.path("new")]);
        let r = d.src.rescan_paths(&touched).expect("rescan");
        assert_eq!(summary(&r.updates).1, [svc_key("b")]);
    }

    #[test]
    fn json_files_hold_one_object_or_a_list() {
        let mut d = Dir::new();
        d.write(
            "one.json",
            r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}"#,
        );
        d.write(
            "list.json",
            r#"{"apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}},
                {"apiVersion": "networking.k8s.io/v1beta1", "kind": "ServiceCIDR",
                 "metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["10.96.0.0/16"]}}
            ]}"#,
        );
        d.write("empty.json", "  \n");
        let r = d.rescan();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let mut got = upserted(&r.updates);
        got.sort();
        assert_eq!(
            got,
            [
                key(Kind::Node, "", "n1"),
                key(Kind::Node, "", "n2"),
                key(Kind::ServiceCidr, "", "kubernetes"),
            ]
        );
    }

    #[test]
    fn endpoints_become_mirrored_slices() {
        let mut d = Dir::new();
        d.write(
            "legacy.yaml",
            r#"
apiVersion: v1
kind: Endpoints
metadata: {name: legacy, namespace: shop}
subsets:
- addresses: [{ip: 10.0.0.1}, {ip: "fd00::1"}, {ip: bogus}]
  ports: [{name: http, port: 8080}]
"#,
        );
        let r = d.rescan();
        assert_eq!(
            upserted(&r.updates),
            [
                key(Kind::EndpointSlice, "shop", "legacy-mirror-0"),
                key(Kind::EndpointSlice, "shop", "legacy-mirror-1"),
            ]
        );
        assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
        assert!(r.errors[0].message.contains("bogus"), "{}", r.errors[0]);
        assert!(
            r.errors[0].message.contains("document 1"),
            "{}",
            r.errors[0]
        );

        // Losing an address family deletes that slice.
        d.write(
            "legacy.yaml",
            r#"
apiVersion: v1
kind: Endpoints
metadata: {name: legacy, namespace: shop}
subsets:
- addresses: [{ip: 10.0.0.1}]
  ports: [{name: http, port: 8080}]
"#,
        );
        let r = d.rescan();
        assert_eq!(
            summary(&r.updates).1,
            [key(Kind::EndpointSlice, "shop", "legacy-mirror-1")]
        );
        assert!(upserted(&r.updates).is_empty(), "mirror-0 is unchanged");
    }

    #[test]
    fn unknown_kinds_and_non_kubernetes_yaml_are_ignored() {
        let mut d = Dir::new();
        d.write(
            "app.yaml",
            &format!(
                r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web}}
spec: {{replicas: "not even checked"}}
---
apiVersion: serving.knative.dev/v1
kind: Service
metadata: {{name: knative}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: cm}}
---
{}"#,
                svc("web", "10.96.0.9")
            ),
        );
        d.write(
            "Chart.yaml",
            "apiVersion: v2\nname: chart\nversion: 1.0.0\n",
        );
        let r = d.rescan();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(upserted(&r.updates), [svc_key("web")]);
    }

    #[test]
    fn unsupported_versions_of_our_kinds_are_reported() {
        let mut d = Dir::new();
        d.write(
            "old.yaml",
            r#"
apiVersion: discovery.k8s.io/v1beta1
kind: EndpointSlice
metadata: {name: old}
addressType: IPv4
endpoints: []
---
kind: Service
metadata: {name: versionless}
"#,
        );
        let r = d.rescan();
        assert!(r.updates.is_empty());
        assert_eq!(r.errors.len(), 2, "{:?}", r.errors);
        assert!(r.errors[0]
            .message
            .contains("document 1: EndpointSlice \"old\""));
        assert!(r.errors[0].message.contains("not supported"));
        assert!(r.errors[1]
            .message
            .contains("document 2: Service \"versionless\""));
    }

    #[test]
    fn a_broken_file_keeps_its_objects_until_fixed() {
        let mut d = Dir::new();
        d.write("a.yaml", &svc("a", "10.96.0.1"));
        d.write("b.yaml", &svc("b", "10.96.0.2"));
        let r = d.rescan();
        assert_eq!(upserted(&r.updates).len(), 2);

        d.write(
            "a.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: {name: a\n  bad: [",
        );
        let r = d.rescan();
        assert!(r.updates.is_empty(), "{:?}", r.updates);
        assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
        assert_eq!(r.errors[0].path, d.path("a.yaml"));
        assert!(r.errors[0].to_string().contains("a.yaml"));
        assert!(r.errors[0].message.contains("stay in force"));

        // Still broken: still nothing to do, still reported.
        let r = d.rescan();
        assert!(r.updates.is_empty());
        assert_eq!(r.errors.len(), 1);

        d.write("a.yaml", &svc("a2", "10.96.0.3"));
        let r = d.rescan();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let (upserts, deletes) = summary(&r.updates);
        assert_eq!(deletes, [svc_key("a")]);
        assert_eq!(upserts, [(svc_key("a2"), "a.yaml".to_string())]);
    }

    #[test]
    fn a_broken_later_document_breaks_the_whole_file() {
        let mut d = Dir::new();
        d.write("a.yaml", &svc("a", "10.96.0.1"));
        d.rescan();
        d.write(
            "a.yaml",
            &format!("{}---\nkey: [unclosed\n", svc("a", "10.96.0.9")),
        );
        let r = d.rescan();
        assert!(
            r.updates.is_empty(),
            "the earlier document is not applied alone"
        );
        assert_eq!(r.errors.len(), 1);
    }

    #[test]
    fn a_file_broken_from_the_start_yields_nothing_and_is_reported() {
        let mut d = Dir::new();
        d.write("bad.json", "{\"apiVersion\": ");
        d.write("good.yaml", &svc("good", "10.96.0.1"));
        let r = d.rescan();
        assert_eq!(upserted(&r.updates), [svc_key("good")]);
        assert_eq!(r.errors.len(), 1);
        assert_eq!(r.errors[0].path, d.path("bad.json"));
        assert!(r.errors[0].message.contains("invalid JSON"));
    }

    #[test]
    fn deleting_a_file_deletes_its_objects() {
        let mut d = Dir::new();
        d.write(
            "a.yaml",
            &format!("{}---\n{}", svc("a", "10.96.0.1"), svc("b", "10.96.0.2")),
        );
        d.write("c.yaml", &svc("c", "10.96.0.3"));
        d.rescan();
        d.remove("a.yaml");
        let r = d.rescan();
        assert_eq!(
            summary(&r.updates),
            (vec![], vec![svc_key("a"), svc_key("b")])
        );
    }

    #[test]
    fn only_changed_objects_are_upserted() {
        let mut d = Dir::new();
        d.write(
            "a.yaml",
            &format!("{}---\n{}", svc("a", "10.96.0.1"), svc("b", "10.96.0.2")),
        );
        d.rescan();
        // Reformatted but equal, and one real change.
        d.write(
            "a.yaml",
            &format!(
                "{}---\n{}",
                r#"{"apiVersion": "v1", "kind": "Service",
                    "metadata": {"namespace": "default", "name": "a"},
                    "spec": {"ports": [{"port": 80}], "clusterIP": "10.96.0.1"}}
"#,
                svc("b", "10.96.0.20")
            ),
        );
        let r = d.rescan();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(upserted(&r.updates), [svc_key("b")]);
        assert_eq!(cluster_ip(&r.updates, "b").as_deref(), Some("10.96.0.20"));
        assert!(d.rescan().updates.is_empty(), "nothing changed since");
    }

    #[test]
    fn an_object_moving_to_another_file_is_upserted_with_its_new_origin() {
        let mut d = Dir::new();
        d.write("a.yaml", &svc("a", "10.96.0.1"));
        d.rescan();
        d.remove("a.yaml");
        d.write("b.yaml", &svc("a", "10.96.0.1"));
        let r = d.rescan();
        assert_eq!(
            summary(&r.updates),
            (vec![(svc_key("a"), "b.yaml".to_string())], vec![])
        );
    }

    #[test]
    fn duplicate_keys_across_files_first_path_wins() {
        let mut d = Dir::new();
        d.write("b.yaml", &svc("web", "10.96.0.2"));
        d.write("a.yaml", &svc("web", "10.96.0.1"));
        let r = d.rescan();
        assert_eq!(
            summary(&r.updates).0,
            [(svc_key("web"), "a.yaml".to_string())]
        );
        assert_eq!(cluster_ip(&r.updates, "web").as_deref(), Some("10.96.0.1"));
        assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
        assert_eq!(r.errors[0].path, d.path("b.yaml"));
        assert!(r.errors[0].message.contains("a.yaml"), "{}", r.errors[0]);

        // When the winner goes, the other definition takes over.
        d.remove("a.yaml");
        let r = d.rescan();
        assert!(r.errors.is_empty());
        assert_eq!(
            summary(&r.updates).0,
            [(svc_key("web"), "b.yaml".to_string())]
        );
        assert_eq!(cluster_ip(&r.updates, "web").as_deref(), Some("10.96.0.2"));
    }

    #[test]
    fn duplicate_keys_within_one_file_first_wins() {
        let mut d = Dir::new();
        d.write(
            "a.yaml",
            &format!(
                "{}---\n{}",
                svc("web", "10.96.0.1"),
                svc("web", "10.96.0.2")
            ),
        );
        let r = d.rescan();
        assert_eq!(cluster_ip(&r.updates, "web").as_deref(), Some("10.96.0.1"));
        assert_eq!(r.errors.len(), 1);
        assert!(r.errors[0].message.contains("twice"), "{}", r.errors[0]);
    }

    #[test]
    fn a_bad_object_is_skipped_and_the_rest_of_the_file_counts() {
        let mut d = Dir::new();
        d.write(
            "a.yaml",
            &format!(
                "{}---\n{}---\n{}---\njust a string\n---\nkind: List\nitems: [{{metadata: {{name: x}}}}]\n",
                svc("a", "10.96.0.1"),
                "apiVersion: v1\nkind: Service\nmetadata: {name: bad, namespace: shop}\n\
                 spec: {ports: [{port: eighty}]}\n",
                svc("c", "10.96.0.3")
            ),
        );
        let r = d.rescan();
        assert_eq!(upserted(&r.updates), [svc_key("a"), svc_key("c")]);
        assert_eq!(r.errors.len(), 3, "{:?}", r.errors);
        let bad = &r.errors[0];
        assert_eq!(bad.path, d.path("a.yaml"));
        for part in ["document 2", "Service", "\"shop/bad\"", "invalid"] {
            assert!(bad.message.contains(part), "{part} missing from {bad}");
        }
        assert!(
            r.errors[1].message.contains("document 4"),
            "{}",
            r.errors[1]
        );
        assert!(r.errors[2].message.contains("items[0]"), "{}", r.errors[2]);
    }

    #[test]
    fn an_out_of_range_number_or_a_repeated_key_skips_that_document_only() {
        let mut d = Dir::new();
        d.write(
            "a.yaml",
            &format!(
                "{}---
{}---
{}---
{}---
{}",
                svc("a", "10.96.0.1"),
                "apiVersion: v1\nkind: Service\nmetadata: {name: huge, namespace: default}\n\
                 spec: {clusterIP: 10.96.0.2, ports: [{port: 99999999999999999999999}]}\n",
                "apiVersion: v1\nkind: Service\nmetadata: {name: twice, namespace: default}\n\
                 spec:\n  clusterIP: 10.96.0.3\n  clusterIP: 10.96.0.4\n  ports: [{port: 80}]\n",
                "apiVersion: v1\nmetadata: {name: kindless, namespace: default}\n\
                 spec: {clusterIP: 10.96.0.5}\n",
                svc("e", "10.96.0.6")
            ),
        );
        let r = d.rescan();
        assert_eq!(upserted(&r.updates), [svc_key("a"), svc_key("e")]);
        let messages: Vec<&str> = r.errors.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(messages.len(), 3, "{messages:?}");
        assert!(messages[0].starts_with("document 2:"), "{messages:?}");
        assert!(
            messages[1].starts_with("document 3:") && messages[1].contains("duplicate"),
            "{messages:?}"
        );
        assert!(
            messages[2].contains("document 4") && messages[2].contains("no kind"),
            "{messages:?}"
        );
    }

    #[test]
    fn nameless_objects_are_reported() {
        let mut d = Dir::new();
        d.write(
            "a.yaml",
            "apiVersion: v1\nkind: Node\nmetadata: {labels: {a: b}}\n",
        );
        let r = d.rescan();
        assert!(r.updates.is_empty());
        assert_eq!(r.errors.len(), 1);
        assert!(r.errors[0].message.contains("no metadata.name"));
    }

    #[test]
    fn a_missing_root_is_an_error() {
        let d = Dir::new();
        let mut src = ManifestDir::new(d.path("nope"));
        let err = src.rescan().expect_err("missing directory");
        assert!(format!("{err:#}").contains("nope"), "{err:#}");
    }

    #[test]
    fn absurd_input_is_an_error_not_a_panic() {
        let mut d = Dir::new();
        d.write("many.yaml", &"---\n".repeat(MAX_OBJECTS_PER_FILE + 10));
        d.write(
            "deep.json",
            &format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
        );
        d.write(
            "deep.yaml",
            &format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
        );
        d.write(
            "bomb.yaml",
            "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n\
             c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n\
             e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n\
             g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]\nh: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]\n",
        );
        d.write(
            "tags.yaml",
            "!!binary aGVsbG8=\n---\n{1: 2}\n---\n!custom {a: b}\n",
        );
        d.write("binary.yaml", "");
        fs::write(d.path("binary.yaml"), [0xff, 0xfe, 0x00, 0x01]).expect("write");
        d.write(
            "wrongtypes.yaml",
            "apiVersion: 1\nkind: [Service]\nmetadata: 7\n",
        );
        d.write(
            "weird.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: {name: \"a\\nb\"}\nspec: 12\n",
        );
        let big = d.path("big.yaml");
        let file = fs::File::create(&big).expect("create");
        file.set_len(MAX_FILE_BYTES + 1).expect("set_len");
        let r = d.rescan();
        assert!(r.updates.is_empty(), "{:?}", r.updates);
        for e in &r.errors {
            assert!(e.message.chars().count() <= MAX_MESSAGE_CHARS + 1, "{e}");
            assert!(!e.message.chars().any(char::is_control), "{e}");
        }
        let failing: BTreeSet<String> = r
            .errors
            .iter()
            .filter_map(|e| e.path.file_name().map(|f| f.to_string_lossy().into_owned()))
            .collect();
        for f in [
            "many.yaml",
            "deep.json",
            "deep.yaml",
            "bomb.yaml",
            "binary.yaml",
            "big.yaml",
            "weird.yaml",
        ] {
            assert!(failing.contains(f), "{f} not reported: {:?}", r.errors);
        }
    }

    #[test]
    fn watch_delivers_updates_after_a_write() {
        let d = Dir::new();
        d.write("a.yaml", &svc("a", "10.96.0.1"));
        let mut src = ManifestDir::new(d.path(""));
        let initial = src.rescan().expect("rescan");
        assert_eq!(upserted(&initial.updates), [svc_key("a")]);

        let (tx, rx) = mpsc::channel();
        let handle = watch(src, Duration::ZERO, move |updates| {
            let _ = tx.send(updates);
        })
        .expect("watch");
        d.write("sub/b.yaml", &svc("b", "10.96.0.2"));
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = Vec::new();
        while !seen.contains(&svc_key("b")) {
            let left = deadline.saturating_duration_since(Instant::now());
            let updates = rx.recv_timeout(left).expect("an update within 10 s");
            seen.extend(upserted(&updates));
        }
        assert!(
            !seen.contains(&svc_key("a")),
            "unchanged objects are not re-sent"
        );

        d.remove("a.yaml");
        let updates = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the delete");
        assert_eq!(summary(&updates).1, [svc_key("a")]);

        // Our own reads must not trigger further rescans with updates, and nothing
        // arrives once the handle is gone.
        drop(handle);
        d.write("c.yaml", &svc("c", "10.96.0.3"));
        assert!(rx.recv_timeout(Duration::from_millis(600)).is_err());
    }

    /// Collects every key upserted through `rx` until `want` is among them (10 s).
    /// Other updates are passed over: a rescan that lists a directory while a
    /// symlink on its path is repointed may find a listed file gone, and says so
    /// (the file's objects stay; the next rescan reads the new target).
    fn wait_for(rx: &mpsc::Receiver<Vec<SourceUpdate>>, want: &ObjectKey) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        let upserts = |updates: &[SourceUpdate]| {
            updates
                .iter()
                .any(|u| matches!(u, SourceUpdate::Upsert { object, .. } if object.key() == *want))
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(updates) if upserts(&updates) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    }

    #[test]
    fn a_directory_replaced_under_the_watch_is_followed() {
        let d = Dir::new();
        d.write("m/a.yaml", &svc("a", "10.96.0.1"));
        let mut src = ManifestDir::new(d.path("m"));
        src.rescan().expect("rescan");
        let (tx, rx) = mpsc::channel();
        let _handle = watch(src, Duration::ZERO, move |u| {
            let _ = tx.send(u);
        })
        .expect("watch");
        // Renamed away and a new one put in its place (what `kubectl cp`, rsync
        // --delete-after or a deploy script swapping directories does).
        fs::rename(d.path("m"), d.path("m.old")).unwrap();
        d.write("m.new/b.yaml", &svc("b", "10.96.0.2"));
        fs::rename(d.path("m.new"), d.path("m")).unwrap();
        assert!(wait_for(&rx, &svc_key("b")), "the new directory was read");
        // And edits in the new directory are seen: the watch moved with it.
        d.write("m/c.yaml", &svc("c", "10.96.0.3"));
        assert!(
            wait_for(&rx, &svc_key("c")),
            "edits after the swap are seen"
        );
        // Deleted, then re-created later.
        fs::remove_dir_all(d.path("m")).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        d.write("m/d.yaml", &svc("d", "10.96.0.4"));
        assert!(
            wait_for(&rx, &svc_key("d")),
            "a re-created directory is found"
        );
        d.write("m/e.yaml", &svc("e", "10.96.0.5"));
        assert!(wait_for(&rx, &svc_key("e")), "and watched");
    }

    #[test]
    fn a_configmap_volume_update_is_seen() {
        // As the kubelet lays out a ConfigMap volume: `web.yaml -> ..data/web.yaml`,
        // `..data -> ..v1`, updated by renaming a new `..data` link over the old.
        let d = Dir::new();
        d.write("..v1/web.yaml", &svc("web", "10.96.0.1"));
        std::os::unix::fs::symlink("..v1", d.path("..data")).unwrap();
        std::os::unix::fs::symlink("..data/web.yaml", d.path("web.yaml")).unwrap();
        let mut src = ManifestDir::new(d.path(""));
        assert_eq!(
            cluster_ip(&src.rescan().expect("rescan").updates, "web").as_deref(),
            Some("10.96.0.1")
        );
        let (tx, rx) = mpsc::channel();
        let _handle = watch(src, Duration::ZERO, move |u| {
            let _ = tx.send(u);
        })
        .expect("watch");
        d.write("..v2/web.yaml", &svc("web", "10.96.0.2"));
        std::os::unix::fs::symlink("..v2", d.path("..data_tmp")).unwrap();
        fs::rename(d.path("..data_tmp"), d.path("..data")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut ip = None;
        while ip.as_deref() != Some("10.96.0.2") {
            let left = deadline.saturating_duration_since(Instant::now());
            let updates = rx.recv_timeout(left).expect("the new version within 10 s");
            ip = cluster_ip(&updates, "web").or(ip);
        }
    }

    #[test]
    fn a_repointed_symlink_is_followed() {
        let d = Dir::new();
        d.write("v1/a.yaml", &svc("a", "10.96.0.1"));
        d.write("v2/b.yaml", &svc("b", "10.96.0.2"));
        std::os::unix::fs::symlink(d.path("v1"), d.path("current")).unwrap();
        let mut src = ManifestDir::new(d.path("current"));
        src.rescan().expect("rescan");
        let (tx, rx) = mpsc::channel();
        let _handle = watch(src, Duration::ZERO, move |u| {
            let _ = tx.send(u);
        })
        .expect("watch");
        // Atomically, as `ln -sfn` through a rename.
        std::os::unix::fs::symlink(d.path("v2"), d.path("next")).unwrap();
        fs::rename(d.path("next"), d.path("current")).unwrap();
        assert!(wait_for(&rx, &svc_key("b")), "the new target was read");
        d.write("v2/e.yaml", &svc("e", "10.96.0.5"));
        assert!(
            wait_for(&rx, &svc_key("e")),
            "edits in the new target are seen"
        );
    }

    /// `watch_loop` over `src` on a thread of its own, with no watcher: events are
    /// what the test sends (and `Msg::Stop` ends it); updates come out of the
    /// receiver.
    fn loop_without_watcher(
        src: ManifestDir,
        rescan_period: Duration,
    ) -> (
        mpsc::Sender<Msg>,
        mpsc::Receiver<Vec<SourceUpdate>>,
        thread::JoinHandle<()>,
    ) {
        let (events_tx, events) = mpsc::channel::<Msg>();
        let (tx, rx) = mpsc::channel();
        let armed = DirIdentity::of(src.root());
        let thread = thread::spawn(move || {
            watch_loop(
                src,
                &events,
                rescan_period,
                armed,
                |_| Ok(()),
                move |u| {
                    let _ = tx.send(u);
                },
            )
        });
        (events_tx, rx, thread)
    }

    #[test]
    fn the_periodic_rescan_catches_what_no_event_reported() {
        let d = Dir::new();
        let mut src = ManifestDir::new(d.path(""));
        src.rescan().expect("rescan");
        // No watcher at all: only the period can notice.
        let (stop, rx, thread) = loop_without_watcher(src, Duration::from_millis(200));
        d.write("a.yaml", &svc("a", "10.96.0.1"));
        assert!(wait_for(&rx, &svc_key("a")));
        stop.send(Msg::Stop).unwrap();
        thread.join().unwrap();
    }

    #[test]
    fn other_processes_reading_the_directory_do_not_hold_back_a_settling_file() {
        let d = Dir::new();
        d.write("a.yaml", &svc("a", "10.96.0.1"));
        std::thread::sleep(SETTLE);
        let mut src = ManifestDir::new(d.path(""));
        src.rescan().expect("rescan");
        let (events_tx, rx, thread) = loop_without_watcher(src, Duration::ZERO);
        // An edit in place (read too early, it is left to settle), then, as other
        // proxies rescan, reads of the directory every 50 ms.
        d.write("a.yaml", &svc("a", "10.96.0.9"));
        let path = d.path("a.yaml");
        let event = |kind| Msg::Event(Ok(notify::Event::new(kind).add_path(path.clone())));
        events_tx
            .send(event(EventKind::Modify(notify::event::ModifyKind::Any)))
            .unwrap();
        let start = Instant::now();
        let mut got = None;
        while got.is_none() && start.elapsed() < Duration::from_secs(3) {
            events_tx
                .send(event(EventKind::Access(AccessKind::Open(AccessMode::Read))))
                .unwrap();
            got = rx.recv_timeout(Duration::from_millis(50)).ok();
        }
        let took = start.elapsed();
        let got = got.expect("the edit was delivered while the directory was read");
        assert_eq!(cluster_ip(&got, "a").as_deref(), Some("10.96.0.9"));
        assert!(took < SETTLE * 3, "{took:?}");
        events_tx.send(Msg::Stop).unwrap();
        thread.join().unwrap();
    }

    #[test]
    fn a_file_caught_mid_rewrite_keeps_its_objects_until_it_settles() {
        let mut d = Dir::new();
        d.src.settle = SETTLE;
        d.write("a.yaml", &svc("a", "10.96.0.1"));
        // Old enough to be settled.
        std::thread::sleep(SETTLE);
        assert_eq!(upserted(&d.rescan().updates), [svc_key("a")]);
        // Truncated by an in-place rewrite, not yet written again.
        fs::write(d.path("a.yaml"), "").unwrap();
        let r = d.rescan();
        assert!(
            r.updates.is_empty(),
            "nothing deleted mid-write: {:?}",
            r.updates
        );
        assert!(r.unsettled);
        // The writer finishes within the settle time: the service never went away.
        fs::write(d.path("a.yaml"), svc("a", "10.96.0.9")).unwrap();
        std::thread::sleep(SETTLE);
        let r = d.rescan();
        assert!(!r.unsettled);
        assert_eq!(cluster_ip(&r.updates, "a").as_deref(), Some("10.96.0.9"));
        assert!(summary(&r.updates).1.is_empty(), "no delete ever");
        // Emptied for good: deleted once settled.
        fs::write(d.path("a.yaml"), "").unwrap();
        assert!(d.rescan().updates.is_empty());
        std::thread::sleep(SETTLE);
        assert_eq!(summary(&d.rescan().updates).1, [svc_key("a")]);
    }

    /// The first scan streamed (`rescan_into`) comes to what `rescan` returns: the
    /// same objects in force (each key's first definition in path order, nothing of
    /// a file that fails part way), the same errors, and the same record, so that
    /// the rescans that follow say the same.
    #[test]
    fn the_first_scan_streamed_is_the_scan() {
        let write_all = |d: &Dir| {
            d.write(
                "a/1.yaml",
                &format!(
                    "{}---\n{}",
                    svc("web", "10.96.0.1"),
                    svc("web", "10.96.0.9")
                ),
            );
            d.write(
                "a/2.yaml",
                &format!(
                    "{}---\n{}---\n[not: yaml\n",
                    svc("late", "10.96.0.2"),
                    svc("db", "10.96.0.3")
                ),
            );
            d.write(
                "b/1.yaml",
                &format!(
                    "{}---\n{}---\nkind: Service\nmetadata: {{name: x}}\nspec: 5\n",
                    svc("web", "10.96.0.4"),
                    svc("db", "10.96.0.5")
                ),
            );
            d.write("b/2.json", r#"{"apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "json", "namespace": "default"},
                 "spec": {"clusterIP": "10.96.0.6", "ports": [{"port": 80}]}},
                {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "json", "namespace": "default"},
                 "subsets": [{"addresses": [{"ip": "10.244.0.6"}], "ports": [{"port": 80}]}]}]}"#);
            d.write("c/empty.yaml", "");
            d.write("c/bad.json", "{");
        };
        let mut plain = Dir::new();
        write_all(&plain);
        let mut streamed = Dir::new();
        write_all(&streamed);

        let scanned = plain.rescan();
        let mut handed: Vec<SourceUpdate> = Vec::new();
        let first = streamed
            .src
            .rescan_into(&mut |u| handed.push(u))
            .expect("rescan");
        // What is in force after each: the upserts, less what was taken back, by
        // the file (under its root) that defined them.
        let in_force = |d: &Dir, updates: &[SourceUpdate]| {
            let mut objects: BTreeMap<ObjectKey, (KubeObject, String)> = BTreeMap::new();
            for u in updates {
                match u {
                    SourceUpdate::Upsert { object, origin } => {
                        let file = Path::new(origin).strip_prefix(d.tmp.path()).unwrap();
                        objects.insert(object.key(), (object.clone(), file.display().to_string()));
                    }
                    SourceUpdate::Delete(k) => {
                        objects.remove(k);
                    }
                    _ => panic!("{u:?}"),
                }
            }
            objects
        };
        assert_eq!(
            in_force(&streamed, &handed),
            in_force(&plain, &scanned.updates)
        );
        assert_eq!(
            cluster_ip(&scanned.updates, "web").as_deref(),
            Some("10.96.0.1"),
            "the first definition in path order"
        );
        assert_eq!(
            cluster_ip(&scanned.updates, "db").as_deref(),
            Some("10.96.0.5"),
            "a/2.yaml fails part way: nothing of it counts"
        );
        assert!(
            handed.contains(&SourceUpdate::Delete(svc_key("late"))),
            "taken back"
        );
        // Paths under each directory's own root.
        let norm = |d: &Dir, x: &dyn fmt::Debug| {
            format!("{x:?}").replace(&d.tmp.path().display().to_string(), "ROOT")
        };
        assert_eq!(
            norm(&streamed, &first.errors),
            norm(&plain, &scanned.errors)
        );
        assert_eq!(
            norm(&streamed, &first.input_problems),
            norm(&plain, &scanned.input_problems)
        );
        assert_eq!(first.unsettled, scanned.unsettled);
        assert_eq!(streamed.src.reads, plain.src.reads);

        // The same record: the same rescans after edits.
        for d in [&plain, &streamed] {
            d.write("a/2.yaml", &svc("late", "10.96.0.2"));
            d.remove("a/1.yaml");
            d.write("c/bad.json", "[]");
        }
        let (a, b) = (plain.rescan(), streamed.rescan());
        assert_eq!(norm(&plain, &a.updates), norm(&streamed, &b.updates));
        assert_eq!(norm(&plain, &a.errors), norm(&streamed, &b.errors));
        assert_eq!(summary(&a.updates).1, Vec::<ObjectKey>::new());
        assert_eq!(cluster_ip(&a.updates, "web").as_deref(), Some("10.96.0.4"));
        // A later rescan_into is a rescan.
        for d in [&plain, &streamed] {
            d.write("b/1.yaml", &svc("db", "10.96.0.7"));
        }
        let mut handed = Vec::new();
        let b = streamed
            .src
            .rescan_into(&mut |u| handed.push(u))
            .expect("rescan");
        let a = plain.rescan();
        assert_eq!(norm(&streamed, &handed), norm(&plain, &a.updates));
        assert_eq!(norm(&streamed, &b.errors), norm(&plain, &a.errors));
        assert!(b.updates.is_empty());
    }
}
