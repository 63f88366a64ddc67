//! Starts an indexer service as a child process (optionally pinned to one
//! core with `taskset`), learns its port from the "listening on" line it
//! logs, waits for `/health`, and reads its CPU time from `/proc`.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Lines of a server's stderr kept for error reports.
const LOG_TAIL_LINES: usize = 50;
/// How long a server may take to log its port and then to become healthy.
const START_WAIT_MS: u64 = 120_000;

/// A running server.
pub struct Server {
    pub name: String,
    pub addr: SocketAddr,
    pub pid: u32,
    child: Option<Child>,
    tail: Arc<Mutex<VecDeque<String>>>,
}

/// Where a "listening on" log line says the server listens.
fn port_of(line: &str) -> Option<u16> {
    let rest = line.split("listening on ").nth(1)?;
    let addr = rest.split_whitespace().next()?.trim_start_matches("http://");
    let port: String = addr.rsplit(':').next()?.chars().take_while(char::is_ascii_digit).collect();
    port.parse().ok()
}

impl Server {
    /// Runs `program args` (under `taskset -c core` when `core` is given).
    pub fn spawn(name: &str, program: &str, args: &[String], core: Option<usize>) -> Result<Server, String> {
        let mut cmd = match core {
            Some(core) => {
                let mut c = Command::new("taskset");
                c.arg("-c").arg(core.to_string()).arg(program);
                c
            }
            None => Command::new(program),
        };
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        cmd.env_remove("NOTIFY_SOCKET").env_remove("DYN_ROUTER_MIN_INITIAL_WORKERS");
        let mut child = cmd.spawn().map_err(|e| format!("cannot start {program}: {e}"))?;
        let stderr = child.stderr.take().expect("piped stderr");
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = mpsc::channel();
        let keep = tail.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(port) = port_of(&line) {
                    let _ = tx.send(port);
                }
                let mut tail = keep.lock().unwrap();
                if tail.len() == LOG_TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
        let pid = child.id();
        let mut server = Server {
            name: name.to_string(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            pid,
            child: Some(child),
            tail,
        };
        let port = rx
            .recv_timeout(Duration::from_millis(START_WAIT_MS))
            .map_err(|_| format!("{name} did not log its port; log: {}", server.log_tail()))?;
        server.addr.set_port(port);
        server.wait_healthy()?;
        Ok(server)
    }

    /// A server started elsewhere; `pid` (if known) lets CPU time be read.
    pub fn external(name: &str, addr: SocketAddr, pid: u32) -> Server {
        Server { name: name.to_string(), addr, pid, child: None, tail: Arc::default() }
    }

    /// Waits until `/health` answers 200.
    pub fn wait_healthy(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_millis(START_WAIT_MS);
        loop {
            if let Ok(reply) = super::client::call(self.addr, "GET", "/health", b"") {
                if reply.status == 200 {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!("{} not healthy; log: {}", self.name, self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last lines the server logged.
    pub fn log_tail(&self) -> String {
        self.tail.lock().unwrap().iter().cloned().collect::<Vec<_>>().join(" | ")
    }

    /// User plus system CPU time of the whole process so far.
    pub fn cpu_time(&self) -> Option<Duration> {
        cpu_time_of(self.pid)
    }

    /// Resident memory in bytes.
    pub fn rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }

    /// Stops the server (SIGTERM, then SIGKILL after a grace period).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// utime + stime of `pid` from `/proc/<pid>/stat`.
pub fn cpu_time_of(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line; `rest` starts at field 3.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(Duration::from_nanos(ticks * 1_000_000_000 / hz))
}
