/* The arithmetic and checks of BlockCopier (wg_kvcopy.c), the same for every backend:
 * parsing the layer specs, expanding (block, layer, run) into (device-side address, host
 * address, size) triples with every bound checked and neighbours that are contiguous on both
 * sides merged into one copy, and the host backend's memcpy (a few threads when large). */
#include <string.h>

#include "wg_py.h"

/* One engine KV buffer: block b's runs are [ptr + starts[j] + b*stride, +run). */
typedef struct {
    size_t ptr, nbytes, stride, run, nstarts;
    size_t *starts;
} wg_kv_layer;

#define WG_KV_CHUNK (1u << 20)      /* host backend: a thread's unit of work */
#define WG_KV_PARALLEL (4u << 20)   /* below this many bytes, one thread */
#define WG_KV_THREADS 8

typedef struct {
    char *dst;
    const char *src;
    size_t len;
} wg_kv_chunk;

static void wg_kv_copy_item(void *ctx, size_t i) {
    wg_kv_chunk *c = (wg_kv_chunk *)ctx + i;
    memcpy(c->dst, c->src, c->len);
}

/* The host backend's copies, on a few memcpy threads when large; GIL held by the caller. */
int wg_kv_host_copy(void *const *dsts, const void *const *srcs, const size_t *sizes,
                           size_t n, size_t total) {
    size_t units = 0;
    for (size_t i = 0; i < n; i++)
        units += (sizes[i] + WG_KV_CHUNK - 1) / WG_KV_CHUNK;
    wg_kv_chunk *chunks = PyMem_Malloc(sizeof(wg_kv_chunk) * (units ? units : 1));
    if (chunks == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t done = 0; done < sizes[i]; done += WG_KV_CHUNK, u++) {
            chunks[u].dst = (char *)dsts[i] + done;
            chunks[u].src = (const char *)srcs[i] + done;
            chunks[u].len = sizes[i] - done < WG_KV_CHUNK ? sizes[i] - done : WG_KV_CHUNK;
        }
    int cpus = wg_cpu_count();
    int threads = total < WG_KV_PARALLEL ? 1 : cpus < WG_KV_THREADS ? cpus : WG_KV_THREADS;
    Py_BEGIN_ALLOW_THREADS;
    wg_parallel_for(units, threads < 1 ? 1 : threads, wg_kv_copy_item, chunks);
    Py_END_ALLOW_THREADS;
    PyMem_Free(chunks);
    return 0;
}

static size_t wg_kv_size(PyObject *o, const char *what, Py_ssize_t layer, int *bad) {
    Py_ssize_t v = PyNumber_AsSsize_t(o, PyExc_OverflowError);
    if (v == -1 && PyErr_Occurred()) {
        *bad = 1;
        return 0;
    }
    if (v < 0) {
        PyErr_Format(wg_ArgumentError, "layer %zd: negative %s", layer, what);
        *bad = 1;
    }
    return (size_t)v;
}

/* layers: a sequence of (ptr, nbytes, starts, block_stride, run_bytes). */
static wg_kv_layer *wg_kv_layers(PyObject *seq, Py_ssize_t *count) {
    PyObject *fast = PySequence_Fast(seq, "layers must be a sequence");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    wg_kv_layer *out = PyMem_Calloc((size_t)(n ? n : 1), sizeof(wg_kv_layer));
    if (out == NULL) {
        Py_DECREF(fast);
        return (wg_kv_layer *)PyErr_NoMemory();
    }
    int bad = 0;
    for (Py_ssize_t i = 0; i < n && !bad; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 5) {
            PyErr_Format(wg_ArgumentTypeError,
                         "layer %zd must be (ptr, nbytes, starts, block_stride, run_bytes)", i);
            bad = 1;
            break;
        }
        wg_kv_layer *L = &out[i];
        L->ptr = wg_kv_size(PyTuple_GET_ITEM(t, 0), "pointer", i, &bad);
        L->nbytes = bad ? 0 : wg_kv_size(PyTuple_GET_ITEM(t, 1), "nbytes", i, &bad);
        L->stride = bad ? 0 : wg_kv_size(PyTuple_GET_ITEM(t, 3), "block_stride", i, &bad);
        L->run = bad ? 0 : wg_kv_size(PyTuple_GET_ITEM(t, 4), "run_bytes", i, &bad);
        Py_ssize_t ns = 0;
        if (!bad && wg_sizes_from(PyTuple_GET_ITEM(t, 2), "starts", &L->starts, &ns))
            bad = 1;
        L->nstarts = (size_t)ns;
        if (!bad && (L->ptr == 0 || L->run == 0 || L->stride == 0 || ns == 0)) {
            PyErr_Format(wg_ArgumentError,
                         "layer %zd: pointer, run_bytes, block_stride and starts must be "
                         "non-zero / non-empty",
                         i);
            bad = 1;
        }
    }
    Py_DECREF(fast);
    *count = n;
    if (bad) {
        for (Py_ssize_t i = 0; i < n; i++)
            PyMem_Free(out[i].starts);
        PyMem_Free(out);
        return NULL;
    }
    return out;
}

