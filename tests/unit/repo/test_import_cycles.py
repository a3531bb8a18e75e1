"""No module of the agent or the lab imports itself back, directly or through others: an
import circle hides which of two modules is the lower one (issue 22 broke the last three).
Imports under TYPE_CHECKING count too: a circle only typing needs is still a circle."""

from __future__ import annotations

import grimp


def cycles(graph: grimp.ImportGraph) -> list[str]:
    """Every import a -> b for which b imports a back (through any chain), as the circle."""
    found = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if imported == importer or imported.startswith(f"{importer}."):
                # a package importing its own module (ebpflb.maglev its C fill, which grimp,
                # reading only Python files, sees as the package itself)
                continue
            if importer.startswith(f"{imported}."):
                continue
            back = graph.find_shortest_chain(
                importer=imported, imported=importer, as_packages=False
            )
            if back:
                found.append(" -> ".join((importer, *back)))
    return found


def test_the_finder_reports_a_circle() -> None:
    graph = grimp.ImportGraph()
    for importer, imported in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        graph.add_import(importer=importer, imported=imported)
    assert cycles(graph) == [
        "p.a -> p.b -> p.c -> p.a",
        "p.b -> p.c -> p.a -> p.b",
        "p.c -> p.a -> p.b -> p.c",
    ]


def test_no_module_level_import_cycles() -> None:
    graph = grimp.build_graph("ebpflb", "lab", cache_dir=None)
    assert cycles(graph) == []
