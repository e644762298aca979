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
 *   [], len, items); the pure-Python twin's new_block_map() returns a plain dict.
 *
 * xxHash is compiled in (XXH_INLINE_ALL, header from libxxhash-dev): no runtime library.
 * The GIL is held throughout: every call takes microseconds.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

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

/* ---------------------------------------------------------------------------------------
 * BlockMap: the prefix index's block table (u64 block hash -> packed int), a dict stand-in.
 *
 * Why not a dict: at a million entries each lookup of a chain walk misses the cache two or
 * three times (the dict's index table, then its entry, then the stored key's int object to
 * compare with). A BlockMap slot holds the key itself beside the value pointer (16 bytes,
 * four to a cache line), so a lookup costs one miss, and since lookup_runs knows the whole
 * chain up front it prefetches the slots PREFETCH_AHEAD blocks ahead: the misses overlap.
 *
 * Layout: open addressing, linear probing, power-of-two capacity, at most MAX_FILL_NUM /
 * MAX_FILL_DEN full (doubles and rehashes beyond). A slot is empty when its value is NULL,
 * so no key value is reserved as a marker: 0 and 2**64-1 are keys like any other. Removal
 * shifts the rest of the probe run back into the hole (no tombstones), so a probe always
 * ends at the first empty slot and pops never slow later lookups. It never shrinks (a dict
 * does not either, until it next grows).
 *
 * Keys: ints in [0, 2**64); anything else raises (TypeError, OverflowError) rather than
 * reading as a miss, as a dict would: it could only be a caller's bug.
 * Values: exact ints, held as strong references (TypeError for anything else). That is all
 * the index stores, and it is why the type is not GC-tracked: an int refers to nothing, so
 * no reference cycle can pass through a BlockMap. It also means comparing two values runs
 * no Python code; the walk still rereads the slot array after anything that allocates (a
 * collection may run finalizers, and one could change the map).
 *
 * The slot array comes from PyMem_Calloc, which tracemalloc traces (bench router's
 * bytes_per_entry counts it); __sizeof__ reports it.
 */

typedef struct {
    uint64_t key;
    PyObject *value; /* strong reference; NULL: the slot is empty */
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    size_t mask;      /* capacity - 1; the capacity is a power of two */
    Py_ssize_t used;  /* occupied slots */
    uint64_t version; /* bumped whenever an entry comes, goes or moves: items() checks it */
} BlockMap;

#define MIN_CAPACITY 8
#define MAX_FILL_NUM 7 /* grow beyond 70% full: linear probe runs stay short */
#define MAX_FILL_DEN 10
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

static PyTypeObject BlockMapType;
static PyTypeObject BlockMapItemsType;

/* murmur3's 64-bit finalizer: a bijection whose low bits depend on every key bit. Block
 * hashes are already uniform, but small or sequential keys (tests, other callers) would
 * otherwise fill one run of slots. */
static inline uint64_t
mix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

static inline size_t
home_slot(const BlockMap *m, uint64_t key)
{
    return (size_t)mix64(key) & m->mask;
}

static inline void
prefetch_home(const BlockMap *m, uint64_t key)
{
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(&m->slots[home_slot(m, key)], 0, 3);
#else
    (void)m;
    (void)key;
#endif
}

/* The slot holding key, or NULL. */
static inline Slot *
bm_find(const BlockMap *m, uint64_t key)
{
    for (size_t i = home_slot(m, key);; i = (i + 1) & m->mask) {
        Slot *s = &m->slots[i];
        if (s->value == NULL)
            return NULL;
        if (s->key == key)
            return s;
    }
}

/* The first empty slot of key's probe run (key must be absent; the map is never full). */
static Slot *
bm_free_slot(const BlockMap *m, uint64_t key)
{
    size_t i = home_slot(m, key);
    while (m->slots[i].value != NULL)
        i = (i + 1) & m->mask;
    return &m->slots[i];
}

/* Ask for transparent huge pages under a large slot array. A million-entry table spans
 * 8192 4 KiB pages, so nearly every lookup also misses the TLB, and a page walk (nested,
 * in a VM) costs about as much as the miss itself: measured on the 2-core dev VM, a cold
 * 511-block walk took ~110 us on 4 KiB pages and ~78 us on 2 MiB ones. Only the 2 MiB-
 * aligned interior of the allocation is advised (it comes from PyMem, so tracemalloc sees
 * it); the kernel may decline, which only costs the speed-up. */
