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
use softroce_common::{child, pair, run_child, transfer};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn registration_from_another_thread_while_the_data_path_runs() {
    if child(
        "registration_from_another_thread_while_the_data_path_runs",
        concurrent_child,
    ) {
        return;
    }
    run_child(
        "registration_from_another_thread_while_the_data_path_runs",
        "127.0.45.1",
        &[],
    );
}

/// The child of [`registration_from_another_thread_while_the_data_path_runs`].
fn concurrent_child() {
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
}
