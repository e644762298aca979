/* Finds and loads a GPU backend library (_wg_cuda.so / _wg_hip.so, built beside this
 * extension) with dlopen, resolves its C ABI (wg_gpu_api.h), and describes each backend
 * for backends(): built (library present), usable (library loads and sees a device), why not.
 * Nothing is loaded at import: a machine without GPU runtimes never touches them. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "wg_py.h"

/* Path of _wg_<backend>.so in this extension's directory. */
static int wg_lib_path(const char *backend, char *path, size_t pathlen) {
    Dl_info info;
    if (dladdr((void *)wg_lib_path, &info) == 0 || info.dli_fname == NULL)
        return -1;
    const char *slash = strrchr(info.dli_fname, '/');
    int dirlen = slash ? (int)(slash - info.dli_fname) : 1;
    const char *dir = slash ? info.dli_fname : ".";
    int n = snprintf(path, pathlen, "%.*s/_wg_%s.so", dirlen, dir, backend);
    return n > 0 && (size_t)n < pathlen ? 0 : -1;
}

#define WG_SYM(field, name)                                                                   \
    do {                                                                                      \
        *(void **)(&lib->field) = dlsym(lib->handle, name);                                   \
        if (lib->field == NULL) {                                                             \
            snprintf(err, errlen, "%s lacks %s", path, name);                                 \
            return -1;                                                                        \
        }                                                                                     \
    } while (0)

int wg_gpu_load(const char *backend, wg_gpu_lib *lib, char *err, size_t errlen) {
    char path[PATH_MAX];
    memset(lib, 0, sizeof(*lib));
    if (strcmp(backend, "cuda") != 0 && strcmp(backend, "hip") != 0) {
        snprintf(err, errlen, "unknown GPU backend '%s' (cuda or hip)", backend);
        return -1;
    }
    if (wg_lib_path(backend, path, sizeof(path)) != 0) {
        snprintf(err, errlen, "cannot locate the extension's directory");
        return -1;
    }
    if (access(path, R_OK) != 0) {
        snprintf(err, errlen, "not built (%s missing)", path);
        return -1;
    }
    /* The loader reference-counts handles: loading again returns the same library. */
    lib->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib->handle == NULL) {
        const char *why = dlerror();
        snprintf(err, errlen, "cannot load: %s", why ? why : path);
        return -1;
    }
    WG_SYM(abi, "wg_gpu_abi");
    if (lib->abi() != WG_GPU_ABI_VERSION) {
        snprintf(err, errlen, "%s has ABI %d, expected %d", path, lib->abi(), WG_GPU_ABI_VERSION);
        return -1;
    }
    WG_SYM(runtime, "wg_gpu_runtime");
    WG_SYM(runtime_version, "wg_gpu_runtime_version");
    WG_SYM(device_count, "wg_gpu_device_count");
    WG_SYM(device_name, "wg_gpu_device_name");
    WG_SYM(open, "wg_gpu_open");
    WG_SYM(close, "wg_gpu_close");
    WG_SYM(malloc, "wg_gpu_malloc");
    WG_SYM(free, "wg_gpu_free");
    WG_SYM(host_register, "wg_gpu_host_register");
    WG_SYM(host_unregister, "wg_gpu_host_unregister");
    WG_SYM(copy_batch, "wg_gpu_copy_batch");
    WG_SYM(copy_async, "wg_gpu_copy_async");
    WG_SYM(event_wait, "wg_gpu_event_wait");
    WG_SYM(event_query, "wg_gpu_event_query");
    return 0;
}

static int wg_set(PyObject *d, const char *key, PyObject *value) {
    if (value == NULL)
        return -1;
    int rc = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return rc;
}

PyObject *wg_gpu_describe(const char *backend) {
    char err[512] = "";
    char path[PATH_MAX] = "";
    wg_gpu_lib lib;
    int built = wg_lib_path(backend, path, sizeof(path)) == 0 && access(path, R_OK) == 0;
    int devices = 0, version = -1;
    char name[256] = "";
    if (built) {
        Py_BEGIN_ALLOW_THREADS;
        if (wg_gpu_load(backend, &lib, err, sizeof(err)) == 0) {
            version = lib.runtime_version();
            devices = lib.device_count(err, sizeof(err));
            if (devices > 0)
                lib.device_name(0, name, sizeof(name));
        } else {
            devices = -1; /* built, but its runtime cannot be loaded here */
        }
        Py_END_ALLOW_THREADS;
    } else {
        snprintf(err, sizeof(err), "not built (no %s)", path[0] ? path : backend);
    }
    if (devices < 0)
        devices = 0;
    else if (devices == 0 && built)
        snprintf(err, sizeof(err), "no device");
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    if (wg_set(d, "built", PyBool_FromLong(built)) || wg_set(d, "usable", PyBool_FromLong(devices > 0)) ||
        wg_set(d, "selected", PyBool_FromLong(0)) ||
        wg_set(d, "reason", PyUnicode_FromString(devices > 0 ? "" : err)) ||
        wg_set(d, "devices", PyLong_FromLong(devices)) ||
        wg_set(d, "device_name", PyUnicode_FromString(name)) ||
        wg_set(d, "runtime_version", PyLong_FromLong(version)) ||
        wg_set(d, "library", PyUnicode_DecodeFSDefault(built ? path : ""))) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}
