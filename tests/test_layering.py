"""The package's shape, checked: lower layers never import higher ones, and nothing above
``stores/`` keeps its own list of store kinds (the config is the authority on its kind)."""

from __future__ import annotations

import ast
from pathlib import Path

import storelab.stores as stores

PKG = Path(stores.__file__).parent.parent
# the layers of the package, low to high (STYLE.md: ops -> stores -> models -> zoo -> experiments -> cli);
# ``allocator``, ``console``, ``outputs`` and ``files`` are neutral (they import nothing of storelab); the top-level
# package is a facade; ``subjects`` (trained models for the report) sits with train, which it calls
RANK = {"ops": 0, "state": 1, "stores": 2, "models": 3, "zoo": 4, "checkpoint": 4, "capacity": 4, "tasks": 4, "text": 4,
        "text_gguf": 4,
        "probes": 5, "train": 5, "bench": 5, "subjects": 5, "report": 6, "options": 7, "commands": 7, "cli": 8, "__main__": 9,
        "docs": 9}  # docs: the generated reference pages read the CLI app and the registries
NEUTRAL = {"allocator", "console", "outputs", "files"}

# Files above stores/ that may name store kinds as data, and why:
NAMES_KINDS = {
    "checkpoint/families": "each family translates the publisher's layer types into our kinds",
    "checkpoint/gguf": "each GGUF architecture translates llama.cpp's layer vocabulary into the publisher's config",
    "bench": "each bench names the peer implementation of the kind it times",
    "commands/bench.py": "the benches' names (gdn, kda, mamba2 are benches of those ops), a command-line vocabulary",
    "report/memory.py": "the essay's own counts per kind (ESSAY_MIX), compared as claims",
    "train/models.py": "the built-in stacks' letters (pattern:KKKA), a command-line vocabulary",
    "train/recall.py": "the recall benchmark's stack names, a command-line vocabulary",
}


def _modules():
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG)
        top = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        yield p, rel, top


def _imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "storelab":
            yield node.module, node.lineno
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "storelab":
                    yield a.name, node.lineno


def test_no_layer_imports_a_higher_one():
    bad = []
    for p, rel, top in _modules():
        if top == "__init__" or top in NEUTRAL:
            continue
        for mod, line in _imports(ast.parse(p.read_text())):
            target = mod.split(".")[1] if "." in mod else ""
            if not target or target in NEUTRAL or target == top:
                continue
            assert top in RANK and target in RANK, f"{rel}: a package without a layer rank: {top} -> {target}"
            if RANK[target] > RANK[top]:
                bad.append(f"{rel}:{line} ({top}) imports {mod} ({target})")
    assert not bad, "\n".join(bad)


def test_console_imports_nothing_of_storelab():
    assert not list(_imports(ast.parse((PKG / "console.py").read_text())))


def _exempt(rel: Path) -> bool:
    s = rel.as_posix()
    return any(s == k or s.startswith(k + "/") for k in NAMES_KINDS)


def _says_kind(node: ast.AST) -> bool:
    """``x.KIND``, ``kind``, ``x.kind``, ``getattr(x, "KIND", ...)``."""
    if isinstance(node, ast.Attribute):
        return node.attr in ("KIND", "kind")
    if isinstance(node, ast.Name):
        return node.id in ("kind", "KIND")
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "getattr":
        return any(isinstance(a, ast.Constant) and a.value in ("KIND", "kind") for a in node.args)
    return False


def test_nothing_above_stores_keeps_a_list_of_kinds():
    kinds = set(stores.REGISTRY)
    bad = []
    for p, rel, top in _modules():
        if RANK.get(top, -1) <= RANK["stores"] or _exempt(rel):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                names = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in kinds]
            elif isinstance(node, ast.Dict):
                names = [k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in kinds]
            elif isinstance(node, ast.Compare) and any(_says_kind(c) for c in (node.left, *node.comparators)):
                # lay.token.KIND == "kda", kind == "mla": one name is enough
                names = [c.value for c in (node.left, *node.comparators) if isinstance(c, ast.Constant)
                         and c.value in kinds] * 2
            else:
                continue
            if len(names) >= 2:
                bad.append(f"{rel}:{node.lineno}: {sorted(set(names))}")
    assert not bad, "kind names above stores/ (ask the config instead):\n" + "\n".join(bad)


def test_the_check_finds_a_kind_list(tmp_path):
    """The scan above is not vacuous: the lists this issue removed would be found."""
    tree = ast.parse('RECURRENT_KINDS = ("linear_attention", "deltanet", "gated_deltanet", "kda")\n'
                     'x = lay.token.KIND == "mla"\n')
    found = [n for n in ast.walk(tree) if isinstance(n, (ast.Tuple, ast.Compare))]
    kinds = set(stores.REGISTRY)
    assert sum(c.value in kinds for c in found[0].elts) == 4
    assert _says_kind(found[1].left) and found[1].comparators[0].value in kinds
