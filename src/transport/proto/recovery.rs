//! Recovery of a connection whose QPs failed while its side channel lives: both ends
//! replace their QPs, exchange the new ones over the side channel, agree on what completed and
//! post the rest again, so every message completes exactly once with NCCL seeing only success.
//!
//! One attempt is an *epoch*. Either end starts one when a QP of the connection fails (a
//! failed completion, a fatal QP event), or when the peer's [`Hello`] names a newer epoch than
//! its own. Per epoch, on each end:
//!
//! 1. **Rebuild**: stop posting (the cores' `begin_recovery`), take what the old QPs still
//!    completed, destroy them (a completion they still hold is simply never taken), create new
//!    ones; the receiver posts their receives (`RecvCore::repost_receives`).
//! 2. **Hello** to the peer: the new QPs, and the report — the receiver's completions taken per
//!    QP (`RecvCore::taken`), the sender's next FIFO entry (`SendCore::fifo_head`).
//! 3. With the peer's Hello of the same epoch: **connect** the new QPs to the peer's (RTR,
//!    RTS). The sender then sends **Ready**.
//! 4. The receiver, with the sender's Ready (the sender's QPs take writes now): **resume** —
//!    write its CTS entries the sender has not consumed again (`RecvCore::resume`), and when
//!    those writes completed (landed), send its Ready. A rewrite must not land after the
//!    sender took the entry (it would cover the sizes a grouped send stages there), hence
//!    the order.
//! 5. The sender, with the receiver's Ready: **resume** — complete what the receiver took and
//!    post the rest again (`SendCore::resume`).
//!
//! A failure during an attempt (the new QPs fail too, creating or connecting them fails, or
//! the peer's next message does not come within [`PEER_WAIT`]) starts the next epoch after a
//! backoff that doubles up to [`MAX_BACKOFF`]; the attempts go on until
//! the bound (`FERROCE_RECOVERY_TIMEOUT_SEC`) since the first failure, then the comm fails with
//! what was tried. Messages of an older epoch are dropped (late or duplicated), a newer one is
//! joined. A peer whose side channel closed is an error at once, never a recovery (the
//! driver's side-channel read fails the comm).
//!
//! This is pure: inputs are events with the time, outputs are [`Action`]s for the driver.

use super::time::Time;
use crate::error::Error;
use std::time::Duration;

/// The first wait before a new attempt (unless set otherwise); it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long an attempt waits for the peer's next message (its Hello, its Ready) or for the
/// receiver's rewrites to land before it counts as failed and the next one starts. The peer
/// answers within its rebuild (the receiver's drain: at most a second) and a side-channel
/// round trip; one that missed an epoch joins the next (newer epochs are always joined), so
/// an attempt never waits on the peer for the whole bound.
pub const PEER_WAIT: Duration = Duration::from_secs(3);

/// Which end of the connection this is: the receiver's Ready waits for its CTS rewrites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Sender,
    Receiver,
}

/// What the driver does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Stop posting (the cores' `begin_recovery`): the next attempt starts after a backoff.
    Pause,
    /// Stop posting, destroy the QPs and create new ones for `epoch`; then call
    /// [`Recovery::rebuilt`] (or [`Recovery::attempt_failed`]).
    Rebuild { epoch: u32 },
    /// Send this side's Hello of `epoch` (new QPs and report) to the peer.
    SendHello { epoch: u32 },
    /// Connect the new QPs to those of the peer's Hello; then call [`Recovery::connected`].
    Connect { epoch: u32 },
    /// Send Ready of `epoch` to the peer.
    SendReady { epoch: u32 },
    /// Resume the core with the peer's report (the receiver: then call
    /// [`Recovery::landed`] once its CTS rewrites completed).
    Resume { epoch: u32 },
    /// Give up: the comm fails with this error.
    Fail(Error),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Running,
    /// Waiting until `at` before the next attempt.
    Backoff {
        at: Time,
    },
    /// The driver rebuilds the QPs.
    Rebuilding,
    /// Our Hello is sent; the peer's is awaited.
    AwaitHello,
    /// The driver connects the new QPs.
    Connecting,
    /// Connected (the sender: and its Ready sent); the peer's Ready is awaited.
    AwaitReady,
    /// The receiver resumed; its CTS rewrites are on their way.
    Landing,
}

