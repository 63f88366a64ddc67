//! The parent's side of the engine processes: starts them (this bench's
//! own binary with `--child FIRST:END`), learns every engine's endpoints,
//! and sends them commands (see `child.rs` for the line protocol).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::args::Args;
use super::probe::DieWithParent;

/// Longest wait for an engine process to start or answer a command.
const ANSWER_WAIT: Duration = Duration::from_secs(600);

#[derive(Clone, Debug)]
pub struct EngineInfo {
    pub instance: u64,
    pub endpoint: String,
    pub replay: String,
}

/// What the engines published, once all are done.
#[derive(Clone, Debug, Default)]
pub struct Published {
    /// Last seq of each engine, by instance id (-1: none).
    pub last_seq: Vec<(u64, i64)>,
    /// Blocks the engines hold at the end: the pairs a daemon should hold.
    pub cached_blocks: u64,
    pub stored: u64,
    pub removed: u64,
    pub batches: u64,
    pub bytes: u64,
    /// What the rings hold now: block ops, bytes, batches.
    pub ring_ops: u64,
    pub ring_bytes: u64,
    pub ring_batches: u64,
}

pub struct Publishers {
    children: Vec<(Child, ChildStdin)>,
    lines: Receiver<(usize, String)>,
    pub engines: Vec<EngineInfo>,
    pub pids: Vec<u32>,
}

impl Publishers {
    pub fn start(a: &Args) -> Result<Publishers, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let parent_args: Vec<String> = std::env::args().skip(1).collect();
        let (tx, lines) = channel();
        let mut children = Vec::new();
        let mut pids = Vec::new();
        let mut first = 0;
        while first < a.engines {
            let end = (first + a.per_child).min(a.engines);
            let mut child = Command::new(&exe)
                .args(&parent_args)
                .arg("--child")
                .arg(format!("{first}:{end}"))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .die_with_parent()
                .spawn()
                .map_err(|e| format!("cannot start an engine process: {e}"))?;
            let stdout = child.stdout.take().expect("piped stdout");
            let stdin = child.stdin.take().expect("piped stdin");
            let n = children.len();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if tx.send((n, line)).is_err() {
                        break;
                    }
                }
                let _ = tx.send((n, "exited".into()));
            });
            pids.push(child.id());
            children.push((child, stdin));
            first = end;
        }
        let mut p = Publishers { children, lines, engines: Vec::new(), pids };
        let mut ready = 0;
        while ready < p.children.len() {
            let (n, line) = p.next_line()?;
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["engine", id, ep, replay] => p.engines.push(EngineInfo {
                    instance: id.parse().map_err(|_| format!("bad line {line:?}"))?,
                    endpoint: ep.to_string(),
                    replay: replay.to_string(),
                }),
                ["ready"] => ready += 1,
                ["exited"] => return Err(format!("engine process {n} exited while starting")),
                _ => return Err(format!("engine process {n}: unexpected {line:?}")),
            }
        }
        p.engines.sort_by_key(|e| e.instance);
        Ok(p)
    }

    fn next_line(&self) -> Result<(usize, String), String> {
        match self.lines.recv_timeout(ANSWER_WAIT) {
            Ok(l) => Ok(l),
            Err(RecvTimeoutError::Timeout) => Err("an engine process did not answer".into()),
            Err(RecvTimeoutError::Disconnected) => Err("the engine processes are gone".into()),
        }
    }

    fn send_all(&mut self, cmd: &str) -> Result<(), String> {
        for (child, stdin) in &mut self.children {
            writeln!(stdin, "{cmd}").map_err(|e| format!("engine process {}: {e}", child.id()))?;
            stdin.flush().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Waits until every publisher has `n` subscriptions.
    pub fn wait_subscribed(&mut self, n: usize) -> Result<(), String> {
        self.send_all(&format!("subs {n}"))?;
        let mut ok = 0;
        while ok < self.children.len() {
            let (c, line) = self.next_line()?;
            if line == "subs ok" {
                ok += 1;
            } else if line.starts_with("subs failed") || line == "exited" {
                return Err(format!("engine process {c}: {line}"));
            }
        }
        Ok(())
    }

    /// Starts every engine publishing all but its last `hold` requests
    /// (or the rest); `poll_published` says when all are done.
    pub fn publish(&mut self, hold: u32) -> Result<(), String> {
        self.send_all(&format!("publish {hold}"))
    }

    /// Collects the engines' `done` lines for up to `wait`; the totals once every process is done.
    pub fn poll_published(&mut self, acc: &mut (usize, Published), wait: Duration) -> Result<bool, String> {
        let deadline = Instant::now() + wait;
        while acc.0 < self.children.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            let (c, line) = match self.lines.recv_timeout(left) {
                Ok(l) => l,
                Err(RecvTimeoutError::Timeout) => return Ok(false),
                Err(RecvTimeoutError::Disconnected) => return Err("the engine processes are gone".into()),
            };
            let w: Vec<&str> = line.split_whitespace().collect();
            let num = |s: &str| s.parse::<i64>().map_err(|_| format!("engine process {c}: bad line {line:?}"));
            match w.as_slice() {
                ["done", id, last, cached] => {
                    acc.1.last_seq.push((num(id)? as u64, num(last)?));
                    acc.1.cached_blocks += num(cached)? as u64;
                }
                ["published", st, rm, ba, by, ro, rb, rn] => {
                    let p = &mut acc.1;
                    p.stored += num(st)? as u64;
                    p.removed += num(rm)? as u64;
                    p.batches += num(ba)? as u64;
                    p.bytes += num(by)? as u64;
                    p.ring_ops += num(ro)? as u64;
                    p.ring_bytes += num(rb)? as u64;
                    p.ring_batches += num(rn)? as u64;
                    acc.0 += 1;
                }
                ["exited"] => return Err(format!("engine process {c} exited while publishing")),
                _ => {}
            }
        }
        acc.1.last_seq.sort_unstable();
        Ok(true)
    }

    /// Ring requests answered so far, over every engine.
    pub fn replays(&mut self) -> Result<u64, String> {
        self.send_all("stats")?;
        let (mut got, mut total) = (0, 0);
        while got < self.children.len() {
            let (_, line) = self.next_line()?;
            if let Some(n) = line.strip_prefix("replays ") {
                total += n.trim().parse::<u64>().unwrap_or(0);
                got += 1;
            }
        }
        Ok(total)
    }

    /// Resident memory of every engine process together.
    pub fn rss(&self) -> u64 {
        self.pids.iter().map(|&p| super::probe::ProcStatus::read(p).rss).sum()
    }
}

impl Drop for Publishers {
    fn drop(&mut self) {
        for (child, stdin) in &mut self.children {
            let _ = stdin.flush();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
