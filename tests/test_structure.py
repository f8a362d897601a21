"""The tree's shape: no import cycle between the project's modules (an import inside a function
counts too: it only hides the cycle), and the engine package never imports the app."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Each project module -> the project modules it imports (anywhere in its body)."""
    files = {module_name(p): p for pkg in ("tinyllm", "tui") for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            found = []
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            deps |= {f for f in found if f in files and f != name and not name.startswith(f + ".")}
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    graph = imports()
    assert "tinyllm.model.c_layers" in graph["tinyllm.model.transformer"]  # (the graph was read)
    assert cycles(graph) == []


def test_a_cycle_is_found_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_engine_never_imports_the_app():
    assert not [(m, d) for m, deps in imports().items() if m.startswith("tinyllm") for d in deps if d.startswith("tui")]


def test_the_views_are_built_by_keyword():
    """The snapshot's views and the app's frame have 5 to 20 fields, several of the same type:
    built by position, a field added in the middle shifts the rest without an error."""
    import dataclasses

    import pytest

    from tinyllm.observe.snapshot import EngineSnapshot, KVView, RequestView, SlotView
    from tui.runners.interface import Frame
    from tui.runners.race import RaceFrame

    for cls in (SlotView, RequestView, KVView, EngineSnapshot, Frame, RaceFrame):
        assert all(f.kw_only for f in dataclasses.fields(cls)), cls.__name__
    with pytest.raises(TypeError):
        KVView("slots", 0, 0, 0, 0)
    kv = KVView.empty("slots", 64, 4)
    assert (kv.kind, kv.reserved_tokens, kv.allocated_tokens, kv.used_tokens, kv.bytes_per_token) == (
        "slots",
        64,
        0,
        0,
        4,
    )
    snap = EngineSnapshot.empty(kv, n_slots=2, max_len=32, policy="priority")
    assert [(s.slot, s.rid, s.capacity) for s in snap.slots] == [(0, None, 32), (1, None, 32)]
    assert (snap.requests, snap.policy, snap.counters.steps) == ((), "priority", 0)


def test_every_parser_takes_whole_option_names():
    """argparse's prefix matching read ``tinyllm whatif --slo`` as ``--slots`` and refused it with
    a message about slots: every parser in the tree is a OneLineParser (which turns it off) or
    says allow_abbrev=False."""
    loose = []
    for path in [p for d in ("tinyllm", "tui", "scripts") for p in (ROOT / d).rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            f = node.func if isinstance(node, ast.Call) else None
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name == "ArgumentParser" and not any(
                k.arg == "allow_abbrev" and isinstance(k.value, ast.Constant) and k.value.value is False
                for k in node.keywords
            ):
                loose.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert loose == []
