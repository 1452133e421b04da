"""What the program sees of the machine: the group's devices through CUDA and NVML, NVML
as the policies use it, and the virtual view of memory (the cap is the device's memory).

May import: pyvgpu.contract, pyvgpu.jit.runtime, pyvgpu.jit.state.
"""
