"""Holonomic constraints ``g(q) = 0``: Jacobians, consistent initial data and multipliers.

Sign convention (Wenger, Ober-Blöbaum & Leyendecker (2017), eqs. (1)-(3)): the augmented
Lagrangian is ``L - g(q).lam``, so the equations of motion read
``d/dt D2L - D1L + G(q)^T lam = 0`` with ``G = Dg``.  For the
pendulum hanging at rest ``lam`` is the (positive) tension divided by the length.

Rheonomic constraints ``g(t, q) = 0``: a :class:`vijax.TimeDependentSystem` whose
``holonomic(q)`` reads its clock ``self.time`` (a prescribed motion: a pivot moved on a
given path, a hoop of given radius).  The constraint forces stay ``G(t, q)^T lam`` (the
virtual displacements are taken at fixed time), the hidden constraint becomes
``G v + ∂g/∂t = 0``, and every function here evaluates ``g`` at the clock of the system it
is given (``system.at(t)``).  Whether ``holonomic`` reads the clock is decided from its
program while tracing (:func:`reads_clock`), so a constraint that does not pays nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from . import _linalg
from ._checks import is_traced, refuse
from ._tracing import depends_on_first
from ._typing import Constraints, Vector, VectorLike
from .solvers import AbstractFixedPoint, FixedPoint, Newton

if TYPE_CHECKING:  # the systems build on this module
    from .systems import HolonomicSystem

__all__ = [
    "constraint_jacobian",
    "project_position",
    "project_velocity",
    "project_momentum",
    "multiplier",
    "hidden_constraint",
    "constraint_rate",
    "reads_clock",
    "check_consistent",
    "saddle_point_inverse",
    "row_round_off",
    "InconsistentInitialData",
]


class InconsistentInitialData(ValueError):
    """Initial data off the constraint manifold (or its tangent bundle)."""


def constraint_jacobian(system: HolonomicSystem, q: Vector) -> Float[Array, "m n"]:
    """``G(q) = Dg(q)``, shape ``(m, n)``, by :func:`jax.jacfwd`."""
    return jax.jacfwd(system.holonomic)(q)


def _clock(system, q, t=None):
    """``t``, or when it is ``None`` the clock of ``system`` (``system.time`` of a
    :class:`vijax.TimeDependentSystem`, 0 otherwise), in the dtype of ``q`` (an array or a
    group element)."""
    from .systems import TimeDependentSystem  # the systems build on this module
    if t is None:
        t = system.time if isinstance(system, TimeDependentSystem) else 0.0
    return jnp.asarray(t, jax.tree_util.tree_leaves(q)[0].dtype)


def reads_clock(system: HolonomicSystem, q) -> bool:
    """Whether ``system.holonomic`` reads the clock of a :class:`vijax.TimeDependentSystem`
    (a rheonomic constraint ``g(t, q)``), decided from its program while tracing (no value
    is computed; ``q`` gives the shapes)."""
    from .systems import TimeDependentSystem  # the systems build on this module
    if not isinstance(system, TimeDependentSystem):
        return False
    return depends_on_first(lambda t, x: system.at(t).holonomic(x), _clock(system, q), q)


def constraint_rate(system: HolonomicSystem, q) -> Optional[Constraints]:
    """``∂g/∂t`` at ``q`` and the clock of ``system`` (a rheonomic constraint, by
    :func:`jax.jvp` in the clock), or ``None`` when ``holonomic`` does not read the clock."""
    if not reads_clock(system, q):
        return None
    t = _clock(system, q)
    return jax.jvp(lambda s: system.at(s).holonomic(q), (t,), (jnp.ones_like(t),))[1]


def _plus_rate(x, system, q):
    rate = constraint_rate(system, q)
    return x if rate is None else x + rate


def hidden_constraint(system: HolonomicSystem, q: Vector, v: Vector) -> Constraints:
    """Velocity-level (hidden) constraint ``G(q) v`` (``G v + ∂g/∂t`` for a rheonomic
    constraint)."""
    return _plus_rate(constraint_jacobian(system, q) @ v, system, q)


def project_position(system: HolonomicSystem, q: VectorLike, *, max_steps: int = 50) -> Vector:
    """The point of ``g = 0`` nearest to ``q`` in the metric of the velocity Hessian.

    Gauss--Newton ``q <- q - H^{-1} G^T (G H^{-1} G^T)^{-1} g(q)`` with ``H = d2L/dv2`` at
    ``(q, 0)``; converges quadratically from any point close to the manifold.
    """
    q = jnp.asarray(q)
    zero = jnp.zeros_like(q)

    def update(_, x):
        g = system.holonomic(x)
        G = constraint_jacobian(system, x)
        hinv_gt = system.inverse_velocity_hessian(x, zero) @ G.T
        return x - hinv_gt @ _linalg.solve(G @ hinv_gt, g)

    return jax.lax.fori_loop(0, max_steps, update, q)


def project_velocity(system: HolonomicSystem, q: Vector, v: Vector) -> Vector:
    """Project ``v`` onto ``G(q) v = 0`` (``G v + ∂g/∂t = 0`` for a rheonomic constraint)
    along ``H^{-1} G^T`` (the kinetic-energy metric): the same velocity as
    :func:`project_momentum` of ``p = D2L(q, v)`` for mechanical ``L``."""
    G = constraint_jacobian(system, q)
    hinv_gt = system.inverse_velocity_hessian(q, v) @ G.T
    return v - hinv_gt @ _linalg.solve(G @ hinv_gt, _plus_rate(G @ v, system, q))


def project_momentum(system: HolonomicSystem, q: Vector, p: Vector,
                     v_guess: Optional[Vector] = None) -> Vector:
    """Project ``p`` onto the hidden constraint within its class ``p + span(G^T)``:
    ``P(q, p) = p - G^T mu`` with ``G FL^{-1}(q, p - G^T mu) = 0`` (Wenger, Ober-Blöbaum &
    Leyendecker (2017), eq. (4); one linear solve when ``L`` is quadratic in ``v``, Newton in
    ``mu`` otherwise).  For a rheonomic constraint the condition is ``G v + ∂g/∂t = 0``."""
    G = constraint_jacobian(system, q)
    rate = constraint_rate(system, q)

    def residual(mu):
        gv = G @ system.velocity(q, p - G.T @ mu, v_guess)
        return gv if rate is None else gv + rate

    mu0 = jnp.zeros(G.shape[0], dtype=p.dtype)
    if system.quadratic_in_velocity:
        # Exact in one Newton step: residual is affine in mu.
        jac = jax.jacfwd(residual)(mu0)
        mu = _linalg.solve(jac, -residual(mu0))
    else:
        mu, _ = Newton().solve(residual, mu0)
    return p - G.T @ mu


class _ConstrainedFixedPoint(AbstractFixedPoint):
    """:class:`~vijax.solvers.FixedPoint` with the straight-line start measured for the
    constrained stage equations: none on a CPU (on the Cartesian pendulum as fast per step as 1
    or 2 updates, and 0.5--0.7 s less compile time for ``GalerkinVI.gauss(3)`` and
    ``gauss(4)``); on a GPU the fixed point's default."""

    def _default_min_steps(self) -> dict:
        return {"cpu": 0, "gpu": FixedPoint()._default_min_steps()["gpu"]}


