"""The rotation group SO(3) with closed forms for ``exp``, ``log``, ``cay`` and their tangents.

Elements are ``3 × 3`` rotation matrices, the algebra is ``R^3`` with ``hat`` the
cross-product matrix (``hat(ξ) η = ξ × η``), so ``Ad_R = R`` and ``ad_ξ = hat(ξ)``.  With
``θ = |ξ|`` and ``X = hat(ξ)``, the closed forms are (Hairer, Lubich & Wanner (2006), §IV.8;
Iserles, Munthe-Kaas, Nørsett & Zanna (2000); the Cayley map after Kobilarov & Marsden
(2011)):

* ``exp(ξ) = I + (sin θ/θ) X + ((1 - cos θ)/θ²) X²`` (Rodrigues);
* ``d^L exp_ξ = I - ((1 - cos θ)/θ²) X + ((θ - sin θ)/θ³) X²`` (left-trivialised, the
  "right Jacobian" of the robotics literature) and ``(d^L exp_ξ)^{-1} = I + X/2 +
  (1/θ² - (1 + cos θ)/(2 θ sin θ)) X²``;
* ``cay(ξ) = I + 4/(4 + θ²) (X + X²/2)``, ``cay^{-1}(R) = 2 vee(R - Rᵀ)/(1 + tr R)``,
  ``d^L cay_ξ = 2/(4 + θ²) (2 I - X)``, ``(d^L cay_ξ)^{-1} = I + X/2 + ξ ξᵀ/4``.

Every coefficient is a function of ``θ²`` evaluated with the "double where" device (as jaxlie
does for its Taylor branches): below ``θ² = 1`` a twelve-term Taylor polynomial in ``θ²``,
above it the closed form evaluated at a ``θ²`` that the ``where`` keeps away from 0, and every
derivative of a coefficient is built the same way (:class:`SeriesFunction`).  Values,
first and second derivatives (``jax.jacfwd`` of ``jax.jacfwd``, ``jax.vjp`` inside
``jax.jacfwd``) are then finite at ``ξ = 0``; the two branches agree to round-off at the
switch (twelve terms leave a truncation error below ``1e-17`` at ``θ² = 1``, and there the
closed forms lose at most ``~1e-15`` to cancellation in their values and ``~1e-11`` (relative)
in their second derivatives in ``θ²``).

``log`` goes through the unit quaternion (Shepperd's branch choice, then
``θ = 2 atan2(|q_v|, w)`` with ``w >= 0``): accurate for all angles, finite and continuous up
to ``θ = π``, where the logarithm is not unique and either of ``±π n`` is returned.
"""

from __future__ import annotations

import abc
import math
from fractions import Fraction

import jax
import jax.numpy as jnp

from ._base import AbstractCayleyGroup, AbstractMatrixLieGroup

__all__ = ["SO3"]

#: The Taylor branches are used for ``θ² < _SMALL``, with ``_NTERMS`` terms in ``θ²``.
_SMALL = 1.0
_NTERMS = 12


def _poly(s, coeffs):
    """``Σ_k coeffs[k] s^k`` (Horner)."""
    out = coeffs[-1] * jnp.ones_like(s)
    for c in reversed(coeffs[:-1]):
        out = out * s + c
    return out


def series_where(s, exact, coeffs, threshold=_SMALL):
    """``exact(s)`` for ``s >= threshold``, the Taylor polynomial ``coeffs`` in ``s`` below it.

    The "double where": ``exact`` sees ``s = 1`` on the Taylor side, so neither branch
    produces a NaN or an infinity that would leak into derivatives through ``jnp.where``.
    """
    small = s < threshold
    s_safe = jnp.where(small, jnp.ones_like(s), s)
    return jnp.where(small, _poly(s, coeffs), exact(s_safe))


class _Coefficient(abc.ABC):
    """A function of ``s = θ²`` with the derivative rule ``f'(s) ds`` (a
    :func:`jax.custom_jvp`), where ``f'`` is the subclass's :attr:`derivative`."""

    @abc.abstractmethod
    def _value(self, s):
        """The function's value (traced once per call site)."""

    @property
    @abc.abstractmethod
    def derivative(self) -> "_Coefficient":
        """``f'`` as a function of the same kind."""

    def __init__(self):
        self._derivative = None
        f = jax.custom_jvp(self._value)
        f.defjvp(self._jvp)
        self._f = f

    def _jvp(self, primals, tangents):
        (s,), (ds,) = primals, tangents
        return self._f(s), self.derivative(s) * ds

    def __call__(self, s):
        return self._f(s)


