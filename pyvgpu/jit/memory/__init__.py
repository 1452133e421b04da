"""The memory policies: every allocation call, stream-ordered pools, memory no allocation
shows (contexts, modules, measured by NVML), and the message for a context over the cap.

May import: pyvgpu.contract, pyvgpu.jit.runtime, pyvgpu.jit.state, pyvgpu/jit/devices/.
"""
