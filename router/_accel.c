/* router._accel: the router's two per-block hot loops, each as one C call.
 *
 * Why this exists: a routing decision for a 32k-token prompt walks ~500 blocks twice, once to
 * name them (a chained xxh3 hash per block) and once to look them up in the prefix index (a
 * dict lookup per block, equal neighbours grouped). In Python each block costs an interpreter
 * round trip; here the loops run in C. `router.accel` picks this module at import, or the
 * pure-Python versions in `router._accel_py` (same results, bit for bit) when it was not
 * built or WARMGATE_NATIVE=python is set. Types: `_accel.pyi`.
 *
 * - hash_blocks(data, seed, block_chars) -> list[int]: h_i = XXH3_64bits_withSeed(block_i,
 *   h_{i-1}) from h_{-1} = seed, over the full `block_chars`-byte blocks of `data` (any
 *   contiguous bytes-like object; a trailing partial block is ignored).
 * - lookup_runs(blocks, hashes) -> list[tuple[int, int]]: `blocks[h]` for each h of `hashes`
 *   in order, as runs (value, length) of equal consecutive values, stopping at the first h
 *   that is missing or whose value is falsy (0).
 *
 * xxHash is compiled in (XXH_INLINE_ALL, header from libxxhash-dev): no runtime library.
 * The GIL is held throughout: both calls take microseconds.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

static PyObject *
accel_hash_blocks(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError,
                     "hash_blocks() takes 3 positional arguments (data, seed, block_chars), "
                     "%zd given", nargs);
        return NULL;
    }
    PyObject *seed_obj = args[1], *size_obj = args[2];
    if (!PyLong_Check(seed_obj)) {
        PyErr_Format(PyExc_TypeError, "seed must be an int, not %.100s",
                     Py_TYPE(seed_obj)->tp_name);
        return NULL;
    }
    if (!PyLong_Check(size_obj)) {
        PyErr_Format(PyExc_TypeError, "block_chars must be an int, not %.100s",
                     Py_TYPE(size_obj)->tp_name);
        return NULL;
    }
    /* OverflowError for a negative seed or one of 2**64 and more */
    unsigned long long seed = PyLong_AsUnsignedLongLong(seed_obj);
    if (seed == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t block = PyLong_AsSsize_t(size_obj);
    if (block == -1 && PyErr_Occurred())
        return NULL;
    if (block <= 0) {
        PyErr_SetString(PyExc_ValueError, "block_chars must be positive");
        return NULL;
    }

    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t count = view.len / block;
    PyObject *out = PyList_New(count);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const char *p = (const char *)view.buf;
    XXH64_hash_t h = (XXH64_hash_t)seed;
    for (Py_ssize_t i = 0; i < count; i++, p += block) {
        h = XXH3_64bits_withSeed(p, (size_t)block, h);
        PyObject *item = PyLong_FromUnsignedLongLong((unsigned long long)h);
        if (item == NULL) {
            Py_DECREF(out);
            PyBuffer_Release(&view);
            return NULL;
        }
        PyList_SET_ITEM(out, i, item);
    }
    PyBuffer_Release(&view);
    return out;
}

/* Append (value, n) to runs; 0 on success. */
static int
append_run(PyObject *runs, PyObject *value, Py_ssize_t n)
{
    PyObject *count = PyLong_FromSsize_t(n);
    if (count == NULL)
        return -1;
    PyObject *run = PyTuple_New(2);
    if (run == NULL) {
        Py_DECREF(count);
        return -1;
    }
    Py_INCREF(value);
    PyTuple_SET_ITEM(run, 0, value);
    PyTuple_SET_ITEM(run, 1, count);
    int rc = PyList_Append(runs, run);
    Py_DECREF(run);
    return rc;
}

static PyObject *
accel_lookup_runs(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError,
                     "lookup_runs() takes 2 positional arguments (blocks, hashes), %zd given",
                     nargs);
        return NULL;
    }
    PyObject *blocks = args[0];
    if (!PyDict_Check(blocks)) {
        PyErr_Format(PyExc_TypeError, "blocks must be a dict, not %.100s",
                     Py_TYPE(blocks)->tp_name);
        return NULL;
    }
    /* a list or tuple as is, any other iterable copied into a list */
    PyObject *seq = PySequence_Fast(args[1], "hashes must be iterable");
    if (seq == NULL)
        return NULL;
    PyObject *runs = PyList_New(0);
    if (runs == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    PyObject *cur = NULL; /* value of the current run (strong reference) */
    Py_ssize_t n = 0;     /* its length */
    /* The size is read again each turn: a key's __eq__ could shrink a list being walked. */
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *key = PySequence_Fast_GET_ITEM(seq, i);
        Py_INCREF(key);
        PyObject *value = PyDict_GetItemWithError(blocks, key); /* borrowed */
        Py_DECREF(key);
        if (value == NULL) {
            if (PyErr_Occurred()) /* unhashable key, or its __eq__ raised */
                goto fail;
            break; /* not in the index: the walk ends */
        }
        if (value == cur) { /* packed values are interned: mostly the same object */
            n++;
            continue;
        }
        Py_INCREF(value); /* a comparison may run code that changes the dict */
        if (cur != NULL) {
            int eq = PyObject_RichCompareBool(value, cur, Py_EQ);
            if (eq < 0) {
                Py_DECREF(value);
                goto fail;
            }
            if (eq) {
                Py_DECREF(value);
                n++;
                continue;
            }
        }
        int truth = PyObject_IsTrue(value);
        if (truth <= 0) { /* 0: held nowhere, the walk ends; -1: error */
            Py_DECREF(value);
            if (truth < 0)
                goto fail;
            break;
        }
        if (cur != NULL && append_run(runs, cur, n) < 0) {
            Py_DECREF(value);
            goto fail;
        }
        Py_XSETREF(cur, value);
        n = 1;
    }
    if (cur != NULL && append_run(runs, cur, n) < 0)
        goto fail;
    Py_XDECREF(cur);
    Py_DECREF(seq);
    return runs;

fail:
    Py_XDECREF(cur);
    Py_DECREF(seq);
    Py_DECREF(runs);
    return NULL;
}

static PyMethodDef accel_methods[] = {
    {"hash_blocks", (PyCFunction)(void (*)(void))accel_hash_blocks, METH_FASTCALL,
     "hash_blocks(data, seed, block_chars, /)\n--\n\n"
     "Chained XXH3-64 hashes (a list of ints) of every full block_chars-byte block of\n"
     "data, the first seeded by seed, each next one by the previous hash."},
    {"lookup_runs", (PyCFunction)(void (*)(void))accel_lookup_runs, METH_FASTCALL,
     "lookup_runs(blocks, hashes, /)\n--\n\n"
     "List of runs (value, length) of equal consecutive blocks[h] over hashes, up to the\n"
     "first h that is missing or maps to 0."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef accel_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "router._accel",
    .m_doc = "The router's per-block hot loops in C (see router.accel).",
    .m_size = 0,
    .m_methods = accel_methods,
};

PyMODINIT_FUNC
PyInit__accel(void)
{
    PyObject *m = PyModule_Create(&accel_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddStringConstant(m, "IMPLEMENTATION", "c") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
