//! Resource limits against a job size: locked memory for registrations and queues, file
//! descriptors for the side channel.
//!
//! A process with `CAP_IPC_LOCK` in its effective set is not held to `RLIMIT_MEMLOCK`: the
//! kernel's pinning (`ibv_reg_mr`) and softroce's (`softroce/src/driver/pinned.rs`) both skip
//! the limit then, so the memlock check is ok whatever the limit says. Both read the capability
//! the same way, from `CapEff:` in `/proc/self/status`.

use crate::check::Check;
use ferroce::error::{format_bytes, Limit, FDS_PER_CONNECTION};

/// What one process of the job will open (command-line `--ranks`, `--channels`, `--conns`,
/// `--reg-mib`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobSize {
    /// Network connections (send comms + receive comms) of one process.
    pub conns: u64,
    /// QPs per connection (`NCCL_IB_QPS_PER_CONNECTION`).
    pub qps_per_connection: u64,
    /// Host memory NCCL registers per connection (its staging buffers when GPU memory cannot
    /// be registered; 0 with GPUDirect, whose GPU memory is not counted against the limit).
    pub registered_per_connection: u64,
}

impl JobSize {
    /// Connections of one process when each rank talks to every other over `channels` channels
    /// (all-to-all, the worst case): a send and a receive comm per peer and channel.
    pub fn conns_for(ranks: u64, channels: u64) -> u64 {
        2 * ranks.saturating_sub(1) * channels
    }
}

/// Locked memory ferroce itself pins per connection: its CTS FIFO and the receiver's staging
/// copy (one page each) ...
pub const PINNED_PER_CONNECTION: u64 = 2 * 4096;
/// ... and per QP the queue memory a kernel provider pins (send and receive queues and the CQ
/// entries, a few pages on mlx5).
pub const PINNED_PER_QP: u64 = 16 << 10;
/// Descriptors a process holds besides ferroce's (stdio, libraries, NCCL's own sockets).
pub const FD_BASE: u64 = 64;

/// Bytes of locked memory a process of this job needs.
pub fn memlock_needed(job: &JobSize) -> u64 {
    job.conns
        .saturating_mul(PINNED_PER_CONNECTION + job.qps_per_connection * PINNED_PER_QP + job.registered_per_connection)
}

/// File descriptors a process of this job needs.
pub fn fds_needed(job: &JobSize) -> u64 {
    FDS_PER_CONNECTION * job.conns + FD_BASE
}

fn job_text(job: &JobSize) -> String {
    format!("{} connections per process", job.conns)
}

/// `CAP_IPC_LOCK`: its bit in the capability sets (`linux/capability.h`).
pub const CAP_IPC_LOCK: u32 = 14;

/// Whether the `CapEff:` line of `status` (the text of `/proc/<pid>/status`) has
/// `CAP_IPC_LOCK`; `None` without a readable `CapEff:` line.
pub fn cap_ipc_lock_in(status: &str) -> Option<bool> {
    let caps = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    let caps = u64::from_str_radix(caps.trim(), 16).ok()?;
    Some(caps & (1 << CAP_IPC_LOCK) != 0)
}

/// Whether this process has `CAP_IPC_LOCK` in its effective set (false when
/// `/proc/self/status` cannot tell: the limit is then assumed to apply, as softroce assumes).
pub fn has_cap_ipc_lock() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| cap_ipc_lock_in(&s))
        .unwrap_or(false)
}

/// The memlock verdict: `limit` is `getrlimit(RLIMIT_MEMLOCK)`, `cap_ipc_lock` whether the
/// process has `CAP_IPC_LOCK` (then the limit does not apply and the check is ok).
pub fn check_memlock(limit: Option<Limit>, cap_ipc_lock: bool, job: &JobSize) -> Check {
    let name = "memlock";
    if cap_ipc_lock {
        let limit = limit.map_or("getrlimit failed".to_string(), |l| {
            format!("{}, hard {}", format_bytes(l.soft), format_bytes(l.hard))
        });
        return Check::ok(
            name,
            format!(
                "CAP_IPC_LOCK: the memlock limit does not apply ({limit}; {} need about {})",
                job_text(job),
                format_bytes(Some(memlock_needed(job)))
            ),
        );
    }
    let Some(limit) = limit else {
        return Check::warn(name, "getrlimit(RLIMIT_MEMLOCK) failed", "");
    };
    let need = memlock_needed(job);
    let seen = format!(
        "{} (hard {}); {} need about {} ({} per connection)",
        format_bytes(limit.soft),
        format_bytes(limit.hard),
        job_text(job),
        format_bytes(Some(need)),
        format_bytes(Some(need / job.conns.max(1)))
    );
    let fix = "`ulimit -l unlimited`; `* - memlock unlimited` in /etc/security/limits.conf (systemd: LimitMEMLOCK=infinity); containers: `--ulimit memlock=-1:-1` or `--cap-add IPC_LOCK` (root with CAP_IPC_LOCK is not limited)";
    match limit.soft {
        None => Check::ok(name, seen),
        Some(soft) if soft >= need => Check::ok(name, seen),
        Some(_) => {
            let hint = match limit.hard {
                Some(hard) if hard < need => fix.to_string(),
                // The hard limit allows it: no root needed.
                _ => format!(
                    "`ulimit -l {}` (the hard limit allows it) or {fix}",
                    limit.hard.map_or("unlimited".into(), |h| (h >> 10).to_string())
                ),
            };
            Check::fail(name, format!("{seen}: registrations will fail with ENOMEM"), hint)
        }
    }
}

