"""Tests for vijax.systems: Legendre map and its inverse, energies, mass matrices, and
differentiability with respect to system parameters.

The analytic energies below are written independently of the catalogue (the double pendulum's
from the Cartesian positions of its bobs).
"""

import jax


from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import RelativisticParticle, equations

import vijax as vj
from vijax import systems as S

# ---------------------------------------------------------------------------------------------
# Custom systems
# ---------------------------------------------------------------------------------------------


def relativistic_velocity(m, p):
    """Exact inverse of p = m v / sqrt(1 - |v|^2)."""
    return p / jnp.sqrt(m**2 + jnp.vdot(p, p))


class ChargedParticle(vj.LagrangianSystem):
    """``L = 1/2 m |v|^2 + A(q).v - V(q)``: quadratic in v with a linear term (a magnetic
    potential), declared as such so the inverse Legendre map is one linear solve."""

    m: float = 2.0
    b: float = 0.7
    quadratic_in_velocity: ClassVar[bool] = True
    ndim: ClassVar[int] = 2

    def vector_potential(self, q):
        return 0.5 * self.b * jnp.array([-q[1] ** 3, q[0] * jnp.cos(q[1])])

    def lagrangian(self, q, v):
        return (0.5 * self.m * jnp.vdot(v, v) + jnp.vdot(self.vector_potential(q), v)
                - 0.5 * jnp.vdot(q, q))


# ---------------------------------------------------------------------------------------------
# Independent analytic energies of the catalogue
# ---------------------------------------------------------------------------------------------


def energy_harmonic(s, q, v):
    return 0.5 * s.m * np.dot(v, v) + 0.5 * s.k * np.dot(q, q)


def energy_pendulum(s, q, v):
    return 0.5 * s.m * s.l**2 * v[0] ** 2 - s.m * s.g * s.l * np.cos(q[0])


def energy_double_pendulum(s, q, v):
    # bob positions (x right, y up), angles from the downward vertical
    p1 = s.l1 * np.array([np.sin(q[0]), -np.cos(q[0])])
    p2 = p1 + s.l2 * np.array([np.sin(q[1]), -np.cos(q[1])])
    v1 = s.l1 * v[0] * np.array([np.cos(q[0]), np.sin(q[0])])
    v2 = v1 + s.l2 * v[1] * np.array([np.cos(q[1]), np.sin(q[1])])
    kinetic = 0.5 * s.m1 * v1 @ v1 + 0.5 * s.m2 * v2 @ v2
    potential = s.m1 * s.g * p1[1] + s.m2 * s.g * p2[1]
    return kinetic + potential


def energy_kepler(s, q, v):
    return 0.5 * s.m * np.dot(v, v) - s.mu * s.m / np.linalg.norm(q)


def energy_henon_heiles(s, q, v):
    x, y = q
    return 0.5 * np.dot(v, v) + 0.5 * (x**2 + y**2) + s.lam * (x**2 * y - y**3 / 3.0)


def energy_relativistic(s, q, v):
    return s.m / np.sqrt(1.0 - np.dot(v, v)) + 0.5 * s.k * np.dot(q, q)


def energy_charged(s, q, v):
    return 0.5 * s.m * np.dot(v, v) + 0.5 * np.dot(q, q)  # the magnetic term does no work


def energy_shaken_pendulum(s, q, v):
    # at the default time 0: pivot at y_p = a, at rest; E = m l² v²/2 + m g (y_p - l cos q)
    return 0.5 * s.m * s.l ** 2 * v[0] ** 2 + s.m * s.g * (s.a - s.l * np.cos(q[0]))


