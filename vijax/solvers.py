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
per-solve :class:`SolverStats` (iterations, residual, converged) and are differentiated as
their ``adjoint`` says: :class:`ImplicitAdjoint` (default) by the implicit function theorem
(the rule of :func:`jax.lax.custom_root`) -- the tangent/cotangent of the converged root
solves one linear system with the exact Jacobian ``dF/dx`` at the root, whichever iteration
found it --
or :class:`UnrolledAdjoint` through the iterations (a fixed-length ``lax.scan``; slower, for
comparison).  A derivative through a solve that did not converge is NaN.
"""

from __future__ import annotations

import abc
import numbers
from collections.abc import Callable
from typing import ClassVar, Optional, Union

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.extend import core as jax_core
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Bool, Float, Int, PyTree

from . import _linalg

__all__ = [
    "SolverStats",
    "AbstractRootSolver",
    "AbstractAdjoint",
    "ImplicitAdjoint",
    "UnrolledAdjoint",
    "Newton",
    "SimplifiedNewton",
    "StartAsRoot",
    "AbstractFixedPoint",
    "FixedPoint",
    "ConvergenceError",
    "default_tolerance",
    "STAGE_ROOT",
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
# Positions in the vector of loop scalars of AbstractRootSolver._iterate.
_K, _ERR, _FIRST, _MIN, _STALLS, _DONE, _BAD, _ERR2 = range(8)


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


def _tangent_solve(g, y):
    # ``g`` is the linearisation of F at the root; its Jacobian is dF/dx (implicit function
    # theorem).  Unknowns are flat vectors here (see ``AbstractRootSolver.solve``).
    # Reverse mode solves with the transpose directly (``custom_linear_solve``) instead of
    # transposing the elimination's row operations, whose slices transpose to pads: the
    # backward loop of a Kepler gradient (VPRK.gauss(2)) went from 61 to 47 fused kernels,
    # 3.05-3.48 -> 2.92-3.05 us/step (five alternating runs).
    jac = jax.jacfwd(g)(y)
    return jax.lax.custom_linear_solve(
        lambda x: _linalg.mm(jac, x), y, lambda _, b: _linalg.solve(jac, b),
        lambda _, b: _linalg.solve(jac.T, b))


@jax.custom_jvp
def _nan_tangent_if(x, failed):
    """Identity on ``x``; its tangent is NaN where ``failed`` (a gradient through a solve
    that did not converge is NaN, never a number)."""
    return x


@_nan_tangent_if.defjvp
def _nan_tangent_if_jvp(primals, tangents):
    x, failed = primals
    tx, _ = tangents
    # A product, not a select: linear in the tangent, so its transpose (reverse mode) is NaN too.
    nan = lambda t: t * jnp.where(failed, jnp.nan, 1.0).astype(t.dtype)  # noqa: E731
    return x, jax.tree_util.tree_map(nan, tx)


def _with_aux_tangent(fc, consts, x, aux):
    """``aux`` (taken from the last residual evaluation) with the tangent of ``aux(x)`` at the
    root ``x``: the primal costs nothing, the derivative is exact (``fc(y, *consts)`` is the
    closure-converted ``y -> (residual, aux)``)."""

    @jax.custom_jvp
    def attach(x, consts, aux):
        return aux

    @attach.defjvp
    def attach_jvp(primals, tangents):
        x, consts, aux = primals
        tx, tconsts, _ = tangents
        at_x, taux = jax.jvp(lambda y, c: fc(y, *c)[1], (x, consts), (tx, tconsts))
        # The primal is ``aux``, with the derivatives of ``aux(x)``: differentiated again (a
        # Hessian), this rule's own output must depend on ``x`` and the closure, not be the
        # gradient-stopped value (which made second derivatives through VPRK's momentum form
        # wrong by 1 % on the double pendulum, and asymmetric).
        return aux + (at_x - jax.lax.stop_gradient(at_x)), taux

    return attach(x, consts, aux)


def _implicit_solve(iterate, fc, x0, consts, fixed):
    """``iterate(x0, consts, fixed) -> (x, aux, packed statistics)``, the loop that finds the
    root of ``y -> fc(y, *consts)[0]``, with the derivatives of the implicit function theorem:
    ``dx = -(dF/dx)^{-1} (dF/dconsts) dconsts`` at the root, whichever iteration found it
    (the rule of :func:`jax.lax.custom_root`).  ``fixed`` (the preconditioner's data) is not
    differentiated.

    The rule names the root and the statistics :data:`STAGE_ROOT` where it linearises: a
    rematerialised step that saves them needs no second solve.  Its primal output is this
    function again, whose own primal is the loop: a ``lax.scan`` differentiated twice (its
    loop-invariant hoisting partially evaluates the known body again, and so drops the custom
    rules of calls there) differentiates the loop instead, which converges to the same
    derivative."""

    def rule(compact: bool):
        @jax.custom_jvp
        def solve(x0, consts, fixed):
            return iterate(x0, consts, fixed, compact)

        @solve.defjvp
        def solve_jvp(primals, tangents):
            x0, consts, fixed = primals
            _, t_consts, _ = tangents
            x, aux, packed = jax.tree_util.tree_map(lambda v: checkpoint_name(v, STAGE_ROOT),
                                                    plain(x0, consts, fixed))
            rhs = jax.jvp(lambda c: fc(x, *c)[0], (consts,), (t_consts,))[1]
            tx = -_tangent_solve(lambda t: jax.jvp(lambda y: fc(y, *consts)[0], (x,), (t,))[1],
                                 rhs)
            return (x, aux, packed), (tx, jnp.zeros_like(aux), jnp.zeros_like(packed))

        return solve

    # The loop compacts the members of an ensemble (lane_compacting_while) where it is not
    # differentiated; a derivative's primal is the plain loop, which a second derivative may
    # differentiate (custom_vmap's own derivative rule does not compose with that batching).
    plain = rule(False)
    return rule(True)(x0, consts, fixed)


#: The name (:func:`jax.ad_checkpoint.checkpoint_name`) of a stage solve's outputs where its
#: derivative linearises (the root, the ``aux`` output and the statistics, whose convergence
#: flag makes a derivative through a failed solve NaN): ``jax.checkpoint(step,
#: policy=jax.checkpoint_policies.save_only_these_names(STAGE_ROOT))`` keeps what the
#: backward pass reads of them, and the step's derivative then needs no second solve
#: (:class:`ImplicitAdjoint`).
STAGE_ROOT = "vijax_stage_root"


class AbstractAdjoint(eqx.Module):
    """How derivatives flow through a root solve (the role of optimistix's adjoints)."""

    @abc.abstractmethod
    def apply(self, solver: "AbstractRootSolver", f: Callable, x0: Array,
              precond: Optional[Callable], has_aux: bool, stall_level=None
              ) -> tuple[Array, Array, "SolverStats"]:
        """Run ``solver`` on the flat ``f: x -> (F(x), aux)`` from ``x0``; return the root,
        ``aux`` at the root (see :meth:`AbstractRootSolver.solve`) and the statistics."""


class ImplicitAdjoint(AbstractAdjoint):
    """Implicit function theorem (default): the tangent/cotangent of the converged root solves
    one linear system with the exact Jacobian ``dF/dx`` at the root, whichever iteration found
    it.  Memory and cost do not depend on the iteration count.  The root and the statistics
    are named :data:`STAGE_ROOT` where the derivative linearises (:func:`_implicit_solve`): a
    rematerialised step that saves them (``jax.checkpoint`` with
    ``save_only_these_names(STAGE_ROOT)``, as :func:`vijax.simulate` does on CPU) linearises
    its stage equations at the saved root without solving them again."""

    def apply(self, solver, f, x0, precond, has_aux, stall_level=None):
        fc, consts = jax.closure_convert(f, x0)
        if precond is None:
            pc, pc_consts = None, ()
        else:
            pc, pc_consts = jax.closure_convert(precond, x0)

        def iterate(y0, consts, fixed, compact):
            pc_consts, stall = fixed
            x, aux, st = solver._iterate(
                lambda y: fc(y, *consts), y0,
                None if pc is None else (lambda r: pc(r, *pc_consts)), bounded=False,
                has_aux=has_aux, stall_level=stall, compact=compact)
            # one float vector: the statistics ride through the derivative's rule as data
            return x, aux, jnp.stack([st.iterations.astype(x.dtype), st.residual,
                                      st.converged.astype(x.dtype)])

        fixed = jax.lax.stop_gradient((tuple(pc_consts), stall_level))
        # The predictor keeps its tangent: the rule ignores it, but where the loop itself is
        # differentiated (second derivatives, _implicit_solve) the iterates' tangents start
        # from the predictor's, as good as the predictor, rather than from zero, and converge
        # with the iterates (the double pendulum's Hessian through 60 VPRK.gauss(2) steps:
        # asymmetry 5.7e-11 -> 2.6e-15 relative, forward-over-forward against
        # forward-over-reverse 3.8e-11 -> 2.4e-15; first derivatives bit for bit the same,
        # at the same cost).
        x, aux, packed = _implicit_solve(iterate, fc, x0, consts, fixed)
        packed = jax.lax.stop_gradient(packed)
        stats = SolverStats(iterations=packed[0].astype(jnp.int32), residual=packed[1],
                            converged=packed[2] > 0.5)
        aux = _with_aux_tangent(fc, consts, x, jax.lax.stop_gradient(aux))
        return x, aux, stats


class UnrolledAdjoint(AbstractAdjoint):
    """Differentiate through the iterations themselves: a fixed-length ``lax.scan`` of
    ``max_steps`` updates, masked after convergence.  Slower; exists for comparison."""

    def apply(self, solver, f, x0, precond, has_aux, stall_level=None):
        return solver._iterate(f, x0, precond, bounded=True, has_aux=has_aux,
                               stall_level=stall_level)


# Under ``jax.vmap`` a ``while_loop`` runs its body for every member until the slowest has
# stopped: every member pays the largest iteration count of the batch.  From this many members
# on, the loop runs batched only while more than 1/_COMPACT_SHARE of them are still iterating;
# those left (at most that share) are then gathered into a batch of that size, finished there,
# and scattered back.  The tail's iterations then cost 1/_COMPACT_SHARE of a batched one.
# Measured on CPU (benchmarks/lane_compaction.py, both programs alternating in one process):
# NonholonomicVPRK.lobatto(3) on the chaotic system at h = 0.2 (7.4 updates per step on average,
# 13-16 for the slowest of 1024 members) runs 1.21-1.55x faster at 64-4096 members (without the
# tail's own compaction 1.19-1.50x; a share of 4: 1.20-1.45x, 16: 1.36-1.47x); the nonholonomic
# unicycle on SE(2) 1.01-1.17x; VPRK.gauss(6) on the double pendulum and GroupVPRK.gauss(2) on
# the heavy top (uniform counts) 1.00-1.03x.  At 16 members it ranged 0.96-1.08x, hence the 64
# where it starts on a CPU.  On a GPU a batch
# below a few thousand members is bound by kernel launches, not by the lanes' work, and the
# compaction adds launches: there it starts where an H200 was saturated (16384 members of the
# chaotic system ran at the throughput of 262144; the compacted loop has not been timed on a
# GPU yet).
_COMPACT_MIN = {"cpu": 64, "gpu": 16384}
_COMPACT_SHARE = 8
# A tail of at least this many members compacts its own tail (a loop body more to compile:
# 4096 chaotic members compiled in 1.17 s plain, 2.62 s with every level down to 64, and ran
# 1.58x instead of 1.50x faster than plain; from 512 on, 4096 -> 512 -> 64 is one level less).
_COMPACT_NESTED = 512


def _for_backend(table: dict):
    """``table``'s entry for :func:`jax.default_backend` (others: its ``"gpu"`` entry)."""
    return table.get(jax.default_backend(), table["gpu"])


def _compact_min() -> int:
    return _for_backend(_COMPACT_MIN)


def _hoist(fn: Callable, example: PyTree) -> tuple[Callable, list]:
    """``(fn_c, consts)`` with ``fn_c(x, *consts) == fn(x)``: every value ``fn`` closes over
    becomes an argument (:func:`jax.closure_convert` hoists floating-point values only, and
    a batching rule may not close over batched integers)."""
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(example)
    treedef = jax.tree_util.tree_structure(shape)

    def fn_c(x, *consts):
        out = jax_core.jaxpr_as_fun(jax_core.ClosedJaxpr(closed.jaxpr, consts))(
            *jax.tree_util.tree_leaves(x))
        return jax.tree_util.tree_unflatten(treedef, out)

    return fn_c, list(closed.consts)


def lane_compacting_while(cond: Callable, body: Callable, init: PyTree) -> PyTree:
    """``jax.lax.while_loop(cond, body, init)``, with a batching rule for ensembles: under
    :func:`jax.vmap` over at least 64 members on a CPU (16384 on a GPU), the members still
    iterating once at most ``1/_COMPACT_SHARE`` of them are left run on in a compacted batch
    of that size (:func:`jax.custom_batching.custom_vmap`).  Each member runs its own loop;
    only the work spent on members that have stopped changes.  (The compacted batch is a
    kernel of its own, whose round-off can differ: final states of 1024 chaotic members after
    50 steps within 7.5e-15, 0.6 % of the updates moved between members' counts.)  Not
    differentiable: :class:`ImplicitAdjoint` runs it only where no derivative passes."""
    body_c, consts = _hoist(body, init)
    cond_c, cconsts = _hoist(cond, init)

    def run(carry, consts, cconsts):
        return jax.lax.while_loop(lambda c: cond_c(c, *cconsts), lambda c: body_c(c, *consts),
                                  carry)

    @jax.custom_batching.custom_vmap
    def loop(carry, consts, cconsts):
        return run(carry, consts, cconsts)

    @loop.def_vmap
    def loop_batched(size, in_batched, carry, consts, cconsts):
        carry_b, consts_b, cconsts_b = in_batched
        carry = jax.tree_util.tree_map(
            lambda x, b: x if b else jnp.broadcast_to(x, (size,) + jnp.shape(x)), carry, carry_b)
        axes = lambda bs: jax.tree_util.tree_map(lambda b: 0 if b else None, bs)  # noqa: E731
        in_axes = (0, axes(consts_b), axes(cconsts_b))
        batched = lambda fn: jax.vmap(fn, in_axes=in_axes)  # noqa: E731
        if size < _compact_min():
            out = batched(run)(carry, consts, cconsts)
            return out, jax.tree_util.tree_map(lambda _: True, out)
        share = max(1, size // _COMPACT_SHARE)
        going = lambda c: batched(lambda c, k, kk: cond_c(c, *kk))(c, consts, cconsts)  # noqa: E731
        step = batched(lambda c, k, kk: body_c(c, *k))

        def masked(c_on):
            # the members' own loop conditions travel with the carry: evaluated once per
            # iteration, for the update's mask and for the loop's own test
            c, on = c_on
            new = step(c, consts, cconsts)
            c = jax.tree_util.tree_map(
                lambda o, n: jnp.where(on.reshape(on.shape + (1,) * (o.ndim - 1)), n, o), c, new)
            return c, going(c)

        # every member while more than ``share`` are iterating ...
        carry, on = jax.lax.while_loop(lambda c_on: jnp.sum(c_on[1]) > share, masked,
                                       (carry, going(carry)))
        # ... then those left (at most ``share``), gathered, to the end of their own loops
        idx = jnp.nonzero(on, size=share, fill_value=0)[0]
        dest = jnp.where(jnp.arange(share) < jnp.sum(on), idx, size)   # size: dropped
        take = lambda tree, bs: jax.tree_util.tree_map(  # noqa: E731
            lambda x, b: x[idx] if b else x, tree, bs)
        # (this loop again where the tail is itself large: it compacts its own tail)
        inner = loop if max(_compact_min(), _COMPACT_NESTED) <= share < size else run
        sub = batched(inner)(jax.tree_util.tree_map(lambda x: x[idx], carry),
                             take(consts, consts_b), take(cconsts, cconsts_b))
        out = jax.tree_util.tree_map(lambda x, y: x.at[dest].set(y, mode="drop"), carry, sub)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return loop(init, consts, cconsts)


class AbstractRootSolver(eqx.Module):
    """Contract of a root solver: ``solve(F, x0, precond, has_aux) -> (x, [aux,] stats)``.

    Parameters
    ----------
    rtol, atol:
        Convergence when the estimated remaining error (the last increment times
        ``theta / (1 - theta)``, ``theta`` the slower of the last two observed contraction
        rates, or the one rate after two updates; the increment itself before a rate is
        known) is below ``atol + rtol * |x_i|`` in every component -- or, at
        the round-off floor, when increments within 1000 times that bound (or within 1e-8
        times the first increment, at most 1e6 times the bound) stop shrinking: one grows, or
        two in a row fall short of the smallest so far.  ``None`` means
        :func:`default_tolerance` of the working dtype.
    max_steps:
        Iteration cap.  Reaching it without convergence sets ``converged=False`` (never a silent
        NaN: a non-finite iterate stops the loop and is reported the same way).
    adjoint:
        How derivatives flow through the solve: :class:`ImplicitAdjoint` (default; implicit
        function theorem) or :class:`UnrolledAdjoint` (through the iterations).  Either way a
        derivative through a solve that did not converge is NaN.
    min_steps:
        Updates always performed, as straight-line code, before the convergence-checked
        loop (cheaper than loop iterations when the predictor is good: on a GPU every loop
        iteration also waits for its predicate on the host).  ``None``: the solver's default
        for the backend that compiles the step (:meth:`straight_line_updates`).
    kappa:
        Converged when the estimated remaining error is below ``kappa`` times the tolerance
        (Hairer & Wanner (1996), §IV.8, who take ``kappa`` between 1e-2 and 1e-1).  ``1``
        by default; the constrained methods use ``kappa=0.1``
        (:func:`vijax.constraints.default_solver`): after a fast
        transient their observed rate underestimates the slowest mode's.
    """

    rtol: Optional[float] = None
    atol: Optional[float] = None
    max_steps: int = eqx.field(static=True, default=50)
    adjoint: AbstractAdjoint = eqx.field(default_factory=ImplicitAdjoint)
    min_steps: Optional[int] = eqx.field(static=True, default=0)
    kappa: float = eqx.field(static=True, default=1.0)

    #: ``True`` when the ``aux`` an update returns is that of the iterate it started from
    #: (not carried to the new iterate): with ``has_aux`` it is then evaluated once more at
    #: the returned iterate, after the loop.  (A stricter stopping test on the evaluated
    #: iterate instead costs a whole loop iteration more, which on CPU is dearer than the
    #: straight-line evaluation; accepting the lagging value biases the momentum by the
    #: size of the last update, about 3e-14 per step in measurements, and drifts the energy.)
    _aux_lags: ClassVar[bool] = False
    #: ``True`` for a quadratically converging iteration (Newton): its rates fall, so the
    #: last is the slower, and the stopping test takes it alone (see :meth:`_two_rates`).
    _quadratic: ClassVar[bool] = False

    def __check_init__(self):
        name = type(self).__name__
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, numbers.Integral) \
                or self.max_steps < 1:
            raise ValueError(f"{name}: max_steps must be an int >= 1, got {self.max_steps!r}.")
        if self.min_steps is not None and (
                isinstance(self.min_steps, bool)
                or not isinstance(self.min_steps, numbers.Integral) or self.min_steps < 0):
            raise ValueError(f"{name}: min_steps must be None or an int >= 0, got "
                             f"{self.min_steps!r}.")
        for field in ("rtol", "atol", "kappa"):
            value = getattr(self, field)
            try:   # concrete values only: a traced tolerance is the caller's
                bad = value is not None and not 0 <= float(value) < float("inf")
            except (TypeError, jax.errors.ConcretizationTypeError):
                continue
            if bad or (field == "kappa" and float(value) == 0):
                raise ValueError(f"{name}: {field} must be a finite number "
                                 f"{'> 0' if field == 'kappa' else '>= 0'}, got {value!r}"
                                 f"{'' if field == 'kappa' else ' (None: 10 eps of the dtype)'}.")

    def _default_min_steps(self) -> dict:
        """``min_steps`` when it is ``None``, per :func:`jax.default_backend` (others:
        ``"gpu"``)."""
        return {"cpu": 0, "gpu": 0}

    def tolerances(self, dtype) -> tuple[float, float]:
        """``(rtol, atol)`` for iterates of ``dtype``: the given ones, :func:`default_tolerance`
        where ``None``.  An increment is measured in units of ``atol + rtol |x_i|``, the unit
        of ``stall_level`` (:meth:`solve`)."""
        tol = default_tolerance(dtype)
        return (tol if self.rtol is None else self.rtol,
                tol if self.atol is None else self.atol)

    def _two_rates(self, rtol, atol, dtype) -> bool:
        """Whether the stopping test takes the slower of the last two contraction rates: for
        a linearly converging iteration (rates need not be regular) whose test keeps no
        margin of its own.  A margin covers the same irregularity: ``kappa < 1`` (the
        constrained methods' 0.1 and 0.01: both rules together cost RATTLE 3.6 -> 3.9
        updates per step for the same roots) or a tolerance below :func:`default_tolerance`
        (the discrete gradients' ``eps/100``: 5.11 -> 5.28 updates on the CVT gearbox)."""
        if self._quadratic or self.kappa < 1.0:
            return False
        below = [t < default_tolerance(dtype) for t in (rtol, atol) if isinstance(t, float)]
        return not any(below)

    def straight_line_updates(self) -> int:
        """The updates run as straight-line code before the loop: ``min_steps``, or when that
        is ``None`` the default for the backend (:func:`jax.default_backend`)."""
        if self.min_steps is not None:
            return min(self.min_steps, self.max_steps)
        return min(_for_backend(self._default_min_steps()), self.max_steps)

    @abc.abstractmethod
    def _make_update(
        self, f: Callable, x0: Array, precond: Optional[Callable]
    ) -> Callable[[Array], tuple[Array, Array, Array]]:
        """Return ``update(x) -> (dx, r, aux)`` with ``r = F(x)``, the step ``x <- x - dx`` and
        the flat aux output at the new iterate (to first order) or, when ``_aux_lags``, at
        ``x`` (then discarded).  ``f(x) -> (F(x), aux)`` on flat vectors."""

    def _iterate(self, f, x0, precond, bounded: bool, has_aux: bool = False,
                 stall_level=None, compact: bool = False):
        """The iteration on flat ``x``; ``f(x) -> (F(x), aux)``.  ``bounded``: a masked
        fixed-length scan (differentiable by unrolling) instead of a ``while_loop``.
        ``stall_level``: see :meth:`solve`.  ``compact``: the ``while_loop`` compacts the
        members still iterating under ``jax.vmap`` (:func:`lane_compacting_while`; not
        differentiable)."""
        dtype = x0.dtype
        rtol, atol = self.tolerances(dtype)
        update = self._make_update(f, x0, precond)
        noise_floor = (_NOISE_FLOOR if stall_level is None else
                       jnp.maximum(_NOISE_FLOOR, jax.lax.stop_gradient(stall_level)).astype(dtype))

        kappa = self.kappa
        two_rates = self._two_rates(rtol, atol, dtype)

        def one(x, book):
            dx, r, aux = update(x)
            x_new = x - dx
            # One reduction gives the increment's size and the finiteness test: ``0 * x_new``
            # is NaN where ``x_new`` is not finite, and the maximum propagates NaN.
            err = jnp.max(jnp.abs(dx) / (atol + rtol * jnp.abs(x_new)) + 0.0 * x_new)
            finite = jnp.isfinite(err)
            err_prev, err_first, err_min, stalls = (book[_ERR], book[_FIRST], book[_MIN],
                                                    book[_STALLS])
            # Stopping test of Hairer & Wanner (IV.8): with the observed contraction
            # theta = err_k / err_{k-1} < 1, the error left after this update is about
            # theta / (1 - theta) * err_k.  Without a rate yet (first update) or without
            # contraction, the increment itself is tested.  Written without divisions
            # (theta < 1 is err < err_prev, and theta / (1 - theta) * err <= kappa is
            # err^2 <= kappa (err_prev - err)): every comparison below then fuses into the
            # one kernel that writes the packed statistics, where a division used twice is
            # a kernel of its own on XLA:CPU.  At the round-off floor of an ill-conditioned
            # system the increments stop contracting within _NOISE_FLOOR of the tolerance,
            # or _STALL_DROP below the first increment: accepted as converged when an
            # increment grows (theta >= 1) within that level, or when two updates in a row
            # bring no increment below the smallest one so far while that one is within the
            # level.  (At round-off the iterates can also wander in a cycle whose apparent
            # rates are noise below 1: RATTLE on the 3-D double pendulum at h = 1.6e-4 with
            # an O(h^2) predictor cycled through increments of 383, 1208, 987, 656, 494, 383,
            # ... tolerances, rates 3.2 and 0.66-0.82, and never passed the first rule.)
            err_first = jnp.where(jnp.isnan(err_first), err, err_first)
            contracting = err < err_prev          # theta < 1; False while err_prev is NaN
            growing = err >= err_prev             # theta >= 1
            small = jnp.where(contracting, err * err <= kappa * (err_prev - err),
                              err <= kappa)
            # ... with theta the slower of the last two rates once there are two: the rates
            # of a fixed point need not be regular (velocity form of VPRK.gauss(2) on the
            # double pendulum: increments 2.7e11, 2.6e8, 4.7e6, 1.9e3 tolerances, rates
            # 1e-3, 0.018, 4e-4), and the last rate alone then accepted roots up to 1000 eps
            # off (160--1000 eps at the worst of 2000 steps; 25--31 eps with both rates, for
            # 0.1--0.2 more updates per step)
            if two_rates:
                err_prev2 = book[_ERR2]
                small = small & (jnp.isnan(err_prev2) | (err_prev < err_prev2) & (
                    err_prev * err <= kappa * (err_prev2 - err_prev)))
            level = jnp.maximum(noise_floor, jnp.minimum(_STALL_DROP * err_first, _STALL_CAP))
            stalls = jnp.where(err >= err_min, stalls + 1, 0.0)
            err_min = jnp.minimum(err_min, err)
            floor = ((err <= level) & growing) | ((stalls >= 2) & (err_min <= level))
            done = (small | floor) & finite
            book = jnp.stack([book[_K] + 1, err, err_first, err_min, stalls,
                              done.astype(dtype), (~finite).astype(dtype), err_prev])
            return x_new, book, r, aux

        def body(carry):
            x, book, _, aux = carry
            x, book, r, new_aux = one(x, book)
            # a lagging aux is not carried (it is evaluated at the returned iterate below)
            aux = aux if has_aux and self._aux_lags else new_aux
            return x, book, r, aux

        def stopped(book):
            return (book[_DONE] > 0) | (book[_BAD] > 0)

        # The loop's scalars travel as one float vector (``_K`` ... ``_ERR2``), written by one
        # kernel per update; err_prev starts as NaN: no contraction rate is known before the
        # second update.  The residual is carried whole and reduced once, after the loop.
        aux0 = jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype),
                                      jax.eval_shape(lambda y: f(y)[1], x0))
        book0 = jnp.array([0.0, jnp.nan, jnp.nan, jnp.inf, 0.0, 0.0, 0.0, jnp.nan], dtype)
        r0 = jnp.full_like(x0, jnp.inf)   # the flat residual has as many entries as x
        init = (x0, book0, r0, aux0)
        # The first ``min_steps`` updates are straight-line code: a loop iteration costs more
        # than a small system's update on CPU, and a good predictor needs few updates anyway.
        unrolled = self.straight_line_updates()
        for _ in range(unrolled):
            init = body(init)

        if not bounded:
            def cond(carry):
                book = carry[1]
                return (book[_K] < self.max_steps) & ~stopped(book)

            loop = lane_compacting_while if compact else jax.lax.while_loop
            x, book, r, aux = loop(cond, body, init)
        else:
            def scan_body(carry, _):
                stop = stopped(carry[1])
                new = body(carry)
                keep = lambda old, new: jnp.where(stop, old, new)  # noqa: E731
                return jax.tree_util.tree_map(keep, carry, new), None

            (x, book, r, aux), _ = jax.lax.scan(
                scan_body, init, None, length=max(self.max_steps - unrolled, 0))
        k, done = book[_K].astype(jnp.int32), book[_DONE] > 0
        r = jnp.max(jnp.abs(r), initial=0.0)
        if has_aux and self._aux_lags:
            aux = f(x)[1]  # at the returned iterate: one evaluation after the loop
        return x, aux, SolverStats(iterations=k, residual=r, converged=done)

    def solve(
        self,
        fn: Callable[[PyTree], Union[PyTree, tuple[PyTree, PyTree]]],
        x0: PyTree,
        precond: Optional[Callable[[PyTree], PyTree]] = None,
        *,
        has_aux: bool = False,
        stall_level=None,
    ) -> Union[tuple[PyTree, "SolverStats"], tuple[PyTree, PyTree, "SolverStats"]]:
        """Solve ``fn(x) = 0`` from the predictor ``x0``; returns ``(x, stats)``, or
        ``(x, aux, stats)`` with ``has_aux``.

        ``x0`` may be any pytree of arrays; ``fn(x)`` returns a pytree with as many scalars
        in total (it need not have the same structure) -- or, with ``has_aux=True``, a pair
        ``(residual, aux)``: ``aux`` comes from the *last residual evaluation*, so a quantity
        the residual computes anyway (an outgoing momentum) costs no evaluation after the
        solve.  It is made to agree with ``aux(x)`` at the returned root to within the
        tolerance: the Newton solvers carry it across the last update with its Jacobian
        from the same forward pass (error second order in the update); :class:`FixedPoint`,
        which has no Jacobian, evaluates it once more at the returned iterate (one
        evaluation after the loop, as without ``has_aux``).  Its derivative is that of
        ``aux(x)`` at the root, exactly.

        ``fn`` may close over anything (state, step size, system parameters): those closures
        are differentiated through the adjoint (implicit function theorem by default).
        ``precond(r)`` maps a residual pytree to an increment shaped like ``x`` and
        approximates ``J^{-1} r`` (used by :class:`FixedPoint`).  A derivative through a solve
        that did not converge is NaN.

        ``stall_level`` (a scalar, in multiples of the tolerance; default 1000): increments
        that stop shrinking within this level are taken as round-off (the stopping rule of
        ``rtol``).  A method whose residual carries more round-off than that says so here: the
        constraint rows ``g(Q)/h`` of the holonomic methods carry about ``eps |q| / h``.
        """
        x0, unravel = ravel_pytree(x0)
        flat = lambda y: ravel_pytree(y)[0]  # noqa: E731
        split = (lambda out: out) if has_aux else (lambda out: (out, None))  # noqa: E731
        evaluate, (res_shape, aux_shape) = _trace_once(lambda y: split(fn(unravel(y))), x0)
        zeros = lambda shape: jax.tree_util.tree_map(  # noqa: E731
            lambda a: jnp.zeros(a.shape, a.dtype), shape)
        _, unravel_res = ravel_pytree(zeros(res_shape))
        _, unravel_aux = ravel_pytree(zeros(aux_shape))

        def f(y):
            r, aux = evaluate(y)
            aux = flat(aux)
            return flat(r).astype(x0.dtype), aux.astype(x0.dtype)

        pc = None if precond is None else (lambda r: flat(precond(unravel_res(r))))
        x, aux, stats = self.adjoint.apply(self, f, x0, pc, has_aux, stall_level)
        failed = ~stats.converged
        x = _nan_tangent_if(unravel(x), failed)
        if not has_aux:
            return x, stats
        return x, _nan_tangent_if(unravel_aux(aux), failed), stats


