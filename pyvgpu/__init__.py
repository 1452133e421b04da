"""pyvgpu: share one NVIDIA GPU between programs, each in a vGPU with a hard
memory cap, a compute share and its own devices, without changing the program.

Importing this package is cheap (no numba). A wrapped program never needs
it: the shim loads the compiled callbacks itself, in any process.

The packages, lowest layer first (docs/architecture.md, "How the layers map to folders"):
contract/ the models, host/ this machine, jit/ the callbacks' code, native/ their one compile path,
group/ the group protocol, vpmm/ the pool, cluster/ the Kubernetes half, ops/ what the commands do,
and on top the CLI (cli, entry.py, fastwrap.py). tests/test_imports.py enforces the order.
"""

__version__ = "0.1.0"
