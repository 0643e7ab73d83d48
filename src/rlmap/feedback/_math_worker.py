"""Math-answer worker: ``math_verify`` in a process of its own (needs only math_verify).

Not imported by rlmap: ``math_equiv.py`` runs this file's source with
``python -I -c <source> <memory bytes>`` and speaks JSON lines with it. One line
``{"ready": true}`` once the imports are done; then, per request
``{"response": ..., "reference": ...}``, one reply ``{"equal": bool}`` or
``{"error": ...}`` when the reference itself cannot be parsed.

math_verify's own timeouts are off (``parsing_timeout=None``, ``timeout_seconds=None``):
they use ``signal.alarm``, which only works in a main thread and takes whole
seconds. The parent enforces one deadline per request instead and kills this
process when it is missed.
"""

from __future__ import annotations

import json
import logging
import resource
import sys
from typing import Any


def _parse_reference(parse: Any, reference: str) -> list[Any]:
    """The gold answer: as written, else read as LaTeX math (``\\sqrt{2}``, ``x^2+1``); a
    LaTeX command outside ``$...$`` is read as LaTeX first, since read as written
    ``2\\sqrt{3}``, ``3\\pi`` and ``(-\\infty, 3]`` are their first number (a MATH answer)."""
    latex_first = "\\" in reference and "$" not in reference
    gold = parse(f"${reference}$" if latex_first else reference, parsing_timeout=None)
    if not gold and "$" not in reference:
        gold = parse(reference if latex_first else f"${reference}$", parsing_timeout=None)
    # parse falls back to the raw string when nothing parses: that is no answer at all
    return list(gold) if any(not isinstance(g, str) for g in gold) else []


def main() -> None:
    memory = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    logging.disable(logging.CRITICAL)  # math_verify logs each parse failure and timeout
    from math_verify import parse, verify  # type: ignore[import-untyped]

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        gold = _parse_reference(parse, request["reference"])
        if not gold:
            reply: dict[str, object] = {"error": f"cannot parse reference {request['reference']!r}"}
        else:
            answer = parse(request["response"], parsing_timeout=None)
            reply = {"equal": bool(answer) and bool(verify(gold, answer, timeout_seconds=None))}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
