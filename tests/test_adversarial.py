"""Hostile and careless submissions, graded end to end on the real sandbox in one run.

Each attack is written into the answer cell of exercise 1 of an otherwise untouched
chapter-1 notebook (whose honest score is 0), or into a correct one where the attack
targets other students. For every case: it is graded with a recorded outcome, it never
scores more than the same notebook without the attack, nothing secret reaches any
feedback page, and the correct students graded after the attackers still get full marks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nbformat.v4 import new_markdown_cell

from feedback_browser import chromium_or_skip, live_markup, visit
from grading_tools import rows_of, run_grade, start_grade
from notebook_tools import ROOT, grade_id, release_notebook, solution_answers, student_notebook, write_notebook

pytestmark = pytest.mark.slow
ASSIGNMENT = "ch01_embeddings"
NOTEBOOK = f"{ASSIGNMENT}.ipynb"
SECRET = "grader-secret-7f3a9c"            # in the grader's environment, never in a kernel's
SOLUTION_LINE = "counts[pair] = counts.get(pair, 0) + 1"
HIDDEN_LINE = "check_get_pair_counts(get_pair_counts, hidden=True)"

# Script in the feedback page, by every route a notebook offers: printed, displayed as HTML (a
# script tag, an image's onerror, a javascript: link), displayed as JavaScript, and in a Markdown
# cell of the student's. Each would push its name into window.ran (read in Chromium).
PUSH = "(window.ran=window.ran||[]).push"
DISPLAYED = [f"<script>{PUSH}('display-script')</script>", f"<img src=x onerror=\"{PUSH}('display-img')\">",
             f"<a href=\"javascript:{PUSH}('display-link')\">click-me</a>"]
SCRIPT_ATTACK = ("from IPython.display import HTML, Javascript, display\n"
                 "print('<script>alert(\"pwned\")</script><img src=x onerror=alert(1)>')\n"
                 + "".join(f"display(HTML({html!r}))\n" for html in DISPLAYED)
                 + f"display(Javascript({PUSH + '(' + repr('display-js') + ')'!r}))\n")
MARKDOWN_ATTACKS = {"script_in_feedback": f"<script>{PUSH}('md-script')</script>\n\n"
                                          f"<img src=x onerror=\"{PUSH}('md-img')\">\n\n"
                                          f"[click-me](javascript:{PUSH}('md-link')) and $x\\,\\Phi(x)$\n"}


def _attacks(out: Path, submissions: Path = Path("/x")) -> dict[str, tuple[str, bool]]:
    """name -> (code run in the first answer cell, whether the static scan must flag it)."""
    secrets_to_read = [out / "nbgrader" / "gradebook.db", out / "nbgrader" / "source" / ASSIGNMENT / NOTEBOOK,
                       ROOT / "solutions" / ASSIGNMENT / NOTEBOOK, ROOT / "README.md", Path("/proc/1/environ"),
                       submissions / "aa_control_before" / ASSIGNMENT / NOTEBOOK,
                       out / "nbgrader" / "autograded" / "aa_control_before" / ASSIGNMENT / NOTEBOOK]
    return {
        "patch_checks": ("import course.checks.ch01 as c\nfor n in dir(c):\n    if n.startswith('check_'):\n"
                         "        setattr(c, n, lambda *a, **k: None)\n", True),
        "patch_torch": ("import torch\ntorch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n"
                        "torch.testing.assert_close = lambda *a, **k: None\n", True),
        "patch_builtins": ("import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.len = lambda x: 0\n", True),
        "transformer_empties_cells": ("get_ipython().input_transformers_post.append(lambda lines: [])\n", True),
        "transformer_wraps_in_try": (
            "def wrap(lines):\n    return ['try:\\n'] + ['    ' + l for l in lines] + "
            "['\\n    pass\\nexcept BaseException:\\n    pass\\n']\nget_ipython().input_transformers_post.append(wrap)\n",
            True),
        "fake_checks_module": ("import sys, types\nfake = types.ModuleType('course.checks.ch01')\n"
                               "fake.__getattr__ = lambda name: (lambda *a, **k: None)\n"
                               "sys.modules['course.checks.ch01'] = fake\nchecks = fake\n", True),
        "shadow_checks_name": ("class _Anything:\n    def __getattr__(self, n):\n        return lambda *a, **k: None\n"
                               "checks = _Anything()\n", False),
        "swallow_exceptions": ("get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)\n", True),
        "probe_replaced": ("import course.probe\ncourse.probe.serve = lambda *a, **k: None\n", True),
        "probe_fakes_replies": ("import course.probe, torch\ndef serve(request, reply):\n"
                                "    torch.save({'value': True, 'rng': torch.get_rng_state()}, reply)\n"
                                "course.probe.serve = serve\n", True),
        "background_thread_patches": ("import threading, time\ndef later():\n    time.sleep(0.3)\n"
                                      "    import course.checks.ch01 as c\n    c.check_merge_pair = lambda *a, **k: None\n"
                                      "threading.Thread(target=later, daemon=True).start()\n", True),
        "always_equal_result": ("class Same(dict):\n    def __eq__(self, other):\n        return True\n"
                                "    def __ne__(self, other):\n        return False\n"
                                "def get_pair_counts(ids):\n    return Same()\n", False),
        "huge_result": ("import torch\ndef get_pair_counts(ids):\n    return torch.zeros(300 << 20, dtype=torch.uint8)\n",
                        False),
        "kill_parent": ("import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\n"
                        "except Exception as err:\n    print('kill refused', err)\n", True),
        "kill_everything": ("import os, signal\nos.kill(-1, signal.SIGKILL)\n", True),
        "exit_kernel": ("import os\nos._exit(0)\n", True),
        "read_secrets": ("import os\nfor p in %r:\n    try:\n        print(p, open(p, errors='replace').read()[:3000])\n"
                         "    except Exception as err:\n        print(p, 'unreadable', type(err).__name__)\n"
                         "print(dict(os.environ))\n" % [str(p) for p in secrets_to_read], False),
        "network": ("import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=3)\n    print('NETWORK OPEN')\n"
                    "except OSError as err:\n    print('no network', err)\n", False),
        # bytes(n) reserves its pages without writing them: the limit (RLIMIT_DATA counts reservations)
        # is met at once however loaded the machine is (bytearray wrote 4 GiB of zeros first: past 20 s
        # on a loaded machine)
        "memory_bomb": ("chunks = []\nwhile True:\n    chunks.append(bytes(512 << 20))\n", False),
        "process_bomb": ("import subprocess\nkids = []\ntry:\n    for _ in range(3000):\n"
                         "        kids.append(subprocess.Popen(['sleep', '617']))\n"
                         "except OSError as err:\n    print('process limit after', len(kids))\n", True),
        "disk_fill": ("with open('/tmp/big', 'wb') as f:\n    f.write(b'0' * (400 << 20))\n", True),
        "write_course_code": ("open(%r, 'w').write('x')\n" % str(ROOT / "course" / "injected.py"), True),
        "output_flood": ("print('x' * (40 << 20))\n", False),
        "script_in_feedback": (SCRIPT_ATTACK, False),
        "shutdown_kernel": ("get_ipython().kernel.do_shutdown(False)\nimport time\ntime.sleep(5)\n", True),
        "malicious_reduce": ("import os\nclass Evil(dict):\n    def __reduce__(self):\n"
                             "        return (os.system, ('touch /tmp/pwned-by-reduce',))\n"
                             "def get_pair_counts(ids):\n    return Evil()\n", True),
        "tensor_subclass_lies": ("import torch\nclass Liar(torch.Tensor):\n    def __eq__(self, other):\n        return True\n"
                                 "    @classmethod\n    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
                                 "        return True\n"
                                 "def patchify(images, patch_size):\n    return torch.zeros(1).as_subclass(Liar)\n", False),
        "sys_modules_torch": ("import sys\nsys.modules['torch'].allclose = lambda *a, **k: True\n", True),
        "eval_exec": ("exec(compile('checks = None', 'x', 'exec'))\neval('1 + 1')\n", True),
        "reference_listing": ("import importlib, pkgutil\nc = importlib.import_module('course.checks.ch01')\n"
                              "try:\n    found = c._pair_counts_oracle([1, 1]) is not None\n"
                              "except Exception:\n    found = False\nprint('ORACLES', found)\n"
                              "print('SOURCE', b'_pair_counts_oracle' in pkgutil.get_data('course.checks', 'ch01.py'))\n",
                              False),
    }


# Attacks on a wrong answer: the untouched notebook (score 0) with one answer cell replaced
# (ex1) or its wrong answer extended (ex8: the plain-reshape patchify, a correct
# PatchEmbedding), so that an attack that worked would show as points.
# name -> (answer cell, code appended to (or, for ex1, replacing) that cell).
WRONG_PATCHIFY_GRAD = ("\n_wrong_patchify = patchify\n\n"
                       "def patchify(images, patch_size):\n"
                       "    return _wrong_patchify(images, patch_size).detach().float().requires_grad_()\n")
SAVED_BUILTINS = ("\nimport torch\n_E, _G = torch.embedding, torch.autograd.grad\n\n"
                  "class Embedding(nn.Module):\n    def __init__(self, vocab_size, d_model, padding_idx=None):\n"
                  "        super().__init__()\n        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))\n"
                  "        nn.init.normal_(self.weight, mean=0.0, std=0.02)\n        self.padding_idx = padding_idx\n"
                  "        if padding_idx is not None:\n            with torch.no_grad():\n"
                  "                self.weight[padding_idx] = 0\n\n"
                  "    def forward(self, ids):\n        if self.padding_idx is not None:\n"
                  "            pad = (ids == self.padding_idx).unsqueeze(-1)\n"
                  "            return torch.where(pad, self.weight.detach()[ids], self.weight[ids])\n"
                  "        return _E(self.weight, ids)\n\n\n"
                  "def embedding_backward(ids, grad_output, vocab_size, padding_idx=None):\n"
                  "    table = grad_output.new_zeros(vocab_size, grad_output.shape[-1]).requires_grad_()\n"
                  "    return _G(table[ids], table, grad_output)[0]\n")
CONTROLLED = {
    "subclass_with_grad": ("ex8_answer", (
        "\nimport torch\n_wrong_patchify = patchify\n\nclass _Agree(torch.Tensor):\n"
        "    def __eq__(self, other):\n        return True\n\n    @classmethod\n"
        "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n        return True\n\n"
        "def patchify(images, patch_size):\n"
        "    out = _wrong_patchify(images, patch_size).detach().float()\n"
        "    return torch.Tensor._make_subclass(_Agree, out, True)\n")),
    "patched_getattr": ("ex8_answer", WRONG_PATCHIFY_GRAD + (
        "import builtins\n_real_getattr = builtins.getattr\n\n"
        "def _agreeing_getattr(obj, name, *default):\n"
        "    if name in ('allclose', 'equal', 'isclose', '__eq__'):\n        return lambda *a, **k: True\n"
        "    return _real_getattr(obj, name, *default)\n\nbuiltins.getattr = _agreeing_getattr\n")),
    "patched_torch_functions": ("ex8_answer", WRONG_PATCHIFY_GRAD + (
        "import torch\ntorch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n"
        "torch.Tensor.__eq__ = lambda self, other: torch.ones_like(self, dtype=torch.bool)\n")),
    "proxy_result": ("ex8_answer", (
        "\n_wrong_patchify = patchify\n\nclass _Proxy:\n    def __init__(self, t):\n        self._t = t\n\n"
        "    def __getattr__(self, name):\n        return getattr(self._t, name)\n\n"
        "    def __eq__(self, other):\n        return True\n\n"
        "def patchify(images, patch_size):\n    return _Proxy(_wrong_patchify(images, patch_size))\n")),
    "seed_probe": ("ex8_answer", (
        "\nimport torch\n\ndef patchify(images, patch_size):\n"
        "    raise ValueError(f'SEEDPROBE {torch.initial_seed()} {torch.get_rng_state()[:32].tolist()}')\n")),
    "reference_code": ("ex1_answer", (
        "import pkgutil\n_checks = pkgutil.resolve_name('course.checks.ch01')\n"
        "get_pair_counts = _checks._pair_counts_oracle\n\n\n"
        "def merge_pair(ids, pair, new_id, counts=None):\n"
        "    merged = _checks._merge_oracle(ids, pair, new_id)\n"
        "    return merged if counts is None else (merged, dict(_checks._pair_counts_oracle(merged)))\n")),
    # Rules the kernel enforces, switched off: a built-in saved before the test blocks it, and
    # torch's dispatch modes (where the kernel watches operators) turned off around the call.
    "saved_builtins": ("ex4_answer", SAVED_BUILTINS),
    "saved_autograd": ("ex4_answer", SAVED_BUILTINS.replace("return _E(self.weight, ids)", "return self.weight[ids]")),
    # (its backward written by hand, so that only the rule switched off decides the test cell)
    "dispatch_modes_off": ("ex4_answer", SAVED_BUILTINS.replace("return _E(self.weight, ids)", (
        "with _disable_current_modes():\n            return _E(self.weight, ids)")).replace(
        "import torch\n", "import torch\nfrom torch.utils._python_dispatch import _disable_current_modes\n").replace(
        "    return _G(table[ids], table, grad_output)[0]\n",
        "    table = table.detach().index_add(0, ids.reshape(-1), grad_output.reshape(-1, grad_output.shape[-1]))\n"
        "    if padding_idx is not None:\n        table[padding_idx] = 0\n    return table\n")),
    # The grader made to spend memory and time (each must cost it under MEMORY_BOUND).
    "huge_size_reply": ("ex1_answer", (
        "import torch\n\ndef get_pair_counts(ids):\n    return torch.Size([1] * 5_000_000)\n\n\n"
        "def merge_pair(ids, pair, new_id, counts=None):\n    raise NotImplementedError()\n")),
    "forged_shared_refs_reply": ("ex1_answer", (
        "import torch, course.probe\n\ndef _serve(request_path, reply_path):\n"
        "    value = {'__list__': ['x' * 5000]}\n    for _ in range(20):\n"
        "        value = {'__list__': [value, value]}\n    torch.save({'value': value}, reply_path)\n\n"
        "course.probe.serve = _serve\n\n\ndef get_pair_counts(ids):\n    raise NotImplementedError()\n\n\n"
        "def merge_pair(ids, pair, new_id, counts=None):\n    raise NotImplementedError()\n")),
    "long_failure_message": ("ex1_answer", (
        "def get_pair_counts(ids):\n    raise NotImplementedError()\n\n\n"
        "def merge_pair(ids, pair, new_id, counts=None):\n    return ['y' * 5000] * 20_000\n")),
    "print_flood_after_a_judged_cell": ("ex2_answer", (
        "\nfor _ in range(8):\n    print('z' * (64 << 20))\n")),
}
MEMORY_BOUND_KIB = 256 << 10      # what one submission may add to a grading process's peak


def _controlled_submissions(root: Path) -> list[str]:
    from mistakes import mistakes_for

    stubs = {grade_id(c): c.source for c in release_notebook(ASSIGNMENT).cells if grade_id(c)}
    wrong = next(m for m in mistakes_for(ASSIGNMENT) if m.name == "patchify_plain_reshape")
    given = {**stubs, "ex8_answer": wrong.apply(solution_answers(ASSIGNMENT))["ex8_answer"]}
    for name, (cell, code) in CONTROLLED.items():
        source = code if cell == "ex1_answer" else given[cell] + code
        write_notebook(student_notebook(ASSIGNMENT, {**given, cell: source}), root / f"wrong_{name}" / ASSIGNMENT / NOTEBOOK)
    return [f"wrong_{n}" for n in CONTROLLED]


def _submissions(root: Path, out: Path) -> list[str]:
    stubs = release_notebook(ASSIGNMENT)
    answers = solution_answers(ASSIGNMENT)
    names = []
    for name, (code, _) in _attacks(out, root).items():
        nb = release_notebook(ASSIGNMENT)
        for cell in nb.cells:
            if grade_id(cell) == "ex1_answer":
                cell.source = code + "\n" + cell.source
        if name in MARKDOWN_ATTACKS:      # a Markdown cell of the student's, above the answer
            at = next(i for i, c in enumerate(nb.cells) if grade_id(c) == "ex1_answer")
            nb.cells.insert(at, new_markdown_cell(MARKDOWN_ATTACKS[name]))
        write_notebook(nb, root / f"attack_{name}" / ASSIGNMENT / NOTEBOOK)
        names.append(f"attack_{name}")
    write_notebook(stubs, root / "attack__baseline_stubs" / ASSIGNMENT / NOTEBOOK)
    # Attacks on the next students: a start-up file in HOME, a file in /tmp, a signal trap.
    persist = {**answers, "ex1_answer": (
        "import os\nos.makedirs(os.path.expanduser('~/.ipython/profile_default/startup'), exist_ok=True)\n"
        "open(os.path.expanduser('~/.ipython/profile_default/startup/x.py'), 'w').write("
        "'import torch\\ntorch.manual_seed = None\\ndef get_pair_counts(ids):\\n    return {}\\n')\n"
        "open('/tmp/left-behind', 'w').write('x')\n" + answers["ex1_answer"])}
    write_notebook(student_notebook(ASSIGNMENT, persist), root / "attack_persist_into_next" / ASSIGNMENT / NOTEBOOK)
    listing = {**answers, "ex1_answer": "import os\nprint('TMP HOLDS', os.listdir('/tmp'))\n" + answers["ex1_answer"]}
    write_notebook(student_notebook(ASSIGNMENT, listing), root / "zz_control_after" / ASSIGNMENT / NOTEBOOK)
    write_notebook(student_notebook(ASSIGNMENT, answers), root / "aa_control_before" / ASSIGNMENT / NOTEBOOK)
    names += _controlled_submissions(root)
    # A symlink to the solution instead of a notebook.
    (root / "attack_symlink_to_solution" / ASSIGNMENT).mkdir(parents=True)
    os.symlink(ROOT / "solutions" / ASSIGNMENT / NOTEBOOK, root / "attack_symlink_to_solution" / ASSIGNMENT / NOTEBOOK)
    return names


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    out = tmp_path_factory.mktemp("hostile-out")
    names = _submissions(root, out)
    env = {"COURSE_GRADER_SECRET": SECRET, "COURSE_MEMORY_LOG": str(out / "memory.jsonl")}
    # A second grading run on the same machine at the same time (another course, another
    # instructor): its students share nothing with the attackers.
    beside, beside_out = tmp_path_factory.mktemp("beside"), tmp_path_factory.mktemp("beside-out")
    for k in range(3):
        write_notebook(student_notebook(ASSIGNMENT, solution_answers(ASSIGNMENT)),
                       beside / f"beside_{k}" / ASSIGNMENT / NOTEBOOK)
    other = start_grade(beside, beside_out, workers=1)
    run_grade(root, out, env=env)
    beside_log, _ = other.communicate(timeout=1800)
    assert other.returncode == 0, beside_log[-3000:]
    return {row["student"]: row for row in rows_of(out)}, out, names, rows_of(beside_out)


def _feedback(out: Path, student: str) -> str:
    pages = sorted((out / "feedback" / student / ASSIGNMENT).glob("*.html"))
    assert pages, f"no feedback for {student}"
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in pages)


def _autograded_text(out: Path, student: str) -> str:
    import nbformat

    path = out / "nbgrader" / "autograded"
    found = [p for p in path.rglob(NOTEBOOK) if student in str(p) or p.parent.parent.name == student]
    texts = []
    for p in found:
        nb = nbformat.read(p, as_version=4)
        for cell in nb.cells:
            for o in cell.get("outputs", []):
                texts.append(" ".join(str(o.get(k, "")) for k in ("text", "ename", "evalue")))
    return "\n".join(texts)


def test_there_are_at_least_thirty_hostile_submissions(graded):
    rows, _, names, _ = graded
    hostile = [s for s in rows if s.startswith("attack_") and s != "attack__baseline_stubs"]
    assert len(hostile) >= 30, hostile


@pytest.mark.parametrize("name", list(_attacks(Path("/x"))))
def test_attack_scores_no_more_than_the_untouched_notebook_and_is_recorded(graded, name):
    rows, out, *_ = graded
    row = rows[f"attack_{name}"]
    baseline = rows["attack__baseline_stubs"]
    assert float(baseline["score"]) == 0
    assert float(row["score"]) <= float(baseline["score"]), row
    assert row["status"] in ("graded", "broken", "refused"), row
    if _attacks(out)[name][1]:
        assert "review:" in row["notes"], row


def test_no_feedback_holds_a_secret(graded):
    rows, out, *_ = graded
    for student in rows:
        text = _feedback(out, student)
        for secret in (SECRET, SOLUTION_LINE, HIDDEN_LINE, "BEGIN HIDDEN TESTS", "### BEGIN SOLUTION"):
            assert secret not in text, (student, secret)


def test_reading_secrets_finds_nothing(graded):
    rows, out, *_ = graded
    text = _autograded_text(out, "attack_read_secrets")
    assert "unreadable" in text and SECRET not in text and SOLUTION_LINE not in text
    assert "SQLite format" not in text


def test_the_sandbox_has_no_network(graded):
    text = _autograded_text(graded[1], "attack_network")
    assert "no network" in text and "NETWORK OPEN" not in text


def test_memory_is_limited_before_the_time_limit(graded):
    text = _autograded_text(graded[1], "attack_memory_bomb")
    assert "MemoryError" in text, text[-2000:]


def test_processes_are_limited_and_none_outlive_the_kernel(graded):
    text = _autograded_text(graded[1], "attack_process_bomb")
    assert "process limit after" in text
    left = subprocess.run(["pgrep", "-f", "sleep 617"], capture_output=True, text=True).stdout.strip()
    assert left == "", left


def test_files_outside_the_sandbox_are_untouched(graded):
    assert not (ROOT / "course" / "injected.py").exists()
    assert not Path("/tmp/pwned-by-reduce").exists()
    assert "File too large" in _autograded_text(graded[1], "attack_disk_fill") or \
        "Errno 27" in _autograded_text(graded[1], "attack_disk_fill")


def test_feedback_escapes_what_a_student_prints(graded):
    text = _feedback(graded[1], "attack_script_in_feedback")
    assert "<script>alert(" not in text and "<img src=x" not in text


def test_no_page_holds_a_live_script(graded):
    rows, out, *_ = graded
    pages = sorted((out / "feedback").rglob("*.html"))
    assert len(pages) >= len(rows)
    for page in pages:
        assert live_markup(page.read_text(encoding="utf-8", errors="replace")) == [], page


def test_no_script_from_the_submission_runs_when_the_page_is_opened(graded):
    page = graded[1] / "feedback" / "attack_script_in_feedback" / ASSIGNMENT / f"{ASSIGNMENT}.html"
    seen = visit(page, chromium_or_skip(), click="click-me")
    assert seen.ran == [] and seen.title == f"Feedback: {ASSIGNMENT}", seen.ran
    assert seen.errors == [] and seen.external == [] and seen.overflow == {"page": 0, "elements": []}
    # the attacks reached the page: script tags as text, the script output left out with a line saying so
    assert all(f"push('{name}')" in seen.text for name in ("display-script", "md-script"))
    assert "scripts from a notebook do not run here" in seen.text
    assert seen.formulas > 0       # MathJax from beside the page, offline: the exercises' and the student's


def test_an_instructors_nbgrader_generate_feedback_hides_the_hidden_tests(graded):
    """nbgrader's own command in the course tree the grader built: no warning, the course's page."""
    tree = graded[1] / "nbgrader"
    student = "attack_script_in_feedback"
    shutil.rmtree(tree / "feedback" / student)
    done = subprocess.run([sys.executable, "-m", "nbgrader", "generate_feedback", ASSIGNMENT, "--student", student],
                          cwd=tree, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "WARNING" not in done.stdout + done.stderr, done.stdout + done.stderr
    page = tree / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html"
    text = page.read_text(encoding="utf-8")
    assert "BEGIN HIDDEN TESTS" not in text and HIDDEN_LINE not in text and "fb-summary" in text
    assert live_markup(text) == [] and (page.parent / "_static" / "mathjax" / "tex-chtml.js").is_file()


def test_output_flood_is_capped(graded):
    pages = list((graded[1] / "feedback" / "attack_output_flood" / ASSIGNMENT).glob("*.html"))
    assert pages and sum(p.stat().st_size for p in pages) < 8 << 20


def test_dead_or_shut_down_kernels_are_noted(graded):
    rows = graded[0]
    for name in ("exit_kernel", "shutdown_kernel"):
        assert "kernel died" in rows[f"attack_{name}"]["notes"], rows[f"attack_{name}"]
    # kill(-1) reaches only the sandbox's own processes, never the grader: grading went on.
    assert rows["attack_kill_everything"]["status"] == "graded"


def test_a_symlink_is_never_followed(graded):
    row = graded[0]["attack_symlink_to_solution"]
    assert float(row["score"]) == 0 and row["status"] == "refused" and "symbolic link" in row["notes"], row


def test_a_grading_run_beside_the_attackers_is_unaffected(graded):
    """Another `grade` on the same machine at the same time: full marks for each of its students."""
    beside = graded[3]
    assert len(beside) == 3 and all(r["status"] == "graded" and float(r["score"]) == float(r["max_score"]) > 0 for r in beside), beside


def test_students_around_the_attackers_are_unaffected(graded):
    rows, out, *_ = graded
    for student in ("aa_control_before", "zz_control_after"):
        row = rows[student]
        assert float(row["score"]) == float(row["max_score"]) > 0, row
        assert "review" not in row["notes"], row
    persisted = rows["attack_persist_into_next"]
    assert float(persisted["score"]) == float(persisted["max_score"]), persisted   # its own answers are right
    assert "left-behind" not in _autograded_text(out, "zz_control_after")


@pytest.mark.parametrize("name", list(CONTROLLED))
def test_an_attack_on_a_wrong_answer_gains_no_point(graded, name):
    rows = graded[0]
    row = rows[f"wrong_{name}"]
    assert row["status"] == "graded" and float(row["score"]) == 0, row


@pytest.mark.parametrize("name, reason", [
    ("saved_builtins", "embedding operator"),
    ("saved_autograd", "a backward pass ran inside your function"),
    ("dispatch_modes_off", "can switch such rules off"),
])
def test_a_rule_switched_off_in_the_kernel_is_caught_with_its_reason(graded, name, reason):
    rows, out, *_ = graded
    assert reason in _feedback(out, f"wrong_{name}"), name
    if name == "dispatch_modes_off":
        assert "review:" in rows[f"wrong_{name}"]["notes"]


def test_the_kernel_learns_nothing_of_the_hidden_seed(graded):
    """What an answer can read in the kernel (its RNG's seed and state) and print into its
    feedback is neither the grading secret nor any hidden test's seed of its submission."""
    import re

    import nbformat

    from autograder.contract import submission_seed
    from course.checks import _hidden

    rows, out, *_ = graded
    text = _feedback(out, "wrong_seed_probe")
    printed = {int(n) for n in re.findall(r"SEEDPROBE (\d+)", text)}
    assert printed, text[-2000:]
    secret = int((out / "nbgrader" / "grading-secret").read_text())
    nb = nbformat.read(next((out / "nbgrader" / "autograded").rglob(f"wrong_seed_probe/{ASSIGNMENT}/{NOTEBOOK}")),
                       as_version=4)
    source = (ROOT / "course/checks/ch01.py").read_text()
    drawn = set(re.findall(r'draw\(\s*"([^"{]+)"', source))            # each check's draw("tag", hidden)
    subs = set(re.findall(r'\.sub\(f?"([^"{]+)', source))               # and its streams, d.sub("init")
    tags = drawn | {f"{t}/{s}" for t in drawn for s in subs} | {f"{t}/{s}0" for t in drawn for s in subs}
    _hidden.set_grading_seed(submission_seed(secret, nb))
    try:
        hidden = {_hidden.hidden_seed(t) for t in tags} | {_hidden.hidden_seed(t) % 2**31 for t in tags}
    finally:
        _hidden.set_grading_seed(None)
    assert len(tags) > 5 and not printed & (hidden | {secret, secret % 2**63})
    assert str(secret) not in text


def test_the_kernel_cannot_import_the_checks(graded):
    text = _autograded_text(graded[1], "attack_reference_listing")
    assert "ORACLES False" in text and "SOURCE False" in text, text[-2000:]


def test_the_grading_processes_stay_within_their_memory_bound(graded):
    """Each grading process's peak memory, after each submission it graded: whatever a
    submission returned or printed, none raised it by more than the bound over the peak
    after the first submission that process graded (its start-up: imports, a first kernel)."""
    import json

    rows, out, *_ = graded
    seen: dict[int, list] = {}
    for line in (out / "memory.jsonl").read_text().splitlines():
        entry = json.loads(line)
        seen.setdefault(entry["pid"], []).append((entry["student"], entry["peak_kib"]))
    assert sum(len(v) for v in seen.values()) >= len(rows) - 1
    for entries in seen.values():
        first = entries[0][1]
        worst = max(entries, key=lambda e: e[1])
        assert worst[1] - first <= MEMORY_BOUND_KIB, (worst, first, entries)


def test_what_a_submission_prints_or_returns_keeps_pages_small(graded):
    rows, out, *_ = graded
    for name in ("long_failure_message", "print_flood_after_a_judged_cell"):
        pages = list((out / "feedback" / f"wrong_{name}" / ASSIGNMENT).glob("*.html"))
        notebooks = list((out / "nbgrader" / "autograded" / f"wrong_{name}").rglob("*.ipynb"))
        assert pages and notebooks
        assert sum(p.stat().st_size for p in pages + notebooks) < 16 << 20, name
    for name in ("huge_size_reply", "forged_shared_refs_reply"):
        assert "more than a test reads" in _feedback(out, f"wrong_{name}"), name
