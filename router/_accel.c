/* router._accel: the router's two per-block hot loops, each as one C call, and the table
 * the second one walks.
 *
 * Why this exists: a routing decision for a 32k-token prompt walks ~500 blocks twice, once to
 * name them (a chained xxh3 hash per block) and once to look them up in the prefix index (a
 * table lookup per block, equal neighbours grouped). In Python each block costs an interpreter
 * round trip; here the loops run in C, and the index's table is a BlockMap (below) whose
 * lookups cost one cache miss instead of a dict's two or three, overlapped by prefetching.
 * `router.accel` picks this module at import, or the pure-Python versions in
 * `router._accel_py` (same results, bit for bit; a dict for the table) when it was not built
 * or WARMGATE_NATIVE=python is set. Types: `_accel.pyi`.
 *
 * - hash_blocks(data, seed, block_chars) -> list[int]: h_i = XXH3_64bits_withSeed(block_i,
 *   h_{i-1}) from h_{-1} = seed, over the full `block_chars`-byte blocks of `data` (any
 *   contiguous bytes-like object; a trailing partial block is ignored).
 * - lookup_runs(blocks, hashes) -> list[tuple[int, int]]: `blocks[h]` for each h of `hashes`
 *   in order, as runs (value, length) of equal consecutive values, stopping at the first h
 *   that is missing or whose value is falsy (0). `blocks` is a BlockMap or a dict.
 * - BlockMap / new_block_map(): u64 -> int, the dict operations the index uses (get, pop,
 *   [], len, items), in blockmap.c; the pure-Python twin's new_block_map() returns a
 *   plain dict.
 *
 * Errors: the same classes as the pure-Python twin, from `router.errors` (looked up at
 * import): AccelArgumentTypeError (a TypeError) for an argument of the wrong type,
 * BlockSizeError (a ValueError) for block_chars <= 0.
 *
 * xxHash is compiled in (XXH_INLINE_ALL, header from libxxhash-dev): no runtime library.
 * The GIL is held throughout: every call takes microseconds.
 */
#include "blockmap.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

