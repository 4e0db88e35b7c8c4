/* ferroce benchmark harness: launcher, rendezvous, plugin loading, ring setup, table output.
 * See common.h for the contract. */
#define _GNU_SOURCE
#include "common.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <ferroce/ferroce_abi.h>
#include <ferroce/nccl_net.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <softroce_counters.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* small utilities                                                                            */
/* ------------------------------------------------------------------------------------------ */

static hctx_t* g_h; /* the rank's context, for the logger */
/* Whole-run totals of this rank (never reset), printed at h_net_close when FERROCE_STATS is
 * set, so tests can compare them with the plugin's statistics file. */
static long h_run_sends, h_run_recvs;
static double h_run_bytes_sent;

double h_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void h_die(hctx_t* h, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fflush(stdout);
  if (h)
    fprintf(stderr, "[rank %d] %s: error: ", h->rank, h->test_name);
  else
    fprintf(stderr, "harness: error: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fflush(stderr);
  _exit(1);
}

void* h_alloc(size_t bytes) {
  void* p = NULL;
  if (bytes == 0) bytes = 1;
  size_t rounded = (bytes + 4095) & ~(size_t)4095;
  if (posix_memalign(&p, 4096, rounded) != 0 || !p) h_die(g_h, "cannot allocate %zu bytes", bytes);
  memset(p, 0, rounded);
  return p;
}

static size_t parse_size(const char* s) {
  char* end;
  double v = strtod(s, &end);
  if (end == s || v < 0) h_die(NULL, "bad size '%s'", s);
  switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    case 0: break;
    default: h_die(NULL, "bad size suffix in '%s'", s);
  }
  return (size_t)v;
}

/* ------------------------------------------------------------------------------------------ */
/* options                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static void usage(const char* test_name, const char* extra, int rc) {
  fprintf(rc ? stderr : stdout,
          "usage: %s [options]\n"
          "  -b, --minbytes SIZE      smallest message (default 32M; K/M/G suffixes)\n"
          "  -e, --maxbytes SIZE      largest message (default 32M)\n"
          "  -f, --stepfactor F       multiply the size by F between rows (default 1: use -i)\n"
          "  -i, --stepbytes SIZE     add SIZE between rows when -f is 1 (default 1M)\n"
          "  -n, --iters N            timed iterations per size (default 20)\n"
          "  -w, --warmup_iters N     untimed iterations per size (default 1)\n"
          "  -c, --check N            checked iterations per size, 0 = none (default 1)\n"
          "  -g, -N, --ranks N        number of ranks (processes, default 2)\n"
          "  -C, --channels N         comms per ring neighbour (default 1, at most %d)\n"
          "  -a, --average 0..3       time across ranks: 0 rank 0, 1 average, 2 min, 3 max (default 1)\n"
          "      --inplace 0|1        also run in place, as nccl-tests does (default 0)\n"
          "      --chunk SIZE         bytes per pipeline step / message (default 512K)\n"
          "      --steps N            steps in flight per comm (default 8 = NCCL_STEPS)\n"
          "      --plugin PATH        plugin library (default: NCCL_NET_PLUGIN, else\n"
          "                           <harness dir>/../libnccl-net-ferroce.so)\n"
          "      --net-version N      use ncclNetPlugin_vN (default: newest exported, v12..v6)\n"
          "      --dev N              plugin device (default 0)\n"
          "      --vdev K             each rank runs over a fused device (makeVDevice, v9+) of K members:\n"
          "                           plugin devices dev..dev+K-1; over softroce each rank gets K\n"
          "                           softroce devices on addresses of its own (printed at start)\n"
          "      --softroce 0|1       give each rank SOFTROCE_ADDR=<addr-base>.<rank+1> (default:\n"
          "                           when the libibverbs.so.1 first on LD_LIBRARY_PATH is softroce's)\n"
          "      --addr-base A.B.C    loopback prefix for softroce ranks (default 127.0.50)\n"
          "      --timeout SEC        stop every rank after SEC seconds (default 600)\n"
          "      --csv FILE           also write the rows as CSV\n"
          "      --json FILE          also write the rows as JSON\n"
          "      --stats              after the table: CPU time of each rank's threads and time inside\n"
          "                           isend/irecv/test during the timed iterations of the largest size;\n"
          "                           for every size, #work lines: verbs work per message (softroce's\n"
          "                           counters; the plugin's, with FERROCE_STATS set: posts, signaled\n"
          "                           completions, CTS writes per side)\n"
          "%s"
          "Environment: NCCL_DEBUG=INFO prints the plugin's INFO lines (WARNs are always printed).\n",
          test_name, H_MAX_CHANNELS, extra ? extra : "");
  exit(rc);
}

/* Is the first libibverbs.so.1 on LD_LIBRARY_PATH softroce's? */
static int softroce_on_path(void) {
  const char* lp = getenv("LD_LIBRARY_PATH");
  if (!lp) return 0;
  char* dup = strdup(lp);
  int found = 0;
  for (char* save = NULL, *d = strtok_r(dup, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/libibverbs.so.1", d);
    if (access(path, R_OK) == 0) {
      found = strstr(d, "softroce") != NULL;
      break;
    }
  }
  free(dup);
  return found;
}

void h_parse(hopts_t* o, int argc, char** argv, const char* test_name, const char* extra_usage) {
  memset(o, 0, sizeof *o);
  o->min_bytes = o->max_bytes = 32 << 20;
  o->step_bytes = 1 << 20;
  o->step_factor = 1;
  o->iters = 20;
  o->warmup = 1;
  o->check = 1;
  o->nranks = 2;
  o->nchannels = 1;
  o->average = 1;
  o->inplace = 0;
  o->chunk_bytes = 512 << 10;
  o->steps = 8;
  o->net_version = 0;
  o->softroce = -1;
  snprintf(o->addr_base, sizeof o->addr_base, "127.0.50");
  o->timeout_s = 600;
  o->quiet_log = 1;
  o->conns = 1024;
  o->group = 1;
  o->direct = 1;
  o->compute = 1;
  o->chunk_steps = 4;
  o->slice_steps = 2;
  const char* dbg = getenv("NCCL_DEBUG");
  if (dbg && (strcasecmp(dbg, "INFO") == 0 || strcasecmp(dbg, "TRACE") == 0)) o->quiet_log = 0;

  enum { O_INPLACE = 1000, O_CHUNK, O_STEPS, O_PLUGIN, O_NETV, O_DEV, O_SOFTROCE, O_ADDR, O_TIMEOUT, O_CSV, O_JSON, O_CONNS, O_STATS, O_GROUP, O_DIRECT, O_COMPUTE, O_CHUNKSTEPS, O_SLICESTEPS, O_VDEV, O_CYCLES };
  static const struct option longs[] = {
      {"minbytes", required_argument, 0, 'b'}, {"maxbytes", required_argument, 0, 'e'},
      {"stepfactor", required_argument, 0, 'f'}, {"stepbytes", required_argument, 0, 'i'},
      {"iters", required_argument, 0, 'n'}, {"warmup_iters", required_argument, 0, 'w'},
      {"check", required_argument, 0, 'c'}, {"ranks", required_argument, 0, 'N'},
      {"ngpus", required_argument, 0, 'g'}, {"channels", required_argument, 0, 'C'},
      {"average", required_argument, 0, 'a'}, {"pingpong", no_argument, 0, 'P'}, {"oneway", no_argument, 0, 'O'},
      {"inplace", required_argument, 0, O_INPLACE}, {"chunk", required_argument, 0, O_CHUNK},
      {"steps", required_argument, 0, O_STEPS}, {"plugin", required_argument, 0, O_PLUGIN},
      {"net-version", required_argument, 0, O_NETV}, {"dev", required_argument, 0, O_DEV}, {"vdev", required_argument, 0, O_VDEV},
      {"softroce", required_argument, 0, O_SOFTROCE}, {"addr-base", required_argument, 0, O_ADDR},
      {"timeout", required_argument, 0, O_TIMEOUT}, {"csv", required_argument, 0, O_CSV},
      {"json", required_argument, 0, O_JSON}, {"conns", required_argument, 0, O_CONNS}, {"cycles", required_argument, 0, O_CYCLES}, {"stats", no_argument, 0, O_STATS}, {"group", required_argument, 0, O_GROUP}, {"direct", required_argument, 0, O_DIRECT}, {"compute", required_argument, 0, O_COMPUTE}, {"chunksteps", required_argument, 0, O_CHUNKSTEPS}, {"slicesteps", required_argument, 0, O_SLICESTEPS}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "b:e:f:i:n:w:c:N:g:C:a:POh", longs, NULL)) != -1) {
    switch (c) {
      case 'b': o->min_bytes = parse_size(optarg); break;
      case 'e': o->max_bytes = parse_size(optarg); break;
      case 'f': o->step_factor = atof(optarg); break;
      case 'i': o->step_bytes = parse_size(optarg); break;
      case 'n': o->iters = atoi(optarg); break;
      case 'w': o->warmup = atoi(optarg); break;
      case 'c': o->check = atoi(optarg); break;
      case 'N': case 'g': o->nranks = atoi(optarg); break;
      case 'C': o->nchannels = atoi(optarg); break;
      case 'a': o->average = atoi(optarg); break;
      case 'P': o->pingpong = 1; break;
      case 'O': o->oneway = 1; break;
      case O_INPLACE: o->inplace = atoi(optarg); break;
      case O_CHUNK: o->chunk_bytes = parse_size(optarg); break;
      case O_STEPS: o->steps = atoi(optarg); break;
      case O_PLUGIN: o->plugin = optarg; break;
      case O_NETV: o->net_version = atoi(optarg); break;
      case O_DEV: o->dev = atoi(optarg); break;
      case O_VDEV: o->vdev = atoi(optarg); break;
      case O_SOFTROCE: o->softroce = atoi(optarg); break;
      case O_ADDR: snprintf(o->addr_base, sizeof o->addr_base, "%s", optarg); break;
      case O_TIMEOUT: o->timeout_s = atoi(optarg); break;
      case O_CSV: o->csv = optarg; break;
      case O_JSON: o->json = optarg; break;
      case O_CONNS: o->conns = atoi(optarg); break;
      case O_CYCLES: o->cycles = atoi(optarg); break;
      case O_STATS: o->stats = 1; break;
      case O_GROUP: o->group = atoi(optarg); break;
      case O_DIRECT: o->direct = atoi(optarg); break;
      case O_COMPUTE: o->compute = atoi(optarg); break;
      case O_CHUNKSTEPS: o->chunk_steps = atoi(optarg); break;
      case O_SLICESTEPS: o->slice_steps = atoi(optarg); break;
      case 'h': usage(test_name, extra_usage, 0); break;
      default: usage(test_name, extra_usage, 2);
    }
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s'\n", test_name, argv[optind]);
    usage(test_name, extra_usage, 2);
  }
  if (o->max_bytes < o->min_bytes) o->max_bytes = o->min_bytes;
  if (o->nranks < 2 || o->nranks > 250) h_die(NULL, "-g/-N: 2..250 ranks");
  if (o->nchannels < 1 || o->nchannels > H_MAX_CHANNELS) h_die(NULL, "-C: 1..%d channels", H_MAX_CHANNELS);
  if (o->steps < 1 || o->steps > H_MAX_STEPS) h_die(NULL, "--steps: 1..%d", H_MAX_STEPS);
  if (o->group < 1 || o->group > H_MAX_GROUP) h_die(NULL, "--group: 1..%d", H_MAX_GROUP);
  if (o->slice_steps < 1 || o->chunk_steps < o->slice_steps || o->chunk_steps % o->slice_steps || o->slice_steps > o->steps)
    h_die(NULL, "--chunksteps must be a multiple of --slicesteps, and --slicesteps 1..--steps");
  if (o->chunk_bytes < 16 || o->chunk_bytes > (1u << 30)) h_die(NULL, "--chunk: 16 bytes..1 GiB");
  o->chunk_bytes &= ~(size_t)15;
  if (o->iters < 1 || o->warmup < 0 || o->check < 0) h_die(NULL, "-n >= 1, -w >= 0, -c >= 0");
  if (o->step_factor < 1) h_die(NULL, "-f must be >= 1");
  if (o->step_factor == 1 && o->step_bytes == 0) h_die(NULL, "-i must be > 0 with -f 1");
  if (o->average < 0 || o->average > 3) h_die(NULL, "-a: 0..3");
  if (o->net_version && (o->net_version < 6 || o->net_version > 12)) h_die(NULL, "--net-version: 6..12");
  if (o->softroce < 0) o->softroce = softroce_on_path();
  if (o->vdev < 0 || o->vdev == 1 || o->vdev > FERROCE_NET_MAX_DEVS_PER_NIC_V9)
    h_die(NULL, "--vdev K: 2..%d members (0: no fusion)", FERROCE_NET_MAX_DEVS_PER_NIC_V9);
  if (o->vdev && o->net_version && o->net_version < 9) h_die(NULL, "--vdev needs ncclNetPlugin_v9 or newer (makeVDevice)");
  if (o->vdev && o->softroce && o->nranks * o->vdev > 254)
    h_die(NULL, "--vdev %d with %d ranks: more softroce addresses than %s.1..254 holds", o->vdev, o->nranks, o->addr_base);
  if ((o->pingpong || o->oneway) && o->nranks != 2) h_die(NULL, "-P (ping-pong) and -O (one way) need exactly 2 ranks");
  if (o->pingpong && o->oneway) h_die(NULL, "-P and -O exclude each other");
}

