/* Shared declarations of tierd's native copy module (pure C parts, no Python):
 * a parallel-for on short-lived pthreads, CRC-32C, batched file I/O, the GPU loader. */
#ifndef WG_COMMON_H
#define WG_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define WG_ALIGN 4096u
#define WG_MAX_THREADS 64
#define WG_MAX_IO_THREADS 16

/* Calls fn(ctx, i) for every i in [0, n), on `threads` threads (the caller is one of them);
 * items are claimed one at a time from an atomic counter, so uneven items balance. */
typedef void (*wg_item_fn)(void *ctx, size_t i);
void wg_parallel_for(size_t n, int threads, wg_item_fn fn, void *ctx);
int wg_cpu_count(void);

/* CRC-32C (Castagnoli), reflected, standard pre/post inversion: crc32c("123456789") =
 * 0xE3069283. `crc` is the CRC of the preceding bytes (0 to start). */
uint32_t wg_crc32c(uint32_t crc, const void *buf, size_t len);
uint32_t wg_crc32c_sw(uint32_t crc, const void *buf, size_t len);
int wg_crc32c_hw_available(void);

/* One slice of a batched file operation. `status` receives bytes done or -errno. */
typedef struct {
    const char *path;
    char *buf;
    size_t size;
    off_t file_offset;
    int64_t status;
} wg_io;

typedef struct {
    wg_io *items;
    int direct;
    int fsync;
    int truncate; /* writes: O_TRUNC and whole-file writes from offset 0 */
} wg_io_batch;

void wg_read_item(void *batch, size_t i);  /* wg_item_fn over a wg_io_batch */
void wg_write_item(void *batch, size_t i); /* wg_item_fn over a wg_io_batch */
int wg_probe_direct(const char *directory, char *why, size_t whylen);
int wg_drop_page_cache(const char *path); /* 0 or -errno */

#endif
