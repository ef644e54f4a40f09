"""Every exception the package raises to its callers is declared in ``errors.py``."""

from __future__ import annotations

import ast
import builtins
import inspect
import re
from pathlib import Path

import slurm_elastic.errors as errors

PACKAGE = Path(errors.__file__).parent
# Named in errors.py's docstring: presentation of the errors (click) and the HTTP
# handler's private status signal.
ELSEWHERE = {"daemon/commands.py": {"_Error"}, "daemon/api.py": {"_HttpError"}}
DECLARED = {
    name
    for name, value in vars(errors).items()
    if inspect.isclass(value) and issubclass(value, BaseException)
}


def _exception_classes(tree: ast.Module, known: set[str]) -> set[str]:
    """Classes whose base is a builtin exception, a class of ``known``, or one of these."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for base in node.bases:
            name = base.id if isinstance(base, ast.Name) else ast.unparse(base)
            builtin = getattr(builtins, name, None)
            is_builtin_exc = inspect.isclass(builtin) and issubclass(builtin, BaseException)
            if is_builtin_exc or name in known | found or name.endswith("ClickException"):
                found.add(node.name)
    return found


def test_no_exception_class_is_declared_outside_errors_py() -> None:
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "errors.py":
            continue
        classes = _exception_classes(ast.parse(path.read_text()), DECLARED)
        allowed = ELSEWHERE.get(rel, set())
        # Subclasses of an allowed class (CycleFailed of _Error) are allowed with it.
        tree_allowed = _exception_classes(ast.parse(path.read_text()), allowed) | allowed
        stray += [f"{rel}: {name}" for name in sorted(classes - tree_allowed)]
    assert stray == []


def test_the_checker_finds_a_stray_exception() -> None:
    code = (
        "class Mine(SolverError):\n    pass\nclass Other(Mine):\n    pass\nclass Fine:\n    pass\n"
    )
    assert _exception_classes(ast.parse(code), DECLARED) == {"Mine", "Other"}
    assert _exception_classes(ast.parse("class E(ValueError): pass"), set()) == {"E"}


def test_every_error_is_in_the_docstring_tree_and_has_a_docstring() -> None:
    tree = re.findall(r"(?m)^ +(?:[│ ]*[├└]── )?(\w+)\b", errors.__doc__ or "")
    assert set(tree) == DECLARED
    for name in DECLARED:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.SlurmElasticError) and cls.__doc__, name
