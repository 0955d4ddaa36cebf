"""Mechanical systems: the Lagrangian is the only physics a user writes.

Every derived object -- ``D1L``, ``D2L``, the Legendre map and its inverse, the velocity
Hessian, the energy -- comes from :mod:`jax` autodiff of :meth:`LagrangianSystem.lagrangian`.
"""

from __future__ import annotations

import abc
from typing import ClassVar, Literal, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .. import _linalg, constraints
from .._typing import Matrix, Scalar, Vector
from ..solvers import Newton

__all__ = ["LagrangianSystem", "MechanicalSystem", "PointMassSystem", "HolonomicSystem",
           "NonholonomicSystem", "ForcedSystem", "TimeDependentSystem"]


class LagrangianSystem(eqx.Module):
    """A mechanical system given by a Lagrangian ``L(q, v)`` on ``Q = R^n``.

    Subclass it, declare the parameters as fields (they are pytree leaves, hence
    differentiable) and implement :meth:`lagrangian`::

        class Pendulum(vj.LagrangianSystem):
            m: float = 1.0
            l: float = 1.0
            g: float = 9.81
            def lagrangian(self, q, v):
                return 0.5 * self.m * self.l**2 * v[0]**2 + self.m * self.g * self.l * jnp.cos(q[0])

    Optional declarations (class variables):

    * ``quadratic_in_velocity = True`` when ``L`` is a quadratic polynomial in ``v`` (any
      ``1/2 v^T M(q) v + a(q).v - V(q)``): the inverse Legendre map is then one linear solve
      instead of a Newton iteration.
    * ``ndim``: the configuration dimension, checked against initial conditions.

    Capabilities beyond the Lagrangian are declared by subclassing their base, never by
    defining an optional method: holonomic constraints by :class:`HolonomicSystem`,
    nonholonomic ones by :class:`NonholonomicSystem`, non-conservative forces and controls by
    :class:`ForcedSystem`, an explicitly time-dependent Lagrangian by
    :class:`TimeDependentSystem`.  Each integrator declares which of them it accepts
    (:meth:`vijax.AbstractIntegrator.accepts`).
    """

    quadratic_in_velocity: ClassVar[bool] = False
    ndim: ClassVar[Optional[int]] = None

    @abc.abstractmethod
    def lagrangian(self, q: Float[Array, " n"], v: Float[Array, " n"]) -> Float[Array, ""]:
        """The Lagrangian ``L(q, v)`` (a scalar)."""

    def at(self, t: Float[Array, ""]) -> "LagrangianSystem":
        """The system at time ``t``: itself, since ``L`` does not depend on time
        (:class:`TimeDependentSystem` sets its clock).  Integrators evaluate every derivative
        of ``L`` on ``system.at(t)`` at the time of the node."""
        return self

    # -- derivatives, all by autodiff -------------------------------------------------------
    def d1_lagrangian(self, q: Vector, v: Vector) -> Vector:
        """``D1L(q, v) = dL/dq``."""
        return jax.grad(self.lagrangian, argnums=0)(q, v)

    def momentum(self, q: Vector, v: Vector) -> Vector:
        """Legendre map ``p = D2L(q, v) = dL/dv``."""
        return jax.grad(self.lagrangian, argnums=1)(q, v)

    def derivatives(self, q: Vector, v: Vector) -> tuple[Vector, Vector]:
        """``(D1L, D2L)`` in one reverse pass."""
        return jax.grad(self.lagrangian, argnums=(0, 1))(q, v)

    def momentum_rate(self, q: Vector, v: Vector) -> Vector:
        """``∂(D2L)/∂t`` at fixed ``(q, v)``: zero, since ``L`` does not depend on time
        (:class:`TimeDependentSystem` differentiates its clock)."""
        return jnp.zeros_like(v)

    def velocity_hessian(self, q: Vector, v: Vector) -> Matrix:
        """``d^2L/dv^2`` (the generalised mass matrix for mechanical Lagrangians)."""
        return jax.jacfwd(self.momentum, argnums=1)(q, v)

    def inverse_velocity_hessian(self, q: Vector, v: Vector) -> Matrix:
        """``(d^2L/dv^2)^{-1}``; override when a closed form is known."""
        return _linalg.inv(self.velocity_hessian(q, v))

    def energy(self, q: Vector, v: Vector) -> Scalar:
        """Energy ``E = <D2L, v> - L``."""
        return jnp.vdot(self.momentum(q, v), v) - self.lagrangian(q, v)

    def hamiltonian(self, q: Vector, p: Vector, v_guess: Optional[Vector] = None) -> Scalar:
        """``H(q, p) = E(q, FL^{-1}(q, p))``."""
        return self.energy(q, self.velocity(q, p, v_guess))

    def velocity(self, q: Vector, p: Vector, v_guess: Optional[Vector] = None) -> Vector:
        """Inverse Legendre map: the ``v`` with ``D2L(q, v) = p``.

        One linear solve when the class declares ``quadratic_in_velocity``; otherwise damped
        Newton from ``v_guess`` (zero by default), differentiable by the implicit function
        theorem.
        """
        if self.quadratic_in_velocity:
            zero = jnp.zeros_like(p)
            return self.inverse_velocity_hessian(q, zero) @ (p - self.momentum(q, zero))
        guess = jnp.zeros_like(p) if v_guess is None else v_guess
        v, _ = Newton(damped=True).solve(lambda v: self.momentum(q, v) - p, guess)
        return v

    # -- consistent initial data (identity without constraints) -----------------------------
    def project_configuration(self, q: Vector) -> Vector:
        """The nearest consistent configuration (``q`` itself for an unconstrained system)."""
        return q

    def project_velocity(self, q: Vector, v: Vector) -> Vector:
        """The nearest consistent velocity at ``q`` (``v`` itself without constraints)."""
        return v