/// One end's recovery state.
#[derive(Debug)]
pub struct Recovery {
    role: Role,
    epoch: u32,
    phase: Phase,
    /// When the first [`Recovery::tick`] saw the phase that waits on the peer (unset at each
    /// change of phase).
    waiting_since: Option<Time>,
    peer_hello: Option<u32>,
    peer_ready: Option<u32>,
    /// When the first failure of the recovery in progress happened. Kept after a resume until
    /// the connection made progress ([`Recovery::progressed`]): QPs that fail again right
    /// after each recovery count against one bound, with a growing backoff.
    since: Option<Time>,
    timeout: Duration,
    backoff: Duration,
    first_backoff: Duration,
    /// Attempts of one recovery before it gives up (0: only the time bound).
    max_attempts: u32,
    /// Attempts of the recovery in progress.
    attempts_now: u32,
    /// Attempts started, and recoveries completed, since the comm was made.
    pub attempts: u32,
    pub recovered: u32,
    /// What the last failure was (for the final error).
    last_cause: String,
    peer: String,
}

impl Recovery {
    /// `timeout`: the bound since the first failure; zero turns recovery off (the first
    /// failure fails the comm, as before).
    pub fn new(role: Role, timeout: Duration, peer: String) -> Recovery {
        Recovery {
            role,
            epoch: 0,
            phase: Phase::Running,
            waiting_since: None,
            peer_hello: None,
            peer_ready: None,
            since: None,
            timeout,
            backoff: FIRST_BACKOFF,
            first_backoff: FIRST_BACKOFF,
            max_attempts: 0,
            attempts_now: 0,
            attempts: 0,
            recovered: 0,
            last_cause: String::new(),
            peer,
        }
    }

    /// The first wait between two attempts, and the most attempts of one recovery (0: no
    /// bound but the time).
    pub fn with_limits(mut self, first_backoff: Duration, max_attempts: u32) -> Recovery {
        self.first_backoff = first_backoff.min(MAX_BACKOFF);
        self.backoff = self.first_backoff;
        self.max_attempts = max_attempts;
        self
    }

    pub fn enabled(&self) -> bool {
        !self.timeout.is_zero()
    }

    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Whether a recovery is in progress (the cores must not post).
    pub fn active(&self) -> bool {
        self.phase != Phase::Running
    }

    /// Whether the connection recovered and has not completed anything since.
    pub fn unproven(&self) -> bool {
        self.phase == Phase::Running && self.since.is_some()
    }

    /// How long the recovery in progress has taken.
    pub fn elapsed(&self, now: Time) -> Duration {
        self.since.map_or(Duration::ZERO, |s| now.saturating_since(s))
    }

    fn set_phase(&mut self, phase: Phase) {
        self.phase = phase;
        self.waiting_since = None;
    }

    fn start_epoch(&mut self, epoch: u32) -> Action {
        self.epoch = epoch;
        self.set_phase(Phase::Rebuilding);
        self.attempts += 1;
        self.attempts_now += 1;
        Action::Rebuild { epoch }
    }

    fn attempts_in_recovery(&self) -> u32 {
        self.attempts_now
    }

    fn give_up(&mut self, now: Time) -> Action {
        let e = Error::remote(format!(
            "the connection to {} lost its QPs and could not be recovered within {:?} ({} attempts; last: {}): check the link and port state (ibv_devinfo) on both hosts, and FERROCE_RECOVERY_TIMEOUT_SEC",
            self.peer,
            self.elapsed(now),
            self.attempts_now,
            self.last_cause
        ));
        self.set_phase(Phase::Running);
        Action::Fail(e)
    }

