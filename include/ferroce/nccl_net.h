/* ferroce: the NCCL net plugin ABI (v6-v12) as this project declares it.
 *
 * Written from the layout tables of shared/spec/nccl-net-abi.md (sections 1, 3, 4); this is
 * not NCCL's header. Rust declares the same layouts in src/abi/types.rs; both sides assert
 * every size and offset (c_shim/abi_layout_test.c, `cargo test`).
 *
 * A plugin exports data symbols `ncclNetPlugin_vN` of type ferroce_net_vN_t.
 */
#ifndef FERROCE_NCCL_NET_H
#define FERROCE_NCCL_NET_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ncclResult_t */
typedef int ferroce_result_t;
enum {
  FERROCE_NCCL_SUCCESS = 0,
  FERROCE_NCCL_UNHANDLED_CUDA_ERROR = 1,
  FERROCE_NCCL_SYSTEM_ERROR = 2,
  FERROCE_NCCL_INTERNAL_ERROR = 3,
  FERROCE_NCCL_INVALID_ARGUMENT = 4,
  FERROCE_NCCL_INVALID_USAGE = 5,
  FERROCE_NCCL_REMOTE_ERROR = 6,
  FERROCE_NCCL_IN_PROGRESS = 7
};

/* ncclDebugLogLevel and ncclDebugLogSubSys */
enum { FERROCE_LOG_NONE = 0, FERROCE_LOG_VERSION = 1, FERROCE_LOG_WARN = 2, FERROCE_LOG_INFO = 3, FERROCE_LOG_ABORT = 4, FERROCE_LOG_TRACE = 5 };
#define FERROCE_LOG_INIT 0x1UL
#define FERROCE_LOG_NET 0x10UL
#define FERROCE_LOG_ENV 0x80UL
#define FERROCE_LOG_ALL (~0UL)

/* ncclDebugLogger_t: variadic, printf-style. */
typedef void (*ferroce_logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
/* ncclProfilerCallback_t */
typedef ferroce_result_t (*ferroce_profiler_callback_t)(void** eHandle, int type, void* pHandle, int64_t pluginId, void* extData);

#define FERROCE_NET_HANDLE_MAXSIZE 128
#define FERROCE_PTR_HOST 0x1
#define FERROCE_PTR_CUDA 0x2
#define FERROCE_PTR_DMABUF 0x4
#define FERROCE_NET_OPTIONAL_RECV_COMPLETION 0x1
#define FERROCE_NET_DEVICE_HOST 0
#define FERROCE_NET_MAX_DEVS_PER_NIC_V9 4
#define FERROCE_NET_MAX_DEVS_PER_NIC_V12 8

/* ncclNetDeviceHandle_v7..v12: 32 bytes */
typedef struct {
  int netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
} ferroce_net_device_handle_t;

/* ncclNetVDeviceProps */
typedef struct { int ndevs; int devs[FERROCE_NET_MAX_DEVS_PER_NIC_V9]; } ferroce_vdevice_props_v9_t;
typedef struct { int ndevs; int devs[FERROCE_NET_MAX_DEVS_PER_NIC_V12]; } ferroce_vdevice_props_v12_t;

/* ncclNetCommConfig (v10+) */
typedef struct { int trafficClass; } ferroce_net_comm_config_t;

/* ncclNetCommAttr / ncclNetAttr (v11+) */
typedef struct { int32_t maxConcurrentPeers, minConcurrentPeers, maxFlowsPerPeer, minFlowsPerPeer; } ferroce_net_comm_attr_t;
typedef struct {
  ferroce_net_comm_attr_t sendCommAttr;
  ferroce_net_comm_attr_t recvCommAttr;
  uint32_t op;
  uint32_t algo;
  uint32_t proto;
} ferroce_net_attr_t;

/* ncclNetProperties_v6 */
typedef struct {
  const char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
} ferroce_net_properties_v6_t;

/* ncclNetProperties_v7 */
typedef struct {
  const char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
} ferroce_net_properties_v7_t;

/* ncclNetProperties_v8 */
typedef struct {
  const char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
} ferroce_net_properties_v8_t;

/* ncclNetProperties_v9 (also v10) */
typedef struct {
  const char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
  ferroce_vdevice_props_v9_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
} ferroce_net_properties_v9_t;

/* ncclNetProperties_v11 */
typedef struct {
  const char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
  ferroce_vdevice_props_v9_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
} ferroce_net_properties_v11_t;

/* ncclNetProperties_v12 */
typedef struct {
  const char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
  ferroce_vdevice_props_v12_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
  int16_t railId;
  int16_t planeId;
} ferroce_net_properties_v12_t;

typedef ferroce_net_properties_v9_t ferroce_net_properties_v10_t;

/* ncclNet_v6 */
typedef struct {
  const char* name;
  ferroce_result_t (*init)(ferroce_logger_t logFunction);
  ferroce_result_t (*devices)(int* ndev);
  ferroce_result_t (*getProperties)(int dev, ferroce_net_properties_v6_t* props);
  ferroce_result_t (*listen)(int dev, void* handle, void** listenComm);
  ferroce_result_t (*connect)(int dev, void* handle, void** sendComm);
  ferroce_result_t (*accept)(void* listenComm, void** recvComm);
  ferroce_result_t (*regMr)(void* comm, void* data, int size, int type, void** mhandle);
  ferroce_result_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ferroce_result_t (*deregMr)(void* comm, void* mhandle);
  ferroce_result_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ferroce_result_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request);
  ferroce_result_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ferroce_result_t (*test)(void* request, int* done, int* sizes);
  ferroce_result_t (*closeSend)(void* sendComm);
  ferroce_result_t (*closeRecv)(void* recvComm);
  ferroce_result_t (*closeListen)(void* listenComm);
} ferroce_net_v6_t;

