/* The data path through the C ABI, as NCCL drives it: dlopen(RTLD_NOW|RTLD_LOCAL) the plugin,
 * dlsym ncclNetPlugin_vN, then listen/connect/accept, regMr/regMrDmaBuf, isend/irecv/iflush/test
 * and close, with every byte verified.
 *
 *   datapath_test <plugin.so> <version 6..12> local [opts]          both ends in this process
 *   datapath_test <plugin.so> <version> recv <handle-file> [opts]   receiving process
 *   datapath_test <plugin.so> <version> send <handle-file> [opts]   sending process
 *   datapath_test <plugin.so> <version> garbage                     junk on the listen port first
 *   datapath_test <plugin.so> <version> large SIZE                  one SIZE-byte message (GiBs)
 *
 * opts: -g groups  -b max-big-bytes  -s seed  -c comms  -w window  -D (no dmabuf)
 *       -f N  (v9+: fuse devices 0..N-1 with makeVDevice and use the fused device)
 *       -k N  (recv/send: die with SIGKILL after N completed groups; -e: expect an error instead
 *             of completing: exit 0 when the peer's death is reported within -t seconds)
 *       -t seconds (overall limit, default 120)
 *       -H    (every single-buffer irecv is called with NCCL's 0x1 hint in *request, which must
 *             never stay there: a request or NULL comes back; also checked on an error path)
 *       -n NAME  (v12: the plugin must list exactly one device, named NAME: NCCL_IB_HCA checks)
 *       -c C  (recv/send: C comms between the two processes, set up at once; they share one
 *             side-channel link from wire version 6 on)
 *       -R    (recv/send: then a second round: the receiver closes all its comms (its end of the
 *             link closes), the sender all but comm 0 (which keeps its end open, unaware), and
 *             C new comms are set up (handles in <handle-file>.2) and move -g groups)
 *       -L    (recv/send: the comms with the peer hold exactly one file descriptor once set up;
 *             while they were set up the sender never had more than that one open, and the
 *             receiver, whose C listen comms share one listener, never more than two)
 *       -X N  (recv/send with -c: the sender closes comm 0 after N groups and goes on with the
 *             others; the receiver must get an error on comm 0 within -t and finish the others)
 *       -A N  (recv/send: the receiver posts N groups on comm 0, and once they are done, waits
 *             0.5 s (the sender's next messages land: with the eager path, unasked) and closes
 *             comm 0; the sender must get ncclRemoteError on comm 0 within -t, whatever its
 *             sends wait for, and finish the other comms)
 *       -W TEXT  (with -A, at the sender: the WARN of comm 0 says TEXT)
 *       -a MS (with -A: the receiver's wait before it closes comm 0, default 500; 0: at once,
 *             while the acknowledgement of the sender's last write may still be on its way)
 *       -P    (local, v11+: NCCL 2.28.9's call pattern, as FERROCE_CALL_TRACE recorded it on a GPU
 *             host: setNetAttr before every connect, accept, isend and irecv call; three host
 *             buffers (NCCL's LL, LL128 and SIMPLE buffers) registered on each comm as soon as it
 *             exists, before the other end is accepted, and deregistered just before its close;
 *             single receives with the 0x1 hint; receive comms closed before send comms; the
 *             comms driven by a second thread (NCCL's proxy thread) while init and finalize run
 *             on the main thread)
 *
 * Both processes derive the same schedule from the seed: per group n buffers (1..8, distinct
 * tags in shuffled order, sizes 0..256 KiB, sometimes 0, sometimes up to -b bytes), receive
 * capacities larger than the message, send order shuffled; a quarter of the buffers are
 * memfd-backed and registered with regMrDmaBuf. Prints "N passed, M failed" at the end.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <ferroce/ferroce_abi.h>
#include <ferroce/nccl_net.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

static int passed, failed;
#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (cond) {                                            \
      passed++;                                            \
    } else {                                               \
      failed++;                                            \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
    }                                                      \
  } while (0)

static int warns;
static char last_warn[2048];
static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags, (void)file, (void)line;
  if (level != FERROCE_LOG_WARN && !getenv("DATAPATH_VERBOSE")) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_warn, sizeof last_warn, fmt, ap);
  va_end(ap);
  if (level == FERROCE_LOG_WARN) warns++;
  fprintf(stderr, "  [plugin %s] %s\n", level == FERROCE_LOG_WARN ? "WARN" : "log", last_warn);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int count_fds(void) {
  DIR* d = opendir("/proc/self/fd");
  int n = 0;
  struct dirent* e;
  while (d && (e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  if (d) closedir(d);
  return n;
}

/* ------------------------------------------------------------------------------------------ */
/* One calling convention over every table version.                                             */

typedef struct {
  int ver;
  void* tbl;
  void* ctx;
} net_t;

#define T(v) ((ferroce_net_v##v##_t*)n->tbl)
#define DISPATCH(expr6, expr7, expr8, expr9, expr10, expr11, expr12) \
  switch (n->ver) {                                                  \
    case 6: return expr6;                                            \
    case 7: return expr7;                                            \
    case 8: return expr8;                                            \
    case 9: return expr9;                                            \
    case 10: return expr10;                                          \
    case 11: return expr11;                                          \
    default: return expr12;                                          \
  }
#define SAME(call) DISPATCH(T(6)->call, T(7)->call, T(8)->call, T(9)->call, T(10)->call, T(11)->call, T(12)->call)

