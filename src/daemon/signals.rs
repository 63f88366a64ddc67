//! SIGTERM and SIGINT as a channel message, SIGHUP as a call (the access
//! log's reopen, for logrotate, and a nudge to reread the workers file;
//! the call must be quick: it runs on this thread, which meanwhile waits
//! for no signal). The signals are blocked in every thread
//! (call `block` before spawning any) and one thread waits for them with
//! `sigwait`, so no handler runs in an arbitrary thread.

use crossbeam::channel::{bounded, Receiver};

use std::sync::{Arc, Mutex};

/// What SIGHUP runs; set once the daemon has something to reopen.
pub type Hangup = Arc<Mutex<Option<Box<dyn Fn() + Send>>>>;

fn signal_set() -> libc::sigset_t {
    // SAFETY: plain libc calls on a local, initialized signal set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        set
    }
}

/// Blocks SIGTERM, SIGINT and SIGHUP in this thread and every thread spawned after.
pub fn block() {
    let set = signal_set();
    // SAFETY: `set` is an initialized signal set.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Starts the waiting thread; the receiver yields the stop signal's number
/// once. Each SIGHUP runs what `hangup` holds then (nothing if empty).
pub fn wait_for_stop(hangup: Hangup) -> Receiver<i32> {
    let (tx, rx) = bounded(1);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let set = signal_set();
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` is initialized; sigwait writes the signal number into `sig`.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                continue;
            }
            if sig == libc::SIGHUP {
                if let Some(f) = hangup.lock().ok().as_ref().and_then(|h| h.as_ref()) {
                    f();
                }
                continue;
            }
            let _ = tx.send(sig);
            return;
        })
        .expect("spawning the signal thread");
    rx
}
