/* sendrecv_perf: every rank sends `size` bytes to rank+1 and receives `size` bytes from rank-1
 * at the same time (nccl-tests' sendrecv_perf; with 2 ranks, a pair exchanging), through a net
 * plugin. Registered user buffers are sent from and received into directly, cut into messages of
 * at most --chunk bytes, the buffer split over the channels, up to --steps requests in flight per
 * comm. busbw = algbw.
 *
 * -P (ping-pong, 2 ranks): rank 0 sends one message of `size` bytes, rank 1 answers with one as
 * soon as it has it; both keep --steps receives posted ahead (as NCCL's proxy does), so a round
 * trip is two one-way trips. The time column is half the median round trip measured on rank 0
 * (what ib_write_lat reports as t_typical).
 * -O (one way, 2 ranks): only rank 0 sends, to rank 1 (compare with unidirectional ib_write_bw).
 *   The timed iterations run back to back as one stream, as ib_write_bw streams its writes and
 *   as NCCL's send-only kernels and receive proxy do (the proxy posts the next operation's
 *   receives while the current one's are in flight): the messages of iteration k+1 go out while
 *   those of iteration k are still landing, at the same buffer offsets (identical bytes, so the
 *   overlapping receives are harmless). Checked iterations (-c) run one at a time. In two-way
 *   mode each rank's iteration ends with its receives, as an NCCL sendrecv kernel does.
 * --group G: the receiver posts G consecutive messages in one grouped irecv (n = G, as NCCL does
 * for up to maxRecvs sub-receives on one comm); the sender still sends each message on its own.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

typedef struct {
  size_t off, bytes; /* this channel's part of the buffer */
  long nmsg, spost, rpost, rdone; /* messages: in all, sends posted, receives posted / done */
  hq_t sq, rq;
  void* mh_send;
  void* mh_recv;
} schan_t;

static void plan(hctx_t* h, schan_t* S, size_t bytes) {
  int C = h->nch;
  size_t per = (bytes + C - 1) / C;
  per = (per + 15) & ~(size_t)15;
  size_t chunk = h->o->chunk_bytes;
  for (int c = 0; c < C; c++) {
    size_t off = (size_t)c * per;
    S[c].off = off < bytes ? off : bytes;
    S[c].bytes = off < bytes ? (bytes - off < per ? bytes - off : per) : 0;
    S[c].nmsg = (long)((S[c].bytes + chunk - 1) / chunk);
    if (bytes == 0 && c == 0) S[c].nmsg = 1; /* a 0-byte message, legal in NCCL */
  }
}

/* `iters` iterations as one stream of iters × nmsg messages per channel */
static void run_sendrecv(hctx_t* h, schan_t* S, char* sbuf, char* rbuf, int iters) {
  int steps = h->o->steps;
  int prev = (h->rank + h->nranks - 1) % h->nranks;
  size_t chunk = h->o->chunk_bytes;
  int do_send = !(h->o->oneway && h->rank == 1), do_recv = !(h->o->oneway && h->rank == 0);
  int G = h->o->group;
  for (int c = 0; c < h->nch; c++) {
    S[c].spost = S[c].rpost = S[c].rdone = 0;
    hq_init(&S[c].sq, h->ch[c]->send_comm, 1, h->rank, steps * G);
    hq_init(&S[c].rq, h->ch[c]->recv_comm, 0, prev, steps);
  }
  for (;;) {
    int progress = 0, left = 0;
    for (int c = 0; c < h->nch; c++) {
      schan_t* s = &S[c];
      long nsend = do_send ? s->nmsg * iters : 0, nrecv = do_recv ? s->nmsg * iters : 0;
      while (s->rpost < nrecv) {
        /* up to G consecutive messages in one (grouped) receive */
        void* d[H_MAX_GROUP];
        void* mh[H_MAX_GROUP];
        size_t len[H_MAX_GROUP];
        int n = 0;
        for (; n < G && s->rpost + n < nrecv; n++) {
          size_t o = (size_t)((s->rpost + n) % s->nmsg) * chunk;
          len[n] = s->bytes - o < chunk ? s->bytes - o : chunk;
          d[n] = rbuf + s->off + o;
          mh[n] = s->mh_recv;
        }
        if (!hq_post_recvn(h, &s->rq, n, d, len, len, mh)) break;
        s->rpost += n;
        progress = 1;
      }
      while (s->spost < nsend) {
        size_t o = (size_t)(s->spost % s->nmsg) * chunk;
        size_t len = s->bytes - o < chunk ? s->bytes - o : chunk;
        if (!hq_post_send(h, &s->sq, sbuf + s->off + o, len, s->mh_send)) break;
        s->spost++;
        progress = 1;
      }
      progress |= hq_poll(h, &s->sq);
      int n_oldest = s->rq.n[s->rq.done % H_MAX_INFLIGHT];
      if (hq_poll(h, &s->rq)) s->rdone += n_oldest, progress = 1;
      left += s->sq.done < nsend || s->rdone < nrecv;
    }
    if (!left) break;
    if (!progress) h_idle(h);
  }
}

