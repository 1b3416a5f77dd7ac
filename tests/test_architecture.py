"""The package's layout is what the code map (doc/codemap.rst) says: layers, no import cycle."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sklearn_linattn"


def _unit(path):
    """The code map's name of a module: a top-level file, or a subpackage as a whole."""
    rel = path.relative_to(PACKAGE)
    return f"{rel.parts[0]}/" if len(rel.parts) > 1 else rel.stem


def _imports():
    """unit -> set of units it imports (at any depth of the module, lazy imports included)."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        unit = _unit(path)
        deps = graph.setdefault(unit, set())
        package = path.relative_to(PACKAGE).parts[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            parts = list(base) + (node.module.split(".") if node.module else [])
            targets = [parts] if node.module else [parts + [a.name] for a in node.names]
            for target in targets:
                if not target:
                    continue
                name = target[0]
                if (PACKAGE / name).is_dir():
                    dep = f"{name}/"
                elif (PACKAGE / f"{name}.py").exists():
                    dep = name
                else:
                    continue
                if dep != unit:
                    deps.add(dep)
    return graph


def _code_map_order():
    text = (ROOT / "doc" / "codemap.rst").read_text()
    table = text[text.index(".. list-table::"): text.index("One ``fit`` call")]
    names = []
    for cell in re.findall(r"^   \* - (.+)$", table, flags=re.M)[1:]:  # skip the header
        names.extend(re.findall(r"``([\w/]+)``", cell))
    return names


def test_no_import_cycle():
    graph = _imports()
    state = {}

    def visit(unit, path):
        state[unit] = "open"
        for dep in sorted(graph.get(unit, ())):
            if state.get(dep) == "open":
                pytest.fail("import cycle: " + " -> ".join(path + [unit, dep]))
            if dep not in state:
                visit(dep, path + [unit])
        state[unit] = "done"

    for unit in sorted(graph):
        if unit not in state:
            visit(unit, [])


def test_code_map_lists_every_module_in_import_order():
    graph = _imports()
    order = _code_map_order()
    modules = set(graph) - {"__init__"}
    assert set(order) == modules, (
        f"doc/codemap.rst lists {sorted(set(order) - modules)} that do not exist and misses "
        f"{sorted(modules - set(order))}"
    )
    rank = {name: i for i, name in enumerate(order)}
    upward = [(unit, dep) for unit in modules for dep in graph[unit]
              if dep in rank and rank[dep] <= rank[unit]]
    assert not upward, f"modules importing from above them in doc/codemap.rst: {sorted(upward)}"


def test_modules_and_classes_stay_small():
    # No module over 900 lines; no class over 350 lines of code (docstrings,
    # comments and blank lines not counted).
    for path in PACKAGE.rglob("*.py"):
        source = path.read_text()
        assert source.count("\n") <= 900, f"{path.relative_to(ROOT)} has over 900 lines"
        lines = source.split("\n")
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ClassDef):
                continue
            numbers = set(range(node.lineno, node.end_lineno + 1))
            for inner in ast.walk(node):
                body = getattr(inner, "body", None)
                if isinstance(inner, (ast.ClassDef, ast.FunctionDef)) and body and isinstance(
                    body[0], ast.Expr
                ) and isinstance(getattr(body[0], "value", None), ast.Constant):
                    numbers -= set(range(body[0].lineno, body[0].end_lineno + 1))
            code = [n for n in numbers if lines[n - 1].strip()
                    and not lines[n - 1].strip().startswith("#")]
            assert len(code) <= 350, (
                f"{path.relative_to(ROOT)}:{node.name} has {len(code)} lines of code"
            )


def test_no_private_name_imported_across_modules():
    # A name with a leading underscore is its module's own; a subpackage's
    # modules may share theirs.  Importing a private module is not a name.
    found = []
    for path in PACKAGE.rglob("*.py"):
        package = path.relative_to(PACKAGE).parts[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            target = list(base) + (node.module.split(".") if node.module else [])
            if package and target[:1] == list(package[:1]):
                continue  # within one subpackage
            for alias in node.names:
                name = alias.name
                is_module = (PACKAGE.joinpath(*target, f"{name}.py").exists()
                             or PACKAGE.joinpath(*target, name).is_dir())
                if name.startswith("_") and not name.startswith("__") and not is_module:
                    found.append(f"{path.relative_to(PACKAGE)}: {'.'.join(target)}.{name}")
    assert not found, f"private names imported across modules: {sorted(found)}"
