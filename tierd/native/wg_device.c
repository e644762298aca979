/* DeviceArena: device memory from a GPU backend library (wg_gpu.c loads it), with a context
 * of dedicated streams. `busy` counts copies in flight with the GIL released; close() is
 * refused meanwhile, so memory is never freed under a running copy. */
#include <string.h>

#include "wg_py.h"

#define WG_STREAMS 4

static void wg_dev_free(wg_DeviceArena *self) {
    if (self->ctx != NULL) {
        if (self->base != NULL)
            self->lib.free(self->ctx, self->base);
        self->lib.close(self->ctx);
    }
    self->ctx = NULL;
    self->base = NULL;
}

static int wg_dev_init(wg_DeviceArena *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"nbytes", "backend", "device", NULL};
    Py_ssize_t nbytes = 0;
    const char *backend = "cuda";
    int device = 0;
    char err[512] = "";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n|s$i:DeviceArena", kwlist, &nbytes,
                                     &backend, &device))
        return -1;
    if (self->ctx != NULL) {
        PyErr_SetString(wg_StateError, "DeviceArena is already initialised");
        return -1;
    }
    if (nbytes <= 0 || device < 0) {
        PyErr_SetString(wg_ArgumentError, "nbytes must be positive and device >= 0");
        return -1;
    }
    int rc = 0;
    void *ptr = NULL;
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
        rc = self->lib.open(device, WG_STREAMS, &self->ctx, err, sizeof(err));
    if (rc == 0) {
        rc = self->lib.malloc(self->ctx, (size_t)nbytes, &ptr, err, sizeof(err));
        if (rc != 0) {
            self->lib.close(self->ctx);
            self->ctx = NULL;
        }
    }
    Py_END_ALLOW_THREADS;
    if (rc != 0) {
        PyErr_Format(wg_UnavailableError, "%s backend not usable: %s", backend, err);
        return -1;
    }
    self->base = (char *)ptr;
    self->nbytes = (size_t)nbytes;
    self->device = device;
    snprintf(self->backend, sizeof(self->backend), "%s", backend);
    return 0;
}

