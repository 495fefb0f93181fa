"""Slurm hostlist expressions: ``node[1-3,7],gpu[01-02]`` ⇄ a list of names."""

from __future__ import annotations

import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(expression: str) -> list[str]:
    """Expand a hostlist in Slurm's order; ``""`` and ``"(null)"`` give ``[]``.

    Handles several bracket groups per name (``rack[1-2]-n[1-2]``) and zero padding
    (``n[08-10]`` gives ``n08 n09 n10``).
    """
    expression = expression.strip()
    if expression in ("", "(null)", "None"):
        return []
    names: list[str] = []
    for item in _split_top_level(expression):
        names.extend(_expand_item(item))
    return names


def _split_top_level(expression: str) -> list[str]:
    items, depth, start = [], 0, 0
    for position, char in enumerate(expression):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {expression!r}")
        elif char == "," and depth == 0:
            items.append(expression[start:position])
            start = position + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in hostlist {expression!r}")
    items.append(expression[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_item(item: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    prefix, ranges, rest = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
    tails = _expand_item(rest) if rest else [""]
    names: list[str] = []
    for number in _expand_ranges(ranges, item):
        names.extend(prefix + number + tail for tail in tails)
    return names


def _expand_ranges(ranges: str, item: str) -> list[str]:
    numbers: list[str] = []
    for part in ranges.split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            raise ValueError(f"bad range {part!r} in hostlist item {item!r}")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ValueError(f"descending range {part!r} in hostlist item {item!r}")
        width = len(low) if low.startswith("0") else 0
        numbers.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return numbers


def expand_index_list(expression: str) -> list[int]:
    """``"0-1,3"`` → ``[0, 1, 3]`` (GPU indices in ``gres_detail``)."""
    indices: list[int] = []
    for part in expression.split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        indices.extend(range(int(low), int(high or low) + 1))
    return indices
