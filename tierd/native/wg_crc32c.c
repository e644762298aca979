/* CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78).
 * Hardware: the SSE4.2 crc32 instruction, chosen at run time when the CPU has it. The
 * instruction has a latency of 3 cycles but a throughput of 1, so long inputs run three
 * independent lanes of LANE bytes side by side and join them: the CRC register is linear, so
 * reg(a, A|B) = reg(a, A) * x^(8|B|) mod P xor reg(0, B); the multiplication by x^(8 LANE)
 * is a carry-less multiply modulo P with a constant computed once (after zlib's crc32_combine).
 * Software: slicing-by-8 tables (8 lookups fold 8 bytes a step). Tables and constant are built
 * once (pthread_once) and never written again; both paths give identical results. */
#include <pthread.h>
#include <string.h>

#include "wg_common.h"

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define WG_X86 1
#endif

#define POLY 0x82F63B78u

#define LANE 4096u /* bytes per lane per round of the 3-lane hardware loop */

static uint32_t wg_tables[8][256];
static uint32_t wg_lane_shift; /* x^(8 * LANE) mod P */
static pthread_once_t wg_tables_once = PTHREAD_ONCE_INIT;

/* a * b modulo P, polynomials in reflected bit order (bit 31 is x^0). */
static uint32_t wg_multmodp(uint32_t a, uint32_t b) {
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0)
                break;
        }
        m >>= 1;
        b = (b & 1) ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

/* x^(8 * nbytes) mod P by repeated squaring. */
static uint32_t wg_xpow8n(size_t nbytes) {
    uint32_t result = 1u << 31; /* x^0 */
    uint32_t sq = 1u << 23;     /* x^8 */
    while (nbytes) {
        if (nbytes & 1)
            result = wg_multmodp(sq, result);
        sq = wg_multmodp(sq, sq);
        nbytes >>= 1;
    }
    return result;
}

static void wg_build_tables(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        wg_tables[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++)
            wg_tables[t][n] = (wg_tables[t - 1][n] >> 8) ^ wg_tables[0][wg_tables[t - 1][n] & 0xFF];
    wg_lane_shift = wg_xpow8n(LANE);
}

uint32_t wg_crc32c_sw(uint32_t crc, const void *buf, size_t len) {
    const unsigned char *p = (const unsigned char *)buf;
    pthread_once(&wg_tables_once, wg_build_tables);
    crc = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        crc = wg_tables[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
        len--;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc; /* little-endian: the CRC folds into the first four bytes */
        crc = wg_tables[7][w & 0xFF] ^ wg_tables[6][(w >> 8) & 0xFF] ^
              wg_tables[5][(w >> 16) & 0xFF] ^ wg_tables[4][(w >> 24) & 0xFF] ^
              wg_tables[3][(w >> 32) & 0xFF] ^ wg_tables[2][(w >> 40) & 0xFF] ^
              wg_tables[1][(w >> 48) & 0xFF] ^ wg_tables[0][w >> 56];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = wg_tables[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

#ifdef WG_X86
__attribute__((target("sse4.2"))) static uint32_t wg_crc32c_hw(uint32_t crc, const void *buf,
                                                               size_t len) {
    const unsigned char *p = (const unsigned char *)buf;
    uint64_t c = (uint32_t)~crc;
    while (len && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        len--;
    }
    if (len >= 3 * LANE)
        pthread_once(&wg_tables_once, wg_build_tables);
    while (len >= 3 * LANE) {
        uint64_t c1 = 0, c2 = 0;
        for (const unsigned char *end = p + LANE; p < end; p += 8) {
            uint64_t w0, w1, w2;
            memcpy(&w0, p, 8);
            memcpy(&w1, p + LANE, 8);
            memcpy(&w2, p + 2 * LANE, 8);
            c = _mm_crc32_u64(c, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
        }
        c = wg_multmodp(wg_lane_shift, (uint32_t)c) ^ (uint32_t)c1;
        c = wg_multmodp(wg_lane_shift, (uint32_t)c) ^ (uint32_t)c2;
        p += 2 * LANE;
        len -= 3 * LANE;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        len -= 8;
    }
    while (len--)
        c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}

int wg_crc32c_hw_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") ? 1 : 0;
}

uint32_t wg_crc32c(uint32_t crc, const void *buf, size_t len) {
    if (wg_crc32c_hw_available())
        return wg_crc32c_hw(crc, buf, len);
    return wg_crc32c_sw(crc, buf, len);
}
#else
int wg_crc32c_hw_available(void) { return 0; }

uint32_t wg_crc32c(uint32_t crc, const void *buf, size_t len) {
    return wg_crc32c_sw(crc, buf, len);
}
#endif
