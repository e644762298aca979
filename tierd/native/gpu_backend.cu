/* GPU backend of tierd's copy module, one source for CUDA (nvcc) and HIP (hipcc) through
 * gpu_compat.h; built as its own shared library and dlopened by the host extension.
 * A batch of slice copies is split into contiguous runs, one per dedicated non-blocking
 * stream of the context; each run goes out as one cudaMemcpyBatchAsync where the runtime has
 * it (CUDA 12.8+), else as one gpuMemcpyAsync per slice; then every stream is synchronised.
 * Unified addressing (gpuMemcpyDefault) lets the runtime tell H2D, D2H and D2D apart.
 * copy_async (the KV block copier's path) enqueues on the first stream, ordered after and
 * before the caller's stream by events, records a completion event and returns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_compat.h"
#include "wg_gpu_api.h"

#define WG_MAX_STREAMS 16

struct wg_gpu_ctx {
    int device;
    int nstreams;
    int batch_api_ok; /* cleared after the batched API fails once; per-copy from then on */
    gpuStream_t streams[WG_MAX_STREAMS];
    int nevents;
    gpuEvent_t events[WG_GPU_EVENTS + 1]; /* completion events; the last: "caller's stream" */
};

static void wg_ctx_destroy(wg_gpu_ctx *ctx) {
    for (int s = 0; s < ctx->nstreams; s++)
        gpuStreamDestroy(ctx->streams[s]);
    for (int i = 0; i < ctx->nevents; i++)
        gpuEventDestroy(ctx->events[i]);
    free(ctx);
}

static int wg_fail(gpuError_t e, const char *what, char *err, size_t errlen) {
    if (err && errlen)
        snprintf(err, errlen, "%s: %s", what, gpuGetErrorString(e));
    return -(int)e - 1;
}

