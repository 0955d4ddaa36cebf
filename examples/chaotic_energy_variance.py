"""The chaotic energy-variance study of Martín de Diego & Sato Martín de Almagro (2022), §7.3
(their Fig. 6): an ensemble of initial conditions on the energy sheet E0 = 3.06 of the fully
chaotic nonholonomic system of McLachlan & Perlmutter (2006) (n = 7), integrated with the
nonholonomic Lobatto IIIA-IIIB methods, and the mean squared energy error over the ensemble

    μ(E, k) = mean_j (E_jk - E0)²          (their eq. (33); vj.diagnostics.energy_variance)

at every step. Over this short horizon μ is dominated by a bounded O(h^(2·order)) oscillation of
the energy error; the random walk underneath (μ ∝ t) shows over thousands of time units or once
the oscillation is averaged out (docs/nonholonomic.md, "The random walk"). Scaled by
h^(2·order) the curves of two step sizes collapse: μ/h⁴ for Lobatto-2, μ/h⁸ for Lobatto-3 (the
paper's caption prints h¹⁰; h⁸ = h^(2·order) is what the data give, see docs/nonholonomic.md).

    python examples/chaotic_energy_variance.py                  # 10⁴ members on the CPU
    python examples/chaotic_energy_variance.py --members 1000000 --batch-size 65536   # a GPU

The ensemble is one `vj.simulate_ensemble` call per (method, h): `vmap` over the members,
chunked by `--batch-size`; nothing else changes between 10⁴ members on a CPU and 10⁶ on an
accelerator. Writes out/chaotic_energy_variance.{json,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import vijax as vj  # noqa: E402

E0 = 3.06


def study(members: int, t_end: float, batch_size: int | None, seed: int = 0) -> dict:
    system = vj.systems.ChaoticNonholonomic()
    q0, v0 = system.sample_energy_sheet(jax.random.PRNGKey(seed), members, energy=E0)
    runs = {}
    for s, hs in ((2, (0.1, 0.05)), (3, (0.2, 0.1))):
        integ = vj.NonholonomicVPRK.lobatto(s)
        for h in hs:
            n = int(round(t_end / h))
            # save about every half time unit (a divisor of the step count)
            every = max(d for d in range(1, n + 1) if n % d == 0 and d * h <= 0.5 + 1e-9)
            start = time.perf_counter()
            ens = vj.simulate_ensemble(system, integ, q0=q0, v0=v0, dt=h, n_steps=n,
                                       save_every=every, batch_size=batch_size)
            mu = vj.diagnostics.energy_variance(system, ens, reference=E0)
            mu = np.asarray(jax.block_until_ready(mu))
            seconds = time.perf_counter() - start
            runs[f"lobatto{s}_h{h}"] = dict(
                s=s, order=integ.order, h=h, t=np.asarray(ens.t[0]).tolist(), mu=mu.tolist(),
                scaled=(mu / h ** (2 * integ.order)).tolist(), seconds=seconds,
                member_steps_per_second=members * n / seconds)
            print(f"Lobatto-{s}, h = {h}: μ(E, end) = {mu[-1]:.3e}, "
                  f"μ/h^{2 * integ.order} = {mu[-1] / h ** (2 * integ.order):.4g}, "
                  f"{members * n / seconds:.3g} member-steps/s (incl. compilation)")
    return runs


def collapse(runs: dict) -> dict:
    """Ratio of the scaled curves of the two step sizes at the final time (1 = collapse)."""
    out = {}
    for s in (2, 3):
        a, b = (v for v in runs.values() if v["s"] == s)
        out[f"lobatto{s}"] = a["scaled"][-1] / b["scaled"][-1]
    return out


def plot(runs: dict, path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, s in zip(axes, (2, 3)):
        for v in runs.values():
            if v["s"] == s:
                ax.plot(v["t"][1:], v["scaled"][1:], label=f"h = {v['h']}")
        ax.set_xlabel("t")
        ax.set_ylabel(f"μ(E, k) / h^{2 * (2 * s - 2)}")
        ax.set_title(f"Lobatto-{s} (order {2 * s - 2})")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--t-end", type=float, default=10.0)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--out", default="out")
    args = parser.parse_args(argv)
    runs = study(args.members, args.t_end, args.batch_size)
    ratios = collapse(runs)
    print("scaled-curve ratio of the two step sizes at the final time (1 = collapse):",
          {k: round(v, 3) for k, v in ratios.items()})
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = dict(members=args.members, t_end=args.t_end, energy=E0, runs=runs,
                  collapse_ratio=ratios, device=str(jax.devices()[0]),
                  command="python examples/chaotic_energy_variance.py " + " ".join(
                      argv if argv is not None else sys.argv[1:]))
    (out / "chaotic_energy_variance.json").write_text(json.dumps(result, indent=1))
    plot(runs, out / "chaotic_energy_variance.png")
    return result


if __name__ == "__main__":
    main()
