"""Dense output: trajectories between steps, from the polynomials the methods solve for.

Every collocation or Galerkin family defines, on each step ``[t_k, t_k + h]``, polynomials in
the scaled time ``τ = (t - t_k) / h``: VPRK's collocation polynomial through its stages, the
Galerkin families' configuration and momentum polynomials.  An integrator with dense output
(:class:`vijax.integrators.AbstractDenseIntegrator`) reports them as values at static nodes on
``[0, 1]``; this module stores them as one :class:`PiecewisePolynomial` per variable and
evaluates them anywhere, in the style of diffrax's interpolation classes.  Build one with
``vijax.simulate(..., dense=True)`` and evaluate it with ``Solution.evaluate(t)``.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._checks import refuse
from .quadrature import lagrange_basis, lagrange_derivative_matrix

__all__ = ["DenseOutput", "PiecewisePolynomial", "DenseInterpolation", "locate", "SIDES"]

#: What a piecewise polynomial returns *at* a grid point ``t_k``:
#: ``"node"`` -- the node value (the method's ``q_k``, ``p_k`` ...);
#: ``"right"`` -- the polynomial of the step that starts at ``t_k`` (right-continuous; at the
#: last grid point the node value if there is one, else the last polynomial at ``τ = 1``).
SIDES = ("node", "right")


class DenseOutput(NamedTuple):
    """Dense values at the requested times, one row per time: ``q``, ``p`` and, where the
    method defines them, the velocity ``v`` and the constraint momentum ``pg``."""

    q: Array
    p: Array
    v: Optional[Array] = None
    pg: Optional[Array] = None


def locate(t_nodes, t, right: bool, snap):
    """Interval index for each ``t`` (right- or left-continuous convention at grid points), the
    nearest grid point and whether ``t`` is one (within ``snap``: the grid is accumulated in
    floating point)."""
    n_int = t_nodes.shape[0] - 1
    nearest = jnp.clip(jnp.searchsorted(t_nodes, t), 0, n_int)
    lower = jnp.clip(nearest - 1, 0, n_int)
    d_near = jnp.abs(t_nodes[nearest] - t)
    d_low = jnp.abs(t_nodes[lower] - t)
    node = jnp.where(d_low < d_near, lower, nearest)
    on_node = jnp.minimum(d_near, d_low) <= snap
    idx = jnp.searchsorted(t_nodes, t, side="right" if right else "left") - 1
    # On a grid point the convention decides: right-continuous -> interval starting there,
    # left-continuous -> interval ending there.
    idx = jnp.where(on_node, node if right else node - 1, idx)
    return jnp.clip(idx, 0, n_int - 1), node, on_node


class PiecewisePolynomial(eqx.Module):
    """A function of time that is a polynomial on each step, in Lagrange form.

    ``values[k]`` holds the step-``k`` polynomial at the static ``nodes`` (scaled time on
    ``[0, 1]``); ``knots[k]`` the node value at ``ts[k]`` (or ``None``).  ``side`` says what is
    returned at a grid point (:data:`SIDES`).  With ``pinned``, the nodes contain 0 and 1 and
    the polynomial of each step takes the knot values there, so the interpolant is continuous
    and passes through the method's node values.
    """

    ts: Float[Array, " N1"]
    values: Float[Array, "N k n"]
    knots: Optional[Float[Array, "N1 n"]]
    nodes: tuple = eqx.field(static=True)
    side: str = eqx.field(static=True, default="node")
    pinned: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        if self.side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, got {self.side!r}.")
        if self.side == "node" and self.knots is None:
            raise ValueError("side='node' needs the node values (knots).")
        if self.pinned and (self.nodes[0] != 0.0 or self.nodes[-1] != 1.0):
            raise ValueError("pinned=True needs nodes that start at 0 and end at 1.")

    def _coefficients(self):
        if not self.pinned:
            return self.values
        return self.values.at[:, 0].set(self.knots[:-1]).at[:, -1].set(self.knots[1:])

    def evaluate(self, t, derivative: bool = False) -> Array:
        """Values (or time derivatives) at the times ``t`` (scalar or 1-D), one row each."""
        ts = self.ts
        t = jnp.atleast_1d(jnp.asarray(t, ts.dtype))
        h = jnp.diff(ts)
        snap = 1e-9 * jnp.min(h)
        n_int = ts.shape[0] - 1
        right = self.side == "right"
        idx, node, on_node = locate(ts, t, right, snap)
        tau = jnp.clip((t - ts[idx]) / h[idx], 0.0, 1.0)
        if right:
            # on a grid point: the step starting there (tau = 0), the last one at the end
            at_end = on_node & (node == n_int)
            tau = jnp.where(on_node, jnp.where(at_end, 1.0, 0.0), tau)
        nodes = np.asarray(self.nodes)
        basis = lagrange_basis(nodes, tau).astype(ts.dtype)  # (len(t), k)
        if derivative:
            dmat = jnp.asarray(lagrange_derivative_matrix(nodes, nodes), ts.dtype)
            basis = (basis @ dmat) / h[idx][:, None]
        coeffs = self._coefficients()[idx]  # (len(t), k, n)
        out = jnp.einsum("tk,tkn->tn", basis, coeffs)
        if derivative or self.knots is None:
            return out
        if right:
            return jnp.where((on_node & (node == n_int))[:, None], self.knots[-1], out)
        return jnp.where(on_node[:, None], self.knots[node], out)


class DenseInterpolation(eqx.Module):
    """The dense output of a run: one :class:`PiecewisePolynomial` per variable (``q``,
    ``p``; ``v`` and ``pg`` where the method defines them) on the same time grid."""

    fields: dict

    @classmethod
    def build(cls, layout: dict, ts, values: dict, knots: dict) -> "DenseInterpolation":
        """From a method's ``dense_layout`` (``name -> (nodes, side, pinned)``), the grid, the
        per-step node values (``name -> (N, k, n)``) and the knots (``name -> (N + 1, n)``)."""
        out = {}
        for name, (nodes, side, pinned) in layout.items():
            out[name] = PiecewisePolynomial(ts=ts, values=values[name], knots=knots.get(name),
                                            nodes=tuple(float(x) for x in nodes), side=side,
                                            pinned=pinned)
        return cls(fields=out)

    @property
    def ts(self):
        return next(iter(self.fields.values())).ts

    def evaluate(self, t, derivative: bool = False) -> DenseOutput:
        """:class:`DenseOutput` at the times ``t`` (a time or a 1-D array, within the grid:
        the polynomials do not extrapolate, and a time outside it or NaN is an error, raised at
        once or, under ``jit``, in the graph); with ``derivative=True`` the time derivatives of
        the polynomials (step by step; not defined at the grid points of a discontinuous
        variable)."""
        ts = self.ts
        t = jnp.asarray(t, ts.dtype)
        if t.ndim > 1:
            raise ValueError(f"evaluate takes a time or a 1-D array of times, got shape "
                             f"{t.shape}; pass t.ravel() and reshape the result.")
        lo, hi = ts[0], ts[-1]
        slack = 1e-9 * (hi - lo)
        outside = ~((t >= lo - slack) & (t <= hi + slack))   # NaN is outside too

        def eager():
            got = np.atleast_1d(np.asarray(t))[np.atleast_1d(np.asarray(outside))][:3]
            return (f"evaluate: times must lie in the run [{float(lo)}, {float(hi)}] (dense "
                    f"output does not extrapolate), got {got}; pass times within the run.")

        t = refuse(t, jnp.any(outside),
                   "evaluate: a time lies outside the run [t[0], t[-1]] (or is NaN); dense "
                   "output does not extrapolate: pass times within the run.", eager)
        vals = {k: f.evaluate(t, derivative) for k, f in self.fields.items()}
        return DenseOutput(**vals)


def stack_knots(records) -> dict:
    """``name -> (N + 1, n)`` from a first record and the stacked per-step records."""
    first, rest = records
    return jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a[None], b]), first, rest)
