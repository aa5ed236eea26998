/* A fake libcuda.so.1 for tests: the CUDA driver API calls the burn worker
 * makes, on the CPU, behind the real cuda-bindings (which finds it through
 * LD_LIBRARY_PATH and takes every entry point from cuGetProcAddress_v2, as it
 * does with the real driver).
 *
 * "Device memory" is host memory from malloc; every pointer a call or kernel
 * gets is checked against the live allocations (CUDA_ERROR_ILLEGAL_ADDRESS
 * otherwise, sticky like a real context). cuModuleLoadData accepts only a
 * CUDA ELF (EM_CUDA) that names the kernel, and cuLaunchKernel runs the
 * kernel's CPU twin, written here over the same helpers the GPU code uses
 * (agent/burn/kernels.py HELPERS, force-included at build time).
 *
 * Environment, read at cuInit:
 *   CUDA_VISIBLE_DEVICES  as CUDA reads it: a list of GPU-<uuid> or indices;
 *                         the first entry of another shape ends the list
 *   FAKECUDA_DEVICES      devices when CUDA_VISIBLE_DEVICES is unset (1)
 *   FAKECUDA_MEMORY       bytes of "device memory" (64 MiB)
 *   FAKECUDA_SMS          multiprocessors (132)
 *   FAKECUDA_CC           compute capability, as "9.0" (the default)
 *   FAKECUDA_GEMM_MS      milliseconds one GEMM takes, beside the CPU work (0)
 *   FAKECUDA_REQUIRE_FLAGS the primary context's flags must be these
 *   FAKECUDA_FAULTS       ID=FAULT[,ID=FAULT...]: ID is the value of
 *                         CUDA_VISIBLE_DEVICES (or * for any), FAULT one of
 *       flip:K            the K-th GEMM's output has one bit flipped
 *       wrong             every GEMM adds 1.0 to each element of C
 *       stuck:W           word W of the memory test reads with bit 5 set
 *       slow:F            each GEMM takes F times FAKECUDA_GEMM_MS
 *       hang:K            the K-th cuStreamSynchronize never returns
 *       fail:K:CODE       the K-th kernel launch faults with CUresult CODE:
 *                         the next synchronising call returns it, and every
 *                         call after that (a sticky error, as after an Xid)
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
    OK = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NOT_INITIALIZED = 3,
    NO_DEVICE = 100,
    INVALID_DEVICE = 101,
    INVALID_IMAGE = 200,
    INVALID_CONTEXT = 201,
    INVALID_HANDLE = 400,
    NOT_FOUND = 500,
    ILLEGAL_ADDRESS = 700,
};

struct fake_faults FAKE;

static int initialized, devices, context_current, launches, syncs;
/* An error in queued work surfaces at the next synchronising call and then
   sticks to every call, as a real context's does after a kernel fault. */
static CUresult sticky, pending;
static size_t memory_total, memory_used;
static int sms = 132, cc_major = 9, cc_minor = 0;

/* ------------------------------------------------------------- memory */

#define MAX_ALLOCS 4096
static struct {
    char *base;
    size_t size;
} allocs[MAX_ALLOCS];

void *fakecuda_range(CUdeviceptr ptr, size_t bytes) {
    for (int i = 0; i < MAX_ALLOCS; i++) {
        uintptr_t base = (uintptr_t)allocs[i].base;
        if (base && ptr >= base && ptr - base <= allocs[i].size && bytes <= allocs[i].size - (ptr - base))
            return (void *)(uintptr_t)ptr;
    }
    return NULL;
}


static CUresult fail(CUresult code) {
    if (!pending) pending = code;
    return OK;
}

static CUresult surface(void) {
    if (pending) sticky = pending;
    return sticky;
}

/* for the fake cuBLAS: the context's error, and a fault in its own work */
CUresult fakecuda_sticky(void) { return sticky; }
void fakecuda_fault(CUresult code) { fail(code); }
int fakecuda_ready(void) { return initialized && context_current && !sticky; }

#define READY()                                   \
    do {                                          \
        if (!initialized) return NOT_INITIALIZED; \
        if (sticky) return sticky;                \
    } while (0)
#define CONTEXT()                                   \
    do {                                            \
        READY();                                    \
        if (!context_current) return INVALID_CONTEXT; \
    } while (0)

/* ------------------------------------------------------------- setup */

static unsigned long long env_u64(const char *name, unsigned long long dflt) {
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 0) : dflt;
}

