//! How the daemon gives freed memory back to the OS.
//!
//! glibc gives threads up to eight arenas per core and returns an arena's
//! free memory to the OS only from its top, so what a burst frees (ingest
//! batches decoded and applied, index tables regrown, everything a clear
//! drops) stays resident, scattered over the arenas of whichever threads
//! allocated it. `benches/daemon_rss.rs` measured that at 2.3-3.5x the
//! index's own bytes after loading a million pairs. Three settings bring
//! it to about 1.5x of the whole process (1.15x over the idle daemon), and
//! a cleared daemon to within a few MiB of an idle one:
//!
//! - at most one arena per core (`M_ARENA_MAX`), so free memory is not
//!   spread over arenas no thread uses any more; an operator's
//!   `MALLOC_ARENA_MAX` wins;
//! - a thread that every `CHECK_INTERVAL_MS` (doubled while nothing moved,
//!   up to `CHECK_INTERVAL_MAX_MS`: a look costs tens of ms at fleet size,
//!   5-10% of a core when taken every second) frees what the indexes
//!   unlinked and no reader can hold any more (`index::reclaim`: after a
//!   clear nothing else would, so it would stay allocated until the next
//!   events);
//! - then, once the arenas' free bytes (a clear, tables regrown) or the
//!   resident set (a load: the batches it decoded and freed dirtied pages
//!   that free chunks still hold, which the free bytes alone do not show
//!   when it all happens between two looks) moved by `TRIM_MOVED_BYTES`
//!   since the last look or the last trim, `malloc_trim(0)`, which returns
//!   every free page of every arena, not only their tops (about 1 ms a call
//!   here, each arena locked in turn for part of it). Comparing with the
//!   last look, not only the last trim, catches frees that landed while a
//!   trim ran. A daemon whose memory does not move never trims.
//!
//! Elsewhere than on glibc this does nothing.

/// Milliseconds between two looks at the allocator after memory moved.
pub const CHECK_INTERVAL_MS: u64 = 1_000;
/// Longest pause between two looks, reached while memory stays put.
pub const CHECK_INTERVAL_MAX_MS: u64 = 16_000;

/// Bytes by which the arenas' free chunks or the resident set must have
/// moved, since the last look or the last trim, for a trim.
pub const TRIM_MOVED_BYTES: usize = 1 << 20;

/// Applies the settings; call first thing, before other threads start,
/// with the daemon's signals already blocked (`kv_indexer::command_line`
/// does both), since the trim thread inherits the mask.
pub fn configure() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let arenas = i32::try_from(cores).unwrap_or(i32::MAX);
            // SAFETY: mallopt takes plain integers and changes allocator settings only.
            unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) };
        }
        let trim = std::thread::Builder::new().name("malloc-trim".into()).spawn(trim_loop);
        // Without the thread the daemon runs as before, only holding more memory.
        drop(trim);
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_loop() {
    let mut last = Looked::now();
    let mut after_trim = Looked::now();
    let mut interval = CHECK_INTERVAL_MS;
    loop {
        std::thread::sleep(std::time::Duration::from_millis(interval));
        kv_indexer::index::reclaim();
        let now = Looked::now();
        // Against the last look: frees that landed while the last trim ran
        // (a clear under way) count now. Against the last trim: slow drift.
        if now.moved_from(&last) || now.moved_from(&after_trim) {
            // SAFETY: malloc_trim only releases free pages; it takes no pointers.
            unsafe { libc::malloc_trim(0) };
            after_trim = Looked::now();
            interval = CHECK_INTERVAL_MS;
        } else {
            interval = (interval * 2).min(CHECK_INTERVAL_MAX_MS);
        }
        last = now;
    }
}

/// What the trim thread sees of the process at one look.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
struct Looked {
    /// Bytes in the arenas' free chunks, resident or trimmed (mmapped chunks
    /// are never free).
    free_bytes: usize,
    /// The process's resident set (0 if /proc cannot be read).
    resident_bytes: usize,
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
impl Looked {
    fn now() -> Looked {
        // SAFETY: mallinfo2 takes no arguments and only reads the allocator's state.
        let free_bytes = unsafe { libc::mallinfo2() }.fordblks;
        // statm: total and resident pages, then more.
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let pages = statm.split_whitespace().nth(1).and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
        // SAFETY: sysconf has no preconditions.
        let page_bytes = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        Looked { free_bytes, resident_bytes: pages.saturating_mul(page_bytes) }
    }

    /// Whether the arenas' free bytes or the resident set differ from `then`'s
    /// by `TRIM_MOVED_BYTES` or more.
    fn moved_from(&self, then: &Looked) -> bool {
        self.free_bytes.abs_diff(then.free_bytes) >= TRIM_MOVED_BYTES
            || self.resident_bytes.abs_diff(then.resident_bytes) >= TRIM_MOVED_BYTES
    }
}
