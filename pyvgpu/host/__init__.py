"""This machine: its GPUs as NVML reports them, and its CPU.

devices.py   the GPUs (and MIG instances) through NVML, for checks before a program starts
cpuid.py     which CPU this is: the key of a host-tuned callback library
driver.py    whether the CUDA driver loads, and the fix when it does not

May import: pyvgpu.contract, pyvgpu.errors (devices.py reuses group.limits' ASCII check lazily: a known
crossing, listed in tests/test_imports.py).
"""
