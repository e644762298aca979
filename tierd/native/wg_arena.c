/* The arena types. HostArena: an anonymous private mmap (page-aligned, zero-filled) exposed
 * through the buffer protocol; pinned=True mlocks it and, where a GPU backend sees a device,
 * registers it with that runtime for DMA. close() is refused while a view is exported, so
 * the memory can never vanish under a reader. DeviceArena: device memory and a context of
 * dedicated streams from a GPU backend library; copies in flight keep it from closing. */
#include <string.h>
#include <sys/mman.h>

#include "wg_py.h"

/* ------------------------------------------------------------------ HostArena */

static void wg_host_unmap(wg_HostArena *self) {
    if (self->base == NULL)
        return;
    if (self->registered)
        self->reg_lib.host_unregister(self->base);
    munmap(self->base, self->nbytes);
    self->base = NULL;
    self->registered = 0;
}

static int wg_host_register_any(wg_HostArena *self) {
    static const char *const order[] = {"cuda", "hip"};
    char err[256];
    for (size_t i = 0; i < 2; i++) {
        wg_gpu_lib lib;
        if (wg_gpu_load(order[i], &lib, err, sizeof(err)) != 0)
            continue;
        if (lib.device_count(err, sizeof(err)) <= 0)
            continue;
        if (lib.host_register(self->base, self->nbytes, err, sizeof(err)) == 0) {
            self->reg_lib = lib;
            self->registered = 1;
            return 1;
        }
    }
    return 0;
}

static int wg_host_init(wg_HostArena *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"nbytes", "pinned", NULL};
    Py_ssize_t nbytes = 0;
    int pinned = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n|$p:HostArena", kwlist, &nbytes, &pinned))
        return -1;
    if (self->base != NULL) {
        PyErr_SetString(wg_StateError, "HostArena is already initialised");
        return -1;
    }
    if (nbytes <= 0) {
        PyErr_Format(wg_ArgumentError, "nbytes must be positive, not %zd", nbytes);
        return -1;
    }
    void *p = mmap(NULL, (size_t)nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (p == MAP_FAILED) {
        PyErr_SetFromErrno(PyExc_MemoryError);
        return -1;
    }
    self->base = (char *)p;
    self->nbytes = (size_t)nbytes;
    if (pinned) {
        int locked = 0, registered = 0;
        Py_BEGIN_ALLOW_THREADS;
        locked = mlock(self->base, self->nbytes) == 0;
        registered = wg_host_register_any(self);
        Py_END_ALLOW_THREADS;
        self->pinned = locked || registered;
    }
    return 0;
}

static void wg_host_dealloc(wg_HostArena *self) {
    wg_host_unmap(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int wg_host_getbuffer(wg_HostArena *self, Py_buffer *view, int flags) {
    if (self->base == NULL) {
        PyErr_SetString(PyExc_BufferError, "HostArena is closed");
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->base, (Py_ssize_t)self->nbytes, 0,
                          flags) != 0)
        return -1;
    self->exports++;
    return 0;
}

static void wg_host_releasebuffer(wg_HostArena *self, Py_buffer *view) {
    (void)view;
    self->exports--;
}

static int wg_host_open(wg_HostArena *self) {
    if (self->base == NULL) {
        PyErr_SetString(wg_ClosedError, "HostArena is closed");
        return -1;
    }
    return 0;
}

int wg_range_args(PyObject *const *args, Py_ssize_t nargs, size_t len, Py_ssize_t *off,
                         Py_ssize_t *size) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "read(offset, size)");
        return -1;
    }
    *off = PyLong_AsSsize_t(args[0]);
    *size = *off == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(args[1]);
    if (PyErr_Occurred())
        return -1;
    if (*off < 0 || *size < 0) {
        PyErr_SetString(wg_ArgumentError, "negative offset or size");
        return -1;
    }
    if ((size_t)*size > len || (size_t)*off > len - (size_t)*size) {
        PyErr_Format(PyExc_IndexError, "[%zd:+%zd] is out of range (length %zu)", *off, *size,
                     len);
        return -1;
    }
    return 0;
}

