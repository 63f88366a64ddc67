//! The kv-indexer daemon: command line to `daemon::run`.

mod alloc;

use kv_indexer::config::{parse, usage, Command};
use std::process::ExitCode;

fn main() -> ExitCode {
    let env = |k: &str| std::env::var(k).ok();
    match parse(std::env::args_os().skip(1), env) {
        Ok(Command::Help) => {
            print!("{}", usage());
            ExitCode::SUCCESS
        }
        Ok(Command::Version) => {
            println!("kv-indexer {}", kv_indexer::version());
            ExitCode::SUCCESS
        }
        Ok(Command::Run(cfg)) => {
            alloc::configure();
            match kv_indexer::daemon::run(*cfg) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("kv-indexer: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            eprintln!("kv-indexer: {e}");
            ExitCode::from(2)
        }
    }
}
