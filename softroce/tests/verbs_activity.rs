//! The NIC's doorbell (`softroce::driver::activity`): what rings it, and that a poller
//! which has gone idle long enough to wait on it still sees its completion.
//! Its own test binary, and one test: the doorbell is process-wide, so a
//! parallel test ringing it would hide a missing ring.

mod verbs_util;

use std::time::{Duration, Instant};
use verbs_util::*;

#[test]
fn inbound_write_and_completions_ring_and_an_idle_poller_still_gets_its_completion() {
    let c = open("127.0.21.7");
    let (a, b) = pair(&c);
    let len = 3 * 4096 + 5;
    let mut src = Buf::new(&c, len, ACCESS_ALL);
    let dst = Buf::new(&c, len, ACCESS_ALL);

    // An unsignaled RDMA WRITE makes no completion on either side: only its
    // landing can wake a thread that watches the target memory (as the
    // plugin's sender watches its CTS FIFO).
    src.fill(|i| (i as u8).wrapping_mul(7).wrapping_add(1));
    let before = softroce::driver::activity::snapshot();
    let mut sge = src.sge(len);
    let mut wr = rdma_wr(1, 0, &mut sge, 0, &dst);
    assert_eq!(post_send(&a, &mut wr), 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while dst.read() != src.read() {
        assert!(Instant::now() < deadline, "the WRITE did not land within 10 s");
        std::thread::yield_now();
    }
    // The ring follows the copy within the same engine batch.
    while softroce::driver::activity::snapshot() == before {
        assert!(Instant::now() < deadline, "a landed WRITE did not ring the doorbell");
        std::thread::yield_now();
    }

    // A poller that has found nothing for well past SOFTROCE_POLL_SLEEP_AFTER_US
    // (200 us) waits on the doorbell; a SEND posted meanwhile must still reach it.
    post_recv(&b, dst.addr(), len as u32, dst.lkey(), 7);
    let b_cq = b.cq as usize;
    let poller = std::thread::spawn(move || poll_one(b_cq as *mut rdma_sys::ibv_cq));
    std::thread::sleep(Duration::from_millis(20));
    let before = softroce::driver::activity::snapshot();
    let mut sge = src.sge(64);
    let mut wr = send_wr(2, 2, &mut sge, SIGNALED);
    assert_eq!(post_send(&a, &mut wr), 0);
    let wc = poller.join().unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (7, 0, 64), "{wc:?}");
    assert_eq!(poll_one(a.cq).status, 0);
    assert_ne!(
        softroce::driver::activity::snapshot(),
        before,
        "completions ring the doorbell"
    );
}
