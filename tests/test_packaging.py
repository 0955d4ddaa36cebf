"""Packaging promises: every runtime dependency is imported by the package (jaxlib is jax's
backend, imported by jax itself), and importing vijax changes no global JAX configuration."""

import ast
import pathlib
import re
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _modules(nodes) -> set[str]:
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def imported_modules(module_level_only: bool) -> set[str]:
    names = set()
    for path in (ROOT / "vijax").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names |= _modules(tree.body if module_level_only else ast.walk(tree))
    return names


def _names(requirements) -> set[str]:
    return {re.split(r"[<>=!~\[ ]", d, maxsplit=1)[0].lower() for d in requirements}


def test_every_runtime_dependency_is_imported():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = _names(project["dependencies"])
    extras = set().union(*(_names(v) for v in project["optional-dependencies"].values()))
    imported = imported_modules(module_level_only=True)
    assert names - {"jaxlib"} <= imported, names - imported
    # nothing outside the standard library and the dependencies is imported on import; the
    # optional extras (scipy for reference solutions) only lazily, inside functions
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    assert imported - stdlib - names == set(), imported - stdlib - names
    lazily = imported_modules(module_level_only=False) - imported
    assert lazily - stdlib <= extras, lazily - stdlib - extras


def test_import_changes_no_global_jax_configuration():
    code = ("import jax; before = (jax.config.jax_enable_x64, jax.config.jax_numpy_dtype_promotion)"
            "\nimport vijax\nafter = (jax.config.jax_enable_x64, jax.config.jax_numpy_dtype_promotion)"
            "\nassert before == after, (before, after)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
