/* soak: ranks (processes) drive the plugin through cycles of connect -> traffic -> close, under
 * the faults softroce injects (loss, reordering, duplication: SOFTROCE_* set by ci/soak.sh) and the
 * faults this program injects: a rank SIGKILLed or closing every comm with requests in flight
 * while the others are busy with it (each survivor must see an error within --error-bound, then
 * the rank is restarted), a rank's port going down for 0.3-0.8 s during the traffic and back
 * (softroce's fault control: every comm recovers over new QPs, no error is allowed, every byte
 * still checked), closes with requests in flight on both sides, and registrations from a second
 * thread concurrent with the traffic.
 *
 * Every cycle: each rank listens once per peer, the coordinator (the parent) passes the handles,
 * the ranks connect a full mesh (a send comm to and a recv comm from every peer), then run
 *   - sendrecv: one stream per ordered pair, random sizes (0 B .. 256 KiB), the receiver grouping
 *     g (1..8, per stream) consecutive messages in one irecv with tags 0..g-1, buffers larger than
 *     the messages; every received byte is compared with pattern(seed, cycle, src, dst, message);
 *   - all_reduce: a ring reduce-scatter + allgather of random counts of floats over the next/prev
 *     comms, checked exactly (small integers);
 * and close (a clean close, or with extra requests in flight on both sides). All sizes and
 * choices derive from --seed (printed), the cycle number and the ranks.
 *
 * Checks (any failure: a message on stderr and exit status 1): every byte; a watchdog in every
 * rank fails the run when a request makes no progress for --hang-bound seconds, and the
 * coordinator when a rank reports nothing for that long; only expected errors (those of the
 * comms with a killed or aborting peer, and of requests posted while the peers close with
 * requests in flight) and expected plugin WARNs (scan_warns says which) are allowed; heap
 * (mallinfo2), RSS and open descriptors sampled after every cycle's close stay flat in each rank
 * process: after its cycles the heap grew by less than one comm's worth (measured in the same
 * process), the descriptors did not grow, RSS grew by less than --rss-slack MiB.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ferroce/nccl_net.h>

#include "common.h"

#define S_MAX_RANKS 8
#define S_SLOT (256 << 10) /* receive capacity of one message; the largest message */
#define S_DEPTH 4          /* requests in flight per stream (a grouped irecv is one) */
#define S_WINDOW (S_DEPTH * H_MAX_GROUP)

/* ---- options ---- */
static struct {
  double minutes;
  uint64_t seed;
  int nranks;
  double hang_bound, error_bound, rss_slack_mib;
  const char* addr_base;
  const char* logdir;
  int fault_every; /* one cycle in this many kills or aborts a rank, or flaps its port */
  int corrupt;     /* --corrupt-check N: the checker flips a byte of message N (proves the check) */
  int scan_only;   /* --scan-logs DIR: only the WARN scan of a finished run's logs */
} g_opt = {1.0, 0, 4, 20.0, 10.0, 8.0, "127.0.72", NULL, 4, -1, 0};

/* ---- deterministic choices: splitmix64 of (seed, labels) ---- */
static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
static uint64_t draw(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return mix(mix(mix(mix(g_opt.seed) ^ a) ^ b) ^ c ^ (d << 32));
}
/* the byte i of message k from src to dst in cycle c */
static inline uint8_t pattern(uint64_t key, size_t i) { return (uint8_t)(mix(key + (i >> 3)) >> ((i & 7) * 8)); }
static uint64_t msg_key(int c, int src, int dst, long k) { return draw(1, (uint64_t)c, (uint64_t)(src * 16 + dst), (uint64_t)k); }
static size_t msg_size(int c, int src, int dst, long k) {
  uint64_t r = draw(2, (uint64_t)c, (uint64_t)(src * 16 + dst), (uint64_t)k);
  switch (r % 10) {
    case 0: return (r >> 8) % 65;                     /* 0..64 B, zero-byte messages included */
    case 1: case 2: case 3: return (r >> 8) % S_SLOT + 1; /* anything up to the slot */
    default: return (r >> 8) % (16 << 10) + 1;        /* up to 16 KiB */
  }
}
static int stream_group(int c, int src, int dst) { return 1 + (int)(draw(3, (uint64_t)c, (uint64_t)(src * 16 + dst), 0) % H_MAX_GROUP); }

/* ---- coordinator <-> rank messages ---- */
enum { M_PLAN = 1, M_HANDLES, M_ALL_HANDLES, M_CONNECTED, M_GO, M_PEER_ERROR, M_ABORT, M_STOP, M_CLOSING, M_CLOSE, M_DONE };
enum { F_NONE = 0, F_KILL, F_ABORT, F_FLAP };
static const char* const fault_names[] = {"none", "kill", "abort", "flap"}; /* in the rank logs, read by scan_warns */
/* A kill or an abort: the victim's peers see errors. A flap is not one: every request must
 * complete. In every fault cycle the streams run until the coordinator says stop, so that every
 * comm has requests in flight while the fault lasts (as a training job's comms do; a comm NCCL
 * does not call takes part in a recovery only at its next call). */
static int peer_fault(int f) { return f == F_KILL || f == F_ABORT; }

typedef struct {
  int32_t cycle, victim, fault, close_inflight, allreduce;
} plan_t;

typedef struct {
  double msgs, bytes, sends, regs, expected_errors, heap, heap_conn_per_comm, rss, hwm, fds;
  double err_remote, err_system, err_other, err_at_close;
  int32_t cycle, rank;
} done_t;

typedef struct {
  int32_t peer;
  double t_send_err, t_recv_err;
} peer_error_t;

static int write_full(int fd, const void* p, size_t n) {
  const char* c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    c += w, n -= (size_t)w;
  }
  return 0;
}
static int read_full(int fd, void* p, size_t n) {
  char* c = p;
  while (n) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    c += r, n -= (size_t)r;
  }
  return 0;
}
static int send_msg(int fd, uint32_t type, const void* p, uint32_t len) {
  uint32_t hdr[2] = {type, len};
  return write_full(fd, hdr, sizeof hdr) || (len && write_full(fd, p, len)) ? -1 : 0;
}
/* A whole message into p (at most cap bytes); -1 when the peer is gone or the message is bad. */
static int recv_msg(int fd, uint32_t* type, void* p, uint32_t cap) {
  uint32_t hdr[2];
  if (read_full(fd, hdr, sizeof hdr) || hdr[1] > cap) return -1;
  if (hdr[1] && read_full(fd, p, hdr[1])) return -1;
  *type = hdr[0];
  return (int)hdr[1];
}
static int readable(int fd, int timeout_ms) {
  struct pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, timeout_ms) > 0;
}

