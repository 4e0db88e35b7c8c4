/* softroce ABI smoke test: compiled against the installed rdma-core 44
 * <infiniband/verbs.h>, linked against softroce's libibverbs.so.1, so every
 * static-inline verb of the header dispatches through the objects we return.
 * Also dlopen(RTLD_NOW)s the library and resolves versioned symbols.
 * Needs SOFTROCE_ADDR (a free 127.x address). Prints "N passed, M failed". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int pass, fail;
#define CHECK(cond, ...)                                   \
    do {                                                   \
        if (cond) {                                        \
            pass++;                                        \
        } else {                                           \
            fail++;                                        \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);    \
            printf(__VA_ARGS__);                           \
            printf(" (errno %d)\n", errno);                \
        }                                                  \
    } while (0)

int main(int argc, char **argv)
{
    const char *lib = argc > 1 ? argv[1] : "libibverbs.so.1";
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n >= 1, "ibv_get_device_list");
    if (!list || n < 1)
        return 1;
    CHECK(strcmp(ibv_get_device_name(list[0]), "softroce0") == 0, "device name");
    CHECK(list[0]->node_type == IBV_NODE_CA && list[0]->transport_type == IBV_TRANSPORT_IB,
          "node/transport type");
    struct ibv_context *ctx = ibv_open_device(list[0]);
    CHECK(ctx != NULL, "ibv_open_device");
    if (!ctx)
        return 1;

    /* inline ibv_query_device_ex -> verbs_context.query_device_ex */
    struct ibv_device_attr_ex dx;
    memset(&dx, 0xab, sizeof(dx));
    CHECK(ibv_query_device_ex(ctx, NULL, &dx) == 0, "ibv_query_device_ex");
    CHECK(dx.orig_attr.vendor_id != 0 && dx.orig_attr.max_qp_rd_atom > 0 && dx.orig_attr.phys_port_cnt == 1,
          "device_ex attributes");
    CHECK(dx.comp_mask == 0 && dx.max_dm_size == 0, "device_ex tail zeroed");

    /* inline ibv_query_port -> verbs_context.query_port (52-byte struct) */
    struct ibv_port_attr pa;
    memset(&pa, 0xab, sizeof(pa));
    CHECK(ibv_query_port(ctx, 1, &pa) == 0, "ibv_query_port");
    CHECK(pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_ETHERNET && pa.lid == 0,
          "port attributes");
    CHECK(pa.port_cap_flags2 == 0, "port_cap_flags2 written");
    CHECK(ibv_query_port(ctx, 2, &pa) != 0, "port 2 must not exist");

    /* ibv_query_gid_ex macro -> _ibv_query_gid_ex */
    struct ibv_gid_entry ge;
    CHECK(ibv_query_gid_ex(ctx, 1, 3, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2, "gid 3 RoCE v2");
    CHECK(ibv_query_gid_ex(ctx, 1, 2, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V1, "gid 2 RoCE v1");
    CHECK(ibv_query_gid_ex(ctx, 1, 7, &ge, 0) == ENODATA, "empty gid slot -> ENODATA");
    struct ibv_gid_entry table[16];
    CHECK(ibv_query_gid_table(ctx, table, 16, 0) == 4, "gid table has 4 entries");

    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd != NULL, "ibv_alloc_pd");
    static char buf[8192];
    /* macro: non-constant access -> ibv_reg_mr_iova2; optional bits ignored */
    volatile int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_RELAXED_ORDERING;
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), access);
    CHECK(mr && mr->lkey && mr->rkey && mr->addr == buf && mr->length == sizeof(buf), "ibv_reg_mr");
    errno = 0;
    CHECK(ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL,
          "REMOTE_WRITE without LOCAL_WRITE rejected");

    struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
    CHECK(ch && ch->fd >= 0, "comp channel");
    struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, ch, 0);
    CHECK(cq && cq->context == ctx && cq->channel == ch, "ibv_create_cq");
    CHECK(ibv_req_notify_cq(cq, 0) == 0, "inline ibv_req_notify_cq");
    struct ibv_wc wc;
    CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "inline ibv_poll_cq on empty CQ");

    /* extended CQ: the poll API through the ibv_cq_ex slots */
    struct ibv_cq_init_attr_ex cqx = {.cqe = 16, .wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP};
    struct ibv_cq_ex *cqex = ibv_create_cq_ex(ctx, &cqx);
    CHECK(cqex != NULL && ibv_cq_ex_to_cq(cqex)->context == ctx, "ibv_create_cq_ex");
    if (cqex) {
        struct ibv_poll_cq_attr pattr = {0};
        CHECK(ibv_start_poll(cqex, &pattr) == ENOENT, "ibv_start_poll on an empty CQ -> ENOENT");
        CHECK(ibv_poll_cq(ibv_cq_ex_to_cq(cqex), 1, &wc) == 0, "ibv_poll_cq works on a cq_ex");
        CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cqex)) == 0, "destroy cq_ex");
    }
    struct ibv_cq_init_attr_ex cqbad = {.cqe = 16, .wc_flags = IBV_WC_EX_WITH_FLOW_TAG};
    errno = 0;
    CHECK(ibv_create_cq_ex(ctx, &cqbad) == NULL && errno == EOPNOTSUPP, "unsupported wc_flags -> EOPNOTSUPP");
    CHECK(dx.completion_timestamp_mask != 0 && dx.hca_core_clock != 0, "timestamp capability");

    /* extended verbs we do not offer fail cleanly through the header's checks */
    errno = 0;
    CHECK(ibv_alloc_mw(pd, IBV_MW_TYPE_1) == NULL && errno == EOPNOTSUPP, "ibv_alloc_mw -> EOPNOTSUPP");
    struct ibv_srq_init_attr sa = {.attr = {.max_wr = 2, .max_sge = 1}};
    struct ibv_srq *srq = ibv_create_srq(pd, &sa);
    CHECK(srq != NULL && srq->context == ctx, "ibv_create_srq");
    if (srq) {
        struct ibv_sge rs = {.addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey};
        struct ibv_recv_wr rw = {.wr_id = 7, .sg_list = &rs, .num_sge = 1}, *rbad = NULL;
        CHECK(ibv_post_srq_recv(srq, &rw, &rbad) == 0, "inline ibv_post_srq_recv");
        CHECK(ibv_post_srq_recv(srq, &rw, &rbad) == 0, "second WQE");
        CHECK(ibv_post_srq_recv(srq, &rw, &rbad) == ENOMEM && rbad == &rw, "SRQ full -> ENOMEM");
        struct ibv_srq_attr sq = {.srq_limit = 1};
        CHECK(ibv_modify_srq(srq, &sq, IBV_SRQ_LIMIT) == 0, "arm SRQ limit");
        memset(&sq, 0, sizeof(sq));
        CHECK(ibv_query_srq(srq, &sq) == 0 && sq.max_wr == 2 && sq.srq_limit == 1, "ibv_query_srq");
        CHECK(ibv_destroy_srq(srq) == 0, "ibv_destroy_srq");
    }

    /* ibv_create_qp_ex with comp_mask == PD falls back to ibv_create_qp */
    struct ibv_qp_init_attr_ex qx = {
        .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
        .comp_mask = IBV_QP_INIT_ATTR_PD, .pd = pd,
    };
    struct ibv_qp *qp = ibv_create_qp_ex(ctx, &qx);
    CHECK(qp && qp->qp_num > 1 && qp->state == IBV_QPS_RESET && qp->context == ctx, "ibv_create_qp_ex(PD)");
    CHECK(qx.cap.max_inline_data > 0, "granted caps written back");
    CHECK(ibv_qp_to_qp_ex(qp) == NULL, "no qp_ex extension");
    struct ibv_qp_init_attr uq = {.qp_type = IBV_QPT_UD, .send_cq = cq, .recv_cq = cq,
                                  .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
    errno = 0;
    CHECK(ibv_create_qp(pd, &uq) == NULL && errno == EOPNOTSUPP, "UD QP -> EOPNOTSUPP");

    /* post_send in RESET is refused with EINVAL (inline ibv_post_send) */
    struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey};
    struct ibv_send_wr swr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                              .send_flags = IBV_SEND_SIGNALED}, *bad = NULL;
    CHECK(ibv_post_send(qp, &swr, &bad) == EINVAL && bad == &swr, "post_send in RESET -> EINVAL, bad_wr set");
    /* an illegal transition (RESET -> RTR) fails */
    struct ibv_qp_attr at = {.qp_state = IBV_QPS_RTR};
    CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE) != 0, "RESET -> RTR refused");
    struct ibv_qp_attr qa;
    struct ibv_qp_init_attr qia;
    CHECK(ibv_query_qp(qp, &qa, IBV_QP_STATE | IBV_QP_CAP, &qia) == 0 && qa.qp_state == IBV_QPS_RESET &&
              qia.cap.max_send_wr == qx.cap.max_send_wr,
          "ibv_query_qp");

    CHECK(ibv_destroy_cq(cq) == EBUSY, "CQ in use -> EBUSY");
    CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
    CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
    CHECK(ibv_destroy_comp_channel(ch) == 0, "ibv_destroy_comp_channel");
    CHECK(ibv_dealloc_pd(pd) == EBUSY, "PD with an MR -> EBUSY");
    CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
    CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
    CHECK(strcmp(ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR), "remote access error") == 0, "wc status string");
    CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
    ibv_free_device_list(list);

    /* dlopen(RTLD_NOW) + versioned lookups, as a plugin loading verbs at run time does */
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL, "dlopen(%s): %s", lib, dlerror());
    if (h) {
        CHECK(dlvsym(h, "ibv_get_device_list", "IBVERBS_1.1") != NULL, "ibv_get_device_list@IBVERBS_1.1");
        CHECK(dlvsym(h, "ibv_reg_mr_iova2", "IBVERBS_1.8") != NULL, "ibv_reg_mr_iova2@IBVERBS_1.8");
        CHECK(dlvsym(h, "_ibv_query_gid_ex", "IBVERBS_1.11") != NULL, "_ibv_query_gid_ex@IBVERBS_1.11");
        CHECK(dlvsym(h, "ibv_reg_dmabuf_mr", "IBVERBS_1.12") != NULL, "ibv_reg_dmabuf_mr@IBVERBS_1.12");
        CHECK(dlvsym(h, "ibv_query_gid_type", "IBVERBS_PRIVATE_34") != NULL, "ibv_query_gid_type@PRIVATE_34");
        CHECK(dlsym(h, "softroce_internal_does_not_exist") == NULL, "no stray exports");
        dlclose(h);
    }
    printf("%d passed, %d failed\n", pass, fail);
    return fail ? 1 : 0;
}