pub fn check_nofile(limit: Option<Limit>, job: &JobSize) -> Check {
    let name = "open files";
    let Some(limit) = limit else {
        return Check::warn(name, "getrlimit(RLIMIT_NOFILE) failed", "");
    };
    let need = fds_needed(job);
    let show = |v: Option<u64>| v.map_or("unlimited".into(), |v| v.to_string());
    let seen = format!(
        "{} (hard {}); {} need about {need} ({FDS_PER_CONNECTION} per connection + {FD_BASE})",
        show(limit.soft),
        show(limit.hard),
        job_text(job)
    );
    match limit.soft {
        None => Check::ok(name, seen),
        Some(soft) if soft >= need => Check::ok(name, seen),
        Some(_) => {
            let raise = match limit.hard {
                Some(hard) if hard >= need => format!("`ulimit -n {need}` (the hard limit allows it)"),
                _ => format!("`ulimit -n {need}` as root, `* - nofile {need}` in /etc/security/limits.conf (systemd: LimitNOFILE=)"),
            };
            Check::fail(
                name,
                format!("{seen}: listen/connect will fail with EMFILE (Too many open files)"),
                format!("{raise}; containers: `--ulimit nofile={need}:{need}`"),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Status;

    const JOB: JobSize = JobSize {
        conns: 1024,
        qps_per_connection: 1,
        registered_per_connection: 0,
    };

    fn limit(soft: Option<u64>, hard: Option<u64>) -> Option<Limit> {
        Some(Limit { soft, hard })
    }

    #[test]
    fn needs_grow_with_the_job() {
        assert_eq!(JobSize::conns_for(8, 2), 28);
        assert_eq!(JobSize::conns_for(1, 2), 0);
        assert_eq!(memlock_needed(&JOB), 1024 * (8192 + 16384));
        let four_mib = JobSize {
            registered_per_connection: 4 << 20,
            qps_per_connection: 4,
            ..JOB
        };
        assert_eq!(memlock_needed(&four_mib), 1024 * (8192 + 4 * 16384 + (4 << 20)));
        assert_eq!(fds_needed(&JOB), 2 * 1024 + 64);
    }

    fn check_memlock_(limit: Option<Limit>, job: &JobSize) -> Check {
        check_memlock(limit, false, job)
    }

    #[test]
    fn memlock_passes_at_the_need_and_fails_just_below() {
        let need = memlock_needed(&JOB);
        assert_eq!(check_memlock_(limit(Some(need), Some(need)), &JOB).status, Status::Ok);
        let low = check_memlock_(limit(Some(need - 1), Some(need - 1)), &JOB);
        assert_eq!(low.status, Status::Fail);
        assert!(
            low.hint.contains("ulimit -l unlimited") && low.hint.contains("--ulimit memlock"),
            "{}",
            low.hint
        );
        assert_eq!(check_memlock_(limit(None, None), &JOB).status, Status::Ok);
        let soft_only = check_memlock_(limit(Some(64 << 10), None), &JOB);
        assert!(
            soft_only
                .hint
                .starts_with("`ulimit -l unlimited` (the hard limit allows it)"),
            "{}",
            soft_only.hint
        );
    }

    #[test]
    fn cap_ipc_lock_lifts_the_memlock_limit() {
        let need = memlock_needed(&JOB);
        let low = limit(Some(64 << 10), Some(64 << 10));
        let with = check_memlock(low, true, &JOB);
        assert_eq!(with.status, Status::Ok);
        assert!(
            with.value
                .starts_with("CAP_IPC_LOCK: the memlock limit does not apply (64 KiB, hard 64 KiB; 1024 connections"),
            "{}",
            with.value
        );
        assert_eq!(check_memlock(None, true, &JOB).status, Status::Ok);
        // Without the capability the same limit keeps today's verdict.
        let without = check_memlock(low, false, &JOB);
        assert_eq!(without.status, Status::Fail);
        assert!(
            without.value.ends_with("registrations will fail with ENOMEM"),
            "{}",
            without.value
        );
        assert!(without.hint.contains("--cap-add IPC_LOCK"), "{}", without.hint);
        assert_eq!(
            check_memlock(limit(Some(need), Some(need)), false, &JOB).status,
            Status::Ok
        );
    }

    #[test]
    fn cap_ipc_lock_is_bit_14_of_cap_eff() {
        let status = |eff: &str| format!("Name:\tx\nCapPrm:\t000001ffffffffff\nCapEff:\t{eff}\nCapBnd:\t0\n");
        // Root in Docker's default set (no IPC_LOCK), then with `--cap-add IPC_LOCK`.
        assert_eq!(cap_ipc_lock_in(&status("00000000a80425fb")), Some(false));
        assert_eq!(cap_ipc_lock_in(&status("00000000a80465fb")), Some(true));
        assert_eq!(cap_ipc_lock_in(&status("000001ffffffffff")), Some(true));
        assert_eq!(cap_ipc_lock_in(&status("0000000000000000")), Some(false));
        assert_eq!(cap_ipc_lock_in("Name:\tx\n"), None);
        assert_eq!(cap_ipc_lock_in("CapEff:\tzz\n"), None);
    }

    #[test]
    fn nofile_passes_at_the_need_and_fails_just_below() {
        let need = fds_needed(&JOB);
        assert_eq!(check_nofile(limit(Some(need), Some(need)), &JOB).status, Status::Ok);
        let low = check_nofile(limit(Some(512), Some(4096)), &JOB);
        assert_eq!(low.status, Status::Fail);
        assert!(
            low.value
                .starts_with("512 (hard 4096); 1024 connections per process need about 2112"),
            "{}",
            low.value
        );
        assert!(
            low.hint.contains("ulimit -n 2112") && low.hint.contains("hard limit allows it"),
            "{}",
            low.hint
        );
        let hard_low = check_nofile(limit(Some(512), Some(1024)), &JOB);
        assert!(hard_low.hint.contains("limits.conf"), "{}", hard_low.hint);
    }
}