class SeriesFunction(_Coefficient):
    """A coefficient function ``f(s)``: :func:`series_where` of its Taylor coefficients in ``s``
    and its closed form, with derivatives given by the same device (a :func:`jax.custom_jvp`):
    ``f'`` is the :class:`SeriesFunction` of the differentiated polynomial and the
    differentiated closed form, so a derivative program evaluates one polynomial per derivative
    instead of differentiating the Horner recurrence and both branches of the ``where`` (the
    same values: the derivative of the truncated polynomial is the truncated derivative; a
    smaller program, which the Lie-group integrators' Newton Jacobians and gradients
    differentiate up to three times)."""

    def __init__(self, coeffs, exact, threshold=_SMALL):
        self.coeffs = tuple(coeffs) or (0.0,)
        self.exact, self.threshold = exact, threshold
        super().__init__()

    def _value(self, s):
        return series_where(s, self.exact, self.coeffs, self.threshold)

    @property
    def derivative(self) -> "SeriesFunction":
        if self._derivative is None:
            exact = self.exact

            def d_exact(s):
                return jax.jvp(exact, (s,), (jnp.ones_like(s),))[1]

            self._derivative = SeriesFunction(
                [k * c for k, c in enumerate(self.coeffs)][1:], d_exact, self.threshold)
        return self._derivative


def _bernoulli(n):
    """``B_0 .. B_n`` (``B_1 = -1/2``) as exact fractions."""
    B = [Fraction(1)]
    for k in range(1, n + 1):
        B.append(-sum(math.comb(k + 1, j) * B[j] for j in range(k)) / Fraction(k + 1))
    return B


_B = _bernoulli(2 * _NTERMS + 2)
# Taylor coefficients in s = θ² (exact rationals, rounded once).
_C_SINC = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(_NTERMS))
_C_COS2 = tuple((-1) ** k / math.factorial(2 * k + 2) for k in range(_NTERMS))
_C_SIN3 = tuple((-1) ** k / math.factorial(2 * k + 3) for k in range(_NTERMS))
# 1/θ² - cot(θ/2)/(2θ) = Σ_k |B_{2k+2}| θ^{2k} / (2k+2)!  (radius of convergence 2π)
_C_DEXPINV = tuple(float(abs(_B[2 * k + 2]) / math.factorial(2 * k + 2)) for k in range(_NTERMS))
# (θ/2) cot(θ/2) = 1 - θ² (1/θ² - cot(θ/2)/(2θ))
_C_HALFCOT = (1.0,) + tuple(-c for c in _C_DEXPINV[:-1])


#: ``sin θ / θ`` as a function of ``s = θ²``.
sinc = SeriesFunction(_C_SINC, lambda s: jnp.sin(jnp.sqrt(s)) / jnp.sqrt(s))


#: ``(1 - cos θ)/θ²`` as a function of ``s = θ²`` (written ``2 sin²(θ/2)/θ²``).
cos2 = SeriesFunction(_C_COS2, lambda s: 2.0 * jnp.sin(0.5 * jnp.sqrt(s)) ** 2 / s)


def _sin3(s):
    t = jnp.sqrt(s)
    return (t - jnp.sin(t)) / (s * t)


#: ``(θ - sin θ)/θ³`` as a function of ``s = θ²``.
sin3 = SeriesFunction(_C_SIN3, _sin3)


def _dexpinv_coeff(s):
    h = 0.5 * jnp.sqrt(s)
    return 1.0 / s - jnp.cos(h) / (4.0 * h * jnp.sin(h))


#: ``1/θ² - (1 + cos θ)/(2 θ sin θ)`` as a function of ``s = θ²`` (finite up to ``θ = 2π``,
#: exclusive).
dexpinv_coeff = SeriesFunction(_C_DEXPINV, _dexpinv_coeff)


def _halfcot(s):
    h = 0.5 * jnp.sqrt(s)
    return h * jnp.cos(h) / jnp.sin(h)


#: ``(θ/2) cot(θ/2)`` as a function of ``s = θ²``.
halfcot = SeriesFunction(_C_HALFCOT, _halfcot)


class SeriesStack(_Coefficient):
    """Several :class:`SeriesFunction` of the same ``s``, evaluated as one stacked array
    (leading axis: the functions).  On XLA:CPU each closed form's ``sqrt``, ``sin`` and
    divisions used by more than one consumer are kernels of their own; with one consumer
    (the stack) they fuse into one kernel.  Derivatives stack the same way."""

    def __init__(self, *functions):
        self.functions = functions
        super().__init__()

    def _value(self, s):
        return jnp.stack([fn._value(s) for fn in self.functions])

    @property
    def derivative(self) -> "SeriesStack":
        if self._derivative is None:
            self._derivative = SeriesStack(*(fn.derivative for fn in self.functions))
        return self._derivative


