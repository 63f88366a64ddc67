//! Restarts and deaths the stream must see through, each a script of the
//! scripted engine of `model_tests` that must end where the engine is: a
//! ring asked while the connection is down, a restart a proxy hides, a
//! host gone without a reset, a listener removed mid-replay; and an
//! exploration over the steps that model these (`EXTRA_STEPS`).

use std::collections::BTreeMap;

use super::model_tests::{play, starts, Start, Step, EXTRA_STEPS, STEPS};

/// Every script of `len` steps over `alphabet`.
fn scripts(alphabet: &[Step], len: u32) -> impl Iterator<Item = Vec<Step>> + '_ {
    let n = alphabet.len();
    (0..n.pow(len)).map(move |mut i| {
        (0..len)
            .map(|_| {
                let step = alphabet[i % n];
                i /= n;
                step
            })
            .collect()
    })
}

/// Failures by class (start's ring, extra steps in the script, verdict):
/// how many, and the shortest report.
type Classes = BTreeMap<String, (usize, String)>;

/// Counts failure `e` of `script` in its class.
fn note_failure(classes: &mut Classes, start: Start, script: &[Step], e: String) {
    let verdict = e.lines().next().unwrap_or("").split("]: ").nth(1).unwrap_or("").to_string();
    let extra: Vec<_> = EXTRA_STEPS.iter().filter(|s| script.contains(s)).collect();
    let key = format!("{:?} {extra:?}: {}", start.ring, verdict.chars().take(40).collect::<String>());
    let entry = classes.entry(key).or_insert((0, e.clone()));
    entry.0 += 1;
    if e.len() < entry.1.len() {
        entry.1 = e;
    }
}

/// Every script of `MODEL_LEN` (4) steps over the model's steps and the
/// extra ones, minus those named in `MODEL_WITHOUT`; failures grouped by
/// their first line's verdict, one example each.
#[test]
#[ignore = "exploration"]
fn explore_extra_steps() {
    let len: u32 = std::env::var("MODEL_LEN").ok().and_then(|n| n.parse().ok()).unwrap_or(4);
    let without = std::env::var("MODEL_WITHOUT").unwrap_or_default();
    let alphabet: Vec<Step> =
        STEPS.iter().chain(EXTRA_STEPS.iter()).copied().filter(|s| !without.contains(&format!("{s:?}"))).collect();
    let mut classes = Classes::new();
    for start in starts() {
        for script in scripts(&alphabet, len) {
            if let Err(e) = play(start, &script) {
                note_failure(&mut classes, start, &script, e);
            }
        }
    }
    for (key, (n, example)) in &classes {
        println!("== {n} x {key}\n{}\n", example.lines().next().unwrap_or(""));
    }
    assert!(classes.is_empty(), "{} classes of failures", classes.len());
}

const RING: Start = Start { ring: true, gate_open: true, seeded: false };

/// Plays `script` from `start`, settles, and checks the end state.
fn outcome(start: Start, script: &[Step]) -> Result<(), String> {
    play(start, script)
}

// A ring request asked while the stream's connection is down would be
// answered by whatever process holds the ring port by then, and a stream
// with no watermark takes the first answer as the process of the
// connection it was asked on: the request is dropped with the connection,
// so no batch the dead process sent on it is judged as the new process's.

#[test]
fn a_ring_answer_after_the_engine_died_does_not_vouch_for_its_dead_connection() {
    // Startup recovery holds the stream (no watermark). The first process
    // sends batch 2 and dies; its connection's last batch, read after the
    // drop, shows a gap from 0, and the replay asked for it waits. A new
    // process binds the endpoints and answers the replay before the
    // listener reconnects; the dead process's batch 2 ends up applied on
    // top of it, and the new process's own 1 and 2 dropped as duplicates.
    let script = [Step::Pub, Step::Die, Step::Gate, Step::Live, Step::Spawn, Step::Pub, Step::Wait, Step::Reply];
    outcome(Start { gate_open: false, ..RING }, &script).unwrap();
}