/* ---- memory and descriptors of this process ---- */
static double status_kib(const char* key) {
  FILE* f = fopen("/proc/self/status", "r");
  char line[256];
  double kb = 0;
  size_t n = strlen(key);
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, key, n) == 0) kb = atof(line + n);
  if (f) fclose(f);
  return kb;
}
static double open_fds(void) {
  DIR* d = opendir("/proc/self/fd");
  int n = 0;
  struct dirent* e;
  while (d && (e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  if (d) closedir(d);
  return n - 1; /* the directory stream itself */
}
static double heap_in_use(void) {
  struct mallinfo2 mi = mallinfo2();
  return (double)mi.uordblks + (double)mi.hblkhd;
}

/* ================================ a rank ================================ */

typedef struct {
  void* comm;
  int peer, is_send, group, failed, stopped;
  long next_msg, posted, done; /* messages posted / requests posted / requests done */
  long limit;                  /* messages in this cycle's stream (-1: until told to stop) */
  char* buf;
  void* mh;
  void* req[S_WINDOW];
  int n[S_WINDOW];
  long first[S_WINDOW];
  double since[S_WINDOW]; /* when the request became the oldest (or was posted) */
  double t_err;
} stream_t;

typedef struct {
  hctx_t h;
  int fd, rank, n;
  plan_t plan;
  void* sc[S_MAX_RANKS];
  void* rc[S_MAX_RANKS];
  stream_t tx[S_MAX_RANKS], rx[S_MAX_RANKS];
  done_t st;
  /* the registration thread */
  pthread_t reg_thread;
  pthread_mutex_t comm_lock; /* held by the thread around its calls, by close for its comm */
  volatile int reg_run;
  char* reg_pool;
  double regs;
  int aborted;
  int closing; /* in rank_close: the peers close their comms with requests in flight too */
} rank_t;

static rank_t* g_r;

_Noreturn static void fail(rank_t* r, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(rank_t* r, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "[rank %d] soak: FAIL in cycle %d: ", r->rank, r->plan.cycle);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fflush(stderr);
  _exit(1);
}

static int is_victim_comm(rank_t* r, stream_t* s) { return peer_fault(r->plan.fault) && s->peer == r->plan.victim; }

/* The plugin returned an error for stream s: expected only on a comm with this cycle's victim, or
 * for a request posted at the close (its peer may have closed the comm, in flight, already). */
static void stream_error(rank_t* r, stream_t* s, int rc, const char* call) {
  int victim_comm = is_victim_comm(r, s) && r->rank != r->plan.victim;
  if (!victim_comm && !r->closing)
    fail(r, "%s on the %s comm with rank %d returned %d: an unexpected error", call, s->is_send ? "send" : "recv", s->peer, rc);
  s->failed = 1;
  s->t_err = h_now();
  r->st.expected_errors++;
  if (!victim_comm) r->st.err_at_close++;
  if (rc == FERROCE_NCCL_REMOTE_ERROR) r->st.err_remote++;
  else if (rc == FERROCE_NCCL_SYSTEM_ERROR) r->st.err_system++;
  else r->st.err_other++;
}

static void fill_message(char* p, size_t size, uint64_t key) {
  for (size_t i = 0; i < size; i++) p[i] = (char)pattern(key, i);
}

static void check_message(rank_t* r, stream_t* s, const char* p, size_t size, long k) {
  uint64_t key = msg_key(r->plan.cycle, s->peer, r->rank, k);
  for (size_t i = 0; i < size; i++) {
    uint8_t want = pattern(key, i);
    if (g_opt.corrupt >= 0 && k == g_opt.corrupt && i == size / 2) want ^= 1; /* --corrupt-check */
    if ((uint8_t)p[i] != want)
      fail(r, "message %ld from rank %d (%zu bytes): byte %zu is 0x%02x, expected 0x%02x", k, s->peer, size, i,
           (uint8_t)p[i], want);
  }
  r->st.msgs++;
  r->st.bytes += (double)size;
}

/* Posts the next request of stream s when it has room; returns 1 when it posted. */
static int stream_post(rank_t* r, stream_t* s) {
  /* a sender keeps S_DEPTH groups in flight: the plugin starts a grouped receive's sends only
   * once all of them are posted (as NCCL issues them together) */
  int depth = s->is_send ? S_DEPTH * s->group : S_DEPTH;
  if (s->failed || s->stopped || s->posted - s->done >= depth || (s->limit >= 0 && s->next_msg >= s->limit)) return 0;
  int c = r->plan.cycle, slot = (int)(s->posted % S_WINDOW);
  void* req = NULL;
  int rc, g = 1;
  long k = s->next_msg;
  if (s->is_send) {
    size_t size = msg_size(c, r->rank, s->peer, k);
    char* p = s->buf + (size_t)(k % S_WINDOW) * S_SLOT;
    fill_message(p, size, msg_key(c, r->rank, s->peer, k));
    rc = r->h.net.isend(s->comm, p, size, (int)(k % s->group), s->mh, &req);
    if (rc == 0 && req) r->st.sends++;
  } else {
    g = s->group;
    if (s->limit >= 0 && k + g > s->limit) g = (int)(s->limit - k);
    void* data[H_MAX_GROUP];
    size_t caps[H_MAX_GROUP];
    int tags[H_MAX_GROUP];
    void* mhs[H_MAX_GROUP];
    for (int i = 0; i < g; i++) {
      data[i] = s->buf + (size_t)((k + i) % S_WINDOW) * S_SLOT;
      caps[i] = S_SLOT, tags[i] = i, mhs[i] = s->mh;
      memset(data[i], 0xee, msg_size(c, s->peer, r->rank, k + i) + 1 > S_SLOT ? S_SLOT : msg_size(c, s->peer, r->rank, k + i) + 1);
    }
    rc = r->h.net.irecv(s->comm, g, data, caps, tags, mhs, &req);
  }
  if (rc) {
    stream_error(r, s, rc, s->is_send ? "isend" : "irecv");
    return 0;
  }
  if (!req) return 0; /* the plugin has no room now: retry, as NCCL does */
  s->req[slot] = req, s->n[slot] = g, s->first[slot] = k;
  s->since[slot] = h_now();
  s->next_msg += g;
  s->posted++;
  return 1;
}

/* Tests the oldest request of s (as NCCL's proxy does); returns 1 when it completed. */
static int stream_poll(rank_t* r, stream_t* s) {
  if (s->failed || s->done == s->posted) return 0;
  int slot = (int)(s->done % S_WINDOW), done = 0, sizes[64] = {0};
  int rc = r->h.net.test(s->req[slot], &done, sizes);
  if (rc) {
    stream_error(r, s, rc, "test");
    return 0;
  }
  double now = h_now();
  if (!done) {
    if (now - s->since[slot] > g_opt.hang_bound)
      fail(r, "watchdog: the %s request for messages %ld..%ld %s rank %d made no progress for %.1f s", s->is_send ? "send" : "recv",
           s->first[slot], s->first[slot] + s->n[slot] - 1, s->is_send ? "to" : "from", s->peer, now - s->since[slot]);
    return 0;
  }
  if (!s->is_send)
    for (int i = 0; i < s->n[slot]; i++) {
      long k = s->first[slot] + i;
      size_t want = msg_size(r->plan.cycle, s->peer, r->rank, k);
      if ((size_t)sizes[i] != want) fail(r, "message %ld from rank %d: test reports %d bytes, %zu were sent", k, s->peer, sizes[i], want);
      check_message(r, s, s->buf + (size_t)(k % S_WINDOW) * S_SLOT, want, k);
    }
  s->done++;
  s->since[(int)(s->done % S_WINDOW)] = now; /* the next oldest waits from now */
  return 1;
}

/* ---- the registration thread: regMr/deregMr of random ranges on live comms, concurrent with traffic ---- */
#define S_REG_POOL (4 << 20)
static void* reg_main(void* arg) {
  rank_t* r = arg;
  uint64_t x = draw(9, (uint64_t)r->plan.cycle, (uint64_t)r->rank, 0);
  while (r->reg_run) {
    x = mix(x);
    int peer = (int)(x % (uint64_t)r->n);
    int is_send = (int)((x >> 8) & 1);
    size_t off = (size_t)((x >> 16) % (S_REG_POOL / 2)), len = (size_t)((x >> 40) % (S_REG_POOL / 2)) + 1;
    pthread_mutex_lock(&r->comm_lock);
    void* comm = peer == r->rank ? NULL : is_send ? r->sc[peer] : r->rc[peer];
    stream_t* s = is_send ? &r->tx[peer] : &r->rx[peer];
    if (comm && !s->failed && !r->aborted) {
      void* mh = NULL;
      int rc = r->h.net.reg_mr(comm, r->reg_pool + off, len, FERROCE_PTR_HOST, &mh);
      if (rc) fail(r, "regMr(%zu bytes) from the second thread on the comm with rank %d returned %d", len, peer, rc);
      rc = r->h.net.dereg_mr(comm, mh);
      if (rc) fail(r, "deregMr from the second thread returned %d", rc);
      r->regs++;
    }
    pthread_mutex_unlock(&r->comm_lock);
    usleep(200);
  }
  return NULL;
}

/* ---- one cycle ---- */
static void rank_connect(rank_t* r) {
  char mine[S_MAX_RANKS * H_HANDLE_SIZE] = {0}, all[S_MAX_RANKS * S_MAX_RANKS * H_HANDLE_SIZE];
  void* lc[S_MAX_RANKS] = {0};
  for (int p = 0; p < r->n; p++)
    if (p != r->rank) {
      int rc = r->h.net.listen(r->h.net.ctx, r->h.dev, mine + (size_t)p * H_HANDLE_SIZE, &lc[p]);
      if (rc || !lc[p]) fail(r, "listen for rank %d returned %d", p, rc);
    }
  uint32_t type;
  size_t hs = (size_t)r->n * H_HANDLE_SIZE;
  if (send_msg(r->fd, M_HANDLES, mine, (uint32_t)hs) || recv_msg(r->fd, &type, all, sizeof all) != (int)(hs * (size_t)r->n) ||
      type != M_ALL_HANDLES)
    fail(r, "the handle exchange with the coordinator failed");
  /* pair i: connect to peer's handle made for me, accept on my listen for that peer */
  char handles[S_MAX_RANKS * H_HANDLE_SIZE];
  void *lcs[S_MAX_RANKS], *scs[S_MAX_RANKS] = {0}, *rcs[S_MAX_RANKS] = {0};
  int peers[S_MAX_RANKS], np = 0;
  for (int p = 0; p < r->n; p++)
    if (p != r->rank) {
      memcpy(handles + (size_t)np * H_HANDLE_SIZE, all + ((size_t)p * r->n + r->rank) * H_HANDLE_SIZE, H_HANDLE_SIZE);
      lcs[np] = lc[p], peers[np++] = p;
    }
  h_connect_pairs(&r->h, np, handles, scs, lcs, rcs, g_opt.hang_bound);
  for (int i = 0; i < np; i++) r->sc[peers[i]] = scs[i], r->rc[peers[i]] = rcs[i];
}

static void streams_open(rank_t* r, long limit_scale) {
  int c = r->plan.cycle;
  for (int p = 0; p < r->n; p++) {
    if (p == r->rank) continue;
    for (int d = 0; d < 2; d++) {
      stream_t* s = d ? &r->tx[p] : &r->rx[p];
      memset(s, 0, sizeof *s);
      s->peer = p, s->is_send = d, s->comm = d ? r->sc[p] : r->rc[p];
      int src = d ? r->rank : p, dst = d ? p : r->rank;
      s->group = stream_group(c, src, dst);
      s->limit = limit_scale < 0 ? -1 : 16 + (long)(draw(4, (uint64_t)c, (uint64_t)(src * 16 + dst), 0) % (uint64_t)limit_scale);
      s->buf = h_alloc((size_t)S_WINDOW * S_SLOT);
      s->mh = h_reg(&r->h, s->comm, s->buf, (size_t)S_WINDOW * S_SLOT);
    }
  }
}

/* Runs the streams until they are done, or (kill/abort cycles) until the coordinator says stop. */
static void run_streams(rank_t* r) {
  int fault = r->plan.fault != F_NONE, me_victim = peer_fault(r->plan.fault) && r->rank == r->plan.victim, reported = 0;
  for (;;) {
    int progress = 0, left = 0;
    for (int p = 0; p < r->n && !r->aborted; p++) {
      if (p == r->rank) continue;
      for (int d = 0; d < 2; d++) {
        stream_t* s = d ? &r->tx[p] : &r->rx[p];
        progress |= stream_post(r, s);
        progress |= stream_poll(r, s);
        left += !s->failed && !s->stopped && (s->done < s->posted || s->limit < 0 || s->next_msg < s->limit);
      }
    }
    if (peer_fault(r->plan.fault) && !me_victim && !reported && r->tx[r->plan.victim].failed && r->rx[r->plan.victim].failed) {
      peer_error_t e = {r->plan.victim, r->tx[r->plan.victim].t_err, r->rx[r->plan.victim].t_err};
      if (send_msg(r->fd, M_PEER_ERROR, &e, sizeof e)) fail(r, "lost the coordinator");
      reported = 1;
    }
    if (fault && readable(r->fd, 0)) {
      uint32_t type;
      char buf[64];
      if (recv_msg(r->fd, &type, buf, sizeof buf) < 0) fail(r, "lost the coordinator");
      if (type == M_STOP) return;
      if (type != M_ABORT || !me_victim) fail(r, "unexpected message %u from the coordinator", type);
      /* abort: every comm closed with its requests in flight, as a process giving up would */
      fprintf(stderr, "[rank %d] soak: cycle %d closes with requests in flight (abort)\n", r->rank, r->plan.cycle);
      pthread_mutex_lock(&r->comm_lock);
      r->aborted = 1;
      for (int p = 0; p < r->n; p++)
        if (p != r->rank) {
          h_dereg(&r->h, r->sc[p], r->tx[p].mh), h_dereg(&r->h, r->rc[p], r->rx[p].mh);
          r->tx[p].mh = r->rx[p].mh = NULL;
          if (r->h.net.close_send(r->sc[p]) || r->h.net.close_recv(r->rc[p])) fail(r, "close with requests in flight failed");
          r->sc[p] = r->rc[p] = NULL;
        }
      pthread_mutex_unlock(&r->comm_lock);
    }
    if (!fault && !left) return;
    if (!progress) h_idle(&r->h);
  }
}

/* all_reduce (sum) of `count` floats over the ring: reduce-scatter then allgather, checked exactly. */
static void run_allreduce(rank_t* r, int iter) {
  int n = r->n, me = r->rank, next = (me + 1) % n, prev = (me + n - 1) % n, c = r->plan.cycle;
  size_t count = 1 + draw(5, (uint64_t)c, (uint64_t)iter, 0) % (48 << 10), chunk = (count + (size_t)n - 1) / (size_t)n;
  float* data = h_alloc((size_t)n * chunk * sizeof(float));
  float* tmp = h_alloc(chunk * sizeof(float));
  for (size_t i = 0; i < count; i++) data[i] = h_pattern(me + 7 * c + 13 * iter, i);
  void* dmh = h_reg(&r->h, r->sc[next], data, (size_t)n * chunk * sizeof(float));
  void* tmh = h_reg(&r->h, r->rc[prev], tmp, chunk * sizeof(float));
  for (int step = 0; step < 2 * (n - 1); step++) {
    int rs = step < n - 1; /* reduce-scatter, then allgather */
    int sidx = rs ? (me - step + 2 * n) % n : (me + 1 - (step - (n - 1)) + 2 * n) % n;
    int ridx = rs ? (me - step - 1 + 2 * n) % n : (me - (step - (n - 1)) + 2 * n) % n;
    void *sreq = NULL, *rreq = NULL, *rdata = tmp;
    size_t rcap = chunk * sizeof(float);
    int tag = step;
    double t0 = h_now();
    while (!rreq || !sreq) {
      if (!rreq && r->h.net.irecv(r->rc[prev], 1, &rdata, &rcap, &tag, &tmh, &rreq)) fail(r, "all_reduce irecv failed");
      if (!sreq && r->h.net.isend(r->sc[next], data + (size_t)sidx * chunk, chunk * sizeof(float), tag, dmh, &sreq))
        fail(r, "all_reduce isend failed");
      if (h_now() - t0 > g_opt.hang_bound) fail(r, "watchdog: all_reduce step %d could not post for %.0f s", step, g_opt.hang_bound);
    }
    int sdone = 0, rdone = 0, sizes[64];
    while (!sdone || !rdone) {
      if (!sdone && r->h.net.test(sreq, &sdone, sizes)) fail(r, "all_reduce send test failed");
      if (!rdone && r->h.net.test(rreq, &rdone, sizes)) fail(r, "all_reduce recv test failed");
      if (rdone == 1 && (size_t)sizes[0] != chunk * sizeof(float)) fail(r, "all_reduce step %d received %d bytes", step, sizes[0]);
      if (h_now() - t0 > g_opt.hang_bound)
        fail(r, "watchdog: all_reduce step %d (%s) made no progress for %.0f s", step, sdone ? "recv" : "send", g_opt.hang_bound);
      if (!sdone || !rdone) h_idle(&r->h);
    }
    for (size_t i = 0; i < chunk; i++) data[(size_t)ridx * chunk + i] = rs ? data[(size_t)ridx * chunk + i] + tmp[i] : tmp[i];
  }
  for (size_t i = 0; i < count; i++) {
    float want = 0;
    for (int q = 0; q < n; q++) want += h_pattern(q + 7 * c + 13 * iter, i);
    if (data[i] != want) fail(r, "all_reduce of %zu floats: element %zu is %g, expected %g", count, i, data[i], want);
  }
  r->st.msgs += 2 * (n - 1), r->st.bytes += (double)(2 * (n - 1)) * (double)(chunk * sizeof(float));
  h_dereg(&r->h, r->sc[next], dmh), h_dereg(&r->h, r->rc[prev], tmh);
  free(data), free(tmp);
}

/* Close: optionally with extra requests in flight on both sides first (left unfinished). */
static void rank_close(rank_t* r) {
  /* Said before the close barrier: once every rank passed it, any peer may deregister a buffer
   * this rank's request in flight writes into, before this rank itself gets past the barrier (the
   * registration thread's calls still step this rank's comms meanwhile); scan_warns expects a peer
   * gone only after this line. */
  int in_flight = 0;
  for (int p = 0; p < r->n; p++)
    if (p != r->rank && r->sc[p])
      in_flight |= (r->plan.close_inflight && !r->tx[p].failed && !r->rx[p].failed) || r->tx[p].posted > r->tx[p].done ||
                   r->rx[p].posted > r->rx[p].done;
  if (in_flight) fprintf(stderr, "[rank %d] soak: cycle %d closes with requests in flight\n", r->rank, r->plan.cycle);
  uint32_t type;
  if (send_msg(r->fd, M_CLOSING, NULL, 0) || recv_msg(r->fd, &type, NULL, 0) < 0 || type != M_CLOSE)
    fail(r, "the close barrier failed");
  r->reg_run = 0;
  pthread_join(r->reg_thread, NULL);
  r->closing = 1;
  for (int p = 0; p < r->n; p++) {
    if (p == r->rank || !r->sc[p]) continue;
    stream_t* s[2] = {&r->tx[p], &r->rx[p]};
    for (int d = 0; d < 2; d++)
      if (r->plan.close_inflight && !s[0]->failed && !s[1]->failed) {
        s[d]->limit = -1, s[d]->stopped = 0;
        for (int i = 0; i < 2; i++) stream_post(r, s[d]); /* tested never again: closed in flight */
      }
  }
  /* as NCCL (net.cc, recvProxyFree): deregister, then close; a peer's write into a buffer
   * deregistered in flight is refused */
  for (int p = 0; p < r->n; p++) {
    if (p == r->rank || !r->sc[p]) continue;
    if (r->tx[p].mh) h_dereg(&r->h, r->sc[p], r->tx[p].mh);
    if (r->rx[p].mh) h_dereg(&r->h, r->rc[p], r->rx[p].mh);
    if (r->h.net.close_send(r->sc[p])) fail(r, "closeSend of the comm to rank %d failed", p);
    if (r->h.net.close_recv(r->rc[p])) fail(r, "closeRecv of the comm from rank %d failed", p);
    r->sc[p] = r->rc[p] = NULL;
  }
  for (int p = 0; p < r->n; p++) free(r->tx[p].buf), free(r->rx[p].buf), r->tx[p].buf = r->rx[p].buf = NULL;
}

static void rank_cycle(rank_t* r) {
  memset(&r->st, 0, sizeof r->st);
  r->aborted = 0, r->closing = 0, r->regs = 0;
  fprintf(stderr, "[rank %d] soak: cycle %d begins: fault %s, victim %d\n", r->rank, r->plan.cycle, fault_names[r->plan.fault],
          r->plan.victim);
  double heap0 = heap_in_use();
  rank_connect(r);
  double heap_conn = heap_in_use();
  uint32_t type;
  if (send_msg(r->fd, M_CONNECTED, NULL, 0) || recv_msg(r->fd, &type, NULL, 0) < 0 || type != M_GO) fail(r, "the go barrier failed");
  r->reg_run = 1;
  if (pthread_create(&r->reg_thread, NULL, reg_main, r)) fail(r, "pthread_create failed");
  int fault = r->plan.fault != F_NONE;
  streams_open(r, fault ? -1 : 48);
  run_streams(r);
  if (!fault && r->plan.allreduce)
    for (int it = 0; it < 1 + r->plan.cycle % 3; it++) run_allreduce(r, it);
  rank_close(r);
  r->st.regs = r->regs;
  r->st.heap = heap_in_use();
  r->st.heap_conn_per_comm = (heap_conn - heap0) / (2.0 * (r->n - 1));
  r->st.rss = status_kib("VmRSS:") * 1024, r->st.hwm = status_kib("VmHWM:") * 1024, r->st.fds = open_fds();
  r->st.cycle = r->plan.cycle, r->st.rank = r->rank;
  fprintf(stderr, "[rank %d] soak: cycle %d done: %.0f messages, heap %.0f B, RSS %.0f KiB, %.0f fds\n", r->rank, r->plan.cycle,
          r->st.msgs, r->st.heap, r->st.rss / 1024, r->st.fds);
  if (send_msg(r->fd, M_DONE, &r->st, sizeof r->st)) fail(r, "lost the coordinator");
}

_Noreturn static void rank_main(int rank, int fd, hopts_t* o) {
  static rank_t r;
  memset(&r, 0, sizeof r);
  g_r = &r;
  r.rank = rank, r.fd = fd, r.n = g_opt.nranks;
  r.h.rank = rank, r.h.nranks = r.n, r.h.fd = -1, r.h.o = o, r.h.test_name = "soak";
  r.plan.cycle = -1;
  h_log_as(&r.h);
  pthread_mutex_init(&r.comm_lock, NULL);
  r.reg_pool = h_alloc(S_REG_POOL);
  h_net_open(&r.h);
  for (;;) {
    uint32_t type;
    int len = recv_msg(fd, &type, &r.plan, sizeof r.plan);
    if (len < 0) break; /* the coordinator is done */
    if (type != M_PLAN || len != (int)sizeof r.plan) fail(&r, "unexpected message %u", type);
    rank_cycle(&r);
  }
  h_net_close(&r.h);
  _exit(0);
}

/* ================================ the coordinator ================================ */

typedef struct {
  pid_t pid;
  int fd;
  int cycles;              /* cycles this process completed */
  done_t first, last;      /* samples after its first steady cycle and its last */
  double* heaps;           /* the heap after each of its cycles */
  int nheaps, heaps_cap;
  double min_conn_cost;    /* smallest heap per comm measured in it */
  double peak_hwm;
} slot_t;

static slot_t g_slot[S_MAX_RANKS];
static hopts_t g_hopts;
static const char* g_fail_reason;
static struct {
  double msgs, bytes, sends, regs, cycles, kills, aborts, flaps, inflight_closes, expected_errors, err_remote, err_system, err_other;
  double err_at_close;
  double peak_hwm, max_error_latency;
  int restarts;
} g_tot;

static void coord_fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void coord_fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "soak: FAIL: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  g_fail_reason = "see above";
}

static void start_rank(int rank) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) h_die(NULL, "socketpair: %s", strerror(errno));
  fflush(stdout), fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) h_die(NULL, "fork: %s", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(sv[0]);
    for (int i = 0; i < g_opt.nranks; i++)
      if (g_slot[i].fd > 0) close(g_slot[i].fd);
    char addr[64];
    snprintf(addr, sizeof addr, "%s.%d", g_opt.addr_base, rank + 1);
    setenv("SOFTROCE_ADDR", addr, 1);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)draw(6, (uint64_t)rank, (uint64_t)g_tot.restarts, 0));
    setenv("SOFTROCE_SEED", seed, 1);
    if (g_opt.logdir) {
      char path[4096];
      /* one log per process: a killed one may leave its last line unfinished */
      snprintf(path, sizeof path, "%s/rank-%d.%d.log", g_opt.logdir, rank, (int)getpid());
      if (!freopen(path, "w", stderr)) _exit(1);
      setvbuf(stderr, NULL, _IOLBF, 0); /* whole lines, also from the plugin's threads */
    }
    if (!freopen("/dev/null", "w", stdout)) _exit(1);
    rank_main(rank, sv[1], &g_hopts);
  }
  close(sv[1]);
  free(g_slot[rank].heaps);
  memset(&g_slot[rank], 0, sizeof g_slot[rank]);
  g_slot[rank].pid = pid, g_slot[rank].fd = sv[0];
}

