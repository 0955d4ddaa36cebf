"""The method table (README, docs) generated from the integrators' traits."""

from __future__ import annotations

from ..systems import CAPABILITIES
from ._base import registry

__all__ = ["presets", "method_table"]


def presets():
    """The named presets of every family, as ``(constructor call, integrator)`` pairs."""
    return registry()


def method_table() -> str:
    """Markdown table of the presets with their traits (order, stages, symplecticity and the
    capabilities each accepts)."""
    caps = [c.__name__ for c in CAPABILITIES]
    rows = ["| preset | method | stages | order | symplectic | " + " | ".join(caps) + " |",
            "|---|---|---|---|---|" + "---|" * len(caps)]
    yes = lambda b: "yes" if b else "-"  # noqa: E731
    for call, m in presets():
        accepted = " | ".join(
            "required" if c in m.required else yes(c in m.supported) for c in CAPABILITIES)
        rows.append(f"| `{call}` | {m.name} | {m.stages} | {m.order} | {yes(m.symplectic)} | "
                    f"{accepted} |")
    return "\n".join(rows)
