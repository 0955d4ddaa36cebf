"""Root solvers for the implicit stage equations of every vijax integrator.

Each implicit method is a residual ``F(x) = 0`` over its stage unknowns ``x`` (DESIGN.md,
principle 2).  This module owns the iteration that finds the root and the way gradients flow
through it:

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


def default_tolerance(dtype) -> float:
    """``eps**0.8`` of ``dtype``: about 3e-13 in float64 and 3e-6 in float32."""
    return float(jnp.finfo(dtype).eps) ** 0.8


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
        Convergence when ``|dx_i| <= atol + rtol * |x_i|`` for every component of the last
        increment.  ``None`` means :func:`default_tolerance` of the working dtype.
    max_steps:
        Iteration cap.  Reaching it without convergence sets ``converged=False`` (never a silent
        NaN: a non-finite iterate stops the loop and is reported the same way).
    implicit_diff:
        ``True`` (default): gradients by the implicit function theorem.  ``False``: unrolled
        iterations (fixed ``max_steps`` iterations, masked after convergence).
    """

    rtol: Optional[float] = None
    atol: Optional[float] = None
    max_steps: int = eqx.field(static=True, default=50)
    implicit_diff: bool = eqx.field(static=True, default=True)

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

        def one(x):
            dx, r = update(x)
            x_new = x - dx
            scale = atol + rtol * jnp.abs(x_new)
            small = jnp.all(jnp.abs(dx) <= scale)
            finite = jnp.all(jnp.isfinite(x_new))
            return x_new, jnp.max(jnp.abs(r)).astype(dtype), small & finite, ~finite

        init = (x0, jnp.asarray(0, jnp.int32), jnp.asarray(jnp.inf, dtype),
                jnp.asarray(False), jnp.asarray(False))

        if self.implicit_diff:
            def cond(carry):
                _, k, _, done, bad = carry
                return (k < self.max_steps) & ~done & ~bad

            def body(carry):
                x, k, _, _, _ = carry
                x, r, done, bad = one(x)
                return x, k + 1, r, done, bad

            x, k, r, done, _ = jax.lax.while_loop(cond, body, init)
        else:
            def scan_body(carry, _):
                x, k, r, done, bad = carry
                x_new, r_new, done_new, bad_new = one(x)
                stop = done | bad
                keep = lambda old, new: jnp.where(stop, old, new)  # noqa: E731
                return (keep(x, x_new), keep(k, k + 1), keep(r, r_new),
                        keep(done, done_new), keep(bad, bad_new)), None

            (x, k, r, done, _), _ = jax.lax.scan(scan_body, init, None, length=self.max_steps)
        return x, SolverStats(iterations=k, residual=r, converged=done)

    def solve(
        self,
        fn: Callable[[Array], Array],
        x0: Array,
        precond: Optional[Callable[[Array], Array]] = None,
    ) -> tuple[Array, SolverStats]:
        """Solve ``fn(x) = 0`` from the predictor ``x0`` (any shape; ``fn`` preserves it).

        ``fn`` may close over anything (state, step size, system parameters): with
        ``implicit_diff=True`` those closures are differentiated by the implicit function
        theorem.  ``precond(r)`` approximates ``J^{-1} r`` (used by :class:`FixedPoint`).
        """
        shape = x0.shape
        flat = lambda y: jnp.reshape(y, (-1,))  # noqa: E731
        f = lambda y: flat(fn(jnp.reshape(y, shape)))  # noqa: E731
        pc = None if precond is None else (
            lambda r: flat(precond(jnp.reshape(r, shape))))
        x0 = flat(x0)
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
        return jnp.reshape(x, shape), stats


class Newton(AbstractRootSolver):
    """Full Newton: ``J = jax.jacfwd(F)(x)`` and a dense LU solve at every iteration."""

    def _make_update(self, f, x0, precond):
        def update(x):
            jac, r = jax.jacfwd(lambda y: (f(y), f(y)), has_aux=True)(x)
            return _dense_solve(jac, r), r

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

    def _make_update(self, f, x0, precond):
        def update(x):
            r = f(x)
            return (r if precond is None else precond(r)), r

        return update
