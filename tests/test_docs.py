"""The docs can't drift: the CRD reference pages are what ``hack/crdref.py`` generates from
``deploy/crds/``; the hand-written field prose names exactly the fields the CRDs have; the
README stays a short front door whose links resolve and whose intro and three paths the site
includes; and ``mkdocs build --strict`` fails on a broken internal link."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.conftest import in_ci

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"


def _crdref() -> ModuleType:
    """hack/crdref.py, imported from its file (hack/ is not a package)."""
    spec = importlib.util.spec_from_file_location("crdref", REPO / "hack" / "crdref.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["crdref"] = module
    spec.loader.exec_module(module)
    return module


crdref = _crdref()


# --- the generated CRD reference ------------------------------------------------------------


def test_the_crd_reference_pages_are_what_the_crds_generate() -> None:
    assert crdref.stale() == [], "run: python hack/crdref.py"
    assert sorted(crdref.pages()) == ["imageplatformcatalog.md", "podplacementconfig.md",
                                      "podplacementpolicy.md"]


def test_a_crd_changed_without_regenerating_leaves_its_page_stale(tmp_path: Path) -> None:
    crds, ref = tmp_path / "crds", tmp_path / "reference"
    shutil.copytree(REPO / "deploy" / "crds", crds)
    shutil.copytree(DOCS / "reference", ref, symlinks=True)
    assert crdref.stale(ref, crds) == []
    path = crds / "podplacementpolicy.yaml"
    crd = yaml.safe_load(path.read_text())
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props["properties"]["priority"]["maximum"] = 100
    path.write_text(yaml.safe_dump(crd))
    assert crdref.stale(ref, crds) == ["podplacementpolicy.md"]
    assert "| `spec.priority` | integer (int32) |  | required; 0..100 |" in (
        crdref.pages(crds)["podplacementpolicy.md"])


def _row(page: str, field: str) -> str:
    (row,) = [line for line in page.splitlines() if line.startswith(f"| `{field}` |")]
    return row


def test_a_row_gives_the_type_default_constraints_and_description_of_the_schema() -> None:
    page = crdref.pages()["podplacementconfig.md"]
    budget = _row(page, "spec.admission.inspectionBudget")
    assert "| string | `300ms` |" in budget and "at most 32 characters" in budget
    assert "rule `duration(self) <= duration('4s')`: must be at most 4s" in budget
    assert "before it leaves the pod gated for the controller" in budget
    assert "| integer (int32) | `16` | 1..100 |" in _row(page, "spec.topology.maxCandidateNodes")
    weights = _row(page, "spec.plugins.nodeAffinityScoring.platforms")
    assert "at most 4 items; a map list keyed by `architecture`: one item per key" in weights
    oses = _row(page, "spec.fallbackOperatingSystems")
    assert '`["linux"]`' in oses and "each item: one of `linux`, `windows`" in oses
    # a pipe inside a cell never splits the row (GitHub and MkDocs)
    ttl = _row(page, "spec.imageInspection.cacheTTL")
    assert len(re.findall(r"(?<!\\)\|", ttl)) == 6, ttl
    assert "self.metadata.name == 'cluster'" in page


def _prose_fields(page: Path) -> set[str]:
    """The field paths in the first column of a page's ``| field | meaning |`` table."""
    fields: set[str] = set()
    in_table = False
    for line in page.read_text().splitlines():
        if line.startswith("| field | meaning |"):
            in_table = True
        elif in_table and line.startswith("| `"):
            # status.conditions[Accepted]: one condition; platforms[]: the list itself
            fields.add(re.sub(r"\[[A-Z]\w*\]|\[\]$", "", line.split("`")[1]))
        elif not line.startswith("|"):
            in_table = False
    return fields


@pytest.mark.parametrize(("guide", "crd"), [
    ("guide/configuration.md", "podplacementconfig.yaml"),
    ("guide/policies.md", "podplacementpolicy.yaml"),
])
def test_the_field_prose_names_exactly_the_fields_of_the_crd(guide: str, crd: str) -> None:
    prose = _prose_fields(DOCS / guide)
    schema = set(crdref.field_paths(yaml.safe_load((REPO / "deploy" / "crds" / crd).read_text())))
    assert prose, guide
    # every field the prose names exists (metadata.name: the object's CEL rule)
    assert prose - schema - {"metadata.name"} == set()
    # every field of spec is described: itself, through a field above it, or (a group such as
    # spec.admission) through the fields below it
    def related(path: str, field: str) -> bool:
        return any(a == b or a.startswith((b + ".", b + "[]")) for a, b in
                   ((path, field), (field, path)))

    undescribed = [path for path in schema if path.startswith("spec.") and not any(
        related(path, field) for field in prose)]
    assert undescribed == [], f"{guide} says nothing of {undescribed}"


# --- the README, the front door -------------------------------------------------------------


