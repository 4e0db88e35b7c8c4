//! Unit tests of the CTS FIFO ring: entry layout and states, torn entries, tag matching, stamps,
//! wrap-around, and a property test against a naive model.

use super::*;

fn entries(counter: u64, tags: &[i32]) -> [CtsEntry; MAX_RECVS] {
    let mut out = [CtsEntry::default(); MAX_RECVS];
    let n = tags.len();
    let addrs: Vec<usize> = (0..n).map(|i| 0x1000 * (i + 1)).collect();
    let sizes: Vec<usize> = (0..n).map(|i| 100 * (i + 1)).collect();
    let rkeys: Vec<[u32; MAX_DEVS]> = (0..n).map(|i| [i as u32 + 7; MAX_DEVS]).collect();
    assert_eq!(fill_group(&mut out, counter, &addrs, &sizes, tags, &rkeys), n);
    out
}

#[test]
fn layout_offsets() {
    assert_eq!(std::mem::offset_of!(CtsEntry, size), 8);
    assert_eq!(std::mem::offset_of!(CtsEntry, rkeys), 16);
    assert_eq!(std::mem::offset_of!(CtsEntry, seal), 48);
    assert_eq!(std::mem::offset_of!(CtsEntry, tag), 52);
    assert_eq!(std::mem::offset_of!(CtsEntry, stamp), 56);
    let e = CtsEntry::new(
        0x0102030405060708,
        0x1112131415161718,
        [0x21222324; 8],
        3,
        0x41424344,
        0x55,
    );
    assert_eq!(e.nreqs(), 3);
    assert_eq!(e.idx(), 0x56);
    assert_eq!(e.stamp, (3 << 56) | 0x56);
    let w = e.to_wire();
    assert_eq!(CtsEntry::from_wire(&w), e);
    assert!(stamp_matches(w.stamp, 0x55));
    assert!(!stamp_matches(w.stamp, 0x56));
    assert!(e.sealed());
}

#[test]
fn slot_states() {
    let e = entries(41, &[3, 1, 2]);
    assert_eq!(check_group(&e[..3], 40), GroupState::NotPosted);
    assert_eq!(check_group(&e[..3], 41), GroupState::Ready(3));
    // entry 2 not landed yet (old stamp)
    let mut partial = e;
    partial[2] = CtsEntry::default();
    assert_eq!(check_group(&partial[..3], 41), GroupState::Landing);
    assert_eq!(check_group(&e[..1], 41), GroupState::Landing);
    assert_eq!(check_group(&[], 41), GroupState::NotPosted);
}

/// Regression (harness report 1): the stamp lands before the rest of the entry. Every mix
/// of old and new bytes with the new stamp is "landing", never accepted, never an error.
#[test]
fn torn_entries_are_landing_not_corrupt() {
    let mut old = entries(41 - 9, &[9, 8, 7, 6, 5]);
    old[0] = CtsEntry::new(0xdead_0000, 77_777, [0x55; MAX_DEVS], 5, 9, 41 - 9);
    let new = entries(41, &[1, 2]);
    // Byte-level tearing of entry 0: take each prefix/suffix split and each 8-byte word.
    let to_bytes = |e: &CtsEntry| -> [u8; 64] {
        let w = e.to_wire();
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(&w.addr.to_ne_bytes());
        b[8..16].copy_from_slice(&w.size.to_ne_bytes());
        for i in 0..8 {
            b[16 + 4 * i..20 + 4 * i].copy_from_slice(&w.rkeys[i].to_ne_bytes());
        }
        b[48..52].copy_from_slice(&w.seal.to_ne_bytes());
        b[52..56].copy_from_slice(&w.tag.to_ne_bytes());
        b[56..64].copy_from_slice(&w.stamp.to_ne_bytes());
        b
    };
    let from_bytes = |b: &[u8; 64]| -> CtsEntry {
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        CtsEntry::from_wire(&CtsEntry {
            addr: u64_at(0),
            size: u64_at(8),
            rkeys: std::array::from_fn(|i| u32_at(16 + 4 * i)),
            seal: u32_at(48),
            tag: u32_at(52),
            stamp: u64_at(56),
        })
    };
    let (ob, nb) = (to_bytes(&old[0]), to_bytes(&new[0]));
    for mask in 1u8..0x7f {
        // Words 0..7 new or old by mask bit; word 7 (the stamp) always new.
        let mut b = ob;
        for w in 0..8 {
            if w == 7 || mask & (1 << w) != 0 {
                b[8 * w..8 * w + 8].copy_from_slice(&nb[8 * w..8 * w + 8]);
            }
        }
        let mut snap = new;
        snap[0] = from_bytes(&b);
        let st = check_group(&snap[..2], 41);
        assert_eq!(st, GroupState::Landing, "torn mask {mask:#x} accepted");
    }
    // All new: ready.
    assert_eq!(check_group(&new[..2], 41), GroupState::Ready(2));
    // nreqs 0 with the right idx: landing, not an error.
    let mut z = new;
    z[0].stamp &= IDX_MASK;
    assert_eq!(check_group(&z[..2], 41), GroupState::Landing);
}

