"""The built-in verifier kinds, one module each."""

from __future__ import annotations

from posttrain.platform.verifiers.kinds.code import CODE
from posttrain.platform.verifiers.kinds.custom import CUSTOM
from posttrain.platform.verifiers.kinds.doc_qa import DOC_QA
from posttrain.platform.verifiers.kinds.exact import EXACT, NORMALIZED
from posttrain.platform.verifiers.kinds.math_expr import MATH
from posttrain.platform.verifiers.kinds.numeric import NUMERIC
from posttrain.platform.verifiers.kinds.structured import JSON_SCHEMA
from posttrain.platform.verifiers.kinds.tool_use import TOOL_USE
from posttrain.platform.verifiers.registry import VerifierKind

BUILTIN_KINDS: tuple[VerifierKind, ...] = (
    EXACT,
    NORMALIZED,
    NUMERIC,
    MATH,
    JSON_SCHEMA,
    DOC_QA,
    CUSTOM,
    CODE,
    TOOL_USE,
)
