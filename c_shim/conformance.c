/* Loads libnccl-net-ferroce.so exactly as NCCL does (dlopen RTLD_NOW|RTLD_LOCAL, dlsym of each
 * versioned data symbol) and checks the plugin from the C side.
 *
 *   conformance <plugin.so> symbols     every ncclNetPlugin_v6..v12 table, slots, no foreign symbols
 *   conformance <plugin.so> no-device   init fails with one WARN, an error code, no thread left
 *   conformance <plugin.so> devices     (softroce or a real NIC) devices and every property per
 *                                       version, fusion, init/finalize/dlclose/dlopen reload cycle
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <ferroce/nccl_net.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int passed, failed;
#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (cond) {                                            \
      passed++;                                            \
    } else {                                               \
      failed++;                                            \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
    }                                                      \
  } while (0)

/* A logger that records every line, as NCCL's would print it. */
#define MAX_LINES 256
static char lines[MAX_LINES][1024];
static int line_levels[MAX_LINES];
static int nlines;
static void record_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags, (void)file, (void)line;
  if (nlines >= MAX_LINES) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(lines[nlines], sizeof lines[nlines], fmt, ap);
  va_end(ap);
  line_levels[nlines++] = level;
  if (getenv("CONFORMANCE_VERBOSE")) fprintf(stderr, "  [log %d] %s\n", level, lines[nlines - 1]);
}
static int count_level(int level) {
  int n = 0;
  for (int i = 0; i < nlines; i++) n += line_levels[i] == level;
  return n;
}
static const char* first_of_level(int level) {
  for (int i = 0; i < nlines; i++)
    if (line_levels[i] == level) return lines[i];
  return "";
}

/* Whether an INFO line names the plugin's release as "NET/ferroce version X.Y.Z:" — the version
 * NCCL's log shows at init. `want` (FERROCE_VERSION, which 10-plugin-abi.sh reads from
 * Cargo.toml) is the exact release expected; without it any X.Y.Z counts. */
static int info_names_version(const char* want) {
  for (int i = 0; i < nlines; i++) {
    if (line_levels[i] != FERROCE_LOG_INFO) continue;
    const char* p = strstr(lines[i], "NET/ferroce version ");
    unsigned a, b, c;
    char colon;
    if (!p || sscanf(p, "NET/ferroce version %u.%u.%u%c", &a, &b, &c, &colon) != 4 || colon != ':') continue;
    char seen[64];
    snprintf(seen, sizeof seen, "%u.%u.%u", a, b, c);
    if (!want || strcmp(seen, want) == 0) return 1;
  }
  return 0;
}

/* Threads whose name starts with "ferroce" (the plugin's own). */
static int plugin_threads(void) {
  DIR* d = opendir("/proc/self/task");
  int n = 0;
  struct dirent* e;
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[300], name[64] = {0};
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE* f = fopen(path, "r");
    if (!f) continue;
    if (fgets(name, sizeof name, f) && strncmp(name, "ferroce", 7) == 0) n++;
    fclose(f);
  }
  if (d) closedir(d);
  return n;
}

/* plugin_threads() once it equals `want`, waiting up to 2 s: a joined thread's task can stay in
 * /proc/self/task for a moment after pthread_join returned (the join wakes at the thread's exit,
 * before the kernel reaps it; under valgrind noticeably later). */
static int plugin_threads_settled(int want) {
  int n = plugin_threads();
  for (int i = 0; i < 200 && n != want; i++) {
    usleep(10000);
    n = plugin_threads();
  }
  return n;
}

/* Whether a library whose path ends in `path`'s file name is still mapped (glibc keeps a DSO
 * mapped after dlclose while threads it registered thread-local destructors for are alive). */
static int still_mapped(const char* path) {
  const char* base = strrchr(path, '/');
  base = base ? base + 1 : path;
  FILE* f = fopen("/proc/self/maps", "r");
  char line[1024];
  int found = 0;
  while (f && fgets(line, sizeof line, f))
    if (strstr(line, base)) found = 1;
  if (f) fclose(f);
  return found;
}

static void* open_plugin(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  CHECK(h != NULL, "dlopen(%s): %s", path, dlerror());
  return h;
}

