"""The import contracts ([tool.importlinter] in pyproject.toml) hold, and an upward import breaks them."""

from __future__ import annotations

from pathlib import Path

from import_contract import cycles, lint, mirror, undeclared


def test_the_floors_hold(tmp_path: Path) -> None:
    done = lint(mirror(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_an_upward_import_is_named(tmp_path: Path) -> None:
    """The database floor importing training, and a preprocessing module importing the platform's database: both
    contracts break, each naming the module, the line and the import."""
    dest = mirror(tmp_path)
    (dest / "posttrain" / "platform" / "db" / "upward.py").write_text("import posttrain.training.config\n")
    (dest / "posttrain" / "preprocess" / "upward.py").write_text("\n\nfrom posttrain.platform.db import engine\n")
    done = lint(dest)
    assert done.returncode != 0
    assert "posttrain.platform.db.upward -> posttrain.training.config (l.1)" in done.stdout, done.stdout
    assert "posttrain.preprocess.upward -> posttrain.platform.db" in done.stdout, done.stdout
    assert "2 broken" in done.stdout, done.stdout


def test_a_page_importing_training_is_named(tmp_path: Path) -> None:
    """A console page reaches training only through the platform (job kinds, the presets training registers): a
    page importing a training module breaks that contract alone, naming it."""
    dest = mirror(tmp_path)
    (dest / "posttrain" / "ui" / "views" / "reaching.py").write_text("from posttrain.training import presets\n")
    done = lint(dest)
    assert done.returncode != 0
    assert "posttrain.ui.views.reaching -> posttrain.training.presets" in done.stdout, done.stdout
    assert "1 broken" in done.stdout, done.stdout


def test_the_only_cycle_is_the_declared_plugin_registry(tmp_path: Path) -> None:
    """No import cycle but the verifier kinds' registry; a new one (two training modules importing each other) is
    named."""
    dest = mirror(tmp_path)
    assert undeclared(cycles(dest)) == []
    (dest / "posttrain" / "training" / "one.py").write_text("import posttrain.training.two\n")
    (dest / "posttrain" / "training" / "two.py").write_text("import posttrain.training.one\n")
    assert undeclared(cycles(dest)) == [{"posttrain.training.one", "posttrain.training.two"}]