def _trace_once(fn: Callable, x0: Array) -> tuple[Callable, PyTree]:
    """``fn`` traced once, at ``x0``'s shape: returns ``y -> fn(y)`` and ``fn``'s output
    shapes.

    A solve evaluates its residual in several places -- the unrolled first updates, the
    loop body, the value after the loop, the Jacobian of the tangent solve, the aux output's
    tangent -- and each would trace the method's stage equations through Python again
    (``GroupVPRK.lobatto(2)`` on the unicycle: five traces, 2.5 of the 5.4 s it took to trace
    a step).  Here the
    residual becomes a jaxpr once; every later use calls one :func:`jax.jit` of it, whose
    cache hands back the same jaxpr (XLA inlines the call).  Everything the residual closes
    over (the state, the step size, the system's parameters: tracers of the enclosing
    computation) is passed to that call as an argument, so derivatives with respect to them
    flow through it as before.
    """
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(x0)
    jaxpr, consts = closed.jaxpr, list(closed.consts)
    out_tree = jax.tree_util.tree_structure(out_shape)

    @jax.jit
    def run(y, consts):
        return jax_core.jaxpr_as_fun(jax_core.ClosedJaxpr(jaxpr, consts))(y)

    return (lambda y: jax.tree_util.tree_unflatten(out_tree, run(y, consts))), out_shape


