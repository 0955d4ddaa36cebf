"""Recover the parameters of a damped, chaotic double pendulum from noisy angle observations.

The unknowns are the mass ``m2`` and length ``l2`` of the outer arm, gravity ``g`` and a joint
damping coefficient ``c`` (viscous dampers at both joints, Rayleigh dissipation
``R = c/2 (w1² + w2²)`` with ``w1``, ``w2`` the joint rates); the inner arm (``m1 = l1 = 1``)
is known, and fixes the units: scaling every mass and ``c`` by the same factor leaves the motion
unchanged.  Steps:

1. **Observations.**  ``K`` experiments, each releasing the pendulum from rest at angles of
   about ±2 rad (a chaotic regime: at the true parameters the largest Lyapunov exponent is
   about 1/s, so a perturbation of the initial state grows about 35-fold in 3 s and 10⁴-fold in
   9 s).  The truth is integrated with ``VPRK.gauss(4)`` at a tenth of the observation step,
   the two angles are observed every ``dt = 0.025 s`` over a horizon ``T`` and Gaussian noise of
   standard deviation σ = 0.02 rad is added.
2. **Model and loss.**  The model integrates with ``VPRK.gauss(2)`` at the observation step
   itself (a different method and step from the truth).  Its error must stay far below the
   noise, or it biases the fit: at 0.025 s it stays below 4e-4 rad over 3 s, and a fit to the
   noiseless truth moves no unknown by more than 0.02 σ from the true values; at 0.05 s it
   reaches 0.1 rad in the fastest experiments (whatever the stage solver: the step is outside
   the method's asymptotic regime there) and biases release angles by up to 3 σ.  Unknowns:
   the logarithms of the four physical parameters (positivity) and, per experiment, the
   release angles (nuisance parameters, started from the first noisy observation; the release
   velocity is zero).  The loss is the mean squared angle residual.
3. **Why short horizons and several experiments.**  In a chaotic system the loss over a horizon
   ``T`` varies on parameter scales shrinking like ``exp(-λT)``: over a long window it is a
   landscape of narrow local minima, which no local optimiser crosses.  So each experiment is
   short (3 s, three Lyapunov times: informative, still smooth enough), and information comes
   from several independent experiments rather than from one long record.  Adam works by
   *continuation in the horizon*: it fits the first 0.5 s, then the horizon grows in stages to
   ``T``, each stage starting from the previous stage's optimum, which lies inside the next
   stage's basin.  Measured with 4 experiments from the initial guess below: at T = 3 s Adam
   on the whole horizon converges as well (4 seeds of 4); at T = 4 s it stalls in a local
   minimum 500 times the noise variance for one seed of 3, where the continuation converges;
   at T = 5 s both fail for one seed of 2.  The continuation costs nothing (the same iterations)
   and is kept as a margin.  (Multiple shooting, with each window's unobserved initial
   velocities as extra unknowns, is the way to use long records.)
4. **One compiled function.**  The residuals and their Jacobian with respect to all unknowns
   come from one ``jax.jit``-compiled function: forward mode (``jax.jacfwd``), whose cost is one
   tangent per unknown (4 + 2K of them, fewer than the residuals, so cheaper than reverse mode
   for the Jacobian, and it compiles faster).  The loss gradient is ``Jᵀ r``; vijax
   differentiates its implicit stage solves by the implicit function theorem.  The same
   function drives the optax Adam iterations, a Gauss-Newton polish at the full horizon and the
   uncertainty estimate.  (``optax.lbfgs`` started from Adam's result comes within 0.2 σ of the
   same optimum in 60 iterations, where Gauss-Newton needs a few steps; and its line search
   differentiates the loss in reverse mode inside a loop, a second compiled program that takes
   longer to compile than the whole quick run.  A least-squares problem whose Jacobian is at
   hand is better served by Gauss-Newton.)
5. **Uncertainty (Laplace / Gauss-Newton).**  At the optimum, ``Σ = s² (JᵀJ)⁻¹`` with
   ``s² = |r|² / (N - P)`` the residual variance (N residuals, P unknowns); the block of the
   physical parameters marginalises over the release angles.  It is a covariance of the
   log-parameters: the table gives ``exp(log p̂) ± p̂ σ_log`` and the z-score
   ``(log p̂ - log p_true) / σ_log``.

Usage::

    python examples/fit_parameters.py            # 4 experiments of 3 s (under a minute, 2 cores)
    python examples/fit_parameters.py --quick    # 1 experiment of 2 s (the smoke test)
    python examples/fit_parameters.py --out DIR  # default out/

Writes ``DIR/fit_parameters.json`` (true, initial, recovered, sigma and z per parameter, the
loss history, wall time) and ``DIR/fit_parameters.png`` (loss history; observed, initial-guess
and fitted angles), and prints the table.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402


class DampedDoublePendulum(vj.ForcedSystem, vj.systems.DoublePendulum):
    """The catalogue's double pendulum (absolute angles) with viscous joint damping."""

    c: float = 0.05

    def force(self, t, q, v, u):
        w1, w2 = v[0], v[1] - v[0]  # shoulder and elbow rates
        # F = -dR/dv with R = c/2 (w1² + w2²), w1 = v1, w2 = v2 - v1
        return -self.c * jnp.stack([w1 - w2, w2])


