/* Python entry points of CRC-32C: one range of a buffer, or many slices of one buffer
 * (spread over threads when the batch is large), with the GIL released while hashing. */
#include "wg_py.h"

#define WG_CRC_PARALLEL_MIN (4u << 20)

PyObject *wg_py_crc32c(PyObject *mod, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"buffer", "offset", "size", "value", "software", NULL};
    PyObject *buf_o;
    Py_ssize_t off = 0, size = -1;
    unsigned long long value = 0;
    int software = 0;
    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|nn$Kp:crc32c", kwlist, &buf_o, &off, &size,
                                     &value, &software))
        return NULL;
    if (value > 0xFFFFFFFFull) {
        PyErr_SetString(wg_ArgumentError, "value must be a 32-bit unsigned CRC");
        return NULL;
    }
    if (off < 0 || size < -1) {
        PyErr_SetString(wg_ArgumentError, "negative offset or size");
        return NULL;
    }
    wg_mem m;
    if (wg_mem_get(buf_o, "buffer", 0, 0, &m))
        return NULL;
    if (size == -1) {
        if ((size_t)off > m.len) {
            PyErr_Format(PyExc_IndexError, "offset %zd is out of range (length %zu)", off, m.len);
            wg_mem_release(&m);
            return NULL;
        }
        size = (Py_ssize_t)(m.len - (size_t)off);
    }
    size_t o = (size_t)off, z = (size_t)size;
    if (wg_check_ranges("buffer", m.len, &o, &z, 1)) {
        wg_mem_release(&m);
        return NULL;
    }
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS;
    crc = software ? wg_crc32c_sw((uint32_t)value, m.base + o, z)
                   : wg_crc32c((uint32_t)value, m.base + o, z);
    Py_END_ALLOW_THREADS;
    wg_mem_release(&m);
    return PyLong_FromUnsignedLong(crc);
}

typedef struct {
    const char *base;
    const size_t *offs;
    const size_t *sizes;
    uint32_t *out;
} wg_crc_job;

static void wg_crc_item(void *ctx, size_t i) {
    wg_crc_job *job = (wg_crc_job *)ctx;
    job->out[i] = wg_crc32c(0, job->base + job->offs[i], job->sizes[i]);
}

PyObject *wg_py_crc32c_batch(PyObject *mod, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"buffer", "offsets", "sizes", "threads", NULL};
    PyObject *buf_o, *offs_o, *sizes_o;
    long threads_arg = 0;
    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|$l:crc32c_batch", kwlist, &buf_o, &offs_o,
                                     &sizes_o, &threads_arg))
        return NULL;
    wg_mem m;
    size_t *offs = NULL, *sizes = NULL;
    uint32_t *out = NULL;
    Py_ssize_t no = 0, nz = 0;
    PyObject *result = NULL;
    if (wg_mem_get(buf_o, "buffer", 0, 0, &m))
        return NULL;
    if (wg_sizes_from(offs_o, "offsets", &offs, &no) ||
        wg_sizes_from(sizes_o, "sizes", &sizes, &nz) || wg_check_lengths(no, nz, nz) ||
        wg_check_ranges("buffer", m.len, offs, sizes, (size_t)nz))
        goto done;
    size_t total = 0;
    for (Py_ssize_t i = 0; i < nz; i++)
        total += sizes[i];
    int threads;
    if (wg_threads_arg(threads_arg, total < WG_CRC_PARALLEL_MIN ? 1 : wg_cpu_count(),
                       WG_MAX_THREADS, &threads))
        goto done;
    out = PyMem_Malloc(sizeof(uint32_t) * (size_t)(nz ? nz : 1));
    if (out == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    wg_crc_job job = {m.base, offs, sizes, out};
    Py_BEGIN_ALLOW_THREADS;
    wg_parallel_for((size_t)nz, threads, wg_crc_item, &job);
    Py_END_ALLOW_THREADS;
    result = PyList_New(nz);
    for (Py_ssize_t i = 0; result != NULL && i < nz; i++) {
        PyObject *v = PyLong_FromUnsignedLong(out[i]);
        if (v == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyList_SET_ITEM(result, i, v);
    }
done:
    PyMem_Free(out);
    PyMem_Free(offs);
    PyMem_Free(sizes);
    wg_mem_release(&m);
    return result;
}
