"""The attribution-graph page: drawn by headless Chromium, it shows exactly the nodes and edges that the Python
mirror of its pruning keeps, at any thresholds in the URL, with supernodes merged or not."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import tempfile

import pytest

from interp.viz.graph_page import graph_page, grouped, prune

from .conftest import REPO


def _graph(seed: int = 0):
    rng = random.Random(seed)
    nodes = [{"id": f"emb{p}", "kind": "embedding", "layer": -1, "position": p, "influence": rng.random()}
             for p in range(4)]
    nodes += [{"id": f"f{ly}.{p}.{i}", "kind": "feature", "layer": ly, "position": p, "feature": i,
               "influence": rng.random() ** 3, "activation": rng.random(), "label": f"feature {i} at L{ly}",
               "contexts": [f"ctx <{i}> {ly}", "another </script> context"]}
              for ly in range(3) for p in range(4) for i in range(rng.randint(1, 4))]
    nodes += [{"id": f"err{ly}.{p}", "kind": "error", "layer": ly, "position": p, "influence": rng.random() / 4}
              for ly in range(3) for p in range(4)]
    nodes.append({"id": "target", "kind": "target", "layer": 3, "position": 3, "influence": 0.0})
    ids = [n["id"] for n in nodes]
    rank = {n["id"]: (n["layer"], n["position"]) for n in nodes}
    edges = [(a, b, rng.gauss(0, 1) ** 3) for a in ids for b in ids if rank[a][0] < rank[b][0] and rng.random() < 0.3]
    feats = [n["id"] for n in nodes if n["kind"] == "feature"]
    return nodes, edges, {"early": feats[:3], "late": feats[-3:]}


def _drawn(page: str, fragment: str) -> tuple[int, int, str]:
    sys.path.insert(0, str(REPO / "scripts"))
    from screenshot_report import FLAGS, chromium

    exe = chromium()
    if exe is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium); the graph page check needs a browser")
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/graph.html"
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(page)
        dom = subprocess.run([exe, *FLAGS, f"--user-data-dir={d}/prof", "--dump-dom", f"file://{path}#{fragment}"],
                             capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'id="counts" data-nodes="(\d+)" data-edges="(\d+)"', dom)
    assert m, "the page's script did not run (no counts drawn)"
    assert dom.count('class="node"') == int(m.group(1)) and dom.count('class="edge"') == int(m.group(2))
    return int(m.group(1)), int(m.group(2)), dom


@pytest.mark.parametrize("node,edge,group", [(0.8, 0.98, False), (0.5, 0.7, False), (0.8, 0.98, True),
                                             (1.0, 1.0, True)])
def test_browser_draws_what_the_pruning_keeps(node, edge, group):
    nodes, edges, groups = _graph()
    edges = [(s, t, w, abs(w) * (1 + i % 3)) for i, (s, t, w) in enumerate(edges)]   # scores other than |weight|
    shown, kept = prune(nodes, edges, node, edge)
    if group:
        shown, kept = grouped(shown, kept, groups)
    page = graph_page(nodes, edges, "test graph", tokens=["<s>", "how", "to", "x"], supernodes=groups)
    n, e, _ = _drawn(page, f"node={node}&edge={edge}&group={int(group)}")
    assert (n, e) == (len(shown), len(kept))
    assert 0 < n < len(nodes) or node == 1.0


def test_pruning_keeps_the_smallest_set_covering_the_share():
    """Nodes: the shortest run of the most influential (embeddings and targets aside, always in) that reaches the
    share; with the edge share at 1 every edge between kept nodes stays; a smaller share keeps the top scores."""
    nodes, edges, _ = _graph(1)
    ranked = sorted((n for n in nodes if n["kind"] not in ("target", "embedding")), key=lambda n: -n["influence"])
    total = sum(n["influence"] for n in ranked)
    cum = [sum(n["influence"] for n in ranked[: i + 1]) for i in range(len(ranked))]
    n_keep = next(i + 1 for i, c in enumerate(cum) if c >= 0.6 * total)
    keep = {n["id"] for n in ranked[:n_keep]} | {n["id"] for n in nodes if n["kind"] in ("target", "embedding")}
    shown, kept = prune(nodes, edges, 0.6, 1.0)
    assert {(s, t) for s, t, _ in kept} == {(s, t) for s, t, _ in edges if s in keep and t in keep}
    assert "target" in shown and shown <= keep
    _, fewer = prune(nodes, edges, 0.6, 0.5)
    assert 0 < len(fewer) < len(kept)
    dropped = [abs(e[2]) for e in kept if e not in fewer]
    assert dropped and min(abs(e[2]) for e in fewer) >= max(dropped)
    scored = [(s, t, w, 1.0 / (1 + abs(w))) for s, t, w in edges]      # a score that reverses the weight order
    _, by_score = prune(nodes, scored, 0.6, 0.5)
    assert {e[:2] for e in by_score} != {e[:2] for e in fewer}


def test_clicked_node_shows_its_contexts_escaped():
    nodes, edges, groups = _graph()
    shown, _ = prune(nodes, edges)
    pick = next(i for i in sorted(shown) if i.startswith("f"))
    _, _, dom = _drawn(graph_page(nodes, edges, "t", supernodes=groups), f"select={pick}")
    assert 'id="sel"' in dom and "ctx &lt;" in dom and "&lt;/script&gt;" in dom


def test_bad_input():
    nodes, edges, _ = _graph()
    with pytest.raises(ValueError, match="unique"):
        graph_page(nodes + nodes[:1], edges, "t")
    with pytest.raises(ValueError, match="not in the node list"):
        graph_page(nodes, edges + [("nope", "target", 1.0)], "t")
    with pytest.raises(ValueError, match="kind"):
        graph_page(nodes + [{"id": "z", "kind": "neuron", "layer": 0, "position": 0, "influence": 0}], edges, "t")
    with pytest.raises(ValueError, match="node_threshold"):
        graph_page(nodes, edges, "t", node_threshold=0)
    with pytest.raises(ValueError, match="finite"):
        graph_page(nodes, [(edges[0][0], edges[0][1], float("nan"))], "t")
