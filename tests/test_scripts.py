"""The scripts users run, end to end: each example that no other test runs, and each peer
benchmark in its quick form, run as a user runs it (``python <script>`` in a fresh process from
the repository root).  Each must exit with status 0 and write its results.

The numbers they print are not checked here -- the examples' claims are checked by the tests of
the properties they show, and benchmarks measure speed, which tests do not assert -- but a
script that no longer runs against the library (a renamed argument, a solver setting the library
now refuses) fails here instead of in a user's hands: a benchmark's profiling solver built with
``max_steps=0`` ran until solver settings began to be checked, and then failed on first use.

All of them are marked ``slow`` (``make test-extended`` and CI run them): 9 minutes of scripts,
5 minutes of wall time on two workers (AMD EPYC, 2 cores).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

# script -> its arguments ("{out}": a fresh folder for its results), the files it must write
# (globs, under that folder, else under the repository's out/)
SCRIPTS = {
    "examples/demo.py": ([], ["demo_summary.md"]),
    "examples/continuous_time_pendulum.py": ([], ["continuous_time_summary.md"]),
    "examples/galerkin_orders.py": ([], ["galerkin_orders.md"]),
    "examples/lie_group_figures.py": (["--quick", "--out", "{out}"], ["*"]),
    "examples/nonholonomic_orders.py": ([], []),
    "examples/rotating_hoop.py": ([], ["rotating_hoop_summary.md"]),
    "benchmarks/run.py": (["--quick", "--out", "{out}"], ["*.json"]),
    "benchmarks/adjoints.py": (["--quick", "--out", "{out}"], ["*.json"]),
    "benchmarks/constrained.py": (["--quick", "--out", "{out}"], ["*.json"]),
    "benchmarks/ensemble.py": (["--quick", "--out", "{out}"], ["*.json"]),
    "benchmarks/lie_groups.py": (["--quick", "--out", "{out}"], ["*.json"]),
    "benchmarks/nonholonomic.py": (["--quick", "--out", "{out}"], ["*.json"]),
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_script_runs(script, tmp_path):
    args, outputs = SCRIPTS[script]
    out_dir = tmp_path if "{out}" in args else ROOT / "out"
    argv = [a.replace("{out}", str(tmp_path)) for a in args]
    # (with the suite's XLA flags, tests/conftest.py: the same programs, compiled faster)
    run = subprocess.run([sys.executable, str(ROOT / script), *argv], cwd=ROOT,
                         capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, (script, run.stdout[-3000:], run.stderr[-5000:])
    for pattern in outputs:
        assert list(out_dir.glob(pattern)), (script, pattern, sorted(os.listdir(out_dir)))
