// Fake NCCL for the CPU run of nccl_direct.cu (ci/tests/60-gpu-scripts.sh): one rank only, data
// copied as a one-rank NCCL would (all_reduce sum of one rank = copy; send/recv to itself = copy at
// ncclGroupEnd). FAKE_NCCL_CORRUPT=1 flips one received float per all_reduce/recv of > 1 element,
// to show that nccl_direct's checks catch it.
#include <nccl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int g_dummy;
static const void* g_send = nullptr;
static void* g_recv = nullptr;
static size_t g_send_bytes = 0, g_recv_bytes = 0;

static size_t type_size(ncclDataType_t t) { return t == ncclUint64 ? 8 : 4; }
static void maybe_corrupt(void* p, size_t count, ncclDataType_t t) {
  const char* c = getenv("FAKE_NCCL_CORRUPT");
  if (c && *c == '1' && t == ncclFloat && count > 1) ((float*)p)[count / 2] += 1.0f;
}

extern "C" {
ncclResult_t ncclGetVersion(int* v) { *v = 22105; return ncclSuccess; }
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) { memset(id, 7, sizeof(*id)); return ncclSuccess; }
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId, int rank) {
  if (nranks != 1 || rank != 0) return (ncclResult_t)5;  // ncclInvalidUsage
  *comm = (ncclComm_t)&g_dummy;
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommAbort(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* e) { *e = ncclSuccess; return ncclSuccess; }
const char* ncclGetErrorString(ncclResult_t) { return "fake NCCL error"; }
const char* ncclGetLastError(ncclComm_t) { return ""; }
ncclResult_t ncclAllReduce(const void* s, void* r, size_t count, ncclDataType_t t, ncclRedOp_t, ncclComm_t,
                           cudaStream_t) {
  memmove(r, s, count * type_size(t));
  maybe_corrupt(r, count, t);
  return ncclSuccess;
}
ncclResult_t ncclSend(const void* s, size_t count, ncclDataType_t t, int peer, ncclComm_t, cudaStream_t) {
  if (peer != 0) return (ncclResult_t)4;  // ncclInvalidArgument
  g_send = s;
  g_send_bytes = count * type_size(t);
  return ncclSuccess;
}
ncclResult_t ncclRecv(void* r, size_t count, ncclDataType_t t, int peer, ncclComm_t, cudaStream_t) {
  if (peer != 0) return (ncclResult_t)4;
  g_recv = r;
  g_recv_bytes = count * type_size(t);
  return ncclSuccess;
}
ncclResult_t ncclGroupStart(void) { g_send = nullptr; g_recv = nullptr; return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) {
  if (g_send && g_recv) {
    if (g_send_bytes != g_recv_bytes) return (ncclResult_t)4;
    memmove(g_recv, g_send, g_send_bytes);
    maybe_corrupt(g_recv, g_recv_bytes / 4, ncclFloat);
  }
  return ncclSuccess;
}
}
