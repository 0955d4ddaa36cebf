"""The small dense linear algebra written as fusible array code (``vijax._linalg``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vijax import _linalg


def _matrices(n, rng):
    """Random matrices, and ones that need row exchanges (zero or tiny leading pivots)."""
    out = [rng.standard_normal((n, n)) for _ in range(20)]
    perm = np.eye(n)[rng.permutation(n)] + 1e-3 * rng.standard_normal((n, n))
    out.append(perm)
    if n > 1:
        m = rng.standard_normal((n, n))
        m[0, 0] = 0.0
        out.append(m)
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_solve_is_backward_stable_with_pivoting(n):
    """The unrolled elimination (separate right-hand sides for n <= 2, one augmented array
    above) has a backward error of a few eps, for vector and matrix right-hand sides, on
    matrices that need row exchanges."""
    rng = np.random.default_rng(n)
    for m in _matrices(n, rng):
        for b in (rng.standard_normal(n), rng.standard_normal((n, 3))):
            x = np.asarray(_linalg.solve(jnp.asarray(m), jnp.asarray(b)))
            assert x.shape == b.shape
            backward = np.linalg.norm(m @ x - b) / (np.linalg.norm(m) * np.linalg.norm(x))
            assert backward < 50 * np.finfo(float).eps


@pytest.mark.parametrize("n", [2, 4])
def test_solve_differentiates_like_the_lapack_solve(n):
    rng = np.random.default_rng(10 + n)
    m = jnp.asarray(rng.standard_normal((n, n)) + n * np.eye(n))
    b = jnp.asarray(rng.standard_normal(n))
    w = jnp.asarray(rng.standard_normal(n))

    def loss(solve, m, b):
        return jnp.dot(w, solve(m, b)) ** 2

    ours = jax.grad(lambda m, b: loss(_linalg.solve, m, b), argnums=(0, 1))(m, b)
    ref = jax.grad(lambda m, b: loss(jnp.linalg.solve, m, b), argnums=(0, 1))(m, b)
    for a, r in zip(ours, ref):
        np.testing.assert_allclose(a, r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_closed_forms_against_numpy(n):
    """``inv`` (adjugate over the determinant) and ``cramer`` (the adjugate's columns summed
    with the right-hand side's weights) agree with LAPACK on non-symmetric matrices, and their
    derivatives with those of ``jnp.linalg.solve``."""
    rng = np.random.default_rng(n)
    m = jnp.asarray(rng.standard_normal((n, n)) + n * np.eye(n))
    b = jnp.asarray(rng.standard_normal(n))
    np.testing.assert_allclose(_linalg.inv(m), np.linalg.inv(m), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(_linalg.cramer(m, b), np.linalg.solve(m, b), rtol=1e-13,
                               atol=1e-14)
    loss = lambda f: lambda m, b: jnp.sum(f(m, b) ** 3)  # noqa: E731
    for got, want in zip(jax.grad(loss(_linalg.cramer), argnums=(0, 1))(m, b),
                         jax.grad(loss(jnp.linalg.solve), argnums=(0, 1))(m, b)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("n", [1, 2, 4, 6, 8, 9])
def test_spd_solve_against_numpy_and_its_derivatives(n):
    """The Cholesky solve written out (n <= 8; LAPACK above) on ill-conditioned SPD matrices
    (condition 1e8): residual at round-off, and its derivatives in symmetric directions of the
    matrix and in the right-hand side equal the LAPACK solve's."""
    rng = np.random.default_rng(n)
    U, _ = np.linalg.qr(rng.normal(size=(n, n)))
    m = jnp.asarray(U @ np.diag(np.logspace(0, -8, n)) @ U.T)
    b = jnp.asarray(rng.normal(size=n))
    x = _linalg.spd_solve(m, b)
    assert float(jnp.max(jnp.abs(m @ x - b))) <= 1e-14 * float(jnp.max(jnp.abs(m)) *
                                                                 jnp.max(jnp.abs(x)))
    sym = jnp.asarray(rng.normal(size=(n, n)))
    dm, db = sym + sym.T, jnp.asarray(rng.normal(size=n))
    mine = jax.jvp(_linalg.spd_solve, (m, b), (dm, db))[1]
    ref = jax.jvp(jnp.linalg.solve, (m, b), (dm, db))[1]
    np.testing.assert_allclose(mine, ref, rtol=1e-6 if n > 1 else 1e-12,
                               atol=1e-6 * float(jnp.max(jnp.abs(ref))))


@pytest.mark.parametrize("n", [7, 8])
def test_solve_switches_to_array_code_under_vmap(n):
    """From 7 to 8 unknowns one system goes to LAPACK and a vmapped batch to the elimination
    written out (a batched LAPACK call solves one system after the other, and with jaxlib 0.10
    can deadlock XLA:CPU's thread pool); values, derivatives (forward, reverse, second, of the
    batch and batched) equal ``jnp.linalg.solve``'s."""
    rng = np.random.default_rng(n)
    M = jnp.asarray(rng.normal(size=(4, n, n)) + n * np.eye(n))
    B = jnp.asarray(rng.normal(size=(4, n)))
    assert "lapack" in jax.jit(_linalg.solve).lower(M[0], B[0]).as_text()
    assert "lapack" not in jax.jit(jax.vmap(_linalg.solve)).lower(M, B).as_text()
    np.testing.assert_allclose(jax.vmap(_linalg.solve)(M, B),
                               np.linalg.solve(M, B[..., None])[..., 0], rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(jax.vmap(_linalg.solve, (None, 0))(M[0], B),
                               np.linalg.solve(M[0], B.T).T, rtol=1e-13, atol=1e-14)
    mine = lambda m, b: jnp.sum(jnp.sin(_linalg.solve(m, b)))  # noqa: E731
    ref = lambda m, b: jnp.sum(jnp.sin(jnp.linalg.solve(m, b)))  # noqa: E731
    for transform in (lambda f: jax.vmap(jax.grad(f, (0, 1))),
                      lambda f: jax.grad(lambda m, b: jnp.sum(jax.vmap(f)(m, b)), (0, 1)),
                      lambda f: jax.vmap(jax.jacfwd(f, (0, 1))),
                      lambda f: jax.vmap(jax.hessian(f, 1))):
        for a, c in zip(jax.tree.leaves(transform(mine)(M, B)),
                        jax.tree.leaves(transform(ref)(M, B))):
            np.testing.assert_allclose(a, c, rtol=1e-12, atol=1e-14)
