"""Builds the native parts (the shim, the compiled callbacks, the bench) into the wheel; see scripts/build_native.py.

The wheel is tagged py3-none-<platform>: its shared objects are plain C and numba code that no Python
version's ABI touches. `auditwheel repair` gives it a manylinux tag (scripts/build_wheel.py).
"""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent


def _build_native():
    spec = importlib.util.spec_from_file_location("build_native", ROOT / "scripts" / "build_native.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildPyWithNative(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:
            _build_native().build(Path(self.build_lib) / "pyvgpu")
        else:
            _build_native().build(ROOT / "pyvgpu")


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # the wheel carries a shared library: make it platform-specific
        return True


class AnyPythonWheel(bdist_wheel):
    def get_tag(self):
        return ("py3", "none", super().get_tag()[2])  # one platform, any Python 3


setup(cmdclass={"build_py": BuildPyWithNative, "bdist_wheel": AnyPythonWheel}, distclass=BinaryDistribution)