/* ncclNet_v7 */
typedef struct {
  const char* name;
  ferroce_result_t (*init)(ferroce_logger_t logFunction);
  ferroce_result_t (*devices)(int* ndev);
  ferroce_result_t (*getProperties)(int dev, ferroce_net_properties_v7_t* props);
  ferroce_result_t (*listen)(int dev, void* handle, void** listenComm);
  ferroce_result_t (*connect)(int dev, void* handle, void** sendComm, ferroce_net_device_handle_t** sendDevComm);
  ferroce_result_t (*accept)(void* listenComm, void** recvComm, ferroce_net_device_handle_t** recvDevComm);
  ferroce_result_t (*regMr)(void* comm, void* data, int size, int type, void** mhandle);
  ferroce_result_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ferroce_result_t (*deregMr)(void* comm, void* mhandle);
  ferroce_result_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ferroce_result_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request);
  ferroce_result_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ferroce_result_t (*test)(void* request, int* done, int* sizes);
  ferroce_result_t (*closeSend)(void* sendComm);
  ferroce_result_t (*closeRecv)(void* recvComm);
  ferroce_result_t (*closeListen)(void* listenComm);
  ferroce_result_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ferroce_result_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ferroce_net_v7_t;

/* ncclNet_v8 */
typedef struct {
  const char* name;
  ferroce_result_t (*init)(ferroce_logger_t logFunction);
  ferroce_result_t (*devices)(int* ndev);
  ferroce_result_t (*getProperties)(int dev, ferroce_net_properties_v8_t* props);
  ferroce_result_t (*listen)(int dev, void* handle, void** listenComm);
  ferroce_result_t (*connect)(int dev, void* handle, void** sendComm, ferroce_net_device_handle_t** sendDevComm);
  ferroce_result_t (*accept)(void* listenComm, void** recvComm, ferroce_net_device_handle_t** recvDevComm);
  ferroce_result_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ferroce_result_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ferroce_result_t (*deregMr)(void* comm, void* mhandle);
  ferroce_result_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ferroce_result_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request);
  ferroce_result_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ferroce_result_t (*test)(void* request, int* done, int* sizes);
  ferroce_result_t (*closeSend)(void* sendComm);
  ferroce_result_t (*closeRecv)(void* recvComm);
  ferroce_result_t (*closeListen)(void* listenComm);
  ferroce_result_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ferroce_result_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ferroce_net_v8_t;

/* ncclNet_v9 */
typedef struct {
  const char* name;
  ferroce_result_t (*init)(ferroce_logger_t logFunction);
  ferroce_result_t (*devices)(int* ndev);
  ferroce_result_t (*getProperties)(int dev, ferroce_net_properties_v9_t* props);
  ferroce_result_t (*listen)(int dev, void* handle, void** listenComm);
  ferroce_result_t (*connect)(int dev, void* handle, void** sendComm, ferroce_net_device_handle_t** sendDevComm);
  ferroce_result_t (*accept)(void* listenComm, void** recvComm, ferroce_net_device_handle_t** recvDevComm);
  ferroce_result_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ferroce_result_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ferroce_result_t (*deregMr)(void* comm, void* mhandle);
  ferroce_result_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request);
  ferroce_result_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** request);
  ferroce_result_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ferroce_result_t (*test)(void* request, int* done, int* sizes);
  ferroce_result_t (*closeSend)(void* sendComm);
  ferroce_result_t (*closeRecv)(void* recvComm);
  ferroce_result_t (*closeListen)(void* listenComm);
  ferroce_result_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ferroce_result_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ferroce_result_t (*makeVDevice)(int* d, ferroce_vdevice_props_v9_t* props);
} ferroce_net_v9_t;

