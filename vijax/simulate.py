"""``simulate``: drive an integrator's ``step`` inside a jit-compiled ``lax.scan``."""

from __future__ import annotations

import numbers
import warnings
from typing import Any, Optional, Union

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from ._typing import ScalarLike, Times, VectorLike
from .integrators._base import AbstractDenseIntegrator, AbstractIntegrator
from .interpolation import DenseInterpolation, DenseOutput
from .solvers import ConvergenceError
from .systems import LagrangianSystem

__all__ = ["simulate", "Solution", "StepStats", "PrecisionWarning"]


class StepStats(eqx.Module):
    """Solver statistics aggregated over the ``save_every`` steps ending at each saved time.

    Arrays have one entry per saved time after the first (aligned with ``Solution.t[1:]``).
    """

    iterations: Int[Array, " n_saves"]      # total solver iterations in the block
    max_iterations: Int[Array, " n_saves"]  # largest per-step count in the block
    residual: Float[Array, " n_saves"]      # largest final residual in the block
    converged: Bool[Array, " n_saves"]      # every step of the block converged
    failed_step: Int[Array, " n_saves"]     # global index of the first failed step, or -1

    @property
    def all_converged(self):
        return jnp.all(self.converged)

    @property
    def first_failure(self):
        """Global index of the first step whose solve failed, or -1."""
        failed = self.failed_step >= 0
        return jnp.where(jnp.any(failed), self.failed_step[jnp.argmax(failed)], -1)


class Solution(eqx.Module):
    """Saved trajectory: ``t, q, v, p`` have ``n_steps // save_every + 1`` rows (initial
    point included); ``states`` holds the integrator's full states at the same times
    (multipliers, stage caches ...), ``stats`` the solver statistics per saved block."""

    t: Float[Array, " n_saves+1"]
    q: Float[Array, "n_saves+1 n"]
    v: Float[Array, "n_saves+1 n"]
    p: Float[Array, "n_saves+1 n"]
    stats: StepStats
    states: Any
    n_steps: int = eqx.field(static=True)
    interpolation: Optional[DenseInterpolation] = None

    @property
    def final_state(self):
        return jax.tree_util.tree_map(lambda x: x[-1], self.states)

    def evaluate(self, t: Union[ScalarLike, Times], derivative: bool = False) -> DenseOutput:
        """Dense output at the times ``t`` (scalar or 1-D): ``q``, ``p`` and, where the method
        defines them, ``v`` and ``pg``, from the polynomials the method solved for on each step
        (:mod:`vijax.interpolation`).  Needs ``simulate(..., dense=True)``."""
        if self.interpolation is None:
            raise ValueError("this Solution has no dense output: run simulate(..., dense=True) "
                             "with an integrator that has it (a vijax.AbstractDenseIntegrator).")
        return self.interpolation.evaluate(t, derivative)

    @property
    def mean_iterations(self):
        """Mean solver iterations per step."""
        return jnp.sum(self.stats.iterations) / self.n_steps


def _is_traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def _vector(name: str, x, ndim_expected: Optional[int]) -> Array:
    x = jnp.asarray(x)
    if x.ndim != 1:
        raise ValueError(
            f"{name} must be a 1-D array of generalised coordinates, got shape {x.shape}; "
            f"for an ensemble, jax.vmap over simulate instead of stacking initial conditions."
        )
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(
            f"{name} has dtype {x.dtype}; pass floating-point values, e.g. "
            f"jnp.asarray({name}, dtype=jnp.float64) (with jax_enable_x64) or float32."
        )
    if ndim_expected is not None and x.shape[0] != ndim_expected:
        raise ValueError(f"{name} has {x.shape[0]} components but the system has "
                         f"ndim = {ndim_expected}.")
    return x


class PrecisionWarning(UserWarning):
    """Float64 input computed in float32 because JAX's x64 mode is off."""


_warned_precision = False


def _warn_if_float64_is_truncated(**inputs) -> None:
    """Warn once per process when float64 input meets JAX without x64 (silently float32)."""
    global _warned_precision
    if _warned_precision or jax.config.jax_enable_x64:
        return
    wide = [name for name, x in inputs.items()
            if x is not None and not _is_traced(x) and np.asarray(x).dtype == np.float64
            and not isinstance(x, float)]
    if wide:
        _warned_precision = True
        warnings.warn(
            f"{', '.join(wide)} {'is' if len(wide) == 1 else 'are'} float64 but JAX's x64 mode "
            f"is off, so the run is computed in float32 (energy errors near 1e-5 instead of "
            f"1e-9). Enable float64 at start-up with jax.config.update(\"jax_enable_x64\", True), "
            f"or pass float32 arrays to silence this.", PrecisionWarning, stacklevel=3)


