/* all_reduce_perf: ring allreduce (reduce-scatter + all-gather, float32 sum) through a net plugin,
 * N ranks as processes, with nccl-tests' flags and table.
 *
 * The algorithm is NCCL's ring allreduce (runRing in all_reduce.h) with the SIMPLE protocol:
 * the buffer is cut into loops of nChannels x nRanks chunks of at most --chunk bytes; for each
 * chunk a rank does, in order, on its ring channel (to rank+1, from rank-1):
 *   step 0            send                 its input chunk r-1
 *   steps 1..n-2      recvReduceSend       recv partial, + own input, send on
 *   step n-1          recvReduceCopySend   recv partial, + own input = final chunk r, send on
 *   steps n..2n-3     recvCopySend         recv final chunk, keep it, send on
 *   step 2n-2         recv                 recv final chunk r+1
 * As in NCCL's SIMPLE protocol, a ring chunk is --chunksteps steps of --chunk bytes
 * (ALLREDUCE_CHUNKSTEPS 4 × 512 KiB = 2 MiB) and moves in slices of --slicesteps steps
 * (ALLREDUCE_SLICESTEPS 2: 1 MiB), one network message per slice, --steps / --slicesteps slices in
 * flight per comm (8 / 2 = 4, NCCL's 4 MiB buffer): a step of the chunk (send, recvReduceSend, ...)
 * handles its slices in order, so a reduced slice goes on while the next one is still arriving.
 * Slices are sized as NCCL's: half the step each, but at least 1/32 of a full slice (32 KiB), so
 * a step of at most 32 KiB moves as one message and a 0-byte one (NCCL's proxy sends an empty
 * slice too).
 * --chunksteps 1 --slicesteps 1 gives one message per chunk and step.
 * Reduce-scatter receives land in registered slots per channel (NCCL's per-connection FIFO) or,
 * with --direct 1 (default, out of place), in the output buffer; the CPU reduces them with the
 * input, and the result is sent from the output buffer directly. All-gather receives (final
 * data) go straight into the registered output buffer and are forwarded from there (NCCL's
 * direct path for registered buffers), so they cost no copy. Sends and receives each keep their
 * order, and a send-only step does not wait for an earlier receive-only one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum { OP_SEND = 1, OP_RRS, OP_RRCS, OP_RCS, OP_RECV };
#define HAS_RECV(k) ((k) != OP_SEND)
#define HAS_SEND(k) ((k) != OP_RECV)
/* all-gather steps receive final data: directly into the output buffer, as NCCL does with
 * registered user buffers (no copy); reduce steps receive into a slot */
#define DIRECT(k) ((k) == OP_RCS || (k) == OP_RECV)

typedef struct {
  size_t off, nelem;
  int kind;
} aop_t;

typedef struct {
  aop_t* ops;
  int nops, cap;
  /* engine */
  int scur, rcur, rpost;         /* next op with a send / with a receive to run; next receive to post */
  long recv_consumed;            /* receives whose slot the CPU has consumed */
  int ready[H_MAX_STEPS];        /* ops whose send is ready, in send order, not yet posted */
  long ready_head, ready_tail;
  hq_t sq, rq;
  void* mh_send_in;  /* the input buffer, registered on the send comm */
  void* mh_send_out; /* the output buffer, registered on the send comm */
  void* mh_recv_out; /* the output buffer, registered on the recv comm (direct receives) */
} achan_t;

static void push(achan_t* a, size_t off, size_t nelem, int kind) {
  if (a->nops == a->cap) {
    a->cap = a->cap ? a->cap * 2 : 64;
    a->ops = realloc(a->ops, (size_t)a->cap * sizeof *a->ops);
  }
  a->ops[a->nops++] = (aop_t){off, nelem, kind};
}