NAMES = ("m2", "l2", "g", "c")
TRUE = {"m2": 0.8, "l2": 1.2, "g": 9.81, "c": 0.05}
INITIAL = {"m2": 1.0, "l2": 1.0, "g": 9.0, "c": 0.1}  # round nominal values: 8 % to 100 % off
SIGMA = 0.02        # observation noise, rad
DT = 0.025          # observation step = model step, s
TRUTH_SUBSTEPS = 10  # the truth's step is DT / 10
Q0_SCALE = 0.1      # the release-angle unknowns are offsets in units of 0.1 rad (Adam's scale)

CONFIGS = {
    # experiments, horizon (s), Adam stages (horizon, iterations), Adam learning rate
    "full": dict(experiments=4, horizon=3.0,
                 stages=((0.5, 150), (1.0, 150), (1.5, 150), (2.0, 150), (3.0, 200)), lr=0.03),
    "quick": dict(experiments=1, horizon=2.0,
                  stages=((0.5, 120), (1.0, 120), (2.0, 160)), lr=0.03),
}


def make_system(log_params):
    return DampedDoublePendulum(**{k: jnp.exp(log_params[i]) for i, k in enumerate(NAMES)})


def observe(rng, n_experiments: int, horizon: float):
    """Release angles, noiseless truth and noisy observations, each ``(K, n_obs + 1, 2)``."""
    n_obs = int(round(horizon / DT))
    angles = rng.uniform(1.7, 2.3, (n_experiments, 2)) * rng.choice([-1.0, 1.0], (n_experiments, 2))
    truth = DampedDoublePendulum(**TRUE)
    exact = []
    for q0 in angles:  # one compiled run, reused for every experiment
        sol = vj.simulate(truth, vj.VPRK.gauss(4), q0=jnp.asarray(q0), v0=jnp.zeros(2),
                          dt=DT / TRUTH_SUBSTEPS, n_steps=TRUTH_SUBSTEPS * n_obs,
                          save_every=TRUTH_SUBSTEPS)
        exact.append(np.asarray(sol.q))
    exact = np.stack(exact)
    return angles, exact, exact + SIGMA * rng.standard_normal(exact.shape)


