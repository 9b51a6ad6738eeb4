"""Where in a YAML config each problem is, and which problems follow from a typo.

``gateway.core.config`` reports problems by field path (``tables.visits.privacy_unti: unknown
setting``). An admin edits a file, so each problem is given the line it is on; and a
misspelt setting is named with the setting it resembles, first, while the problems that
a typo can cause in its own table (a missing privacy unit makes a reference to the table
wrong) are marked as perhaps following from it rather than presented as new mistakes.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

import yaml

_PATH = re.compile(r"^([A-Za-z0-9_.\[\]-]+): ")
_UNKNOWN = re.compile(r"^([A-Za-z0-9_.\[\]-]+): unknown setting \(allowed: ([^)]*)\)")


def locate(problems: Sequence[str], text: str) -> list[str]:
    """``problems`` with the line of each field path (``line 12: tables.x: …``), a typo's
    likely meaning, and problems that may follow from a typo said to."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return list(problems)
    typos: list[tuple[str, str, int | None]] = []  # (path of the table, meant key, line)
    out: list[tuple[int, str]] = []
    for problem in problems:
        match = _PATH.match(problem)
        line = _line_of(root, match.group(1)) if match else None
        unknown = _UNKNOWN.match(problem)
        if unknown:
            path, allowed = unknown.group(1), unknown.group(2).split(", ")
            key = path.rsplit(".", 1)[-1]
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.75)
            if close:
                problem = f"{path}: unknown setting — did you mean '{close[0]}'?"
                typos.append((path.rsplit(".", 1)[0], close[0], line))
                out.append((0, _at(line, problem)))
                continue
        out.append((1, _at(line, problem)))
    if typos:
        out = [(rank, _knock_on(p, typos) if rank else p) for rank, p in out]
    return [p for _, p in sorted(out, key=lambda rp: rp[0])]


def _at(line: int | None, problem: str) -> str:
    return f"line {line}: {problem}" if line is not None else problem


def _knock_on(problem: str, typos: list[tuple[str, str, int | None]]) -> str:
    """Mark a problem in a section with a typo, or that names a table with one."""
    body = problem.split(": ", 1)[-1] if problem.startswith("line ") else problem
    path = body.split(": ", 1)[0]
    inside = [t for t in typos if path.startswith(t[0] + ".")]
    naming = [
        t
        for t in typos
        if t[1] in body or re.search(rf"\b{re.escape(t[0].rsplit('.', 1)[-1])}\b", body)
    ]
    for _, _, line in (inside or naming)[:1]:
        where = f" at line {line}" if line is not None else ""
        return f"{problem} (perhaps only because of the typo{where})"
    return problem


def _line_of(root: yaml.Node | None, path: str) -> int | None:
    """The 1-based line of the deepest node of ``path`` (``a.b[2].c``) found in the YAML."""
    node, line = root, None
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if isinstance(node, yaml.MappingNode):
            found = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
            key = next((k for k, _ in node.value if getattr(k, "value", None) == part), None)
            if found is None or key is None:
                break
            node, line = found, key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and part.startswith("["):
            index = int(part[1:-1])
            if index >= len(node.value):
                break
            node = node.value[index]
            line = node.start_mark.line + 1
        else:
            break
    return line
