/* scale_bench: open --conns (default 1024) connections between two processes through the plugin
 * and report the setup time and the memory each connection costs.
 *
 * Each rank listens --conns/2 times, the handles are exchanged, and each rank connects to the
 * other's handles while accepting on its own listens (all driven together, non-blocking, as
 * NCCL's proxy would); so each process ends up with conns/2 send comms and conns/2 recv comms,
 * and the two processes hold `conns` connections (send comm + recv comm each).
 *
 * Memory: glibc's mallinfo2() (in-use heap bytes, mmapped chunks included), VmRSS and open file
 * descriptors, measured after one warm-up connection per direction (so one-time device setup is
 * not counted) and after all connections; heap per connection = the sum of both processes'
 * heap growth / conns. Note that softroce (the NIC) lives in the same process and its per-QP
 * state is in that heap too (as a real provider's queue buffers would be, in part).
 * With -c 1 (default) one 8-byte message goes through every connection.
 * -O: rank 0 holds all --conns recv comms and rank 1 all send comms, so that the heap of a recv
 * comm and of a send comm are measured apart.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

typedef struct {
  double heap, rss, fds;
} mem_t;

static double rss_bytes(void) {
  FILE* f = fopen("/proc/self/status", "r");
  char line[256];
  double kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "VmRSS:", 6) == 0) kb = atof(line + 6);
  if (f) fclose(f);
  return kb * 1024;
}

static double open_fds(void) {
  DIR* d = opendir("/proc/self/fd");
  int n = 0;
  struct dirent* e;
  while (d && (e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  if (d) closedir(d);
  return n;
}

static mem_t measure(void) {
  struct mallinfo2 mi = mallinfo2();
  mem_t m = {(double)mi.uordblks + (double)mi.hblkhd, rss_bytes(), open_fds()};
  return m;
}

/* One 8-byte message through each connection, both directions at once. */
static void exchange(hctx_t* h, int n, void** scs, void** rcs) {
  char* sbuf = h_alloc((size_t)n * 8);
  char* rbuf = h_alloc((size_t)n * 8);
  void** smh = calloc((size_t)n, sizeof *smh);
  void** rmh = calloc((size_t)n, sizeof *rmh);
  hq_t* sq = calloc((size_t)n, sizeof *sq);
  hq_t* rq = calloc((size_t)n, sizeof *rq);
  int peer = 1 - h->rank;
  for (int i = 0; i < n; i++) {
    if (scs) smh[i] = h_reg(h, scs[i], sbuf, (size_t)n * 8);
    if (rcs) rmh[i] = h_reg(h, rcs[i], rbuf, (size_t)n * 8);
    hq_init(&sq[i], scs ? scs[i] : NULL, 1, h->rank, 1);
    hq_init(&rq[i], rcs ? rcs[i] : NULL, 0, peer, 1);
    uint64_t v = ((uint64_t)h->rank << 32) | (uint64_t)i;
    memcpy(sbuf + (size_t)i * 8, &v, 8);
  }
  double deadline = h_now() + 60;
  int left;
  do {
    left = 0;
    int progress = 0;
    for (int i = 0; i < n; i++) {
      if (rcs && rq[i].posted == 0) progress |= hq_post_recv(h, &rq[i], rbuf + (size_t)i * 8, 8, 8, rmh[i]);
      if (scs && sq[i].posted == 0) progress |= hq_post_send(h, &sq[i], sbuf + (size_t)i * 8, 8, smh[i]);
      progress |= hq_poll(h, &sq[i]);
      progress |= hq_poll(h, &rq[i]);
      left += (scs && sq[i].done == 0) || (rcs && rq[i].done == 0);
    }
    if (left && h_now() > deadline) h_die(h, "exchange: %d connections did not complete in 60 s", left);
    if (!progress) h_idle(h);
  } while (left);
  int bad = 0;
  for (int i = 0; rcs && i < n; i++) {
    uint64_t v, want = ((uint64_t)peer << 32) | (uint64_t)i;
    memcpy(&v, rbuf + (size_t)i * 8, 8);
    bad += v != want;
  }
  if (bad) h_die(h, "exchange: %d of %d connections delivered wrong data", bad, n);
  for (int i = 0; i < n; i++) {
    if (scs) h_dereg(h, scs[i], smh[i]);
    if (rcs) h_dereg(h, rcs[i], rmh[i]);
  }
  free(sbuf), free(rbuf), free(smh), free(rmh), free(sq), free(rq);
}

/* --cycles N: N times, one connection each way made, used for one 8-byte message and closed
 * (the listen comm by h_connect_accept). The heap of each rank is measured after the first 1 % of the cycles
 * (the caches and free lists reached their size) and after the last: a leak of anything per
 * connection grows with N. Prints the growth per rank. */