static int visible_devices(void) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v) return (int)env_u64("FAKECUDA_DEVICES", 1);
    int count = 0;
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int valid = strncmp(tok, "GPU-", 4) == 0 && strlen(tok) > 4;
        if (!valid) {
            valid = *tok != 0;
            for (char *c = tok; *c; c++) valid &= *c >= '0' && *c <= '9';
        }
        if (!valid) break;
        count++;
    }
    return count;
}

static void read_faults(void) {
    const char *spec = getenv("FAKECUDA_FAULTS");
    const char *me = getenv("CUDA_VISIBLE_DEVICES");
    char buf[4096];
    memset(&FAKE, 0, sizeof FAKE);
    FAKE.slow = 1.0;
    FAKE.gemm_ms = (double)env_u64("FAKECUDA_GEMM_MS", 0);
    if (!spec) return;
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = 0;
        if (strcmp(tok, "*") != 0 && !(me && strcmp(tok, me) == 0)) continue;
        const char *f = eq + 1;
        if (sscanf(f, "flip:%d", &FAKE.flip_gemm) == 1) continue;
        if (strcmp(f, "wrong") == 0) FAKE.wrong = 1;
        else if (sscanf(f, "stuck:%llu", &FAKE.stuck_word) == 1) FAKE.stuck = 1;
        else if (sscanf(f, "slow:%lf", &FAKE.slow) == 1) continue;
        else if (sscanf(f, "hang:%d", &FAKE.hang_sync) == 1) continue;
        else if (sscanf(f, "fail:%d:%d", &FAKE.fail_launch, &FAKE.fail_code) == 2) continue;
        else fprintf(stderr, "fakecuda: unknown fault %s\n", f);
    }
}

CUresult cuInit(unsigned int flags) {
    if (flags != 0) return INVALID_VALUE;
    if (!initialized) {
        devices = visible_devices();
        memory_total = env_u64("FAKECUDA_MEMORY", 64ull << 20);
        sms = (int)env_u64("FAKECUDA_SMS", 132);
        const char *cc = getenv("FAKECUDA_CC");
        if (cc && sscanf(cc, "%d.%d", &cc_major, &cc_minor) != 2) return INVALID_VALUE;
        read_faults();
        if (devices == 0) return NO_DEVICE;
        initialized = 1;
    }
    return OK;
}

CUresult cuDriverGetVersion(int *version) {
    if (!version) return INVALID_VALUE;
    *version = 12090;
    return OK;
}

static const char *error_name(CUresult e) {
    switch (e) {
        case OK: return "CUDA_SUCCESS";
        case INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
        case OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
        case NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
        case NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
        case INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
        case INVALID_IMAGE: return "CUDA_ERROR_INVALID_IMAGE";
        case INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
        case 214: return "CUDA_ERROR_ECC_UNCORRECTABLE";
        case INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
        case NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
        case ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
        case 719: return "CUDA_ERROR_LAUNCH_FAILED";
        default: return NULL;
    }
}

CUresult cuGetErrorName(CUresult error, const char **str) {
    if (!str) return INVALID_VALUE;
    *str = error_name(error);
    return *str ? OK : INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **str) { return cuGetErrorName(error, str); }

/* ------------------------------------------------------------- devices */

CUresult cuDeviceGetCount(int *count) {
    READY();
    if (!count) return INVALID_VALUE;
    *count = devices;
    return OK;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    READY();
    if (!dev) return INVALID_VALUE;
    if (ordinal < 0 || ordinal >= devices) return INVALID_DEVICE;
    *dev = ordinal;
    return OK;
}

#define DEVICE(d) \
    if ((d) < 0 || (d) >= devices) return INVALID_DEVICE

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    READY();
    DEVICE(dev);
    if (!name || len <= 0) return INVALID_VALUE;
    const char *n = getenv("FAKECUDA_NAME");
    snprintf(name, (size_t)len, "%s", n ? n : "NVIDIA H100 80GB HBM3");
    return OK;
}

CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice dev) {
    READY();
    DEVICE(dev);
    if (!bus || len <= 0) return INVALID_VALUE;
    snprintf(bus, (size_t)len, "0000:%02X:00.0", 0x18 + 0x10 * dev);
    return OK;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) {
    READY();
    DEVICE(dev);
    if (!value) return INVALID_VALUE;
    switch (attribute) {
        case 16: *value = sms; return OK;  /* MULTIPROCESSOR_COUNT */
        case 75: *value = cc_major; return OK; /* COMPUTE_CAPABILITY_MAJOR */
        case 76: *value = cc_minor; return OK; /* COMPUTE_CAPABILITY_MINOR */
        default: return INVALID_VALUE;
    }
}

