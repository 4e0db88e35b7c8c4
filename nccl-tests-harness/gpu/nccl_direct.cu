// nccl_direct: NCCL called directly, one process per rank, results checked, nccl-tests' columns.
//
//   nccl_direct --rank R --nranks N --id-file PATH [-b 4K] [-e 256M] [-f 2] [-n 20] [-w 5]
//               [--cap 1G] [--gpu G] [-T timeout_s]
//
// Rank 0 creates the ncclUniqueId and writes it to PATH (atomically: PATH.tmp, then rename); the
// other ranks wait for the file (up to the timeout). Each rank uses GPU G, or rank % device count
// (two ranks may share one GPU). NCCL_HOSTID is set to "ferroce-gpu-rank<R>" unless already set, so
// that NCCL treats the ranks as separate hosts and routes them through the network transport.
//
// Tests, per size (doubling from -b to -e):
//   all_reduce: ncclAllReduce float32 sum, out of place. x_r[i] = i % 13 + 1 + r, so every sum is a
//               small exact integer; the receive buffer is checked after the timed loop, then
//               poisoned (NaN), reduced once more and checked again.
//   sendrecv:   ncclSend to (r+1) % N and ncclRecv from (r-1) % N in one group; the received
//               buffer must equal the peer's pattern (checked the same two ways).
// #wrong is the number of wrong elements over all ranks (summed with one small ncclAllReduce).
// Exit status: 0 when nothing was wrong, 1 on wrong elements, 2 on a CUDA/NCCL/usage error,
// 3 on an NCCL asynchronous error or timeout (the communicator is aborted).
#include <cuda_runtime.h>
#include <nccl.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <string>

// ncclInProgress (non-blocking communicators) exists from NCCL 2.14 on; this program uses blocking ones.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
#define NCCL_OK(r) ((r) == ncclSuccess || (r) == ncclInProgress)
#else
#define NCCL_OK(r) ((r) == ncclSuccess)
#endif

#define CUDACHECK(cmd)                                                                       \
  do {                                                                                       \
    cudaError_t e_ = (cmd);                                                                  \
    if (e_ != cudaSuccess) {                                                                 \
      fprintf(stderr, "rank %d: %s:%d CUDA error %s: %s\n", g_rank, __FILE__, __LINE__,      \
              cudaGetErrorName(e_), cudaGetErrorString(e_));                                 \
      exit(2);                                                                               \
    }                                                                                        \
  } while (0)

#define NCCLCHECK(cmd)                                                                       \
  do {                                                                                       \
    ncclResult_t r_ = (cmd);                                                                 \
    if (!NCCL_OK(r_)) {                                                                           \
      fprintf(stderr, "rank %d: %s:%d NCCL error %d: %s (last error: %s)\n", g_rank,         \
              __FILE__, __LINE__, (int)r_, ncclGetErrorString(r_), last_error());            \
      exit(2);                                                                               \
    }                                                                                        \
  } while (0)

static int g_rank = -1;
static ncclComm_t g_comm = nullptr;

static const char* last_error() {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  return ncclGetLastError(g_comm);
#else
  return "";
#endif
}

static const int kPattern = 13;

__global__ void fill_pattern(float* p, size_t n, int rank) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = (float)((int)(i % kPattern) + 1 + rank);
}

// mode 0: expected = sum over ranks of the pattern; mode 1: expected = pattern of rank `peer`.
__global__ void count_wrong(const float* p, size_t n, int nranks, int mode, int peer,
                            unsigned long long* wrong) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    int base = (int)(i % kPattern) + 1;
    float want = mode == 0 ? (float)(nranks * base + nranks * (nranks - 1) / 2)
                           : (float)(base + peer);
    if (!(p[i] == want)) local++;
  }
  if (local) atomicAdd(wrong, local);
}

static double now_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static size_t parse_size(const char* s) {
  char* end = nullptr;
  double v = strtod(s, &end);
  size_t unit = 1;
  if (end && *end) {
    switch (*end) {
      case 'K': case 'k': unit = 1ull << 10; break;
      case 'M': case 'm': unit = 1ull << 20; break;
      case 'G': case 'g': unit = 1ull << 30; break;
      default: fprintf(stderr, "bad size '%s'\n", s); exit(2);
    }
  }
  if (v <= 0) { fprintf(stderr, "bad size '%s'\n", s); exit(2); }
  return (size_t)(v * unit);
}

struct Opts {
  int rank = -1, nranks = 2, gpu = -1, iters = 20, warmup = 5, timeout = 300;
  size_t minb = 4096, maxb = 256ull << 20, factor = 2, cap = 1ull << 30;
  std::string id_file;
};

static void usage(const char* argv0) {
  fprintf(stderr,
          "usage: %s --rank R --nranks N --id-file PATH [-b 4K] [-e 256M] [-f 2] [-n 20] [-w 5]\n"
          "          [--cap 1G] [--gpu G] [-T timeout_s]\n",
          argv0);
}

