"""What one reply from a kernel costs, written and read, in each of its two formats.

A check makes thousands of calls into the student's code, and each call's reply is written
by the kernel (``course.probe.write_reply``) and read by the grader
(``autograder.remote.read_reply``). A reply that JSON gives back exactly (no tensor, tuple,
number key or NaN) is written as JSON; any other with ``torch.save`` and read with
``torch.load(weights_only=True)``. This writes and reads typical tensor-free replies both
ways, ``--calls`` times each, and prints the CPU milliseconds per reply and the ratio (the
``torch.save`` format is the baseline, in the same run). Nothing here asserts a time.

    .venv/bin/python benchmarks/reply_formats.py --calls 2000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autograder.remote import read_reply  # noqa: E402
from course.probe import JSON_REPLY, write_reply  # noqa: E402

EMPTY = {"contexts": [], "grads": {}, "twins": {}}
REPLIES = {
    "a reference (an attribute read)": {"value": {"__ref__": 7, "type": "Linear", "bases": ["torch.nn:Module"]},
                                        "changed": [], **EMPTY},
    "a number": {"value": 0.125, "changed": [], **EMPTY},
    "a list of 100 numbers": {"value": {"__list__": list(range(100))}, "changed": [], **EMPTY},
    "an error": {"error": {"type": "ValueError", "bases": ["ValueError", "Exception"], "message": "bad shape",
                           "traceback": "Traceback ...\n" * 20}, **EMPTY},
}


def per_call_ms(reply: dict, path: Path, calls: int, as_saved: bool) -> float:
    """CPU milliseconds to write and read ``reply`` once."""
    started = time.process_time()
    for _ in range(calls):
        if as_saved:
            torch.save(reply, path)
        else:
            write_reply(reply, str(path))
        read_reply(path)
    return (time.process_time() - started) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    path = Path(tempfile.mkdtemp(prefix="reply-formats-")) / "reply"
    print("| reply | torch.save + weights_only load (ms) | JSON (ms) | ratio |")
    print("|---|---|---|---|")
    for name, reply in REPLIES.items():
        write_reply(reply, str(path))
        assert path.read_bytes().startswith(JSON_REPLY), f"{name}: write_reply did not choose JSON"
        saved = per_call_ms(reply, path, args.calls, as_saved=True)
        as_json = per_call_ms(reply, path, args.calls, as_saved=False)
        print(f"| {name} | {saved:.3f} | {as_json:.3f} | {saved / as_json:.1f}x |")


if __name__ == "__main__":
    main()