#[test]
fn grouped_receive_shuffled_tags() {
    // Receiver posts tags [5, 2, 9, 2]; sends arrive in the order 2, 9, 2, 5.
    let e = entries(7, &[5, 2, 9, 2]);
    let mut matched = 0u8;
    let mut got = vec![];
    for tag in [2, 9, 2, 5] {
        let i = match_tag(&e[..4], matched, tag).expect("match");
        matched |= 1 << i;
        got.push(i);
    }
    assert_eq!(got, [1, 2, 3, 0]);
    assert_eq!(matched, full_mask(4));
    // A fifth send with any tag finds nothing.
    assert_eq!(match_tag(&e[..4], matched, 2), None);
    // An unknown tag never matches.
    assert_eq!(match_tag(&e[..4], 0, 77), None);
}

#[test]
fn shuffled_property() {
    // Deterministic pseudo-random permutations: every send lands in the buffer posted with
    // its tag, each buffer exactly once.
    let mut seed = 0x9e3779b97f4a7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..1000 {
        let n = (rnd() % 8 + 1) as usize;
        let tags: Vec<i32> = (0..n).map(|_| (rnd() % 4) as i32).collect();
        let e = entries(rnd() % 1000, &tags);
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, (rnd() % (i as u64 + 1)) as usize);
        }
        let mut matched = 0u8;
        for &k in &order {
            let i = match_tag(&e[..n], matched, tags[k]).expect("match");
            assert_eq!(e[i].tag, tags[k] as u32);
            assert_eq!(matched & (1 << i), 0);
            matched |= 1 << i;
        }
        assert_eq!(matched, full_mask(n));
    }
}

#[test]
fn stamps_and_positions() {
    assert_eq!(ring_pos(0), 0);
    assert_eq!(ring_pos(RING as u64 + 1), 1);
    assert_ne!(stamp(u64::MAX), 0);
    assert_ne!(stamp(IDX_MASK), 0, "the stamp never looks like zeroed memory");
    assert_eq!(full_mask(1), 1);
    assert_eq!(full_mask(8), 0xff);
    assert_eq!(RING_BYTES, 4 * 1024);
    assert_eq!(pieces(0, 8), [(0, 8), (0, 0)]);
    assert_eq!(pieces(56, 8), [(56, 8), (0, 0)]);
    assert_eq!(pieces(62, 5), [(62, 2), (0, 3)]);
    assert_eq!(pieces(RING as u64 * 3 + 63, 8), [(63, 1), (0, 7)]);
}

/// The sender's FIFO as the receiver's RDMA writes leave it (wire order).
struct Fifo([CtsEntry; RING]);

impl Fifo {
    fn new() -> Fifo {
        Fifo([CtsEntry::default(); RING])
    }

    /// What the receiver's CTS write(s) of a group do: the group's entries at its ring
    /// positions, in one or two runs.
    fn post(&mut self, start: u64, group: &[CtsEntry]) {
        let mut k = 0;
        for (pos, len) in pieces(start, group.len()) {
            for p in pos..pos + len {
                self.0[p] = group[k].to_wire();
                k += 1;
            }
        }
        assert_eq!(k, group.len());
    }