    /// A QP of the connection failed (`cause` in words). Starts a recovery, or the next
    /// attempt of the one in progress (after its backoff).
    pub fn local_failure(&mut self, now: Time, cause: &str) -> Vec<Action> {
        self.last_cause = cause.to_string();
        if !self.enabled() {
            return vec![Action::Fail(Error::remote(cause.to_string()))];
        }
        match self.phase {
            Phase::Running if self.since.is_some() => {
                // Failed again before anything completed since the last recovery.
                let mut out = vec![Action::Pause];
                out.extend(self.attempt_failed(now, cause));
                out
            }
            Phase::Running => {
                self.since = Some(now);
                self.backoff = self.first_backoff;
                self.attempts_now = 0;
                self.peer_hello = None;
                self.peer_ready = None;
                vec![self.start_epoch(self.epoch.wrapping_add(1))]
            }
            // Already waiting for the next attempt, or rebuilding (the failure is of the QPs
            // being replaced): nothing new.
            Phase::Backoff { .. } | Phase::Rebuilding => Vec::new(),
            // The new QPs of this attempt failed: the next attempt after the backoff.
            Phase::AwaitHello | Phase::Connecting | Phase::AwaitReady | Phase::Landing => {
                self.attempt_failed(now, cause)
            }
        }
    }

    /// The attempt in progress failed (rebuilding or connecting the QPs, or the new QPs
    /// failed): wait, then try again — or give up past the bound.
    pub fn attempt_failed(&mut self, now: Time, cause: &str) -> Vec<Action> {
        self.last_cause = cause.to_string();
        let out_of_attempts = self.max_attempts > 0 && self.attempts_in_recovery() >= self.max_attempts;
        if self.elapsed(now) >= self.timeout || out_of_attempts {
            return vec![self.give_up(now)];
        }
        self.set_phase(Phase::Backoff { at: now + self.backoff });
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        Vec::new()
    }

    /// The driver replaced the QPs for `epoch`: send our Hello, and connect at once when the
    /// peer's Hello of this epoch is already here.
    pub fn rebuilt(&mut self, epoch: u32) -> Vec<Action> {
        if epoch != self.epoch || self.phase != Phase::Rebuilding {
            return Vec::new();
        }
        if self.peer_hello == Some(epoch) {
            self.set_phase(Phase::Connecting);
            vec![Action::SendHello { epoch }, Action::Connect { epoch }]
        } else {
            self.set_phase(Phase::AwaitHello);
            vec![Action::SendHello { epoch }]
        }
    }

    /// The peer's Hello of `epoch` arrived.
    pub fn peer_hello(&mut self, now: Time, epoch: u32) -> Vec<Action> {
        if !self.enabled() {
            return vec![Action::Fail(Error::remote(format!(
                "the peer {} started a recovery of the connection, which this side has turned off (FERROCE_RECOVERY_TIMEOUT_SEC=0)",
                self.peer
            )))];
        }
        if epoch < self.epoch || (epoch == self.epoch && self.peer_hello == Some(epoch)) {
            // Late or duplicated.
            return Vec::new();
        }
        if epoch > self.epoch || self.phase == Phase::Running {
            // The peer saw a failure first, or a newer one: join its epoch.
            if self.phase == Phase::Running {
                self.since = Some(now);
                self.backoff = self.first_backoff;
                self.attempts_now = 0;
                self.last_cause = format!("the peer {} reported its QPs failed", self.peer);
            }
            self.peer_hello = Some(epoch);
            self.peer_ready = None;
            return vec![self.start_epoch(epoch)];
        }
        self.peer_hello = Some(epoch);
        if self.phase == Phase::AwaitHello {
            self.set_phase(Phase::Connecting);
            return vec![Action::Connect { epoch }];
        }
        Vec::new()
    }

