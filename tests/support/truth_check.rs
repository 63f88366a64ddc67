//! Compares what a running daemon says with what its engines really hold,
//! through the API only:
//!
//! - `/dump`, read as what it means, a list of held blocks: every block of
//!   a Stored event is one (instance, rank, tier, engine hash, local hash)
//!   the engine holds, each listed once, and every block the engines hold
//!   is listed, including orphans (blocks whose parent the worker no longer
//!   holds: a lower-tier block whose device parent was evicted, a block
//!   after a hole), which are exactly the blocks the dump marks as such.
//!   A dump that lists anything else (a Removed event, a stand-in block)
//!   fails.
//! - `/query_by_hash` along the chain of every block an engine holds
//!   (visible or not): the owner's gpu, cpu and disk depths must be exactly
//!   those its held blocks give, walking the tiers in query order, and every
//!   other instance must answer zeros.
//!
//! Also reads counters from `/metrics` and prints the figures of a run.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use super::daemon::Daemon;
use super::fault_engine::{Engine, BLOCK_SIZE, MODEL};
use super::model_sink::Tiers;
use super::wait_until;
use kv_indexer::StorageTier;

/// (instance, dp rank, tier, engine hash, local hash) of one listed block.
pub type Fact = (u64, u32, usize, u64, u64);

/// Chains queried per engine at most (spread over its held blocks).
const CHAINS_PER_ENGINE_MAX: usize = 400;

/// An orphan: (instance, dp rank, tier, engine hash) of a block whose
/// parent its worker does not hold.
pub type Orphan = (u64, u32, usize, u64);

/// `/dump` of the test model read as a list of held blocks.
#[derive(Default)]
pub struct Listed {
    /// Every block of a Stored event.
    pub facts: BTreeSet<Fact>,
    /// The first blocks of events marked as orphans.
    pub orphans: BTreeSet<Orphan>,
    /// Events that are not stores (a list of held blocks has none).
    pub not_stores: usize,
    /// Blocks listed more than once.
    pub repeated: usize,
}

/// Reads `d`'s `/dump` of the test model as a list of held blocks.
pub fn dump_list(d: &Daemon) -> Listed {
    let dump = d.dump();
    let mut out = Listed::default();
    for (key, entry) in dump.as_object().unwrap() {
        assert_eq!(key, &format!("{MODEL}:default"), "an index nobody registered");
        for ev in entry["events"].as_array().unwrap() {
            let instance = ev["worker_id"].as_u64().unwrap();
            let rank = ev["event"]["dp_rank"].as_u64().unwrap_or(0) as u32;
            let tier = StorageTier::parse(ev["storage_tier"].as_str().unwrap()).unwrap().index();
            let stored = &ev["event"]["data"]["stored"];
            let Some(blocks) = stored["blocks"].as_array() else {
                out.not_stores += 1;
                continue;
            };
            for (i, b) in blocks.iter().enumerate() {
                let hash = b["block_hash"].as_u64().unwrap();
                if !out.facts.insert((instance, rank, tier, hash, b["tokens_hash"].as_u64().unwrap())) {
                    out.repeated += 1;
                }
                if i == 0 && !stored["kv_indexer_orphan"].is_null() {
                    out.orphans.insert((instance, rank, tier, hash));
                }
            }
        }
    }
    out
}

/// Every block `/dump` lists for the test model, checked to be a list of
/// held blocks (stores only, each block once).
pub fn dump_facts(d: &Daemon) -> BTreeSet<Fact> {
    let l = dump_list(d);
    assert_eq!((l.not_stores, l.repeated), (0, 0), "{} lists more than held blocks", d.base);
    l.facts
}

/// The orphans among what these engines hold: blocks whose parent the
/// engine does not hold where a receiver looks (a device block's on the
/// device, a lower-tier block's in any tier). The test engines give every
/// block its own hash and random tokens, so a hash is a block.
pub fn truth_orphans(engines: &[Engine]) -> BTreeSet<Orphan> {
    let mut out = BTreeSet::new();
    for e in engines {
        let truth = e.publisher.truth();
        for (tier, set) in truth.iter().enumerate() {
            for &h in set {
                let chain = e.publisher.chain_hashes(h);
                let Some(&parent) = chain.len().checked_sub(2).map(|i| &chain[i]) else { continue };
                let held = if tier == StorageTier::Device.index() {
                    truth[tier].contains(&parent)
                } else {
                    truth.iter().any(|t| t.contains(&parent))
                };
                if !held {
                    out.insert((e.instance, 0, tier, h));
                }
            }
        }
    }
    out
}

