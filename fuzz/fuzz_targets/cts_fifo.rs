//! The CTS FIFO as the sender reads it (`ferroce::transport::proto::fifo`): a ring of 64 entries in
//! which the receiver's RDMA writes land in any byte order, next to entries left from earlier
//! laps of the ring, or plain garbage (a peer that lies).
//!
//! Each input builds a ring: the group the sender expects (posting counter `c`, `n` entries
//! from `fill_group`, at absolute entry `head`) written *torn*: per 8-byte word of each entry,
//! the new word or the old one (from an entry of an earlier lap, sealed for another counter),
//! or, in the garbage mode, input bytes; and reads it with `read_group`.
//!
//! Invariants, beyond "no panic":
//! * `Ready(n)` only for the group expected: n is its size and every entry read is exactly the
//!   entry written (a torn, stale or wrongly sealed entry is never accepted);
//! * a group whose every word landed is `Ready(n)` (a landed group is never refused);
//! * the stamp not (yet) landed at the head means `NotPosted`;
//! * in the garbage mode, `Ready(n)` means 1 <= n <= 8 entries, each sealed, carrying the
//!   expected counter and n, with a size that fits an i64;
//! * `pieces` covers exactly `min(n, RING)` entries inside the ring.
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use nccl_net_ferroce::transport::proto::fifo::*;
use nccl_net_ferroce::transport::proto::limits::{MAX_DEVS, MAX_RECVS};

const WORDS: usize = ENTRY_BYTES / 8;
/// The stamp is the last word of an entry.
const STAMP_WORD: usize = STAMP_OFFSET / 8;

fn words(e: &CtsEntry) -> [u64; WORDS] {
    let w = e.to_wire();
    let mut out = [0u64; WORDS];
    out[0] = w.addr;
    out[1] = w.size;
    for i in 0..4 {
        out[2 + i] = u64::from(w.rkeys[2 * i]) | (u64::from(w.rkeys[2 * i + 1]) << 32);
    }
    out[6] = u64::from(w.seal) | (u64::from(w.tag) << 32);
    out[7] = w.stamp;
    out
}

fn entry(w: &[u64; WORDS]) -> CtsEntry {
    let mut rkeys = [0u32; MAX_DEVS];
    for i in 0..4 {
        rkeys[2 * i] = w[2 + i] as u32;
        rkeys[2 * i + 1] = (w[2 + i] >> 32) as u32;
    }
    CtsEntry {
        addr: w[0],
        size: w[1],
        rkeys,
        seal: w[6] as u32,
        tag: (w[6] >> 32) as u32,
        stamp: w[7],
    }
}

fn group(u: &mut Unstructured, counter: u64, n: usize) -> Result<[CtsEntry; MAX_RECVS]> {
    let mut out = [CtsEntry::default(); MAX_RECVS];
    let mut addrs = vec![];
    let mut sizes = vec![];
    let mut tags = vec![];
    let mut rkeys = vec![];
    for _ in 0..n {
        addrs.push(u.arbitrary::<u64>()? as usize);
        sizes.push(u.arbitrary::<u32>()? as usize);
        tags.push(u.arbitrary()?);
        rkeys.push([u.arbitrary::<u32>()?; MAX_DEVS]);
    }
    assert_eq!(fill_group(&mut out, counter, &addrs, &sizes, &tags, &rkeys), n);
    Ok(out)
}

fn check(u: &mut Unstructured) -> Result<()> {
    let counter = u64::from(u.arbitrary::<u32>()?);
    let head = u64::from(u.arbitrary::<u16>()?);
    let n = u.int_in_range(1..=MAX_RECVS)?;
    let garbage = u.ratio(1, 4)?;
    let new = group(u, counter, n)?;
    let mut ring = [[0u64; WORDS]; RING];
    // Earlier laps: sealed entries for other counters (before this one, or far ahead).
    for slot in ring.iter_mut() {
        let lap = u.int_in_range(1..=3u64)?;
        let old_counter = if u.arbitrary()? {
            counter.wrapping_sub(lap * RING as u64)
        } else {
            counter + lap
        };
        let old_n = u.int_in_range(1..=MAX_RECVS)?;
        let old = group(u, old_counter, old_n)?;
        *slot = words(&old[0]);
    }
    let mut landed = true;
    for (i, e) in new.iter().take(n).enumerate() {
        let pos = ring_pos(head + i as u64);
        let w = words(e);
        if garbage {
            for (k, word) in ring[pos].iter_mut().enumerate() {
                // The stamp word usually right, so that the rest gets read.
                *word = if k == STAMP_WORD && u.ratio(3, 4)? {
                    w[k]
                } else {
                    u.arbitrary()?
                };
            }
            continue;
        }
        let mask: u8 = u.arbitrary()?;
        for k in 0..WORDS {
            if mask & (1 << k) != 0 {
                ring[pos][k] = w[k];
            }
        }
        landed &= ring[pos] == w;
    }
    let mut out = [CtsEntry::default(); MAX_RECVS];
    let stamp_word = ring[ring_pos(head)][STAMP_WORD];
    let got = read_group(
        head,
        counter,
        |pos| ring[pos][STAMP_WORD],
        |pos| entry(&ring[pos]),
        &mut out,
    );
    if !stamp_matches(stamp_word, counter) {
        assert_eq!(got, GroupState::NotPosted, "no stamp at the head: not posted");
    }
    if garbage {
        if let GroupState::Ready(k) = got {
            assert!((1..=MAX_RECVS).contains(&k));
            for e in &out[..k] {
                assert!(e.sealed() && e.idx() == stamp(counter) && e.nreqs() == k && e.posted_size() <= i64::MAX as u64);
            }
        }
    } else {
        match got {
            GroupState::Ready(k) => {
                assert_eq!(k, n, "Ready with another group size");
                for i in 0..n {
                    assert_eq!(out[i], new[i], "entry {i} accepted but not the one written");
                    assert_eq!(
                        ring[ring_pos(head + i as u64)],
                        words(&new[i]),
                        "a torn entry {i} accepted"
                    );
                }
            }
            _ => assert!(!landed, "a fully landed group of {n} was not accepted: {got:?}"),
        }
        if landed {
            assert_eq!(got, GroupState::Ready(n));
        }
    }
    // check_group on the host-order snapshot agrees with read_group.
    let snapshot: Vec<CtsEntry> = (0..n)
        .map(|i| CtsEntry::from_wire(&entry(&ring[ring_pos(head + i as u64)])))
        .collect();
    if stamp_matches(stamp_word, counter) && u64::from_le(stamp_word) >> 56 == n as u64 {
        assert_eq!(
            check_group(&snapshot, counter),
            got,
            "check_group and read_group disagree"
        );
    }
    let [(p0, n0), (p1, n1)] = pieces(head, n);
    assert_eq!(n0 + n1, n.min(RING));
    assert!(p0 < RING && p0 + n0 <= RING && p1 == 0 && n1 <= RING);
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = check(&mut Unstructured::new(data));
});