#: ``(sinc, cos2)`` and ``(cos2, sin3)``: the coefficients of ``exp`` and ``dexp``.
exp_coefficients = SeriesStack(sinc, cos2)
dexp_coefficients = SeriesStack(cos2, sin3)


# hat(ξ) as a stack of its nine entries.  (A gather ξ[index] * sign was one operation fewer
# and an eighth fewer operations in a heavy-top gradient program, but its transpose in every
# reverse pass -- the stage forces L*D1ℓ are gradients -- is a scatter-add: per step 1.05-1.15x
# (single heavy top, Exp and Cayley), 1.2x (called ensembles), 1.1-1.16x (gradients) the cost
# of the stack, and XLA:CPU never compiles a loop that holds a scatter into one kernel.)


def skew(xi):
    """The cross-product matrix ``hat(ξ)`` (``hat(ξ) η = ξ × η``)."""
    x, y, z = xi[0], xi[1], xi[2]
    o = jnp.zeros_like(x)
    return jnp.stack([jnp.stack([o, -z, y]), jnp.stack([z, o, -x]), jnp.stack([-y, x, o])])


def unskew(X):
    """Inverse of :func:`skew` (of the skew part: ``vee((X - Xᵀ)/2)``)."""
    return 0.5 * jnp.stack([X[2, 1] - X[1, 2], X[0, 2] - X[2, 0], X[1, 0] - X[0, 1]])


def _skew_sq(xi, s):
    """``hat(ξ)² = ξ ξᵀ - |ξ|² I``."""
    return jnp.outer(xi, xi) - s * jnp.eye(3, dtype=xi.dtype)


def project_rotation(M):
    """The rotation nearest to ``M`` in the Frobenius norm: the polar factor ``U Vᵀ`` of the
    SVD ``M = U S Vᵀ``, with the last singular direction flipped if ``det(U Vᵀ) < 0``."""
    U, _, Vt = jnp.linalg.svd(M)
    sign = jnp.sign(jnp.linalg.det(U @ Vt))
    sign = jnp.where(sign == 0, jnp.ones_like(sign), sign)
    D = jnp.stack([jnp.ones_like(sign), jnp.ones_like(sign), sign])
    return (U * D[None, :]) @ Vt


def rotation_distance(R):
    """``‖RᵀR - I‖_F + |det R - 1|`` (0 exactly on SO(n))."""
    k = R.shape[-1]
    return jnp.linalg.norm(R.T @ R - jnp.eye(k, dtype=R.dtype)) + jnp.abs(jnp.linalg.det(R) - 1.0)


