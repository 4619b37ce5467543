"""Every third-party module the project imports is declared in setup.py (install_requires or the test
extra), so a fresh venv that installs `.[test]` runs everything; and the layers import downward only.

Found without importing anything: the import statements of every .py file under verify_attn/, bench/,
integration/, autotune/ and tests/ (SGLang's fetched kernel under tests/sglang_ref/ excluded), read
with `ast`, minus the standard library, the project's own packages and the test helpers. A module that
is only ever imported inside `try: ... except ImportError` (or through importlib) is optional and must be
listed in OPTIONAL with what happens without it.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("verify_attn", "bench", "integration", "autotune", "tests")
LOCAL = {"verify_attn", "bench", "integration", "autotune", "tests", "cases", "conftest", "setup"}
# import name -> distribution name, where they differ
DIST_OF = {"cuda": "cuda-python", "nvidia": "nvidia-cuda-nvdisasm", "yaml": "pyyaml"}
# optional imports (guarded): what the project does without them
OPTIONAL = {
    "sglang": "bench.benchmark.baselines / tests load SGLang's kernel file by path instead, or skip it; "
              "integration.serving.sglang_backend.install() says SGLang is needed",
    "flashinfer": "bench.benchmark.baselines notes that FlashInfer is absent; bench.verify's flashinfer-mla rows say why",
}


def _py_files():
    for top in SCANNED:
        for f in sorted((REPO / top).rglob("*.py")):
            if "sglang_ref" in f.parts or "__pycache__" in f.parts:
                continue
            yield f


def _guarded(node: ast.AST, parents: dict) -> bool:
    """Inside a `try` whose handlers catch ImportError / ModuleNotFoundError / Exception."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Try):
            for h in node.handlers:
                names = [h.type] if not isinstance(h.type, ast.Tuple) else list(h.type.elts)
                if h.type is None or any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError",
                                                                             "Exception") for n in names):
                    return True
    return False


def third_party_imports() -> dict[str, dict[str, list[str]]]:
    """{top-level module: {"required": [files], "guarded": [files]}} of non-stdlib, non-local imports."""
    out: dict[str, dict[str, list[str]]] = {}
    for f in _py_files():
        tree = ast.parse(f.read_text(), str(f))
        parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            else:
                continue
            for m in mods:
                top = m.split(".")[0]
                if top in sys.stdlib_module_names or top in LOCAL or top.startswith("test_") or top == "__future__":
                    continue
                kind = "guarded" if _guarded(node, parents) else "required"
                out.setdefault(top, {"required": [], "guarded": []})[kind].append(str(f.relative_to(REPO)))
    return out