static int n_init(net_t* n) {
  ferroce_net_comm_config_t cfg = {-1};
  DISPATCH(T(6)->init(logger), T(7)->init(logger), T(8)->init(logger), T(9)->init(logger), T(10)->init(logger, NULL),
           T(11)->init(&n->ctx, 1, &cfg, logger, NULL), T(12)->init(&n->ctx, 1, &cfg, logger, NULL))
}
static int n_finalize(net_t* n) {
  if (n->ver == 11) return T(11)->finalize(n->ctx);
  if (n->ver == 12) return T(12)->finalize(n->ctx);
  return 0;
}
static int n_devices(net_t* n, int* nd) { SAME(devices(nd)) }
static int n_listen(net_t* n, int dev, void* h, void** lc) {
  DISPATCH(T(6)->listen(dev, h, lc), T(7)->listen(dev, h, lc), T(8)->listen(dev, h, lc), T(9)->listen(dev, h, lc),
           T(10)->listen(dev, h, lc), T(11)->listen(n->ctx, dev, h, lc), T(12)->listen(n->ctx, dev, h, lc))
}
static void nccl_attr(net_t* n, int op);
static int n_connect(net_t* n, int dev, void* h, void** sc) {
  ferroce_net_device_handle_t* dh = NULL;
  nccl_attr(n, 1);
  ferroce_net_comm_config_t cfg = {-1};
  DISPATCH(T(6)->connect(dev, h, sc), T(7)->connect(dev, h, sc, &dh), T(8)->connect(dev, h, sc, &dh),
           T(9)->connect(dev, h, sc, &dh), T(10)->connect(dev, &cfg, h, sc, &dh), T(11)->connect(n->ctx, dev, h, sc, &dh),
           T(12)->connect(n->ctx, dev, h, sc, &dh))
}
static int n_accept(net_t* n, void* lc, void** rc) {
  ferroce_net_device_handle_t* dh = NULL;
  nccl_attr(n, 2);
  DISPATCH(T(6)->accept(lc, rc), T(7)->accept(lc, rc, &dh), T(8)->accept(lc, rc, &dh), T(9)->accept(lc, rc, &dh),
           T(10)->accept(lc, rc, &dh), T(11)->accept(lc, rc, &dh), T(12)->accept(lc, rc, &dh))
}
static int n_regmr(net_t* n, void* comm, void* data, size_t size, int type, void** mh) {
  DISPATCH(T(6)->regMr(comm, data, (int)size, type, mh), T(7)->regMr(comm, data, (int)size, type, mh),
           T(8)->regMr(comm, data, size, type, mh), T(9)->regMr(comm, data, size, type, mh),
           T(10)->regMr(comm, data, size, type, mh), T(11)->regMr(comm, data, size, type, mh),
           T(12)->regMr(comm, data, size, type, mh))
}
static int n_regmr_dmabuf(net_t* n, void* comm, void* data, size_t size, int type, uint64_t off, int fd, void** mh) {
  SAME(regMrDmaBuf(comm, data, size, type, off, fd, mh))
}
static int n_deregmr(net_t* n, void* comm, void* mh) { SAME(deregMr(comm, mh)) }
static int n_isend(net_t* n, void* sc, void* data, size_t size, int tag, void* mh, void** req) {
  nccl_attr(n, 3);
  DISPATCH(T(6)->isend(sc, data, (int)size, tag, mh, req), T(7)->isend(sc, data, (int)size, tag, mh, req),
           T(8)->isend(sc, data, (int)size, tag, mh, req), T(9)->isend(sc, data, size, tag, mh, req),
           T(10)->isend(sc, data, size, tag, mh, NULL, req), T(11)->isend(sc, data, size, tag, mh, NULL, req),
           T(12)->isend(sc, data, size, tag, mh, NULL, req))
}
static int n_irecv(net_t* n, void* rc, int cnt, void** data, size_t* sizes, int* tags, void** mhs, void** req) {
  nccl_attr(n, 4);
  int isz[8];
  for (int i = 0; i < cnt; i++) isz[i] = (int)sizes[i];
  DISPATCH(T(6)->irecv(rc, cnt, data, isz, tags, mhs, req), T(7)->irecv(rc, cnt, data, isz, tags, mhs, req),
           T(8)->irecv(rc, cnt, data, isz, tags, mhs, req), T(9)->irecv(rc, cnt, data, sizes, tags, mhs, req),
           T(10)->irecv(rc, cnt, data, sizes, tags, mhs, NULL, req), T(11)->irecv(rc, cnt, data, sizes, tags, mhs, NULL, req),
           T(12)->irecv(rc, cnt, data, sizes, tags, mhs, NULL, req))
}
static int n_iflush(net_t* n, void* rc, int cnt, void** data, int* sizes, void** mhs, void** req) {
  SAME(iflush(rc, cnt, data, sizes, mhs, req))
}
static int n_test(net_t* n, void* req, int* done, int* sizes) { SAME(test(req, done, sizes)) }
static int n_close_send(net_t* n, void* c) { SAME(closeSend(c)) }
static int n_close_recv(net_t* n, void* c) { SAME(closeRecv(c)) }
static int n_close_listen(net_t* n, void* c) { SAME(closeListen(c)) }
static int n_max_recvs(net_t* n) {
  switch (n->ver) {
    case 6: { ferroce_net_properties_v6_t p; return T(6)->getProperties(0, &p) ? 1 : p.maxRecvs; }
    case 7: { ferroce_net_properties_v7_t p; return T(7)->getProperties(0, &p) ? 1 : p.maxRecvs; }
    case 8: { ferroce_net_properties_v8_t p; return T(8)->getProperties(0, &p) ? 1 : p.maxRecvs; }
    case 9: { ferroce_net_properties_v9_t p; return T(9)->getProperties(0, &p) ? 1 : p.maxRecvs; }
    case 10: { ferroce_net_properties_v10_t p; return T(10)->getProperties(0, &p) ? 1 : p.maxRecvs; }
    case 11: { ferroce_net_properties_v11_t p; return T(11)->getProperties(0, &p) ? 1 : p.maxRecvs; }
    default: { ferroce_net_properties_v12_t p; return T(12)->getProperties(0, &p) ? 1 : p.maxRecvs; }
  }
}

/* maxP2pBytes of device 0 (v9+; older tables have no such field: 0). */
static size_t n_max_p2p(net_t* n) {
  switch (n->ver) {
    case 9: { ferroce_net_properties_v9_t p; return T(9)->getProperties(0, &p) ? 0 : p.maxP2pBytes; }
    case 10: { ferroce_net_properties_v10_t p; return T(10)->getProperties(0, &p) ? 0 : p.maxP2pBytes; }
    case 11: { ferroce_net_properties_v11_t p; return T(11)->getProperties(0, &p) ? 0 : p.maxP2pBytes; }
    case 12: { ferroce_net_properties_v12_t p; return T(12)->getProperties(0, &p) ? 0 : p.maxP2pBytes; }
    default: return 0;
  }
}

/* ------------------------------------------------------------------------------------------ */
/* The schedule both ends derive from the seed.                                                 */