/* The runs of every block as (device-side address, host address, size), checked. */
static int wg_kv_plan(const wg_kv_layer *layers, size_t nl, size_t num_blocks,
                      const size_t *blocks, const size_t *hoffs, size_t nb, char *host,
                      size_t hlen, size_t **dev, size_t **hst, size_t **sizes, size_t *count) {
    size_t slice = 0, runs = 0;
    for (size_t l = 0; l < nl; l++) {
        slice += layers[l].nstarts * layers[l].run;
        runs += layers[l].nstarts;
    }
    *count = 0;
    size_t cap;
    if (__builtin_mul_overflow(runs, nb, &cap) || cap > PY_SSIZE_T_MAX / sizeof(size_t)) {
        PyErr_SetString(PyExc_OverflowError, "too many runs in one call");
        return -1;
    }
    cap = cap ? cap : 1;
    *dev = PyMem_Malloc(sizeof(size_t) * cap);
    *hst = PyMem_Malloc(sizeof(size_t) * cap);
    *sizes = PyMem_Malloc(sizeof(size_t) * cap);
    if (*dev == NULL || *hst == NULL || *sizes == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < nb; i++) {
        size_t b = blocks[i];
        if (b >= num_blocks) {
            PyErr_Format(PyExc_IndexError, "block id %zu is out of range (%zu blocks)", b,
                         num_blocks);
            return -1;
        }
        if (slice > hlen || hoffs[i] > hlen - slice) {
            PyErr_Format(PyExc_IndexError,
                         "slice %zu: host[%zu:+%zu] is out of range (length %zu)", i, hoffs[i],
                         slice, hlen);
            return -1;
        }
        size_t pos = hoffs[i];
        for (size_t l = 0; l < nl; l++) {
            const wg_kv_layer *L = &layers[l];
            size_t base;
            if (__builtin_mul_overflow(b, L->stride, &base))
                base = SIZE_MAX;
            for (size_t j = 0; j < L->nstarts; j++, pos += L->run) {
                size_t off;
                if (__builtin_add_overflow(base, L->starts[j], &off) || L->run > L->nbytes ||
                    off > L->nbytes - L->run) {
                    PyErr_Format(PyExc_IndexError,
                                 "block %zu, layer %zu, run %zu: bytes [%zu:+%zu] are past the "
                                 "KV buffer (%zu bytes)",
                                 b, l, j, base + L->starts[j], L->run, L->nbytes);
                    return -1;
                }
                size_t d = L->ptr + off, h = (size_t)(uintptr_t)host + pos;
                if (k > 0 && (*dev)[k - 1] + (*sizes)[k - 1] == d &&
                    (*hst)[k - 1] + (*sizes)[k - 1] == h) {
                    (*sizes)[k - 1] += L->run; /* contiguous on both sides: one copy */
                    continue;
                }
                (*dev)[k] = d;
                (*hst)[k] = h;
                (*sizes)[k++] = L->run;
            }
        }
    }
    *count = k;
    return 0;
}

static void wg_kv_layers_free(wg_kv_layer *layers, Py_ssize_t n) {
    for (Py_ssize_t i = 0; layers && i < n; i++)
        PyMem_Free(layers[i].starts);
    PyMem_Free(layers);
}

int wg_kv_prepare(PyObject *layers_o, Py_ssize_t num_blocks, PyObject *blocks_o,
                  PyObject *host_o, PyObject *hoffs_o, int to_host, int same_memory,
                  wg_kv_job *job) {
    memset(job, 0, sizeof(*job));
    if (num_blocks < 0) {
        PyErr_SetString(wg_ArgumentError, "num_blocks must be >= 0");
        return -1;
    }
    Py_ssize_t nl = 0, nb = 0, nh = 0;
    size_t *blocks = NULL, *hoffs = NULL;
    int rc = -1;
    wg_kv_layer *layers = wg_kv_layers(layers_o, &nl);
    if (layers == NULL || wg_sizes_from(blocks_o, "block_ids", &blocks, &nb) ||
        wg_sizes_from(hoffs_o, "host_offsets", &hoffs, &nh))
        goto done;
    if (nb != nh) {
        PyErr_Format(wg_ArgumentError, "block_ids and host_offsets differ in length (%zd, %zd)",
                     nb, nh);
        goto done;
    }
    if (wg_mem_get(host_o, "host", to_host, 0, &job->host) ||
        wg_kv_plan(layers, (size_t)nl, (size_t)num_blocks, blocks, hoffs, (size_t)nb,
                   job->host.base, job->host.len, &job->dev, &job->hst, &job->sizes, &job->n))
        goto done;
    /* Destinations must not overlap (a block twice in a load, a slice twice in a save), nor,
     * when both sides are host memory, a source. Addresses are absolute: base 0. */
    wg_mem any = {.base = NULL, .len = SIZE_MAX};
    if (wg_check_overlap(&any, to_host ? job->hst : job->dev, same_memory ? &any : NULL,
                         to_host ? job->dev : job->hst, job->sizes, job->n)) {
        if (PyErr_ExceptionMatches(wg_OverlapError)) {
            PyErr_Clear();
            PyErr_SetString(wg_OverlapError,
                            "destination runs overlap (a block id or host slice given twice, "
                            "or the KV buffer overlaps the host buffer)");
        }
        goto done;
    }
    for (size_t i = 0; i < job->n; i++)
        job->total += job->sizes[i];
    rc = 0;
done:
    wg_kv_layers_free(layers, nl);
    PyMem_Free(blocks);
    PyMem_Free(hoffs);
    return rc;
}

void wg_kv_job_free(wg_kv_job *job) {
    wg_mem_release(&job->host);
    PyMem_Free(job->dev);
    PyMem_Free(job->hst);
    PyMem_Free(job->sizes);
    memset(job, 0, sizeof(*job));
}