/* ------------------------------------------------------------- context, stream */

static int primary_refs;
static unsigned primary_flags;
static char primary_context, the_stream;

/* The worker asks for CU_CTX_SCHED_BLOCKING_SYNC (4); FAKECUDA_REQUIRE_FLAGS
   makes a context retained with other flags fail, so a test can tell. */
CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
    READY();
    DEVICE(dev);
    if (flags & ~0x1Fu) return INVALID_VALUE;
    primary_flags = flags;
    return OK;
}

CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice dev) {
    READY();
    DEVICE(dev);
    if (!ctx) return INVALID_VALUE;
    const char *want = getenv("FAKECUDA_REQUIRE_FLAGS");
    if (want && *want && strtoul(want, NULL, 0) != primary_flags) return INVALID_VALUE;
    primary_refs++;
    *ctx = &primary_context;
    return OK;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
    READY();
    DEVICE(dev);
    if (primary_refs == 0) return INVALID_CONTEXT;
    primary_refs--;
    return OK;
}

CUresult cuCtxSetCurrent(void *ctx) {
    READY();
    if (ctx != NULL && ctx != &primary_context) return INVALID_CONTEXT;
    if (ctx && primary_refs == 0) return INVALID_CONTEXT;
    context_current = ctx != NULL;
    return OK;
}

static int streams;

CUresult cuStreamCreate(void **stream, unsigned int flags) {
    CONTEXT();
    if (!stream || flags > 1) return INVALID_VALUE;
    streams++;
    *stream = &the_stream;
    return OK;
}

#define STREAM(s) \
    if ((s) != NULL && ((s) != (void *)&the_stream || streams == 0)) return INVALID_HANDLE

CUresult cuStreamDestroy(void *stream) {
    CONTEXT();
    if (stream == NULL) return INVALID_HANDLE;
    STREAM(stream);
    streams--;
    return OK;
}

CUresult cuStreamSynchronize(void *stream) {
    CONTEXT();
    STREAM(stream);
    if (FAKE.hang_sync && ++syncs >= FAKE.hang_sync)
        for (;;) pause(); /* a GPU that never finishes its work */
    return surface();
}

/* ------------------------------------------------------------- memory API */

CUresult cuMemGetInfo(size_t *free_bytes, size_t *total) {
    CONTEXT();
    if (!free_bytes || !total) return INVALID_VALUE;
    *free_bytes = memory_total - memory_used;
    *total = memory_total;
    return OK;
}

CUresult cuMemAlloc(CUdeviceptr *ptr, size_t bytes) {
    CONTEXT();
    if (!ptr || bytes == 0) return INVALID_VALUE;
    if (bytes > memory_total - memory_used) return OUT_OF_MEMORY;
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (allocs[i].base) continue;
        char *p = malloc(bytes);
        if (!p) return OUT_OF_MEMORY;
        memset(p, 0xA5, bytes); /* fresh device memory holds garbage, not zeros */
        allocs[i].base = p;
        allocs[i].size = bytes;
        memory_used += bytes;
        *ptr = (uintptr_t)p;
        return OK;
    }
    return OUT_OF_MEMORY;
}

CUresult cuMemFree(CUdeviceptr ptr) {
    CONTEXT();
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if ((uintptr_t)allocs[i].base != ptr || !ptr) continue;
        free(allocs[i].base);
        memory_used -= allocs[i].size;
        allocs[i].base = NULL;
        return OK;
    }
    return INVALID_VALUE;
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, void *stream) {
    CONTEXT();
    STREAM(stream);
    if (dst % 4) return INVALID_VALUE;
    uint32_t *p = fakecuda_range(dst, 4 * count);
    if (!p) return INVALID_VALUE;
    for (size_t i = 0; i < count; i++) p[i] = value;
    return OK;
}

CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t bytes) {
    CONTEXT();
    if (!dst) return INVALID_VALUE;
    if (surface()) return sticky;
    void *p = fakecuda_range(src, bytes);
    if (!p) return INVALID_VALUE;
    memcpy(dst, p, bytes);
    return OK;
}

/* ------------------------------------------------------------- modules, kernels */

static const char *const KERNELS[] = {"nha_fill_bf16", "nha_digest_f32", "nha_digest_compare", "nha_mem_write",
                                      "nha_mem_verify"};
#define NKERNELS (int)(sizeof KERNELS / sizeof *KERNELS)

#define MAX_MODULES 16
static struct {
    char *image;
    size_t size;
} modules[MAX_MODULES];

