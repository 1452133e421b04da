"""The compute share: every launch counted, charged and paced; the budget (limiter), the
device turn and its words, draining before a hand-over, the cost model, the controller, gangs.

May import: pyvgpu.contract, pyvgpu.jit.runtime, pyvgpu.jit.state, pyvgpu/jit/devices/.
"""
