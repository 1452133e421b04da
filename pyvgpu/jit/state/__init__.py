"""The state the policies keep: the group's quota and event log in the shared region, and
the process's table of allocations.

May import: pyvgpu.contract, pyvgpu.jit.runtime.
"""
