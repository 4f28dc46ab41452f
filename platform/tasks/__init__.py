"""Tasks: procedural domains (``posttrain.platform.tasks.domains``) and importers
(``posttrain.platform.tasks.importers``). Tasks are ``TaskSpec`` models (see verifiers)."""

from posttrain.platform.verifiers.models import ChatMessage, TaskSpec, VerifierRef

__all__ = ["ChatMessage", "TaskSpec", "VerifierRef"]
