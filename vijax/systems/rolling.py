"""Nonholonomic test systems with linear constraints: rolling and skating.

The examples of Celledoni, Farré Puiggalí, Høiseth & Martín de Diego (2016), §2 and §4, with
the paper's parameters and initial data as defaults.  Each is a :class:`vijax.MechanicalSystem`
and a :class:`vijax.NonholonomicSystem` with ``constraint_form = "linear"``
(``Φ(q, v) = A(q) v``) and supplies an analytic frame ``distribution_frame(q)`` of the
constraint distribution (the paper's adapted frame; the discrete-gradient integrators build
one by QR when it is not asked for).  The energy is :meth:`~vijax.MechanicalSystem.energy`.

The Euler--Poincaré--Suslov problem lives on the Lie algebra so(3), which vijax's
configuration spaces (``R^n``) do not model: :class:`SuslovProblem` is its reduced
almost-Poisson form (their §4.3), integrated by
:func:`vijax.integrators.discrete_gradients.skew_gradient_step`.
"""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from ._base import MechanicalSystem, NonholonomicSystem, PointMassSystem

__all__ = ["VerticalDisk", "ChaplyginSleigh", "QuarticNonholonomic", "CVTGearbox",
           "PendulumDrivenCVT", "SuslovProblem"]


class VerticalDisk(MechanicalSystem, NonholonomicSystem):
    """Vertical rolling disk, ``q = (x1, x2, θ, φ)`` (contact point, heading, rolling angle)
    (Celledoni et al. (2016), §2): ``L = ½[m(x1'² + x2'²) + J_θ θ'² + J_φ φ'²]``, rolling
    without slipping ``x1' = r φ' cos θ``, ``x2' = r φ' sin θ``."""

    m: float = 1.0
    r: float = 0.5
    J_theta: float = 0.3
    J_phi: float = 0.2

    constraint_form: ClassVar[str] = "linear"
    ndim: ClassVar[int] = 4

    def mass_matrix(self, q):
        d = jnp.stack([self.m, self.m, self.J_theta, self.J_phi]).astype(q.dtype)
        return jnp.diag(d)

    def potential(self, q):
        return jnp.zeros((), q.dtype)

    def nonholonomic(self, q, v):
        th = q[2]
        return jnp.stack([v[0] - self.r * v[3] * jnp.cos(th), v[1] - self.r * v[3] * jnp.sin(th)])

    def distribution_frame(self, q):
        """``X1 = r cos θ ∂x1 + r sin θ ∂x2 + ∂φ``, ``X2 = ∂θ``."""
        th = q[2]
        one, zero = jnp.ones((), q.dtype), jnp.zeros((), q.dtype)
        x1 = jnp.stack([self.r * jnp.cos(th), self.r * jnp.sin(th), zero, one])
        x2 = jnp.stack([zero, zero, one, zero])
        return jnp.stack([x1, x2], axis=1)

    def initial(self, rho=(1.3, 0.7), q0=(0.0, 0.0, 0.0, 0.0)):
        """``(q0, v0)`` from the reduced momenta ``ρ = ((m r² + J_φ) φ', J_θ θ')``."""
        q0 = jnp.asarray(q0, dtype=jnp.float64)
        om1 = rho[0] / (self.m * self.r ** 2 + self.J_phi)
        om2 = rho[1] / self.J_theta
        th = q0[2]
        v0 = jnp.stack([self.r * om1 * jnp.cos(th), self.r * om1 * jnp.sin(th),
                        jnp.asarray(om2, q0.dtype), jnp.asarray(om1, q0.dtype)])
        return q0, v0