/* Waits for one message of `type` from every rank in `who` (bit mask); -1 on a failure. */
static int gather(int who, uint32_t want, void* out, uint32_t each, const char* what, int cycle) {
  int left = who;
  double deadline = h_now() + g_opt.hang_bound + 10;
  while (left) {
    struct pollfd p[S_MAX_RANKS];
    int idx[S_MAX_RANKS], np = 0;
    for (int i = 0; i < g_opt.nranks; i++)
      if (left & (1 << i)) p[np].fd = g_slot[i].fd, p[np].events = POLLIN, p[np].revents = 0, idx[np++] = i;
    int rc = poll(p, (nfds_t)np, 200);
    if (rc < 0 && errno != EINTR) return -1;
    for (int j = 0; j < np; j++) {
      if (!p[j].revents) continue;
      int i = idx[j];
      uint32_t type;
      char buf[sizeof(done_t) + S_MAX_RANKS * H_HANDLE_SIZE];
      int len = recv_msg(g_slot[i].fd, &type, buf, sizeof buf);
      if (len < 0) {
        coord_fail("cycle %d: rank %d died while the coordinator waited for %s (see its log)", cycle, i, what);
        return -1;
      }
      if (type != want || (uint32_t)len != each) {
        coord_fail("cycle %d: rank %d sent message %u (%d bytes) while %s was expected", cycle, i, type, len, what);
        return -1;
      }
      if (out) memcpy((char*)out + (size_t)i * each, buf, each);
      left &= ~(1 << i);
    }
    if (left && h_now() > deadline) {
      for (int i = 0; i < g_opt.nranks; i++)
        if (left & (1 << i)) coord_fail("cycle %d: watchdog: rank %d sent no %s for %.0f s (hung?)", cycle, i, what, g_opt.hang_bound + 10);
      return -1;
    }
  }
  return 0;
}