def build(observed):
    """The compiled ``evaluate(x, w) -> (loss, grad, r, J)`` of the model against ``observed``."""
    n_exp, n_saves, _ = observed.shape
    y = jnp.asarray(observed)

    def trajectories(x):
        system = make_system(x[:4])
        q0s = y[:, 0, :] + Q0_SCALE * x[4:].reshape(n_exp, 2)
        run = lambda q0: vj.simulate(system, vj.VPRK.gauss(2), q0=q0,  # noqa: E731
                                     v0=jnp.zeros(2, q0.dtype), dt=DT, n_steps=n_saves - 1).q
        return jax.vmap(run)(q0s)

    def residuals(x):
        r = (trajectories(x) - y).ravel()
        return r, r

    @jax.jit
    def evaluate(x, w):
        """Loss (mean squared residual, weights ``w``), its gradient, the residuals and their
        Jacobian: the whole model in one compiled call."""
        jac, r = jax.jacfwd(residuals, has_aux=True)(x)
        loss = jnp.sum(w * r**2) / jnp.sum(w)
        return loss, jac.T @ (w * r) * (2.0 / jnp.sum(w)), r, jac

    return evaluate


def fit(evaluate, x0, stages, lr, n_exp, n_saves):
    """Adam with a growing horizon, then Gauss-Newton at the full horizon."""
    t_obs = np.arange(n_saves) * DT
    schedule = optax.cosine_decay_schedule(lr, sum(n for _, n in stages), alpha=0.1)
    opt = optax.adam(schedule)

    @jax.jit
    def update(grad, state, x):
        step, state = opt.update(grad, state, x)
        return optax.apply_updates(x, step), state

    x, state = x0, opt.init(x0)
    full = jnp.ones(2 * n_exp * n_saves)
    history, staged, stage_ends = [], [], []
    for horizon, n_iter in stages:
        w = jnp.asarray(np.repeat(np.tile((t_obs <= horizon + 1e-9).astype(float), n_exp), 2))
        for _ in range(n_iter):
            loss, g, r, _ = evaluate(x, w)
            staged.append(float(loss))              # the loss minimised: the stage's horizon
            history.append(float(jnp.mean(r**2)))  # the loss over the full horizon
            x, state = update(g, state, x)
        stage_ends.append(len(history))
    # Gauss-Newton at the full horizon, halving the step until the loss decreases
    loss, _, r, jac = map(np.asarray, evaluate(x, full))
    for _ in range(8):
        history.append(float(loss))
        staged.append(float(loss))
        step = np.linalg.lstsq(jac, -r, rcond=None)[0]
        for _ in range(10):
            loss_new, _, r_new, jac_new = map(np.asarray, evaluate(x + step, full))
            if loss_new <= loss:
                break
            step = step / 2
        else:
            break
        x, loss, r, jac = x + step, loss_new, r_new, jac_new
        if np.max(np.abs(step[:4])) < 1e-10:
            break
    history.append(float(loss))
    staged.append(float(loss))
    return x, r, jac, history, staged, stage_ends


