"""The documentation against what it documents: the `--help` blocks copied into docs/ against the
programs' own --help, every relative link and #anchor of the README, docs/ and bench/results/README.md,
the front page's length, and the two indexes (docs/README.md, bench/results/README.md) against the
files they index. The Makefile line that docs/setup.md quotes is checked in test_makefile.py.
"""

import difflib
import os
import re
import subprocess
import tempfile
import unittest
from pathlib import Path

from tests.python import REPO

DOCS = REPO / "docs"
RESULTS = REPO / "bench" / "results"
FRONT_PAGE_MAX_LINES = 300  # issue 38: the README is a front page
# The programs whose --help is copied into the docs, and the page each is copied into.
HELP_PAGES = {"train": DOCS / "train.md", "predict": DOCS / "predict.md"}
# --workers' default is computed from the cores of the machine that prints it: compared without the number.
WORKERS_DEFAULT = re.compile(r"\[default: \d+ \(min\(cores - 1, 8\)\)\]")


def normalised(help_text):
    """The help with what depends on the machine as the pages write it: the --workers default (the
    core count) and the repository the program was built in (default paths under it)."""
    return WORKERS_DEFAULT.sub("[default: N (min(cores - 1, 8))]", help_text).replace(f"{REPO}/", "<repository>/")


def markdown_files():
    return [REPO / "README.md", *sorted(DOCS.glob("*.md")), *sorted(RESULTS.glob("*.md"))]


def fenced_blocks(text):
    """The contents of every ``` fenced block, in order."""
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)


def usage_blocks(text, program):
    return [b for b in fenced_blocks(text) if b.startswith(f"usage: {program} ")]


def github_anchors(text):
    """The #anchors GitHub gives the headings of a Markdown file (outside fenced blocks): lower case,
    everything but letters, digits, spaces, hyphens and underscores dropped, spaces made hyphens, and a
    repeated anchor suffixed -1, -2, ..."""
    anchors, seen, fenced = set(), {}, False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"#{1,6} +(.*?) *#*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def relative_links(text):
    """(target, anchor) of every Markdown link outside fenced blocks and inline code that is not a URL."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        yield path, anchor


class HelpBlocks(unittest.TestCase):
    """Each program's --help is copied verbatim into its page; a flag added, renamed or reworded in the
    program without the page (or the reverse) fails here."""

    def test_every_copied_help_block_is_the_programs_help(self):
        for program, page in HELP_PAGES.items():
            with self.subTest(program):
                binary = REPO / "bin" / program
                if not binary.exists():
                    self.skipTest(f"{binary} is not built (make bin/{program})")
                with tempfile.TemporaryDirectory() as scratch:  # nothing it might write lands in the tree
                    p = subprocess.run([str(binary), "--help"], cwd=scratch, capture_output=True, text=True,
                                       timeout=60, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
                self.assertEqual(p.returncode, 0, p.stderr)
                actual = normalised(p.stdout)
                copies = {f: usage_blocks(f.read_text(), program) for f in markdown_files()}
                self.assertEqual(len(copies[page]), 1, f"{page.relative_to(REPO)} holds one copy of {program} --help")
                for f, blocks in copies.items():
                    for block in blocks:
                        diff = "".join(difflib.unified_diff(normalised(block).splitlines(True), actual.splitlines(True),
                                                            f"{f.relative_to(REPO)}", f"bin/{program} --help"))
                        if diff:
                            self.fail(f"the copy of `{program} --help` in {f.relative_to(REPO)} differs from the "
                                      f"program's; copy its output into the page:\n{diff}")

    def test_only_the_workers_default_is_left_out_of_the_comparison(self):
        line = "  --workers N           loader threads of the pinned loader [default: {} (min(cores - 1, 8))]"
        self.assertEqual(normalised(line.format(1)), normalised(line.format(15)))
        self.assertNotEqual(normalised(line.format(1)), normalised(line.format(1).replace("loader threads", "threads")))


class Links(unittest.TestCase):
    def test_every_relative_link_and_anchor_resolves(self):
        broken = []
        for f in markdown_files():
            text = f.read_text()
            for path, anchor in relative_links(text):
                target = (f.parent / path).resolve() if path else f
                if not target.exists():
                    broken.append(f"{f.relative_to(REPO)}: {path} does not exist")
                elif anchor and target.suffix == ".md" and anchor not in github_anchors(target.read_text()):
                    broken.append(f"{f.relative_to(REPO)}: {path}#{anchor}: no such heading")
        self.assertEqual(broken, [])

    def test_anchors_are_made_as_github_makes_them(self):
        self.assertEqual(github_anchors("## The built-in timeline: `--trace FILE.json`\n# x\n# x\n"),
                         {"the-built-in-timeline---trace-filejson", "x", "x-1"})
        self.assertEqual(github_anchors("```\n# a comment in a block\n```\n"), set())


class FrontPage(unittest.TestCase):
    def test_the_readme_is_a_front_page(self):
        lines = (REPO / "README.md").read_text().splitlines()
        self.assertLessEqual(len(lines), FRONT_PAGE_MAX_LINES, "usage and internals belong in docs/")

    def test_the_docs_index_names_every_page(self):
        index = (DOCS / "README.md").read_text()
        linked = {path for path, _ in relative_links(index)}
        missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "README.md" and p.name not in linked]
        self.assertEqual(missing, [], "docs/README.md links every page of docs/")


class ResultsIndex(unittest.TestCase):
    """bench/results/README.md has a row for every file there. A name written `.csv` after a full name
    stands for that name with another extension (`x.md`, `.csv`: x.md and x.csv)."""

    EXTENSIONS = r"(md|csv|png|jsonl|json|diff)"  # what a results file may be

    def indexed(self):
        names, stem = set(), None
        for token in re.findall(r"`([^`\s]+)`", (RESULTS / "README.md").read_text()):
            if re.fullmatch(r"[\w.-]+\." + self.EXTENSIONS, token) and not token.startswith("."):
                names.add(token)
                stem = token.rsplit(".", 1)[0]
            elif re.fullmatch(r"\." + self.EXTENSIONS, token) and stem:
                names.add(stem + token)
        return names

    def test_every_results_file_is_indexed(self):
        files = {p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "README.md"}
        self.assertEqual(sorted(files - self.indexed()), [], "add a row to bench/results/README.md")

    def test_every_indexed_file_exists(self):
        files = {p.name for p in RESULTS.iterdir() if p.is_file()}
        self.assertEqual(sorted(self.indexed() - files), [])


if __name__ == "__main__":
    unittest.main()
