//! QP choice and 128-byte chunking for one message (pure, no I/O).
//!
//! Contract (docs/nccl-net-abi.md#data-path "QP choice and splitting", #rules-ferroce-keeps rule 13):
//! * `nQpsPerRequest` is every QP of the connection in split mode
//!   (`NCCL_IB_SPLIT_DATA_ON_QPS=1`), otherwise one QP per device pair (`nDataQps`).
//! * chunk `i` of request `id` goes to QP `(id * nQpsPerRequest + i) mod nqps`;
//! * each chunk is `roundup(ceil(size / nQpsPerRequest), 128)` bytes, the last chunks may be
//!   short or empty (an empty chunk is still posted, it carries the immediate);
//! * both ends compute the same QP list from the same posting counter `id`, so the receiver
//!   posts exactly one receive WR on every QP the sender will complete on.
//!
//! Nothing here panics for any input (arithmetic saturates / is checked).

/// Chunks are cut at multiples of this many bytes so that LL (8 B) and LL128 (128 B) flag lines
/// are never split across QPs.
pub const CHUNK_ALIGN: usize = 128;

/// How many QPs one request (one CTS slot) is spread over.
pub fn qps_per_request(split_data_on_qps: bool, nqps: usize, ndata_qps: usize) -> usize {
    let n = if split_data_on_qps { nqps } else { ndata_qps };
    n.clamp(1, nqps.max(1))
}

/// The QP index that carries chunk `i` of request `id`.
pub fn qp_for_chunk(id: u64, qps_per_req: usize, i: usize, nqps: usize) -> usize {
    let nqps = nqps.max(1) as u64;
    let base = id.wrapping_mul(qps_per_req as u64) % nqps;
    ((base + i as u64) % nqps) as usize
}

/// Size of every chunk but the tail ones: `roundup(ceil(size / n), 128)`.
pub fn chunk_size(size: usize, qps_per_req: usize) -> usize {
    let n = qps_per_req.max(1);
    let per = size.div_ceil(n);
    per.div_ceil(CHUNK_ALIGN).saturating_mul(CHUNK_ALIGN)
}

/// `(offset, len)` of chunk `i` (0-based) of a `size`-byte message split over `qps_per_req`
/// QPs. Chunks past the end are `(size, 0)`.
pub fn chunk(size: usize, qps_per_req: usize, i: usize) -> (usize, usize) {
    let cs = chunk_size(size, qps_per_req);
    let off = cs.saturating_mul(i).min(size);
    let len = cs.min(size - off);
    (off, len)
}

/// One WR of the chain a group posts on one QP (pure plan; the sender turns it into an
/// `ibv_send_wr`; docs/nccl-net-abi.md#data-path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrPlan {
    /// RDMA WRITE of `len` bytes at offset `off` of buffer `sub` (local and remote alike).
    /// `imm`: this write is also the signaled WRITE WITH IMMEDIATE that completes the group on
    /// this QP (n == 1 without the adaptive-routing split; it may be empty).
    Data { sub: u8, off: usize, len: usize, imm: bool },
    /// A zero-length, signaled WRITE WITH IMMEDIATE behind the data (n == 1, adaptive routing
    /// on and the message above NCCL_IB_AR_THRESHOLD).
    ZeroImm,
    /// A signaled WRITE WITH IMMEDIATE of the n sizes into the receiver's completion record
    /// (grouped receives, n > 1).
    SizesImm,
}

use super::limits::{MAX_CHAIN, PIECES_PER_BUFFER};

/// The longest piece one WR carries when the device's WRs take at most `wr_bytes`: a multiple
/// of [`CHUNK_ALIGN`] (so pieces keep the flag lines whole too), at least one.
pub fn piece_bytes(wr_bytes: usize) -> usize {
    (wr_bytes.min(super::limits::MAX_WR_BYTES) / CHUNK_ALIGN).max(1) * CHUNK_ALIGN
}

/// The largest buffer one isend or irecv takes on a device whose work requests carry at most
/// `wr_bytes` (the `maxP2pBytes` the properties report): [`PIECES_PER_BUFFER`] pieces of
/// [`piece_bytes`] — of the aligned piece, not of `wr_bytes` itself, or a buffer could need one
/// piece more than a chain holds.
pub fn max_buffer_bytes(wr_bytes: usize) -> usize {
    PIECES_PER_BUFFER * piece_bytes(wr_bytes)
}

