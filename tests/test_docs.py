"""The documentation stays readable and connected: no page under docs/ is longer than 800 lines
(a manual that long is two manuals, or a manual with a lab notebook inside it), README.md stays
under 10 kB, and every relative link in docs/ and the README reaches a file that exists and, where
it names one, a heading of that file (the anchors GitHub makes of headings)."""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    found, seen = set(), {}
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


def broken_links(page: Path) -> list[str]:
    bad = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no such heading)")
    return bad


def test_no_page_is_longer_than_800_lines():
    long = {str(p.relative_to(ROOT)): n for p in DOCS.rglob("*.md") if (n := len(p.read_text().splitlines())) > 800}
    assert not long, f"split these pages (a manual, and results in experiments*.md): {long}"


def test_the_readme_is_under_10_kb():
    size = len((ROOT / "README.md").read_bytes())
    assert size < 10_240, f"README.md is {size} bytes: figures belong in docs/, linked from a short table"


def test_every_relative_link_reaches_its_page_and_heading():
    bad = {str(p.relative_to(ROOT)): b for p in PAGES if (b := broken_links(p))}
    assert not bad, bad


def test_anchors_are_githubs():
    """The anchor rule on headings this documentation has: code, punctuation, a repeated heading."""
    assert slug("Run 20: `small` with weight decay on a 128 x 128 mesh") == "run-20-small-with-weight-decay-on-a-128-x-128-mesh"
    assert slug("Measured: hints, the embedding's estimate in the prompt (the sparse world)") == \
        "measured-hints-the-embeddings-estimate-in-the-prompt-the-sparse-world"
    assert slug("The regimes table (`eval --regimes`)") == "the-regimes-table-eval---regimes"


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\n## Same\n\n## Same\n\n```\n# not a heading\n```\n")
    (tmp_path / "b.md").write_text("[ok](a.md#top) [ok](a.md#same-1) [bad](a.md#not-a-heading) "
                                   "[gone](c.md) [web](https://example.org/x#y) [self](#nowhere)\n")
    assert broken_links(tmp_path / "b.md") == ["a.md#not-a-heading (no such heading)", "c.md (no such file)",
                                              "#nowhere (no such heading)"]