static uint64_t splitmix(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

#define MAXN 8
typedef struct {
  int n;
  int tags[MAXN];
  size_t size[MAXN], cap[MAXN];
  int order[MAXN];
  int dmabuf[MAXN];
} group_t;

static struct {
  int groups, window, comms, no_dmabuf, kill_after, expect_error, max_recvs, fuse, dev, hint;
  size_t big;
  uint64_t seed;
  double limit;
  const char* dev_name;
  size_t small;     /* -S: every size at most this (the eager path's sizes) */
  int singles;      /* -1: single-buffer receives only (what NCCL's LL protocol posts) */
  long expect_eager; /* -E: at least this many eager messages sent or delivered here; 0: none */
  int close_after;   /* -X: the sender closes comm 0 after this many groups; the receiver expects it */
  int shared_link;   /* -L: the comms with the peer hold one file descriptor in all */
  int reconnect;     /* -R: a second round of comms after the receiver closed all of the first */
  int abort_after;   /* -A: the receiver closes comm 0 after this many groups; the sender expects it */
  const char* want_warn; /* -W: what the WARN of -A's failure says */
  int nccl_pattern;      /* -P: NCCL 2.28.9's call pattern */
  int abort_wait_ms;     /* -a: the receiver's wait before -A's close */
} opt = {200, 32, 1, 0, -1, 0, 8, 0, 0, 0, 64u << 20, 1, 120, NULL, 0, 0, -1, -1, 0, 0, -1, "closed the connection", 0, 500};
static void* g_dl;

/* The comms a run sets up: -c, at most 16. */
static int comm_count(void) { return opt.comms > 16 ? 16 : opt.comms; }

/* -P: the hints NCCL 2.28.9 gave before every connect, accept, isend and irecv call (thousands per
 * second on its proxy thread): they must cost nothing and change nothing. */
static long attr_calls;
static void nccl_attr(net_t* n, int op) {
  if (!opt.nccl_pattern || n->ver < 11) return;
  ferroce_net_attr_t a;
  memset(&a, 0, sizeof a);
  a.sendCommAttr = (ferroce_net_comm_attr_t){1 + (int)(attr_calls % 8), 1, 1 + op, 1};
  a.recvCommAttr = (ferroce_net_comm_attr_t){1 + (int)(attr_calls % 4), 1, 2, 1};
  a.op = (uint32_t)op;
  a.algo = (uint32_t)(attr_calls % 7);
  a.proto = (uint32_t)(attr_calls % 3);
  int rc = n->ver == 11 ? T(11)->setNetAttr(n->ctx, &a) : T(12)->setNetAttr(n->ctx, &a);
  if (rc != 0) CHECK(0, "setNetAttr = %d", rc);
  attr_calls++;
}

static void gen_group(uint64_t seed, int comm, int g, group_t* G) {
  uint64_t s = seed * 1000003 + (uint64_t)comm * 7919 + (uint64_t)g;
  for (int i = 0; i < 3; i++) splitmix(&s);
  G->n = opt.max_recvs > 1 ? 1 + (int)(splitmix(&s) % (uint64_t)opt.max_recvs) : 1;
  int perm[MAXN];
  for (int i = 0; i < G->n; i++) perm[i] = i;
  for (int i = G->n - 1; i > 0; i--) {
    int j = (int)(splitmix(&s) % (uint64_t)(i + 1)), t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  for (int i = 0; i < G->n; i++) {
    G->tags[i] = 100 + perm[i];
    uint64_t r = splitmix(&s);
    if (G->n == 1 && r % 16 == 0)
      G->size[i] = (size_t)(splitmix(&s) % (opt.big + 1));
    else if (r % 8 == 1)
      G->size[i] = 0;
    else
      G->size[i] = (size_t)(splitmix(&s) % (256 * 1024));
    if (opt.small) G->size[i] = (size_t)(r % (opt.small + 1));
    G->cap[i] = G->size[i] + ((r >> 8) % 2 ? (size_t)((r >> 16) % 8192) : 0);
    G->dmabuf[i] = !opt.no_dmabuf && (r >> 32) % 4 == 0;
    G->order[i] = i;
  }
  for (int i = G->n - 1; i > 0; i--) {
    int j = (int)(splitmix(&s) % (uint64_t)(i + 1)), t = G->order[i];
    G->order[i] = G->order[j], G->order[j] = t;
  }
}

static void fill(uint8_t* p, size_t len, uint64_t seed) {
  uint64_t s = seed;
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t v = splitmix(&s);
    memcpy(p + i, &v, 8);
  }
  uint64_t v = splitmix(&s);
  for (; i < len; i++) p[i] = (uint8_t)(v >> (8 * (i % 8)));
}
static uint64_t data_seed(int comm, int g, int i) { return opt.seed ^ ((uint64_t)comm << 48) ^ ((uint64_t)g << 8) ^ (uint64_t)i; }

/* A buffer: anonymous memory, or a memfd mapping registered through regMrDmaBuf. */
typedef struct {
  uint8_t* p;
  size_t len;
  void* mh;
} buf_t;

static int buf_alloc(net_t* n, void* comm, buf_t* b, size_t len, int dmabuf) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  b->len = (len + page - 1) / page * page;
  if (b->len == 0) b->len = page;
  b->mh = NULL;
  if (dmabuf) {
    int fd = memfd_create("datapath", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)b->len) != 0) return -1;
    b->p = mmap(NULL, b->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int rc = b->p == MAP_FAILED ? -1 : n_regmr_dmabuf(n, comm, b->p, b->len, FERROCE_PTR_CUDA, 0, fd, &b->mh);
    close(fd); /* NCCL closes the fd right after the call */
    return rc;
  }
  b->p = mmap(NULL, b->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (b->p == MAP_FAILED) return -1;
  return n_regmr(n, comm, b->p, b->len, FERROCE_PTR_HOST, &b->mh);
}
static void buf_free(net_t* n, void* comm, buf_t* b) {
  if (b->mh) CHECK(n_deregmr(n, comm, b->mh) == 0, "deregMr");
  munmap(b->p, b->len);
}

/* ------------------------------------------------------------------------------------------ */
/* Receiver and sender state machines (non-blocking steps).                                     */

#define MAXW 64
typedef struct {
  net_t* n;
  void* rc;
  int comm;
  int posted, done;
  group_t g[MAXW];
  buf_t b[MAXW][MAXN];
  void* req[MAXW];
  int err;
} recv_t;

typedef struct {
  net_t* n;
  void* sc;
  int comm;
  int next_g, next_i; /* next isend: group, position in its send order */
  int done_g;         /* groups whose every isend completed */
  int prepared_g;     /* group whose buffers are allocated and filled (next_g when ready) */
  group_t g[MAXW];
  buf_t b[MAXW][MAXN];
  void* req[MAXW][MAXN];
  int err;
} send_t;

static int recv_step(recv_t* R) {
  net_t* n = R->n;
  int progress = 0;
  int groups = opt.abort_after >= 0 && R->comm == 0 ? opt.abort_after : opt.groups;
  while (R->posted < groups && R->posted - R->done < opt.window) {
    int w = R->posted % MAXW;
    group_t* G = &R->g[w];
    gen_group(opt.seed, R->comm, R->posted, G);
    void* data[MAXN];
    void* mhs[MAXN];
    for (int i = 0; i < G->n; i++) {
      if (buf_alloc(n, R->rc, &R->b[w][i], G->cap[i], G->dmabuf[i]) != 0) {
        fprintf(stderr, "receive buffer registration failed\n");
        return R->err = -1, -1;
      }
      memset(R->b[w][i].p, 0xa5, R->b[w][i].len);
      data[i] = R->b[w][i].p, mhs[i] = R->b[w][i].mh;
    }
    /* NCCL_NET_OPTIONAL_RECV_COMPLETION (0x1): NCCL stores it in *request for single receives. */
    void* req = opt.hint && G->n == 1 ? (void*)0x1 : NULL;
    int rc = n_irecv(n, R->rc, G->n, data, G->cap, G->tags, mhs, &req);
    if (opt.hint && G->n == 1)
      CHECK(req != (void*)0x1, "irecv left NCCL's 0x1 hint in *request (rc %d, group %d)", rc, R->posted);
    if (rc != 0) return R->err = rc, -1;
    if (!req) { /* out of slots: retry later */
      for (int i = 0; i < G->n; i++) buf_free(n, R->rc, &R->b[w][i]);
      break;
    }
    R->req[w] = req;
    R->posted++;
    progress = 1;
  }
  if (R->done < R->posted) {
    int w = R->done % MAXW;
    group_t* G = &R->g[w];
    int done = 0, sizes[64];
    memset(sizes, 0xff, sizeof sizes);
    int rc = n_test(n, R->req[w], &done, sizes);
    if (rc != 0) return R->err = rc, -1;
    if (done) {
      int sz[MAXN];
      void* data[MAXN];
      void* mhs[MAXN];
      for (int i = 0; i < G->n; i++) {
        uint8_t* p = R->b[w][i].p;
        CHECK(sizes[i] == (int)G->size[i], "comm %d group %d buffer %d: got size %d, sent %zu", R->comm, R->done, i,
              sizes[i], G->size[i]);
        uint8_t* want = malloc(G->size[i] + 1);
        fill(want, G->size[i], data_seed(R->comm, R->done, i));
        int same = memcmp(p, want, G->size[i]) == 0;
        free(want);
        CHECK(same, "comm %d group %d buffer %d: %zu bytes differ", R->comm, R->done, i, G->size[i]);
        size_t k = G->size[i];
        while (k < R->b[w][i].len && p[k] == 0xa5) k++;
        CHECK(k == R->b[w][i].len, "comm %d group %d buffer %d: byte %zu past the message was written", R->comm,
              R->done, i, k);
        sz[i] = sizes[i], data[i] = p, mhs[i] = R->b[w][i].mh;
      }
      void* freq = NULL;
      rc = n_iflush(n, R->rc, G->n, data, sz, mhs, &freq);
      if (rc != 0) return R->err = rc, -1;
      double end = now_s() + 30;
      for (int fd = 0; freq && !fd;) {
        if ((rc = n_test(n, freq, &fd, NULL)) != 0) return R->err = rc, -1;
        if (now_s() > end) return R->err = -2, -1;
      }
      for (int i = 0; i < G->n; i++) buf_free(n, R->rc, &R->b[w][i]);
      R->done++;
      progress = 1;
      if (opt.kill_after >= 0 && R->done == opt.kill_after) {
        fprintf(stderr, "receiver: dying now (SIGKILL) after %d groups, %d receives posted, at %.4f\n", R->done, R->posted,
                now_s());
        kill(getpid(), SIGKILL);
      }
    }
  }
  return progress;
}

