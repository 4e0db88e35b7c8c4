//! `activity::wait` with nobody ringing comes back by itself, after its timeout and not before
//! it. Its own test binary (one test, one process): another test's `ring` would end the wait
//! early. The lower bound is the futex's contract (a timed FUTEX_WAIT returns early only on a
//! wake or a signal, neither of which happens here), so it holds on any machine; the upper bound
//! is the harness's: without the timeout this test never ends.

use softroce::driver::activity;
use std::time::{Duration, Instant};

#[test]
fn a_quiet_wait_comes_back_by_itself() {
    let timeout = Duration::from_millis(20);
    let seen = activity::snapshot();
    let t0 = Instant::now();
    activity::wait(seen, timeout);
    let waited = t0.elapsed();
    assert_eq!(activity::snapshot(), seen, "nothing rang during the wait");
    assert!(
        waited >= timeout,
        "came back after {waited:?}, before its {timeout:?} timeout"
    );
}