/* The op list of channel c for `count` floats (see the file comment). */
static void build_ops(hctx_t* h, achan_t* a, int c, size_t count) {
  int n = h->nranks, r = h->rank, C = h->nch;
  size_t CE = h->o->chunk_bytes * (size_t)h->o->chunk_steps / sizeof(float);
  size_t slices = (size_t)(h->o->chunk_steps / h->o->slice_steps);
  size_t loop = (size_t)C * n * CE;
  size_t min_se = h->o->chunk_bytes * (size_t)h->o->slice_steps / 32 / sizeof(float);
  a->nops = 0;
  for (size_t base = 0; base < count; base += loop) {
    size_t end = base + loop < count ? base + loop : count;
    size_t rem = end - base;
    size_t real = (rem + (size_t)C * n - 1) / ((size_t)C * n);
    real = (real + 3) & ~(size_t)3; /* 16-byte aligned chunks, as NCCL */
    if (real > CE) real = CE;
    size_t chbase = base + (size_t)c * n * real;
    for (int s = 0; s <= 2 * n - 2; s++) {
      int kind, chunk;
      if (s == 0) kind = OP_SEND, chunk = (r + n - 1) % n;
      else if (s <= n - 2) kind = OP_RRS, chunk = (r + n - 1 - s) % n;
      else if (s == n - 1) kind = OP_RRCS, chunk = r;
      else if (s <= 2 * n - 3) kind = OP_RCS, chunk = (r + 2 * n - 1 - s) % n;
      else kind = OP_RECV, chunk = (r + 1) % n;
      size_t off = chbase + (size_t)chunk * real;
      size_t nelem = off < end ? (end - off < real ? end - off : real) : 0;
      /* the step's slices, in order, sized as NCCL's genericOp (prims_simple.h): sliceSize =
       * max(divUp(nelem, 16 * SlicePerChunk) * 16, stepSize * StepPerSlice / 32) elements, so a
       * slice is at least 1/32 of a full one (32 KiB at the defaults); every step has
       * SlicePerChunk slices, and an empty one still moves as a 0-byte message (the proxy
       * posts one isend/irecv per slice: nsteps / sliceSteps of them) */
      size_t se = (nelem + 16 * slices - 1) / (16 * slices) * 16;
      if (se < min_se) se = min_se;
      if (se > CE / slices) se = CE / slices; /* a slot's size (NCCL's stepSize is a power of 2) */
      for (size_t k = 0, done = 0; k < slices; k++) {
        size_t n_k = nelem - done < se ? nelem - done : se;
        push(a, off + done, n_k, kind);
        done += n_k;
      }
    }
  }
}

static void reduce_into(float* restrict dst, const float* restrict b, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] += b[i];
}

static void reduce(float* restrict dst, const float* restrict a, const float* restrict b, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
}

/* One allreduce: in -> out (in == out for in-place).
 * Ops run in dataflow order: sends in their list order and receives in theirs (each is FIFO on its
 * comm); an op that receives and sends runs when both orders reach it. So the next loop's first
 * send does not wait for this loop's last receive (NCCL gets the same overlap from larger chunks
 * and more channels). */
static int next_with(const aop_t* ops, int i, int n, int want_recv) {
  while (i < n && !(want_recv ? HAS_RECV(ops[i].kind) : HAS_SEND(ops[i].kind))) i++;
  return i;
}