static int send_step(send_t* S) {
  net_t* n = S->n;
  int progress = 0;
  /* Post isends in order, keeping at most `window` groups in flight. */
  while (S->next_g < opt.groups && S->next_g - S->done_g < opt.window) {
    int w = S->next_g % MAXW;
    group_t* G = &S->g[w];
    if (S->prepared_g != S->next_g + 1) {
      S->prepared_g = S->next_g + 1;
      gen_group(opt.seed, S->comm, S->next_g, G);
      for (int i = 0; i < G->n; i++) {
        if (buf_alloc(n, S->sc, &S->b[w][i], G->size[i], G->dmabuf[i]) != 0) {
          fprintf(stderr, "send buffer registration failed\n");
          return S->err = -1, -1;
        }
        fill(S->b[w][i].p, G->size[i], data_seed(S->comm, S->next_g, i));
        S->req[w][i] = NULL;
      }
    }
    int i = G->order[S->next_i];
    void* req = NULL;
    int rc = n_isend(n, S->sc, S->b[w][i].p, G->size[i], G->tags[i], S->b[w][i].mh, &req);
    if (rc != 0) return S->err = rc, -1;
    if (!req) break; /* receiver not ready: retry later */
    S->req[w][i] = req;
    progress = 1;
    if (++S->next_i == G->n) S->next_i = 0, S->next_g++;
  }
  /* Complete the oldest group. */
  if (S->done_g < S->next_g) {
    int w = S->done_g % MAXW;
    group_t* G = &S->g[w];
    int all = 1;
    for (int i = 0; i < G->n; i++) {
      if (!S->req[w][i]) continue;
      int done = 0, size = -1;
      int rc = n_test(n, S->req[w][i], &done, &size);
      if (rc != 0) return S->err = rc, -1;
      if (!done) {
        all = 0;
        break;
      }
      CHECK(size == (int)G->size[i], "send size %d vs %zu", size, G->size[i]);
      S->req[w][i] = NULL;
    }
    if (all) {
      for (int i = 0; i < G->n; i++) buf_free(n, S->sc, &S->b[w][i]);
      S->done_g++;
      progress = 1;
      if (opt.kill_after >= 0 && S->done_g == opt.kill_after) {
        fprintf(stderr, "sender: dying now (SIGKILL) after %d groups, at %.4f\n", S->done_g, now_s());
        kill(getpid(), SIGKILL);
      }
    }
  }
  return progress;
}

/* ------------------------------------------------------------------------------------------ */

static net_t load(const char* path, int ver) {
  net_t n = {ver, NULL, NULL};
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
    exit(2);
  }
  g_dl = h;
  char sym[32];
  snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", ver);
  n.tbl = dlsym(h, sym);
  if (!n.tbl) {
    fprintf(stderr, "dlsym %s: %s\n", sym, dlerror());
    exit(2);
  }
  int rc = n_init(&n);
  if (rc != 0) {
    fprintf(stderr, "init failed: %d\n", rc);
    exit(2);
  }
  int nd = 0;
  CHECK(n_devices(&n, &nd) == 0 && nd >= 1, "devices");
  if (opt.fuse > 1) {
    /* Fuse devices 0..fuse-1 (makeVDevice, v9+) and use the virtual device. */
    ferroce_vdevice_props_v12_t p12 = {0};
    p12.ndevs = opt.fuse;
    for (int i = 0; i < opt.fuse; i++) p12.devs[i] = i;
    int d = -1, rc2;
    if (ver >= 12)
      rc2 = ((ferroce_net_v12_t*)n.tbl)->makeVDevice(&d, &p12);
    else if (ver >= 9) {
      ferroce_vdevice_props_v9_t p9 = {0};
      p9.ndevs = opt.fuse;
      for (int i = 0; i < opt.fuse && i < 4; i++) p9.devs[i] = i;
      rc2 = ((ferroce_net_v9_t*)n.tbl)->makeVDevice(&d, &p9);
    } else
      rc2 = -1;
    CHECK(rc2 == 0 && d >= nd, "makeVDevice of %d devices -> %d (rc %d)", opt.fuse, d, rc2);
    opt.dev = d;
  }
  if (opt.dev_name) {
    ferroce_net_properties_v12_t p;
    int ok = ver == 12 && ((ferroce_net_v12_t*)n.tbl)->getProperties(0, &p) == 0;
    CHECK(ok && nd == 1 && p.name && !strcmp(p.name, opt.dev_name), "devices: %d, device 0 named %s (want exactly %s)",
          nd, ok && p.name ? p.name : "?", opt.dev_name);
  }
  opt.max_recvs = n_max_recvs(&n);
  if (opt.max_recvs > MAXN) opt.max_recvs = MAXN;
  if (opt.max_recvs < 1 || opt.singles) opt.max_recvs = 1;
  return n;
}