const char* h_mode(const hopts_t* o) { return o->pingpong ? "pingpong" : o->oneway ? "oneway" : "ring"; }

size_t h_next_size(const hopts_t* o, size_t s) {
  if (o->step_factor > 1) {
    size_t n = (size_t)(s * o->step_factor);
    return n > s ? n : s + 1;
  }
  return s + o->step_bytes;
}

/* ------------------------------------------------------------------------------------------ */
/* launcher and rendezvous                                                                    */
/* ------------------------------------------------------------------------------------------ */

static int write_all(int fd, const void* p, size_t n) {
  const char* c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    c += w, n -= (size_t)w;
  }
  return 0;
}
static int read_all(int fd, void* p, size_t n) {
  char* c = p;
  while (n) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    c += r, n -= (size_t)r;
  }
  return 0;
}

/* Every rank sends (u64 len, bytes); the launcher answers each with all ranks' bytes in rank order. */
void h_allgather(hctx_t* h, const void* mine, size_t len, void* all) {
  uint64_t l = len;
  if (write_all(h->fd, &l, sizeof l) || write_all(h->fd, mine, len) || read_all(h->fd, all, len * (size_t)h->nranks))
    h_die(h, "rendezvous with the launcher failed (another rank died?)");
}

void h_barrier(hctx_t* h) {
  char me = 1, all[256];
  h_allgather(h, &me, 1, all);
}

double h_allreduce_double(hctx_t* h, double v, int how) {
  double all[256];
  h_allgather(h, &v, sizeof v, all);
  double r = all[0];
  if (how == 0) return r;
  double sum = 0, mn = all[0], mx = all[0];
  for (int i = 0; i < h->nranks; i++) {
    sum += all[i];
    mn = all[i] < mn ? all[i] : mn;
    mx = all[i] > mx ? all[i] : mx;
  }
  switch (how) {
    case 1: return sum / h->nranks;
    case 2: return mn;
    case 3: return mx;
    default: return sum;
  }
}

static pid_t g_pids[256];
static int g_nkids;
static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { g_stop = sig; }

static void kill_ranks(int sig) {
  for (int i = 0; i < g_nkids; i++)
    if (g_pids[i] > 0) kill(g_pids[i], sig);
}

