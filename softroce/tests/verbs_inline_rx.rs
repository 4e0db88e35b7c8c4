//! With the engine thread not receiving at all (`SOFTROCE_ENGINE_RX=0`), the
//! application threads that poll their CQs must move every packet themselves
//! (`SOFTROCE_INLINE_RX`, on by default): SEND, RDMA WRITE (multi-packet) and
//! READ between two QPs complete, byte for byte. Its own test binary: the
//! variable is read once per process.

mod verbs_util;

use verbs_util::*;

#[test]
fn polling_threads_alone_move_the_traffic() {
    // SAFETY: set before any other thread exists in this test binary's only test.
    unsafe { std::env::set_var("SOFTROCE_ENGINE_RX", "0") };
    let c = open("127.0.21.8");
    let (a, b) = pair(&c);
    let len = 5 * 4096 + 3;
    let mut src = Buf::new(&c, len, ACCESS_ALL);
    let dst = Buf::new(&c, len, ACCESS_ALL);

    // SEND -> RECV
    src.fill(|i| (i as u8).wrapping_mul(13).wrapping_add(5));
    post_recv(&b, dst.addr(), len as u32, dst.lkey(), 10);
    let mut sge = src.sge(len);
    let mut wr = send_wr(1, 2, &mut sge, SIGNALED);
    assert_eq!(post_send(&a, &mut wr), 0);
    assert_eq!(poll_one(b.cq).byte_len, len as u32);
    assert_eq!(poll_one(a.cq).status, 0);
    assert_eq!(dst.read(), src.read(), "SEND payload");

    // RDMA WRITE, signaled: its completion needs the ACKs received by a poller
    src.fill(|i| (i as u8).wrapping_mul(3));
    let mut sge = src.sge(len);
    let mut wr = rdma_wr(2, 0, &mut sge, SIGNALED, &dst);
    assert_eq!(post_send(&a, &mut wr), 0);
    let w = poll_one(a.cq);
    assert_eq!((w.wr_id, w.status), (2, 0), "{w:?}");
    assert_eq!(dst.read(), src.read(), "WRITE payload");

    // RDMA READ back into the source buffer
    src.fill(|_| 0);
    let mut sge = src.sge(len);
    let mut wr = rdma_wr(3, 4, &mut sge, SIGNALED, &dst);
    assert_eq!(post_send(&a, &mut wr), 0);
    let r = poll_one(a.cq);
    assert_eq!((r.wr_id, r.status), (3, 0), "{r:?}");
    assert_eq!(src.read(), dst.read(), "READ payload");
}
