"""The static tamper scan: what an honest answer never needs is flagged; honest code is not."""

from __future__ import annotations

import nbformat
import pytest

from autograder.tamper import build_context, scan_notebook, scan_source
from notebook_tools import ROOT, grade_id, release_notebook, solution_answers, student_notebook

ASSIGNMENTS = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def ctx():
    release = release_notebook("ch01_embeddings")
    return build_context(release, release)


def notes_for(source: str, ctx) -> list[str]:
    return scan_source(source, "ex3_answer", ctx)


FLAGGED = [
    # patching modules, builtins and the checks
    ("torch.allclose = lambda *a, **k: True", "patches torch.allclose"),
    ("torch.testing.assert_close = print", "patches torch.testing.assert_close"),
    ("nn.Module.__call__ = lambda self, x: x", "patches nn.Module.__call__"),
    ("checks.check_encode_decode = lambda *a, **k: None", "patches checks.check_encode_decode"),
    ("import builtins\nbuiltins.print = None", "patches builtins.print"),
    ("__builtins__.len = lambda x: 0", "patches __builtins__.len"),
    ("setattr(torch, 'allclose', lambda *a: True)", "patches torch with setattr"),
    ("delattr(checks, 'check_embedding')", "patches checks with delattr"),
    ("del torch.allclose", "deletes torch.allclose"),
    ("import torch as t\nt.allclose = None", "patches t.allclose"),
    ("alias = torch\nalias.allclose = None", "patches alias.allclose"),
    ("def f():\n    torch.allclose = None", "patches torch.allclose"),
    ("checks = None", "rebinds checks"),
    ("def cheat():\n    global checks\n    checks = None", "rebinds checks"),
    ("from torch import nn as torch", "rebinds torch"),
    # the interpreter and the kernel
    ("import sys\nsys.modules['course.checks.ch01'] = None", "changes sys.modules"),
    ("import sys\nx = sys.modules", "touches sys.modules"),
    ("get_ipython().run_cell('x = 1')", "uses get_ipython"),
    ("exec('x = 1')", "runs exec"),
    ("y = eval('1 + 1')", "runs eval"),
    ("code = compile('1', 'x', 'eval')", "compiles code"),
    ("os_module = __import__('os')", "calls __import__"),
    ("import importlib\nm = importlib.import_module('os')", "imports importlib"),
    ("globals()['checks'] = None", "uses globals()"),
    ("import sys\nframe = sys._getframe(1)", "reads interpreter frames"),
    ("def f(g):\n    return g.__globals__", "reads __globals__"),
    # processes and signals
    ("import os\nos.kill(os.getppid(), 9)", "sends a signal (os.kill)"),
    ("import os\nos._exit(0)", "exits the process (os._exit)"),
    ("import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)", "imports signal"),
    ("import subprocess\nsubprocess.run(['pkill', 'python'])", "imports subprocess"),
    ("import os\nos.system('rm -rf ~')", "runs a shell command (os.system)"),
    ("from os import system\nsystem('ls')", "imports os.system"),
    ("import ctypes", "imports ctypes"),
    # files
    ("open('grades.csv', 'w').write('x')", "writes a file (open mode 'w')"),
    ("with open('log.txt', mode='a') as f:\n    f.write('x')", "writes a file (open mode 'a')"),
    ("with open('new.txt', 'x') as f:\n    pass", "writes a file (open mode 'x')"),
    ("from pathlib import Path\nPath('a.py').write_text('x')", "writes a file (.write_text)"),
    ("from pathlib import Path\nPath('a.bin').write_bytes(b'x')", "writes a file (.write_bytes)"),
    ("import os\nos.remove('gradebook.db')", "deletes a file (os.remove)"),
    ("import shutil\nshutil.rmtree('/tmp')", "imports shutil"),
    ("torch.save({}, 'capstone_checkpoints/lm.pt')", "writes a file (torch.save)"),
    ("text = open('/proc/self/environ').read()", "reads /proc"),
    # the course's grading and reference code
    ("import autograder.grade", "imports autograder.grade"),
    ("from course.checks import ch01", "imports course.checks.ch01"),
    ("from course.checks._core import expect_close", "imports course.checks._core.expect_close"),
    ("import nbgrader", "imports nbgrader"),
    ("def encode(text, merges):\n    return checks._merge_oracle(list(text.encode()), (1, 2), 3)", "uses checks._merge_oracle"),
    # the environment
    ("import os\nos.environ['COURSE_PROFILE'] = 'smoke'", "changes os.environ"),
    ("import os\nos.environ.update(COURSE_DEVICE='cpu')", "changes os.environ"),
    ("import os\ndel os.environ['HOME']", "changes os.environ"),
    ("import os\nsecret = os.environ.get('TOKEN')", "reads os.environ"),
    # magics and shell escapes
    ("!pip install cheat", "runs a shell command (!pip install cheat)"),
    ("%env COURSE_PROFILE=smoke", "runs the magic %env"),
    ("%%bash\necho hi", "runs the cell magic %%bash"),
    ("files = !ls", "runs a shell command or magic"),
]


