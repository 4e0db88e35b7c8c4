//! What both cores keep alike: the request slots and the comm's first fatal error.

use super::request::RequestPool;
use crate::error::{Error, Result};

/// Told of a comm's first fatal error, once (the driver WARNs it through NCCL's logger; the
/// core does no I/O itself).
pub type FailureReport = fn(&Error);

/// The request pool of a comm and whether the comm failed.
pub struct CommState {
    pub pool: RequestPool,
    /// Set at the first fatal error; every later call returns it.
    failed: Option<Error>,
    report: FailureReport,
}

impl CommState {
    pub fn new(pool: RequestPool, report: FailureReport) -> CommState {
        CommState {
            pool,
            failed: None,
            report,
        }
    }

    /// The comm's error if it failed.
    pub fn check(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    pub fn failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Record `e` as the comm's fatal error (the first one wins: it is reported once, and
    /// marked logged) and mark every request in flight failed. Returns the comm's error.
    pub fn fail(&mut self, e: Error) -> Error {
        if let Some(old) = &self.failed {
            return old.clone();
        }
        (self.report)(&e);
        let e = e.mark_logged();
        for r in self.pool.busy_mut() {
            r.set_failed();
        }
        self.failed = Some(e.clone());
        e
    }

    /// As [`CommState::fail`], but the requests already done stay done: their test still
    /// reports them (a closed receiver took them; only the rest fail).
    pub fn fail_undone(&mut self, e: Error) -> Error {
        if let Some(old) = &self.failed {
            return old.clone();
        }
        (self.report)(&e);
        let e = e.mark_logged();
        for r in self.pool.busy_mut() {
            if !r.is_done() {
                r.set_failed();
            }
        }
        self.failed = Some(e.clone());
        e
    }
}

#[cfg(test)]
mod tests {
    use super::super::request::{ReqKind, RequestPool};
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static REPORTED: AtomicUsize = AtomicUsize::new(0);

    fn count(_: &Error) {
        REPORTED.fetch_add(1, Ordering::Relaxed);
    }

    #[test]
    fn the_first_failure_wins_is_reported_once_and_marks_requests() {
        let mut s = CommState::new(RequestPool::with_capacity(4), count);
        let i = s.pool.alloc(ReqKind::Send).unwrap();
        assert!(s.check().is_ok() && !s.failed());
        let e = s.fail(Error::remote("first"));
        assert!(s.failed());
        assert!(e.logged && e.message == "first");
        let e = s.fail(Error::system("second"));
        assert_eq!(e.message, "first");
        assert_eq!(REPORTED.load(Ordering::Relaxed), 1);
        assert!(s.pool.get(i).unwrap().failed());
        assert_eq!(s.check().unwrap_err().message, "first");
    }
}