#[test]
fn a_ring_answer_before_the_replacement_is_seen_does_not_start_the_stream_on_the_dead_connection() {
    // The same, the new process's batches 0 and 1 replayed first.
    let script =
        [Step::Pub, Step::Die, Step::Spawn, Step::Gate, Step::Pub, Step::Pub, Step::Live, Step::Reply, Step::Reply];
    outcome(Start { gate_open: false, ..RING }, &script).unwrap();
}

#[test]
fn a_host_gone_without_a_reset_does_not_lend_its_connection_to_the_next_process() {
    // The connection of a process whose host vanished looks up until the
    // keepalive gives up. The fill from the seeded watermark finds a new
    // process (a restart, filled from 0 on the same, dead, connection),
    // and the dead process's batch 2, still queued on it, is applied on top.
    let script = [Step::Pub, Step::Pub, Step::Vanish, Step::Spawn, Step::Pub, Step::Gate, Step::Reply, Step::Reply];
    outcome(Start { gate_open: false, seeded: true, ..RING }, &script).unwrap();
}

// A restart hidden by a proxy (the connection stays up): the new
// process's batches below the watermark are never taken for duplicates
// (they do not repeat the batches kept for their seqs), so its batch
// `last + 1` never continues the old process's blocks.

#[test]
fn a_restart_behind_a_proxy_is_not_continued_as_the_old_process() {
    // The fill applies 0 and 1; the engine restarts behind a proxy, its 0
    // is lost, its 1 dropped as a duplicate, its 2 applied on top of the
    // old process's blocks.
    let script = [Step::Reply, Step::Reply, Step::Reply, Step::ProxyRestart, Step::Lost, Step::Pub, Step::Pub];
    outcome(RING, &script).unwrap();
}

#[test]
fn a_restart_behind_a_proxy_without_a_ring_is_not_continued_as_the_old_process() {
    let script = [Step::Pub, Step::Live, Step::ProxyRestart, Step::Lost, Step::Pub, Step::Live];
    outcome(Start { ring: false, ..RING }, &script).unwrap();
}

// `Stream::end` (the listener removed) gives back to the thread's account
// every batch it holds, those a gap's replay keeps while its ring is
// checked (`Ask::rolled`) included.

#[test]
fn removing_a_listener_mid_replay_gives_back_every_byte_it_held() {
    let mut run = super::model_tests::Run::new(RING);
    // Filled 0 and 1; 2..=5 lost; the ring forgets 0..=2; 6 shows the gap;
    // the replay's ring starts past the watermark: 3 and 4 are kept until
    // its copy of 6 says whose ring it is.
    let script = [
        Step::Reply,
        Step::Reply,
        Step::Reply,
        Step::Lost,
        Step::Lost,
        Step::Lost,
        Step::Lost,
        Step::Roll,
        Step::Pub,
        Step::Live,
        Step::Reply,
        Step::Reply,
    ];
    for step in script {
        run.step(step);
    }
    run.check_held().unwrap();
    let trace = run.trace();
    let (bytes, gauge) = run.remove();
    assert_eq!((bytes, gauge), (0, 0), "the thread's account after removal\n{trace}");
}

/// Random scripts (`MODEL_RANDOM` per start, `MODEL_LEN` steps, seed
/// `MODEL_SEED`) over the model's steps and the extra ones, minus those in
/// `MODEL_WITHOUT`, deliveries drawn more often; failures grouped.
#[test]
#[ignore = "exploration"]
fn explore_extra_steps_at_random() {
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|n| n.parse().ok()).unwrap_or(d);
    let (count, len, seed) = (env("MODEL_RANDOM", 20_000), env("MODEL_LEN", 24) as usize, env("MODEL_SEED", 1));
    let without = std::env::var("MODEL_WITHOUT").unwrap_or_default();
    let alphabet: Vec<Step> =
        STEPS.iter().chain(EXTRA_STEPS.iter()).copied().filter(|s| !without.contains(&format!("{s:?}"))).collect();
    let common = [Step::Pub, Step::Pub, Step::Live, Step::Live, Step::Reply, Step::Reply, Step::Reply];
    let mut classes = Classes::new();
    for (i, start) in starts().into_iter().enumerate() {
        let mut rng = crate::test_rng::RngStar(seed + i as u64);
        for _ in 0..count {
            let script: Vec<Step> =
                (0..len).map(|_| if rng.chance(2) { rng.pick(&common) } else { rng.pick(&alphabet) }).collect();
            if let Err(e) = play(start, &script) {
                note_failure(&mut classes, start, &script, e);
            }
        }
    }
    for (key, (n, example)) in &classes {
        println!("== {n} x {key}\n{}\n", example.lines().next().unwrap_or(""));
    }
    assert!(classes.is_empty(), "{} classes of failures", classes.len());
}