def laplace(r, jac):
    """Gauss-Newton (Laplace) covariance of all unknowns, with the noise variance from r."""
    n, p = jac.shape
    s2 = float(r @ r) / (n - p)
    return s2 * np.linalg.inv(jac.T @ jac), s2


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 short experiment (smoke test)")
    parser.add_argument("--out", default="out", help="output folder (default out/)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    cfg = CONFIGS["quick" if args.quick else "full"]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    rng = np.random.default_rng(args.seed)
    angles, exact, observed = observe(rng, cfg["experiments"], cfg["horizon"])
    n_exp, n_saves, _ = observed.shape
    evaluate = build(observed)
    log_true = np.log([TRUE[k] for k in NAMES])
    x0 = jnp.asarray(np.concatenate([np.log([INITIAL[k] for k in NAMES]), np.zeros(2 * n_exp)]))

    r0 = evaluate(x0, jnp.ones(observed.size))[2]  # the initial guess's residuals
    x, r, jac, history, staged, stage_ends = fit(evaluate, x0, cfg["stages"], cfg["lr"],
                                                 n_exp, n_saves)
    cov, s2 = laplace(r, jac)
    x = np.asarray(x)
    sd_log = np.sqrt(np.diag(cov))
    z = (x[:4] - log_true) / sd_log[:4]
    recovered = np.exp(x[:4])
    wall = time.perf_counter() - start

    q0_fit = np.asarray(observed[:, 0, :] + Q0_SCALE * x[4:].reshape(n_exp, 2))
    z_angles = (q0_fit - angles).ravel() / (Q0_SCALE * sd_log[4:])
    result = {
        "mode": "quick" if args.quick else "full",
        "experiments": n_exp, "horizon_s": cfg["horizon"], "observation_step_s": DT,
        "observations": int(r.size), "unknowns": int(x.size), "noise_sigma": SIGMA,
        "noise_sigma_estimated": float(np.sqrt(s2)),
        "parameters": list(NAMES),
        "true": dict(TRUE), "initial": dict(INITIAL),
        "recovered": {k: float(v) for k, v in zip(NAMES, recovered)},
        "sigma": {k: float(v) for k, v in zip(NAMES, recovered * sd_log[:4])},
        "sigma_log": {k: float(v) for k, v in zip(NAMES, sd_log[:4])},
        "z": {k: float(v) for k, v in zip(NAMES, z)},
        "z_release_angles": z_angles.tolist(),
        "loss_initial": history[0], "loss_final": history[-1],
        "loss_history": history, "loss_history_length": len(history),
        "loss_history_stage_horizon": staged,
        "adam_stages": [list(s) for s in cfg["stages"]],
        "wall_time_s": wall,
    }
    (out / "fit_parameters.json").write_text(json.dumps(result, indent=1))

    print(f"{n_exp} experiment(s) of {cfg['horizon']} s, {r.size} observed angles, "
          f"noise {SIGMA} rad (estimated {np.sqrt(s2):.4f}); {len(history)} loss evaluations, "
          f"loss {history[0]:.3g} -> {history[-1]:.3g} rad²; {wall:.1f} s")
    print(f"{'':>4} {'true':>8} {'initial':>8} {'recovered ± 1σ':>22} {'z':>6}")
    for i, k in enumerate(NAMES):
        print(f"{k:>4} {TRUE[k]:8.4f} {INITIAL[k]:8.4f} {recovered[i]:12.5f} ± "
              f"{recovered[i] * sd_log[i]:<8.5f} {z[i]:6.2f}")
    print(f"release angles: max |z| = {np.max(np.abs(z_angles)):.2f} over {z_angles.size}")

    _plot(out / "fit_parameters.png", history, staged, stage_ends, observed,
          observed + np.asarray(r0).reshape(observed.shape), observed + r.reshape(observed.shape))
    print(f"wrote {out / 'fit_parameters.json'} and {out / 'fit_parameters.png'}")
    return result


def _plot(path, history, staged, stage_ends, observed, initial, fitted) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.arange(observed.shape[1]) * DT
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    ax = axes[0]
    ax.semilogy(history, lw=1, label="full horizon")
    ax.semilogy(staged, lw=1, label="stage's horizon (minimised)")
    for e in stage_ends[:-1]:
        ax.axvline(e, color="0.8", lw=0.8)
    ax.axvline(stage_ends[-1], color="C3", lw=0.8, ls="--", label="Gauss-Newton from here")
    ax.axhline(SIGMA**2, color="0.5", ls=":", label="noise variance σ²")
    ax.set_xlabel("iteration (grey: horizon grows)")
    ax.set_ylabel("mean squared residual (rad²)")
    ax.legend(fontsize=8)
    for j, ax in enumerate(axes[1:]):
        ax.plot(t, observed[0, :, j], ".", ms=3, color="k", label="observed")
        ax.plot(t, initial[0, :, j], "--", lw=1, color="0.6", label="initial guess")
        ax.plot(t, fitted[0, :, j], lw=1.2, color="C1", label="fitted")
        ax.set_xlabel("t (s)")
        ax.set_ylabel(f"θ{j + 1} (rad), experiment 1")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
