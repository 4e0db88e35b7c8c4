#!/usr/bin/env python3
"""torch.distributed over NCCL, checked exactly, with nccl-tests' columns.

Launched by torchrun (see run_torch.sh), one process per rank:

    torchrun --standalone --nproc_per_node=2 torch_allreduce.py [-b 4K] [-e 256M] ...

Each rank
  * uses GPU LOCAL_RANK % torch.cuda.device_count() (two ranks may share one GPU);
  * sets NCCL_HOSTID to a value of its own before init_process_group, so that NCCL treats the ranks
    as separate hosts and routes their traffic through the network transport (the plugin), never
    through P2P or SHM; and, when run_torch.sh selected softroce, binds its own softroce address
    (SOFTROCE_ADDR=<FERROCE_GPU_SOFTROCE_NET_ACTIVE>.<RANK+1>);
  * all_reduces (sum) float32 and bfloat16 tensors from -b to -e bytes (doubling), every element
    checked exactly: inputs are small integers (x_r[i] = i % 13 + 1 + r), so sums are exact in bf16,
    and repeated in-place all_reduces only multiply by the world size (a power of two is exact);
  * all_gathers a batch of embedding vectors (the serving pattern: a fixed, seeded nn.Embedding on
    every rank; each rank embeds its slice of the batch; the gathered batch is compared on rank 0,
    and on every rank, with a local recomputation of the whole batch);
  * measures the seed's inference case: each rank encodes a batch of queries with a small
    BERT-style encoder built from ENCODER (seeded random weights, nothing downloaded), then the
    pooled embeddings are all_gathered through the transport; P50/P99 latency of that aggregation
    step (ranks aligned first, one query batch size at a time: --embed-queries 1,8,64), and every
    gathered row is checked against a local recomputation;
  * prints, on rank 0, time and bus bandwidth per size in nccl-tests' columns
    (size, count, type, redop, root, time, algbw, busbw, #wrong) and exits non-zero on any wrong
    element on any rank.

`--dry-run` parses the arguments and prints the plan without importing torch (CPU check).
"""

import argparse
import copy
import os
import sys
import time

SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# nccl-tests' type names.
TYPE_NAMES = {"float32": "float", "bfloat16": "bfloat16", "float16": "half"}
ELEM_SIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
PATTERN = 13  # x_r[i] = i % PATTERN + 1 + r
# The BERT-style query encoder (MiniLM-sized: the embedding models used for retrieval).
ENCODER = {"vocab": 30522, "hidden": 384, "layers": 4, "heads": 6, "intermediate": 1536, "seq_len": 32}


def parse_size(text):
    """nccl-tests' size syntax: a number with an optional K, M or G suffix (powers of 1024)."""
    t = str(text).strip().upper()
    if t.endswith("B"):
        t = t[:-1]
    unit = ""
    if t and t[-1] in "KMG":
        unit, t = t[-1], t[:-1]
    try:
        value = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError("bad size %r (use e.g. 4096, 4K, 256M, 1G)" % text)
    n = int(value * SIZE_UNITS[unit])
    if n <= 0:
        raise argparse.ArgumentTypeError("size must be > 0: %r" % text)
    return n


def sizes(min_bytes, max_bytes, factor):
    """Message sizes from min to max, multiplied by factor (nccl-tests -b/-e/-f)."""
    out = []
    s = min_bytes
    while s <= max_bytes:
        out.append(s)
        if factor <= 1:
            break
        s *= factor
    return out


