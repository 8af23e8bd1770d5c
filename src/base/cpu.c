/* Run-time CPU feature detection (CPUID + XGETBV) and the kernel path choice. */
#include "difflet/base.h"

#include <cpuid.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static dl_cpu_features g_cpu;
static int g_cpu_done;
static int g_isa = -1;

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

const dl_cpu_features *dl_cpu(void) {
    if (g_cpu_done) return &g_cpu;
    unsigned a, b, c, d;
    memset(&g_cpu, 0, sizeof g_cpu);
    if (__get_cpuid_max(0, NULL) >= 7 && __get_cpuid(1, &a, &b, &c, &d)) {
        int osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
        uint64_t xcr0 = osxsave ? xgetbv0() : 0;
        int ymm_os = (xcr0 & 0x6) == 0x6;
        int zmm_os = (xcr0 & 0xe6) == 0xe6;
        __cpuid_count(7, 0, a, b, c, d);
        int avx2 = (b >> 5) & 1;
        int f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
        g_cpu.avx2_fma = ymm_os && avx2 && fma && f16c;
        g_cpu.avx512f = g_cpu.avx2_fma && zmm_os && f && dq && bw && vl;
        int amx_os = (xcr0 & 0x60000) == 0x60000; /* XTILECFG and XTILEDATA enabled by the OS */
        g_cpu.amx_bf16 = g_cpu.avx512f && amx_os && ((d >> 24) & 1) && ((d >> 22) & 1);
        g_cpu.amx_int8 = g_cpu.avx512f && amx_os && ((d >> 24) & 1) && ((d >> 25) & 1);
        g_cpu.vnni = g_cpu.avx512f && ((c >> 11) & 1);
        __cpuid_count(7, 1, a, b, c, d);
        g_cpu.avx512_bf16 = g_cpu.avx512f && ((a >> 5) & 1);
        g_cpu.vnni |= g_cpu.avx2_fma && ((a >> 4) & 1);
    }
    g_cpu_done = 1;
    return &g_cpu;
}

const char *dl_cpu_model(void) {
    static char brand[49];
    if (brand[0]) return brand;
    unsigned r[12] = {0};
    if (__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u)
        for (unsigned i = 0; i < 3; i++) __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
    memcpy(brand, r, 48);
    brand[48] = 0;
    char *b = brand;
    while (*b == ' ') b++;
    memmove(brand, b, strlen(b) + 1);
    for (size_t n = strlen(brand); n && brand[n - 1] == ' '; n--) brand[n - 1] = 0;
    if (!brand[0]) snprintf(brand, sizeof brand, "unknown x86-64");
    return brand;
}

static dl_isa best_isa(void) {
    const dl_cpu_features *f = dl_cpu();
    if (f->avx512_bf16) return DL_ISA_AVX512_BF16;
    if (f->avx512f) return DL_ISA_AVX512;
    if (f->avx2_fma) return DL_ISA_AVX2;
    return DL_ISA_REF;
}

dl_isa dl_kernel_isa(void) {
    if (g_isa >= 0) return (dl_isa)g_isa;
    dl_isa best = best_isa(), want = best;
    const char *env = getenv("DIFFLET_KERNELS");
    if (env && *env) {
        if (!strcasecmp(env, "ref")) want = DL_ISA_REF;
        else if (!strcasecmp(env, "avx2")) want = DL_ISA_AVX2;
        else if (!strcasecmp(env, "avx512")) want = DL_ISA_AVX512_BF16;
        else if (strcasecmp(env, "auto"))
            dl_log(DL_LOG_WARN, "DIFFLET_KERNELS=%s is not one of ref|avx2|avx512|auto; using auto", env);
    }
    g_isa = (int)(want < best ? want : best);
    return (dl_isa)g_isa;
}

void dl_set_kernel_isa(dl_isa isa) {
    dl_isa best = best_isa();
    g_isa = (int)(isa < best ? isa : best);
}

const char *dl_isa_name(dl_isa isa) {
    switch (isa) {
    case DL_ISA_REF: return "ref";
    case DL_ISA_AVX2: return "avx2";
    case DL_ISA_AVX512: return "avx512";
    case DL_ISA_AVX512_BF16: return "avx512-bf16";
    }
    return "?";
}
