"""Convergence of discrete optimal controls at the order of the integrator.

The optimal-control problem: a pendulum (``m = l = 1``, ``g = 9.81``) driven by a torque
``u``, from rest hanging (``θ = 0``) towards ``θ_T = 2`` rad at rest in ``T = 2`` s,

    min_u  ε ∫ u² dt  +  w (|θ(T) − θ_T|² + |ω(T)|²),      ε = 1,  w = 100.

The terminal condition is a *cost* of moderate weight, not a constraint: the optimum (the
pendulum ends near θ = 1.90 rad) is smooth, unique near the solution, and exactly defined by
the discrete problem as well, whose minimiser an unconstrained optimiser finds to round-off.

**Discretisation** (Ober-Blöbaum, Junge & Marsden (2011); Campos, Ober-Blöbaum & Trélat
(2015)): the forced variational integrator's steps are the dynamics, one control per force
node of every step, and the effort is integrated with the method's weights ``b_i``
(:class:`vijax.control.OptimalControl`).  For each method and ``N = 10, 20, 40, 80`` steps the
discrete problem is solved by :func:`vijax.control.solve` (L-BFGS, 300 iterations), each ``N``
warm-started from the coarser solution interpolated to its force nodes; the largest entry of
the gradient at the result is reported (round-off level: the minimiser is found).

**Reference**: the continuous optimum from Pontryagin's principle: ``u = −λ_ω / (2 ε)``,
``λ_θ' = λ_ω g cos θ``, ``λ_ω' = −λ_θ`` with ``λ(T) = 2 w (x(T) − x_T)``, solved by shooting
on ``λ(0)`` with DOP853 at tolerance 1e-13 (no discretisation of our own enters the
reference).  The full run also solves the discrete problem with ``VPRK.gauss(3)`` at
``N = 160`` and reports its distance to this reference, as a cross-check.

**Errors**, against step size ``h = T / N``, with log-log slopes fitted over all ``N``:

* ``control (stage)``: ``max_ki |u_ki − u*(t_k + c_i h)|``, the controls at the force nodes;
* ``control (step mean)``: ``max_k |Σ_i b_i u_ki − (1/h) ∫_step u* dt|``, the impulse per step;
* ``final state``: ``|(θ_N, ω_N) − (θ*(T), ω*(T))|``; ``state (grid)``: the largest error of
  ``(θ_k, ω_k)`` over the grid; ``cost``: ``|J_N − J*|``.

**What is measured** (the full run; the numbers are in the JSON): the final state, the grid
states, the cost and the step means of the control converge at the order of the method (2
for ``gauss(1)``, 4 for ``gauss(2)`` and ``lobatto(3)``).  The controls at the stage nodes of
``gauss(2)`` converge at order 3 only (consecutive slopes 3.10, 3.01, 3.03), while those of
``lobatto(3)`` converge at order 4.  Our reading: the discrete optimality conditions are a
symplectic partitioned Runge--Kutta discretisation of Pontryagin's boundary-value problem
(Campos et al. (2015); for Runge--Kutta methods in general, Hager (2000)), and a stage
control is a function of the *stage* value of the costate, ``u_ki = −Λ_ki / (2 ε)``.  A
Runge--Kutta method computes stage values only to its stage order plus one: Gauss with ``s``
stages has stage order ``s``, hence ``O(h^(s+1))`` stage values (``h²`` for ``s = 1``, which
is also its order; ``h³`` for ``s = 2``).  The full order appears at the grid points and in
the ``b``-weighted combinations the method propagates (the step mean).  For Lobatto
IIIA--IIIB, a plausible reason for the full order at the stages is that the costate of the
momentum, which sets the control, is integrated with the conjugate coefficients (IIIA,
stage order 3), which makes its stage values ``O(h^4)``.  Where Gauss stage controls are
needed at the full order, take the step means, or evaluate the control law at the grid
points from the discrete state and costate (the post-processing Hager (2000) discusses).

Usage::

    python examples/optimal_control_order.py           # gauss(1), gauss(2), lobatto(3); N = 10..80
    python examples/optimal_control_order.py --quick   # gauss(2), N = 10, 20 (smoke test)
    python examples/optimal_control_order.py --out DIR # default out/

Writes ``DIR/optimal_control_order.json`` (per method and ``N``: errors, objective, gradient,
time; the fitted slopes; the reference) and ``DIR/optimal_control_order.png`` (reference and
discrete controls; errors against ``h``), and prints the order table.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from scipy.integrate import solve_ivp
from scipy.optimize import root

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402

T, THETA_T, EFFORT, WEIGHT = 2.0, 2.0, 1.0, 100.0
M, L, G = 1.0, 1.0, 9.81

METHODS = {"gauss(1)": lambda: vj.VPRK.gauss(1), "gauss(2)": lambda: vj.VPRK.gauss(2),
           "lobatto(3)": lambda: vj.VPRK.lobatto(3), "gauss(3)": lambda: vj.VPRK.gauss(3)}
CONFIGS = {
    "full": dict(methods=("gauss(1)", "gauss(2)", "lobatto(3)"), n_list=(10, 20, 40, 80),
                 steps=300, check=("gauss(3)", 160, 400)),
    "quick": dict(methods=("gauss(2)",), n_list=(10, 20), steps=120, check=None),
}
ERRORS = ("control_stage", "control_step_mean", "final_state", "state_grid", "cost")
LABELS = {"control_stage": "stage", "control_step_mean": "step mean", "final_state": "final",
          "state_grid": "grid"}


class TorquePendulum(vj.ForcedSystem, vj.systems.Pendulum):
    """The catalogue's pendulum driven by a torque ``u`` about the pivot."""

    control_dim = 1

    def force(self, t, q, v, u):
        return u


