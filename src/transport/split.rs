//! QP choice and 128-byte chunking for one message (pure, no I/O).
//!
//! Contract (spec §8.8 "QP choice and splitting", §12 rule 13):
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

#[cfg(test)]
mod tests {
    use super::*;

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