class ChaplyginSleigh(MechanicalSystem, NonholonomicSystem):
    """Chaplygin sleigh, ``q = (x1, x2, θ)``: blade contact point and orientation; mass ``m``,
    inertia ``J`` about the centre of mass, which lies a distance ``a`` along the blade
    (Celledoni et al. (2016), §4.2; the paper's ``J = 8``, ``a = m = 1`` as defaults).  The
    blade does not slip sideways: ``-x1' sin θ + x2' cos θ = 0``."""

    m: float = 1.0
    J: float = 8.0
    a: float = 1.0

    constraint_form: ClassVar[str] = "linear"
    ndim: ClassVar[int] = 3

    def mass_matrix(self, q):
        th = q[2]
        m, ma = self.m, self.m * self.a
        s, c = jnp.sin(th), jnp.cos(th)
        zero = jnp.zeros((), q.dtype)
        return jnp.stack([jnp.stack([m + zero, zero, -ma * s]),
                          jnp.stack([zero, m + zero, ma * c]),
                          jnp.stack([-ma * s, ma * c, self.J + ma * self.a + zero])])

    def potential(self, q):
        return jnp.zeros((), q.dtype)

    def nonholonomic(self, q, v):
        th = q[2]
        return jnp.atleast_1d(-v[0] * jnp.sin(th) + v[1] * jnp.cos(th))

    @property
    def k(self):
        """``J + m a²``."""
        return self.J + self.m * self.a ** 2

    @property
    def C(self):
        """The structure constant ``C^1_12 = a √m / (J + m a²)`` of the G-orthonormal frame."""
        return self.a * jnp.sqrt(self.m) / self.k

    def distribution_frame(self, q):
        """The G-orthonormal frame ``X1 = k^{-1/2} ∂θ``, ``X2 = m^{-1/2}(cos θ ∂x1 +
        sin θ ∂x2)`` (``k = J + m a²``), in which ``ρ = (√k θ', √m u)``, ``u`` the forward
        speed, and ``𝓗 = ½|ρ|²``."""
        th = q[2]
        zero = jnp.zeros((), q.dtype)
        x1 = jnp.stack([zero, zero, 1.0 / jnp.sqrt(self.k) + zero])
        x2 = jnp.stack([jnp.cos(th), jnp.sin(th), zero]) / jnp.sqrt(self.m)
        return jnp.stack([x1, x2], axis=1)

    def rho(self, q, v):
        """The reduced momenta ``(√k θ', √m (cos θ x1' + sin θ x2'))``."""
        th = q[..., 2]
        return jnp.stack([jnp.sqrt(self.k) * v[..., 2],
                          jnp.sqrt(self.m) * (jnp.cos(th) * v[..., 0] + jnp.sin(th) * v[..., 1])],
                         axis=-1)

    def initial(self, rho1=0.001, rho2=-0.6, x1=-5.0, x2=0.0, theta=0.1):
        """``(q0, v0)`` from ``ρ = (ρ1, ρ2)``; defaults: the start of Fig. 3 of Celledoni et
        al. (2016), near the unstable equilibrium ``ρ1 = 0``, ``ρ2 < 0``."""
        q0 = jnp.asarray([x1, x2, theta], dtype=jnp.float64)
        u = rho2 / np.sqrt(float(self.m))
        v0 = jnp.asarray([u * np.cos(theta), u * np.sin(theta), rho1 / np.sqrt(float(self.k))])
        return q0, v0

    def stability_bound(self, rho2):
        """The step bound ``|2 / (C ρ2)|`` of Celledoni et al. (2016), Prop. 4.1."""
        return jnp.abs(2.0 / (self.C * rho2))


class QuarticNonholonomic(MechanicalSystem, NonholonomicSystem):
    """The fully chaotic quartic nonholonomic system of McLachlan & Perlmutter (2006), as
    used by Celledoni et al. (2016), §4.1, eqs. (19)--(20): ``q = (x, w_1..w_n, z_1..z_n)``,
    ``L = ½|q'|² - V``, ``V = ½(|q|² + z_1² z_2² + Σ w_i² z_i²)``, constraint
    ``x' + Σ w_i z_i' = 0``."""

    n_pairs: int = eqx.field(static=True, default=3)

    constraint_form: ClassVar[str] = "linear"
    constant_mass: ClassVar[bool] = True

    def _split(self, q):
        n = self.n_pairs
        return q[0], q[1:1 + n], q[1 + n:]

    def mass_matrix(self, q):
        return jnp.eye(q.shape[0], dtype=q.dtype)

    def inverse_mass_matrix(self, q):
        return jnp.eye(q.shape[0], dtype=q.dtype)

    def potential(self, q):
        _, w, z = self._split(q)
        return 0.5 * (q @ q + z[0] ** 2 * z[1] ** 2 + jnp.sum(w ** 2 * z ** 2))

    def nonholonomic(self, q, v):
        _, w, _ = self._split(q)
        _, _, vz = self._split(v)
        return jnp.atleast_1d(v[0] + w @ vz)

    def distribution_frame(self, q):
        """``X_i = ∂/∂w_i``, ``X_{n+i} = w_i ∂/∂x - ∂/∂z_i`` (§4.1)."""
        n = self.n_pairs
        _, w, _ = self._split(q)
        eye = jnp.eye(n, dtype=q.dtype)
        zero = jnp.zeros((n, n), q.dtype)
        top = jnp.concatenate([jnp.zeros((1, n), q.dtype), w[None, :]], axis=1)
        return jnp.concatenate([top, jnp.concatenate([eye, zero], axis=1),
                                jnp.concatenate([zero, -eye], axis=1)], axis=0)

    @staticmethod
    def initial(a=np.pi / 9):
        """The family of McLachlan & Perlmutter (2006) with energy 3.06 for every ``a`` (three
        pairs): ``x = cos a``, ``w = (.6, .4, .2)``, ``z = (1, 1, 1)``, ``w_1' = sin a``, the
        other velocities 0."""
        a = jnp.asarray(a, jnp.float64)
        q0 = jnp.concatenate([jnp.cos(a)[None], jnp.asarray([0.6, 0.4, 0.2, 1.0, 1.0, 1.0])])
        v0 = jnp.zeros(7, jnp.float64).at[1].set(jnp.sin(a))
        return q0, v0