def test_the_readme_is_a_short_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings == ["Three paths", "Quick start", "Install", "Documentation"], headings
    quick = text.split("## Quick start", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in quick.splitlines()] == [
        "bash hack/demo.sh", "bash hack/test.sh"]
    install = text.split("## Install", 1)[1]
    for command in ("kubectl apply -k deploy/",
                    "kubectl create -f deploy/samples/podplacementconfig.yaml"):
        assert command in install


def _slug(heading: str) -> str:
    """A heading's anchor, as GitHub and MkDocs' toc make it for our headings."""
    text = re.sub(r"<[^>]+>", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_every_relative_link_of_the_readme_resolves() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    relative = [link for link in links if "://" not in link]
    assert len(relative) >= 20, relative
    for link in relative:
        target, _, anchor = link.partition("#")
        path = REPO / target
        assert path.exists(), f"README links to {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
            assert anchor in {_slug(h) for h in headings}, f"README links to {link}"
    # every page of the site is one link away from the front door
    pages = {str(p.relative_to(REPO)) for p in DOCS.rglob("*.md")}
    linked = {link.partition("#")[0] for link in relative}
    assert pages - linked - {"docs/index.md", "docs/changelog.md", "docs/reference/deploy.md"} \
        == set()


def test_the_site_home_includes_the_readme_intro_and_three_paths() -> None:
    readme, home = README.read_text(), (DOCS / "index.md").read_text()
    for section in ("intro", "paths"):
        assert f'--8<-- "README.md:{section}"' in home
        start = f"<!-- --8<-- [start:{section}] -->"
        end = f"<!-- --8<-- [end:{section}] -->"
        assert readme.count(start) == 1 and readme.count(end) == 1, section
        body = readme.split(start, 1)[1].split(end, 1)[0]
        # the included text is read relative to docs/: it must not link
        assert "](" not in body, f"README section {section} has a link the site cannot follow"
    paths = readme.split("[start:paths]", 1)[1]
    assert "podplacement-gate" in paths and "ImagePlatformCatalog" in paths
    assert "inspectionBudget" in paths and "one PATCH" in paths


# --- mkdocs build --strict ------------------------------------------------------------------


def _mkdocs() -> str:
    found = shutil.which("mkdocs")
    if found is None:
        message = "mkdocs not found (the test extra installs mkdocs and mkdocs-material)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return found


def _site_copy(tmp_path: Path) -> Path:
    """The site's sources (mkdocs.yml, README.md, docs/ with its links resolved)."""
    root = tmp_path / "src"
    root.mkdir()
    shutil.copy(REPO / "mkdocs.yml", root)
    shutil.copy(README, root)
    shutil.copytree(DOCS, root / "docs")
    return root


def _build(mkdocs: str, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([mkdocs, "build", "--strict", "-d", str(root.parent / "site")],
                          cwd=root, capture_output=True, text=True, timeout=120, check=False,
                          env={"PATH": str(Path(mkdocs).parent) + ":/usr/bin:/bin",
                               "NO_MKDOCS_2_WARNING": "1", "HOME": str(root.parent)})


@pytest.mark.parametrize(("page", "old", "new", "named"), [
    ("guide/install.md", "](../reference/deploy.md)", "](../reference/nowhere.md)",
     "nowhere.md"),
    ("runbooks.md", "](#podplacementnoleader)", "](#podplacement-no-leader)",
     "podplacement-no-leader"),
])
def test_mkdocs_strict_fails_on_a_broken_internal_link(
        tmp_path: Path, page: str, old: str, new: str, named: str) -> None:
    mkdocs = _mkdocs()
    root = _site_copy(tmp_path)
    target = root / "docs" / page
    text = target.read_text()
    assert old in text
    target.write_text(text.replace(old, new, 1))
    proc = _build(mkdocs, root)
    assert proc.returncode != 0, proc.stderr
    output = proc.stdout + proc.stderr
    assert named in output and "strict mode" in output, output


def test_mkdocs_strict_builds_the_site(tmp_path: Path) -> None:
    mkdocs = _mkdocs()
    proc = _build(mkdocs, _site_copy(tmp_path))
    assert proc.returncode == 0, proc.stderr
    home = (tmp_path / "site" / "index.html").read_text()
    assert "MutatingAdmissionPolicy podplacement-gate" in home  # the README's paths, included


# --- the generated predicate table ------------------------------------------------------------


def _predicatesdoc() -> ModuleType:
    """hack/predicatesdoc.py, imported from its file (hack/ is not a package)."""
    spec = importlib.util.spec_from_file_location("predicatesdoc",
                                                  REPO / "hack" / "predicatesdoc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["predicatesdoc"] = module
    spec.loader.exec_module(module)
    return module


def test_how_it_decides_lists_every_predicate_as_the_table_has_it() -> None:
    """docs/how-it-decides.md's predicate section is what hack/predicatesdoc.py renders from
    rules/admit/predicates.py: every entry by name, with its Python and its CEL."""
    from podplacement.rules.admit.predicates import PREDICATES

    predicatesdoc = _predicatesdoc()
    page = (DOCS / "how-it-decides.md").read_text()
    assert predicatesdoc.rewritten(page) == page, "run: python hack/predicatesdoc.py"
    section = page[page.index(predicatesdoc.BEGIN):page.index(predicatesdoc.END)]
    inputs = predicatesdoc.Inputs()
    for predicate in PREDICATES:
        assert f"- **`{predicate.name}`**:" in section
        assert f"    {predicate.cel(inputs)}\n" in section
    assert predicatesdoc.main(["--check"]) == 0
    with pytest.raises(predicatesdoc.PageError):
        predicatesdoc.rewritten(page.replace(predicatesdoc.END, ""))


_CONFLICT = re.compile(r"^(<{7} |={7}$|>{7} )", re.MULTILINE)
_TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".toml", ".sh", ".cfg", ".json", ".txt"}
_SKIP_DIRS = {".git", ".venv", "build", "node_modules", "__pycache__", "site", ".demo-cache"}


def test_no_merge_conflict_markers_are_left_in_the_source() -> None:
    """A merge resolved in one file but committed with markers in another renders as text
    (mkdocs and the linters accept it): look for the markers themselves."""
    found = []
    for path in REPO.rglob("*"):
        if (path.suffix not in _TEXT_SUFFIXES and path.name != ".importlinter") \
                or any(part in _SKIP_DIRS or part.endswith(".egg-info")
                       for part in path.relative_to(REPO).parts) \
                or path.is_symlink() or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        found += [f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}"
                  for m in _CONFLICT.finditer(text)]
    assert not found, found


# --- the threat model's table ---------------------------------------------------------------

_TEST_REF = re.compile(r"`(tests/[\w/]+\.py)((?:::\w+)?)`((?:, `::\w+`)*)")


def _threat_model_refs(text: str) -> list[tuple[str, str]]:
    """``(file, test name or "")`` for every test a table cell of docs/security.md names:
    ``tests/x.py``, ``tests/x.py::name`` and the ``::other`` names that follow it."""
    refs: list[tuple[str, str]] = []
    for m in _TEST_REF.finditer(text):
        names = [m.group(2)[2:]] if m.group(2) else [""]
        names += re.findall(r"::(\w+)", m.group(3))
        refs += [(m.group(1), n) for n in names]
    return refs


def test_every_test_the_threat_model_names_exists() -> None:
    """docs/security.md's table says, per input, which test fails without its check; a
    renamed or removed test must take its row along (the hook before every stop asks for
    the table to stay true)."""
    refs = _threat_model_refs((DOCS / "security.md").read_text())
    assert len(refs) >= 40, refs
    missing = []
    for file, name in refs:
        path = REPO / file
        if not path.is_file():
            missing.append(file)
        elif name and not re.search(rf"^(async )?def {name}\(", path.read_text(), re.M):
            missing.append(f"{file}::{name}")
    assert not missing, missing


def test_the_threat_model_check_sees_a_test_that_is_gone() -> None:
    refs = _threat_model_refs("| x | y | z | `tests/test_docs.py::no_such_test`, `::nor_this` |")
    assert refs == [("tests/test_docs.py", "no_such_test"), ("tests/test_docs.py", "nor_this")]
    assert not re.search(r"^def no_such_test\(", (REPO / "tests/test_docs.py").read_text(), re.M)


# --- docs/design.md: the layout names real files ----------------------------------------------


def _section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of ``text`` (up to the next ``## ``)."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def test_design_where_to_add_names_files_that_exist() -> None:
    """Every path of "Where to add" in docs/design.md is a file of the tree, and it names the
    four things a newcomer adds (a predicate, a config field, an auth kind, an admission
    stage)."""
    body = _section((DOCS / "design.md").read_text(), "Where to add")
    for thing in ("A predicate", "A config field", "An auth kind", "An admission stage"):
        assert f"**{thing}**" in body
    paths = sorted(set(re.findall(r"`([\w./-]+\.(?:py|yaml|md))`", body)))
    assert len(paths) >= 15, paths
    missing = [p for p in paths if not (REPO / p).is_file()]
    assert not missing, f"docs/design.md, Where to add: no such file {missing}"


def test_design_layout_names_the_rooms_of_rules() -> None:
    """The layout table of docs/design.md has one row per room of ``rules/`` and names every
    module of each room; every room it names is a package of the tree."""
    body = _section((DOCS / "design.md").read_text(), "Layout (top level, as the product's "
                    "design card asks)")
    rooms = re.findall(r"^\| `rules/(\w+)/` \| ([^|]*) \|", body, re.MULTILINE)
    assert {r for r, _ in rooms} == {"place", "admit", "monitor"}
    for room, job in rooms:
        package = REPO / "rules" / room
        assert (package / "__init__.py").is_file()
        modules = {p.stem for p in package.glob("*.py")} - {"__init__"}
        named = set(re.findall(r"`(\w+)`", job))
        assert modules <= named, f"rules/{room}/: {sorted(modules - named)} not in the table"
