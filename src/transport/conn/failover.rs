//! Which members of a fused device a connection's QPs use: striped over every member at the
//! start (active-standby: the first one that is up), and, when a recovery makes new QPs, only
//! the members whose ports are up and whose paths answer (NCCL_IB_RESILIENCY_PORT_FAILOVER),
//! the others marked failed over until they are back (failback).

use super::devices::{port_actives, port_is_active};
use super::Conn;
use crate::config;
use crate::device::NetDevice;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The first wait before a member whose path stopped answering is tried again; it doubles
/// with each failure of that member, up to [`PATH_RETRY_MAX`].
const PATH_RETRY_FIRST: Duration = Duration::from_secs(1);
const PATH_RETRY_MAX: Duration = Duration::from_secs(60);

/// QP i of `nqps` on local device i mod ndevs.
fn striped(ndevs: usize, nqps: usize) -> Vec<usize> {
    (0..nqps).map(|i| i % ndevs.max(1)).collect()
}

/// Where a connection's `nqps` QPs start: striped over the members, or, active-standby, all
/// on the first member whose port is ACTIVE (the first member when none is).
pub fn initial_placement(members: &[Arc<NetDevice>], nqps: usize) -> Vec<usize> {
    if !config::get().active_standby_for(members.len()) {
        return striped(members.len(), nqps);
    }
    let primary = members.iter().position(|m| port_is_active(m)).unwrap_or(0);
    vec![primary; nqps]
}

impl Conn {
    /// Where a recovery puts the connection's `nqps` QPs: striped over the members whose
    /// ports are up (all of them when none is, so that the attempt fails and is retried), or,
    /// active-standby, all on the first of them. A member left out that the QPs would
    /// otherwise use is marked failed over, with its port's `port_actives` then.
    pub(super) fn placement(&mut self, nqps: usize) -> Vec<usize> {
        let failover = config::get().port_failover && self.devs.len() > 1;
        let now = Instant::now();
        // The counts first: a PORT_ACTIVE after the query is then a change.
        let actives: Vec<u32> = self.devs.iter().map(|d| port_actives(&d.dev)).collect();
        let up: Vec<bool> = self.devs.iter().map(|d| !failover || port_is_active(&d.dev)).collect();
        for (d, &up) in self.devs.iter_mut().zip(&up) {
            if !up || d.path_retry_at.is_some_and(|t| now >= t) {
                // A port that is down explains the failed retries; a wait that is over ends.
                d.path_retry_at = None;
            }
        }
        let answering: Vec<bool> = self.devs.iter().map(|d| d.path_retry_at.is_none()).collect();
        let chosen = choose_members(self.spec.standby, &up, &answering);
        for (i, d) in self.devs.iter_mut().enumerate() {
            d.failed_over = chosen.left_out.contains(&i).then_some(actives[i]);
        }
        if chosen.used.is_empty() {
            return striped(self.devs.len(), nqps);
        }
        (0..nqps).map(|i| chosen.used[i % chosen.used.len()]).collect()
    }

    /// A QP on member `dev` ran out of retries: on a fused device with failover, the member
    /// is left out of the next recovery while another answers, for a wait that doubles per
    /// failure.
    pub fn note_path_failure(&mut self, dev: usize) {
        if !config::get().port_failover || self.devs.len() < 2 || dev >= self.devs.len() {
            return;
        }
        let d = &mut self.devs[dev];
        if d.path_retry_at.is_some() {
            return;
        }
        let wait = PATH_RETRY_FIRST
            .saturating_mul(1u32 << d.path_failures.min(6))
            .min(PATH_RETRY_MAX);
        d.path_failures += 1;
        d.path_retry_at = Some(Instant::now() + wait);
    }

