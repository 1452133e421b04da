"""JAX's default preallocation (75% of what the driver reports) under a cap."""

import json
import os

import jax
import jax.numpy as jnp

x = jnp.ones((1024, 1024), dtype=jnp.float32)
x.block_until_ready()
stats = jax.devices()[0].memory_stats() or {}
from pyvgpu.group import region  # noqa: E402

r = region.open_region(region.path_from_env(os.environ), writable=False).device(0)
print(json.dumps({"bytes_limit": stats.get("bytes_limit"), "group_used": r.used, "group_peak": r.peak,
                  "limit": r.limit}))
