"""docs/runs keeps only what the docs cite, under one naming scheme, within its size budget."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs" / "runs"
# <machine>-<date>-<topic>: h100-2026-11-23-turns, h200x2-2026-11-22-devices, 2core-2026-11-23-native
NAME = re.compile(r"^[a-z0-9]+-\d{4}-\d{2}-\d{2}-[a-z0-9-]+$")
CITED = re.compile(r"(?:docs/)?runs/([A-Za-z0-9_.\-]+)")
IN_GIT_HISTORY = "in git at"  # a citation of a file since pruned names the commit that still has it


SKIP_DIRS = {"build", "dist", "node_modules"}  # build outputs; hidden folders (.git) and *.egg-info too


def _docs() -> list[Path]:
    """The repository's Markdown files outside docs/runs, found by walking the tree: the suite also runs from
    a `git archive` tarball, which has no .git."""
    out = []
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x not in SKIP_DIRS
                         and not x.endswith(".egg-info") and Path(d, x) != RUNS)
        out += [Path(d, f) for f in sorted(files) if f.endswith(".md")]
    return sorted(out)


def test_the_docs_found_without_git_are_the_tracked_ones():
    if not (ROOT / ".git").exists():  # a tarball: nothing to compare with, the walk is all there is
        return
    tracked = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    want = sorted(ROOT / f for f in tracked.stdout.split() if not f.startswith("docs/runs/"))
    untracked = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "*.md"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.split()
    assert [p for p in _docs() if str(p.relative_to(ROOT)) not in untracked] == want


def test_every_run_directory_follows_the_naming_scheme():
    bad = [p.name for p in RUNS.iterdir() if not (p.is_dir() and NAME.match(p.name))]
    assert not bad, f"docs/runs entries outside <machine>-<date>-<topic>/: {bad}"


def test_docs_runs_stays_within_600_kib():
    total = sum(p.stat().st_size for p in RUNS.rglob("*") if p.is_file())
    assert total <= 600 * 1024, f"docs/runs holds {total / 1024:.0f} KiB (budget 600): prune what no doc cites"


def test_every_run_directory_is_cited_and_every_citation_exists():
    cited = set()
    for doc in _docs():
        for line in doc.read_text().splitlines():
            for m in CITED.finditer(line):
                if IN_GIT_HISTORY not in line:
                    cited.add(m.group(1))
    present = {p.name for p in RUNS.iterdir()}
    assert cited <= present, f"cited but missing from docs/runs: {sorted(cited - present)}"
    assert present <= cited, f"in docs/runs but cited by no doc: {sorted(present - cited)}"


CITED_FILE = re.compile(r"(?:docs/)?runs/([A-Za-z0-9_.\-]+)/([A-Za-z0-9_.*\-/]+[A-Za-z0-9*])")
# a run folder cited by a short name (`issue5-h100/top.txt`) instead of its path under docs/runs
SHORT_RUN = re.compile(r"`([a-z0-9-]*(?:h100|h200|2core)[a-z0-9-]*)/[^`\s]+`")


def test_every_cited_run_file_exists_and_run_folders_are_cited_by_their_path():
    missing, short = [], []
    for doc in _docs():
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if IN_GIT_HISTORY in line:
                continue
            for m in CITED_FILE.finditer(line):
                if not list((RUNS / m.group(1)).glob(m.group(2))):
                    missing.append(f"{doc.relative_to(ROOT)}:{n}: {m.group(0)}")
            for m in SHORT_RUN.finditer(line):
                if "runs/" not in line[max(0, m.start() - 5):m.start() + 1]:
                    short.append(f"{doc.relative_to(ROOT)}:{n}: {m.group(0)}")
    assert not missing, f"cited run files that do not exist: {missing}"
    assert not short, f"run folders cited by a short name, not docs/runs/<folder>/...: {short}"


FIGURE = re.compile(r"\b\d+\.\d+/\d+\.\d+%|\b[01]\.\d{4}\b")  # a pair's shares (27.7/68.7%), an overhead ratio
RUN_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
# the pages that quote figures the README once quoted (moved there by issue 28)
QUOTING = ("docs/manual.md", "docs/what-works.md")


def test_the_quoted_measured_figures_are_the_measurements():
    """A figure the manual or docs/what-works.md quotes comes from a run docs/measurements.md or docs/compute.md
    records: one source, so the quoting pages cannot drift from it (or from each other)."""
    recorded = (ROOT / "docs" / "measurements.md").read_text() + (ROOT / "docs" / "compute.md").read_text()
    quoted = set()
    for page in QUOTING:
        quoted |= set(FIGURE.findall((ROOT / page).read_text()))
    assert quoted, f"{' and '.join(QUOTING)} quote no figure: the pattern is stale"
    assert not sorted(f for f in quoted if f not in recorded), "quoted figures found in no measurement"


def test_the_readme_quotes_no_run_date_or_measured_figure():
    """The README says what pyvgpu is and how to use it; dated runs and their figures live in docs/."""
    text = (ROOT / "README.md").read_text()
    assert not FIGURE.findall(text), f"README figures belong in docs/: {FIGURE.findall(text)}"
    assert not RUN_DATE.findall(text), f"README run dates belong in docs/: {RUN_DATE.findall(text)}"
    assert len(text.splitlines()) <= 150, "the README is a README: at most 150 lines, the manual is docs/manual.md"


def test_the_architecture_folder_map_names_only_what_exists():
    """docs/architecture.md's "How the layers map to folders" says it describes HEAD: every path it names
    (a folder, or a file of pyvgpu/) exists, so the map cannot silently describe an older tree."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("## How the layers map to folders")
    section = text[start:text.index("\n## ", start + 1)]
    named = re.findall(r"`([A-Za-z0-9_./*-]+)`", section)
    folders = [n for n in named if n.endswith("/")]
    files = [n for n in named if n.endswith(".py") and "*" not in n]
    assert len(folders) >= 8 and len(files) >= 20, "the folder map's pattern is stale"
    missing = [f for f in folders if not (ROOT / f).is_dir() and not (ROOT / "pyvgpu" / f).is_dir()]
    missing += [f for f in files if not any((ROOT / d / f).is_file() for d in (".", "pyvgpu", "scripts"))]
    assert not missing, f"docs/architecture.md's folder map names paths HEAD does not have: {missing}"