def default_solver(kappa: float = 0.1) -> AbstractFixedPoint:
    """The stage solver of :class:`vijax.HolonomicVPRK` and :class:`vijax.GalerkinVI` unless
    one is given: a fixed point preconditioned by :func:`saddle_point_inverse`, stopping at a
    tenth of the tolerance (``kappa=0.1``: after a fast transient the observed contraction
    rate underestimates the slowest mode's), its straight-line start chosen per backend when
    the step is compiled.  The nonholonomic PRK methods use it with ``kappa=0.01`` and their
    own preconditioner (:func:`vijax.integrators._prk_core.nonholonomic_precond`)."""
    return _ConstrainedFixedPoint(kappa=kappa)


def row_round_off(q: Vector, h, stages: int):
    """The round-off level, in multiples of the solver's tolerance (10 eps), of the impulses
    the constrained stage equations solve for: ``stages^2 |q| / h``.

    The constraint rows ``g(Q)/h`` carry round-off ``eps |q| / h``, which the impulses
    ``h lambda`` inherit through the bordered system, amplified at inner stages by its
    conditioning.  Measured on the 3-D double pendulum, where the increments of the solve
    stagnate at round-off: about ``0.16 |q| / h`` tolerances for RATTLE (1020 at h = 1.6e-4,
    |q| = 1.5), 1.1e4-6e4 for the inner stages of Lobatto IIIA-IIIB(5) there, 11 to 60 times
    RATTLE's; this level is 3.9e4 and 2.4e5 there.  Passed to the stage solver as ``stall_level``
    (:meth:`vijax.solvers.AbstractRootSolver.solve`) by the holonomic methods: at the usual
    step sizes it is below the default level (1000) and changes nothing."""
    return stages**2 * jnp.max(jnp.abs(q)) / jnp.abs(h)


