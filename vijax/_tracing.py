"""What a function's program depends on, decided while tracing (no values computed)."""

from __future__ import annotations

import jax
import jax.extend

__all__ = ["depends_on_first"]


def depends_on_first(fn, x, *args) -> bool:
    """Whether the output of ``fn(x, *args)`` depends on ``x`` through the operations of its
    program (a walk of its jaxpr, conservative: an operation that reads ``x`` counts as
    depending on it), decided while tracing."""
    jaxpr = jax.make_jaxpr(lambda y: fn(y, *args))(x).jaxpr
    live = set(jaxpr.invars)
    for eqn in jaxpr.eqns:
        if any(not isinstance(v, jax.extend.core.Literal) and v in live for v in eqn.invars):
            live.update(eqn.outvars)
    return any(not isinstance(v, jax.extend.core.Literal) and v in live for v in jaxpr.outvars)