static int tell(int who, uint32_t type, const void* p, uint32_t len) {
  for (int i = 0; i < g_opt.nranks; i++)
    if ((who & (1 << i)) && send_msg(g_slot[i].fd, type, p, len)) return -1;
  return 0;
}

/* `softroce-ctl ADDR CMD`, spoken directly: one line to the device's control socket
 * ($SOFTROCE_CTL_DIR/ADDR.sock), an answer starting "ok:". */
static int softroce_ctl(const char* addr, const char* cmd) {
  const char* dir = getenv("SOFTROCE_CTL_DIR");
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s/%s.sock", dir && *dir ? dir : "/tmp/softroce", addr);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  char answer[512] = {0};
  int ok = connect(fd, (struct sockaddr*)&sa, sizeof sa) == 0 && dprintf(fd, "%s\n", cmd) > 0;
  size_t got = 0;
  ssize_t n;
  while (ok && got < sizeof answer - 1 && (n = read(fd, answer + got, sizeof answer - 1 - got)) > 0) got += (size_t)n;
  close(fd);
  if (!ok || strncmp(answer, "ok:", 3) != 0) {
    coord_fail("softroce-ctl %s %s: %s", addr, cmd, got ? answer : "no answer (is SOFTROCE_CTL_DIR the ranks'?)");
    return -1;
  }
  return 0;
}

