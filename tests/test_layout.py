"""Issue 24: one table per concept. The precision names live in ``tasks/precisions.py`` and the
targets (names, soc_model / htp_arch numbers, the default) in ``tasks/targets.py``; no other
module of the package writes them in code (docstrings and comments may name them)."""
import ast

from conftest import REPO

from tasks.precisions import NAMES
from tasks.targets import DEFAULT_TARGET, TARGETS


def _code_constants(f):
    """(line, value) of every constant in ``f``'s code, docstrings left out."""
    tree = ast.parse(f.read_text(encoding="utf-8"))
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in docs]


def _modules(*skip):
    return [f for f in sorted((REPO / "tasks").rglob("*.py")) if f.relative_to(REPO / "tasks").as_posix() not in skip]


def test_precision_names_are_written_once():
    found = [(f.relative_to(REPO).as_posix(), line, v) for f in _modules("precisions.py")
             for line, v in _code_constants(f) if isinstance(v, str) and v in NAMES]
    assert found == [], found
    assert NAMES == ("w8a16", "w4a16", "w8a8")


def test_target_names_and_numbers_are_written_once():
    names = set(TARGETS) | {DEFAULT_TARGET}
    found = []
    for f in _modules("targets.py"):
        consts = _code_constants(f)
        found += [(f.relative_to(REPO).as_posix(), line, v) for line, v in consts if isinstance(v, str) and v in names]
        # the target travels by name: no function takes soc_model / htp_arch numbers (the LLM
        # helpers did, with defaults 60 / 73 written four times)
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and node.arg in ("soc_model", "htp_arch"):
                found.append((f.relative_to(REPO).as_posix(), node.lineno, node.arg))
    assert found == [], found