class HolonomicSystem(LagrangianSystem):
    """A system with holonomic constraints ``g(q) = 0``: implement :meth:`holonomic`.

    Combine it with the structure you declare, e.g.
    ``class CartesianPendulum(vj.PointMassSystem, vj.HolonomicSystem)``.  The augmented
    Lagrangian is ``L - g(q).lam`` (sign convention of :mod:`vijax.constraints`).
    """

    @abc.abstractmethod
    def holonomic(self, q: Float[Array, " n"]) -> Float[Array, " m"]:
        """Constraint values ``g(q)``, shape ``(m,)`` with ``m < n`` independent rows."""

    def project_configuration(self, q):
        """The point of ``g = 0`` nearest to ``q`` (:func:`vijax.constraints.project_position`)."""
        return constraints.project_position(self, q)

    def project_velocity(self, q, v):
        """``v`` projected onto ``G(q) v = 0`` (:func:`vijax.constraints.project_velocity`)."""
        return constraints.project_velocity(self, q, v)


class NonholonomicSystem(LagrangianSystem):
    """A system with nonholonomic constraints ``Φ(q, v) = 0``: implement :meth:`nonholonomic`.

    The constraint forces follow the Lagrange--d'Alembert (Chetaev) principle,
    ``d/dt D2L - D1L = D2Φ(q, v)^T λ`` (Martín de Diego & Sato Martín de Almagro (2022),
    eqs. (2)--(3)).  Declare how ``Φ`` depends on ``v`` in ``constraint_form``: ``"linear"``
    (``Φ = A(q) v``), ``"affine"`` (``A(q) v + a(q)``) or ``"nonlinear"`` (the default, the
    safe choice); methods that need linearity refuse the other forms and say which methods
    accept them.
    """

    #: ``"linear"``, ``"affine"`` or ``"nonlinear"`` in ``v``.
    constraint_form: ClassVar[Literal["linear", "affine", "nonlinear"]] = "nonlinear"

    @abc.abstractmethod
    def nonholonomic(self, q: Float[Array, " n"], v: Float[Array, " n"]) -> Float[Array, " m"]:
        """Constraint values ``Φ(q, v)``, shape ``(m,)``, ``m < n`` independent rows
        (``rank D2Φ = m``)."""

    def constraint_matrix(self, q: Vector, v: Vector) -> Matrix:
        """``D2Φ(q, v)`` (shape ``(m, n)``; the one-forms ``A(q)`` for linear and affine
        constraints), by :func:`jax.jacfwd`."""
        return jax.jacfwd(self.nonholonomic, argnums=1)(q, v)

    def distribution_frame(self, q: Vector) -> Matrix:
        """An analytic frame of the constraint distribution ``D_q = ker A(q)`` of linear
        constraints: shape ``(n, n - m)``, columns spanning ``D_q``.  Override it when one is
        known; :class:`vijax.DiscreteGradient` builds a Householder frame from ``A(q)``
        otherwise (its default, ``frame="qr"``), and refuses ``frame="system"`` for a system
        that does not override this method."""
        raise NotImplementedError(
            f"{type(self).__name__} does not define an analytic distribution_frame(q); "
            f"override it, or let the method build a frame from the constraint one-forms.")

    def project_velocity(self, q: Vector, v: Vector, *, max_steps: int = 20) -> Vector:
        """The velocity nearest to ``v`` (in the metric of the velocity Hessian) with
        ``Φ(q, v) = 0``: ``v <- v - H^{-1} A^T (A H^{-1} A^T)^{-1} Φ(q, v)``, exact in one
        update for linear and affine constraints, Gauss--Newton otherwise."""
        v = jnp.asarray(v)

        def update(_, w):
            A = self.constraint_matrix(q, w)
            hinv_at = self.inverse_velocity_hessian(q, v) @ A.T
            return w - hinv_at @ _linalg.solve(A @ hinv_at, self.nonholonomic(q, w))

        n_updates = 1 if self.constraint_form in ("linear", "affine") else max_steps
        return jax.lax.fori_loop(0, n_updates, update, v)


