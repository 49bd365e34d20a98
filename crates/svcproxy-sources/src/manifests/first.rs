//! The first scan, streamed: each object goes to the caller as soon as its document
//! is parsed, instead of every object of the directory being held until the merge.
//!
//! Why: a cold start otherwise holds every parsed object at once, and the state
//! converted from them is then allocated among the holes their parsing left (each
//! document's YAML and JSON trees), so it stays spread over all of that memory once
//! the objects are freed: `svcproxy dns` at 10,000 Services with 10 endpoints each
//! (`scripts/bench-dns.sh`) peaked at 138 MiB and held 103 MiB resident for 27 MiB
//! in use, which `malloc_trim` cannot give back (the free pieces are smaller than
//! a page). Streamed, it peaks at 54 MiB and holds 49 MiB: what the state holds,
//! and a document.
//!
//! The outcome is [`ManifestDir::rescan`]'s: the same objects (each key's first
//! definition in path order), the same errors, the same record of what was yielded
//! for the rescans that follow. Files are parsed by up to [`MAX_READERS`] threads
//! at once, each at most a few hundred objects ahead of the state, and taken in
//! path order. A file that turns out unusable part way (a syntax
//! error, too many objects) takes back the objects it handed on, as `Delete`s: on a
//! first scan nothing else can have defined them yet.

use super::*;

/// What a reader thread sends: a file's object (with its digest), or the end of
/// the file.
enum Read {
    Object(ManifestObject, Digest),
    Done(Result<Vec<String>, ReadError>),
}

/// Objects parsed ahead of the state at most (backpressure: a reader faster than
/// the state holds no more than this).
const AHEAD: usize = 256;

/// Objects a reader sends at once. One at a time, the state's thread woke for
/// each and slept again: 20,000 context switches at 10k Services, and the reader
/// waiting on the wakeups.
const BATCH: usize = 32;

impl ManifestDir {
    /// [`ManifestDir::rescan`], handing the updates to `sink` as they are read
    /// rather than returning them: on the first scan, each object as soon as its
    /// document is parsed (files parsed by reader threads, taken in path order while
    /// the caller takes the objects); later, all at once at the end.
    pub fn rescan_into(
        &mut self,
        sink: &mut dyn FnMut(SourceUpdate),
    ) -> anyhow::Result<RescanResult> {
        if !self.files.is_empty() || !self.yielded.is_empty() || !self.file_errors.is_empty() {
            let mut result = self.rescan()?;
            for update in result.updates.drain(..) {
                sink(update);
            }
            return Ok(result);
        }
        let listing = list_files(&self.root)?;
        let paths: Vec<&Path> = listing.files.iter().map(|(p, _)| p.as_path()).collect();
        let mut first = First::default();
        read_in_order(&paths, &read_manifest_each, &mut |i, read| {
            let (path, meta) = &listing.files[i];
            match read {
                Read::Object(o, d) => first.object(path, o, d, sink),
                Read::Done(done) => {
                    self.reads += 1;
                    match done {
                        Ok(errors) => {
                            let stamp = meta.as_ref().and_then(|m| Stamp::settled(m, self.settle));
                            let path = first.done(path);
                            if !errors.is_empty() {
                                let errors = errors.iter().map(|m| FileError::new(&path, m));
                                self.file_errors.insert(path.clone(), errors.collect());
                            }
                            if let Some(stamp) = stamp {
                                self.parsed.insert(path, stamp);
                            }
                        }
                        Err(message) => {
                            first.take_back(sink);
                            let path: Arc<Path> = Arc::from(path.as_path());
                            let message = format!("{message}; its previous objects stay in force");
                            self.file_errors
                                .insert(path.clone(), vec![FileError::new(&path, message)]);
                        }
                    }
                }
            }
        });
        let mut errors = listing.errors.clone();
        errors.extend(self.file_errors.values().flatten().cloned());
        errors.extend(first.passed_over);
        self.files = first.files.into_iter().collect();
        self.order = first.order;
        self.yielded = first.yielded;
        self.tree = listing.simple.then(|| Tree {
            dirs: listing.dirs,
            errors: listing.errors,
        });
        Ok(self.finish(errors, Vec::new(), false))
    }
}

