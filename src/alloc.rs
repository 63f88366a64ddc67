//! How the daemon asks glibc's allocator to give memory back.
//!
//! glibc gives threads up to eight arenas per core and returns an arena's
//! free memory to the OS only from its top, so what a burst frees (ingest
//! batches decoded and applied, index tables regrown, everything a clear
//! drops) stays resident, scattered over the arenas of whichever threads
//! allocated it. `benches/daemon_rss.rs` measured that at 2.3-3.5x the
//! index's own bytes after loading a million pairs. Two settings bring it
//! to about 1.5x (1.15x over the idle daemon):
//!
//! - at most one arena per core (`M_ARENA_MAX`), so free memory is not
//!   spread over arenas no thread uses any more;
//! - a thread that calls `malloc_trim(0)` every `TRIM_INTERVAL_S`, which
//!   returns every free page of every arena, not only their tops (about
//!   1 ms a call here, each arena locked in turn for part of it).
//!
//! Elsewhere than on glibc this does nothing.

/// Seconds between two trims.
pub const TRIM_INTERVAL_S: u64 = 10;

/// Applies the settings; call first thing, before other threads start.
/// Blocks SIGTERM and SIGINT in the calling thread (see `signals`).
pub fn configure() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let arenas = i32::try_from(cores).unwrap_or(i32::MAX);
        // SAFETY: mallopt takes plain integers and changes allocator settings only.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) };
        // The daemon waits for SIGTERM and SIGINT in one thread; every other
        // thread, this one included, must be spawned with them blocked.
        kv_indexer::signals::block();
        let trim = std::thread::Builder::new().name("malloc-trim".into()).spawn(|| loop {
            std::thread::sleep(std::time::Duration::from_secs(TRIM_INTERVAL_S));
            // SAFETY: malloc_trim only releases free pages; it takes no pointers.
            unsafe { libc::malloc_trim(0) };
        });
        // Without the thread the daemon runs as before, only holding more memory.
        drop(trim);
    }
}
