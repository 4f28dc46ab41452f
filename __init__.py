"""posttrain: a platform for post-training large models.

One import package over the repository's top folders: ``posttrain.platform``,
``posttrain.preprocess``, ``posttrain.training`` and ``posttrain.ui``.
"""

__version__ = "0.1.0"
