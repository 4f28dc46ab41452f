"""Choose the sandbox pool for this process: local, or spread over a Ray cluster.

Example::

    settings = get_settings()
    pool = make_pool(settings.sandbox, settings.data_dir, settings.ray_address)
    with pool, pool.acquire() as sandbox:
        sandbox.run_python("1 + 1")

``backend="ray"`` or a Ray address gives a ``RaySandboxPool`` (each node runs the
local backend: bubblewrap for "ray", else the one configured); otherwise the local
``SandboxPool``. Both have ``acquire()``, ``checkout()``/``release()``, ``status()`` and
``close()``, and their sandboxes the same tool methods.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from posttrain.platform.sandbox.backends import SandboxUnavailableError
from posttrain.platform.sandbox.pool import SandboxPool
from posttrain.platform.settings.sandbox import SandboxConfig

if TYPE_CHECKING:
    from posttrain.platform.sandbox.ray_backend import RaySandboxPool


def uses_ray(config: SandboxConfig, ray_address: str | None = None) -> bool:
    return config.backend == "ray" or bool(ray_address)


def make_pool(
    config: SandboxConfig, data_dir: Path | None = None, ray_address: str | None = None
) -> SandboxPool | RaySandboxPool:
    """A started pool: ``RaySandboxPool`` when ``config.backend == "ray"`` or ``ray_address``
    is given (POSTTRAIN_RAY_ADDRESS), else ``SandboxPool``."""
    if not uses_ray(config, ray_address):
        return SandboxPool(config, data_dir)
    try:
        from posttrain.platform.sandbox.ray_backend import RaySandboxPool  # optional: ray
    except ImportError as exc:
        raise SandboxUnavailableError(
            f"sandbox pools on Ray need the 'ray' package ({exc}): pip install 'posttrain[ray]' "
            "(or 'ray>=2.40'), or unset POSTTRAIN_RAY_ADDRESS and use backend 'bwrap'"
        ) from exc
    return RaySandboxPool(config, data_dir, address=ray_address or None)
