"""What the commands do (the CLI only parses): wrap a program, read and manage groups, check
the machine, export metrics.

wrap.py      `pyvgpu wrap`: prepare a vGPU's environment and exec the program
groups.py    named groups' lifecycle: made, last used, removed, expired
status.py    `pyvgpu status`: read regions, reclaim dead members' quota, report
top.py       `pyvgpu top`: a live table of groups, devices and processes
exporter.py  `pyvgpu exporter`: Prometheus metrics for every group
doctor.py    `pyvgpu doctor`: is this machine ready? each check says how to fix it

May import: every layer below (contract, host, native, group, vpmm; jit only through native), pyvgpu.cluster's
node state for the readers, pyvgpu.errors; never the CLI.
"""
