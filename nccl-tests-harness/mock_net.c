/* libnccl-net-mock.so: a minimal NCCL net plugin (ncclNetPlugin_v12 and _v6) over TCP on
 * 127.0.0.1, no RDMA. It exists to test the harness on its own (ranks, rendezvous, the
 * connect/accept loop, pipelining, checks, output) and to show the harness's own overhead. It
 * keeps NCCL's rules: nothing blocks, isend may return a NULL request, sends and receives match
 * in posting order, test() progresses the whole comm.
 * MOCK_NET_CORRUPT=1 flips a bit in every received message, to test the harness's checks.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ferroce/nccl_net.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MOCK_MAGIC 0x6d6f636b6e657431ULL
#define QDEPTH 64

typedef struct mreq mreq_t;
typedef struct {
  int fd;
  int is_send;
  mreq_t* q[QDEPTH];
  unsigned head, tail;
} mcomm_t;

struct mreq {
  mcomm_t* comm;
  char* data;
  size_t size; /* send: bytes; recv: capacity, then the received size */
  uint64_t hdr;
  size_t hdr_done, data_done;
  int done;
};

typedef struct {
  uint64_t magic;
  uint16_t port;
} mhandle_t;

static int set_nb(int fd) { return fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

static ferroce_result_t m_init12(void** ctx, uint64_t id, ferroce_net_comm_config_t* cfg, ferroce_logger_t l,
                                 ferroce_profiler_callback_t p) {
  (void)id, (void)cfg, (void)l, (void)p;
  *ctx = (void*)0x1;
  return 0;
}
static ferroce_result_t m_init6(ferroce_logger_t l) {
  (void)l;
  return 0;
}
static ferroce_result_t m_devices(int* n) {
  *n = 1;
  return 0;
}
static ferroce_result_t m_props12(int dev, ferroce_net_properties_v12_t* p) {
  if (dev != 0) return FERROCE_NCCL_INTERNAL_ERROR;
  memset(p, 0, sizeof *p);
  p->name = "mock0";
  p->ptrSupport = FERROCE_PTR_HOST;
  p->speed = 10000;
  p->maxComms = 65536;
  p->maxRecvs = 1;
  p->vProps.ndevs = 1;
  p->maxP2pBytes = 1ULL << 30;
  p->maxCollBytes = 1ULL << 30;
  p->maxMultiRequestSize = 1;
  p->railId = p->planeId = -1;
  return 0;
}
static ferroce_result_t m_props6(int dev, ferroce_net_properties_v6_t* p) {
  if (dev != 0) return FERROCE_NCCL_INTERNAL_ERROR;
  memset(p, 0, sizeof *p);
  p->name = "mock0";
  p->ptrSupport = FERROCE_PTR_HOST;
  p->speed = 10000;
  p->maxComms = 65536;
  p->maxRecvs = 1;
  return 0;
}
static ferroce_result_t m_listen6(int dev, void* handle, void** lc) {
  (void)dev;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr*)&a, sizeof a) || listen(fd, 16) || getsockname(fd, (struct sockaddr*)&a, &al) ||
      set_nb(fd)) {
    if (fd >= 0) close(fd);
    return FERROCE_NCCL_SYSTEM_ERROR;
  }
  mhandle_t* h = handle;
  memset(handle, 0, FERROCE_NET_HANDLE_MAXSIZE);
  h->magic = MOCK_MAGIC;
  h->port = ntohs(a.sin_port);
  mcomm_t* c = calloc(1, sizeof *c);
  c->fd = fd;
  *lc = c;
  return 0;
}
static ferroce_result_t m_listen12(void* ctx, int dev, void* handle, void** lc) {
  (void)ctx;
  return m_listen6(dev, handle, lc);
}
static ferroce_result_t m_connect6(int dev, void* handle, void** sc) {
  (void)dev;
  mhandle_t* h = handle;
  if (h->magic != MOCK_MAGIC) return FERROCE_NCCL_INTERNAL_ERROR;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = htons(h->port)};
  /* a loopback connect to a listening socket completes from the backlog: no wait for accept */
  if (fd < 0 || connect(fd, (struct sockaddr*)&a, sizeof a)) {
    if (fd >= 0) close(fd);
    return FERROCE_NCCL_REMOTE_ERROR;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  set_nb(fd);
  mcomm_t* c = calloc(1, sizeof *c);
  c->fd = fd;
  c->is_send = 1;
  *sc = c;
  return 0;
}
static ferroce_result_t m_connect12(void* ctx, int dev, void* handle, void** sc, ferroce_net_device_handle_t** dh) {
  (void)ctx, (void)dh;
  return m_connect6(dev, handle, sc);
}
static ferroce_result_t m_accept6(void* lc, void** rc) {
  mcomm_t* l = lc;
  int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) {
    *rc = NULL;
    return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : FERROCE_NCCL_SYSTEM_ERROR;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  mcomm_t* c = calloc(1, sizeof *c);
  c->fd = fd;
  *rc = c;
  return 0;
}
static ferroce_result_t m_accept12(void* lc, void** rc, ferroce_net_device_handle_t** dh) {
  (void)dh;
  return m_accept6(lc, rc);
}
static ferroce_result_t m_reg(void* comm, void* data, size_t size, int type, void** mh) {
  (void)comm, (void)data, (void)size;
  if (type != FERROCE_PTR_HOST) return FERROCE_NCCL_INTERNAL_ERROR;
  *mh = malloc(16);
  return 0;
}
static ferroce_result_t m_reg6(void* comm, void* data, int size, int type, void** mh) {
  return m_reg(comm, data, (size_t)size, type, mh);
}
static ferroce_result_t m_dereg(void* comm, void* mh) {
  (void)comm;
  free(mh);
  return 0;
}

