//! SIGTERM and SIGINT as a channel message. The signals are blocked in every
//! thread (call `block` before spawning any) and one thread waits for them
//! with `sigwait`, so no handler runs in an arbitrary thread.

use crossbeam::channel::{bounded, Receiver};

/// Blocks SIGTERM and SIGINT in this thread and every thread spawned after.
pub fn block() {
    // SAFETY: plain libc calls on a local, initialized signal set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Starts the waiting thread; the receiver yields the signal number once.
pub fn wait_for_stop() -> Receiver<i32> {
    let (tx, rx) = bounded(1);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            // SAFETY: as in `block`; sigwait writes the signal number into `sig`.
            let sig = unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGTERM);
                libc::sigaddset(&mut set, libc::SIGINT);
                let mut sig: libc::c_int = 0;
                libc::sigwait(&set, &mut sig);
                sig
            };
            let _ = tx.send(sig);
        })
        .expect("spawning the signal thread");
    rx
}
