/*
 * A fake libnvidia-ml.so.1 for tests: the real pynvml loads it.
 *
 * Driven by the scenario file named by $FAKE_NVML_SCENARIO, re-read whenever
 * its mtime or size changes, so a test can rewrite it while the agent runs.
 * One "key value" per line ('#' starts a comment):
 *
 *   init <code>                 nvmlInitWithFlags returns <code> (e.g. 9 DRIVER_NOT_LOADED)
 *   count <n>                   number of GPUs
 *   hang.<function> <seconds>   that function sleeps first (a call stuck in the driver)
 *   <i>.lost 1                  every call on GPU i returns GPU_IS_LOST (15)
 *   <i>.<field> <value>         a field of GPU i (see the functions below for names)
 *   <i>.<field> NS | LOST | ERR <code>
 *   <i>.procs <pid>:<bytes> ...  compute processes on GPU i (absent: none; NS | LOST | ERR <code>)
 *   <i>.gprocs <pid>:<bytes> ... graphics processes on GPU i (the same forms)
 *   <i>.mig <uuid> ...          MIG mode on, with these MIG devices (absent: no MIG support)
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum { OK = 0, ERR_INVALID_ARGUMENT = 2, ERR_NOT_SUPPORTED = 3, ERR_NOT_FOUND = 6, ERR_INSUFFICIENT_SIZE = 7,
       ERR_TIMEOUT = 10, ERR_GPU_IS_LOST = 15 };
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

static void reload_locked(void) {
    const char *path = getenv("FAKE_NVML_SCENARIO");
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        for (int i = 0; i < nlines; i++) free(keys[i]);
        nlines = 0;
        loaded_size = -1;
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
}

/* Copies the value of `key` into out; 1 if present. */
static int get(const char *key, char *out, size_t cap) {
    pthread_mutex_lock(&mu);
    reload_locked();
    int found = 0;
    for (int i = nlines - 1; i >= 0 && !found; i--) {
        if (strcmp(keys[i], key) == 0) {
            snprintf(out, cap, "%s", vals[i]);
            found = 1;
        }
    }
    pthread_mutex_unlock(&mu);
    return found;
}

static void maybe_hang(const char *fn) {
    char key[128], v[64];
    snprintf(key, sizeof key, "hang.%s", fn);
    if (get(key, v, sizeof v)) {
        double s = atof(v);
        struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
        nanosleep(&ts, NULL);
    }
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

nvmlReturn_t nvmlDeviceGetFieldValues(struct device *d, int n, field_value_t *values) {
    maybe_hang("nvmlDeviceGetFieldValues");
    nvmlReturn_t rc = check_dev(d);
    if (rc != OK) return rc;
    for (int i = 0; i < n; i++) {
        char name[32];
        unsigned long long v = 0;
        snprintf(name, sizeof name, "field.%u", values[i].fieldId);
        values[i].nvmlReturn = field_u64(d, "field", name, &v);
        values[i].valueType = 3; /* unsigned long long */
        values[i].value.ull = v;
    }
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