static int summary(void) {
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

/* -P: NCCL's per-comm protocol buffers (LL, LL128, SIMPLE: the sizes NCCL 2.28.9 registered),
 * [comm][0 send, 1 receive][protocol]. */
static const size_t proto_sizes[3] = {512u << 10, 4800u << 10, 4u << 20};
static buf_t proto_bufs[16][2][3];
static int proto_register(net_t* n, void* comm, int c, int side) {
  for (int p = 0; p < 3; p++)
    if (buf_alloc(n, comm, &proto_bufs[c][side][p], proto_sizes[p], 0) != 0) return -1;
  return 0;
}
static void proto_deregister(net_t* n, void* comm, int c, int side) {
  for (int p = 0; p < 3; p++) buf_free(n, comm, &proto_bufs[c][side][p]);
}

/* Connect `count` pairs in this process, connect and accept driven alternately on one thread. */
static int connect_local(net_t* n, int count, void** sc, void** rc) {
  for (int c = 0; c < count; c++) {
    char handle[FERROCE_NET_HANDLE_MAXSIZE] = {0};
    void* lc = NULL;
    if (n_listen(n, opt.dev, handle, &lc) != 0 || !lc) return -1;
    sc[c] = rc[c] = NULL;
    double end = now_s() + 30;
    while (!sc[c] || !rc[c]) {
      if (!sc[c]) {
        if (n_connect(n, opt.dev, handle, &sc[c]) != 0) return -1;
        /* NCCL registers its buffers on a send comm at once, before the receiver is accepted. */
        if (sc[c] && opt.nccl_pattern && proto_register(n, sc[c], c, 0) != 0) return -1;
      }
      if (!rc[c]) {
        if (n_accept(n, lc, &rc[c]) != 0) return -1;
        if (rc[c] && opt.nccl_pattern) {
          CHECK(n_close_listen(n, lc) == 0, "closeListen right after its accept");
          lc = NULL;
          if (proto_register(n, rc[c], c, 1) != 0) return -1;
        }
      }
      if (now_s() > end) return -1;
    }
    if (lc) CHECK(n_close_listen(n, lc) == 0, "closeListen");
  }
  return 0;
}

/* -E: the eager path's work in this process, from the plugin's statistics (FERROCE_STATS). */
static void check_eager(void) {
  if (opt.expect_eager < 0) return;
  int (*get)(ferroce_rs_FerroceStatsTotals*, size_t);
  *(void**)&get = dlsym(g_dl, "ferroce_stats_totals_get");
  ferroce_rs_FerroceStatsTotals t;
  memset(&t, 0, sizeof t);
  CHECK(get && get(&t, sizeof t) == 0 && t.enabled && t.size == sizeof t,
        "the plugin's statistics (ferroce_stats_totals_get; FERROCE_STATS set?)");
  unsigned long long work = (unsigned long long)(t.eager_sent + t.eager_delivered);
  printf("eager path: %llu sent, %llu delivered\n", (unsigned long long)t.eager_sent, (unsigned long long)t.eager_delivered);
  if (opt.expect_eager == 0)
    CHECK(work == 0, "no eager message (%llu sent or delivered)", work);
  else
    CHECK(work >= (unsigned long long)opt.expect_eager, "at least %ld eager messages sent or delivered (%llu)", opt.expect_eager,
          work);
}

/* The comms of run_local, from set-up to close (-P: on a thread of its own, as NCCL's proxy). */
static void* local_comms(void* arg) {
  net_t* n = arg;
  void* sc[16];
  void* rc[16];
  int C = comm_count();
  CHECK(connect_local(n, C, sc, rc) == 0, "connect %d comm(s) in one process", C);
  if (failed) return NULL;
  if (opt.hint) {
    /* An irecv that fails (n = 0) must not leave the 0x1 hint behind either. */
    void* req = (void*)0x1;
    size_t sz = 8;
    int tag = 1;
    void* data = NULL;
    void* mh = NULL;
    int rc0 = n_irecv(n, rc[0], 0, &data, &sz, &tag, &mh, &req);
    CHECK(rc0 != 0 && req == NULL, "irecv with n=0: an error (%d) and *request NULL (%p), not the 0x1 hint", rc0, req);
    warns = 0; /* that error was WARNed on purpose */
  }
  static recv_t R[16];
  static send_t S[16];
  for (int c = 0; c < C; c++) {
    memset(&R[c], 0, sizeof R[c]);
    memset(&S[c], 0, sizeof S[c]);
    R[c].n = S[c].n = n;
    R[c].rc = rc[c], S[c].sc = sc[c];
    R[c].comm = S[c].comm = c;
  }
  double end = now_s() + opt.limit;
  int left = C;
  while (left > 0 && now_s() < end) {
    left = 0;
    for (int c = 0; c < C; c++) {
      if (R[c].done == opt.groups && S[c].done_g == opt.groups) continue;
      left++;
      if (recv_step(&R[c]) < 0 || send_step(&S[c]) < 0) {
        CHECK(0, "comm %d: error (recv %d, send %d)", c, R[c].err, S[c].err);
        return NULL;
      }
    }
  }
  for (int c = 0; c < C; c++)
    CHECK(R[c].done == opt.groups && S[c].done_g == opt.groups, "comm %d finished %d/%d groups in time", c, R[c].done,
          opt.groups);
  if (opt.nccl_pattern) {
    /* NCCL 2.28.9's teardown: each comm's registrations, then the comm; receive comms first. */
    for (int c = 0; c < C; c++) {
      proto_deregister(n, rc[c], c, 1);
      CHECK(n_close_recv(n, rc[c]) == 0, "closeRecv");
    }
    for (int c = 0; c < C; c++) {
      proto_deregister(n, sc[c], c, 0);
      CHECK(n_close_send(n, sc[c]) == 0, "closeSend");
    }
    printf("NCCL 2.28.9's pattern: %ld setNetAttr calls\n", attr_calls);
    CHECK(attr_calls > 2L * opt.groups * C, "setNetAttr before every connect, accept, isend and irecv (%ld calls)", attr_calls);
  } else {
    for (int c = 0; c < C; c++) {
      CHECK(n_close_send(n, sc[c]) == 0, "closeSend");
      CHECK(n_close_recv(n, rc[c]) == 0, "closeRecv");
    }
  }
  return NULL;
}

static int run_local(net_t* n) {
  int fds0 = count_fds();
  if (opt.nccl_pattern) {
    CHECK(n->ver >= 11, "-P needs a v11+ table (setNetAttr)");
    pthread_t proxy;
    CHECK(pthread_create(&proxy, NULL, local_comms, n) == 0, "start the proxy thread");
    pthread_join(proxy, NULL);
  } else {
    local_comms(n);
  }
  if (failed) return summary();
  int C = comm_count();
  CHECK(count_fds() == fds0, "no fd leaked by %d comm(s): %d fds before, %d after", C, fds0, count_fds());
  CHECK(warns == 0, "no WARN on a clean run (%d, last: %s)", warns, last_warn);
  check_eager();
  CHECK(n_finalize(n) == 0, "finalize");
  return summary();
}

/* Sparse memory for messages of gigabytes: nothing is reserved, pages appear as written. */
static uint8_t* sparse_new(size_t len) {
  void* p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}
static uint8_t probe_byte(size_t i) { return (uint8_t)(i * 7 + 1) | 1; }

/* One message of `size` bytes (past 2 GiB and past one WR's max_msg_sz on v9+; INT_MAX, the most
 * an int carries, on v6-v8): one probe byte per MiB and the last byte must land, and both ends'
 * test() must report the size, saturated at INT_MAX where an int cannot hold it. v9+: maxP2pBytes
 * covers the size, and a receive one byte past maxP2pBytes is refused with ncclInternalError.
 * v6-v8: a size past INT_MAX reaches the plugin as a negative int, which isend refuses. */
static int run_large(net_t* n, size_t size) {
  void* sc[1];
  void* rc[1];
  CHECK(connect_local(n, 1, sc, rc) == 0, "connect one comm in one process");
  if (failed) return summary();
  uint8_t* src = sparse_new(size);
  uint8_t* dst = sparse_new(size);
  CHECK(src && dst, "mmap two sparse buffers of %zu bytes", size);
  if (failed) return summary();
  size_t nprobes = 0;
  for (size_t off = 0; off < size; off += 1 << 20) src[off] = probe_byte(nprobes++);
  src[size - 1] = 0x5a;
  void *smh = NULL, *rmh = NULL;
  int tag = 9;
  if (n->ver >= 9) {
    size_t max = n_max_p2p(n);
    CHECK(max >= size, "v%d maxP2pBytes %zu covers a %zu-byte message", n->ver, max, size);
    /* regMr covers the whole mapping; one byte past maxP2pBytes is refused by irecv itself. */
    uint8_t* past = sparse_new(max + 1);
    void* pmh = NULL;
    CHECK(past && n_regmr(n, rc[0], past, max + 1, FERROCE_PTR_HOST, &pmh) == 0, "regMr of %zu bytes", max + 1);
    size_t psz = max + 1;
    void* pdata = past;
    void* preq = NULL;
    warns = 0;
    int prc = n_irecv(n, rc[0], 1, &pdata, &psz, &tag, &pmh, &preq);
    CHECK(prc == FERROCE_NCCL_INTERNAL_ERROR && preq == NULL && warns > 0, "irecv of maxP2pBytes + 1 bytes: ncclInternalError (%d), no request, a WARN", prc);
    if (pmh) CHECK(n_deregmr(n, rc[0], pmh) == 0, "deregMr");
    if (past) munmap(past, max + 1);
    warns = 0;
  } else if (size > (size_t)INT32_MAX) {
    CHECK(n_regmr(n, sc[0], src, (size_t)INT32_MAX, FERROCE_PTR_HOST, &smh) == 0, "regMr");
    void* req = NULL;
    int rc0 = n_isend(n, sc[0], src, size, tag, smh, &req);
    CHECK(rc0 == FERROCE_NCCL_INTERNAL_ERROR && req == NULL, "v%d isend of %zu bytes (a negative int): ncclInternalError (%d)", n->ver, size, rc0);
    warns = 0;
    CHECK(n_deregmr(n, sc[0], smh) == 0, "deregMr");
    munmap(src, size), munmap(dst, size);
    CHECK(n_close_send(n, sc[0]) == 0 && n_close_recv(n, rc[0]) == 0, "close");
    return summary();
  }
  CHECK(n_regmr(n, sc[0], src, size, FERROCE_PTR_HOST, &smh) == 0, "regMr of the %zu-byte source", size);
  CHECK(n_regmr(n, rc[0], dst, size, FERROCE_PTR_HOST, &rmh) == 0, "regMr of the %zu-byte destination", size);
  if (failed) return summary();
  void* rreq = NULL;
  void* sreq = NULL;
  void* ddata = dst;
  size_t dsz = size;
  CHECK(n_irecv(n, rc[0], 1, &ddata, &dsz, &tag, &rmh, &rreq) == 0 && rreq, "irecv of %zu bytes", size);
  double end = now_s() + opt.limit;
  int src0 = 0, trc = 0;
  while (!sreq && src0 == 0 && now_s() < end) src0 = n_isend(n, sc[0], src, size, tag, smh, &sreq);
  CHECK(src0 == 0 && sreq, "isend of %zu bytes (%d)", size, src0);
  int sdone = 0, rdone = 0, ssize = -1, rsize = -1;
  while (trc == 0 && sreq && rreq && (!sdone || !rdone) && now_s() < end) {
    if (!sdone) trc = n_test(n, sreq, &sdone, &ssize);
    if (!rdone && trc == 0) trc = n_test(n, rreq, &rdone, &rsize);
  }
  CHECK(trc == 0, "test() of the %zu-byte message (%d)", size, trc);
  CHECK(sdone && rdone, "the %zu-byte message completed within %.0f s", size, opt.limit);
  int want = size > (size_t)INT32_MAX ? INT32_MAX : (int)size;
  CHECK(ssize == want && rsize == want, "test() sizes: sender %d, receiver %d (want %d)", ssize, rsize, want);
  size_t wrong = 0, i = 0;
  for (size_t off = 0; off < size; off += 1 << 20) wrong += dst[off] != probe_byte(i++);
  wrong += dst[size - 1] != 0x5a;
  CHECK(wrong == 0, "%zu of %zu probe bytes wrong", wrong, nprobes + 1);
  CHECK(n_deregmr(n, sc[0], smh) == 0 && n_deregmr(n, rc[0], rmh) == 0, "deregMr");
  munmap(src, size), munmap(dst, size);
  CHECK(n_close_send(n, sc[0]) == 0 && n_close_recv(n, rc[0]) == 0, "close");
  CHECK(warns == 0, "no WARN on a clean run (%d, last: %s)", warns, last_warn);
  CHECK(n_finalize(n) == 0, "finalize");
  printf("v%d: a %zu-byte message, %zu probe bytes right, test() sizes %d/%d\n", n->ver, size, nprobes + 1, ssize, rsize);
  return summary();
}

static int write_handles(const char* file, const char* h, int count) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", file);
  FILE* f = fopen(tmp, "w");
  if (!f) return -1;
  for (int i = 0; i < FERROCE_NET_HANDLE_MAXSIZE * count; i++) fprintf(f, "%02x", (unsigned char)h[i]);
  fclose(f);
  return rename(tmp, file);
}
static int read_handles(const char* file, char* h, int count, double limit) {
  double end = now_s() + limit;
  for (;;) {
    FILE* f = fopen(file, "r");
    if (f) {
      int ok = 1;
      for (int i = 0; i < FERROCE_NET_HANDLE_MAXSIZE * count && ok; i++) {
        unsigned v;
        ok = fscanf(f, "%2x", &v) == 1;
        h[i] = (char)v;
      }
      fclose(f);
      if (ok) return 0;
    }
    if (now_s() > end) return -1;
    usleep(10000);
  }
}

