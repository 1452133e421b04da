"""VPMM's Python side: the pool, its statistics, and PyTorch's allocator on it (docs/vpmm.md).
The allocator core itself is numba code in pyvgpu/jit/vpmm/.

pool.py           VirtualMemoryPool: a defragmenting pool on the CUDA virtual-memory API
stats.py          a pool's statistics in PyTorch's shapes
pytorch.py        PyTorch on VPMM: the pluggable allocator and what its API leaves out
torch_startup.py  the startup hook's work in a wrapped Python program: VPMM as PyTorch's allocator

May import: pyvgpu.contract, pyvgpu.host, pyvgpu.native, pyvgpu.group, pyvgpu/jit/vpmm/, pyvgpu.errors.
"""
