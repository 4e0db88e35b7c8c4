/* softroce's verbs work counters, read in-process (softroce/src/driver/counters.rs).
 *
 * softroce's libibverbs.so.1 exports softroce_counters_get; a real libibverbs does not, so look
 * it up at run time:
 *
 *   void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
 *   softroce_counters_get_fn get = lib ? (softroce_counters_get_fn)dlsym(lib, "softroce_counters_get") : NULL;
 *   struct softroce_counters c;
 *   if (get && get(&c, sizeof c) == 0) ...   // c.size bytes were filled
 *
 * Counts are per process, since it started, never reset: take a snapshot before and after what
 * you measure. Fields are only ever appended (SOFTROCE_COUNTERS_VERSION grows); a library older
 * than this header fills fewer bytes (c.size says how many), a newer one only the ones asked for.
 * Layout checked by softroce/src/verbs/layout_tests.rs. */
#ifndef SOFTROCE_COUNTERS_H
#define SOFTROCE_COUNTERS_H

#include <stddef.h>
#include <stdint.h>

#define SOFTROCE_COUNTERS_VERSION 1

struct softroce_counters {
  uint32_t version;         /* SOFTROCE_COUNTERS_VERSION of the library that filled it */
  uint32_t size;            /* bytes it filled */
  uint64_t post_send_calls; /* ibv_post_send and ibv_wr_complete calls */
  uint64_t send_wrs;        /* work requests in them (converted: a malformed WR is not counted) */
  uint64_t signaled_wrs;    /* with IBV_SEND_SIGNALED, or on an sq_sig_all QP */
  uint64_t inline_wrs;      /* with IBV_SEND_INLINE (WRITE and SEND opcodes) */
  uint64_t inline_bytes;    /* their payload bytes */
  uint64_t write_wrs;       /* send WRs by opcode: RDMA WRITE */
  uint64_t write_imm_wrs;   /*   RDMA WRITE with immediate */
  uint64_t send_op_wrs;     /*   SEND, with or without immediate */
  uint64_t read_wrs;        /*   RDMA READ */
  uint64_t atomic_wrs;      /*   compare-and-swap, fetch-and-add */
  uint64_t post_recv_calls; /* ibv_post_recv and ibv_post_srq_recv calls */
  uint64_t recv_wrs;        /* receive work requests in them */
  uint64_t poll_cq_calls;   /* ibv_poll_cq and ibv_start_poll calls */
  uint64_t poll_cq_empty;   /* those that returned no completion */
  uint64_t cqes;            /* completions handed out */
  uint64_t tx_packets;      /* RoCEv2 packets sent, requests and responses */
  uint64_t tx_bytes;        /* their bytes, BTH to ICRC (UDP payload) */
  uint64_t tx_responses;    /* of tx_packets: ACK, NAK, READ response, atomic ACK */
  uint64_t retransmits;     /* request packets sent again (timeout, NAK, probe) */
};

/* Fills *out (size = sizeof *out) with this process's counters; 0, or EINVAL (NULL, size < 8). */
int softroce_counters_get(struct softroce_counters* out, size_t size);
typedef int (*softroce_counters_get_fn)(struct softroce_counters* out, size_t size);

/* One QP's transport events since it was created (a real NIC counts them per port only, in
 * /sys/class/infiniband/DEV/ports/N/hw_counters): look softroce_qp_transport_get up as above
 * (version node SOFTROCE_3). */
#define SOFTROCE_QP_TRANSPORT_VERSION 1

struct ibv_qp;

struct softroce_qp_transport {
  uint32_t version;           /* SOFTROCE_QP_TRANSPORT_VERSION of the library that filled it */
  uint32_t size;              /* bytes it filled */
  uint64_t timeouts;          /* local ACK timeouts (each consumes one retry_cnt): no answer */
  uint64_t retransmits;       /* request packets sent again (timeouts, NAKs, probes) */
  uint64_t rnr_naks_received; /* RNR NAKs: the responder's receive queue was empty */
  uint64_t seq_naks_received; /* PSN sequence error NAKs */
};

/* Fills *out for qp (a QP of this library); 0, or EINVAL (NULL, size < 8). */
int softroce_qp_transport_get(struct ibv_qp* qp, struct softroce_qp_transport* out, size_t size);
typedef int (*softroce_qp_transport_get_fn)(struct ibv_qp* qp, struct softroce_qp_transport* out, size_t size);

#endif
