"""docs/DESIGN.md stays true of the code: what it names exists, what it states holds.

The design document names files (``store/commitlog.py``), modules (``store.commitlog``),
settings with their defaults (``timer.rocks_horizon_ms``), crash points and the one-way
imports between the packages.  These tests read it and check each against the
repository, so moving a file, renaming a setting or changing a default fails here until
the document follows.  Every file that cites the design cites ``docs/DESIGN.md`` and a
section heading that exists.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from chronomq.config import BrokerConfig
from store import crashpoint

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "DESIGN.md"
SELF = Path(__file__).resolve()

# First folders of the repository that a backticked path may start with.
REPO_DIRS = ("store", "timer", "pop", "tiered", "spark", "chronomq", "access", "tests",
             "bench", "scripts", "docs")
PACKAGES = ("store", "timer", "pop", "tiered", "cluster", "spark", "chronomq", "access",
            "tests")
FILE_SUFFIXES = (".py", ".md", ".toml", ".proto")
NOT_A_PATH = set("<>{}*%: =")  # placeholders, globs and settings are not repository paths

# Who may import whom (the layering docs/DESIGN.md "Packages" states).
ALLOWED_IMPORTS = {
    "store": set(),
    "tiered": {"store"},
    "cluster": {"pop", "timer", "recurring", "tiered", "store"},
    "timer": {"tiered", "store"},
    "pop": {"timer", "tiered", "store"},
    "spark": {"tiered", "store"},
    "recurring": {"store"},
    "access": {"tiered", "store"},
    "chronomq": {"pop", "timer", "cluster", "tiered", "store", "spark", "recurring",
                 "access"},
}


def _text() -> str:
    assert DESIGN.is_file(), f"{DESIGN} is missing: the design the code cites lives there"
    return DESIGN.read_text(encoding="utf-8")


def _code_spans(text: str) -> list[str]:
    """Every inline code span outside fenced blocks."""
    inline = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.findall(r"`([^`\n]+)`", inline)


def _repo_paths(spans: list[str]) -> list[str]:
    out = []
    for span in spans:
        if NOT_A_PATH & set(span):
            continue
        first = span.split("/", 1)[0]
        if ("/" in span and first in REPO_DIRS) or ("/" not in span
                                                    and span.endswith(FILE_SUFFIXES)):
            out.append(span)
    return out


def _settings() -> dict[str, object]:
    """``section.key`` -> default of every setting of ``chronomq.config``."""
    out: dict[str, object] = {}
    config = BrokerConfig()
    for section in dataclasses.fields(BrokerConfig):
        value = getattr(config, section.name)
        if dataclasses.is_dataclass(value):
            for f in dataclasses.fields(value):
                out[f"{section.name}.{f.name}"] = getattr(value, f.name)
    return out


def _is_module(dotted: str) -> bool:
    """``a.b`` names a module or package, or ``a.b.NAME`` a name defined in module ``a.b``."""
    parts = dotted.split(".")

    def module_file(names: list[str]) -> Path | None:
        base = ROOT.joinpath(*names)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    if module_file(parts) is not None:
        return True
    owner = module_file(parts[:-1]) if len(parts) > 2 else None
    return owner is not None and re.search(
        rf"^\s*(class |def )?{re.escape(parts[-1])}\b", owner.read_text(encoding="utf-8"),
        flags=re.M) is not None


def _headings(text: str) -> set[str]:
    return {m.strip().lower() for m in re.findall(r"^#+\s+(.+)$", text, flags=re.M)}


def test_every_repository_path_named_exists() -> None:
    # Given the design document's inline code
    paths = _repo_paths(_code_spans(_text()))
    # Then it names many files and folders (a broken pattern would check nothing) ...
    assert len(paths) > 40, paths
    # ... and every one of them exists
    missing = sorted({p for p in paths if not (ROOT / p).exists()})
    assert not missing, f"docs/DESIGN.md names paths that do not exist: {missing}"


def test_every_dotted_name_is_a_module_setting_or_crash_point() -> None:
    settings = _settings()
    dotted = [s for s in _code_spans(_text())
              if re.fullmatch(r"[a-z_]+(\.[A-Za-z_][A-Za-z0-9_]*)+", s)
              and not s.endswith(FILE_SUFFIXES)]
    checked = [s for s in dotted if s.split(".")[0] in PACKAGES or s in settings
               or s.split(".")[0] in {f.name for f in dataclasses.fields(BrokerConfig)}]
    assert len(checked) > 20, checked
    wrong = sorted({s for s in checked if not (s in settings or s in crashpoint.LABELS
                                               or _is_module(s))})
    assert not wrong, ("docs/DESIGN.md names modules or settings that do not exist "
                       f"(a module, a chronomq.config setting or a crash point): {wrong}")


def test_settings_tables_give_the_real_defaults() -> None:
    # Rows "| `section.key` | `default` | ..." state a setting's default.
    settings = _settings()
    rows = re.findall(r"^\|\s*`([a-z_]+\.[a-z_0-9]+)`\s*\|\s*`([^`]+)`", _text(), flags=re.M)
    assert len(rows) >= 10, rows
    wrong = []
    for name, stated in rows:
        real = settings[name]
        if isinstance(real, bool):
            same = stated == str(real).lower()
        elif isinstance(real, int | float):
            same = float(stated.replace("_", "")) == float(real)
        else:
            same = stated.strip('"') == real
        if not same:
            wrong.append(f"{name}: says {stated}, is {real!r}")
    assert not wrong, f"docs/DESIGN.md states wrong defaults: {wrong}"


def test_crash_points_section_lists_every_label() -> None:
    text = _text()
    section = text.split("### Crash points", 1)[1].split("\n#", 1)[0]
    settings = _settings()
    named = {s for s in re.findall(r"`([a-z_]+\.[a-z_]+)`", section)
             if s not in settings and not _is_module(s)}
    assert named == set(crashpoint.LABELS), (
        f"missing: {sorted(set(crashpoint.LABELS) - named)}, "
        f"unknown: {sorted(named - set(crashpoint.LABELS))}")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("package", sorted(ALLOWED_IMPORTS))
def test_packages_import_one_way(package: str) -> None:
    # Given every module of the package (lazy imports inside functions included)
    wrong = []
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = (_imports(path) & set(ALLOWED_IMPORTS)) - ALLOWED_IMPORTS[package] - {package}
        if bad:
            wrong.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    # Then none imports a package above it
    assert not wrong, wrong


def _sources() -> list[Path]:
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any(p.startswith(".") or p in ("node_modules", "__pycache__") for p in rel.parts):
            continue
        if path.is_file() and path.suffix in FILE_SUFFIXES and path not in (DESIGN, SELF):
            out.append(path)
    return out


def test_citations_of_the_design_point_at_docs_design_and_a_real_section() -> None:
    headings = _headings(_text())
    cited = 0
    wrong = []
    for path in _sources():
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in re.finditer(r"(\S*)DESIGN\.md", text):
            where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
            if not m.group(1).endswith("docs/"):
                wrong.append(f"{where}: cites {m.group(0)!r}, not docs/DESIGN.md")
                continue
            cited += 1
            section = re.match(r'[^"\n]{0,20}"([^"]+)"', text[m.end():])
            if section and section.group(1).lower() not in headings:
                wrong.append(f"{where}: section {section.group(1)!r} is not a heading")
    assert not wrong, wrong
    assert cited >= 3, "the code cites the design in at least three places"