/* The launcher: serves allgathers until every rank has closed its socket, then reaps them. */
static int launcher(hopts_t* o, int* fds, const char* test_name) {
  int n = o->nranks;
  int open_fds = n;
  char** bufs = calloc((size_t)n, sizeof *bufs);
  uint64_t* lens = calloc((size_t)n, sizeof *lens);
  int* have = calloc((size_t)n, sizeof *have);
  int* status = calloc((size_t)n, sizeof *status);
  int* reaped = calloc((size_t)n, sizeof *reaped);
  int* reported = calloc((size_t)n, sizeof *reported);
  int failed = 0;
  double grace = 0; /* set when a rank failed: when to stop the others */
  double deadline = h_now() + o->timeout_s;
  struct pollfd* pfd = calloc((size_t)n, sizeof *pfd);
  while (open_fds > 0 && !g_stop) {
    for (int i = 0; i < n; i++) pfd[i].fd = fds[i], pfd[i].events = POLLIN, pfd[i].revents = 0;
    int rc = poll(pfd, (nfds_t)n, 200);
    if (rc < 0 && errno != EINTR) break;
    if (h_now() > deadline) {
      fprintf(stderr, "%s: timeout after %d s: stopping all ranks\n", test_name, o->timeout_s);
      failed = 1;
      break;
    }
    /* A rank that exited with an error: the others get a few seconds to finish what does not
     * need it (printing their results), then they are stopped. */
    for (int i = 0; i < n; i++) {
      if (reaped[i]) continue;
      int st;
      if (waitpid(g_pids[i], &st, WNOHANG) == g_pids[i]) {
        reaped[i] = 1, status[i] = st;
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
          fprintf(stderr, "%s: rank %d %s %d\n", test_name, i, WIFSIGNALED(st) ? "killed by signal" : "exited with",
                  WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
          reported[i] = 1;
          if (grace == 0) grace = h_now() + 3;
        }
      }
    }
    if (grace && h_now() > grace) {
      fprintf(stderr, "%s: stopping the other ranks\n", test_name);
      failed = 1;
      break;
    }
    if (rc <= 0) continue;
    for (int i = 0; i < n; i++) {
      if (fds[i] < 0 || !(pfd[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      uint64_t l;
      ssize_t r = read(fds[i], &l, sizeof l);
      if (r > 0 && r < (ssize_t)sizeof l && read_all(fds[i], (char*)&l + r, sizeof l - (size_t)r) == 0) r = sizeof l;
      if (r == 0) { /* rank done */
        close(fds[i]);
        fds[i] = -1;
        open_fds--;
        continue;
      }
      if (r != (ssize_t)sizeof l || have[i] || l > (64u << 20)) {
        fprintf(stderr, "%s: bad rendezvous message from rank %d\n", test_name, i);
        failed = 1;
        break;
      }
      bufs[i] = malloc(l ? l : 1);
      if (read_all(fds[i], bufs[i], l)) {
        failed = 1;
        break;
      }
      lens[i] = l, have[i] = 1;
    }
    if (failed) break;
    int all = 1;
    for (int i = 0; i < n; i++) all &= have[i];
    if (all) {
      for (int i = 1; i < n; i++)
        if (lens[i] != lens[0]) {
          fprintf(stderr, "%s: ranks disagree on a rendezvous size (%llu vs %llu)\n", test_name,
                  (unsigned long long)lens[i], (unsigned long long)lens[0]);
          failed = 1;
        }
      if (failed) break;
      for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
          if (fds[i] >= 0 && write_all(fds[i], bufs[j], lens[j])) failed = 1;
      for (int i = 0; i < n; i++) free(bufs[i]), bufs[i] = NULL, have[i] = 0;
      if (failed) break;
    } else {
      /* a rank that closed while others wait for it cannot complete the round */
      for (int i = 0; i < n; i++)
        if (fds[i] < 0 && !have[i]) {
          int someone_waits = 0;
          for (int j = 0; j < n; j++) someone_waits |= have[j];
          if (someone_waits) {
            fprintf(stderr, "%s: rank %d left while others wait in a rendezvous\n", test_name, i);
            failed = 1;
          }
          break;
        }
      if (failed) break;
    }
  }
  if (g_stop) {
    fprintf(stderr, "%s: interrupted (signal %d): stopping all ranks\n", test_name, (int)g_stop);
    failed = 1;
  }
  if (failed) {
    kill_ranks(SIGTERM);
    double t = h_now() + 2;
    while (h_now() < t) {
      int alive = 0;
      for (int i = 0; i < n; i++)
        if (!reaped[i]) {
          int st;
          if (waitpid(g_pids[i], &st, WNOHANG) == g_pids[i])
            reaped[i] = 1, status[i] = st;
          else
            alive = 1;
        }
      if (!alive) break;
      usleep(20000);
    }
    kill_ranks(SIGKILL);
  }
  int rc = failed;
  for (int i = 0; i < n; i++) {
    if (!reaped[i]) {
      /* closed its socket: it is exiting; give it the rest of the deadline */
      int st = 0;
      while (waitpid(g_pids[i], &st, WNOHANG) == 0) {
        if (h_now() > deadline) {
          fprintf(stderr, "%s: rank %d does not exit: killing it\n", test_name, i);
          kill(g_pids[i], SIGKILL);
          waitpid(g_pids[i], &st, 0);
          rc = 1;
          break;
        }
        usleep(10000);
      }
      status[i] = st;
    }
    if (!(WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0)) {
      if (!failed && !reported[i])
        fprintf(stderr, "%s: rank %d %s %d\n", test_name, i, WIFSIGNALED(status[i]) ? "killed by signal" : "exited with",
                WIFSIGNALED(status[i]) ? WTERMSIG(status[i]) : WEXITSTATUS(status[i]));
      rc = 1;
    }
  }
  for (int i = 0; i < n; i++)
    if (fds[i] >= 0) close(fds[i]);
  return rc;
}

static char g_plugin_path[PATH_MAX + 64];

static void resolve_plugin(hopts_t* o) {
  if (o->plugin) {
    snprintf(g_plugin_path, sizeof g_plugin_path, "%s", o->plugin);
  } else if (getenv("NCCL_NET_PLUGIN") && *getenv("NCCL_NET_PLUGIN")) {
    const char* p = getenv("NCCL_NET_PLUGIN");
    /* NCCL: a name gives libnccl-net-<name>.so; a path or a file name is used as is */
    if (strchr(p, '/') || strstr(p, ".so"))
      snprintf(g_plugin_path, sizeof g_plugin_path, "%s", p);
    else
      snprintf(g_plugin_path, sizeof g_plugin_path, "libnccl-net-%s.so", p);
  } else {
    char exe[PATH_MAX - 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) h_die(NULL, "cannot find the harness's directory; use --plugin");
    exe[n] = 0;
    char* slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(g_plugin_path, sizeof g_plugin_path, "%s/../libnccl-net-ferroce.so", exe);
    char* real = realpath(g_plugin_path, NULL);
    if (real) {
      snprintf(g_plugin_path, sizeof g_plugin_path, "%s", real);
      free(real);
    }
  }
  o->plugin = g_plugin_path;
}

int h_main(int argc, char** argv, const char* test_name, hbody_t body, const char* extra_usage) {
  static hopts_t o;
  h_parse(&o, argc, argv, test_name, extra_usage);
  resolve_plugin(&o);
  setvbuf(stdout, NULL, _IOLBF, 0);

  /* many comms need many descriptors (scale_bench) */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }

  int fds[256];
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  fflush(stdout);
  fflush(stderr);
  pid_t launcher_pid = getpid();
  for (int r = 0; r < o.nranks; r++) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) h_die(NULL, "socketpair: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) h_die(NULL, "fork: %s", strerror(errno));
    if (pid == 0) {
      /* the rank */
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher_pid) _exit(1);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      signal(SIGHUP, SIG_DFL);
      for (int i = 0; i < r; i++) close(fds[i]);
      close(sv[0]);
      if (o.softroce) {
        char addr[512];
        h_softroce_addrs(&o, r, addr, sizeof addr);
        setenv("SOFTROCE_ADDR", addr, 1);
        if (o.vdev) {
          char n[16];
          snprintf(n, sizeof n, "%d", o.vdev);
          setenv("SOFTROCE_DEVICES", n, 1);
        }
      }
      static hctx_t h;
      memset(&h, 0, sizeof h);
      h.rank = r, h.nranks = o.nranks, h.fd = sv[1], h.o = &o, h.test_name = test_name;
      g_h = &h;
      if (r != 0) {
        /* only rank 0 prints the table */
        if (!freopen("/dev/null", "w", stdout)) _exit(1);
      }
      int rc = body(&h);
      fflush(stdout);
      fflush(stderr);
      close(h.fd);
      _exit(rc);
    }
    close(sv[1]);
    fds[r] = sv[0];
    g_pids[r] = pid;
    g_nkids = r + 1;
  }
  return launcher(&o, fds, test_name);
}

