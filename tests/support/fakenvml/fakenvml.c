/*
 * A fake libnvidia-ml.so.1 for tests: the real pynvml loads it.
 *
 * Driven by the scenario file named by $FAKE_NVML_SCENARIO, re-read whenever
 * its mtime or size changes, so a test can rewrite it while the agent runs.
 * One "key value" per line ('#' starts a comment):
 *
 *   init <code>                 nvmlInitWithFlags returns <code> (e.g. 9 DRIVER_NOT_LOADED)
 *   count <n>                   number of GPUs
 *   hang.<function> <seconds>   that function sleeps first (a call stuck in the driver);
 *                               -1: until the key is removed (a driver wedged for as long as the test says)
 *   <i>.lost 1                  every call on GPU i returns GPU_IS_LOST (15)
 *   <i>.<field> <value>         a field of GPU i (see the functions below for names)
 *   <i>.<field> NS | LOST | ERR <code>
 *   <i>.fabric <state> <status> [<healthMask> <healthSummary>]
 *                               nvmlDeviceGetGpuFabricInfo(V): state 1 NOT_STARTED, 2 IN_PROGRESS, 3 COMPLETED
 *   missing.<function> 1        that function answers FUNCTION_NOT_FOUND, as an older driver's would
 *   <i>.field.<id>[@<scope>] <value>   a field value (nvmlDeviceGetFieldValues); "@<scope>" names
 *                               one NVLink (scopeId), else the value holds for every scope
 *   <i>.gpm 1                   GPM supported; <i>.gpm.<metric id> <percent> one GPM metric
 *   <i>.procs <pid>:<bytes> ...  compute processes on GPU i (absent: none; NS | LOST | ERR <code>)
 *   <i>.gprocs <pid>:<bytes> ... graphics processes on GPU i (the same forms)
 *   <i>.mig <uuid> ...          MIG mode on, with these MIG devices (absent: no MIG support)
 *   <i>.mig<slot>.memory <total> <reserved> <free> <used>   a MIG device's memory; <i>.mig<slot>.gi its GPU instance
 *   events <code>               nvmlDeviceRegisterEvents returns <code> (3 NOT_SUPPORTED)
 *   event.<id> <gpu> <type> <data>   an event, delivered once to every event set
 *                                    (ids increase; type 8 = XidCriticalError)
 *
 * A field that is absent is NOT_SUPPORTED, as on a GPU that lacks it. Symbols
 * this file does not define make pynvml raise FunctionNotFound, as an old
 * driver's library would.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum { OK = 0, ERR_INVALID_ARGUMENT = 2, ERR_NOT_SUPPORTED = 3, ERR_NOT_FOUND = 6, ERR_INSUFFICIENT_SIZE = 7,
       ERR_TIMEOUT = 10, ERR_FUNCTION_NOT_FOUND = 13, ERR_GPU_IS_LOST = 15 };
#define MAX_GPUS 64
#define MAX_LINES 4096

#define MAX_MIGS 7
struct device { unsigned index; unsigned mig; /* 0: the GPU itself, else MIG slot + 1 */ };
static struct device devices[MAX_GPUS];
static struct device mig_devices[MAX_GPUS][MAX_MIGS];

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char *keys[MAX_LINES], *vals[MAX_LINES];
static int nlines;
static struct timespec loaded_mtime;
static off_t loaded_size = -1;

/* An index of the scenario's keys (open addressing; a later line wins), so a
 * lookup costs the same however many GPUs and fields the scenario holds. */
#define INDEX_SIZE (2 * MAX_LINES)
static int slots[INDEX_SIZE]; /* line number + 1; 0 = empty */

static unsigned hash_key(const char *k) {
    unsigned h = 2166136261u;
    while (*k) h = (h ^ (unsigned char)*k++) * 16777619u;
    return h;
}

static void index_locked(void) {
    memset(slots, 0, sizeof slots);
    for (int i = 0; i < nlines; i++) {
        unsigned at = hash_key(keys[i]) % INDEX_SIZE;
        while (slots[at] && strcmp(keys[slots[at] - 1], keys[i]) != 0) at = (at + 1) % INDEX_SIZE;
        slots[at] = i + 1;
    }
}

static const char *lookup_locked(const char *key) {
    for (unsigned at = hash_key(key) % INDEX_SIZE; slots[at]; at = (at + 1) % INDEX_SIZE)
        if (strcmp(keys[slots[at] - 1], key) == 0) return vals[slots[at] - 1];
    return NULL;
}

