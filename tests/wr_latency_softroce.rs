//! The work-request latency monitor (`NCCL_IB_WQE_LATENCY_THRESHOLD_NS`,
//! `NCCL_IB_WQE_LATENCY_REPORT`) over softroce: each test runs a child process (one softroce
//! device, both ends of a connection on it, stderr captured) with FERROCE_TEST_SOFTROCE=1 after
//! `make build`:
//!
//! * asked for, it measures every signaled send work request: p50/p90/p99/p99.9 per QP in the
//!   statistics file; unset, it reads no clock at all (the monitor's clock reads are counted) and
//!   the file has no such figures;
//! * a write blackholed after the receiver's CTS landed (`softroce-ctl blackhole`): a stall WARN
//!   naming both ends (QPN and GID on RoCE, LID on InfiniBand) while nothing completes, then,
//!   healed, a slow WARN; once on a RoCE port and once on an InfiniBand one.
//!
//! Addresses 127.0.36.4x (ci/tests/lib/softroce.sh has the table), one per child.

mod softroce_common;

use nccl_net_ferroce::api;
use nccl_net_ferroce::transport::wr_monitor_clock_reads;
use softroce_common::{child, pair, reg, run_child, transfer};
use std::time::{Duration, Instant};

/// 40 transfers of 64 KiB, then the comms closed and the file written; prints the monitor's
/// clock reads.
fn traffic() {
    let ctx = api::init(None, -1, false).expect("init");
    let (s, r) = pair(&ctx, 0);
    let none = (std::ptr::null_mut(), std::ptr::null_mut());
    for k in 0..40u8 {
        transfer(&s, &r, 1 << 16, k, none, Duration::from_secs(20)).expect("transfer");
    }
    println!("monitor clock reads: {}", wr_monitor_clock_reads());
    drop(s);
    drop(r);
    api::finalize(ctx).expect("finalize");
}

