"""How ``yarnflow info`` shows a job's figures: sizes, and how each operator runs its user
function."""

from __future__ import annotations

from typing import Any

__all__ = ["operator_paths", "size"]


def size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def operator_paths(vertex_name: str, metrics: list[Any]) -> list[str]:
    """How each operator of a vertex runs its user function (vectorised, per row and why), as
    its subtasks report it; an operator whose subtasks differ shows each subtask's."""
    names = vertex_name.split(" -> ")
    lines = []
    for i in range(max((len(m.operator_paths) for m in metrics), default=0)):
        paths = [m.operator_paths[i] if i < len(m.operator_paths) else "" for m in metrics]
        if not any(paths):
            continue
        name = names[i] if len(names) == len(metrics[0].operator_paths) else f"operator {i + 1}"
        if len(set(paths)) == 1:
            lines.append(f"{name}: {paths[0]}")
        else:
            lines += [f"{name} (subtask {j}): {p}" for j, p in enumerate(paths) if p]
    return lines
