"""The group protocol from Python, through its one C implementation (pyvgpu.native.grouplib): the region a
group's processes share, the machine's turn file, the limit grammar, live limit changes, and the MPS mode.

region.py    the shared region: one file per group of processes that share a quota
spec.py      GroupSpec: what a region is made with, or checked against when a process joins it
turnfile.py  the turn file: where the groups on each GPU take turns
limits.py    sizes and per-device specs from options and the environment
live.py      `pyvgpu limits set`: change a running group's limits in its region
mps.py       compute shares and memory limits by NVIDIA's Multi-Process Service instead

May import: pyvgpu.contract, pyvgpu.host, pyvgpu.native, pyvgpu.errors; never jit, vpmm, ops, cluster or the CLI.
"""
