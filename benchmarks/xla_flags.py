"""Per-step cost of vijax steps under XLA:CPU options a user can set (vijax sets none).

    python benchmarks/xla_flags.py                       # every case, results/xla_flags.json
    python benchmarks/xla_flags.py kepler,top_cayley --rounds 3

Each configuration runs in its own process (XLA reads ``XLA_FLAGS`` once, when JAX starts its
CPU backend), the configurations alternating ``--rounds`` times; a process compiles the cases
of ``ab_versions.py`` (``jax.jit`` of ``vj.simulate``, 20000 steps) and reports the fastest of
nine calls of each, per step.  The table keeps each configuration's fastest round and the
number of loops XLA:CPU compiled into one kernel (calls marked ``xla_cpu_small_call`` in the
optimised program).  Configurations:

* ``default``: XLA's defaults;
* ``no_ynn``: ``--xla_cpu_experimental_ynn_fusion_type=`` (no matrix product handed to the
  YNNPACK library);
* ``loop_1MB``: ``--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=1048576``
  (a loop nest accessing up to 1 MB per iteration is compiled into one kernel; 1 kB by
  default).  It cannot be set per program: ``jax.jit(..., compiler_options=...)`` takes no
  map-valued option.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS = {
    "default": "",
    "no_ynn": "--xla_cpu_experimental_ynn_fusion_type=",
    "loop_1MB": "--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=1048576",
}
DEFAULT_CASES = ("kepler", "double_pendulum", "rattle", "galerkin4", "top_exp", "top_cayley",
                 "unicycle_cayley", "ball_cayley", "cvt_dg", "cvt_si_dla", "cvt_lobatto3")


def child(cases):
    """Time ``cases`` in this process; one JSON line per case on stdout."""
    sys.path.insert(0, str(HERE))
    import jax
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    import vijax as vj
    from ab_versions import build

    for case in cases:
        run, n, exe = build(vj, case)
        run()
        times = []
        for _ in range(9):
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
        print(json.dumps(dict(case=case, us_per_step=1e6 * float(np.min(times)) / n,
                              small_calls=exe.as_text().count("xla_cpu_small_call"))),
              flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="?", default=",".join(DEFAULT_CASES))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    cases = args.cases.split(",")
    if args.child:
        return child(cases)
    best = {c: {} for c in CONFIGS}
    for _ in range(args.rounds):
        for name, flags in CONFIGS.items():
            env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + flags)
                       .strip())
            out = subprocess.run([sys.executable, __file__, ",".join(cases), "--child"],
                                 env=env, capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                row = json.loads(line)
                old = best[name].get(row["case"])
                if old is None or row["us_per_step"] < old["us_per_step"]:
                    best[name][row["case"]] = row
    print(f"{'case':18s}" + "".join(f"{c:>22s}" for c in CONFIGS)
          + "   (us/step; loops as one kernel)")
    for case in cases:
        base = best["default"][case]["us_per_step"]
        cells = []
        for c in CONFIGS:
            r = best[c][case]
            ratio = r["us_per_step"] / base
            cells.append(f"{r['us_per_step']:8.3f} {ratio:5.2f}x ({r['small_calls']})")
        print(f"{case:18s}" + "".join(f"{x:>22s}" for x in cells))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / "xla_flags.json"
    path.write_text(json.dumps(dict(configs=CONFIGS, rounds=args.rounds, results=best),
                               indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