# name -> (system with non-default parameters, q, v, analytic energy)
CASES = {
    "harmonic": (S.HarmonicOscillator(m=1.7, k=0.6), [0.3, -1.1, 0.4], [0.5, 0.2, -0.9],
                 energy_harmonic),
    "pendulum": (S.Pendulum(m=1.4, l=0.8, g=9.5), [2.1], [-0.7], energy_pendulum),
    "double_pendulum": (S.DoublePendulum(m1=1.2, m2=0.7, l1=0.9, l2=1.3, g=9.7), [0.8, -1.9],
                        [1.1, -0.4], energy_double_pendulum),
    "kepler": (S.Kepler(m=0.9, mu=1.6), [0.6, -0.8], [0.3, 1.2], energy_kepler),
    "general_kepler": (S.GeneralKepler(m=0.9, mu=1.6), [0.6, -0.8], [0.3, 1.2], energy_kepler),
    "henon_heiles": (S.HenonHeiles(lam=0.8), [0.2, -0.3], [0.35, 0.1], energy_henon_heiles),
    "shaken_pendulum": (S.ShakenPendulum(m=1.3, l=0.9, g=9.7, a=0.2, omega=5.0), [2.1], [-0.7],
                        energy_shaken_pendulum),
    "relativistic": (RelativisticParticle(), [0.4, -0.2], [0.5, -0.3], energy_relativistic),
    "charged": (ChargedParticle(), [0.4, -0.6], [0.9, -0.3], energy_charged),
}
CATALOGUE = ["harmonic", "pendulum", "double_pendulum", "kepler", "general_kepler",
             "henon_heiles", "shaken_pendulum"]
MECHANICAL = [name for name in CATALOGUE if name not in ("general_kepler", "shaken_pendulum")]


def case(name):
    system, q, v, energy = CASES[name]
    return system, jnp.asarray(q, jnp.float64), jnp.asarray(v, jnp.float64), energy


all_cases = pytest.mark.parametrize("name", list(CASES))


def test_catalogue_is_complete():
    """Every exported catalogue system is covered by the cases above."""
    from vijax.systems import catalogue

    covered = {type(CASES[name][0]).__name__ for name in CATALOGUE}
    assert covered == set(catalogue.__all__)


# ---------------------------------------------------------------------------------------------
# Legendre map and its inverse
# ---------------------------------------------------------------------------------------------


