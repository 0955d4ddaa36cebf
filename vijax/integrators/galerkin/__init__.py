"""Galerkin-type variational integrators: the configuration (and momentum) are polynomials in
time on each step, and the step equations are the stationarity conditions of a discretised
action or generating functional.

* :class:`GalerkinVI` (``discrete.py``) -- constrained Galerkin variational integrators of
  Wenger, Ober-Blöbaum & Leyendecker (2017): discrete action with separate quadratures for the
  Lagrangian and the constraints; projected (one-step) and paper (two-step) modes.
* :class:`DGVI` (``dg.py``) -- continuous-time discontinuous-Galerkin integrators of
  Muehlebach, Heimsch & Glocker (2016), with holonomic constraints and a PRK export.
* :class:`CGVI` (``cg.py``) -- their continuous-position variant (App. B; Marsden--West).

``_common.py`` holds what they share (predictors, Hamiltonian pieces, the continuous-time
base); quadrature rules and bases are in :mod:`vijax.quadrature`, dense output in
:mod:`vijax.interpolation`.
"""

# isort: skip_file -- the families are imported in the order of the method table
from .discrete import GalerkinState, GalerkinVI
from ._common import AbstractContinuousTimeVI
from .dg import DGVI, ConstrainedDGState, DGState, dg_prk_tableau, dg_prk_tableau_formula
from .cg import CGVI, CGState

__all__ = ["GalerkinVI", "GalerkinState", "DGVI", "DGState", "ConstrainedDGState", "CGVI",
           "CGState", "AbstractContinuousTimeVI", "dg_prk_tableau", "dg_prk_tableau_formula"]
