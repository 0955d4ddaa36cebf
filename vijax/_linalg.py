"""Small dense linear algebra as fusible array code.

On CPU a LAPACK call (about 1 us) or a ``dot`` (a separate kernel call) inside a ``lax.scan``
costs more than the arithmetic of a small system, so small inverses, solves and products --
mass matrices, stage products, Newton updates -- are written out: closed forms up to
``n = 3``, unrolled pivoted elimination up to ``n = 6``, sums of outer products.  Larger
operands go to LAPACK and ``dot`` as usual.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

__all__ = ["inv", "cramer", "mm", "solve", "factor", "spd_solve"]


def _cofactor_rows(m):
    """``(C, det(m))`` of a ``3 x 3`` matrix, ``C`` its cofactor matrix (``adj(m) = Cᵀ``)."""
    cof = jnp.cross(m[jnp.array([1, 2, 0])], m[jnp.array([2, 0, 1])])
    return cof, jnp.vdot(m[0], cof[0])


def inv(m):
    """Inverse of a square matrix; adjugate formula for ``n <= 3``, :func:`solve` otherwise."""
    n = m.shape[-1]
    if n == 1:
        return 1.0 / m
    if n == 2:
        a, b, c, d = m[0, 0], m[0, 1], m[1, 0], m[1, 1]
        return jnp.array([[d, -b], [-c, a]], dtype=m.dtype) / (a * d - b * c)
    if n == 3:
        cof, det = _cofactor_rows(m)
        return cof.T / det
    return solve(m, jnp.eye(n, dtype=m.dtype))


def cramer(m, b):
    """``m^{-1} b`` for a vector ``b`` and ``n <= 3`` by Cramer's rule, each entry written out
    from the cofactors (no adjugate array) and divided by an array of the determinant's
    copies.  (XLA rewrites a division by a broadcast scalar into a product with the scalar's
    reciprocal, which, used by several entries, is a kernel of its own; on the discrete
    gradients' reduced metric, two kernels fewer per fixed-point update and the step 0.93x.
    :func:`inv` keeps the scalar division: written so, the double pendulum's ensembles ran
    1.03x slower, each entry's division being arithmetic a batch pays for.)"""
    n = m.shape[-1]
    if n == 1:
        return b / m[0, 0]
    if n == 2:
        p, q, r, s = m[0, 0], m[0, 1], m[1, 0], m[1, 1]
        det = p * s - q * r
        return jnp.stack([s * b[0] - q * b[1], p * b[1] - r * b[0]]) / jnp.stack([det, det])
    cof, det = _cofactor_rows(m)
    return (b[0] * cof[0] + b[1] * cof[1] + b[2] * cof[2]) / jnp.stack([det] * 3)


# A product with at most this many terms and a short inner dimension is written as a sum of
# outer products, which XLA fuses with the surrounding elementwise work; a dot is its own
# kernel call on CPU (about 50-100 ns each, more than the arithmetic of a 2x2 or 4x3 product).
_SMALL_PRODUCT = 4096
_UNROLL = 8


def _outer_sum(a2, b2):
    # a sum of k outer-product terms: elementwise code only (a reduction, like a dot, is a
    # fusion boundary on XLA:CPU)
    out = a2[:, 0, None] * b2[None, 0, :]
    for j in range(1, a2.shape[1]):
        out = out + a2[:, j, None] * b2[None, j, :]
    return out


def _product_sum(a2, b2):
    # products summed over the inner index: transposes to broadcasts and products (the row
    # slices of ``_outer_sum`` transpose to pads, a kernel each in reverse mode)
    return jnp.sum(a2[:, :, None] * b2[None, :, :], axis=1)


@jax.custom_jvp
def _small_product(a2, b2):
    return _outer_sum(a2, b2)


def _small_product_jvp(primals, tangents):
    # tangents as sums of products: their transposes (reverse mode) broadcast instead of
    # padding slices, one kernel each (Kepler's backward loop, VPRK.gauss(2): 47 -> 37
    # kernels, gradient 2.67-2.68 -> 2.31-2.38 us/step, four alternating runs)
    (a2, b2), (da, db) = primals, tangents
    out = _small_product(a2, b2)
    zero = jax.custom_derivatives.SymbolicZero
    terms = ([] if isinstance(da, zero) else [_product_sum(da, b2)]) + (
        [] if isinstance(db, zero) else [_product_sum(a2, db)])
    return out, sum(terms[1:], terms[0]) if terms else jnp.zeros_like(out)


_small_product.defjvp(_small_product_jvp, symbolic_zeros=True)


def mm(a, b):
    """``a @ b`` for 1-D or 2-D operands, as fusible elementwise code when small."""
    if a.ndim > 2 or b.ndim > 2 or a.ndim == 0 or b.ndim == 0:
        return a @ b
    a2 = a if a.ndim == 2 else a[None, :]
    b2 = b if b.ndim == 2 else b[:, None]
    k = a2.shape[1]
    if k > _UNROLL or a2.shape[0] * k * b2.shape[1] > _SMALL_PRODUCT:
        return a @ b
    out = _small_product(a2, b2)
    if a.ndim == 1:
        out = out[0]
    if b.ndim == 1:
        out = out[..., 0]
    return out


# Dense systems up to this size are solved by Gaussian elimination with partial pivoting
# written out as array code: a LAPACK custom call costs about 1 us on CPU, more than the
# elimination at these sizes.  Measured per step with Newton (benchmarks/user_calls.py):
# n = 2: 4.2 -> 0.8 us, n = 4: 3.2 -> 1.6 us, n = 6: 4.2 -> 3.2 us; at n = 8 the unrolled
# elimination is larger than a stage loop XLA:CPU compiles into one kernel, and it costs 3x
# the LAPACK solve.
_SMALL_SOLVE = 6


def _eliminate(blocks, n):
    """Gaussian elimination with partial pivoting, unrolled, of the row blocks ``blocks``
    (arrays of ``n`` rows; pivots and factors from the first ``n`` columns of
    ``blocks[0]``, the row operations applied to every block)."""
    rows = jnp.arange(n)
    for j in range(n - 1):
        # pivot: the largest entry on or below the diagonal of column j, swapped into row j
        col = blocks[0][:, j]
        p = jnp.argmax(jnp.where(rows >= j, jnp.abs(col), -1.0))
        swap = ((rows == j).astype(col.dtype) - (rows == p).astype(col.dtype))[:, None]
        blocks = [x - swap * (x[j] - x[p])[None, :] for x in blocks]
        factors = jnp.where(rows > j, blocks[0][:, j] / blocks[0][j, j], 0.0)[:, None]
        blocks = [x - factors * x[j][None, :] for x in blocks]
    return blocks


# Under ``jax.vmap`` the written-out elimination pays up to this size: a batched LAPACK call
# solves its systems one after the other, the array code all at once.  And jaxlib 0.10's
# batched LAPACK kernels on CPU hand chunks of the batch to XLA:CPU's thread pool and block
# until they are done: two independent ones at once deadlock a 2-thread pool (jaxlib 0.10.2
# on 2 cores: ``jax.jit(jax.vmap(f))``, ``f`` summing two independent 6 x 6
# ``jnp.linalg.solve``, hung within 50 calls at 4096 members, within 1000 at 1024; with one
# solve per ``f`` never), which hung the discrete-gradient ensembles of six-dimensional
# reduced metrics (docs/ensembles.md).  SI-DLA on the chaotic
# nonholonomic system (Newton on 8 unknowns): ensembles of 64 / 1024 members under jax.jit
# 1.5x / 1.6x faster (5.9e5 -> 8.8e5 and 4.2e5 -> 6.8e5 trajectory-steps/s), a single
# trajectory unchanged (4.0 us a step; written out it would run 1.6x slower, 6.3 us).
_BATCHED_SOLVE = 8


def solve(m, b):
    """``m^{-1} b`` for a square ``m`` (``b`` a vector or a matrix of right-hand sides):
    Gaussian elimination with partial pivoting, unrolled, for ``n <= 6``; LU otherwise, except
    under ``jax.vmap`` up to ``n = 8`` (:func:`_lu_or_batched`)."""
    n = m.shape[-1]
    if m.ndim != 2 or b.ndim > 2 or n > _BATCHED_SOLVE:
        return jnp.linalg.solve(m, b)
    if n > _SMALL_SOLVE:
        return _lu_or_batched(m, b.astype(m.dtype))
    return _unrolled_solve(m, b)


@jax.custom_batching.custom_vmap
def _lu_unless_batched(m, b):
    return jnp.linalg.solve(m, b)


@_lu_unless_batched.def_vmap
def _lu_unless_batched_vmap(axis_size, in_batched, m, b):
    m = m if in_batched[0] else jnp.broadcast_to(m, (axis_size,) + m.shape)
    b = b if in_batched[1] else jnp.broadcast_to(b, (axis_size,) + b.shape)
    return jax.vmap(_unrolled_solve)(m, b), True


@jax.custom_jvp
def _lu_or_batched(m, b):
    """``m^{-1} b``: LAPACK's LU for one system, the elimination written out for a batch
    (:data:`_BATCHED_SOLVE`).  Its derivative is the solve's, as a linear solve with the same
    switch (transposable for reverse mode)."""
    return _lu_unless_batched(m, b)


@_lu_or_batched.defjvp
def _lu_or_batched_jvp(primals, tangents):
    m, b = primals
    dm, db = tangents
    x = _lu_or_batched(m, b)
    rhs = db - (dm @ x)
    t = jax.lax.custom_linear_solve(lambda y: m @ y, rhs,
                                    lambda _, r: _lu_or_batched(m, r),
                                    lambda _, r: _lu_or_batched(m.T, r))
    return x, t


def _unrolled_solve(m, b):
    n = m.shape[-1]
    vec = b.ndim == 1
    r = (b[:, None] if vec else b).astype(m.dtype)
    # Kernels on XLA:CPU (a division used twice is a kernel of its own): from n = 3 the
    # augmented array [m | b] makes each elimination step one kernel instead of one for m and
    # one for b sharing the division by the pivot, and the back substitution multiplies by
    # the pivots' reciprocals, computed in one kernel (n = 3, 4, 6: 7, 9, 13 kernels against
    # 9, 14, 24); for n <= 2 the concatenation and the reciprocals cost more than they save
    # (3 kernels against 5).  Either way the pivots and factors come from m alone: the result
    # is linear in b.
    if n <= 2:
        a, r = _eliminate([m, r], n)
        divide = lambda acc, i: acc / a[i, i]  # noqa: E731
    else:
        (aug,) = _eliminate([jnp.concatenate([m, r], axis=1)], n)
        a, r = aug[:, :n], aug[:, n:]
        dinv = 1.0 / jnp.diagonal(a)
        divide = lambda acc, i: acc * dinv[i]  # noqa: E731
    x = [None] * n
    for i in range(n - 1, -1, -1):
        acc = r[i]
        for k in range(i + 1, n):
            acc = acc - a[i, k] * x[k]
        x[i] = divide(acc, i)
    out = jnp.stack(x)
    return out[:, 0] if vec else out


def factor(m):
    """``r -> m^{-1} r`` for a matrix factorised once and applied many times: the inverse
    (then a product that fuses with the caller's arithmetic) for ``n <= 6``, LU otherwise."""
    if m.shape[-1] <= _SMALL_SOLVE:
        inverse = solve(m, jnp.eye(m.shape[-1], dtype=m.dtype))
        return lambda r: mm(inverse, r)
    lu = jsl.lu_factor(m)
    return lambda r: jsl.lu_solve(lu, r)


# Symmetric positive definite systems up to this size are solved by a Cholesky factorisation
# written out as array code, faster than LAPACK's LU inside a loop (no pivoting: the
# discrete gradients' 6 x 6 reduced metric, quartic system, step 0.84x) and no batched LAPACK
# call under jax.vmap (:data:`_BATCHED_SOLVE`).
_SMALL_SPD = 8


def spd_solve(m, b):
    """``m^{-1} b`` for a symmetric positive definite ``m`` (``b`` a vector): Cholesky
    ``m = L Lᵀ`` and two triangular substitutions written out for ``n <= 8``, :func:`solve`
    above."""
    n = m.shape[-1]
    if m.ndim != 2 or b.ndim != 1 or n > _SMALL_SPD:
        return solve(m, b)
    L = [[None] * n for _ in range(n)]
    dinv = [None] * n
    for j in range(n):
        d = m[j, j]
        for k in range(j):
            d = d - L[j][k] * L[j][k]
        dinv[j] = jax.lax.rsqrt(d)
        for i in range(j + 1, n):
            acc = m[i, j]
            for k in range(j):
                acc = acc - L[i][k] * L[j][k]
            L[i][j] = acc * dinv[j]
    y = [None] * n
    for i in range(n):   # L y = b
        acc = b[i]
        for k in range(i):
            acc = acc - L[i][k] * y[k]
        y[i] = acc * dinv[i]
    x = [None] * n
    for i in range(n - 1, -1, -1):   # Lᵀ x = y
        acc = y[i]
        for k in range(i + 1, n):
            acc = acc - L[k][i] * x[k]
        x[i] = acc * dinv[i]
    return jnp.stack(x)
