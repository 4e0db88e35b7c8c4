/* Static layout checks of include/ferroce/nccl_net.h against spec/nccl-net-abi.md (sections 1,
 * 3, 4). Compiling this file is the test; running it prints one line so the suite can count it. */
#include <ferroce/ferroce_abi.h> /* cbindgen's rendering of the Rust declarations */
#include <ferroce/nccl_net.h>    /* the hand-written declarations from the spec */
#include <stddef.h>
#include <stdio.h>

#define CHECK_SIZE(t, n) _Static_assert(sizeof(t) == (n), "sizeof " #t)
#define CHECK_OFF(t, f, n) _Static_assert(offsetof(t, f) == (n), "offsetof " #t "." #f)

CHECK_SIZE(ferroce_net_device_handle_t, 32);
CHECK_OFF(ferroce_net_device_handle_t, netDeviceVersion, 4);
CHECK_OFF(ferroce_net_device_handle_t, handle, 8);
CHECK_OFF(ferroce_net_device_handle_t, size, 16);
CHECK_OFF(ferroce_net_device_handle_t, needsProxyProgress, 24);
CHECK_SIZE(ferroce_vdevice_props_v9_t, 20);
CHECK_SIZE(ferroce_vdevice_props_v12_t, 36);
CHECK_SIZE(ferroce_net_comm_config_t, 4);
CHECK_SIZE(ferroce_net_comm_attr_t, 16);
CHECK_SIZE(ferroce_net_attr_t, 44);
CHECK_OFF(ferroce_net_attr_t, recvCommAttr, 16);
CHECK_OFF(ferroce_net_attr_t, op, 32);
CHECK_OFF(ferroce_net_attr_t, algo, 36);
CHECK_OFF(ferroce_net_attr_t, proto, 40);

/* Properties (spec section 4). */
#define COMMON(t) CHECK_OFF(t, name, 0); CHECK_OFF(t, pciPath, 8); CHECK_OFF(t, guid, 16); CHECK_OFF(t, ptrSupport, 24)
COMMON(ferroce_net_properties_v6_t);
CHECK_OFF(ferroce_net_properties_v6_t, speed, 28);
CHECK_OFF(ferroce_net_properties_v6_t, port, 32);
CHECK_OFF(ferroce_net_properties_v6_t, latency, 36);
CHECK_OFF(ferroce_net_properties_v6_t, maxComms, 40);
CHECK_OFF(ferroce_net_properties_v6_t, maxRecvs, 44);
CHECK_SIZE(ferroce_net_properties_v6_t, 48);

COMMON(ferroce_net_properties_v7_t);
CHECK_OFF(ferroce_net_properties_v7_t, speed, 28);
CHECK_OFF(ferroce_net_properties_v7_t, maxRecvs, 44);
CHECK_OFF(ferroce_net_properties_v7_t, netDeviceType, 48);
CHECK_OFF(ferroce_net_properties_v7_t, netDeviceVersion, 52);
CHECK_SIZE(ferroce_net_properties_v7_t, 56);

COMMON(ferroce_net_properties_v8_t);
CHECK_OFF(ferroce_net_properties_v8_t, regIsGlobal, 28);
CHECK_OFF(ferroce_net_properties_v8_t, speed, 32);
CHECK_OFF(ferroce_net_properties_v8_t, port, 36);
CHECK_OFF(ferroce_net_properties_v8_t, latency, 40);
CHECK_OFF(ferroce_net_properties_v8_t, maxComms, 44);
CHECK_OFF(ferroce_net_properties_v8_t, maxRecvs, 48);
CHECK_OFF(ferroce_net_properties_v8_t, netDeviceType, 52);
CHECK_OFF(ferroce_net_properties_v8_t, netDeviceVersion, 56);
CHECK_SIZE(ferroce_net_properties_v8_t, 64);

#define V9ON(t) \
  COMMON(t); CHECK_OFF(t, regIsGlobal, 28); CHECK_OFF(t, forceFlush, 32); CHECK_OFF(t, speed, 36); \
  CHECK_OFF(t, port, 40); CHECK_OFF(t, latency, 44); CHECK_OFF(t, maxComms, 48); CHECK_OFF(t, maxRecvs, 52); \
  CHECK_OFF(t, netDeviceType, 56); CHECK_OFF(t, netDeviceVersion, 60); CHECK_OFF(t, vProps, 64)
V9ON(ferroce_net_properties_v9_t);
CHECK_OFF(ferroce_net_properties_v9_t, maxP2pBytes, 88);
CHECK_OFF(ferroce_net_properties_v9_t, maxCollBytes, 96);
CHECK_SIZE(ferroce_net_properties_v9_t, 104);
CHECK_SIZE(ferroce_net_properties_v10_t, 104);
V9ON(ferroce_net_properties_v11_t);
CHECK_OFF(ferroce_net_properties_v11_t, maxP2pBytes, 88);
CHECK_OFF(ferroce_net_properties_v11_t, maxCollBytes, 96);
CHECK_OFF(ferroce_net_properties_v11_t, maxMultiRequestSize, 104);
CHECK_SIZE(ferroce_net_properties_v11_t, 112);
V9ON(ferroce_net_properties_v12_t);
CHECK_OFF(ferroce_net_properties_v12_t, maxP2pBytes, 104);
CHECK_OFF(ferroce_net_properties_v12_t, maxCollBytes, 112);
CHECK_OFF(ferroce_net_properties_v12_t, maxMultiRequestSize, 120);
CHECK_OFF(ferroce_net_properties_v12_t, railId, 124);
CHECK_OFF(ferroce_net_properties_v12_t, planeId, 126);
CHECK_SIZE(ferroce_net_properties_v12_t, 128);

