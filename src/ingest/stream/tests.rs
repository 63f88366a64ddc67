//! The stream's rules, one finding each, against the scripted engine of
//! `model_tests` with time under the test's control.

use super::model_tests::{Run, Start, Step, RING_TIMEOUT_MS};

const RING: Start = Start { ring: true, gate_open: true, seeded: false };

fn steps(run: &mut Run, steps: &[Step]) {
    steps.iter().for_each(|&s| run.step(s));
}

#[test]
fn batches_held_for_a_slow_replay_never_reach_the_process_that_took_the_endpoint() {
    let mut run = Run::new(RING);
    // The fill asked on connecting takes batches 0 and 1; the first process
    // then applies 2..=9, loses 10 and sends 11..=13: the gap's replay is
    // asked, its ring slow, and 11..=13 are held.
    steps(&mut run, &[Step::Reply, Step::Reply, Step::Reply]);
    for _ in 2..10 {
        steps(&mut run, &[Step::Pub, Step::Live]);
    }
    run.step(Step::Lost);
    for _ in 11..14 {
        steps(&mut run, &[Step::Pub, Step::Live]);
    }
    // It dies; a new process takes the endpoints, loses its 0, sends 1..=4.
    steps(&mut run, &[Step::Restart, Step::Lost]);
    for _ in 1..5 {
        steps(&mut run, &[Step::Pub, Step::Live]);
    }
    run.settle();
    run.check().unwrap();
    let c = run.counters();
    assert_eq!(c.dead_process_dropped, 3, "{c:?}");
    assert_eq!((c.restarts, c.unverified_continuations), (1, 0), "{c:?}");
}

#[test]
fn batches_held_while_the_gate_is_closed_never_reach_a_new_process() {
    let mut run = Run::new(Start { gate_open: false, ..RING });
    for _ in 2..6 {
        steps(&mut run, &[Step::Pub, Step::Live]);
    }
    // A new process; its first batch delivered (6) continues the old seqs.
    run.step(Step::Restart);
    for _ in 0..6 {
        run.step(Step::Lost);
    }
    for _ in 6..8 {
        steps(&mut run, &[Step::Pub, Step::Live]);
    }
    run.settle();
    run.check().unwrap();
    let c = run.counters();
    assert_eq!((c.dead_process_dropped, c.held_dropped), (4, 0), "{c:?}");
    assert_eq!(c.unverified_continuations, 0, "{c:?}");
}

#[test]
fn a_replay_started_right_after_a_long_fill_gets_a_timeout_of_its_own() {
    let mut run = Run::new(RING);
    // The ring gets to hold 0..=9 before the fill's request is answered;
    // asked again after a silent timeout, it answers with all ten.
    for _ in 2..10 {
        run.step(Step::Lost);
    }
    run.pass(RING_TIMEOUT_MS + 1);
    // Live: 10 (the fill's bound), 11 lost, 12. From here live batches wait.
    steps(&mut run, &[Step::Pub, Step::Live, Step::Lost, Step::Pub, Step::Live]);
    // The fill's ten replies come 0.75 timeouts apart: the fill ends at
    // its bound 7.5 timeouts after the live batches began waiting, and
    // the gap before 12 is asked for at once.
    for _ in 0..10 {
        run.pass(RING_TIMEOUT_MS * 3 / 4);
        run.step(Step::Reply);
    }
    assert_eq!(run.counters().replays_started, 1);
    // 8.2 timeouts after the live batches began waiting: past the span,
    // but the replay has had 0.7 timeouts. It is not cut; its answer comes.
    run.pass(RING_TIMEOUT_MS * 7 / 10);
    for _ in 0..4 {
        run.step(Step::Reply);
    }
    run.settle();
    run.check().unwrap();
    let c = run.counters();
    assert_eq!((c.replays_ok, c.resyncs, c.batches_lost), (1, 0, 0), "{c:?}");
}

#[test]
fn live_batches_wait_no_longer_than_the_span_behind_a_ring_that_trickles() {
    let mut run = Run::new(RING);
    steps(&mut run, &[Step::Reply, Step::Reply, Step::Reply]);
    // A gap of twelve, and a ring that answers the replay one batch a
    // little under a timeout apart: never silent, never done in time.
    for _ in 0..12 {
        run.step(Step::Lost);
    }
    steps(&mut run, &[Step::Pub, Step::Live]);
    assert_eq!(run.counters().replays_started, 1);
    for _ in 0..10 {
        run.pass(RING_TIMEOUT_MS - 1);
        run.step(Step::Reply);
    }
    // Eight timeouts after the trigger began waiting, the replay is over:
    // what came is applied, the rest given up, the worker resynced.
    let c = run.counters();
    assert_eq!((c.replays_partial, c.resyncs), (1, 1), "{c:?}");
    assert!(c.batches_replayed < 12, "{c:?}");
    run.settle();
    run.check().unwrap();
}