/* ncclNet_v10 */
typedef struct {
  const char* name;
  ferroce_result_t (*init)(ferroce_logger_t logFunction, ferroce_profiler_callback_t profFunction);
  ferroce_result_t (*devices)(int* ndev);
  ferroce_result_t (*getProperties)(int dev, ferroce_net_properties_v10_t* props);
  ferroce_result_t (*listen)(int dev, void* handle, void** listenComm);
  ferroce_result_t (*connect)(int dev, ferroce_net_comm_config_t* config, void* handle, void** sendComm, ferroce_net_device_handle_t** sendDevComm);
  ferroce_result_t (*accept)(void* listenComm, void** recvComm, ferroce_net_device_handle_t** recvDevComm);
  ferroce_result_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ferroce_result_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ferroce_result_t (*deregMr)(void* comm, void* mhandle);
  ferroce_result_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request);
  ferroce_result_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles, void** request);
  ferroce_result_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ferroce_result_t (*test)(void* request, int* done, int* sizes);
  ferroce_result_t (*closeSend)(void* sendComm);
  ferroce_result_t (*closeRecv)(void* recvComm);
  ferroce_result_t (*closeListen)(void* listenComm);
  ferroce_result_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ferroce_result_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ferroce_result_t (*makeVDevice)(int* d, ferroce_vdevice_props_v9_t* props);
} ferroce_net_v10_t;

/* ncclNet_v11 */
typedef struct {
  const char* name;
  ferroce_result_t (*init)(void** ctx, uint64_t commId, ferroce_net_comm_config_t* config, ferroce_logger_t logFunction, ferroce_profiler_callback_t profFunction);
  ferroce_result_t (*devices)(int* ndev);
  ferroce_result_t (*getProperties)(int dev, ferroce_net_properties_v11_t* props);
  ferroce_result_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ferroce_result_t (*connect)(void* ctx, int dev, void* handle, void** sendComm, ferroce_net_device_handle_t** sendDevComm);
  ferroce_result_t (*accept)(void* listenComm, void** recvComm, ferroce_net_device_handle_t** recvDevComm);
  ferroce_result_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ferroce_result_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ferroce_result_t (*deregMr)(void* comm, void* mhandle);
  ferroce_result_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request);
  ferroce_result_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles, void** request);
  ferroce_result_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ferroce_result_t (*test)(void* request, int* done, int* sizes);
  ferroce_result_t (*closeSend)(void* sendComm);
  ferroce_result_t (*closeRecv)(void* recvComm);
  ferroce_result_t (*closeListen)(void* listenComm);
  ferroce_result_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ferroce_result_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ferroce_result_t (*makeVDevice)(int* d, ferroce_vdevice_props_v9_t* props);
  ferroce_result_t (*finalize)(void* ctx);
  ferroce_result_t (*setNetAttr)(void* ctx, ferroce_net_attr_t* netAttr);
} ferroce_net_v11_t;

/* ncclNet_v12 */
typedef struct {
  const char* name;
  ferroce_result_t (*init)(void** ctx, uint64_t commId, ferroce_net_comm_config_t* config, ferroce_logger_t logFunction, ferroce_profiler_callback_t profFunction);
  ferroce_result_t (*devices)(int* ndev);
  ferroce_result_t (*getProperties)(int dev, ferroce_net_properties_v12_t* props);
  ferroce_result_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ferroce_result_t (*connect)(void* ctx, int dev, void* handle, void** sendComm, ferroce_net_device_handle_t** sendDevComm);
  ferroce_result_t (*accept)(void* listenComm, void** recvComm, ferroce_net_device_handle_t** recvDevComm);
  ferroce_result_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ferroce_result_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ferroce_result_t (*deregMr)(void* comm, void* mhandle);
  ferroce_result_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request);
  ferroce_result_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles, void** request);
  ferroce_result_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ferroce_result_t (*test)(void* request, int* done, int* sizes);
  ferroce_result_t (*closeSend)(void* sendComm);
  ferroce_result_t (*closeRecv)(void* recvComm);
  ferroce_result_t (*closeListen)(void* listenComm);
  ferroce_result_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ferroce_result_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ferroce_result_t (*makeVDevice)(int* d, ferroce_vdevice_props_v12_t* props);
  ferroce_result_t (*finalize)(void* ctx);
  ferroce_result_t (*setNetAttr)(void* ctx, ferroce_net_attr_t* netAttr);
} ferroce_net_v12_t;

#ifdef __cplusplus
}
#endif

#endif /* FERROCE_NCCL_NET_H */
