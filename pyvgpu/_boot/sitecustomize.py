# pyvgpu startup hook. `pyvgpu wrap --allocator vpmm` puts this directory
# first on PYTHONPATH so that VPMM becomes PyTorch's allocator before user
# code runs (see pyvgpu/vpmm/torch_startup.py). Then the next sitecustomize on
# sys.path, if any, runs as it would have without pyvgpu.


def _pyvgpu_startup():
    import os
    import sys

    try:
        from pyvgpu.vpmm import torch_startup as bootstrap
    except Exception as e:  # another interpreter or venv: VPMM needs pyvgpu importable here
        print(f"pyvgpu: warning: --allocator vpmm is not set up: this Python ({sys.executable}) cannot import "
              f"pyvgpu ({type(e).__name__}: {e}); install pyvgpu into this environment", file=sys.stderr)
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