class CVTGearbox(MechanicalSystem, NonholonomicSystem):
    """Continuously variable transmission driven by an asymmetric pendulum (Celledoni et al.
    (2016), §4.4, eq. (24), after Modin & Verdier (2014)): ``q = (q1, q2, q3)``, unit masses,
    two oscillators coupled through the gear ratio ``sin q3`` set by the pendulum angle ``q3``,
    ``V = ½(q1² + q2²) + cos q3 - ε sin 2q3`` (``ε = 1/5`` in the paper, the pendulum's
    asymmetry; eq. (24a) prints ``T - V``, the energy is ``T + V``), constraint
    ``q1' + sin(q3) q2' = 0``."""

    eps: float = 0.2

    constraint_form: ClassVar[str] = "linear"
    constant_mass: ClassVar[bool] = True
    ndim: ClassVar[int] = 3

    def mass_matrix(self, q):
        return jnp.eye(3, dtype=q.dtype)

    def inverse_mass_matrix(self, q):
        return jnp.eye(3, dtype=q.dtype)

    def potential(self, q):
        return 0.5 * (q[0] ** 2 + q[1] ** 2) + jnp.cos(q[2]) - self.eps * jnp.sin(2.0 * q[2])

    def nonholonomic(self, q, v):
        return jnp.atleast_1d(v[0] + jnp.sin(q[2]) * v[1])

    def distribution_frame(self, q):
        """``X1 = (-sin q3, 1, 0)/√(1 + sin² q3)``, ``X2 = ∂/∂q3``."""
        s = jnp.sin(q[2])
        sig = jnp.sqrt(1.0 + s ** 2)
        zero, one = jnp.zeros((), q.dtype), jnp.ones((), q.dtype)
        return jnp.stack([jnp.stack([-s / sig, 1.0 / sig, zero]),
                          jnp.stack([zero, zero, one])], axis=1)

    def oscillator_energy(self, q, v):
        """``½(q1'² + q2'²) + ½(q1² + q2²)``: the energy of the two coupled oscillators."""
        return 0.5 * (v[..., 0] ** 2 + v[..., 1] ** 2 + q[..., 0] ** 2 + q[..., 1] ** 2)

    def pendulum_energy(self, q, v):
        """``½ q3'² + cos q3 - ε sin 2q3``: the energy of the driving pendulum."""
        return 0.5 * v[..., 2] ** 2 + jnp.cos(q[..., 2]) - self.eps * jnp.sin(2.0 * q[..., 2])

    @staticmethod
    def initial():
        """A consistent initial state with non-periodic motion (standard normal draws with
        ``p1 = -sin(q3) p2``; the paper's random values are not given)."""
        q0 = jnp.asarray([0.00123015335748257, 0.2987455375084699, -0.2741378553622176])
        v0 = jnp.asarray([-0.12308715024015861, -0.45467078517172255, -0.9916465549964624])
        return q0, v0