/* ------------------------------------------------------------------------------------------ */
/* the plugin, any table version                                                              */
/* ------------------------------------------------------------------------------------------ */

static void* g_tab;
static int g_ver;
static void* g_dl;

static void h_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags;
  if (level > FERROCE_LOG_WARN && (!g_h || g_h->o->quiet_log || level > FERROCE_LOG_INFO)) return;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (level == FERROCE_LOG_WARN)
    fprintf(stderr, "[rank %d] NCCL WARN %s (%s:%d)\n", g_h ? g_h->rank : -1, msg, file ? file : "?", line);
  else
    fprintf(stderr, "[rank %d] NCCL INFO %s\n", g_h ? g_h->rank : -1, msg);
}

#define T(v) ((ferroce_net_v##v##_t*)g_tab)

/* The softroce addresses of rank r: <base>.<r+1>, or with --vdev K its K addresses
 * <base>.<rK+1>,...,<base>.<rK+K> (SOFTROCE_ADDR's list form). */
void h_softroce_addrs(const hopts_t* o, int r, char* out, size_t len) {
  int k = o->vdev ? o->vdev : 1;
  size_t at = 0;
  out[0] = 0;
  for (int i = 0; i < k && at < len; i++)
    at += (size_t)snprintf(out + at, len - at, "%s%s.%d", i ? "," : "", o->addr_base, r * k + i + 1);
}

/* --vdev K: fuse plugin devices dev..dev+K-1 with makeVDevice and use the fused device. */
static void h_fuse(hctx_t* h, int ndev) {
  int k = h->o->vdev, first = h->o->dev;
  if (g_ver < 9) h_die(h, "--vdev: ncclNetPlugin_v%d has no makeVDevice (v9+)", g_ver);
  if (first + k > ndev)
    h_die(h, "--vdev %d from --dev %d: the plugin has only %d devices (over softroce each rank gets K; else check NCCL_IB_HCA)", k, first, ndev);
  int d = -1, rc;
  if (g_ver >= 12) {
    ferroce_vdevice_props_v12_t vp = {k, {0}};
    for (int i = 0; i < k; i++) vp.devs[i] = first + i;
    rc = T(12)->makeVDevice(&d, &vp);
  } else {
    ferroce_vdevice_props_v9_t vp = {k, {0}};
    for (int i = 0; i < k; i++) vp.devs[i] = first + i;
    rc = T(9)->makeVDevice(&d, &vp);
  }
  if (rc || d < 0) h_die(h, "makeVDevice of devices %d..%d = %d (see the WARN above)", first, first + k - 1, rc);
  h->dev = d;
}

static int w_init(void** ctx) {
  ferroce_net_comm_config_t cfg = {-1};
  if (g_ver >= 11) return T(12)->init(ctx, 0x5eed, &cfg, h_logger, NULL);
  if (g_ver == 10) return T(10)->init(h_logger, NULL);
  return T(6)->init(h_logger);
}
static int w_devices(int* n) { return T(6)->devices(n); }
static int w_props(int dev, hnet_props_t* p) {
  union {
    ferroce_net_properties_v6_t v6;
    ferroce_net_properties_v7_t v7;
    ferroce_net_properties_v8_t v8;
    ferroce_net_properties_v9_t v9;
    ferroce_net_properties_v11_t v11;
    ferroce_net_properties_v12_t v12;
  } u;
  memset(&u, 0, sizeof u);
  int rc;
  const char* name = NULL;
#define COPY(s) (name = (s).name, p->ptr_support = (s).ptrSupport, p->speed = (s).speed, p->max_recvs = (s).maxRecvs, p->max_comms = (s).maxComms)
  switch (g_ver) {
    case 12: rc = T(12)->getProperties(dev, &u.v12); COPY(u.v12); break;
    case 11: rc = T(11)->getProperties(dev, &u.v11); COPY(u.v11); break;
    case 10: rc = T(10)->getProperties(dev, &u.v9); COPY(u.v9); break;
    case 9: rc = T(9)->getProperties(dev, &u.v9); COPY(u.v9); break;
    case 8: rc = T(8)->getProperties(dev, &u.v8); COPY(u.v8); break;
    case 7: rc = T(7)->getProperties(dev, &u.v7); COPY(u.v7); break;
    default: rc = T(6)->getProperties(dev, &u.v6); COPY(u.v6); break;
  }
#undef COPY
  snprintf(p->name, sizeof p->name, "%s", rc == 0 && name ? name : "?");
  return rc;
}
static int w_listen(void* ctx, int dev, void* handle, void** lc) {
  if (g_ver >= 11) return T(12)->listen(ctx, dev, handle, lc);
  return T(6)->listen(dev, handle, lc);
}
static int w_connect(void* ctx, int dev, void* handle, void** sc) {
  ferroce_net_device_handle_t* dh = NULL;
  ferroce_net_comm_config_t cfg = {-1};
  if (g_ver >= 11) return T(12)->connect(ctx, dev, handle, sc, &dh);
  if (g_ver == 10) return T(10)->connect(dev, &cfg, handle, sc, &dh);
  if (g_ver >= 7) return T(7)->connect(dev, handle, sc, &dh);
  return T(6)->connect(dev, handle, sc);
}
static int w_accept(void* lc, void** rc) {
  ferroce_net_device_handle_t* dh = NULL;
  if (g_ver >= 7) return T(7)->accept(lc, rc, &dh);
  return T(6)->accept(lc, rc);
}
static int w_reg(void* comm, void* data, size_t size, int type, void** mh) {
  if (g_ver >= 8) return T(8)->regMr(comm, data, size, type, mh);
  if (size > INT_MAX) return FERROCE_NCCL_INTERNAL_ERROR;
  return T(6)->regMr(comm, data, (int)size, type, mh);
}
static int w_dereg(void* comm, void* mh) { return T(6)->deregMr(comm, mh); }
static int w_isend(void* sc, void* data, size_t size, int tag, void* mh, void** req) {
  if (g_ver >= 10) return T(10)->isend(sc, data, size, tag, mh, NULL, req);
  if (g_ver == 9) return T(9)->isend(sc, data, size, tag, mh, req);
  if (size > INT_MAX) return FERROCE_NCCL_INTERNAL_ERROR;
  return T(6)->isend(sc, data, (int)size, tag, mh, req);
}
static int w_irecv(void* rc, int n, void** data, size_t* sizes, int* tags, void** mhs, void** req) {
  if (g_ver >= 10) return T(10)->irecv(rc, n, data, sizes, tags, mhs, NULL, req);
  if (g_ver == 9) return T(9)->irecv(rc, n, data, sizes, tags, mhs, req);
  int isz[8];
  for (int i = 0; i < n && i < 8; i++) {
    if (sizes[i] > INT_MAX) return FERROCE_NCCL_INTERNAL_ERROR;
    isz[i] = (int)sizes[i];
  }
  return T(6)->irecv(rc, n, data, isz, tags, mhs, req);
}
static int w_test(void* req, int* done, int* sizes) { return T(6)->test(req, done, sizes); }
static int w_close_send(void* c) { return T(6)->closeSend(c); }
static int w_close_recv(void* c) { return T(6)->closeRecv(c); }
static int w_close_listen(void* c) { return T(6)->closeListen(c); }
static int w_finalize(void* ctx) { return g_ver >= 11 ? T(12)->finalize(ctx) : 0; }
#undef T