static void reload_locked(void) {
    const char *path = getenv("FAKE_NVML_SCENARIO");
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        for (int i = 0; i < nlines; i++) free(keys[i]);
        nlines = 0;
        loaded_size = -1;
        index_locked();
        return;
    }
    if (st.st_size == loaded_size && st.st_mtim.tv_sec == loaded_mtime.tv_sec &&
        st.st_mtim.tv_nsec == loaded_mtime.tv_nsec)
        return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    for (int i = 0; i < nlines; i++) free(keys[i]);
    nlines = 0;
    char buf[1024];
    while (nlines < MAX_LINES && fgets(buf, sizeof buf, f)) {
        char *hash = strchr(buf, '#');
        if (hash) *hash = 0;
        char *k = buf + strspn(buf, " \t");
        size_t klen = strcspn(k, " \t\r\n");
        if (klen == 0) continue;
        char *v = k + klen + strspn(k + klen, " \t");
        v[strcspn(v, "\r\n")] = 0;
        char *copy = malloc(klen + strlen(v) + 2);
        memcpy(copy, k, klen);
        copy[klen] = 0;
        strcpy(copy + klen + 1, v);
        keys[nlines] = copy;
        vals[nlines] = copy + klen + 1;
        nlines++;
    }
    fclose(f);
    loaded_size = st.st_size;
    loaded_mtime = st.st_mtim;
    index_locked();
}

/* Copies the value of `key` into out; 1 if present. */
static int get(const char *key, char *out, size_t cap) {
    pthread_mutex_lock(&mu);
    reload_locked();
    const char *v = lookup_locked(key);
    if (v) snprintf(out, cap, "%s", v);
    pthread_mutex_unlock(&mu);
    return v != NULL;
}

static void maybe_hang(const char *fn) {
    char key[128], v[64];
    snprintf(key, sizeof key, "hang.%s", fn);
    if (get(key, v, sizeof v)) {
        double s = atof(v);
        struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)}, step = {0, 10 * 1000 * 1000};
        if (s >= 0) {
            nanosleep(&ts, NULL);
            return;
        }
        while (get(key, v, sizeof v)) nanosleep(&step, NULL);
    }
}

/* An older driver: pynvml raises FunctionNotFound as when the symbol is absent. */
static int missing(const char *fn) {
    char key[128], v[16];
    snprintf(key, sizeof key, "missing.%s", fn);
    return get(key, v, sizeof v) && atoi(v) == 1;
}

static int gpu_count(void) {
    char v[64];
    int n = get("count", v, sizeof v) ? atoi(v) : 0;
    return n < 0 ? 0 : n > MAX_GPUS ? MAX_GPUS : n;
}

static nvmlReturn_t check_dev(struct device *d) {
    char key[64], v[64];
    if (d < devices || d >= devices + MAX_GPUS || (int)d->index >= gpu_count()) return ERR_INVALID_ARGUMENT;
    snprintf(key, sizeof key, "%u.lost", d->index);
    if (get(key, v, sizeof v) && atoi(v)) return ERR_GPU_IS_LOST;
    return OK;
}

/* A device field as text; returns OK or the error the scenario asks for. */
static nvmlReturn_t field_str(struct device *d, const char *fn, const char *name, char *out, size_t cap) {
    maybe_hang(fn);
    nvmlReturn_t rc = check_dev(d);
    if (rc != OK) return rc;
    char key[160];
    snprintf(key, sizeof key, "%u.%s", d->index, name);
    if (!get(key, out, cap) || strcmp(out, "NS") == 0) return ERR_NOT_SUPPORTED;
    if (strcmp(out, "LOST") == 0) return ERR_GPU_IS_LOST;
    if (strncmp(out, "ERR ", 4) == 0) return atoi(out + 4);
    return OK;
}

static nvmlReturn_t field_u64(struct device *d, const char *fn, const char *name, unsigned long long *out) {
    char v[256];
    nvmlReturn_t rc = field_str(d, fn, name, v, sizeof v);
    if (rc == OK) *out = strtoull(v, NULL, 0);
    return rc;
}

static nvmlReturn_t field_uint(struct device *d, const char *fn, const char *name, unsigned *out) {
    unsigned long long v = 0;
    nvmlReturn_t rc = field_u64(d, fn, name, &v);
    if (rc == OK) *out = (unsigned)v;
    return rc;
}

/* ------------------------------------------------------------------ init */

nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    char v[64];
    maybe_hang("nvmlInitWithFlags");
    return get("init", v, sizeof v) ? atoi(v) : OK;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case ERR_NOT_SUPPORTED: return "Not Supported";
    case ERR_GPU_IS_LOST: return "GPU is lost";
    case ERR_TIMEOUT: return "Timeout";
    default: return "Fake NVML error";
    }
}
nvmlReturn_t nvmlSystemGetDriverVersion(char *buf, unsigned len) {
    char v[80];
    if (!get("driver", v, sizeof v)) snprintf(v, sizeof v, "570.86.15");
    snprintf(buf, len, "%s", v);
    return OK;
}

