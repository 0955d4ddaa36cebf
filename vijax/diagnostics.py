"""Verification tools: energy behaviour, convergence orders, symplecticity defects."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike

from . import _xla, constraints
from ._typing import BoolScalar, Scalar, ScalarLike, Times, Vector, VectorLike
from .integrators._base import AbstractIntegrator, AbstractState
from .simulate import Solution
from .systems import HolonomicSystem, LagrangianSystem, LieGroupSystem, NonholonomicSystem

__all__ = [
    "energy",
    "energy_error",
    "OrderEstimate",
    "estimate_order",
    "DriftFit",
    "drift",
    "symplecticity_defect",
    "symplectic_forms",
    "SymplecticForms",
    "euler_lagrange_rhs",
    "energy_variance",
    "reference_solution",
    "ConvergenceStudy",
    "convergence_study",
    "advance",
]


def energy(system: LagrangianSystem, sol: Solution) -> Times:
    """Energy ``E(q, v)`` at every saved point of a :class:`~vijax.Solution` (of
    ``L(t, ·, ·)`` at the saved times for a :class:`vijax.TimeDependentSystem`)."""
    return jax.vmap(lambda t, q, v: system.at(t).energy(q, v))(sol.t, sol.q, sol.v)


def energy_variance(system: LagrangianSystem, ensemble: Solution,
                    reference: Optional[ScalarLike] = None) -> Times:
    """``μ(E, k) = mean_j (E_jk - E_j0)²``: the mean squared energy error over the members
    of an ensemble (a :class:`~vijax.Solution` from :func:`vijax.simulate_ensemble`, arrays
    with a leading member axis) at every saved point ``k`` -- the statistic of Martín de Diego
    & Sato Martín de Almagro (2022), eq. (33), whose growth tells a random walk of the energy
    (``μ ∝ t``) from a drift (``μ ∝ t²``).  ``reference``: a common initial energy ``E0``
    instead of each member's own."""
    e = jax.vmap(lambda t, q, v: jax.vmap(lambda ti, qi, vi: system.at(ti).energy(qi, vi))(
        t, q, v))(ensemble.t, ensemble.q, ensemble.v)
    e0 = e[:, :1] if reference is None else jnp.asarray(reference, e.dtype)
    return jnp.mean((e - e0) ** 2, axis=0)


def energy_error(system: LagrangianSystem, sol: Solution, relative: bool = False) -> Times:
    """``E(t) - E(t0)`` (divided by ``|E(t0)|`` when ``relative``)."""
    e = energy(system, sol)
    err = e - e[0]
    return err / jnp.abs(e[0]) if relative else err


class OrderEstimate(NamedTuple):
    order: float            # least-squares slope of log(error) against log(h)
    used: np.ndarray        # mask of the points kept in the fit
    intercept: float


def estimate_order(hs: Sequence[float], errors: Sequence[float], *,
                   floor: float | None = None) -> OrderEstimate:
    """Convergence order as the least-squares slope of ``log(error)`` vs ``log(h)``.

    Points on the round-off plateau are dropped: errors below ``floor`` (default
    ``1e3 * eps(float64)``, about 2e-13) and, from the small-``h`` end, every point whose local
    slope to its coarser neighbour is below half the slope fitted to the points before it.
    At least two points must remain.
    """
    hs = np.asarray(hs, dtype=np.float64)
    errors = np.asarray(errors, dtype=np.float64)
    if hs.shape != errors.shape or hs.ndim != 1 or hs.size < 2:
        raise ValueError("hs and errors must be 1-D sequences of equal length >= 2.")
    order = np.argsort(-hs)
    hs, errors = hs[order], errors[order]
    if floor is None:
        floor = 1e3 * np.finfo(np.float64).eps
    used = np.isfinite(errors) & (errors > floor)
    keep = list(np.flatnonzero(used))
    while len(keep) > 2:
        before = np.polyfit(np.log(hs[keep[:-1]]), np.log(errors[keep[:-1]]), 1)[0]
        i, j = keep[-2], keep[-1]
        local = np.log(errors[i] / errors[j]) / np.log(hs[i] / hs[j])
        if local >= 0.5 * before:
            break
        keep.pop()
    used = np.zeros_like(used)
    used[keep] = True
    if used.sum() < 2:
        raise ValueError(f"fewer than two usable points (errors above the round-off floor "
                         f"{floor:.1e}): errors = {errors}; use larger step sizes.")
    slope, intercept = np.polyfit(np.log(hs[used]), np.log(errors[used]), 1)
    inv = np.empty_like(order)
    inv[order] = np.arange(order.size)
    return OrderEstimate(float(slope), used[inv], float(intercept))