def declared() -> set[str]:
    """Distribution names in setup.py's INSTALL_REQUIRES and EXTRAS_REQUIRE (read with ast, not run)."""
    tree = ast.parse((REPO / "setup.py").read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and \
                node.targets[0].id in ("INSTALL_REQUIRES", "EXTRAS_REQUIRE"):
            value = ast.literal_eval(node.value)
            reqs = value if isinstance(value, list) else [r for rs in value.values() for r in rs]
            names |= {re.split(r"[<>=!;\[ ]", r, maxsplit=1)[0].strip().lower() for r in reqs}
    return names


def test_every_third_party_import_is_declared():
    have = declared()
    assert {"torch", "pytest", "scipy"} <= have, have
    missing = {}
    for mod, where in third_party_imports().items():
        dist = DIST_OF.get(mod, mod).lower().replace("_", "-")
        if dist in have:
            continue
        if not where["required"] and mod in OPTIONAL:
            continue
        missing[mod] = where["required"] or where["guarded"]
    assert not missing, ("imported but not declared in setup.py (INSTALL_REQUIRES / EXTRAS_REQUIRE), or an "
                         f"unguarded optional import: {missing}")


def test_the_scan_sees_what_it_should():
    """The scanner itself: scipy (tests), rich and triton (package) are found; an optional import counts as
    guarded; stdlib and local packages are not reported."""
    found = third_party_imports()
    assert "scipy" in found and "rich" in found and "triton" in found and "torch" in found
    assert not ({"os", "json", "verify_attn", "bench", "cases"} & set(found))
    for mod in OPTIONAL:
        assert not found.get(mod, {}).get("required"), f"{mod} imported unguarded: {found[mod]['required']}"


def test_bench_does_not_import_integration():
    """Layering: the benchmark sits below the decode loop (integration/ may use bench/, not the reverse)."""
    offenders = []
    for f in sorted((REPO / "bench").rglob("*.py")):
        tree = ast.parse(f.read_text(), str(f))
        for node in ast.walk(tree):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            if any(m == "integration" or m.startswith("integration.") for m in mods):
                offenders.append(f"{f.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders


def test_one_cache_rule(monkeypatch, tmp_path):
    """Every cache (emulator builds, build report, cubins, ceilings, autotune) is under one root:
    $VERIFY_ATTN_CACHE, else $XDG_CACHE_HOME/verify_attn, else ~/.cache/verify_attn."""
    from autotune.cache import default_cache_path
    from bench.core import ceilings
    from verify_attn.backends import cuda_emu
    from verify_attn.utils import cache_dir
    monkeypatch.delenv("VERIFY_ATTN_CACHE", raising=False)
    monkeypatch.delenv("VERIFY_ATTN_AUTOTUNE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = tmp_path / "xdg" / "verify_attn"
    assert cache_dir() == root and cuda_emu.cache_root() == root / "emu" and ceilings.cache_dir() == root
    assert default_cache_path() == root / "autotune_cache.json"
    monkeypatch.setenv("VERIFY_ATTN_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine" and cuda_emu.cache_root() == tmp_path / "mine" / "emu"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("VERIFY_ATTN_CACHE")
    assert cache_dir() == Path.home() / ".cache" / "verify_attn"


def test_integration_rooms_import_downward_only():
    """integration/: loop <- planning <- measure; serving stands alone (verify_attn only: it imports no other
    room, and only measure, which measures it, imports it). A module of a room imports nothing of a room above it."""
    rank = {"loop": 0, "planning": 1, "measure": 2}
    offenders = []
    for room in ("loop", "planning", "measure", "serving"):
        for f in sorted((REPO / "integration" / room).glob("*.py")):
            tree = ast.parse(f.read_text(), str(f))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    mod = node.module or ""
                    if node.level == 2:                         # from ..room.x import
                        target = mod.split(".")[0]
                    elif node.level == 0 and mod.startswith("integration."):
                        target = mod.split(".")[1]
                    else:
                        continue
                    up = target in rank and room in rank and rank[target] > rank[room]
                    if room == "serving" or up or (target == "serving" and room not in ("serving", "measure")):
                        offenders.append(f"{f.relative_to(REPO)}:{node.lineno} imports integration.{target}")
    assert not offenders, offenders


def test_integration_command_lines_keep_their_paths(capsys):
    """`python -m integration.<tool>` and `integration.sglang_compat` keep working after the move into rooms."""
    import importlib
    import subprocess
    for mod in ("decode", "probe", "budget", "bench_e2e", "traffic"):
        m = importlib.import_module(f"integration.{mod}")
        with pytest.raises(SystemExit) as e:
            m.main(["--help"])
        assert e.value.code == 0 and "usage" in capsys.readouterr().out, mod
    r = subprocess.run([sys.executable, "-m", "integration.decode", "--help"], capture_output=True, text=True,
                       cwd=REPO, timeout=300)
    assert r.returncode == 0 and "usage: python -m integration.decode" in r.stdout, r.stderr[-500:]
    from integration.sglang_compat import extend_attention_fwd, verify_only   # the README's drop-in import
    assert callable(extend_attention_fwd) and callable(verify_only)


BENCH_COMMANDS = {"verify": "benchmark", "peer_bundle": "benchmark", "ceilings": "core", "gpu_check": "gpu_run",
                  "knockout": "gpu_run", "ncu_probe": "gpu_run", "fp8_accuracy": "studies",
                  "fp8_mma_error": "studies", "emu_sweep": "studies", "overhead": "studies"}


def test_bench_command_lines_keep_their_paths(capsys):
    """`python -m bench.<tool>` and `bash bench/gpu_session.sh` keep working after the move into rooms: the module
    at the old path is the room's module's main (and its public names)."""
    import importlib
    import subprocess
    for mod, room in BENCH_COMMANDS.items():
        old, new = importlib.import_module(f"bench.{mod}"), importlib.import_module(f"bench.{room}.{mod}")
        assert old.main is new.main, mod
        with pytest.raises(SystemExit) as e:
            old.main(["--help"])
        assert e.value.code == 0 and f"usage: python -m bench.{mod}" in capsys.readouterr().out, mod
    for mod in ("verify", "gpu_check"):   # a module and the folder form (bench/gpu_check/__main__.py)
        r = subprocess.run([sys.executable, "-m", f"bench.{mod}", "--help"], capture_output=True, text=True,
                           cwd=REPO, timeout=300)
        assert r.returncode == 0 and f"usage: python -m bench.{mod}" in r.stdout, r.stderr[-500:]
    shim = (REPO / "bench" / "gpu_session.sh").read_text()
    assert 'exec bash "$(dirname "$0")/gpu_run/gpu_session.sh" "$@"' in shim
    assert (REPO / "bench" / "gpu_run" / "gpu_session.sh").is_file()


BENCH_ROOMS = {"core": 0, "model": 1, "benchmark": 2, "gpu_run": 3, "studies": 3}


def _bench_imports(f: Path):
    """(line, bench room or other name imported) of every import of bench in `f`, function-local ones included;
    relative imports resolved against f's package."""
    pkg = f.relative_to(REPO).with_suffix("").parts[:-1]
    tree = ast.parse(f.read_text(), str(f))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(pkg[:len(pkg) - node.level + 1]) if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            # `from bench import x` names a room (or an old path) in x
            mods = [f"{mod}.{a.name}" for a in node.names] if node.module in (None, "bench") or mod == "bench" \
                else [mod]
        else:
            continue
        for m in mods:
            parts = m.split(".")
            if parts[0] == "bench" and len(parts) > 1:
                yield node.lineno, parts[1]


def test_bench_rooms_import_downward_only():
    """bench/: core (what everything measures with) <- model (the SASS model) <- benchmark (bench.verify and what it
    prints) <- gpu_run, studies (beside each other: neither imports the other). A room imports its own modules and
    the rooms below it, by their room path (never the command-line modules kept at bench/<tool>.py). Outside bench:
    verify_attn imports nothing of bench; autotune/ and integration/ only core and model."""
    offenders = []
    for room, rank in BENCH_ROOMS.items():
        for f in sorted((REPO / "bench" / room).rglob("*.py")):
            for line, target in _bench_imports(f):
                if target == room:
                    continue
                if target not in BENCH_ROOMS or BENCH_ROOMS[target] >= rank:
                    offenders.append(f"{f.relative_to(REPO)}:{line} imports bench.{target}")
    allowed = {"verify_attn": set(), "autotune": {"core", "model"}, "integration": {"core", "model"}}
    for top, ok in allowed.items():
        for f in sorted((REPO / top).rglob("*.py")):
            offenders += [f"{f.relative_to(REPO)}:{line} imports bench.{t}" for line, t in _bench_imports(f)
                          if t not in ok]
    assert not offenders, offenders


def test_bench_has_rooms_and_the_command_lines_only():
    """A module directly under bench/ is one of the command lines kept at their old paths; code lives in a room."""
    flat = {f.stem for f in (REPO / "bench").glob("*.py")} - {"__init__"}
    assert flat == set(BENCH_COMMANDS) - {"gpu_check"}, flat ^ (set(BENCH_COMMANDS) - {"gpu_check"})
    folders = {d.name for d in (REPO / "bench").iterdir() if d.is_dir() and (d / "__init__.py").is_file()}
    assert folders == set(BENCH_ROOMS) | {"gpu_check"}, folders


def test_the_bench_layering_scan_sees_an_upward_import(tmp_path, monkeypatch):
    """The scanner on planted files: an upward import (absolute, relative and function-local) and an import of an
    old command-line path are all found; a downward one is not."""
    import tests.test_dependencies as me
    for room in ("core", "benchmark"):
        (tmp_path / "bench" / room).mkdir(parents=True)
    (tmp_path / "bench" / "core" / "bad.py").write_text(
        "from bench.benchmark import verify\nfrom ..model import call\n"
        "def f():\n    import bench.gpu_run.knockout\n    from bench import studies\n    from bench import roofline\n")
    (tmp_path / "bench" / "benchmark" / "good.py").write_text("from bench.core import roofline\nfrom ..model import call\n")
    monkeypatch.setattr(me, "REPO", tmp_path)
    found = sorted(t for _, t in me._bench_imports(tmp_path / "bench" / "core" / "bad.py"))
    assert found == ["benchmark", "gpu_run", "model", "roofline", "studies"], found
    assert sorted(t for _, t in me._bench_imports(tmp_path / "bench" / "benchmark" / "good.py")) == ["core", "model"]