/* ------------------------------------------------------------------ identity */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    maybe_hang("nvmlDeviceGetCount_v2");
    *count = (unsigned)gpu_count();
    return OK;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, struct device **dev) {
    maybe_hang("nvmlDeviceGetHandleByIndex_v2");
    if ((int)index >= gpu_count()) return ERR_INVALID_ARGUMENT;
    devices[index].index = index;
    *dev = &devices[index];
    return check_dev(&devices[index]);
}
static nvmlReturn_t copy_field(struct device *d, const char *fn, const char *name, char *buf, unsigned len) {
    char v[256];
    nvmlReturn_t rc = field_str(d, fn, name, v, sizeof v);
    if (rc != OK) return rc;
    if (strlen(v) + 1 > len) return ERR_INSUFFICIENT_SIZE;
    strcpy(buf, v);
    return OK;
}
nvmlReturn_t nvmlDeviceGetName(struct device *d, char *buf, unsigned len) { return copy_field(d, "nvmlDeviceGetName", "name", buf, len); }
static int mig_uuid(unsigned gpu, unsigned slot, char *out, size_t cap);
nvmlReturn_t nvmlDeviceGetUUID(struct device *d, char *buf, unsigned len) {
    if (d >= &mig_devices[0][0] && d < &mig_devices[0][0] + MAX_GPUS * MAX_MIGS) {
        char v[96];
        if (!mig_uuid(d->index, d->mig - 1, v, sizeof v)) return ERR_INVALID_ARGUMENT;
        if (strlen(v) + 1 > len) return ERR_INSUFFICIENT_SIZE;
        strcpy(buf, v);
        return OK;
    }
    return copy_field(d, "nvmlDeviceGetUUID", "uuid", buf, len);
}
nvmlReturn_t nvmlDeviceGetSerial(struct device *d, char *buf, unsigned len) { return copy_field(d, "nvmlDeviceGetSerial", "serial", buf, len); }

struct pci_info_v3 {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
};
nvmlReturn_t nvmlDeviceGetPciInfo_v3(struct device *d, struct pci_info_v3 *p) {
    char v[64];
    nvmlReturn_t rc = field_str(d, "nvmlDeviceGetPciInfo_v3", "pci", v, sizeof v); /* "0000:3b:00" */
    if (rc != OK) return rc;
    unsigned dom = 0, bus = 0, dev = 0;
    sscanf(v, "%x:%x:%x", &dom, &bus, &dev);
    memset(p, 0, sizeof *p);
    p->domain = dom, p->bus = bus, p->device = dev, p->pciDeviceId = 0x233010de;
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%04X:%02X:%02X.0", dom, bus, dev);
    snprintf(p->busId, sizeof p->busId, "%08X:%02X:%02X.0", dom, bus, dev);
    return OK;
}

/* ------------------------------------------------------------------ memory */

nvmlReturn_t nvmlDeviceGetTotalEccErrors(struct device *d, int errorType, int counterType, unsigned long long *count) {
    char name[32];
    snprintf(name, sizeof name, "ecc.%s.%s", errorType ? "unc" : "cor", counterType ? "agg" : "vol");
    return field_u64(d, "nvmlDeviceGetTotalEccErrors", name, count);
}
nvmlReturn_t nvmlDeviceGetRemappedRows(struct device *d, unsigned *corr, unsigned *unc, unsigned *pending, unsigned *failure) {
    char v[128];
    nvmlReturn_t rc = field_str(d, "nvmlDeviceGetRemappedRows", "remapped", v, sizeof v); /* "corr unc pending failure" */
    if (rc != OK) return rc;
    *corr = *unc = *pending = *failure = 0;
    sscanf(v, "%u %u %u %u", corr, unc, pending, failure);
    return OK;
}
nvmlReturn_t nvmlDeviceGetRetiredPages(struct device *d, int cause, unsigned *count, unsigned long long *addrs) {
    unsigned n = 0;
    nvmlReturn_t rc = field_uint(d, "nvmlDeviceGetRetiredPages", cause ? "retired.dbe" : "retired.sbe", &n);
    if (rc != OK) return rc;
    if (addrs == NULL || *count < n) {
        *count = n;
        return n == 0 ? OK : ERR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) addrs[i] = 0x1000ull * (i + 1);
    *count = n;
    return OK;
}
nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(struct device *d, int *pending) {
    unsigned v = 0;
    nvmlReturn_t rc = field_uint(d, "nvmlDeviceGetRetiredPagesPendingStatus", "retired.pending", &v);
    if (rc == OK) *pending = (int)v;
    return rc;
}