# -- the reference: Pontryagin's boundary-value problem, by shooting ---------------------------
def _pmp_rhs(t, y):
    th, om, lth, lom = y
    u = -lom / (2 * EFFORT * M * L**2)
    return [om, -(G / L) * np.sin(th) + u / (M * L**2), lom * (G / L) * np.cos(th), -lth]


def reference():
    """The continuous optimum: ``(dense solution, u*(t), J*, shooting residual)``."""
    ivp = dict(method="DOP853", rtol=1e-13, atol=1e-13)

    def residual(lam0):
        y = solve_ivp(_pmp_rhs, (0.0, T), [0.0, 0.0, *lam0], **ivp).y[:, -1]
        return [y[2] - 2 * WEIGHT * (y[0] - THETA_T), y[3] - 2 * WEIGHT * y[1]]

    lam0 = root(residual, [0.0, 0.0], method="hybr", tol=1e-14).x
    sol = solve_ivp(_pmp_rhs, (0.0, T), [0.0, 0.0, *lam0], dense_output=True, **ivp)

    def u(t):
        t = np.asarray(t, float)
        return (-sol.sol(t.ravel())[3] / (2 * EFFORT * M * L**2)).reshape(t.shape)

    x, w = _gauss_legendre(T / 400, 400)
    thT, omT = sol.y[0, -1], sol.y[1, -1]
    J = EFFORT * np.sum(w * u(x) ** 2) + WEIGHT * ((thT - THETA_T) ** 2 + omT**2)
    return sol, u, float(J), float(np.max(np.abs(residual(lam0))))


def _gauss_legendre(h, n_steps, points=10):
    """Nodes ``(n_steps, points)`` and weights of a 10-point Gauss rule on every step."""
    x, w = np.polynomial.legendre.leggauss(points)
    x, w = (x + 1) / 2, w / 2
    return h * (np.arange(n_steps)[:, None] + x[None, :]), h * w[None, :]


# -- one discretisation -------------------------------------------------------------------------
def problem_for(method: str, n: int):
    return vj.control.OptimalControl(
        TorquePendulum(m=M, l=L, g=G), METHODS[method](), q0=jnp.zeros(1), v0=jnp.zeros(1),
        q_target=jnp.array([THETA_T]), v_target=jnp.zeros(1), horizon=T, n_steps=n,
        effort=EFFORT, terminal_weight=WEIGHT)


