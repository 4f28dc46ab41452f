"""Verifiers: ``verify(task, completion) -> Verdict``, run in a pool of worker processes.

Example::

    from posttrain.platform.verifiers import TaskSpec, verify

    task = TaskSpec(domain="demo", prompt="2+3=?",
                    verifier={"kind": "numeric", "spec": {"value": 5}}, reference="5")
    verdict = verify(task, "The answer is 5.")   # Verdict(score=1.0, passed=True, ...)

Kinds (``list_verifiers()``): exact, normalized, numeric, math, json_schema, doc_qa, custom
(entry-point group ``posttrain.verifiers``), code (unit tests in a warm sandbox; the pool is
``VerifyContext(sandbox_pool=...)`` or the process-wide one of ``verifiers.sandboxes``) and
tool_use (checks in the episode's sandbox, lent as ``VerifyContext(sandbox=...)``).
"""

from posttrain.platform.verifiers.errors import SpecProblem, UnknownVerifierError, VerifierError, VerifierSpecError
from posttrain.platform.verifiers.models import ChatMessage, TaskSpec, Verdict, VerifierRef
from posttrain.platform.verifiers.pool import PoolConfig
from posttrain.platform.verifiers.registry import (
    BaseSpec,
    PageLookup,
    VerifierKind,
    VerifyContext,
    get_verifier,
    list_verifiers,
    register_verifier,
    unregister_verifier,
    validate_spec,
    validate_task,
)
from posttrain.platform.verifiers.service import (
    VerifierService,
    averify,
    averify_batch,
    default_service,
    verify,
    verify_batch,
)

__all__ = [
    "BaseSpec",
    "ChatMessage",
    "PageLookup",
    "PoolConfig",
    "SpecProblem",
    "TaskSpec",
    "UnknownVerifierError",
    "Verdict",
    "VerifierError",
    "VerifierKind",
    "VerifierRef",
    "VerifierService",
    "VerifierSpecError",
    "VerifyContext",
    "averify",
    "averify_batch",
    "default_service",
    "get_verifier",
    "list_verifiers",
    "register_verifier",
    "unregister_verifier",
    "validate_spec",
    "validate_task",
    "verify",
    "verify_batch",
]
