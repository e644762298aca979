/* Python-facing declarations shared by the extension's files: argument conversion and
 * checks (wg_args.c), the arena types (wg_arena.c), the GPU library loader (wg_gpu.c). */
#ifndef WG_PY_H
#define WG_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "wg_common.h"
#include "wg_gpu_api.h"

/* ---- errors: the classes of tierd.native.errors (the pure-Python fallback raises the same
 * ones), strong references taken once at import by wg_errors_ready (_native.c) ---- */
extern PyObject *wg_ArgumentTypeError;  /* NativeArgumentTypeError (a TypeError) */
extern PyObject *wg_ArgumentError;      /* NativeArgumentError (a ValueError) */
extern PyObject *wg_OverlapError;       /* CopyOverlapError (a NativeArgumentError) */
extern PyObject *wg_ClosedError;        /* ClosedHandleError (a ValueError) */
extern PyObject *wg_StateError;         /* HandleStateError (a RuntimeError) */
extern PyObject *wg_UnknownBackendError; /* UnknownBackendError (a ValueError) */
extern PyObject *wg_UnavailableError;   /* BackendUnavailableError (a RuntimeError) */
extern PyObject *wg_DeviceCopyError;    /* DeviceCopyError (a RuntimeError) */
/* Imports tierd.native.errors and takes its classes. 0 or -1 (raised). */
int wg_errors_ready(void);

/* ---- GPU backends (wg_gpu.c) ---- */
/* Loads _wg_<backend>.so next to the extension; 0 or -1 with why in err. */
int wg_gpu_load(const char *backend, wg_gpu_lib *lib, char *err, size_t errlen);
/* A dict describing one GPU backend for backends(). */
PyObject *wg_gpu_describe(const char *backend);

/* ---- arenas (wg_arena.c) ---- */
typedef struct {
    PyObject_HEAD char *base;
    size_t nbytes;
    int pinned;
    int registered; /* registered with a GPU runtime (lib below) */
    wg_gpu_lib reg_lib;
    Py_ssize_t exports;
} wg_HostArena;

typedef struct {
    PyObject_HEAD char *base;
    size_t nbytes;
    int device;
    char backend[8];
    wg_gpu_lib lib;
    wg_gpu_ctx *ctx;
    Py_ssize_t busy; /* copies in flight (the GIL is released meanwhile) */
    int last_batch_api; /* the last copy used the runtime's batched API */
} wg_DeviceArena;

/* read(offset, size) arguments checked against len. 0 or -1 (raised). */
int wg_range_args(PyObject *const *args, Py_ssize_t nargs, size_t len, Py_ssize_t *off,
                  Py_ssize_t *size);
PyObject *wg_enter(PyObject *self, PyObject *unused);
/* Copies n slices with the arena's GPU context, GIL released. 0 or -1 (raised). */
int wg_device_copy(wg_DeviceArena *owner, void *const *dsts, const void *const *srcs,
                   const size_t *sizes, size_t n, int *used_batch_api);

extern PyTypeObject wg_HostArenaType;
extern PyTypeObject wg_BlockCopierType; /* wg_kvcopy.c */
extern PyTypeObject wg_DeviceArenaType;
int wg_arena_types_ready(PyObject *module);

/* ---- memory operands and checks (wg_args.c) ---- */
typedef struct {
    Py_buffer view;
    int has_view;
    wg_DeviceArena *device; /* borrowed; non-NULL for a DeviceArena operand */
    char *base;
    size_t len;
} wg_mem;

/* A host buffer (C-contiguous; writable when asked) or a DeviceArena. 0 or -1 (raised). */
int wg_mem_get(PyObject *obj, const char *name, int writable, int allow_device, wg_mem *m);
void wg_mem_release(wg_mem *m);
/* A sequence of non-negative ints into a PyMem_Malloc'ed array; *n receives its length. */
int wg_sizes_from(PyObject *seq, const char *name, size_t **out, Py_ssize_t *n);
/* Same length for every list, else ValueError. */
int wg_check_lengths(Py_ssize_t a, Py_ssize_t b, Py_ssize_t c);
/* Every [off, off+size) within [0, len), else IndexError. */
int wg_check_ranges(const char *name, size_t len, const size_t *offs, const size_t *sizes,
                    size_t n);
/* ValueError when destination ranges overlap each other or (src != NULL) a source range. */
int wg_check_overlap(const wg_mem *dst, const size_t *doffs, const wg_mem *src,
                     const size_t *soffs, const size_t *sizes, size_t n);
/* threads argument: 0 = automatic, else clamp to [1, max]. ValueError when negative. */
int wg_threads_arg(long threads, int automatic, int max, int *out);

/* ---- KV block plans (wg_kvplan.c, used by BlockCopier in wg_kvcopy.c) ---- */
/* One call's work: every run of every block as absolute (dev, hst, sizes) triples. */
typedef struct {
    wg_mem host;
    size_t *dev, *hst, *sizes, n, total;
} wg_kv_job;

/* Parses and checks a copy: layers (a sequence of (ptr, nbytes, starts, block_stride,
 * run_bytes)), block ids (< num_blocks, else IndexError), host slices (inside host, else
 * IndexError), every run inside its buffer (else IndexError), destinations disjoint (and
 * apart from the sources when `same_memory`), else ValueError. 0, or -1 (raised). The job
 * is freed with wg_kv_job_free either way. */
int wg_kv_prepare(PyObject *layers_o, Py_ssize_t num_blocks, PyObject *blocks_o,
                  PyObject *host_o, PyObject *hoffs_o, int to_host, int same_memory,
                  wg_kv_job *job);
void wg_kv_job_free(wg_kv_job *job);
/* The host backend: memcpy of every triple (GIL released). 0 or -1 (raised). */
int wg_kv_host_copy(void *const *dsts, const void *const *srcs, const size_t *sizes, size_t n,
                    size_t total);

#endif
