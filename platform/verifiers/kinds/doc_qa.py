"""Document QA: the answer against the gold (normalised match or token F1) and, when asked,
a quoted evidence span that must really occur on the page the completion cites.

A completion gives its answer either as JSON (``{"answer": ..., "evidence": ..., "page": 3}``)
or as lines ``Answer: ...`` / ``Evidence: "..."`` / ``Page: 3``; plain text is the answer alone.
Page text comes from the spec (``pages``) or from the caller's ``VerifyContext.page_lookup``,
which runs in the caller before the check is dispatched.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from posttrain.platform.verifiers.models import TaskSpec, Verdict
from posttrain.platform.verifiers.registry import BaseSpec, VerifierKind, VerifyContext
from posttrain.platform.verifiers.text import normalize_answer, normalize_whitespace, token_f1


class DocQASpec(BaseSpec):
    """``answers``: accepted gold answers. ``metric``: "exact" (normalised) or "f1" (token F1,
    passed at ``f1_threshold``). ``require_evidence``: the completion must quote a span of at
    least ``min_evidence_chars`` found on the cited page (or on ``page`` when it cites none) and holding an
    accepted answer (``evidence_holds_answer``); the evidence counts ``evidence_weight`` of the score."""

    answers: list[str] = Field(min_length=1)
    metric: Literal["exact", "f1"] = "f1"
    f1_threshold: float = Field(default=0.8, gt=0, le=1)
    require_evidence: bool = False
    evidence_weight: float = Field(default=0.5, ge=0, le=1)
    min_evidence_chars: int = Field(default=8, ge=1)
    evidence_holds_answer: bool = Field(
        default=True,
        description="the quote must contain an accepted answer: a "
        "sentence that does not hold the answer is no evidence for it (without this, "
        "quoting any sentence of the page earned the evidence's weight, and GRPO on "
        "the docqa preset learned exactly that)",
    )
    document_id: str | None = None
    page: int | None = Field(default=None, ge=0)
    pages: dict[int, str] = Field(default_factory=dict)

    @field_validator("answers", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="before")
    @classmethod
    def _answer_alias(cls, data: Any) -> Any:
        if isinstance(data, dict) and "answer" in data and "answers" not in data:
            data = dict(data)
            data["answers"] = data.pop("answer")
        return data


@dataclass(frozen=True)
class DocAnswer:
    answer: str
    evidence: str | None
    page: int | None


_LINE = re.compile(r"^\s*(answer|evidence|quote|page)\s*:\s*(.*)$", re.IGNORECASE)


def parse_doc_answer(completion: str) -> DocAnswer:
    """Split a completion into answer, quoted evidence and cited page."""
    text = completion.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict) and "answer" in data:
            return DocAnswer(
                str(data["answer"]), _opt_str(data.get("evidence", data.get("quote"))), _opt_int(data.get("page"))
            )
    fields: dict[str, str] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match:
            fields.setdefault(match.group(1).lower(), match.group(2).strip())
    if "answer" not in fields:
        return DocAnswer(text, None, None)
    evidence = fields.get("evidence", fields.get("quote"))
    if evidence is not None:
        evidence = evidence.strip().strip("\"“”'")
    return DocAnswer(fields["answer"], evidence, _opt_int(fields.get("page")))


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _opt_int(value: Any) -> int | None:
    if value is None:
        return None
    match = re.search(r"\d+", str(value))
    return int(match.group(0)) if match else None


def prepare_doc_qa(spec: DocQASpec, completion: str, task: TaskSpec, context: VerifyContext) -> DocQASpec:
    """Fetch the cited page's text through the caller's lookup when the spec lacks it."""
    if not spec.require_evidence or context.page_lookup is None:
        return spec
    page = parse_doc_answer(completion).page
    page = spec.page if page is None else page
    if page is None or page in spec.pages:
        return spec
    text = context.page_lookup(spec.document_id, page) or ""  # no such page: nothing can be quoted from it
    return spec.model_copy(update={"pages": {**spec.pages, page: text}})


def check_doc_qa(spec: DocQASpec, completion: str, task: TaskSpec) -> Verdict:
    parsed = parse_doc_answer(completion)
    if spec.metric == "exact":
        answer_score = float(any(normalize_answer(parsed.answer) == normalize_answer(gold) for gold in spec.answers))
        answer_ok = answer_score == 1.0
    else:
        answer_score = max(token_f1(parsed.answer, gold) for gold in spec.answers)
        answer_ok = answer_score >= spec.f1_threshold
    breakdown: dict[str, Any] = {"answer_score": answer_score, "metric": spec.metric}
    notes = [f"answer {spec.metric} {answer_score:.2f}"]
    if not spec.require_evidence:
        verdict = Verdict.of_score(answer_score, notes[0], breakdown=breakdown)
        return verdict.model_copy(update={"passed": answer_ok})

    page = parsed.page if parsed.page is not None else spec.page
    evidence_ok, reason = _evidence_found(spec, parsed.evidence, page)
    if reason is None and not evidence_ok:
        return Verdict.infra(
            f"no text for page {page} of document {spec.document_id!r}: put it in the spec's "
            "'pages' or pass a page_lookup in the VerifyContext",
            kind="doc_qa",
        )
    breakdown.update(evidence_ok=evidence_ok, cited_page=page)
    notes.append("evidence found on the cited page" if evidence_ok else f"evidence rejected: {reason}")
    score = (1 - spec.evidence_weight) * answer_score + spec.evidence_weight * float(evidence_ok)
    verdict = Verdict.of_score(score, "; ".join(notes), breakdown=breakdown)
    return verdict.model_copy(update={"passed": answer_ok and evidence_ok})


_QUOTES = str.maketrans("", "", "\"“”'‘’")


def _unquoted(text: str) -> str:
    """Normalised, without quotation marks (a quote's own outer marks are stripped when it is parsed)."""
    return " ".join(normalize_whitespace(text).translate(_QUOTES).split())


def _evidence_found(spec: DocQASpec, evidence: str | None, page: int | None) -> tuple[bool, str | None]:
    """(found, reason it was not); reason None with found False means the page text is missing."""
    if not evidence:
        return False, "the completion quotes no evidence"
    if page is None:
        return False, "the completion cites no page"
    quoted = normalize_whitespace(evidence)
    if len(quoted) < spec.min_evidence_chars:
        return False, f"the quote is shorter than {spec.min_evidence_chars} characters"
    text = spec.pages.get(page)
    if text is None:
        if spec.pages and page not in spec.pages:
            return False, f"page {page} is not among the task's pages"
        return False, None
    if quoted not in normalize_whitespace(text):
        return False, f"the quote does not occur on page {page}"
    if spec.evidence_holds_answer and not any(_unquoted(gold) in _unquoted(quoted) for gold in spec.answers):
        return False, "the quote does not contain the answer"
    return True, ""


DOC_QA = VerifierKind(
    name="doc_qa",
    spec_model=DocQASpec,
    check=check_doc_qa,
    prepare=prepare_doc_qa,
    default_timeout_s=10.0,
    description="answer matches the gold (normalised or token F1); quoted evidence occurs on the cited page",
)
