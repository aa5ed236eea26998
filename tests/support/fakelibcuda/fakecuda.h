/* Shared by the fake libcuda.so.1 and the fake libcublas.so.12. */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#define NHA_HOST
#include "nha_helpers.h" /* agent/burn/kernels.py HELPERS, written out at build time */

struct fake_faults {
    int flip_gemm;  /* flip a bit in the output of this GEMM (1-based); 0: never */
    int wrong;      /* every GEMM adds 1.0 to each element */
    int stuck;      /* stuck_word reads with bit 5 set */
    unsigned long long stuck_word;
    double slow;    /* GEMM time factor */
    double gemm_ms; /* time of one GEMM beside the CPU work */
    int hang_sync;  /* this cuStreamSynchronize never returns (1-based); 0: never */
    int fail_launch, fail_code;
};

extern struct fake_faults FAKE;
void *fakecuda_range(unsigned long long ptr, size_t bytes);
int fakecuda_sticky(void);
int fakecuda_ready(void);
void fakecuda_fault(int code);

#endif
