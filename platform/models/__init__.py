"""Model directories in Hugging Face layout: build tiny ones locally, load any, register them.

    from posttrain.platform.models import build_tiny_model, TinyModelSpec, load_model
    path = build_tiny_model("var/models/tiny", TinyModelSpec())
    loaded = load_model(path)

Names are imported on first use, so importing the registry or ``inspect_model_dir``
does not pull in torch (the job worker stays light).
"""

from __future__ import annotations

from posttrain.platform.lazy import lazy_exports

_EXPORTS = {
    "TinyModelSpec": "specs",
    "TinyVisionModelSpec": "specs",
    "build_tiny_model": "factory",
    "build_tiny_vision_model": "factory",
    "LoadedModel": "loader",
    "load_model": "loader",
    "ModelDirError": "inspect",
    "ModelInfo": "inspect",
    "inspect_model_dir": "inspect",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