#[cfg(any(test, feature = "testing"))]
/// The chain for QP number `j` (0-based, of `qps_per_req`) of a group whose buffers carry
/// `lens` bytes, each chunk cut into pieces of at most [`piece_bytes`]`(wr_bytes)`. Every
/// chain ends with exactly one completion-carrying write, so the receiver sees one immediate
/// per QP used. Empty data writes are left out except when the write carries the immediate.
/// Returns the number of entries written to `out`, or `None` when the chain would need more
/// than [`MAX_CHAIN`] WRs (a buffer larger than [`max_buffer_bytes`]).
pub fn plan_chain(
    lens: &[usize],
    qps_per_req: usize,
    j: usize,
    ar_split: bool,
    wr_bytes: usize,
    out: &mut [WrPlan; MAX_CHAIN],
) -> Option<usize> {
    plan_chain_as(lens, qps_per_req, j, ar_split, false, wr_bytes, out)
}

/// [`plan_chain`], and with `record` a single buffer completes with the sizes record too (a
/// message too large for the immediate of a version-5 connection, `eager::IMM_SIZE_MAX`).
pub fn plan_chain_as(
    lens: &[usize],
    qps_per_req: usize,
    j: usize,
    ar_split: bool,
    record: bool,
    wr_bytes: usize,
    out: &mut [WrPlan; MAX_CHAIN],
) -> Option<usize> {
    let n = lens.len().min(super::limits::MAX_RECVS);
    let piece = piece_bytes(wr_bytes);
    let mut k = 0;
    let single = n == 1 && !ar_split && !record;
    for (i, &l) in lens.iter().enumerate().take(n) {
        let (off, len) = chunk(l, qps_per_req, j);
        if len == 0 && !single {
            continue;
        }
        let pieces = len.div_ceil(piece).max(1);
        for p in 0..pieces {
            let at = p * piece;
            *out.get_mut(k)? = WrPlan::Data {
                sub: i as u8,
                off: off + at,
                len: piece.min(len - at),
                imm: single && p + 1 == pieces,
            };
            k += 1;
        }
    }
    if !single {
        *out.get_mut(k)? = if n == 1 && !record {
            WrPlan::ZeroImm
        } else {
            WrPlan::SizesImm
        };
        k += 1;
    }
    Some(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(lens: &[usize], nq: usize, j: usize, ar: bool) -> Vec<WrPlan> {
        plan_wr(lens, nq, j, ar, super::super::limits::MAX_WR_BYTES).expect("fits one chain")
    }

    fn plan_wr(lens: &[usize], nq: usize, j: usize, ar: bool, wr: usize) -> Option<Vec<WrPlan>> {
        let mut out = [WrPlan::ZeroImm; MAX_CHAIN];
        let k = plan_chain(lens, nq, j, ar, wr, &mut out)?;
        Some(out[..k].to_vec())
    }

    #[test]
    fn single_message_carries_its_own_immediate() {
        assert_eq!(
            plan(&[1000], 1, 0, false),
            [WrPlan::Data {
                sub: 0,
                off: 0,
                len: 1000,
                imm: true
            }]
        );
        // Zero bytes: one empty write with the immediate.
        assert_eq!(
            plan(&[0], 1, 0, false),
            [WrPlan::Data {
                sub: 0,
                off: 0,
                len: 0,
                imm: true
            }]
        );
        // Split over 4 QPs: QP 1 gets 128..256; QP 3 an empty write that still completes.
        assert_eq!(
            plan(&[300], 4, 1, false),
            [WrPlan::Data {
                sub: 0,
                off: 128,
                len: 128,
                imm: true
            }]
        );
        assert_eq!(
            plan(&[300], 4, 3, false),
            [WrPlan::Data {
                sub: 0,
                off: 300,
                len: 0,
                imm: true
            }]
        );
    }

    #[test]
    fn adaptive_routing_adds_a_zero_length_completion() {
        assert_eq!(
            plan(&[65536], 1, 0, true),
            [
                WrPlan::Data {
                    sub: 0,
                    off: 0,
                    len: 65536,
                    imm: false
                },
                WrPlan::ZeroImm
            ]
        );
        // An empty chunk sends only the completion.
        assert_eq!(plan(&[100], 2, 1, true), [WrPlan::ZeroImm]);
    }

    #[test]
    fn grouped_sends_end_with_the_sizes_write() {
        assert_eq!(
            plan(&[10, 0, 20], 1, 0, false),
            [
                WrPlan::Data {
                    sub: 0,
                    off: 0,
                    len: 10,
                    imm: false
                },
                WrPlan::Data {
                    sub: 2,
                    off: 0,
                    len: 20,
                    imm: false
                },
                WrPlan::SizesImm
            ]
        );
        assert_eq!(plan(&[0, 0], 1, 0, false), [WrPlan::SizesImm]);
        // AR does not change grouped sends.
        assert_eq!(plan(&[0; 8], 2, 1, true), [WrPlan::SizesImm]);
    }

    #[test]
    fn chains_cover_every_byte_once_with_one_completion_per_qp() {
        let mut seed = 0x1234_5678_9abc_def1u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..2000 {
            let n = (rnd() % 8 + 1) as usize;
            let lens: Vec<usize> = (0..n)
                .map(|_| if rnd() % 5 == 0 { 0 } else { (rnd() % 5000) as usize })
                .collect();
            let nq = [1, 2, 3, 4, 8][(rnd() % 5) as usize];
            let ar = rnd() % 2 == 0;
            // Pieces as small as one 128-byte line, so chains of many WRs and chains that
            // cannot fit one post are both planned.
            let wr = [1, 128, 300, 1024, 4096, 1 << 30][(rnd() % 6) as usize];
            let piece = piece_bytes(wr);
            let mut covered = vec![0usize; n];
            for j in 0..nq {
                let single = n == 1 && !ar;
                let data_wrs: usize = lens
                    .iter()
                    .map(|&l| chunk(l, nq, j).1)
                    .filter(|&len| len > 0 || single)
                    .map(|len| len.div_ceil(piece).max(1))
                    .sum();
                let need = data_wrs + usize::from(!single);
                let Some(p) = plan_wr(&lens, nq, j, ar, wr) else {
                    assert!(need > MAX_CHAIN, "a chain of {need} WRs fits {MAX_CHAIN}");
                    covered = lens.clone();
                    break;
                };
                assert_eq!(p.len(), need);
                assert!(!p.is_empty() && p.len() <= MAX_CHAIN);
                let completions = p
                    .iter()
                    .filter(|w| matches!(w, WrPlan::ZeroImm | WrPlan::SizesImm | WrPlan::Data { imm: true, .. }))
                    .count();
                assert_eq!(completions, 1, "exactly one completion per QP");
                assert!(matches!(
                    p.last(),
                    Some(WrPlan::ZeroImm | WrPlan::SizesImm | WrPlan::Data { imm: true, .. })
                ));
                for w in &p {
                    if let WrPlan::Data { sub, off, len, .. } = *w {
                        assert_eq!(off, covered[sub as usize], "chunks in order, no gap");
                        assert!(len <= piece, "a WR of {len} bytes past the {piece}-byte piece");
                        covered[sub as usize] += len;
                        if len > 0 {
                            assert_eq!(off % CHUNK_ALIGN, 0);
                        }
                    }
                }
            }
            assert_eq!(covered, lens, "every byte exactly once");
        }
    }

    #[test]
    fn a_chunk_past_the_wr_limit_is_cut_into_pieces() {
        // 2.5 pieces of 1 KiB on one QP: three writes, the last one short and carrying the
        // immediate.
        assert_eq!(
            plan_wr(&[2560], 1, 0, false, 1024).unwrap(),
            [
                WrPlan::Data {
                    sub: 0,
                    off: 0,
                    len: 1024,
                    imm: false
                },
                WrPlan::Data {
                    sub: 0,
                    off: 1024,
                    len: 1024,
                    imm: false
                },
                WrPlan::Data {
                    sub: 0,
                    off: 2048,
                    len: 512,
                    imm: true
                },
            ]
        );
        // The limit: every buffer of a full group at PIECES_PER_BUFFER pieces fits one chain,
        // one byte more on each does not.
        use super::super::limits::MAX_RECVS;
        let max = max_buffer_bytes(1024);
        assert_eq!(
            plan_wr(&[max; MAX_RECVS], 1, 0, false, 1024).map(|p| p.len()),
            Some(MAX_CHAIN)
        );
        assert_eq!(plan_wr(&[max + 1; MAX_RECVS], 1, 0, false, 1024), None);
        // Real sizes: 4.5 GiB in pieces of 1 GiB, the device limit rounded to 128 bytes.
        let p = plan_wr(&[(9usize << 30) / 2], 1, 0, false, super::super::limits::MAX_WR_BYTES).unwrap();
        assert_eq!(p.len(), 5);
        assert_eq!(piece_bytes(1000), 896);
        assert_eq!(piece_bytes(usize::MAX), 1 << 30);
    }

    /// Found by the transport_core fuzz target: with a `max_msg_sz` off the 128-byte grid
    /// (1266 bytes: pieces of 1152) the largest buffer was computed from the raw size (7 × 1266
    /// = 8862), so an 8192-byte buffer took 8 pieces and its group could never be posted (the
    /// comm failed). It must come from the aligned piece: every buffer at the limit fits.
    #[test]
    fn issue_14_fuzz_a_max_msg_sz_off_the_128_byte_grid() {
        use super::super::limits::MAX_RECVS;
        for wr in [1266, 1000, 129, 4095, (1 << 31) - 1] {
            let max = max_buffer_bytes(wr);
            assert_eq!(max % CHUNK_ALIGN, 0);
            assert!(
                plan_wr(&[max; MAX_RECVS], 1, 0, false, wr).is_some(),
                "{wr}: {max} fits"
            );
            assert!(plan_wr(&[max + 1], 1, 0, false, wr).unwrap().len() > PIECES_PER_BUFFER);
        }
    }

    #[test]
    fn qps_per_request_modes() {
        assert_eq!(qps_per_request(true, 8, 2), 8);
        assert_eq!(qps_per_request(false, 8, 2), 2);
        assert_eq!(qps_per_request(false, 1, 1), 1);
        assert_eq!(qps_per_request(false, 0, 0), 1);
    }

    #[test]
    fn round_robin_over_qps() {
        // Round-robin mode, 4 QPs, one device: request id uses QP id % 4.
        let v: Vec<usize> = (0..8).map(|id| qp_for_chunk(id, 1, 0, 4)).collect();
        assert_eq!(v, [0, 1, 2, 3, 0, 1, 2, 3]);
        // Split mode: every request starts at QP 0 and uses all of them.
        let v: Vec<usize> = (0..4).map(|i| qp_for_chunk(5, 4, i, 4)).collect();
        assert_eq!(v, [0, 1, 2, 3]);
        // Two device pairs, 2 QPs each (nqps 4, 2 QPs per request).
        let v: Vec<(usize, usize)> = (0..3)
            .map(|id| (qp_for_chunk(id, 2, 0, 4), qp_for_chunk(id, 2, 1, 4)))
            .collect();
        assert_eq!(v, [(0, 1), (2, 3), (0, 1)]);
        // Huge counters do not overflow.
        let _ = qp_for_chunk(u64::MAX, 8, 7, 8);
    }

    #[test]
    fn chunks_cover_message_exactly() {
        for &n in &[1usize, 2, 3, 4, 8, 128] {
            for &size in &[
                0usize,
                1,
                127,
                128,
                129,
                255,
                256,
                1000,
                4096,
                65_537,
                1 << 20,
                (1 << 30) + 3,
            ] {
                let mut next = 0;
                for i in 0..n {
                    let (off, len) = chunk(size, n, i);
                    assert_eq!(off, next.min(size), "n={n} size={size} i={i}");
                    if len > 0 {
                        assert_eq!(off % CHUNK_ALIGN, 0);
                    }
                    next = off + len;
                }
                assert_eq!(next, size, "n={n} size={size}");
                // Past the end: empty.
                assert_eq!(chunk(size, n, n + 1).1, 0);
            }
        }
    }

    #[test]
    fn chunk_size_is_128_multiple() {
        assert_eq!(chunk_size(0, 4), 0);
        assert_eq!(chunk_size(1, 4), 128);
        assert_eq!(chunk_size(512, 4), 128);
        assert_eq!(chunk_size(513, 4), 256);
        // small message over 4 QPs: one chunk carries it all, the rest are empty
        assert_eq!(chunk(100, 4, 0), (0, 100));
        assert_eq!(chunk(100, 4, 1), (100, 0));
    }
}
