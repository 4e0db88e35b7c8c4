//! Several threads drive their own QP pairs of one shared device at once
//! (as NCCL's proxy threads do), and every byte arrives where it should.

mod verbs_util;

use rdma_sys::ibv_sge;
use verbs_util::*;

#[test]
fn concurrent_qps_on_one_device() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 200;
    const LEN: usize = 24 * 1024;
    // Configure the address once, before any thread exists.
    let _main = open("127.0.21.4");
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                // Each thread opens its own context on the shared device instance.
                let c = reopen();
                let (a, b) = pair(&c);
                let mut src = Buf::new(&c, LEN, ACCESS_ALL);
                let dst = Buf::new(&c, LEN, ACCESS_ALL);
                for r in 0..ROUNDS {
                    let seed = (t * 31 + r) as u8;
                    src.fill(|i| (i as u8).wrapping_mul(7).wrapping_add(seed));
                    let len = 1 + (r * 977) % LEN;
                    if r % 2 == 0 {
                        let mut sge = ibv_sge {
                            addr: src.addr(),
                            length: len as u32,
                            lkey: src.lkey(),
                        };
                        let mut wr = send_wr(r as u64, 0, &mut sge, SIGNALED);
                        wr.wr.rdma.remote_addr = dst.addr();
                        wr.wr.rdma.rkey = dst.rkey();
                        assert_eq!(post_send(&a, &mut wr), 0);
                        let s = poll_one(a.cq);
                        assert_eq!((s.wr_id, s.status), (r as u64, 0), "thread {t} round {r}");
                    } else {
                        post_recv(&b, dst.addr(), LEN as u32, dst.lkey(), r as u64);
                        let mut sge = ibv_sge {
                            addr: src.addr(),
                            length: len as u32,
                            lkey: src.lkey(),
                        };
                        let mut wr = send_wr(r as u64, 2, &mut sge, SIGNALED);
                        assert_eq!(post_send(&a, &mut wr), 0);
                        assert_eq!(poll_one(a.cq).status, 0);
                        let rc = poll_one(b.cq);
                        assert_eq!((rc.wr_id, rc.status, rc.byte_len), (r as u64, 0, len as u32));
                    }
                    assert_eq!(&dst.read()[..len], &src.read()[..len], "thread {t} round {r}");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker thread failed");
    }
}
