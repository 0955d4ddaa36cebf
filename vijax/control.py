"""Discrete mechanics and optimal control (DMOC).

Ober-Blöbaum, Junge & Marsden (2011) discretise an optimal-control problem for a forced
mechanical system by a forced variational integrator: the discrete Lagrange--d'Alembert
equations are the constraints, the cost is approximated by a quadrature on the same grid.
Campos, Ober-Blöbaum & Trélat (2015) take one control per stage of a symplectic partitioned
Runge--Kutta method and the cost with its weights ``b_i``: the discrete optimal controls then
converge at the order of the method.

:class:`OptimalControl` turns a :class:`vijax.ForcedSystem`, any vijax integrator, the initial
state, a target state and the weights of the cost into a differentiable objective over the
controls (one per force node of every step), by single shooting (the trajectory is
:func:`vijax.simulate` of the controls) or multiple shooting (the horizon is cut into
segments that start from free states, and the defects between segments are penalised;
better conditioned over long or unstable horizons).  The terminal conditions and the defects
enter as quadratic penalties, so that any first-order optimiser (:mod:`optax`) minimises it;
:func:`solve` runs one.  Gradients go through the integrator's implicit stage solves by the
implicit function theorem, and ``adjoint=`` chooses how the trajectory is differentiated.
"""

from __future__ import annotations

from typing import Callable, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, PyTree

from .integrators import AbstractIntegrator
from .simulate import Solution, simulate
from .systems import ForcedSystem, HolonomicSystem

__all__ = ["OptimalControl", "solve"]


class OptimalControl(eqx.Module):
    """``min_U  ε Σ_k h Σ_i b_i |U_ki|² + Σ_k h Σ_i b_i ℓ(t_ki, U_ki)
    + w_T (|q_N − q_T|² + |v_N − v_T|²)`` subject to the forced integrator's step equations.

    Parameters
    ----------
    system:
        A :class:`vijax.ForcedSystem` with ``control_dim > 0``.
    integrator:
        Any vijax integrator; ``b_i`` are its force weights
        (:meth:`~vijax.AbstractIntegrator.force_weights`).
    q0, v0:
        The initial state (consistent with the constraints of a constrained system).
    q_target, v_target:
        The terminal state (``None``: not constrained).
    horizon, n_steps:
        The time ``T`` and the number of steps ``N`` (``h = T / N``).
    effort:
        ``ε``, the weight of the control effort ``∫ |u|² dt``.
    terminal_weight:
        ``w_T``, the penalty weight of the terminal conditions.
    segments:
        Multiple shooting with this many segments (``1``: single shooting); must divide
        ``n_steps``.
    defect_weight:
        Penalty weight of the defects ``|q_end − q_start|² + |v_end − v_start|²`` between
        segments.
    running_cost:
        Optional ``ℓ(t, u)`` added at the force nodes with the weights ``h b_i``.
    adjoint:
        Passed to :func:`vijax.simulate`.
    """

    system: ForcedSystem
    integrator: AbstractIntegrator
    q0: Array
    v0: Array
    q_target: Optional[Array]
    v_target: Optional[Array]
    horizon: float
    n_steps: int = eqx.field(static=True)
    effort: float = 1.0
    terminal_weight: float = 1e3
    segments: int = eqx.field(static=True, default=1)
    defect_weight: float = 1e3
    running_cost: Optional[Callable] = None
    adjoint: str = eqx.field(static=True, default="store_all")

    def __check_init__(self):
        if not isinstance(self.system, ForcedSystem) or self.system.control_dim < 1:
            raise ValueError(
                f"OptimalControl needs a vijax.ForcedSystem with control_dim >= 1, got "
                f"{type(self.system).__name__}; declare control_dim and read u in force(t, q, "
                f"v, u).")
        if not isinstance(self.segments, int) or self.segments < 1 or self.n_steps % self.segments:
            raise ValueError(f"segments must be a positive int dividing n_steps = "
                             f"{self.n_steps}, got {self.segments!r}.")

    # -- the decision variables ----------------------------------------------------------------
    @property
    def dt(self):
        return self.horizon / self.n_steps

    def controls_shape(self) -> tuple[int, int, int]:
        """``(n_steps, force nodes, control_dim)``."""
        return (self.n_steps, len(self.integrator.force_nodes()), self.system.control_dim)

    def initial_guess(self, controls: Optional[Array] = None) -> dict:
        """Decision variables: ``{"U": controls}`` and, with multiple shooting, the segments'
        initial states ``{"q": (segments - 1, n), "v": ...}`` interpolated linearly between
        the initial and the target state (``q0`` where there is no target)."""
        dtype = jnp.asarray(self.q0).dtype
        U = jnp.zeros(self.controls_shape(), dtype) if controls is None else jnp.asarray(controls)
        out = {"U": U}
        if self.segments > 1:
            s = jnp.arange(1, self.segments, dtype=dtype)[:, None] / self.segments
            qT = self.q0 if self.q_target is None else self.q_target
            vT = self.v0 if self.v_target is None else self.v_target
            out["q"] = (1 - s) * self.q0[None, :] + s * qT[None, :]
            out["v"] = (1 - s) * self.v0[None, :] + s * vT[None, :]
        return out

    # -- the objective ---------------------------------------------------------------------------
    def _segment(self, q0, v0, U, t0, project):
        """The end state of a segment, NaN where a stage solve failed: the objective is then
        NaN, which a line search (optax's zoom line search) treats as a failed trial step
        instead of an error that ends the optimisation."""
        sol = simulate(self.system, self.integrator, q0=q0, v0=v0, dt=self.dt,
                       n_steps=U.shape[0], save_every=U.shape[0], t0=t0, controls=U,
                       project=project, adjoint=self.adjoint, throw=False)
        nan = jnp.where(jnp.all(sol.stats.converged), 0.0, jnp.nan).astype(sol.q.dtype)
        return sol.q[-1] + nan, sol.v[-1] + nan

    def trajectory(self, params: dict, save_every: int = 1) -> Solution:
        """The single-shooting trajectory of the controls ``params["U"]`` from ``(q0, v0)``."""
        return simulate(self.system, self.integrator, q0=self.q0, v0=self.v0, dt=self.dt,
                        n_steps=self.n_steps, save_every=save_every, controls=params["U"])

    def cost_terms(self, params: dict) -> dict:
        """The terms of the objective: ``effort``, ``running``, ``terminal`` and ``defects``."""
        U = params["U"]
        h = self.dt
        w = jnp.asarray(self.integrator.force_weights(), U.dtype)
        effort = self.effort * h * jnp.sum(w[None, :] * jnp.sum(U ** 2, axis=-1))
        running = jnp.zeros((), U.dtype)
        if self.running_cost is not None:
            nodes = jnp.asarray(self.integrator.force_nodes(), U.dtype)
            t = h * (jnp.arange(self.n_steps, dtype=U.dtype)[:, None] + nodes[None, :])
            running = h * jnp.sum(w[None, :] * jax.vmap(jax.vmap(self.running_cost))(t, U))
        m = self.n_steps // self.segments
        if self.segments == 1:
            qN, vN = self._segment(self.q0, self.v0, U, 0.0, False)
            defects = jnp.zeros((), U.dtype)
        else:
            q_starts = jnp.concatenate([self.q0[None, :], params["q"]])
            v_starts = jnp.concatenate([self.v0[None, :], params["v"]])
            t_starts = h * m * jnp.arange(self.segments, dtype=U.dtype)
            project = isinstance(self.system, HolonomicSystem)
            q_end, v_end = jax.vmap(lambda q, v, u, t: self._segment(q, v, u, t, project))(
                q_starts, v_starts, U.reshape((self.segments, m) + U.shape[1:]), t_starts)
            defects = self.defect_weight * (jnp.sum((q_end[:-1] - params["q"]) ** 2)
                                            + jnp.sum((v_end[:-1] - params["v"]) ** 2))
            qN, vN = q_end[-1], v_end[-1]
        terminal = jnp.zeros((), U.dtype)
        if self.q_target is not None:
            terminal = terminal + jnp.sum((qN - self.q_target) ** 2)
        if self.v_target is not None:
            terminal = terminal + jnp.sum((vN - self.v_target) ** 2)
        return {"effort": effort, "running": running,
                "terminal": self.terminal_weight * terminal, "defects": defects}

    def objective(self, params: dict) -> Array:
        """The scalar objective (a sum of :meth:`cost_terms`); differentiable in ``params``."""
        return sum(self.cost_terms(params).values())