/* Set up `C` comms with the other process, all at once as NCCL's proxy does: the receiver
 * listens C times and accepts them, the sender connects to all C handles. */
static int connect_remote(net_t* n, int sender, const char* file, int C, void** comms, double end, int* peak) {
  static char handles[16][FERROCE_NET_HANDLE_MAXSIZE];
  void* lcs[16] = {0};
  memset(handles, 0, sizeof handles);
  if (!sender) {
    for (int c = 0; c < C; c++) CHECK(n_listen(n, opt.dev, handles[c], &lcs[c]) == 0 && lcs[c], "listen #%d", c);
    CHECK(write_handles(file, handles[0], C) == 0, "write handles");
  } else {
    CHECK(read_handles(file, handles[0], C, 30) == 0, "read %d handles from %s", C, file);
  }
  if (failed) return -1;
  int left = C;
  while (left > 0 && now_s() < end) {
    left = 0;
    for (int c = 0; c < C; c++) {
      if (comms[c]) continue;
      int rc = sender ? n_connect(n, opt.dev, handles[c], &comms[c]) : n_accept(n, lcs[c], &comms[c]);
      if (rc != 0) return -1;
      left += comms[c] == NULL;
      /* -L: the most descriptors open while the comms are set up */
      if (opt.shared_link) {
        int now_open = count_fds();
        if (now_open > *peak) *peak = now_open;
      }
    }
  }
  for (int c = 0; c < C && !sender; c++) n_close_listen(n, lcs[c]);
  return left == 0 ? 0 : -1;
}

/* Fresh receive and send state for comm c of `comms` (one end of each is used). */
static void init_ends(net_t* n, recv_t* R, send_t* S, void** comms, int C) {
  for (int c = 0; c < C; c++) {
    memset(&R[c], 0, sizeof R[c]);
    memset(&S[c], 0, sizeof S[c]);
    R[c].n = S[c].n = n;
    R[c].rc = S[c].sc = comms[c];
    R[c].comm = S[c].comm = c;
  }
}

/* -R: C new comms with the peer after the receiver closed every comm of the first round (so
 * its end of their link is closed) while the sender kept one (so its end is open and may not
 * know yet): the sender's connects, whatever they try first, must set up and move data. */