static void
advise_huge_pages(void *p, size_t bytes)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20;
    if (bytes < 2 * huge)
        return;
    uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    uintptr_t hi = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p;
    (void)bytes;
#endif
}

static Slot *
alloc_slots(size_t capacity)
{
    if (capacity > (size_t)PY_SSIZE_T_MAX / sizeof(Slot)) {
        PyErr_NoMemory();
        return NULL;
    }
    Slot *slots = PyMem_Calloc(capacity, sizeof(Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    advise_huge_pages(slots, capacity * sizeof(Slot));
    return slots;
}

/* Rehash into `capacity` slots (a power of two above the count). 0, or -1 with
 * MemoryError and the map unchanged. Moves references, runs no Python code. */
static int
bm_resize(BlockMap *m, size_t capacity)
{
    Slot *old = m->slots, *slots = alloc_slots(capacity);
    size_t old_capacity = m->mask + 1;
    if (slots == NULL)
        return -1;
    m->slots = slots;
    m->mask = capacity - 1;
    for (size_t i = 0; i < old_capacity; i++) {
        if (old[i].value != NULL)
            *bm_free_slot(m, old[i].key) = old[i];
    }
    PyMem_Free(old);
    m->version++;
    return 0;
}

/* Store value (a new reference is taken) under key. 0, or -1 with an error set. */
static int
bm_set(BlockMap *m, uint64_t key, PyObject *value)
{
    Slot *s = bm_find(m, key);
    if (s != NULL) { /* overwrite in place: nothing moves, iterators stay valid */
        PyObject *old = s->value;
        Py_INCREF(value);
        s->value = value;
        Py_DECREF(old); /* last: it may run code, and the map is consistent by now */
        return 0;
    }
    /* no overflow: alloc_slots keeps capacities under PY_SSIZE_T_MAX / sizeof(Slot) */
    size_t capacity = m->mask + 1;
    if ((size_t)m->used + 1 > capacity * MAX_FILL_NUM / MAX_FILL_DEN &&
        bm_resize(m, capacity * 2) < 0)
        return -1;
    s = bm_free_slot(m, key);
    s->key = key;
    Py_INCREF(value);
    s->value = value;
    m->used++;
    m->version++;
    return 0;
}

/* Remove the entry in `slot` and return its value (the map's reference, now the
 * caller's). Backward shift, starting with the hole at `slot`: each later entry of the probe run moves into the hole unless
 * its home lies after the hole (cyclically), where moving it would hide it from its own
 * probe; the hole then follows it. */
static PyObject *
bm_take(BlockMap *m, Slot *slot)
{
    size_t mask = m->mask, hole = (size_t)(slot - m->slots);
    PyObject *value = slot->value;
    for (size_t j = (hole + 1) & mask; m->slots[j].value != NULL; j = (j + 1) & mask) {
        size_t from_home = (j - home_slot(m, m->slots[j].key)) & mask;
        if (from_home >= ((j - hole) & mask)) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole].key = 0;
    m->slots[hole].value = NULL;
    m->used--;
    m->version++;
    return value;
}

/* key as a u64: 0, or -1 with TypeError (not an int) or OverflowError (outside [0, 2**64)) */
static int
as_key(PyObject *obj, uint64_t *key)
{
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "BlockMap keys must be ints, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
#if ULONG_MAX == UINT64_MAX
    /* PyLong_AsUnsignedLong reads the digits directly; the long long version goes
     * through a byte array */
    unsigned long k = PyLong_AsUnsignedLong(obj);
    if (k == (unsigned long)-1 && PyErr_Occurred())
        return -1;
#else
    unsigned long long k = PyLong_AsUnsignedLongLong(obj);
    if (k == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
#endif
    *key = (uint64_t)k;
    return 0;
}

static int
check_value(PyObject *value)
{
    if (PyLong_CheckExact(value))
        return 0;
    PyErr_Format(PyExc_TypeError, "BlockMap values must be ints, not %.100s",
                 Py_TYPE(value)->tp_name);
    return -1;
}

static PyObject *
BlockMap_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "BlockMap() takes no arguments");
        return NULL;
    }
    BlockMap *m = (BlockMap *)type->tp_alloc(type, 0);
    if (m == NULL)
        return NULL;
    m->slots = alloc_slots(MIN_CAPACITY);
    if (m->slots == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    m->mask = MIN_CAPACITY - 1;
    return (PyObject *)m;
}

static void
BlockMap_dealloc(BlockMap *m)
{
    /* detach the array first: a value's release must not find a half-freed map */
    Slot *slots = m->slots;
    size_t capacity = m->mask + 1;
    m->slots = NULL;
    m->used = 0;
    if (slots != NULL) {
        for (size_t i = 0; i < capacity; i++)
            Py_XDECREF(slots[i].value);
        PyMem_Free(slots);
    }
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t
BlockMap_length(BlockMap *m)
{
    return m->used;
}

static PyObject *
BlockMap_subscript(BlockMap *m, PyObject *key_obj)
{
    uint64_t key;
    if (as_key(key_obj, &key) < 0)
        return NULL;
    Slot *s = bm_find(m, key);
    if (s == NULL) {
        PyErr_SetObject(PyExc_KeyError, key_obj);
        return NULL;
    }
    return Py_NewRef(s->value);
}

/* m[key] = value, or del m[key] when value is NULL */
static int
BlockMap_ass_subscript(BlockMap *m, PyObject *key_obj, PyObject *value)
{
    uint64_t key;
    if (as_key(key_obj, &key) < 0)
        return -1;
    if (value != NULL)
        return check_value(value) < 0 ? -1 : bm_set(m, key, value);
    Slot *s = bm_find(m, key);
    if (s == NULL) {
        PyErr_SetObject(PyExc_KeyError, key_obj);
        return -1;
    }
    Py_DECREF(bm_take(m, s));
    return 0;
}

static int
BlockMap_contains(BlockMap *m, PyObject *key_obj)
{
    uint64_t key;
    if (as_key(key_obj, &key) < 0)
        return -1;
    return bm_find(m, key) != NULL;
}

static PyObject *
BlockMap_get(BlockMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "get expected 1 or 2 arguments, got %zd", nargs);
        return NULL;
    }
    uint64_t key;
    if (as_key(args[0], &key) < 0)
        return NULL;
    Slot *s = bm_find(m, key);
    return Py_NewRef(s != NULL ? s->value : nargs == 2 ? args[1] : Py_None);
}