class SO3(AbstractMatrixLieGroup, AbstractCayleyGroup):
    """The rotation group SO(3): ``3 × 3`` rotation matrices, algebra ``R^3`` with
    ``hat(ξ) η = ξ × η``.  ``Ad_R = R``, ``ad_ξ = hat(ξ)``, ``Ad*_R μ = Rᵀ μ``,
    ``ad*_ξ μ = μ × ξ``; closed forms for ``exp``, ``log``, ``dexp``, ``dexp_inv`` and the
    Cayley map with its tangents (module docstring).  Build elements from unit quaternions
    with :meth:`from_quaternion`."""

    @property
    def dim(self) -> int:
        return 3

    # -- elements -----------------------------------------------------------------------------
    def identity(self, dtype=None):
        return jnp.eye(3, dtype=dtype)

    def inverse(self, g):
        return g.T

    def project(self, g):
        return project_rotation(g)

    def distance(self, g):
        return rotation_distance(g)

    # -- algebra --------------------------------------------------------------------------------
    def hat(self, xi):
        return skew(xi)

    def vee(self, X):
        return unskew(X)

    def exp(self, xi):
        s = jnp.dot(xi, xi)
        a, b = exp_coefficients(s)
        return jnp.eye(3, dtype=xi.dtype) + a * skew(xi) + b * _skew_sq(xi, s)

    def log(self, g):
        q = self.as_quaternion(g)
        w, v = q[0], q[1:]
        n2 = jnp.dot(v, v)
        # θ/|v| = 2 atan2(|v|, w)/|v|; below n2 = 0.01 the series 2/w Σ (-r)^k/(2k+1) in
        # r = n2/w² (w >= 0.99 there, so r < 0.0102 and eight terms leave < 1e-17).
        small = n2 < 0.01
        n2_safe = jnp.where(small, jnp.ones_like(n2), n2)
        n = jnp.sqrt(n2_safe)
        w_safe = jnp.where(small, w, jnp.ones_like(w))
        r = n2 / w_safe ** 2
        series = 2.0 / w_safe * _poly(r, tuple((-1) ** k / (2 * k + 1) for k in range(8)))
        factor = jnp.where(small, series, 2.0 * jnp.arctan2(n, w) / n)
        return factor * v

    def ad(self, xi):
        return skew(xi)

    def Ad(self, g):  # noqa: N802
        return g

    def dexp(self, xi):
        s = jnp.dot(xi, xi)
        b, c = dexp_coefficients(s)
        return jnp.eye(3, dtype=xi.dtype) - b * skew(xi) + c * _skew_sq(xi, s)

    def dexp_inv(self, xi):
        s = jnp.dot(xi, xi)
        return (jnp.eye(3, dtype=xi.dtype) + 0.5 * skew(xi)
                + dexpinv_coeff(s) * _skew_sq(xi, s))

    # -- Cayley -----------------------------------------------------------------------------------
    def cay(self, xi):
        s = jnp.dot(xi, xi)
        X = skew(xi)
        return jnp.eye(3, dtype=xi.dtype) + (4.0 / (4.0 + s)) * (X + 0.5 * _skew_sq(xi, s))

    def cay_inv(self, g):
        v = jnp.stack([g[2, 1] - g[1, 2], g[0, 2] - g[2, 0], g[1, 0] - g[0, 1]])
        return 2.0 * v / (1.0 + jnp.trace(g))

    def dcay(self, xi):
        s = jnp.dot(xi, xi)
        return (2.0 / (4.0 + s)) * (2.0 * jnp.eye(3, dtype=xi.dtype) - skew(xi))

    def dcay_inv(self, xi):
        return jnp.eye(3, dtype=xi.dtype) + 0.5 * skew(xi) + 0.25 * jnp.outer(xi, xi)

    # -- vector forms -----------------------------------------------------------------------------
    def Ad_apply(self, g, xi):  # noqa: N802
        return g @ xi

    def Ad_star(self, g, mu):  # noqa: N802
        return g.T @ mu

    def ad_apply(self, xi, eta):
        return jnp.cross(xi, eta)

    def ad_star(self, xi, mu):
        return jnp.cross(mu, xi)

    # -- quaternions ------------------------------------------------------------------------------
    @staticmethod
    def from_quaternion(q):
        """The rotation matrix of the quaternion ``q = (w, x, y, z)`` (scalar first), which is
        normalised first; ``q`` and ``-q`` give the same rotation.  The vector ``ξ = θ n``
        corresponds to ``q = (cos(θ/2), sin(θ/2) n)``, i.e. ``from_quaternion(q) = exp(ξ)``."""
        q = q / jnp.linalg.norm(q)
        w, x, y, z = q[0], q[1], q[2], q[3]
        return jnp.stack([
            jnp.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)]),
            jnp.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)]),
            jnp.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]),
        ])

    @staticmethod
    def as_quaternion(R):
        """The unit quaternion ``(w, x, y, z)`` (scalar first, ``w >= 0``) of a rotation matrix:
        Shepperd's method, which divides by the largest of ``4w², 4x², 4y², 4z²`` (at least 1
        on SO(3)), so it is accurate for every rotation."""
        r00, r11, r22 = R[0, 0], R[1, 1], R[2, 2]
        tr = r00 + r11 + r22
        a = R[2, 1] - R[1, 2]
        b = R[0, 2] - R[2, 0]
        c = R[1, 0] - R[0, 1]
        d01 = R[1, 0] + R[0, 1]
        d02 = R[0, 2] + R[2, 0]
        d12 = R[2, 1] + R[1, 2]
        t = jnp.stack([1 + tr, 1 + r00 - r11 - r22, 1 - r00 + r11 - r22, 1 - r00 - r11 + r22])
        cand = jnp.stack([
            jnp.stack([t[0], a, b, c]),
            jnp.stack([a, t[1], d01, d02]),
            jnp.stack([b, d01, t[2], d12]),
            jnp.stack([c, d02, d12, t[3]]),
        ])
        k = jnp.argmax(t)
        q = cand[k] * (0.5 / jnp.sqrt(t[k]))
        q = q / jnp.linalg.norm(q)
        return jnp.where(q[0] < 0, -q, q)

    @staticmethod
    def from_axis_angle(axis, angle):
        """The rotation by ``angle`` about ``axis`` (normalised first): ``exp(angle n)``."""
        n = axis / jnp.linalg.norm(axis)
        return SO3().exp(angle * n)
