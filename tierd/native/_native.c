/* tierd.native._native: the CPython extension of tierd's copy module (API in _native.pyi).
 * Each call converts and checks every argument with the GIL held, then releases the GIL
 * while bytes move: host copies are cut into chunks of at most 1 MiB and spread over a few
 * memcpy threads (wg_parallel_for) when the batch is large; copies touching a DeviceArena go
 * to its GPU backend; file batches run one slice per item on pread/pwrite threads.
 * Errors: the classes of tierd.native.errors, as the pure-Python fallback raises them (taken
 * at import, wg_errors_ready below); IndexError, BufferError, OverflowError stay builtins. */
#include "wg_py.h" /* first: Python.h sets _GNU_SOURCE, which O_DIRECT needs */

#include <errno.h>
#include <fcntl.h>
#include <string.h>

#define WG_CHUNK (1u << 20)            /* host copies: the unit of work of one thread */
#define WG_PARALLEL_MIN (4u << 20)     /* below this many bytes, one thread is faster */
#define WG_COPY_THREADS 8              /* memory bandwidth saturates with a few threads */

typedef struct {
    char *dst;
    const char *src;
    size_t len;
} wg_chunk;

static void wg_copy_item(void *ctx, size_t i) {
    wg_chunk *c = (wg_chunk *)ctx + i;
    memcpy(c->dst, c->src, c->len);
}

static PyObject *wg_host_copy(wg_mem *dst, const size_t *doffs, wg_mem *src, const size_t *soffs,
                              const size_t *sizes, size_t n, long threads_arg) {
    size_t total = 0, units = 0;
    for (size_t i = 0; i < n; i++) {
        total += sizes[i];
        units += (sizes[i] + WG_CHUNK - 1) / WG_CHUNK;
    }
    int threads;
    int automatic = total < WG_PARALLEL_MIN ? 1 : wg_cpu_count();
    if (wg_threads_arg(threads_arg, automatic, WG_COPY_THREADS, &threads))
        return NULL;
    wg_chunk *chunks = PyMem_Malloc(sizeof(wg_chunk) * (units ? units : 1));
    if (chunks == NULL)
        return PyErr_NoMemory();
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t done = 0; done < sizes[i]; done += WG_CHUNK, u++) {
            chunks[u].dst = dst->base + doffs[i] + done;
            chunks[u].src = src->base + soffs[i] + done;
            chunks[u].len = sizes[i] - done < WG_CHUNK ? sizes[i] - done : WG_CHUNK;
        }
    Py_BEGIN_ALLOW_THREADS;
    wg_parallel_for(units, threads, wg_copy_item, chunks);
    Py_END_ALLOW_THREADS;
    PyMem_Free(chunks);
    return PyLong_FromSize_t(total);
}

static PyObject *wg_gpu_copy(wg_mem *dst, const size_t *doffs, wg_mem *src, const size_t *soffs,
                             const size_t *sizes, size_t n) {
    wg_DeviceArena *owner = dst->device ? dst->device : src->device;
    wg_DeviceArena *other = dst->device && src->device && src->device != owner ? src->device : NULL;
    if (other && strcmp(other->backend, owner->backend) != 0) {
        PyErr_SetString(wg_ArgumentError, "copies between a cuda and a hip arena are not possible");
        return NULL;
    }
    void **dsts = PyMem_Malloc(sizeof(void *) * (n ? n : 1));
    const void **srcs = PyMem_Malloc(sizeof(void *) * (n ? n : 1));
    size_t *lens = PyMem_Malloc(sizeof(size_t) * (n ? n : 1));
    size_t total = 0;
    PyObject *result = NULL;
    if (dsts == NULL || srcs == NULL || lens == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    size_t k = 0; /* zero-size slices are dropped: runtimes may refuse them in a batch */
    for (size_t i = 0; i < n; i++) {
        if (sizes[i] == 0)
            continue;
        dsts[k] = dst->base + doffs[i];
        srcs[k] = src->base + soffs[i];
        lens[k++] = sizes[i];
        total += sizes[i];
    }
    int used = 0;
    if (other)
        other->busy++;
    int rc = k ? wg_device_copy(owner, dsts, srcs, lens, k, &used) : 0;
    if (other)
        other->busy--;
    if (rc == 0)
        result = PyLong_FromSize_t(total);
done:
    PyMem_Free(dsts);
    PyMem_Free(srcs);
    PyMem_Free(lens);
    return result;
}

static PyObject *wg_copy_batch(PyObject *mod, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"dst", "dst_offsets", "src", "src_offsets", "sizes", "threads", NULL};
    PyObject *dst_o, *doffs_o, *src_o, *soffs_o, *sizes_o;
    long threads = 0;
    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO|$l:copy_batch", kwlist, &dst_o,
                                     &doffs_o, &src_o, &soffs_o, &sizes_o, &threads))
        return NULL;
    wg_mem dst, src;
    size_t *doffs = NULL, *soffs = NULL, *sizes = NULL;
    Py_ssize_t nd = 0, ns = 0, nz = 0;
    PyObject *result = NULL;
    if (wg_mem_get(dst_o, "dst", 1, 1, &dst))
        return NULL;
    if (wg_mem_get(src_o, "src", 0, 1, &src)) {
        wg_mem_release(&dst);
        return NULL;
    }
    if (wg_sizes_from(doffs_o, "dst_offsets", &doffs, &nd) ||
        wg_sizes_from(soffs_o, "src_offsets", &soffs, &ns) ||
        wg_sizes_from(sizes_o, "sizes", &sizes, &nz) || wg_check_lengths(nd, ns, nz) ||
        wg_check_ranges("dst", dst.len, doffs, sizes, (size_t)nz) ||
        wg_check_ranges("src", src.len, soffs, sizes, (size_t)nz) ||
        wg_check_overlap(&dst, doffs, &src, soffs, sizes, (size_t)nz))
        goto done;
    if (dst.device || src.device)
        result = wg_gpu_copy(&dst, doffs, &src, soffs, sizes, (size_t)nz);
    else
        result = wg_host_copy(&dst, doffs, &src, soffs, sizes, (size_t)nz, threads);
