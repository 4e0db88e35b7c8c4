/* sendrecv_perf: every rank sends `size` bytes to rank+1 and receives `size` bytes from rank-1
 * at the same time (nccl-tests' sendrecv_perf; with 2 ranks, a pair exchanging), through a net
 * plugin. Registered user buffers are sent from and received into directly, cut into messages of
 * at most --chunk bytes, the buffer split over the channels, up to --steps requests in flight per
 * comm. busbw = algbw.
 *
 * -P (ping-pong, 2 ranks): rank 0 sends, rank 1 answers once it has everything; the time column
 * is half the round trip (the number ib_write_lat reports as its latency).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

typedef struct {
  size_t off, bytes; /* this channel's part of the buffer */
  long nmsg, spost, rpost;
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

static void run_sendrecv(hctx_t* h, schan_t* S, char* sbuf, char* rbuf) {
  int steps = h->o->steps;
  int prev = (h->rank + h->nranks - 1) % h->nranks;
  size_t chunk = h->o->chunk_bytes;
  int gate = h->o->pingpong && h->rank == 1; /* answer only after receiving everything */
  for (int c = 0; c < h->nch; c++) {
    S[c].spost = S[c].rpost = 0;
    hq_init(&S[c].sq, h->ch[c]->send_comm, 1, h->rank, steps);
    hq_init(&S[c].rq, h->ch[c]->recv_comm, 0, prev, steps);
  }
  for (;;) {
    int progress = 0, left = 0, recvs_left = 0;
    for (int c = 0; c < h->nch; c++) recvs_left += S[c].rq.done < S[c].nmsg;
    for (int c = 0; c < h->nch; c++) {
      schan_t* s = &S[c];
      while (s->rpost < s->nmsg) {
        size_t o = (size_t)s->rpost * chunk;
        size_t len = s->bytes - o < chunk ? s->bytes - o : chunk;
        if (!hq_post_recv(h, &s->rq, rbuf + s->off + o, len, len, s->mh_recv)) break;
        s->rpost++;
        progress = 1;
      }
      while (s->spost < s->nmsg && !(gate && recvs_left)) {
        size_t o = (size_t)s->spost * chunk;
        size_t len = s->bytes - o < chunk ? s->bytes - o : chunk;
        if (!hq_post_send(h, &s->sq, sbuf + s->off + o, len, s->mh_send)) break;
        s->spost++;
        progress = 1;
      }
      progress |= hq_poll(h, &s->sq);
      progress |= hq_poll(h, &s->rq);
      left += s->sq.done < s->nmsg || s->rq.done < s->nmsg;
    }
    if (!left) break;
    if (!progress) h_idle(h);
  }
}

static int body(hctx_t* h) {
  hopts_t* o = h->o;
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
  for (size_t s = o->min_bytes; s <= o->max_bytes; s = h_next_size(o, s)) {
    hrow_t* row = &rows[nrows++];
    row->count = s / sizeof(float);
    row->bytes = row->count * sizeof(float);
    plan(h, S, row->bytes);
    for (int i = 0; i < o->warmup; i++) run_sendrecv(h, S, sbuf, rbuf);
    h_barrier(h);
    double t0 = h_now();
    for (int i = 0; i < o->iters; i++) run_sendrecv(h, S, sbuf, rbuf);
    double dt = (h_now() - t0) / o->iters;
    if (o->pingpong) dt /= 2;
    dt = h_allreduce_double(h, dt, o->average);
    long wrong = 0;
    float* sf = (float*)sbuf;
    float* rf = (float*)rbuf;
    for (int k = 0; k < o->check; k++) {
      for (size_t i = 0; i < row->count; i++) sf[i] = h_pattern(h->rank, i);
      memset(rbuf, 0xff, row->bytes);
      h_barrier(h);
      run_sendrecv(h, S, sbuf, rbuf);
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
                "  -P, --pingpong           2 ranks: rank 0 sends, rank 1 answers; time = round trip / 2\n");
}