/// How a reader reads one file ([`read_manifest_each`]; a stand-in in tests).
type ReadFile<'a> =
    dyn Fn(&Path, &mut dyn FnMut(ManifestObject)) -> Result<Vec<String>, ReadError> + Sync + 'a;

/// Files a reader may start before `take` has finished the earlier ones: with
/// none, two readers faster than the state ran ahead by any number of files (a
/// file of up to [`AHEAD`] objects never waits on its channel), and the peak of a
/// 100k-Service cold start went from 318 to 512 MiB by how the threads happened
/// to be scheduled.
const FILES_AHEAD: usize = MAX_READERS + 2;

/// Each file's objects (then its end) to `take`, file after file in `paths`' order,
/// while up to [`MAX_READERS`] threads parse the files in turn, each at most
/// [`AHEAD`] objects ahead of `take` through a channel of the file's own, and
/// [`FILES_AHEAD`] files at most begun and not yet taken.
fn read_in_order(paths: &[&Path], read_file: &ReadFile<'_>, take: &mut dyn FnMut(usize, Read)) {
    // A token per file that may be begun: a reader takes one before a file, and
    // `take` gives it back once the file is through.
    let (tokens, token) = mpsc::sync_channel::<()>(FILES_AHEAD);
    for _ in 0..FILES_AHEAD {
        let _ = tokens.send(());
    }
    let token = std::sync::Mutex::new(token);
    let (senders, receivers): (Vec<_>, Vec<_>) = paths
        .iter()
        .map(|_| mpsc::sync_channel::<Vec<Read>>(AHEAD / BATCH))
        .unzip();
    let senders: Vec<std::sync::Mutex<Option<mpsc::SyncSender<Vec<Read>>>>> = senders
        .into_iter()
        .map(|s| std::sync::Mutex::new(Some(s)))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let readers = thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, MAX_READERS);
    thread::scope(|scope| {
        for _ in 0..readers {
            scope.spawn(|| loop {
                if token
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .recv()
                    .is_err()
                {
                    return;
                }
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let (Some(path), Some(slot)) = (paths.get(i), senders.get(i)) else {
                    return;
                };
                let Some(tx) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() else {
                    continue;
                };
                let mut batch = Vec::with_capacity(BATCH);
                let done = read_file(path, &mut |o| {
                    let d = digest(&o.object);
                    batch.push(Read::Object(o, d));
                    if batch.len() == BATCH {
                        let _ = tx.send(std::mem::replace(&mut batch, Vec::with_capacity(BATCH)));
                    }
                });
                batch.push(Read::Done(done));
                let _ = tx.send(batch);
            });
        }
        for (i, rx) in receivers.into_iter().enumerate() {
            // The file's objects, until its end (or its reader's, should it panic).
            'file: while let Ok(reads) = rx.recv() {
                for read in reads {
                    let end = matches!(read, Read::Done(_));
                    take(i, read);
                    if end {
                        break 'file;
                    }
                }
            }
            // Never full: a token is given back only for one taken.
            let _ = tokens.try_send(());
        }
    });
}

/// The first scan's record, file by file.
#[derive(Default)]
struct First {
    /// Files done, in path order, with their entries.
    order: Vec<Arc<Path>>,
    files: Vec<(Arc<Path>, Vec<Entry>)>,
    /// Each key's first definition: file (in `order`, or the file being read when
    /// past its end) and entry.
    wanted: HashMap<ObjectKey, (usize, usize)>,
    yielded: BTreeMap<ObjectKey, (Digest, Arc<Path>)>,
    /// The file being read: its entries, and the keys it handed on.
    entries: Vec<Entry>,
    handed_on: Vec<ObjectKey>,
    /// The definitions passed over, of the files done and of the one being read
    /// (from `pending_from` on).
    passed_over: Vec<FileError>,
    pending_from: usize,
}

