"""The native parts and how Python reaches them: where the shim is and its ctypes face, the group core in C
(libpyvgpu_group.so) and its binding, the callbacks compiled from pyvgpu/jit/ to machine code in one shared
object, and the cache of compiled libraries.

shim.py       where libpyvgpu.so is, and its ctypes interface
grouplib.py   the ctypes binding of libpyvgpu_group.so, the group protocol's one implementation, which the
              shim is built from too: loading it, the limits grammar and the environment's values
groupfiles.py its second half: safe files, opening, checking, creating, mapping and changing a region, the
              turn file
safefile.py   directories, regions, turn files and caches opened safely (thin calls into groupfiles)
callbacks.py  one numba cfunc per (policy, signature) of the hook table, and the services
aot.py        every callback compiled into one relocatable object
cblib.py      the callback library: that object as a shared library any process loads
cache.py      which library a process uses, and compiling one when none fits
choice.py     the library `pyvgpu wrap` names, chosen without loading one and remembered in the runtime dir
services.py   the callback library's services called from Python (reclaim, the event log, VPMM's entries)

May import: pyvgpu.contract, pyvgpu.host, pyvgpu.jit, pyvgpu.errors.
"""