class StartAsRoot(AbstractRootSolver):
    """No update: the start is taken as the root, with the derivatives of the implicit
    function theorem there (:class:`ImplicitAdjoint`), and reported converged.  For a start
    that another solve found, to its own tolerance and with its own convergence test -- the
    step a symmetric method retraces (its stage values reversed,
    :meth:`vijax.integrators.AbstractIntegrator.retracing`), whose linearisation the
    reversible adjoint needs -- so the caller answers for it: ``simulate``'s reversible
    adjoint makes its gradient NaN where the step back did not converge.  One residual
    evaluation (for ``aux`` and the residual statistic).  Measured against one confirming
    update in the reversible adjoint's backward pass: Kepler (``VPRK.gauss(2)``, 1e5
    steps) gradient 0.9x, double pendulum 0.9x (see ``docs/solvers.md``)."""

    def _make_update(self, f, x0, precond):
        raise NotImplementedError("StartAsRoot does not iterate")

    def _iterate(self, f, x0, precond, bounded: bool, has_aux: bool = False,
                 stall_level=None, compact: bool = False):
        r, aux = f(x0)
        return x0, aux, SolverStats(iterations=jnp.asarray(0, jnp.int32),
                                    residual=jnp.max(jnp.abs(r), initial=0.0),
                                    converged=jnp.asarray(True))