static PyObject *wg_host_read(wg_HostArena *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t off, size;
    if (wg_host_open(self) || wg_range_args(args, nargs, self->nbytes, &off, &size))
        return NULL;
    return PyBytes_FromStringAndSize(self->base + off, size);
}

static PyObject *wg_host_write(wg_HostArena *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer data;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "write(offset, data)");
        return NULL;
    }
    if (wg_host_open(self) || PyObject_GetBuffer(args[1], &data, PyBUF_C_CONTIGUOUS) != 0)
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
    if (!bad)
        memmove(self->base + off, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    if (bad)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *wg_host_close(wg_HostArena *self, PyObject *unused) {
    (void)unused;
    if (self->exports > 0) {
        PyErr_SetString(PyExc_BufferError, "cannot close a HostArena with exported views");
        return NULL;
    }
    wg_host_unmap(self);
    Py_RETURN_NONE;
}

PyObject *wg_enter(PyObject *self, PyObject *unused) {
    (void)unused;
    return Py_NewRef(self);
}

static PyObject *wg_host_exit(wg_HostArena *self, PyObject *args) {
    (void)args;
    return wg_host_close(self, NULL);
}

static Py_ssize_t wg_host_len(wg_HostArena *self) { return (Py_ssize_t)self->nbytes; }

static PyObject *wg_host_get_nbytes(wg_HostArena *self, void *c) {
    (void)c;
    return PyLong_FromSize_t(self->nbytes);
}
static PyObject *wg_host_get_pinned(wg_HostArena *self, void *c) {
    (void)c;
    return PyBool_FromLong(self->pinned);
}
static PyObject *wg_get_host_backend(PyObject *self, void *c) {
    (void)self;
    (void)c;
    return PyUnicode_FromString("host");
}

static PyMethodDef wg_host_methods[] = {
    {"read", (PyCFunction)(void (*)(void))wg_host_read, METH_FASTCALL, "bytes at [offset:+size]"},
    {"write", (PyCFunction)(void (*)(void))wg_host_write, METH_FASTCALL, "write data at offset"},
    {"close", (PyCFunction)wg_host_close, METH_NOARGS, "unmap now"},
    {"__enter__", wg_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)wg_host_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef wg_host_getset[] = {
    {"nbytes", (getter)wg_host_get_nbytes, NULL, "size in bytes", NULL},
    {"pinned", (getter)wg_host_get_pinned, NULL, "locked in RAM / registered", NULL},
    {"backend", (getter)wg_get_host_backend, NULL, "'host'", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyBufferProcs wg_host_as_buffer = {
    (getbufferproc)wg_host_getbuffer,
    (releasebufferproc)wg_host_releasebuffer,
};

static PySequenceMethods wg_host_as_sequence = {.sq_length = (lenfunc)wg_host_len};

PyTypeObject wg_HostArenaType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tierd.native._native.HostArena",
    .tp_basicsize = sizeof(wg_HostArena),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Page-aligned host memory with the buffer protocol.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)wg_host_init,
    .tp_dealloc = (destructor)wg_host_dealloc,
    .tp_methods = wg_host_methods,
    .tp_getset = wg_host_getset,
    .tp_as_buffer = &wg_host_as_buffer,
    .tp_as_sequence = &wg_host_as_sequence,
};

/* DeviceArena lives in wg_device.c. */
int wg_arena_types_ready(PyObject *module) {
    if (PyType_Ready(&wg_HostArenaType) < 0 || PyType_Ready(&wg_DeviceArenaType) < 0 ||
        PyType_Ready(&wg_BlockCopierType) < 0)
        return -1;
    if (PyModule_AddObjectRef(module, "HostArena", (PyObject *)&wg_HostArenaType) < 0 ||
        PyModule_AddObjectRef(module, "DeviceArena", (PyObject *)&wg_DeviceArenaType) < 0 ||
        PyModule_AddObjectRef(module, "BlockCopier", (PyObject *)&wg_BlockCopierType) < 0)
        return -1;
    return 0;
}
