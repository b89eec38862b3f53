"""The project's docs, specs, docstrings and comments cite only what a reader has (issue 22):

- every ``*.md`` file and every repository path they name exists in the repository;
- markdown links between the docs resolve, anchors included;
- no citation of the private notes the project was first built from (their numbering, "seed 00N",
  may appear only in specs/errata.md, beside the published reference) nor of design documents
  kept outside the repository; published works are cited by their key in specs/references.md.

Scanned: every text file under the project's folders and at its root (Python, Markdown, JavaScript,
TOML, the Makefile, the golden vectors' comments)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("refimpl", "tabular", "specs", "tests", "benchmarks", "tools", "docs", "examples", "mutation",
           "requirements", ".ci")
SUFFIXES = {".py", ".md", ".mjs", ".js", ".toml", ".json", ".txt", ".cfg", ""}
SELF = Path(__file__).resolve()


def project_files() -> list[Path]:
    top = [p for p in ROOT.iterdir() if p.is_file()]
    files = [p for p in top if p.suffix in {".md", ".toml"} or p.name == "Makefile"]
    for folder in FOLDERS:
        base = ROOT / folder
        if base.is_dir():
            files += [p for p in base.rglob("*") if p.is_file() and p.suffix in SUFFIXES
                      and "__pycache__" not in p.parts and ".egg-info" not in str(p)]
    return sorted(f for f in files if f.resolve() != SELF)


FILES = project_files()
TEXT = {f: f.read_text(encoding="utf-8", errors="replace") for f in FILES}


def prose(path: Path, text: str) -> str:
    """What a reader reads as documentation: a Python file's comments and triple-quoted strings
    (other lines blanked, so line numbers stay), any other file whole."""
    if path.suffix != ".py":
        return text
    keep = [""] * (text.count("\n") + 1)
    lines = text.split("\n")
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        triple = tok.type == tokenize.STRING and tok.string.lstrip("rbfuRBFU")[:3] in ('"""', "'''")
        if tok.type == tokenize.COMMENT or triple:
            for n in range(tok.start[0], tok.end[0] + 1):
                keep[n - 1] = lines[n - 1]
    return "\n".join(keep)


PROSE = {f: prose(f, t) for f, t in TEXT.items() if f.suffix != ".json"}  # the vectors: seed check only

# A citation of the private notes: "seed 001", "seeds 000 and 002", "001 (97)", "000's", "003 writes"...
NOTE = "00[0-4]"
SEED_CITATION = re.compile(
    rf"(?i:seeds?[ -]?{NOTE})|(?<![\w.\"']){NOTE}(?:'s\b| \(\d| eq\. \(| sections?\b| \d\.\d| writes| says|"
    rf" prints| defines| and {NOTE}| / {NOTE}|/{NOTE}| names| uses| vs {NOTE})")
OUTSIDE_DOCS = re.compile(r"\b(?:" + "ARCHITECTURE" + "|" + "STYLE" + r")\.md\b")
URL = re.compile(r"[a-z]+://\S+")
MD_NAME = re.compile(r"(?<![\w/.-])((?:\.\./|\./)?[\w./-]*?[\w-]+\.md)(?![\w/])")
PATH = re.compile(r"(?<![\w./-])((?:refimpl|tabular|specs|tests|tools|benchmarks|docs|mutation|requirements|"
                  r"examples|\.ci)/[\w./*<>-]*)")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _where(path: Path, text: str, index: int) -> str:
    return f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, index) + 1}"


def test_the_scan_covers_the_project():
    names = {f.relative_to(ROOT).as_posix() for f in FILES}
    for expected in ("README.md", "specs/references.md", "specs/errata.md", "docs/architecture.md",
                     "refimpl/losses/policy.py", "tests/test_import_rule.py", "specs/vectors/tabular.json"):
        assert expected in names, expected
    assert SEED_CITATION.search("seed 001 (97)") and SEED_CITATION.search("see 001 (97)")
    assert SEED_CITATION.search("as 000's table") and not SEED_CITATION.search("lr 0.001 (default)")
    assert not SEED_CITATION.search('form="001"') and OUTSIDE_DOCS.search("ARCHITECTURE" + ".md")


