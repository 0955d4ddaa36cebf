"""The code in the docs runs: the minimal method family of docs/concepts.md is added without
touching ``simulate`` and works end to end (run in a fresh process, so the example's class does
not join this process's preset registry)."""

import functools
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def python_blocks(markdown: str, heading: str) -> list[str]:
    section = markdown.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def run_section(page: str, heading: str, checks: str, prefix: str = ""):
    """The one ``python`` block under ``heading`` of ``page`` (a path from the repository
    root), after ``prefix`` and followed by ``checks`` (NumPy imported), in a fresh process."""
    blocks = python_blocks((ROOT / page).read_text(), heading)
    assert len(blocks) == 1
    return run_python(prefix + blocks[0] + "\nimport numpy as np\n" + checks)


def run_python(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter from the repository root; fails the test on an error."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    return out


def test_minimal_method_family_of_the_concepts_page_runs():
    blocks = python_blocks((ROOT / "docs" / "concepts.md").read_text(), "## Adding a method family")
    assert len(blocks) == 1
    code = blocks[0] + (
        "\nimport numpy as np\n"
        "E = vj.diagnostics.energy(vj.systems.Kepler(), sol)\n"
        "assert np.all(np.isfinite(sol.q)) and float(np.max(np.abs(E - E[0]))) < 1e-2\n"
        "assert [c for c, _ in vj.integrators.registry()][-1] == 'SymplecticEuler()'\n")
    out = run_python(code)
    # the mismatch message names the methods that accept the double pendulum, not this one
    assert "does not accept DoublePendulum" in out.stdout
    assert "VPRK" in out.stdout and "SymplecticEuler" not in out.stdout.split("accept it:")[1]


def test_forcing_page_example_runs():
    """The quick start of docs/forcing.md: a controlled, damped pendulum and the gradient of a
    loss with respect to its per-stage controls."""
    run_section("docs/forcing.md", "# Forces and controls",
                "assert sol.q.shape == (101, 1) and U.shape == (100, 2, 1)\n"
                "assert np.all(np.isfinite(dU)) and float(np.max(np.abs(dU))) > 0\n")


def test_time_dependent_example_runs():
    """The Kapitza pendulum of docs/forcing.md stays upright."""
    run_section("docs/forcing.md", "## Explicitly time-dependent Lagrangians",
                "assert sol.q.shape == (3001, 1)\n"
                "assert float(np.max(np.abs(sol.q[:, 0] - np.pi))) < 0.3\n",
                prefix="import jax, jax.numpy as jnp\njax.config.update('jax_enable_x64', True)\n"
                       "import vijax as vj\n")


def test_order_table_example_loads_the_study_design_of_the_tests():
    """``make orders`` (examples/order_table.py) loads tests/test_vprk_numerics.py as a module,
    without tests/ on the path: that module imports nothing from the tests' helpers at import
    time (an import of ``helpers`` there once broke ``make orders``)."""
    run_python("import importlib.util, pathlib\n"
               "spec = importlib.util.spec_from_file_location('_vprk_numerics', "
               "pathlib.Path('tests') / 'test_vprk_numerics.py')\n"
               "module = importlib.util.module_from_spec(spec)\n"
               "spec.loader.exec_module(module)\n"
               "assert module.STEP_COUNTS\n")


@pytest.mark.slow
def test_readme_quick_start_runs():
    """The README's quick start, as a user pastes it (a fresh process; 26 s, hence slow)."""
    blocks = python_blocks((ROOT / "README.md").read_text(), "## Quick start")
    assert len(blocks) == 1
    run_python(blocks[0] + "\nassert ens.q.shape == (1024, 2, 1)\n")


def test_lie_group_page_example_runs():
    """The satellite of docs/lie_groups.md: a controlled rigid body on SO(3) stays on the
    group."""
    run_section("docs/lie_groups.md", "## Systems on a group",
                "assert sol.q.shape == (201, 3, 3) and sol.p.shape == (201, 3)\n"
                "R = np.asarray(sol.q)\n"
                "assert np.max(np.abs(np.einsum('kji,kjl->kil', R, R) - np.eye(3))) < 1e-13\n")


def test_rheonomic_example_of_the_forcing_page_runs():
    """The bead on the breathing hoop of docs/forcing.md stays on the hoop."""
    run_section("docs/forcing.md", "## Rheonomic constraints",
                "r = 1.0 + 0.2 * np.sin(2.0 * np.asarray(sol.t))\n"
                "assert np.max(np.abs(np.linalg.norm(sol.q, axis=1) - r)) < 1e-13\n"
                "assert np.ptp(r) > 0.3\n")


# --------------------------------------------------------------------------------------------
# Links
# --------------------------------------------------------------------------------------------

_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """The anchor GitHub and mkdocs give a heading: lower case, code marks and punctuation
    dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@functools.lru_cache(maxsize=None)
def _prose(page: pathlib.Path) -> str:
    """``page`` without its code blocks."""
    return re.sub(r"```.*?```", "", page.read_text(), flags=re.S)


@functools.lru_cache(maxsize=None)
def _anchors(page: pathlib.Path) -> frozenset[str]:
    text = _prose(page)
    return frozenset({_slug(re.sub(r"<[^>]*>", "", m))
                      for m in re.findall(r"^#+ (.*)$", text, flags=re.M)}
                     | set(re.findall(r'<a id="([^"]+)">', text)))


def broken_links(page: pathlib.Path, within: pathlib.Path) -> list[str]:
    """The relative links of ``page`` whose file is missing or outside ``within`` (the
    documentation site keeps only the pages under docs/), or whose anchor names no heading."""
    bad = []
    for target in _LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):
            continue   # an address (https:, mailto:)
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or within not in (file, *file.parents):
            bad.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            bad.append(target)
    return bad


@pytest.mark.parametrize("page", ["README.md", "benchmarks/README.md"] +
                         sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
def test_relative_links_resolve(page):
    """Every relative link names a file and a heading that exist; a page of the documentation
    site (docs/) links only inside it (``mkdocs build --strict`` refuses a link out of it: one
    from holonomic.md to benchmarks/README.md did)."""
    path = ROOT / page
    within = ROOT / "docs" if path.parent == ROOT / "docs" else ROOT
    assert broken_links(path, within) == []