    /// A member whose QPs a recovery moved to the others is to be used again: its port is up
    /// again (an `IBV_EVENT_PORT_ACTIVE` since, and ACTIVE now), or the wait after its path
    /// failed is over (and its port is ACTIVE). Its label, and why, so the QPs move back.
    ///
    /// Active-standby, a standby whose probe failed is probed again (over a new probe QP, which
    /// takes a recovery) once its wait is over. The cause in words, for the recovery's WARN.
    pub fn member_back(&self) -> Option<String> {
        // Asked on every poll: without a member failed over or a failed probe nothing can be
        // back, and the clock is not read.
        if self.devs.iter().all(|d| d.failed_over.is_none()) && !self.probes.iter().any(|p| p.failed) {
            return None;
        }
        let now = Instant::now();
        self.devs.iter().enumerate().find_map(|(i, d)| {
            let waited = d.path_retry_at.is_none_or(|t| now >= t);
            let cause = if let Some(base) = d.failed_over {
                let why = match d.path_retry_at {
                    Some(t) if now >= t => "the wait after its path stopped answering is over",
                    Some(_) => return None,
                    None if port_actives(&d.dev) != base => "its port is up again (IBV_EVENT_PORT_ACTIVE)",
                    None => return None,
                };
                format!(
                    "member {} of the fused device is to be used again: {why}; moving its QPs back to it (failback)",
                    d.dev.label()
                )
            } else if waited && self.probes.iter().any(|p| p.dev == i && p.failed) {
                format!(
                    "standby member {} of the fused device is to be probed again (the wait after its probe failed is over); making a new probe QP for it",
                    d.dev.label()
                )
            } else {
                return None;
            };
            port_is_active(&d.dev).then_some(cause)
        })
    }

    /// Labels of the members the connection's QPs left (their ports were down).
    pub fn failed_over_members(&self) -> Vec<String> {
        self.devs
            .iter()
            .filter(|d| d.failed_over.is_some())
            .map(|d| d.dev.label())
            .collect()
    }
}

/// Which members a placement uses, and which of the others it marks failed over.
#[derive(Debug, PartialEq, Eq)]
struct Chosen {
    used: Vec<usize>,
    left_out: Vec<usize>,
}

/// The placement's decision from each member's state: `up` (its port is ACTIVE) and
/// `answering` (not left out after its path failed). Striped: every member up and answering
/// (else every one up), the rest failed over. Active-standby: the first such member; those
/// before it (preferred, but down or not answering) failed over, those after stand by. None up:
/// nothing used, nothing failed over (the attempt fails and is tried again).
fn choose_members(standby: bool, up: &[bool], answering: &[bool]) -> Chosen {
    let n = up.len();
    let healthy: Vec<usize> = (0..n).filter(|&i| up[i] && answering[i]).collect();
    let mut used = if healthy.is_empty() {
        (0..n).filter(|&i| up[i]).collect()
    } else {
        healthy
    };
    if standby {
        used.truncate(1);
    }
    let left_out = match used.first() {
        None => Vec::new(),
        Some(&first) if standby => (0..first).collect(),
        Some(_) => (0..n).filter(|i| !used.contains(i)).collect(),
    };
    Chosen { used, left_out }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chosen(used: &[usize], left_out: &[usize]) -> Chosen {
        Chosen {
            used: used.to_vec(),
            left_out: left_out.to_vec(),
        }
    }

    #[test]
    fn striping_uses_every_member_that_is_up_and_answers() {
        let all = [true, true, true];
        assert_eq!(choose_members(false, &all, &all), chosen(&[0, 1, 2], &[]));
        assert_eq!(choose_members(false, &[true, false, true], &all), chosen(&[0, 2], &[1]));
        assert_eq!(choose_members(false, &all, &[true, false, true]), chosen(&[0, 2], &[1]));
        // None answers: every member that is up, rather than none.
        assert_eq!(
            choose_members(false, &[true, true, false], &[false, false, true]),
            chosen(&[0, 1], &[2])
        );
        assert_eq!(choose_members(false, &[false, false], &[true, true]), chosen(&[], &[]));
    }

    #[test]
    fn active_standby_uses_the_first_healthy_member_and_keeps_the_rest_standing_by() {
        let all = [true, true, true];
        assert_eq!(choose_members(true, &all, &all), chosen(&[0], &[]));
        // The primary down: the first standby that answers; the primary is failed over (failback
        // when it is back), the standby after it still stands by.
        assert_eq!(choose_members(true, &[false, true, true], &all), chosen(&[1], &[0]));
        // The first standby's probe failed: the next one.
        assert_eq!(
            choose_members(true, &[false, true, true], &[true, false, true]),
            chosen(&[2], &[0, 1])
        );
        // Nobody answers: the first member that is up.
        assert_eq!(
            choose_members(true, &[false, true, true], &[false, false, false]),
            chosen(&[1], &[0])
        );
        assert_eq!(choose_members(true, &[false, false], &[true, true]), chosen(&[], &[]));
    }
}
