"""Benchmarks behind `pyvgpu bench`: figures, raw against wrapped, in one run."""
