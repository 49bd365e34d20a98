//! The directory walk: which files are manifests (`*.yaml`, `*.yml`, `*.json`,
//! symlinks followed, depth and count bounded), in path order, and what
//! identifies a file's content without reading it ([`Stamp`]).

use super::*;

/// A file changed less than this long ago is read again at every rescan.
pub(super) const STAMP_AGE: Duration = Duration::from_millis(100);

/// What identifies a file's content without reading it: any write changes its
/// change time (and usually its size and modification time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    /// The file's stamp, when its last change is old enough: a file changed more
    /// recently might change again within the same timestamp (file times tick at
    /// the kernel's coarse clock, a few milliseconds), unseen.
    pub(super) fn settled(m: &fs::Metadata, settle: Duration) -> Option<Stamp> {
        let settle = settle.max(STAMP_AGE);
        use std::os::unix::fs::MetadataExt as _;
        let changed = std::time::UNIX_EPOCH
            + Duration::new(
                u64::try_from(m.ctime()).ok()?,
                u32::try_from(m.ctime_nsec()).ok()?,
            );
        let age = std::time::SystemTime::now().duration_since(changed).ok()?;
        (age >= settle).then_some(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

// ---------------------------------------------------------------------------
// Listing

pub(super) struct Listing {
    /// Candidate files, sorted, each reachable file once, with what `stat` said
    /// of it when listed (`None`: it could not be, e.g. a dangling symlink).
    pub(super) files: Vec<(PathBuf, Option<fs::Metadata>)>,
    pub(super) errors: Vec<FileError>,
    pub(super) unreadable_dirs: Vec<PathBuf>,
    /// Every directory walked, the root included, by its listed path.
    pub(super) dirs: HashSet<PathBuf>,
    /// No symlink, no unreadable directory, no file reached twice: each listed
    /// path is the one name of its file (see [`Tree`]).
    pub(super) simple: bool,
}

pub(super) fn is_manifest_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.ends_with(".yaml") || lower.ends_with(".yml") || lower.ends_with(".json")
}

/// Lists manifest files under `root`, following symlinks (ConfigMap volumes are made
/// of them) but entering each real directory once, which also stops symlink loops.
/// One `stat` per manifest file (its result is the rescan's stamp) and none for other
/// regular files: a directory of 20,000 files is listed on every burst of events.
pub(super) fn list_files(root: &Path) -> anyhow::Result<Listing> {
    let canonical_root = fs::canonicalize(root)
        .with_context(|| format!("cannot open manifests directory {}", root.display()))?;
    let top = read_sorted_dir(root)
        .with_context(|| format!("cannot read manifests directory {}", root.display()))?;

    let mut listing = Listing {
        files: Vec::new(),
        errors: Vec::new(),
        unreadable_dirs: Vec::new(),
        dirs: HashSet::from([root.to_path_buf()]),
        simple: !fs::symlink_metadata(root).is_ok_and(|m| m.file_type().is_symlink()),
    };
    let mut visited: HashSet<PathBuf> = HashSet::from([canonical_root]);
    // Depth-first, children pushed in reverse so they are visited in name order.
    let mut stack: Vec<(PathBuf, Option<fs::FileType>, usize)> =
        top.into_iter().rev().map(|(p, t)| (p, t, 1)).collect();
    while let Some((path, file_type, depth)) = stack.pop() {
        let Some(name) = path.file_name().map(|n| n.to_string_lossy()) else {
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        let manifest_name = is_manifest_name(&name);
        if file_type.is_none_or(|t| t.is_symlink()) {
            listing.simple = false;
        }
        // The directory entry's own type (no system call): only a regular file that
        // is not a manifest can be passed over without a `stat`.
        if !manifest_name && file_type.is_some_and(|t| t.is_file()) {
            continue;
        }
        // Follows symlinks; a dangling one fails here.
        let meta = match fs::metadata(&path) {
            Ok(m) => m,
            Err(e) => {
                if manifest_name {
                    // Listed so that reading it reports the problem and keeps what
                    // it yielded before.
                    listing.files.push((path, None));
                } else {
                    tracing::debug!(path = %path.display(), "skipping unreadable entry: {e}");
                }
                continue;
            }
        };
        if meta.is_dir() {
            if let Some(children) = enter_dir(&mut listing, &mut visited, path, depth) {
                stack.extend(children.into_iter().rev().map(|(p, t)| (p, t, depth + 1)));
            }
        } else if manifest_name {
            if meta.is_file() {
                listing.files.push((path, Some(meta)));
            } else {
                // Opening a FIFO or a device would block or never end.
                listing
                    .errors
                    .push(FileError::new(&path, "not a regular file; skipped"));
            }
        }
    }

    listing.files.sort_by(|a, b| a.0.cmp(&b.0));
    // A file reached through two paths (a symlink to a sibling, a hard link) is
    // read once, under its first path, rather than reported as a duplicate of
    // itself: the same file is the same device and inode.
    let mut seen = HashSet::new();
    let listed = listing.files.len();
    listing.files.retain(|(_, meta)| {
        use std::os::unix::fs::MetadataExt as _;
        meta.as_ref()
            .is_none_or(|m| seen.insert((m.dev(), m.ino())))
    });
    listing.simple &= listing.files.len() == listed && listing.unreadable_dirs.is_empty();
    Ok(listing)
}

/// A directory met at `depth`: its entries in name order, unless it is too deep,
/// already read (through a symlink) or unreadable (each said in `listing`).
fn enter_dir(
    listing: &mut Listing,
    visited: &mut HashSet<PathBuf>,
    path: PathBuf,
    depth: usize,
) -> Option<Vec<(PathBuf, Option<fs::FileType>)>> {
    if depth > MAX_DEPTH {
        listing.errors.push(FileError::new(
            &path,
            format!("nested more than {MAX_DEPTH} directories deep; skipped"),
        ));
        return None;
    }
    match fs::canonicalize(&path) {
        Ok(real) => {
            if !visited.insert(real) {
                tracing::debug!(path = %path.display(), "directory already read (symlink); skipped");
                return None;
            }
        }
        Err(e) => {
            listing.errors.push(FileError::new(
                &path,
                format!("cannot resolve directory: {e}"),
            ));
            listing.unreadable_dirs.push(path);
            return None;
        }
    }
    match read_sorted_dir(&path) {
        Ok(children) => {
            listing.dirs.insert(path);
            Some(children)
        }
        Err(e) => {
            listing
                .errors
                .push(FileError::new(&path, format!("cannot read directory: {e}")));
            listing.unreadable_dirs.push(path);
            None
        }
    }
}

/// A directory's entries in name order, each with its type when the directory
/// listing tells it (`d_type`).
pub(super) fn read_sorted_dir(dir: &Path) -> std::io::Result<Vec<(PathBuf, Option<fs::FileType>)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        out.push((entry.file_name(), entry.path(), entry.file_type().ok()));
    }
    // Siblings: their names' bytes order them as their paths' components would,
    // without parsing the paths at each comparison.
    out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(out.into_iter().map(|(_, path, t)| (path, t)).collect())
}

// ---------------------------------------------------------------------------
// Reading one file

/// Whether `path` was modified less than `window` ago (a modification time in the
/// future, a clock step, counts as settled: it must not hold the file back forever).
pub(super) fn written_within(m: &fs::Metadata, window: Duration) -> bool {
    m.modified()
        .ok()
        .and_then(|t| std::time::SystemTime::now().duration_since(t).ok())
        .is_some_and(|age| age < window)
}
