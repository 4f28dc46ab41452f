"""Models as the platform keeps them: the registry, import, export, interpolation, the general check's gate, the
model jobs (``build_model``, ``import_model``, ``export_model``), and tiny models built locally for tests.

    from posttrain.platform.models import build_tiny_model, TinyModelSpec
    path = build_tiny_model("var/models/tiny", TinyModelSpec())

Reading and running a model directory (``load_model``, ``inspect_model_dir``) is the engine floor's,
:mod:`posttrain.platform.engines`. Names are imported on first use (the job worker stays light).
"""

from __future__ import annotations

from posttrain.platform.lazy import lazy_exports

_EXPORTS = {
    "TinyModelSpec": "specs",
    "TinyVisionModelSpec": "specs",
    "build_tiny_model": "factory",
    "build_tiny_vision_model": "factory",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