def saddle_point_inverse(system: HolonomicSystem, q: Vector, v: Vector, K, B, C, G_cols,
                         G_rows):
    """``(R, T) -> (X, Y)``: the solution of the saddle-point system

        sum_b K_ab H X_b + sum_k B_ak G_k^T Y_k = R_a,     sum_b C_lb Gr_l X_b = T_l,

    with ``H`` the velocity Hessian at ``(q, v)``, ``G_k = G_cols[k]`` and ``Gr_l = G_rows[l]``
    constraint Jacobians (shape ``(m, n)`` each), ``K``, ``B``, ``C`` small coefficient matrices
    (``K`` invertible, ``C K^-1 B`` square).  ``R`` has shape ``(len(K), n)``, ``T`` and ``Y``
    ``(len(C), m)``.

    It is the approximate Jacobian of the stage equations of the constrained methods
    (multipliers as impulses ``h lam``, constraint rows ``g / h``): a velocity-Hessian block per
    stage coupled by the tableau or quadrature weights, bordered by constraint Jacobians --
    the structure of the Lobatto IIIA--IIIB and SHAKE/RATTLE equations (Hairer, Lubich &
    Wanner (2006), §VII.1), exact up to terms of order ``h`` when ``H`` and the ``G`` are taken
    at the predicted stage values.  The velocity block is eliminated (a Schur complement, our
    construction): ``Y`` solves one dense ``(len(C) m)``-square system, whose matrix is formed
    and inverted once per step, and ``X = K^-1 (R - B G^T Y) H^-1`` (``H`` symmetric).
    """
    dtype = q.dtype
    as_j = lambda x: jnp.asarray(x, dtype)  # noqa: E731
    k_inv = as_j(np.linalg.inv(K) if isinstance(K, np.ndarray) else _linalg.inv(K))
    h_inv = system.inverse_velocity_hessian(q, v)
    kb = _linalg.mm(k_inv, as_j(B))
    ckb = _linalg.mm(as_j(C), kb)                                           # (z, z)
    z, m, n = G_rows.shape
    g_h = _linalg.mm(G_rows.reshape(z * m, n), h_inv).reshape(z, m, n)     # Gr_l H^-1
    schur = ckb[:, None, :, None] * _linalg.mm(
        g_h.reshape(z * m, n), G_cols.reshape(z * m, n).T).reshape(z, m, z, m)
    solve_y = _linalg.factor(schur.reshape(z * m, z * m))

    def apply(R, T):
        u = _linalg.mm(k_inv, R)
        cu = _linalg.mm(as_j(C), u)
        rhs = sum(g_h[:, :, j] * cu[:, None, j] for j in range(n)) - T     # Gr_l H^-1 (C u)_l
        Y = solve_y(rhs.reshape(-1)).reshape(z, m)
        gty = sum(G_cols[:, a, :] * Y[:, a, None] for a in range(m))       # G_k^T Y_k
        return _linalg.mm(u - _linalg.mm(kb, gty), h_inv.T), Y

    return apply


def multiplier(system: HolonomicSystem, q: Vector, v: Vector,
               force: Optional[Vector] = None) -> Constraints:
    """The multiplier ``lam(q, v)`` of the continuous equations.

    Differentiating ``G(q) v = 0`` twice along the motion gives
    ``(G H^{-1} G^T) lam = G H^{-1} f + G_q(v, v)`` with ``H = d2L/dv2`` and
    ``f = D1L - (d D2L / dq) v - ∂(D2L)/∂t + F`` (Wenger, Ober-Blöbaum & Leyendecker (2017),
    eq. (70); ``∂(D2L)/∂t`` for a :class:`vijax.TimeDependentSystem` at its ``time``; ``F``
    the value of the generalised force of a :class:`vijax.ForcedSystem` at ``(t, q, v, u)``,
    when given).  For a rheonomic constraint ``G_q(v, v)`` becomes the second derivative of
    ``g(t + s, q + s v)`` in ``s``, ``G_q(v, v) + 2 ∂_t G v + ∂²g/∂t²``.
    """
    f = _lagrangian_force(system, q, v)
    if force is not None:
        f = f + force
    return _multiplier_of(system, q, v, f, constraint_jacobian(system, q),
                          system.inverse_velocity_hessian(q, v))