static PyObject *
BlockMap_pop(BlockMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "pop expected 1 or 2 arguments, got %zd", nargs);
        return NULL;
    }
    uint64_t key;
    if (as_key(args[0], &key) < 0)
        return NULL;
    Slot *s = bm_find(m, key);
    if (s != NULL)
        return bm_take(m, s);
    if (nargs == 2)
        return Py_NewRef(args[1]);
    PyErr_SetObject(PyExc_KeyError, args[0]);
    return NULL;
}

static PyObject *
BlockMap_sizeof(BlockMap *m, PyObject *unused)
{
    size_t size = (size_t)Py_TYPE(m)->tp_basicsize;
    if (m->slots != NULL)
        size += (m->mask + 1) * sizeof(Slot);
    return PyLong_FromSize_t(size);
}

/* For tests: the slot index holding key, or -1 (shows that collisions really collide). */
static PyObject *
BlockMap_slot(BlockMap *m, PyObject *key_obj)
{
    uint64_t key;
    if (as_key(key_obj, &key) < 0)
        return NULL;
    Slot *s = bm_find(m, key);
    return PyLong_FromSsize_t(s == NULL ? -1 : (Py_ssize_t)(s - m->slots));
}

/* items(): an iterator over (key, value), in slot order. Like a dict's, it raises
 * RuntimeError if entries come or go under it; a list built from it is a snapshot. */
typedef struct {
    PyObject_HEAD
    BlockMap *map;     /* NULL once exhausted */
    PyObject *result;  /* the last (key, value) tuple, reused when nobody else holds it */
    size_t pos;
    uint64_t version;
} BlockMapItems;

static PyObject *
BlockMap_items(BlockMap *m, PyObject *unused)
{
    BlockMapItems *it = PyObject_New(BlockMapItems, &BlockMapItemsType);
    if (it == NULL)
        return NULL;
    it->map = (BlockMap *)Py_NewRef(m);
    it->result = NULL;
    it->pos = 0;
    it->version = m->version;
    return (PyObject *)it;
}

static void
BlockMapItems_dealloc(BlockMapItems *it)
{
    Py_XDECREF(it->map);
    Py_XDECREF(it->result);
    PyObject_Free(it);
}

/* (key, value) from two new references. The tuple of the previous step is refilled when
 * the caller dropped it (a `for k, v in m.items()` loop unpacks and drops each), as a dict's
 * items iterator does: it halves the allocations of a scan over every entry. A recycled
 * tuple may have been untracked by the GC; that is fine, it only ever holds ints. */
