//! Reading and parsing files: bounded reads, the files shared out among reader
//! threads, a file's errors made safe for messages.

use super::*;

/// [`read_manifest`] of each path, in order, the files shared out among up to
/// [`MAX_READERS`] threads (parsing is most of a cold start).
pub(super) fn read_manifests(paths: &[&Path]) -> Vec<Result<Manifest, ReadError>> {
    let workers = thread::available_parallelism()
        .map_or(1, usize::from)
        .min(MAX_READERS)
        .min(paths.len());
    if workers <= 1 {
        return paths.iter().map(|p| read_manifest(p)).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, Result<Manifest, ReadError>)> = thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(path) = paths.get(i) else { break };
                        mine.push((i, read_manifest(path)));
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    done.sort_unstable_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// Threads that read manifests at once, at most (and the allocator's arenas,
/// `limit_malloc_arenas`: a reader without one of its own waits on another's).
pub const MAX_READERS: usize = 2;

/// Why a manifest file as a whole is unusable (its previous objects stay in force).
#[derive(Debug, thiserror::Error)]
pub(super) enum ReadError {
    #[error("cannot open: {0}")]
    Open(std::io::Error),
    #[error("cannot read: {0}")]
    Read(std::io::Error),
    #[error("larger than {} MiB; skipped", MAX_FILE_BYTES / (1024 * 1024))]
    TooLarge,
    #[error("not UTF-8: {0}")]
    NotUtf8(std::string::FromUtf8Error),
    #[error(transparent)]
    Parse(#[from] manifest::ManifestError),
}

/// Reads and parses one file. `Err` means the file as a whole is unusable.
pub(super) fn read_manifest(path: &Path) -> Result<Manifest, ReadError> {
    let (text, format) = read_text(path)?;
    Ok(manifest::parse(&text, format, &path.display().to_string())?)
}

/// [`read_manifest`], each object handed to `emit` as soon as its document is
/// parsed; returns the documents' errors. On `Err` the objects handed on are not
/// the file's.
pub(super) fn read_manifest_each(
    path: &Path,
    emit: &mut dyn FnMut(ManifestObject),
) -> Result<Vec<String>, ReadError> {
    let (text, format) = read_text(path)?;
    Ok(manifest::parse_each(
        &text,
        format,
        &path.display().to_string(),
        emit,
    )?)
}

/// A file's text (bounded) and its format, by its extension.
fn read_text(path: &Path) -> Result<(String, Format), ReadError> {
    let file = fs::File::open(path).map_err(ReadError::Open)?;
    let mut bytes = Vec::new();
    // Bounded read: the size seen when listing may not be the size now.
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Read)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(ReadError::TooLarge);
    }
    let text = String::from_utf8(bytes).map_err(ReadError::NotUtf8)?;
    let format = if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
    {
        Format::Json
    } else {
        Format::Yaml
    };
    Ok((text, format))
}

/// Bounded, single-line: parser messages can quote large or multi-line input.
pub(super) fn clean_message(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MAX_MESSAGE_CHARS));
    for (i, c) in message.chars().enumerate() {
        if i == MAX_MESSAGE_CHARS {
            out.push('…');
            break;
        }
        out.push(if c.is_control() { ' ' } else { c });
    }
    out
}