    fn read(&self, head: u64, counter: u64) -> (GroupState, [CtsEntry; MAX_RECVS]) {
        let mut out = [CtsEntry::default(); MAX_RECVS];
        let st = read_group(head, counter, |p| self.0[p].stamp, |p| self.0[p], &mut out);
        (st, out)
    }
}

#[test]
fn ring_wraps_over_many_laps() {
    let mut ring = RingAlloc::default();
    let mut fifo = Fifo::new();
    let (mut head, mut counter) = (0u64, 0u64);
    for lap in 0..100u64 {
        // Group sizes 1..=8 in a pattern that lands groups on every offset.
        let n = (lap * 5 % 8 + 1) as usize;
        let tags: Vec<i32> = (0..n as i32).collect();
        let e = entries(counter, &tags);
        let start = ring.alloc(n).expect("room: one group at a time");
        assert_eq!(start, head, "both ends agree where the group starts");
        fifo.post(start, &e[..n]);
        let (st, got) = fifo.read(head, counter);
        assert_eq!(st, GroupState::Ready(n), "group {counter} at {start}");
        assert_eq!(got[..n], e[..n]);
        // Nothing announced for the next counter yet.
        assert_eq!(fifo.read(head + n as u64, counter + 1).0, GroupState::NotPosted);
        head += n as u64;
        counter += 1;
        ring.prove(start + n as u64);
        ring.release(start, n);
        assert_eq!(ring.in_use(), 0);
    }
    assert!(head > 3 * RING as u64, "several laps");
}

#[test]
fn group_straddling_the_end_and_tags_inside_it() {
    let mut ring = RingAlloc::default();
    let mut fifo = Fifo::new();
    // 62 single receives, then a group of 5 at position 62: entries 62, 63, 0, 1, 2.
    for c in 0..62u64 {
        let s = ring.alloc(1).unwrap();
        fifo.post(s, &entries(c, &[0])[..1]);
        ring.prove(s + 1);
        ring.release(s, 1);
    }
    let tags = [4, 9, 4, 1, 9];
    let e = entries(62, &tags);
    let start = ring.alloc(5).unwrap();
    assert_eq!(pieces(start, 5), [(62, 2), (0, 3)]);
    fifo.post(start, &e[..5]);
    let (st, got) = fifo.read(start, 62);
    assert_eq!(st, GroupState::Ready(5));
    assert_eq!(got[..5], e[..5]);
    // Sends arrive 9, 1, 4, 9, 4: each lands in the first unmatched buffer with its tag,
    // across the wrap (buffers 2..5 sit at ring positions 0..3).
    let mut matched = 0u8;
    let mut order = vec![];
    for tag in [9, 1, 4, 9, 4] {
        let i = match_tag(&got[..5], matched, tag).expect("match");
        matched |= 1 << i;
        order.push(i);
    }
    assert_eq!(order, [1, 3, 0, 4, 2]);
    assert_eq!(matched, full_mask(5));
    assert_eq!(got[4].addr, e[4].addr, "buffer 4 came from ring position 2");
    // Only the first run landed: still landing, never ready, never an error.
    let mut half = Fifo::new();
    half.0 = fifo.0;
    for p in 0..3 {
        half.0[p] = entries(p as u64, &[7])[0].to_wire();
    }
    assert_eq!(half.read(start, 62).0, GroupState::Landing);
}

#[test]
fn entries_of_eager_groups_wait_until_the_sender_is_known_to_have_read_them() {
    let mut ring = RingAlloc::default();
    let starts: Vec<u64> = (0..4).map(|_| ring.alloc(1).expect("room")).collect();
    // Groups 0 and 1 filled by eager messages: completed and reported, not known read.
    ring.release(starts[0], 1);
    ring.release(starts[1], 1);
    assert_eq!(
        ring.in_use(),
        4,
        "not freed before the sender is known to have read them"
    );
    ring.prove(1);
    assert_eq!(ring.in_use(), 3, "an eager header said the sender had read entry 0");
    // Group 3 completes through the CTS path: it and everything before it were read.
    ring.prove(starts[3] + 1);
    ring.release(starts[3], 1);
    assert_eq!(ring.in_use(), 2, "group 2 is still in flight");
    ring.release(starts[2], 1);
    assert_eq!(ring.in_use(), 0);
    ring.prove(u64::MAX);
    assert_eq!(
        ring.alloc(1),
        Some(4),
        "a proof past the entries in use proves nothing more"
    );
    ring.release(4, 1);
    assert_eq!(ring.in_use(), 1);
}

