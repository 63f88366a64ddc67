//! The `/query` response and the small status bodies, written straight into
//! the caller's buffer.
//!
//! Shape, as Dynamo 1.6.1's indexer service builds it (`ScoreResponse`):
//!
//! ```text
//! {"scores":{"<instance>":{"<rank>":device_tokens}},
//!  "frequencies":[],
//!  "instances":{"<instance>":{"longest_matched":t,"gpu":t,"dp":{"<rank>":t},"cpu":t,"disk":t}}}
//! ```
//!
//! - `scores`: the device-tier view; only ranks with a nonzero device match
//!   appear, and an instance appears only if one of its ranks does.
//! - `frequencies`: Dynamo declares it (block access counts) but no index of
//!   its 1.6.1 ever fills it, so its service always answers `[]`; so do we.
//! - `instances`: every instance with a match in any tier. `dp` lists each
//!   such rank's device tokens (0 when it matched only in a lower tier);
//!   `gpu`, `cpu`, `disk` are maxima over the ranks of the cumulative
//!   depths (gpu <= cpu <= disk), `longest_matched` the largest of the three.
//!   Dynamo's service lists no worker that matched nothing; a caller may
//!   pass `registered` workers to list them with zeros anyway (Dynamo's
//!   summary builder supports that as "expected workers", unused by its
//!   service).
//! - All values are tokens: blocks times `block_size`, as u64 (no
//!   saturation at u32 as in Dynamo; it cannot be reached with real depths).
//! - Order: instances and ranks ascending (Dynamo's is hash-map order).
//! - `predicted` (ours, absent in Dynamo's shape): the deepest prefix any
//!   rank of the instance holds on its device or is predicted to hold
//!   (`crate::predict`), written only when it passes `gpu`; an instance
//!   with only a prediction is listed with zeros elsewhere.

use crate::event::WorkerId;
use crate::index::Matches;
use crate::json::out::{push_str, push_u64, push_u64_key};
use crate::predict::Predicted;
use std::cell::Cell;

/// One worker's depths, in blocks, and whether it came from the matches.
#[derive(Clone, Copy)]
struct Row {
    worker: WorkerId,
    /// 0 for a match, 1 for a registered worker added with zeros, 2 for a
    /// prediction; sorts matches first.
    padding: u8,
    device: u32,
    host: u32,
    disk: u32,
    /// Predicted depth (0: none).
    predicted: u32,
}

thread_local! {
    /// Reused per HTTP thread so a response allocates nothing once warm.
    static ROWS: Cell<Vec<Row>> = const { Cell::new(Vec::new()) };
}

