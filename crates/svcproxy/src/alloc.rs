//! The allocator's settings and its free pages handed back to the kernel.

/// Hands the allocator's free pages back to the kernel. glibc keeps what a burst
/// freed (the initial list's parsed objects, a full sync's rendered rules) as its
/// own: at 10k services x 10 endpoints the daemon held 142 MiB resident for 51 MiB
/// in use, 93 MiB after this. Called after the syncs that follow a burst; a walk of
/// the heaps, a few milliseconds.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub(crate) fn release_free_memory() {
    // SAFETY: malloc_trim only returns free pages to the kernel; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn release_free_memory() {}

/// Heap arenas glibc may make: as many as threads parse manifests at once
/// (`svcproxy_sources::manifests::MAX_READERS`). glibc gives every thread that allocates an
/// arena of its own (up to eight per core), and memory freed in one arena is not
/// reused by another: with the tokio workers decoding lists while the state is
/// built, unlimited arenas held 20 MiB more at 100k endpoints. One arena made the
/// two threads parsing a cold start's manifests queue on its lock (2.5 s against
/// 1.0 s with two, 10k services); two cost the daemon about 6 MiB after its first
/// sync at 10k services through the API (mimalloc, tried instead, 19 MiB).
/// `MALLOC_ARENA_MAX` in the environment still wins.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub(crate) fn limit_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        let arenas = i32::try_from(svcproxy_sources::manifests::MAX_READERS).unwrap_or(1);
        // SAFETY: mallopt only tunes the allocator; no other thread exists yet.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn limit_malloc_arenas() {}
