"""The method table (README, docs) generated from the integrators' traits."""

from __future__ import annotations

from .dg import CGVI, DGVI
from .galerkin import GalerkinVI
from .holonomic import HolonomicVPRK
from .vprk import VPRK

__all__ = ["presets", "method_table"]


def presets():
    """The named presets, as ``(constructor call, integrator)`` pairs."""
    out = [("VPRK.midpoint()", VPRK.midpoint()), ("VPRK.stormer_verlet()", VPRK.stormer_verlet())]
    out += [(f"VPRK.gauss({s})", VPRK.gauss(s)) for s in (1, 2, 3, 4)]
    out += [(f"VPRK.lobatto({s})", VPRK.lobatto(s)) for s in (2, 3, 4, 5)]
    out += [("HolonomicVPRK.rattle()", HolonomicVPRK.rattle())]
    out += [(f"HolonomicVPRK.lobatto({s})", HolonomicVPRK.lobatto(s)) for s in (3, 4, 5)]
    out += [("GalerkinVI.shake()", GalerkinVI.shake()), ("GalerkinVI.rattle()", GalerkinVI.rattle())]
    out += [(f"GalerkinVI.gauss({s})", GalerkinVI.gauss(s)) for s in (1, 2, 3, 4)]
    out += [(f"GalerkinVI.lobatto({s})", GalerkinVI.lobatto(s)) for s in (2, 3, 4)]
    out += [(f"DGVI({s})", DGVI(s)) for s in (1, 2, 3)]
    out += [(f"CGVI({r})", CGVI(r)) for r in (1, 2)]
    return out


def method_table() -> str:
    """Markdown table of the presets with their traits (order, stages, symplecticity)."""
    rows = ["| preset | method | stages | order | symplectic | holonomic | nonholonomic |",
            "|---|---|---|---|---|---|---|"]
    yes = lambda b: "yes" if b else "-"  # noqa: E731
    for call, m in presets():
        rows.append(f"| `{call}` | {m.name} | {m.stages} | {m.order} | {yes(m.symplectic)} | "
                    f"{yes(m.supports_holonomic)} | {yes(m.supports_nonholonomic)} |")
    return "\n".join(rows)