def _static_int(name: str, value) -> int:
    if _is_traced(value) or isinstance(value, jax.Array):
        raise TypeError(
            f"{name} must be a static Python int (it fixes the length of the compiled loop), "
            f"got a JAX array or tracer: under jax.jit mark it static, e.g. "
            f"jax.jit(f, static_argnames=\"{name}\") or static_argnums, or use "
            f"equinox.filter_jit, which keeps Python ints static.")
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive Python int, got {value!r}.")
    return int(value)  # numpy integers -> static ints


def _check_finite(name: str, x, what: str):
    """``x`` unchanged; raises (concrete) or fails at run time (traced) if not finite."""
    if _is_traced(x):
        return eqx.error_if(x, ~jnp.all(jnp.isfinite(x)), f"simulate: {what} is not finite.")
    if not bool(np.all(np.isfinite(np.asarray(x)))):
        raise ValueError(f"{what} is not finite: {np.asarray(x)}.")
    return x


def _check_parameters(system):
    """Every floating parameter of the system finite, named in the message when not."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(system)
    checked = []
    for path, x in leaves:
        if isinstance(x, float) or (isinstance(x, (jax.Array, np.ndarray, np.generic))
                                    and jnp.issubdtype(x.dtype, jnp.inexact)):
            name = f"{type(system).__name__}{jax.tree_util.keystr(path)}"
            x = _check_finite(name, x, f"the parameter {name}")
        checked.append(x)
    return jax.tree_util.tree_unflatten(treedef, checked)


def _check_dt(dt):
    message = "dt must be positive and finite"
    if _is_traced(dt):
        return eqx.error_if(dt, ~(jnp.isfinite(dt) & (dt > 0)), f"simulate: {message}.")
    if not (float(dt) > 0 and np.isfinite(float(dt))):
        raise ValueError(f"{message}, got {float(dt)}.")
    return dt


_SINGULAR = ("The velocity Hessian d2L/dv2 of {name} is singular at the initial state{detail}: "
             "the Lagrangian is degenerate there, so the Legendre map cannot be inverted and "
             "the variational stage equations have no unique solution. Check the kinetic "
             "energy (every coordinate needs inertia; a q0 longer than the system's "
             "coordinates looks like this: declare ndim on the system to have its length "
             "checked) or choose an initial state away from the singular configuration.")


def _check_regular(system, q0, v0):
    """Refuse a Lagrangian whose velocity Hessian is singular at the initial state; returns
    ``q0`` (carrying the run-time check when traced)."""
    hess = system.velocity_hessian(q0, v0)
    name = type(system).__name__
    if _is_traced(hess):
        sv = jnp.linalg.svd(hess, compute_uv=False)
        eps = jnp.finfo(hess.dtype).eps
        singular = ~(sv[-1] > 1e3 * eps * sv[0]) | ~jnp.all(jnp.isfinite(hess))
        return eqx.error_if(q0, singular, _SINGULAR.format(name=name, detail=""))
    hess = np.asarray(hess)
    eps = np.finfo(hess.dtype).eps
    cond = np.linalg.cond(hess) if np.all(np.isfinite(hess)) else np.inf
    if not cond < 1.0 / (1e3 * eps):
        detail = f" (condition number {cond:.3g})"
        zero = np.flatnonzero(np.all(hess == 0, axis=1))
        if zero.size:
            n = hess.shape[0]
            detail += (
                f"; coordinates {zero.tolist()} of q0 (length {n}) do not enter the kinetic "
                f"energy: if the system has {n - zero.size} coordinates, pass q0 of that length")
        raise ValueError(_SINGULAR.format(name=name, detail=detail))
    return q0


def _initial_velocity(system, q0, v0, p0):
    if (v0 is None) == (p0 is None):
        raise ValueError("Give exactly one of v0 (velocities) or p0 (momenta); "
                         + ("both were given." if v0 is not None else "neither was given."))
    if v0 is not None:
        v0 = _vector("v0", v0, None)
        if v0.shape != q0.shape:
            raise ValueError(f"v0 has shape {v0.shape} but q0 has shape {q0.shape}.")
        return v0.astype(q0.dtype)
    p0 = _vector("p0", p0, None)
    if p0.shape != q0.shape:
        raise ValueError(f"p0 has shape {p0.shape} but q0 has shape {q0.shape}.")
    q0 = _check_regular(system, q0, jnp.zeros_like(q0))
    v0 = system.velocity(q0, p0.astype(q0.dtype))
    if _is_traced(v0):
        return eqx.error_if(v0, ~jnp.all(jnp.isfinite(v0)),
                            "simulate: the inverse Legendre map failed at (q0, p0); pass v0 "
                            "instead of p0.")
    if not bool(np.all(np.isfinite(np.asarray(v0)))):
        raise ValueError(
            f"The inverse Legendre map of {type(system).__name__} failed at (q0, p0): no "
            f"velocity with D2L(q0, v) = p0 was found from v = 0. Pass v0 instead of p0, or "
            f"override {type(system).__name__}.velocity(q, p, v_guess) with a closed form.")
    return v0


def _check_compatible(system, integrator) -> None:
    if isinstance(system, AbstractIntegrator):
        raise TypeError(f"system must be a vijax.LagrangianSystem, got the integrator "
                        f"{type(system).__name__}: the arguments are swapped; call "
                        f"simulate(system, integrator, ...).")
    if not isinstance(integrator, AbstractIntegrator):
        raise TypeError(f"integrator must be a vijax integrator (e.g. vijax.VPRK.gauss(2)), "
                        f"got {type(integrator).__name__}.")
    base = integrator.system_type
    if isinstance(system, type) and issubclass(system, base):
        raise TypeError(f"system must be a vijax.{base.__name__} instance, got the class "
                        f"{system.__name__}; pass an instance, e.g. {system.__name__}().")
    integrator.check_system(system)


@eqx.filter_jit
def _run(system, integrator, q0, v0, t0, dt, n_saves: int, save_every: int, dense: bool):
    state0 = integrator.init(system, t0, q0, v0)

    # Statistics are reduced in the carry, not stacked per step: long runs store only what
    # is saved.
    def one_step(carry, k):
        state, agg = carry
        prev = state
        state, st = integrator.step(system, state, dt)
        # dense output: the step's polynomials at their nodes and the new node values
        rec = ((integrator.dense_interval(system, prev, state, dt),
                integrator.dense_knots(system, state)) if dense else None)
        agg = StepStats(
            iterations=agg.iterations + st.iterations,
            max_iterations=jnp.maximum(agg.max_iterations, st.iterations),
            residual=jnp.maximum(agg.residual, st.residual),
            converged=agg.converged & st.converged,
            failed_step=jnp.where((agg.failed_step < 0) & ~st.converged, k, agg.failed_step),
        )
        return (state, agg), rec

    def block(state, j):
        agg0 = StepStats(iterations=jnp.asarray(0, jnp.int32),
                         max_iterations=jnp.asarray(0, jnp.int32),
                         residual=jnp.zeros((), q0.dtype), converged=jnp.asarray(True),
                         failed_step=jnp.asarray(-1, jnp.int32))
        ks = (j * save_every + jnp.arange(save_every)).astype(jnp.int32)
        (state, agg), recs = jax.lax.scan(one_step, (state, agg0), ks)
        return state, (state, agg, recs)

    _, (states, stats, recs) = jax.lax.scan(block, state0, jnp.arange(n_saves))
    states = jax.tree_util.tree_map(
        lambda a, b: jnp.concatenate([a[None], b]), state0, states)
    v = jax.vmap(lambda s: integrator.velocity(system, s))(states)
    t = t0 + dt * jnp.arange(n_saves + 1, dtype=q0.dtype) * save_every
    interp = None
    if dense:
        flat = lambda x: x.reshape((n_saves * save_every,) + x.shape[2:])  # noqa: E731
        values, knots = jax.tree_util.tree_map(flat, recs)
        knots = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a[None], b]),
                                       integrator.dense_knots(system, state0), knots)
        ts = t0 + dt * jnp.arange(n_saves * save_every + 1, dtype=q0.dtype)
        interp = DenseInterpolation.build(integrator.dense_layout(system), ts, values, knots)
    return t, states, v, stats, interp


def simulate(
    system: LagrangianSystem,
    integrator: AbstractIntegrator,
    *,
    q0: VectorLike,
    v0: Optional[VectorLike] = None,
    p0: Optional[VectorLike] = None,
    dt: ScalarLike,
    n_steps: int,
    save_every: int = 1,
    dense: bool = False,
    t0: ScalarLike = 0.0,
    throw: bool = True,
    project: bool = False,
) -> Solution:
    """Integrate ``system`` with ``integrator`` for ``n_steps`` steps of size ``dt``.

    With ``dense=True`` (collocation and Galerkin methods) the solution also carries the
    polynomials of every step, whatever ``save_every``: ``sol.evaluate(t)`` gives ``q``,
    ``p`` (and ``v``, ``pg`` where defined) at any time.

    Give the initial velocity ``v0`` or the initial momentum ``p0`` (exactly one).  States
    are saved every ``save_every`` steps (``n_steps`` must be a multiple); only saved states
    are stored.  Works under :func:`jax.jit`, :func:`jax.vmap` (ensembles) and
    :func:`jax.grad` (with respect to the initial state, ``dt`` and every system parameter).
    A stage solve that fails to converge raises :class:`~vijax.solvers.ConvergenceError`
    naming the step (``throw=True``, the default; under :func:`jax.jit` and
    :func:`jax.vmap` a run-time error, and one failed ensemble member fails the call).  With
    ``throw=False`` the run returns, the failure is recorded in ``Solution.stats``
    (``converged``, ``failed_step``) and every derivative through it is NaN.  Bad input
    (non-finite ``q0``, ``v0``, ``dt`` or system parameters, ``dt <= 0``, a singular velocity
    Hessian) raises a ``ValueError`` naming it, also under :func:`jax.jit` (then at run
    time).  The working dtype is that of ``q0``.

    The integrator decides which systems it accepts (:meth:`AbstractIntegrator.check_system`)
    and which initial data are consistent (:meth:`AbstractIntegrator.check_initial`); for
    holonomically constrained systems ``(q0, v0)`` must lie on ``g(q) = 0`` and its hidden
    constraint ``G(q) v = 0``.  ``project=True`` projects them first
    (:meth:`LagrangianSystem.project_configuration`, :meth:`~LagrangianSystem.project_velocity`).
    """
    _check_compatible(system, integrator)
    _warn_if_float64_is_truncated(q0=q0, v0=v0, p0=p0)
    n_steps = _static_int("n_steps", n_steps)
    save_every = _static_int("save_every", save_every)
    if n_steps % save_every:
        raise ValueError(f"n_steps = {n_steps} is not a multiple of save_every = {save_every}; "
                         f"choose n_steps = {(n_steps // save_every + 1) * save_every}, say.")
    q0 = _vector("q0", q0, system.ndim)
    dtype = q0.dtype
    # Python-float parameters become arrays of the working dtype: jit then traces them
    # (no recompilation per value) and the system follows the dtype of q0.
    system = jax.tree_util.tree_map(
        lambda x: jnp.asarray(x, dtype) if isinstance(x, float) else x, system)
    system = _check_parameters(system)
    dt = jnp.asarray(dt, dtype)
    if dt.ndim != 0:
        raise ValueError(f"dt must be a scalar, got shape {dt.shape}.")
    dt = _check_dt(dt)
    q0 = _check_finite("q0", q0, "q0")
    if project:
        q0 = system.project_configuration(q0)
    v0 = _initial_velocity(system, q0, v0, p0)
    v0 = _check_finite("v0", v0, "v0")
    if project:
        v0 = system.project_velocity(q0, v0)
    q0 = _check_regular(system, q0, v0)
    q0, v0 = integrator.check_initial(system, q0, v0, float(jnp.finfo(dtype).eps) ** 0.6)
    t0 = jnp.asarray(t0, dtype)

    if dense and not isinstance(integrator, AbstractDenseIntegrator):
        raise ValueError(f"{integrator.name} has no dense output; drop dense=True or use a "
                         f"collocation or Galerkin method (a vijax.AbstractDenseIntegrator).")
    t, states, v, stats, interp = _run(system, integrator, q0, v0, t0, dt,
                                       n_steps // save_every, save_every, bool(dense))
    sol = Solution(t=t, q=states.q, v=v, p=states.p, stats=stats, states=states,
                   n_steps=n_steps, interpolation=interp)
    if throw:
        ok = stats.converged
        if _is_traced(ok):
            sol = eqx.error_if(
                sol, ~jnp.all(ok),
                "simulate: an implicit stage solve did not converge (in some ensemble member "
                "under vmap). Reduce dt, raise the solver's max_steps or use "
                "solver=vijax.solvers.Newton() for stiff problems; pass throw=False to get "
                "the run and inspect sol.stats.converged and sol.stats.failed_step.")
        elif not bool(np.all(np.asarray(ok))):
            k = int(stats.first_failure)
            raise ConvergenceError(
                f"The stage equations of {integrator.name} did not converge at step {k} "
                f"(t = {float(t0) + k * float(dt):.6g}; residual "
                f"{float(np.max(np.asarray(stats.residual))):.3g}). Reduce dt, raise the "
                f"solver's max_steps, or use solver=vijax.solvers.Newton() for stiff problems "
                f"(throw=False returns the run with its statistics instead)."
            )
    return sol
