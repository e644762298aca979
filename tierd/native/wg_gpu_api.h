/* The C ABI between the host extension and a GPU backend library (_wg_cuda.so, _wg_hip.so,
 * both built from gpu_backend.cu). The extension dlopens a library and resolves these
 * symbols only when asked for a GPU, so it imports on machines without GPU runtimes.
 * Every function returns 0 on success or a negative code with a message in err. */
#ifndef WG_GPU_API_H
#define WG_GPU_API_H

#include <stddef.h>

#define WG_GPU_ABI_VERSION 2
#define WG_GPU_EVENTS 64 /* completion events per context, reused round robin */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct wg_gpu_ctx wg_gpu_ctx;

typedef int (*wg_gpu_abi_fn)(void);
typedef const char *(*wg_gpu_runtime_fn)(void); /* "cuda" or "hip" */
typedef int (*wg_gpu_runtime_version_fn)(void);
/* Number of devices (>= 0), or < 0 with err saying why none can be used. */
typedef int (*wg_gpu_device_count_fn)(char *err, size_t errlen);
typedef int (*wg_gpu_device_name_fn)(int device, char *name, size_t namelen);
/* A context: the device and `nstreams` dedicated non-blocking streams. */
typedef int (*wg_gpu_open_fn)(int device, int nstreams, wg_gpu_ctx **out, char *err,
                              size_t errlen);
typedef void (*wg_gpu_close_fn)(wg_gpu_ctx *ctx);
typedef int (*wg_gpu_malloc_fn)(wg_gpu_ctx *ctx, size_t nbytes, void **out, char *err,
                                size_t errlen);
typedef int (*wg_gpu_free_fn)(wg_gpu_ctx *ctx, void *ptr);
/* Page-lock (register) host memory for DMA, portable across devices. */
typedef int (*wg_gpu_host_register_fn)(void *ptr, size_t nbytes, char *err, size_t errlen);
typedef int (*wg_gpu_host_unregister_fn)(void *ptr);
/* Copies n slices (unified addressing decides each direction), spread over the context's
 * streams (batched API where the runtime has one), then waits for all of them.
 * *used_batch_api is set to 1 when the runtime's batched copy was used. */
typedef int (*wg_gpu_copy_batch_fn)(wg_gpu_ctx *ctx, void *const *dsts, const void *const *srcs,
                                    const size_t *sizes, size_t n, int *used_batch_api,
                                    char *err, size_t errlen);
/* Enqueues n slice copies on the context's first stream and returns without waiting.
 * With `order` set, the copies come after all work enqueued so far on the caller's stream
 * `after` (a cudaStream_t/hipStream_t as an integer; 0 = the legacy default stream), and
 * work the caller enqueues on `after` later waits for the copies: they behave as if issued
 * on that stream, but run on ours. Then completion event `slot` (< WG_GPU_EVENTS) is recorded. */
typedef int (*wg_gpu_copy_async_fn)(wg_gpu_ctx *ctx, void *const *dsts, const void *const *srcs,
                                    const size_t *sizes, size_t n, int order, size_t after,
                                    int slot, int *used_batch_api, char *err, size_t errlen);
/* Event `slot`: wait for it (0 or < 0 with err), or ask (1 done, 0 pending, < 0 error). */
typedef int (*wg_gpu_event_wait_fn)(wg_gpu_ctx *ctx, int slot, char *err, size_t errlen);
typedef int (*wg_gpu_event_query_fn)(wg_gpu_ctx *ctx, int slot, char *err, size_t errlen);

typedef struct {
    void *handle;
    wg_gpu_abi_fn abi;
    wg_gpu_runtime_fn runtime;
    wg_gpu_runtime_version_fn runtime_version;
    wg_gpu_device_count_fn device_count;
    wg_gpu_device_name_fn device_name;
    wg_gpu_open_fn open;
    wg_gpu_close_fn close;
    wg_gpu_malloc_fn malloc;
    wg_gpu_free_fn free;
    wg_gpu_host_register_fn host_register;
    wg_gpu_host_unregister_fn host_unregister;
    wg_gpu_copy_batch_fn copy_batch;
    wg_gpu_copy_async_fn copy_async;
    wg_gpu_event_wait_fn event_wait;
    wg_gpu_event_query_fn event_query;
} wg_gpu_lib;

#ifdef __cplusplus
}
#endif

#endif