@all_cases
def test_legendre_round_trip(name):
    system, q, v, _ = case(name)

    @jax.jit  # one compilation instead of op-by-op dispatch of the Newton loops
    def round_trip(q, v):
        p = system.momentum(q, v)
        v_back = system.velocity(q, p)
        # and from the other side: p -> v -> p for a momentum not produced by this velocity
        p2 = 0.3 * p + 0.05
        return p, v_back, system.momentum(q, v_back), p2, system.momentum(q, system.velocity(q, p2))

    p, v_back, p_back, p2, p2_back = round_trip(q, v)
    np.testing.assert_allclose(v_back, v, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(p_back, p, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(p2_back, p2, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", MECHANICAL)
def test_mechanical_momentum_is_mass_matrix_times_velocity(name):
    system, q, v, _ = case(name)
    np.testing.assert_allclose(system.momentum(q, v), system.mass_matrix(q) @ v, rtol=1e-13)


@pytest.mark.parametrize("name", MECHANICAL)
def test_mechanical_derivatives_equal_the_lagrangians_autodiff(name):
    """A MechanicalSystem's momentum M(q) v and (dL/dq, dL/dv) in closed form equal the
    generic autodiff of its Lagrangian, with their forward derivatives (Newton Jacobians) and
    their gradients with respect to the system's parameters."""
    system, q, v, _ = case(name)
    generic = lambda s, q, v: vj.LagrangianSystem.derivatives(s, q, v)  # noqa: E731
    closed = lambda s, q, v: s.derivatives(q, v)  # noqa: E731
    for a, b in zip(closed(system, q, v), generic(system, q, v)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(system.momentum(q, v),
                               vj.LagrangianSystem.momentum(system, q, v), rtol=1e-13, atol=1e-14)
    jq = [jax.jacfwd(f, argnums=(1, 2))(system, q, v) for f in (closed, generic)]
    for a, b in zip(jax.tree.leaves(jq[0]), jax.tree.leaves(jq[1])):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
    w = jnp.arange(1.0, 1.0 + 2 * q.size).reshape(2, -1)
    weight = lambda f: lambda s: jnp.sum(jnp.stack(f(s, q, v)) * w)  # noqa: E731
    ga, gb = (eqx.filter_grad(weight(f))(system) for f in (closed, generic))
    for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


def test_mechanical_momentum_under_vmap_reduces_no_matrix():
    """Under jax.vmap (an ensemble's stages) the momentum of a MechanicalSystem is M(q) v,
    not the transposed products of the Lagrangian's gradient: no reduction of a rank-3 array
    (members x n x n), which XLA:CPU hands to its YNNPACK fusions, several times slower in
    float64 than its own loops."""
    system = S.ChaoticNonholonomic()
    q = v = jnp.ones((64, system.dim))
    jaxpr = jax.make_jaxpr(jax.vmap(system.derivatives))(q, v)
    reductions = [e for e in equations(jaxpr.jaxpr)
                  if e.primitive.name == "reduce_sum" and e.invars[0].aval.ndim >= 3]
    assert not reductions, reductions


def test_relativistic_momentum_and_velocity_are_exact():
    system, q, v, _ = case("relativistic")
    p = system.momentum(q, v)
    np.testing.assert_allclose(p, system.m * v / jnp.sqrt(1.0 - v @ v), rtol=1e-13)
    np.testing.assert_allclose(system.velocity(q, p), relativistic_velocity(system.m, p),
                               rtol=1e-12)
    # with a guess close to the answer Newton still lands on the same root
    np.testing.assert_allclose(system.velocity(q, p, v_guess=0.9 * v), v, rtol=1e-12)


def test_relativistic_inverse_legendre_map_is_differentiable():
    """dv/dp of the Newton-based inverse map equals the analytic Jacobian, and the inverse of
    the velocity Hessian (implicit function theorem)."""
    system, q, v, _ = case("relativistic")
    p = system.momentum(q, v)

    @jax.jit
    def jacobians(p):
        inverse = lambda p: system.velocity(q, p)  # noqa: E731
        return jax.jacfwd(inverse)(p), jax.jacrev(inverse)(p)

    jac, jac_rev = jacobians(p)
    np.testing.assert_allclose(jac, jax.jacfwd(lambda p: relativistic_velocity(system.m, p))(p),
                               rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(jac, jnp.linalg.inv(system.velocity_hessian(q, v)), rtol=1e-11,
                               atol=1e-14)
    np.testing.assert_allclose(jac_rev, jac, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", CATALOGUE)
def test_generic_newton_inverse_agrees_with_the_structured_one(name):
    """The generic (Newton) inverse Legendre map of the base class gives the same velocity as
    the structured one of mechanical systems."""
    system, q, v, _ = case(name)
    p = system.momentum(q, v)
    generic = vj.solvers.Newton().solve(lambda w: system.momentum(q, w) - p, jnp.zeros_like(v))
    assert bool(generic[1].converged)
    np.testing.assert_allclose(generic[0], system.velocity(q, p), rtol=1e-12, atol=1e-14)


def test_quadratic_declaration_with_a_linear_term():
    """``quadratic_in_velocity`` handles the ``a(q).v`` term (p - D2L(q, 0) on the right)."""
    system, q, v, _ = case("charged")
    p = system.momentum(q, v)
    np.testing.assert_allclose(p, system.m * v + system.vector_potential(q), rtol=1e-13)
    np.testing.assert_allclose(system.velocity(q, p), v, rtol=1e-13)


# ---------------------------------------------------------------------------------------------
# Energy, Hamiltonian, mass matrix
# ---------------------------------------------------------------------------------------------


@all_cases
def test_energy_matches_the_analytic_formula(name):
    system, q, v, energy = case(name)
    expected = energy(system, np.asarray(q), np.asarray(v))
    np.testing.assert_allclose(system.energy(q, v), expected, rtol=1e-13)
    # the generic <D2L, v> - L of the base class agrees with any override
    np.testing.assert_allclose(vj.LagrangianSystem.energy(system, q, v), expected, rtol=1e-13)
    # and the Hamiltonian is the energy expressed in momenta
    np.testing.assert_allclose(system.hamiltonian(q, system.momentum(q, v)), expected,
                               rtol=1e-12)


def test_hamiltonian_equations_from_autodiff():
    """dH/dp = v and dH/dq = -dL/dq (Legendre transform), here for the relativistic particle
    whose Hamiltonian is H = sqrt(m^2 + |p|^2) + 1/2 k |q|^2."""
    system, q, v, _ = case("relativistic")
    p = system.momentum(q, v)
    np.testing.assert_allclose(system.hamiltonian(q, p),
                               jnp.sqrt(system.m**2 + p @ p) + 0.5 * system.k * q @ q,
                               rtol=1e-13)
    dh_dq, dh_dp = jax.grad(system.hamiltonian, argnums=(0, 1))(q, p)
    np.testing.assert_allclose(dh_dp, v, rtol=1e-12)
    np.testing.assert_allclose(dh_dq, -system.d1_lagrangian(q, v), rtol=1e-12)


@pytest.mark.parametrize("name", MECHANICAL)
def test_mass_matrix_is_the_velocity_hessian(name):
    system, q, v, _ = case(name)
    assert isinstance(system, vj.MechanicalSystem)
    hess = jax.hessian(system.lagrangian, argnums=1)(q, v)
    np.testing.assert_allclose(system.mass_matrix(q), hess, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(system.velocity_hessian(q, v), hess, rtol=1e-13, atol=1e-15)
    # the generic autodiff Hessian of the base class agrees too
    np.testing.assert_allclose(vj.LagrangianSystem.velocity_hessian(system, q, v), hess,
                               rtol=1e-13, atol=1e-15)
    m = np.asarray(system.mass_matrix(q))
    np.testing.assert_allclose(m, m.T, rtol=0, atol=0)
    assert np.all(np.linalg.eigvalsh(m) > 0)


def test_double_pendulum_mass_matrix_from_cartesian_kinetic_energy():
    system, q, v, _ = case("double_pendulum")
    kinetic = lambda w: energy_double_pendulum(  # noqa: E731
        system, np.asarray(q), w) - energy_double_pendulum(system, np.asarray(q), 0.0 * w)
    # T is quadratic in w, so its Hessian is recovered exactly from polarisation
    e = np.eye(2)
    hess = np.array([[kinetic(e[i] + e[j]) - kinetic(e[i]) - kinetic(e[j])
                      for j in range(2)] for i in range(2)])
    np.testing.assert_allclose(system.mass_matrix(q), hess, rtol=1e-13, atol=1e-15)


def test_general_kepler_matches_kepler():
    q = jnp.array([0.6, -0.8])
    v = jnp.array([0.3, 1.2])
    k, gk = S.Kepler(m=0.9, mu=1.6), S.GeneralKepler(m=0.9, mu=1.6)
    np.testing.assert_allclose(gk.lagrangian(q, v), k.lagrangian(q, v), rtol=1e-14)
    np.testing.assert_allclose(gk.velocity_hessian(q, v), k.mass_matrix(q), rtol=1e-14)
    d1k, d2k = k.derivatives(q, v)
    d1g, d2g = gk.derivatives(q, v)
    np.testing.assert_allclose(d1g, d1k, rtol=1e-14)
    np.testing.assert_allclose(d2g, d2k, rtol=1e-14)
    np.testing.assert_allclose(d1k, -k.m * k.mu * q / jnp.linalg.norm(q) ** 3, rtol=1e-13)


def test_kepler_initial_conditions_and_angular_momentum():
    system = S.Kepler()
    e = 0.6
    q0, v0 = S.Kepler.initial_conditions(e)
    # vis-viva at pericentre: energy -1/2 for a = mu = 1; angular momentum sqrt(1 - e^2)
    np.testing.assert_allclose(system.energy(q0, v0), -0.5, rtol=1e-14)
    np.testing.assert_allclose(system.angular_momentum(q0, v0), np.sqrt(1 - e**2), rtol=1e-14)
    q32, v32 = S.Kepler.initial_conditions(e, dtype=jnp.float32)
    assert q32.dtype == v32.dtype == jnp.float32


# ---------------------------------------------------------------------------------------------
# Parameters are differentiable pytree leaves
# ---------------------------------------------------------------------------------------------


def test_parameters_are_pytree_leaves():
    leaves = jax.tree_util.tree_leaves(S.DoublePendulum(m1=1.2, m2=0.7, l1=0.9, l2=1.3, g=9.7))
    assert sorted(float(x) for x in leaves) == sorted([1.2, 0.7, 0.9, 1.3, 9.7])
    assert jax.tree_util.tree_leaves(RelativisticParticle()) == [1.3, 0.8]


def test_energy_gradient_wrt_pendulum_parameters():
    system, q, v, _ = case("pendulum")
    grads = jax.grad(lambda s: s.energy(q, v))(system)
    assert isinstance(grads, S.Pendulum)
    m, l, g, th, w = system.m, system.l, system.g, float(q[0]), float(v[0])
    np.testing.assert_allclose(grads.m, 0.5 * l**2 * w**2 - g * l * np.cos(th), rtol=1e-13)
    np.testing.assert_allclose(grads.l, m * l * w**2 - m * g * np.cos(th), rtol=1e-13)
    np.testing.assert_allclose(grads.g, -m * l * np.cos(th), rtol=1e-13)


def test_energy_gradient_wrt_double_pendulum_parameters():
    """Against central differences of the independent Cartesian energy."""
    system, q, v, _ = case("double_pendulum")
    grads = jax.grad(lambda s: s.energy(q, v))(system)
    for field in ("m1", "m2", "l1", "l2", "g"):
        h = 1e-6
        plus = eqx.tree_at(lambda s: getattr(s, field), system, getattr(system, field) + h)
        minus = eqx.tree_at(lambda s: getattr(s, field), system, getattr(system, field) - h)
        fd = (energy_double_pendulum(plus, np.asarray(q), np.asarray(v))
              - energy_double_pendulum(minus, np.asarray(q), np.asarray(v))) / (2 * h)
        np.testing.assert_allclose(getattr(grads, field), fd, rtol=1e-8, err_msg=field)


def test_energy_gradient_wrt_kepler_parameters_with_array_fields():
    """Fields given as jnp arrays work with eqx.filter_grad."""
    q = jnp.array([0.6, -0.8])
    v = jnp.array([0.3, 1.2])
    system = S.Kepler(m=jnp.asarray(0.9), mu=jnp.asarray(1.6))
    grads = eqx.filter_grad(lambda s: s.energy(q, v))(system)
    r = float(jnp.linalg.norm(q))
    np.testing.assert_allclose(grads.m, 0.5 * v @ v - 1.6 / r, rtol=1e-13)
    np.testing.assert_allclose(grads.mu, -0.9 / r, rtol=1e-13)
    # and the same through the generic (autodiff energy, Newton velocity) GeneralKepler path
    general = S.GeneralKepler(m=jnp.asarray(0.9), mu=jnp.asarray(1.6))
    p = general.momentum(q, v)
    hgrads = eqx.filter_grad(lambda s: s.hamiltonian(q, p))(general)
    # H(q, p) = |p|^2 / 2m - mu m / |q|
    np.testing.assert_allclose(hgrads.m, -(p @ p) / (2 * 0.9**2) - 1.6 / r, rtol=1e-12)
    np.testing.assert_allclose(hgrads.mu, -0.9 / r, rtol=1e-12)


def test_relativistic_hamiltonian_gradient_wrt_mass():
    """Parameter gradient through the Newton inverse Legendre map (implicit function theorem):
    H = sqrt(m^2 + |p|^2) + 1/2 k |q|^2, so dH/dm = m / sqrt(m^2 + |p|^2), dH/dk = |q|^2/2."""
    system, q, v, _ = case("relativistic")
    p = system.momentum(q, v)
    grads = jax.grad(lambda s: s.hamiltonian(q, p))(system)
    np.testing.assert_allclose(grads.m, system.m / jnp.sqrt(system.m**2 + p @ p), rtol=1e-12)
    np.testing.assert_allclose(grads.k, 0.5 * q @ q, rtol=1e-12)


def test_systems_work_under_jit_and_vmap():
    system = S.DoublePendulum(m2=0.7)
    qs = jnp.array([[0.1, 0.2], [1.0, -2.0], [2.5, 0.3]])
    vs = jnp.array([[0.3, -0.1], [0.0, 1.0], [-1.2, 0.4]])
    e = jax.jit(jax.vmap(system.energy))(qs, vs)
    for i in range(3):
        np.testing.assert_allclose(e[i], energy_double_pendulum(system, np.asarray(qs[i]),
                                                                np.asarray(vs[i])), rtol=1e-13)
    rel = RelativisticParticle()
    ps = 0.4 * vs
    v_batch = jax.jit(jax.vmap(rel.velocity))(qs, ps)
    np.testing.assert_allclose(v_batch, jax.vmap(lambda p: relativistic_velocity(rel.m, p))(ps),
                               rtol=1e-12)


def test_float32_systems_stay_float32():
    for name in ("relativistic", "general_kepler"):
        system, q, v, _ = case(name)

        @jax.jit
        def everything(q, v):
            p = system.momentum(q, v)
            return p, system.energy(q, v), system.velocity(q, p)

        p, e, v_back = everything(q.astype(jnp.float32), v.astype(jnp.float32))
        assert p.dtype == e.dtype == v_back.dtype == jnp.float32
        np.testing.assert_allclose(v_back, v, rtol=1e-5, atol=1e-6)