impl First {
    /// One object of the file at `path`: handed on if it is the first definition
    /// of its key, else noted as passed over.
    fn object(
        &mut self,
        path: &Path,
        o: ManifestObject,
        digest: Digest,
        sink: &mut dyn FnMut(SourceUpdate),
    ) {
        let fi = self.order.len();
        // The entry outlives the parse: its strings are copied on this thread
        // rather than moved from the reader's, whose allocator arena they would
        // otherwise pin among the freed objects parsed beside them (`svcproxy dns`
        // at bench-dns scale: 49.5 MiB resident with the copies, 51 MiB without,
        // two runs each).
        let ManifestObject {
            key,
            object,
            at,
            mirrored_from,
        } = o;
        let entry = Entry {
            key: key.clone(),
            at: at.as_str().to_owned(),
            mirrored_from: mirrored_from.clone(),
            digest,
            object: None,
        };
        let ei = self.entries.len();
        match self.wanted.get(&entry.key) {
            Some(&(first_fi, first_ei)) => {
                let (first_path, first_at) = if first_fi == fi {
                    (None, &self.entries[first_ei].at)
                } else {
                    let (p, entries) = &self.files[first_fi];
                    (Some(p), &entries[first_ei].at)
                };
                let message = passed_over(&entry, first_path, first_at);
                self.passed_over.push(FileError::new(path, message));
            }
            None => {
                self.wanted.insert(entry.key.clone(), (fi, ei));
                self.handed_on.push(entry.key.clone());
                sink(SourceUpdate::Upsert {
                    object: Arc::try_unwrap(object).unwrap_or_else(|o| (*o).clone()),
                    origin: path.display().to_string(),
                });
            }
        }
        self.entries.push(entry);
    }

    /// The file at `path` parsed: its entries are kept, and what it handed on is
    /// recorded as yielded. Returns its shared path.
    fn done(&mut self, path: &Path) -> Arc<Path> {
        let path: Arc<Path> = Arc::from(path);
        let fi = self.order.len();
        let entries = std::mem::take(&mut self.entries);
        for key in self.handed_on.drain(..) {
            let (_, ei) = self.wanted[&key];
            self.yielded.insert(key, (entries[ei].digest, path.clone()));
        }
        debug_assert!(self.wanted.values().all(|(f, _)| *f <= fi));
        self.order.push(path.clone());
        self.files.push((path.clone(), entries));
        self.pending_from = self.passed_over.len();
        path
    }

    /// The file being read is unusable: what it handed on is taken back, and
    /// nothing of it counts.
    fn take_back(&mut self, sink: &mut dyn FnMut(SourceUpdate)) {
        for key in self.handed_on.drain(..) {
            self.wanted.remove(&key);
            sink(SourceUpdate::Delete(key));
        }
        self.entries.clear();
        self.passed_over.truncate(self.pending_from);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// However slow the state is, the readers begin no more than [`FILES_AHEAD`]
    /// files past the one it is taking, and every file's objects come in path
    /// order, each file whole.
    #[test]
    fn readers_stay_a_few_files_ahead_of_a_slow_state() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: NAME, namespace: ns}\n\
            spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n";
        let names: Vec<std::path::PathBuf> =
            (0..40).map(|i| format!("f{i:02}.yaml").into()).collect();
        let paths: Vec<&Path> = names.iter().map(|p| p.as_path()).collect();
        let begun = AtomicUsize::new(0);
        let read = |path: &Path, emit: &mut dyn FnMut(ManifestObject)| {
            begun.fetch_add(1, Ordering::SeqCst);
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let text = text.replace("NAME", &name);
            svcproxy_core::manifest::parse_each(&text, manifest::Format::Yaml, "t", emit)
                .map_err(ReadError::from)
        };
        let mut seen = Vec::new();
        let mut most_ahead = 0;
        read_in_order(&paths, &read, &mut |i, r| {
            // File i is being taken: i + 1 begun so far at the least.
            most_ahead = most_ahead.max(begun.load(Ordering::SeqCst) - (i + 1));
            std::thread::sleep(std::time::Duration::from_millis(2));
            if let Read::Object(o, _) = r {
                seen.push((i, o.key.name.to_string()));
            }
        });
        let want: Vec<(usize, String)> = (0..40).map(|i| (i, format!("f{i:02}"))).collect();
        assert_eq!(seen, want);
        assert!(most_ahead <= FILES_AHEAD, "{most_ahead} files begun ahead");
        assert!(most_ahead >= 1, "the readers read ahead at all");
    }
}