static void second_round(net_t* n, int sender, const char* file, int C) {
  char file2[4096];
  snprintf(file2, sizeof file2, "%s.2", file);
  void* comms[16] = {0};
  int peak = 0;
  int shared = opt.shared_link;
  opt.shared_link = 0; /* the first round's link may still be open here */
  CHECK(connect_remote(n, sender, file2, C, comms, now_s() + 60, &peak) == 0, "second round: %s %d comm(s)",
        sender ? "connect" : "accept", C);
  opt.shared_link = shared;
  static recv_t R[16];
  static send_t S[16];
  int left = C, err = 0;
  init_ends(n, R, S, comms, C);
  double end = now_s() + opt.limit;
  while (left > 0 && !err && comms[C - 1] && now_s() < end) {
    left = 0;
    for (int c = 0; c < C && !err; c++) {
      if ((sender ? S[c].done_g : R[c].done) == opt.groups) continue;
      left++;
      if ((sender ? send_step(&S[c]) : recv_step(&R[c])) < 0) err = sender ? S[c].err : R[c].err;
    }
  }
  CHECK(err == 0 && left == 0, "second round: %d comms moved %d groups each (error %d)", C, opt.groups, err);
  for (int c = 0; c < C; c++)
    if (comms[c]) CHECK((sender ? n_close_send(n, comms[c]) : n_close_recv(n, comms[c])) == 0, "second round: close");
  printf("second round: %d comms set up and used after the peer closed its end of the first link\n", C);
}

/* Two processes: each side runs its half; with -k the other side dies and this one must see an
 * error (never a hang) within the limit; with -X the sender closes comm 0 early and the
 * receiver must see an error on that comm alone. */
static int run_remote(net_t* n, int sender, const char* file) {
  int C = comm_count();
  void* comms[16] = {0};
  double end = now_s() + opt.limit;
  int fds0 = count_fds(), peak = fds0;
  CHECK(connect_remote(n, sender, file, C, comms, end, &peak) == 0, "%s %d comm(s)", sender ? "connect" : "accept", C);
  if (failed) return summary();
  /* One side-channel link for every comm with this peer (wire version 6): no descriptor per
   * comm. The receiver's listen comms are closed by now, so this counts what the comms hold. */
  /* Set up, too, a connect to a process it has a link with opens no socket: its handshake
   * goes on the link. The sender's one socket is the first connect's, which becomes the link;
   * the receiver's C listen comms share the process's one listener, open until the last is
   * closed, beside the accepted link. */
  if (opt.shared_link)
    CHECK(peak - fds0 <= (sender ? 1 : 2), "%d comms set up with at most %d descriptors open at once (%d)", C, sender ? 1 : 2,
          peak - fds0);
  if (opt.shared_link)
    CHECK(count_fds() - fds0 == 1, "%d comms with one peer hold %d file descriptors (one shared link: at most 1)", C,
          count_fds() - fds0);
  static recv_t R[16];
  static send_t S[16];
  int err[16] = {0}, closed[16] = {0};
  double failed_at[16] = {0}, done_at[16] = {0};
  init_ends(n, R, S, comms, C);
  double t0 = now_s();
  int left = C;
  while (left > 0 && now_s() < end) {
    left = 0;
    for (int c = 0; c < C; c++) {
      int finished = sender ? S[c].done_g == opt.groups : R[c].done == opt.groups;
      if (finished && !done_at[c]) done_at[c] = now_s();
      if (finished || err[c] || closed[c]) continue;
      left++;
      if ((sender ? send_step(&S[c]) : recv_step(&R[c])) < 0) {
        err[c] = sender ? S[c].err : R[c].err;
        failed_at[c] = now_s();
        /* -k: the peer is dead, every comm fails; one is enough to report. */
        if (opt.expect_error) break;
        continue;
      }
      if (!sender && c == 0 && opt.abort_after >= 0 && R[0].done == opt.abort_after) {
        usleep(opt.abort_wait_ms * 1000);
        CHECK(n_close_recv(n, comms[0]) == 0, "closeRecv of comm 0 after %d groups", opt.abort_after);
        fprintf(stderr, "receiver: closed comm 0 after %d groups\n", opt.abort_after);
        closed[0] = 1;
      }
      if (sender && c == 0 && opt.close_after >= 0 && S[0].done_g == opt.close_after) {
        CHECK(n_close_send(n, comms[0]) == 0, "closeSend of comm 0 after %d groups", opt.close_after);
        fprintf(stderr, "sender: closed comm 0 after %d groups\n", opt.close_after);
        closed[0] = 1;
      }
    }
    int any = 0;
    for (int c = 0; c < C; c++) any |= err[c] != 0;
    if (opt.expect_error && any) break;
  }
  double took = now_s() - t0;
  /* -X: the sender keeps the link open a while after its other comms are done, so that only
   * the close of comm 0 itself (not the link ending) can fail the receiver's comm 0 in time. */
  if ((sender && opt.close_after >= 0) || (!sender && opt.abort_after >= 0)) sleep(2);
  if (opt.expect_error) {
    int e = 0;
    for (int c = 0; c < C && !e; c++) e = err[c];
    CHECK(e == FERROCE_NCCL_REMOTE_ERROR || e == FERROCE_NCCL_SYSTEM_ERROR,
          "the survivor got an error (%d) after the peer died, in %.1f s", e, took);
    CHECK(warns >= 1 && warns <= 2, "one WARN names the failure (%d WARNs)", warns);
    double at = 0;
    for (int c = 0; c < C; c++)
      if (err[c] && (!at || failed_at[c] < at)) at = failed_at[c];
    /* The monotonic clock is the machine's: `at` minus the killed side's "at" is the time the
     * peer's death took to notice. */
    printf("survivor: error %d after %.1f s, at %.4f: %s\n", e, took, at, last_warn);
  } else if (opt.close_after >= 0 && !sender) {
    CHECK(err[0] == FERROCE_NCCL_REMOTE_ERROR, "comm 0, closed by the peer, fails with ncclRemoteError (%d) after %d groups",
          err[0], R[0].done);
    CHECK(strstr(last_warn, "closed the connection") != NULL, "its WARN says the peer closed it: %s", last_warn);
    CHECK(warns == 1, "one WARN, for comm 0 alone (%d)", warns);
    for (int c = 1; c < C; c++) {
      CHECK(err[c] == 0 && R[c].done == opt.groups, "comm %d on the same link finished all %d groups (%d, error %d)", c,
            opt.groups, R[c].done, err[c]);
      CHECK(failed_at[0] > 0 && failed_at[0] < done_at[c], "comm 0 failed (%.2f s) before comm %d finished (%.2f s)",
            failed_at[0] - t0, c, done_at[c] - t0);
    }
    printf("receiver: comm 0 failed %.2f s after the start with the others going on: %s\n", failed_at[0] - t0, last_warn);
  } else if (opt.abort_after >= 0 && sender) {
    CHECK(err[0] == FERROCE_NCCL_REMOTE_ERROR, "comm 0, closed by the receiver, fails with ncclRemoteError (%d) after %d groups",
          err[0], S[0].done_g);
    CHECK(S[0].done_g == opt.abort_after, "comm 0: the %d groups the receiver took completed (%d)", opt.abort_after, S[0].done_g);
    CHECK(strstr(last_warn, "closed the connection") && strstr(last_warn, opt.want_warn), "its WARN says the peer closed it, and '%s': %s",
          opt.want_warn, last_warn);
    CHECK(warns == 1, "one WARN, for comm 0 alone (%d)", warns);
    for (int c = 1; c < C; c++)
      CHECK(err[c] == 0 && S[c].done_g == opt.groups, "comm %d finished all %d groups (%d, error %d)", c, opt.groups,
            S[c].done_g, err[c]);
    printf("sender: comm 0 failed %.2f s after the start: %s\n", failed_at[0] - t0, last_warn);
  } else {
    for (int c = 0; c < C; c++) {
      if (closed[c]) continue;
      CHECK(err[c] == 0, "%s comm %d finished without error (%d)", sender ? "sender" : "receiver", c, err[c]);
      CHECK((sender ? S[c].done_g : R[c].done) == opt.groups, "comm %d: all %d groups done in time", c, opt.groups);
    }
    CHECK(warns == 0, "no WARN on a clean run (%d, last: %s)", warns, last_warn);
  }
  /* Close (safe with requests in flight after an error). -R: the sender keeps comm 0, and
   * closes the others first (a file tells the receiver), so that its end of the link has read
   * nothing when the receiver's end closes: its next connect tries the link first. */
  char closed_file[4096];
  snprintf(closed_file, sizeof closed_file, "%s.closed", file);
  for (double until = now_s() + 30; opt.reconnect && !sender && access(closed_file, F_OK) != 0 && now_s() < until;)
    usleep(10000);
  for (int c = 0; c < C; c++) {
    if (closed[c] || (opt.reconnect && sender && c == 0)) continue;
    if (sender)
      CHECK(n_close_send(n, comms[c]) == 0, "closeSend");
    else
      CHECK(n_close_recv(n, comms[c]) == 0, "closeRecv");
  }
  if (opt.reconnect && sender) {
    FILE* f = fopen(closed_file, "w");
    CHECK(f != NULL, "create %s", closed_file);
    if (f) fclose(f);
  }
  if (opt.reconnect) second_round(n, sender, file, C);
  if (opt.reconnect && sender) CHECK(n_close_send(n, comms[0]) == 0, "closeSend of comm 0 after the second round");
  CHECK(count_fds() == fds0, "no fd left once the %d comm(s) closed: %d before, %d after", C, fds0, count_fds());
  check_eager();
  n_finalize(n);
  return summary();
}