/* Moves bytes for the oldest requests of a comm; 0 or an error code. */
static ferroce_result_t progress(mcomm_t* c) {
  while (c->head != c->tail) {
    mreq_t* r = c->q[c->head % QDEPTH];
    if (r->hdr_done < sizeof r->hdr) {
      ssize_t n = c->is_send ? send(c->fd, (char*)&r->hdr + r->hdr_done, sizeof r->hdr - r->hdr_done, MSG_NOSIGNAL)
                             : recv(c->fd, (char*)&r->hdr + r->hdr_done, sizeof r->hdr - r->hdr_done, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
      if (n <= 0) return FERROCE_NCCL_REMOTE_ERROR;
      r->hdr_done += (size_t)n;
      if (r->hdr_done < sizeof r->hdr) return 0;
      if (!c->is_send) {
        if (r->hdr > r->size) return FERROCE_NCCL_INTERNAL_ERROR; /* larger than the posted buffer */
        r->size = r->hdr;
      }
    }
    if (r->data_done < r->size) {
      ssize_t n = c->is_send ? send(c->fd, r->data + r->data_done, r->size - r->data_done, MSG_NOSIGNAL)
                             : recv(c->fd, r->data + r->data_done, r->size - r->data_done, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
      if (n <= 0) return FERROCE_NCCL_REMOTE_ERROR;
      r->data_done += (size_t)n;
      if (r->data_done < r->size) return 0;
    }
    r->done = 1;
    c->head++;
  }
  return 0;
}

static ferroce_result_t post(mcomm_t* c, void* data, size_t size, void** request) {
  *request = NULL;
  if (c->tail - c->head >= QDEPTH) return 0; /* NULL request: NCCL retries */
  mreq_t* r = calloc(1, sizeof *r);
  r->comm = c, r->data = data, r->size = size, r->hdr = size;
  c->q[c->tail++ % QDEPTH] = r;
  *request = r;
  return progress(c);
}
static ferroce_result_t m_isend12(void* sc, void* data, size_t size, int tag, void* mh, void* ph, void** req) {
  (void)tag, (void)mh, (void)ph;
  return post(sc, data, size, req);
}
static ferroce_result_t m_isend6(void* sc, void* data, int size, int tag, void* mh, void** req) {
  (void)tag, (void)mh;
  return post(sc, data, (size_t)size, req);
}
static ferroce_result_t m_irecv12(void* rc, int n, void** data, size_t* sizes, int* tags, void** mhs, void** phs,
                                  void** req) {
  (void)tags, (void)mhs, (void)phs;
  if (n != 1) return FERROCE_NCCL_INTERNAL_ERROR;
  return post(rc, data[0], sizes[0], req);
}
static ferroce_result_t m_irecv6(void* rc, int n, void** data, int* sizes, int* tags, void** mhs, void** req) {
  (void)tags, (void)mhs;
  if (n != 1) return FERROCE_NCCL_INTERNAL_ERROR;
  return post(rc, data[0], (size_t)sizes[0], req);
}
static ferroce_result_t m_iflush(void* rc, int n, void** data, int* sizes, void** mhs, void** req) {
  (void)rc, (void)n, (void)data, (void)sizes, (void)mhs;
  *req = NULL;
  return 0;
}
static ferroce_result_t m_test(void* request, int* done, int* sizes) {
  mreq_t* r = request;
  ferroce_result_t rc = progress(r->comm);
  if (rc) return rc;
  *done = r->done;
  if (r->done) {
    /* MOCK_NET_CORRUPT=1: damage every received message (tests the harness's result check) */
    if (!r->comm->is_send && r->size >= 4 && getenv("MOCK_NET_CORRUPT")) r->data[1] ^= 0x40;
    if (sizes) sizes[0] = (int)r->size;
    free(r);
  }
  return 0;
}
static ferroce_result_t m_close(void* comm) {
  mcomm_t* c = comm;
  if (!c) return 0;
  close(c->fd);
  free(c);
  return 0;
}
static ferroce_result_t m_finalize(void* ctx) {
  (void)ctx;
  return 0;
}

__attribute__((visibility("default"))) const ferroce_net_v12_t ncclNetPlugin_v12 = {
    .name = "mock", .init = m_init12, .devices = m_devices, .getProperties = m_props12, .listen = m_listen12,
    .connect = m_connect12, .accept = m_accept12, .regMr = m_reg, .regMrDmaBuf = NULL, .deregMr = m_dereg,
    .isend = m_isend12, .irecv = m_irecv12, .iflush = m_iflush, .test = m_test, .closeSend = m_close,
    .closeRecv = m_close, .closeListen = m_close, .getDeviceMr = NULL, .irecvConsumed = NULL, .makeVDevice = NULL,
    .finalize = m_finalize, .setNetAttr = NULL};

__attribute__((visibility("default"))) const ferroce_net_v6_t ncclNetPlugin_v6 = {
    .name = "mock", .init = m_init6, .devices = m_devices, .getProperties = m_props6, .listen = m_listen6,
    .connect = m_connect6, .accept = m_accept6, .regMr = m_reg6, .regMrDmaBuf = NULL, .deregMr = m_dereg,
    .isend = m_isend6, .irecv = m_irecv6, .iflush = m_iflush, .test = m_test, .closeSend = m_close,
    .closeRecv = m_close, .closeListen = m_close};
