//! Registration concurrent with the data path: NCCL's service thread calls
//! regMr/deregMr while its proxy thread drives isend/irecv/test on a comm of the same device.
//! A second thread registers and deregisters host buffers (some overlapping each other, so
//! the MR cache's reuse and refcounts are exercised) on the device of a live connection while
//! the first keeps transferring; every transfer's bytes and every registration must be right.
//! Runs in a child process over softroce (FERROCE_TEST_SOFTROCE=1 after `make build`); address
//! 127.0.45.1.

mod softroce_common;

use nccl_net_ferroce::api;
use nccl_net_ferroce::transport::MemKind;
use softroce_common::{pair, softroce_lib, transfer};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn registration_from_another_thread_while_the_data_path_runs() {
    if std::env::var("FERROCE_TEST_SOFTROCE").ok().as_deref() != Some("1") {
        return;
    }
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "concurrent_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("CONCURRENCY_CHILD", "1")
        .env("NCCL_IBVERBS_LIB", softroce_lib())
        .env("SOFTROCE_ADDR", "127.0.45.1")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("FERROCE_CONNECT_TIMEOUT_SEC", "10")
        .output()
        .expect("run the child");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(
        text.contains("concurrent_child: done"),
        "the child did not run:\n{text}"
    );
}

#[test]
#[ignore = "the child process of registration_from_another_thread_while_the_data_path_runs, which runs it"]
fn concurrent_child() {
    assert_eq!(
        std::env::var("CONCURRENCY_CHILD").ok().as_deref(),
        Some("1"),
        "run by registration_from_another_thread_while_the_data_path_runs"
    );
    let ctx = api::init(None, -1, false).expect("init");
    let (s, r) = pair(&ctx, 0);
    // SAFETY: s is a live send handle of this test.
    let dev = unsafe { api::comm_device(&*s as *const _ as *mut std::ffi::c_void) }.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let registrar = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let pool: Vec<Vec<u8>> = (0..8).map(|i| vec![i as u8; (i + 1) * 16 * 1024]).collect();
            let mut held = Vec::new();
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) || rounds < 200 {
                let b = &pool[(rounds % 8) as usize];
                // A sub-range of an earlier buffer now and then: reuse through the cache.
                let (addr, len) = if rounds.is_multiple_of(3) {
                    (b.as_ptr() as usize + 4096, 4096)
                } else {
                    (b.as_ptr() as usize, b.len())
                };
                let mh = api::reg_mr(&dev, addr, len, MemKind::Host, None).expect("regMr on the service thread");
                held.push(mh);
                if held.len() > 5 {
                    api::dereg_mr(held.remove(0)).expect("deregMr on the service thread");
                }
                rounds += 1;
            }
            for mh in held {
                api::dereg_mr(mh).expect("deregMr");
            }
            rounds
        })
    };
    for k in 0..60usize {
        let size = [0, 8, 4096, 100_000, 1 << 20][k % 5];
        let none = (std::ptr::null_mut(), std::ptr::null_mut());
        transfer(&s, &r, size, k as u8, none, Duration::from_secs(20)).expect("transfer during registrations");
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = registrar.join().expect("registration thread");
    assert!(rounds >= 200);
    drop((s, r));
    api::finalize(ctx).expect("finalize");
    println!("concurrent_child: {rounds} registrations beside 60 transfers");
    println!("concurrent_child: done");
}