class Newton(AbstractRootSolver):
    """Full Newton: ``J = jax.jacfwd(F)(x)`` and a dense LU solve at every iteration.

    ``damped=True`` adds a backtracking line search (step halved, at most 30 times, until the
    residual's max-norm decreases and stays finite): robust far from the root, as for the
    inverse Legendre map of a non-quadratic Lagrangian started from ``v = 0``.
    """

    damped: bool = eqx.field(static=True, default=False)

    _quadratic: ClassVar[bool] = True

    def _make_update(self, f, x0, precond):
        def with_value(y):
            out = f(y)
            return out, out  # one evaluation: the value rides along as jacfwd's aux output

        def update(x):
            # The aux output's Jacobian comes from the same forward pass; it carries aux to
            # the new iterate to second order in the step.
            (jac, jac_aux), (r, aux) = jax.jacfwd(with_value, has_aux=True)(x)
            dx = _linalg.solve(jac, r)
            if not self.damped:
                return dx, r, aux - _linalg.mm(jac_aux, dx)
            norm0 = jnp.max(jnp.abs(r))

            def worse(carry):
                alpha, k = carry
                trial = jnp.max(jnp.abs(f(x - alpha * dx)[0]))
                return ~(trial < norm0) & (k < 30)

            alpha, _ = jax.lax.while_loop(
                worse, lambda c: (0.5 * c[0], c[1] + 1), (jnp.ones((), x.dtype), 0))
            return alpha * dx, r, aux - _linalg.mm(jac_aux, alpha * dx)

        return update