/// What the dump must rebuild for these engines: every block they hold.
pub fn truth_facts(engines: &[Engine]) -> BTreeSet<Fact> {
    let mut out = BTreeSet::new();
    for e in engines {
        for (tier, set) in e.publisher.truth().iter().enumerate() {
            for &h in set {
                let local = *e.publisher.chain_locals(h).last().unwrap();
                out.insert((e.instance, 0, tier, h, local));
            }
        }
    }
    out
}

fn describe(got: &BTreeSet<Fact>, want: &BTreeSet<Fact>) -> String {
    let stale: Vec<&Fact> = got.difference(want).collect();
    let missing: Vec<&Fact> = want.difference(got).collect();
    format!(
        "dump {} blocks, truth {}: {} stale (first {:?}), {} missing (first {:?})",
        got.len(),
        want.len(),
        stale.len(),
        stale.iter().take(3).collect::<Vec<_>>(),
        missing.len(),
        missing.iter().take(3).collect::<Vec<_>>()
    )
}

/// What an exact check found.
#[derive(Copy, Clone, Debug, Default)]
pub struct Checked {
    pub blocks: usize,
    /// Of those, orphans (each marked as such in the dump).
    pub orphans: usize,
    pub differing: usize,
    pub chains: usize,
    pub wrong_depths: usize,
}

/// `d`'s dump restricted to these engines' workers.
pub fn dump_facts_of(d: &Daemon, engines: &[Engine]) -> BTreeSet<Fact> {
    dump_facts(d).into_iter().filter(|f| engines.iter().any(|e| e.instance == f.0)).collect()
}

/// Waits (bounded) until `d`'s dump of these engines' workers lists
/// exactly the blocks they hold, with exactly their orphans marked, then
/// checks every chain's depths; panics with the difference if any fails.
pub fn assert_exact(d: &Daemon, engines: &[Engine]) -> Checked {
    let want = truth_facts(engines);
    let want_orphans = truth_orphans(engines);
    let ours = |f: &(u64, u32, usize, u64)| engines.iter().any(|e| e.instance == f.0);
    let (mut got, mut orphans, mut extra) = (BTreeSet::new(), BTreeSet::new(), (0, 0));
    let same = wait_until(|| {
        let l = dump_list(d);
        got = l.facts.into_iter().filter(|f| ours(&(f.0, f.1, f.2, f.3))).collect();
        orphans = l.orphans.into_iter().filter(ours).collect();
        extra = (l.not_stores, l.repeated);
        got == want && orphans == want_orphans && extra == (0, 0)
    });
    assert!(
        same,
        "{} drifted from its engines: {}; {} events not stores, {} blocks listed twice; \
         {} orphans held, {} marked, {} unmarked (first {:?}), {} wrongly marked (first {:?})",
        d.base,
        describe(&got, &want),
        extra.0,
        extra.1,
        want_orphans.len(),
        orphans.len(),
        want_orphans.difference(&orphans).count(),
        want_orphans.difference(&orphans).next(),
        orphans.difference(&want_orphans).count(),
        orphans.difference(&want_orphans).next(),
    );
    let (chains, wrong) = check_chains(d, engines);
    assert_eq!(wrong, 0, "{wrong} of {chains} chains answered wrong depths");
    Checked { blocks: got.len(), orphans: orphans.len(), differing: 0, chains, wrong_depths: 0 }
}

/// Asserts `d` lists no block of these engines' workers that they do not hold (it may miss some);
/// returns (listed, missing).
pub fn assert_no_stale(d: &Daemon, engines: &[Engine]) -> (usize, usize) {
    let want = truth_facts(engines);
    let got = dump_facts_of(d, engines);
    assert!(got.is_subset(&want), "{} holds stale blocks: {}", d.base, describe(&got, &want));
    (got.len(), want.len() - got.len())
}