/* Junk on the listen port (HTTP, NCCL's socket magic, a silent client) is rejected with a WARN
 * and the real peer still connects and moves data. */
static int run_garbage(net_t* n) {
  char handle[FERROCE_NET_HANDLE_MAXSIZE] = {0};
  void* lc = NULL;
  CHECK(n_listen(n, opt.dev, handle, &lc) == 0 && lc, "listen");
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  memcpy(&a.sin_port, handle + 12, 2);
  memcpy(&a.sin_addr, handle + 16, 4);
  int junk[3];
  const char* http = "GET / HTTP/1.1\r\nHost: ferroce\r\n\r\n";
  uint64_t magic[2] = {0x564ab9f2fc4b9d6cULL, 4};
  for (int i = 0; i < 3; i++) {
    junk[i] = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(connect(junk[i], (struct sockaddr*)&a, sizeof a) == 0, "junk connect: %s", strerror(errno));
  }
  CHECK(write(junk[0], http, strlen(http)) > 0, "write junk");
  CHECK(write(junk[1], magic, sizeof magic) > 0, "write NCCL magic");
  void* rc = NULL;
  void* sc = NULL;
  for (int i = 0; i < 200; i++) {
    CHECK(n_accept(n, lc, &rc) == 0 && rc == NULL, "accept with only junk connected");
    usleep(1000);
  }
  CHECK(warns >= 2, "junk is WARNed (%d WARNs)", warns);
  double end = now_s() + 30;
  while ((!sc || !rc) && now_s() < end) {
    if (!sc && n_connect(n, opt.dev, handle, &sc) != 0) break;
    if (!rc && n_accept(n, lc, &rc) != 0) break;
  }
  CHECK(sc && rc, "the real peer connects after the junk");
  for (int i = 0; i < 3; i++) close(junk[i]);
  n_close_listen(n, lc);
  if (sc && rc) {
    static recv_t R;
    static send_t S;
    R.n = S.n = n;
    R.rc = rc, S.sc = sc;
    opt.groups = 20;
    while ((R.done < opt.groups || S.done_g < opt.groups) && now_s() < end)
      if (recv_step(&R) < 0 || send_step(&S) < 0) break;
    CHECK(R.done == opt.groups && S.done_g == opt.groups, "data moves after the junk (%d/%d)", R.done, S.done_g);
    n_close_send(n, sc);
    n_close_recv(n, rc);
  }
  CHECK(n_finalize(n) == 0, "finalize");
  return summary();
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s <plugin.so> <6..12> local|recv|send|garbage [handle-file] [opts]\n", argv[0]);
    return 2;
  }
  const char* path = argv[1];
  int ver = atoi(argv[2]);
  const char* mode = argv[3];
  int argi = 4;
  const char* file = NULL;
  size_t large = 0;
  if (!strcmp(mode, "recv") || !strcmp(mode, "send")) {
    if (argc < 5) return 2;
    file = argv[argi++];
  } else if (!strcmp(mode, "large")) {
    if (argc < 5) return 2;
    large = strtoull(argv[argi++], NULL, 0);
    if (large == 0) return 2;
  }
  for (int i = argi; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "0";
    if (!strcmp(a, "-g")) opt.groups = atoi(v), i++;
    else if (!strcmp(a, "-b")) opt.big = strtoull(v, NULL, 0), i++;
    else if (!strcmp(a, "-s")) opt.seed = strtoull(v, NULL, 0), i++;
    else if (!strcmp(a, "-c")) opt.comms = atoi(v), i++;
    else if (!strcmp(a, "-w")) opt.window = atoi(v), i++;
    else if (!strcmp(a, "-k")) opt.kill_after = atoi(v), i++;
    else if (!strcmp(a, "-t")) opt.limit = atof(v), i++;
    else if (!strcmp(a, "-f")) opt.fuse = atoi(v), i++;
    else if (!strcmp(a, "-D")) opt.no_dmabuf = 1;
    else if (!strcmp(a, "-H")) opt.hint = 1;
    else if (!strcmp(a, "-n")) opt.dev_name = v, i++;
    else if (!strcmp(a, "-e")) opt.expect_error = 1;
    else if (!strcmp(a, "-S")) opt.small = strtoull(v, NULL, 0), i++;
    else if (!strcmp(a, "-1")) opt.singles = 1;
    else if (!strcmp(a, "-E")) opt.expect_eager = atol(v), i++;
    else if (!strcmp(a, "-X")) opt.close_after = atoi(v), i++;
    else if (!strcmp(a, "-A")) opt.abort_after = atoi(v), i++;
    else if (!strcmp(a, "-W")) opt.want_warn = v, i++;
    else if (!strcmp(a, "-a")) opt.abort_wait_ms = atoi(v), i++;
    else if (!strcmp(a, "-L")) opt.shared_link = 1;
    else if (!strcmp(a, "-R")) opt.reconnect = 1;
    else if (!strcmp(a, "-P")) opt.nccl_pattern = opt.hint = opt.singles = 1;
    else {
      fprintf(stderr, "unknown option %s\n", a);
      return 2;
    }
  }
  if (opt.window > MAXW) opt.window = MAXW;
  if (ver < 6 || ver > 12) return 2;
  net_t n = load(path, ver);
  if (!strcmp(mode, "local")) return run_local(&n);
  if (!strcmp(mode, "garbage")) return run_garbage(&n);
  if (!strcmp(mode, "large")) return run_large(&n, large);
  if (!strcmp(mode, "recv")) return run_remote(&n, 0, file);
  if (!strcmp(mode, "send")) return run_remote(&n, 1, file);
  fprintf(stderr, "unknown mode %s\n", mode);
  return 2;
}