class SimplifiedNewton(AbstractRootSolver):
    """Newton with the Jacobian evaluated and LU-factorised once, at the predictor ``x0``."""

    def _make_update(self, f, x0, precond):
        jac, jac_aux = jax.jacfwd(f)(x0)
        apply = _linalg.factor(jac)

        def update(x):
            r, aux = f(x)
            dx = apply(r)
            return dx, r, aux - _linalg.mm(jac_aux, dx)

        return update


class AbstractFixedPoint(AbstractRootSolver):
    """Preconditioned fixed-point iteration ``x <- x - P(F(x))`` (the shared part of
    :class:`FixedPoint` and the constrained methods' default solver); subclasses declare their
    per-backend straight-line start ``_default_min_steps``."""

    max_steps: int = eqx.field(static=True, default=100)
    min_steps: Optional[int] = eqx.field(static=True, default=None)
    _aux_lags: ClassVar[bool] = True

    @abc.abstractmethod
    def _default_min_steps(self) -> dict:
        """The straight-line start per backend: measured per family of stage equations."""

    def _make_update(self, f, x0, precond):
        def update(x):
            r, aux = f(x)
            return (r if precond is None else precond(r)), r, aux

        return update


class FixedPoint(AbstractFixedPoint):
    """Preconditioned fixed-point iteration ``x <- x - P(F(x))``.

    ``P`` is the method's approximate inverse Jacobian (for :class:`vijax.VPRK`, the inverse
    velocity Hessian of the Lagrangian at the start of the step, block-diagonal over stages).
    Without a preconditioner it is the plain iteration ``x <- x - F(x)``.  It converges
    linearly with a rate ``O(h)`` on non-stiff problems; use :class:`Newton` for stiff ones.
    """

    # Measured with benchmarks/stage_sweeps.py (VPRK Gauss(2)-(4) on Kepler, the double
    # pendulum and Henon--Heiles; 1 to 16384 members): on a CPU a loop iteration costs about
    # what an unrolled update does, so 2; on an H100 the best count is the typical iteration
    # count (3 to 5 there), and 4 is within 20 % of the best in every case measured, against
    # up to 1.7 times slower steps with 2.
    def _default_min_steps(self) -> dict:
        return {"cpu": 2, "gpu": 4}