/* The flap: the victim's port goes down during the traffic, for 0.3-0.8 s, and comes back; the
 * traffic goes on for 3 s more (the recovery's backoff reaches 1.5 s), then stops. */
static int flap_port(const plan_t* pl, int all) {
  char addr[64];
  snprintf(addr, sizeof addr, "%s.%d", g_opt.addr_base, pl->victim + 1);
  usleep((useconds_t)(50000 + draw(7, (uint64_t)pl->cycle, 1, 0) % 250000));
  if (softroce_ctl(addr, "port-down")) return -1;
  usleep((useconds_t)(300000 + draw(7, (uint64_t)pl->cycle, 2, 0) % 500000));
  if (softroce_ctl(addr, "port-up")) return -1;
  g_tot.flaps++;
  usleep(3000000);
  return tell(all, M_STOP, NULL, 0);
}

/* The fault: SIGKILL or abort the victim during its traffic; every survivor must report an error
 * on both its comms with it within --error-bound. */
static int inject_fault(const plan_t* pl, int all) {
  int survivors = all & ~(1 << pl->victim);
  double delay = 0.2 + (double)(draw(7, (uint64_t)pl->cycle, 0, 0) % 800) / 1000.0;
  usleep((useconds_t)(delay * 1e6));
  double t_fault = h_now();
  if (pl->fault == F_KILL) {
    kill(g_slot[pl->victim].pid, SIGKILL);
    waitpid(g_slot[pl->victim].pid, NULL, 0);
    close(g_slot[pl->victim].fd);
    g_slot[pl->victim].fd = -1;
    g_tot.kills++;
  } else {
    if (tell(1 << pl->victim, M_ABORT, NULL, 0)) return -1;
    g_tot.aborts++;
  }
  peer_error_t e[S_MAX_RANKS];
  if (gather(survivors, M_PEER_ERROR, e, sizeof e[0], "error report about the victim", pl->cycle)) return -1;
  for (int i = 0; i < g_opt.nranks; i++) {
    if (!(survivors & (1 << i))) continue;
    double lat = (e[i].t_send_err > e[i].t_recv_err ? e[i].t_send_err : e[i].t_recv_err) - t_fault;
    if (lat > g_tot.max_error_latency) g_tot.max_error_latency = lat;
    if (lat > g_opt.error_bound) {
      coord_fail("cycle %d: rank %d saw the %s of rank %d only after %.2f s (bound %.1f s)", pl->cycle, i,
                 pl->fault == F_KILL ? "kill" : "abort", pl->victim, lat, g_opt.error_bound);
      return -1;
    }
  }
  return tell(pl->fault == F_KILL ? survivors : all, M_STOP, NULL, 0);
}

