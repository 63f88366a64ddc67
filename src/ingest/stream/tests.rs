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
    // The dead process's 11..=13 and the new one's 1..=4, held when the
    // ring showed a new process: none could be told to be the new one's,
    // whose ring refilled its own.
    assert_eq!(c.unproven_dropped + c.held_dropped, 7, "{c:?}");
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
    // Both processes' held batches: the new one's ring refilled its own.
    assert_eq!((c.unproven_dropped, c.held_dropped), (6, 0), "{c:?}");
    assert_eq!(c.unverified_continuations, 0, "{c:?}");
}

#[test]
fn a_replay_started_right_after_a_long_one_gets_a_timeout_of_its_own() {
    let mut run = Run::new(RING);
    steps(&mut run, &[Step::Reply, Step::Reply, Step::Reply]);
    // A gap of eight before batch 10: replay A is asked for 2..10, and
    // batch 10 waits from here.
    for _ in 2..10 {
        run.step(Step::Lost);
    }
    steps(&mut run, &[Step::Pub, Step::Live]);
    // Another gap, before 12, which waits behind A.
    steps(&mut run, &[Step::Lost, Step::Pub, Step::Live]);
    // A's nine replies (its check of batch 1, then 2..=9) come 0.85
    // timeouts apart: A ends 7.65 timeouts after batch 10 began waiting,
    // and the gap before 12 is asked for at once (replay B).
    for _ in 0..9 {
        run.pass(RING_TIMEOUT_MS * 85 / 100);
        run.step(Step::Reply);
    }
    assert_eq!(run.counters().replays_started, 2);
    // 8.15 timeouts after the live batches began waiting: past the span,
    // but B has had half a timeout. It is not cut; its answer comes.
    run.pass(RING_TIMEOUT_MS / 2);
    for _ in 0..4 {
        run.step(Step::Reply);
    }
    run.settle();
    run.check().unwrap();
    let c = run.counters();
    assert_eq!((c.replays_ok, c.resyncs, c.batches_lost), (2, 0, 0), "{c:?}\n{}", run.trace());
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

#[test]
fn a_batch_dropped_when_the_ring_starts_the_stream_is_read_from_the_ring() {
    let mut run = Run::new(RING);
    // The fill from 0 is asked while the ring holds 0 and 1; batch 2 comes
    // live before the answer and is held. The answer starts the stream and
    // drops 2 unjudged (whose it is cannot be told), and the answer itself
    // predates 2: the fill asks again to read it, with no later batch
    // needed to show the gap.
    steps(&mut run, &[Step::Pub, Step::Live]);
    for _ in 0..6 {
        run.step(Step::Reply);
    }
    assert!(!run.stream.asking(), "the fill has ended");
    run.check().unwrap();
    assert_eq!(run.counters().unproven_dropped, 1);
}

#[test]
fn a_fill_stopped_by_an_overflow_before_its_answer_keeps_the_seeded_blocks() {
    // Seeded, gate closed: batches 2..=7 are held (the model holds six).
    // The gate opens and the fill from the watermark is asked; batch 8
    // overflows the hold, which stops the fill before the ring answered.
    // The ring was never silent: the workers are not cleared for it.
    let mut run = Run::new(Start { gate_open: false, seeded: true, ..RING });
    for _ in 2..8 {
        steps(&mut run, &[Step::Pub, Step::Live]);
    }
    steps(&mut run, &[Step::Gate, Step::Pub, Step::Live, Step::Wait]);
    run.settle();
    run.check().unwrap();
    assert_eq!(run.counters().resyncs, 0, "{:?}", run.counters());
}

#[test]
fn live_copies_a_proxy_swapped_far_behind_a_fill_are_duplicates() {
    let mut run = Run::new(RING);
    run.cfg.replay_batches_max = 200;
    // Batch 2 comes and is held; the fill's answer (0 and 1) starts the
    // stream and drops it unjudged, then asks again. Meanwhile 3..=82 go
    // out, 11 and 12 swapped, and the second answer runs to 82 before the
    // live stream shows any of them.
    steps(&mut run, &[Step::Pub, Step::Live]);
    for _ in 3..=12 {
        run.step(Step::Pub);
    }
    run.step(Step::Swap);
    for _ in 13..=82 {
        run.step(Step::Pub);
    }
    for _ in 0..200 {
        run.step(Step::Reply);
    }
    assert!(!run.stream.asking(), "the fill has ended\n{}", run.trace());
    assert_eq!(run.counters().batches_filled, 83);
    // 3..=10, 12, 11, 13..=82, all behind the watermark: copies of what
    // the fill applied, 11 after 12 too (out of the recent ones by then),
    // not a restart.
    for _ in 3..=82 {
        run.step(Step::Live);
    }
    run.settle();
    run.check().unwrap();
    let c = run.counters();
    assert_eq!((c.restarts, c.duplicates_dropped), (0, 80), "{c:?}\n{}", run.trace());
}

#[test]
fn batches_sent_before_the_subscription_took_are_read_from_the_ring_once_quiet() {
    let mut run = Run::new(RING);
    // The fill asked on connecting takes 0 and 1. The engine then sends
    // three more before our subscription reaches its PUB socket (dropped
    // there) and goes quiet: nothing live ever shows them missing.
    steps(&mut run, &[Step::Reply, Step::Reply, Step::Reply]);
    assert!(!run.stream.asking(), "the fill has ended");
    for _ in 2..5 {
        run.step(Step::Lost);
    }
    run.pass(RING_TIMEOUT_MS);
    assert_eq!(run.counters().batches_filled, 2, "read again too soon");
    // With nothing published while it settles, only the read after the
    // quiet fill can bring them.
    // The first read brings them; nothing live comes after it either, so
    // every read is made.
    run.settle_rounds(1);
    run.exact().unwrap();
    let c = run.counters();
    let reads = crate::ingest::config::LATE_JOIN_READS_MS.len() as u64;
    assert_eq!((c.ring_fills, c.late_join_reads, c.batches_filled), (1, reads, 5), "{c:?}\n{}", run.trace());
    assert_eq!((c.resyncs, c.restarts, c.batches_lost), (0, 0, 0), "{c:?}");
}

#[test]
fn a_live_batch_after_the_fill_ends_the_reads_of_a_quiet_ring() {
    let mut run = Run::new(RING);
    steps(&mut run, &[Step::Reply, Step::Reply, Step::Reply, Step::Pub, Step::Live]);
    assert_eq!(run.stream.late_due(), None, "the subscription took: a later loss shows as a gap");
    run.settle_rounds(1);
    run.exact().unwrap();
    assert_eq!(run.counters().late_join_reads, 0);
}

#[test]
fn a_quiet_ring_is_read_again_a_bounded_number_of_times() {
    let mut run = Run::new(RING);
    steps(&mut run, &[Step::Reply, Step::Reply, Step::Reply]);
    // Nothing is ever published again: each read finds nothing new, and
    // the reads stop after the last pause.
    for _ in 0..200 {
        run.pass(RING_TIMEOUT_MS);
        while run.stream.asking() {
            run.step(Step::Reply);
        }
    }
    assert_eq!(run.stream.late_due(), None);
    let c = run.counters();
    let reads = crate::ingest::config::LATE_JOIN_READS_MS.len() as u64;
    assert_eq!((c.ring_fills, c.late_join_reads, c.batches_filled), (1, reads, 2), "{c:?}");
    run.check().unwrap();
}
