//! Ingest counters: relaxed atomics bumped by listener and shard threads,
//! read as one snapshot for metrics and status.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// Live counters shared by every ingest thread.
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub(crate) $name: AtomicU64,)*
            /// How far applied batches lag behind their engine's clock.
            pub(crate) event_lag: super::lag::EventLag,
        }

        /// A snapshot of the ingest counters (totals since start).
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct IngestCounters {
            $($(#[$doc])* pub $name: u64,)*
            /// Messages queued per writer shard right now.
            pub shard_queue_depths: Vec<usize>,
            /// Batches held by listeners right now (replay in flight or gate closed).
            pub held_batches: u64,
            /// Bytes of batches received and not yet applied, and the budget for them.
            pub budget_bytes: u64,
            pub budget_bytes_max: u64,
            /// Events skipped while converting, by reason.
            pub skips: Vec<(&'static str, u64)>,
        }

        impl Counters {
            pub(crate) fn snapshot(&self) -> IngestCounters {
                IngestCounters {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                    ..IngestCounters::default()
                }
            }
        }
    };
}

counters! {
    /// Well-formed messages received from SUB sockets.
    batches_received,
    /// Batches whose events reached a sink (live and replayed).
    batches_applied,
    /// Events handed to sinks after conversion.
    events_applied,
    /// Messages dropped for a wrong shape (frame count, seq width).
    malformed_messages,
    /// Batches whose msgpack payload could not be decoded (treated as lost).
    undecodable_batches,
    /// Batches dropped because their seq was already dealt with.
    duplicates_dropped,
    /// Gaps in a listener's seq.
    gaps_detected,
    /// Replay requests sent.
    replays_started,
    /// Replays that delivered every missing batch.
    replays_ok,
    /// Replays that delivered some but not all missing batches.
    replays_partial,
    /// Replays that delivered nothing (timeout, unreachable, bad replies).
    replays_failed,
    /// Batches recovered through replay and applied.
    batches_replayed,
    /// Batches known missing and not recovered (mid-stream).
    batches_lost,
    /// Batches a listener missed before its first one (joined mid-stream, no replay).
    batches_missed_at_join,
    /// Ring fills asked for: a listener connected (or its stream was reset)
    /// and asked its engine's ring for everything past its watermark.
    ring_fills,
    /// Ring reads after a fill that no live batch followed (`LATE_JOIN_READS_MS`).
    late_join_reads,
    /// Batches recovered by ring fills (and the reads after them) and applied.
    batches_filled,
    /// Listeners whose workers were cleared because their publisher stayed
    /// unreachable for `engine_gone_ms` (once per outage).
    engine_gone_clears,
    /// Publisher restarts detected (the workers were cleared).
    restarts,
    /// Batches of a new connection that nothing verified (no ring, or a
    /// ring that never answered) taken for the same process because they
    /// continued the watermark exactly.
    unverified_continuations,
    /// Workers cleared after a gap that could not be replayed.
    resyncs,
    /// Live batches dropped because a listener's hold buffer was full.
    held_dropped,
    /// Live batches dropped undecoded because the ingest budget was spent
    /// (each a gap its stream asks the engine's ring for).
    budget_dropped,
    /// Live batches dropped because nothing showed they came from the engine
    /// process the stream follows: a new process's ring (or a replay) then
    /// brings back its own; a dead one's are gone.
    unproven_dropped,
    /// Batches dropped because they named more dp ranks than a listener may track.
    dp_rank_limit_dropped,
    /// Workers removed through their shard.
    workers_removed,
}