/// Shrinks the failing script in `MODEL_SCRIPT` (as `replay_one_script`
/// takes it): drops steps while the same verdict stays, and prints it.
#[test]
#[ignore = "a tool: shrinks the script in MODEL_SCRIPT"]
fn shrink_one_script() {
    let text = std::env::var("MODEL_SCRIPT").expect("MODEL_SCRIPT");
    let (head, steps) = text.split_once(':').expect("flags: steps");
    let flags: Vec<bool> = head.split_whitespace().map(|f| f == "1").collect();
    let start = Start { ring: flags[0], gate_open: flags[1], seeded: flags[2] };
    let mut script: Vec<Step> = steps
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .map(|w| *STEPS.iter().chain(EXTRA_STEPS.iter()).find(|s| format!("{s:?}") == w).expect("a step"))
        .collect();
    let verdict = |e: &str| e.lines().next().unwrap_or("").split("]: ").nth(1).unwrap_or("").to_string();
    // MODEL_QUIET: settled quietly (`play_quiet`).
    let play = if std::env::var_os("MODEL_QUIET").is_some() { play_quiet } else { play };
    let want = verdict(&play(start, &script).expect_err("the script fails"));
    let mut shrunk = true;
    while shrunk {
        shrunk = false;
        for i in 0..script.len() {
            let mut shorter = script.clone();
            shorter.remove(i);
            if play(start, &shorter).is_err_and(|e| verdict(&e) == want) {
                script = shorter;
                shrunk = true;
                break;
            }
        }
    }
    println!("SHRUNK {start:?} {script:?}: {want}");
}

/// Parses `flags: steps` as `replay_one_script` takes it.
fn parse(text: &str) -> (Start, Vec<Step>) {
    let (head, steps) = text.split_once(':').expect("flags: steps");
    let flags: Vec<bool> = head.split_whitespace().map(|f| f == "1").collect();
    let start = Start { ring: flags[0], gate_open: flags[1], seeded: flags[2] };
    let script = steps
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .map(|w| *STEPS.iter().chain(EXTRA_STEPS.iter()).find(|s| format!("{s:?}") == w).expect("a step"))
        .collect();
    (start, script)
}

/// Prints the trace of the script in `MODEL_SCRIPT`, failing or not.
#[test]
#[ignore = "a tool: traces the script in MODEL_SCRIPT"]
fn trace_one_script() {
    let (start, script) = parse(&std::env::var("MODEL_SCRIPT").expect("MODEL_SCRIPT"));
    let mut run = super::model_tests::Run::new(start);
    for &step in &script {
        run.step(step);
    }
    run.settle_rounds(if std::env::var_os("MODEL_QUIET").is_some() { 1 } else { 3 });
    println!("{}\n{:?}\n{:?}", run.trace(), run.check(), run.counters());
}