class ForcedSystem(LagrangianSystem):
    """A system with a non-conservative generalised force ``F(t, q, v, u)``: implement
    :meth:`force`.

    Damping, friction, actuation and explicitly time-dependent drives enter the integrators
    through the Lagrange--d'Alembert principle ``δ∫L dt + ∫F·δq dt = 0`` (Marsden & West
    (2001), §3; Ober-Blöbaum, Junge & Marsden (2011)): each variational method adds the
    virtual work of ``F`` with its own quadrature, which keeps its order.  ``u`` is the control
    (shape ``(control_dim,)``), fed by ``vijax.simulate(..., controls=...)``; it is ``None``
    when the class declares ``control_dim = 0`` (the default).

    Combine it with the other capabilities, e.g.
    ``class DampedPendulum(vj.ForcedSystem, vj.systems.CartesianPendulum)``.
    """

    #: Dimension of the control input ``u`` (0: no control, ``force`` receives ``None``).
    control_dim: ClassVar[int] = 0

    @abc.abstractmethod
    def force(self, t: Float[Array, ""], q: Float[Array, " n"], v: Float[Array, " n"],
              u: Optional[Float[Array, " c"]]) -> Float[Array, " n"]:
        """The generalised force (shape ``(n,)``, covariant: it is paired with ``δq``)."""


