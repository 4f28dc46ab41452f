"""Importers: JSONL task files and public benchmarks (HumanEval) into TaskSpec lists."""

from posttrain.platform.tasks.importers.humaneval import import_humaneval
from posttrain.platform.tasks.importers.jsonl import ImportErrorLine, TaskImportError, import_jsonl, parse_jsonl_lines

__all__ = ["ImportErrorLine", "TaskImportError", "import_humaneval", "import_jsonl", "parse_jsonl_lines"]