/* router.errors' classes (strong references, taken at module init) */
PyObject *accel_ArgumentTypeError = NULL;
static PyObject *accel_BlockSizeError = NULL;

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
        PyErr_Format(accel_ArgumentTypeError, "seed must be an int, not %.100s",
                     Py_TYPE(seed_obj)->tp_name);
        return NULL;
    }
    if (!PyLong_Check(size_obj)) {
        PyErr_Format(accel_ArgumentTypeError, "block_chars must be an int, not %.100s",
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
        PyErr_SetString(accel_BlockSizeError, "block_chars must be positive");
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


/* How many blocks ahead the walk prefetches: far enough to cover a cold miss (~250 ns for
 * a dependent load on the dev VM, page walk included) at ~10 ns of work per block, near
 * enough that a walk cut short by a miss early in the chain wastes little. Measured there,
 * it gains less than hoped (cold walk ~110 us without, ~100 us with): the lookups are
 * independent loads that out-of-order execution already overlaps, and the VM's memory
 * parallelism is low. It costs nothing when the slots are cached. */
#ifndef PREFETCH_AHEAD /* -DPREFETCH_AHEAD=n to tune it */
#define PREFETCH_AHEAD 16
#endif
#define STACK_KEYS 1024 /* chains up to this long convert their keys on the stack */

/* ---------------------------------------------------------------------------------------
 * lookup_runs: the chain walk, over a BlockMap (prefetching) or a dict (the fallback
 * table, and any caller's dict).
 */

/* The runs found so far and the one being extended. */
typedef struct {
    PyObject *runs; /* list of (value, length) */
    PyObject *cur;  /* value of the current run (strong reference), NULL before the first */
    Py_ssize_t n;   /* its length */
} Runs;

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

/* Add the next block's value (borrowed). 1: go on; 0: it is falsy (held nowhere), the walk
 * ends; -1: error. */
static int
runs_add(Runs *r, PyObject *value)
{
    if (value == r->cur) { /* packed values are interned: mostly the same object */
        r->n++;
        return 1;
    }
    Py_INCREF(value); /* comparing or allocating may run code that changes the table */
    if (r->cur != NULL) {
        int eq = PyObject_RichCompareBool(value, r->cur, Py_EQ);
        if (eq != 0) {
            Py_DECREF(value);
            if (eq < 0)
                return -1;
            r->n++;
            return 1;
        }
    }
    int truth = PyObject_IsTrue(value);
    if (truth <= 0) {
        Py_DECREF(value);
        return truth;
    }
    if (r->cur != NULL && append_run(r->runs, r->cur, r->n) < 0) {
        Py_DECREF(value);
        return -1;
    }
    Py_XSETREF(r->cur, value);
    r->n = 1;
    return 1;
}

/* Close the last run: 0, or -1 with an error set. */
static int
runs_finish(Runs *r)
{
    return r->cur != NULL ? append_run(r->runs, r->cur, r->n) : 0;
}

/* Walk a dict: one PyDict lookup per block. 0, or -1 with an error set. */
static int
walk_dict(PyObject *blocks, PyObject *seq, Runs *r)
{
    /* The size is read again each turn: a key's __eq__ could shrink a list being walked. */
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *key = PySequence_Fast_GET_ITEM(seq, i);
        Py_INCREF(key);
        PyObject *value = PyDict_GetItemWithError(blocks, key); /* borrowed */
        Py_DECREF(key);
        if (value == NULL)
            return PyErr_Occurred() ? -1 : 0; /* unhashable key or raising __eq__; a miss */
        int go = runs_add(r, value);
        if (go <= 0)
            return go;
    }
    return 0;
}

/* Convert the chain's keys to u64 up front (so the walk can hash keys ahead of itself).
 * Returns how many leading keys converted; when that is short of n, the conversion error
 * is held in *err and only raised if the walk gets that far: a dict walk would not look at
 * keys past the first miss either. */
static Py_ssize_t
convert_keys(PyObject *seq, uint64_t *keys, Py_ssize_t n, PyObject *err[3])
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (bm_key(PySequence_Fast_GET_ITEM(seq, i), &keys[i]) < 0) {
            PyErr_Fetch(&err[0], &err[1], &err[2]);
            return i;
        }
    }
    return n;
}

/* Walk a BlockMap, prefetching the home slot of the block PREFETCH_AHEAD ahead, so that up
 * to 16 cache misses can be in flight instead of one. Each lookup probes the table afresh
 * (runs_add may allocate, and a finalizer run by a collection could resize the map).
 * 0, or -1 with an error set. */
