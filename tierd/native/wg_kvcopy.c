/* BlockCopier: gathers KV blocks out of an engine's own KV buffers (raw pointers it owns:
 * a tensor's data_ptr()) into slices of a host buffer (tierd's arena), and scatters them
 * back, every layer in one call; the arithmetic and checks (wg_kvplan.c) are the same for
 * every backend. "host": memcpy, synchronous. "cuda"/"hip": enqueued on the backend's stream
 * (ordered after and before the caller's stream); copy() returns a ticket and wait(ticket) /
 * done(ticket) tell when the bytes are there; the host buffer of a pending copy stays
 * referenced until then. register() page-locks a host buffer once, so copies are DMA. */
#include <string.h>

#include "wg_py.h"

#include "structmember.h"

#define WG_KV_REG 16

typedef struct {
    PyObject_HEAD int gpu; /* 0: host backend */
    char backend[8];
    int device;
    wg_gpu_lib lib;
    wg_gpu_ctx *ctx;
    int busy;
    unsigned long long issued; /* tickets issued; ticket t uses event slot t % WG_GPU_EVENTS */
    Py_buffer held[WG_GPU_EVENTS];
    int holding[WG_GPU_EVENTS];
    Py_buffer reg[WG_KV_REG];
    int registered[WG_KV_REG];
    char last_batch_api;
    Py_ssize_t last_copies, last_bytes;
} wg_BlockCopier;

/* One thread at a time: every method that releases the GIL marks the copier busy. */
static int wg_kv_enter(wg_BlockCopier *self) {
    if (self->busy) {
        PyErr_SetString(wg_StateError, "BlockCopier is in use by another thread");
        return -1;
    }
    self->busy = 1;
    return 0;
}

static int wg_kv_fail(wg_BlockCopier *self, const char *err) {
    PyErr_Format(wg_DeviceCopyError, "%s block copy failed: %s", self->backend, err);
    return -1;
}

/* Waits for event slot (GIL released) and drops the host buffer it kept alive. */
static int wg_kv_settle(wg_BlockCopier *self, int slot) {
    char err[512] = "";
    int rc = 0;
    if (self->gpu) {
        Py_BEGIN_ALLOW_THREADS;
        rc = self->lib.event_wait(self->ctx, slot, err, sizeof(err));
        Py_END_ALLOW_THREADS;
    }
    if (self->holding[slot]) {
        PyBuffer_Release(&self->held[slot]);
        self->holding[slot] = 0;
    }
    return rc ? wg_kv_fail(self, err) : 0;
}

static int wg_kv_sync_all(wg_BlockCopier *self) {
    int rc = 0;
    for (int s = 0; s < WG_GPU_EVENTS; s++)
        if (self->holding[s] && wg_kv_settle(self, s) && rc == 0)
            rc = -1;
    return rc;
}

static void wg_kv_free(wg_BlockCopier *self) {
    if (wg_kv_sync_all(self))
        PyErr_Clear(); /* a failed copy cannot be reported from here */
    for (int i = 0; i < WG_KV_REG; i++) {
        if (!self->registered[i])
            continue;
        self->lib.host_unregister(self->reg[i].buf);
        PyBuffer_Release(&self->reg[i]);
        self->registered[i] = 0;
    }
    if (self->ctx)
        self->lib.close(self->ctx);
    self->ctx = NULL;
}

static int wg_kv_init(wg_BlockCopier *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"backend", "device", NULL};
    const char *backend = "host";
    int device = 0;
    char err[512] = "";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|s$i:BlockCopier", kwlist, &backend,
                                     &device))
        return -1;
    if (self->ctx != NULL || self->backend[0]) {
        PyErr_SetString(wg_StateError, "BlockCopier is already initialised");
        return -1;
    }
    if (device < 0) {
        PyErr_SetString(wg_ArgumentError, "device must be >= 0");
        return -1;
    }
    self->device = device;
    if (strcmp(backend, "host") == 0) {
        snprintf(self->backend, sizeof(self->backend), "host");
        return 0;
    }
    if (strcmp(backend, "cuda") != 0 && strcmp(backend, "hip") != 0) {
        PyErr_Format(wg_UnknownBackendError, "unknown backend '%s' (host, cuda or hip)", backend);
        return -1;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = wg_gpu_load(backend, &self->lib, err, sizeof(err));
    if (rc == 0) {
        int n = self->lib.device_count(err, sizeof(err));
        if (n <= device) {
            if (n >= 0)
                snprintf(err, sizeof(err), "no device %d (%d present)", device, n);
            rc = -1;
        }
    }
    if (rc == 0)
        rc = self->lib.open(device, 1, &self->ctx, err, sizeof(err));
    Py_END_ALLOW_THREADS;
    if (rc != 0) {
        PyErr_Format(wg_UnavailableError, "%s backend not usable: %s", backend, err);
        return -1;
    }
    self->gpu = 1;
    snprintf(self->backend, sizeof(self->backend), "%s", backend);
    return 0;
}

