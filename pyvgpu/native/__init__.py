"""The native parts and their one compile and load path: where the shim is and its ctypes
face, the callbacks compiled from pyvgpu/jit/ to machine code in one shared object, and the cache of compiled
libraries.

shim.py       where libpyvgpu.so is, and its ctypes interface
callbacks.py  one numba cfunc per (policy, signature) of the hook table, and the services
aot.py        every callback compiled into one relocatable object
cblib.py      the callback library: that object as a shared library any process loads
cache.py      which library a process uses, and compiling one when none fits
services.py   the callback library's services called from Python (reclaim, the event log, VPMM's entries)

May import: pyvgpu.contract, pyvgpu.host, pyvgpu.jit, pyvgpu.errors.
"""