def stage_times(problem):
    c = np.asarray(problem.integrator.force_nodes())
    return problem.dt * (np.arange(problem.n_steps)[:, None] + c[None, :])


@eqx.filter_jit
def _finish(problem, params):
    """The gradient and the trajectory at the optimum, in one compiled call."""
    return jax.grad(problem.objective)(params)["U"], problem.trajectory(params)


def solve_one(method, n, steps, ref_sol, u_ref, J_ref, warm=None):
    problem = problem_for(method, n)
    t_nodes = stage_times(problem)
    guess = None
    if warm is not None:  # the coarser optimum, interpolated (piecewise linear) to our nodes
        t_prev, u_prev = warm
        guess = np.interp(t_nodes.ravel(), t_prev.ravel(), u_prev.ravel()).reshape(
            problem.controls_shape())
    t0 = time.perf_counter()
    params, history = vj.control.solve(problem, problem.initial_guess(
        None if guess is None else jnp.asarray(guess)), steps=steps)
    grad, sol = _finish(problem, params)
    wall = time.perf_counter() - t0
    U = np.asarray(params["U"])[..., 0]
    b = np.asarray(problem.integrator.force_weights())
    h = problem.dt
    xg, wg = _gauss_legendre(h, n)
    mean_ref = np.sum(wg * u_ref(xg), axis=1) / h
    t_grid = np.asarray(sol.t)
    exact = ref_sol.sol(t_grid)[:2].T
    state = np.concatenate([np.asarray(sol.q), np.asarray(sol.v)], axis=1)
    theta_N, omega_N = float(sol.q[-1, 0]), float(sol.v[-1, 0])
    J = EFFORT * h * float(np.sum(b[None, :] * U**2)) + WEIGHT * ((theta_N - THETA_T) ** 2
                                                                  + omega_N**2)
    errors = {
        "control_stage": float(np.max(np.abs(U - u_ref(t_nodes)))),
        "control_step_mean": float(np.max(np.abs(U @ b - mean_ref))),
        "final_state": float(np.linalg.norm(state[-1] - exact[-1])),
        "state_grid": float(np.max(np.abs(state - exact))),
        "cost": abs(J - J_ref),
    }
    record = {"method": method, "integrator": problem.integrator.name, "N": n, "h": h,
              "objective": J, "objective_history_last": float(history[-1]),
              "objective_history_first": float(history[0]),
              "gradient_max_abs": float(jnp.max(jnp.abs(grad))),
              "errors": errors, "theta_final": theta_N, "omega_final": omega_N,
              "wall_time_s": wall}
    return record, (t_nodes, U)


