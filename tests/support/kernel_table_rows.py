"""The KernelEntry rows of a generated kernel_table.cpp, read by field name (codegen writes them
with designated initialisers), so a test asserts on ``row["fast_accum"]``, not on a position."""

from __future__ import annotations

import re

_FIELD = re.compile(r"\.(\w+) = (\"[^\"]*\"|[^,{}\s]+)")


def entry_rows(table: str) -> list[dict[str, str]]:
    """``{field: C++ text}`` per kernel entry (the closing nullptr row left out); the geometry's
    fields (tile_m, ..., style, split_k) sit beside the entry's own; strings are unquoted."""
    body = table.split("kEntries[] = {", 1)[1].split("\n};", 1)[0]
    rows = []
    for chunk in re.split(r"\n(?=    \{\.config = )", body):
        row = {k: v.strip('"') for k, v in _FIELD.findall(chunk)}
        if row.get("config", "nullptr") != "nullptr":
            rows.append(row)
    return rows
