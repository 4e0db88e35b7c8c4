/* ferroce benchmark harness: the part shared by all_reduce_perf, sendrecv_perf and scale_bench.
 *
 * It drives a net plugin the way NCCL's proxy does (shared/spec/nccl-net-abi.md §7):
 *   - a launcher forks N ranks (processes); with softroce each gets SOFTROCE_ADDR=<base>.<rank+1>;
 *   - the ranks rendezvous through the launcher (one Unix socketpair per rank; allgather/barrier);
 *   - each rank dlopens the plugin (RTLD_NOW|RTLD_LOCAL), takes the newest ncclNetPlugin_vN table
 *     (v12 first, down to v6), calls init with a logger that prints WARNs;
 *   - it connects a ring (C comms per neighbour, "channels"): listen -> allgather handles ->
 *     connect/accept called alternately, never blocking, until both comms exist -> closeListen;
 *   - buffers are registered (regMr, NCCL_PTR_HOST) and moved with isend/irecv/test, several
 *     requests in flight per comm (NCCL_STEPS deep, like NCCL's SIMPLE protocol).
 *
 * Everything here is plain C (no GPU). All errors are fatal for the rank: it prints the reason
 * and exits non-zero; the launcher then stops the other ranks.
 */
#ifndef FERROCE_HARNESS_COMMON_H
#define FERROCE_HARNESS_COMMON_H

#include <stddef.h>
#include <stdint.h>

#define H_HANDLE_SIZE 128
#define H_MAX_CHANNELS 32
#define H_MAX_STEPS 32
#define H_MAX_GROUP 8                           /* buffers in one grouped irecv (maxRecvs) */
#define H_MAX_INFLIGHT (H_MAX_STEPS * H_MAX_GROUP) /* requests one stream can have in flight */

/* ---- the plugin, as one version-independent table (v12 signatures, sizes as size_t) ---- */
typedef struct {
  char name[64];
  int ptr_support;
  int speed;
  int max_recvs;
  int max_comms;
} hnet_props_t;

typedef struct {
  int version; /* the N of the ncclNetPlugin_vN table in use */
  const char* name;
  void* ctx; /* v11+: the context init returned */
  int (*init)(void** ctx);
  int (*devices)(int* ndev);
  int (*get_props)(int dev, hnet_props_t* p);
  int (*listen)(void* ctx, int dev, void* handle, void** listen_comm);
  int (*connect)(void* ctx, int dev, void* handle, void** send_comm);
  int (*accept)(void* listen_comm, void** recv_comm);
  int (*reg_mr)(void* comm, void* data, size_t size, int type, void** mhandle);
  int (*dereg_mr)(void* comm, void* mhandle);
  int (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle, void** request);
  int (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** request);
  int (*test)(void* request, int* done, int* sizes);
  int (*close_send)(void* send_comm);
  int (*close_recv)(void* recv_comm);
  int (*close_listen)(void* listen_comm);
  int (*finalize)(void* ctx);
} hnet_t;

/* ---- options (nccl-tests flags plus the harness's own) ---- */
typedef struct {
  size_t min_bytes, max_bytes; /* -b -e */
  size_t step_bytes;           /* -i (used when -f is 1) */
  double step_factor;          /* -f */
  int iters, warmup;           /* -n -w */
  int check;                   /* -c */
  int nranks;                  /* -g / -N / --ranks */
  int nchannels;               /* -C */
  int average;                 /* -a 0 rank0, 1 avg, 2 min, 3 max */
  int inplace;                 /* --inplace 0|1 (nccl-tests prints both) */
  size_t chunk_bytes;          /* --chunk: one pipeline step (NCCL: BUFFSIZE/NCCL_STEPS = 512 KiB) */
  int steps;                   /* --steps: steps in flight per comm (NCCL_STEPS = 8) */
  int pingpong;                /* sendrecv_perf -P: rank 0 <-> 1 ping-pong, time = RTT/2 */
  int oneway;                  /* sendrecv_perf -O: only rank 0 sends, to rank 1 */
  int group;                   /* sendrecv_perf --group G: irecv of G buffers at once */
  int direct;                  /* all_reduce_perf --direct: reduce steps receive into the output */
  int compute;                 /* all_reduce_perf --compute 0: skip the CPU reduction (diagnosis) */
  int chunk_steps;             /* all_reduce_perf --chunksteps: steps per ring chunk (ALLREDUCE_CHUNKSTEPS 4) */
  int slice_steps;             /* all_reduce_perf --slicesteps: steps per message (ALLREDUCE_SLICESTEPS 2) */
  int net_version;             /* --net-version N: use ncclNetPlugin_vN (default newest) */
  int dev;                     /* --dev: plugin device index */
  int vdev;                    /* --vdev K: fuse devices dev..dev+K-1 with makeVDevice (0: off) */
  int softroce;                /* -1 auto (LD_LIBRARY_PATH), 0 no, 1 yes */
  char addr_base[32];          /* --addr-base 127.0.50 */
  int timeout_s;               /* --timeout: the launcher kills the ranks after this long */
  const char* plugin;          /* --plugin PATH */
  const char* csv;             /* --csv FILE */
  const char* json;            /* --json FILE */
  int conns;                   /* scale_bench --conns: connections between the two ranks */
  int cycles;                  /* scale_bench --cycles N: then N connect/close cycles of one pair */
  int stats;                   /* --stats: CPU and plugin-call time of the largest size, verbs work of each */
  int quiet_log;               /* only WARNs from the plugin (default), 0 = INFO too */
} hopts_t;