class PendulumDrivenCVT(PointMassSystem, NonholonomicSystem):
    """Pendulum-driven continuously variable transmission of Martín de Diego & Sato Martín de
    Almagro (2022), §7.2 (after Modin & Verdier (2014)): ``q = (x, y, z)``, unit masses
    (``m = 1``, the paper's; ``m`` scales the kinetic energy),

        L = ½(x'² + y'² + z'²) - ½(x² + z² - 2 cos y + ε sin 2y),    Φ = z' + sin(y) x',

        x'' = -x + λ sin y,   y'' = -sin y - ε cos 2y,   z'' = -z + λ,
        λ = (z + x sin y - x' y' cos y) / (1 + sin² y).

    The pendulum angle ``y`` (the driver) sets the gear ratio ``sin y`` between the two
    oscillators ``x`` and ``z`` (the passenger).  The constraint does not involve ``y'``, so
    the driver is an autonomous pendulum and its energy :meth:`driver_energy`
    ``E_d = ½ y'² - cos y + (ε/2) sin 2y`` is a first integral of the continuous flow, as are
    the passenger's :meth:`passenger_energy` ``E_p = ½(x'² + z'²) + ½(x² + z²)`` and the total
    ``E_T = E_d + E_p`` (:meth:`energy`).

    Differences from :class:`CVTGearbox` (Celledoni et al. (2016), §4.4): there the
    constraint ``q1' + sin(q3) q2'`` has the gear ratio on the other oscillator's velocity,
    the pendulum potential is ``cos q3 - ε sin 2q3`` (upright at ``q3 = 0``, ``ε = 1/5``) and
    the initial state is a random one; here the pendulum hangs at ``y = 0`` with potential
    ``-cos y + (ε/2) sin 2y`` (``ε = 1/2`` and ``ε = 0`` in the paper), and :meth:`initial`
    gives the paper's two regimes, an oscillating and a rotating pendulum."""

    eps: float = 0.5
    ndim: ClassVar[int] = 3
    constraint_form: ClassVar[str] = "linear"

    def potential(self, q):
        return (0.5 * (q[0] ** 2 + q[2] ** 2) - jnp.cos(q[1])
                + 0.5 * self.eps * jnp.sin(2.0 * q[1]))

    def nonholonomic(self, q, v):
        return jnp.atleast_1d(v[2] + jnp.sin(q[1]) * v[0])

    def distribution_frame(self, q):
        """``X1 = (1, 0, -sin y)/√(1 + sin² y)``, ``X2 = ∂/∂y`` (orthonormal)."""
        s = jnp.sin(q[1])
        c = 1.0 / jnp.sqrt(1.0 + s ** 2)
        return jnp.zeros((3, 2), q.dtype).at[0, 0].set(c).at[2, 0].set(-s * c).at[1, 1].set(1.0)

    def driver_energy(self, q, v):
        """``E_d = ½ m y'² - cos y + (ε/2) sin 2y``: the energy of the driving pendulum."""
        y = q[..., 1]
        return 0.5 * self.m * v[..., 1] ** 2 - jnp.cos(y) + 0.5 * self.eps * jnp.sin(2.0 * y)

    def passenger_energy(self, q, v):
        """``E_p = ½ m (x'² + z'²) + ½(x² + z²)``: the energy of the driven oscillators."""
        return 0.5 * (self.m * (v[..., 0] ** 2 + v[..., 2] ** 2) + q[..., 0] ** 2
                      + q[..., 2] ** 2)

    @staticmethod
    def initial(regime: str = "low"):
        """``(q0, v0)`` of the paper's two regimes, ``q0 = (1, 0, 1)`` and ``λ0 = 1`` in both
        (for every ``ε``: ``sin 2y = 0`` at ``y = 0``):

        * ``"low"``: ``v0 = (0, 3√10/5, 0)``, ``E_d = 4/5``, ``E_p = 1``, ``E_T = 9/5``
          (the pendulum oscillates);
        * ``"high"``: ``v0 = (0, √8, 0)``, ``E_d = 3``, ``E_p = 1``, ``E_T = 4`` (the
          pendulum rotates)."""
        speeds = {"low": 3.0 * np.sqrt(10.0) / 5.0, "high": np.sqrt(8.0)}
        if regime not in speeds:
            raise ValueError(f"PendulumDrivenCVT.initial: regime={regime!r}; use 'low' (the "
                             f"pendulum oscillates) or 'high' (it rotates).")
        q0 = jnp.asarray([1.0, 0.0, 1.0])
        v0 = jnp.asarray([0.0, float(speeds[regime]), 0.0])
        return q0, v0


class SuslovProblem(eqx.Module):
    """The Euler--Poincaré--Suslov problem on so(3) in reduced form (Celledoni et al. (2016),
    §4.3): a rigid body with inertia ``[[I11, 0, I13], [0, I22, I23], [I13, I23, I33]]``
    (frame chosen with ``I12 = 0``) and the constraint ``ω3 = 0``; on the constraint
    ``ρ = (I11 ω1, I22 ω2)``, ``𝓗 = ½(ρ1²/I11 + ρ2²/I22)`` and ``ρ' = Π(ρ)∇𝓗`` with
    ``Π = [[0, -c], [c, 0]]``, ``c(ρ) = C^1_12 ρ1 + C^2_12 ρ2``, ``C^1_12 = I13/I11``,
    ``C^2_12 = I23/I22`` (the third moment ``M3 = c``)."""

    I11: float = 1.0
    I22: float = 2.0
    I13: float = 0.3
    I23: float = 0.4

    def hamiltonian(self, rho):
        return 0.5 * (rho[0] ** 2 / self.I11 + rho[1] ** 2 / self.I22)

    def c(self, rho):
        """``c(ρ) = C^1_12 ρ1 + C^2_12 ρ2 = M3``: zero at the equilibria."""
        return self.I13 / self.I11 * rho[..., 0] + self.I23 / self.I22 * rho[..., 1]

    def bracket(self, rho):
        c = self.c(rho)
        zero = jnp.zeros((), rho.dtype)
        return jnp.stack([jnp.stack([zero, -c]), jnp.stack([c, zero])])

    @staticmethod
    def initial():
        return jnp.asarray([1.0, 0.5])
