//! The file's text to entries: one `/register` body a line, read by the
//! same parser as `/register` (so a line is refused exactly when the
//! request would be), and checked against the other lines: no key
//! (instance, dp rank) twice, no instance under two (model, tenant), no
//! (model, tenant) with two block sizes. Blank lines and lines whose
//! first non-blank character is `#` are skipped.

use crate::event::WorkerId;
use crate::http::codec::parse_register;
use crate::ingest::LISTENERS_MAX;
use crate::registry::RegisterArgs;
use rustc_hash::FxHashMap;

/// Largest file read, in bytes: 4,096 entries of some 300 bytes with room
/// for comments.
pub const WORKERS_FILE_BYTES_MAX: usize = 4 << 20;

/// One registration the file asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// 1-based line number, for messages.
    pub line: usize,
    pub args: RegisterArgs,
}

/// Reads every entry of `text`; an error names the line (1-based) and why.
pub fn parse(text: &[u8]) -> Result<Vec<Entry>, (usize, String)> {
    if text.len() > WORKERS_FILE_BYTES_MAX {
        return Err((0, format!("the file is larger than {WORKERS_FILE_BYTES_MAX} bytes")));
    }
    let mut out: Vec<Entry> = Vec::new();
    let mut seen = Seen::default();
    for (i, raw) in text.split(|&b| b == b'\n').enumerate() {
        let line = i + 1;
        let body = raw.trim_ascii();
        if body.is_empty() || body.starts_with(b"#") {
            continue;
        }
        let args = parse_register(body).map_err(|e| (line, e.message().to_string()))?;
        if out.len() == LISTENERS_MAX {
            return Err((line, format!("more than {LISTENERS_MAX} entries, the most a daemon runs")));
        }
        seen.check(line, &args).map_err(|why| (line, why))?;
        out.push(Entry { line, args });
    }
    Ok(out)
}

/// What the earlier lines hold, by what a later one must agree with.
#[derive(Default)]
struct Seen {
    keys: FxHashMap<WorkerId, usize>,
    instances: FxHashMap<u64, (String, String, usize)>,
    block_sizes: FxHashMap<(String, String), (u32, usize)>,
}

impl Seen {
    /// Whether `args` on `line` agrees with the lines before it; records it if so.
    fn check(&mut self, line: usize, args: &RegisterArgs) -> Result<(), String> {
        let (model, tenant) = (&args.model_name, &args.tenant_id);
        if let Some(at) = self.keys.get(&args.worker()) {
            return Err(format!(
                "instance {} dp_rank {} is listed already on line {at}",
                args.instance_id, args.dp_rank
            ));
        }
        if let Some((m, t, at)) = self.instances.get(&args.instance_id).filter(|(m, t, _)| (m, t) != (model, tenant)) {
            return Err(format!(
                "instance {} is under model={m:?} tenant={t:?} on line {at}; an instance serves one (model, tenant)",
                args.instance_id
            ));
        }
        let index = (model.clone(), tenant.clone());
        if let Some((size, at)) = self.block_sizes.get(&index).filter(|(size, _)| *size != args.block_size) {
            return Err(format!(
                "model={model:?} tenant={tenant:?} has block_size {size} on line {at}, not {}",
                args.block_size
            ));
        }
        self.keys.insert(args.worker(), line);
        self.instances.entry(args.instance_id).or_insert_with(|| (model.clone(), tenant.clone(), line));
        self.block_sizes.entry(index).or_insert((args.block_size, line));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(instance: u64, rank: u32, model: &str, block_size: u32) -> String {
        format!(
            r#"{{"instance_id":{instance},"dp_rank":{rank},"endpoint":"tcp://127.0.0.1:{}","model_name":"{model}","block_size":{block_size}}}"#,
            5000 + instance
        )
    }

    #[test]
    fn entries_skip_blanks_and_comments_and_keep_their_lines() {
        let text = format!(
            "# engines\n\n{}\r\n   \n  # off: {}\n{}\n",
            line(1, 0, "m", 16),
            line(9, 0, "m", 16),
            line(2, 1, "m", 16)
        );
        let entries = parse(text.as_bytes()).unwrap();
        let got: Vec<(usize, u64, u32)> =
            entries.iter().map(|e| (e.line, e.args.instance_id, e.args.dp_rank)).collect();
        assert_eq!(got, [(3, 1, 0), (6, 2, 1)]);
        assert_eq!(entries[0].args.tenant_id, "default");
        assert_eq!(parse(b"").unwrap(), []);
    }

    #[test]
    fn a_bad_line_is_named_with_why() {
        let ok = line(1, 0, "m", 16);
        let cases = [
            (format!("{ok}\n{{\"instance_id\":2"), 2, "EOF"),
            (format!("{ok}\n\n{}", line(2, 0, "m", 0)), 3, "block_size"),
            (format!("{ok}\n{}", line(1, 0, "m", 16)), 2, "listed already on line 1"),
            (format!("{ok}\n{}", line(1, 1, "other", 16)), 2, "instance 1 is under model=\"m\""),
            (format!("{ok}\n{}", line(2, 0, "m", 32)), 2, "has block_size 16 on line 1"),
            (format!("{ok}\n{}", ok.replace("tcp://127.0.0.1:5001", "tcp://*:5557")), 2, "tcp://*:5557"),
            (format!("{ok}\n[1,2]"), 2, "JSON object"),
            ("{\"instance_id\":1} trailing".to_string(), 1, ""),
        ];
        for (text, want_line, want) in cases {
            let (at, why) = parse(text.as_bytes()).unwrap_err();
            assert_eq!(at, want_line, "{text}: {why}");
            assert!(why.contains(want), "{text}: {why}");
        }
        let (_, why) = parse(b"\xff\n").unwrap_err();
        assert!(!why.is_empty());
        let big = vec![b' '; WORKERS_FILE_BYTES_MAX + 1];
        assert_eq!(parse(&big).unwrap_err().0, 0);
    }

    #[test]
    fn entries_past_the_listener_cap_are_refused() {
        let text: String = (0..=LISTENERS_MAX as u64).map(|i| line(i, 0, "m", 16) + "\n").collect();
        let (at, why) = parse(text.as_bytes()).unwrap_err();
        assert_eq!(at, LISTENERS_MAX + 1, "{why}");
    }
}
