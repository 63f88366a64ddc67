//! Ingest: from engine ZMQ publishers to the index, in per-worker order,
//! without drifting from the engines' true cache state, and without one slow
//! or dead engine holding up the others.
//!
//! # Shape
//!
//! Listener threads (pinned) each own many SUB sockets and sleep in one
//! epoll wait on all of them, reading only those that are ready. A listener checks each message's shape (3 frames, 8-byte seq),
//! decodes the msgpack batch, judges its seq, and sends it to the writer
//! shard that owns the worker: a stable hash of (instance, dp_rank) modulo
//! the shard count. What one wake-up makes for one shard goes as one queue
//! message. The send blocks when the shard's bounded queue is full;
//! the SUB socket's high-water mark then drops messages, and the loss shows
//! up as a seq gap, handled below. Shards own each worker's converter and
//! apply events to the worker's [`EventSink`]. Clears and removals travel
//! the same queue, so they land after the worker's earlier batches and
//! before its later ones. With one listener thread and one shard (the
//! default on up to three cores) the listener thread runs the shard itself:
//! it applies each batch where it decoded it, in the same order, and the
//! API's messages to the shard ring its doorbell.
//!
//! # Sequence rules
//!
//! Each listener key (instance, registered dp_rank) has a stream
//! (`stream/`): a watermark `last`, the highest seq dealt with, and the
//! connections known to reach the engine process whose batches it holds.
//! A SUB socket carries one connection (`subscriber.rs`: ZMQ never
//! reconnects it; the listener opens the next), so every batch carries the
//! connection it came on. A batch with seq `s` on a proven connection:
//!
//! - `s == last + 1`: applied.
//! - `s <= last`: a stale *duplicate*, dropped and counted, only when it
//!   is one of the last 64 batches dealt with and its payload digest
//!   matches the one kept for that seq; any other step back is a
//!   *restart* (a proxy between us and the engine can hide its reconnects,
//!   so a new process may speak on an old connection).
//! - `s > last + 1`: a *gap* `last+1..s`. With a replay endpoint the
//!   listener asks for it (DEALER `[b"", from]`), from the watermark itself
//!   so the ring's batch there proves it is the same process, holds the
//!   worker's live batches meanwhile, applies the replies in order, then
//!   the held batches. Replies that skip seqs or stop short are asked for
//!   again while each request makes progress (an engine's ROUTER socket
//!   drops replies that overflow its pipe). A ring that starts past the
//!   watermark has rolled past it, or is another process's: its copy of the
//!   batch that showed the gap tells which; the part it still holds is
//!   replayed and the rest given up (see resync). Without a replay
//!   endpoint, or for whatever the replay cannot deliver, see resync.
//!
//! A batch of a connection not proven to reach the stream's process (a
//! reconnect, or a watermark kept from an earlier registration or a
//! snapshot) waits for the ring fill that every new connection starts
//! (below), which proves the process the same or starts the stream over.
//! Without a ring, or when the ring never answers, it is judged as a new
//! process's: any step back is a restart, and a gap after a lost
//! connection a *rejoin* (the worker is cleared and the batch starts a new
//! stream, replayed from 0). Only a batch that continues the watermark
//! exactly is taken for the same process, the one case nothing here can
//! tell from a new process; it is counted
//! (`kv_indexer_unverified_continuations_total`).
//!
//! A new listener has no watermark unless an earlier registration of the
//! same key left one (watermarks survive remove/add) or a snapshot seeded
//! one. Its first batch is applied if `s == 0`; otherwise batches `0..s`
//! are replayed when it can. The watermark keeps beside `last` a digest of
//! batch `last`'s payload (xxh3), saved in snapshots too; a ring is checked
//! against the newest batch whose digest is known.
//!
//! # Ring fill
//!
//! An idle engine sends no batch that would show what a new listener
//! missed, so a listener with a replay endpoint does not wait for one: on
//! every new connection (the first, every reconnect, and after its stream
//! was started over for want of its engine), once the ready gate is open,
//! it asks the ring for what it may lack: from 0 without a watermark, and
//! from `last` itself with one (a gap's replay running at a reconnect is
//! dropped for it). The ring's first answer must then be batch `last` with
//! the digest we keep: it is dropped as a duplicate, the fill goes on past
//! it, and every connection up to the newest is proven. A ring that
//! answers another batch `last` or nothing from there is another process's
//! (a restart); one that starts past `last` rolled past the watermark, or
//! is another process's too (a resync). Either way the workers are cleared,
//! the watermark forgotten, every held batch dropped (the fill asked next
//! holds them too, if they were its process's), and the fill starts again
//! from 0. A fill without a watermark binds the stream to the connection it
//! was asked on when the ring first answers, again dropping every held
//! batch; it then reads the ring to its end, and once more if that end
//! comes before the newest batch dropped (the answer may predate it).
//! Batches dropped for want of room are read from the ring the same way
//! once the held ones are judged. A request running when its connection
//! drops is dropped with it: a ring answer then would vouch for a
//! connection that is gone, so the next connection asks afresh.
//! A request nothing answers is asked again; the live batches held
//! meanwhile wait at most `REPLAY_SPAN_TIMEOUTS` replay timeouts. A fill
//! that runs out so, its connection unproven, drops the held batches of
//! older connections (asked for again once) and, if the stream has a
//! watermark, clears its workers: nothing told the process. The fill
//! ends with the ring's end marker, or at the first live batch past the
//! watermark: that batch bounds it (`to`), the live stream has it and
//! everything after, and whatever of the fill's range is still missing then
//! is left to the live rules (that batch shows a gap, asked for as any
//! other). A ring that starts later than asked on a fresh stream is
//! counted as missed at join.
//!
//! A publisher sends each batch live and keeps it in its ring, so the fill
//! may apply batches the live stream has yet to deliver. The sequencer keeps
//! the seqs a fill applied for this connection (`filled`) until the live
//! stream has delivered or passed them: such a copy is a duplicate even at
//! seq 0, which would otherwise be a restart.
//!
//! # Dead engines
//!
//! A listener reconnects on its own, so a dead engine looks like one that is
//! merely slow to come back, and its blocks would stay forever. A SUB
//! socket's connection has TCP keepalive (`heartbeat_ivl_ms`), so a host
//! gone without a TCP reset drops it after three unanswered probes.
//! A listener whose publisher has been unreachable (no connection since it
//! was added, or since its connection dropped) for `engine_gone_ms` clears
//! its workers through their shards, once per outage, drops what it held,
//! forgets its watermark and keeps reconnecting; when the publisher is back
//! a ring fill and the live stream refill the workers, from 0 whatever
//! process it is. The deadline runs during startup recovery too; since a
//! peer's dump applied after such a clear may put the engine's blocks
//! back, the clear is made again when the ready gate opens.
//!
//! # Restart
//!
//! A restarted engine's cache is empty. On a restart the listener sends a
//! clear for every worker its stream has written to (through their shards,
//! so it lands before the new stream's first batch) and forgets the
//! watermark; the batch then starts a new stream as above. No block of the
//! old process survives, and no batch held from one of its connections is
//! applied after.
//!
//! # Resync
//!
//! A gap mid-stream that cannot be recovered (no replay endpoint, a replay
//! that times out, replies starting later than the ring still holds or
//! skipping seqs, an undecodable batch) may have hidden evictions, so
//! keeping the worker's blocks could claim blocks the engine no longer has.
//! The listener clears the worker instead (a *resync*, counted with the
//! lost batches) and later events rebuild it. Stores whose parent was lost
//! are dropped by the index, so after a resync the worker holds a subset of
//! the engine's blocks, never a stale one. Batches missing at the *start*
//! of a stream (a new listener joining late, or after a restart) need no
//! clear: nothing the worker holds can have been touched by them; they are
//! counted as missed at join.
//!
//! # Lifecycle
//!
//! A listener is `pending` until a connection's ZMQ handshake succeeds,
//! then `active`; `paused` while the global ready gate is closed (startup
//! recovery: batches are held, bounded, and applied in order when it
//! opens); `failed` when the peer is no ZMQ publisher (handshake failed, or
//! the connection dropped during it). A connection that fails or drops is
//! followed by the next after `reconnect_ivl_ms` (doubled while attempts
//! fail, up to `reconnect_ivl_max_ms`, with jitter), back to `pending` with
//! `last_error` saying so (and past `engine_gone_ms` its workers are
//! cleared, see dead engines). Endpoints ZMQ cannot parse are rejected by
//! `add_listener`.

mod budget;
mod config;
mod connection;
mod counters;
mod decode;
mod gone;
mod lag;
mod listener;
mod log;
pub(crate) use log::LogLimiter;
mod outbox;
mod poller;
mod replay;
mod sequencer;
mod service;
mod shard;
mod sink;
mod status;
mod stream;
mod subscriber;
mod zmq_context;

pub use config::{
    IngestConfig, BLOCK_SIZE_MAX, BUDGET_MIB_DEFAULT, BUDGET_MIB_MAX, CONTROL_TIMEOUT_MS, DP_RANKS_PER_LISTENER_MAX,
    ENGINE_GONE_S_DEFAULT, ENGINE_GONE_S_MAX, HEARTBEAT_MS_DEFAULT, HEARTBEAT_MS_MAX, LISTENERS_MAX,
};
pub use counters::IngestCounters;
pub use lag::{EventLagCounts, EVENT_LAG_BUCKETS_S};
pub use sequencer::Watermark;
pub use service::{Ingest, IngestError};
pub use sink::EventSink;
pub use status::{ListenerId, ListenerInfo, ListenerSpec, ListenerStatus};
