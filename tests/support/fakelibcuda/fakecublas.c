/* A fake libcublas.so.12 for tests: the five calls the burn makes, checked
 * the way cuBLAS checks them, with the GEMM computed on the CPU (BF16 inputs,
 * FP32 accumulation in k order) over the fake libcuda's memory, faults and
 * all. It links against the fake libcuda.so.1 beside it (rpath $ORIGIN). */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fakecuda.h"

enum {
    STATUS_SUCCESS = 0,
    STATUS_NOT_INITIALIZED = 1,
    STATUS_ALLOC_FAILED = 3,
    STATUS_INVALID_VALUE = 7,
    STATUS_EXECUTION_FAILED = 13,
    STATUS_NOT_SUPPORTED = 15,
};

struct handle {
    unsigned magic;
    void *stream;
};
#define MAGIC 0xB1A5u

static int gemms;

int cublasCreate_v2(struct handle **out) {
    if (!out) return STATUS_INVALID_VALUE;
    /* cuBLAS needs an initialised driver with a current context */
    if (!fakecuda_ready()) return STATUS_NOT_INITIALIZED;
    struct handle *h = calloc(1, sizeof *h);
    if (!h) return STATUS_ALLOC_FAILED;
    h->magic = MAGIC;
    *out = h;
    return STATUS_SUCCESS;
}

#define HANDLE(h) \
    if (!(h) || (h)->magic != MAGIC) return STATUS_NOT_INITIALIZED

int cublasDestroy_v2(struct handle *h) {
    HANDLE(h);
    h->magic = 0;
    free(h);
    return STATUS_SUCCESS;
}

int cublasSetStream_v2(struct handle *h, void *stream) {
    HANDLE(h);
    h->stream = stream;
    return STATUS_SUCCESS;
}

int cublasGetProperty(int type, int *value) {
    static const int version[] = {12, 9, 1};
    if (!value || type < 0 || type > 2) return STATUS_INVALID_VALUE;
    *value = version[type];
    return STATUS_SUCCESS;
}

static float bf16(nha_u16 bits) {
    nha_u32 u = (nha_u32)bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

int cublasGemmEx(struct handle *h, int transa, int transb, int m, int n, int k, const float *alpha, const void *A,
                 int atype, int lda, const void *B, int btype, int ldb, const float *beta, void *C, int ctype, int ldc,
                 int compute, int algo) {
    HANDLE(h);
    if (m < 0 || n < 0 || k < 0 || lda < (m > 1 ? m : 1) || ldb < (k > 1 ? k : 1) || ldc < (m > 1 ? m : 1) ||
        !alpha || !beta || (unsigned)transa > 2 || (unsigned)transb > 2)
        return STATUS_INVALID_VALUE;
    /* only what the burn asks for: BF16 x BF16 -> FP32, FP32 compute, no transposes */
    if (transa || transb || atype != 14 || btype != 14 || ctype != 0 || compute != 68 || (algo != -1 && algo != 99))
        return STATUS_NOT_SUPPORTED;
    if (fakecuda_sticky()) return STATUS_EXECUTION_FAILED;
    const nha_u16 *a = fakecuda_range((uintptr_t)A, 2ull * lda * k);
    const nha_u16 *b = fakecuda_range((uintptr_t)B, 2ull * ldb * n);
    float *c = fakecuda_range((uintptr_t)C, 4ull * ldc * n);
    if (!a || !b || !c) {
        fakecuda_fault(700); /* the kernel reads or writes out of bounds: CUDA_ERROR_ILLEGAL_ADDRESS */
        return STATUS_SUCCESS;
    }
    float *af = malloc(sizeof(float) * (size_t)m * k), *acc = malloc(sizeof(float) * (size_t)m);
    if (!af || !acc) return STATUS_ALLOC_FAILED;
    for (int kk = 0; kk < k; kk++)
        for (int i = 0; i < m; i++) af[(size_t)kk * m + i] = bf16(a[(size_t)kk * lda + i]);
    for (int j = 0; j < n; j++) {
        memset(acc, 0, sizeof(float) * (size_t)m);
        for (int kk = 0; kk < k; kk++) {
            float bv = bf16(b[(size_t)j * ldb + kk]);
            const float *col = af + (size_t)kk * m;
            for (int i = 0; i < m; i++) acc[i] += col[i] * bv;
        }
        float *out = c + (size_t)j * ldc;
        for (int i = 0; i < m; i++) out[i] = *alpha * acc[i] + (*beta != 0.0f ? *beta * out[i] : 0.0f);
    }
    free(af);
    free(acc);
    gemms++;
    if (FAKE.wrong)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) c[(size_t)j * ldc + i] += 1.0f;
    if (FAKE.flip_gemm == gemms && m * n > 7) {
        nha_u32 bits;
        memcpy(&bits, &c[7], 4);
        bits ^= 1u << 3;
        memcpy(&c[7], &bits, 4);
    }
    double ms = FAKE.gemm_ms * FAKE.slow;
    if (ms > 0) {
        struct timespec ts = {(time_t)(ms / 1000), (long)((ms - 1000 * (time_t)(ms / 1000)) * 1e6)};
        nanosleep(&ts, NULL);
    }
    return STATUS_SUCCESS;
}
