/* router/blockmap.h: the prefix index's block table as a C type, shared by its storage
 * (blockmap_table.c), its Python type (blockmap.c) and the chain walk that reads it
 * (_accel.c).
 *
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
 * Keys: ints in [0, 2**64); anything else raises (router.errors.AccelArgumentTypeError, a
 * TypeError, or OverflowError) rather than reading as a miss, as a dict would: it could
 * only be a caller's bug.
 * Values: exact ints, held as strong references (AccelArgumentTypeError for anything
 * else). That is all the index stores, and it is why the type is not GC-tracked: an int
 * refers to nothing, so no reference cycle can pass through a BlockMap. It also means
 * comparing two values runs no Python code; the walk still rereads the slot array after
 * anything that allocates (a collection may run finalizers, and one could change the map).
 *
 * The slot array comes from PyMem_Calloc, which tracemalloc traces (bench router's
 * bytes_per_entry counts it); __sizeof__ reports it.
 */
#ifndef WG_BLOCKMAP_H
#define WG_BLOCKMAP_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

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

extern PyTypeObject BlockMapType;
/* router.errors.AccelArgumentTypeError (a TypeError), set at module init (_accel.c) */
extern PyObject *accel_ArgumentTypeError;
extern PyTypeObject BlockMapItemsType;

#define BM_MIN_CAPACITY 8

/* The table's storage (blockmap_table.c). */

/* key as a u64: 0, or -1 with TypeError (not an int) or OverflowError (outside [0, 2**64)) */
int bm_key(PyObject *obj, uint64_t *key);

/* A zeroed array of `capacity` slots (huge pages advised), or NULL with MemoryError. */
Slot *bm_alloc_slots(size_t capacity);

/* Store value (a new reference is taken) under key, growing the table past its fill
 * limit. 0, or -1 with an error set. */
int bm_set(BlockMap *m, uint64_t key, PyObject *value);

/* Remove the entry in `slot` and return its value (the map's reference, now the
 * caller's). */
PyObject *bm_take(BlockMap *m, Slot *slot);

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


#endif /* WG_BLOCKMAP_H */
