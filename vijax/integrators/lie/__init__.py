"""Lie-group integrators: the variational PRK over a retraction (:class:`GroupVPRK`)."""

from ._dynamics import euler_poincare, free_acceleration, nonholonomic_multiplier
from .prk import GroupPRKState, GroupVPRK

__all__ = ["GroupVPRK", "GroupPRKState", "euler_poincare", "free_acceleration",
           "nonholonomic_multiplier"]