void h_net_open(hctx_t* h) {
  const char* path = h->o->plugin;
  g_dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!g_dl) h_die(h, "dlopen(%s): %s", path, dlerror());
  for (int v = h->o->net_version ? h->o->net_version : 12; v >= 6; v--) {
    char sym[32];
    snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", v);
    g_tab = dlsym(g_dl, sym);
    if (g_tab) {
      g_ver = v;
      break;
    }
    if (h->o->net_version) break;
  }
  if (!g_tab) h_die(h, "%s exports no ncclNetPlugin_v%s table", path, h->o->net_version ? "<asked>" : "6..12");
  hnet_t* n = &h->net;
  n->version = g_ver;
  n->name = *(const char**)g_tab;
  n->init = w_init, n->devices = w_devices, n->get_props = w_props, n->listen = w_listen;
  n->connect = w_connect, n->accept = w_accept, n->reg_mr = w_reg, n->dereg_mr = w_dereg;
  n->isend = w_isend, n->irecv = w_irecv, n->test = w_test, n->close_send = w_close_send;
  n->close_recv = w_close_recv, n->close_listen = w_close_listen, n->finalize = w_finalize;
  int rc = n->init(&n->ctx);
  if (rc) h_die(h, "plugin %s (v%d): init returned %d (see the WARN above)", n->name, g_ver, rc);
  int ndev = 0;
  rc = n->devices(&ndev);
  if (rc || ndev < 1) h_die(h, "plugin devices() = %d, %d devices", rc, ndev);
  if (h->o->dev >= ndev) h_die(h, "--dev %d: the plugin has %d devices", h->o->dev, ndev);
  h->dev = h->o->dev;
  if (h->o->vdev) h_fuse(h, ndev);
  hnet_props_t p;
  rc = n->get_props(h->dev, &p);
  if (rc) h_die(h, "getProperties(%d) = %d", h->dev, rc);
  if (!(p.ptr_support & FERROCE_PTR_HOST)) h_die(h, "device %s does not support host memory", p.name);
  h->max_recvs = p.max_recvs;
  if (h->o->group > p.max_recvs) h_die(h, "--group %d: the device takes at most %d buffers per irecv (maxRecvs)", h->o->group, p.max_recvs);
  if (h->rank == 0) {
    printf("# plugin %s (ncclNetPlugin_v%d) from %s\n", n->name, g_ver, path);
    printf("# device %d of %d: %s, speed %d Mbps, maxRecvs %d, maxComms %d%s%s\n", h->dev, ndev, p.name, p.speed,
           p.max_recvs, p.max_comms, h->o->softroce ? ", softroce SOFTROCE_ADDR=" : "",
           h->o->softroce ? h->o->addr_base : "");
    if (h->o->softroce && !h->o->vdev) printf("#   (ranks use %s.1 .. %s.%d)\n", h->o->addr_base, h->o->addr_base, h->nranks);
    for (int r = 0; h->o->softroce && h->o->vdev && r < h->nranks; r++) {
      char addr[512];
      h_softroce_addrs(h->o, r, addr, sizeof addr);
      printf("#   rank %d: fused device of %d softroce devices on %s\n", r, h->o->vdev, addr);
    }
  }
}

void h_net_close(hctx_t* h) {
  if (getenv("FERROCE_STATS"))
    fprintf(stderr, "harness: rank %d sent %ld messages, %.0f bytes through isend\n", h->rank, h_run_sends, h_run_bytes_sent);
  int rc = h->net.finalize(h->net.ctx);
  if (rc) h_die(h, "finalize = %d", rc);
}

void* h_reg(hctx_t* h, void* comm, void* data, size_t size) {
  void* mh = NULL;
  int rc = h->net.reg_mr(comm, data, size, FERROCE_PTR_HOST, &mh);
  if (rc) h_die(h, "regMr(%p, %zu) = %d", data, size, rc);
  return mh;
}

void h_dereg(hctx_t* h, void* comm, void* mh) {
  int rc = h->net.dereg_mr(comm, mh);
  if (rc) h_die(h, "deregMr = %d", rc);
}

hstats_t h_stats;

void h_test_req(hctx_t* h, void* req, int* done, int* size, const char* what) {
  double t0 = h_now();
  int rc = h->net.test(req, done, size);
  h_stats.test_s += h_now() - t0;
  h_stats.tests++;
  if (rc) h_die(h, "test(%s) = %d", what, rc);
}

/* Connect/accept many pairs at once, alternating non-blocking calls as NCCL's bootstrap does. */
static void connect_accept_many(hctx_t* h, int n, char* handles, void** scs, void** lcs, void** rcs, double deadline_s) {
  double t0 = h_now(), deadline = t0 + deadline_s;
  int left;
  long spins = 0;
  do {
    left = 0;
    int progressed = 0;
    for (int i = 0; i < n; i++) {
      if (handles && !scs[i]) {
        int rc = h->net.connect(h->net.ctx, h->dev, handles + (size_t)i * H_HANDLE_SIZE, &scs[i]);
        if (rc) h_die(h, "connect #%d = %d", i, rc);
        if (scs[i]) progressed = 1;
        else left++;
      }
      if (lcs && lcs[i] && !rcs[i]) {
        int rc = h->net.accept(lcs[i], &rcs[i]);
        if (rc) h_die(h, "accept #%d = %d", i, rc);
        if (rcs[i]) {
          progressed = 1;
          rc = h->net.close_listen(lcs[i]); /* NCCL: one listen per connection */
          if (rc) h_die(h, "closeListen #%d = %d", i, rc);
          lcs[i] = NULL;
        } else {
          left++;
        }
      }
    }
    if (left && h_now() > deadline)
      h_die(h, "connection setup: %d of %d endpoints not connected after %.0f s", left, n, deadline_s);
    if (left && !progressed && ++spins > 100) usleep(50);
  } while (left);
}

void h_connect_accept(hctx_t* h, void* handle, void** send_comm, void* listen_comm, void** recv_comm, double deadline_s) {
  void* lcs[1] = {listen_comm};
  void* scs[1] = {NULL};
  void* rcs[1] = {NULL};
  connect_accept_many(h, 1, handle, scs, listen_comm ? lcs : NULL, rcs, deadline_s);
  if (send_comm) *send_comm = scs[0];
  if (recv_comm) *recv_comm = rcs[0];
}

void h_connect_pairs(hctx_t* h, int n, char* handles, void** scs, void** lcs, void** rcs, double deadline_s) {
  connect_accept_many(h, n, handles, scs, lcs, rcs, deadline_s);
}

void h_ring_connect(hctx_t* h, size_t slot_bytes) {
  int C = h->o->nchannels, n = h->nranks;
  char* mine = calloc((size_t)C, H_HANDLE_SIZE);
  char* all = calloc((size_t)C * (size_t)n, H_HANDLE_SIZE);
  void* lcs[H_MAX_CHANNELS] = {0};
  void* scs[H_MAX_CHANNELS] = {0};
  void* rcs[H_MAX_CHANNELS] = {0};
  double t0 = h_now();
  for (int c = 0; c < C; c++) {
    int rc = h->net.listen(h->net.ctx, h->dev, mine + (size_t)c * H_HANDLE_SIZE, &lcs[c]);
    if (rc || !lcs[c]) h_die(h, "listen (channel %d) = %d", c, rc);
  }
  h_allgather(h, mine, (size_t)C * H_HANDLE_SIZE, all);
  int next = (h->rank + 1) % n;
  connect_accept_many(h, C, all + (size_t)next * C * H_HANDLE_SIZE, scs, lcs, rcs, 120);
  double t1 = h_now();
  h->nch = C;
  for (int c = 0; c < C; c++) {
    hchan_t* ch = calloc(1, sizeof *ch);
    ch->send_comm = scs[c];
    ch->recv_comm = rcs[c];
    ch->slot_bytes = slot_bytes;
    if (slot_bytes) {
      ch->slots = h_alloc(slot_bytes * (size_t)h->o->steps);
      ch->slots_mh = h_reg(h, ch->recv_comm, ch->slots, slot_bytes * (size_t)h->o->steps);
    }
    h->ch[c] = ch;
  }
  double setup = h_allreduce_double(h, t1 - t0, 3);
  if (h->rank == 0) printf("# ring of %d ranks, %d channel(s): connected in %.1f ms\n", n, C, setup * 1e3);
  free(mine);
  free(all);
}

