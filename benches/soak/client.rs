//! A soak client: one keep-alive HTTP connection sending `/query` requests
//! for prompts of the workload's documents, paced or back to back. Every
//! answer is checked (2xx, JSON, scores no deeper than the prompt) and
//! timed; the latencies of the current window are kept, bounded.

use super::workload::{Rng, Workload};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Latency samples kept per client and window; past it samples are dropped (and counted).
const SAMPLES_PER_WINDOW_MAX: usize = 1 << 20;
/// Error messages kept for the report.
const ERROR_MESSAGES_MAX: usize = 8;

/// What the reporter reads from a client.
#[derive(Default)]
pub struct ClientStats {
    /// Latencies of this window, in microseconds.
    pub samples_us: Mutex<Vec<u32>>,
    pub samples_dropped: AtomicU64,
    pub queries: AtomicU64,
    pub errors: AtomicU64,
    pub messages: Mutex<Vec<String>>,
}

impl ClientStats {
    fn error(&self, message: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut m = self.messages.lock();
        if m.len() < ERROR_MESSAGES_MAX {
            m.push(message);
        }
    }
}

/// Sends queries to `base` until `stop`; `per_s` 0 means back to back.
pub fn run(base: &str, model: &str, w: Workload, seed: u64, per_s: f64, stats: &ClientStats, stop: &AtomicBool) {
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(10)).max_idle_connections(1).build();
    let url = format!("{base}/query");
    let mut rng = Rng::new(seed);
    let mut tokens = Vec::new();
    let mut body = String::new();
    let period = (per_s > 0.0).then(|| Duration::from_secs_f64(1.0 / per_s));
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if let Some(p) = period {
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else if now - next > Duration::from_secs(1) {
                next = now;
            }
            next += p;
        }
        let doc = w.pick_doc(&mut rng);
        let blocks = 1 + rng.below(w.doc_len(doc) as u64) as u32;
        w.prompt(doc, blocks, rng.below(w.block_size as u64) as u32, &mut tokens);
        body.clear();
        body.push_str("{\"model_name\":\"");
        body.push_str(model);
        body.push_str("\",\"token_ids\":[");
        for (i, t) in tokens.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(&t.to_string());
        }
        body.push_str("]}");
        let started = Instant::now();
        let res = agent.post(&url).set("Content-Type", "application/json").send_string(&body);
        let text = match res {
            Ok(r) => r.into_string(),
            Err(ureq::Error::Status(code, r)) => {
                stats.error(format!("HTTP {code}: {}", r.into_string().unwrap_or_default()));
                continue;
            }
            Err(e) => {
                stats.error(format!("transport: {e}"));
                continue;
            }
        };
        let elapsed = started.elapsed();
        stats.queries.fetch_add(1, Ordering::Relaxed);
        match text.map_err(|e| e.to_string()).and_then(|t| check(&t, blocks * w.block_size)) {
            Ok(()) => {
                let mut s = stats.samples_us.lock();
                if s.len() < SAMPLES_PER_WINDOW_MAX {
                    s.push(elapsed.as_micros().min(u32::MAX as u128) as u32);
                } else {
                    stats.samples_dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => stats.error(format!("decode: {e}")),
        }
    }
}

/// A query answer must be JSON with a `scores` object of numbers within the prompt.
fn check(text: &str, prompt_tokens: u32) -> Result<(), String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("{e}: {text:.200}"))?;
    let scores = v.get("scores").and_then(|s| s.as_object()).ok_or_else(|| format!("no scores: {text:.200}"))?;
    for ranks in scores.values() {
        for score in ranks.as_object().ok_or("scores per rank are not an object")?.values() {
            match score.as_u64() {
                Some(s) if s <= prompt_tokens as u64 => {}
                _ => return Err(format!("score {score} for a {prompt_tokens}-token prompt")),
            }
        }
    }
    Ok(())
}
