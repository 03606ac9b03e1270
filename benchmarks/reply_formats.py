"""What one call into a kernel costs to send and to answer, in each format.

A check makes thousands of calls into the student's code. Each call's request is pickled by
the grader (``autograder.remote.dumps``) and unpickled by the kernel; its reply is written by
the kernel (``course.probe.write_reply``) and read by the grader
(``autograder.remote.read_reply``). A reply that JSON gives back exactly (no tensor, tuple,
number key or NaN) is written as JSON; one of plain values and CPU tensors as tagged JSON and
the tensors' bytes (``course.probe.pack_reply``); any other with ``torch.save``, read with
``torch.load(weights_only=True)``. A request's tensors travel as their storages' bytes,
where cloudpickle would pickle each storage with torch.save.

This writes and reads typical replies and requests ``--calls`` times each, and prints the
CPU milliseconds per call in the baseline format (``torch.save``; plain cloudpickle) and in
the one chosen, and the ratio, in the same run. Nothing here asserts a time.

    .venv/bin/python benchmarks/reply_formats.py --calls 2000
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cloudpickle  # noqa: E402

from autograder.remote import dumps, read_reply  # noqa: E402
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


ARGUMENTS = torch.arange(512, dtype=torch.float32).view(2, 16, 16)
TENSOR_REPLIES = {
    "a tensor (2x16x16)": {"value": ARGUMENTS, "changed": [], **EMPTY},
    "a tuple of three tensors and a number": {"value": {"__tuple__": [ARGUMENTS, ARGUMENTS[0], ARGUMENTS.sum(0), 1.5]},
                                              "changed": [], **EMPTY},
}
REQUESTS = {
    "a call with two tensors": {"op": "call", "target": None, "args": (ARGUMENTS, ARGUMENTS[:, :4]), "kwargs": {},
                                "seed": 7, "grad": False, "contexts": []},
    "a call with a model's 8 parameters": {"op": "call", "target": None, "kwargs": {}, "seed": 7, "grad": False,
                                           "args": (dict(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                                                             *[torch.nn.Linear(16, 16) for _ in range(3)])
                                                         .state_dict()),), "contexts": []},
}


def request_ms(request: dict, calls: int, plain: bool) -> float:
    """CPU milliseconds to pickle ``request`` once and unpickle it."""
    started = time.process_time()
    for _ in range(calls):
        pickle.loads(cloudpickle.dumps(request) if plain else dumps(request))
    return (time.process_time() - started) / calls * 1e3


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
    print("| reply | torch.save + weights_only load (ms) | chosen (ms) | format chosen | ratio |")
    print("|---|---|---|---|---|")
    for name, reply in {**REPLIES, **TENSOR_REPLIES}.items():
        write_reply(reply, str(path))
        chosen = "JSON" if path.read_bytes().startswith(JSON_REPLY) else "packed"
        assert chosen == ("JSON" if name in REPLIES else "packed"), f"{name}: write_reply chose {chosen}"
        saved = per_call_ms(reply, path, args.calls, as_saved=True)
        own = per_call_ms(reply, path, args.calls, as_saved=False)
        print(f"| {name} | {saved:.3f} | {own:.3f} | {chosen} | {saved / own:.1f}x |")
    print()
    print("| request | cloudpickle (ms) | tensors as bytes (ms) | ratio |")
    print("|---|---|---|---|")
    for name, request in REQUESTS.items():
        plain, own = request_ms(request, args.calls, plain=True), request_ms(request, args.calls, plain=False)
        print(f"| {name} | {plain:.3f} | {own:.3f} | {plain / own:.1f}x |")


if __name__ == "__main__":
    main()