static PyObject *
items_pair(BlockMapItems *it, PyObject *key, PyObject *value)
{
    PyObject *result = it->result;
    if (result != NULL && Py_REFCNT(result) == 1) {
        PyObject *old_key = PyTuple_GET_ITEM(result, 0);
        PyObject *old_value = PyTuple_GET_ITEM(result, 1);
        PyTuple_SET_ITEM(result, 0, key);
        PyTuple_SET_ITEM(result, 1, value);
        Py_DECREF(old_key);
        Py_DECREF(old_value);
        return Py_NewRef(result);
    }
    PyObject *pair = PyTuple_New(2);
    if (pair == NULL) {
        Py_DECREF(key);
        Py_DECREF(value);
        return NULL;
    }
    PyTuple_SET_ITEM(pair, 0, key);
    PyTuple_SET_ITEM(pair, 1, value);
    Py_XSETREF(it->result, Py_NewRef(pair));
    return pair;
}

static PyObject *
BlockMapItems_next(BlockMapItems *it)
{
    BlockMap *m = it->map;
    if (m == NULL)
        return NULL;
    if (m->version != it->version) {
        PyErr_SetString(PyExc_RuntimeError, "BlockMap changed size during iteration");
        return NULL;
    }
    for (size_t capacity = m->mask + 1; it->pos < capacity; it->pos++) {
        Slot *s = &m->slots[it->pos];
        if (s->value == NULL)
            continue;
        PyObject *key = PyLong_FromUnsignedLongLong((unsigned long long)s->key);
        if (key == NULL)
            return NULL;
        it->pos++;
        return items_pair(it, key, Py_NewRef(s->value));
    }
    it->map = NULL;
    Py_DECREF(m);
    return NULL;
}

static PyMethodDef BlockMap_methods[] = {
    {"get", (PyCFunction)(void (*)(void))BlockMap_get, METH_FASTCALL,
     "get(key, default=None, /)\n--\n\nThe value of key, else default."},
    {"pop", (PyCFunction)(void (*)(void))BlockMap_pop, METH_FASTCALL,
     "pop(key[, default], /)\n--\n\n"
     "Remove key and return its value, else default (KeyError without one)."},
    {"items", (PyCFunction)BlockMap_items, METH_NOARGS,
     "items()\n--\n\nAn iterator over (key, value) pairs (RuntimeError if entries come or "
     "go meanwhile)."},
    {"__sizeof__", (PyCFunction)BlockMap_sizeof, METH_NOARGS,
     "__sizeof__()\n--\n\nBytes of the object and its slot array."},
    {"_slot", (PyCFunction)BlockMap_slot, METH_O,
     "_slot(key, /)\n--\n\nFor tests: the index of the slot holding key, else -1."},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods BlockMap_as_mapping = {
    .mp_length = (lenfunc)BlockMap_length,
    .mp_subscript = (binaryfunc)BlockMap_subscript,
    .mp_ass_subscript = (objobjargproc)BlockMap_ass_subscript,
};

static PySequenceMethods BlockMap_as_sequence = {
    .sq_contains = (objobjproc)BlockMap_contains,
};

static PyTypeObject BlockMapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "router._accel.BlockMap",
    .tp_doc = "BlockMap()\n--\n\n"
              "u64 key -> int value, a dict stand-in for the prefix index's block table:\n"
              "open addressing in one flat array; lookup_runs prefetches along a chain.",
    .tp_basicsize = sizeof(BlockMap),
    .tp_flags = Py_TPFLAGS_DEFAULT, /* not GC-tracked: values are ints (see above) */
    .tp_new = BlockMap_new,
    .tp_dealloc = (destructor)BlockMap_dealloc,
    .tp_as_mapping = &BlockMap_as_mapping,
    .tp_as_sequence = &BlockMap_as_sequence,
    .tp_methods = BlockMap_methods,
    .tp_hash = PyObject_HashNotImplemented,
};

static PyTypeObject BlockMapItemsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "router._accel.BlockMapItems",
    .tp_basicsize = sizeof(BlockMapItems),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)BlockMapItems_dealloc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)BlockMapItems_next,
};

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
        if (as_key(PySequence_Fast_GET_ITEM(seq, i), &keys[i]) < 0) {
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
        PyErr_Format(PyExc_TypeError, "blocks must be a BlockMap or a dict, not %.100s",
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

PyMODINIT_FUNC
PyInit__accel(void)
{
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