static void account(const done_t* d, int rank) {
  slot_t* s = &g_slot[rank];
  g_tot.msgs += d->msgs, g_tot.bytes += d->bytes, g_tot.sends += d->sends, g_tot.regs += d->regs;
  g_tot.expected_errors += d->expected_errors, g_tot.err_remote += d->err_remote, g_tot.err_system += d->err_system;
  g_tot.err_other += d->err_other, g_tot.err_at_close += d->err_at_close;
  if (d->hwm > g_tot.peak_hwm) g_tot.peak_hwm = d->hwm;
  if (s->cycles == 0 || d->heap_conn_per_comm < s->min_conn_cost) s->min_conn_cost = d->heap_conn_per_comm;
  /* the first cycle of a process makes its one-time state (device, PD, threads): the baseline is the second */
  if (s->cycles == 1) s->first = *d;
  s->last = *d;
  if (s->nheaps == s->heaps_cap) {
    s->heaps_cap = s->heaps_cap ? 2 * s->heaps_cap : 256;
    s->heaps = realloc(s->heaps, (size_t)s->heaps_cap * sizeof *s->heaps);
    if (!s->heaps) h_die(NULL, "out of memory");
  }
  s->heaps[s->nheaps++] = d->heap;
  s->cycles++;
}

#define S_HEAP_WINDOW 8
static double lowest(const double* v, int n) {
  double m = v[0];
  for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
  return m;
}

/* The heap, descriptors and RSS of one rank process across its cycles. The heap is compared as
 * the lowest of up to S_HEAP_WINDOW samples at the start (from its second cycle) and at the end:
 * a leak raises every later sample, a transient (packets softroce's or the plugin's threads hold
 * at that moment: seen once as +17 KiB at one close, back to the byte at the next) only some. */
static int check_flat(int rank, const char* when) {
  slot_t* s = &g_slot[rank];
  if (s->cycles < 3) return 0; /* too few cycles to compare */
  int w = (s->nheaps - 1) / 2 < S_HEAP_WINDOW ? (s->nheaps - 1) / 2 : S_HEAP_WINDOW;
  double heap0 = lowest(s->heaps + 1, w), heap1 = lowest(s->heaps + s->nheaps - w, w);
  double dheap = heap1 - heap0, dfd = s->last.fds - s->first.fds, drss = s->last.rss - s->first.rss;
  printf("soak: rank %d (pid %d, %s): %d cycles: heap %.1f -> %.1f KiB (the lowest of %d samples; %+.1f KiB; one comm: %.1f KiB), fds %.0f -> %.0f, RSS %.1f -> %.1f MiB\n",
         rank, (int)s->pid, when, s->cycles, heap0 / 1024, heap1 / 1024, w, dheap / 1024, s->min_conn_cost / 1024, s->first.fds,
         s->last.fds, s->first.rss / 1048576, s->last.rss / 1048576);
  int bad = 0;
  if (dheap >= s->min_conn_cost) {
    coord_fail("rank %d: the heap grew by %.1f KiB over %d cycles, more than one comm's worth (%.1f KiB)", rank, dheap / 1024,
               s->cycles - 1, s->min_conn_cost / 1024);
    bad = 1;
  }
  if (dfd > 0) {
    coord_fail("rank %d: open descriptors grew from %.0f to %.0f", rank, s->first.fds, s->last.fds);
    bad = 1;
  }
  if (drss > g_opt.rss_slack_mib * 1048576) {
    coord_fail("rank %d: RSS grew by %.1f MiB (more than --rss-slack %.0f MiB)", rank, drss / 1048576, g_opt.rss_slack_mib);
    bad = 1;
  }
  return bad;
}

/* Sums the softroce-faults-<pid>.txt files the rank processes left (SOFTROCE_FAULT_COUNTS). */
static int softroce_faults(double* lost, double* reordered, double* duplicated) {
  const char* dir = getenv("SOFTROCE_FAULT_COUNTS");
  DIR* d = dir ? opendir(dir) : NULL;
  if (!d) return -1;
  struct dirent* e;
  *lost = *reordered = *duplicated = 0;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, "softroce-faults-", 16) != 0) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE* f = fopen(path, "r");
    unsigned long long l = 0, r = 0, u = 0;
    if (f && fscanf(f, "lost=%llu reordered=%llu duplicated=%llu", &l, &r, &u) == 3)
      *lost += (double)l, *reordered += (double)r, *duplicated += (double)u;
    if (f) fclose(f);
  }
  closedir(d);
  return 0;
}

/* ---- the WARN scan: every plugin WARN in the rank logs must be one the soak's faults cause ----
 * Each rank log says, per cycle, "cycle N begins: fault F, victim V", "cycle N closes with
 * requests in flight" (before the close barrier, so before any rank deregisters a buffer with
 * requests in flight) and "cycle N done".
 * Expected, and only so:
 *  - a peer gone (it was killed or aborted: its side channel closed, its QPs stopped answering,
 *    or it deregistered the buffer our write was for): on a survivor in a cycle with a fault,
 *    naming the victim's GID when the WARN names a GID; or on any rank once it closes with
 *    requests in flight (its peers do the same at the same time);
 *  - a local access violation (a peer's write into a buffer this rank deregistered with the
 *    receive in flight, as NCCL deregisters before it closes): only between this rank's "closes
 *    with requests in flight" and "done" of the cycle (the plugin logs the event before the close
 *    that destroys the QP returns);
 *  - a recovery (a connection lost its QPs: recovering, the peer lost them, recovered; the port
 *    event): on any rank in a flap cycle, as is a closed connection (the cycle closes every comm,
 *    possibly while one still recovers); in a kill or abort cycle as a peer gone (a survivor's
 *    QPs to the victim fail, and the recovery meets the closed side channel).
 * Anything else, or a WARN line not named by the log's rank, is unexpected. */
enum { K_RECOVERING, K_PEER_LOST, K_RECOVERED, K_PORT_DOWN, K_CLOSED, K_RETRY, K_REMOTE_ACCESS, K_LOCAL_ACCESS, K_N };
static const char* const warn_kinds[K_N] = {"recovering over new QPs", "the peer lost its QPs", "recovered over new QPs",
                                            "the port went down",      "closed the connection", "transport retry counter exceeded",
                                            "remote access error",     "local access violation"};