/// The statistics file a child wrote into `dir`.
fn stats_file(dir: &std::path::Path) -> String {
    let files: Vec<_> = std::fs::read_dir(dir).expect("stats dir").flatten().collect();
    assert_eq!(files.len(), 1, "one file per process: {files:?}");
    std::fs::read_to_string(files[0].path()).expect("read the file")
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build"]
fn the_monitor_reports_quantiles_when_asked_and_reads_no_clock_when_not() {
    const NAME: &str = "the_monitor_reports_quantiles_when_asked_and_reads_no_clock_when_not";
    if child(NAME, traffic) {
        return;
    }
    for (addr, report) in [("127.0.36.40", true), ("127.0.36.41", false)] {
        let dir = std::env::temp_dir().join(format!("ferroce-wrlat-{}-{report}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let dir_s = dir.to_string_lossy().to_string();
        let mut env = vec![("FERROCE_STATS", dir_s.as_str()), ("SOFTROCE_LINK_LAYER", "roce")];
        if report {
            env.push(("NCCL_IB_WQE_LATENCY_REPORT", "1"));
        }
        let text = run_child(NAME, addr, &env);
        let json = stats_file(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        if report {
            assert!(!text.contains("monitor clock reads: 0\n"), "{text}");
            // The sender's QP: every message's write measured (40, one signaled WR each).
            let at = json.find("\"wr_latency\":{\"count\":").expect("wr_latency in the file");
            let count: u64 = json[at + 22..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .expect("count");
            assert!(count >= 40, "{count} in {json}");
            for key in [
                "p50_ns",
                "p90_ns",
                "p99_ns",
                "p999_ns",
                "\"slow\":0",
                "\"stalled\":0",
                "log2_ns",
            ] {
                assert!(json.contains(key), "{key} in {json}");
            }
        } else {
            assert!(text.contains("monitor clock reads: 0\n"), "{text}");
            assert!(!json.contains("wr_latency"), "{json}");
        }
    }
}

/// A 1 MiB send blackholed after the CTS landed: test() goes on for `stall_ms`, the path heals,
/// and the send completes.
fn stalled_send() {
    let addr = std::env::var("SOFTROCE_ADDR").expect("SOFTROCE_ADDR");
    let ctx = api::init(None, -1, false).expect("init");
    let (s, r) = pair(&ctx, 0);
    let size = 1 << 20;
    let src = vec![7u8; size];
    let mut dst = vec![0u8; size];
    let (smh, rmh) = (reg(&*s, &src), reg(&*r, &dst));
    // SAFETY: live handle, registered buffer alive until the comms close.
    let rq = unsafe { api::irecv(&r, &[dst.as_mut_ptr() as usize], &[size], &[1], &[&rmh], false) }
        .expect("irecv")
        .expect("a receive slot");
    let mut sizes = [0i32];
    // SAFETY: rq is in flight; a test moves the CTS write on.
    assert!(!unsafe { api::test(rq, sizes.as_mut_ptr()) }.expect("test"));
    std::thread::sleep(Duration::from_millis(300));
    softroce_common::ctl(&addr, &["blackhole", &addr]);
    // SAFETY: live handle, registered buffer.
    let q = unsafe { api::isend(&s, src.as_ptr() as usize, size, 1, &smh) }
        .expect("isend")
        .expect("the receiver's CTS had landed");
    let heal_at = Instant::now() + Duration::from_millis(700);
    let end = Instant::now() + Duration::from_secs(20);
    let (mut sent, mut received, mut healed) = (false, false, false);
    while !(sent && received) {
        assert!(Instant::now() < end, "the send did not complete after the heal");
        if !healed && Instant::now() >= heal_at {
            softroce_common::ctl(&addr, &["heal"]);
            healed = true;
        }
        // SAFETY: q and rq are in flight until test says done.
        sent = sent || unsafe { api::test(q, sizes.as_mut_ptr()) }.expect("test send");
        // SAFETY: as above.
        received = received || unsafe { api::test(rq, sizes.as_mut_ptr()) }.expect("test recv");
        assert!(healed || !sent, "no ACK can come through the blackhole");
    }
    assert_eq!(dst, src);
    drop(s);
    drop(r);
    api::dereg_mr(smh).expect("deregMr");
    api::dereg_mr(rmh).expect("deregMr");
    api::finalize(ctx).expect("finalize");
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build"]
fn a_blackholed_write_warns_stalled_then_slow() {
    const NAME: &str = "a_blackholed_write_warns_stalled_then_slow";
    if child(NAME, stalled_send) {
        return;
    }
    // The ends are named by GID on RoCE and by LID on InfiniBand; both ends are on the one port.
    for (link_layer, addr) in [("roce", "127.0.36.42"), ("ib", "127.0.36.43")] {
        let env = [
            ("SOFTROCE_LINK_LAYER", link_layer),
            ("NCCL_IB_WQE_LATENCY_THRESHOLD_NS", "100000000"),
            ("NCCL_IB_TIMEOUT", "16"),
            ("NCCL_IB_RETRY_CNT", "7"),
        ];
        let text = run_child(NAME, addr, &env);
        let port = |l: &str| -> Option<String> {
            let at = l.split("(softroce0:1 ").nth(1)?;
            Some(at[..at.find(')')?].to_string())
        };
        let ends = |l: &&str| {
            let Some(me) = port(l) else { return false };
            let form_ok = if link_layer == "ib" {
                me.starts_with("LID 0x") && !l.contains("GID")
            } else {
                me == format!("GID ::ffff:{addr}")
            };
            form_ok
                && l.contains("on QP 0x")
                && l.contains(&format!("(softroce0:1 {me}) -> QP 0x"))
                && l.matches(&me).count() == 2
        };
        let stall: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("has had no completion for"))
            .collect();
        assert_eq!(stall.len(), 1, "{link_layer}: one stall WARN:\n{text}");
        assert!(
            stall.iter().all(ends) && stall[0].contains("NCCL_IB_WQE_LATENCY_THRESHOLD_NS=100000000"),
            "{link_layer}: {stall:?}"
        );
        let slow: Vec<&str> = text.lines().filter(|l| l.contains("us after its post")).collect();
        assert_eq!(slow.len(), 1, "{link_layer}: one slow WARN:\n{text}");
        assert!(slow.iter().all(ends), "{link_layer}: {slow:?}");
    }
}
