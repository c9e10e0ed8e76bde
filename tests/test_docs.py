"""The README and docs/ as a new user reads them: commands that run from the checkout as written,
no link leaving the repository, and the unit's Documentation= installed by the README's steps."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "bench" / "README.md"]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def shell_lines(doc: Path) -> list[str]:
    """Lines of the ```sh blocks and of indented code blocks, continuations joined, comments
    dropped."""
    text = doc.read_text()
    blocks = [body for lang, body in FENCE.findall(text) if lang in ("sh", "bash", "shell")]
    blocks += re.findall(r"^\n((?: {4}\S.*\n)+)", text, re.M)
    out: list[str] = []
    for body in blocks:
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split(" # ", 1)[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def commands(line: str) -> list[str]:
    """The command word of each command on a shell line (after sudo, env assignments)."""
    if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$", line.split(" ", 1)[0]) and "$(" in line:
        line = line[line.index("$(") + 2:]  # var=$(cmd ...)...: the command inside
    try:
        tokens = shlex.split(line)
    except ValueError:
        return []
    words, start = [], True
    for tok in tokens:
        if tok in ("&&", "||", ";", "|"):
            start = True
        elif start and (tok == "sudo" or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tok)):
            continue
        elif start:
            words.append(tok)
            start = False
    return words


def test_no_bare_edgepilot_command_in_the_docs() -> None:
    bare = [(doc.name, line) for doc in DOCS for line in shell_lines(doc)
            if "edgepilot" in commands(line)]
    # `edgepilot` is on no PATH after `make run`: .venv/bin/edgepilot (or a make target)
    assert bare == []


def test_doc_commands_name_only_tools_that_exist_here() -> None:
    # each command word is a path in the checkout, or a program the README's apt lines install
    known = {"make", "curl", "sudo", "install", "git", "cd", "ln", "systemctl",
             "scripts/link-pyarmnn.sh", "apt-get", "systemd-sysusers", "systemd-tmpfiles",
             "mosquitto_sub", "mosquitto_pub"}
    unknown = []
    for line in (line for doc in DOCS for line in shell_lines(doc)):
        for word in commands(line):
            local = (REPO / word).exists() or word.startswith(".venv/bin/")
            if not local and word not in known:
                unknown.append((word, line))
    assert unknown == []
    assert (REPO / "scripts" / "link-pyarmnn.sh").is_file()


def test_links_stay_inside_the_repository_and_resolve() -> None:
    bad = []
    for doc in DOCS:
        text = doc.read_text()
        assert "shared/DESIGN.md" not in text, doc
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+://|^#|^mailto:", target):
                continue
            path = (doc.parent / target.split("#", 1)[0]).resolve()
            if not path.is_relative_to(REPO) or not path.exists():
                bad.append((doc.name, target))
    assert bad == []


def test_unit_documentation_is_what_the_readme_installs(tmp_path: Path) -> None:
    unit = (REPO / "systemd" / "edgepilot.service").read_text()
    docs = re.findall(r"^Documentation=(.+)$", unit, re.M)
    uris = [u for line in docs for u in line.split()]
    assert uris and all(u.startswith("file:///usr/share/doc/edgepilot/") for u in uris), uris
    # the README's install lines for /usr/share/doc, run as written under a scratch root
    steps = [line for line in shell_lines(REPO / "README.md") if "/usr/share/doc" in line]
    assert steps
    root = tmp_path / "root"
    for line in steps:
        cmd = line.removeprefix("sudo ").replace("/usr/share/doc", f"{root}/usr/share/doc")
        subprocess.run(["bash", "-c", cmd], cwd=REPO, check=True, timeout=30)
    for uri in uris:
        installed = root / uri.removeprefix("file:///")
        assert installed.is_file(), uri
        source = REPO / uri.removeprefix("file:///usr/share/doc/edgepilot/")
        assert installed.read_bytes() == source.read_bytes()