def iters_for(size, iters, warmup, cap_bytes):
    """Iterations (timed, warmup) for one size: at most cap_bytes moved per size, at least 1."""
    n = max(1, min(iters, cap_bytes // max(size, 1)))
    w = max(1, min(warmup, n))
    return n, w


def busbw_factor(op, world):
    """nccl-tests' busBw = algBw * factor."""
    if world <= 1:
        return 1.0
    if op == "all_reduce":
        return 2.0 * (world - 1) / world
    if op == "all_gather":
        return (world - 1) / world
    return 1.0


def expected_sum_scale(world, calls, max_first, limit):
    """After `calls` in-place all_reduces of inputs whose first sum is S, every element is
    S * world**(calls-1). Returns that multiplier when it is exact (world a power of two) and the
    largest value max_first * multiplier stays below `limit` (the dtype's largest finite value);
    else None (then only the fresh single-call check applies)."""
    if world < 1 or world & (world - 1) != 0 or calls < 1:
        return None
    scale = float(world) ** (calls - 1)
    if max_first * scale >= limit:
        return None
    return scale


def percentile(values, q):
    """The q-th percentile (0 < q <= 100) by the nearest-rank method: the smallest value with at
    least q % of the values at or below it."""
    if not values:
        raise ValueError("percentile of no values")
    v = sorted(values)
    k = max(1, -(-len(v) * q // 100))  # ceil(n * q / 100)
    return v[int(k) - 1]


def parse_counts(text):
    """'1,8,64' -> [1, 8, 64]; '' -> [] (the latency section is not run)."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) < 1:
            raise argparse.ArgumentTypeError("bad query count %r (use e.g. 1,8,64)" % part)
        out.append(int(part))
    return out


def latency_header(world, iters, dtype_name):
    c = ENCODER
    return "\n".join([
        "# embedding aggregation latency: BERT-style encoder (vocab %d, hidden %d, %d layers, %d heads, "
        "seq %d), %s, pooled vectors all_gathered over %d ranks, %d timed iterations per row" % (
            c["vocab"], c["hidden"], c["layers"], c["heads"], c["seq_len"], dtype_name, world, iters),
        "# embed-latency %8s %6s %9s %9s %9s %9s %11s %6s" % (
            "queries", "rows", "bytes", "p50(us)", "p99(us)", "mean(us)", "encode(us)", "#wrong"),
    ])


def latency_row(queries, world, row_bytes, lat_us, encode_us, wrong):
    """One row: queries per rank, gathered rows and bytes, P50/P99/mean of the aggregation step,
    P50 of the encoding, wrong elements."""
    return "# embed-latency %8d %6d %9d %9.1f %9.1f %9.1f %11.1f %6d" % (
        queries, queries * world, queries * world * row_bytes, percentile(lat_us, 50),
        percentile(lat_us, 99), sum(lat_us) / len(lat_us), percentile(encode_us, 50), wrong)


def build_encoder(torch, cfg):
    """A BERT-style encoder from a config: token and position embeddings, LayerNorm, post-norm
    transformer layers with GELU, mean pooling over the unpadded tokens, L2 normalisation."""
    nn = torch.nn

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(cfg["vocab"], cfg["hidden"])
            self.pos = nn.Embedding(cfg["seq_len"], cfg["hidden"])
            self.norm = nn.LayerNorm(cfg["hidden"])
            layer = nn.TransformerEncoderLayer(cfg["hidden"], cfg["heads"], cfg["intermediate"], dropout=0.0,
                                               activation="gelu", batch_first=True)
            self.layers = nn.TransformerEncoder(layer, cfg["layers"], enable_nested_tensor=False)

        def forward(self, ids, mask):
            pos = torch.arange(ids.shape[1], device=ids.device)
            x = self.norm(self.tok(ids) + self.pos(pos)[None, :, :])
            x = self.layers(x, src_key_padding_mask=~mask)
            m = mask[:, :, None].to(x.dtype)
            pooled = (x * m).sum(dim=1) / m.sum(dim=1)
            return torch.nn.functional.normalize(pooled, dim=-1)

    return Encoder()


def header(title, op):
    return "\n".join([
        "# op: %s" % op,
        "# %s" % title,
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s" % (
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s" % (
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""),
    ])


def row(size, count, tname, redop, time_us, algbw, busbw, wrong):
    t = ("%7.1f" % time_us) if time_us < 1e7 else ("%7.0f" % time_us)
    return "%12d  %12d  %8s  %6s  %6d  %7s  %6.2f  %6.2f  %5d" % (
        size, count, tname, redop, -1, t, algbw, busbw, wrong)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("4K"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("256M"))
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("--cap", type=parse_size, default=parse_size("1G"),
                   help="at most this many bytes all_reduced per size (fewer iterations for large sizes)")
    p.add_argument("--dtypes", default="float32,bfloat16",
                   help="comma-separated: float32, bfloat16, float16")
    p.add_argument("--embed-vocab", type=int, default=32000)
    p.add_argument("--embed-dim", type=int, default=1024)
    p.add_argument("--embed-batch", type=int, default=2048,
                   help="global batch of token ids (split evenly over the ranks)")
    p.add_argument("--embed-queries", type=parse_counts, default=parse_counts("1,8,64"),
                   help="query batch sizes per rank for the aggregation latency ('' = skip it)")
    p.add_argument("--embed-iters", type=int, default=200,
                   help="timed iterations per query batch size (P99 needs 100 or more)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout", type=int, default=300,
                   help="seconds for init_process_group's collective timeout")
    p.add_argument("--no-hostid", action="store_true",
                   help="do not set NCCL_HOSTID per rank (NCCL may then use P2P/SHM between ranks)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan and exit (no torch import)")
    a = p.parse_args(argv)
    a.dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    for d in a.dtypes:
        if d not in TYPE_NAMES:
            p.error("unknown dtype %r (float32, bfloat16, float16)" % d)
    if a.minbytes > a.maxbytes:
        p.error("-b %d is larger than -e %d" % (a.minbytes, a.maxbytes))
    if a.iters < 1 or a.warmup_iters < 0 or a.stepfactor < 1:
        p.error("need -n >= 1, -w >= 0, -f >= 1")
    if a.embed_iters < 1:
        p.error("need --embed-iters >= 1")
    return a


def rank_environment(rank, no_hostid=False, environ=None):
    """The per-rank variables this rank sets before init_process_group (returned, and set)."""
    env = os.environ if environ is None else environ
    out = {}
    if not no_hostid:
        out["NCCL_HOSTID"] = "%s%d" % (env.get("FERROCE_GPU_HOSTID_PREFIX", "ferroce-gpu-rank"), rank)
    net = env.get("FERROCE_GPU_SOFTROCE_NET_ACTIVE", "")
    if net:
        out["SOFTROCE_ADDR"] = "%s.%d" % (net, rank + 1)
    env.update(out)
    return out


def nccl_version_string(torch):
    """torch.cuda.nccl.version() is a tuple in recent torch, an int (2708) in old ones."""
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - informational only
        return "?"
    if isinstance(v, int):
        return "%d.%d.%d" % (v // 1000, v % 1000 // 100, v % 100) if v < 10000 else \
            "%d.%d.%d" % (v // 10000, v % 10000 // 100, v % 100)
    return ".".join(str(x) for x in v)


def dry_run(a):
    world = int(os.environ.get("WORLD_SIZE", "2"))
    print("# dry run: world %d, dtypes %s" % (world, ",".join(a.dtypes)))
    for r in range(world):
        e = rank_environment(r, a.no_hostid, environ={
            k: v for k, v in os.environ.items() if k.startswith("FERROCE_GPU_")})
        print("# rank %d env: %s" % (r, " ".join("%s=%s" % kv for kv in sorted(e.items()))))
    for d in a.dtypes:
        print(header("all_reduce %s (plan)" % d, "all_reduce"))
        for s in sizes(a.minbytes, a.maxbytes, a.stepfactor):
            n, w = iters_for(s, a.iters, a.warmup_iters, a.cap)
            print("%12d  %12d  %8s  %6s  %6d  iters %d warmup %d" % (
                s, s // ELEM_SIZE[d], TYPE_NAMES[d], "sum", -1, n, w))
    per = a.embed_batch // world
    print("# all_gather embedding: vocab %d dim %d batch %d (%d per rank)" % (
        a.embed_vocab, a.embed_dim, per * world, per))
    if a.embed_queries:
        print(latency_header(world, a.embed_iters, "float32"))
        print("# embed-latency plan: queries per rank %s" % ",".join(map(str, a.embed_queries)))
    return 0


def main(argv=None):
    a = parse_args(argv)
    if a.dry_run:
        return dry_run(a)

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    set_env = rank_environment(rank, a.no_hostid)

    import datetime
    import torch
    import torch.distributed as dist

    ndev = torch.cuda.device_count()
    if ndev < 1:
        print("rank %d: no CUDA device" % rank, file=sys.stderr)
        return 2
    dev_index = local_rank % ndev
    torch.cuda.set_device(dev_index)
    dev = torch.device("cuda", dev_index)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=a.timeout))
    say = (lambda *x: print(*x, flush=True)) if rank == 0 else (lambda *x: None)
    nccl_ver = nccl_version_string(torch)
    print("# rank %d/%d: cuda:%d (%s), %s" % (
        rank, world, dev_index, torch.cuda.get_device_name(dev_index),
        " ".join("%s=%s" % kv for kv in sorted(set_env.items()))), flush=True)
    say("# torch %s, NCCL %s, CUDA %s, world %d, GPUs visible per rank %d" % (
        torch.__version__, nccl_ver, torch.version.cuda, world, ndev))

    total_wrong = 0
    busbws = []

    def sync_stats(elapsed, wrong):
        """Average time over ranks (at least 1 ns) and total wrong elements (one small NCCL
        all_reduce)."""
        t = torch.tensor([elapsed, float(wrong)], dtype=torch.float64, device=dev)
        dist.all_reduce(t)
        return max(t[0].item() / world, 1e-9), int(t[1].item())

    # ---- all_reduce, float32 and bfloat16, every element checked ----
    for dname in a.dtypes:
        dtype = getattr(torch, dname)
        say(header("all_reduce (in-place) %s, sum, %d ranks" % (dname, world), "all_reduce"))
        for size in sizes(a.minbytes, a.maxbytes, a.stepfactor):
            count = size // ELEM_SIZE[dname]
            n, w = iters_for(size, a.iters, a.warmup_iters, a.cap)
            base = (torch.arange(count, device=dev, dtype=torch.int32) % PATTERN + 1).to(torch.float32)
            buf = (base + rank).to(dtype)
            # First sum S[i] = world*(i%13+1) + world*(world-1)/2 (small integers: exact).
            first = base * world + world * (world - 1) // 2
            for _ in range(w):
                dist.all_reduce(buf)
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            for _ in range(n):
                dist.all_reduce(buf)
            torch.cuda.synchronize(dev)
            elapsed = time.perf_counter() - t0
            max_first = PATTERN * world + world * (world - 1) // 2
            scale = expected_sum_scale(world, w + n, max_first, torch.finfo(dtype).max)
            wrong = 0
            if scale is not None:
                # Chain check: every call's result feeds the next one, so any wrong element in any
                # call shows in the final buffer.
                wrong += int(torch.ne(buf, (first * scale).to(dtype)).sum().item())
            # Fresh check of one call.
            buf.copy_((base + rank).to(dtype))
            dist.all_reduce(buf)
            wrong += int(torch.ne(buf, first.to(dtype)).sum().item())
            torch.cuda.synchronize(dev)
            avg, wrong_all = sync_stats(elapsed / n, wrong)
            total_wrong += wrong_all
            algbw = size / avg / 1e9
            busbw = algbw * busbw_factor("all_reduce", world)
            busbws.append(busbw)
            say(row(size, count, TYPE_NAMES[dname], "sum", avg * 1e6, algbw, busbw, wrong_all))
            del buf, base, first

    # ---- all_gather of embedding vectors (serving pattern) ----
    torch.manual_seed(a.seed)
    emb_cpu = torch.nn.Embedding(a.embed_vocab, a.embed_dim)  # same seeded weights on every rank
    gen = torch.Generator().manual_seed(a.seed + 1)
    per = max(1, a.embed_batch // world)
    ids = torch.randint(0, a.embed_vocab, (per * world,), generator=gen)
    say(header("all_gather of an embedded batch: vocab %d, dim %d, batch %d (%d per rank)" % (
        a.embed_vocab, a.embed_dim, per * world, per), "all_gather"))
    for dname in a.dtypes:
        dtype = getattr(torch, dname)
        emb = copy.deepcopy(emb_cpu).to(device=dev, dtype=dtype)  # Module.to works in place
        with torch.no_grad():
            mine = emb(ids[rank * per:(rank + 1) * per].to(dev)).contiguous()
            full_ref = emb(ids.to(dev))
        out = torch.empty((per * world, a.embed_dim), dtype=dtype, device=dev)

        def gather():
            if hasattr(dist, "all_gather_into_tensor"):
                dist.all_gather_into_tensor(out, mine)
            else:
                dist.all_gather(list(out.chunk(world)), mine)

        size = out.numel() * out.element_size()
        n, w = iters_for(size, a.iters, a.warmup_iters, a.cap)
        for _ in range(w):
            gather()
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(n):
            gather()
        torch.cuda.synchronize(dev)
        elapsed = time.perf_counter() - t0
        # Fresh gather into a poisoned buffer, then compare with the local recomputation.
        out.fill_(float("nan"))
        gather()
        wrong = int(torch.ne(out, full_ref).sum().item())
        avg, wrong_all = sync_stats(elapsed / n, wrong)
        total_wrong += wrong_all
        algbw = size / avg / 1e9
        busbw = algbw * busbw_factor("all_gather", world)
        say(row(size, out.numel(), TYPE_NAMES[dname], "none", avg * 1e6, algbw, busbw, wrong_all))
        if rank == 0 and wrong:
            bad = torch.ne(out, full_ref).any(dim=1).nonzero().flatten()[:8].tolist()
            print("# rank 0: gathered embedding rows differ from the recomputation at rows %s" % bad,
                  flush=True)

    if a.embed_queries:
        total_wrong += embedding_latency(a, torch, dist, dev, rank, world, say)

    say("# Out of bounds values : %d %s" % (total_wrong, "FAILED" if total_wrong else "OK"))
    if busbws:
        say("# Avg bus bandwidth    : %g " % (sum(busbws) / len(busbws)))
    say("#")
    dist.barrier(device_ids=[dev_index])
    dist.destroy_process_group()
    return 1 if total_wrong else 0


def embedding_latency(a, torch, dist, dev, rank, world, say):
    """The seed's inference case: encode, then all_gather the pooled embeddings; P50/P99 of the
    all_gather step on rank 0 (ranks aligned by a small all_reduce first, so that one rank's
    encoding does not count as the other's network time). Returns the wrong elements, all ranks."""
    cfg = ENCODER
    torch.manual_seed(a.seed + 7)  # the same weights on every rank
    model = build_encoder(torch, cfg).to(dev).eval()
    align = torch.zeros(1, device=dev)
    say(latency_header(world, a.embed_iters, "float32"))
    wrong_all = 0
    for q in a.embed_queries:

        def batch(it, r):
            """Token ids and padding mask of rank r's queries in iteration it (seeded: any rank can
            recompute any other's)."""
            g = torch.Generator().manual_seed(a.seed * 1000003 + it * 131 + r * 7 + q)
            ids = torch.randint(1, cfg["vocab"], (q, cfg["seq_len"]), generator=g)
            lengths = torch.randint(4, cfg["seq_len"] + 1, (q,), generator=g)
            mask = torch.arange(cfg["seq_len"])[None, :] < lengths[:, None]
            return ids.to(dev), mask.to(dev)

        out = torch.empty((q * world, cfg["hidden"]), dtype=torch.float32, device=dev)
        lat, enc = [], []
        warm = min(20, a.embed_iters)
        with torch.inference_mode():
            for it in range(warm + a.embed_iters):
                ids, mask = batch(it, rank)
                torch.cuda.synchronize(dev)
                t0 = time.perf_counter()
                mine = model(ids, mask).contiguous()
                torch.cuda.synchronize(dev)
                t1 = time.perf_counter()
                dist.all_reduce(align)
                torch.cuda.synchronize(dev)
                t2 = time.perf_counter()
                dist.all_gather_into_tensor(out, mine)
                torch.cuda.synchronize(dev)
                t3 = time.perf_counter()
                if it >= warm:
                    enc.append((t1 - t0) * 1e6)
                    lat.append((t3 - t2) * 1e6)
            # The last iteration's gathered rows against a recomputation of every rank's queries:
            # this rank's own rows bit for bit, the others' (the same kernels on the same inputs)
            # within float32 rounding of a different launch.
            last = warm + a.embed_iters - 1
            wrong = 0
            for r in range(world):
                ids, mask = batch(last, r)
                ref = model(ids, mask)
                got = out[r * q:(r + 1) * q]
                if r == rank:
                    wrong += int(torch.ne(got, mine).sum().item())
                else:
                    wrong += int((~torch.isclose(got, ref, rtol=1e-5, atol=1e-6)).sum().item())
        t = torch.tensor([float(wrong)], dtype=torch.float64, device=dev)
        dist.all_reduce(t)
        w = int(t[0].item())
        wrong_all += w
        say(latency_row(q, world, cfg["hidden"] * 4, lat, enc, w))
    return wrong_all


if __name__ == "__main__":
    sys.exit(main())
