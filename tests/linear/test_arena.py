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


def test_max_retrieval_and_tiny_lm_have_linear_rows():
    from softmaxkit.arena import max_retrieval as mr
    from softmaxkit.arena import tiny_lm

    assert {"linear attn: linear", "linear attn: performer", "linear attn: mala"} <= {r[0] for r in mr.NORMALIZERS}
    cfg = mr.Config(train_sizes=(2, 4), test_sizes=(4, 16), classes=3, width=8, steps=5, batch=16, test_sets=16)
    rows = (("linear attn: performer", "linear:performer", None), ("linear attn: mala", "linear:mala", None))
    results, skipped, _ = mr.measure(cfg, seed=0, normalizers=rows, workers=1)
    assert not skipped and all(0.0 <= a <= 1.0 for v in results.values() for a in v)

    assert "linear:cosformer" in tiny_lm.LINEAR and "linear:soft" not in tiny_lm.LINEAR
    tiny = tiny_lm.Config(context=16, width=16, heads=2, layers=1, steps=3, batch=2, corpus_bytes=20_000,
                          eval_windows=4)
    for name in ("linear:performer", "linear:inline"):
        result = tiny_lm.run_one(name, tiny, seed=0)
        assert isinstance(result, dict), result
        assert 0 < result["val loss"] < 10 and 0.0 <= result["sink rate"] <= 1.0
