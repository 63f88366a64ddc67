//! The fleet bench's figures: printed as aligned text lines while the run
//! goes, and kept as JSON (`{section: {server: {figure: value}}}`) for
//! `--json`.

use serde_json::{json, Map, Value};

#[derive(Default)]
pub struct Report {
    pub json: Map<String, Value>,
}

pub const MIB: f64 = 1024.0 * 1024.0;

impl Report {
    /// Records `figure` of `server` in `section`, and prints it.
    pub fn put(&mut self, section: &str, server: &str, figure: &str, value: Value) {
        let shown = match &value {
            Value::Number(n) if n.is_f64() => format!("{:.2}", n.as_f64().unwrap_or(0.0)),
            Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        println!("{section:<9} {server:<8} {figure:<28} {shown}");
        let s = self.json.entry(section).or_insert_with(|| json!({}));
        let srv = s.as_object_mut().expect("object").entry(server).or_insert_with(|| json!({}));
        srv.as_object_mut().expect("object").insert(figure.to_string(), value);
    }

    pub fn mib(&mut self, section: &str, server: &str, figure: &str, bytes: u64) {
        self.put(section, server, &format!("{figure}_mib"), json!(bytes as f64 / MIB));
    }

    pub fn secs(&mut self, section: &str, server: &str, figure: &str, s: f64) {
        self.put(section, server, &format!("{figure}_s"), json!(s));
    }

    pub fn note(&mut self, section: &str, server: &str, text: &str) {
        self.put(section, server, "note", json!(text));
    }

    /// The load average now, recorded in `section`.
    pub fn load(&mut self, section: &str) {
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let three: Vec<&str> = load.split_whitespace().take(3).collect();
        self.put(section, "machine", "loadavg", json!(three.join(" ")));
    }
}