/* ------------------------------------------------------------------ thermal, clocks, PCIe */

nvmlReturn_t nvmlDeviceGetTemperature(struct device *d, int sensor, unsigned *t) {
    (void)sensor;
    return field_uint(d, "nvmlDeviceGetTemperature", "temp", t);
}
nvmlReturn_t nvmlDeviceGetTemperatureThreshold(struct device *d, int which, unsigned *t) {
    const char *names[] = {"temp.shutdown", "temp.slowdown", "temp.memmax", "temp.gpumax"};
    if (which < 0 || which > 3) return ERR_NOT_SUPPORTED;
    return field_uint(d, "nvmlDeviceGetTemperatureThreshold", names[which], t);
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(struct device *d, unsigned long long *r) {
    return field_u64(d, "nvmlDeviceGetCurrentClocksEventReasons", "clocks_event", r);
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(struct device *d, unsigned *v) { return field_uint(d, "nvmlDeviceGetCurrPcieLinkGeneration", "pcie.gen", v); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(struct device *d, unsigned *v) { return field_uint(d, "nvmlDeviceGetMaxPcieLinkGeneration", "pcie.gen_max", v); }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(struct device *d, unsigned *v) { return field_uint(d, "nvmlDeviceGetCurrPcieLinkWidth", "pcie.width", v); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(struct device *d, unsigned *v) { return field_uint(d, "nvmlDeviceGetMaxPcieLinkWidth", "pcie.width_max", v); }

nvmlReturn_t nvmlDeviceGetPersistenceMode(struct device *d, int *mode) {
    unsigned v = 0;
    nvmlReturn_t rc = field_uint(d, "nvmlDeviceGetPersistenceMode", "persistence", &v);
    if (rc == OK) *mode = (int)v;
    return rc;
}

/* ------------------------------------------------------------------ fabric (nvml.h nvmlGpuFabricInfo_t, _v2, _v3) */

struct fabric_v1 { unsigned char clusterUuid[16]; nvmlReturn_t status; unsigned cliqueId, state; };
struct fabric_v3 {
    unsigned version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned cliqueId, state, healthMask;
    unsigned char healthSummary; /* v3 only */
};
static nvmlReturn_t fabric(struct device *d, const char *fn, unsigned *st, int *status, unsigned *mask, unsigned *summary) {
    char v[128];
    nvmlReturn_t rc = field_str(d, fn, "fabric", v, sizeof v);
    if (rc != OK) return rc;
    *st = *mask = *summary = 0, *status = 0;
    sscanf(v, "%u %d %u %u", st, status, mask, summary);
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuFabricInfo(struct device *d, struct fabric_v1 *info) {
    unsigned mask, summary;
    memset(info, 0, sizeof *info);
    return fabric(d, "nvmlDeviceGetGpuFabricInfo", &info->state, &info->status, &mask, &summary);
}
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(struct device *d, struct fabric_v3 *info) {
    char v[16];
    unsigned version = info->version, mask = 0, summary = 0;
    if (get("fabric_v", v, sizeof v) && atoi(v) == 0) return 13; /* FUNCTION_NOT_FOUND: an older driver */
    if (version != 0x02000024 && version != 0x3000028) return 25; /* ARGUMENT_VERSION_MISMATCH */
    memset(info, 0, version == 0x3000028 ? sizeof *info : offsetof(struct fabric_v3, healthSummary));
    info->version = version;
    nvmlReturn_t rc = fabric(d, "nvmlDeviceGetGpuFabricInfoV", &info->state, &info->status, &mask, &summary);
    info->healthMask = mask;
    if (version == 0x3000028) info->healthSummary = (unsigned char)summary;
    return rc;
}

/* ------------------------------------------------------------------ NVLink */

nvmlReturn_t nvmlDeviceGetNvLinkState(struct device *d, unsigned link, unsigned *active) {
    char name[48];
    unsigned links = 0;
    nvmlReturn_t rc = field_uint(d, "nvmlDeviceGetNvLinkState", "nvlink.links", &links);
    if (rc != OK) return rc;
    if (link >= links) return ERR_INVALID_ARGUMENT;
    snprintf(name, sizeof name, "nvlink.%u.state", link);
    rc = field_uint(d, "nvmlDeviceGetNvLinkState", name, active);
    if (rc == ERR_NOT_SUPPORTED) *active = 1, rc = OK; /* a link that exists is up unless said otherwise */
    return rc;
}
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(struct device *d, unsigned link, int counter, unsigned long long *v) {
    const char *names[] = {"replay", "recovery", "crc_flit", "crc_data", "ecc_data"};
    char name[48];
    unsigned links = 0;
    nvmlReturn_t rc = field_uint(d, "nvmlDeviceGetNvLinkErrorCounter", "nvlink.links", &links);
    if (rc != OK) return rc;
    if (link >= links || counter < 0 || counter > 4) return ERR_INVALID_ARGUMENT;
    snprintf(name, sizeof name, "nvlink.%u.%s", link, names[counter]);
    rc = field_u64(d, "nvmlDeviceGetNvLinkErrorCounter", name, v);
    if (rc == ERR_NOT_SUPPORTED) *v = 0, rc = OK;
    return rc;
}

/* ------------------------------------------------------------------ processes and MIG */

typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId, computeInstanceId; } process_info_t;

/* "<pid>:<bytes> ..." of key <i>.<name>; absent is an empty list. */
static nvmlReturn_t processes(struct device *d, const char *fn, const char *name, unsigned *count, process_info_t *out) {
    char key[64], v[2048];
    maybe_hang(fn);
    nvmlReturn_t rc = check_dev(d);
    if (rc != OK) return rc;
    snprintf(key, sizeof key, "%u.%s", d->index, name);
    if (!get(key, v, sizeof v)) v[0] = 0;
    if (strcmp(v, "NS") == 0) return ERR_NOT_SUPPORTED;
    if (strcmp(v, "LOST") == 0) return ERR_GPU_IS_LOST;
    if (strncmp(v, "ERR ", 4) == 0) return atoi(v + 4);
    unsigned n = 0, cap = *count;
    char *save = NULL;
    for (char *tok = strtok_r(v, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save), n++) {
        if (out && n < cap) {
            out[n].pid = (unsigned)strtoul(tok, NULL, 10);
            char *colon = strchr(tok, ':');
            out[n].usedGpuMemory = colon ? strtoull(colon + 1, NULL, 0) : ~0ull;
            out[n].gpuInstanceId = out[n].computeInstanceId = 0xFFFFFFFFu;
        }
    }
    *count = n;
    if (n == 0) return OK;
    return (out == NULL || cap < n) ? ERR_INSUFFICIENT_SIZE : OK;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(struct device *d, unsigned *count, process_info_t *infos) {
    return processes(d, "nvmlDeviceGetComputeRunningProcesses_v3", "procs", count, infos);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(struct device *d, unsigned *count, process_info_t *infos) {
    return processes(d, "nvmlDeviceGetGraphicsRunningProcesses_v3", "gprocs", count, infos);
}

/* The slot-th MIG uuid of GPU gpu; 1 if there is one. */
static int mig_uuid(unsigned gpu, unsigned slot, char *out, size_t cap) {
    char key[64], v[1024];
    snprintf(key, sizeof key, "%u.mig", gpu);
    if (!get(key, v, sizeof v)) return 0;
    unsigned n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(v, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save), n++)
        if (n == slot) return snprintf(out, cap, "%s", tok), 1;
    return 0;
}
nvmlReturn_t nvmlDeviceGetMigMode(struct device *d, unsigned *current, unsigned *pending) {
    char key[64], v[1024];
    nvmlReturn_t rc = check_dev(d);
    if (rc != OK) return rc;
    snprintf(key, sizeof key, "%u.mig", d->index);
    if (!get(key, v, sizeof v)) return ERR_NOT_SUPPORTED;
    *current = *pending = 1;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(struct device *d, unsigned *count) {
    unsigned current = 0, pending = 0;
    nvmlReturn_t rc = nvmlDeviceGetMigMode(d, &current, &pending);
    if (rc == OK) *count = MAX_MIGS;
    return rc;
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(struct device *d, unsigned slot, struct device **mig) {
    char v[96];
    nvmlReturn_t rc = check_dev(d);
    if (rc != OK) return rc;
    if (slot >= MAX_MIGS) return ERR_INVALID_ARGUMENT;
    if (!mig_uuid(d->index, slot, v, sizeof v)) return ERR_NOT_FOUND;
    mig_devices[d->index][slot].index = d->index;
    mig_devices[d->index][slot].mig = slot + 1;
    *mig = &mig_devices[d->index][slot];
    return OK;
}

/* ------------------------------------------------------------------ field values */

typedef struct {
    unsigned fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    union { double d; unsigned ui; unsigned long ul; unsigned long long ull; long long sll; int si; unsigned short us; } value;
} field_value_t;

/* One field: "<i>.field.<id>@<scope>", else "<i>.field.<id>"; NS | LOST | ERR <code> as for any field. */
static nvmlReturn_t field_value_locked(unsigned gpu, field_value_t *fv) {
    char key[64];
    snprintf(key, sizeof key, "%u.field.%u@%u", gpu, fv->fieldId, fv->scopeId);
    const char *v = lookup_locked(key);
    if (!v) {
        snprintf(key, sizeof key, "%u.field.%u", gpu, fv->fieldId);
        v = lookup_locked(key);
    }
    fv->valueType = 3; /* unsigned long long */
    fv->value.ull = 0;
    if (!v || strcmp(v, "NS") == 0) return ERR_NOT_SUPPORTED;
    if (strcmp(v, "LOST") == 0) return ERR_GPU_IS_LOST;
    if (strncmp(v, "ERR ", 4) == 0) return atoi(v + 4);
    fv->value.ull = strtoull(v, NULL, 0);
    return OK;
}

nvmlReturn_t nvmlDeviceGetFieldValues(struct device *d, int n, field_value_t *values) {
    maybe_hang("nvmlDeviceGetFieldValues");
    if (missing("nvmlDeviceGetFieldValues")) return ERR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = check_dev(d);
    if (rc != OK) return rc;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    pthread_mutex_lock(&mu);
    reload_locked(); /* once per call, as the driver answers all fields of one call together */
    for (int i = 0; i < n; i++) {
        values[i].nvmlReturn = field_value_locked(d->index, &values[i]);
        values[i].timestamp = (long long)now.tv_sec * 1000000 + now.tv_nsec / 1000;
        values[i].latencyUsec = 0;
    }
    pthread_mutex_unlock(&mu);
    return OK;
}

/* ------------------------------------------------------------------ events */

struct event_set {
    unsigned long long mask[MAX_GPUS];
    long last_id;
};
typedef struct {
    struct device *device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} event_data_t;

static long max_event_id(void) {
    long max = 0;
    pthread_mutex_lock(&mu);
    reload_locked();
    for (int i = 0; i < nlines; i++)
        if (strncmp(keys[i], "event.", 6) == 0 && atol(keys[i] + 6) > max) max = atol(keys[i] + 6);
    pthread_mutex_unlock(&mu);
    return max;
}

nvmlReturn_t nvmlEventSetCreate(struct event_set **set) {
    *set = calloc(1, sizeof **set);
    (*set)->last_id = max_event_id(); /* events before registration are not recorded */
    return OK;
}
nvmlReturn_t nvmlEventSetFree(struct event_set *set) {
    free(set);
    return OK;
}
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(struct device *d, unsigned long long *types) {
    nvmlReturn_t rc = check_dev(d);
    if (rc == OK) *types = 0x8 | 0x2 | 0x1;
    return rc;
}
nvmlReturn_t nvmlDeviceRegisterEvents(struct device *d, unsigned long long types, struct event_set *set) {
    char v[64];
    maybe_hang("nvmlDeviceRegisterEvents");
    nvmlReturn_t rc = check_dev(d);
    if (rc != OK) return rc;
    if (get("events", v, sizeof v) && atoi(v) != OK) return atoi(v);
    set->mask[d->index] |= types;
    return OK;
}

/* Finds the next event after set->last_id for a registered device. */
static int next_event(struct event_set *set, event_data_t *out) {
    int found = 0;
    long best = 0;
    pthread_mutex_lock(&mu);
    reload_locked();
    for (int i = 0; i < nlines; i++) {
        if (strncmp(keys[i], "event.", 6) != 0) continue;
        long id = atol(keys[i] + 6);
        unsigned gpu = 0;
        unsigned long long type = 0, data = 0;
        if (id <= set->last_id || (found && id >= best)) continue;
        if (sscanf(vals[i], "%u %llu %llu", &gpu, &type, &data) != 3 || gpu >= MAX_GPUS) continue;
        if (!(set->mask[gpu] & type)) continue;
        best = id, found = 1;
        devices[gpu].index = gpu;
        out->device = &devices[gpu], out->eventType = type, out->eventData = data;
        out->gpuInstanceId = out->computeInstanceId = 0xFFFFFFFFu;
    }
    pthread_mutex_unlock(&mu);
    if (found) set->last_id = best;
    return found;
}

nvmlReturn_t nvmlEventSetWait_v2(struct event_set *set, event_data_t *data, unsigned timeout_ms) {
    char v[64];
    maybe_hang("nvmlEventSetWait_v2");
    if (get("wait", v, sizeof v)) return atoi(v); /* e.g. 15 GPU_IS_LOST, 999 UNKNOWN */
    struct timespec step = {0, 5 * 1000 * 1000};
    for (unsigned waited = 0;; waited += 5) {
        if (next_event(set, data)) return OK;
        if (waited >= timeout_ms) return ERR_TIMEOUT;
        nanosleep(&step, NULL);
    }
}

/* ------------------------------------------------------------------ telemetry (power, clocks, utilisation, memory) */

nvmlReturn_t nvmlDeviceGetPowerUsage(struct device *d, unsigned *mw) { return field_uint(d, "nvmlDeviceGetPowerUsage", "power", mw); }
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(struct device *d, unsigned *mw) { return field_uint(d, "nvmlDeviceGetEnforcedPowerLimit", "power.limit", mw); }
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(struct device *d, unsigned long long *mj) { return field_u64(d, "nvmlDeviceGetTotalEnergyConsumption", "energy", mj); }
nvmlReturn_t nvmlDeviceGetPcieReplayCounter(struct device *d, unsigned *v) { return field_uint(d, "nvmlDeviceGetPcieReplayCounter", "pcie.replay", v); }
nvmlReturn_t nvmlDeviceGetPerformanceState(struct device *d, unsigned *p) { return field_uint(d, "nvmlDeviceGetPerformanceState", "pstate", p); }
nvmlReturn_t nvmlDeviceGetClockInfo(struct device *d, int type, unsigned *mhz) {
    const char *names[] = {"clock.graphics", "clock.sm", "clock.mem", "clock.video"};
    if (type < 0 || type > 3) return ERR_INVALID_ARGUMENT;
    return field_uint(d, "nvmlDeviceGetClockInfo", names[type], mhz);
}
nvmlReturn_t nvmlDeviceGetPcieThroughput(struct device *d, int counter, unsigned *kbps) {
    if (counter < 0 || counter > 1) return ERR_INVALID_ARGUMENT;
    return field_uint(d, "nvmlDeviceGetPcieThroughput", counter ? "pcie.rx_kbps" : "pcie.tx_kbps", kbps);
}

typedef struct { unsigned gpu, memory; } utilization_t;
nvmlReturn_t nvmlDeviceGetUtilizationRates(struct device *d, utilization_t *u) {
    char v[64];
    nvmlReturn_t rc = field_str(d, "nvmlDeviceGetUtilizationRates", "util", v, sizeof v); /* "gpu% memory%" */
    if (rc == OK) u->gpu = u->memory = 0, sscanf(v, "%u %u", &u->gpu, &u->memory);
    return rc;
}
static nvmlReturn_t codec_util(struct device *d, const char *fn, const char *name, unsigned *util, unsigned *period) {
    nvmlReturn_t rc = field_uint(d, fn, name, util);
    if (rc == OK) *period = 167000;
    return rc;
}
nvmlReturn_t nvmlDeviceGetEncoderUtilization(struct device *d, unsigned *u, unsigned *p) { return codec_util(d, "nvmlDeviceGetEncoderUtilization", "util.enc", u, p); }
nvmlReturn_t nvmlDeviceGetDecoderUtilization(struct device *d, unsigned *u, unsigned *p) { return codec_util(d, "nvmlDeviceGetDecoderUtilization", "util.dec", u, p); }

typedef struct { unsigned long long referenceTime, violationTime; } violation_t;
nvmlReturn_t nvmlDeviceGetViolationStatus(struct device *d, int policy, violation_t *v) {
    char name[32];
    unsigned long long ns = 0;
    snprintf(name, sizeof name, "violation.%d", policy);
    nvmlReturn_t rc = field_u64(d, "nvmlDeviceGetViolationStatus", name, &ns);
    if (rc == OK) v->referenceTime = 0, v->violationTime = ns;
    return rc;
}

typedef struct { unsigned long long total, free, used; } memory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } memory_v2_t;
static nvmlReturn_t memory_of(struct device *d, const char *fn, unsigned long long out[4]) {
    char v[160], name[32] = "memory";
    if (d >= &mig_devices[0][0] && d < &mig_devices[0][0] + MAX_GPUS * MAX_MIGS) {
        snprintf(name, sizeof name, "mig%u.memory", d->mig - 1); /* a MIG device: its own share */
        d = &devices[d->index]; /* answered as its GPU answers (lost, hung, ...) */
    }
    nvmlReturn_t rc = field_str(d, fn, name, v, sizeof v); /* "total reserved free used" */
    if (rc == OK) out[0] = out[1] = out[2] = out[3] = 0, sscanf(v, "%llu %llu %llu %llu", &out[0], &out[1], &out[2], &out[3]);
    return rc;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(struct device *d, memory_t *m) {
    unsigned long long v[4];
    nvmlReturn_t rc = memory_of(d, "nvmlDeviceGetMemoryInfo", v);
    /* v1 counts the reserved memory as used, as the real driver does */
    if (rc == OK) m->total = v[0], m->free = v[2], m->used = v[3] + v[1];
    return rc;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(struct device *d, memory_v2_t *m) {
    unsigned long long v[4];
    if (missing("nvmlDeviceGetMemoryInfo_v2")) return ERR_FUNCTION_NOT_FOUND;
    if (m->version != 0x02000028) return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    nvmlReturn_t rc = memory_of(d, "nvmlDeviceGetMemoryInfo_v2", v);
    if (rc == OK) m->total = v[0], m->reserved = v[1], m->free = v[2], m->used = v[3];
    return rc;
}

/* A MIG device's GPU instance id: "<i>.mig<slot>.gi", else slot + 1. */
nvmlReturn_t nvmlDeviceGetGpuInstanceId(struct device *d, unsigned *id) {
    char key[48], v[32];
    if (!(d >= &mig_devices[0][0] && d < &mig_devices[0][0] + MAX_GPUS * MAX_MIGS)) return ERR_INVALID_ARGUMENT;
    snprintf(key, sizeof key, "%u.mig%u.gi", d->index, d->mig - 1);
    *id = get(key, v, sizeof v) ? (unsigned)atoi(v) : d->mig;
    return OK;
}

/* ------------------------------------------------------------------ GPM (Hopper and later) */

struct gpm_sample { int taken; unsigned gpu; int mig; unsigned gi; struct timespec at; };
typedef struct { unsigned version, supported; } gpm_support_t;
typedef struct { unsigned metricId; nvmlReturn_t nvmlReturn; double value; char *shortName, *longName, *unit; } gpm_metric_t;
typedef struct { unsigned version, numMetrics; struct gpm_sample *sample1, *sample2; gpm_metric_t metrics[]; } gpm_get_t;

static int gpm_supported(unsigned gpu) {
    char key[32], v[16];
    snprintf(key, sizeof key, "%u.gpm", gpu);
    return get(key, v, sizeof v) && atoi(v) == 1;
}
nvmlReturn_t nvmlGpmQueryDeviceSupport(struct device *d, gpm_support_t *s) {
    maybe_hang("nvmlGpmQueryDeviceSupport");
    if (missing("nvmlGpmQueryDeviceSupport")) return ERR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = check_dev(d);
    if (rc != OK) return rc;
    if (s->version != 1) return 25;
    s->supported = (unsigned)gpm_supported(d->index);
    return OK;
}
nvmlReturn_t nvmlGpmSampleAlloc(struct gpm_sample **s) {
    *s = calloc(1, sizeof **s);
    return *s ? OK : 999;
}
nvmlReturn_t nvmlGpmSampleFree(struct gpm_sample *s) {
    free(s);
    return OK;
}
static nvmlReturn_t gpm_take(struct device *d, struct gpm_sample *s, int mig, unsigned gi) {
    maybe_hang("nvmlGpmSampleGet");
    nvmlReturn_t rc = check_dev(d);
    if (rc != OK) return rc;
    if (!s) return ERR_INVALID_ARGUMENT;
    if (!gpm_supported(d->index)) return ERR_NOT_SUPPORTED;
    s->taken = 1, s->gpu = d->index, s->mig = mig, s->gi = gi;
    clock_gettime(CLOCK_MONOTONIC, &s->at);
    return OK;
}
nvmlReturn_t nvmlGpmSampleGet(struct device *d, struct gpm_sample *s) { return gpm_take(d, s, 0, 0); }
nvmlReturn_t nvmlGpmMigSampleGet(struct device *d, unsigned gi, struct gpm_sample *s) { return gpm_take(d, s, 1, gi); }

/* Metrics between two samples of one GPU (or GPU instance), the second taken later;
 * the value is "<i>.gpm.<id>" (or "<i>.mig.gi<gi>.gpm.<id>"), a percentage. */
nvmlReturn_t nvmlGpmMetricsGet(gpm_get_t *g) {
    if (g->version != 1) return 25;
    struct gpm_sample *a = g->sample1, *b = g->sample2;
    if (!a || !b || !a->taken || !b->taken || a->gpu != b->gpu || a->mig != b->mig || a->gi != b->gi)
        return ERR_INVALID_ARGUMENT;
    double dt = (double)(b->at.tv_sec - a->at.tv_sec) + (b->at.tv_nsec - a->at.tv_nsec) / 1e9;
    if (dt <= 0) return ERR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < g->numMetrics; i++) {
        char key[64], v[64];
        if (a->mig) snprintf(key, sizeof key, "%u.mig.gi%u.gpm.%u", a->gpu, a->gi, g->metrics[i].metricId);
        else snprintf(key, sizeof key, "%u.gpm.%u", a->gpu, g->metrics[i].metricId);
        g->metrics[i].nvmlReturn = get(key, v, sizeof v) && strcmp(v, "NS") != 0 ? OK : ERR_NOT_SUPPORTED;
        g->metrics[i].value = g->metrics[i].nvmlReturn == OK ? atof(v) : 0;
    }
    return OK;
}
