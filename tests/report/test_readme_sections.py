"""README.md's generated sections (registry table, headline figures) match what
``python -m softmaxkit.report.readme`` generates from the code and docs/results.json."""

from pathlib import Path

import pytest

from softmaxkit import registry
from softmaxkit.report import readme

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_readme_table_is_generated_from_the_registry():
    section = readme.current_section(README.read_text(), "normalizers")
    for spec in registry.normalizers():
        if not spec.user:
            assert f"| `{spec.name}` |" in section, f"{spec.name} missing from the README table"
    assert section == readme.normalizer_section(), "README table is stale: run python -m softmaxkit.report.readme"


def test_headline_section_comes_from_the_committed_results():
    if not (ROOT / readme.RESULTS).is_file():
        pytest.skip("no committed docs/results.json")
    section = readme.current_section(README.read_text(), "headline")
    assert section == readme.headline_section(ROOT / readme.RESULTS), \
        "README headline figures are stale: run python -m softmaxkit.report.readme"
    assert "| op | case |" in section


def test_update_rewrites_a_stale_section(tmp_path):
    start, end = readme.markers("normalizers")
    hstart, hend = readme.markers("headline")
    (tmp_path / "docs").mkdir()
    results = ROOT / readme.RESULTS
    if results.is_file():
        (tmp_path / readme.RESULTS).write_text(results.read_text())
    else:
        pytest.skip("no committed docs/results.json")
    path = tmp_path / "README.md"
    path.write_text(f"x\n{start}\nold\n{end}\n{hstart}\nold\n{hend}\n")
    assert readme.update(path) and not readme.update(path)
    assert readme.current_section(path.read_text(), "normalizers") == readme.normalizer_section()
