"""Measured orders of the constrained Galerkin VIs next to Tables 1-2 of Wenger,
Ober-Blöbaum & Leyendecker (2017).

For every gray-shaded cell with s <= 4, runs the paper-mode integrator on the Cartesian
pendulum (our defaults m = l = 1, theta0 = 1, thetadot0 = 0.5, T = 1; the paper gives none)
and on the same pendulum with a nonlinear spring (under uniform gravity several schemes give
identical trajectories; the spring tells them apart), and prints ord(q) / ord(p) / ord(lam)
raw, and ord(P p) / ord(lam (70)) after post-processing.  The harness (references, error
norms, step sizes) is the test suite's (tests/test_galerkin.py), so the table is exactly what
the tests assert.

    python examples/galerkin_orders.py            # writes out/galerkin_orders.md
"""

import os
import sys
import warnings

import jax

jax.config.update("jax_enable_x64", True)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import numpy as np  # noqa: E402
from test_galerkin import TABLE1, TABLE2, _step_sizes, errors_for  # noqa: E402

import vijax as vj  # noqa: E402


def orders(hs, e):
    out = []
    for col in (0, 3, 4, 1, 2):
        if col == 4 and np.all(e[1:, 4] >= 0.7 * e[:-1, 4]):
            out.append("d")
            continue
        out.append(f"{vj.diagnostics.estimate_order(hs, e[:, col]).order:.2f}")
    return out


def main():
    lines = ["| L quad | s | w | ordL | paper q/p/λ | gravity: q / p / λ (raw) | P p / λ(70) | "
             "spring: q / p / λ (raw) | P p / λ(70) |", "|---|---|---|---|---|---|---|---|---|"]
    for quad, table in (("Gauss", TABLE1), ("Lobatto", TABLE2)):
        for (s, ordL), row in sorted(table.items()):
            for w, entry in sorted(row.items()):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    integ = vj.GalerkinVI(s, w, quadrature=quad.lower(), ordL=ordL, mode="paper")
                hs = _step_sizes(int(entry.split("/")[0]))
                cells = []
                for k in (0.0, 5.0):
                    o = orders(hs, errors_for(integ, k, hs))
                    cells += [" / ".join(o[:3]), " / ".join(o[3:])]
                line = f"| {quad} | {s} | {w} | {ordL} | {entry} | " + " | ".join(cells) + " |"
                print(line, flush=True)
                lines.append(line)
    os.makedirs("out", exist_ok=True)
    with open(os.path.join("out", "galerkin_orders.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