def solve(problem: OptimalControl, params: Optional[PyTree] = None, *, optimizer=None,
          steps: int = 200) -> tuple[PyTree, np.ndarray]:
    """Minimise ``problem.objective`` from ``params`` (default :meth:`~OptimalControl.
    initial_guess`) with an :mod:`optax` optimiser (default :func:`optax.lbfgs` with its zoom
    line search); returns the parameters and the objective at every iteration.  The whole
    iteration is one compiled :func:`jax.lax.scan`, compiled once per problem structure and
    optimiser (pass the same optimiser object to reuse the compilation).  optax's L-BFGS mixes
    integer widths, so the run uses JAX's standard dtype promotion whatever the global
    setting."""
    params = problem.initial_guess() if params is None else params
    optimizer = _default_optimizer() if optimizer is None else optimizer
    with jax.numpy_dtype_promotion("standard"):
        params, values = _solve(problem, params, optimizer, steps)
    return params, np.asarray(values)


_DEFAULT_OPTIMIZER = []


def _default_optimizer():
    if not _DEFAULT_OPTIMIZER:
        _DEFAULT_OPTIMIZER.append(optax.lbfgs())
    return _DEFAULT_OPTIMIZER[0]


@eqx.filter_jit
def _solve(problem, params, optimizer, steps):
    extra = isinstance(optimizer, optax.GradientTransformationExtraArgs)

    def step(carry, _):
        params, state = carry
        value, grad = jax.value_and_grad(problem.objective)(params)
        kwargs = dict(value=value, grad=grad, value_fn=problem.objective) if extra else {}
        updates, state = optimizer.update(grad, state, params, **kwargs)
        return (optax.apply_updates(params, updates), state), value

    (params, _), values = jax.lax.scan(step, (params, optimizer.init(params)), None,
                                       length=steps)
    return params, values
