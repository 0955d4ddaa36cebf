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


def _package_classes():
    import importlib
    import inspect
    import pkgutil

    import vijax

    classes = {}
    for info in pkgutil.walk_packages(vijax.__path__, "vijax."):
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__.startswith("vijax."):
                classes[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return classes


def test_no_concrete_class_is_subclassed_in_the_package():
    """Equinox's abstract/final pattern: shared parts live in abstract bases."""
    import inspect

    import equinox as eqx

    classes = _package_classes()
    modules = [c for c in classes.values() if issubclass(c, eqx.Module)]

    def abstract(cls):  # abstract methods, or equinox abstract variables (AbstractVar)
        return (inspect.isabstract(cls) or bool(cls.__dict__.get("__abstractvars__"))
                or bool(cls.__dict__.get("__abstractclassvars__")))

    offenders = [(base.__qualname__, sub.__qualname__) for base in modules for sub in modules
                 if sub is not base and issubclass(sub, base) and not abstract(base)]
    assert offenders == [], offenders


def _collect(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_every_extended_entry_names_a_test():
    """tests/conftest.py's EXTENDED table against a full collection of the suite (both tiers):
    an entry that matches no test is stale (a renamed test or parameter)."""
    from conftest import stale_extended_entries
    out = _collect("-m", "")
    assert out.returncode == 0, out.stdout + out.stderr
    nodeids = [line for line in out.stdout.splitlines() if "::" in line]
    assert len(nodeids) > 1000
    assert stale_extended_entries(nodeids) == []
    assert stale_extended_entries(nodeids[:10]) != []   # the check can fail


def test_the_retry_of_make_test_collects_the_failed_tests(tmp_path):
    """`make test` re-runs the tests that failed with `--last-failed`, which collects only those
    tests of a module; collection must not fail there (a staleness check of the EXTENDED table
    that ran at collection read the missing ones as stale and stopped the retry)."""
    failed = "tests/test_tstar.py::test_order_bounds_of_the_cutoff[r0]"
    cache = tmp_path / "v" / "cache"
    cache.mkdir(parents=True)
    (cache / "lastfailed").write_text('{"%s": true}' % failed)
    out = _collect("-o", f"cache_dir={tmp_path}", "--last-failed", "--last-failed-no-failures",
                   "none")
    assert out.returncode == 0, out.stdout + out.stderr
    assert failed in out.stdout
