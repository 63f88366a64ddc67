//! Ingest settings and the fixed limits that bound every queue and buffer.

use std::time::Duration;

/// Most listeners one `Ingest` accepts (one per (instance, dp_rank)).
/// Each holds up to four ZMQ sockets (SUB, its monitor's two ends, a
/// replay in flight) and about six descriptors; `zmq_context` sizes the
/// context from this.
pub const LISTENERS_MAX: usize = 4_096;
/// Most distinct dp ranks one listener's batches may name (a batch's rank
/// overrides the registered one; a publisher cannot make us track more).
pub const DP_RANKS_PER_LISTENER_MAX: usize = 1_024;
/// Most messages taken from one socket per poll round, so a busy publisher
/// cannot starve the others on its thread.
pub const RECV_BURST_MAX: usize = 256;
/// Most times one replay asks again after its replies stopped short: an
/// engine's ROUTER socket drops replies that overflow its pipe, so a long
/// replay arrives with holes although the engine still buffers them. Each
/// retry needs progress since the request before it.
pub const REPLAY_RETRIES_MAX: u32 = 32;
/// Longest run of one replay or ring fill, in replay timeouts: replies
/// that keep coming stretch its deadline up to this.
pub const REPLAY_SPAN_TIMEOUTS: u32 = 8;
/// A replay whose replies stop for this long short of its range asks again.
pub const REPLAY_IDLE_MS: u64 = 200;
/// Pauses before reading the ring again after a fill that no live batch of
/// its connection followed: the first from the fill's end, each next from
/// the read before. A PUB socket drops what it sends before our
/// subscription reaches it, and an engine that then goes quiet sends
/// nothing that would show those batches missing; its ring has them.
/// A live batch of the connection ends the reads (later losses show as gaps).
pub const LATE_JOIN_READS_MS: [u64; 3] = [250, 1_000, 4_000];
/// Most control messages (add/remove listener) queued per listener thread.
pub const CONTROL_QUEUE_MAX: usize = 1_024;
/// Largest block size a listener accepts, in tokens.
pub const BLOCK_SIZE_MAX: u32 = 1 << 20;
/// How long `remove_listener`, `remove_worker` and `sync` wait for a thread.
pub const CONTROL_TIMEOUT_MS: u64 = 5_000;
/// Shards and blocked listeners check for shutdown this often.
pub const SHUTDOWN_CHECK_MS: u64 = 50;
/// Longest a connection attempt may take to complete its ZMQ handshake
/// before the listener gives it up and tries again (an address that does
/// not resolve, a host that drops the TCP handshake).
pub const CONNECT_ATTEMPT_MS: u64 = 10_000;
/// Least time between two log lines about one endpoint that cannot be reached.
pub const CONNECT_LOG_INTERVAL_MS: u64 = 30_000;
/// Longest `last_error` kept per listener, in bytes.
pub const LAST_ERROR_LEN_MAX: usize = 512;

/// Default of `IngestConfig::budget_bytes`, in MiB.
pub const BUDGET_MIB_DEFAULT: usize = 128;
/// Largest `IngestConfig::budget_bytes` accepted, in MiB.
pub const BUDGET_MIB_MAX: usize = 1 << 20;
/// Most replies a ring request's socket queues unread: an engine's ROUTER
/// drops what overflows its own pipe (1,000 by default) anyway, and what
/// is dropped is asked for again.
pub const RING_PIPE_BATCHES: usize = 1_024;

/// Default of `IngestConfig::heartbeat_ivl_ms`.
pub const HEARTBEAT_MS_DEFAULT: i32 = 2_500;
/// Largest `IngestConfig::heartbeat_ivl_ms` accepted.
pub const HEARTBEAT_MS_MAX: i32 = 600_000;
/// Default of `IngestConfig::engine_gone_ms`, in seconds (see README,
/// "Snapshots, peers and engines that go away", for why this long).
pub const ENGINE_GONE_S_DEFAULT: u64 = 60;
/// Largest `IngestConfig::engine_gone_ms` accepted, in seconds (a day).
pub const ENGINE_GONE_S_MAX: u64 = 86_400;

