"""numba callbacks (cfuncs) and the llvmlite intrinsics they are built from.

intrinsics.py  atomics, function-pointer calls, libc calls with errno
policies.py    what a hooked call does (njit functions that only call intrinsics)
callbacks.py   one cfunc per (policy, signature) of the hook table, and the services (VPMM's entry points too)
aot.py         compiles all callbacks into one cached object file
vpmm*.py       VPMM's allocator; vpmm_entries.py its C entry points, services of the hook table
"""
