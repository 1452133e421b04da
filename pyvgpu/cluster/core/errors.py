"""The error the cluster core raises for input a user can fix."""

from __future__ import annotations

from pyvgpu.errors import PyvgpuError


class ClusterInputError(PyvgpuError):
    """Invalid input: `field` names where (an annotation key, a resource name, a JSON path)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.detail = message
