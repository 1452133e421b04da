"""The one exception type pyvgpu raises for problems a user can fix."""


class PyvgpuError(Exception):
    """A problem with input or environment; the message names it and the fix."""
