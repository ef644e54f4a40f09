"""The documentation holds together: a short README, links that resolve, commands that exist.

README.md is the front door (at most 250 lines, issue 15); the rest lives under docs/. A
link to a file or heading that moved is a broken promise to the reader, so every relative
link in README.md, CONTRIBUTING.md and docs/*.md must name an existing file and, where it
has an anchor, a heading of that file. The README's shell commands must name make targets,
files and ``slurm-elastic`` subcommands and options that exist.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_elastic.cli import cli

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = [README, REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 250

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^()\s]+)\)")
INLINE_CODE = re.compile(r"`[^`]*`")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a link inside a code block is not a link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 for repeated ones."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose_lines(path.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    """``file: target (why)`` for each relative link of ``path`` that does not resolve."""
    broken = []
    for line in prose_lines(path.read_text()):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:, file:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                broken.append(f"{path.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{path.name}: {target} (no such heading)")
    return broken


def test_readme_is_a_short_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text(
        "# Other\n\n## A `code` heading (v2.0)\n\n## Twice\n\n## Twice\n"
    )
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[ok](other.md) [ok](other.md#a-code-heading-v20) [ok](other.md#twice-1) [ok](#page)\n"
        "[gone](missing.md) [bad anchor](other.md#nope) [self](#nowhere)\n"
        "`[in code](missing-too.md)`\n\n```\n[in a block](missing-three.md)\n```\n"
        "[web](https://example.invalid/x)\n"
    )
    assert broken_links(page) == [
        "page.md: missing.md (no such file)",
        "page.md: other.md#nope (no such heading)",
        "page.md: #nowhere (no such heading)",
    ]


def readme_command_lines() -> list[list[list[str]]]:
    """The README's ``sh`` blocks: per line, its commands (split at ``&&`` and ``;``)."""
    lines: list[list[list[str]]] = []
    block: str | None = None
    for line in README.read_text().splitlines():
        if block is None:
            if line.startswith("```"):
                block = line[3:].strip()
            continue
        if line.startswith("```"):
            block = None
        elif block == "sh" and not line.startswith("#"):
            commands = [shlex.split(part, comments=True) for part in re.split(r"&&|;", line)]
            if any(commands):
                lines.append([words for words in commands if words])
    return lines


def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([a-z][\w-]*):", text, flags=re.MULTILINE))


REPO_FILE = re.compile(r"[\w.-]+/[\w./-]+|[\w-]+\.(?:sbatch|example|service)")


def test_readme_commands_name_what_exists() -> None:
    """make targets in the Makefile, repository files on disk (after a ``cd DIR &&`` on the
    same line), ``slurm-elastic`` subcommands whose ``--help`` lists every option used."""
    lines = readme_command_lines()
    assert lines, "no sh block in README.md"
    targets = make_targets()
    runner = CliRunner()
    for commands in lines:
        cwd = REPO
        for words in commands:
            program, args = words[0], words[1:]
            if program == "cd":
                cwd = REPO / args[0]
                assert cwd.is_dir(), words
                continue
            if program == "make":
                assert set(args) <= targets, words
            for arg in args:
                if REPO_FILE.fullmatch(arg) and not arg.startswith("/"):
                    assert (cwd / arg).exists(), f"{words}: {arg} not in {cwd}"
            if program == "slurm-elastic":
                own = args[: args.index("--")] if "--" in args else args  # then the child's
                names = [a for a in own if not a.startswith("-")]
                sub = names[:2] if names[:1] == ["config"] else names[:1]
                result = runner.invoke(cli, [*sub, "--help"])
                assert result.exit_code == 0, (words, result.output)
                for option in (a for a in own if a.startswith("--")):
                    assert option.split("=")[0] in result.output, (words, option)


def test_readme_names_the_tested_slurm_versions() -> None:
    """The versions the README promises are the ones the test matrix runs."""
    matrix = (REPO / "scripts" / "test-matrix.sh").read_text()
    text = README.read_text()
    for version in ("22.05", "24.11", "26.05"):
        assert version in matrix
        assert re.search(rf"\| {re.escape(version)}\.\d+ \|", text), version
