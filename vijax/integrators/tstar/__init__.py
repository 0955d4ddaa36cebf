"""Symplectic Lie-group methods on ``T*G`` of Bogfjellmo & Marthinsen (2016), "High order
symplectic partitioned Lie group methods" (Found. Comput. Math.; arXiv:1303.5654).

* ``vrkmk.py`` -- :class:`VRKMK`, variational Runge--Kutta--Munthe-Kaas methods (their
  eq. (16)): any order through Gauss tableaus with a ``dexp⁻¹`` cut-off ``r = 2s − 2``;
* ``vcg.py`` -- :class:`VCG`, variational Crouch--Grossman methods (their eq. (18)): any
  even order through symmetric compositions of the midpoint VCG (their Lemma 5.4);
* ``_common.py`` -- the map ``f`` of a :class:`vijax.LieGroupSystem` (:func:`spatial_field`),
  the right-trivialised ``dexp*`` and truncated ``dexp⁻¹_(r)``, the state.

Both integrate a :class:`vijax.LieGroupSystem` (optionally a :class:`vijax.ForcedSystem`,
body forces through the Lagrange--d'Alembert principle) from a group element and a **body**
velocity; the state's ``p`` is the body momentum ``μ̄ = D2ℓ``.
"""

from ._common import (TStarState, bernoulli, default_solver, dexp_star, dexpinv_truncated,
                      dexpinv_truncated_vjp, spatial_field, sprk_order, stage_field)
from .vcg import (VCG, TRIPLE_JUMP, YOSHIDA6, composition_tableau, vcg_order,
                  vcg_order_conditions)
from .vrkmk import VRKMK, kutta3_tableau, vrkmk_order

__all__ = ["VRKMK", "VCG", "TStarState", "default_solver", "spatial_field", "stage_field",
           "dexp_star", "dexpinv_truncated", "dexpinv_truncated_vjp", "bernoulli", "sprk_order",
           "vrkmk_order", "kutta3_tableau", "composition_tableau", "vcg_order",
           "vcg_order_conditions", "TRIPLE_JUMP", "YOSHIDA6"]