@pytest.mark.parametrize("source,expected", FLAGGED, ids=[f[1] + f" [{i}]" for i, f in enumerate(FLAGGED)])
def test_each_construct_is_flagged(ctx, source, expected):
    notes = notes_for(source, ctx)
    assert any(expected in n for n in notes), notes
    assert all(n.startswith("review: ex3_answer line ") for n in notes), notes


# Exercise 1 answered with course.checks.ch01's oracles by indirect routes (issue 31): each scored
# full marks with no note before the scan knew them. (route, answer, what its note says)
ROUTES = [
    ("pkgutil.resolve_name", 'import pkgutil\nmerge_pair = pkgutil.resolve_name("course.checks.ch01:_merge_oracle")',
     "imports pkgutil"),
    ("pydoc.locate", 'import pydoc\nmerge_pair = pydoc.locate("course.checks.ch01._merge_oracle")', "imports pydoc"),
    ("runpy.run_module", 'import runpy\nmerge_pair = runpy.run_module("course.checks.ch01")["_merge_oracle"]',
     "imports runpy"),
    ("__main__", "import __main__\nmerge_pair = __main__.checks._merge_oracle", "imports __main__"),
    ("locals() and attrgetter", 'import operator\n'
     'merge_pair = operator.attrgetter("_merge_oracle")(locals()["che" + "cks"])', "uses locals()"),
    ("attrgetter of a computed name", 'from operator import attrgetter\nname = "_merge" + "_oracle"\n'
     "merge_pair = attrgetter(name)(ns)", "by a computed or private name (attrgetter)"),
    ("builtins via __self__", '_b = [print][0].__self__\n_imp = getattr(_b, "__imp" + "ort__")\n'
     'merge_pair = _imp("course.checks.ch01", fromlist=["x"])._merge_oracle', "reads __self__"),
    ("getattr of a computed name", '_imp = getattr(b, "__imp" + "ort__")', "by a computed name (getattr)"),
    ("getattr of __import__", '_imp = getattr(b, "__import__")', "reads __import__ (getattr)"),
    ("pkgutil.get_data and types.FunctionType", 'import pkgutil, types\n'
     '_src = pkgutil.get_data("course", "checks/ch01.py")\n'
     "_code = [c for c in compile(_src, 'x', 'exec').co_consts if hasattr(c, 'co_name')][0]\n"
     "merge_pair = types.FunctionType(_code, {})", "builds a function from a code object (types.FunctionType)"),
    ("types.CodeType", "from types import CodeType\ncode = CodeType(*parts)", "types.CodeType"),
    ("[sys][0].modules", 'import sys\nmerge_pair = [sys][0].modules["course.checks.ch01"]._merge_oracle',
     "hands the module sys around as a value"),
    ("sys through os", 'import os\nm = os.sys.modules["course.checks.ch01"]', "(.sys)"),
    ("importlib through another module", "importer = torch.serialization.importlib", "(.importlib)"),
    ("a line that ends in ? inside a string", 'x = """?\n"""; from course.checks.ch01 import _merge_oracle; '
     'y = """?\n"""\n#"""', "line 2 imports course.checks.ch01._merge_oracle"),
    ("a safe magic inside a string", 's = """\n%matplotlib inline"""; import course.checks.ch01 as c; t = """\n"""',
     "line 2 imports course.checks.ch01"),
    ("torch._C", "state = torch._C._get_tracing_state()", "a private part of torch, torch._C"),
    ("getattr(torch, '_C')", "C = getattr(torch, '_C')", "a private part of torch, torch._C"),
    ("torch.utils._python_dispatch", "with torch.utils._python_dispatch._disable_current_modes():\n    pass",
     "a private part of torch, torch.utils._python_dispatch"),
    ("from torch.utils import _python_dispatch", "from torch.utils import _python_dispatch",
     "a private part of torch, torch.utils._python_dispatch"),
    ("torch.ops.aten", "out = torch.ops.aten.embedding(weight, ids)", "torch's operator registry"),
    ("__torch_function__", "class T(torch.Tensor):\n    @classmethod\n    def __torch_function__(cls, *a, **k):\n"
     "        return True", "defines __torch_function__"),
]


@pytest.mark.parametrize("route,source,expected", ROUTES, ids=[r[0] for r in ROUTES])
def test_each_route_to_the_reference_code_is_noted(ctx, route, source, expected):
    notes = notes_for(source, ctx)
    assert any(expected in n for n in notes), notes


