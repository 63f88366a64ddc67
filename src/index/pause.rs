//! Pause points: every place where a writer has just made a change a
//! reader can see, and every place where a query's walk moves on.
//!
//! The reader/writer protocol is proven by tests that stop one side at
//! each of these points and run the other side meanwhile (`race_tests`):
//! a unit test installs a hook on its thread, and the hook runs at every
//! point that thread reaches. Outside unit tests `point` is empty and
//! compiles to nothing.

#[cfg(test)]
use std::cell::RefCell;

/// What may run while a thread is stopped at a point.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Point {
    /// The thread holds the tree lock: only queries can run.
    Locked,
    /// The thread holds no lock of the index: writers of other workers can run too.
    Open,
}

#[cfg(test)]
type Hook = Box<dyn FnMut(Point)>;

#[cfg(test)]
thread_local! {
    static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

#[cfg(test)]
fn run(p: Point) {
    // Taken out while it runs, so that a hook never runs inside itself.
    let hook = HOOK.with(|h| h.borrow_mut().take());
    if let Some(mut hook) = hook {
        hook(p);
        HOOK.with(|h| *h.borrow_mut() = Some(hook));
    }
}

/// A change readers can see was just made, under the tree lock (or a
/// query's walk moves on).
#[inline(always)]
pub(crate) fn point() {
    #[cfg(test)]
    run(Point::Locked);
}

/// A writer is between steps and holds no lock of the index, or a query's
/// walk moves on.
#[inline(always)]
pub(crate) fn open() {
    #[cfg(test)]
    run(Point::Open);
}

/// Runs `f` with `hook` called at every pause point this thread reaches.
#[cfg(test)]
pub(crate) fn with_hook<R>(hook: impl FnMut(Point) + 'static, f: impl FnOnce() -> R) -> R {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            HOOK.with(|h| *h.borrow_mut() = None);
        }
    }
    HOOK.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
    let _reset = Reset;
    f()
}
