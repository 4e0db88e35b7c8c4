//! Progress for comms NCCL is not calling. NCCL calls a comm only while it has something in
//! flight on it: a receiver whose last message arrived is not called again until the next
//! operation, and that may wait for the peer's sends — which, when the connection lost its
//! QPs, wait for this comm to answer the peer's recovery. So a comm that waits (its
//! [`Driver::idle_probe`](super::driver::Driver::idle_probe), at most every 50 ms) also steps
//! the process's comms no NCCL call reached since the last such round ([`ROUND`]) that have a
//! recovery in progress or a side-channel message waiting, exactly as their next NCCL call
//! would. It runs on the thread of that waiting call (an NCCL thread that posts anyway: no
//! thread of our own, no per-thread state of the NIC library made late).
//!
//! Each comm's data path sits in a [`Guarded`]: every NCCL call takes its lock (uncontended:
//! a step only tries it, and only on a comm idle for a round), so the data path is never run
//! by two threads at once.

use parking_lot::{Mutex, MutexGuard};
use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The shortest time between two rounds (of any thread); a comm NCCL did not call from one
/// round to the next is stepped.
const ROUND: Duration = Duration::from_millis(50);

/// What a round asks of an idle comm's data path.
pub trait Watched {
    /// Requests in flight name their comm by this address (the [`Guarded`] holding it).
    fn set_owner(&mut self, owner: *const ());
    /// Move a recovery on, or read the side channel when a message is waiting (as the next
    /// NCCL call would); nothing otherwise. An error stays in the comm's state for NCCL's
    /// next call.
    fn idle_step(&mut self);
}

/// A comm's data path and the count of NCCL calls on it, under one lock.
pub struct Guarded<T: Watched> {
    calls: Mutex<u64>,
    dp: UnsafeCell<T>,
}

/// The data path while its lock is held.
pub struct Entered<'a, T: Watched> {
    _calls: MutexGuard<'a, u64>,
    dp: &'a mut T,
}

impl<T: Watched> Deref for Entered<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.dp
    }
}

impl<T: Watched> DerefMut for Entered<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.dp
    }
}

impl<T: Watched + 'static> Guarded<T> {
    /// Box `dp`, point its requests at the box, and let the rounds see it.
    pub fn new(dp: T) -> Box<Guarded<T>> {
        let g = Box::new(Guarded {
            calls: Mutex::new(0),
            dp: UnsafeCell::new(dp),
        });
        let owner = &*g as *const Guarded<T> as *const ();
        // Counted as a call: the first round only notes the count.
        g.enter().set_owner(owner);
        register(Entry {
            comm: owner,
            step: step::<T>,
            seen: u64::MAX,
        });
        g
    }
}

impl<T: Watched> Guarded<T> {
    /// An NCCL call: the data path, exclusively.
    pub fn enter(&self) -> Entered<'_, T> {
        let mut calls = self.calls.lock();
        *calls = calls.wrapping_add(1);
        Entered {
            _calls: calls,
            // SAFETY: the lock is held for as long as the reference lives (both in `Entered`),
            // and every access to `dp` takes it first.
            dp: unsafe { &mut *self.dp.get() },
        }
    }
}

impl<T: Watched> Drop for Guarded<T> {
    fn drop(&mut self) {
        // Before the data path is freed: rounds step comms under the registry's lock, so once
        // this returns none steps or holds this one.
        unregister(self as *const Guarded<T> as *const ());
    }
}

// SAFETY: the data path is reached only under `calls`' lock (see `enter`); what it holds
// (verbs objects, sockets, its own memory) is usable from any thread.
unsafe impl<T: Watched> Sync for Guarded<T> {}
// SAFETY: as above.
unsafe impl<T: Watched> Send for Guarded<T> {}

/// One watched comm.
struct Entry {
    comm: *const (),
    /// Steps the comm at `comm` when no call reached it since `seen` calls.
    step: unsafe fn(*const (), &mut u64),
    /// NCCL's call count when the last round looked.
    seen: u64,
}

// SAFETY: `comm` is only dereferenced through `step`, under the registry lock, while the comm
// is registered (it unregisters before it is freed).
unsafe impl Send for Entry {}

/// # Safety
/// `comm` is a registered (so live) `Guarded<T>`.
unsafe fn step<T: Watched>(comm: *const (), seen: &mut u64) {
    // SAFETY: per the contract.
    let g = unsafe { &*(comm as *const Guarded<T>) };
    let Some(calls) = g.calls.try_lock() else {
        return;
    };
    let idle = *calls == *seen;
    *seen = *calls;
    if idle {
        // SAFETY: the lock is held.
        unsafe { &mut *g.dp.get() }.idle_step();
    }
}

fn registry() -> &'static Mutex<Vec<Entry>> {
    static REGISTRY: OnceLock<Mutex<Vec<Entry>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(Vec::new()))
}

fn register(e: Entry) {
    registry().lock().push(e);
}

fn unregister(comm: *const ()) {
    registry().lock().retain(|e| e.comm != comm);
}

/// A round, unless another thread runs one or had one less than [`ROUND`] ago: step the
/// comms no NCCL call reached since the last round. Called by a comm that waits, holding its
/// own lock (a round only tries the others', so it skips that one and never blocks).
pub(crate) fn step_idle_comms() {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let Some(mut last) = LAST.try_lock() else {
        return;
    };
    if !crate::transport::clock::due(&mut last, ROUND) {
        return;
    }
    let Some(mut list) = registry().try_lock() else {
        return;
    };
    for e in list.iter_mut() {
        // SAFETY: registered entries are live comms (the registry lock is held).
        unsafe { (e.step)(e.comm, &mut e.seen) };
    }
}
