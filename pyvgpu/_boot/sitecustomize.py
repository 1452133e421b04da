# pyvgpu startup hook. `pyvgpu wrap` puts this directory first on PYTHONPATH
# so the callbacks are installed on the main thread before user code runs
# (see pyvgpu/bootstrap.py). Then the next sitecustomize on sys.path, if
# any, runs as it would have without pyvgpu.


def _pyvgpu_startup():
    import ctypes
    import os
    import sys

    try:
        shim = ctypes.CDLL(None)
        booting = shim.pyvgpu_booting  # absent: the shim is not preloaded here
    except (OSError, AttributeError):
        booting = None
    # In a non-Python host the shim is starting this interpreter itself and
    # installs once sys.path is set up; it asks us to stay out of the way.
    if booting is not None and not booting():
        try:
            from pyvgpu import bootstrap
        except Exception as e:  # another interpreter or venv: the shim reports it at the first CUDA call
            want = os.environ.get("PYVGPU_PYTHON", "the Python pyvgpu was installed for")
            msg = (f"this Python ({sys.executable}, {sys.version.split()[0]}) cannot import pyvgpu "
                   f"({type(e).__name__}: {e}); pyvgpu is installed for {want}: install pyvgpu into this "
                   "environment, or run the program with that Python")
            shim.pyvgpu_set_error.argtypes = [ctypes.c_char_p]
            shim.pyvgpu_set_error(msg.encode())
        else:
            bootstrap.startup()

    # Chain to the sitecustomize this one shadows.
    here = os.path.dirname(os.path.abspath(__file__))
    mod = sys.modules.pop("sitecustomize", None)
    saved = sys.path[:]
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        import importlib

        try:
            importlib.import_module("sitecustomize")
        except ModuleNotFoundError as e:
            if e.name != "sitecustomize":
                raise
    finally:
        sys.path[:] = saved
        if "sitecustomize" not in sys.modules and mod is not None:
            sys.modules["sitecustomize"] = mod


_pyvgpu_startup()
del _pyvgpu_startup