    /// The driver connected the new QPs of `epoch` to the peer's. The sender sends Ready;
    /// either resumes at once when the peer's Ready is already here.
    pub fn connected(&mut self, epoch: u32) -> Vec<Action> {
        if epoch != self.epoch || self.phase != Phase::Connecting {
            return Vec::new();
        }
        self.set_phase(Phase::AwaitReady);
        let mut out = Vec::new();
        if self.role == Role::Sender {
            out.push(Action::SendReady { epoch });
        }
        if self.peer_ready == Some(epoch) {
            out.push(self.resume());
        }
        out
    }

    /// The peer's Ready of `epoch` arrived.
    pub fn peer_ready(&mut self, epoch: u32) -> Vec<Action> {
        if epoch != self.epoch || self.peer_ready == Some(epoch) {
            return Vec::new();
        }
        self.peer_ready = Some(epoch);
        if self.phase == Phase::AwaitReady {
            return vec![self.resume()];
        }
        Vec::new()
    }

    fn resume(&mut self) -> Action {
        match self.role {
            Role::Sender => self.finish(),
            Role::Receiver => self.set_phase(Phase::Landing),
        }
        Action::Resume { epoch: self.epoch }
    }

    fn finish(&mut self) {
        self.set_phase(Phase::Running);
        self.recovered += 1;
    }

    /// A work request of the new QPs completed: the recovery worked; a later failure starts
    /// a new one with its own bound.
    pub fn progressed(&mut self) {
        if self.phase == Phase::Running {
            self.since = None;
            self.backoff = self.first_backoff;
            self.attempts_now = 0;
        }
    }

    /// The receiver's CTS rewrites of `epoch` landed: send Ready; the recovery is over.
    pub fn landed(&mut self, epoch: u32) -> Vec<Action> {
        if epoch != self.epoch || self.phase != Phase::Landing {
            return Vec::new();
        }
        self.finish();
        vec![Action::SendReady { epoch }]
    }

    /// Whether the receiver waits for its CTS rewrites to land.
    pub fn landing(&self) -> bool {
        self.phase == Phase::Landing
    }

