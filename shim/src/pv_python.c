/* Installing the callbacks through Python, when the startup hook did not.
 *
 * Python host (Py_IsInitialized() in the process): take the GIL on the
 * calling thread and run the bootstrap (the "first-call" fallback, used
 * after `python -S` or `-I`, or without `pyvgpu wrap`).
 *
 * Non-Python host: load the libpython pyvgpu was installed with
 * (PYVGPU_LIBPYTHON, set by `pyvgpu wrap`, else the one recorded at
 * build), RTLD_GLOBAL, initialise it without signal handlers, run the
 * bootstrap, and release the GIL for good.
 *
 * The shim never links libpython: every Python C-API function is looked
 * up at run time, in the process or in the loaded libpython.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <wchar.h>

#include "pv_shim.h"

#ifndef PV_BUILD_LIBPYTHON
#define PV_BUILD_LIBPYTHON ""
#endif
#ifndef PV_BUILD_PYTHON_HOME
#define PV_BUILD_PYTHON_HOME ""
#endif
#ifndef PV_BUILD_PYTHON
#define PV_BUILD_PYTHON ""
#endif

#define PY_FILE_INPUT 257


typedef struct {
    int (*IsInitialized)(void);
    int (*GILState_Ensure)(void);
    void (*GILState_Release)(int);
    void *(*Dict_New)(void);
    void *(*Dict_GetItemString)(void *, const char *);
    const char *(*Unicode_AsUTF8)(void *);
    void *(*Run_StringFlags)(const char *, int, void *, void *, void *);
    void (*DecRef)(void *);
    void (*Err_Print)(void);
    void (*InitializeEx)(int);
    void *(*Eval_SaveThread)(void);
    wchar_t *(*DecodeLocale)(const char *, size_t *);
    void (*SetPythonHome)(const wchar_t *); /* deprecated in 3.11; optional */
} pyapi_t;

static int load_api(void *h, pyapi_t *api) {
#define SYM(field, name)                                                                                         \
    do {                                                                                                         \
        *(void **)&api->field = pv_real_dlsym(h, name);                                                          \
        if (!api->field)                                                                                         \
            return -1;                                                                                           \
    } while (0)
    SYM(IsInitialized, "Py_IsInitialized");
    SYM(GILState_Ensure, "PyGILState_Ensure");
    SYM(GILState_Release, "PyGILState_Release");
    SYM(Dict_New, "PyDict_New");
    SYM(Dict_GetItemString, "PyDict_GetItemString");
    SYM(Unicode_AsUTF8, "PyUnicode_AsUTF8");
    SYM(Run_StringFlags, "PyRun_StringFlags");
    SYM(DecRef, "Py_DecRef");
    SYM(Err_Print, "PyErr_Print");
    SYM(InitializeEx, "Py_InitializeEx");
    SYM(Eval_SaveThread, "PyEval_SaveThread");
    SYM(DecodeLocale, "Py_DecodeLocale");
#undef SYM
    *(void **)&api->SetPythonHome = pv_real_dlsym(h, "Py_SetPythonHome");
    return 0;
}

static void hex(const char *s, char *out, size_t outlen) {
    size_t o = 0;
    for (; *s && o + 3 < outlen; s++)
        o += snprintf(out + o, outlen - o, "%02x", (unsigned char)*s);
    out[o] = 0;
}

/* Directory that holds the pyvgpu package this shim belongs to
 * (.../site-packages for .../site-packages/pyvgpu/libpyvgpu.so). */
static void shim_site(char *out, size_t len) {
    Dl_info di;
    out[0] = 0;
    if (dladdr((void *)pv_python_install, &di) && di.dli_fname) {
        snprintf(out, len, "%s", di.dli_fname);
        for (int up = 0; up < 2; up++) {
            char *slash = strrchr(out, '/');
            if (!slash) {
                out[0] = 0;
                return;
            }
            *slash = 0;
        }
    }
}

/* Run the bootstrap with a fresh globals dict; it leaves its error, if
 * any, in the global `_err`. */