static void wg_dev_dealloc(wg_DeviceArena *self) {
    wg_dev_free(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

int wg_device_copy(wg_DeviceArena *owner, void *const *dsts, const void *const *srcs,
                   const size_t *sizes, size_t n, int *used_batch_api) {
    char err[512] = "";
    int rc;
    owner->busy++;
    Py_BEGIN_ALLOW_THREADS;
    rc = owner->lib.copy_batch(owner->ctx, dsts, srcs, sizes, n, used_batch_api, err,
                               sizeof(err));
    Py_END_ALLOW_THREADS;
    owner->busy--;
    owner->last_batch_api = *used_batch_api;
    if (rc != 0) {
        PyErr_Format(wg_DeviceCopyError, "%s copy failed: %s", owner->backend, err);
        return -1;
    }
    return 0;
}

static int wg_dev_open(wg_DeviceArena *self) {
    if (self->base == NULL) {
        PyErr_SetString(wg_ClosedError, "DeviceArena is closed");
        return -1;
    }
    return 0;
}

static PyObject *wg_dev_read(wg_DeviceArena *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t off, size;
    int used = 0;
    if (wg_dev_open(self) || wg_range_args(args, nargs, self->nbytes, &off, &size))
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL)
        return NULL;
    void *dst = PyBytes_AS_STRING(out);
    const void *src = self->base + off;
    size_t sz = (size_t)size;
    if (size > 0 && wg_device_copy(self, &dst, &src, &sz, 1, &used) != 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *wg_dev_write(wg_DeviceArena *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer data;
    int used = 0;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "write(offset, data)");
        return NULL;
    }
    if (wg_dev_open(self) || PyObject_GetBuffer(args[1], &data, PyBUF_C_CONTIGUOUS) != 0)
        return NULL;
    Py_ssize_t off = PyLong_AsSsize_t(args[0]);
    int bad = off == -1 && PyErr_Occurred();
    if (!bad && off < 0) {
        PyErr_SetString(wg_ArgumentError, "negative offset");
        bad = 1;
    }
    if (!bad && ((size_t)data.len > self->nbytes || (size_t)off > self->nbytes - (size_t)data.len)) {
        PyErr_Format(PyExc_IndexError, "[%zd:+%zd] is out of range (length %zu)", off, data.len,
                     self->nbytes);
        bad = 1;
    }
    if (!bad && data.len > 0) {
        void *dst = self->base + off;
        const void *src = data.buf;
        size_t sz = (size_t)data.len;
        bad = wg_device_copy(self, &dst, &src, &sz, 1, &used) != 0;
    }
    PyBuffer_Release(&data);
    if (bad)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *wg_dev_close(wg_DeviceArena *self, PyObject *unused) {
    (void)unused;
    if (self->busy > 0) {
        PyErr_SetString(wg_StateError, "cannot close a DeviceArena during a copy");
        return NULL;
    }
    /* Detach under the GIL, so no other thread can start a copy on freed memory. */
    void *base = self->base;
    wg_gpu_ctx *ctx = self->ctx;
    wg_gpu_lib lib = self->lib;
    self->base = NULL;
    self->ctx = NULL;
    Py_BEGIN_ALLOW_THREADS;
    if (ctx != NULL) {
        if (base != NULL)
            lib.free(ctx, base);
        lib.close(ctx);
    }
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

static PyObject *wg_dev_exit(wg_DeviceArena *self, PyObject *args) {
    (void)args;
    return wg_dev_close(self, NULL);
}

static Py_ssize_t wg_dev_len(wg_DeviceArena *self) { return (Py_ssize_t)self->nbytes; }

static PyObject *wg_dev_get_nbytes(wg_DeviceArena *self, void *c) {
    (void)c;
    return PyLong_FromSize_t(self->nbytes);
}
static PyObject *wg_dev_get_backend(wg_DeviceArena *self, void *c) {
    (void)c;
    return PyUnicode_FromString(self->backend);
}
static PyObject *wg_dev_get_device(wg_DeviceArena *self, void *c) {
    (void)c;
    return PyLong_FromLong(self->device);
}

static PyMethodDef wg_dev_methods[] = {
    {"read", (PyCFunction)(void (*)(void))wg_dev_read, METH_FASTCALL, "bytes at [offset:+size]"},
    {"write", (PyCFunction)(void (*)(void))wg_dev_write, METH_FASTCALL, "write data at offset"},
    {"close", (PyCFunction)wg_dev_close, METH_NOARGS, "free the device memory now"},
    {"__enter__", wg_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)wg_dev_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyObject *wg_dev_get_batch_api(wg_DeviceArena *self, void *c) {
    (void)c;
    return PyBool_FromLong(self->last_batch_api);
}

static PyGetSetDef wg_dev_getset[] = {
    {"batch_api", (getter)wg_dev_get_batch_api, NULL, "last copy used a batched API", NULL},
    {"nbytes", (getter)wg_dev_get_nbytes, NULL, "size in bytes", NULL},
    {"backend", (getter)wg_dev_get_backend, NULL, "'cuda' or 'hip'", NULL},
    {"device", (getter)wg_dev_get_device, NULL, "device ordinal", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods wg_dev_as_sequence = {.sq_length = (lenfunc)wg_dev_len};

PyTypeObject wg_DeviceArenaType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tierd.native._native.DeviceArena",
    .tp_basicsize = sizeof(wg_DeviceArena),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Device memory of a GPU backend (cuda or hip).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)wg_dev_init,
    .tp_dealloc = (destructor)wg_dev_dealloc,
    .tp_methods = wg_dev_methods,
    .tp_getset = wg_dev_getset,
    .tp_as_sequence = &wg_dev_as_sequence,
};
