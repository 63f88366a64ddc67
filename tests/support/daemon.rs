//! Runs the real `kv-indexer` binary for behaviour tests: on a free port
//! (it binds port 0 and logs the one it got), killed when dropped, with a
//! small JSON-over-HTTP client.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::WAIT_MS;

/// A running daemon.
pub struct Daemon {
    child: Child,
    pub port: u16,
    pub base: String,
    /// Lines the daemon wrote to stderr so far (drained by `log`).
    lines: mpsc::Receiver<String>,
    pub log: Vec<String>,
}

impl Daemon {
    /// Starts the daemon with `args` (plus `--port 0 --host 127.0.0.1`) and waits until it listens.
    pub fn start(args: &[&str]) -> Daemon {
        Self::start_env(args, &[])
    }

    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Daemon {
        Self::spawn(Self::command(args, env))
    }

    /// Starts the daemon with its soft limit on open files at `soft` (its
    /// hard limit unchanged), as a shell's `ulimit -Sn` would.
    #[allow(dead_code)] // not every test binary uses it
    pub fn start_with_open_files(args: &[&str], soft: u64) -> Daemon {
        use std::os::unix::process::CommandExt;
        let mut cmd = Self::command(args, &[]);
        // SAFETY: between fork and exec only getrlimit and setrlimit run,
        // both async-signal-safe, on a local struct.
        unsafe {
            cmd.pre_exec(move || {
                let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                lim.rlim_cur = soft.min(lim.rlim_max);
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Self::spawn(cmd)
    }

    fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kv-indexer"));
        cmd.args(["--port", "0", "--host", "127.0.0.1", "--no-pin"]).args(args);
        cmd.env_remove("NOTIFY_SOCKET").env_remove("DYN_ROUTER_MIN_INITIAL_WORKERS");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    fn spawn(mut cmd: Command) -> Daemon {
        let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("starting kv-indexer");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut log = Vec::new();
        let port = loop {
            let line =
                rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| panic!("daemon did not start: {log:?}"));
            log.push(line.clone());
            if let Some(rest) = line.split(" listening on ").nth(1) {
                let addr = rest.split_whitespace().next().unwrap();
                // The port ends at the first non-digit (a JSON line's closing quote).
                let port: String = addr.rsplit(':').next().unwrap().chars().take_while(char::is_ascii_digit).collect();
                break port.parse::<u16>().unwrap();
            }
        };
        Daemon { child, port, base: format!("http://127.0.0.1:{port}"), lines: rx, log }
    }

    /// Everything logged so far. A line the daemon wrote may still be on
    /// its way through the reader thread: to check for a line, use
    /// `wait_logged`, or `terminate` first (which reads the log to its end).
    pub fn log(&mut self) -> &[String] {
        while let Ok(l) = self.lines.try_recv() {
            self.log.push(l);
        }
        &self.log
    }

    /// Waits (bounded) until a logged line contains `text`; whether one did.
    pub fn wait_logged(&mut self, text: &str) -> bool {
        let deadline = Instant::now() + Duration::from_millis(WAIT_MS);
        loop {
            if self.log().iter().any(|l| l.contains(text)) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.log.push(l),
                Err(_) => return false,
            }
        }
    }

    /// Sends SIGTERM and waits for the exit, then reads the log to its end;
    /// returns the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        // SAFETY: plain kill(2) on our child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let code = self.child.wait().ok().and_then(|s| s.code());
        // The reader thread ends at the end of stderr: then every line is here.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(WAIT_MS)) {
            self.log.push(l);
        }
        code
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        request("GET", &format!("{}{path}", self.base), None)
    }

    pub fn post(&self, path: &str, body: &str) -> (u16, String) {
        request("POST", &format!("{}{path}", self.base), Some(body))
    }

    pub fn post_json(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        let (status, text) = self.post(path, &body.to_string());
        (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} answered non-JSON {text:?}: {e}")))
    }

    pub fn get_json(&self, path: &str) -> (u16, serde_json::Value) {
        let (status, text) = self.get(path);
        (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} answered non-JSON {text:?}: {e}")))
    }

    /// `/dump`, asked again while it answers 503: a test that polls it may
    /// still be reading its last reply when it asks again, and a daemon
    /// builds or sends at most two dumps at once.
    pub fn dump(&self) -> serde_json::Value {
        let mut reply = (0, serde_json::Value::Null);
        let answered = super::wait_until(|| {
            reply = self.get_json("/dump");
            reply.0 != 503
        });
        assert!(answered && reply.0 == 200, "/dump answered {}: {}", reply.0, reply.1);
        reply.1
    }
}

/// Lines of a daemon's log a failing test prints.
const FAILED_LOG_LINES: usize = 200;

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let base = self.base.clone();
            let log = self.log();
            let from = log.len().saturating_sub(FAILED_LOG_LINES);
            eprintln!("--- the last {} lines of {}'s log:", log.len() - from, base);
            log[from..].iter().for_each(|l| eprintln!("{l}"));
        }
    }
}

/// One HTTP request; any status is returned (not an error).
pub fn request(method: &str, url: &str, body: Option<&str>) -> (u16, String) {
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(20)).build();
    let req = agent.request(method, url);
    let res = match body {
        Some(b) => req.send_string(b),
        None => req.call(),
    };
    match res {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{method} {url}: {e}"),
    }
}
