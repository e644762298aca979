/* router/blockmap_table.c: the block table's storage (see blockmap.h for why and how it is
 * laid out): slot arrays, insertion with growth, removal by backward shift, keys as u64.
 * BlockMap's Python type over it is blockmap.c. */
#include "blockmap.h"

#include <limits.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

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

Slot *
bm_alloc_slots(size_t capacity)
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
    Slot *old = m->slots, *slots = bm_alloc_slots(capacity);
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

int
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
    /* no overflow: bm_alloc_slots keeps capacities under PY_SSIZE_T_MAX / sizeof(Slot) */
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

/* Backward shift, starting with the hole at `slot`: each later entry of the probe run
 * moves into the hole unless its home lies after the hole (cyclically), where moving it
 * would hide it from its own probe; the hole then follows it. */
PyObject *
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
        PyErr_Format(accel_ArgumentTypeError, "BlockMap keys must be ints, not %.100s",
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