/* A cubin: ELF64, little-endian, e_machine EM_CUDA (190), built for an
   architecture this GPU runs; its size is where the section headers end. */
static size_t cubin_size(const unsigned char *e) {
    if (memcmp(e, "\177ELF", 4) != 0 || e[4] != 2 || e[5] != 1 || (e[18] | e[19] << 8) != 190) return 0;
    uint64_t shoff;
    uint32_t flags;
    uint16_t shentsize, shnum;
    memcpy(&shoff, e + 0x28, 8);
    memcpy(&flags, e + 0x30, 4);
    memcpy(&shentsize, e + 0x3A, 2);
    memcpy(&shnum, e + 0x3C, 2);
    /* the sm_XY it was built for: e_flags' low byte in ABI version 7, the
       next byte in version 8 (sm_100 and later) */
    unsigned sm = e[8] >= 8 ? (flags >> 8) & 0xFF : flags & 0xFF;
    /* SASS runs on its own major architecture, at its minor or a later one */
    if (sm && ((int)sm / 10 != cc_major || (int)sm % 10 > cc_minor)) return 0;
    return shoff + (uint64_t)shentsize * shnum;
}

/* PTX: NUL-terminated text for a virtual architecture at or below this
   GPU's, which the driver would compile for it. */
static size_t ptx_size(const char *text) {
    const char *target = strstr(text, ".target sm_");
    int arch;
    if (!strstr(text, ".version ") || !target || sscanf(target, ".target sm_%d", &arch) != 1) return 0;
    return arch <= 10 * cc_major + cc_minor ? strlen(text) + 1 : 0;
}

CUresult cuModuleLoadData(void **module, const void *image) {
    CONTEXT();
    if (!module || !image) return INVALID_VALUE;
    size_t size = cubin_size(image);
    if (!size) size = ptx_size(image);
    if (!size) return INVALID_IMAGE;
    for (int i = 0; i < MAX_MODULES; i++) {
        if (modules[i].image) continue;
        modules[i].image = malloc(size);
        memcpy(modules[i].image, image, size);
        modules[i].size = size;
        *module = &modules[i];
        return OK;
    }
    return OUT_OF_MEMORY;
}

CUresult cuModuleGetFunction(void **fn, void *module, const char *name) {
    CONTEXT();
    if (!fn || !name) return INVALID_VALUE;
    if ((char *)module < (char *)modules || (char *)module >= (char *)(modules + MAX_MODULES)) return INVALID_HANDLE;
    char *image = ((typeof(&modules[0]))module)->image;
    size_t size = ((typeof(&modules[0]))module)->size;
    for (int k = 0; k < NKERNELS; k++) {
        if (strcmp(name, KERNELS[k]) != 0) continue;
        /* the kernel must be in the image: ".text.<name>" names its code
           section in a cubin, ".entry <name>(" its entry in PTX */
        char section[128], entry[128];
        snprintf(section, sizeof section, ".text.%s", name);
        snprintf(entry, sizeof entry, ".entry %s(", name);
        if (!memmem(image, size, section, strlen(section) + 1) && !memmem(image, size, entry, strlen(entry)))
            return NOT_FOUND;
        *fn = (void *)(uintptr_t)(k + 1);
        return OK;
    }
    return NOT_FOUND;
}

#define ARG(i) (*(nha_u64 *)params[i])
#define RANGE(var, type, ptr, bytes)                                  \
    type var = fakecuda_range((ptr), (bytes));                        \
    if (!var) return fail(ILLEGAL_ADDRESS)