typedef struct {
  long expected[K_N], unexpected, files;
} warn_scan_t;

typedef struct {
  int rank, cycle, fault, victim, closing;
} log_state_t;

static int warn_expected(const log_state_t* st, int kind, const char* line) {
  /* a flap cycle ends with every comm closed, possibly while one still recovers: its peer sees
   * the side channel close during the recovery */
  if (st->fault == F_FLAP && (kind <= K_PORT_DOWN || kind == K_CLOSED)) return 1;
  if (kind == K_LOCAL_ACCESS || st->closing) return st->closing;
  if (kind == K_RECOVERED || kind == K_PORT_DOWN) return 0;
  if (st->fault == F_NONE || st->rank == st->victim) return 0;
  const char* g = strstr(line, "peer GID ::ffff:");
  char want[64];
  snprintf(want, sizeof want, "peer GID ::ffff:%s.%d,", g_opt.addr_base, st->victim + 1);
  return !g || strncmp(g, want, strlen(want)) == 0;
}

/* Follows the soak's own lines of a rank log (the cycle, its fault, the close in flight). */
static void log_follow(log_state_t* st, const char* line) {
  const char* m = strstr(line, "soak: cycle ");
  if (!m) return;
  int c;
  char fault[16];
  if (sscanf(m, "soak: cycle %d begins: fault %15[a-z], victim %d", &c, fault, &st->victim) == 3) {
    st->cycle = c, st->closing = 0, st->fault = -1;
    for (int f = F_NONE; f <= F_FLAP; f++)
      if (strcmp(fault, fault_names[f]) == 0) st->fault = f;
  } else if (sscanf(m, "soak: cycle %d", &c) == 1 && c == st->cycle) {
    if (strstr(m, " closes with requests in flight")) st->closing = 1;
    if (strstr(m, " done:")) st->closing = 0;
  }
}

static void scan_one_log(const char* path, int rank, warn_scan_t* ws) {
  FILE* f = fopen(path, "r");
  if (!f) {
    coord_fail("cannot read %s", path);
    ws->unexpected++;
    return;
  }
  ws->files++;
  log_state_t st = {rank, -1, -1, -1, 0};
  char line[8192];
  while (fgets(line, sizeof line, f)) {
    if (!strchr(line, '\n')) break; /* the unfinished last line of a killed process */
    log_follow(&st, line);
    if (!strstr(line, "NCCL WARN")) continue;
    int named = -2, kind = -1;
    sscanf(line, "[rank %d]", &named);
    for (int k = 0; k < K_N && kind < 0; k++)
      if (strstr(line, warn_kinds[k])) kind = k;
    if (named == rank && kind >= 0 && st.fault >= 0 && warn_expected(&st, kind, line)) {
      ws->expected[kind]++;
      continue;
    }
    if (ws->unexpected++ < 10)
      coord_fail("%s (rank %d, cycle %d, fault %s, victim %d%s): an unexpected WARN%s: %s", path, rank, st.cycle,
                 st.fault >= 0 ? fault_names[st.fault] : "?", st.victim, st.closing ? ", closing with requests in flight" : "",
                 named == rank ? "" : " (not named by the log's rank)", line);
  }
  fclose(f);
}

/* Scans every rank-R.PID.log in the log directory; a failure is reported (coord_fail). */
static warn_scan_t scan_warns(void) {
  warn_scan_t ws;
  memset(&ws, 0, sizeof ws);
  DIR* d = opendir(g_opt.logdir);
  struct dirent* e;
  while (d && (e = readdir(d))) {
    int r;
    if (sscanf(e->d_name, "rank-%d.", &r) != 1) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", g_opt.logdir, e->d_name);
    scan_one_log(path, r, &ws);
  }
  if (d) closedir(d);
  if (ws.files < g_opt.nranks) coord_fail("found %ld rank logs in %s, expected at least %d", ws.files, g_opt.logdir, g_opt.nranks);
  if (ws.unexpected) coord_fail("%ld unexpected plugin WARNs in the rank logs (the first ones above)", ws.unexpected);
  return ws;
}

static void print_warn_scan(const warn_scan_t* ws) {
  long n = 0;
  for (int k = 0; k < K_N; k++) n += ws->expected[k];
  printf("soak: plugin WARNs in %ld rank logs: %ld expected (", ws->files, n);
  for (int k = 0; k < K_N; k++) printf("%s'%s' %ld", k ? ", " : "", warn_kinds[k], ws->expected[k]);
  printf("), %ld unexpected\n", ws->unexpected);
}

static void usage(int rc) {
  fprintf(rc ? stderr : stdout,
          "usage: soak --logdir DIR [--minutes N] [--seed S] [--ranks N] [--hang-bound SEC] [--error-bound SEC]\n"
          "            [--rss-slack MIB] [--addr-base A.B.C] [--fault-every K] [--corrupt-check MSG]\n"
          "  --minutes N       run cycles for N minutes (fractions allowed; default 1)\n"
          "  --seed S          seed of every choice (default: from the clock; printed)\n"
          "  --ranks N         rank processes (2..%d, default 4), softroce addresses A.B.C.1..N\n"
          "  --hang-bound SEC  a request without progress this long fails the run (default 20)\n"
          "  --error-bound SEC each survivor of a kill/abort must see an error within this (default 10)\n"
          "  --rss-slack MIB   RSS growth allowed per rank process over its cycles (default 8)\n"
          "  --fault-every K   one cycle in K (on average) kills or aborts a rank or flaps its port (default 4)\n"
          "  --corrupt-check M the checker expects a wrong byte in message M of every stream (proves the check fails)\n"
          "  --logdir DIR      rank logs (rank-N.PID.log) and where the WARN scan reads them\n"
          "  --scan-logs DIR   run nothing: the WARN scan of the rank logs in DIR (of a run with the same --ranks\n"
          "                    and --addr-base); exit status 1 on an unexpected WARN\n"
          "Environment: SOFTROCE_FAULT_COUNTS (the injected loss/reordering/duplication counts), and whatever\n"
          "the plugin and softroce read (ci/soak.sh sets them).\n",
          S_MAX_RANKS);
  exit(rc);
}

static void parse(int argc, char** argv) {
  static const struct option longs[] = {{"minutes", 1, 0, 'm'},     {"seed", 1, 0, 's'},        {"ranks", 1, 0, 'N'},
                                        {"hang-bound", 1, 0, 'H'},  {"error-bound", 1, 0, 'E'}, {"rss-slack", 1, 0, 'R'},
                                        {"addr-base", 1, 0, 'A'},   {"logdir", 1, 0, 'L'},      {"fault-every", 1, 0, 'F'},
                                        {"corrupt-check", 1, 0, 'X'}, {"scan-logs", 1, 0, 'S'},  {"help", 0, 0, 'h'},
                                        {0, 0, 0, 0}};
  int c, have_seed = 0;
  while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
    switch (c) {
      case 'm': g_opt.minutes = atof(optarg); break;
      case 's': g_opt.seed = strtoull(optarg, NULL, 0), have_seed = 1; break;
      case 'N': g_opt.nranks = atoi(optarg); break;
      case 'H': g_opt.hang_bound = atof(optarg); break;
      case 'E': g_opt.error_bound = atof(optarg); break;
      case 'R': g_opt.rss_slack_mib = atof(optarg); break;
      case 'A': g_opt.addr_base = optarg; break;
      case 'L': g_opt.logdir = optarg; break;
      case 'F': g_opt.fault_every = atoi(optarg); break;
      case 'X': g_opt.corrupt = atoi(optarg); break;
      case 'S': g_opt.logdir = optarg, g_opt.scan_only = 1; break;
      case 'h': usage(0); break;
      default: usage(2);
    }
  }
  if (optind < argc) usage(2);
  if (!g_opt.logdir) h_die(NULL, "--logdir is required (the rank logs are checked for unexpected WARNs)");
  if (g_opt.minutes <= 0 || g_opt.nranks < 2 || g_opt.nranks > S_MAX_RANKS || g_opt.hang_bound <= 0 || g_opt.error_bound <= 0 ||
      g_opt.fault_every < 1)
    h_die(NULL, "--minutes > 0, --ranks 2..%d, bounds > 0, --fault-every >= 1", S_MAX_RANKS);
  if (!have_seed) g_opt.seed = (uint64_t)(h_now() * 1e6) ^ ((uint64_t)getpid() << 40);
  if (!g_opt.scan_only && !getenv("SOFTROCE_FAULT_COUNTS")) h_die(NULL, "SOFTROCE_FAULT_COUNTS is not set: the injected faults could not be counted");
}