static void wg_kv_dealloc(wg_BlockCopier *self) {
    wg_kv_free(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *wg_kv_copy(wg_BlockCopier *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"layers", "num_blocks", "block_ids", "host", "host_offsets",
                             "to_host", "stream", NULL};
    PyObject *layers_o, *blocks_o, *host_o, *hoffs_o, *stream_o = Py_None;
    Py_ssize_t num_blocks;
    int to_host = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OnOOO|$pO:copy", kwlist, &layers_o,
                                     &num_blocks, &blocks_o, &host_o, &hoffs_o, &to_host,
                                     &stream_o))
        return NULL;
    if (to_host < 0) {
        PyErr_SetString(PyExc_TypeError, "copy() needs to_host=True (a save) or False (a load)");
        return NULL;
    }
    if (self->backend[0] == 0 || (self->gpu && self->ctx == NULL)) {
        PyErr_SetString(wg_ClosedError, "BlockCopier is closed");
        return NULL;
    }
    size_t stream = 0;
    int order = stream_o != Py_None;
    if (order) {
        Py_ssize_t s = PyNumber_AsSsize_t(stream_o, PyExc_OverflowError);
        if (s == -1 && PyErr_Occurred())
            return NULL;
        stream = (size_t)s;
    }
    wg_kv_job job;
    if (wg_kv_enter(self))
        return NULL;
    PyObject *result = NULL;
    if (wg_kv_prepare(layers_o, num_blocks, blocks_o, host_o, hoffs_o, to_host, !self->gpu,
                      &job))
        goto done;
    unsigned long long ticket = ++self->issued;
    int slot = (int)(ticket % WG_GPU_EVENTS);
    if (self->holding[slot] && wg_kv_settle(self, slot)) /* an old copy in this slot */
        goto done;
    void **dsts = (void **)(to_host ? job.hst : job.dev);
    const void **srcs = (const void **)(to_host ? job.dev : job.hst);
    int rc = 0, used = 0;
    char err[512] = "";
    if (self->gpu) {
        Py_BEGIN_ALLOW_THREADS;
        rc = self->lib.copy_async(self->ctx, dsts, srcs, job.sizes, job.n, order, stream, slot,
                                  &used, err, sizeof(err));
        Py_END_ALLOW_THREADS;
    } else if (wg_kv_host_copy(dsts, srcs, job.sizes, job.n, job.total)) {
        goto done;
    }
    self->last_batch_api = (char)used;
    self->last_copies = (Py_ssize_t)job.n;
    self->last_bytes = (Py_ssize_t)job.total;
    if (rc != 0) {
        (void)wg_kv_settle(self, slot); /* what was queued has finished before we return */
        PyErr_Clear();
        wg_kv_fail(self, err);
        goto done;
    }
    if (self->gpu) { /* the host memory stays alive until the ticket is waited for */
        self->held[slot] = job.host.view;
        self->holding[slot] = 1;
        job.host.has_view = 0;
    }
    result = PyLong_FromUnsignedLongLong(ticket);
done:
    self->busy = 0;
    wg_kv_job_free(&job);
    return result;
}

/* The slot of a ticket, or -1 when it is complete by construction (too old: its slot was
 * reused, which waited for it; or the host backend). */
