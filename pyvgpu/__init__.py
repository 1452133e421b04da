"""pyvgpu: share one NVIDIA GPU between programs, each in a vGPU with a hard
memory cap, a compute share and its own devices, without changing the program.

Importing this package is cheap (no numba): the bootstrap that runs at the
start of every wrapped Python process imports it.
"""

__version__ = "0.1.0"