LOG = ROOT / "docs" / "measurements.md"  # the one dated log of measurements
DATED_HEADING = re.compile(r"\b20\d\d-\d\d-\d\d\b|\bnight of\b|\blate on\b|\bsession \d\b", re.IGNORECASE)


def _headings(text: str) -> list[tuple[int, str]]:
    """(level, title) of each Markdown heading outside fenced and indented code."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = re.match(r"^(#{1,6}) (.*)", line)
        if m and not fenced:
            out.append((len(m.group(1)), m.group(2).strip()))
    return out


def test_design_pages_hold_no_dated_sections():
    """A design page says how things work, for any date; what a run measured is an entry of the log that the
    page links to (issue 28: no "Night of 2026-11-23" sections)."""
    dated = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page == LOG:
            continue
        dated += [f"{page.name}: {title}" for _, title in _headings(page.read_text()) if DATED_HEADING.search(title)]
    assert not dated, f"dated sections in design pages (move them to docs/measurements.md, link there): {dated}"


def test_the_log_is_one_list_of_dated_entries_newest_first():
    """docs/measurements.md: one `## YYYY-MM-DD` per day, newest first; each entry a `### YYYY-MM-DD ...` of its
    day that names the machine, the commit(s) and the raw files on its first line."""
    heads = _headings(LOG.read_text())
    days = [t for lv, t in heads if lv == 2]
    assert days and all(re.fullmatch(r"20\d\d-\d\d-\d\d", d) for d in days), f"log days not dates: {days}"
    assert days == sorted(days, reverse=True) and len(set(days)) == len(days), f"log days not newest first: {days}"
    day, entries = None, 0
    for lv, title in heads:
        if lv == 2:
            day = title
        elif lv == 3:
            entries += 1
            assert day and title.startswith(day + " "), f"log entry {title!r} is not under its day ({day})"
    assert entries >= len(days)
    text = LOG.read_text()
    for block in re.split(r"\n### ", text)[1:]:
        first = block.split("\n\n", 2)[1] if block.count("\n\n") >= 1 else ""
        assert first.startswith("*Machine, commit, raw:*"), f"log entry without its machine line: {block[:80]!r}"


def _slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


LINK = re.compile(r"\]\(([\w./-]+\.(?:md|png|svg)|)(#[\w-]+)?\)")


def test_links_between_the_docs_and_their_anchors_resolve():
    """Every relative link of the README and docs/ names a file that exists and, with `#anchor`, a heading of
    that file: the design pages link to log entries by anchor, so a renamed entry must fail here."""
    bad = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in LINK.finditer(doc.read_text()):
            target = (doc.parent / m.group(1)).resolve() if m.group(1) else doc
            if not m.group(1) and not m.group(2):
                continue
            if not target.is_file():
                bad.append(f"{doc.relative_to(ROOT)}: {m.group(0)} (no such file)")
            elif m.group(2) and target.suffix == ".md":
                if m.group(2)[1:] not in {_slug(t) for _, t in _headings(target.read_text())}:
                    bad.append(f"{doc.relative_to(ROOT)}: {m.group(0)} (no such heading)")
    assert not bad, f"broken links: {bad}"


CODE_DIRS = ("pyvgpu", "shim/src", "scripts", "tests", ".ci")
CODE_SUFFIXES = {".py", ".c", ".h", ".sh", ".pyx", ""}
DOC_PATH = re.compile(r"\bdocs/[\w./*-]*[\w*]")
# a run's date; not a timestamp a test writes ("2026-01-02 15:04:05", as HAMi's handshake) nor Go's format 2006-01-02
RUN_DATE_IN_CODE = re.compile(r"\b202\d-\d\d-\d\d\b(?![ T]\d\d:\d\d)")
# "seed 4, sections 4-8", "seed 5.3", "seed section 6": the design seeds live outside the repository
NOT_IN_REPO = re.compile(r"(?<![-\w])seed (?:\d+\.\d|\d+,? \(?sections?\b|sections?\b)|\bseeds/", re.IGNORECASE)


def _code_files() -> list[Path]:
    out = []
    for d in CODE_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.is_file() and p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts and p != Path(__file__):
                out.append(p)
    return out


def test_code_cites_only_documents_in_the_repository_and_no_run_dates():
    """Code, scripts and tests cite documents that ship with them (a docs/ path that exists, not "seed 4,
    sections 4-8"), and keep run dates out: measured figures and their dates belong in docs/measurements.md."""
    missing, seeds, dates = [], [], []
    for p in _code_files():
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        rel = p.relative_to(ROOT)
        for n, line in enumerate(text.splitlines(), 1):
            for m in DOC_PATH.finditer(line):
                path = m.group(0).rstrip(".")
                if not ((ROOT / path).exists() or ("*" in path and list(ROOT.glob(path)))):
                    missing.append(f"{rel}:{n}: {path}")
            if NOT_IN_REPO.search(line):
                seeds.append(f"{rel}:{n}")
            if RUN_DATE_IN_CODE.search(line):
                dates.append(f"{rel}:{n}")
    assert not missing, f"code cites docs that do not exist: {missing}"
    assert not seeds, f"code cites the seed documents, which are not in the repository: {seeds}"
    assert not dates, f"run dates in code (they belong in docs/measurements.md): {dates}"


README_INSTALL = "pip install . && pyvgpu doctor"
README_TESTS = "pip install '.[test]' && pytest"
README_QUICK = "pyvgpu wrap --memory 4G python examples/train.py"


def test_the_readme_commands_are_the_ones_ci_and_the_example_use():
    """The README's two commands stay usable as written: the test command is the one `.ci/run` runs, the install
    command names the package root, and the quick start's program is in the repository."""
    readme = (ROOT / "README.md").read_text()
    commands = {line.strip() for line in readme.splitlines() if line.startswith("    ")}
    assert {README_INSTALL, README_TESTS, README_QUICK} <= commands, "the README lost one of its commands"
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert ci[-1] == README_TESTS, f".ci/run no longer runs the README's test command: {ci[-1]!r}"
    assert (ROOT / "pyproject.toml").is_file() and (ROOT / "examples" / "train.py").is_file()


SECTION_CITED = re.compile(r"\b(docs/[\w-]+\.md),\s*(?:(?:#|//|\*)\s*)?\"([^\"\n]+(?:\n\s*(?:#|//|\*)?[^\"\n]*)?)\"")
COMMENT_BREAK = re.compile(r"\s*\n\s*(?:#|//|\*)?\s*")  # a quote that runs on in the next comment line


def test_the_sections_code_cites_are_in_those_docs():
    """`(docs/compute.md, "What a launch under a share costs")` in code names words of that page: a section
    moved to the log or renamed must take its citations along."""
    stale = []
    for p in _code_files():
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        for m in SECTION_CITED.finditer(text):
            doc = ROOT / m.group(1)
            words = COMMENT_BREAK.sub(" ", m.group(2)).lower()
            if doc.is_file() and words not in " ".join(doc.read_text().lower().split()):
                stale.append(f"{p.relative_to(ROOT)}: {m.group(0)}")
    assert not stale, f"code cites sections its docs no longer have: {stale}"


WHOLE_DIR = re.compile(r"(?:docs/)?runs/([A-Za-z0-9_.\-]+)/(?![A-Za-z0-9_.*\-])")  # `docs/runs/<dir>/`: all of it
NAMED = re.compile(r"`([A-Za-z0-9_.*\-/]+\.[A-Za-z0-9]+)`")  # a file named in backticks beside its folder's path


def test_every_raw_file_is_cited():
    """A file in docs/runs is evidence only if a doc cites it: by its path, by its folder cited whole
    (`docs/runs/<dir>/`), or by its name in the paragraph that cites its folder. Unused raw files are pruned."""
    whole, named = set(), set()
    for doc in _docs():
        for para in re.split(r"\n\s*\n", doc.read_text()):
            if IN_GIT_HISTORY in para:
                continue
            dirs = {m.group(1) for m in CITED.finditer(para)}
            whole |= {m.group(1) for m in WHOLE_DIR.finditer(para)}
            named |= {(d, m.group(1)) for d in dirs for m in NAMED.finditer(para)}
            named |= {(m.group(1), m.group(2)) for m in CITED_FILE.finditer(para)}
    uncited = []
    for p in sorted(RUNS.rglob("*")):
        if not p.is_file():
            continue
        d, rest = p.relative_to(RUNS).parts[0], "/".join(p.relative_to(RUNS).parts[1:])
        if d in whole or any(n == d and (fnmatch.fnmatch(rest, f) or fnmatch.fnmatch(p.name, f)
                                         or rest.startswith(f.rstrip("/") + "/")) for n, f in named):
            continue
        uncited.append(str(p.relative_to(RUNS)))
    assert not uncited, f"raw files no doc cites (cite them or remove them): {uncited}"