/* ---- per-rank state ---- */
typedef struct hchan hchan_t;

typedef struct {
  int rank, nranks;
  int fd; /* socketpair to the launcher */
  hopts_t* o;
  hnet_t net;
  int dev;
  int max_recvs; /* the device's maxRecvs property */
  int nch;
  hchan_t* ch[H_MAX_CHANNELS];
  const char* test_name;
} hctx_t;

/* One ring channel: a sendComm to rank+1 and a recvComm from rank-1, with the engine state. */
struct hchan {
  void* send_comm;
  void* recv_comm;
  /* receive slots (NCCL's SIMPLE buffer): steps * chunk bytes, registered on recv_comm */
  char* slots;
  void* slots_mh;
  size_t slot_bytes;
};

/* ---- program entry: parse flags, fork the ranks, run `body` in each, collect the results ---- */
typedef int (*hbody_t)(hctx_t* h);
int h_main(int argc, char** argv, const char* test_name, hbody_t body, const char* extra_usage);

/* Parses the shared flags; unknown flags are an error. */
void h_parse(hopts_t* o, int argc, char** argv, const char* test_name, const char* extra_usage);

/* ---- rendezvous through the launcher ---- */
void h_allgather(hctx_t* h, const void* mine, size_t len, void* all);
void h_barrier(hctx_t* h);
double h_allreduce_double(hctx_t* h, double v, int how); /* how: 0 rank0, 1 avg, 2 min, 3 max, 4 sum */

/* ---- plugin ---- */
void h_net_open(hctx_t* h);  /* dlopen, dlsym, init, devices, properties */
void h_net_close(hctx_t* h); /* finalize (v11+) */
void h_ring_connect(hctx_t* h, size_t slot_bytes); /* C channels to rank+1 / from rank-1 */
void h_ring_close(hctx_t* h);
void* h_reg(hctx_t* h, void* comm, void* data, size_t size);
void h_dereg(hctx_t* h, void* comm, void* mh);

/* Non-blocking connect/accept loop for one pair of (handle, listen comm): returns when both
 * comms exist; dies after `deadline_s`. Either of handle/listen_comm may be NULL. */
void h_connect_accept(hctx_t* h, void* handle, void** send_comm, void* listen_comm, void** recv_comm, double deadline_s);
/* The same for n pairs at once: handles[n*128] (NULL: no connects), listen comms lcs[n] (NULL: no
 * accepts; each is closed and set to NULL once accepted), results in scs[n] / rcs[n]. */
void h_connect_pairs(hctx_t* h, int n, char* handles, void** scs, void** lcs, void** rcs, double deadline_s);

/* ---- transfers ----
 * One "message" of a channel's send or receive stream. The engine posts them in order, keeps up to
 * o->steps in flight per comm, and calls back when a receive completed (to reduce/copy) or decides
 * when a send may go (its data ready). */
typedef struct {
  size_t off;   /* element offset of the chunk in the user buffers */
  size_t bytes; /* message size */
  int op;       /* allreduce step kind (see all_reduce_perf.c) */
} hmsg_t;

/* One ordered stream of isends or irecvs on one comm, at most `depth` requests in flight.
 * post_* return 1 when the request was posted, 0 when it must be retried later (full, or the
 * plugin returned a NULL request as NCCL allows). poll tests the oldest request only, as NCCL's
 * proxy does, and returns 1 when it completed (its size checked against the expected one). */