    /// The time: the next attempt when its backoff is over; an attempt that waited
    /// [`PEER_WAIT`] on the peer failed; the end past the bound.
    pub fn tick(&mut self, now: Time) -> Vec<Action> {
        match self.phase {
            Phase::Running => Vec::new(),
            _ if self.elapsed(now) >= self.timeout => vec![self.give_up(now)],
            Phase::Backoff { at } if now >= at => {
                self.peer_hello = None;
                self.peer_ready = None;
                vec![self.start_epoch(self.epoch.wrapping_add(1))]
            }
            Phase::AwaitHello | Phase::AwaitReady | Phase::Landing => {
                let since = *self.waiting_since.get_or_insert(now);
                if now.saturating_since(since) < PEER_WAIT {
                    return Vec::new();
                }
                let (epoch, peer) = (self.epoch, &self.peer);
                let cause = match self.phase {
                    Phase::AwaitHello => {
                        format!("attempt {epoch}: no Hello (new QPs) from the peer {peer} within {PEER_WAIT:?}")
                    }
                    Phase::AwaitReady => format!("attempt {epoch}: no Ready from the peer {peer} within {PEER_WAIT:?}"),
                    _ => format!(
                        "attempt {epoch}: the CTS rewrites to the peer {peer} did not complete within {PEER_WAIT:?}"
                    ),
                };
                self.attempt_failed(now, &cause)
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Time {
        Time::ZERO + Duration::from_millis(ms)
    }

    /// A sender and its receiver.
    fn pair() -> (Recovery, Recovery) {
        let d = Duration::from_secs(10);
        (
            Recovery::new(Role::Sender, d, "b".into()),
            Recovery::new(Role::Receiver, d, "a".into()),
        )
    }

    #[test]
    fn one_side_fails_both_rebuild_connect_and_resume_the_receiver_after_its_rewrites() {
        let (mut a, mut b) = pair();
        assert_eq!(
            a.local_failure(t(0), "retry exceeded"),
            vec![Action::Rebuild { epoch: 1 }]
        );
        assert_eq!(a.rebuilt(1), vec![Action::SendHello { epoch: 1 }]);
        assert_eq!(b.peer_hello(t(1), 1), vec![Action::Rebuild { epoch: 1 }]);
        assert_eq!(
            b.rebuilt(1),
            vec![Action::SendHello { epoch: 1 }, Action::Connect { epoch: 1 }]
        );
        assert_eq!(b.connected(1), vec![], "the receiver waits for the sender's Ready");
        assert_eq!(a.peer_hello(t(2), 1), vec![Action::Connect { epoch: 1 }]);
        assert_eq!(a.connected(1), vec![Action::SendReady { epoch: 1 }]);
        assert_eq!(b.peer_ready(1), vec![Action::Resume { epoch: 1 }]);
        assert!(b.landing() && b.active());
        assert_eq!(b.landed(1), vec![Action::SendReady { epoch: 1 }]);
        assert_eq!(a.peer_ready(1), vec![Action::Resume { epoch: 1 }]);
        assert!(!a.active() && !b.active());
        assert_eq!((a.recovered, b.recovered), (1, 1));
    }

    #[test]
    fn duplicate_and_stale_messages_are_dropped_and_a_newer_epoch_is_joined() {
        let (_, mut a) = pair();
        a.local_failure(t(0), "x");
        a.rebuilt(1);
        assert_eq!(a.peer_hello(t(1), 1), vec![Action::Connect { epoch: 1 }]);
        assert_eq!(a.peer_hello(t(1), 1), vec![], "duplicate");
        assert_eq!(a.peer_hello(t(1), 0), vec![], "stale");
        assert_eq!(a.peer_ready(0), vec![]);
        assert_eq!(
            a.peer_hello(t(2), 3),
            vec![Action::Rebuild { epoch: 3 }],
            "the peer is ahead"
        );
        assert_eq!(a.rebuilt(1), vec![], "a rebuild of an old epoch");
        assert_eq!(
            a.rebuilt(3),
            vec![Action::SendHello { epoch: 3 }, Action::Connect { epoch: 3 }]
        );
    }

    #[test]
    fn an_attempt_the_peer_does_not_answer_is_followed_by_a_newer_one_the_peer_joins() {
        let (mut a, mut b) = pair();
        a.local_failure(t(0), "port down");
        assert_eq!(a.rebuilt(1), vec![Action::SendHello { epoch: 1 }]);
        // The Hello of epoch 1 never reaches b (it missed it).
        assert_eq!(a.tick(t(10)), vec![]);
        assert_eq!(a.tick(t(2999)), vec![], "within PEER_WAIT of the first tick");
        assert_eq!(a.tick(t(3010)), vec![], "the wait failed the attempt: backoff");
        assert_eq!(a.tick(t(3110)), vec![Action::Rebuild { epoch: 2 }]);
        assert_eq!(a.rebuilt(2), vec![Action::SendHello { epoch: 2 }]);
        assert_eq!(b.peer_hello(t(3120), 2), vec![Action::Rebuild { epoch: 2 }]);
        assert_eq!(
            b.rebuilt(2),
            vec![Action::SendHello { epoch: 2 }, Action::Connect { epoch: 2 }]
        );
        assert_eq!(b.connected(2), vec![]);
        assert_eq!(a.peer_hello(t(3130), 2), vec![Action::Connect { epoch: 2 }]);
        assert_eq!(a.connected(2), vec![Action::SendReady { epoch: 2 }]);
        // Each wait starts anew with its phase: the Ready is waited for from here.
        assert_eq!(a.tick(t(6000)), vec![]);
        assert_eq!(b.peer_ready(2), vec![Action::Resume { epoch: 2 }]);
        assert_eq!(b.landed(2), vec![Action::SendReady { epoch: 2 }]);
        assert_eq!(a.peer_ready(2), vec![Action::Resume { epoch: 2 }]);
        assert!(!a.active() && !b.active());
        assert_eq!(a.attempts, 2);
    }

    #[test]
    fn a_peer_that_never_answers_fails_the_comm_at_the_bound_naming_what_was_awaited() {
        let mut a = Recovery::new(Role::Receiver, Duration::from_secs(10), "peer".into());
        a.local_failure(t(0), "port down");
        a.rebuilt(1);
        let mut failed = None;
        for ms in (0..11_000).step_by(10) {
            for act in a.tick(t(ms)) {
                match act {
                    Action::Rebuild { epoch } => {
                        a.rebuilt(epoch);
                    }
                    Action::Fail(e) => failed = Some((ms, e)),
                    other => panic!("{other:?}"),
                }
            }
            if failed.is_some() {
                break;
            }
        }
        let (ms, e) = failed.expect("gave up");
        assert_eq!(ms, 10_000, "at the bound");
        assert!(
            e.message.contains("no Hello (new QPs) from the peer peer"),
            "{}",
            e.message
        );
        assert!(a.attempts >= 3, "{} attempts", a.attempts);
    }

    #[test]
    fn failed_attempts_back_off_and_give_up_past_the_bound() {
        let mut a = Recovery::new(Role::Sender, Duration::from_secs(1), "peer".into());
        a.local_failure(t(0), "port down");
        a.rebuilt(1);
        assert_eq!(a.local_failure(t(10), "retry exceeded"), vec![]);
        assert_eq!(a.tick(t(50)), vec![], "backoff 100 ms");
        assert_eq!(a.tick(t(110)), vec![Action::Rebuild { epoch: 2 }]);
        assert_eq!(a.attempt_failed(t(120), "modify to RTR failed"), vec![]);
        assert_eq!(a.tick(t(250)), vec![], "backoff 200 ms");
        assert_eq!(a.tick(t(320)), vec![Action::Rebuild { epoch: 3 }]);
        match a.tick(t(1000)).as_slice() {
            [Action::Fail(e)] => {
                assert!(
                    e.message.contains("3 attempts") && e.message.contains("RTR"),
                    "{}",
                    e.message
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(!a.active());
    }

    #[test]
    fn a_failure_right_after_a_resume_backs_off_and_counts_against_the_same_bound() {
        let mut a = Recovery::new(Role::Sender, Duration::from_secs(1), "peer".into());
        a.local_failure(t(0), "x");
        a.rebuilt(1);
        a.peer_hello(t(1), 1);
        a.connected(1);
        assert_eq!(a.peer_ready(1), vec![Action::Resume { epoch: 1 }]);
        assert!(a.unproven());
        assert_eq!(a.local_failure(t(5), "again"), vec![Action::Pause]);
        assert_eq!(a.tick(t(110)), vec![Action::Rebuild { epoch: 2 }]);
        a.rebuilt(2);
        a.peer_hello(t(120), 2);
        a.connected(2);
        a.peer_ready(2);
        a.progressed();
        assert!(!a.unproven());
        assert_eq!(
            a.local_failure(t(5000), "much later"),
            vec![Action::Rebuild { epoch: 3 }],
            "a new bound"
        );
    }

    #[test]
    fn a_bound_on_attempts_gives_up_after_that_many() {
        let mut a = Recovery::new(Role::Sender, Duration::from_secs(100), "peer".into())
            .with_limits(Duration::from_millis(10), 2);
        a.local_failure(t(0), "x");
        assert_eq!(a.attempt_failed(t(1), "RTR failed"), vec![], "attempt 1 of 2");
        assert_eq!(
            a.tick(t(12)),
            vec![Action::Rebuild { epoch: 2 }],
            "after the 10 ms first wait"
        );
        match a.attempt_failed(t(13), "RTR failed").as_slice() {
            [Action::Fail(e)] => assert!(e.message.contains("2 attempts"), "{}", e.message),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn turned_off_the_first_failure_fails_the_comm() {
        let mut a = Recovery::new(Role::Sender, Duration::ZERO, "peer".into());
        assert!(matches!(a.local_failure(t(0), "x").as_slice(), [Action::Fail(_)]));
        assert!(matches!(a.peer_hello(t(0), 1).as_slice(), [Action::Fail(_)]));
    }
}
