//! The kv-indexer daemon: its allocator, then `kv_indexer::command_line`.

mod alloc;

fn main() -> std::process::ExitCode {
    kv_indexer::command_line(alloc::configure)
}
