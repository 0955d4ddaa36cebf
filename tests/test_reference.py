"""The reference solutions of :mod:`vijax.diagnostics` take every capability of the system:
against closed forms and hand-derived equations, a holonomic (also rheonomic) constraint, a
nonholonomic one, a force; a Lie-group system is refused.  (Before, the Euler--Lagrange field
ignored constraints and forces: a Cartesian pendulum fell freely.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import vijax as vj

pytestmark = pytest.mark.fast_compile  # compile-bound: see tests/conftest.py


def angle_solution(rhs, y0, t_final):
    out = solve_ivp(rhs, (0.0, t_final), y0, method="DOP853", rtol=1e-13, atol=1e-14)
    return out.y[:, -1]


def test_cartesian_pendulum_reference_is_the_pendulum():
    th0, w0, T = 1.1, 0.4, 2.0
    q0 = jnp.array([np.sin(th0), -np.cos(th0)])
    v0 = w0 * jnp.array([np.cos(th0), np.sin(th0)])
    q, v, _ = vj.diagnostics.reference_solution(vj.systems.CartesianPendulum(), q0, v0, T)
    th, w = angle_solution(lambda t, y: [y[1], -9.81 * np.sin(y[0])], [th0, w0], T)
    np.testing.assert_allclose(q, [np.sin(th), -np.cos(th)], atol=1e-10)
    np.testing.assert_allclose(v, w * np.array([np.cos(th), np.sin(th)]), atol=1e-10)


def test_rotating_hoop_reference_follows_the_angle_equation():
    """A rheonomic constraint: ``R θ'' = sin θ (ω² R cos θ - g)`` on the spinning hoop."""
    system = vj.systems.RotatingHoop(omega=5.0)
    T = 2.0
    q0, v0 = system.state(0.0, 1.0, 0.5)
    q, v, _ = vj.diagnostics.reference_solution(system, q0, v0, T)
    th, w = angle_solution(lambda t, y: [y[1], np.sin(y[0]) * (25.0 * np.cos(y[0]) - 9.81)],
                           [1.0, 0.5], T)
    q_ref, v_ref = system.state(T, th, w)
    np.testing.assert_allclose(q, q_ref, atol=1e-10)
    np.testing.assert_allclose(v, v_ref, atol=1e-9)


def test_nonholonomic_reference_keeps_the_constraint_and_the_free_coordinate():
    """The particle's ``y`` is a free oscillator (``y'' = -y``) and ``v_z = y v_x`` holds."""
    system = vj.systems.NonholonomicParticle()
    q0, v0 = vj.systems.NonholonomicParticle.initial_conditions()
    T = 3.0
    q, v, _ = vj.diagnostics.reference_solution(system, q0, v0, T)
    np.testing.assert_allclose(q[1], np.cos(T) + 0.5 * np.sin(T), atol=1e-11)
    assert abs(v[2] - q[1] * v[0]) <= 1e-10


class DampedOscillator(vj.ForcedSystem, vj.systems.HarmonicOscillator):
    c: float = 0.3

    def force(self, t, q, v, u):
        return -self.c * v


def test_forced_reference_is_the_damped_oscillator():
    """``q'' = -q - c q'`` from ``q = 1, q' = 0``: the closed form."""
    T, c = 4.0, 0.3
    q, v, _ = vj.diagnostics.reference_solution(DampedOscillator(), jnp.array([1.0]),
                                                jnp.array([0.0]), T)
    wd = np.sqrt(1.0 - c ** 2 / 4)
    exact = np.exp(-c * T / 2) * (np.cos(wd * T) + c / (2 * wd) * np.sin(wd * T))
    np.testing.assert_allclose(q, [exact], atol=1e-11)


def test_convergence_study_of_a_constrained_method():
    """The library's driver on a constrained system now measures the method's order."""
    th0 = 1.1
    q0 = jnp.array([np.sin(th0), -np.cos(th0)])
    v0 = 0.4 * jnp.array([np.cos(th0), np.sin(th0)])
    study = vj.diagnostics.convergence_study(vj.systems.CartesianPendulum(),
                                             vj.HolonomicVPRK.lobatto(3), q0, v0, 1.0,
                                             [10, 20, 40])
    assert abs(study.order_q - 4.0) <= 0.3, study


def test_lie_group_system_is_refused():
    with pytest.raises(TypeError, match="euler_poincare"):
        vj.diagnostics.euler_lagrange_rhs(vj.systems.HeavyTop())
