"""Test systems and reference solutions shared by several test modules.

* :class:`SpringPendulum`: the planar pendulum in Cartesian coordinates (Lagrangian (69) of
  Wenger, Ober-Blöbaum & Leyendecker (2017), planar case; unit mass) with an optional spring
  ½k|q - c|², c = (0.3, 0.2): a nonlinear potential on which schemes that coincide under
  uniform gravity differ (there the Lagrangian integrand is a polynomial that every admissible
  quadrature integrates exactly).  Gravity, length and spring constant are parameters.
* :func:`spring_pendulum_reference`: its reference solution from the angle ODE (DOP853, rtol
  1e-13), with the multiplier of eq. (70) of Wenger et al. (2017).
* :func:`pendulum_initial`, :func:`double_pendulum_3d_initial`: initial data on ``T C``.
* :func:`constraint_residuals`: ``max |g(q_k)|`` and ``max |G(q_k) v_k|`` over saved rows.
* :func:`fitted_order`: the log-log slope of errors against step sizes, every point in the fit.
* :func:`drift_measures`, :func:`assert_no_drift`: a bounded error tells from a drifting one.
* :class:`RelativisticParticle`: ``L = -m sqrt(1 - |v|^2) - k |q|^2 / 2``, a Lagrangian whose
  velocity Hessian depends on ``v`` (the inverse Legendre map goes through Newton).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy.integrate import solve_ivp

import vijax as vj

__all__ = [
    "SPRING_CENTRE",
    "Reference",
    "RelativisticParticle",
    "SpringPendulum",
    "constraint_residuals",
    "double_pendulum_3d_initial",
    "pendulum_initial",
    "spring_pendulum_reference",
]

SPRING_CENTRE = (0.3, 0.2)


class RelativisticParticle(vj.LagrangianSystem):
    """``L = -m sqrt(1 - |v|^2) - 1/2 k |q|^2`` (c = 1): not quadratic in v, so the inverse
    Legendre map goes through Newton; ``p = m v / sqrt(1 - |v|^2)``,
    ``v = p / sqrt(m^2 + |p|^2)``."""

    m: float = 1.3
    k: float = 0.8

    def lagrangian(self, q, v):
        return -self.m * jnp.sqrt(1.0 - jnp.vdot(v, v)) - 0.5 * self.k * jnp.vdot(q, q)


class SpringPendulum(vj.MechanicalSystem, vj.HolonomicSystem):
    """Unit point mass on ``|q| = l`` in the plane, ``g = (|q|² - l²)/2``, potential
    ``gravity * y + ½k|q - c|²`` with ``c = (0.3, 0.2)``; ``k``, ``l`` and ``gravity`` are
    differentiable parameters (``k = 0``: the plain Cartesian pendulum)."""

    k: float = 0.0
    l: float = 1.0
    gravity: float = 9.81

    def mass_matrix(self, q):
        return jnp.eye(2, dtype=q.dtype)

    def potential(self, q):
        c = jnp.array(SPRING_CENTRE, dtype=q.dtype)
        return self.gravity * q[1] + 0.5 * self.k * jnp.sum((q - c) ** 2)

    def holonomic(self, q):
        return jnp.atleast_1d(0.5 * (q @ q - self.l ** 2))


class PinnedBody(vj.LieGroupSystem, vj.HolonomicSystem):
    """A free rigid body on SE(3) (centre of mass at the body origin, central inertia I_c) in
    gravity, with its body point p pinned at the origin: Φ(g) = x + R p = 0.  It is the heavy
    top with inertia I_c + m(|p|² I - p pᵀ) about the pin and centre of mass -p."""

    inertia: tuple = (0.5, 0.8, 1.2)
    mass: float = 1.0
    gravity: float = 1.0
    pin: tuple = (0.0, 0.0, -1.0)
    quadratic_in_velocity = True

    @property
    def group(self):
        return vj.lie.SE3()

    def lagrangian(self, g, xi):
        v, w = xi[:3], xi[3:]
        return (0.5 * self.mass * jnp.dot(v, v)
                + 0.5 * jnp.sum(jnp.asarray(self.inertia, xi.dtype) * w ** 2)
                - self.mass * self.gravity * g[2, 3])

    def holonomic(self, g):
        return g[:3, 3] + g[:3, :3] @ jnp.asarray(self.pin, g.dtype)


class Reference(NamedTuple):
    q: np.ndarray    # (..., 2)
    v: np.ndarray    # (..., 2)
    lam: np.ndarray  # (...,): multiplier, eq. (70) of Wenger et al. (2017)


def spring_pendulum_reference(t, *, k: float, theta0: float, omega0: float = 0.0,
                              gravity: float = 9.81, l: float = 1.0) -> Reference:
    """:class:`SpringPendulum` from the angle ``theta0`` (from the downward vertical) and
    angular velocity ``omega0``, by DOP853 (rtol 1e-13, atol 1e-15) on the angle ODE
    ``l² theta'' = -grad V . dq/dtheta``.

    ``t`` a scalar: the state at ``t`` (the solver's last step lands on it); ``t`` a 1-D array
    of increasing times from 0: the states there (dense output), rows aligned with ``t``.
    """
    c = np.array(SPRING_CENTRE)

    def rhs(_, y):
        th, om = y
        q = l * np.array([np.sin(th), -np.cos(th)])
        dq = l * np.array([np.cos(th), np.sin(th)])       # dq/dtheta
        force = -np.array([0.0, gravity]) - k * (q - c)   # -grad V
        return [om, (force @ dq) / l ** 2]

    t = np.asarray(t, dtype=np.float64)
    if t.ndim == 0:
        r = solve_ivp(rhs, (0, float(t)), [theta0, omega0], method="DOP853", rtol=1e-13,
                      atol=1e-15)
        th, om = r.y[:, -1]
    else:
        r = solve_ivp(rhs, (0, t[-1]), [theta0, omega0], method="DOP853", rtol=1e-13,
                      atol=1e-15, t_eval=t)
        th, om = r.y
    q = l * np.stack([np.sin(th), -np.cos(th)], -1)
    v = (l * om)[..., None] * np.stack([np.cos(th), np.sin(th)], -1)
    # eq. (70) for this system: lam = (|v|² - q . grad V) / l².
    gradv = np.array([0.0, gravity]) + k * (q - c)
    lam = (np.sum(v * v, -1) - np.sum(q * gradv, -1)) / l ** 2
    return Reference(q, v, lam)


# An order fit may drop a point only where its error is at round-off (the plateau of
# :func:`vijax.diagnostics.estimate_order`, about 2e-13, with a decade of margin).
_PLATEAU = 1e4 * float(np.finfo(np.float64).eps)


def fitted_order(hs, errors) -> float:
    """:func:`vijax.diagnostics.estimate_order`, failing where it dropped a point above
    round-off: the estimator also drops a smallest-``h`` point whose local slope falls below
    half the slope before it, so an order test that does not check the points used would pass
    an order that collapses at the smallest step (errors 1.6e-3, 1e-4, 2.6e-5 at h = 0.2,
    0.1, 0.05: fitted 4.0 on the first two, last slope 1.9)."""
    est = vj.diagnostics.estimate_order(hs, errors)
    errors = np.asarray(errors, dtype=np.float64)
    assert np.all(errors[~est.used] <= _PLATEAU), (
        f"a point above round-off dropped from the order fit (an order collapsing at small h?): "
        f"hs = {list(hs)}, errors = {list(errors)}, used = {est.used}")
    return est.order


def drift_measures(t, err) -> tuple[float, float]:
    """``(t statistic, accumulated share)`` of the linear drift of ``err`` over ``t``: the slope
    fitted to 50 block means (:func:`vijax.diagnostics.drift`, which averages a bounded
    error's oscillation out) over its standard error, and the drift it accumulates over the
    run as a share of ``max |err|``."""
    t, err = np.asarray(t, dtype=np.float64), np.asarray(err, dtype=np.float64)
    fit = vj.diagnostics.drift(t, err)
    return fit.t_statistic, abs(fit.slope) * (t[-1] - t[0]) / fit.bound


def assert_no_drift(t, err, *, share: float = 0.05, label=""):
    """``err`` bounded without drift: the fitted drift statistically zero (``|t| < 3``) and
    below ``share`` of the error's magnitude over the run.  (Comparing the maxima of two
    halves of the run, ``second <= 2 first``, passes a linear drift as large as the
    oscillation itself.)"""
    t_stat, accumulated = drift_measures(t, err)
    assert abs(t_stat) < 3 and accumulated < share, (
        f"{label}: energy drift t = {t_stat:.2f}, accumulated {accumulated:.3f} of max |err|")


def pendulum_initial(theta0: float, omega0: float = 0.0):
    """``(q0, v0)`` of the unit-length planar pendulum at angle ``theta0`` from the downward
    vertical with angular velocity ``omega0`` (consistent: ``g = 0``, ``G v = 0``)."""
    q0 = jnp.array([np.sin(theta0), -np.cos(theta0)])
    v0 = omega0 * jnp.array([np.cos(theta0), np.sin(theta0)])
    return q0, v0


def double_pendulum_3d_initial():
    """:meth:`DoublePendulum3D.initial_conditions` with the velocity projected onto
    ``G v = 0``."""
    system = vj.systems.DoublePendulum3D()
    q0, v0 = system.initial_conditions()
    return q0, vj.constraints.project_velocity(system, q0, v0)


def constraint_residuals(system, q, v):
    """``(max_k |g(q_k)|, max_k |G(q_k) v_k|)`` over the rows of ``q`` and ``v`` (floats)."""
    g = jax.vmap(system.holonomic)(q)
    hidden = jax.vmap(lambda qk, vk: vj.constraints.hidden_constraint(system, qk, vk))(q, v)
    return float(jnp.max(jnp.abs(g))), float(jnp.max(jnp.abs(hidden)))


def equations(jaxpr, in_loops: bool = False, _inside: bool = False) -> list:
    """Every equation of a jaxpr, nested jaxprs included; ``in_loops``: only those inside the
    body of a ``while`` loop."""
    out = []
    for eqn in jaxpr.eqns:
        if _inside or not in_loops:
            out.append(eqn)
        for key, param in eqn.params.items():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    out += equations(sub, in_loops, _inside or (
                        eqn.primitive.name == "while" and key == "body_jaxpr"))
    return out


def primitives(jaxpr) -> list[str]:
    """The primitive of every equation in a jaxpr, nested jaxprs included."""
    return [eqn.primitive.name for eqn in equations(jaxpr)]


def while_loops(jaxpr) -> int:
    """The ``while`` loops in a jaxpr, nested ones included."""
    return primitives(jaxpr).count("while")


def with_and_without_misses(integrator, system, q0, v0, h: float, n: int):
    """``n`` steps from ``(q0, v0)`` with the warm start corrected by the predictor's misses
    (``vijax.integrators._prk_core.Misses``) and with the correction held off (its
    ``warm`` kept at 0), every solve converged: ``(corrected state, plain state, corrected updates,
    plain updates)``."""
    import equinox as eqx

    step = jax.jit(lambda s: integrator.step(system, s, h))
    plain = jax.jit(lambda s: integrator.step(system, eqx.tree_at(
        lambda x: x.misses.warm, s, jnp.zeros_like(s.misses.warm)), h))
    a = b = integrator.init(system, 0.0, q0, v0)
    updates_a = updates_b = 0
    for _ in range(n):
        (a, sa), (b, sb) = step(a), plain(b)
        assert bool(sa.converged) and bool(sb.converged)
        updates_a, updates_b = updates_a + int(sa.iterations), updates_b + int(sb.iterations)
    return a, b, updates_a, updates_b


def assert_miss_orders(hs, case, orders, tol: float = 0.3):
    """The warm start's error against the step's root at each step size of ``hs``:
    uncorrected, with the predictor's last miss, and with the trend of the last two
    (``vijax.integrators._prk_core.corrected``) -- least-squares log-log slopes within ``tol``
    of ``orders`` (three numbers).  ``case(h) -> (raw start, the state's Misses record, root)``;
    the record's first carried unknown is the one corrected."""
    from vijax.integrators._prk_core import corrected

    errors = {"raw": [], "last": [], "trend": []}
    for h in hs:
        raw, record, root = case(h)
        misses, warm = record.values[0], record.warm
        last_only = misses.at[1].set(misses[0])   # no trend
        for key, start in (("raw", raw), ("last", corrected(raw, last_only, warm)),
                           ("trend", corrected(raw, misses, warm))):
            errors[key].append(float(jnp.max(jnp.abs(start - root))))
    slope = {k: np.polyfit(np.log(hs), np.log(e), 1)[0] for k, e in errors.items()}
    for key, order in zip(("raw", "last", "trend"), orders):
        assert abs(slope[key] - order) < tol, (key, slope, errors)
