"""The summary tables' pieces: where a claim comes from, and the headline fallback for new suites."""

import pytest

from softmaxkit._plugins import Outcome
from softmaxkit._table import Table
from softmaxkit.report.summary import claim_source, headline_rows, verdict_rows


@pytest.mark.parametrize("claim, source", [
    ("Target (issue 7): Soft-NMS 10x faster.", "softmaxkit target (issue 7)"),
    ("Milakov & Gimelshein 2018: fused Softmax+TopK up to 5x.", "Milakov & Gimelshein 2018"),
    ("Dukhan & Ablavatski 2020 (arXiv 2001.04438): two-pass is faster.", "Dukhan & Ablavatski 2020 (arXiv 2001.04438)"),
    ("Scores beat MSP (Hendrycks & Gimpel 2017): ODIN (Liang et al. 2018: FPR 34.7% -> 4.3%).",
     "Hendrycks & Gimpel 2017; Liang et al. 2018"),
    ("A claim with no reference (none).", ""),
])
def test_claim_source(claim, source):
    assert claim_source(claim) == source


def test_a_new_suite_appears_without_extra_work():
    table = Table("new suite table", ["shape", "speedup vs torch"], rows=[["a", 3.0], ["b", 0.8]],
                  claim="Someone 2025: it is fast.", status="partly", verdict="0.8x to 3x")
    outcome = Outcome("bench", "newsuite", "ok", [table])
    [row] = headline_rows([outcome])
    assert (row.op, row.case, row.peer, row.ratio, row.declared) == ("new suite table", "b (worst of 2)", "torch",
                                                                     0.8, False)
    [verdict] = verdict_rows([outcome])
    assert (verdict.status, verdict.source, verdict.anchor) == ("partly", "Someone 2025",
                                                                "bench-newsuite-new-suite-table")


def test_a_claim_without_status_is_not_testable_with_the_reason():
    outcome = Outcome("arena", "t", "ok", [Table("t", ["x"], rows=[[1]], claim="c")])
    [row] = verdict_rows([outcome])
    assert row.status == "not testable" and "computed no verdict" in row.reason
