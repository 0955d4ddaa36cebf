"""Checks on input values that raise at once on concrete values and run in the compiled code
(:func:`equinox.error_if`) on traced ones, with the same wording, for :func:`vijax.simulate` and
the constraint layer."""

from __future__ import annotations

import functools as ft

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["is_traced", "refuse"]


def is_traced(x) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x))


@ft.partial(jax.custom_jvp, nondiff_argnums=(3,))
def _error_if(x, bad, index, messages: tuple):
    return eqx.branched_error_if(x, bad, index, messages)


@_error_if.defjvp
def _error_if_jvp(messages, primals, tangents):
    # The tangents are multiplied by a checked one: a derivative (forward or reverse mode)
    # then depends on the check too, which would otherwise be dropped when only the
    # derivative is used (as under jax.jit(jax.grad(...))).
    x, bad, index = primals
    tx = tangents[0]
    one = eqx.branched_error_if(jnp.ones(()), bad, index, messages)
    scale = lambda t: t if t.dtype == jax.dtypes.float0 else t * one.astype(t.dtype)  # noqa
    return _error_if(x, bad, index, messages), jax.tree_util.tree_map(scale, tx)


def refuse(x, bad, message, eager=None, exc=ValueError, index=0):
    """``x`` unchanged, or an error when ``bad`` holds: raised at once when ``bad`` is concrete
    (``exc`` with ``eager()``, a message that contains ``message`` with the concrete values),
    checked in the graph by :func:`equinox.error_if` when it is traced (under ``jit``/``vmap``;
    one bad lane fails the whole call).  ``message`` may be a list, chosen by ``index`` in the
    graph (:func:`equinox.branched_error_if`).  The check runs only if the returned ``x`` (or
    a derivative through it) is used, so guard every input the result depends on
    (``vijax.simulate`` guards all of them with every check)."""
    messages = tuple(message) if isinstance(message, (list, tuple)) else (message,)
    if is_traced(bad):
        arrays, rest = eqx.partition(x, eqx.is_array)  # Python scalars stay as they are
        return eqx.combine(_error_if(arrays, bad, index, messages), rest)
    if bool(np.any(np.asarray(bad))):
        raise exc(_eager_message(messages, index, eager))
    return x


def _eager_message(messages, index, eager):
    """``eager()`` (the message with the concrete values), or the plain message where the
    values are tracers: under ``jax.grad``/``jax.jvp`` without ``jit`` the flag can be concrete
    while the values it was computed from are not (formatting them would raise JAX's
    conversion error instead of this one)."""
    try:
        return messages[int(index)] if eager is None else eager()
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError,
            jax.errors.TracerBoolConversionError, jax.errors.TracerIntegerConversionError,
            TypeError):
        return messages[0 if is_traced(index) else int(index)]