/// Plays `script` from `start` and settles with the engine quiet (no
/// batch published after the script to show a gap); with a ring that
/// lost nothing, no batch lost on the way and nothing dropped for want
/// of room, the worker must then hold exactly the engine's blocks.
fn play_quiet(start: Start, script: &[Step]) -> Result<(), String> {
    let mut run = super::model_tests::Run::new(start);
    for &step in script {
        run.step(step);
    }
    run.settle_rounds(1);
    // What nothing can show while the engine is quiet: a batch lost in
    // the network with nothing after it, a restart behind a proxy that
    // published nothing yet, and anything at all without a ring.
    let blind = !start.ring || script.iter().any(|s| matches!(s, Step::Lost | Step::ProxyRestart));
    let content = |e: &str| e.starts_with("misses blocks") || e.starts_with("credits blocks");
    let checked = run.check().or_else(|e| if blind && content(&e) { Ok(()) } else { Err(e) });
    let verdict = checked.and_then(|()| if !blind && run.clean() { run.exact() } else { Ok(()) });
    verdict.map_err(|e| format!("{start:?} {script:?}: {e}\n  {:?}\n{}", run.counters(), run.trace()))
}

/// Every script of `MODEL_LEN` (4) steps, then `MODEL_RANDOM` (0) random
/// ones of 16, over the model's steps and the extra ones minus
/// `MODEL_WITHOUT`, each settled quietly (`play_quiet`); failures grouped.
#[test]
#[ignore = "exploration"]
fn explore_quiet_settle() {
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|n| n.parse().ok()).unwrap_or(d);
    let (len, count, seed) = (env("MODEL_LEN", 4) as u32, env("MODEL_RANDOM", 0), env("MODEL_SEED", 1));
    let without = std::env::var("MODEL_WITHOUT").unwrap_or_default();
    let alphabet: Vec<Step> =
        STEPS.iter().chain(EXTRA_STEPS.iter()).copied().filter(|s| !without.contains(&format!("{s:?}"))).collect();
    let common = [Step::Pub, Step::Pub, Step::Live, Step::Live, Step::Reply, Step::Reply, Step::Reply];
    let mut classes = Classes::new();
    for (i, start) in starts().into_iter().enumerate() {
        let mut rng = crate::test_rng::RngStar(seed + i as u64);
        let random = (0..count).map(|_| {
            (0..16).map(|_| if rng.chance(2) { rng.pick(&common) } else { rng.pick(&alphabet) }).collect::<Vec<_>>()
        });
        let all: Vec<Vec<Step>> = scripts(&alphabet, len).chain(random.collect::<Vec<_>>()).collect();
        for script in all {
            if let Err(e) = play_quiet(start, &script) {
                note_failure(&mut classes, start, &script, e);
            }
        }
    }
    for (key, (n, example)) in &classes {
        println!("== {n} x {key}\n{example}\n");
    }
    assert!(classes.is_empty(), "{} classes of failures", classes.len());
}

// Held batches dropped unjudged and the fill's bounds, each checked once
// the engine is quiet: the world settles without the extra batches
// `settle` publishes, so nothing but the stream itself can show what it
// missed.

/// Plays `script` from `start`, settles with the engine quiet, and checks
/// the worker holds exactly the engine's blocks.
fn quiet_exact(start: Start, script: &[Step]) -> Result<(), String> {
    let mut run = super::model_tests::Run::new(start);
    for &step in script {
        run.step(step);
    }
    run.settle_rounds(1);
    run.check().and_then(|()| run.exact()).map_err(|e| format!("{e}\n  {:?}\n{}", run.counters(), run.trace()))
}

// Held batches dropped unjudged when a ring starts or restarts the stream
// never bound the fill that follows (they may be a dead process's, with
// higher seqs): it reads the new process's ring to its end, so a removal
// there is never left unread while the engine is quiet.

#[test]
fn a_dead_process_s_dropped_batches_do_not_cut_the_new_process_s_fill_short() {
    // Startup recovery holds process 1's 2 and 3 (connection 1). Its host
    // vanishes; process 2 binds the endpoints and publishes 0..=5, nothing
    // read yet. The fill on connection 2 starts the stream on process 2's
    // ring and drops 2 and 3, bounding the fill at 4: 4 and 5 are never
    // read, and 5 removed block 3.
    let mut script = vec![Step::Pub, Step::Pub, Step::Vanish, Step::Spawn];
    script.extend([Step::Pub; 6]);
    quiet_exact(Start { gate_open: false, ..RING }, &script).unwrap();
}

