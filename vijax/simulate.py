"""``simulate``: drive an integrator's ``step`` inside a jit-compiled ``lax.scan``."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
import warnings
from typing import Any, Optional, Union

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from . import _xla
from ._checks import is_traced as _is_traced
from ._checks import refuse as _refuse
from ._typing import ScalarLike, Times, VectorLike
from .integrators._base import AbstractDenseIntegrator, AbstractIntegrator, registry
from .interpolation import DenseInterpolation, DenseOutput
from .solvers import STAGE_ROOT, ConvergenceError
from .systems import (ForcedSystem, LagrangianSystem, LieGroupSystem, MechanicalSystem,
                      TimeDependentSystem)

__all__ = ["simulate", "Solution", "StepStats", "PrecisionWarning"]


class StepStats(eqx.Module):
    """Solver statistics aggregated over the ``save_every`` steps ending at each saved time.

    Arrays have one entry per saved time after the first (aligned with ``Solution.t[1:]``).
    """

    iterations: Int[Array, " n_saves"]      # total solver iterations in the block
    max_iterations: Int[Array, " n_saves"]  # largest per-step count in the block
    residual: Float[Array, " n_saves"]      # largest final residual in the block
    converged: Bool[Array, " n_saves"]      # every step of the block converged
    failed_step: Int[Array, " n_saves"]     # global index of the first failed step, or -1

    @property
    def all_converged(self):
        return jnp.all(self.converged)

    @property
    def first_failure(self):
        """Global index of the first step whose solve failed, or -1."""
        failed = self.failed_step >= 0
        return jnp.where(jnp.any(failed), self.failed_step[jnp.argmax(failed)], -1)


class Solution(eqx.Module):
    """Saved trajectory: ``t, q, v, p`` have ``n_steps // save_every + 1`` rows (initial
    point included); ``states`` holds the integrator's full states at the same times
    (multipliers, stage caches ...), ``stats`` the solver statistics per saved block."""

    t: Float[Array, " n_saves+1"]
    q: Float[Array, "n_saves+1 n"]
    v: Float[Array, "n_saves+1 n"]
    p: Float[Array, "n_saves+1 n"]
    stats: StepStats
    states: Any
    n_steps: int = eqx.field(static=True)
    interpolation: Optional[DenseInterpolation] = None

    @property
    def final_state(self):
        return jax.tree_util.tree_map(lambda x: x[-1], self.states)

    def evaluate(self, t: Union[ScalarLike, Times], derivative: bool = False) -> DenseOutput:
        """Dense output at the times ``t`` (scalar or 1-D): ``q``, ``p`` and, where the method
        defines them, ``v`` and ``pg``, from the polynomials the method solved for on each step
        (:mod:`vijax.interpolation`).  Needs ``simulate(..., dense=True)``.  The times must lie
        in the run, ``[t[0], t[-1]]``: the polynomials do not extrapolate
        (:meth:`vijax.interpolation.DenseInterpolation.evaluate`)."""
        if self.interpolation is None:
            raise ValueError("this Solution has no dense output: run simulate(..., dense=True) "
                             "with an integrator that has it (a vijax.AbstractDenseIntegrator).")
        return self.interpolation.evaluate(t, derivative)

    @property
    def mean_iterations(self):
        """Mean solver iterations per step."""
        return jnp.sum(self.stats.iterations) / self.n_steps


class PrecisionWarning(UserWarning):
    """float64 input (NumPy arrays, lists of floats) met JAX with 64-bit mode off, so it was
    truncated to float32."""


_precision_warned = False


def _meant_float64(x) -> bool:
    """Whether ``x`` arrived as float64 the way NumPy sees it: a NumPy float64 array or scalar,
    or a list/tuple of Python floats.  JAX arrays (already converted) and bare Python scalars
    (weakly typed: they follow the working dtype) are not."""
    if isinstance(x, (np.ndarray, np.generic)):
        return x.dtype == np.float64
    if isinstance(x, (list, tuple)):
        try:
            return np.asarray(x).dtype == np.float64
        except (TypeError, ValueError):
            return False
    return False


def _warn_precision(**inputs) -> None:
    """Warn once per process when float64 input is about to be truncated to float32."""
    global _precision_warned
    if _precision_warned or jax.config.jax_enable_x64:
        return
    meant = [name for name, x in inputs.items() if x is not None and _meant_float64(x)]
    if meant:
        _precision_warned = True
        warnings.warn(
            f"{', '.join(meant)} {'is' if len(meant) == 1 else 'are'} float64 but JAX's 64-bit "
            f"mode is off, so vijax computes in float32 (about 7 significant digits; over long "
            f"runs the energy error grows and drifts where float64 keeps it bounded near "
            f"round-off). Enable float64 "
            f"at start-up with jax.config.update(\"jax_enable_x64\", True), or pass float32 "
            f"arrays to compute in float32 on purpose. (Shown once per process.)",
            PrecisionWarning, stacklevel=3)


class _Inputs:
    """The inputs of a run, each check on their values guarding all of them together: eagerly a
    failed check raises at once; in the graph the check is an ``error_if`` on every input, so
    that whatever part of the result is used, every check runs first, in order."""

    def __init__(self, **inputs):
        self.inputs = inputs

    def __getattr__(self, name):
        try:
            return self.__dict__["inputs"][name]
        except KeyError:
            raise AttributeError(name) from None

    def set(self, **inputs):
        self.inputs = {**self.inputs, **inputs}

    def refuse(self, bad, message, eager=None, exc=ValueError, index=0):
        self.inputs = _refuse(self.inputs, bad, message, eager, exc, index)


def _nonfinite(x):
    """Whether ``x`` has a non-finite entry: a NumPy bool on concrete values (also under a
    jit trace, where jnp would stage them), traced otherwise."""
    leaves = jax.tree_util.tree_leaves(x)
    if any(_is_traced(y) for y in leaves):
        return ~jnp.all(jnp.stack([jnp.all(jnp.isfinite(y)) for y in leaves]))
    return not all(bool(np.all(np.isfinite(np.asarray(y)))) for y in leaves)


def _where_nonfinite(x) -> str:
    x = np.asarray(x)
    if x.ndim == 0:
        return f"{x.item()}"
    idx = [tuple(int(i) for i in ix) if x.ndim > 1 else int(ix[0])
           for ix in np.argwhere(~np.isfinite(x))]
    return f"{x.ravel()[~np.isfinite(x.ravel())][0].item()} at index {idx[0]}" + (
        f" and {len(idx) - 1} more" if len(idx) > 1 else "")


# -- static checks (shapes, dtypes, types, Python ints): raised at trace time under jit -------

# (system type, integrator type, integrator name) triples that passed _check_compatible: the
# check reads types, class-level declarations and the method's configuration (its name: a
# tableau may fit one kind of system and not another), and through equinox's bound methods
# costs ~0.08 ms.
_COMPATIBLE: set = set()


def _check_compatible(system, integrator) -> None:
    pair = (type(system), type(integrator), getattr(integrator, "name", None))
    if pair in _COMPATIBLE:
        return
    if isinstance(system, AbstractIntegrator) or (
            isinstance(system, type) and issubclass(system, AbstractIntegrator)):
        raise TypeError(f"system must be a vijax.LagrangianSystem, got the integrator "
                        f"{_name(system)}: the arguments are swapped; call "
                        f"simulate(system, integrator, ...).")
    if isinstance(integrator, type) and issubclass(integrator, AbstractIntegrator):
        presets = integrator.presets() if not inspect.isabstract(integrator) else []
        example = f"vijax.{presets[0][0]}" if presets else "vijax.VPRK.gauss(2)"
        raise TypeError(f"integrator must be a vijax integrator instance, got the class "
                        f"{integrator.__name__}; pass an instance, e.g. {example}.")
    if not isinstance(integrator, AbstractIntegrator):
        raise TypeError(f"integrator must be a vijax integrator (e.g. vijax.VPRK.gauss(2)), "
                        f"got {_name(integrator)}.")
    base = integrator.system_type
    if isinstance(system, type) and issubclass(system, base):
        raise TypeError(f"system must be a vijax.{base.__name__} instance, got the class "
                        f"{system.__name__}; pass an instance, e.g. {system.__name__}().")
    integrator.check_system(system)
    _COMPATIBLE.add(pair)


def _name(x) -> str:
    return x.__name__ if isinstance(x, type) else type(x).__name__


def _static_count(name: str, n) -> int:
    """``n_steps`` and ``save_every`` fix array shapes: they must be positive Python ints."""
    if isinstance(n, jax.core.Tracer):
        raise ValueError(
            f"{name} must be a positive Python int known when tracing (static): it fixes the "
            f"number of steps and the shape of the saved arrays, but it is traced here "
            f"({type(n).__name__}), as every argument of a jax.jit-compiled function is. Mark "
            f"it static, "
            f"jax.jit(f, static_argnums=...) or jax.jit(f, static_argnames=...), or compile "
            f"with equinox.filter_jit, which keeps Python ints static.")
    if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n <= 0:
        raise ValueError(f"{name} must be a positive Python int, got {n!r}"
                         + ("; pass int(...) of it." if isinstance(n, jax.Array) else "."))
    return int(n)  # numpy integers -> static ints


def _vector(name: str, x, ndim_expected: Optional[int]) -> Array:
    x = jnp.asarray(x)
    if x.ndim != 1:
        raise ValueError(
            f"{name} must be a 1-D array of generalised coordinates, got shape {x.shape}; "
            f"for an ensemble, jax.vmap over simulate instead of stacking initial conditions."
        )
    if x.dtype not in _WORKING_DTYPES:
        raise TypeError(
            f"{name} has dtype {x.dtype}; pass floating-point values (float32 or float64), "
            f"e.g. jnp.asarray({name}, dtype=jnp.float64) (with jax_enable_x64) or float32."
        )
    if ndim_expected is not None and x.shape[0] != ndim_expected:
        raise ValueError(f"{name} has {x.shape[0]} component{'s' if x.shape[0] != 1 else ''} "
                         f"but the system has ndim = {ndim_expected}; pass {name} of length "
                         f"{ndim_expected}.")
    return x


def _check_shapes(q0, v0, p0, dim=None):
    """The one of ``v0``/``p0`` that is given, as a vector shaped like ``q0`` (of length
    ``dim``, the algebra dimension, for a group element ``q0``)."""
    if (v0 is None) == (p0 is None):
        raise ValueError("Give exactly one of v0 (velocities) or p0 (momenta); "
                         + ("both were given." if v0 is not None else "neither was given."))
    name, x = ("v0", v0) if v0 is not None else ("p0", p0)
    x = _vector(name, x, None)
    if dim is not None:
        if x.shape != (dim,):
            raise ValueError(f"{name} has shape {x.shape} but the group's Lie algebra has "
                             f"dimension {dim}: pass the body velocity (or momentum) as a "
                             f"vector of length {dim}.")
        return x.astype(_dtype_of(q0))
    if x.shape != q0.shape:
        raise ValueError(f"{name} has shape {x.shape} but q0 has shape {q0.shape}.")
    return x.astype(q0.dtype)


def _dtype_of(q0):
    """The working dtype: that of ``q0`` (of its first array for a group element)."""
    return jnp.asarray(jax.tree_util.tree_leaves(q0)[0]).dtype


def _group_element(system, q0):
    """``q0`` of a :class:`vijax.LieGroupSystem` as arrays, with its shape checked against the
    group's elements."""
    q0 = jax.tree_util.tree_map(jnp.asarray, q0)
    group = system.group
    try:
        group.check_shape(q0)
    except ValueError as err:
        raise ValueError(f"q0 must be an element of {type(group).__name__} for "
                         f"{type(system).__name__}: {err}.") from None
    for x in jax.tree_util.tree_leaves(q0):
        if x.dtype not in _WORKING_DTYPES:
            raise TypeError(f"q0 has dtype {x.dtype}; pass floating-point values (float32 or "
                            f"float64).")
    return q0