static void cycles(hctx_t* h) {
  int total = h->o->cycles, warm = total / 10 > 0 ? total / 10 : 1;
  mem_t a = {0, 0, 0};
  for (int c = 0; c < total; c++) {
    if (c == warm) a = measure();
    char hmine[H_HANDLE_SIZE], hall[2 * H_HANDLE_SIZE];
    void *l = NULL, *s = NULL, *r = NULL;
    if (h->net.listen(h->net.ctx, h->dev, hmine, &l) || !l) h_die(h, "cycle %d: listen failed", c);
    h_allgather(h, hmine, sizeof hmine, hall);
    h_connect_accept(h, hall + (1 - h->rank) * H_HANDLE_SIZE, &s, l, &r, 60);
    exchange(h, 1, &s, &r);
    // (h_connect_accept closed the listen comm once it accepted.)
    if (h->net.close_send(s) || h->net.close_recv(r)) h_die(h, "cycle %d: close failed", c);
  }
  mem_t b = measure();
  double v[3] = {b.heap - a.heap, b.fds - a.fds, b.rss - a.rss};
  double allv[6];
  h_allgather(h, v, sizeof v, allv);
  if (h->rank == 0)
    printf("scale_bench cycles=%d measured_from=%d heap_growth_KiB=%.2f,%.2f fds_growth=%.0f,%.0f rss_growth_KiB=%.0f,%.0f\n",
           total, warm, allv[0] / 1024, allv[3] / 1024, allv[1], allv[4], allv[2] / 1024, allv[5] / 1024);
}