class TimeDependentSystem(LagrangianSystem):
    """An explicitly time-dependent Lagrangian ``L(t, q, v)`` (a driven or rheonomic
    system): the Lagrangian -- and, for a :class:`MechanicalSystem`, its mass matrix and
    potential -- read the time as ``self.time``::

        class ShakenPendulum(vj.TimeDependentSystem):   # pivot driven up and down
            a: float = 0.1
            omega: float = 20.0
            def lagrangian(self, q, v):
                yp_dot = -self.a * self.omega * jnp.sin(self.omega * self.time)
                yp = self.a * jnp.cos(self.omega * self.time)
                ...

    Integrators set the clock with :meth:`at` at the time of each stage or quadrature node,
    so every derivative of ``L`` (momenta, Legendre map, energy) is taken at fixed time, and
    the discrete Lagrangian ``h Σ b_i L(t_k + c_i h, Q^i, V^i)`` keeps the method's order
    (Marsden & West (2001), Part 4, time-dependent mechanics).  The energy is no longer
    conserved: ``dE/dt = -∂L/∂t``.

    Constraints may read the clock too (rheonomic ``g(t, q)`` of a :class:`HolonomicSystem`,
    ``Φ(t, q, v)`` of a :class:`NonholonomicSystem`): the integrators evaluate them at the
    times of their nodes, the hidden constraint becomes ``G v + ∂g/∂t = 0``, and the helpers
    of :mod:`vijax.constraints` work at the clock of the system they are given
    (``system.at(t)``).
    """

    #: The time at which the Lagrangian is evaluated (set by :meth:`at`; 0 by default).
    time: Float[Array, ""] = eqx.field(default=0.0, kw_only=True)

    def at(self, t):
        """This system with its clock set to ``t``."""
        return eqx.tree_at(lambda s: s.time, self, t)

    def momentum_rate(self, q, v):
        """``∂(D2L)/∂t`` at fixed ``(q, v)`` and the current ``self.time``, by
        :func:`jax.jvp` in the clock."""
        t = jnp.asarray(self.time, q.dtype)
        return jax.jvp(lambda s: self.at(s).momentum(q, v), (t,), (jnp.ones_like(t),))[1]


class MechanicalSystem(LagrangianSystem):
    """``L = 1/2 v^T M(q) v - V(q)``: implement :meth:`mass_matrix` and :meth:`potential`.

    Declaring the structure lets integrators use ``M(q)`` directly (no Hessian by autodiff)
    and makes the inverse Legendre map a single linear solve.
    """

    quadratic_in_velocity: ClassVar[bool] = True
    #: Declare ``True`` when ``M`` does not depend on ``q`` (nor, for a
    #: :class:`TimeDependentSystem`, on time): VPRK then preconditions its stage iteration
    #: with one inverse per step instead of one per stage and update.
    constant_mass: ClassVar[bool] = False

    @abc.abstractmethod
    def mass_matrix(self, q: Float[Array, " n"]) -> Float[Array, "n n"]:
        """Symmetric positive-definite mass matrix ``M(q)``."""

    @abc.abstractmethod
    def potential(self, q: Float[Array, " n"]) -> Float[Array, ""]:
        """Potential energy ``V(q)``."""

    def lagrangian(self, q, v):
        return 0.5 * _linalg.mm(v, _linalg.mm(self.mass_matrix(q), v)) - self.potential(q)

    def momentum(self, q, v):
        # p = M(q) v in closed form (M symmetric), not as the gradient of L: under jax.vmap
        # over many members the gradient's transposed products are reductions over arrays of
        # (members, stages, n, n) that XLA:CPU hands to its YNNPACK fusions, several times
        # slower in float64 than its own loops (chaotic ensemble of 1024 members,
        # NonholonomicVPRK.lobatto(3): 64 % of the run in one such reduction)
        return _linalg.mm(self.mass_matrix(q), v)

    def derivatives(self, q, v):
        return self.d1_lagrangian(q, v), self.momentum(q, v)

    def velocity_hessian(self, q, v):
        return self.mass_matrix(q)

    def inverse_mass_matrix(self, q: Vector) -> Matrix:
        """``M(q)^{-1}``; override when a closed form is known."""
        return _linalg.inv(self.mass_matrix(q))

    def inverse_velocity_hessian(self, q, v):
        return self.inverse_mass_matrix(q)

    def velocity(self, q, p, v_guess=None):
        return self.inverse_mass_matrix(q) @ p

    def energy(self, q, v):
        return 0.5 * jnp.vdot(v, self.mass_matrix(q) @ v) + self.potential(q)


class PointMassSystem(MechanicalSystem):
    """``M = m I`` in any dimension: implement :meth:`potential` only.

    The mass matrix and its inverse are closed forms and ``constant_mass`` is declared.
    """

    m: float = 1.0
    constant_mass: ClassVar[bool] = True

    def mass_matrix(self, q):
        return self.m * jnp.eye(q.shape[-1], dtype=q.dtype)

    def inverse_mass_matrix(self, q):
        return jnp.eye(q.shape[-1], dtype=q.dtype) / self.m