static Opts parse(int argc, char** argv) {
  Opts o;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) { usage(argv[0]); exit(2); }
      return argv[++i];
    };
    if (a == "--rank") o.rank = atoi(val());
    else if (a == "--nranks") o.nranks = atoi(val());
    else if (a == "--id-file") o.id_file = val();
    else if (a == "--gpu") o.gpu = atoi(val());
    else if (a == "-b") o.minb = parse_size(val());
    else if (a == "-e") o.maxb = parse_size(val());
    else if (a == "-f") o.factor = (size_t)atol(val());
    else if (a == "-n") o.iters = atoi(val());
    else if (a == "-w") o.warmup = atoi(val());
    else if (a == "--cap") o.cap = parse_size(val());
    else if (a == "-T") o.timeout = atoi(val());
    else if (a == "-h" || a == "--help") { usage(argv[0]); exit(0); }
    else { fprintf(stderr, "unknown option '%s'\n", a.c_str()); usage(argv[0]); exit(2); }
  }
  if (o.rank < 0 || o.nranks < 1 || o.rank >= o.nranks || o.id_file.empty() || o.minb > o.maxb ||
      o.iters < 1 || o.warmup < 0 || o.factor < 1) {
    usage(argv[0]);
    exit(2);
  }
  return o;
}

static void write_id(const std::string& path, const ncclUniqueId& id) {
  std::string tmp = path + ".tmp";
  FILE* f = fopen(tmp.c_str(), "wb");
  if (!f || fwrite(&id, sizeof(id), 1, f) != 1 || fclose(f) != 0) {
    fprintf(stderr, "rank 0: cannot write %s: %s\n", tmp.c_str(), strerror(errno));
    exit(2);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    fprintf(stderr, "rank 0: cannot rename to %s: %s\n", path.c_str(), strerror(errno));
    exit(2);
  }
}

static ncclUniqueId read_id(const std::string& path, int timeout_s) {
  ncclUniqueId id;
  double deadline = now_s() + timeout_s;
  for (;;) {
    FILE* f = fopen(path.c_str(), "rb");
    if (f) {
      size_t n = fread(&id, sizeof(id), 1, f);
      fclose(f);
      if (n == 1) return id;
    }
    if (now_s() > deadline) {
      fprintf(stderr, "rank %d: no unique id in %s after %d s (is rank 0 running?)\n", g_rank,
              path.c_str(), timeout_s);
      exit(2);
    }
    usleep(20000);
  }
}

// Wait for the stream while watching NCCL's asynchronous error and the deadline (like nccl-tests).
static void wait_stream(cudaStream_t s, int timeout_s) {
  double deadline = now_s() + timeout_s;
  for (;;) {
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) CUDACHECK(e);
    ncclResult_t ae = ncclSuccess;
    NCCLCHECK(ncclCommGetAsyncError(g_comm, &ae));
    if (!NCCL_OK(ae)) {
      fprintf(stderr, "rank %d: NCCL asynchronous error %d: %s (%s); aborting\n", g_rank, (int)ae,
              ncclGetErrorString(ae), last_error());
      ncclCommAbort(g_comm);
      exit(3);
    }
    if (now_s() > deadline) {
      fprintf(stderr, "rank %d: operation did not finish within %d s; aborting\n", g_rank,
              timeout_s);
      ncclCommAbort(g_comm);
      exit(3);
    }
    usleep(50);
  }
}

static void header(const char* title, const char* op) {
  printf("# op: %s\n# %s\n", op, title);
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s\n", "size", "count", "type", "redop",
         "root", "time", "algbw", "busbw", "#wrong");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)", "", "", "",
         "(us)", "(GB/s)", "(GB/s)", "");
  fflush(stdout);
}