#[test]
fn full_ring_says_retry_later_and_frees_in_posting_order() {
    let mut ring = RingAlloc::default();
    // Eight groups of 8 fill the ring exactly (NCCL's peak: 8 steps × maxRecvs 8).
    let starts: Vec<u64> = (0..8).map(|_| ring.alloc(8).expect("room")).collect();
    assert_eq!(starts, [0, 8, 16, 24, 32, 40, 48, 56]);
    assert_eq!(ring.alloc(1), None, "full: retry later");
    assert_eq!(ring.alloc(0), None);
    assert_eq!(ring.alloc(RING + 1), None);
    // A later group completing first frees nothing: the receiver may not reuse entries of
    // a group whose completion record it has not read yet.
    ring.prove(16);
    ring.release(8, 8);
    assert_eq!(ring.in_use(), 64);
    assert_eq!(ring.alloc(1), None);
    ring.release(8, 8); // twice: ignored
    assert_eq!((ring.abs_start(0), ring.abs_start(8), ring.abs_start(63)), (0, 8, 63));
    ring.release(ring.abs_start(0), 8);
    assert_eq!(ring.in_use(), 48, "groups 0 and 1 free together");
    assert_eq!(ring.abs_start(16), 16);
    assert_eq!(ring.abs_start(0), 64, "position 0 is the next lap now");
    // Partial room: a group of 8 wraps into the freed space.
    for _ in 0..6 {
        ring.alloc(2).unwrap();
    }
    assert_eq!(ring.next_start(), 76);
    assert!(!ring.fits(5));
    assert_eq!(ring.alloc(5), None);
    assert_eq!(ring.alloc(4), Some(76));
    assert_eq!(ring.in_use(), 64);
    // Unknown ranges are ignored.
    ring.release(1000, 1);
    ring.release(0, 8);
    ring.release(u64::MAX, 2);
    assert_eq!(ring.in_use(), 64);
    // 32 single receives always fit in an empty ring.
    let mut r = RingAlloc::default();
    for _ in 0..32 {
        r.alloc(1).expect("32 single receives in flight");
    }
}

/// Entries left from an earlier lap carry an older posting counter: never accepted, at the
/// head (not posted) or inside a group (still landing), however well sealed.
#[test]
fn stale_entries_from_an_earlier_lap_never_accepted() {
    let mut fifo = Fifo::new();
    // Lap 0: groups 0..8 of 8 entries each fill the ring.
    for c in 0..8u64 {
        fifo.post(c * 8, &entries(c, &[1; 8])[..8]);
    }
    for c in 0..8u64 {
        assert_eq!(fifo.read(c * 8, c).0, GroupState::Ready(8));
    }
    // The sender now expects group 8 at entry 64 = position 0, where group 0 still sits.
    assert_eq!(fifo.read(64, 8).0, GroupState::NotPosted);
    // An old entry whose counter matches modulo the ring or the group count is no match.
    for old in [0u64, 8, 8 - 1, 64] {
        let mut f = Fifo::new();
        f.0[0] = entries(old, &[1])[0].to_wire();
        assert_eq!(f.read(64, 8 + 64).0, GroupState::NotPosted, "counter {old}");
    }
    // Group 8 is a group of 3 at positions 0..3; only its head landed, the rest is lap 0.
    let g8 = entries(8, &[1, 2, 3]);
    fifo.0[0] = g8[0].to_wire();
    assert_eq!(fifo.read(64, 8).0, GroupState::Landing);
    fifo.post(64, &g8[..3]);
    assert_eq!(fifo.read(64, 8).0, GroupState::Ready(3));
    // A consumed entry whose rkeys now hold grouped-send sizes is dead: not for its own
    // counter (seal broken) and not for a later one (stamp).
    let mut dead = g8[0].to_wire();
    dead.rkeys[..3].copy_from_slice(&[5u32.to_le(), 6u32.to_le(), 7u32.to_le()]);
    fifo.0[0] = dead;
    assert_eq!(fifo.read(64, 8).0, GroupState::Landing);
    assert_eq!(fifo.read(64, 9).0, GroupState::NotPosted);
}