def _lagrangian_force(system, q, v):
    """``D1L - (d D2L/dq) v - ∂(D2L)/∂t`` at the clock of ``system``: the unconstrained,
    unforced motion is ``H a`` = this, ``H = d2L/dv2``."""
    mixed = jax.jacfwd(system.momentum, argnums=0)(q, v)
    return system.d1_lagrangian(q, v) - mixed @ v - system.momentum_rate(q, v)


def _multiplier_of(system, q, v, f, G, hinv):
    """:func:`multiplier` from the force ``f`` (``H a = f - Gᵀλ``), ``G`` and ``H^{-1}``."""
    if reads_clock(system, q):
        t = _clock(system, q)

        def along(s):   # g(t + s, q + s v)
            return system.at(t + s).holonomic(q + s * v)

        one = jnp.ones_like(t)
        gqvv = jax.jvp(lambda s: jax.jvp(along, (s,), (one,))[1], (0.0 * t,), (one,))[1]
    else:
        gqvv = jax.jvp(lambda x: constraint_jacobian(system, x), (q,), (v,))[1] @ v
    return _linalg.solve(G @ hinv @ G.T, G @ hinv @ f + gqvv)


def check_consistent(system: HolonomicSystem, q0: Vector, v0: Vector, tol: float, *,
                     velocity: bool = True) -> tuple[Vector, Vector]:
    """Refuse initial data off ``g = 0`` (and, with ``velocity``, off the hidden constraint
    ``G(q) v = 0``, ``G v + ∂g/∂t = 0`` for a rheonomic constraint), or with a
    rank-deficient constraint Jacobian, naming the fix.  ``system`` at the initial time
    (``system.at(t0)``).

    On concrete values it raises; on traced values (under :func:`jax.jit`) the same checks
    run in the compiled code (:func:`equinox.error_if`, derivatives included) and the
    returned ``(q0, v0)`` carry them, so use the returned values."""
    g = system.holonomic(q0)
    G = constraint_jacobian(system, q0)
    name = type(system).__name__
    if G.ndim != 2 or G.shape[1] != q0.shape[0] or G.shape[0] == 0:
        raise ValueError(f"{name}.holonomic(q) must return a 1-D array of m >= 1 constraint "
                         f"values.")
    # the same expressions on NumPy values (eager) or traced ones (in the graph)
    xp = jnp if is_traced((g, G, v0)) else np
    data = (q0, v0)
    g, G, v = (xp.asarray(x) for x in (g, G, v0))
    sv = xp.linalg.svd(G, compute_uv=False)
    rank = (f"The constraint Jacobian of {name}.holonomic has rank deficiency at q0: the "
            f"constraints are not independent there. Remove redundant constraints or start "
            f"away from the singular configuration.")
    data = refuse(data, ~(sv[-1] > 1e3 * xp.finfo(G.dtype).eps * xp.maximum(sv[0], 1.0)),
                  rank, lambda: rank.replace("at q0:", f"at q0 (singular values {sv}):"))
    # a rheonomic constraint is projected at the initial time
    at_t0 = "system.at(t0)" if reads_clock(system, q0) else "system"
    gap = xp.max(xp.abs(g))
    off = (f"q0 violates {name}.holonomic (> {tol:.1e}). Project it with "
           f"vijax.constraints.project_position({at_t0}, q0), or pass project=True to "
           f"simulate.")
    data = refuse(data, ~(gap <= tol), off, lambda: off.replace("(>", f"by {gap:.2e} (>"),
                  InconsistentInitialData)
    if velocity:
        rate = constraint_rate(system, q0)
        drift = xp.max(xp.abs(G @ v if rate is None else G @ v + xp.asarray(rate)))
        law = "G(q0) v0 = 0" if rate is None else "G(t0, q0) v0 + ∂g/∂t(t0, q0) = 0"
        hidden = (f"v0 violates the hidden constraint {law} of {name} (> {tol:.1e}). "
                  f"Project it with vijax.constraints.project_velocity({at_t0}, q0, v0) (or "
                  f"project_momentum for p0), or pass project=True to simulate.")
        data = refuse(data, ~(drift <= tol), hidden,
                      lambda: hidden.replace("(>", f"by {drift:.2e} (>"), InconsistentInitialData)
    return data
    g, G = np.asarray(g), np.asarray(G)
    sv = np.linalg.svd(G, compute_uv=False)
    if sv.size == 0 or sv[-1] <= 1e3 * np.finfo(G.dtype).eps * max(sv[0], 1.0):
        raise ValueError(rank.replace("at q0:", f"at q0 (singular values {sv}):"))
    if not np.max(np.abs(g)) <= tol:
        raise InconsistentInitialData(off.replace("(>", f"by {np.max(np.abs(g)):.2e} (>"))
    if velocity:
        res = np.asarray(G @ np.asarray(v0))
        if not np.max(np.abs(res)) <= tol:
            raise InconsistentInitialData(
                hidden.replace("(>", f"by {np.max(np.abs(res)):.2e} (>"))
    return q0, v0


