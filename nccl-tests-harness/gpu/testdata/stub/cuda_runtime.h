/* Stub CUDA runtime for CPU-only checks of nccl_direct.cu (ci/tests/60-gpu-scripts.sh), used with
 * nccl_min/nccl.h: (1) a syntax check of the host code; (2) a CPU run, with fake_nccl.cpp, of the
 * whole program with one rank. Kernels become plain calls: the test rewrites "k<<<cfg>>>(args)" as
 * "(launch_config(cfg), k)(args)", and with gridDim = blockDim = 1 the kernels' grid-stride loops
 * cover every element on the CPU. Memory is host memory; streams and events are synchronous. */
#pragma once
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#define __global__
#define __device__
#define __host__
typedef enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorNotReady = 600 } cudaError_t;
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
struct dim3_stub { unsigned x, y, z; };
static const dim3_stub blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0}, blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
struct cudaDeviceProp { char name[256]; int pciBusID; };
enum cudaMemcpyKind { cudaMemcpyDeviceToHost = 2 };
#define cudaStreamNonBlocking 0x01
template <class... A> inline int launch_config(A...) { return 0; }
inline const char* cudaGetErrorName(cudaError_t) { return "cudaErrorStub"; }
inline const char* cudaGetErrorString(cudaError_t) { return "stub"; }
inline cudaError_t cudaGetDeviceCount(int* n) { *n = 1; return cudaSuccess; }
inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  strcpy(p->name, "CPU stub");
  p->pciBusID = 0;
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) { *s = nullptr; return cudaSuccess; }
inline cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
template <class T> inline cudaError_t cudaMalloc(T** p, size_t n) {
  *p = (T*)malloc(n);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFree(void* p) { free(p); return cudaSuccess; }
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) { memset(p, v, n); return cudaSuccess; }
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) {
  memcpy(d, s, n);
  return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* e) { *e = nullptr; return cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) { *ms = 1.0f; return cudaSuccess; }
inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  unsigned long long o = *p;
  *p += v;
  return o;
}