static void run_allreduce(hctx_t* h, achan_t* A, float* in, float* out) {
  int steps = h->o->steps / h->o->slice_steps; /* messages (slices) in flight per comm */
  /* out of place with --direct 1: reduce steps also receive into the output buffer and add the
   * input there (the received lines are still in cache); in place they need the slots */
  int direct_all = h->o->direct && in != out;
  int compute = h->o->compute;
  int prev = (h->rank + h->nranks - 1) % h->nranks;
  for (int c = 0; c < h->nch; c++) {
    achan_t* a = &A[c];
    a->scur = next_with(a->ops, 0, a->nops, 0);
    a->rcur = next_with(a->ops, 0, a->nops, 1);
    a->rpost = a->rcur;
    a->recv_consumed = 0;
    a->ready_head = a->ready_tail = 0;
    hq_init(&a->sq, h->ch[c]->send_comm, 1, h->rank, steps);
    hq_init(&a->rq, h->ch[c]->recv_comm, 0, prev, steps);
  }
  int left = h->nch;
  while (left) {
    int progress = 0;
    left = 0;
    for (int c = 0; c < h->nch; c++) {
      achan_t* a = &A[c];
      hchan_t* ch = h->ch[c];
      aop_t* ops = a->ops;
      /* pre-post receives into free slots */
      while (a->rpost < a->nops && a->rq.posted - a->recv_consumed < steps) {
        aop_t* op = &ops[a->rpost];
        size_t bytes = op->nelem * sizeof(float);
        int ok;
        if (DIRECT(op->kind) || direct_all) /* straight into the output buffer */
          ok = hq_post_recv(h, &a->rq, out + op->off, bytes, bytes, a->mh_recv_out);
        else
          ok = hq_post_recv(h, &a->rq, ch->slots + (size_t)(a->rq.posted % steps) * ch->slot_bytes, ch->slot_bytes, bytes,
                            ch->slots_mh);
        if (!ok) break;
        a->rpost = next_with(ops, a->rpost + 1, a->nops, 1);
        progress = 1;
      }
      /* the "kernel": run the ops whose data and send room are there */
      for (;;) {
        int ran = 0;
        /* a receive-only op, or a receive+send op both orders have reached */
        if (a->rcur < a->nops && a->rq.done > a->recv_consumed) {
          aop_t* op = &ops[a->rcur];
          int sends = HAS_SEND(op->kind);
          if (!sends || (a->scur == a->rcur && (a->ready_tail - a->sq.posted) + hq_inflight(&a->sq) < steps)) {
            const float* slot = (const float*)(ch->slots + (size_t)(a->recv_consumed % steps) * ch->slot_bytes);
            double t0 = h_now();
            if (DIRECT(op->kind) || !compute)
              ; /* final data, already in place (or --compute 0) */
            else if (direct_all)
              reduce_into(out + op->off, in + op->off, op->nelem);
            else
              reduce(out + op->off, slot, in + op->off, op->nelem);
            h_stats.compute_s += h_now() - t0;
            a->recv_consumed++;
            if (sends) {
              a->ready[a->ready_tail++ % H_MAX_STEPS] = a->scur;
              a->scur = next_with(ops, a->scur + 1, a->nops, 0);
            }
            a->rcur = next_with(ops, a->rcur + 1, a->nops, 1);
            ran = 1;
          }
        }
        /* a send-only op (its data is the input) */
        if (a->scur < a->nops && !HAS_RECV(ops[a->scur].kind) &&
            (a->ready_tail - a->sq.posted) + hq_inflight(&a->sq) < steps) {
          a->ready[a->ready_tail++ % H_MAX_STEPS] = a->scur;
          a->scur = next_with(ops, a->scur + 1, a->nops, 0);
          ran = 1;
        }
        if (!ran) break;
        progress = 1;
      }
      /* post the sends that are ready, in order */
      while (a->ready_head < a->ready_tail) {
        aop_t* op = &ops[a->ready[a->ready_head % H_MAX_STEPS]];
        float* src = op->kind == OP_SEND ? in : out;
        void* mh = (op->kind == OP_SEND && in != out) ? a->mh_send_in : a->mh_send_out;
        if (!hq_post_send(h, &a->sq, src + op->off, op->nelem * sizeof(float), mh)) break;
        a->ready_head++;
        progress = 1;
      }
      progress |= hq_poll(h, &a->sq);
      progress |= hq_poll(h, &a->rq);
      if (a->scur < a->nops || a->rcur < a->nops || a->ready_head < a->ready_tail || a->sq.done < a->sq.posted ||
          a->rq.done < a->rq.posted)
        left++;
    }
    if (!progress) h_idle(h);
  }
}

static void init_data(hctx_t* h, float* in, float* out, size_t count, int inplace) {
  for (size_t i = 0; i < count; i++) in[i] = h_pattern(h->rank, i);
  if (!inplace) memset(out, 0xff, count * sizeof(float)); /* NaN: untouched elements count as wrong */
}

static long check_data(hctx_t* h, const float* out, size_t count) {
  long wrong = 0;
  for (size_t i = 0; i < count; i++) {
    float want = 0;
    for (int r = 0; r < h->nranks; r++) want += h_pattern(r, i);
    if (out[i] != want) {
      if (wrong < 5)
        fprintf(stderr, "[rank %d] all_reduce_perf: element %zu of %zu is %g, expected %g\n", h->rank, i, count,
                (double)out[i], (double)want);
      wrong++;
    }
  }
  return wrong;
}

