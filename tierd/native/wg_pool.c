/* A parallel-for on short-lived pthreads: the caller and threads-1 helpers each claim the
 * next item index from one atomic counter until none is left, then the helpers are joined.
 * Spawning per call costs tens of microseconds, which only batches worth splitting pay. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "wg_common.h"

typedef struct {
    atomic_size_t next;
    size_t n;
    wg_item_fn fn;
    void *ctx;
} wg_loop;

static void *wg_worker(void *arg) {
    wg_loop *loop = (wg_loop *)arg;
    for (;;) {
        size_t i = atomic_fetch_add_explicit(&loop->next, 1, memory_order_relaxed);
        if (i >= loop->n)
            break;
        loop->fn(loop->ctx, i);
    }
    return NULL;
}

void wg_parallel_for(size_t n, int threads, wg_item_fn fn, void *ctx) {
    wg_loop loop;
    pthread_t tids[WG_MAX_THREADS];
    int started = 0;
    atomic_init(&loop.next, 0);
    loop.n = n;
    loop.fn = fn;
    loop.ctx = ctx;
    if (threads > WG_MAX_THREADS)
        threads = WG_MAX_THREADS;
    if ((size_t)threads > n)
        threads = (int)n;
    for (int t = 1; t < threads; t++) {
        if (pthread_create(&tids[started], NULL, wg_worker, &loop) != 0)
            break; /* fewer helpers: the work still gets done */
        started++;
    }
    wg_worker(&loop);
    for (int t = 0; t < started; t++)
        pthread_join(tids[t], NULL);
}

int wg_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