static int body(hctx_t* h) {
  if (h->nranks != 2) h_die(h, "scale_bench runs between exactly 2 ranks");
  int per = h->o->conns / 2;
  if (per < 1) h_die(h, "--conns must be >= 2");
  h_net_open(h);

  /* Descriptors before any connection: what the plugin opens for connections is counted from
   * here, the warm-up's included (a side channel shared per peer process opens with it). */
  double fds_pre = open_fds();
  /* warm-up: one connection each way (device context, PD, threads, MR cache are one-time costs) */
  char hw[H_HANDLE_SIZE], hall[2 * H_HANDLE_SIZE];
  void *wl = NULL, *ws = NULL, *wr = NULL;
  if (h->net.listen(h->net.ctx, h->dev, hw, &wl) || !wl) h_die(h, "listen failed");
  h_allgather(h, hw, sizeof hw, hall);
  h_connect_accept(h, hall + (1 - h->rank) * H_HANDLE_SIZE, &ws, wl, &wr, 60);
  /* symmetric: each rank listens `per` times and connects `per` times; -O: rank 0 holds every
   * recv comm, rank 1 every send comm (the two sides' costs apart) */
  int oneway = h->o->oneway;
  int conns = oneway ? h->o->conns : 2 * per;
  int n = oneway ? conns : per;
  int nlisten = oneway ? (h->rank == 0 ? n : 0) : n, nconnect = oneway ? (h->rank == 1 ? n : 0) : n;
  /* the harness's own arrays first, so that they are not counted */
  char* mine = calloc((size_t)n, H_HANDLE_SIZE);
  char* all = calloc((size_t)n * 2, H_HANDLE_SIZE);
  void** lcs = calloc((size_t)n, sizeof *lcs);
  void** scs = calloc((size_t)n, sizeof *scs);
  void** rcs = calloc((size_t)n, sizeof *rcs);
  memset(mine, 0, (size_t)n * H_HANDLE_SIZE);
  memset(all, 0, (size_t)n * 2 * H_HANDLE_SIZE);
  h_barrier(h);
  mem_t m0 = measure();
  h_barrier(h);
  double t0 = h_now();
  for (int i = 0; i < nlisten; i++) {
    int rc = h->net.listen(h->net.ctx, h->dev, mine + (size_t)i * H_HANDLE_SIZE, &lcs[i]);
    if (rc || !lcs[i]) h_die(h, "listen #%d = %d", i, rc);
  }
  double t_listen = h_now() - t0;
  /* what the listen comms hold before any connect: they share the process's one listener */
  double listen_fds = open_fds() - m0.fds;
  h_allgather(h, mine, (size_t)n * H_HANDLE_SIZE, all);
  h_connect_pairs(h, n, nconnect ? all + (size_t)(1 - h->rank) * n * H_HANDLE_SIZE : NULL, scs, nlisten ? lcs : NULL,
                  rcs, 300);
  double t_local = h_now() - t0;
  h_barrier(h);
  double t_all = h_now() - t0;
  mem_t m1 = measure();
  if (h->o->check) exchange(h, n, nconnect ? scs : NULL, nlisten ? rcs : NULL);
  mem_t m2 = measure();
  for (int i = 0; i < n; i++) {
    if (nconnect && h->net.close_send(scs[i])) h_die(h, "closeSend #%d failed", i);
    if (nlisten && h->net.close_recv(rcs[i])) h_die(h, "closeRecv #%d failed", i);
  }
  mem_t m3 = measure();
  h->net.close_send(ws);
  h->net.close_recv(wr);

  double v[10] = {t_listen, t_local, t_all, m1.heap - m0.heap, m1.rss - m0.rss, m1.fds - m0.fds,
                  m2.heap - m1.heap, m3.heap - m0.heap, m0.heap, m0.rss};
  double allv[20], fds_all = m1.fds - fds_pre, fdsv[2], lfdv[2];
  h_allgather(h, v, sizeof v, allv);
  h_allgather(h, &fds_all, sizeof fds_all, fdsv);
  h_allgather(h, &listen_fds, sizeof listen_fds, lfdv);
  if (h->rank == 0) {
    double heap = allv[3] + allv[13], rss = allv[4] + allv[14];
    /* Both processes' descriptors for all their connections, the 2 warm-up ones included; each
     * process has one peer, so per peer is the mean of the two. */
    double fds = fdsv[0] + fdsv[1], fds_growth = allv[5] + allv[15];
    double setup = allv[2] > allv[12] ? allv[2] : allv[12];
    if (oneway)
      printf("# scale_bench: %d connections between 2 processes (rank 0: %d recv comms, rank 1: %d send comms), plugin %s v%d%s\n",
             conns, n, n, h->net.name, h->net.version, h->o->softroce ? " over softroce" : "");
    else
      printf("# scale_bench: %d connections between 2 processes (%d send + %d recv comms each), plugin %s v%d%s\n",
             conns, n, n, h->net.name, h->net.version, h->o->softroce ? " over softroce" : "");
    printf("#   setup: %.1f ms in all, %.1f us per connection (listens on one rank %.1f ms)\n", setup * 1e3,
           setup * 1e6 / conns, allv[0] * 1e3);
    if (oneway)
      printf("#   heap per connection : %.1f KiB (mallinfo2 in-use, both ends: recv comm %.1f + send comm %.1f KiB)\n",
             heap / conns / 1024, allv[3] / n / 1024, allv[13] / n / 1024);
    else
      printf("#   heap per connection : %.1f KiB (mallinfo2 in-use, both ends; rank 0 %.1f + rank 1 %.1f KiB per comm)\n",
             heap / conns / 1024, allv[3] / n / 2 / 1024, allv[13] / n / 2 / 1024);
    printf("#   RSS per connection  : %.1f KiB\n", rss / conns / 1024);
    printf("#   file descriptors    : %.3f per connection, %.1f per peer process (all both processes opened\n"
           "#                         for their %d connections, warm-up included; %+.0f after the warm-up)\n",
           fds / (conns + 2), fds / 2, conns + 2, fds_growth);
    printf("#   listen comms        : %d hold %.0f descriptor(s) before their connects (rank 0 %.0f, rank 1 %.0f)\n", nlisten,
           lfdv[0] > lfdv[1] ? lfdv[0] : lfdv[1], lfdv[0], lfdv[1]);
    if (h->o->check)
      printf("#   one 8-byte message through every connection: ok (heap +%.1f KiB per connection while used)\n",
             (allv[6] + allv[16]) / conns / 1024);
    printf("#   after closing them: heap %+.1f KiB per connection vs. before (leak check)\n",
           (allv[7] + allv[17]) / conns / 1024);
    printf("scale_bench conns=%d setup_ms=%.1f setup_us_per_conn=%.1f heap_per_conn_KiB=%.1f rss_per_conn_KiB=%.1f "
           "fds_per_conn=%.3f fds_per_peer=%.1f listen_fds=%.0f leak_per_conn_KiB=%.2f",
           conns, setup * 1e3, setup * 1e6 / conns, heap / conns / 1024, rss / conns / 1024, fds / (conns + 2), fds / 2,
           lfdv[0] > lfdv[1] ? lfdv[0] : lfdv[1], (allv[7] + allv[17]) / conns / 1024);
    if (oneway) printf(" recv_comm_KiB=%.1f send_comm_KiB=%.1f", allv[3] / n / 1024, allv[13] / n / 1024);
    printf("\n");
  }
  if (h->o->cycles > 0) cycles(h);
  h_net_close(h);
  free(mine), free(all), free(lcs), free(scs), free(rcs);
  return 0;
}

int main(int argc, char** argv) {
  return h_main(argc, argv, "scale_bench", body,
                "      --conns N            scale_bench: connections to open (default 1024)\n"
                "      --cycles N           then N connect/close cycles of one connection each way, heap\n"
                "                           and fds measured after the first 10 % and the last\n"
                "  -O                       rank 0 takes every recv comm, rank 1 every send comm\n");
}