def test_the_scan_reads_a_cell_as_ipython_runs_it(ctx):
    """The ``?`` route is real: IPython's own transformer keeps the import as code (the scan used
    to take the line for a help request and skip it), and a real help request runs nothing."""
    from IPython.core.inputtransformer2 import TransformerManager

    hidden = next(source for route, source, _ in ROUTES if route.startswith("a line that ends in ?"))
    assert "from course.checks.ch01 import" in TransformerManager().transform_cell(hidden)
    help_line = "from course.checks.ch01 import _merge_oracle; torch.allclose?"
    assert "import" not in TransformerManager().transform_cell(help_line)     # IPython runs only the help
    assert notes_for(help_line, ctx) == []
    assert notes_for("x = 1\n!ls \\\n  -la\ny = 2\nimport ctypes", ctx) == [     # joined lines keep numbers
        "review: ex3_answer line 2 runs a shell command (!ls \\)",
        "review: ex3_answer line 5 imports ctypes (reaches into the interpreter)"]


def test_note_names_the_cell_and_the_line(ctx):
    assert notes_for("import math\n\n\ntorch.allclose = lambda *a: True", ctx) == [
        "review: ex3_answer line 4 patches torch.allclose"]


HONEST = [
    "squares = [x * x for x in range(10) if x % 2]",
    "with torch.no_grad():\n    y = torch.zeros(3)",
    "class Embedding(nn.Module):\n    def __init__(self, vocab_size, d_model):\n        super().__init__()\n"
    "        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))\n"
    "        nn.init.normal_(self.weight, mean=0.0, std=0.02)\n",
    "class Tied(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.embed = nn.Embedding(5, 3)\n"
    "        self.head = nn.Linear(3, 5, bias=False)\n        self.head.weight = self.embed.weight\n",
    "@torch.no_grad()\ndef evaluate(model):\n    model.eval()\n    return model",
    "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F",
    "import re\npattern = re.compile(r'\\w+')",
    "def step(opt):\n    for group in opt.param_groups:\n        group['lr'] = 0.1",
    "def f(data):\n    data.cache = {}\n    return data",
    "pe = torch.zeros(4, 6)\npe[:, 0::2] = 1.0",
    "with open('notes.txt') as f:\n    text = f.read()",
    "x = torch.compile",
    "%timeit sum(range(10))",
    "%time y = [i for i in range(3)]",
    "%matplotlib inline\n%load_ext autoreload\n%autoreload 2",
    "torch.allclose?",
    "?torch.allclose\ntorch.allclose??\n%pinfo torch",
    'def f(ids):\n    """Does it merge?\n    Really?\n    """\n    return ids  # why?',
    'print(f"{torch.__version__}?")',
    "for module in model.modules():\n    module.eval()",
    "pick = getattr(model, 'weight')\nimport operator\nkey = operator.itemgetter(1)",
    "import math\nx = math.sqrt(2)\nn = torch.__version__",
    "scores = {}\nscores.update(a=1)",
    "def merge(ids, pair, new_id):\n    out, i = [], 0\n    while i < len(ids):\n        i += 1\n    return out",
]


@pytest.mark.parametrize("source", HONEST)
def test_honest_code_is_not_flagged(ctx, source):
    assert notes_for(source, ctx) == []


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_no_answer_of_any_solution_is_flagged(assignment):
    solution = nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    release = release_notebook(assignment)
    assert scan_notebook(solution, release) == []
    assert scan_notebook(student_notebook(assignment, solution_answers(assignment)), release) == []
    assert scan_notebook(release, release) == []          # the untouched exercise


def test_unparseable_cells_are_noted_not_fatal(ctx):
    assert notes_for("def broken(:\n    pass", ctx) == ["review: ex3_answer could not be parsed (line 1: invalid syntax)"]
    notes = notes_for("%timeit -n 3 f(x)\ny = (", ctx)
    assert len(notes) == 1 and notes[0].startswith("review: ex3_answer could not be parsed")
    assert notes_for("x = 1\x00", ctx)[0].startswith("review: ex3_answer could not be parsed")


def test_added_cells_are_scanned_and_locked_cells_are_not():
    assignment = "ch01_embeddings"
    nb = student_notebook(assignment, solution_answers(assignment))
    nb.cells.append(nbformat.v4.new_code_cell("import subprocess"))
    for cell in nb.cells:
        if grade_id(cell) == "ex1_visible":
            cell.source = "import os\nos.system('x')"     # nbgrader restores locked cells: not scanned
    notes = scan_notebook(nb, release_notebook(assignment))
    assert notes == [f"review: cell {len(nb.cells)} (added) line 1 imports subprocess (runs programs)"]


def test_capstone_course_state_is_protected():
    assignment = "ch07_capstone"
    release = release_notebook(assignment)
    ctx = build_context(release, release)
    assert any("patches profile.lm" in n for n in scan_source("profile.lm.steps = 1", "ex2_answer", ctx))
    assert any("rebinds profile" in n for n in scan_source("profile = None", "ex2_answer", ctx))
    assert scan_source("def train(model, steps):\n    profile = 3\n    return profile", "ex2_answer", ctx) == []
