//! One line per thing an operator acts on, to stderr. A global level switch;
//! `debug` adds detail.
//!
//! The line's form follows where stderr goes. Under systemd
//! (`JOURNAL_STREAM` names stderr's device and inode) each line starts with
//! a syslog priority, `<3>` error to `<7>` debug, which journald strips and
//! files, so `journalctl -p warning` works; journald stamps the time.
//! Anywhere else a line starts with a UTC timestamp. `--log-format json`
//! writes one JSON object a line (`ts`, `level`, `msg`), with the priority
//! prefix still in front under journald. A line is written with one call,
//! so lines from different threads never interleave.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How much to log.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

impl Level {
    const ALL: [Level; 4] = [Level::Error, Level::Warn, Level::Info, Level::Debug];

    /// Parses `error`, `warn` (or `warning`), `info` or `debug`.
    pub fn parse(s: &str) -> Option<Level> {
        let s = s.to_ascii_lowercase();
        Level::ALL.into_iter().find(|l| l.name() == s || (*l == Level::Warn && s == "warning"))
    }

    fn name(self) -> &'static str {
        ["error", "warn", "info", "debug"][self as usize]
    }

    fn tag(self) -> &'static str {
        ["ERROR", "WARN", "INFO", "DEBUG"][self as usize]
    }

    /// The syslog priority journald files the line under.
    fn syslog_priority(self) -> u8 {
        [3, 4, 6, 7][self as usize]
    }
}

/// The shape of a log line.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Format {
    /// `LEVEL message`, after a timestamp or a priority prefix.
    Text,
    /// `{"ts":..,"level":..,"msg":..}`.
    Json,
}

impl Format {
    /// Parses `text` or `json`.
    pub fn parse(s: &str) -> Option<Format> {
        [("text", Format::Text), ("json", Format::Json)]
            .into_iter()
            .find(|(n, _)| s.eq_ignore_ascii_case(n))
            .map(|f| f.1)
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);
static JSON: AtomicBool = AtomicBool::new(false);
static JOURNAL: AtomicBool = AtomicBool::new(false);

/// Sets the global level.
pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

/// Sets level and format, and detects whether stderr is the journal.
pub fn init(level: Level, format: Format) {
    set_level(level);
    JSON.store(format == Format::Json, Ordering::Relaxed);
    let journal = std::env::var("JOURNAL_STREAM").ok().is_some_and(|v| stderr_is(&v));
    JOURNAL.store(journal, Ordering::Relaxed);
}

/// Whether `journal_stream` ("device:inode", as systemd sets it) is stderr.
/// A daemon started from a unit's shell inherits the variable with another
/// stderr; only the same stream counts.
fn stderr_is(journal_stream: &str) -> bool {
    let Some((dev, ino)) = journal_stream.split_once(':') else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    // SAFETY: fstat on fd 2 into a zeroed, correctly sized struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(2, &mut st) } != 0 {
        return false;
    }
    st.st_dev as u64 == dev && st.st_ino as u64 == ino
}

/// Whether lines at `level` are written.
pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Writes one line if `level` is enabled. Use the `error!`, `warn!`, `info!`, `debug!` macros.
pub fn write(level: Level, args: std::fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let format = if JSON.load(Ordering::Relaxed) { Format::Json } else { Format::Text };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let line = format_line(level, format, JOURNAL.load(Ordering::Relaxed), now.as_millis() as u64, &args.to_string());
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// One complete line, newline included. Newlines inside `msg` are escaped
/// so one event stays one line.
pub fn format_line(level: Level, format: Format, journal: bool, unix_ms: u64, msg: &str) -> String {
    let mut line = String::with_capacity(msg.len() + 48);
    if journal {
        line.push_str(&format!("<{}>", level.syslog_priority()));
    }
    match format {
        Format::Json => {
            let ts = serde_json::Value::String(rfc3339_utc_ms(unix_ms));
            let msg = serde_json::Value::String(msg.to_string());
            line.push_str(&format!("{{\"ts\":{ts},\"level\":\"{}\",\"msg\":{msg}}}", level.name()));
        }
        Format::Text => {
            if !journal {
                line.push_str(&rfc3339_utc_ms(unix_ms));
                line.push(' ');
            }
            line.push_str(level.tag());
            line.push(' ');
            line.push_str(&msg.replace('\n', "\\n"));
        }
    }
    line.push('\n');
    line
}

/// `2024-05-06T07:08:09.010Z` for milliseconds since the Unix epoch.
pub fn rfc3339_utc_ms(unix_ms: u64) -> String {
    let mut out = Vec::with_capacity(24);
    push_timestamp(&mut out, UNIX_EPOCH + Duration::from_millis(unix_ms), false);
    String::from_utf8(out).unwrap_or_default()
}

/// Writes `t` as RFC 3339 with milliseconds: `2025-01-02T03:04:05.678Z`, or
/// in local time with its offset, `2025-01-02T04:04:05.678+01:00`.
pub fn push_timestamp(out: &mut Vec<u8>, t: SystemTime, local_time: bool) {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (secs, millis) = (since.as_secs() as libc::time_t, since.subsec_millis());
    let convert = if local_time { libc::localtime_r } else { libc::gmtime_r };
    // SAFETY: a zeroed tm is valid; the _r variants write only into `tm`.
    // They fail only for years past i32, which then read as zeroed fields.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { convert(&secs, &mut tm) }.is_null() {
        tm = unsafe { std::mem::zeroed() };
    }
    let (year, month, day) = (tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday);
    let (hour, min, sec) = (tm.tm_hour, tm.tm_min, tm.tm_sec);
    let _ = write!(out, "{year:04}-{month:02}-{day:02}T{hour:02}:{min:02}:{sec:02}.{millis:03}");
    if !local_time {
        return out.push(b'Z');
    }
    let offset_min = tm.tm_gmtoff / 60;
    let sign = if offset_min < 0 { '-' } else { '+' };
    let _ = write!(out, "{sign}{:02}:{:02}", offset_min.abs() / 60, offset_min.abs() % 60);
}