int main(int argc, char** argv) {
  Opts o = parse(argc, argv);
  g_rank = o.rank;
  char hostid[64];
  snprintf(hostid, sizeof(hostid), "ferroce-gpu-rank%d", o.rank);
  setenv("NCCL_HOSTID", hostid, 0);  // keep a value the launcher set

  int ndev = 0;
  CUDACHECK(cudaGetDeviceCount(&ndev));
  if (ndev < 1) { fprintf(stderr, "rank %d: no CUDA device\n", o.rank); return 2; }
  int gpu = o.gpu >= 0 ? o.gpu : o.rank % ndev;
  CUDACHECK(cudaSetDevice(gpu));
  cudaDeviceProp prop;
  CUDACHECK(cudaGetDeviceProperties(&prop, gpu));
  int ver = 0;
  NCCLCHECK(ncclGetVersion(&ver));
#ifdef NCCL_MIN_HEADER
  const char* hdr = "nccl_min/nccl.h (no nccl.h was found)";
#else
  char hdr[32];
  snprintf(hdr, sizeof(hdr), "nccl.h %d.%d.%d", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
#endif
  printf("# nccl_direct rank %d/%d pid %d: cuda:%d %s [0x%02x], NCCL_HOSTID=%s, NCCL library %d, "
         "built with %s\n",
         o.rank, o.nranks, (int)getpid(), gpu, prop.name, prop.pciBusID, getenv("NCCL_HOSTID"),
         ver, hdr);
  fflush(stdout);

  ncclUniqueId id;
  if (o.rank == 0) {
    NCCLCHECK(ncclGetUniqueId(&id));
    write_id(o.id_file, id);
  } else {
    id = read_id(o.id_file, o.timeout);
  }
  NCCLCHECK(ncclCommInitRank(&g_comm, o.nranks, id, o.rank));

  cudaStream_t stream;
  CUDACHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  float *send = nullptr, *recv = nullptr;
  unsigned long long* wrong_dev = nullptr;
  CUDACHECK(cudaMalloc(&send, o.maxb));
  CUDACHECK(cudaMalloc(&recv, o.maxb));
  CUDACHECK(cudaMalloc(&wrong_dev, sizeof(unsigned long long)));
  cudaEvent_t ev0, ev1;
  CUDACHECK(cudaEventCreate(&ev0));
  CUDACHECK(cudaEventCreate(&ev1));
  const int threads = 512, blocks = 1024;
  int next = (o.rank + 1) % o.nranks, prev = (o.rank - 1 + o.nranks) % o.nranks;

  unsigned long long total_wrong = 0;
  double bw_sum = 0;
  int bw_n = 0;
  for (int test = 0; test < 2; test++) {
    const bool ar = test == 0;
    if (o.rank == 0)
      header(ar ? "ncclAllReduce float32 sum, out of place" : "ncclSend/ncclRecv ring exchange, float32",
             ar ? "all_reduce" : "sendrecv");
    for (size_t size = o.minb; size <= o.maxb; size *= o.factor) {
      size_t count = size / sizeof(float);
      int n = (int)std::max<size_t>(1, std::min<size_t>((size_t)o.iters, o.cap / size));
      int w = std::max(1, std::min(o.warmup, n));
      fill_pattern<<<blocks, threads, 0, stream>>>(send, count, o.rank);
      CUDACHECK(cudaGetLastError());
      auto op = [&]() {
        if (ar) {
          NCCLCHECK(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, g_comm, stream));
        } else {
          NCCLCHECK(ncclGroupStart());
          NCCLCHECK(ncclSend(send, count, ncclFloat, next, g_comm, stream));
          NCCLCHECK(ncclRecv(recv, count, ncclFloat, prev, g_comm, stream));
          NCCLCHECK(ncclGroupEnd());
        }
      };
      for (int i = 0; i < w; i++) op();
      wait_stream(stream, o.timeout);
      CUDACHECK(cudaEventRecord(ev0, stream));
      for (int i = 0; i < n; i++) op();
      CUDACHECK(cudaEventRecord(ev1, stream));
      wait_stream(stream, o.timeout);
      float ms = 0;
      CUDACHECK(cudaEventElapsedTime(&ms, ev0, ev1));
      // Check the timed loop's result, then a fresh call into a poisoned buffer.
      CUDACHECK(cudaMemsetAsync(wrong_dev, 0, sizeof(unsigned long long), stream));
      count_wrong<<<blocks, threads, 0, stream>>>(recv, count, o.nranks, ar ? 0 : 1, prev, wrong_dev);
      CUDACHECK(cudaMemsetAsync(recv, 0xff, size, stream));  // NaN
      op();
      count_wrong<<<blocks, threads, 0, stream>>>(recv, count, o.nranks, ar ? 0 : 1, prev, wrong_dev);
      // Sum the wrong counts of every rank (also a last small collective through the transport).
      NCCLCHECK(ncclAllReduce(wrong_dev, wrong_dev, 1, ncclUint64, ncclSum, g_comm, stream));
      unsigned long long wrong = 0;
      CUDACHECK(cudaMemcpyAsync(&wrong, wrong_dev, sizeof(wrong), cudaMemcpyDeviceToHost, stream));
      wait_stream(stream, o.timeout);
      total_wrong += wrong;
      double sec = ms / 1e3 / n;
      double algbw = size / sec / 1e9;
      double busbw = ar ? algbw * 2.0 * (o.nranks - 1) / o.nranks : algbw;
      bw_sum += busbw;
      bw_n++;
      if (o.rank == 0) {
        printf("%12zu  %12zu  %8s  %6s  %6d  %7.1f  %6.2f  %6.2f  %5llu\n", size, count, "float",
               ar ? "sum" : "none", -1, sec * 1e6, algbw, busbw, wrong);
        fflush(stdout);
      }
      if (o.factor == 1) break;
    }
  }
  if (o.rank == 0) {
    printf("# Out of bounds values : %llu %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g \n#\n", bw_n ? bw_sum / bw_n : 0.0);
    fflush(stdout);
  }
  CUDACHECK(cudaStreamSynchronize(stream));
  NCCLCHECK(ncclCommDestroy(g_comm));
  cudaFree(send);
  cudaFree(recv);
  cudaFree(wrong_dev);
  if (o.rank == 0) unlink(o.id_file.c_str());
  return total_wrong ? 1 : 0;
}
