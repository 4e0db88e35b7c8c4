//! RC under the receive path's injected faults (`SOFTROCE_LOSS`, `SOFTROCE_REORDER`,
//! `SOFTROCE_DUP`): every message arrives exactly once, in order, byte for byte, over the
//! real driver (UDP socket, engine, injector), for SENDs and RDMA WRITEs with immediate,
//! one to nine packets each.

mod verbs_util;

use rdma_sys::ibv_sge;
use softroce::driver::inject;
use verbs_util::*;

const MESSAGES: usize = 600;
const WINDOW: usize = 32;
const SLOT: usize = 9 * 1024;
const FENCE: u64 = 0xFEED_FACE_CAFE_BEEF;

fn size_of(k: usize) -> usize {
    1 + (k * 7919) % (SLOT - 1)
}

fn byte_of(k: usize, i: usize) -> u8 {
    (k as u32)
        .wrapping_mul(2_654_435_761)
        .wrapping_add(i as u32 * 40_503)
        .to_le_bytes()[3]
}

#[test]
fn rc_delivers_exactly_once_in_order_under_loss_reordering_and_duplication() {
    std::env::set_var("SOFTROCE_LOSS", "0.01");
    std::env::set_var("SOFTROCE_REORDER", "0.05");
    std::env::set_var("SOFTROCE_DUP", "0.05");
    std::env::set_var("SOFTROCE_SEED", "4242");
    let c = open("127.0.73.1");
    let (a, b) = pair(&c);
    let mut src = Buf::new(&c, WINDOW * SLOT, ACCESS_ALL);
    let dst = Buf::new(&c, WINDOW * SLOT, ACCESS_ALL);
    for base in (0..MESSAGES).step_by(WINDOW) {
        let ks = base..(base + WINDOW).min(MESSAGES);
        for k in ks.clone() {
            let slot = k % WINDOW;
            let at = dst.addr() + (slot * SLOT) as u64;
            post_recv(&b, at, SLOT as u32, dst.lkey(), k as u64);
            src.fill_range(slot * SLOT, size_of(k), |i| byte_of(k, i));
        }
        for k in ks.clone() {
            let slot = k % WINDOW;
            let mut sge = ibv_sge {
                addr: src.addr() + (slot * SLOT) as u64,
                length: size_of(k) as u32,
                lkey: src.lkey(),
            };
            // even: SEND; odd: RDMA WRITE with immediate into the same slot
            let mut wr = if k % 2 == 0 {
                send_wr(k as u64, 2, &mut sge, SIGNALED)
            } else {
                let mut wr = rdma_wr(k as u64, 1, &mut sge, SIGNALED, &dst);
                wr.wr.rdma.remote_addr = dst.addr() + (slot * SLOT) as u64;
                wr.imm_data_invalidated_rkey_union.imm_data = (k as u32).to_be();
                wr
            };
            assert_eq!(post_send(&a, &mut wr), 0, "post_send #{k}");
        }
        for k in ks.clone() {
            let s = poll_one(a.cq);
            assert_eq!((s.wr_id, s.status), (k as u64, 0), "send completion of #{k}: {s:?}");
        }
        for k in ks {
            let r = poll_one(b.cq);
            let opcode = if k % 2 == 0 { 128 } else { 129 };
            assert_eq!(
                (r.wr_id, r.status, r.opcode, r.byte_len),
                (k as u64, 0, opcode, size_of(k) as u32),
                "receive completion #{k} (a duplicate or a reordering that reached the QP shifts these): {r:?}"
            );
            if k % 2 == 1 {
                assert_eq!(u32::from_be(r.imm), k as u32, "immediate of #{k}");
            }
            let got = dst.read_range((k % WINDOW) * SLOT, size_of(k));
            let bad = got.iter().enumerate().position(|(i, &v)| v != byte_of(k, i));
            assert_eq!(bad, None, "message #{k}: first wrong byte");
        }
    }
    // A duplicate delivered after the last window would take the next receive: the fence must.
    post_recv(&b, dst.addr(), SLOT as u32, dst.lkey(), 1);
    post_recv(&b, dst.addr() + SLOT as u64, SLOT as u32, dst.lkey(), 2);
    src.fill_range(0, 8, |i| FENCE.to_le_bytes()[i]);
    let mut sge = src.sge(8);
    let mut wr = send_wr(FENCE, 2, &mut sge, SIGNALED);
    assert_eq!(post_send(&a, &mut wr), 0);
    assert_eq!(poll_one(a.cq).status, 0);
    let r = poll_one(b.cq);
    assert_eq!(
        (r.wr_id, r.status, r.byte_len),
        (1, 0, 8),
        "the fence is the next receive: {r:?}"
    );
    assert_eq!(dst.read_range(0, 8), FENCE.to_le_bytes());

    let n = inject::counts();
    assert!(
        n.lost > 0 && n.reordered > 0 && n.duplicated > 0,
        "every kind of fault happened: {n:?}"
    );
    eprintln!("injected over {MESSAGES} messages: {n:?}");
}
