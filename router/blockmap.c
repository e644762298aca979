/* router/blockmap.c: BlockMap, the prefix index's block table (see blockmap.h for why and
 * how it is laid out): the table's operations and its Python type. */
#include "blockmap.h"

#include <limits.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#define MIN_CAPACITY 8
#define MAX_FILL_NUM 7 /* grow beyond 70% full: linear probe runs stay short */
#define MAX_FILL_DEN 10

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

int
bm_key(PyObject *obj, uint64_t *key)
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
    if (bm_key(key_obj, &key) < 0)
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
    if (bm_key(key_obj, &key) < 0)
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
    if (bm_key(key_obj, &key) < 0)
        return -1;
    return bm_find(m, key) != NULL;
}

/* get() and pop(): (key[, default]) with the key as a u64; 0, or -1 with an error set */
static int
key_and_default(const char *name, PyObject *const *args, Py_ssize_t nargs, uint64_t *key)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "%s expected 1 or 2 arguments, got %zd", name, nargs);
        return -1;
    }
    return bm_key(args[0], key);
}

static PyObject *
BlockMap_get(BlockMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t key;
    if (key_and_default("get", args, nargs, &key) < 0)
        return NULL;
    Slot *s = bm_find(m, key);
    return Py_NewRef(s != NULL ? s->value : nargs == 2 ? args[1] : Py_None);
}

static PyObject *
BlockMap_pop(BlockMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t key;
    if (key_and_default("pop", args, nargs, &key) < 0)
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
    if (bm_key(key_obj, &key) < 0)
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

PyTypeObject BlockMapType = {
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

PyTypeObject BlockMapItemsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "router._accel.BlockMapItems",
    .tp_basicsize = sizeof(BlockMapItems),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)BlockMapItems_dealloc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)BlockMapItems_next,
};