def test_no_citation_of_the_private_notes_outside_errata():
    found = []
    for path, text in TEXT.items():
        if path == ROOT / "specs" / "errata.md":
            continue
        found += [f"{_where(path, text, m.start())}: {m.group(0)!r}" for m in SEED_CITATION.finditer(text)]
    assert not found, "cite the published work (specs/references.md), not the notes:\n" + "\n".join(found)


def test_no_citation_of_design_documents_outside_the_repository():
    found = [_where(p, t, m.start()) for p, t in PROSE.items() for m in OUTSIDE_DOCS.finditer(t)]
    assert not found, "cite docs/architecture.md instead:\n" + "\n".join(found)


def _md_exists(name: str, citing: Path, basenames: set[str]) -> bool:
    if "/" not in name.lstrip("./"):
        return Path(name).name in basenames
    if any((base / name).exists() for base in (ROOT, citing.parent)):
        return True
    # "vectors/SCHEMA.md" written inside a listing of specs/
    return name.startswith(("vectors/", "frameworks/")) and any(ROOT.rglob(name))


def test_every_cited_markdown_file_exists():
    basenames = {p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts}
    missing = []
    for path, text in PROSE.items():
        text = URL.sub("", text)
        for m in MD_NAME.finditer(text):
            if not _md_exists(m.group(1), path, basenames):
                missing.append(f"{_where(path, text, m.start())}: {m.group(1)}")
    assert not missing, "\n".join(missing)


TABULAR_MODULES = {p.stem for p in (ROOT / "tabular").glob("*.py")}


def _path_exists(raw: str) -> bool:
    path = raw.rstrip(".,:;)`'\"")
    parts = path.split("/")
    if parts[0] == "tabular" and len(parts) > 1 and parts[1].split(".")[0] not in TABULAR_MODULES:
        return True  # a golden-vector id ("tabular/<case>/<quantity>"), not a file
    pattern = re.sub(r"<[^>]*>", "*", path)
    if "*" in pattern:
        return any(ROOT.glob(pattern.rstrip("/")))
    head, _, _ = path.rpartition("/")
    stem = path.split("/")[-1].split(".")[0]
    return ((ROOT / path).exists() or (ROOT / f"{path}.py").exists()  # a module named without .py
            or (ROOT / head / f"{stem}.py").exists()  # "tests/strategies.policy_loss_batches"
            or (path.endswith("_") and any(ROOT.glob(path + "*"))))  # "test_mutation_kills_{a,b}.py"


def test_every_cited_repository_path_exists():
    missing = []
    for path, text in PROSE.items():
        text = URL.sub("", text)
        for m in PATH.finditer(text):
            if not _path_exists(m.group(1)):
                missing.append(f"{_where(path, text, m.start())}: {m.group(1)}")
    assert not missing, "\n".join(missing)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    body = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    return {github_anchor(h) for h in re.findall(r"^#+ (.*)$", body, re.M)}


@pytest.mark.parametrize("doc", [f for f in FILES if f.suffix == ".md" and f.parent.name != "vectors"],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_markdown_links_resolve(doc):
    bad = []
    for m in MD_LINK.finditer(re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)):
        target = m.group(1)
        if URL.match(target) or target.startswith("mailto:"):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no such heading")
    assert not bad, "\n".join(bad)


def test_references_have_unique_keys_and_the_specs_cite_them():
    refs = (ROOT / "specs" / "references.md").read_text()
    keys = re.findall(r"^- \*\*(.+?)\*\*:", refs, re.M)
    assert len(keys) == len(set(keys)) >= 25
    for spec in ("mdp", "estimators", "trust_region", "policy_losses", "advantages", "kl"):
        text = (ROOT / "specs" / f"{spec}.md").read_text()
        assert "references.md" in text, spec
        assert sum(key in text for key in keys) >= 3, spec