/// The longest prefix of `s` of at most `max` bytes that ends on a char boundary.
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    &s[..(0..=max.min(s.len())).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0)]
}

/// Logs at error level.
macro_rules! error { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Error, format_args!($($t)*)) } }
/// Logs at warn level.
macro_rules! warn_ { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Warn, format_args!($($t)*)) } }
/// Logs at info level.
macro_rules! info { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Info, format_args!($($t)*)) } }
/// Logs at debug level.
macro_rules! debug { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Debug, format_args!($($t)*)) } }
// `warn` is also a built-in attribute's name, which a `use` of it cannot
// tell apart: the macro is defined as `warn_` and imported under its name.
pub(crate) use {debug, error, info, warn_ as warn};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_rfc3339() {
        assert_eq!(rfc3339_utc_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_utc_ms(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339_utc_ms(1_733_057_445_007), "2024-12-01T12:50:45.007Z");
        assert_eq!(rfc3339_utc_ms(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }

    #[test]
    fn utc_timestamps_are_rfc3339_with_millis() {
        let mut out = Vec::new();
        push_timestamp(&mut out, UNIX_EPOCH + Duration::from_millis(1_700_000_000_123), false);
        assert_eq!(String::from_utf8(out).unwrap(), "2023-11-14T22:13:20.123Z");
        let mut out = Vec::new();
        push_timestamp(&mut out, UNIX_EPOCH + Duration::from_millis(951_825_600_007), false);
        assert_eq!(String::from_utf8(out).unwrap(), "2000-02-29T12:00:00.007Z", "a leap day");
    }

    #[test]
    fn local_timestamps_carry_an_offset() {
        let mut out = Vec::new();
        push_timestamp(&mut out, UNIX_EPOCH + Duration::from_millis(1_700_000_000_123), true);
        let s = String::from_utf8(out).unwrap();
        assert_eq!(s.len(), "2023-11-14T22:13:20.123+00:00".len(), "{s}");
        assert!(matches!(&s[23..24], "+" | "-") && &s[26..27] == ":", "{s}");
    }

    #[test]
    fn long_strings_are_cut_on_a_char_boundary() {
        assert_eq!(truncate_utf8("aé", 2), "a");
        assert_eq!(truncate_utf8("aé", 3), "aé");
        assert_eq!(truncate_utf8("abc", 5), "abc");
        assert_eq!(truncate_utf8("é", 1), "");
        assert_eq!(truncate_utf8("", 0), "");
    }

    #[test]
    fn the_journal_gets_a_priority_and_no_timestamp() {
        assert_eq!(format_line(Level::Error, Format::Text, true, 0, "boom"), "<3>ERROR boom\n");
        assert_eq!(format_line(Level::Warn, Format::Text, true, 0, "w"), "<4>WARN w\n");
        assert_eq!(format_line(Level::Info, Format::Text, true, 0, "i"), "<6>INFO i\n");
        assert_eq!(format_line(Level::Debug, Format::Text, true, 0, "d"), "<7>DEBUG d\n");
    }

    #[test]
    fn a_terminal_gets_a_timestamp_and_one_line() {
        assert_eq!(
            format_line(Level::Warn, Format::Text, false, 1_000, "a\nb"),
            "1970-01-01T00:00:01.000Z WARN a\\nb\n"
        );
    }

    #[test]
    fn json_lines_parse_and_escape() {
        let line = format_line(Level::Warn, Format::Json, false, 1_000, "say \"hi\"\n");
        let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(v, serde_json::json!({"ts": "1970-01-01T00:00:01.000Z", "level": "warn", "msg": "say \"hi\"\n"}));
        let line = format_line(Level::Error, Format::Json, true, 0, "x");
        assert!(line.starts_with("<3>{\"ts\":"), "{line}");
    }

    #[test]
    fn journal_stream_must_name_stderr() {
        assert!(!stderr_is(""));
        assert!(!stderr_is("0:0"));
        assert!(!stderr_is("x:y"));
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::fstat(2, &mut st) }, 0);
        assert!(stderr_is(&format!("{}:{}", st.st_dev, st.st_ino)));
    }
}