# The dtypes a run computes in: LAPACK (the larger solves, the SVDs of the checks) has no
# half-precision kernels, and half precision cannot resolve a step's stage equations anyway.
_WORKING_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _real_scalar(name: str, x, dtype):
    """``x`` as a scalar of the working ``dtype``, refusing complex and boolean values (a cast
    would drop the imaginary part, or read ``True`` as 1)."""
    raw = jnp.asarray(x)
    if not (jnp.issubdtype(raw.dtype, jnp.floating) or jnp.issubdtype(raw.dtype, jnp.integer)):
        raise TypeError(f"{name} has dtype {raw.dtype}; pass a real number.")
    x = raw.astype(dtype)
    if x.ndim != 0:
        raise ValueError(f"{name} must be a scalar, got shape {x.shape}.")
    return x


# -- checks on values: raised at once on concrete values, in the graph on traced ones ----------

def _parameter_checks(system):
    """``(bad, message, eager message)`` for every floating-point parameter of the system:
    a non-finite value is named by its field."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(system)[0]:
        if isinstance(leaf, float) or (
                isinstance(leaf, (jax.Array, np.ndarray, np.generic))
                and jnp.issubdtype(leaf.dtype, jnp.inexact)):
            field = f"{type(system).__name__}{jax.tree_util.keystr(path)}"
            fix = (f"every floating-point parameter of the system must be a finite number; "
                   f"pass a finite value for {field}.")
            out.append((_nonfinite(leaf), f"{field} is not finite: {fix}",
                        lambda f=field, x=leaf, fix=fix: (
                            f"{f} is not finite ({_where_nonfinite(x)}): {fix}")))
    # static fields (eqx.field(static=True)) are not leaves: a Python float there is checked
    # here, at trace time
    for name, value in _static_floats(system):
        if not np.isfinite(value):
            field = f"{type(system).__name__}.{name}"
            raise ValueError(f"{field} is not finite ({value}): every floating-point parameter "
                             f"of the system must be a finite number; pass a finite value for "
                             f"{field}.")
    return out


def _static_floats(module, prefix=""):
    """``(dotted name, value)`` of the Python floats in the static fields of an equinox
    module and of the modules among its fields."""
    if not isinstance(module, eqx.Module):
        return
    for f in dataclasses.fields(module):
        value = getattr(module, f.name, None)
        if f.metadata.get("static", False) and isinstance(value, float):
            yield prefix + f.name, value
        elif isinstance(value, eqx.Module):
            yield from _static_floats(value, f"{prefix}{f.name}.")


def _finite(name: str, x, what: str):
    """``(bad, message, eager message)`` refusing non-finite entries of ``x``."""
    return (_nonfinite(x), f"{name} contains non-finite values (nan or inf); pass finite {what}.",
            lambda: f"{name} contains non-finite values: {np.asarray(x)}; pass finite {what}.")


def _singular_messages(system, n: int) -> list[str]:
    """The singular-Hessian messages: ``[general, k = 1 .. n-1 trailing coordinates without
    inertia]`` (the latter only when the system does not declare ``ndim``: a too long ``q0``)."""
    name = type(system).__name__
    head = f"The velocity Hessian d2L/dv2 of {name} is singular at the initial state"
    general = (f"{head}: the Lagrangian is degenerate there, so the Legendre map cannot be "
               f"inverted and the variational stage equations have no unique solution. Check "
               f"the kinetic energy (every coordinate needs inertia) or choose an initial state "
               f"away from the singular configuration.")
    out = [general]
    for k in range(1, n):
        out.append(f"{head}: coordinates {list(range(n - k, n))} of q0 (length {n}) do not "
                   f"enter the kinetic energy: if the system has {n - k} "
                   f"coordinate{'s' if n - k > 1 else ''} pass q0 of length {n - k} (declare "
                   f"`ndim` on the system to have it checked); otherwise the Lagrangian is "
                   f"degenerate: every coordinate needs inertia.")
    return out


def _regular(system, q0, v0):
    """``(bad, messages, eager message, index)`` refusing a Lagrangian whose velocity Hessian
    is singular at ``(q0, v0)``, naming the coordinates that carry no inertia (a ``q0`` longer
    than the system's coordinates shows up as trailing coordinates that do not enter the
    Lagrangian; a shorter one cannot be seen: JAX clamps out-of-range indices)."""
    params, static = eqx.partition(system, eqx.is_inexact_array)
    frozen = eqx.combine(jax.lax.stop_gradient(params), static)
    hess = frozen.velocity_hessian(jax.lax.stop_gradient(q0), jax.lax.stop_gradient(v0))
    n = v0.shape[0]
    messages = _singular_messages(system, n)
    # the same expressions on NumPy values (eager) or traced ones (in the graph)
    xp = jnp if _is_traced(hess) else np
    hess = xp.asarray(hess)
    finite = xp.all(xp.isfinite(hess))
    sv = xp.linalg.svd(xp.where(finite, hess, 0), compute_uv=False)
    bad = ~(finite & (sv[-1] > 1e3 * xp.finfo(hess.dtype).eps * sv[0]))
    zero = xp.all(hess == 0, axis=0) & xp.all(hess == 0, axis=1)
    trailing = xp.sum(xp.cumprod(zero[::-1].astype(xp.int32)))
    index = xp.where((xp.sum(zero) == trailing) & (trailing < n) & (system.ndim is None),
                     trailing, 0)

    def eager():
        if int(index):
            return messages[int(index)]
        cols = [int(i) for i in np.flatnonzero(zero)]
        if cols:
            return (f"The velocity Hessian d2L/dv2 of {type(system).__name__} is singular at the "
                    f"initial state: coordinates {cols} of q0 (length {n}) do not enter the "
                    f"kinetic energy, so the Lagrangian is degenerate, the Legendre map cannot "
                    f"be inverted and the variational stage equations have no unique solution. "
                    f"Check the kinetic energy (every coordinate needs inertia).")
        cond = np.inf if not finite or sv[-1] == 0 else sv[0] / sv[-1]
        return messages[0].replace("initial state:",
                                   f"initial state (condition number {cond:.3g}):", 1)

    return bad, messages, eager, index


# XLA:CPU runs a loop whose buffers are small (about 1 kB) as one compiled kernel; a loop that
# also writes into the saved arrays runs op by op, each op a separate call (tens of ns each,
# more than the arithmetic of a small step).  So the steps between saves run in an inner loop
# carrying only the state, and the saves are gathered in chunks small enough to stay in the
# kernel, written to the saved arrays once per chunk.
_CHUNK_BYTES = 1536


def _nbytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
               for x in jax.tree_util.tree_leaves(tree))


def _chunk(n_saves: int, record_bytes: int) -> int:
    """Saves per chunk: the largest divisor of ``n_saves`` whose records fit the budget."""
    most = max(1, min(n_saves, _CHUNK_BYTES // max(record_bytes, 1)))
    return next(c for c in range(most, 0, -1) if n_saves % c == 0)


#: Saves (each at least sqrt(N) steps long) that the checkpointed layout keeps as one chunk.
_FEW_SAVES = 16


def _divisor_near_sqrt(n: int) -> int:
    """The divisor of ``n`` nearest to ``sqrt(n)`` (from below)."""
    return _divisor_below(n, math.isqrt(n))


def _divisor_below(n: int, m: int) -> int:
    """The largest divisor of ``n`` at most ``m`` (at least 1)."""
    return next(d for d in range(max(1, min(m, n)), 0, -1) if n % d == 0)


def _loops(body, carry, length: int, per_loop: int):
    """``lax.scan(body, carry, None, length)`` as loops of ``per_loop`` iterations inside a
    loop (``per_loop`` divides ``length``): the inner loops' stored values stay small."""
    if per_loop in (1, length):
        return jax.lax.scan(body, carry, None, length=length)

    def loop(carry, _):
        return jax.lax.scan(body, carry, None, length=per_loop)

    carry, recs = jax.lax.scan(loop, carry, None, length=length // per_loop)
    return carry, jax.tree_util.tree_map(lambda x: x.reshape((length,) + x.shape[2:]), recs)


#: jax.checkpoint for the layouts here, each of which wraps the body of a lax.scan: there the
#: common-subexpression elimination that prevent_cse guards against cannot reach across
#: iterations, so it is off (its barriers cost kernels in the backward loop: Kepler 28 -> 24
#: per step, gradient 0.95x with store_all and 0.80x checkpointed, double pendulum
#: checkpointed 0.95x; memory and stored bytes unchanged; alternating process pairs, N = 1e4
#: and 1e5).
_checkpoint = functools.partial(jax.checkpoint, prevent_cse=False)


def _scan(body, carry, length: int, checkpointed: bool, step_bytes: int = 0):
    """``lax.scan(body, carry, None, length)``; checkpointed: as two nested scans whose outer
    body is :func:`jax.checkpoint`-ed (reverse mode stores the carry at the ``length / inner``
    segment boundaries and, while it runs back through one segment, that segment's ``inner``
    steps).  ``step_bytes`` > 0 (a rematerialised ``body`` storing that much per step): the
    steps, and each segment's steps, run in inner loops of at most ``_CHUNK_BYTES`` of
    stored values (see ``_saves_impl``)."""
    per_loop = lambda n: _chunk(n, step_bytes) if step_bytes else 1  # noqa: E731
    inner = _divisor_near_sqrt(length) if checkpointed else length
    if inner in (1, length):
        if checkpointed and length > 1 and not step_bytes:
            body = _checkpoint(body)
        return _loops(body, carry, length, per_loop(length))

    @_checkpoint
    def segment(carry, _):
        return _loops(body, carry, inner, per_loop(inner))

    carry, recs = jax.lax.scan(segment, carry, None, length=length // inner)
    return carry, jax.tree_util.tree_map(lambda x: x.reshape((length,) + x.shape[2:]), recs)


# A block's statistics while its steps run: one int32 vector -- the iterations, the largest
# count, and ``lead``: the steps converged so far while none has failed, else ``-m - 2`` for
# a first failure at the block's step ``m`` -- and the largest residual.  Each updated in one
# kernel: the five scalars of StepStats were five kernels a step on XLA:CPU, 5 of the 30 of
# a Kepler step whose Solution is returned whole, and the failure's global index needed the
# step counter in the loop even where nothing read the statistics but the convergence flag
# (measured in kernels per step, Kepler / double pendulum, VPRK.gauss(2): Solution returned
# 30 -> 25 / 50 -> 45, positions only 23 / 43 unchanged).
_TOTAL, _MOST, _LEAD = range(3)


def _block_start(dtype):
    return jnp.zeros(3, jnp.int32), jnp.zeros((), dtype)


def _counted(block, st):
    """``block`` after one more step whose solve reported ``st``."""
    counts, residual = block
    it = st.iterations.astype(jnp.int32)
    lane = jnp.arange(3)
    lead = jnp.where((counts < 0) | st.converged, counts + (counts >= 0).astype(jnp.int32),
                     -counts - 2)
    counts = jnp.where(lane == _TOTAL, counts + it,
                       jnp.where(lane == _MOST, jnp.maximum(counts, it), lead))
    return counts, jnp.maximum(residual, st.residual)


def _block_stats(block, first) -> StepStats:
    """The statistics of the block of steps ``first, first + 1, ...``."""
    counts, residual = block
    lead = counts[..., _LEAD]
    return StepStats(iterations=counts[..., _TOTAL], max_iterations=counts[..., _MOST],
                     residual=residual, converged=lead >= 0,
                     failed_step=jnp.where(lead >= 0, -1, first - lead - 2))


def _advance(integrator, system, state, dt, u):
    """One step, with the step's controls ``u`` when there are any."""
    if u is None:
        return integrator.step(system, state, dt)
    return integrator.step(system, state, dt, u)


def _saves(integrator, system, state0, dt, U, n_saves: int, save_every: int, dense: bool,
           checkpointed: bool):
    """The run from ``state0``: per save, the state, its block's statistics and (dense) the
    steps' polynomials, each with a leading axis of ``n_saves``."""
    return _differentiable_saves((system, state0, dt, U), integrator=integrator,
                                 n_saves=n_saves, save_every=save_every, dense=dense,
                                 checkpointed=checkpointed)


# The backends (:func:`jax.default_backend`) where the derivative re-runs each step
# (``remat`` in ``_saves_impl``).  Measured on an NVIDIA H200 (4096 double
# pendulums, VPRK.gauss(2), 1000 steps, `jax.grad` of the ensemble's loss): re-running each
# step made the gradient 1.28x slower with store_all (291 against 227 ms) and 1.11x with
# checkpointed: a GPU runs the stored linearisations' loop as kernels anyway, and the
# re-run stage solve waits on its loop predicate.  On CPU it is 2-4x faster (see there).
# (Measured before the re-run kept the stage root: it no longer solves, so a GPU may now
# gain from it too; to be measured on a device before the gate changes.)
_REMAT_BACKENDS = frozenset({"cpu"})


@eqx.filter_custom_jvp
def _differentiable_saves(diff, *, integrator, n_saves, save_every, dense, checkpointed):
    """:func:`_saves_impl`: the plain loop when nothing is differentiated; its derivatives
    (forward and reverse mode, and Hessians as forward over reverse) are those of the
    rematerialised layout, whose reverse pass stores one state per step (``store_all``) or
    per segment boundary and segment step (``checkpointed``); see ``remat`` there."""
    system, state0, dt, U = diff
    return _saves_impl(integrator, system, state0, dt, U, n_saves, save_every, dense, False,
                       False)


@_differentiable_saves.def_jvp
def _differentiable_saves_jvp(primals, tangents, *, integrator, n_saves, save_every, dense,
                              checkpointed):
    (diff,), (t_diff,) = primals, tangents
    none = lambda x: x is None  # noqa: E731  (a None, e.g. no controls, stays a leaf)
    leaves, tree = jax.tree_util.tree_flatten(diff, is_leaf=none)
    t_leaves = jax.tree_util.tree_leaves(t_diff, is_leaf=none)
    assert len(t_leaves) == len(leaves)
    moving = [i for i, t in enumerate(t_leaves) if t is not None]

    def run(*xs):
        new = list(leaves)
        for i, x in zip(moving, xs):
            new[i] = x
        system, state0, dt, U = jax.tree_util.tree_unflatten(tree, new)
        return _saves_impl(integrator, system, state0, dt, U, n_saves, save_every, dense,
                           checkpointed, jax.default_backend() in _REMAT_BACKENDS)

    return jax.jvp(run, [leaves[i] for i in moving], [t_leaves[i] for i in moving])


def _reads_clock(system) -> bool:
    return isinstance(system, (TimeDependentSystem, ForcedSystem))


def _clock_at(t0, dt, k):
    """``t_k = t0 + k dt``."""
    return t0 + dt * k.astype(dt.dtype)


def _on_clock(system, state, t0, dt, k):
    """``state`` with its clock set to ``t_k = t0 + k dt`` (``k`` the steps taken) for a
    system that reads the clock (a :class:`TimeDependentSystem`, a :class:`ForcedSystem`):
    the clock of every step is then within an ulp of its time on the saved grid, instead of
    a sum of ``k`` increments ``t + dt`` whose round-off accumulates (Stormer--Verlet,
    dt = 0.01 from t0 = 0.3: 1.4e-11 off after 1e4 steps, 1.7e-7 after 1e6; 1 ulp with the
    clock set), which a time-dependent Lagrangian, a force or a rheonomic constraint reads.
    Other systems keep the sum: setting the clock costs two kernels per step on XLA:CPU
    (Kepler's step 23 -> 25), and nothing of theirs reads it."""
    if not _reads_clock(system):
        return state
    return eqx.tree_at(lambda s: s.t, state, _clock_at(t0, dt, k))


def _clock_step(system, t0, dt, k):
    """The step ``k`` takes: ``dt``, or for a system that reads the clock ``t_{k+1} - t_k``,
    which differs from ``dt`` by at most an ulp of ``t`` and is exact in floating point
    (Sterbenz's lemma, ``t_k >= t_{k+1} / 2``), so that the step ends on the clock the next
    one starts from, ``t_k + (t_{k+1} - t_k) = t_{k+1}``.  A step that ended at ``t_k + dt``
    instead left its successor's clock an ulp away: DGVI, which keeps a rheonomic
    constraint's gap from node to node, gathered 8.8e-14 of it over 300 steps on the
    spinning hoop (3.5e-15 with the methods that impose the constraint at every node)."""
    if not _reads_clock(system):
        return dt
    return _clock_at(t0, dt, k + 1) - _clock_at(t0, dt, k)


def _saves_impl(integrator, system, state0, dt, U, n_saves: int, save_every: int,
                dense: bool, checkpointed: bool, remat: bool):
    zero = _block_start(state0.p.dtype)

    def advance(k, state):
        h = _clock_step(system, state0.t, dt, k)
        new, st = _advance(integrator, system, state, h, None if U is None else U[k])
        return _on_clock(system, new, state0.t, dt, k + 1), st

    # ``remat`` (the layout store_all differentiates): each step is rematerialised, so what a
    # step stores for the backward pass is its input state (and control), not its
    # linearisation (the stage solve's Jacobian, elimination factors, the residual's
    # intermediates: 4-8 times the state), and the steps run in inner loops of ``per_loop``
    # steps whose stored states fit the budget of a loop XLA:CPU compiles into one kernel (a
    # backward loop over a trajectory's stacked linearisations runs op by op).  The
    # backward pass re-runs each step, then differentiates it.  Measured on Kepler and the
    # double pendulum (VPRK.gauss(2), 1e4 steps): gradient 3.1 instead of 10.2 us/step and
    # 7.3 instead of 20 us/step, 5.5 and 3.3 times the forward run instead of 18 and 9.
    # Without derivatives the steps run in one loop: the nested loops cost 0.2 us/step more
    # on Kepler (0.54 -> 0.7-0.9 us).  CPU only (``_REMAT_BACKENDS``).
    #
    # What the backward pass reads of each stage solve (``STAGE_ROOT``: the root, and the
    # convergence flag) is stored with the state (on VPRK.gauss(2) 88 instead of 64 B per
    # step), so the re-run linearises the stage equations at the stored root and solves
    # nothing: gradient 7.4-7.5 -> 5.5-5.9 us/step on the double pendulum (4.9 fixed-point
    # updates a step saved), 3.6-3.8 -> 3.0-3.6 on Kepler (2.5), alternating runs.
    if remat:
        advance = _checkpoint(
            advance, policy=jax.checkpoint_policies.save_only_these_names(STAGE_ROOT))
    step_bytes = (_nbytes(state0) + (0 if U is None else _nbytes(U[0]))) if remat else 0

    # Statistics are reduced in the carry, not stacked per step: long runs store only what
    # is saved.
    def one_step(k, state, agg):
        prev = state
        state, st = advance(k, state)
        # dense output: the step's polynomials at their nodes and the new node values
        rec = ((integrator.dense_interval(system, prev, state,
                                          _clock_step(system, state0.t, dt, k)),
                integrator.dense_knots(system, state)) if dense else None)
        return state, _counted(agg, st), rec

    def save(state, j):
        """The ``save_every`` steps ending at save ``j``; returns the record saved."""
        # the step index rides in the carry: an index array as the scan's input would be a
        # buffer of the loop, and past about 1 kB XLA:CPU no longer runs it as one kernel
        def body(carry, _):
            k, state, agg = carry
            state, agg, rec = one_step(k, state, agg)
            return (k + 1, state, agg), rec

        first = (j * save_every).astype(jnp.int32)
        (_, state, agg), recs = _scan(body, (first, state, zero), save_every, segmented,
                                      step_bytes)
        return state, (state, _block_stats(agg, first), recs)

    # A saved record is a state and its block's statistics (dense output: one save per
    # chunk).  Checkpointed, every level of jax.checkpoint costs one more forward run in the
    # backward pass, so there is one level where it suffices for memory like sqrt(N), N the
    # steps: saves at most sqrt(N) steps apart are grouped into chunks of about sqrt(N)
    # steps, each chunk a checkpoint (when there are several); saves further apart run their
    # steps in checkpointed segments of about sqrt(save_every) steps, and up to
    # _FEW_SAVES of them are one chunk (memory within sqrt(_FEW_SAVES) of sqrt(N)), more are
    # chunks of about sqrt(n_saves) saves, each a checkpoint (two levels).
    segmented = checkpointed and save_every > math.isqrt(n_saves * save_every)
    if dense or not checkpointed:
        per_chunk = 1 if dense else _chunk(n_saves, _nbytes((state0, zero)))
    elif segmented:
        per_chunk = n_saves if n_saves <= _FEW_SAVES else _divisor_near_sqrt(n_saves)
    else:
        per_chunk = _divisor_below(n_saves, math.isqrt(n_saves * save_every) // save_every)

    def chunk(state, i):
        return jax.lax.scan(save, state, i * per_chunk + jnp.arange(per_chunk))

    if checkpointed and n_saves > per_chunk:
        chunk = _checkpoint(chunk)

    _, recs = jax.lax.scan(chunk, state0, jnp.arange(n_saves // per_chunk))
    return jax.tree_util.tree_map(lambda x: x.reshape((n_saves,) + x.shape[2:]), recs)


def _reverse_nodes(u):
    """Per-node controls in the order of the step taken backwards (symmetric nodes)."""
    return u if u is None or u.ndim == 1 else u[::-1]


@eqx.filter_custom_vjp
def _reversible_saves(diff, integrator, n_saves: int, save_every: int):
    """:func:`_saves` whose reverse mode keeps only the saved states: the backward pass
    rebuilds each state between two saves by stepping back with ``-dt`` (a symmetric
    method's inverse) from the later one and differentiates that step there."""
    system, state0, dt, U = diff
    # the plain loop: this function's own derivative is the custom VJP below
    states, stats, _ = _saves_impl(integrator, system, state0, dt, U, n_saves, save_every,
                                   False, False, False)
    return states, stats


@_reversible_saves.def_fwd
def _reversible_fwd(perturbed, diff, integrator, n_saves, save_every):
    out = _reversible_saves.fn(diff, integrator, n_saves, save_every)
    # the saved states (outputs anyway) and their blocks' convergence
    return out, (out[0], out[1].converged)


@_reversible_saves.def_bwd
def _reversible_bwd(res, grad_obj, perturbed, diff, integrator, n_saves, save_every):
    system, state0, dt, U = diff
    saved, converged = res
    states_ct = grad_obj[0]
    # cotangents of the saved states (zero where a field was not differentiated)
    like = jax.tree_util.tree_leaves(saved)
    given = jax.tree_util.tree_leaves(states_ct, is_leaf=lambda x: x is None)
    cts = [jnp.zeros(x.shape, x.dtype) if c is None else c for x, c in zip(like, given)]
    states_ct = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(saved), cts)
    dyn, static = eqx.partition(system, eqx.is_inexact_array)
    # Each block of steps between two saves is rebuilt backwards from the later save's state,
    # as the forward run saved it: exact there, whatever round-off the blocks after it
    # gathered.  Its last step is retraced back (that state carries the step's stage values,
    # whose reverse is the root of the step back), the others are taken back with -dt (the
    # integrator's own predictor, extrapolating the steps taken back before them); each step
    # is then retraced forwards to be linearised, its solve started at the root the step back
    # found (the Kepler problem's VPRK.gauss(2): 3.0 updates -> none, the root taken as
    # found; the double pendulum's 5.7 -> none).
    retraced = integrator.retracing()

    def forward(dyn, dt, u, state):
        return _advance(retraced, eqx.combine(dyn, static), state, dt, u)[0]

    def back(step_back, carry, k):
        state, ok, ct, g_dyn, g_dt, g_U = carry
        u = None if U is None else U[k]
        # the step the forward run took, back and forth (see _clock_step)
        step = lambda h: _clock_step(system, state0.t, h, k)  # noqa: E731
        prev, st = _advance(step_back, system, state, -step(dt), _reverse_nodes(u))
        prev = _on_clock(system, prev, state0.t, dt, k)   # the clock of the forward run
        if u is None:
            _, vjp = jax.vjp(lambda d, h, x: forward(d, step(h), None, x), dyn, dt, prev)
            d_dyn, d_dt, ct = vjp(ct)
        else:
            _, vjp = jax.vjp(lambda d, h, w, x: forward(d, step(h), w, x), dyn, dt, u, prev)
            d_dyn, d_dt, d_u, ct = vjp(ct)
            g_U = g_U.at[k].add(d_u)
        add = lambda a, b: jax.tree_util.tree_map(jnp.add, a, b)  # noqa: E731
        return (prev, ok & st.converged, ct, add(g_dyn, d_dyn), g_dt + d_dt, g_U), None

    def block(carry, j):
        ct, *grads = carry
        state = jax.tree_util.tree_map(lambda x: x[j], saved)
        ct = jax.tree_util.tree_map(lambda a, b: a + b[j], ct, states_ct)
        ks = j * save_every + jnp.arange(save_every - 1, -1, -1)
        carry, _ = back(retraced, (state, converged[j], ct, *grads), ks[0])
        if save_every > 1:
            carry, _ = jax.lax.scan(functools.partial(back, integrator), carry, ks[1:])
        # a block whose steps, forwards or back, did not all converge: a NaN gradient, never
        # a number (the retraced steps take their roots as found)
        _, ok, *out = carry
        fail = jnp.where(ok, 1.0, jnp.nan)
        return jax.tree_util.tree_map(lambda x: x * fail.astype(x.dtype), tuple(out)), None

    zeros = lambda t: jax.tree_util.tree_map(jnp.zeros_like, t)  # noqa: E731
    start = (zeros(jax.tree_util.tree_map(lambda x: x[-1], saved)), zeros(dyn),
             jnp.zeros_like(dt), None if U is None else jnp.zeros_like(U))
    (ct0, g_dyn, g_dt, g_U), _ = jax.lax.scan(block, start, jnp.arange(n_saves - 1, -1, -1))
    return g_dyn, ct0, g_dt, g_U


def _run_impl(system, integrator, q0, v0, t0, dt, U, n_saves: int, save_every: int,
              dense: bool, adjoint: str = "store_all"):
    state0 = integrator.init(system, t0, q0, v0)
    if adjoint == "reversible":
        states, stats = _reversible_saves((system, state0, dt, U), integrator, n_saves,
                                          save_every)
        # the statistics are not differentiable (a custom_vjp output would carry tangents)
        stats, recs = jax.tree_util.tree_map(jax.lax.stop_gradient, stats), None
    else:
        states, stats, recs = _saves(integrator, system, state0, dt, U, n_saves, save_every,
                                     dense, adjoint == "checkpointed")
    states = jax.tree_util.tree_map(
        lambda a, b: jnp.concatenate([a[None], b]), state0, states)
    v = jax.vmap(lambda s: integrator.velocity(system, s))(states)
    t = t0 + dt * (jnp.arange(n_saves + 1, dtype=t0.dtype) * save_every)   # (as _on_clock)
    interp = None
    if dense:
        flat = lambda x: x.reshape((n_saves * save_every,) + x.shape[2:])  # noqa: E731
        values, knots = jax.tree_util.tree_map(flat, recs)
        knots = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a[None], b]),
                                       integrator.dense_knots(system, state0), knots)
        ts = t0 + dt * jnp.arange(n_saves * save_every + 1, dtype=t0.dtype)
        interp = DenseInterpolation.build(integrator.dense_layout(system), ts, values, knots)
    return Solution(t=t, q=states.q, v=v, p=states.p, stats=stats, states=states,
                    n_steps=n_saves * save_every, interpolation=interp)


_run = eqx.filter_jit(_run_impl)


# Compiled runs for direct calls: one jax.jit per static configuration (the tree structure and
# non-array parts of system and integrator, and the counts), called on the flat array leaves.
# equinox.filter_jit splits its arguments into arrays and the rest on every call, which for
# a system and an integrator costs about 0.2 ms; here that split is made once per checked
# input (see _CHECKED) and a repeated call goes straight to jax.jit's dispatch.
_JITS: dict = {}
_JITS_SIZE = 4096  # like jax.jit's own cache: a suite or a sweep reuses configurations


def _compiled(treedef, static, counts):
    key = (treedef, static, counts)
    fn = _JITS.pop(key, None)
    if fn is None:
        # the non-array part of the output, recorded when tracing (None: arrays only)
        out_static = [None]

        def run(*leaves):
            args = eqx.combine(jax.tree_util.tree_unflatten(treedef, leaves), static)
            out, rest = eqx.partition(_run_impl(*args, *counts), eqx.is_array)
            out_static[0] = rest if jax.tree_util.tree_leaves(rest) else None
            return out

        jitted = jax.jit(run, compiler_options=dict(_xla.active()) or None)

        def fn(*leaves):
            out = jitted(*leaves)
            return out if out_static[0] is None else eqx.combine(out, out_static[0])

        if len(_JITS) >= _JITS_SIZE:
            _JITS.pop(next(iter(_JITS)))
    _JITS[key] = fn
    return fn


class _Checked:
    """A checked input (what :func:`_check_values` returned) and, per ``(n_saves,
    save_every, dense)``, its compiled run with the argument leaves it is called on."""

    def __init__(self, values):
        self.values = values
        self.runs = {}

    def runner(self, integrator, counts):
        run = self.runs.get(counts)
        if run is None:
            system, q0, v0, dt, t0, U = self.values
            args = (system, integrator, q0, v0, t0, dt, U)
            dyn, static = eqx.partition(args, eqx.is_array)
            leaves, treedef = jax.tree_util.tree_flatten(dyn)
            try:
                fn = _compiled(treedef, static, counts)
            except (TypeError, ValueError):  # a non-array part that cannot be hashed: no fast path
                fn = None
            run = self.runs[counts] = (
                (lambda: _run(*args, *counts)) if fn is None else (lambda: fn(*leaves)))
        return run


def simulate(
    system: LagrangianSystem,
    integrator: AbstractIntegrator,
    *,
    q0: VectorLike,
    v0: Optional[VectorLike] = None,
    p0: Optional[VectorLike] = None,
    dt: ScalarLike,
    n_steps: int,
    save_every: int = 1,
    dense: bool = False,
    t0: ScalarLike = 0.0,
    throw: bool = True,
    project: bool = False,
    controls=None,
    adjoint: str = "store_all",
) -> Solution:
    """Integrate ``system`` with ``integrator`` for ``n_steps`` steps of size ``dt``.

    ``controls`` feeds the control input ``u`` of a :class:`vijax.ForcedSystem` that declares
    ``control_dim = c > 0``: an array of shape ``(n_steps, c)`` (one control per step, held
    over it), ``(n_steps, k, c)`` (one per force node: ``k = len(integrator.force_nodes())``,
    the stage or quadrature nodes at which the method evaluates the force; needed for the
    full order of high-order methods in optimal control), or a callable ``u(t) -> (c,)``
    (sampled at the force nodes).  Derivatives flow to the controls.

    ``adjoint`` chooses what reverse mode (:func:`jax.grad`) keeps of the forward run:
    ``"store_all"`` (default) every step (on CPU its input state and its stage solve's
    root, the step being re-run from them without a second solve and differentiated in
    the backward pass; on other backends its linearisation);
    ``"checkpointed"`` only states at the boundaries of segments of about ``sqrt`` of the
    step count, recomputing each segment's steps during the backward pass: memory grows like
    the square root of the step count (plus the saved states themselves) for about one more
    forward pass (two with more than 16 saves over ``sqrt`` of the step count apart);
    ``"reversible"`` (symmetric methods, reverse mode only) the saved states, rebuilding the
    others by stepping back from the next save (round-off grows over ``save_every`` steps at
    most).  All give the same derivatives (to round-off).

    With ``dense=True`` (collocation and Galerkin methods) the solution also carries the
    polynomials of every step, whatever ``save_every``: ``sol.evaluate(t)`` gives ``q``,
    ``p`` (and ``v``, ``pg`` where defined) at any time.

    Give the initial velocity ``v0`` or the initial momentum ``p0`` (exactly one).  States
    are saved every ``save_every`` steps (``n_steps`` must be a multiple); only saved states
    are stored.  ``n_steps`` and ``save_every`` fix array shapes, so they are static Python
    ints (under :func:`jax.jit` mark them static, or use :func:`equinox.filter_jit`).  Works
    under :func:`jax.jit`, :func:`jax.vmap` (ensembles) and :func:`jax.grad` (with respect to
    the initial state, ``dt`` and every system parameter).  The working dtype is that of
    ``q0``; float64 input met with JAX's 64-bit mode off warns (:class:`PrecisionWarning`).

    Bad input raises an error that names the fix, under ``jit`` as well: shapes, dtypes and
    types at trace time, values (``dt``, non-finite ``q0``/``v0``/``p0`` or parameters, a
    singular velocity Hessian) through :func:`equinox.error_if` in the compiled graph.

    A stage solve that does not converge raises (``throw=True``, the default): outside ``jit``
    a :class:`~vijax.solvers.ConvergenceError` naming the step, time and residual; inside
    ``jit`` (and under ``vmap``, where one failed lane fails the call) an
    :func:`equinox.error_if` runtime error.  With ``throw=False`` the run returns whatever the
    solver produced and records the failure in ``Solution.stats`` (``converged``,
    ``failed_step``, ``first_failure``), to inspect each lane of an ensemble; a derivative
    through a failed solve is then NaN.

    The integrator decides which systems it accepts (:meth:`AbstractIntegrator.check_system`)
    and which initial data are consistent (:meth:`AbstractIntegrator.check_initial`, also in
    the graph under ``jit``); for holonomically constrained systems ``(q0, v0)`` must lie on
    ``g(q) = 0`` and its hidden constraint ``G(q) v = 0``.  ``project=True`` projects them
    first (:meth:`LagrangianSystem.project_configuration`,
    :meth:`~LagrangianSystem.project_velocity`).

    Called directly on concrete values, the value checks (and the projection, or the
    momentum-to-velocity map, they come with) run eagerly once per distinct input and are then
    cached: a repeated call with the same system parameters and initial data goes straight to
    the compiled run, so its cost is that of a ``jit``-compiled call.
    """
    _warn_precision(q0=q0, v0=v0, p0=p0, dt=dt)
    counts = _static_checks(system, integrator, n_steps, save_every, dense, adjoint)
    controls = _controls(system, integrator, controls, counts[0], q0, t0, dt)
    values = dict(q0=q0, v0=v0, p0=p0, dt=dt, t0=t0, project=project, controls=controls)
    # one flattening serves the test for traced inputs and the cache key
    leaves, treedef = jax.tree_util.tree_flatten((system, integrator, values))
    if _xla.traced() or any(_is_traced(x) for x in leaves):
        return _finish(integrator, *_check_values(system, integrator, **values), *counts,
                       throw=throw)
    key = _checked_key(leaves, treedef)
    checked = None if key is None else _CHECKED.pop(key, None)
    if checked is None:
        checked = _Checked(_check_values(system, integrator, **values))
        if key is not None and len(_CHECKED) >= _CHECKED_SIZE:
            _CHECKED.pop(next(iter(_CHECKED)))  # the least recently used
    if key is not None:
        _CHECKED[key] = checked  # (re)inserted last: most recently used
    return _finish(integrator, *checked.values, *counts, throw=throw,
                   run=checked.runner(integrator, (counts[0] // counts[1],) + counts[1:]))


# Inputs whose value checks passed, with what the checks returned (the system with array
# parameters and the projected or momentum-derived initial state), least recently used first.
_CHECKED: dict = {}
_CHECKED_SIZE = 256


def _leaf_key(x):
    if isinstance(x, (bool, int, float, complex, str, type(None))):
        return (type(x).__name__, x)
    x = np.asarray(x)
    return (x.shape, x.dtype.str, x.tobytes())


def _checked_key(leaves, treedef):
    """A hashable key of everything the value checks read (the leaves of system, integrator
    -- its check_initial may read its configuration -- and the values), or ``None`` (not
    cached)."""
    try:
        key = (treedef, tuple(_leaf_key(x) for x in leaves))
        hash(key)
        return key
    except (TypeError, ValueError):
        return None


def _raise_if_failed(sol: Solution, integrator: AbstractIntegrator, t0, dt,
                     save_every: int, members: bool = False) -> None:
    """:class:`ConvergenceError` naming the first failed step of a run (``members``: of an
    ensemble's first failed member, with the count of failed members)."""
    ok = np.asarray(sol.stats.converged)
    if bool(np.all(ok)):
        return
    stats, which, whose = sol.stats, "", "the trajectory is"
    if members:
        failed = np.flatnonzero(~ok.reshape(ok.shape[0], -1).all(axis=1))
        m = int(failed[0])
        stats = jax.tree_util.tree_map(lambda x: x[m], stats)
        which = f" in {failed.size} of {ok.shape[0]} members (the first, member {m},"
        whose = "their trajectories are"
    k = int(stats.first_failure)
    residual = float(np.asarray(stats.residual)[k // save_every])
    where = (f"{which} at step {k}, t = {float(t0) + k * float(dt):.6g}; residual "
             f"{residual:.3g})" if members else
             f" at step {k} (t = {float(t0) + k * float(dt):.6g}; residual {residual:.3g})")
    raise ConvergenceError(
        f"The stage equations of {integrator.name} did not converge{where}, so {whose} "
        f"wrong from that step on. Reduce dt, raise the solver's max_steps, or use "
        f"solver=vijax.solvers.Newton() for stiff problems; pass throw=False to get "
        f"the result anyway and inspect sol.stats (converged, failed_step"
        f"{', one row per member' if members else ''}).")


ADJOINTS = ("store_all", "checkpointed", "reversible")


def _static_checks(system, integrator, n_steps, save_every, dense, adjoint="store_all"
                   ) -> tuple[int, int, bool, str]:
    """Types and Python ints (raised at trace time under jit); ``(n_steps, save_every,
    dense, adjoint)`` as static Python values."""
    _check_compatible(system, integrator)
    n_steps = _static_count("n_steps", n_steps)
    save_every = _static_count("save_every", save_every)
    if n_steps % save_every:
        raise ValueError(f"n_steps = {n_steps} is not a multiple of save_every = {save_every}; "
                         f"choose n_steps = {(n_steps // save_every + 1) * save_every}, say.")
    if dense and not isinstance(integrator, AbstractDenseIntegrator):
        raise ValueError(f"{integrator.name} has no dense output; drop dense=True or use a "
                         f"collocation or Galerkin method (a vijax.AbstractDenseIntegrator).")
    if adjoint not in ADJOINTS:
        raise ValueError(f"adjoint must be one of {', '.join(map(repr, ADJOINTS))}, got "
                         f"{adjoint!r}.")
    if adjoint == "reversible":
        if not integrator.symmetric:
            allowed = sorted({call for call, m in registry() if m.symmetric})
            raise ValueError(
                f"adjoint='reversible' rebuilds the states by stepping backwards, which needs a "
                f"symmetric method (its step with -h inverts the step with h); "
                f"{integrator.name} is not one. Methods that allow it: {', '.join(allowed)}. "
                f"Or use adjoint='checkpointed'.")
        if dense:
            raise ValueError("adjoint='reversible' keeps no step's polynomials; drop "
                             "dense=True or use adjoint='checkpointed'.")
    return n_steps, save_every, bool(dense), adjoint


def _controls(system, integrator, controls, n_steps: int, q0, t0, dt):
    """The controls as an array ``(n_steps, c)`` or ``(n_steps, k, c)`` (a callable sampled at
    the force nodes), or ``None``; shapes checked against the system and the method."""
    c = system.control_dim if isinstance(system, ForcedSystem) else 0
    if controls is None and not c:
        return None  # (every direct call passes here: no work for runs without controls)
    name = type(system).__name__
    nodes = np.asarray(integrator.force_nodes())
    k = len(nodes)
    shapes = (f"an array of shape (n_steps, control_dim) = ({n_steps}, {c}) held over each "
              f"step, of shape (n_steps, force nodes, control_dim) = ({n_steps}, {k}, {c}) "
              f"with one control per force node of {integrator.name}, or a callable u(t) "
              f"returning shape ({c},)")
    if controls is None:
        if c:
            raise ValueError(f"{name} declares control_dim = {c}: pass controls=..., {shapes}.")
        return None
    if not c:
        raise ValueError(
            f"controls were given but {name} has no control input: declare control_dim > 0 on "
            f"a vijax.ForcedSystem whose force(t, q, v, u) reads u, or drop controls=.")
    if callable(controls):
        dtype = jnp.result_type(_dtype_of(q0), float)
        times = (jnp.asarray(t0, dtype) + jnp.asarray(dt, dtype)
                 * (jnp.arange(n_steps, dtype=dtype)[:, None] + jnp.asarray(nodes, dtype)[None, :]))
        U = jax.vmap(jax.vmap(controls))(times)
        if U.shape != (n_steps, k, c):
            raise ValueError(f"The control function returned shape {U.shape[2:]} at a time; it "
                             f"must return shape ({c},), the control_dim of {name}.")
        return U
    U = jnp.asarray(controls)
    if U.shape not in ((n_steps, c), (n_steps, k, c)):
        raise ValueError(
            f"controls has shape {U.shape}, which does not match n_steps = {n_steps}, the {k} "
            f"force nodes (stages) of {integrator.name} and control_dim = {c} of {name}; pass "
            f"{shapes}.")
    return U


def _warn_narrowing(dtype, stacklevel: int = 4, **inputs) -> None:
    """A :class:`PrecisionWarning` when float64 arrays are passed to a float32 run (the run
    follows ``q0``'s dtype): their values are rounded, silently otherwise."""
    if dtype != np.float32 or not jax.config.jax_enable_x64:  # without x64: _warn_precision
        return
    wide = [name for name, x in inputs.items()
            if isinstance(x, (np.ndarray, np.generic, jax.Array)) and x.dtype == np.float64]
    if wide:
        warnings.warn(
            f"{', '.join(wide)} {'is' if len(wide) == 1 else 'are'} float64 but q0 is float32, "
            f"and a run computes in q0's dtype: {'it is' if len(wide) == 1 else 'they are'} "
            f"rounded to float32. Pass q0 as float64 to compute in float64.",
            PrecisionWarning, stacklevel=stacklevel)


def _check_model_shapes(system, q0, x0, t0, lie: bool):
    """The shapes of what the user's model returns (:func:`jax.eval_shape`, nothing runs): the
    Lagrangian and the potential a real scalar, the mass matrix ``n x n``.  Otherwise the
    first derivative taken of them fails inside JAX ("Gradient only defined for
    scalar-output functions"), differently eagerly and under ``jit``."""
    name = type(system).__name__
    at_t0 = system.at(t0)

    def returned(method, *args):
        try:
            return jax.eval_shape(getattr(at_t0, method), *args)
        except Exception:  # noqa: BLE001 -- its own error surfaces where the run calls it
            return None

    def refuse(method, args, out, want, what):
        shape = getattr(out, "shape", None)
        real = shape is not None and jnp.issubdtype(out.dtype, jnp.floating)
        if out is not None and (shape != want or not real):
            got = (f"shape {shape} ({out.dtype})" if shape is not None
                   else type(out).__name__)
            raise ValueError(f"{name}.{method}({args}) returned {got}; it must return {what}.")

    if isinstance(system, MechanicalSystem) and not lie:
        n = q0.shape[0]
        refuse("mass_matrix", "q", returned("mass_matrix", q0), (n, n),
               f"the {n} x {n} mass matrix M(q) (real floating point)")
        refuse("potential", "q", returned("potential", q0), (),
               "the potential energy as a real scalar")
    refuse("lagrangian", "g, xi" if lie else "q, v", returned("lagrangian", q0, x0), (),
           "the Lagrangian's value as a real scalar (e.g. a sum, not a vector of terms)")


def _check_values(system, integrator, *, q0, v0, p0, dt, t0, project, controls):
    """Shapes and dtypes (at trace time under jit), then the checks on values: raised at once
    on concrete values, carried in the graph on traced ones.  Returns ``(system, q0, v0, dt,
    t0, controls)`` ready for the run (projected, ``v0`` from ``p0``, array parameters)."""
    lie = isinstance(system, LieGroupSystem)
    if lie:
        q0 = _group_element(system, q0)
        x0 = _check_shapes(q0, v0, p0, system.group.dim)
    else:
        q0 = _vector("q0", q0, system.ndim)
        x0 = _check_shapes(q0, v0, p0)
    dtype = x0.dtype
    _warn_narrowing(dtype, v0=v0, p0=p0, dt=dt, t0=t0)
    dt = _real_scalar("dt", dt, dtype)
    t0 = _real_scalar("t0", t0, dtype)
    _check_model_shapes(system, q0, x0, t0, lie)

    # Checks on values: raised here on concrete values, in the graph (eqx.error_if) on traced
    # ones, with the same wording; each guards all the inputs of the run.
    inputs = _Inputs(system=system, q0=q0, x0=x0, dt=dt, t0=t0)
    inputs.refuse(
        ~(dt > 0) | _nonfinite(dt) if _is_traced(dt) else not 0 < float(dt) < np.inf,
        "dt must be positive and finite; pass a step size dt > 0.",
        lambda: f"dt must be positive and finite, got {float(dt)}; pass a step size dt > 0.")
    inputs.refuse(*_finite("t0", t0, "initial time"))
    inputs.refuse(
        t0 + dt == t0,
        f"dt is below the resolution of t0 in {dtype}: t0 + dt == t0, so the clock would not "
        f"advance; pass a larger dt, a t0 nearer 0, or float64 inputs.",
        lambda: f"dt = {float(dt)} is below the resolution of t0 = {float(t0)} in {dtype}: "
                f"t0 + dt == t0, so the clock would not advance; pass a larger dt, a t0 nearer "
                f"0, or float64 inputs.")
    for check in _parameter_checks(system):
        inputs.refuse(*check)
    inputs.refuse(*_finite("q0", q0, "initial coordinates"))
    if controls is not None:
        if not (jnp.issubdtype(controls.dtype, jnp.floating)
                or jnp.issubdtype(controls.dtype, jnp.integer)):
            raise TypeError(f"controls has dtype {controls.dtype}; pass real numbers.")
        inputs.set(controls=controls.astype(dtype))
        inputs.refuse(*_finite("controls", inputs.controls, "controls"))
    if project:   # (at the initial time: a rheonomic constraint reads the clock)
        inputs.set(q0=inputs.system.at(inputs.t0).project_configuration(inputs.q0))
    if lie:
        group, name = system.group, type(system.group).__name__
        off = group.distance(inputs.q0)
        tol = 1e3 * float(jnp.finfo(dtype).eps)
        inputs.refuse(
            ~(off <= tol) if _is_traced(off) else not float(off) <= tol,
            f"q0 is not an element of {name} (off the group by more than {tol:.1e}); repair "
            f"it with system.group.project(q0), or pass project=True.",
            lambda: f"q0 is not an element of {name}: it is off the group by {float(off):.3e} "
                    f"(tolerance {tol:.1e}); repair it with system.group.project(q0), or pass "
                    f"project=True.")
    if v0 is not None:
        inputs.refuse(*_finite("v0", x0, "initial velocities"))
        inputs.set(v0=inputs.x0)
    else:
        inputs.refuse(*_finite("p0", x0, "initial momenta"))
        bad, messages, eager, index = _regular(system, inputs.q0, jnp.zeros_like(x0))
        inputs.refuse(bad, messages, eager, index=index)
        at_t0 = inputs.system.at(inputs.t0)
        v0 = at_t0.velocity(inputs.q0, inputs.x0)
        name = type(system).__name__
        # the velocity found must map back to p0: a p0 outside the range of v -> D2L(q0, v)
        # leaves Newton at a nearby v whose momentum is another (a bounded kinetic term)
        gap = jnp.max(jnp.abs(at_t0.momentum(inputs.q0, v0) - inputs.x0))
        tol = float(jnp.finfo(dtype).eps) ** 0.5 * (1.0 + jnp.max(jnp.abs(inputs.x0)))
        inputs.refuse(
            _nonfinite(v0) | ~(gap <= tol),
            f"The inverse Legendre map of {name} failed at (q0, p0): no velocity with "
            f"D2L(q0, v) = p0 was found from v = 0 (p0 may lie outside the range of the "
            f"Legendre map). Pass v0 instead of p0, or override "
            f"{name}.velocity(q, p, v_guess) with a closed form.")
        inputs.set(v0=v0)
    if project:
        inputs.set(v0=inputs.system.at(inputs.t0).project_velocity(inputs.q0, inputs.v0))
    bad, messages, eager, index = _regular(system, inputs.q0, inputs.v0)
    inputs.refuse(bad, messages, eager, index=index)
    system, q0, v0, dt, t0 = (inputs.system, inputs.q0, inputs.v0, inputs.dt, inputs.t0)
    controls = inputs.controls if controls is not None else None
    if isinstance(system, ForcedSystem):
        u0 = None if controls is None else controls.reshape((-1, controls.shape[-1]))[0]
        out = jax.eval_shape(system.force, t0, q0, v0, u0)
        if getattr(out, "shape", None) != x0.shape:
            like = "v (the body velocity)" if lie else "q"
            raise ValueError(
                f"{type(system).__name__}.force(t, q, v, u) returned "
                f"{getattr(out, 'shape', type(out).__name__)}; it must return the generalised "
                f"force, an array shaped like {like}, {x0.shape}.")
    # the integrator's own consistency checks (raised here, or carried by q0, v0 in the graph)
    q0, v0 = integrator.check_initial(system.at(t0), q0, v0,
                                      float(jnp.finfo(dtype).eps) ** 0.6)
    # Python-float parameters become arrays of the working dtype: jit then traces them
    # (no recompilation per value) and the system follows the dtype of q0.
    system = jax.tree_util.tree_map(
        lambda x: jnp.asarray(x, dtype) if isinstance(x, float) else x, system)
    return system, q0, v0, dt, t0, controls


def _finish(integrator, system, q0, v0, dt, t0, U, n_steps, save_every, dense, adjoint, *,
            throw, run=None):
    """The compiled run on checked inputs (``run()``, when given, is it), and its
    convergence check."""
    if run is None:
        run = lambda: _run(system, integrator, q0, v0, t0, dt, U,  # noqa: E731
                           n_steps // save_every, save_every, dense, adjoint)
    sol = run()
    if throw:
        ok = sol.stats.converged
        if _is_traced(ok):
            sol = _refuse(
                sol, ~jnp.all(ok),
                "vijax.simulate: an implicit stage solve did not converge, so the trajectory "
                "is wrong from that step on. Reduce dt, or use solver=vijax.solvers.Newton() "
                "for stiff problems; pass throw=False to get the result anyway and inspect "
                "sol.stats (converged, failed_step, first_failure), or run without jit to have "
                "the step named.")
        else:
            _raise_if_failed(sol, integrator, t0, dt, save_every)
    return sol