/// A torn entry inside a wrapped group is read again until it has landed.
#[test]
fn torn_entry_in_a_wrapped_group_is_read_again() {
    let mut fifo = Fifo::new();
    let e = entries(100, &[3, 1, 4, 1]);
    let start = 64 * 7 + 62; // positions 62, 63, 0, 1
    fifo.post(start, &e[..4]);
    let good = fifo.0[0];
    // Entry 2 (position 0): new stamp, old everything else.
    let mut torn = entries(100 - 9, &[0; 8])[0].to_wire();
    torn.stamp = good.stamp;
    fifo.0[0] = torn;
    assert_eq!(fifo.read(start, 100).0, GroupState::Landing);
    // New address, old rest.
    torn.addr = good.addr;
    fifo.0[0] = torn;
    assert_eq!(fifo.read(start, 100).0, GroupState::Landing);
    // Landed.
    fifo.0[0] = good;
    let (st, got) = fifo.read(start, 100);
    assert_eq!(st, GroupState::Ready(4));
    assert_eq!(got[..4], e[..4]);
}

/// Receiver and sender driven against each other with random group sizes, random send
/// progress and completions in random order: the sender sees every group in order with its
/// own entries, and the receiver never writes over entries the sender has not consumed or
/// whose completion record it has not read.
#[test]
fn ring_property_against_a_naive_model() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut ring = RingAlloc::default();
    let mut fifo = Fifo::new();
    // Oracle: owner[pos] = the group counter whose entry lives there until released.
    let mut owner: [Option<u64>; RING] = [None; RING];
    let mut posted: std::collections::VecDeque<(u64, u64, usize)> = Default::default(); // (counter, start, n)
    let mut sent: Vec<(u64, u64, usize)> = vec![];
    let (mut rcounter, mut scounter, mut shead) = (0u64, 0u64, 0u64);
    let mut refused = 0;
    for _ in 0..20_000 {
        match rnd() % 3 {
            0 => {
                let n = (rnd() % 8 + 1) as usize;
                let Some(start) = ring.alloc(n) else {
                    assert!(ring.in_use() + n > RING, "refused with room");
                    refused += 1;
                    continue;
                };
                for a in start..start + n as u64 {
                    assert_eq!(owner[ring_pos(a)], None, "entry {a} still in use");
                    owner[ring_pos(a)] = Some(rcounter);
                }
                let tags: Vec<i32> = (0..n).map(|_| (rnd() % 3) as i32).collect();
                fifo.post(start, &entries(rcounter, &tags)[..n]);
                posted.push_back((rcounter, start, n));
                rcounter += 1;
            }
            1 => {
                // The sender consumes the next group if it is there.
                let (st, got) = fifo.read(shead, scounter);
                match posted.front() {
                    Some(&(c, start, n)) => {
                        assert_eq!((c, start), (scounter, shead));
                        assert_eq!(st, GroupState::Ready(n));
                        assert!(got[..n].iter().all(|e| e.idx() == stamp(c)));
                        posted.pop_front();
                        sent.push((c, start, n));
                        shead += n as u64;
                        scounter += 1;
                    }
                    None => assert_eq!(st, GroupState::NotPosted),
                }
            }
            _ => {
                // Some sent group's receive completes and is reported.
                if !sent.is_empty() {
                    let (c, start, n) = sent.swap_remove((rnd() % sent.len() as u64) as usize);
                    for a in start..start + n as u64 {
                        assert_eq!(owner[ring_pos(a)], Some(c));
                        owner[ring_pos(a)] = None;
                    }
                    assert_eq!(ring.abs_start(ring_pos(start)), start);
                    ring.prove(start + n as u64);
                    ring.release(ring.abs_start(ring_pos(start)), n);
                }
            }
        }
    }
    assert!(
        rcounter > 1000 && refused > 100,
        "the ring filled and wrapped many times"
    );
}
