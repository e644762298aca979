/* router/blockmap.c: BlockMap's Python type (see blockmap.h for why and how it is laid
 * out): constructor, mapping protocol, get/pop, the items iterator. The table's storage it
 * stands on is blockmap_table.c. */
#include "blockmap.h"

static int
check_value(PyObject *value)
{
    if (PyLong_CheckExact(value))
        return 0;
    PyErr_Format(accel_ArgumentTypeError, "BlockMap values must be ints, not %.100s",
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
    m->slots = bm_alloc_slots(BM_MIN_CAPACITY);
    if (m->slots == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    m->mask = BM_MIN_CAPACITY - 1;
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