static int wg_kv_slot(wg_BlockCopier *self, PyObject *arg, int *slot) {
    unsigned long long t = PyLong_AsUnsignedLongLong(arg);
    if (t == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (t == 0 || t > self->issued) {
        PyErr_Format(wg_ArgumentError, "unknown ticket %llu (issued %llu)", t, self->issued);
        return -1;
    }
    *slot = (int)(t % WG_GPU_EVENTS);
    if (!self->gpu || self->issued - t >= WG_GPU_EVENTS || !self->holding[*slot])
        *slot = -1;
    return 0;
}

static PyObject *wg_kv_wait(wg_BlockCopier *self, PyObject *arg) {
    int slot;
    if (wg_kv_slot(self, arg, &slot) || wg_kv_enter(self))
        return NULL;
    int rc = slot >= 0 ? wg_kv_settle(self, slot) : 0;
    self->busy = 0;
    if (rc)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *wg_kv_done(wg_BlockCopier *self, PyObject *arg) {
    int slot;
    char err[512] = "";
    if (wg_kv_slot(self, arg, &slot))
        return NULL;
    if (slot < 0)
        Py_RETURN_TRUE;
    if (wg_kv_enter(self))
        return NULL;
    int q = self->lib.event_query(self->ctx, slot, err, sizeof(err));
    int rc = q < 0 ? wg_kv_fail(self, err) : q == 1 ? wg_kv_settle(self, slot) : 0;
    self->busy = 0;
    if (rc)
        return NULL;
    return PyBool_FromLong(q == 1);
}

static PyObject *wg_kv_synchronize(wg_BlockCopier *self, PyObject *unused) {
    (void)unused;
    if (wg_kv_enter(self))
        return NULL;
    int rc = wg_kv_sync_all(self);
    self->busy = 0;
    if (rc)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *wg_kv_register(wg_BlockCopier *self, PyObject *arg) {
    if (!self->gpu)
        Py_RETURN_FALSE; /* host memory needs no registration */
    int free_at = -1;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_C_CONTIGUOUS) != 0)
        return NULL;
    for (int i = 0; i < WG_KV_REG; i++) {
        if (self->registered[i] && self->reg[i].buf == view.buf) {
            PyBuffer_Release(&view);
            Py_RETURN_TRUE;
        }
        if (!self->registered[i] && free_at < 0)
            free_at = i;
    }
    char err[512] = "";
    int rc = free_at < 0 || view.len == 0;
    if (!rc) {
        Py_BEGIN_ALLOW_THREADS;
        rc = self->lib.host_register(view.buf, (size_t)view.len, err, sizeof(err));
        Py_END_ALLOW_THREADS;
    }
    if (rc != 0) { /* not fatal: copies from pageable memory are staged by the runtime */
        PyBuffer_Release(&view);
        Py_RETURN_FALSE;
    }
    self->reg[free_at] = view; /* kept: the memory cannot be unmapped while registered */
    self->registered[free_at] = 1;
    Py_RETURN_TRUE;
}

static PyObject *wg_kv_unregister(wg_BlockCopier *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0)
        return NULL;
    void *buf = view.buf;
    PyBuffer_Release(&view);
    for (int i = 0; i < WG_KV_REG; i++) {
        if (!self->registered[i] || self->reg[i].buf != buf)
            continue;
        if (wg_kv_enter(self))
            return NULL;
        int rc = wg_kv_sync_all(self); /* no copy may still use it */
        self->busy = 0;
        if (rc)
            return NULL;
        self->lib.host_unregister(buf);
        PyBuffer_Release(&self->reg[i]);
        self->registered[i] = 0;
        Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

static PyObject *wg_kv_close(wg_BlockCopier *self, PyObject *unused) {
    (void)unused;
    if (self->busy) {
        PyErr_SetString(wg_StateError, "cannot close a BlockCopier during a copy");
        return NULL;
    }
    if (wg_kv_sync_all(self))
        PyErr_Clear();
    wg_kv_free(self);
    self->backend[0] = 0;
    Py_RETURN_NONE;
}

static PyObject *wg_kv_exit(wg_BlockCopier *self, PyObject *args) {
    (void)args;
    return wg_kv_close(self, NULL);
}

static PyObject *wg_kv_get_backend(wg_BlockCopier *self, void *c) {
    (void)c;
    return PyUnicode_FromString(self->backend[0] ? self->backend : "closed");
}

static PyObject *wg_kv_get_registered(wg_BlockCopier *self, void *c) {
    (void)c;
    int n = 0;
    for (int i = 0; i < WG_KV_REG; i++)
        n += self->registered[i];
    return PyLong_FromLong(n);
}

static PyMethodDef wg_kv_methods[] = {
    {"copy", (PyCFunction)(void (*)(void))wg_kv_copy, METH_VARARGS | METH_KEYWORDS,
     "gather (to_host) or scatter blocks; returns a ticket"},
    {"wait", (PyCFunction)wg_kv_wait, METH_O, "wait until a ticket's copies are done"},
    {"done", (PyCFunction)wg_kv_done, METH_O, "whether a ticket's copies are done"},
    {"synchronize", (PyCFunction)wg_kv_synchronize, METH_NOARGS, "wait for every copy"},
    {"register", (PyCFunction)wg_kv_register, METH_O, "page-lock a host buffer for DMA"},
    {"unregister", (PyCFunction)wg_kv_unregister, METH_O, "undo register()"},
    {"close", (PyCFunction)wg_kv_close, METH_NOARGS, "wait, unregister, free the streams"},
    {"__enter__", wg_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)wg_kv_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef wg_kv_getset[] = {
    {"backend", (getter)wg_kv_get_backend, NULL, "'host', 'cuda' or 'hip'", NULL},
    {"registered", (getter)wg_kv_get_registered, NULL, "host buffers registered", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

#define WG_KV_RO(name, type, field, doc) {name, type, offsetof(wg_BlockCopier, field), READONLY, doc}
static PyMemberDef wg_kv_members[] = {
    WG_KV_RO("device", T_INT, device, "device ordinal"),
    WG_KV_RO("batch_api", T_BOOL, last_batch_api, "last copy used a batched API"),
    WG_KV_RO("last_copies", T_PYSSIZET, last_copies, "copies issued by the last call"),
    WG_KV_RO("last_bytes", T_PYSSIZET, last_bytes, "bytes moved by the last call"),
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject wg_BlockCopierType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tierd.native._native.BlockCopier",
    .tp_basicsize = sizeof(wg_BlockCopier),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Gathers / scatters KV blocks between an engine's KV buffers and host slices.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)wg_kv_init,
    .tp_dealloc = (destructor)wg_kv_dealloc,
    .tp_methods = wg_kv_methods,
    .tp_getset = wg_kv_getset,
    .tp_members = wg_kv_members,
};
