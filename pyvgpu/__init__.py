"""pyvgpu: share one NVIDIA GPU between programs, each in a vGPU with a hard
memory cap, a compute share and its own devices, without changing the program.

Importing this package is cheap (no numba). A wrapped program never needs
it: the shim loads the compiled callbacks itself, in any process.
"""

__version__ = "0.1.0"
