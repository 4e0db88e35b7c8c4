/* Stub for a CPU-only *syntax* check of nccl_direct.cu's host code (ci/tests/60-gpu-scripts.sh),
 * used with nccl_min/nccl.h.
 * Declares only what nccl_direct.cu uses, with the CUDA runtime's signatures. Never linked. */
#pragma once
#include <stddef.h>
#define __global__
#define __device__
#define __host__
typedef enum { cudaSuccess = 0, cudaErrorNotReady = 600 } cudaError_t;
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
struct dim3_stub { unsigned x, y, z; };
extern const dim3_stub blockIdx, blockDim, threadIdx, gridDim;
struct cudaDeviceProp { char name[256]; int pciBusID; };
enum cudaMemcpyKind { cudaMemcpyDeviceToHost = 2 };
#define cudaStreamNonBlocking 0x01
const char* cudaGetErrorName(cudaError_t);
const char* cudaGetErrorString(cudaError_t);
cudaError_t cudaGetDeviceCount(int*);
cudaError_t cudaSetDevice(int);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp*, int);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t*, unsigned int);
cudaError_t cudaStreamQuery(cudaStream_t);
cudaError_t cudaStreamSynchronize(cudaStream_t);
template <class T> cudaError_t cudaMalloc(T** p, size_t n);
cudaError_t cudaFree(void*);
cudaError_t cudaMemsetAsync(void*, int, size_t, cudaStream_t);
cudaError_t cudaMemcpyAsync(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t);
cudaError_t cudaEventCreate(cudaEvent_t*);
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t);
cudaError_t cudaEventElapsedTime(float*, cudaEvent_t, cudaEvent_t);
cudaError_t cudaGetLastError(void);
unsigned long long atomicAdd(unsigned long long*, unsigned long long);
/* The check rewrites "kernel<<<cfg>>>(args)" as "(launch_config(cfg), kernel)(args)". */
template <class... A> int launch_config(A...) { return 0; }
