"""Smoke tests: the distributed benchmark on tiny sizes (4 spawned gloo processes) and the
demo as one process; the tables are well formed and their verdict is computed."""

import math
import os
import subprocess
import sys

from softmaxkit._table import VERDICTS
from softmaxkit.bench import SUITES
from softmaxkit.bench import distributed as bench

TINY = {"b": 1, "h": 4, "hkv": 2, "length": 64, "d": 8, "block": (8, 16), "repeats": 1}


def test_bench_distributed_on_tiny_sizes():
    assert "distributed" in SUITES
    measured, modelled = bench.run(config=TINY)
    assert measured.status in VERDICTS and measured.verdict and measured.claim
    assert [row[0] for row in measured.rows] == ["1 process (sk.attention)", 1, 2, 4]
    for row in measured.rows[1:]:
        p, sent_mib, formula_mib, err = row[0], row[5], row[6], row[8]
        assert math.isclose(sent_mib, formula_mib), row  # counted bytes = the documented formula
        assert (sent_mib > 0) == (p > 1)
        assert err < 1e-5
        assert row[2] > 0 and math.isfinite(row[3])
    assert "MODELLED" in modelled.title and [row[0] for row in modelled.rows] == [8, 16, 32, 64]
    assert all(row[4] > 0 and row[6] > 0 for row in modelled.rows)


def test_expected_bytes_formula():
    cfg = {"b": 2, "hkv": 3, "length": 16, "d": 5}
    assert bench.expected_bytes(1, cfg) == 0
    kv = 2 * 8 * 2 * 3 * 5  # K and V of one block of n = 8 tokens
    assert bench.expected_bytes(2, cfg, elem=2) == kv * 2 * 2 + 2 * kv * 4


def test_demo_runs_as_one_process():
    env = {**os.environ, "MASTER_PORT": str(bench._free_port()), "OMP_NUM_THREADS": "1"}
    env.pop("RANK", None)
    proc = subprocess.run([sys.executable, "-m", "softmaxkit.distributed.demo", "--length", "32", "--dim", "8",
                           "--tokens", "64", "--vocab", "50", "--repeats", "1", "--dtype", "float64",
                           "--no-llama"],
                          check=False, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "1 process(es), backend gloo" in out
    for name in ("softmax", "softpick", "adaptive_softmax", "sparsemax", "sparse_softmax"):
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        out_err, grad_err = (float(x) for x in line.split()[-4:-2])
        assert out_err < 1e-10 and grad_err < 1e-10, line
    assert "max |loss, grad - one process|" in out  # the tiny Llama runs context-parallel in test_multiprocess
