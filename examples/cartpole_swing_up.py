"""Swing-up by discrete mechanics and optimal control (DMOC): a cart-pole, and a constrained
pendulum in Cartesian coordinates.

The optimal-control problem is discretised as in Ober-Blöbaum, Junge & Marsden (2011): the
forced variational integrator's step equations are the dynamics, one control per force node
of every step (Campos, Ober-Blöbaum & Trélat (2015)), and the cost

    ε Σ_k h Σ_i b_i |u_ki|²  +  w_T (|q_N − q_T|² + |v_N − v_T|²)

with the method's weights ``b_i`` (:class:`vijax.control.OptimalControl`).  The terminal state
enters as a quadratic penalty; :func:`vijax.control.solve` minimises the objective by
L-BFGS (:func:`optax.lbfgs`), differentiating through the implicit stage solves.

``--system cartpole`` (default)
    A cart (mass 1 kg) on a rail carries a pole (a point mass of 0.3 kg at 0.5 m); the control
    is the horizontal force on the cart, the parameters of Kelly (2017).  ``q = (x, θ)``,
    ``θ = 0`` hangs down; from rest hanging, swing the pole upright (``θ = π``) in 2 s with the
    cart back at ``x = 0``, at rest.  ``VPRK.gauss(2)`` (order 4, two controls per step).
``--system cartesian``
    The constrained case: a point mass on a massless rod in Cartesian coordinates
    ``q = (x, y)``, ``|q| = l`` a holonomic constraint (``vijax.systems.CartesianPendulum``),
    driven by a force perpendicular to the rod, ``F = u (−y, x) / l²`` (torque ``u``).  From
    hanging at rest to upright at rest in 3 s with ``HolonomicVPRK.rattle()`` (default; order
    2, controls at both ends of the step) or ``--integrator galerkin`` (``GalerkinVI.gauss(2)``,
    order 4).  The constraint holds to round-off along the optimal trajectory.

How it is solved, and why:

* **Single shooting.**  Over these short horizons (one to two natural periods) single
  shooting converges from a zero (cart-pole) or constant (Cartesian) control.  Multiple
  shooting was measured on the cart-pole (``--segments 5``, the full run's N = 50 and
  iterations): the objective ends at 89 (``w_T = 1e3``) and 122 (``w_T = 1e5``), against
  68 and 70 for single shooting, with defect penalties of 41 left: the segments do not
  join, and the controls, simulated from the initial state, miss the target by 2.2 (the
  upright pole amplifies every gap).  Its segment states, interpolated linearly between the
  initial and the target state, start far from any trajectory (initial objective 1.6e5
  against 9.9e3).  It is meant for long or unstable horizons; here it does not pay.
* **Continuation in the terminal weight.**  A penalty leaves a terminal error of about
  ``λ / (2 w_T)`` (``λ``: the effort's sensitivity to the target), a few 1e-2 at
  ``w_T = 1e3``.  A large weight from the start makes the problem ill-conditioned; so the
  full run solves at ``w_T = 1e3``, then restarts L-BFGS from that optimum at ``w_T = 1e5``
  (terminal error ~1e-3 or less).
* **A capped search direction.**  A step of RATTLE has no solution once the pendulum turns
  by more than about a radian per step (the chord ``h v`` no longer meets the circle), and
  the stage iterations of the other methods fail at large controls too (seen on the
  cart-pole with a backtracking line search).  The first trial of L-BFGS's line
  search (step 1 along the quasi-Newton direction) can ask for such controls: on the Cartesian
  pendulum at N = 30 the 135th direction has max |ΔU| = 29 N m, the trial's stage solve
  does not converge, ``vijax.simulate`` raises inside the objective and the whole
  ``solve`` call fails.  So the search direction is capped (``optax.clip_by_global_norm``,
  2 N or N m RMS per control value) and the step kept at most 1: a trust region that is
  inactive near the optimum (on the cart-pole, N = 40, 300 iterations: objective 73.0,
  against 73.2 with plain L-BFGS).
* **Breaking a symmetry (Cartesian case).**  At rest hanging, every admissible variation of
  the final configuration is horizontal, while the gradient of ``|q_N − q_T|²`` is vertical:
  zero controls are a stationary point of the objective.  The Cartesian run starts from a
  constant torque of 1 N m instead.  (In the angle coordinate of the cart-pole the penalty
  ``(θ_N − π)²`` has a nonzero gradient at rest, and zero controls are a fine start.)

Usage::

    python examples/cartpole_swing_up.py                       # cart-pole, N = 50
    python examples/cartpole_swing_up.py --system cartesian    # constrained pendulum, N = 60
    python examples/cartpole_swing_up.py --quick               # smoke size (N = 20 or 30)
    python examples/cartpole_swing_up.py --out DIR             # default out/

Writes ``DIR/swing_up_<system>.json`` (initial and final objective, cost terms, terminal state
error, constraint residual for the Cartesian case, objective history, wall time) and
``DIR/swing_up_<system>.png`` (controls against time, trajectory, objective history), and
prints a summary.  Every call of :func:`vijax.control.solve` compiles its iteration anew, and
compilation dominates the run time at these sizes (tens of seconds on 2 cores).
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
import optax

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402


class CartPole(vj.ForcedSystem, vj.MechanicalSystem):
    """A cart on a horizontal rail with a pendulum (point mass ``mp`` at distance ``l``).

    ``q = (x, θ)``, ``θ = 0`` hanging down.  The pole's mass sits at
    ``(x + l sin θ, −l cos θ)``, so ``T = ½ (mc + mp) ẋ² + mp l cos θ ẋ θ̇ + ½ mp l² θ̇²`` and
    ``V = −mp g l cos θ``.  The control is the horizontal force on the cart, the generalised
    force ``(u, 0)``."""

    mc: float = 1.0   # cart, kg
    mp: float = 0.3   # pole tip, kg
    l: float = 0.5    # noqa: E741  pole length, m
    g: float = 9.81
    ndim = 2
    control_dim = 1

    def mass_matrix(self, q):
        c = self.mp * self.l * jnp.cos(q[1])
        return jnp.stack([jnp.stack([jnp.full_like(c, self.mc + self.mp), c]),
                          jnp.stack([c, jnp.full_like(c, self.mp * self.l**2)])])

    def potential(self, q):
        return -self.mp * self.g * self.l * jnp.cos(q[1])

    def force(self, t, q, v, u):
        return jnp.stack([u[0], jnp.zeros_like(u[0])])


class ActuatedCartesianPendulum(vj.ForcedSystem, vj.systems.CartesianPendulum):
    """The Cartesian pendulum (``|q| = l``, gravity along ``−y``) driven by the force
    ``u (−y, x) / l²`` perpendicular to the rod: its torque about the pivot is ``u``."""

    control_dim = 1

    def force(self, t, q, v, u):
        return u[0] * jnp.stack([-q[1], q[0]]) / self.l**2


def make_problem(system: str, integrator: str, n_steps: int, segments: int):
    if system == "cartpole":
        sys_ = CartPole()
        integ = vj.VPRK.gauss(2)
        q0, qT, horizon = jnp.zeros(2), jnp.array([0.0, np.pi]), 2.0
    else:
        sys_ = ActuatedCartesianPendulum()
        integ = vj.HolonomicVPRK.rattle() if integrator == "rattle" else vj.GalerkinVI.gauss(2)
        q0, qT, horizon = jnp.array([0.0, -1.0]), jnp.array([0.0, 1.0]), 3.0
    return vj.control.OptimalControl(
        sys_, integ, q0=q0, v0=jnp.zeros(2), q_target=qT, v_target=jnp.zeros(2),
        horizon=horizon, n_steps=n_steps, effort=1.0, terminal_weight=1e3, segments=segments)


CONFIGS = {
    # steps N, stages of (terminal weight, L-BFGS iterations)
    "cartpole": {"full": dict(n_steps=50, stages=((1e3, 1000), (1e5, 500))),
                 "quick": dict(n_steps=20, stages=((1e3, 150),))},
    "cartesian": {"full": dict(n_steps=60, stages=((1e3, 400), (1e5, 300))),
                  "quick": dict(n_steps=30, stages=((1e3, 150),))},
}


def capped_lbfgs(problem, rms: float = 2.0):
    """:func:`optax.lbfgs` (zoom line search, step at most 1) with its search direction capped
    at a global norm of ``rms`` per control value: a trust region for the first trial of each
    line search.  See the module docstring for why."""
    cap = rms * float(np.sqrt(np.prod(problem.controls_shape())))
    return optax.chain(
        optax.scale_by_lbfgs(), optax.clip_by_global_norm(cap), optax.scale(-1.0),
        optax.scale_by_zoom_linesearch(max_linesearch_steps=20, initial_guess_strategy="one",
                                       max_learning_rate=1.0))


def evaluate(problem, params):
    """The trajectory of the controls from the initial state (single shooting), the cost
    terms and the terminal errors of that trajectory.

    The terms are those of :meth:`OptimalControl.cost_terms`: computed from the one trajectory
    for single shooting, taken from ``cost_terms`` for multiple shooting."""
    sol = problem.trajectory(params)
    U = np.asarray(params["U"])
    b = np.asarray(problem.integrator.force_weights())
    eq = np.asarray(sol.q[-1] - problem.q_target)
    ev = np.asarray(sol.v[-1] - problem.v_target)
    if problem.segments > 1:  # the terminal term is then at the last segment's end
        terms = {k: float(v) for k, v in problem.cost_terms(params).items() if k != "running"}
    else:
        terms = {"effort": float(problem.effort * problem.dt
                                 * np.sum(b[None, :] * np.sum(U**2, -1))),
                 "terminal": float(problem.terminal_weight * (eq @ eq + ev @ ev))}
    return sol, terms, eq, ev


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--system", choices=("cartpole", "cartesian"), default="cartpole")
    parser.add_argument("--integrator", choices=("rattle", "galerkin"), default="rattle",
                        help="the Cartesian case's method (default HolonomicVPRK.rattle())")
    parser.add_argument("--segments", type=int, default=1,
                        help="multiple shooting with this many segments (default 1: single)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke size (one stage; N = 20 cart-pole, 30 Cartesian)")
    parser.add_argument("--out", default="out", help="output folder (default out/)")
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "full"
    cfg = CONFIGS[args.system][mode]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    problem = make_problem(args.system, args.integrator, cfg["n_steps"], args.segments)
    guess = None
    if args.system == "cartesian":  # zero controls are stationary here: see the docstring
        guess = jnp.ones(problem.controls_shape())
    params = problem.initial_guess(guess)
    history, stage_ends, stage_results = [], [], []
    for weight, steps in cfg["stages"]:
        problem = eqx.tree_at(lambda p: p.terminal_weight, problem, weight)
        t0 = time.perf_counter()
        params, values = vj.control.solve(problem, params, optimizer=capped_lbfgs(problem),
                                          steps=steps)
        history.extend(values.tolist())
        stage_ends.append(len(history))
        _, terms, eq, ev = evaluate(problem, params)
        stage_results.append({"terminal_weight": weight, "iterations": steps,
                              "objective_final": sum(terms.values()),
                              "terminal_state_error": float(np.sqrt(eq @ eq + ev @ ev)),
                              "wall_time_s": time.perf_counter() - t0})
    if not np.all(np.isfinite(history)):
        raise RuntimeError("the optimisation produced a non-finite objective")
    sol, terms, eq, ev = evaluate(problem, params)
    wall = time.perf_counter() - start

    q, v, t = np.asarray(sol.q), np.asarray(sol.v), np.asarray(sol.t)
    U = np.asarray(params["U"])[..., 0]
    nodes = np.asarray(problem.integrator.force_nodes())
    t_nodes = problem.dt * (np.arange(problem.n_steps)[:, None] + nodes[None, :])
    result = {
        "mode": mode, "system": args.system, "integrator": problem.integrator.name,
        "n_steps": problem.n_steps, "horizon_s": problem.horizon, "segments": args.segments,
        "effort_weight": problem.effort,
        "stages": stage_results,
        "objective_initial": history[0],
        "objective_final": sum(terms.values()),
        "objective_decrease_factor": history[0] / sum(terms.values()),
        "cost_terms_final": terms,
        "terminal_state_error": float(np.sqrt(eq @ eq + ev @ ev)),
        "terminal_position_error": np.abs(eq).tolist(),
        "terminal_velocity_error": np.abs(ev).tolist(),
        "q_final": q[-1].tolist(), "v_final": v[-1].tolist(),
        "q_target": np.asarray(problem.q_target).tolist(),
        "control_max_abs": float(np.max(np.abs(U))),
        "control_times": t_nodes.tolist(), "controls": U.tolist(),
        "objective_history": history, "stage_ends": stage_ends,
        "wall_time_s": wall,
    }
    if args.system == "cartesian":
        g = jax.vmap(problem.system.holonomic)(sol.q)
        hidden = jnp.sum(sol.q * sol.v, axis=-1)  # G(q) v = q·v
        result["constraint_residual_max"] = float(jnp.max(jnp.abs(g)))
        result["hidden_constraint_residual_max"] = float(jnp.max(jnp.abs(hidden)))
    name = f"swing_up_{args.system}"
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))

    print(f"{args.system}: {problem.integrator.name}, N = {problem.n_steps}, "
          f"T = {problem.horizon} s, {args.segments} segment(s); {len(history)} L-BFGS iterations "
          f"in {len(cfg['stages'])} stage(s), {wall:.1f} s")
    for s in stage_results:
        print(f"  w_T = {s['terminal_weight']:.0e}: objective {s['objective_final']:.6g}, "
              f"terminal error {s['terminal_state_error']:.2e} ({s['wall_time_s']:.1f} s)")
    print(f"objective {history[0]:.6g} -> {result['objective_final']:.6g} "
          f"(x{result['objective_decrease_factor']:.3g} lower); effort {terms['effort']:.5g}; "
          f"terminal state error {result['terminal_state_error']:.2e}; "
          f"max |u| = {result['control_max_abs']:.3g}")
    if args.system == "cartesian":
        print(f"constraint residual max |g(q)| = {result['constraint_residual_max']:.1e}, "
              f"max |q·v| = {result['hidden_constraint_residual_max']:.1e}")
    _plot(out / f"{name}.png", args.system, problem, t_nodes, U, t, q, history, stage_ends)
    print(f"wrote {out / (name + '.json')} and {out / (name + '.png')}")
    return result


def _plot(path, system, problem, t_nodes, U, t, q, history, stage_ends) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    ax = axes[0]
    order = np.argsort(t_nodes.ravel(), kind="stable")
    ax.plot(t_nodes.ravel()[order], U.ravel()[order], ".-", ms=3, lw=0.8)
    ax.set_xlabel("t (s)")
    ax.set_ylabel("cart force u (N)" if system == "cartpole" else "torque u (N m)")
    ax.set_title(f"controls at the force nodes ({problem.integrator.name})", fontsize=9)
    ax = axes[1]
    if system == "cartpole":
        ax.plot(t, q[:, 0], label="x (m)")
        ax.plot(t, q[:, 1], label="θ (rad)")
        ax.axhline(np.pi, color="0.7", ls=":", lw=0.8)
        ax.set_xlabel("t (s)")
        ax.legend(fontsize=8)
        ax.set_title("cart position and pole angle", fontsize=9)
    else:
        ax.plot(q[:, 0], q[:, 1], ".-", ms=3, lw=0.8)
        ax.plot([0], [0], "k+")
        ax.plot(*q[0], "o", color="C2", label="start")
        ax.plot(*np.asarray(problem.q_target), "x", color="C3", label="target")
        ax.set_aspect("equal")
        ax.set_xlabel("x (m)")
        ax.set_ylabel("y (m)")
        ax.legend(fontsize=8)
        ax.set_title("path of the mass (on |q| = l)", fontsize=9)
    ax = axes[2]
    ax.semilogy(history, lw=1)
    for e in stage_ends[:-1]:
        ax.axvline(e, color="0.7", lw=0.8, ls="--")
    ax.set_xlabel("L-BFGS iteration (dashed: terminal weight raised)")
    ax.set_ylabel("objective")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