/* `iters` round trips of one `bytes` message on channel 0; rank 0 stores each round trip in t[] */
static void run_pingpong(hctx_t* h, schan_t* S, char* sbuf, char* rbuf, size_t bytes, int iters, double* t) {
  hq_t sq, rq;
  int peer = 1 - h->rank;
  hq_init(&sq, h->ch[0]->send_comm, 1, h->rank, h->o->steps);
  hq_init(&rq, h->ch[0]->recv_comm, 0, peer, h->o->steps);
  for (int i = 0; i < iters; i++) {
    double t0 = h_now();
    int sent = 0;
    for (;;) {
      int progress = 0;
      progress |= hq_poll(h, &rq);
      /* the answer goes out first; re-posting receives (CTS writes to the peer) comes after */
      if (!sent && (h->rank == 0 || rq.done > i) && hq_post_send(h, &sq, sbuf, bytes, S[0].mh_send)) sent = progress = 1;
      while (rq.posted < iters && hq_post_recv(h, &rq, rbuf, bytes, bytes, S[0].mh_recv)) progress = 1;
      progress |= hq_poll(h, &sq);
      if (sent && rq.done > i) break;
      if (!progress) h_idle(h);
    }
    if (t) t[i] = h_now() - t0;
  }
  while (sq.done < sq.posted)
    if (!hq_poll(h, &sq)) h_idle(h);
}