/// Writes the `/query` (and `/query_by_hash`) response for `matches` of a
/// query of `query_blocks` blocks in an index of `block_size` tokens per
/// block. Workers in `registered` that matched nothing are listed in
/// `instances` with zeros, and `predicted` depths add `predicted`; pass
/// `&[]` for both to answer exactly as Dynamo does.
pub fn write_query_response(
    out: &mut Vec<u8>,
    matches: &Matches,
    registered: &[WorkerId],
    predicted: &[Predicted],
    block_size: u32,
    query_blocks: usize,
) {
    // A match is never deeper than the query; clamp so a broken invariant
    // upstream cannot put impossible numbers on the wire.
    let cap = u32::try_from(query_blocks).unwrap_or(u32::MAX);
    let mut rows = ROWS.take();
    rows.clear();
    for m in &matches.workers {
        debug_assert!(m.device <= m.host && m.host <= m.disk && m.disk <= cap);
        let (device, host, disk) = (m.device.min(cap), m.host.min(cap), m.disk.min(cap));
        rows.push(Row { worker: m.worker, padding: 0, device, host, disk, predicted: 0 });
    }
    for &worker in registered {
        rows.push(Row { worker, padding: 1, device: 0, host: 0, disk: 0, predicted: 0 });
    }
    for p in predicted {
        rows.push(Row { worker: p.worker, padding: 2, device: 0, host: 0, disk: 0, predicted: p.blocks.min(cap) });
    }
    rows.sort_unstable_by_key(|r| (r.worker, r.padding));
    rows.dedup_by(|later, kept| {
        let same = later.worker == kept.worker;
        if same {
            kept.predicted = kept.predicted.max(later.predicted);
        }
        same
    });
    let tokens = |blocks: u32| u64::from(blocks) * u64::from(block_size);
    let instances = || rows.chunk_by(|a, b| a.worker.instance_id == b.worker.instance_id);

    out.extend_from_slice(b"{\"scores\":{");
    for group in instances().filter(|g| g.iter().any(|r| r.device > 0)) {
        comma(out);
        push_u64_key(out, group[0].worker.instance_id);
        out.push(b'{');
        for r in group.iter().filter(|r| r.device > 0) {
            comma(out);
            push_u64_key(out, u64::from(r.worker.dp_rank));
            push_u64(out, tokens(r.device));
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"},\"frequencies\":[],\"instances\":{");
    for group in instances() {
        comma(out);
        let max = |depth: fn(&Row) -> u32| group.iter().map(depth).max().unwrap_or(0);
        let (gpu, cpu, disk, predicted) = (max(|r| r.device), max(|r| r.host), max(|r| r.disk), max(|r| r.predicted));
        push_u64_key(out, group[0].worker.instance_id);
        out.extend_from_slice(b"{\"longest_matched\":");
        push_u64(out, tokens(gpu.max(cpu).max(disk)));
        out.extend_from_slice(b",\"gpu\":");
        push_u64(out, tokens(gpu));
        out.extend_from_slice(b",\"dp\":{");
        for r in group {
            comma(out);
            push_u64_key(out, u64::from(r.worker.dp_rank));
            push_u64(out, tokens(r.device));
        }
        out.extend_from_slice(b"},\"cpu\":");
        push_u64(out, tokens(cpu));
        out.extend_from_slice(b",\"disk\":");
        push_u64(out, tokens(disk));
        if predicted > gpu {
            out.extend_from_slice(b",\"predicted\":");
            push_u64(out, tokens(predicted));
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"}}");
    ROWS.set(rows);
}

/// A comma before every member of an object but its first (which follows
/// the object's `{`).
fn comma(out: &mut Vec<u8>) {
    if out.last() != Some(&b'{') {
        out.push(b',');
    }
}

/// Writes `{"error":"<message>"}`.
pub fn write_error(out: &mut Vec<u8>, message: &str) {
    out.extend_from_slice(b"{\"error\":");
    push_str(out, message);
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::WorkerMatch;
    use serde_json::{json, Value};

    fn m(instance_id: u64, dp_rank: u32, device: u32, host: u32, disk: u32) -> WorkerMatch {
        WorkerMatch { worker: WorkerId::new(instance_id, dp_rank), device, host, disk }
    }

    fn render(matches: Vec<WorkerMatch>, registered: &[WorkerId], block_size: u32, blocks: usize) -> Value {
        let mut out = b"prefix".to_vec();
        write_query_response(&mut out, &Matches { workers: matches }, registered, &[], block_size, blocks);
        assert!(out.starts_with(b"prefix"), "writers append");
        serde_json::from_slice(&out[6..]).expect("valid JSON")
    }

    #[test]
    fn empty_matches() {
        assert_eq!(render(vec![], &[], 16, 10), json!({"scores": {}, "frequencies": [], "instances": {}}));
    }

    #[test]
    fn tiers_ranks_and_instances() {
        let v = render(vec![m(7, 1, 1, 1, 2), m(9, 0, 0, 2, 3), m(7, 0, 2, 3, 3)], &[], 16, 4);
        assert_eq!(
            v,
            json!({
                "scores": {"7": {"0": 32, "1": 16}},
                "frequencies": [],
                "instances": {
                    "7": {"longest_matched": 48, "gpu": 32, "dp": {"0": 32, "1": 16}, "cpu": 48, "disk": 48},
                    "9": {"longest_matched": 48, "gpu": 0, "dp": {"0": 0}, "cpu": 32, "disk": 48}
                }
            })
        );
    }

    #[test]
    fn registered_workers_appear_with_zeros_only_when_given() {
        let v = render(vec![m(1, 0, 2, 2, 2)], &[WorkerId::new(1, 0), WorkerId::new(1, 1), WorkerId::new(3, 0)], 4, 2);
        assert_eq!(
            v,
            json!({
                "scores": {"1": {"0": 8}},
                "frequencies": [],
                "instances": {
                    "1": {"longest_matched": 8, "gpu": 8, "dp": {"0": 8, "1": 0}, "cpu": 8, "disk": 8},
                    "3": {"longest_matched": 0, "gpu": 0, "dp": {"0": 0}, "cpu": 0, "disk": 0}
                }
            })
        );
    }

    #[test]
    fn output_is_ordered_by_instance_then_rank() {
        let mut out = Vec::new();
        let ms = Matches { workers: vec![m(20, 3, 1, 1, 1), m(3, 0, 1, 1, 1), m(20, 1, 1, 1, 1), m(100, 0, 1, 1, 1)] };
        write_query_response(&mut out, &ms, &[], &[], 1, 1);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with(r#"{"scores":{"3":{"0":1},"20":{"1":1,"3":1},"100":{"0":1}}"#), "{text}");
    }

    #[test]
    fn predictions_appear_only_past_gpu_and_list_their_instance() {
        let mut out = Vec::new();
        let ms = Matches { workers: vec![m(1, 0, 2, 3, 3), m(1, 1, 1, 1, 1), m(2, 0, 2, 2, 2)] };
        let p = |i, r, blocks| Predicted { worker: WorkerId::new(i, r), blocks };
        // Instance 1: rank 1 is predicted 3 blocks, past the instance gpu of 2.
        // Instance 2: a prediction equal to gpu is not written. Instance 5: only predicted.
        let predicted = [p(1, 1, 3), p(2, 0, 2), p(5, 2, 4)];
        write_query_response(&mut out, &ms, &[], &predicted, 4, 4);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            json!({
                "scores": {"1": {"0": 8, "1": 4}, "2": {"0": 8}},
                "frequencies": [],
                "instances": {
                    "1": {"longest_matched": 12, "gpu": 8, "dp": {"0": 8, "1": 4}, "cpu": 12, "disk": 12, "predicted": 12},
                    "2": {"longest_matched": 8, "gpu": 8, "dp": {"0": 8}, "cpu": 8, "disk": 8},
                    "5": {"longest_matched": 0, "gpu": 0, "dp": {"2": 0}, "cpu": 0, "disk": 0, "predicted": 16}
                }
            })
        );
    }

    #[test]
    fn large_depths_do_not_wrap() {
        let v = render(vec![m(1, 0, 1 << 20, 1 << 20, 1 << 20)], &[], 1 << 16, 1 << 20);
        assert_eq!(v["instances"]["1"]["gpu"], json!(1u64 << 36));
    }

    #[test]
    fn error_and_status_bodies() {
        let mut out = Vec::new();
        write_error(&mut out, "no indexer for model=\"a\\b\" tenant=\n");
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v, json!({"error": "no indexer for model=\"a\\b\" tenant=\n"}));
    }
}