class DriftFit(NamedTuple):
    slope: float        # fitted d(error)/dt
    stderr: float       # standard error of the slope (ordinary least squares)
    bound: float        # max |error|

    @property
    def t_statistic(self) -> float:
        return self.slope / self.stderr if self.stderr > 0 else 0.0


def drift(t: ArrayLike, err: ArrayLike, *, n_blocks: int = 50) -> DriftFit:
    """Linear drift of an error signal (e.g. energy error) over time.

    The signal is averaged over ``n_blocks`` equal blocks before fitting so that the fast
    oscillations of a bounded error do not masquerade as independent noise; the slope is
    then statistically zero for a bounded error (``|t_statistic|`` small) and clearly
    nonzero for a drifting one.
    """
    t = np.asarray(t, dtype=np.float64)
    err = np.asarray(err, dtype=np.float64)
    n = (t.size // n_blocks) * n_blocks
    tb = t[:n].reshape(n_blocks, -1).mean(axis=1)
    eb = err[:n].reshape(n_blocks, -1).mean(axis=1)
    design = np.stack([tb, np.ones_like(tb)], axis=1)
    coef, res, *_ = np.linalg.lstsq(design, eb, rcond=None)
    resid = eb - design @ coef
    sigma2 = resid @ resid / max(n_blocks - 2, 1)
    cov = sigma2 * np.linalg.inv(design.T @ design)
    return DriftFit(float(coef[0]), float(np.sqrt(cov[0, 0])), float(np.max(np.abs(err))))


class SymplecticForms(NamedTuple):
    """The canonical 2-form before and after one step, restricted to the phase space:
    ``original = B^T Omega B`` and ``pulled_back = B^T J^T Omega J B`` (see
    :func:`symplectic_forms`)."""

    pulled_back: jax.Array
    original: jax.Array


def symplectic_forms(system: LagrangianSystem, integrator: AbstractIntegrator,
                     state: AbstractState, h: ScalarLike) -> SymplecticForms:
    """``B^T J^T Omega J B`` and ``B^T Omega B`` for the one-step map at ``state``.

    ``J`` is the Jacobian of ``(q, p) -> (q', p')`` (:meth:`integrator.step` from ``state``
    with its ``q`` and the momentum fields it reads replaced, see
    :meth:`vijax.AbstractState.step_momenta`), by :func:`jax.jacfwd`
    (through the implicit function theorem at the converged stage solution), and
    ``Omega = [[0, I], [-I, 0]]``.

    ``B`` is an orthonormal basis of the phase space at ``(state.q, state.p)``: the identity
    for an unconstrained system; for a :class:`vijax.HolonomicSystem` the tangent space of
    ``T^*C = {g(q) = 0, G(q) H^{-1}(q, p) p = 0}`` (``H^{-1} p`` the inverse Legendre map),
    i.e. the null space of the Jacobian of those ``2m`` equations (Wenger, Ober-Blöbaum &
    Leyendecker (2017), §3.4.1; Muehlebach, Heimsch & Glocker (2016), §4.2.3).  On ``T^*C``
    the restricted form is non-degenerate, and a momentum shift along ``G(q)^T`` (the gauge
    of schemes that carry an unprojected momentum) does not change it, so the check applies
    whichever representative of the momentum the step returns.  ``state.p`` must lie on
    ``T^*C`` (every vijax holonomic state's ``p`` does).  Works under :func:`jax.jit`.
    """
    if isinstance(system, LieGroupSystem):
        return _group_symplectic_forms(system, integrator, state, h)
    q, p = state.q, state.p
    n = q.shape[0]
    where = type(state).step_momenta
    k = len(where(state))

    def flow(z):
        qq, pp = z[:n], z[n:]
        start = eqx.tree_at(lambda s: (s.q,) + tuple(where(s)), state, (qq,) + (pp,) * k)
        new, _ = integrator.step(system, start, h)
        return jnp.concatenate([new.q, where(new)[0]])

    z = jnp.concatenate([q, p])
    jac = jax.jacfwd(flow)(z)
    eye = jnp.eye(n, dtype=z.dtype)
    zero = jnp.zeros((n, n), dtype=z.dtype)
    omega = jnp.block([[zero, eye], [-eye, zero]])
    pulled_back = jac.T @ omega @ jac
    if not isinstance(system, HolonomicSystem):
        return SymplecticForms(pulled_back=pulled_back, original=omega)

    at_t = system.at(state.t)   # (the constraint at the step's start: it may read the clock)

    def manifold(z):
        qq, pp = z[:n], z[n:]
        vv = at_t.velocity(qq, pp)
        return jnp.concatenate([at_t.holonomic(qq), constraints.hidden_constraint(at_t, qq, vv)])

    rows = jax.jacfwd(manifold)(z)
    _, _, vt = jnp.linalg.svd(rows, full_matrices=True)
    basis = vt[rows.shape[0]:].T  # the null space (the 2m rows are independent)
    return SymplecticForms(pulled_back=basis.T @ pulled_back @ basis,
                           original=basis.T @ omega @ basis)


def _group_symplectic_forms(system, integrator, state, h) -> SymplecticForms:
    """:func:`symplectic_forms` for a :class:`vijax.LieGroupSystem`, in canonical coordinates of
    the first kind around ``ĝ = state.q``: ``g = ĝ exp(x)`` and ``p_x = (dexp_x)ᵀ μ`` (the
    cotangent lift of the chart; ``ℓ(ĝ exp(x), dexp_x x')`` is the Lagrangian in ``x``, whose
    momentum is ``(dexp_x)ᵀ D2ℓ``), so that the step map is symplectic iff its Jacobian in
    ``(x, p_x)`` is (Bogfjellmo & Marthinsen (2016), §6)."""
    if isinstance(system, HolonomicSystem):
        raise NotImplementedError(
            "the symplecticity check of a holonomically constrained Lie-group system is not "
            "implemented; check the unconstrained system, or the vector-space formulation.")
    G = system.group
    g_hat = state.q
    d = G.dim
    where = type(state).step_momenta
    k = len(where(state))

    def flow(z):
        x, px = z[:d], z[d:]
        mu = jnp.linalg.solve(G.dexp(x).T, px)
        start = eqx.tree_at(lambda s: (s.q,) + tuple(where(s)), state,
                            (G.compose(g_hat, G.exp(x)),) + (mu,) * k)
        new, _ = integrator.step(system, start, h)
        x1 = G.log(G.compose(G.inverse(g_hat), new.q))
        return jnp.concatenate([x1, G.dexp(x1).T @ where(new)[0]])

    z = jnp.concatenate([jnp.zeros_like(state.p), state.p])
    jac = jax.jacfwd(flow)(z)
    eye = jnp.eye(d, dtype=z.dtype)
    zero = jnp.zeros((d, d), dtype=z.dtype)
    omega = jnp.block([[zero, eye], [-eye, zero]])
    return SymplecticForms(pulled_back=jac.T @ omega @ jac, original=omega)


def symplecticity_defect(system: LagrangianSystem, integrator: AbstractIntegrator,
                         state: AbstractState, h: ScalarLike) -> Scalar:
    """``max |B^T (J^T Omega J - Omega) B|`` of the one-step map at ``state``: zero (to
    round-off) for a symplectic method.

    ``B = I`` for an unconstrained system, i.e. ``max |J^T Omega J - Omega|``; for a
    :class:`vijax.HolonomicSystem` ``B`` spans the tangent space of the constraint manifold
    ``T^*C`` (see :func:`symplectic_forms`).  ``J`` is taken in the variables the method's
    step map uses (:meth:`vijax.AbstractState.step_momenta`).
    """
    forms = symplectic_forms(system, integrator, state, h)
    return jnp.max(jnp.abs(forms.pulled_back - forms.original))


def euler_lagrange_rhs(system: LagrangianSystem,
                       ) -> Callable[[Vector, Vector], tuple[Vector, Vector]]:
    """First-order form ``(q, v)' = (v, a)`` of the Euler--Lagrange equations, by autodiff:
    ``d2L/dv2 a = D1L - (d2L/dv dq) v - ∂(D2L)/∂t + F - G^T λ``, with the system's
    ``inverse_velocity_hessian`` (closed forms up to 3x3, no LAPACK call).  Used for reference
    solutions and as the vector field of peer solvers in the benchmarks.  ``rhs(q, v, t=None)``:
    the time ``t`` (default: the system's clock, ``system.time``, or 0) is read by a
    :class:`vijax.TimeDependentSystem` and by the force.

    Every capability of the system enters: the force ``F(t, q, v, u)`` of a
    :class:`vijax.ForcedSystem` (with zero controls), the multiplier of a
    :class:`vijax.HolonomicSystem` (:func:`vijax.constraints.multiplier`, rheonomic
    constraints included: the index-1 form, exact on the constraint manifold, whose
    numerical solution drifts off it at the integrator's tolerance), and the nonholonomic
    equations of a :class:`vijax.NonholonomicSystem`
    (:func:`vijax.constraints.nonholonomic_acceleration`).  A :class:`vijax.LieGroupSystem` is
    refused: its equations live on the group
    (:func:`vijax.integrators.lie.euler_poincare`)."""
    if isinstance(system, LieGroupSystem):
        raise TypeError(
            f"euler_lagrange_rhs takes a vector configuration; {type(system).__name__} is a "
            f"Lie-group system: use vijax.integrators.lie.euler_poincare(system, t, g, xi) for "
            f"its (constrained, forced) Euler--Poincaré equations.")

    def rhs(q, v, t=None):
        t = constraints._clock(system, q, t)
        if isinstance(system, NonholonomicSystem):
            return v, constraints.nonholonomic_acceleration(system, q, v, t)[0]
        sys = system.at(t)
        f = constraints._generalised_force(system, q, v, t, None)
        hinv = sys.inverse_velocity_hessian(q, v)
        if isinstance(system, HolonomicSystem):
            G = constraints.constraint_jacobian(sys, q)
            f = f - G.T @ constraints._multiplier_of(sys, q, v, f, G, hinv)
        return v, hinv @ f

    return rhs


def reference_solution(system: LagrangianSystem, q0: VectorLike, v0: VectorLike, t_final: float,
                       *, rtol: float = 3e-14, atol: float = 1e-16, t0: float = 0.0,
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """High-accuracy ``(q, v, p)`` at ``t0 + t_final`` from scipy's DOP853 on the
    Euler--Lagrange equations (:func:`euler_lagrange_rhs`: forces with zero controls,
    holonomic and nonholonomic constraints in their index-1 form, the clock of a
    time-dependent system); an independent reference for convergence studies; needs
    ``scipy``.

    Accurate to about 1e-12 on smooth problems over a few periods (the Kepler orbit with
    e = 0.5 over one period: ~1e-12); use an exact solution where one is known to measure
    errors below that."""
    try:
        from scipy.integrate import solve_ivp
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError("reference_solution needs scipy: pip install 'vijax[bench]'") from err
    n = np.asarray(q0).shape[0]
    rhs = euler_lagrange_rhs(system)
    f = jax.jit(lambda t, y: jnp.concatenate(rhs(y[:n], y[n:], t)))
    y0 = np.concatenate([np.asarray(q0, np.float64), np.asarray(v0, np.float64)])
    out = solve_ivp(lambda t, y: np.asarray(f(jnp.asarray(t), jnp.asarray(y))),
                    (float(t0), float(t0) + float(t_final)), y0,
                    method="DOP853", rtol=rtol, atol=atol)
    if not out.success:
        raise RuntimeError(f"reference integration failed: {out.message}")
    y = out.y[:, -1]
    q, v = y[:n], y[n:]
    at_end = system.at(jnp.asarray(float(t0) + float(t_final)))
    p = np.asarray(at_end.momentum(jnp.asarray(q), jnp.asarray(v)))
    return q, v, p


class ConvergenceStudy(NamedTuple):
    hs: np.ndarray
    err_q: np.ndarray
    err_p: np.ndarray
    order_q: float
    order_p: float


def convergence_study(system: LagrangianSystem, integrator: AbstractIntegrator, q0: VectorLike,
                      v0: VectorLike, t_final: float, n_steps_list: Sequence[int],
                      reference: Optional[tuple[ArrayLike, ArrayLike, ArrayLike]] = None,
                      ) -> ConvergenceStudy:
    """Global errors at ``t_final`` (max-norm in ``q`` and ``p``) for each step count, and the
    fitted orders (:func:`estimate_order`).  ``reference`` is ``(q, v, p)`` at ``t_final``
    (default: :func:`reference_solution`)."""
    if reference is None:
        reference = reference_solution(system, q0, v0, t_final)
    q_ref, _, p_ref = (np.asarray(x) for x in reference)
    q0 = jnp.asarray(q0)
    v0 = jnp.asarray(v0, q0.dtype)
    hs, eq, ep = [], [], []
    for n in n_steps_list:
        h = t_final / n
        state, ok = advance(system, integrator, q0, v0, jnp.asarray(h, q0.dtype),
                            jnp.asarray(int(n)))
        if not bool(ok):
            raise RuntimeError(f"{integrator.name}: a stage solve did not converge (h = {h}).")
        hs.append(h)
        eq.append(np.max(np.abs(np.asarray(state.q) - q_ref)))
        ep.append(np.max(np.abs(np.asarray(state.p) - p_ref)))
    hs, eq, ep = np.array(hs), np.array(eq), np.array(ep)
    return ConvergenceStudy(hs, eq, ep, estimate_order(hs, eq).order,
                            estimate_order(hs, ep).order)


def advance(system: LagrangianSystem, integrator: AbstractIntegrator, q0: VectorLike,
            v0: VectorLike, h: ScalarLike, n: int) -> tuple[AbstractState, BoolScalar]:
    """``n`` steps of size ``h`` from ``(q0, v0)``; returns the final state and whether every
    stage solve converged.  Pass ``h`` and ``n`` as arrays: the trip count is dynamic, so one
    compilation per (system, method) serves every step size and count (forward mode only;
    :func:`vijax.simulate` is the reverse-differentiable driver).  Called directly, it is
    compiled with :func:`vijax.compiler_options`."""
    return _xla.filter_jit(_advance)(system, integrator, q0, v0, h, n)


def _advance(system, integrator, q0, v0, h, n):
    def body(_, carry):
        state, ok = carry
        state, stats = integrator.step(system, state, h)
        return state, ok & stats.converged

    state = integrator.init(system, jnp.zeros((), q0.dtype), q0, v0)
    return jax.lax.fori_loop(0, n, body, (state, jnp.asarray(True)))
