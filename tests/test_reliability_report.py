"""The generator of docs/reliability.md (tests/reliability_report.py) on a made-up
figures file, and the committed page against the generator's scenario list."""

from __future__ import annotations

import json
from pathlib import Path

from tests import reliability_report as report
from tests.figures import record

DOC = Path(__file__).resolve().parent.parent / "docs" / "reliability.md"


def _figures(path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DISTLOCK_FIGURES", str(path))
    record("mixed", "redis", processes=3, acquisitions=100, overlaps=0, repeated_tokens=0)
    record("mixed", "redis", processes=3, acquisitions=50, overlaps=1, repeated_tokens=0)
    record("sigkill", "zk", freed_s=6.2, bound_s=9.5)
    record("sigkill", "zk", freed_s=4.0, bound_s=9.5)
    record("frozen-server", "pg-lease", worst_call_s=7.5, bound_s=5.0)
    record("made-up-scenario", "locmem", gadgets=2)


def test_a_made_up_run_becomes_tables(tmp_path: Path, monkeypatch) -> None:
    path, doc = tmp_path / "figures.jsonl", tmp_path / "reliability.md"
    _figures(path, monkeypatch)
    assert all(json.loads(line)["scenario"] for line in path.read_text().splitlines())
    doc.write_text(f"# head\n\n{report.BEGIN}\nSTALE TEXT\n{report.END}\n\ntail\n")
    assert report.main([str(path), str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# head\n") and text.endswith("\ntail\n") and "STALE TEXT" not in text
    # Counts of one (scenario, backend) add up; times and bounds keep the largest.
    assert "| redis | 6 | 150 | **1** | 0 |" in text
    assert "| zk | 6.2 | 9.5 |" in text
    assert "| pg-lease | 7.5 **over** | 5 |" in text
    # Every known scenario has its section; an unknown one too, flagged.
    names = report.scenario_names(text)
    assert names == [*report.SCENARIOS, "made-up-scenario"]
    assert "**Not described**" in text and "| locmem | 2 |" in text
    assert text.count("No figures in the last run.") == len(report.SCENARIOS) - 3
    report.main([str(path), str(doc)])  # again: the same page, not a second block
    assert doc.read_text() == text


def test_record_does_nothing_without_the_variable(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("DISTLOCK_FIGURES", raising=False)
    monkeypatch.chdir(tmp_path)
    record("mixed", "redis", processes=1)
    assert list(tmp_path.iterdir()) == []


def test_the_committed_page_lists_the_generators_scenarios() -> None:
    names = report.scenario_names(DOC.read_text(encoding="utf-8"))
    known = [name for name in names if name in report.SCENARIOS]
    assert known == list(report.SCENARIOS)


def test_the_committed_page_is_the_generators_output_of_the_committed_figures() -> None:
    """docs/reliability.md's tables are what the generator makes of docs/reliability.jsonl
    (both written by scripts/reliability): a generator change regenerates the page."""
    records = report.load(DOC.with_suffix(".jsonl"))
    assert records, "docs/reliability.jsonl holds no figures"
    block = report.block_of(DOC.read_text(encoding="utf-8"))
    assert block == f"\n\n{report.render_records(records)}\n"