static int body(hctx_t* h) {
  hopts_t* o = h->o;
  if (!o->compute && o->check) {
    if (h->rank == 0) printf("# --compute 0: the reduction is skipped, so results are not checked (-c 0)\n");
    o->check = 0;
  }
  h_net_open(h);
  /* receive slots of one slice each (only the first steps/slicesteps are used) */
  h_ring_connect(h, o->chunk_bytes * (size_t)o->slice_steps);
  if (h->rank == 0)
    printf("# ring chunk %zu bytes (%d steps), messages (slices) of up to %zu bytes, %d in flight per comm\n",
           o->chunk_bytes * (size_t)o->chunk_steps, o->chunk_steps, o->chunk_bytes * (size_t)o->slice_steps,
           o->steps / o->slice_steps);
  size_t maxcount = o->max_bytes / sizeof(float);
  float* in = h_alloc(maxcount * sizeof(float));
  float* out = h_alloc(maxcount * sizeof(float));
  achan_t A[H_MAX_CHANNELS];
  memset(A, 0, sizeof A);
  for (int c = 0; c < h->nch; c++) {
    A[c].mh_send_in = h_reg(h, h->ch[c]->send_comm, in, maxcount * sizeof(float));
    A[c].mh_send_out = h_reg(h, h->ch[c]->send_comm, out, maxcount * sizeof(float));
    A[c].mh_recv_out = h_reg(h, h->ch[c]->recv_comm, out, maxcount * sizeof(float));
  }
  hcoll_t coll = {"float", "sum", -1, 2.0 * (h->nranks - 1) / h->nranks, sizeof(float)};
  h_print_header(h, &coll);
  int maxrows = 0;
  for (size_t s = o->min_bytes; s <= o->max_bytes; s = h_next_size(o, s)) maxrows++;
  hrow_t* rows = calloc((size_t)maxrows + 1, sizeof *rows);
  int nrows = 0;
  /* as nccl-tests: warm up once at the largest size before the sweep */
  for (int c = 0; c < h->nch; c++) build_ops(h, &A[c], c, maxcount);
  for (int i = 0; i < o->warmup; i++) run_allreduce(h, A, in, out);
  for (size_t s = o->min_bytes; s <= o->max_bytes; s = h_next_size(o, s)) {
    hrow_t* row = &rows[nrows++];
    row->count = s / sizeof(float);
    row->bytes = row->count * sizeof(float);
    for (int c = 0; c < h->nch; c++) build_ops(h, &A[c], c, row->count);
    for (int p = 0; p < 1 + (o->inplace != 0); p++) {
      float* src = p ? out : in;
      for (int i = 0; i < o->warmup; i++) run_allreduce(h, A, src, out);
      h_barrier(h);
      int stats = o->stats && p == 0 && h_next_size(o, s) > o->max_bytes;
      if (stats) h_stats_begin(h);
      if (o->stats && p == 0) h_work_begin(h);
      double t0 = h_now();
      for (int i = 0; i < o->iters; i++) run_allreduce(h, A, src, out);
      double dt = (h_now() - t0) / o->iters;
      /* ring steps of the timed iterations: 2(n-1) per all_reduce (reduce-scatter, all-gather), per channel */
      if (o->stats && p == 0) h_work_report(h, row->bytes, (double)o->iters * 2 * (h->nranks - 1) * h->nch);
      if (stats) h_stats_report(h, "the timed iterations of the largest size (out of place)");
      dt = h_allreduce_double(h, dt, o->average);
      long wrong = 0;
      for (int k = 0; k < o->check; k++) {
        init_data(h, src, out, row->count, p);
        h_barrier(h);
        run_allreduce(h, A, src, out);
        wrong += check_data(h, out, row->count);
      }
      wrong = (long)h_allreduce_double(h, (double)wrong, 4);
      row->time_us[p] = dt * 1e6;
      row->algbw[p] = dt > 0 ? row->bytes / dt / 1e9 : 0;
      row->busbw[p] = row->algbw[p] * coll.bus_factor;
      row->wrong[p] = wrong;
    }
    h_print_row(h, &coll, row);
  }
  int bad = h_print_footer(h, rows, nrows);
  h_write_outputs(h, &coll, rows, nrows);
  for (int c = 0; c < h->nch; c++) {
    free(A[c].ops);
    h_dereg(h, h->ch[c]->send_comm, A[c].mh_send_in);
    h_dereg(h, h->ch[c]->send_comm, A[c].mh_send_out);
    h_dereg(h, h->ch[c]->recv_comm, A[c].mh_recv_out);
  }
  h_ring_close(h);
  h_net_close(h);
  free(rows);
  return bad;
}

int main(int argc, char** argv) {
  return h_main(argc, argv, "all_reduce_perf", body,
                "      --direct 0|1         out of place, reduce-scatter steps too receive into the output\n"
                "                           buffer (default 1); 0 = through the slots, as NCCL without\n"
                "                           registered user buffers\n"
                "      --compute 0|1        0: skip the CPU reduction (diagnosis: the network part alone;\n"
                "                           results are then not checked; default 1)\n"
                "      --chunksteps K       steps (--chunk bytes each) per ring chunk (default 4 =\n"
                "                           NCCL's ALLREDUCE_CHUNKSTEPS)\n"
                "      --slicesteps S       steps per network message (default 2 = ALLREDUCE_SLICESTEPS);\n"
                "                           --steps / S messages in flight per comm\n");
}