/* Function tables (spec section 3): slot k at offset 8k. */
#define SLOTS16(t) \
  CHECK_OFF(t, init, 8); CHECK_OFF(t, devices, 16); CHECK_OFF(t, getProperties, 24); CHECK_OFF(t, listen, 32); \
  CHECK_OFF(t, connect, 40); CHECK_OFF(t, accept, 48); CHECK_OFF(t, regMr, 56); CHECK_OFF(t, regMrDmaBuf, 64); \
  CHECK_OFF(t, deregMr, 72); CHECK_OFF(t, isend, 80); CHECK_OFF(t, irecv, 88); CHECK_OFF(t, iflush, 96); \
  CHECK_OFF(t, test, 104); CHECK_OFF(t, closeSend, 112); CHECK_OFF(t, closeRecv, 120); CHECK_OFF(t, closeListen, 128)
SLOTS16(ferroce_net_v6_t);
CHECK_SIZE(ferroce_net_v6_t, 136);
SLOTS16(ferroce_net_v7_t);
CHECK_OFF(ferroce_net_v7_t, getDeviceMr, 136);
CHECK_OFF(ferroce_net_v7_t, irecvConsumed, 144);
CHECK_SIZE(ferroce_net_v7_t, 152);
SLOTS16(ferroce_net_v8_t);
CHECK_SIZE(ferroce_net_v8_t, 152);
SLOTS16(ferroce_net_v9_t);
CHECK_OFF(ferroce_net_v9_t, makeVDevice, 152);
CHECK_SIZE(ferroce_net_v9_t, 160);
SLOTS16(ferroce_net_v10_t);
CHECK_SIZE(ferroce_net_v10_t, 160);
SLOTS16(ferroce_net_v11_t);
CHECK_OFF(ferroce_net_v11_t, makeVDevice, 152);
CHECK_OFF(ferroce_net_v11_t, finalize, 160);
CHECK_OFF(ferroce_net_v11_t, setNetAttr, 168);
CHECK_SIZE(ferroce_net_v11_t, 176);
SLOTS16(ferroce_net_v12_t);
CHECK_OFF(ferroce_net_v12_t, finalize, 160);
CHECK_SIZE(ferroce_net_v12_t, 176);

/* The Rust declarations (through cbindgen) agree with the hand-written header. */
#define SAME(rs, c) _Static_assert(sizeof(rs) == sizeof(c), "Rust and C disagree on " #c)
SAME(ferroce_rs_NcclNetV6, ferroce_net_v6_t);
SAME(ferroce_rs_NcclNetV7, ferroce_net_v7_t);
SAME(ferroce_rs_NcclNetV8, ferroce_net_v8_t);
SAME(ferroce_rs_NcclNetV9, ferroce_net_v9_t);
SAME(ferroce_rs_NcclNetV10, ferroce_net_v10_t);
SAME(ferroce_rs_NcclNetV11, ferroce_net_v11_t);
SAME(ferroce_rs_NcclNetV12, ferroce_net_v12_t);
SAME(ferroce_rs_NcclNetPropertiesV6, ferroce_net_properties_v6_t);
SAME(ferroce_rs_NcclNetPropertiesV7, ferroce_net_properties_v7_t);
SAME(ferroce_rs_NcclNetPropertiesV8, ferroce_net_properties_v8_t);
SAME(ferroce_rs_NcclNetPropertiesV9, ferroce_net_properties_v9_t);
SAME(ferroce_rs_NcclNetPropertiesV11, ferroce_net_properties_v11_t);
SAME(ferroce_rs_NcclNetPropertiesV12, ferroce_net_properties_v12_t);
SAME(ferroce_rs_NcclNetDeviceHandle, ferroce_net_device_handle_t);
SAME(ferroce_rs_NcclNetAttr, ferroce_net_attr_t);
_Static_assert(offsetof(ferroce_rs_NcclNetPropertiesV12, max_p2p_bytes) == offsetof(ferroce_net_properties_v12_t, maxP2pBytes), "v12 maxP2pBytes");
_Static_assert(offsetof(ferroce_rs_NcclNetPropertiesV12, plane_id) == offsetof(ferroce_net_properties_v12_t, planeId), "v12 planeId");
_Static_assert(offsetof(ferroce_rs_NcclNetV12, set_net_attr) == offsetof(ferroce_net_v12_t, setNetAttr), "v12 setNetAttr");
_Static_assert(offsetof(ferroce_rs_NcclNetV9, make_vdevice) == offsetof(ferroce_net_v9_t, makeVDevice), "v9 makeVDevice");

int main(void) {
  printf("abi_layout_test: every size and offset of spec sections 1, 3, 4 holds\n");
  return 0;
}