/// Blocks (in query order) `truth` lets a query follow along `chain`:
/// device, then host pinned, then disk and external, each from where the
/// tier before stopped. Returns (gpu, cpu, disk) in blocks.
fn expected_depths(truth: &Tiers, chain: &[u64]) -> (usize, usize, usize) {
    let mut pos = 0;
    let mut run = |tier: StorageTier| {
        while pos < chain.len() && truth[tier.index()].contains(&chain[pos]) {
            pos += 1;
        }
        pos
    };
    let gpu = run(StorageTier::Device);
    let cpu = run(StorageTier::HostPinned);
    run(StorageTier::Disk);
    let disk = run(StorageTier::External);
    (gpu, cpu, disk)
}

/// Queries the chain of held blocks of every engine; returns (queried, wrong).
pub fn check_chains(d: &Daemon, engines: &[Engine]) -> (usize, usize) {
    let (mut queried, mut wrong) = (0, 0);
    let tokens = |blocks: usize| blocks as u64 * u64::from(BLOCK_SIZE);
    for e in engines {
        let truth = e.publisher.truth();
        let held: Vec<u64> = truth.iter().flatten().copied().collect::<BTreeSet<u64>>().into_iter().collect();
        let step = held.len().div_ceil(CHAINS_PER_ENGINE_MAX).max(1);
        for &leaf in held.iter().step_by(step) {
            let chain = e.publisher.chain_hashes(leaf);
            let locals = e.publisher.chain_locals(leaf);
            let (gpu, cpu, disk) = expected_depths(truth, &chain);
            let depths = |gpu, cpu, disk| {
                json!({"longest_matched": tokens(disk), "gpu": tokens(gpu), "dp": {"0": tokens(gpu)},
                       "cpu": tokens(cpu), "disk": tokens(disk)})
            };
            let want = depths(gpu, cpu, disk);
            let body = json!({"block_hashes": locals, "model_name": MODEL, "include_unmatched": true});
            let (status, v) = d.post_json("/query_by_hash", body);
            queried += 1;
            // Registered workers that match nothing are listed with zeros (asked for).
            let others_zero = v["instances"]
                .as_object()
                .is_some_and(|m| m.iter().all(|(k, w)| *k == e.instance.to_string() || *w == depths(0, 0, 0)));
            if status != 200 || v["instances"][e.instance.to_string()] != want || !others_zero {
                if wrong == 0 {
                    eprintln!("chain of {leaf} on engine {}: want {want}, got {v}", e.instance);
                }
                wrong += 1;
            }
        }
    }
    (queried, wrong)
}

/// An unlabelled counter or gauge from `/metrics`.
pub fn metric(d: &Daemon, name: &str) -> u64 {
    let (status, text) = d.get("/metrics");
    assert_eq!(status, 200);
    let line = text.lines().find(|l| l.split_whitespace().next() == Some(name));
    let value = line.unwrap_or_else(|| panic!("no metric {name}")).split_whitespace().nth(1).unwrap();
    value.parse::<f64>().unwrap() as u64
}

/// The daemon counters the fault tests quote (`kv_indexer_<name>_total`).
pub const COUNTERS: [&str; 10] = [
    "gaps_detected",
    "replays_ok",
    "replays_partial",
    "replays_failed",
    "batches_replayed",
    "batches_lost",
    "batches_missed_at_join",
    "duplicates_dropped",
    "restarts",
    "resyncs",
];

/// The `COUNTERS` of `d`, by name.
pub fn counters(d: &Daemon) -> Value {
    let mut out = json!({});
    for n in COUNTERS {
        out[n] = metric(d, &format!("kv_indexer_{n}_total")).into();
    }
    out
}

/// Prints a test's figures: faults injected, the final check, the daemon's counters.
pub fn report(test: &str, engines: &[Engine], checked: &Checked, daemon: &Daemon) {
    let sent: u64 = engines.iter().map(|e| e.sent).sum();
    let restarts: u64 = engines.iter().map(|e| e.restarts).sum();
    let mut s = super::fault_proxy::FaultStats::default();
    engines.iter().for_each(|e| s += e.stats());
    eprintln!(
        "{test}: {} engines, batches sent {sent}, dropped {}, duplicated {}, reordered {}, restarts injected {restarts}; \
         final check: {} blocks in /dump ({} orphans), {} differing, {} chains queried, {} wrong; daemon {}",
        engines.len(),
        s.dropped,
        s.duplicated,
        s.reordered,
        checked.blocks,
        checked.orphans,
        checked.differing,
        checked.chains,
        checked.wrong_depths,
        counters(daemon)
    );
}
