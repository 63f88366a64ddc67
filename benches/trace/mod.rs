//! The trace-replay benchmark's parts: trace reading, token expansion, mock
//! engines and op-stream generation, the backend interface, the replay
//! driver, verification against the engines, and reporting. Shared by
//! `benches/trace_replay.rs` and `benches/vs-dynamo` (through `#[path]`).

#![allow(dead_code)]

pub mod args;
pub mod backend;
pub mod dynamo_hash;
pub mod engine;
pub mod hashes;
pub mod mem;
pub mod mooncake;
pub mod ours;
pub mod replay;
pub mod report;
pub mod sweep;
pub mod tokens;
pub mod verify;
pub mod workload;