typedef struct {
  void* comm;
  int is_send;
  int tag;
  int depth;
  long posted, done;
  void* req[H_MAX_INFLIGHT];
  size_t expect[H_MAX_INFLIGHT][H_MAX_GROUP];
  int n[H_MAX_INFLIGHT]; /* buffers of a (grouped) receive */
} hq_t;
void hq_init(hq_t* q, void* comm, int is_send, int tag, int depth);
int hq_post_send(hctx_t* h, hq_t* q, void* data, size_t bytes, void* mh);
int hq_post_recv(hctx_t* h, hq_t* q, void* data, size_t capacity, size_t expect, void* mh);
/* A grouped receive of n buffers (NCCL groups sub-receives on one recvComm up to maxRecvs);
 * it completes as one request with n sizes. */
int hq_post_recvn(hctx_t* h, hq_t* q, int n, void** data, size_t* capacity, size_t* expect, void** mh);
int hq_poll(hctx_t* h, hq_t* q);
static inline int hq_full(const hq_t* q) { return q->posted - q->done >= q->depth; }
static inline long hq_inflight(const hq_t* q) { return q->posted - q->done; }

double h_now(void);
void* h_alloc(size_t bytes); /* page-aligned, zeroed, dies on failure */
_Noreturn void h_die(hctx_t* h, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void h_test_req(hctx_t* h, void* req, int* done, int* size, const char* what);

/* ---- where the time goes ---- */
typedef struct {
  double isend_s, irecv_s, test_s; /* wall time inside the plugin calls */
  double compute_s;                 /* wall time in the CPU reduction (all_reduce_perf) */
  long isend_calls, irecv_calls, tests, sends, recvs;
  double bytes_sent;
  double cpu_main0, cpu_other0, cpu_process0, wall0;
} hstats_t;
extern hstats_t h_stats;
void h_stats_begin(hctx_t* h);
void h_stats_report(hctx_t* h, const char* what); /* collective; rank 0 prints */
/* --stats: the verbs work of each size's timed iterations per message (softroce's counters and
 * the plugin's statistics, see common.c); steps > 0 also prints it per collective step. */
void h_work_begin(hctx_t* h);
void h_work_report(hctx_t* h, size_t bytes, double steps); /* collective; rank 0 prints */

/* ---- results ---- */
typedef struct {
  size_t bytes, count;
  double time_us[2], algbw[2], busbw[2]; /* [0] out-of-place, [1] in-place */
  long wrong[2];
} hrow_t;

typedef struct {
  const char* type;
  const char* redop;
  int root;
  double bus_factor; /* busbw = algbw * factor */
  size_t elem_size;
} hcoll_t;

void h_print_header(hctx_t* h, const hcoll_t* c);
void h_print_row(hctx_t* h, const hcoll_t* c, const hrow_t* r);
int h_print_footer(hctx_t* h, hrow_t* rows, int nrows); /* returns 1 when a result was wrong */
void h_write_outputs(hctx_t* h, const hcoll_t* c, hrow_t* rows, int nrows);

/* The value rank r puts at element i: small integers, so float sums over ranks are exact, and a
 * hash of i, so data landing at the wrong offset is seen. */
static inline float h_pattern(int r, size_t i) {
  uint32_t x = (uint32_t)i * 2654435761u + (uint32_t)r * 40503u + 0x9e3779b9u;
  x ^= x >> 15;
  x *= 0x2c1b3c6du;
  x ^= x >> 12;
  return (float)((int)(x & 63) - 32);
}

/* "ring", "pingpong" or "oneway" */
const char* h_mode(const hopts_t* o);
void h_softroce_addrs(const hopts_t* o, int r, char* out, size_t len);

/* When a polling loop made no progress: let softroce's threads run (this host may have few cores). */
void h_idle(hctx_t* h);

/* size sweep helper: next size after `s` per -f / -i */
size_t h_next_size(const hopts_t* o, size_t s);

/* The plugin path h_main resolves (--plugin, NCCL_NET_PLUGIN, next to the harness), for programs
 * with their own launcher. */
void h_resolve_plugin(hopts_t* o);
/* The context whose rank names the plugin's WARN/INFO lines (h_main sets it), for the same. */
void h_log_as(hctx_t* h);

#endif
