"""The docs hold together (no jax import): every relative link in README.md and docs/**/*.md
points to a file that exists; every figure the README's results section quotes has a row in
docs/results.md; the README stays short (at most 220 lines, no table cell over 200
characters)."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
RESULTS = os.path.join(ROOT, "docs", "results.md")

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# a figure: a number with a decimal point, its sign kept (0.903, 0.90, +0.006, −0.015, 4.3e-09)
FIGURE = re.compile(r"(?<![\w.])[+\-−]?\d[\d,]*\.\d+(?:e[+\-−]?\d+)?(?![\w.]*\d)")
RESULTS_HEADING = re.compile(r"^##\s+(results|findings|measured|headline)", re.I)


def markdown_files() -> list[str]:
    docs = glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    return [README] + sorted(docs)


def strip_code(text: str) -> str:
    """The text without fenced code blocks and inline code (links inside them are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def broken_links(path: str) -> list[str]:
    bad = []
    for target in LINK.findall(strip_code(open(path, encoding="utf-8").read())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # http(s), mailto, ...; an anchor on the same page
        file = target.split("#", 1)[0]
        if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(path), file))):
            bad.append(f"{os.path.relpath(path, ROOT)}: {target}")
    return bad


def results_section(text: str) -> list[str]:
    """The README lines under a '## Results'-like heading, up to the next '## '."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith("## "):
            inside = bool(RESULTS_HEADING.match(line))
            continue
        if inside:
            lines.append(line)
    return lines


def figures(text: str) -> set[str]:
    return {f.replace("−", "-") for f in FIGURE.findall(text)}


def unmatched_figures(readme: str, results: str) -> set[str]:
    quoted = figures("\n".join(results_section(readme)))
    return quoted - figures(results)


def table_cells(text: str) -> list[str]:
    cells = []
    for line in strip_fences(text).splitlines():
        if line.lstrip().startswith("|"):
            cells += [c.strip() for c in line.strip().strip("|").split("|")]
    return cells


def strip_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def test_relative_links_resolve():
    bad = [b for path in markdown_files() for b in broken_links(path)]
    assert not bad, "links to files that do not exist:\n" + "\n".join(bad)


def test_readme_results_figures_have_rows_in_results_md():
    readme = open(README, encoding="utf-8").read()
    section = results_section(readme)
    assert section, "README.md has no '## Results' section"
    quoted = figures("\n".join(section))
    assert len(quoted) >= 5, f"the results section quotes too few figures: {sorted(quoted)}"
    missing = unmatched_figures(readme, open(RESULTS, encoding="utf-8").read())
    assert not missing, f"README results figures with no row in docs/results.md: {sorted(missing)}"


def test_readme_is_short():
    text = open(README, encoding="utf-8").read()
    n = len(text.splitlines())
    assert n <= 220, f"README.md has {n} lines (at most 220)"
    long = [c[:80] for c in table_cells(text) if len(c) > 200]
    assert not long, f"README table cells over 200 characters: {long}"


def test_the_checks_catch_what_they_should(tmp_path):
    """Each check fails on a broken input: a dead link, a figure with no row, a long cell."""
    page = tmp_path / "p.md"
    (tmp_path / "there.md").write_text("x")
    page.write_text("[ok](there.md#a) [web](https://x.org/y.md) [self](#top) `[code](nope.md)`\n"
                    "[dead](nope.md) ![img](gone.png)\n")
    assert [b.split(": ")[1] for b in broken_links(str(page))] == ["nope.md", "gone.png"]
    readme = "## Results\n| a | +0.006, p = 0.28 |\n| b | 0.903 |\n## Layout\n1.25\n"
    assert unmatched_figures(readme, "+0.006 p = 0.28 and 0.903") == set()
    assert unmatched_figures(readme, "+0.006 p = 0.28 and 0.9031") == {"0.903"}
    assert unmatched_figures(readme, "0.006 p = 0.28 0.903") == {"+0.006"}
    assert max(map(len, table_cells("| " + "x" * 201 + " | y |\n"))) == 201