void h_ring_close(hctx_t* h) {
  for (int c = 0; c < h->nch; c++) {
    hchan_t* ch = h->ch[c];
    if (ch->slots_mh) h_dereg(h, ch->recv_comm, ch->slots_mh);
    int rc = h->net.close_send(ch->send_comm);
    if (rc) h_die(h, "closeSend = %d", rc);
    rc = h->net.close_recv(ch->recv_comm);
    if (rc) h_die(h, "closeRecv = %d", rc);
    free(ch->slots);
    free(ch);
    h->ch[c] = NULL;
  }
  h->nch = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* results                                                                                    */
/* ------------------------------------------------------------------------------------------ */

void h_print_header(hctx_t* h, const hcoll_t* c) {
  (void)c;
  if (h->rank != 0) return;
  hopts_t* o = h->o;
  printf("# %s: nRanks %d nChannels %d minBytes %zu maxBytes %zu step: ", h->test_name, h->nranks, o->nchannels,
         o->min_bytes, o->max_bytes);
  if (o->step_factor > 1)
    printf("%g(factor)", o->step_factor);
  else
    printf("%zu(bytes)", o->step_bytes);
  printf(" warmup iters: %d iters: %d validation: %d chunk: %zu steps: %d%s\n", o->warmup, o->iters, o->check,
         o->chunk_bytes, o->steps, o->pingpong ? " mode: ping-pong (time = median round trip / 2)"
                                    : o->oneway ? " mode: one way (rank 0 -> rank 1 only)" : "");
  printf("#\n");
  printf("# %52s  %-30s", "", o->inplace ? "      out-of-place" : "      out-of-place");
  if (o->inplace) printf("  %-30s", "      in-place");
  printf("\n");
  printf("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s", "size", "count", "type", "redop", "root", "time", "algbw",
         "busbw", "#wrong");
  if (o->inplace) printf("  %7s  %6s  %6s  %6s", "time", "algbw", "busbw", "#wrong");
  printf("\n");
  printf("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "");
  if (o->inplace) printf("  %7s  %6s  %6s  %6s", "(us)", "(GB/s)", "(GB/s)", "");
  printf("\n");
}

static void fmt_time(char* buf, size_t n, double us) {
  if (us < 10000)
    snprintf(buf, n, "%7.2f", us);
  else if (us < 100000)
    snprintf(buf, n, "%7.1f", us);
  else
    snprintf(buf, n, "%7.0f", us);
}

void h_print_row(hctx_t* h, const hcoll_t* c, const hrow_t* r) {
  if (h->rank != 0) return;
  printf("%12zu  %12zu  %8s  %6s  %6d", r->bytes, r->count, c->type, c->redop, c->root);
  for (int p = 0; p < 1 + (h->o->inplace != 0); p++) {
    char t[32], w[32];
    fmt_time(t, sizeof t, r->time_us[p]);
    if (h->o->check)
      snprintf(w, sizeof w, "%ld", r->wrong[p]);
    else
      snprintf(w, sizeof w, "N/A");
    printf("  %7s  %6.2f  %6.2f  %6s", t, r->algbw[p], r->busbw[p], w);
  }
  printf("\n");
}

int h_print_footer(hctx_t* h, hrow_t* rows, int nrows) {
  long wrong = 0;
  double sum = 0;
  int cnt = 0;
  for (int i = 0; i < nrows; i++)
    for (int p = 0; p < 1 + (h->o->inplace != 0); p++) {
      wrong += rows[i].wrong[p];
      sum += rows[i].busbw[p];
      cnt++;
    }
  if (h->rank == 0) {
    printf("# Out of bounds values : %ld %s\n", wrong, wrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g \n", cnt ? sum / cnt : 0.0);
    printf("#\n");
  }
  return wrong != 0;
}

void h_write_outputs(hctx_t* h, const hcoll_t* c, hrow_t* rows, int nrows) {
  if (h->rank != 0) return;
  const char* place[2] = {"out-of-place", "in-place"};
  int np = 1 + (h->o->inplace != 0);
  if (h->o->csv) {
    FILE* f = fopen(h->o->csv, "w");
    if (!f) h_die(h, "cannot write %s: %s", h->o->csv, strerror(errno));
    fprintf(f, "test,nranks,channels,mode,size,count,type,redop,root,placement,time_us,algbw_GBps,busbw_GBps,wrong\n");
    for (int i = 0; i < nrows; i++)
      for (int p = 0; p < np; p++)
        fprintf(f, "%s,%d,%d,%s,%zu,%zu,%s,%s,%d,%s,%.3f,%.4f,%.4f,%ld\n", h->test_name, h->nranks, h->o->nchannels,
                h_mode(h->o), rows[i].bytes, rows[i].count, c->type, c->redop, c->root,
                place[p], rows[i].time_us[p], rows[i].algbw[p], rows[i].busbw[p], h->o->check ? rows[i].wrong[p] : -1);
    fclose(f);
    printf("# CSV written to %s\n", h->o->csv);
  }
  if (h->o->json) {
    FILE* f = fopen(h->o->json, "w");
    if (!f) h_die(h, "cannot write %s: %s", h->o->json, strerror(errno));
    fprintf(f, "{\"test\": \"%s\", \"nranks\": %d, \"channels\": %d, \"mode\": \"%s\", \"plugin\": \"%s\", "
               "\"net_version\": %d, \"softroce\": %d, \"chunk\": %zu, \"steps\": %d, \"iters\": %d, \"rows\": [",
            h->test_name, h->nranks, h->o->nchannels, h_mode(h->o), h->net.name, h->net.version,
            h->o->softroce, h->o->chunk_bytes, h->o->steps, h->o->iters);
    int first = 1;
    for (int i = 0; i < nrows; i++)
      for (int p = 0; p < np; p++) {
        fprintf(f, "%s\n  {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", \"root\": %d, "
                   "\"placement\": \"%s\", \"time_us\": %.3f, \"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f, \"wrong\": %ld}",
                first ? "" : ",", rows[i].bytes, rows[i].count, c->type, c->redop, c->root, place[p], rows[i].time_us[p],
                rows[i].algbw[p], rows[i].busbw[p], h->o->check ? rows[i].wrong[p] : -1);
        first = 0;
      }
    fprintf(f, "\n]}\n");
    fclose(f);
    printf("# JSON written to %s\n", h->o->json);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* request streams                                                                            */
/* ------------------------------------------------------------------------------------------ */

void hq_init(hq_t* q, void* comm, int is_send, int tag, int depth) {
  memset(q, 0, sizeof *q);
  q->comm = comm, q->is_send = is_send, q->tag = tag, q->depth = depth;
}

int hq_post_send(hctx_t* h, hq_t* q, void* data, size_t bytes, void* mh) {
  if (hq_full(q)) return 0;
  void* req = NULL;
  double t0 = h_now();
  int rc = h->net.isend(q->comm, data, bytes, q->tag, mh, &req);
  h_stats.isend_s += h_now() - t0;
  h_stats.isend_calls++;
  if (rc) h_die(h, "isend(%zu bytes) = %d", bytes, rc);
  if (!req) return 0;
  h_stats.sends++;
  h_stats.bytes_sent += bytes;
  h_run_sends++;
  h_run_bytes_sent += (double)bytes;
  int s = (int)(q->posted % H_MAX_INFLIGHT);
  q->req[s] = req, q->expect[s][0] = bytes, q->n[s] = 1;
  q->posted++;
  return 1;
}

int hq_post_recvn(hctx_t* h, hq_t* q, int n, void** data, size_t* capacity, size_t* expect, void** mh) {
  if (hq_full(q)) return 0;
  void* req = NULL; /* NCCL stores NULL (or the 0x1 hint for LL protocols) before irecv */
  int tags[H_MAX_GROUP];
  for (int i = 0; i < n; i++) tags[i] = q->tag;
  double t0 = h_now();
  int rc = h->net.irecv(q->comm, n, data, capacity, tags, mh, &req);
  h_stats.irecv_s += h_now() - t0;
  h_stats.irecv_calls++;
  if (rc) h_die(h, "irecv(n=%d, %zu bytes) = %d", n, capacity[0], rc);
  if (!req) return 0;
  h_stats.recvs++;
  h_run_recvs++;
  int s = (int)(q->posted % H_MAX_INFLIGHT);
  q->req[s] = req, q->n[s] = n;
  for (int i = 0; i < n; i++) q->expect[s][i] = expect[i];
  q->posted++;
  return 1;
}

int hq_post_recv(hctx_t* h, hq_t* q, void* data, size_t capacity, size_t expect, void* mh) {
  return hq_post_recvn(h, q, 1, &data, &capacity, &expect, &mh);
}

int hq_poll(hctx_t* h, hq_t* q) {
  if (q->done == q->posted) return 0;
  int s = (int)(q->done % H_MAX_INFLIGHT);
  int done = 0, sizes[64] = {0}; /* NCCL passes a zero-filled array of 64 */
  h_test_req(h, q->req[s], &done, sizes, q->is_send ? "isend" : "irecv");
  if (!done) return 0;
  if (!q->is_send)
    for (int i = 0; i < q->n[s]; i++)
      if ((size_t)sizes[i] != q->expect[s][i])
        h_die(h, "receive #%ld (buffer %d of %d) completed with %d bytes, the peer sent %zu", q->done, i, q->n[s],
              sizes[i], q->expect[s][i]);
  q->req[s] = NULL;
  q->done++;
  return 1;
}

/* HARNESS_IDLE: "yield" (default: sched_yield), "spin" (busy poll, as NCCL's proxy), or a number
 * of microseconds to sleep. */
void h_idle(hctx_t* h) {
  static int mode = -2; /* -2 unset, -1 spin, 0 yield, >0 sleep us */
  (void)h;
  if (mode == -2) {
    const char* e = getenv("HARNESS_IDLE");
    mode = !e || !strcmp(e, "yield") ? 0 : !strcmp(e, "spin") ? -1 : atoi(e);
  }
  if (mode == 0)
    sched_yield();
  else if (mode > 0)
    usleep((useconds_t)mode);
}

/* CPU seconds of this process's threads, split into the calling (main) thread and the others
 * (softroce's engine threads when softroce is the NIC; the plugin's own threads, if any). */
static void thread_cpu(double* main_s, double* other_s, char* names, size_t nlen) {
  *main_s = *other_s = 0;
  if (names && nlen) names[0] = 0;
  long hz = sysconf(_SC_CLK_TCK);
  DIR* d = opendir("/proc/self/task");
  struct dirent* e;
  pid_t me = getpid();
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[300], buf[1024];
    snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
    FILE* f = fopen(path, "r");
    if (!f) continue;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char* rp = strrchr(buf, ')');
    if (!rp) continue;
    unsigned long ut = 0, st = 0;
    /* fields after ")": state(3) ... utime(14) stime(15) */
    if (sscanf(rp + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) continue;
    double cpu = (double)(ut + st) / hz;
    if (atoi(e->d_name) == me) {
      *main_s += cpu;
    } else {
      *other_s += cpu;
      char* lp = strchr(buf, '(');
      if (names && lp && rp > lp && strlen(names) + (size_t)(rp - lp) + 2 < nlen) {
        char nm[64];
        snprintf(nm, sizeof nm, "%.*s", (int)(rp - lp - 1), lp + 1);
        if (!strstr(names, nm)) {
          if (names[0]) strcat(names, ",");
          strcat(names, nm);
        }
      }
    }
  }
  if (d) closedir(d);
}

/* CPU time of the whole process (every thread: the caller's, the plugin's, softroce's engine),
 * with the clock's resolution rather than /proc's ticks, so a few thousand messages suffice. */
static double process_cpu(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void h_stats_begin(hctx_t* h) {
  (void)h;
  memset(&h_stats, 0, sizeof h_stats);
  thread_cpu(&h_stats.cpu_main0, &h_stats.cpu_other0, NULL, 0);
  h_stats.cpu_process0 = process_cpu();
  h_stats.wall0 = h_now();
}

void h_stats_report(hctx_t* h, const char* what) {
  double wall = h_now() - h_stats.wall0, cm, co;
  char names[256];
  thread_cpu(&cm, &co, names, sizeof names);
  cm -= h_stats.cpu_main0, co -= h_stats.cpu_other0;
  double cp = process_cpu() - h_stats.cpu_process0;
  enum { N = 14 };
  double v[N] = {wall, cm, co, h_stats.isend_s, h_stats.irecv_s, h_stats.test_s, (double)h_stats.sends, (double)h_stats.tests,
                 h_stats.compute_s, cp, (double)h_stats.recvs, (double)h_stats.isend_calls, (double)h_stats.irecv_calls, 0};
  double all[N * 256];
  h_allgather(h, v, sizeof v, all);
  if (h->rank != 0) return;
  /* One machine-readable line per rank (ci/bench-compare.sh reads it). */
  for (int r = 0; r < h->nranks; r++) {
    double* x = all + N * r;
    printf("#cpu rank=%d wall_s=%.6f process_cpu_s=%.6f isend_s=%.6f irecv_s=%.6f test_s=%.6f sends=%.0f recvs=%.0f "
           "isend_calls=%.0f irecv_calls=%.0f tests=%.0f\n",
           r, x[0], x[9], x[3], x[4], x[5], x[6], x[10], x[11], x[12], x[7]);
  }
  printf("# cpu during %s (per rank: wall s | main thread cpu s | other threads cpu s [%s] | time inside isend/irecv/test s | sends | tests | CPU reduction s):\n",
         what, names[0] ? names : "none");
  for (int r = 0; r < h->nranks; r++) {
    double* x = all + N * r;
    printf("#   rank %d: %.2f | %.2f (%.0f%%) | %.2f (%.0f%%) | %.3f/%.3f/%.3f | %.0f | %.0f | %.3f (%.0f%%)\n", r, x[0], x[1],
           100 * x[1] / x[0], x[2], 100 * x[2] / x[0], x[3], x[4], x[5], x[6], x[7], x[8], 100 * x[8] / x[0]);
  }
}

/* ---- verbs work per message (--stats) ----
 * Two sources, snapshotted around the timed iterations of each size:
 *  - softroce's process counters (softroce_counters_get in libibverbs.so.1; absent on a real
 *    NIC): every post call, WR, signaled WR, inline byte, CQ poll and packet of the process,
 *    both roles together;
 *  - the plugin's own statistics (ferroce_stats_totals_get; kept when FERROCE_STATS or
 *    NCCL_DEBUG=INFO is set), split by side: the send side's posts and signaled completions per
 *    isend, the receive side's posts and CTS writes per irecv, and each side's CQ polls (empty
 *    ones too: send_polls per isend, recv_polls per irecv). CTS writes come from here (a CTS
 *    is an RDMA WRITE like the sender's data, so softroce cannot tell them apart). */
_Static_assert(sizeof(struct softroce_counters) == 160, "struct softroce_counters: 160 bytes (layout_tests.rs)");
_Static_assert(offsetof(struct softroce_counters, retransmits) == 152, "softroce_counters.retransmits at 152");
_Static_assert(sizeof(ferroce_rs_FerroceStatsTotals) == 136, "FerroceStatsTotals: 136 bytes (src/abi/stats.rs)");

typedef int (*ferroce_stats_totals_get_fn)(ferroce_rs_FerroceStatsTotals*, size_t);
static softroce_counters_get_fn g_sr_get;
static ferroce_stats_totals_get_fn g_pl_get;
static int g_work_looked;
static struct softroce_counters g_sr0;
static ferroce_rs_FerroceStatsTotals g_pl0;
static long g_sends0, g_recvs0;
static double g_bytes0;

static int sr_snapshot(struct softroce_counters* c) {
  memset(c, 0, sizeof *c);
  return g_sr_get && g_sr_get(c, sizeof *c) == 0 && c->size == sizeof *c;
}

static int pl_snapshot(ferroce_rs_FerroceStatsTotals* t) {
  memset(t, 0, sizeof *t);
  return g_pl_get && g_pl_get(t, sizeof *t) == 0 && t->size == sizeof *t && t->enabled;
}

void h_work_begin(hctx_t* h) {
  if (!g_work_looked) {
    g_work_looked = 1;
    void* ibv = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (ibv) *(void**)&g_sr_get = dlsym(ibv, "softroce_counters_get");
    *(void**)&g_pl_get = dlsym(g_dl, "ferroce_stats_totals_get");
    ferroce_rs_FerroceStatsTotals t;
    if (h->rank == 0) {
      if (!g_sr_get)
        printf("# verbs work: no softroce counters (libibverbs.so.1 %s softroce_counters_get: a real NIC); plugin figures only\n",
               ibv ? "has no" : "not loaded, no");
      if (!g_pl_get)
        printf("# verbs work: the plugin exports no ferroce_stats_totals_get: no per-side or CTS figures\n");
      else if (!pl_snapshot(&t))
        printf("# verbs work: the plugin keeps no statistics (set FERROCE_STATS=DIR): no per-side or CTS figures\n");
      printf("# verbs work per message, averaged over the timed iterations (per rank: msgs = its isends or irecvs, whichever more,\n"
             "#   msg_bytes = the bytes of its average isend;\n"
             "#   softroce figures count both roles of the process; send_* per isend, recv_* and cts per irecv, from the plugin)\n");
    }
  }
  sr_snapshot(&g_sr0);
  pl_snapshot(&g_pl0);
  g_sends0 = h_run_sends, g_recvs0 = h_run_recvs, g_bytes0 = h_run_bytes_sent;
}

enum { W_MSGS, W_MSG_BYTES, W_SENDS, W_RECVS, W_SR, W_PL, W_POST_SEND, W_WRS, W_SIGNALED, W_INLINE_B, W_POST_RECV, W_POLLS, W_EMPTY, W_CQES,
       W_PACKETS, W_RESP, W_RETX, W_SEND_POSTS, W_SEND_WRS, W_SEND_SIGNALED, W_RECV_POSTS, W_CTS, W_EAGER, W_DELIVERED,
       W_SEND_POLLS, W_RECV_POLLS, W_N };

void h_work_report(hctx_t* h, size_t bytes, double steps) {
  struct softroce_counters c;
  ferroce_rs_FerroceStatsTotals t;
  double v[W_N] = {0};
  v[W_SR] = sr_snapshot(&c);
  v[W_PL] = pl_snapshot(&t);
  v[W_SENDS] = (double)(h_run_sends - g_sends0), v[W_RECVS] = (double)(h_run_recvs - g_recvs0);
  v[W_MSGS] = v[W_SENDS] > v[W_RECVS] ? v[W_SENDS] : v[W_RECVS];
  v[W_MSG_BYTES] = v[W_SENDS] > 0 ? (h_run_bytes_sent - g_bytes0) / v[W_SENDS] : 0;
  double m = v[W_MSGS] > 0 ? v[W_MSGS] : 1, ns = v[W_SENDS] > 0 ? v[W_SENDS] : 1, nr = v[W_RECVS] > 0 ? v[W_RECVS] : 1;
  if (v[W_SR]) {
    v[W_POST_SEND] = (double)(c.post_send_calls - g_sr0.post_send_calls) / m;
    v[W_WRS] = (double)(c.send_wrs - g_sr0.send_wrs) / m;
    v[W_SIGNALED] = (double)(c.signaled_wrs - g_sr0.signaled_wrs) / m;
    v[W_INLINE_B] = (double)(c.inline_bytes - g_sr0.inline_bytes) / m;
    v[W_POST_RECV] = (double)(c.post_recv_calls - g_sr0.post_recv_calls) / m;
    v[W_POLLS] = (double)(c.poll_cq_calls - g_sr0.poll_cq_calls) / m;
    v[W_EMPTY] = (double)(c.poll_cq_empty - g_sr0.poll_cq_empty) / m;
    v[W_CQES] = (double)(c.cqes - g_sr0.cqes) / m;
    v[W_PACKETS] = (double)(c.tx_packets - g_sr0.tx_packets) / m;
    v[W_RESP] = (double)(c.tx_responses - g_sr0.tx_responses) / m;
    v[W_RETX] = (double)(c.retransmits - g_sr0.retransmits) / m;
  }
  if (v[W_PL]) {
    v[W_SEND_POSTS] = (double)(t.send_post_calls - g_pl0.send_post_calls) / ns;
    v[W_SEND_WRS] = (double)(t.send_wrs - g_pl0.send_wrs) / ns;
    v[W_SEND_SIGNALED] = (double)(t.send_completions - g_pl0.send_completions) / ns;
    v[W_RECV_POSTS] = (double)(t.recv_post_calls - g_pl0.recv_post_calls) / nr;
    v[W_CTS] = (double)(t.cts_writes - g_pl0.cts_writes) / nr;
    v[W_EAGER] = (double)(t.eager_sent - g_pl0.eager_sent) / ns;
    v[W_DELIVERED] = (double)(t.eager_delivered - g_pl0.eager_delivered) / nr;
    v[W_SEND_POLLS] = (double)(t.send_cq_polls - g_pl0.send_cq_polls) / ns;
    v[W_RECV_POLLS] = (double)(t.recv_cq_polls - g_pl0.recv_cq_polls) / nr;
  }
  double all[W_N * 256];
  h_allgather(h, v, sizeof v, all);
  if (h->rank != 0) return;
  for (int r = 0; r < h->nranks; r++) {
    double* x = all + W_N * r;
    char sr[320] = "softroce=absent", pl[320] = "plugin=absent";
    if (x[W_SR])
      snprintf(sr, sizeof sr,
               "post_send=%.3f wrs=%.3f signaled=%.3f inline_bytes=%.1f post_recv=%.3f polls=%.2f empty_polls=%.2f cqes=%.3f "
               "packets=%.3f responses=%.3f retransmits=%.4f",
               x[W_POST_SEND], x[W_WRS], x[W_SIGNALED], x[W_INLINE_B], x[W_POST_RECV], x[W_POLLS], x[W_EMPTY], x[W_CQES],
               x[W_PACKETS], x[W_RESP], x[W_RETX]);
    if (x[W_PL])
      snprintf(pl, sizeof pl,
               "send_posts=%.3f send_wrs=%.3f send_signaled=%.3f recv_posts=%.3f cts=%.3f eager=%.3f eager_delivered=%.3f "
               "send_polls=%.2f recv_polls=%.2f",
               x[W_SEND_POSTS], x[W_SEND_WRS], x[W_SEND_SIGNALED], x[W_RECV_POSTS], x[W_CTS], x[W_EAGER], x[W_DELIVERED],
               x[W_SEND_POLLS], x[W_RECV_POLLS]);
    printf("#work bytes=%zu rank=%d msgs=%.0f isends=%.0f irecvs=%.0f msg_bytes=%.0f %s %s\n", bytes, r, x[W_MSGS], x[W_SENDS],
           x[W_RECVS], x[W_MSG_BYTES], sr, pl);
    if (steps > 0 && x[W_SR])
      printf("#work-step bytes=%zu rank=%d steps=%.0f post_send=%.3f wrs=%.3f signaled=%.3f post_recv=%.3f polls=%.2f cts=%.3f\n",
             bytes, r, steps, x[W_POST_SEND] * x[W_MSGS] / steps, x[W_WRS] * x[W_MSGS] / steps, x[W_SIGNALED] * x[W_MSGS] / steps,
             x[W_POST_RECV] * x[W_MSGS] / steps, x[W_POLLS] * x[W_MSGS] / steps, x[W_CTS] * x[W_RECVS] / steps);
  }
}

/* For programs with their own launcher (soak): the plugin path h_main would use. */
void h_resolve_plugin(hopts_t* o) { resolve_plugin(o); }

/* For programs with their own launcher (soak): the rank the plugin's log lines are named by
 * (h_main sets it for its ranks). */
void h_log_as(hctx_t* h) { g_h = h; }
