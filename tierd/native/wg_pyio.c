/* Python entry points of the batched file I/O (read_batch, write_batch, probe_direct,
 * drop_page_cache): paths are converted with the filesystem encoding, every slice checked
 * against its buffer, then the slices run on pread/pwrite threads with the GIL released
 * (wg_fileio.c). Per-slice results come back as a list of ints: bytes or -errno. */
#include "wg_py.h"

#include <errno.h>
#include <fcntl.h>

typedef struct {
    PyObject **paths; /* bytes objects owned here */
    Py_ssize_t n;
} wg_paths;

static void wg_paths_free(wg_paths *p) {
    for (Py_ssize_t i = 0; i < p->n; i++)
        Py_XDECREF(p->paths[i]);
    PyMem_Free(p->paths);
    p->paths = NULL;
    p->n = 0;
}

static int wg_paths_from(PyObject *seq, wg_paths *out) {
    out->paths = NULL;
    out->n = 0;
    PyObject *fast = PySequence_Fast(seq, "paths must be a sequence of paths");
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    out->paths = PyMem_Calloc((size_t)(n ? n : 1), sizeof(PyObject *));
    if (out->paths == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        out->n = i + 1;
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(fast, i), &out->paths[i])) {
            Py_DECREF(fast);
            wg_paths_free(out);
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

static PyObject *wg_status_list(const wg_io *items, size_t n) {
    PyObject *out = PyList_New((Py_ssize_t)n);
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLongLong(items[i].status);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, v);
    }
    return out;
}

/* Shared body of read_batch (is_read) and write_batch. */
static PyObject *wg_file_batch(PyObject *args, PyObject *kwargs, int is_read) {
    static char *rkw[] = {"paths", "dst", "dst_offsets", "sizes", "file_offsets", "direct",
                          "threads", NULL};
    static char *wkw[] = {"paths", "src", "src_offsets", "sizes", "file_offsets", "direct",
                          "fsync", "threads", NULL};
    PyObject *paths_o, *buf_o, *offs_o, *sizes_o, *foffs_o = Py_None;
    int direct = 0, do_fsync = 0;
    long threads_arg = 0;
    int ok = is_read ? PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|O$pl:read_batch", rkw,
                                                   &paths_o, &buf_o, &offs_o, &sizes_o,
                                                   &foffs_o, &direct, &threads_arg)
                     : PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|O$ppl:write_batch", wkw,
                                                   &paths_o, &buf_o, &offs_o, &sizes_o,
                                                   &foffs_o, &direct, &do_fsync, &threads_arg);
    if (!ok)
        return NULL;
    wg_mem mem;
    wg_paths paths = {NULL, 0};
    size_t *offs = NULL, *sizes = NULL, *foffs = NULL;
    Py_ssize_t no = 0, nz = 0, nf = 0;
    wg_io *items = NULL;
    PyObject *result = NULL;
    const char *bname = is_read ? "dst" : "src";
    if (wg_mem_get(buf_o, bname, is_read, 0, &mem))
        return NULL;
    if (wg_paths_from(paths_o, &paths) ||
        wg_sizes_from(offs_o, is_read ? "dst_offsets" : "src_offsets", &offs, &no) ||
        wg_sizes_from(sizes_o, "sizes", &sizes, &nz))
        goto done;
    nf = nz;
    if (foffs_o != Py_None && wg_sizes_from(foffs_o, "file_offsets", &foffs, &nf))
        goto done;
    if (wg_check_lengths(paths.n, no, nz) || wg_check_lengths(nz, nf, nz) ||
        wg_check_ranges(bname, mem.len, offs, sizes, (size_t)nz) ||
        (is_read && wg_check_overlap(&mem, offs, NULL, NULL, sizes, (size_t)nz)))
        goto done;
    for (Py_ssize_t i = 0; i < nz; i++)
        if (foffs && foffs[i] > (size_t)INT64_MAX - sizes[i]) {
            PyErr_Format(PyExc_IndexError, "slice %zd: file offset out of range", i);
            goto done;
        }
    int threads;
    if (wg_threads_arg(threads_arg, WG_MAX_IO_THREADS, WG_MAX_IO_THREADS, &threads))
        goto done;
    items = PyMem_Calloc((size_t)(nz ? nz : 1), sizeof(wg_io));
    if (items == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < nz; i++) {
        items[i].path = PyBytes_AS_STRING(paths.paths[i]);
        items[i].buf = mem.base + offs[i];
        items[i].size = sizes[i];
        items[i].file_offset = foffs ? (off_t)foffs[i] : 0;
    }
    wg_io_batch batch = {items, direct, do_fsync, !is_read && foffs == NULL};
    Py_BEGIN_ALLOW_THREADS;
    wg_parallel_for((size_t)nz, threads, is_read ? wg_read_item : wg_write_item, &batch);
    Py_END_ALLOW_THREADS;
    result = wg_status_list(items, (size_t)nz);
done:
    PyMem_Free(items);
    PyMem_Free(offs);
    PyMem_Free(sizes);
    PyMem_Free(foffs);
    wg_paths_free(&paths);
    wg_mem_release(&mem);
    return result;
}

PyObject *wg_py_read_batch(PyObject *mod, PyObject *args, PyObject *kwargs) {
    (void)mod;
    return wg_file_batch(args, kwargs, 1);
}

PyObject *wg_py_write_batch(PyObject *mod, PyObject *args, PyObject *kwargs) {
    (void)mod;
    return wg_file_batch(args, kwargs, 0);
}

PyObject *wg_py_probe_direct(PyObject *mod, PyObject *arg) {
    (void)mod;
    PyObject *path = NULL;
    char why[512] = "";
    int ok;
    if (!PyUnicode_FSConverter(arg, &path))
        return NULL;
    Py_BEGIN_ALLOW_THREADS;
    ok = wg_probe_direct(PyBytes_AS_STRING(path), why, sizeof(why));
    Py_END_ALLOW_THREADS;
    Py_DECREF(path);
    return Py_BuildValue("(Os)", ok ? Py_True : Py_False, why);
}

static void wg_drop_item(void *ctx, size_t i) {
    wg_io *items = (wg_io *)ctx;
    items[i].status = wg_drop_page_cache(items[i].path);
}

PyObject *wg_py_drop_page_cache(PyObject *mod, PyObject *arg) {
    (void)mod;
    wg_paths paths;
    if (wg_paths_from(arg, &paths))
        return NULL;
    wg_io *items = PyMem_Calloc((size_t)(paths.n ? paths.n : 1), sizeof(wg_io));
    PyObject *result = NULL;
    if (items == NULL) {
        PyErr_NoMemory();
    } else {
        for (Py_ssize_t i = 0; i < paths.n; i++)
            items[i].path = PyBytes_AS_STRING(paths.paths[i]);
        Py_BEGIN_ALLOW_THREADS;
        wg_parallel_for((size_t)paths.n, 4, wg_drop_item, items);
        Py_END_ALLOW_THREADS;
        result = wg_status_list(items, (size_t)paths.n);
    }
    PyMem_Free(items);
    wg_paths_free(&paths);
    return result;
}