static void run_op(hctx_t* h, schan_t* S, char* sbuf, char* rbuf, size_t bytes, int iters, double* t) {
  if (h->o->pingpong) {
    run_pingpong(h, S, sbuf, rbuf, bytes, iters, t);
  } else {
    if (h->o->oneway)
      run_sendrecv(h, S, sbuf, rbuf, iters);
    else
      for (int i = 0; i < iters; i++) run_sendrecv(h, S, sbuf, rbuf, 1);
  }
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static int body(hctx_t* h) {
  hopts_t* o = h->o;
  if (o->group > 1 && o->pingpong) h_die(h, "--group does not apply to -P");
  if (o->inplace) {
    if (h->rank == 0) printf("# sendrecv_perf: in-place is not meaningful for an exchange; out-of-place only\n");
    o->inplace = 0;
  }
  h_net_open(h);
  h_ring_connect(h, 0);
  size_t maxb = o->max_bytes;
  char* sbuf = h_alloc(maxb);
  char* rbuf = h_alloc(maxb);
  schan_t S[H_MAX_CHANNELS];
  memset(S, 0, sizeof S);
  for (int c = 0; c < h->nch; c++) {
    S[c].mh_send = h_reg(h, h->ch[c]->send_comm, sbuf, maxb);
    S[c].mh_recv = h_reg(h, h->ch[c]->recv_comm, rbuf, maxb);
  }
  hcoll_t coll = {"float", "sum", -1, 1.0, sizeof(float)};
  h_print_header(h, &coll);
  int maxrows = 0;
  for (size_t s = o->min_bytes; s <= o->max_bytes; s = h_next_size(o, s)) maxrows++;
  hrow_t* rows = calloc((size_t)maxrows + 1, sizeof *rows);
  int nrows = 0;
  int prev = (h->rank + h->nranks - 1) % h->nranks;
  /* as nccl-tests: warm up once at the largest size before the sweep */
  plan(h, S, (o->max_bytes / sizeof(float)) * sizeof(float));
  run_op(h, S, sbuf, rbuf, (o->max_bytes / sizeof(float)) * sizeof(float), o->warmup, NULL);
  for (size_t s = o->min_bytes; s <= o->max_bytes; s = h_next_size(o, s)) {
    hrow_t* row = &rows[nrows++];
    row->count = s / sizeof(float);
    row->bytes = row->count * sizeof(float);
    plan(h, S, row->bytes);
    run_op(h, S, sbuf, rbuf, row->bytes, o->warmup, NULL);
    h_barrier(h);
    int last = h_next_size(o, s) > o->max_bytes;
    if (o->stats && last) h_stats_begin(h);
    if (o->stats) h_work_begin(h);
    double dt;
    if (o->pingpong) {
      /* the median round trip / 2 on rank 0, as ib_write_lat's t_typical */
      double* t = malloc((size_t)o->iters * sizeof *t);
      run_op(h, S, sbuf, rbuf, row->bytes, o->iters, t);
      qsort(t, (size_t)o->iters, sizeof *t, cmp_double);
      dt = h_allreduce_double(h, t[o->iters / 2] / 2, 0);
      free(t);
    } else {
      double t0 = h_now();
      run_op(h, S, sbuf, rbuf, row->bytes, o->iters, NULL);
      dt = (h_now() - t0) / o->iters;
      dt = h_allreduce_double(h, dt, o->average);
    }
    if (o->stats) h_work_report(h, row->bytes, 0);
    if (o->stats && last) h_stats_report(h, "the timed iterations of the largest size");
    long wrong = 0;
    float* sf = (float*)sbuf;
    float* rf = (float*)rbuf;
    for (int k = 0; k < o->check; k++) {
      for (size_t i = 0; i < row->count; i++) sf[i] = h_pattern(h->rank, i);
      memset(rbuf, 0xff, row->bytes);
      h_barrier(h);
      run_op(h, S, sbuf, rbuf, row->bytes, 1, NULL);
      if (o->oneway && h->rank == 0) continue; /* it received nothing */
      for (size_t i = 0; i < row->count; i++)
        if (rf[i] != h_pattern(prev, i)) {
          if (wrong < 5)
            fprintf(stderr, "[rank %d] sendrecv_perf: element %zu of %zu is %g, expected %g\n", h->rank, i, row->count,
                    (double)rf[i], (double)h_pattern(prev, i));
          wrong++;
        }
    }
    wrong = (long)h_allreduce_double(h, (double)wrong, 4);
    row->time_us[0] = dt * 1e6;
    row->algbw[0] = dt > 0 ? row->bytes / dt / 1e9 : 0;
    row->busbw[0] = row->algbw[0] * coll.bus_factor;
    row->wrong[0] = wrong;
    h_print_row(h, &coll, row);
  }
  int bad = h_print_footer(h, rows, nrows);
  h_write_outputs(h, &coll, rows, nrows);
  for (int c = 0; c < h->nch; c++) {
    h_dereg(h, h->ch[c]->send_comm, S[c].mh_send);
    h_dereg(h, h->ch[c]->recv_comm, S[c].mh_recv);
  }
  h_ring_close(h);
  h_net_close(h);
  free(rows);
  return bad;
}

int main(int argc, char** argv) {
  return h_main(argc, argv, "sendrecv_perf", body,
                "  -P, --pingpong           2 ranks: rank 0 sends, rank 1 answers; time = median round trip / 2\n"
                "  -O, --oneway             2 ranks: only rank 0 sends (to rank 1)\n"
                "      --group G            receive G messages per grouped irecv (1..8, default 1)\n");
}
