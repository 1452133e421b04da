"""What every policy is built from: llvmlite intrinsics, typed accessors of the layouts,
the per-process context (driver calls, call count, device) and the launch path's clock.

May import: pyvgpu.contract and this package only.
"""