/// How the ingest pipeline runs. `0` in a count means "pick from the core count".
#[derive(Clone, Debug)]
pub struct IngestConfig {
    /// Listener threads (each owns many SUB sockets). 0: cores / 4, at least 1.
    pub listener_threads: usize,
    /// Writer shards (each owns a disjoint set of workers). 0: cores / 2, at least 1.
    pub shard_threads: usize,
    /// Pin listener and shard threads to cores.
    pub pin_threads: bool,
    /// Batches queued per shard before listeners block (back-pressure), in
    /// messages of up to 64 batches each (what one listener wake-up made).
    pub shard_queue_batches: usize,
    /// Longest wait of a listener thread while one of its replays runs (for
    /// its deadline); otherwise it waits until a socket is ready.
    pub poll_timeout_ms: u64,
    /// How long one replay or ring fill may go without a reply (and, times
    /// `REPLAY_SPAN_TIMEOUTS`, its longest run).
    pub replay_timeout_ms: u64,
    /// Most replies taken from one replay (the engine's default buffer holds 10,000).
    pub replay_batches_max: usize,
    /// Live batches one listener holds while a replay runs or the ready gate
    /// is closed; beyond this the newest are dropped and show up as a gap.
    pub held_batches_max: usize,
    /// Bytes of batches received and not yet applied, daemon-wide (held,
    /// kept from a ring, queued to shards): see `budget.rs` for what
    /// happens at it. The sockets' receive queues are sized from it too.
    pub budget_bytes: usize,
    /// ZMQ receive high-water mark of each SUB socket, in messages.
    pub sub_rcvhwm_batches: i32,
    /// Wait before the next connection attempt after one failed or dropped,
    /// first and largest: doubled after each attempt that did not connect,
    /// plus up to as much again at random, so many listeners spread out.
    pub reconnect_ivl_ms: i32,
    pub reconnect_ivl_max_ms: i32,
    /// TCP keepalive towards each publisher (`subscriber.rs`): probes after
    /// this much silence and this far apart (whole seconds, rounded up);
    /// three unanswered drop the connection, which is then reconnected.
    /// 0: none.
    pub heartbeat_ivl_ms: i32,
    /// A listener whose publisher stays unreachable this long (no ZMQ
    /// connection since it was added or since its connection dropped) has
    /// its workers cleared, once per outage; it keeps reconnecting, and a
    /// ring fill and the live stream refill them when the publisher is back.
    /// 0: never.
    pub engine_gone_ms: u64,
    /// Whether the ready gate starts open. Closed: listeners connect and hold
    /// batches until `open_ready_gate` (startup recovery).
    pub ready_gate_open: bool,
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            listener_threads: 0,
            shard_threads: 0,
            pin_threads: true,
            shard_queue_batches: 4_096,
            poll_timeout_ms: 10,
            replay_timeout_ms: 2_000,
            replay_batches_max: 16_384,
            held_batches_max: 16_384,
            budget_bytes: BUDGET_MIB_DEFAULT << 20,
            sub_rcvhwm_batches: 100_000,
            reconnect_ivl_ms: 100,
            reconnect_ivl_max_ms: 5_000,
            heartbeat_ivl_ms: HEARTBEAT_MS_DEFAULT,
            engine_gone_ms: ENGINE_GONE_S_DEFAULT * 1_000,
            ready_gate_open: true,
        }
    }
}

impl IngestConfig {
    /// Listener and shard thread counts with the defaults filled in.
    pub(crate) fn thread_counts(&self) -> (usize, usize) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let or = |n: usize, default: usize| if n == 0 { default.max(1) } else { n };
        (or(self.listener_threads, cores / 4), or(self.shard_threads, cores / 2))
    }

    /// `engine_gone_ms` as a duration; None: never.
    pub(crate) fn engine_gone(&self) -> Option<Duration> {
        (self.engine_gone_ms > 0).then(|| Duration::from_millis(self.engine_gone_ms))
    }

    /// Rejects settings that would make a queue or loop unbounded or useless.
    pub(crate) fn validate(&self) -> Result<(), String> {
        let checks: [(bool, &str); 10] = [
            (self.shard_queue_batches > 0, "shard_queue_batches must be at least 1"),
            (self.poll_timeout_ms > 0, "poll_timeout_ms must be at least 1"),
            (self.replay_timeout_ms > 0, "replay_timeout_ms must be at least 1"),
            (self.replay_batches_max > 0, "replay_batches_max must be at least 1"),
            (self.held_batches_max > 0, "held_batches_max must be at least 1"),
            (self.budget_bytes >= 1 << 20, "budget_bytes must be at least 1 MiB"),
            (self.sub_rcvhwm_batches > 0, "sub_rcvhwm_batches must be at least 1"),
            (
                self.reconnect_ivl_ms > 0 && self.reconnect_ivl_max_ms >= 0,
                "reconnect_ivl_ms must be at least 1 and reconnect_ivl_max_ms at least 0",
            ),
            (self.engine_gone_ms <= ENGINE_GONE_S_MAX * 1_000, "engine_gone_ms must be at most a day"),
            (self.listener_threads <= 256 && self.shard_threads <= 256, "at most 256 listener and 256 shard threads"),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, why)) => Err((*why).to_string()),
            None => Ok(()),
        }
    }
}
