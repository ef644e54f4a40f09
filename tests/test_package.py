"""The package imports cheaply: no torch at import or for ``--help``/``--version``; its
runtime dependencies are exactly the third-party packages it imports."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import slurm_elastic

NO_TORCH = "import sys; {body}; assert 'torch' not in sys.modules, sorted(sys.modules)"


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_import_does_not_import_torch() -> None:
    proc = _python(NO_TORCH.format(body="import slurm_elastic, slurm_elastic.marker"))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("args", [["--help"], ["--version"]])
def test_cli_help_and_version_do_not_import_torch(args: list[str]) -> None:
    body = (
        "from click.testing import CliRunner; from slurm_elastic.cli import cli; "
        f"r = CliRunner().invoke(cli, {args!r}); assert r.exit_code == 0, r.output; "
        "print(r.output)"
    )
    proc = _python(NO_TORCH.format(body=body))
    assert proc.returncode == 0, proc.stderr
    if args == ["--version"]:
        assert slurm_elastic.__version__ in proc.stdout


def test_console_script_works() -> None:
    exe = shutil.which("slurm-elastic")
    assert exe is not None, "console script missing: pip install -e '.[test]'"
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"slurm-elastic, version {slurm_elastic.__version__}"
    helptext = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert helptext.returncode == 0, helptext.stderr
    assert "Usage: slurm-elastic" in helptext.stdout


def test_console_script_rejects_unknown_command() -> None:
    exe = shutil.which("slurm-elastic")
    assert exe is not None
    proc = subprocess.run([exe, "no-such-command"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "No such command" in proc.stderr


# --------------------------------------------------------------------------- dependencies

PACKAGE = Path(slurm_elastic.__file__).parent
PYPROJECT = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]


def _dist(requirement: str) -> str:
    """The normalised distribution name of a requirement line (PEP 503)."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name is not None, requirement
    return re.sub(r"[-_.]+", "-", name.group()).lower()


def _guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Imported on first use: inside a function, or in a ``try`` that turns its absence
    into ``MissingExtra``."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return True
        if isinstance(node, ast.Try) and any(
            "MissingExtra" in ast.unparse(h) for h in node.handlers
        ):
            return True
    return False


def package_imports(root: Path) -> dict[str, set[bool]]:
    """Third-party distributions ``root``'s modules import -> {eager?} of their sites."""
    owners = importlib.metadata.packages_distributions()
    found: dict[str, set[bool]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in {name.split(".")[0] for name in names}:
                if top in sys.stdlib_module_names or top == root.name:
                    continue
                assert top in owners, f"{path}: imports {top}, which is not installed"
                for dist in owners[top]:
                    found.setdefault(_dist(dist), set()).add(not _guarded(node, parents))
    return found


def test_runtime_dependencies_are_what_the_package_imports() -> None:
    runtime = {_dist(r) for r in PYPROJECT["dependencies"]}
    extras = {_dist(r) for reqs in PYPROJECT["optional-dependencies"].values() for r in reqs}
    imported = package_imports(PACKAGE)
    # Every runtime dependency is imported, and every import is a runtime dependency or
    # an extra's package imported on first use (never at import time of its module).
    assert set(imported) - (extras - runtime) == runtime
    eager_extras = {d for d in extras - runtime if True in imported.get(d, set())}
    assert eager_extras == set()


def test_the_dependency_check_sees_eager_and_guarded_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "import os\nimport numpy\nfrom pkg import b\n"
        "try:\n    import yaml\nexcept ModuleNotFoundError:\n    raise MissingExtra()\n"
        "def f():\n    import click.testing\n"
    )
    assert package_imports(pkg) == {"numpy": {True}, "pyyaml": {False}, "click": {False}}


def test_an_extra_names_itself_when_missing() -> None:
    code = (
        "import sys; sys.modules['pulp'] = None\n"
        "try:\n    import slurm_elastic.policy.pulp_model\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    proc = _python(code)
    assert proc.stdout.strip() == (
        "the pulp cross-check needs pulp, from the 'test' extra: pip install 'slurm-elastic[test]'"
    )
