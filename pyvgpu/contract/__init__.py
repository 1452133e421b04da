"""The contract between the shim (C), the callbacks (numba), the Python tools and the
environment: the models the C, the numba accessors and the ctypes classes are generated from, declared once.

structs.py   binary structs declared once, rendered for C, numba and ctypes
abi.py       facts of the CUDA driver's and NVML's ABI (codes, flags, struct offsets)
hooks.py     the hook table: every intercepted symbol, its policy, the helpers and services
hooks_model.py  the table's model: parameters, variants, hooks, entries, services, the table hash
layout.py    pyvgpu's own binary layouts (context, region, turn file)
envspec.py   every environment variable pyvgpu reads or writes
record.py    frozen and plain records without dataclasses, for the modules a plain `pyvgpu wrap` imports

May import: nothing of pyvgpu outside this package (everything else imports it).
"""
