"""What the conformance suites (onnx_node_tests.py, opinfo.py) share: outcome names, how
an error is shown, and how a run ends."""
from __future__ import annotations

import json
from dataclasses import asdict
from typing import Optional, Sequence

PASSED, FAILED, UNSUPPORTED, SKIPPED = "passed", "failed", "unsupported", "skipped"


def first_line(err: BaseException) -> str:
    """An error's first line (its type when it has no message), cut to a table cell."""
    lines = str(err).strip().splitlines()
    return (lines[0] if lines else type(err).__name__)[:400]


def finish(outcomes: Sequence, json_path: Optional[str]) -> int:
    """Writes every outcome (dataclasses with a ``status``) to ``json_path`` if given; the
    exit status: 1 when any failed."""
    if json_path:
        with open(json_path, "w") as f:
            json.dump([asdict(o) for o in outcomes], f, indent=1)
    return 1 if any(o.status == FAILED for o in outcomes) else 0