# --------------------------------------------------------------------------------------------
# Nonholonomic constraints Φ(q, v) = 0
# --------------------------------------------------------------------------------------------
# Martín de Diego & Sato Martín de Almagro (2022), §2: the Lagrange--d'Alembert (Chetaev)
# equations  d/dt D2L - D1L = D2Φ(q, v)^T λ (+ F),  Φ(q, v) = 0.  Every derivative below is
# taken by autodiff of the system's Lagrangian and constraint.

import equinox as eqx  # noqa: E402 (this section's own import)

__all__ += ["nonholonomic_acceleration", "nonholonomic_multiplier",
            "check_nonholonomic_consistent"]


def _generalised_force(system, q, v, t, u):
    """``f = D1L - (d D2L/dq) v - ∂_t D2L (+ F(t, q, v, u))`` at the time ``t`` (zero
    controls when ``u`` is ``None``), so that the unconstrained motion is ``H a = f``."""
    from .systems import ForcedSystem  # the systems build on this module
    f = _lagrangian_force(system.at(t), q, v)
    if isinstance(system, ForcedSystem):
        if u is None and system.control_dim:
            u = jnp.zeros((system.control_dim,), q.dtype)
        f = f + system.force(t, q, v, u)
    return f


def nonholonomic_acceleration(system, q: Vector, v: Vector, t=None, u=None
                              ) -> tuple[Vector, Constraints]:
    """The acceleration and the multiplier ``(a, λ)`` of the continuous nonholonomic equations
    at ``(t, q, v)``: the index-1 form with the multiplier eliminated.

    With the free acceleration ``a_free = H^{-1} f`` (``H = d2L/dv2``,
    ``f = D1L - (d D2L/dq) v``, plus the force ``F(t, q, v, u)`` of a
    :class:`vijax.ForcedSystem` and ``-∂_t D2L`` of a :class:`vijax.TimeDependentSystem`;
    ``t=None``: the system's own clock, ``system.time``),
    differentiating ``Φ(q, v) = 0`` along the motion gives (Martín de Diego & Sato Martín de
    Almagro (2022), eq. (4); ``+ ∂Φ/∂t`` in the bracket for a constraint that reads the clock
    of a :class:`vijax.TimeDependentSystem`)

        λ = -C^{-1} (D1Φ(q, v) v + D2Φ(q, v) a_free),    C = D2Φ H^{-1} D2Φ^T,

    and ``a = a_free + H^{-1} D2Φ^T λ``.  It holds for linear, affine and nonlinear ``Φ``.
    ``u`` defaults to zero controls.  Compiled (:func:`equinox.filter_jit`): an eager call
    costs one compilation per system class instead of one dispatch per primitive."""
    return _nonholonomic_acceleration(system, q, v, t, u)


