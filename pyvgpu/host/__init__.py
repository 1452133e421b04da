"""This machine: its GPUs as NVML reports them, its CPU, and files other users may touch.

devices.py   the GPUs (and MIG instances) through NVML, for checks before a program starts
cpuid.py     which CPU this is: the key of a host-tuned callback library
safefile.py  directories, regions, turn files and caches opened safely (through grouplib)
grouplib.py  the ctypes binding of libpyvgpu_group.so: the group core in C (limits grammar, environment,
             safe files, opening, checking and creating a region and the turn file), which the shim is
             built from too

May import: pyvgpu.contract, pyvgpu.errors (devices.py reuses group.limits' ASCII check lazily: a known
crossing, listed in tests/test_imports.py).
"""