done:
    PyMem_Free(doffs);
    PyMem_Free(soffs);
    PyMem_Free(sizes);
    wg_mem_release(&dst);
    wg_mem_release(&src);
    return result;
}

static PyObject *wg_memcpy_single(PyObject *mod, PyObject *args) {
    PyObject *dst_o, *src_o;
    Py_ssize_t doff, soff, size;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OnOnn:memcpy_single", &dst_o, &doff, &src_o, &soff, &size))
        return NULL;
    if (doff < 0 || soff < 0 || size < 0) {
        PyErr_SetString(wg_ArgumentError, "negative offset or size");
        return NULL;
    }
    wg_mem dst, src;
    if (wg_mem_get(dst_o, "dst", 1, 0, &dst))
        return NULL;
    if (wg_mem_get(src_o, "src", 0, 0, &src)) {
        wg_mem_release(&dst);
        return NULL;
    }
    size_t d = (size_t)doff, s = (size_t)soff, z = (size_t)size;
    int bad = wg_check_ranges("dst", dst.len, &d, &z, 1) ||
              wg_check_ranges("src", src.len, &s, &z, 1) ||
              wg_check_overlap(&dst, &d, &src, &s, &z, 1);
    if (!bad) {
        Py_BEGIN_ALLOW_THREADS;
        memcpy(dst.base + d, src.base + s, z);
        Py_END_ALLOW_THREADS;
    }
    wg_mem_release(&dst);
    wg_mem_release(&src);
    if (bad)
        return NULL;
    Py_RETURN_NONE;
}

/* Provided by wg_pyio.c / wg_pycrc.c. */
PyObject *wg_py_read_batch(PyObject *mod, PyObject *args, PyObject *kwargs);
PyObject *wg_py_write_batch(PyObject *mod, PyObject *args, PyObject *kwargs);
PyObject *wg_py_probe_direct(PyObject *mod, PyObject *arg);
PyObject *wg_py_drop_page_cache(PyObject *mod, PyObject *arg);
PyObject *wg_py_crc32c(PyObject *mod, PyObject *args, PyObject *kwargs);
PyObject *wg_py_crc32c_batch(PyObject *mod, PyObject *args, PyObject *kwargs);

static int wg_set(PyObject *d, const char *key, PyObject *value) {
    if (value == NULL)
        return -1;
    int rc = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return rc;
}