@eqx.filter_jit
def _nonholonomic_acceleration(system, q, v, t, u):
    t = _clock(system, q, t)
    sys_t = system.at(t)
    f = _generalised_force(system, q, v, t, u)
    A = sys_t.constraint_matrix(q, v)
    hinv = _linalg.inv(sys_t.velocity_hessian(q, v))
    a_free = hinv @ f
    # D1Φ v + ∂Φ/∂t: the derivative along (q + s v, t + s) (the clock of a
    # TimeDependentSystem; nothing for a system without one)
    d1phi_v = jax.jvp(lambda x, s: system.at(s).nonholonomic(x, v), (q, t),
                      (v, jnp.ones_like(t)))[1]
    lam = -_linalg.solve(A @ hinv @ A.T, d1phi_v + A @ a_free)
    return a_free + hinv @ (A.T @ lam), lam


def nonholonomic_multiplier(system, q: Vector, v: Vector, t=None, u=None) -> Constraints:
    """The exact multiplier ``λ(q, v)`` of the continuous nonholonomic equations
    (Martín de Diego & Sato Martín de Almagro (2022), eq. (4);
    :func:`nonholonomic_acceleration`): the consistent ``λ0`` that
    :class:`vijax.NonholonomicVPRK` needs for its full order."""
    return nonholonomic_acceleration(system, q, v, t, u)[1]


def _rank_messages(kind: str, name: str, m: int) -> list[str]:
    return [f"The {kind} of {name}.nonholonomic has rank {r} < m = {m} at (q0, v0): the "
            f"constraint rows are not independent (Martín de Diego & Sato Martín de Almagro "
            f"(2022), §2: rank D2Φ = m and an invertible C = D2Φ H^-1 D2Φ^T are needed). "
            f"Remove dependent rows or start away from the singular state."
            for r in range(m + 1)]


def check_nonholonomic_consistent(system, q0: Vector, v0: Vector, tol: float
                                  ) -> tuple[Vector, Vector]:
    """Refuse initial velocities off ``Φ(q0, v0) = 0`` (:class:`InconsistentInitialData`,
    naming the fix ``system.project_velocity(q0, v0)``) and dependent constraint rows
    (``rank D2Φ < m``, or a singular compatibility matrix ``C = D2Φ H^{-1} D2Φ^T``; the
    message gives the measured rank).

    On concrete values it raises; on traced values (under :func:`jax.jit`) the same checks run
    in the compiled code (:func:`equinox.error_if`) and the returned ``(q0, v0)`` carry them,
    so use the returned values."""
    name = type(system).__name__
    phi = system.nonholonomic(q0, v0)
    if phi.ndim != 1 or phi.shape[0] == 0 or phi.shape[0] >= v0.shape[0]:
        raise ValueError(f"{name}.nonholonomic(q, v) must return a 1-D array of 1 <= m < n "
                         f"constraint values; got shape {phi.shape} for n = {v0.shape[0]}.")
    m = phi.shape[0]

    def compatibility(q, v):
        A = system.constraint_matrix(q, v)
        return A @ system.inverse_velocity_hessian(q, v) @ A.T

    xp = jnp if is_traced((q0, v0, system)) else np
    phi = xp.asarray(phi)
    data = (q0, v0)
    # Each matrix is built from the data the check before returned: traced, the singular
    # value decompositions run one after the other (under jax.vmap two batched LAPACK calls
    # at once can deadlock XLA:CPU's thread pool with jaxlib 0.10, docs/ensembles.md).
    for kind, build in (("constraint matrix D2Φ", system.constraint_matrix),
                        ("compatibility matrix C = D2Φ H^-1 D2Φ^T", compatibility)):
        mat = xp.asarray(build(*data))
        sv = xp.linalg.svd(xp.where(xp.isfinite(mat), mat, 0), compute_uv=False)
        rank = xp.sum(sv > 1e3 * xp.finfo(mat.dtype).eps * xp.maximum(sv[0], 1.0))
        messages = _rank_messages(kind, name, m)
        data = refuse(data, rank < m, messages,
                      lambda r=rank, msgs=messages: msgs[int(r)], index=xp.minimum(rank, m))
    gap = xp.max(xp.abs(phi))
    off = (f"v0 violates the nonholonomic constraint {name}.nonholonomic(q0, v0) = 0 "
           f"(> {tol:.1e}). Project it with system.project_velocity(q0, v0), or pass "
           f"project=True to simulate.")
    return refuse(data, ~(gap <= tol), off, lambda: off.replace("(>", f"by {gap:.2e} (>"),
                  InconsistentInitialData)
