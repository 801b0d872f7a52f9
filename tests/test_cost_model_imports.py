"""The cost model's modules import one another without a cycle (top-level and function-level imports alike):
config and memory, in particular, share params.py instead of importing each other."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "ninefold" / "analysis" / "cost_model"


def graph() -> dict:
    mods = {p.stem for p in PKG.glob("*.py") if p.stem != "__init__"}
    out = {}
    for m in mods:
        deps = set()
        for node in ast.walk(ast.parse((PKG / f"{m}.py").read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1 and node.module:
                    deps.add(node.module.split(".")[0])
                elif node.level == 1:
                    deps.update(a.name for a in node.names)
                elif node.module and node.module.startswith("ninefold.analysis.cost_model."):
                    deps.add(node.module.split(".")[3])
        out[m] = deps & mods
    return out


def cycles(g: dict) -> list:
    found, state = [], {}

    def visit(n, path):
        state[n] = 1
        for d in sorted(g[n]):
            if state.get(d) == 1:
                found.append(path[path.index(d):] + [d])
            elif d not in state:
                visit(d, path + [d])
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n, [n])
    return found


def test_no_import_cycle():
    g = graph()
    assert "config" not in g["memory"] or "memory" not in g["config"]
    assert {"params"} <= g["memory"] and "params" in g["config"]
    assert cycles(g) == []


def test_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