static int
walk_block_map(BlockMap *m, PyObject *seq, Runs *r)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uint64_t stack_keys[STACK_KEYS];
    uint64_t *keys = stack_keys;
    if (n > STACK_KEYS && (keys = PyMem_Malloc((size_t)n * sizeof(uint64_t))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *err[3] = {NULL, NULL, NULL};
    Py_ssize_t ok = convert_keys(seq, keys, n, err);
    int rc = 0;
    Py_ssize_t i = 0;
    for (Py_ssize_t j = 0; j < PREFETCH_AHEAD && j < ok; j++)
        prefetch_home(m, keys[j]);
    for (; i < ok; i++) {
        if (i + PREFETCH_AHEAD < ok)
            prefetch_home(m, keys[i + PREFETCH_AHEAD]);
        Slot *s = bm_find(m, keys[i]);
        if (s == NULL)
            break;
        rc = runs_add(r, s->value);
        if (rc <= 0)
            break;
    }
    if (rc >= 0 && i == ok && ok < n) { /* the walk reached the key that did not convert */
        PyErr_Restore(err[0], err[1], err[2]);
        rc = -1;
    }
    else {
        Py_XDECREF(err[0]);
        Py_XDECREF(err[1]);
        Py_XDECREF(err[2]);
    }
    if (keys != stack_keys)
        PyMem_Free(keys);
    return rc < 0 ? -1 : 0;
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
    int is_map = Py_IS_TYPE(blocks, &BlockMapType);
    if (!is_map && !PyDict_Check(blocks)) {
        PyErr_Format(accel_ArgumentTypeError, "blocks must be a BlockMap or a dict, not %.100s",
                     Py_TYPE(blocks)->tp_name);
        return NULL;
    }
    /* a list or tuple as is, any other iterable copied into a list */
    PyObject *seq = PySequence_Fast(args[1], "hashes must be iterable");
    if (seq == NULL)
        return NULL;
    Runs r = {.runs = PyList_New(0), .cur = NULL, .n = 0};
    if (r.runs == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_INCREF(blocks); /* the walk may run code; keep the table alive meanwhile */
    int rc = is_map ? walk_block_map((BlockMap *)blocks, seq, &r) : walk_dict(blocks, seq, &r);
    Py_DECREF(blocks);
    if (rc == 0)
        rc = runs_finish(&r);
    Py_XDECREF(r.cur);
    Py_DECREF(seq);
    if (rc < 0)
        Py_CLEAR(r.runs);
    return r.runs;
}

static PyObject *
accel_new_block_map(PyObject *module, PyObject *unused)
{
    return PyObject_CallNoArgs((PyObject *)&BlockMapType);
}

static PyMethodDef accel_methods[] = {
    {"hash_blocks", (PyCFunction)(void (*)(void))accel_hash_blocks, METH_FASTCALL,
     "hash_blocks(data, seed, block_chars, /)\n--\n\n"
     "Chained XXH3-64 hashes (a list of ints) of every full block_chars-byte block of\n"
     "data, the first seeded by seed, each next one by the previous hash."},
    {"lookup_runs", (PyCFunction)(void (*)(void))accel_lookup_runs, METH_FASTCALL,
     "lookup_runs(blocks, hashes, /)\n--\n\n"
     "List of runs (value, length) of equal consecutive blocks[h] over hashes, up to the\n"
     "first h that is missing or maps to 0. blocks: a BlockMap (prefetching walk) or a dict."},
    {"new_block_map", (PyCFunction)accel_new_block_map, METH_NOARGS,
     "new_block_map()\n--\n\nAn empty BlockMap (the pure-Python twin returns a dict)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef accel_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "router._accel",
    .m_doc = "The router's per-block hot loops in C (see router.accel).",
    .m_size = 0,
    .m_methods = accel_methods,
};

/* A class of router.errors, as a new reference; NULL (raised) when it is missing. */
static PyObject *
error_class(PyObject *errors, const char *name)
{
    PyObject *cls = PyObject_GetAttrString(errors, name);
    if (cls != NULL && !PyExceptionClass_Check(cls)) {
        PyErr_Format(PyExc_ImportError, "router.errors.%s is not an exception class", name);
        Py_CLEAR(cls);
    }
    return cls;
}

PyMODINIT_FUNC
PyInit__accel(void)
{
    if (accel_ArgumentTypeError == NULL) {
        PyObject *errors = PyImport_ImportModule("router.errors");
        if (errors == NULL)
            return NULL;
        accel_ArgumentTypeError = error_class(errors, "AccelArgumentTypeError");
        accel_BlockSizeError = error_class(errors, "BlockSizeError");
        Py_DECREF(errors);
        if (accel_ArgumentTypeError == NULL || accel_BlockSizeError == NULL) {
            Py_CLEAR(accel_ArgumentTypeError);
            Py_CLEAR(accel_BlockSizeError);
            return NULL;
        }
    }
    PyObject *m = PyModule_Create(&accel_module);
    if (m == NULL)
        return NULL;
    if (PyType_Ready(&BlockMapType) < 0 || PyType_Ready(&BlockMapItemsType) < 0 ||
        PyModule_AddStringConstant(m, "IMPLEMENTATION", "c") < 0 ||
        PyModule_AddObjectRef(m, "BlockMap", (PyObject *)&BlockMapType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