extern "C" {

int wg_gpu_abi(void) { return WG_GPU_ABI_VERSION; }

const char *wg_gpu_runtime(void) { return WG_RUNTIME_NAME; }

int wg_gpu_runtime_version(void) {
    int v = 0;
    if (gpuRuntimeGetVersion(&v) != gpuSuccess)
        return -1;
    return v;
}

int wg_gpu_device_count(char *err, size_t errlen) {
    int n = 0;
    gpuError_t e = gpuGetDeviceCount(&n);
    if (e != gpuSuccess) {
        (void)gpuGetLastError();
        return wg_fail(e, "no device", err, errlen);
    }
    return n;
}

int wg_gpu_device_name(int device, char *name, size_t namelen) {
    gpuDeviceProp prop;
    memset(&prop, 0, sizeof(prop));
    if (gpuGetDeviceProperties(&prop, device) != gpuSuccess)
        return -1;
    snprintf(name, namelen, "%s", prop.name);
    return 0;
}

int wg_gpu_open(int device, int nstreams, wg_gpu_ctx **out, char *err, size_t errlen) {
    gpuError_t e = gpuSetDevice(device);
    if (e != gpuSuccess)
        return wg_fail(e, "set device", err, errlen);
    if (nstreams < 1)
        nstreams = 1;
    if (nstreams > WG_MAX_STREAMS)
        nstreams = WG_MAX_STREAMS;
    wg_gpu_ctx *ctx = (wg_gpu_ctx *)calloc(1, sizeof(wg_gpu_ctx));
    if (!ctx) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    ctx->device = device;
    ctx->batch_api_ok = 1;
    for (int s = 0; s < nstreams; s++) {
        e = gpuStreamCreateWithFlags(&ctx->streams[s], gpuStreamNonBlocking);
        if (e != gpuSuccess) {
            wg_ctx_destroy(ctx);
            return wg_fail(e, "create stream", err, errlen);
        }
        ctx->nstreams = s + 1;
    }
    for (int i = 0; i < WG_GPU_EVENTS + 1; i++) {
        e = gpuEventCreateWithFlags(&ctx->events[i], gpuEventDisableTiming);
        if (e != gpuSuccess) {
            wg_ctx_destroy(ctx);
            return wg_fail(e, "create event", err, errlen);
        }
        ctx->nevents = i + 1;
    }
    *out = ctx;
    return 0;
}

void wg_gpu_close(wg_gpu_ctx *ctx) {
    if (!ctx)
        return;
    gpuSetDevice(ctx->device);
    wg_ctx_destroy(ctx);
}

int wg_gpu_malloc(wg_gpu_ctx *ctx, size_t nbytes, void **out, char *err, size_t errlen) {
    gpuError_t e = gpuSetDevice(ctx->device);
    if (e == gpuSuccess)
        e = gpuMalloc(out, nbytes);
    return e == gpuSuccess ? 0 : wg_fail(e, "device malloc", err, errlen);
}

int wg_gpu_free(wg_gpu_ctx *ctx, void *ptr) {
    gpuSetDevice(ctx->device);
    return gpuFree(ptr) == gpuSuccess ? 0 : -1;
}

int wg_gpu_host_register(void *ptr, size_t nbytes, char *err, size_t errlen) {
    gpuError_t e = gpuHostRegister(ptr, nbytes, gpuHostRegisterPortable);
    return e == gpuSuccess ? 0 : wg_fail(e, "host register", err, errlen);
}

int wg_gpu_host_unregister(void *ptr) { return gpuHostUnregister(ptr) == gpuSuccess ? 0 : -1; }

#ifdef WG_HAVE_BATCH_COPY
static gpuError_t wg_batch_run(wg_gpu_ctx *ctx, void *const *dsts, const void *const *srcs,
                               const size_t *sizes, size_t n, gpuStream_t stream) {
    cudaMemcpyAttributes attr;
    memset(&attr, 0, sizeof(attr));
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint.type = cudaMemLocationTypeDevice;
    attr.srcLocHint.id = ctx->device;
    attr.dstLocHint.type = cudaMemLocationTypeDevice;
    attr.dstLocHint.id = ctx->device;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_idx = 0;
#if CUDART_VERSION >= 13000
    return cudaMemcpyBatchAsync(dsts, srcs, sizes, n, &attr, &attr_idx, 1, stream);
#else
    size_t fail_idx = 0;
    return cudaMemcpyBatchAsync((void **)dsts, (void **)srcs, (size_t *)sizes, n, &attr,
                                &attr_idx, 1, &fail_idx, stream);
#endif
}
#endif

static gpuError_t wg_copy_run(void *const *dsts, const void *const *srcs, const size_t *sizes,
                              size_t n, gpuStream_t stream) {
    for (size_t i = 0; i < n; i++) {
        if (sizes[i] == 0)
            continue;
        gpuError_t e = gpuMemcpyAsync(dsts[i], srcs[i], sizes[i], gpuMemcpyDefault, stream);
        if (e != gpuSuccess)
            return e;
    }
    return gpuSuccess;
}

/* One stream's run of copies: the batched API where the runtime has it (and it worked
 * before), else one async copy per slice. */
static gpuError_t wg_enqueue(wg_gpu_ctx *ctx, void *const *dsts, const void *const *srcs,
                             const size_t *sizes, size_t n, gpuStream_t stream, int *used) {
#ifdef WG_HAVE_BATCH_COPY
    if (ctx->batch_api_ok) {
        gpuError_t e = wg_batch_run(ctx, dsts, srcs, sizes, n, stream);
        if (e == gpuSuccess) {
            *used = 1;
            return e;
        }
        (void)gpuGetLastError();
        ctx->batch_api_ok = 0; /* unsupported here: per-copy from now on */
    }
#endif
    return wg_copy_run(dsts, srcs, sizes, n, stream);
}

int wg_gpu_copy_batch(wg_gpu_ctx *ctx, void *const *dsts, const void *const *srcs,
                      const size_t *sizes, size_t n, int *used_batch_api, char *err,
                      size_t errlen) {
    *used_batch_api = 0;
    gpuError_t e = gpuSetDevice(ctx->device);
    if (e != gpuSuccess)
        return wg_fail(e, "set device", err, errlen);
    size_t per = (n + (size_t)ctx->nstreams - 1) / (size_t)ctx->nstreams;
    gpuError_t first = gpuSuccess;
    int used = 0;
    for (int s = 0; s < ctx->nstreams && first == gpuSuccess; s++) {
        size_t lo = (size_t)s * per;
        if (lo >= n)
            break;
        size_t cnt = n - lo < per ? n - lo : per;
        e = wg_enqueue(ctx, dsts + lo, srcs + lo, sizes + lo, cnt, ctx->streams[s], &used);
        if (e != gpuSuccess)
            first = e;
    }
    for (int s = 0; s < ctx->nstreams; s++) {
        e = gpuStreamSynchronize(ctx->streams[s]);
        if (e != gpuSuccess && first == gpuSuccess)
            first = e;
    }
    *used_batch_api = used;
    return first == gpuSuccess ? 0 : wg_fail(first, "copy", err, errlen);
}

int wg_gpu_copy_async(wg_gpu_ctx *ctx, void *const *dsts, const void *const *srcs,
                      const size_t *sizes, size_t n, int order, size_t after, int slot,
                      int *used_batch_api, char *err, size_t errlen) {
    *used_batch_api = 0;
    if (slot < 0 || slot >= WG_GPU_EVENTS) {
        snprintf(err, errlen, "event slot %d out of range", slot);
        return -1;
    }
    gpuStream_t own = ctx->streams[0];
    gpuStream_t caller = (gpuStream_t)after;
    gpuEvent_t before = ctx->events[WG_GPU_EVENTS];
    gpuError_t e = gpuSetDevice(ctx->device);
    if (e != gpuSuccess)
        return wg_fail(e, "set device", err, errlen);
    if (order) { /* after everything already on the caller's stream */
        e = gpuEventRecord(before, caller);
        if (e == gpuSuccess)
            e = gpuStreamWaitEvent(own, before, 0);
        if (e != gpuSuccess)
            return wg_fail(e, "order after the caller's stream", err, errlen);
    }
    e = n ? wg_enqueue(ctx, dsts, srcs, sizes, n, own, used_batch_api) : gpuSuccess;
    if (e != gpuSuccess) {
        /* some copies may be queued: the event still marks where they end */
        (void)gpuEventRecord(ctx->events[slot], own);
        return wg_fail(e, "enqueue copies", err, errlen);
    }
    e = gpuEventRecord(ctx->events[slot], own);
    if (e == gpuSuccess && order) /* the caller's later work waits for the copies */
        e = gpuStreamWaitEvent(caller, ctx->events[slot], 0);
    return e == gpuSuccess ? 0 : wg_fail(e, "record completion", err, errlen);
}

int wg_gpu_event_wait(wg_gpu_ctx *ctx, int slot, char *err, size_t errlen) {
    if (slot < 0 || slot >= WG_GPU_EVENTS) {
        snprintf(err, errlen, "event slot %d out of range", slot);
        return -1;
    }
    gpuError_t e = gpuEventSynchronize(ctx->events[slot]);
    return e == gpuSuccess ? 0 : wg_fail(e, "copy", err, errlen);
}

int wg_gpu_event_query(wg_gpu_ctx *ctx, int slot, char *err, size_t errlen) {
    if (slot < 0 || slot >= WG_GPU_EVENTS) {
        snprintf(err, errlen, "event slot %d out of range", slot);
        return -1;
    }
    gpuError_t e = gpuEventQuery(ctx->events[slot]);
    if (e == gpuSuccess)
        return 1;
    if (e == gpuErrorNotReady) {
        (void)gpuGetLastError();
        return 0;
    }
    return wg_fail(e, "copy", err, errlen);
}

} /* extern "C" */