def slopes(h, e):
    """Least-squares slope of ``log e`` against ``log h`` and the consecutive slopes."""
    lh, le = np.log(np.asarray(h)), np.log(np.asarray(e))
    fit = float(np.polyfit(lh, le, 1)[0]) if len(h) > 1 else float("nan")
    return fit, (np.diff(le) / np.diff(lh)).tolist()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="gauss(2), N = 10, 20 (smoke test)")
    parser.add_argument("--out", default="out", help="output folder (default out/)")
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "full"
    cfg = CONFIGS[mode]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    ref_sol, u_ref, J_ref, shooting_residual = reference()
    runs, table, controls = [], {}, {}
    for method in cfg["methods"]:
        warm = None
        for n in cfg["n_list"]:
            record, warm = solve_one(method, n, cfg["steps"], ref_sol, u_ref, J_ref, warm)
            runs.append(record)
            controls[(method, n)] = warm
            e = record["errors"]
            print(f"{method:>10} N={n:<4} control(stage) {e['control_stage']:.3e}  "
                  f"control(mean) {e['control_step_mean']:.3e}  final state "
                  f"{e['final_state']:.3e}  |grad| {record['gradient_max_abs']:.1e}  "
                  f"({record['wall_time_s']:.1f} s)", flush=True)
        rs = [r for r in runs if r["method"] == method]
        table[method] = {"N": [r["N"] for r in rs], "h": [r["h"] for r in rs],
                         "errors": {k: [r["errors"][k] for r in rs] for k in ERRORS},
                         "slopes": {}, "consecutive_slopes": {}}
        for k in ERRORS:
            fit, consecutive = slopes(table[method]["h"], table[method]["errors"][k])
            table[method]["slopes"][k] = fit
            table[method]["consecutive_slopes"][k] = consecutive

    check = None
    if cfg["check"] is not None:  # a fine discrete optimum against the continuous reference
        method, n, steps = cfg["check"]
        coarse = [(m, k) for (m, k) in controls if m == "gauss(2)"]
        warm = controls[max(coarse, key=lambda mk: mk[1])] if coarse else None
        record, _ = solve_one(method, n, steps, ref_sol, u_ref, J_ref, warm)
        check = record
        print(f"check: {method} N={n}: control(stage) {record['errors']['control_stage']:.2e}, "
              f"final state {record['errors']['final_state']:.2e}, "
              f"|grad| {record['gradient_max_abs']:.1e}")
    wall = time.perf_counter() - start

    result = {
        "mode": mode,
        "problem": {"system": "pendulum, m = l = 1, g = 9.81, torque control", "horizon_s": T,
                    "theta0": 0.0, "theta_target": THETA_T, "effort": EFFORT,
                    "terminal_weight": WEIGHT},
        "reference": {"method": "Pontryagin BVP by shooting, DOP853 rtol = atol = 1e-13",
                      "shooting_residual": shooting_residual, "cost": J_ref,
                      "theta_final": float(ref_sol.y[0, -1]),
                      "omega_final": float(ref_sol.y[1, -1])},
        "lbfgs_iterations": cfg["steps"],
        "table": table, "runs": runs, "discrete_reference_check": check,
        "wall_time_s": wall,
    }
    (out / "optimal_control_order.json").write_text(json.dumps(result, indent=1))

    print(f"\nreference: J* = {J_ref:.12f}, θ(T) = {ref_sol.y[0, -1]:.10f}, "
          f"ω(T) = {ref_sol.y[1, -1]:.3e} (shooting residual {shooting_residual:.1e})")
    print(f"{'method':>10} {'error':>18}   slope  (consecutive)")
    for method, row in table.items():
        for k in ERRORS:
            cons = ", ".join(f"{s:.2f}" for s in row["consecutive_slopes"][k])
            print(f"{method:>10} {k:>18}   {row['slopes'][k]:5.2f}  ({cons})")
    print(f"N = {list(cfg['n_list'])}; {wall:.1f} s")
    _plot(out / "optimal_control_order.png", u_ref, table, controls, cfg)
    print(f"wrote {out / 'optimal_control_order.json'} and {out / 'optimal_control_order.png'}")
    return result


def _plot(path, u_ref, table, controls, cfg) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    ax = axes[0]
    t = np.linspace(0.0, T, 400)
    ax.plot(t, u_ref(t), "k", lw=1, label="continuous optimum (PMP)")
    n0 = cfg["n_list"][0]
    for i, method in enumerate(cfg["methods"]):
        tn, U = controls[(method, n0)]
        ax.plot(tn.ravel(), U.ravel(), "o", ms=3, color=f"C{i}", label=f"{method}, N = {n0}")
    ax.set_xlabel("t (s)")
    ax.set_ylabel("torque u (N m)")
    ax.legend(fontsize=8)
    for ax, keys, title in ((axes[1], ("control_stage", "control_step_mean"), "controls"),
                            (axes[2], ("final_state", "state_grid"), "states")):
        for i, (method, row) in enumerate(table.items()):
            for key, style in zip(keys, ("o-", "s--")):
                ax.loglog(row["h"], row["errors"][key], style, ms=4, color=f"C{i}",
                          label=f"{method} {LABELS[key]} "
                                f"({row['slopes'][key]:.2f})")
        h = table[cfg["methods"][0]]["h"]
        ax.set_xticks(h, [f"{x:g}" for x in h])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("step h (s)")
        ax.set_ylabel("max error")
        ax.set_title(f"{title} (fitted slope)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