static plan_t make_plan(int cycle) {
  uint64_t x = draw(8, (uint64_t)cycle, 0, 0);
  plan_t p = {cycle, (int)(x % (uint64_t)g_opt.nranks), F_NONE, (int)((x >> 8) % 3 == 0), (int)((x >> 12) % 2 == 0)};
  if (cycle > 0 && (x >> 16) % (uint64_t)g_opt.fault_every == 0) p.fault = F_KILL + (int)((x >> 24) % 3);
  return p;
}

/* One cycle, driven from here; returns -1 on a failure (already reported). */
static int coord_cycle(const plan_t* pl) {
  int n = g_opt.nranks, all = (1 << n) - 1;
  size_t hs = (size_t)n * H_HANDLE_SIZE;
  static char handles[S_MAX_RANKS * S_MAX_RANKS * H_HANDLE_SIZE];
  done_t d[S_MAX_RANKS];
  if (tell(all, M_PLAN, pl, sizeof *pl) || gather(all, M_HANDLES, handles, (uint32_t)hs, "listen handles", pl->cycle) ||
      tell(all, M_ALL_HANDLES, handles, (uint32_t)(hs * (size_t)n)) || gather(all, M_CONNECTED, NULL, 0, "connected", pl->cycle) ||
      tell(all, M_GO, NULL, 0))
    return -1;
  int alive = all;
  if (pl->fault == F_FLAP && flap_port(pl, all)) return -1;
  if (peer_fault(pl->fault)) {
    if (inject_fault(pl, all)) return -1;
    if (pl->fault == F_KILL) alive &= ~(1 << pl->victim);
  }
  if (gather(alive, M_CLOSING, NULL, 0, "the close barrier", pl->cycle) || tell(alive, M_CLOSE, NULL, 0) ||
      gather(alive, M_DONE, d, sizeof d[0], "the cycle's results", pl->cycle))
    return -1;
  for (int i = 0; i < n; i++)
    if (alive & (1 << i)) account(&d[i], i);
  g_tot.inflight_closes += pl->close_inflight;
  if (pl->fault == F_KILL) {
    if (check_flat(pl->victim, "until killed")) return -1;
    g_tot.restarts++;
    start_rank(pl->victim);
  }
  return 0;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  parse(argc, argv);
  if (g_opt.scan_only) {
    warn_scan_t ws = scan_warns();
    print_warn_scan(&ws);
    return g_fail_reason ? 1 : 0;
  }
  char* fake_argv[] = {argv[0], NULL};
  optind = 1;
  h_parse(&g_hopts, 1, fake_argv, "soak", NULL);
  h_resolve_plugin(&g_hopts);
  if (!g_hopts.softroce) h_die(NULL, "the first libibverbs.so.1 on LD_LIBRARY_PATH is not softroce's: the soak's faults need it");
  signal(SIGPIPE, SIG_IGN);
  printf("soak: seed %llu, %d ranks (softroce %s.1..%d), %.2f minutes, plugin %s, hang bound %.0f s, error bound %.0f s\n",
         (unsigned long long)g_opt.seed, g_opt.nranks, g_opt.addr_base, g_opt.nranks, g_opt.minutes, g_hopts.plugin,
         g_opt.hang_bound, g_opt.error_bound);
  for (int i = 0; i < g_opt.nranks; i++) g_slot[i].fd = -1;
  for (int i = 0; i < g_opt.nranks; i++) start_rank(i);
  double t0 = h_now(), end = t0 + g_opt.minutes * 60;
  for (int cycle = 0; h_now() < end; cycle++) {
    plan_t pl = make_plan(cycle);
    if (coord_cycle(&pl)) break;
    g_tot.cycles++;
  }
  double wall = h_now() - t0;
  /* the ranks exit when their socket closes */
  for (int i = 0; i < g_opt.nranks; i++) close(g_slot[i].fd);
  for (int i = 0; i < g_opt.nranks; i++) {
    int st = 0;
    if (g_fail_reason) kill(g_slot[i].pid, SIGKILL);
    waitpid(g_slot[i].pid, &st, 0);
    if (!g_fail_reason && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) coord_fail("rank %d did not exit cleanly (status %d)", i, st);
  }
  for (int i = 0; !g_fail_reason && i < g_opt.nranks; i++) check_flat(i, "to the end");
  double lost = 0, reordered = 0, duplicated = 0;
  if (softroce_faults(&lost, &reordered, &duplicated)) coord_fail("cannot read the fault counts in SOFTROCE_FAULT_COUNTS");
  warn_scan_t warns = scan_warns();
  if (!g_fail_reason && lost + reordered + duplicated == 0)
    coord_fail("softroce injected no faults (are SOFTROCE_LOSS, SOFTROCE_REORDER, SOFTROCE_DUP set?)");
  printf("soak: %.0f s, %.0f connect/close cycles (%d ranks, full mesh: %d comms per rank per cycle)\n", wall, g_tot.cycles,
         g_opt.nranks, 2 * (g_opt.nranks - 1));
  printf("soak: messages %.0f, bytes %.0f (every one verified), sends %.0f, registrations from the second thread %.0f\n", g_tot.msgs,
         g_tot.bytes, g_tot.sends, g_tot.regs);
  printf("soak: faults injected: packets lost %.0f, reordered %.0f, duplicated %.0f; ranks killed %.0f (restarted %d), aborted %.0f; ports flapped %.0f; closes with requests in flight %.0f cycles\n",
         lost, reordered, duplicated, g_tot.kills, g_tot.restarts, g_tot.aborts, g_tot.flaps, g_tot.inflight_closes);
  printf("soak: errors seen: %.0f, all expected (remote %.0f, system %.0f, other %.0f; %.0f on comms with a killed or aborted rank, the slowest %.2f s after the fault; %.0f of requests posted at a close in flight)\n",
         g_tot.expected_errors, g_tot.err_remote, g_tot.err_system, g_tot.err_other, g_tot.expected_errors - g_tot.err_at_close,
         g_tot.max_error_latency, g_tot.err_at_close);
  print_warn_scan(&warns);
  printf("soak: peak RSS of a rank %.1f MiB\n", g_tot.peak_hwm / 1048576);
  printf("soak: %s\n", g_fail_reason ? "FAIL" : "PASS");
  return g_fail_reason ? 1 : 0;
}