#[test]
fn a_restart_found_by_the_ring_reads_the_new_ring_to_its_end() {
    // Seeded at process 1's batch 1. Process 2 sends its 0 on connection 2
    // and dies; process 3 publishes 0..=2 before connection 3. The fill
    // from the watermark finds another process, starts over, drops process
    // 2's 0 and refills only up to 1 (`refill_to`): process 3's 1 and 2
    // are never read, and 2 removed block 0.
    let script = [Step::Restart, Step::Pub, Step::Die, Step::Spawn, Step::Pub, Step::Pub, Step::Pub];
    quiet_exact(Start { gate_open: false, seeded: true, ..RING }, &script).unwrap();
}

// Held batches dropped for want of room (the newest, counted in
// `held_dropped`) are read from the ring once the held ones are judged,
// with no later batch needed to show their gap.

#[test]
fn a_batch_dropped_from_a_full_hold_is_read_from_the_ring() {
    // Startup recovery: batches 2..=8 arrive; the model holds six, so 8 is
    // dropped. When the gate opens the fill starts the stream, drops the
    // held ones and reads the ring up to 7: 8, which removed block 6, is
    // never read though the ring has it.
    let script = [Step::Pub; 7];
    quiet_exact(Start { gate_open: false, ..RING }, &script).unwrap();
}

// When the fill a new connection asks runs out (a ring slow or silent for
// `REPLAY_SPAN_TIMEOUTS` timeouts), batches held from older connections
// are dropped, never judged, and the workers of a stream with a watermark
// are cleared: nothing told the new connection's process.

#[test]
fn a_dead_connection_s_held_batch_is_not_applied_when_the_new_fill_runs_out() {
    // Process 1's 2 is held behind the fill of connection 1 (its ring
    // muted); process 2 takes the endpoints (connection 2), its ring muted
    // too; the fill runs out and 1:2 starts the stream over process 2.
    let script = [Step::Pub, Step::Mute, Step::Restart, Step::Gone];
    let mut run = super::model_tests::Run::new(RING);
    script.iter().for_each(|&s| run.step(s));
    run.settle_rounds(1);
    run.check().unwrap_or_else(|e| panic!("{e}\n{}", run.trace()));
}

#[test]
fn a_dead_connection_s_held_batch_is_not_taken_for_the_seeded_process_when_the_fill_runs_out() {
    // Seeded at process 1's 1. Its 2 arrives on connection 1 after the
    // drop and waits for the fill of connection 2, which reaches process 2;
    // that ring's answer comes after the held batch waited out, and 1:2 is
    // applied as a continuation of the seeded watermark.
    let script = [Step::Pub, Step::Restart, Step::Gone];
    let mut run = super::model_tests::Run::new(Start { seeded: true, ..RING });
    script.iter().for_each(|&s| run.step(s));
    run.settle_rounds(1);
    run.check().unwrap_or_else(|e| panic!("{e}\n{}", run.trace()));
}

// A gap's replay on a fresh stream becomes a fill when its first answer
// starts the stream (`start_on_ring`); its outcome is still counted as a
// replay's.

#[test]
fn a_replay_turned_into_a_fill_still_counts_its_outcome() {
    // Process 2's empty ring ends the fill; its 0 is lost and its 1 shows a
    // gap from 0 on a fresh stream: a replay, whose first answer starts
    // the stream.
    let script = [Step::Restart, Step::Reply, Step::Lost, Step::Pub, Step::Live, Step::Reply, Step::Reply, Step::Reply];
    let mut run = super::model_tests::Run::new(RING);
    script.iter().for_each(|&s| run.step(s));
    run.settle_rounds(1);
    run.check().and_then(|()| run.exact()).unwrap_or_else(|e| panic!("{e}\n{}", run.trace()));
    let c = run.counters();
    assert_eq!(c.replays_started, c.replays_ok + c.replays_partial + c.replays_failed, "{c:?}\n{}", run.trace());
}
