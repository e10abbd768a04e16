"""Arena `linear` (quick): the four claim tables, each with a claim, a verdict and a computed status."""

from softmaxkit._table import VERDICTS
from softmaxkit.arena import TASKS
from softmaxkit.arena import linear as task


def test_quick_task_tables_carry_claims_and_statuses():
    assert "linear" in TASKS and task.CLAIM
    tables = task.run(quick=True)
    assert len(tables) == 4
    for t in tables:
        assert t.claim and t.verdict and t.status in VERDICTS
        assert t.rows and all(len(r) == len(t.columns) for r in t.rows)
    inj = {r[0]: r[-1] for r in tables[3].rows}
    assert inj["cosformer"] == "yes" and inj["inline"] == "no" and inj["softmax"] == "no"
