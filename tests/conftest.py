"""Shared pytest configuration: the whole suite runs in float64.

vijax never touches global JAX configuration (see ``vijax/__init__.py``), so the tests enable
double precision themselves, at import time, before any array is created.
"""

import jax

jax.config.update("jax_enable_x64", True)