/* Every table version, as NCCL probes them (newest first). */
static void check_symbols(const char* path) {
  void* h = open_plugin(path);
  if (!h) return;
  static const char* names[] = {"ncclNetPlugin_v12", "ncclNetPlugin_v11", "ncclNetPlugin_v10", "ncclNetPlugin_v9",
                                "ncclNetPlugin_v8",  "ncclNetPlugin_v7",  "ncclNetPlugin_v6"};
  for (int i = 0; i < 7; i++) {
    int v = 12 - i;
    void** slots = dlsym(h, names[i]);
    CHECK(slots != NULL, "%s not exported", names[i]);
    if (!slots) continue;
    CHECK(slots[0] && strcmp((const char*)slots[0], "ferroce") == 0, "%s name", names[i]);
    int nslots = v == 6 ? 17 : v <= 8 ? 19 : v <= 10 ? 20 : 22;
    for (int k = 1; k < nslots; k++) {
      int optional_null = (v >= 7 && (k == 17 || k == 18)); /* getDeviceMr, irecvConsumed: HOST plugin */
      if (optional_null)
        CHECK(slots[k] == NULL, "%s slot %d must be NULL for a HOST plugin", names[i], k);
      else
        CHECK(slots[k] != NULL, "%s slot %d is NULL", names[i], k);
    }
  }
  static const char* foreign[] = {"ncclCollNetPlugin_v12", "ncclCollNetPlugin_v6", "ncclTunerPlugin_v2", "ncclTunerPlugin_v6",
                                  "ncclProfiler_v1", "ncclProfiler_v6", "ncclGinPlugin_v13", "ncclRmaPlugin_v13",
                                  "ncclNetPlugin_v5", "ncclNetPlugin_v13"};
  for (unsigned i = 0; i < sizeof foreign / sizeof *foreign; i++)
    CHECK(dlsym(h, foreign[i]) == NULL, "%s must not be exported", foreign[i]);
  dlclose(h);
}

/* init must fail with one WARN that names what is missing, for every init flavour. */
static void check_no_device(const char* path) {
  int before = plugin_threads();
  for (int v = 12; v >= 6; v--) {
    void* h = open_plugin(path);
    if (!h) return;
    char sym[32];
    snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", v);
    void** t = dlsym(h, sym);
    nlines = 0;
    int rc;
    if (v >= 11) {
      ferroce_net_v12_t* n = (ferroce_net_v12_t*)t;
      void* ctx = (void*)0x1;
      ferroce_net_comm_config_t cfg = {-1};
      rc = n->init(&ctx, 42, &cfg, record_logger, NULL);
      CHECK(ctx == (void*)0x1, "v%d: init wrote ctx although it failed", v);
    } else if (v == 10) {
      rc = ((ferroce_net_v10_t*)t)->init(record_logger, NULL);
    } else {
      rc = ((ferroce_net_v6_t*)t)->init(record_logger);
    }
    CHECK(rc == FERROCE_NCCL_SYSTEM_ERROR, "v%d: init returned %d, want ncclSystemError", v, rc);
    CHECK(count_level(FERROCE_LOG_WARN) == 1, "v%d: %d WARN lines, want exactly 1", v, count_level(FERROCE_LOG_WARN));
    const char* w = first_of_level(FERROCE_LOG_WARN);
    CHECK(strstr(w, "NET/ferroce") && (strstr(w, "no RDMA device") || strstr(w, "libibverbs")) &&
              (strstr(w, "docs/errors.md") || strstr(w, "docs/softroce-variables.md")),
          "v%d: WARN does not say what is missing and where to look: %s", v, w);
    printf("v%d no-device: rc=%d WARN: %s\n", v, rc, w);
    CHECK(plugin_threads_settled(before) == before, "v%d: %d plugin threads left after a failed init", v, plugin_threads() - before);
    dlclose(h);
  }
}

static void print_props_v12(int v, int dev, const ferroce_net_properties_v12_t* p) {
  printf("v%d dev %d: name=%s pciPath=%s guid=0x%llx ptrSupport=0x%x regIsGlobal=%d forceFlush=%d speed=%d port=%d "
         "latency=%.1f maxComms=%d maxRecvs=%d netDeviceType=%d netDeviceVersion=%d vProps={%d:",
         v, dev, p->name, p->pciPath ? p->pciPath : "(null)", (unsigned long long)p->guid, p->ptrSupport, p->regIsGlobal,
         p->forceFlush, p->speed, p->port, p->latency, p->maxComms, p->maxRecvs, p->netDeviceType, p->netDeviceVersion,
         p->vProps.ndevs);
  for (int i = 0; i < p->vProps.ndevs && i < 8; i++) printf(" %d", p->vProps.devs[i]);
  printf("} maxP2pBytes=%zu maxCollBytes=%zu maxMultiRequestSize=%d railId=%d planeId=%d\n", p->maxP2pBytes,
         p->maxCollBytes, p->maxMultiRequestSize, p->railId, p->planeId);
}