static PyObject *wg_backends(PyObject *mod, PyObject *unused) {
    (void)mod;
    (void)unused;
    PyObject *out = PyDict_New(), *host = PyDict_New();
    if (out == NULL || host == NULL)
        goto fail;
#ifdef O_DIRECT
    int o_direct = 1;
#else
    int o_direct = 0;
#endif
    if (wg_set(host, "built", PyBool_FromLong(1)) || wg_set(host, "usable", PyBool_FromLong(1)) ||
        wg_set(host, "selected", PyBool_FromLong(1)) ||
        wg_set(host, "reason", PyUnicode_FromString("")) ||
        wg_set(host, "o_direct", PyBool_FromLong(o_direct)) ||
        wg_set(host, "crc32c_hw", PyBool_FromLong(wg_crc32c_hw_available())) ||
        wg_set(host, "threads", PyLong_FromLong(wg_cpu_count())) ||
        wg_set(host, "copy_threads_max", PyLong_FromLong(WG_COPY_THREADS)) ||
        wg_set(host, "io_threads_max", PyLong_FromLong(WG_MAX_IO_THREADS)) ||
        wg_set(out, "host", Py_NewRef(host)) ||
        wg_set(out, "hip", wg_gpu_describe("hip")) || wg_set(out, "cuda", wg_gpu_describe("cuda")))
        goto fail;
    Py_DECREF(host);
    return out;
fail:
    Py_XDECREF(out);
    Py_XDECREF(host);
    return NULL;
}

static PyMethodDef wg_methods[] = {
    {"backends", wg_backends, METH_NOARGS, "describe every backend"},
    {"copy_batch", (PyCFunction)(void (*)(void))wg_copy_batch, METH_VARARGS | METH_KEYWORDS,
     "copy many slices"},
    {"memcpy_single", wg_memcpy_single, METH_VARARGS, "one memcpy on this thread"},
    {"read_batch", (PyCFunction)(void (*)(void))wg_py_read_batch, METH_VARARGS | METH_KEYWORDS,
     "read many file slices"},
    {"write_batch", (PyCFunction)(void (*)(void))wg_py_write_batch, METH_VARARGS | METH_KEYWORDS,
     "write many file slices"},
    {"probe_direct", wg_py_probe_direct, METH_O, "does O_DIRECT work in this directory"},
    {"drop_page_cache", wg_py_drop_page_cache, METH_O, "evict files from the page cache"},
    {"crc32c", (PyCFunction)(void (*)(void))wg_py_crc32c, METH_VARARGS | METH_KEYWORDS,
     "CRC-32C of a buffer"},
    {"crc32c_batch", (PyCFunction)(void (*)(void))wg_py_crc32c_batch,
     METH_VARARGS | METH_KEYWORDS, "CRC-32C of many slices"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef wg_module = {
    PyModuleDef_HEAD_INIT, "_native", "tierd's native copy module (C).", -1, wg_methods,
    NULL, NULL, NULL, NULL,
};

PyObject *wg_ArgumentTypeError, *wg_ArgumentError, *wg_OverlapError, *wg_ClosedError,
    *wg_StateError, *wg_UnknownBackendError, *wg_UnavailableError, *wg_DeviceCopyError;

int wg_errors_ready(void) {
    static const struct {
        PyObject **slot;
        const char *name;
    } classes[] = {
        {&wg_ArgumentTypeError, "NativeArgumentTypeError"},
        {&wg_ArgumentError, "NativeArgumentError"},
        {&wg_OverlapError, "CopyOverlapError"},
        {&wg_ClosedError, "ClosedHandleError"},
        {&wg_StateError, "HandleStateError"},
        {&wg_UnknownBackendError, "UnknownBackendError"},
        {&wg_UnavailableError, "BackendUnavailableError"},
        {&wg_DeviceCopyError, "DeviceCopyError"},
    };
    const size_t count = sizeof(classes) / sizeof(classes[0]);
    if (*classes[count - 1].slot != NULL)
        return 0; /* taken at an earlier import */
    PyObject *errors = PyImport_ImportModule("tierd.native.errors");
    if (errors == NULL)
        return -1;
    int rc = 0;
    for (size_t i = 0; i < count && rc == 0; i++) {
        PyObject *cls = PyObject_GetAttrString(errors, classes[i].name);
        if (cls != NULL && !PyExceptionClass_Check(cls)) {
            PyErr_Format(PyExc_ImportError, "tierd.native.errors.%s is not an exception class",
                         classes[i].name);
            Py_CLEAR(cls);
        }
        if (cls == NULL)
            rc = -1;
        *classes[i].slot = cls;
    }
    Py_DECREF(errors);
    if (rc < 0)
        for (size_t i = 0; i < count; i++)
            Py_CLEAR(*classes[i].slot);
    return rc;
}

PyMODINIT_FUNC PyInit__native(void) {
    if (wg_errors_ready() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&wg_module);
    if (m == NULL)
        return NULL;
    if (wg_arena_types_ready(m) < 0 || PyModule_AddStringConstant(m, "IMPLEMENTATION", "c") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
