//! The usual `process_*` metrics (as Prometheus client libraries export
//! them), read from /proc at scrape time, and `kv_indexer_build_info`.
//! Linux only, like the rest of the daemon; a figure /proc does not give is
//! left out rather than written as 0.

use crate::metrics::Prom;

/// Writes `kv_indexer_build_info` and the process families into `p`.
pub fn render(p: &mut Prom) {
    p.family("kv_indexer_build_info", "gauge", "Always 1; the labels name the running build.");
    p.sample("kv_indexer_build_info", &[("version", crate::version())], 1.0);
    if let Some(s) = read_stat() {
        p.single("process_cpu_seconds_total", "counter", "User and system CPU time spent, in seconds.", s.cpu_seconds);
        if let Some(start) = s.start_time_seconds {
            p.single(
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since the Unix epoch, in seconds.",
                start,
            );
        }
        p.single("process_virtual_memory_bytes", "gauge", "Virtual memory size, in bytes.", s.virtual_bytes);
        p.single("process_resident_memory_bytes", "gauge", "Resident memory size, in bytes.", s.resident_bytes);
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        // The directory handle itself is one of the entries.
        let open = dir.count().saturating_sub(1);
        p.single("process_open_fds", "gauge", "Open file descriptors.", open as f64);
    }
    if let Some(max) = max_fds() {
        p.single("process_max_fds", "gauge", "Most open file descriptors allowed (soft limit).", max);
    }
}

struct Stat {
    cpu_seconds: f64,
    start_time_seconds: Option<f64>,
    virtual_bytes: f64,
    resident_bytes: f64,
}

fn read_stat() -> Option<Stat> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_stat(&text, sysconf(libc::_SC_CLK_TCK)?, sysconf(libc::_SC_PAGESIZE)?, boot_time_seconds())
}

/// Parses /proc/self/stat. Fields after the command name (which may hold
/// spaces and parentheses, hence the last `)`): utime 14, stime 15,
/// starttime 22, vsize 23, rss 24 (1-based, as in proc(5)).
fn parse_stat(text: &str, ticks_per_s: f64, page_bytes: f64, boot_s: Option<f64>) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state).
    let field = |n: usize| f.get(n - 3).and_then(|v| v.parse::<f64>().ok());
    Some(Stat {
        cpu_seconds: (field(14)? + field(15)?) / ticks_per_s,
        start_time_seconds: boot_s.and_then(|b| Some(b + field(22)? / ticks_per_s)),
        virtual_bytes: field(23)?,
        resident_bytes: field(24)? * page_bytes,
    })
}

fn sysconf(name: libc::c_int) -> Option<f64> {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(name) };
    (v > 0).then_some(v as f64)
}

/// Boot time from /proc/stat's `btime` line.
fn boot_time_seconds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    text.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()
}

fn max_fds() -> Option<f64> {
    let mut lim: libc::rlimit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into `lim`, ours.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(lim.rlim_cur as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_the_command_name() {
        let line = "4242 (kv (indexer) x) S 1 2 3 4 5 6 7 8 9 10 150 50 0 0 20 0 9 0 1000 104857600 2560 rest";
        let s = parse_stat(line, 100.0, 4096.0, Some(1_700_000_000.0)).unwrap();
        assert_eq!(s.cpu_seconds, 2.0);
        assert_eq!(s.start_time_seconds, Some(1_700_000_010.0));
        assert_eq!(s.virtual_bytes, 104_857_600.0);
        assert_eq!(s.resident_bytes, 2560.0 * 4096.0);
    }

    #[test]
    fn this_process_has_figures() {
        let mut p = Prom::default();
        render(&mut p);
        for name in [
            "process_resident_memory_bytes ",
            "process_cpu_seconds_total ",
            "process_open_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(p.text.contains(name), "{name} missing:\n{}", p.text);
        }
        assert!(p.text.contains(&format!("kv_indexer_build_info{{version=\"{}\"}} 1\n", crate::version())));
    }
}
