"""The layers point down (DESIGN.md): cli -> report -> bench, arena -> the library; inside the
library nn, hf, distributed -> attention, linear, losses, sampling, scores, ops -> registry and
normalizers -> kernels (leaves). Every import statement in src/ is read, including the ones
inside functions, and checked against these contracts."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "softmaxkit"

MEASURING = ("bench", "arena", "report", "cli", "__main__")
TOP = ("nn", "hf", "distributed")
MIDDLE = ("attention", "linear", "losses", "sampling", "scores", "ops")
CORE = ("normalizers", "registry", "forms", "functional", "_checks", "_rows", "algorithms", "_table")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> list[str]:
    """Absolute names of the softmaxkit modules ``path`` imports (anywhere in the file)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append(target)
            found += [f"{target}.{a.name}" for a in node.names]
    return [f for f in found if f == "softmaxkit" or f.startswith("softmaxkit.")]


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _sources():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def _violations(allowed) -> list[str]:
    bad = []
    for path in _sources():
        module = _module_name(path)
        for target in _imports(path):
            why = allowed(_layer(module), module, _layer(target), target)
            if why:
                bad.append(f"{module} imports {target}: {why}")
    return bad


def test_the_library_never_imports_the_measuring_code():
    def rule(layer, module, target_layer, target):
        if layer not in MEASURING and target_layer in MEASURING:
            return "bench, arena, report and cli are never imported by the library"
        return None
    assert not _violations(rule)


def test_kernels_are_leaves():
    def rule(layer, module, target_layer, target):
        if layer == "kernels" and target_layer not in ("kernels", "_checks", ""):
            return "kernels import only kernels and _checks (a kernel flags rows it cannot do; dispatch falls back)"
        return None
    assert not _violations(rule)


def test_normalizers_and_registry_point_down_only():
    def rule(layer, module, target_layer, target):
        if layer in CORE and target_layer in TOP + MIDDLE:
            return f"the core ({', '.join(CORE)}) never imports {target_layer}"
        return None
    assert not _violations(rule)


def test_middle_layers_never_import_modules_or_integrations():
    def rule(layer, module, target_layer, target):
        if layer in MIDDLE and target_layer in TOP:
            return f"{layer} is below nn, hf and distributed"
        return None
    assert not _violations(rule)


def test_the_contract_checker_sees_relative_imports():
    fake = PACKAGE / "attention" / "api.py"
    names = _imports(fake)
    assert "softmaxkit.registry" in names and "softmaxkit.attention.dense" in names


@pytest.mark.parametrize("layer", TOP + MIDDLE + CORE + ("kernels",))
def test_every_named_layer_exists(layer):
    assert (PACKAGE / layer).is_dir() or (PACKAGE / f"{layer}.py").is_file() or layer in ("linear", "distributed")