static int run_bootstrap(pyapi_t *api, const char *mode, int embedded, char *err, size_t errlen) {
    static const char *const fmt =
        "import os, sys\n"
        "if %d:\n"
        "    if not getattr(sys, 'argv', None):\n"
        "        sys.argv = ['pyvgpu-embedded']\n"
        "    _extra = [p for p in os.environ.get('PYVGPU_SYSPATH', '').split(os.pathsep) if p]\n"
        "    _extra.append(bytes.fromhex('%s').decode())\n"
        "    sys.path[:0] = [p for p in _extra if p and p not in sys.path]\n"
        "try:\n"
        "    from pyvgpu import bootstrap as _b\n"
        "except Exception as _e:\n"
        "    _want = os.environ.get('PYVGPU_PYTHON') or bytes.fromhex('%s').decode() or 'another Python'\n"
        "    _err = ('this Python (%%s, %%s) cannot import pyvgpu (%%s: %%s); pyvgpu is installed for %%s: '\n"
        "            'install pyvgpu into this environment, or run the program with that Python'\n"
        "            %% (sys.executable or '?', sys.version.split()[0], type(_e).__name__, _e, _want))\n"
        "else:\n"
        "    _err = _b.install_from_shim('%s')\n";
    char site[1024], site_hex[2100], want_hex[2100], code[8192];
    shim_site(site, sizeof site);
    hex(site, site_hex, sizeof site_hex);
    hex(PV_BUILD_PYTHON, want_hex, sizeof want_hex);
    snprintf(code, sizeof code, fmt, embedded, site_hex, want_hex, mode);

    void *g = api->Dict_New();
    if (!g) {
        snprintf(err, errlen, "PyDict_New failed");
        return -1;
    }
    void *r = api->Run_StringFlags(code, PY_FILE_INPUT, g, g, NULL);
    int rc = -1;
    if (!r) {
        api->Err_Print();
        snprintf(err, errlen, "the Python bootstrap raised an exception (traceback above)");
    } else {
        api->DecRef(r);
        void *e = api->Dict_GetItemString(g, "_err"); /* borrowed */
        const char *msg = e ? api->Unicode_AsUTF8(e) : NULL;
        if (msg && *msg)
            snprintf(err, errlen, "%s", msg);
        else
            rc = 0;
    }
    api->DecRef(g);
    return rc;
}

static int python_host(pyapi_t *api, char *err, size_t errlen) {
    pv_boot_mode = "first-call";
    int g = api->GILState_Ensure();
    int rc = run_bootstrap(api, "first-call", 0, err, errlen);
    api->GILState_Release(g);
    return rc;
}

static volatile int pv_embedding; /* read by the startup hook through pyvgpu_booting() */
PV_EXPORT int pyvgpu_booting(void) { return pv_embedding; }

/* Py_InitializeEx aborts the process when it cannot find the standard
 * library, so check first that <home>/lib/pythonX.Y/os.py exists, X.Y
 * taken from the libpython file name. */
static int check_home(const char *lib, const char *home, char *err, size_t errlen) {
    const char *base = strrchr(lib, '/');
    base = base ? base + 1 : lib;
    unsigned major = 0, minor = 0;
    if (sscanf(base, "libpython%u.%u", &major, &minor) != 2) {
        snprintf(err, errlen, "cannot tell the Python version of %s (expected libpythonX.Y...); set "
                              "PYVGPU_LIBPYTHON to the libpython of the Python that has pyvgpu installed", lib);
        return -1;
    }
    char probe[1200];
    snprintf(probe, sizeof probe, "%s/lib/python%u.%u/os.py", home, major, minor);
    if (!*home || access(probe, R_OK) != 0) {
        snprintf(err, errlen, "no Python %u.%u standard library under '%s' (looked for %s); set "
                              "PYVGPU_PYTHON_HOME to sys.base_prefix of the Python that has pyvgpu installed",
                 major, minor, home, probe);
        return -1;
    }
    return 0;
}

static int embedded(char *err, size_t errlen) {
    const char *lib = getenv("PYVGPU_LIBPYTHON");
    if (!lib || !*lib)
        lib = PV_BUILD_LIBPYTHON;
    if (!*lib) {
        snprintf(err, errlen, "no libpython was recorded for this non-Python program; set PYVGPU_LIBPYTHON to "
                              "the libpython of the Python that has pyvgpu installed, or use `pyvgpu wrap`");
        return -1;
    }
    void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        snprintf(err, errlen, "cannot load %s for the embedded interpreter (%s); set PYVGPU_LIBPYTHON to the "
                              "libpython of the Python that has pyvgpu installed", lib, dlerror());
        return -1;
    }
    pyapi_t api;
    if (load_api(h, &api) != 0) {
        snprintf(err, errlen, "%s lacks the Python C API; set PYVGPU_LIBPYTHON to a real libpython", lib);
        return -1;
    }
    const char *home = getenv("PYVGPU_PYTHON_HOME");
    if (!home || !*home)
        home = PV_BUILD_PYTHON_HOME;
    if (check_home(lib, home, err, errlen) != 0)
        return -1;
    if (api.SetPythonHome) {
        wchar_t *w = api.DecodeLocale(home, NULL); /* kept: Python keeps the pointer */
        if (w)
            api.SetPythonHome(w);
    }
    pv_boot_mode = "embedded";
    pv_embedding = 1;
    api.InitializeEx(0); /* 0: leave the host's signal handlers alone */
    pv_embedding = 0;
    int rc = run_bootstrap(&api, "embedded", 1, err, errlen);
    api.Eval_SaveThread(); /* release the GIL for good: callbacks never need it */
    return rc;
}

int pv_python_install(char *err, size_t errlen) {
    pyapi_t api;
    if (load_api(RTLD_DEFAULT, &api) == 0) {
        if (api.IsInitialized())
            return python_host(&api, err, errlen);
        snprintf(err, errlen, "this program has a Python runtime that is not initialised yet; pyvgpu will not "
                              "start a second one. Let the program initialise Python before its first CUDA "
                              "call, or run it with PYVGPU_ON_ERROR=open");
        return -1;
    }
    return embedded(err, errlen);
}
