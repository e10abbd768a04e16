"""Stand-in bench suites and arena tasks for testing the frames and the report quickly.

Installed into ``sys.modules`` under ``softmaxkit.bench.<name>`` / ``softmaxkit.arena.<name>``
by :func:`install`, so that the frames import them as they would a real suite or task.
"""

import sys
import types

from softmaxkit._table import Table
from softmaxkit.bench._measure import Measured


def _table_with_figure(title: str, status: str) -> Table:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 2))
    ax = fig.add_subplot()
    ax.plot([1, 2, 3], [3, 1, 2])
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats)")
    table = Table(title=title, columns=["name", "ratio"], claim="fake claim <b>", verdict="fake verdict",
                  notes="fake notes & more", status=status)
    table.add("a<b", 1.25)
    table.add("c", 0.5)
    table.figures.append(("fake plot", fig))
    return table


def _ok_suite(quick=False):
    timed = Table(title="fake timed table", columns=["shape", "op", "torch ms", "kernel ms", "speedup vs torch"],
                  claim="Target (issue 99): the kernel is 2x faster than torch.", status="did not hold",
                  verdict="1.6x at 64x64")
    t_torch = [Measured(2.0, 0.02), Measured(8.0, 0.05), Measured(30.0, 0.01)]
    t_kernel = [Measured(1.25, 0.03), Measured(4.0, 0.04), Measured(60.0, 0.02)]
    for shape, a, b in zip(("64x64", "256x256", "1024x1024"), t_torch, t_kernel):
        timed.add(shape, "softmax", a, b, a / b)
    timed.add_headline("softmax forward", "torch", t_torch[0] / t_kernel[0], "64x64")
    return [_table_with_figure("fake bench table", "held"), timed,
            Table(title="second fake bench table", columns=["x"], rows=[[1]])]


def _ok_task(quick=False, seed=0):
    return [_table_with_figure(f"fake arena table seed={seed} quick={quick}", "partly")]


def _broken(quick=False, seed=0):
    raise RuntimeError("boom in fake task")


def _unfinished(quick=False, seed=0):
    raise NotImplementedError("the subject is being written")


def install(monkeypatch):
    """Register fake suites ``fakebench`` (ok) and ``ghostbench`` (no module), and fake tasks
    ``fakeok``, ``fakebroken``, ``fakeunfinished`` and ``ghosttask`` (no module); return their names."""
    from softmaxkit import arena, bench

    modules = {
        "softmaxkit.bench.fakebench": {"run": _ok_suite},
        "softmaxkit.arena.fakeok": {"run": _ok_task, "CLAIM": "fake claim tested"},
        "softmaxkit.arena.fakebroken": {"run": _broken, "CLAIM": "broken claim"},
        "softmaxkit.arena.fakeunfinished": {"run": _unfinished},
    }
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        for key, value in attrs.items():
            setattr(module, key, value)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(bench, "SUITES", {"fakebench": "a fake suite", "ghostbench": "not written"})
    monkeypatch.setattr(arena, "TASKS", {"fakeok": "ok", "fakebroken": "raises", "fakeunfinished": "todo",
                                         "ghosttask": "not written"})
    return ["fakebench", "ghostbench"], ["fakeok", "fakebroken", "fakeunfinished", "ghosttask"]
