"""Root solvers for the implicit stage equations of every vijax integrator.

Each implicit method is a residual ``F(x) = 0`` over its stage unknowns ``x``; one solver
interface serves every method.  This module owns the iteration that finds the root and the way
gradients flow through it:

* :class:`Newton` -- full Newton, Jacobian by :func:`jax.jacfwd` of ``F`` and a dense LU solve
  at every iteration (stiff problems, constraints);
* :class:`SimplifiedNewton` -- Newton with the Jacobian evaluated and LU-factorised once, at
  the predictor;
* :class:`FixedPoint` -- ``x <- x - P(F(x))`` with an approximate inverse Jacobian ``P``
  supplied by the method (for VPRK: the block-diagonal inverse velocity Hessian), the cheapest
  iteration for non-stiff mechanical problems.

All three run the same ``lax.while_loop`` to a mixed tolerance with an iteration cap, report
per-solve :class:`SolverStats` (iterations, residual, converged) and -- by default -- are
differentiated by the implicit function theorem through :func:`jax.lax.custom_root`: the
tangent/cotangent of the converged root solves one linear system with the exact Jacobian
``dF/dx`` at the root, whichever iteration found it.  With ``implicit_diff=False`` the
iterations are unrolled instead (a fixed-length ``lax.scan``), which is slower and exists for
comparison.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Bool, Float, Int

__all__ = [
    "SolverStats",
    "AbstractRootSolver",
    "Newton",
    "SimplifiedNewton",
    "FixedPoint",
    "ConvergenceError",
    "default_tolerance",
]


class ConvergenceError(RuntimeError):
    """Raised (with ``throw=True``) when an implicit stage solve did not converge."""


class SolverStats(eqx.Module):
    """Per-solve diagnostics.

    ``residual`` is the max-norm of ``F`` at the last iterate where it was evaluated (the one
    before the returned root: the returned root is at least one contraction better).
    """

    iterations: Int[Array, ""]
    residual: Float[Array, ""]
    converged: Bool[Array, ""]


_NOISE_FLOOR = 1000.0
# A stall is also accepted once the increments have fallen this far below the first one:
# position-level rows g(Q) / h carry round-off eps |q| / h, which for small h sits above
# _NOISE_FLOOR times the tolerance while the iteration has plainly converged.  Capped at
# _STALL_CAP times the tolerance (2e-9 relative in float64) whatever the first increment.
_STALL_DROP = 1e-8
_STALL_CAP = 1e6


def default_tolerance(dtype) -> float:
    """``10 eps`` of ``dtype`` (2.2e-15 in float64, 1.2e-6 in float32).

    Stage equations of symplectic methods are solved to round-off: a solve stopped at a
    looser tolerance leaves a small systematic error per step that shows up as energy drift
    over long runs and breaks exact time reversibility (Hairer, Lubich & Wanner, *Geometric
    Numerical Integration*, §VIII.6).  The stopping test below reaches this level without
    wasted iterations: it estimates the remaining error from the contraction rate and
    accepts the round-off floor once increments stop shrinking.
    """
    return 10.0 * float(jnp.finfo(dtype).eps)


def _dense_solve(matrix, rhs):
    return jnp.linalg.solve(matrix, rhs)


def _tangent_solve(g, y):
    # ``g`` is the linearisation of F at the root; its Jacobian is dF/dx (implicit function
    # theorem).  Unknowns are flat vectors here (see ``AbstractRootSolver.solve``).
    return _dense_solve(jax.jacfwd(g)(y), y)


class AbstractRootSolver(eqx.Module):
    """Contract of a root solver: ``solve(F, x0, precond) -> (x, SolverStats)``.

    Parameters
    ----------
    rtol, atol:
        Convergence when the estimated remaining error (the last increment times
        ``theta / (1 - theta)``, ``theta`` the observed contraction rate; the increment itself
        before a rate is known) is below ``atol + rtol * |x_i|`` in every component -- or, at
        the round-off floor, when increments within 1000 times that bound (or within 1e-8
        times the first increment, at most 1e6 times the bound) stop shrinking.  ``None`` means :func:`default_tolerance` of the working dtype.
    max_steps:
        Iteration cap.  Reaching it without convergence sets ``converged=False`` (never a silent
        NaN: a non-finite iterate stops the loop and is reported the same way).
    implicit_diff:
        ``True`` (default): gradients by the implicit function theorem.  ``False``: unrolled
        iterations (fixed ``max_steps`` iterations, masked after convergence).
    min_steps:
        Updates always performed, as straight-line code, before the convergence-checked
        loop (cheaper than loop iterations on CPU when the predictor is good).
    """

    rtol: Optional[float] = None
    atol: Optional[float] = None
    max_steps: int = eqx.field(static=True, default=50)
    implicit_diff: bool = eqx.field(static=True, default=True)
    min_steps: int = eqx.field(static=True, default=0)

    @abc.abstractmethod
    def _make_update(
        self, f: Callable, x0: Array, precond: Optional[Callable]
    ) -> Callable[[Array], tuple[Array, Array]]:
        """Return ``update(x) -> (dx, r)`` with ``r = F(x)`` and the step ``x <- x - dx``."""

    def _iterate(self, f, x0, precond):
        dtype = x0.dtype
        tol = default_tolerance(dtype)
        rtol = tol if self.rtol is None else self.rtol
        atol = tol if self.atol is None else self.atol
        update = self._make_update(f, x0, precond)

        def one(x, err_prev, err_first):
            dx, r = update(x)
            x_new = x - dx
            err = jnp.max(jnp.abs(dx) / (atol + rtol * jnp.abs(x_new)))
            finite = jnp.all(jnp.isfinite(x_new))
            # Stopping test of Hairer & Wanner (IV.8): with the observed contraction
            # theta = err_k / err_{k-1} < 1, the error left after this update is about
            # theta / (1 - theta) * err_k.  Without a rate yet (first update) or without
            # contraction, the increment itself is tested.  At the round-off floor of an
            # ill-conditioned system the increments stop contracting (theta >= 1) within
            # _NOISE_FLOOR of the tolerance, or _STALL_DROP below the first increment:
            # accepted as converged.
            err_first = jnp.where(jnp.isnan(err_first), err, err_first)
            theta = err / err_prev
            estimate = jnp.where(theta < 1, err * theta / (1 - theta), err)
            level = jnp.maximum(_NOISE_FLOOR, jnp.minimum(_STALL_DROP * err_first, _STALL_CAP))
            floor = (err <= level) & (theta >= 1)
            done = ((estimate <= 1) | floor) & finite
            return x_new, jnp.max(jnp.abs(r)).astype(dtype), err, done, ~finite, err_first

        def body(carry):
            x, k, _, err, _, _, err_first = carry
            x, r, err, done, bad, err_first = one(x, err, err_first)
            return x, k + 1, r, err, done, bad, err_first

        # err_prev starts as NaN: no contraction rate is known before the second update.
        init = (x0, jnp.asarray(0, jnp.int32), jnp.asarray(jnp.inf, dtype),
                jnp.asarray(jnp.nan, dtype), jnp.asarray(False), jnp.asarray(False),
                jnp.asarray(jnp.nan, dtype))
        # The first ``min_steps`` updates are straight-line code: a loop iteration costs more
        # than a small system's update on CPU, and a good predictor needs few updates anyway.
        for _ in range(min(self.min_steps, self.max_steps)):
            init = body(init)

        if self.implicit_diff:
            def cond(carry):
                _, k, _, _, done, bad, _ = carry
                return (k < self.max_steps) & ~done & ~bad

            x, k, r, _, done, _, _ = jax.lax.while_loop(cond, body, init)
        else:
            def scan_body(carry, _):
                x, k, r, err, done, bad, err_first = carry
                new = one(x, err, err_first)
                stop = done | bad
                keep = lambda old, new: jnp.where(stop, old, new)  # noqa: E731
                return (keep(x, new[0]), keep(k, k + 1), keep(r, new[1]), keep(err, new[2]),
                        keep(done, new[3]), keep(bad, new[4]), keep(err_first, new[5])), None

            (x, k, r, _, done, _, _), _ = jax.lax.scan(
                scan_body, init, None, length=max(self.max_steps - self.min_steps, 0))
        return x, SolverStats(iterations=k, residual=r, converged=done)

    def solve(
        self,
        fn: Callable[[Array], Array],
        x0: Array,
        precond: Optional[Callable[[Array], Array]] = None,
    ) -> tuple[Array, SolverStats]:
        """Solve ``fn(x) = 0`` from the predictor ``x0``.

        ``x0`` may be any pytree of arrays; ``fn(x)`` returns a pytree with as many scalars
        in total (it need not have the same structure), and ``precond`` maps a residual pytree
        to an increment shaped like ``x``.

        ``fn`` may close over anything (state, step size, system parameters): with
        ``implicit_diff=True`` those closures are differentiated by the implicit function
        theorem.  ``precond(r)`` approximates ``J^{-1} r`` (used by :class:`FixedPoint`).
        """
        x0, unravel = ravel_pytree(x0)
        flat = lambda y: ravel_pytree(y)[0]  # noqa: E731
        f = lambda y: flat(fn(unravel(y))).astype(x0.dtype)  # noqa: E731
        pc = None if precond is None else (lambda r: flat(precond(unravel(r))))
        if self.implicit_diff:
            # custom_root differentiates its aux output too, so the integer/bool statistics
            # travel as one float vector and are cast back afterwards.
            def solve_packed(g, y):
                x, st = self._iterate(g, y, pc)
                return x, jnp.stack([st.iterations.astype(x.dtype), st.residual,
                                     st.converged.astype(x.dtype)])

            x, packed = jax.lax.custom_root(
                f, jax.lax.stop_gradient(x0), solve_packed, _tangent_solve, has_aux=True
            )
            packed = jax.lax.stop_gradient(packed)
            stats = SolverStats(iterations=packed[0].astype(jnp.int32), residual=packed[1],
                                converged=packed[2] > 0.5)
        else:
            x, stats = self._iterate(f, x0, pc)
        return unravel(x), stats


class Newton(AbstractRootSolver):
    """Full Newton: ``J = jax.jacfwd(F)(x)`` and a dense LU solve at every iteration.

    ``damped=True`` adds a backtracking line search (step halved, at most 30 times, until the
    residual's max-norm decreases and stays finite): robust far from the root, as for the
    inverse Legendre map of a non-quadratic Lagrangian started from ``v = 0``.
    """

    damped: bool = eqx.field(static=True, default=False)

    def _make_update(self, f, x0, precond):
        def with_value(y):
            r = f(y)
            return r, r  # one evaluation: the residual rides along as jacfwd's aux output

        def update(x):
            jac, r = jax.jacfwd(with_value, has_aux=True)(x)
            dx = _dense_solve(jac, r)
            if not self.damped:
                return dx, r
            norm0 = jnp.max(jnp.abs(r))

            def worse(carry):
                alpha, k = carry
                trial = jnp.max(jnp.abs(f(x - alpha * dx)))
                return ~(trial < norm0) & (k < 30)

            alpha, _ = jax.lax.while_loop(
                worse, lambda c: (0.5 * c[0], c[1] + 1), (jnp.ones((), x.dtype), 0))
            return alpha * dx, r

        return update


class SimplifiedNewton(AbstractRootSolver):
    """Newton with the Jacobian evaluated and LU-factorised once, at the predictor ``x0``."""

    def _make_update(self, f, x0, precond):
        lu = jsl.lu_factor(jax.jacfwd(f)(x0))

        def update(x):
            r = f(x)
            return jsl.lu_solve(lu, r), r

        return update


class FixedPoint(AbstractRootSolver):
    """Preconditioned fixed-point iteration ``x <- x - P(F(x))``.

    ``P`` is the method's approximate inverse Jacobian (for :class:`vijax.VPRK`, the inverse
    velocity Hessian of the Lagrangian at the start of the step, block-diagonal over stages).
    Without a preconditioner it is the plain iteration ``x <- x - F(x)``.  It converges
    linearly with a rate ``O(h)`` on non-stiff problems; use :class:`Newton` for stiff ones.
    """

    max_steps: int = eqx.field(static=True, default=100)
    min_steps: int = eqx.field(static=True, default=2)

    def _make_update(self, f, x0, precond):
        def update(x):
            r = f(x)
            return (r if precond is None else precond(r)), r

        return update