static void check_common_props(int v, int dev, const char* name, int ptrSupport, int speed, int maxComms, int maxRecvs) {
  CHECK(name && name[0], "v%d dev %d: empty name", v, dev);
  CHECK(ptrSupport & FERROCE_PTR_HOST, "v%d dev %d: ptrSupport lacks HOST", v, dev);
  CHECK(speed > 0, "v%d dev %d: speed %d", v, dev, speed);
  CHECK(maxComms > 0, "v%d dev %d: maxComms %d", v, dev, maxComms);
  CHECK(maxRecvs == 8, "v%d dev %d: maxRecvs %d", v, dev, maxRecvs);
}

/* Fills an older struct surrounded by guard bytes, to prove the plugin writes only its size. */
#define GUARDED_PROPS(type, call, v, dev, out)                                                         \
  do {                                                                                               \
    unsigned char buf[sizeof(type) + 64];                                                            \
    memset(buf, 0xA5, sizeof buf);                                                                   \
    int rc_ = call(dev, (type*)buf);                                                                 \
    CHECK(rc_ == 0, "v%d getProperties(%d) = %d", v, dev, rc_);                                      \
    int guard_ok = 1;                                                                                \
    for (size_t g = sizeof(type); g < sizeof buf; g++) guard_ok &= buf[g] == 0xA5;                   \
    CHECK(guard_ok, "v%d getProperties wrote past sizeof(%s)", v, #type);                            \
    memcpy(&(out), buf, sizeof(type));                                                               \
  } while (0)

static void check_version_props(void** t, int v, int ndev) {
  for (int dev = 0; dev < ndev; dev++) {
    if (v == 12) {
      ferroce_net_properties_v12_t p;
      GUARDED_PROPS(ferroce_net_properties_v12_t, ((ferroce_net_v12_t*)t)->getProperties, v, dev, p);
      print_props_v12(v, dev, &p);
      check_common_props(v, dev, p.name, p.ptrSupport, p.speed, p.maxComms, p.maxRecvs);
      CHECK(p.netDeviceType == FERROCE_NET_DEVICE_HOST && p.netDeviceVersion == 0, "v12 device type");
      CHECK(p.maxP2pBytes > 0 && p.maxP2pBytes <= (1ULL << 40), "v12 maxP2pBytes %zu", p.maxP2pBytes);
      CHECK(p.maxCollBytes > 0, "v12 maxCollBytes");
      CHECK(p.maxMultiRequestSize == 1, "v12 maxMultiRequestSize");
      CHECK(p.regIsGlobal == 1 && p.forceFlush == 0, "v12 regIsGlobal/forceFlush");
      CHECK(p.vProps.ndevs >= 1, "v12 vProps.ndevs");
      if (p.vProps.ndevs == 1) CHECK(p.vProps.devs[0] == dev, "v12 vProps of a physical device");
      CHECK(p.railId == -1 && p.planeId == -1, "v12 rail/plane unset without NCCL_IB_HCA rails");
    } else if (v == 11) {
      ferroce_net_properties_v11_t p;
      GUARDED_PROPS(ferroce_net_properties_v11_t, ((ferroce_net_v11_t*)t)->getProperties, v, dev, p);
      check_common_props(v, dev, p.name, p.ptrSupport, p.speed, p.maxComms, p.maxRecvs);
      CHECK(p.maxMultiRequestSize == 1 && p.vProps.ndevs >= 1, "v11 fields");
    } else if (v == 9 || v == 10) {
      ferroce_net_properties_v9_t p;
      GUARDED_PROPS(ferroce_net_properties_v9_t, ((ferroce_net_v9_t*)t)->getProperties, v, dev, p);
      check_common_props(v, dev, p.name, p.ptrSupport, p.speed, p.maxComms, p.maxRecvs);
      CHECK(p.maxP2pBytes > 0 && p.vProps.ndevs >= 1, "v%d fields", v);
    } else if (v == 8) {
      ferroce_net_properties_v8_t p;
      GUARDED_PROPS(ferroce_net_properties_v8_t, ((ferroce_net_v8_t*)t)->getProperties, v, dev, p);
      check_common_props(v, dev, p.name, p.ptrSupport, p.speed, p.maxComms, p.maxRecvs);
      CHECK(p.regIsGlobal == 1 && p.netDeviceType == 0, "v8 fields");
    } else if (v == 7) {
      ferroce_net_properties_v7_t p;
      GUARDED_PROPS(ferroce_net_properties_v7_t, ((ferroce_net_v7_t*)t)->getProperties, v, dev, p);
      check_common_props(v, dev, p.name, p.ptrSupport, p.speed, p.maxComms, p.maxRecvs);
      CHECK(p.netDeviceType == 0 && p.netDeviceVersion == 0, "v7 fields");
    } else {
      ferroce_net_properties_v6_t p;
      GUARDED_PROPS(ferroce_net_properties_v6_t, ((ferroce_net_v6_t*)t)->getProperties, v, dev, p);
      check_common_props(v, dev, p.name, p.ptrSupport, p.speed, p.maxComms, p.maxRecvs);
    }
  }
}

static void check_devices(const char* path) {
  int baseline = plugin_threads();
  /* First (v11+ only, so no legacy init holds the plugin): two communicators (v12 contexts) at once, then the reload cycle NCCL runs when the last
   * communicator goes away: init -> finalize -> dlclose -> dlopen -> init. */
  for (int round = 0; round < 3; round++) {
    void* h = open_plugin(path);
    if (!h) return;
    ferroce_net_v12_t* n = dlsym(h, "ncclNetPlugin_v12");
    void *a = NULL, *b = NULL;
    ferroce_net_comm_config_t cfg = {5};
    CHECK(n->init(&a, 1, &cfg, record_logger, NULL) == 0 && a, "reload round %d: init a", round);
    CHECK(n->init(&b, 2, &cfg, record_logger, NULL) == 0 && b && b != a, "reload round %d: init b", round);
    int nd = 0;
    CHECK(n->devices(&nd) == 0 && nd >= 1, "reload round %d: devices", round);
    CHECK(n->finalize(a) == 0, "reload round %d: finalize a", round);
    CHECK(n->devices(&nd) == 0 && nd >= 1, "reload round %d: devices still there for b", round);
    CHECK(n->finalize(b) == 0, "reload round %d: finalize b", round);
    CHECK(plugin_threads_settled(baseline) == baseline, "reload round %d: threads left", round);
    dlclose(h);
  }

  /* Then every version in turn, newest first, as NCCL probes them. */
  for (int v = 12; v >= 6; v--) {
    void* h = open_plugin(path);
    if (!h) return;
    char sym[32];
    snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", v);
    void** t = dlsym(h, sym);
    nlines = 0;
    void* ctx = NULL;
    int rc;
    ferroce_net_comm_config_t cfg = {-1};
    if (v >= 11)
      rc = ((ferroce_net_v12_t*)t)->init(&ctx, 7, &cfg, record_logger, NULL);
    else if (v == 10)
      rc = ((ferroce_net_v10_t*)t)->init(record_logger, NULL);
    else
      rc = ((ferroce_net_v6_t*)t)->init(record_logger);
    CHECK(rc == 0, "v%d init = %d (%s)", v, rc, first_of_level(FERROCE_LOG_WARN));
    if (rc != 0) {
      dlclose(h);
      continue;
    }
    CHECK(count_level(FERROCE_LOG_WARN) == 0, "v%d: unexpected WARN: %s", v, first_of_level(FERROCE_LOG_WARN));
    if (v == 12) CHECK(count_level(FERROCE_LOG_INFO) >= 2, "v%d: the first init logs the devices and configuration at INFO", v);
    if (v == 12)
      CHECK(info_names_version(getenv("FERROCE_VERSION")), "v%d: no INFO line at init names the release 'NET/ferroce version %s:'", v,
            getenv("FERROCE_VERSION") ? getenv("FERROCE_VERSION") : "X.Y.Z");
    int ndev = 0;
    rc = ((ferroce_net_v6_t*)t)->devices(&ndev);
    CHECK(rc == 0 && ndev >= 1, "v%d devices = %d, n=%d", v, rc, ndev);
    check_version_props(t, v, ndev);

    /* Bad arguments: an error code and a WARN, never a crash. */
    nlines = 0;
    CHECK(((ferroce_net_v6_t*)t)->devices(NULL) == FERROCE_NCCL_INTERNAL_ERROR, "v%d devices(NULL)", v);
    ferroce_net_properties_v6_t junk;
    CHECK(((ferroce_net_v6_t*)t)->getProperties(ndev + 100, &junk) == FERROCE_NCCL_INTERNAL_ERROR, "v%d bad dev", v);
    CHECK(count_level(FERROCE_LOG_WARN) == 2, "v%d: each bad call logs one WARN", v);
    CHECK(((ferroce_net_v6_t*)t)->deregMr(NULL, NULL) == 0, "v%d deregMr(NULL) must succeed", v);
    CHECK(((ferroce_net_v6_t*)t)->closeListen(NULL) == 0, "v%d closeListen(NULL)", v);

    /* Fusion (v9+): two physical devices become one virtual device appended after them. */
    if (v >= 9 && ndev >= 2) {
      int d = -1;
      if (v == 12) {
        ferroce_vdevice_props_v12_t vp = {2, {0, 1}};
        rc = ((ferroce_net_v12_t*)t)->makeVDevice(&d, &vp);
      } else {
        ferroce_vdevice_props_v9_t vp = {2, {0, 1}};
        rc = ((ferroce_net_v9_t*)t)->makeVDevice(&d, &vp);
      }
      int n2 = 0;
      ((ferroce_net_v6_t*)t)->devices(&n2);
      CHECK(rc == 0 && d == ndev && n2 == ndev + 1, "v%d makeVDevice rc=%d d=%d devices %d->%d", v, rc, d, ndev, n2);
      if (v == 12 && rc == 0) {
        ferroce_net_properties_v12_t p0, p1, pv;
        ((ferroce_net_v12_t*)t)->getProperties(0, &p0);
        ((ferroce_net_v12_t*)t)->getProperties(1, &p1);
        ((ferroce_net_v12_t*)t)->getProperties(d, &pv);
        print_props_v12(v, d, &pv);
        char want[256];
        snprintf(want, sizeof want, "%s+%s", p0.name, p1.name);
        CHECK(strcmp(pv.name, want) == 0, "fused name %s, want %s", pv.name, want);
        CHECK(pv.speed == p0.speed + p1.speed, "fused speed is the sum");
        CHECK(pv.vProps.ndevs == 2 && pv.vProps.devs[0] == 0 && pv.vProps.devs[1] == 1, "fused vProps");
        int again = -1;
        ferroce_vdevice_props_v12_t vp = {2, {0, 1}};
        ((ferroce_net_v12_t*)t)->makeVDevice(&again, &vp);
        CHECK(again == d, "the same group twice gives the same device, not a duplicate");
        ferroce_vdevice_props_v12_t bad = {2, {0, 99}};
        CHECK(((ferroce_net_v12_t*)t)->makeVDevice(&again, &bad) != 0, "makeVDevice of a missing device fails");
      }
    }

    if (v >= 11) {
      rc = ((ferroce_net_v12_t*)t)->finalize(ctx);
      CHECK(rc == 0, "v%d finalize = %d", v, rc);
      CHECK(plugin_threads_settled(baseline) == baseline, "v%d: %d plugin threads left after finalize", v, plugin_threads() - baseline);
    }
    dlclose(h);
    /* Pre-v11 NCCL unloads without finalize: if the library is really unmapped, its unload hook
     * must have stopped its threads (no code of it may run any more). */
    if (!still_mapped(path))
      CHECK(plugin_threads_settled(baseline) == baseline, "v%d: %d plugin threads left after the library was unmapped", v,
            plugin_threads() - baseline);
  }

}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s <libnccl-net-ferroce.so> symbols|no-device|devices\n", argv[0]);
    return 2;
  }
  if (strcmp(argv[2], "symbols") == 0)
    check_symbols(argv[1]);
  else if (strcmp(argv[2], "no-device") == 0)
    check_no_device(argv[1]);
  else if (strcmp(argv[2], "devices") == 0)
    check_devices(argv[1]);
  else {
    fprintf(stderr, "unknown mode %s\n", argv[2]);
    return 2;
  }
  printf("conformance %s: %d passed, %d failed\n", argv[2], passed, failed);
  return failed ? 1 : 0;
}
