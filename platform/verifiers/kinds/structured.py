"""Structured output: the completion parsed as JSON, validated by a JSON Schema, credit by field."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for
from pydantic import Field, field_validator

from posttrain.platform.verifiers.models import TaskSpec, Verdict
from posttrain.platform.verifiers.registry import BaseSpec, VerifierKind
from posttrain.platform.verifiers.text import strip_code_fence

_ROOT = "(document)"


class JsonSchemaSpec(BaseSpec):
    """``schema``: a JSON Schema the answer must satisfy (its ``$schema`` picks the draft,
    2020-12 otherwise). ``expected``: optional value the answer must also equal, compared
    field by field. ``partial_credit``: score = share of top-level fields that are right."""

    json_schema: dict[str, Any] = Field(alias="schema")
    expected: Any = None
    partial_credit: bool = True

    @field_validator("json_schema")
    @classmethod
    def _is_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        validator = validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            validator.check_schema(schema)
        except SchemaError as error:
            where = "/".join(str(p) for p in error.absolute_path) or "(top)"
            raise ValueError(
                f"not a valid JSON Schema ({validator.__name__}): at {where}: {error.message}; "
                "fix the schema so that it validates against its meta-schema"
            ) from None
        return schema


def parse_json_answer(completion: str) -> Any:
    """The JSON value in ``completion``: the whole text, a fenced block, or the outermost {...}/[...]."""
    text = strip_code_fence(completion).strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError as first:
        match = re.search(r"[\[{].*[\]}]", text, re.DOTALL)
        if match and match.group(0) != text:
            try:
                return json.loads(match.group(0))
            except json.JSONDecodeError:
                pass
        raise first


def _field_of(error: jsonschema.ValidationError, document: Any) -> str:
    if error.absolute_path:
        return str(error.absolute_path[0])
    if error.validator == "required" and isinstance(document, dict):
        missing = re.match(r"'(.+)' is a required property", error.message)
        if missing:
            return missing.group(1)
    return _ROOT


def check_json_schema(spec: JsonSchemaSpec, completion: str, task: TaskSpec) -> Verdict:
    try:
        document = parse_json_answer(completion)
    except json.JSONDecodeError as exc:
        return Verdict.failure(f"the answer is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
    validator_class = validator_for(spec.json_schema, default=jsonschema.Draft202012Validator)
    errors = list(validator_class(spec.json_schema).iter_errors(document))
    wrong: dict[str, str] = {}
    for error in errors:
        wrong.setdefault(_field_of(error, document), error.message)

    fields: list[str] = list((spec.json_schema.get("properties") or {}).keys())
    expected = spec.expected
    if isinstance(expected, dict):
        fields += [key for key in expected if key not in fields]
        for key, value in expected.items():
            got = document.get(key) if isinstance(document, dict) else None
            if key not in wrong and (not isinstance(document, dict) or key not in document or got != value):
                wrong[key] = f"expected {json.dumps(value)[:60]}, got {json.dumps(got)[:60]}"
    elif expected is not None and document != expected and _ROOT not in wrong:
        wrong[_ROOT] = f"expected {json.dumps(expected)[:80]}"

    root_problems = 1 if _ROOT in wrong else 0
    units = len(fields) + root_problems
    good = sum(1 for name in fields if name not in wrong)
    score = good / units if units else (0.0 if wrong else 1.0)
    if not isinstance(document, (dict,)) and wrong:
        score = 0.0
    passed = not wrong
    if not spec.partial_credit:
        score = 1.0 if passed else 0.0
    if passed:
        details = "valid against the schema" + (" and equal to the expected value" if expected is not None else "")
    else:
        listed = "; ".join(f"{name}: {message}" for name, message in list(wrong.items())[:8])
        details = f"{len(wrong)} problem(s): {listed}"
    verdict = Verdict.of_score(score, details, breakdown={"fields_ok": good, "fields": len(fields), "problems": wrong})
    return verdict.model_copy(update={"passed": passed})


JSON_SCHEMA = VerifierKind(
    name="json_schema",
    spec_model=JsonSchemaSpec,
    check=check_json_schema,
    default_timeout_s=10.0,
    description="the answer is JSON valid against a JSON Schema (and equal to 'expected' if given)",
)
