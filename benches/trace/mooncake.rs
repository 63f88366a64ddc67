//! Reads a Mooncake trace (one JSON object a line) into requests.
//!
//! Each line is `{"timestamp": ms, "input_length": tokens, "output_length":
//! tokens, "hash_ids": [...]}`; every hash id stands for one block of
//! [`TRACE_BLOCK_TOKENS`] tokens, the last one possibly partial. The reader
//! checks each line once, here, so later stages can trust the values.

use serde::Deserialize;
use std::io::{BufRead, BufReader, Read};

/// Tokens that one trace hash id stands for (the public Mooncake traces use 512).
pub const TRACE_BLOCK_TOKENS: usize = 512;
/// Longest accepted line; a longer one is reported as an error, not read.
pub const TRACE_LINE_BYTES_MAX: usize = 4 << 20;
/// Most requests a trace may hold (after duplication too).
pub const TRACE_REQUESTS_MAX: usize = 20_000_000;
/// Most hash ids one request may hold (4M tokens at 512 tokens an id).
pub const REQUEST_HASH_IDS_MAX: usize = 8192;
/// Most output tokens one request may ask for.
pub const OUTPUT_TOKENS_MAX: u32 = 1 << 20;

/// One request of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRequest {
    pub timestamp_ms: u64,
    /// Prompt length in tokens, at most `hash_ids.len() * TRACE_BLOCK_TOKENS`.
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub hash_ids: Vec<u64>,
}

#[derive(Deserialize)]
struct Line {
    timestamp: u64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

/// Loads a trace; timestamps must not decrease. Errors name the line.
pub fn load(path: &str) -> Result<Vec<TraceRequest>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open trace {path}: {e}"))?;
    let mut reader = BufReader::new(file);
    let mut requests = Vec::new();
    let mut line = String::new();
    let mut line_no = 0usize;
    loop {
        line.clear();
        let n = reader
            .by_ref()
            .take(TRACE_LINE_BYTES_MAX as u64 + 1)
            .read_line(&mut line)
            .map_err(|e| format!("{path}: read error after line {line_no}: {e}"))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        if n > TRACE_LINE_BYTES_MAX {
            return Err(format!("{path}:{line_no}: line longer than {TRACE_LINE_BYTES_MAX} bytes"));
        }
        if line.trim().is_empty() {
            continue;
        }
        let parsed: Line =
            serde_json::from_str(&line).map_err(|e| format!("{path}:{line_no}: not a Mooncake trace line: {e}"))?;
        requests.push(check(parsed).map_err(|e| format!("{path}:{line_no}: {e}"))?);
        if requests.len() > TRACE_REQUESTS_MAX {
            return Err(format!("{path}: more than {TRACE_REQUESTS_MAX} requests"));
        }
        let k = requests.len();
        if k > 1 && requests[k - 1].timestamp_ms < requests[k - 2].timestamp_ms {
            return Err(format!("{path}:{line_no}: timestamp goes backwards"));
        }
    }
    if requests.is_empty() {
        return Err(format!("{path}: no requests"));
    }
    Ok(requests)
}

fn check(line: Line) -> Result<TraceRequest, String> {
    if line.hash_ids.is_empty() || line.hash_ids.len() > REQUEST_HASH_IDS_MAX {
        return Err(format!("hash_ids must hold 1..={REQUEST_HASH_IDS_MAX} ids, got {}", line.hash_ids.len()));
    }
    let covered = line.hash_ids.len() * TRACE_BLOCK_TOKENS;
    // The last id may be partial; an input_length beyond the ids is clamped
    // (there are no tokens for it), zero means "all the ids' tokens".
    let input = match line.input_length as usize {
        0 => covered,
        n => n.min(covered),
    };
    if line.output_length > OUTPUT_TOKENS_MAX as u64 {
        return Err(format!("output_length {} exceeds {OUTPUT_TOKENS_MAX}", line.output_length));
    }
    Ok(TraceRequest {
        timestamp_ms: line.timestamp,
        input_tokens: input as u32,
        output_tokens: line.output_length as u32,
        hash_ids: line.hash_ids,
    })
}

/// Makes `k` structurally identical copies of the trace with disjoint hash
/// spaces (copy `d` adds `d * (max_id + 1)` to every id); copies of one
/// request keep its timestamp and follow it directly.
pub fn duplicate(requests: &[TraceRequest], k: usize) -> Result<Vec<TraceRequest>, String> {
    if k <= 1 {
        return Ok(requests.to_vec());
    }
    if requests.len().saturating_mul(k) > TRACE_REQUESTS_MAX {
        return Err(format!("--dup {k} makes more than {TRACE_REQUESTS_MAX} requests"));
    }
    let max_id = requests.iter().flat_map(|r| r.hash_ids.iter().copied()).max().unwrap_or(0);
    let stride =
        max_id.checked_add(1).filter(|s| s.checked_mul(k as u64).is_some()).ok_or("hash ids too large to duplicate")?;
    let mut out = Vec::with_capacity(requests.len() * k);
    for r in requests {
        for d in 0..k as u64 {
            let mut copy = r.clone();
            copy.hash_ids.iter_mut().for_each(|h| *h += stride * d);
            out.push(copy);
        }
    }
    Ok(out)
}
