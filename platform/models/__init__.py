"""Model directories in Hugging Face layout: build tiny ones locally, load any.

    from posttrain.platform.models import build_tiny_model, TinyModelSpec, load_model
    path = build_tiny_model("var/models/tiny", TinyModelSpec())
    loaded = load_model(path)
"""

from posttrain.platform.models.factory import (
    TinyModelSpec,
    TinyVisionModelSpec,
    build_tiny_model,
    build_tiny_vision_model,
)
from posttrain.platform.models.loader import LoadedModel, ModelDirError, ModelInfo, inspect_model_dir, load_model

__all__ = [
    "LoadedModel",
    "ModelDirError",
    "ModelInfo",
    "TinyModelSpec",
    "TinyVisionModelSpec",
    "build_tiny_model",
    "build_tiny_vision_model",
    "inspect_model_dir",
    "load_model",
]
