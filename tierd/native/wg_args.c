/* Argument conversion and checks of the extension: every offset and size is validated before
 * any byte moves. Overlap: destination intervals (by address) are sorted and neighbours
 * compared; source intervals are sorted and merged into a union, and a two-pointer sweep over
 * both sorted lists finds any destination that intersects it: O(n log n) for n slices. */
#include "wg_py.h"

#include <stdlib.h>

typedef struct {
    uintptr_t start, end;
} wg_span;

int wg_mem_get(PyObject *obj, const char *name, int writable, int allow_device, wg_mem *m) {
    memset(m, 0, sizeof(*m));
    if (PyObject_TypeCheck(obj, &wg_DeviceArenaType)) {
        wg_DeviceArena *d = (wg_DeviceArena *)obj;
        if (!allow_device) {
            PyErr_Format(wg_ArgumentTypeError, "%s: a DeviceArena is not accepted here", name);
            return -1;
        }
        if (d->base == NULL) {
            PyErr_Format(wg_ClosedError, "%s: the DeviceArena is closed", name);
            return -1;
        }
        m->device = d;
        m->base = d->base;
        m->len = d->nbytes;
        return 0;
    }
    if (PyObject_TypeCheck(obj, &wg_HostArenaType) && ((wg_HostArena *)obj)->base == NULL) {
        PyErr_Format(wg_ClosedError, "%s: the HostArena is closed", name);
        return -1;
    }
    if (PyObject_GetBuffer(obj, &m->view, PyBUF_C_CONTIGUOUS) != 0) {
        if (PyErr_ExceptionMatches(PyExc_BufferError) || PyErr_ExceptionMatches(PyExc_TypeError) ||
            PyErr_ExceptionMatches(PyExc_ValueError)) {
            PyErr_Clear();
            PyErr_Format(wg_ArgumentTypeError, "%s must be a C-contiguous buffer", name);
        }
        return -1;
    }
    m->has_view = 1;
    if (writable && m->view.readonly) {
        wg_mem_release(m);
        PyErr_Format(wg_ArgumentTypeError, "%s must be writable", name);
        return -1;
    }
    m->base = (char *)m->view.buf;
    m->len = (size_t)m->view.len;
    return 0;
}

void wg_mem_release(wg_mem *m) {
    if (m->has_view)
        PyBuffer_Release(&m->view);
    m->has_view = 0;
}

int wg_sizes_from(PyObject *seq, const char *name, size_t **out, Py_ssize_t *n) {
    *out = NULL;
    PyObject *fast = PySequence_Fast(seq, "");
    if (fast == NULL) {
        PyErr_Format(wg_ArgumentTypeError, "%s must be a sequence of ints", name);
        return -1;
    }
    Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
    size_t *arr = PyMem_Malloc(sizeof(size_t) * (size_t)(len ? len : 1));
    if (arr == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *idx = PyNumber_Index(items[i]);
        if (idx == NULL) {
            PyErr_Format(wg_ArgumentTypeError, "%s[%zd] is not an int", name, i);
            goto fail;
        }
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(idx, &overflow);
        Py_DECREF(idx);
        if (v == -1 && PyErr_Occurred())
            goto fail;
        if (overflow > 0) {
            PyErr_Format(PyExc_IndexError, "%s[%zd] is out of range", name, i);
            goto fail;
        }
        if (overflow < 0 || v < 0) {
            PyErr_Format(wg_ArgumentError, "%s[%zd] is negative", name, i);
            goto fail;
        }
        arr[i] = (size_t)v;
    }
    Py_DECREF(fast);
    *out = arr;
    *n = len;
    return 0;
fail:
    Py_DECREF(fast);
    PyMem_Free(arr);
    return -1;
}

int wg_check_lengths(Py_ssize_t a, Py_ssize_t b, Py_ssize_t c) {
    if (a != b || b != c) {
        PyErr_Format(wg_ArgumentError, "batch lists differ in length (%zd, %zd, %zd)", a, b, c);
        return -1;
    }
    return 0;
}

int wg_check_ranges(const char *name, size_t len, const size_t *offs, const size_t *sizes,
                    size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (sizes[i] > len || offs[i] > len - sizes[i]) {
            PyErr_Format(PyExc_IndexError, "slice %zu: %s[%zu:+%zu] is out of range (length %zu)",
                         i, name, offs[i], sizes[i], len);
            return -1;
        }
    }
    return 0;
}

static int wg_span_cmp(const void *a, const void *b) {
    const wg_span *x = (const wg_span *)a, *y = (const wg_span *)b;
    return x->start < y->start ? -1 : x->start > y->start ? 1 : 0;
}

/* Sorted non-empty intervals of base+offs[i] .. +sizes[i]; returns the count or -1. */
static Py_ssize_t wg_spans(const wg_mem *m, const size_t *offs, const size_t *sizes, size_t n,
                           wg_span **out) {
    wg_span *s = PyMem_Malloc(sizeof(wg_span) * (n ? n : 1));
    if (s == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (sizes[i] == 0)
            continue;
        s[k].start = (uintptr_t)m->base + offs[i];
        s[k].end = s[k].start + sizes[i];
        k++;
    }
    qsort(s, k, sizeof(wg_span), wg_span_cmp);
    *out = s;
    return (Py_ssize_t)k;
}

int wg_check_overlap(const wg_mem *dst, const size_t *doffs, const wg_mem *src,
                     const size_t *soffs, const size_t *sizes, size_t n) {
    wg_span *d = NULL, *s = NULL;
    Py_ssize_t nd = wg_spans(dst, doffs, sizes, n, &d);
    if (nd < 0)
        return -1;
    int rc = 0;
    for (Py_ssize_t i = 1; i < nd; i++) {
        if (d[i].start < d[i - 1].end) {
            PyErr_Format(wg_OverlapError, "destination ranges overlap at offset %zu",
                         (size_t)(d[i].start - (uintptr_t)dst->base));
            rc = -1;
            goto done;
        }
    }
    /* Only the same memory can overlap: same device arena, or intersecting host buffers. */
    if (src == NULL || (src->device != NULL) != (dst->device != NULL) ||
        (uintptr_t)src->base >= (uintptr_t)dst->base + dst->len ||
        (uintptr_t)dst->base >= (uintptr_t)src->base + src->len)
        goto done;
    Py_ssize_t ns = wg_spans(src, soffs, sizes, n, &s);
    if (ns < 0) {
        rc = -1;
        goto done;
    }
    Py_ssize_t m = 0; /* merge the sorted source spans into a union, in place */
    for (Py_ssize_t i = 0; i < ns; i++) {
        if (m > 0 && s[i].start <= s[m - 1].end) {
            if (s[i].end > s[m - 1].end)
                s[m - 1].end = s[i].end;
        } else {
            s[m++] = s[i];
        }
    }
    for (Py_ssize_t i = 0, j = 0; i < nd && j < m;) {
        if (s[j].end <= d[i].start)
            j++;
        else if (d[i].end <= s[j].start)
            i++;
        else {
            PyErr_SetString(wg_OverlapError, "a destination range overlaps a source range");
            rc = -1;
            goto done;
        }
    }
done:
    PyMem_Free(d);
    PyMem_Free(s);
    return rc;
}

int wg_threads_arg(long threads, int automatic, int max, int *out) {
    if (threads < 0) {
        PyErr_SetString(wg_ArgumentError, "threads must be >= 0");
        return -1;
    }
    long t = threads == 0 ? automatic : threads;
    if (t > max)
        t = max;
    *out = t < 1 ? 1 : (int)t;
    return 0;
}
