"""The package's dependency graph, from the code's own imports (grimp parses every module,
imports inside functions included): no cycles between fedshift's packages and top-level
modules, method modules reach the engine through ``fedshift.engine.contract`` only, and
evaluation does not import the engine that calls it (issue 23)."""

from __future__ import annotations

from collections import defaultdict

import grimp
import pytest


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("fedshift")


def unit(module: str) -> str:
    """The package or top-level module of ``module``: ``fedshift.engine.runner`` → engine."""
    return ".".join(module.split(".")[:2])


def edges(graph) -> set[tuple[str, str]]:
    return {
        (unit(m), unit(i))
        for m in graph.modules
        for i in graph.find_modules_directly_imported_by(m)
        if unit(m) != unit(i)
    }


def cycles(pairs: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    succ = defaultdict(set)
    for a, b in pairs:
        succ[a].add(b)
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(succ[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted({x for pair in pairs for x in pair}):
        if v not in index:
            visit(v)
    return found


def test_cycles_finds_a_cycle():
    assert cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]


def test_no_cycles_between_packages(graph):
    assert cycles(edges(graph)) == []


def test_methods_import_only_the_contract_from_the_engine(graph):
    methods = [m for m in graph.modules if m.startswith("fedshift.algorithms")]
    reached = {
        (m, i)
        for m in methods
        for i in graph.find_modules_directly_imported_by(m)
        if unit(i) == "fedshift.engine" and i != "fedshift.engine.contract"
    }
    assert reached == set()


def test_evaluation_does_not_import_the_engine(graph):
    assert not any(b == "fedshift.engine" for a, b in edges(graph) if a == "fedshift.eval")


def test_the_engine_does_not_import_methods_or_front_ends(graph):
    above = {
        "fedshift.algorithms",
        "fedshift.api",
        "fedshift.cli",
        "fedshift.jobs",
        "fedshift.reproduce",
    }
    assert {b for a, b in edges(graph) if a == "fedshift.engine"} & above == set()


def test_methods_train_through_the_contexts_train_not_its_trainer():
    """``ctx.train`` is the one entry a method trains through (it flattens nested trees,
    seeds noise, applies update rules); the trainer behind it is the engine's."""
    import ast
    from pathlib import Path

    import fedshift.algorithms as package

    reached = [
        f"{path.name}:{node.lineno}"
        for path in sorted(Path(package.__file__).parent.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "trainer"
    ]
    assert reached == []
