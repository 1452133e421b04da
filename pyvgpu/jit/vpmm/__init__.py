"""VPMM's allocator core in numba (design: docs/vpmm.md): the tables, the driver calls,
defragmentation, housekeeping, and the entry points the callback library exports (entries.py).

May import: pyvgpu.contract, pyvgpu.jit.runtime, this package.
"""