static CUresult run_kernel(int k, void **params) {
    switch (k) {
        case 0: { /* nha_fill_bf16(out, n, seed) */
            nha_u64 n = ARG(1), seed = ARG(2);
            RANGE(out, nha_u16 *, ARG(0), 2 * n);
            for (nha_u64 i = 0; i < n; i++) out[i] = nha_input_bf16(seed, i);
            return OK;
        }
        case 1: { /* nha_digest_f32(c, n, digest, nonfinite) */
            nha_u64 n = ARG(1), acc = 0, bad = 0;
            RANGE(c, const nha_u32 *, ARG(0), 4 * n);
            RANGE(digest, nha_u64 *, ARG(2), 8);
            RANGE(nonfinite, nha_u64 *, ARG(3), 8);
            for (nha_u64 i = 0; i < n; i++) {
                acc += nha_digest_term(i, c[i]);
                bad += (c[i] & 0x7F800000u) == 0x7F800000u;
            }
            *digest += acc;
            *nonfinite += bad;
            return OK;
        }
        case 2: { /* nha_digest_compare(reference, current, mismatches) */
            RANGE(ref, nha_u64 *, ARG(0), 8);
            RANGE(cur, nha_u64 *, ARG(1), 8);
            RANGE(mismatches, nha_u64 *, ARG(2), 8);
            if (*cur != *ref) ++*mismatches;
            *cur = 0;
            return OK;
        }
        case 3: { /* nha_mem_write(p, n, base, seed, invert) */
            nha_u64 n = ARG(1), base = ARG(2), seed = ARG(3), invert = ARG(4);
            RANGE(p, nha_u64 *, ARG(0), 8 * n);
            for (nha_u64 i = 0; i < n; i++) p[i] = nha_pattern(seed, base + i) ^ invert;
            if (FAKE.stuck && FAKE.stuck_word >= base && FAKE.stuck_word - base < n) p[FAKE.stuck_word - base] |= 32;
            return OK;
        }
        case 4: { /* nha_mem_verify(p, n, base, seed, invert, errors, first_bad) */
            nha_u64 n = ARG(1), base = ARG(2), seed = ARG(3), invert = ARG(4), bad = 0;
            RANGE(p, const nha_u64 *, ARG(0), 8 * n);
            RANGE(errors, nha_u64 *, ARG(5), 8);
            RANGE(first_bad, nha_u64 *, ARG(6), 8);
            for (nha_u64 i = 0; i < n; i++) {
                if (p[i] == (nha_pattern(seed, base + i) ^ invert)) continue;
                bad++;
                if (base + i < *first_bad) *first_bad = base + i;
            }
            *errors += bad;
            return OK;
        }
    }
    return INVALID_HANDLE;
}

CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *stream, void **params, void **extra) {
    CONTEXT();
    STREAM(stream);
    int k = (int)(uintptr_t)fn - 1;
    if (k < 0 || k >= NKERNELS) return INVALID_HANDLE;
    if (!params || extra || gx == 0 || gx > 0x7FFFFFFF || gy != 1 || gz != 1 || bx == 0 || bx > 1024 || by != 1 ||
        bz != 1 || shared > 48 * 1024)
        return INVALID_VALUE;
    if (FAKE.fail_launch && ++launches >= FAKE.fail_launch) return fail(FAKE.fail_code);
    return pending ? OK : run_kernel(k, params);
}

/* ------------------------------------------------------------- entry points */

/* NVRTC opens libcuda.so.1 too, and asks for the driver's private tables:
   there are none here, which it takes as "no driver features to use". */
CUresult cuGetExportTable(const void **table, const void *id) {
    (void)id;
    if (table) *table = NULL;
    return NOT_FOUND;
}

#define ENTRY(name) {#name, (void *)name}
static const struct {
    const char *name;
    void *fn;
} ENTRIES[] = {
    ENTRY(cuInit),          ENTRY(cuDriverGetVersion),     ENTRY(cuGetErrorName),       ENTRY(cuGetErrorString),
    ENTRY(cuDeviceGetCount), ENTRY(cuDeviceGet),           ENTRY(cuDeviceGetName),      ENTRY(cuDeviceGetPCIBusId),
    ENTRY(cuDeviceGetAttribute), ENTRY(cuDevicePrimaryCtxRetain), ENTRY(cuDevicePrimaryCtxRelease),
    ENTRY(cuDevicePrimaryCtxSetFlags),
    ENTRY(cuCtxSetCurrent), ENTRY(cuStreamCreate),         ENTRY(cuStreamDestroy),      ENTRY(cuStreamSynchronize),
    ENTRY(cuMemGetInfo),    ENTRY(cuMemAlloc),             ENTRY(cuMemFree),            ENTRY(cuMemsetD32Async),
    ENTRY(cuMemcpyDtoH),    ENTRY(cuModuleLoadData),       ENTRY(cuModuleGetFunction),  ENTRY(cuLaunchKernel),
};

/* cuda-bindings asks for every entry point by its base name and the CUDA
   version that introduced the signature it wants; this fake has one
   signature per name, the one the newest version asks for. */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
    (void)version;
    (void)flags;
    if (!symbol || !pfn) return INVALID_VALUE;
    for (size_t i = 0; i < sizeof ENTRIES / sizeof *ENTRIES; i++) {
        if (strcmp(symbol, ENTRIES[i].name) != 0) continue;
        *pfn = ENTRIES[i].fn;
        if (status) *status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
        return OK;
    }
    *pfn = NULL;
    if (status) *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    return NOT_FOUND;
}
