"""Tamper evidence: a static look (Python ``ast``, nothing is run) at the code a student wrote.

It reads the answer cells (nbgrader ``solution: true``) and every code cell the student added
or that nbgrader would not restore, and flags what an honest answer never needs: patching
modules or builtins (``torch.allclose = ...``, ``setattr(checks, ...)``), rebinding or patching
the names the course's own cells rely on (``checks``, ``profile``, ...), ``sys.modules``,
``get_ipython``, ``exec``/``eval``/``compile``, ``__import__``/``importlib``, killing or
spawning processes, writing or deleting files, importing the grading or reference code
(``autograder``, ``nbgrader``, ``course.checks``), reading ``/proc`` or the environment,
``globals()``/``__builtins__``, frames and other interpreter internals, shell escapes and
magics. Routes that reach code by a name the scan cannot read are noted too: ``pkgutil``,
``pydoc``, ``runpy``, ``__main__``, attributes such as ``.import_module`` or ``.modules`` on any
object, builtins through a bound method's ``__self__``, functions built from code objects
(``types.FunctionType``), ``getattr``/``attrgetter`` with a computed name, ``locals()``/``vars()``,
a watched module (``sys``, ``os``, ...) handed around as a value (``[sys][0]``), and torch's
private parts (``torch._C``, ``torch.utils._python_dispatch``) and operator registry (``torch.ops``).

A cell is read as the kernel runs it: transformed by IPython's own input transformers first,
so ``obj?``, ``!cmd`` and ``%magic`` count only where IPython takes them as such (never inside
a string, where a line-based reading would let one ``?`` hide the next line from every rule).

Each finding is a short human note, ``review: ex3_answer line 4 patches torch.allclose``.
The notes are evidence for a person to read; they never change a score by themselves. One
thing follows from some of them: a finding that can switch off a rule the grader enforces
inside the kernel (a forbidden built-in, a recorder of what the code computes) — a patch,
torch's private parts, code reached by a name the scan cannot read — is also returned in
``doubts``, and the grader then fails the tests that rely on such a rule, with that finding
as the reason (:func:`autograder.remote.doubt_kernel_rules`). Writing files, processes, the
environment: noted, but they cannot switch a rule off in the kernel's process. A cell that does
not parse (a syntax error, an unknown magic) gives ``review: <cell> could not be parsed``.

Names are resolved through the notebook's imports (``nn`` is ``torch.nn``, ``checks`` is
``course.checks.ch01``) with Python's scoping, so ``self.head.weight = ...`` or a local
variable that happens to share a module's name is not flagged.
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

REVIEW = "review:"
MAX_NOTES = 20                      # per notebook; more are summarised in one note

BUILTIN_NAMES = frozenset(dir(builtins))

# Modules an answer never needs: importing or using any of them (or a submodule) is flagged.
MODULES = {
    "subprocess": "runs programs", "ctypes": "reaches into the interpreter", "cffi": "loads native code",
    "signal": "signals", "importlib": "imports code dynamically", "shutil": "copies or deletes files",
    "multiprocessing": "starts processes", "socket": "network", "pty": "a terminal", "gc": "live objects",
    "builtins": "the builtins", "atexit": "runs code at exit", "resource": "process limits",
    "IPython": "the IPython shell", "ipykernel": "the kernel", "jupyter_client": "the kernel",
    "autograder": "the course's grading code", "nbgrader": "the grading code",
    "course.checks": "the course's reference code",
    # routes to a module or object by its name, or to running code: each can reach course.checks
    "pkgutil": "loads modules and their files by name", "pydoc": "loads objects by name",
    "runpy": "runs modules", "__main__": "the notebook's own namespace", "marshal": "loads compiled code",
    "code": "runs code", "codeop": "compiles code", "zipimport": "imports code",
}

# Calls (or references) that an answer never needs, by qualified name (or prefix ending in '*').
CALLS = {
    "builtins.exec": "runs exec", "builtins.eval": "runs eval", "builtins.compile": "compiles code",
    "builtins.__import__": "calls __import__", "builtins.globals": "uses globals()",
    "builtins.breakpoint": "calls breakpoint", "builtins.locals": "uses locals()",
    "builtins.vars": "uses vars()",
    "types.FunctionType": "builds a function from a code object (types.FunctionType)",
    "types.LambdaType": "builds a function from a code object (types.LambdaType)",
    "types.CodeType": "builds a code object (types.CodeType)",
    "torch.ops": "calls torch's operator registry (torch.ops)", "torch.ops.*": "calls torch's operator registry",
    "torch.library": "changes torch's operators (torch.library)", "torch.library.*": "changes torch's operators",
    "torch.overrides": "changes how torch dispatches (torch.overrides)",
    "torch.overrides.*": "changes how torch dispatches",
    "os.system": "runs a shell command (os.system)", "os.popen": "runs a shell command (os.popen)",
    "os.kill": "sends a signal (os.kill)", "os.killpg": "sends a signal (os.killpg)",
    "os._exit": "exits the process (os._exit)", "os.abort": "aborts the process (os.abort)",
    "os.fork": "forks the process", "os.forkpty": "forks the process", "os.exec*": "replaces the process",
    "os.spawn*": "starts a process", "os.posix_spawn*": "starts a process",
    "os.setsid": "leaves its process group", "os.setpgrp": "leaves its process group",
    "os.remove": "deletes a file", "os.unlink": "deletes a file", "os.rmdir": "deletes a folder",
    "os.removedirs": "deletes folders", "os.rename": "renames a file", "os.renames": "renames a file",
    "os.replace": "replaces a file", "os.truncate": "truncates a file", "os.chmod": "changes permissions",
    "os.chown": "changes ownership", "os.symlink": "creates a link", "os.link": "creates a link",
    "os.mkfifo": "creates a pipe", "os.open": "opens a file descriptor", "os.write": "writes to a file descriptor",
    "os.putenv": "changes the environment", "os.unsetenv": "changes the environment",
    "os.getenv": "reads the environment", "os.environ": "reads os.environ", "os.environb": "reads os.environ",
    "os.chdir": "changes the working folder",
    "sys.modules": "touches sys.modules", "sys.exit": "exits (sys.exit)", "sys._getframe": "reads interpreter frames",
    "sys.settrace": "installs a tracer", "sys.setprofile": "installs a profiler", "sys.meta_path": "changes imports",
    "sys.path_hooks": "changes imports", "sys.addaudithook": "installs an audit hook",
    "sys.stdout": "replaces or reads sys.stdout", "sys.stderr": "replaces or reads sys.stderr",
    "inspect.currentframe": "reads interpreter frames", "inspect.stack": "reads interpreter frames",
    "inspect.getouterframes": "reads interpreter frames", "inspect.getsource": "reads source code",
    "torch.save": "writes a file (torch.save)", "numpy.save": "writes a file (numpy.save)",
    "numpy.savez": "writes a file (numpy.savez)", "numpy.savetxt": "writes a file (numpy.savetxt)",
    "pathlib.Path.write_text": "writes a file", "pathlib.Path.write_bytes": "writes a file",
}
# What can be noted but cannot switch off a rule inside the kernel's own process (files,
# processes, signals, the environment, output): these findings put no test in doubt.
SIDE_EFFECTS = ("os.", "sys.exit", "sys.stdout", "sys.stderr", "torch.save", "numpy.save", "pathlib.", "subprocess",
                "signal", "shutil", "multiprocessing", "socket", "pty", "atexit", "resource", "IPython", "ipykernel",
                "jupyter_client", "autograder", "nbgrader", "inspect.getsource", "builtins.open", "builtins.breakpoint",
                "io.open", "codecs.open")


def _doubts(qualified: str) -> bool:
    """Whether using ``qualified`` can switch off a rule the grader enforces in the kernel."""
    for name in SIDE_EFFECTS:
        module = name.rstrip(".")
        if qualified == module or qualified.startswith(module + "."):
            return False
    return True


OPENERS = {"builtins.open", "io.open", "codecs.open", "os.fdopen"}
MUTATED = {"os.environ": "changes os.environ", "os.environb": "changes os.environ",
           "sys.modules": "changes sys.modules"}
MUTATING_METHODS = {"update", "pop", "popitem", "setdefault", "clear", "__setitem__", "__delitem__", "append",
                    "insert", "extend", "remove"}
# Attribute names no honest answer reads, whatever object they are on.
INTERNAL_ATTRS = {"__globals__", "__builtins__", "__code__", "__closure__", "__subclasses__", "f_globals",
                  "f_locals", "f_back", "f_builtins", "tb_frame", "gi_frame", "cr_frame", "__import__",
                  "__loader__", "__self__", "__torch_function__", "__torch_dispatch__"}
# Attribute names that import code or reach sys's module table, on whatever object they are read
# (``os.sys.modules``, ``some_module.importlib``): a qualified name cannot follow those routes.
IMPORT_ATTRS = {"import_module", "resolve_name", "run_module", "run_path", "find_spec", "module_from_spec",
                "spec_from_file_location", "spec_from_loader", "exec_module", "load_module", "get_data",
                "importlib", "pkgutil", "pydoc", "runpy", "sys"}
# Modules whose object, handed around as a value (``[sys][0].modules``), takes the scan's
# qualified names out of reach: using one other than as ``module.attribute`` is noted.
WATCHED_MODULES = {"sys", "os", "builtins", "importlib", "types", "inspect", "gc", "pkgutil", "pydoc",
                   "runpy", "__main__", "operator"}
NAME_LOOKUPS = {"builtins.getattr", "builtins.hasattr", "builtins.setattr", "builtins.delattr"}
# Methods that write or delete files when called on a path object.
FILE_METHODS = {"write_text": "writes a file", "write_bytes": "writes a file", "unlink": "deletes a file",
                "rmdir": "deletes a folder", "touch": "creates a file", "symlink_to": "creates a link",
                "hardlink_to": "creates a link", "chmod": "changes permissions"}
NAMES = {"get_ipython": "uses get_ipython", "__builtins__": "touches __builtins__",
         "__import__": "calls __import__"}

SAFE_LINE_MAGICS = {"matplotlib", "time", "timeit", "precision", "pprint", "who", "whos", "who_ls", "pdb",
                    "debug", "xmode", "prun", "lprun", "memit", "mprun", "pwd", "pinfo", "pinfo2", "lsmagic",
                    "magic", "quickref", "autoreload", "aimport"}
SAFE_EXTENSIONS = {"autoreload", "memory_profiler", "line_profiler"}
PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun"}


def _match(table: dict[str, str], qualified: str) -> str | None:
    if qualified in table:
        return table[qualified]
    for key, message in table.items():
        if key.endswith("*") and qualified.startswith(key[:-1]):
            return message
    return None


def _module_rule(qualified: str) -> str | None:
    for module, message in MODULES.items():
        if qualified == module or qualified.startswith(module + "."):
            return message
    return _private_torch(qualified)


def _private_torch(qualified: str) -> str | None:
    """``torch._C``, ``torch.utils._python_dispatch``: torch's internals, which can switch off
    what a check watches; dunders such as ``torch.__version__`` are public."""
    parts = qualified.split(".")
    if parts[0] != "torch":
        return None
    for i, part in enumerate(parts[1:], start=2):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return f"a private part of torch, {'.'.join(parts[:i])}"
    return None


# ----------------------------------------------------------------------------- notebook context

def _nbgrader(cell) -> dict:
    from .contract import nbgrader_meta

    return nbgrader_meta(cell)


def _parse_quietly(source: str) -> ast.Module | None:
    try:
        return ast.parse(_to_python(source)[0])
    except Exception:  # noqa: BLE001 - a cell that cannot be read adds nothing to the context
        return None


def _import_bindings(tree: ast.AST, top_level_only: bool = True) -> dict[str, str]:
    """Name -> qualified module/object for the imports of ``tree``."""
    out: dict[str, str] = {}
    body = tree.body if top_level_only and isinstance(tree, ast.Module) else list(ast.walk(tree))
    for node in body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    out[alias.asname] = alias.name
                else:
                    out[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if alias.name != "*":
                    out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return out


def _top_level_bound(tree: ast.Module) -> set[str]:
    """Names a cell binds at its top level (not inside functions, classes or comprehensions)."""
    names: set[str] = set()
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(_import_bindings(ast.Module(body=[node], type_ignores=[])))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        stack.extend(ast.iter_child_nodes(node))
    return names


def _loaded(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


@dataclass
class Context:
    """What the course's own (locked) cells define and use."""

    imports: dict[str, str] = field(default_factory=dict)      # name -> qualified, from every cell
    protected: dict[str, str] = field(default_factory=dict)    # name -> qualified or "" (not a module)
    locked_ids: set[str] = field(default_factory=set)
    released_sources: set[str] = field(default_factory=set)    # code cells of the release without an id


def build_context(submitted, released=None) -> Context:
    """Imports of all cells; names bound by locked cells and used by locked cells are protected."""
    ctx = Context()
    locked_trees: list[tuple[ast.Module, bool]] = []
    for cell in (released.cells if released is not None else []):
        meta = _nbgrader(cell)
        if cell.get("cell_type") != "code":
            continue
        if not meta.get("grade_id"):
            ctx.released_sources.add(cell.source.strip())
        if meta.get("grade_id") and meta.get("locked"):
            ctx.locked_ids.add(meta["grade_id"])
            tree = _parse_quietly(cell.source)
            if tree is not None:
                locked_trees.append((tree, bool(meta.get("grade"))))
    locked_imports: dict[str, str] = {}
    for tree, _ in locked_trees:
        locked_imports.update(_import_bindings(tree))
    ctx.imports.update(locked_imports)
    # The names the score depends on: what graded cells load, and (transitively) what the locked
    # cells that bind those names load. Demo cells' variables are not among them.
    needed: set[str] = set()
    for tree, graded in locked_trees:
        if graded:
            needed |= _loaded(tree)
    changed = True
    while changed:
        changed = False
        for tree, graded in locked_trees:
            if not graded and _top_level_bound(tree) & needed and not _loaded(tree) <= needed:
                needed |= _loaded(tree)
                changed = True
    bound: set[str] = set()
    for tree, _ in locked_trees:
        bound |= _top_level_bound(tree)
    for cell in submitted.cells:
        if cell.get("cell_type") == "code" and _nbgrader(cell).get("grade_id") not in ctx.locked_ids:
            tree = _parse_quietly(cell.source)
            if tree is not None:
                for name, qualified in _import_bindings(tree).items():
                    ctx.imports.setdefault(name, qualified)
    for name in (bound & needed) | (needed & BUILTIN_NAMES):
        ctx.protected[name] = locked_imports.get(name, "")
    return ctx


# ----------------------------------------------------------------------------- IPython syntax

_OPTIONS = re.compile(r"((?:-\w+(?:\s+\d+)?\s+)*)(.*)$", re.DOTALL)
_HELP_MAGICS = {"pinfo", "pinfo2", "psearch"}


def _to_python(source: str) -> tuple[str, list[tuple[int, str]]]:
    """IPython input -> plain Python with the same line numbers, and what its IPython syntax does.

    The cell is transformed by IPython's own input transformers, as the kernel does before it
    runs a cell: a ``?``, ``!`` or ``%`` is special syntax only where IPython's tokens say so,
    never inside a string (a line-based reading let ``x = \"\"\"?`` hide the next line from
    every rule). Each transformed piece becomes one line, padded with blank lines so that the
    line numbers stay those of the cell."""
    from IPython.core import inputtransformer2 as it

    text = source if source.endswith("\n") else source + "\n"
    original = text.splitlines(keepends=True)
    lines = it.leading_empty_lines(original)
    skipped = len(original) - len(lines)
    for transform in (it.leading_indent, it.classic_prompt, it.ipython_prompt):
        lines = transform(lines)
    if lines and lines[0].startswith("%%") and not re.match(r"%%\w+\?", lines[0]):
        return _cell_magic(lines, skipped)
    manager, transformed = it.TransformerManager(), []
    for _ in range(it.TRANSFORM_LOOP_LIMIT):
        before = lines
        changed, lines = manager.do_one_token_transform(lines)
        if not changed:
            break
        at = next((i for i, (a, b) in enumerate(zip(before, lines)) if a != b), len(lines) - 1)
        lines[at + 1:at + 1] = ["\n"] * (len(before) - len(lines))     # the lines it joined
        transformed.append(at)
    findings: list[tuple[int, str]] = []
    for at in transformed:
        raw = original[at + skipped].strip()[:40] if at + skipped < len(original) else ""
        lines[at], finding = _magic_line(lines[at], raw)
        if finding:
            findings.append((at + skipped + 1, finding))
    return "\n" * skipped + "".join(lines), findings


def _cell_magic(lines: list[str], skipped: int) -> tuple[str, list[tuple[int, str]]]:
    """A cell that starts with ``%%name``: its body is Python only for the timing magics."""
    name, _, argument = lines[0][2:].rstrip().partition(" ")
    if name not in PYTHON_CELL_MAGICS:
        return "", [(skipped + 1, f"runs the cell magic %%{name}")]
    body, findings = _to_python("".join(lines[1:]))
    setup = _OPTIONS.match(argument).group(2).strip() if name == "timeit" else ""
    shifted = [(n + skipped + 1, m) for n, m in findings]
    return "\n" * skipped + setup.replace("\n", " ") + "\n" + body, shifted


def _magic_line(line: str, raw: str) -> tuple[str, str | None]:
    """One line IPython transformed -> (Python the scan reads in its place, a finding or None).

    IPython writes its syntax as ``get_ipython().method('name', 'argument')`` (or ``x = ...``);
    any other result (an autocall such as ``/f x`` -> ``f(x)``) is ordinary code, scanned as such."""
    indent = line[:len(line) - len(line.lstrip())]
    try:
        statement = ast.parse(line.strip()).body[0]
    except (SyntaxError, ValueError, IndexError):
        return line, None
    call = statement.value if isinstance(statement, (ast.Expr, ast.Assign)) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Call) and isinstance(call.func.value.func, ast.Name)
            and call.func.value.func.id == "get_ipython"
            and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in call.args)):
        return line, None
    method, args = call.func.attr, [a.value for a in call.args]
    blank = indent + "pass\n"
    if isinstance(statement, ast.Assign):
        return blank, f"runs a shell command or magic ({raw})"
    if method == "system":
        return blank, f"runs a shell command ({raw})"
    if method == "show_usage":
        return blank, None
    if method != "run_line_magic" or len(args) != 2:
        return blank, f"runs IPython syntax ({raw})"
    name, argument = args
    if name in _HELP_MAGICS:
        return blank, None
    if name in ("time", "timeit"):
        timed = _OPTIONS.match(argument).group(2).strip()
        return (indent + timed.replace("\n", " ") + "\n" if timed else blank), None
    if name == "load_ext" and argument.split()[:1] and argument.split()[0] in SAFE_EXTENSIONS:
        return blank, None
    return blank, (None if name in SAFE_LINE_MAGICS else f"runs the magic %{name}")


# ----------------------------------------------------------------------------- the scan of one cell

class _Scope:
    def __init__(self, bindings: dict[str, str | None], parent: "_Scope | None" = None, is_function=False):
        self.bindings = bindings          # name -> qualified (a module or imported object) or None (a local)
        self.parent = parent
        self.is_function = is_function
        self.globals: set[str] = set()

    def lookup(self, name: str) -> tuple[bool, str | None]:
        """(found, qualified)."""
        scope = self
        while scope is not None:
            if name in scope.bindings and name not in scope.globals:
                return True, scope.bindings[name]
            scope = scope.parent
        return False, None


def _function_locals(node) -> set[str]:
    """Names local to a function: parameters and everything it binds (not in nested scopes)."""
    names: set[str] = set()
    declared: set[str] = set()
    args = node.args
    for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if a is not None:
            names.add(a.arg)
    if isinstance(node, ast.Lambda):
        return names
    stack = list(node.body)
    while stack:
        sub = stack.pop()
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(sub.name)
            stack.extend(sub.decorator_list)
            continue
        if isinstance(sub, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(sub, (ast.Global, ast.Nonlocal)):
            declared.update(sub.names)
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
            names.add(sub.id)
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            names.update(a.asname or a.name.split(".")[0] for a in sub.names)
        elif isinstance(sub, ast.ExceptHandler) and sub.name:
            names.add(sub.name)
        stack.extend(ast.iter_child_nodes(sub))
    return names - declared


class _Scanner(ast.NodeVisitor):
    def __init__(self, ctx: Context):
        self.ctx = ctx
        top = {name: q for name, q in ctx.imports.items()}
        self.scope = _Scope(dict(top))
        self.findings: list[tuple[int, str]] = []
        self.doubtful: set[tuple[int, str]] = set()  # findings that can switch a kernel-side rule off
        self.handled: set[int] = set()
        self.attribute_bases: set[int] = set()     # nodes read as ``node.attribute``
        self.called: set[int] = set()              # nodes called as ``node(...)``

    # -- helpers
    def flag(self, node: ast.AST, message: str, doubt: bool = True) -> None:
        finding = (getattr(node, "lineno", 1), message)
        self.findings.append(finding)
        if doubt:
            self.doubtful.add(finding)

    def qualified(self, node: ast.AST) -> str | None:
        """The dotted name of a module, imported object or builtin that ``node`` denotes."""
        if isinstance(node, ast.Name):
            found, q = self.scope.lookup(node.id)
            if found:
                return q
            if node.id in BUILTIN_NAMES or node.id == "__builtins__":
                return f"builtins.{node.id}"
            return None
        if isinstance(node, ast.Attribute):
            base = self.qualified(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call):
            func = self.qualified(node.func)
            if func == "builtins.getattr" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                    and isinstance(node.args[1].value, str):
                base = self.qualified(node.args[0])
                return f"{base}.{node.args[1].value}" if base else None
            if func in ("importlib.import_module", "builtins.__import__") and node.args \
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                return node.args[0].value
        return None

    def root_name(self, node: ast.AST) -> str | None:
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    def protected_root(self, node: ast.AST) -> str | None:
        """The protected course name at the root of ``node`` (``profile`` in ``profile.lm.steps``)."""
        name = self.root_name(node)
        if name is None or name not in self.ctx.protected:
            return None
        scope = self.scope
        while scope is not None and scope.parent is not None:   # shadowed by a local?
            if name in scope.bindings and name not in scope.globals:
                return None
            scope = scope.parent
        return name

    def course_object(self, node: ast.AST) -> bool:
        return self.qualified(node) is not None or self.protected_root(node) is not None

    def at_top_level(self, name: str) -> bool:
        scope = self.scope
        if scope.parent is None:
            return True
        return name in scope.globals

    def bind(self, name: str, qualified: str | None, node: ast.AST, via_import: bool = False) -> None:
        if self.at_top_level(name) and name in self.ctx.protected:
            original = self.ctx.protected[name]
            if not (via_import and original and qualified == original):
                self.flag(node, f"rebinds {name}, which the course's cells use")
        scope = self.scope
        if name in scope.globals:
            while scope.parent is not None:
                scope = scope.parent
        scope.bindings[name] = qualified

    def bind_target(self, target: ast.AST, value: ast.AST | None) -> None:
        if isinstance(target, ast.Name):
            self.bind(target.id, self.qualified(value) if value is not None else None, target)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.bind_target(element, None)
        elif isinstance(target, ast.Starred):
            self.bind_target(target.value, None)
        else:
            self.store_into(target, "patches")

    def store_into(self, target: ast.AST, verb: str) -> None:
        """An attribute or item of something is assigned or deleted."""
        if isinstance(target, ast.Attribute):
            if self.course_object(target.value):
                self.flag(target, f"{verb} {_text(target)}")
                self.handled.add(id(target.value))
        elif isinstance(target, ast.Subscript):
            q = self.qualified(target.value)
            if q in MUTATED:
                self.flag(target, MUTATED[q])
                self.handled.add(id(target.value))
            elif self.course_object(target.value):
                self.flag(target, f"{verb} {_text(target)}")
                self.handled.add(id(target.value))

    # -- scopes
    def _visit_function(self, node) -> None:
        if getattr(node, "name", "") in ("__torch_function__", "__torch_dispatch__"):
            self.flag(node, f"defines {node.name} (changes what torch functions do on its objects)")
        for decorator in getattr(node, "decorator_list", []):
            self.visit(decorator)
        for default in [*node.args.defaults, *[d for d in node.args.kw_defaults if d is not None]]:
            self.visit(default)
        if not isinstance(node, ast.Lambda):
            self.bind(node.name, None, node)
        inner = _Scope({name: None for name in _function_locals(node)}, self.scope, is_function=True)
        if not isinstance(node, ast.Lambda):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Global):
                    inner.globals.update(sub.names)
        self.scope = inner
        body = node.body if isinstance(node.body, list) else [node.body]
        for statement in body:
            self.visit(statement)
        self.scope = inner.parent

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _visit_function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for sub in [*node.decorator_list, *node.bases, *node.keywords]:
            self.visit(sub)
        self.bind(node.name, None, node)
        inner = _Scope({}, self.scope)
        self.scope = inner
        for statement in node.body:
            self.visit(statement)
        self.scope = inner.parent

    # -- bindings and stores
    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self.bind_target(target, node.value)
            self._visit_target_loads(target)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        if node.value is not None or not isinstance(node.target, ast.Name):
            self.bind_target(node.target, node.value)
        self._visit_target_loads(node.target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            self.bind(node.target.id, None, node.target)
        else:
            self.store_into(node.target, "patches")
        self._visit_target_loads(node.target)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self.bind(node.target.id, None, node.target)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            if isinstance(target, ast.Name):
                self.bind(target.id, None, target)
            else:
                self.store_into(target, "deletes")
            self._visit_target_loads(target)

    def visit_For(self, node) -> None:
        self.visit(node.iter)
        self.bind_target(node.target, None)
        self._visit_target_loads(node.target)
        for statement in [*node.body, *node.orelse]:
            self.visit(statement)

    visit_AsyncFor = visit_For

    def visit_With(self, node) -> None:
        for item in node.items:
            self.visit(item.context_expr)
            if item.optional_vars is not None:
                self.bind_target(item.optional_vars, None)
                self._visit_target_loads(item.optional_vars)
        for statement in node.body:
            self.visit(statement)

    visit_AsyncWith = visit_With

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
        if node.name:
            self.bind(node.name, None, node)
        for statement in node.body:
            self.visit(statement)

    def visit_Global(self, node: ast.Global) -> None:
        self.scope.globals.update(node.names)

    def _visit_target_loads(self, target: ast.AST) -> None:
        """Visit the loads inside a store target (``a[i].b = ...`` loads ``a`` and ``i``)."""
        if isinstance(target, (ast.Attribute, ast.Subscript)):
            if isinstance(target, ast.Attribute):
                self.attribute_bases.add(id(target.value))
            self.visit(target.value)
            if isinstance(target, ast.Subscript):
                self.visit(target.slice)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._visit_target_loads(element)
        elif isinstance(target, ast.Starred):
            self._visit_target_loads(target.value)

    # -- imports
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            message = _module_rule(alias.name)
            if message:
                self.flag(node, f"imports {alias.name} ({message})", _doubts(alias.name))
            if alias.asname:
                self.bind(alias.asname, alias.name, node, via_import=True)
            else:
                top = alias.name.split(".")[0]
                self.bind(top, top, node, via_import=True)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:
            self.flag(node, "uses a relative import")
            return
        for alias in node.names:
            qualified = f"{module}.{alias.name}"
            message = _module_rule(qualified)
            if alias.name == "*":
                self.flag(node, f"imports * from {module}")
            elif message:
                self.flag(node, f"imports {qualified} ({message})", _doubts(qualified))
            elif _match(CALLS, qualified):
                self.flag(node, f"imports {qualified}", _doubts(qualified))
            if alias.name != "*":
                self.bind(alias.asname or alias.name, qualified, node, via_import=True)

    # -- loads
    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and id(node) not in self.handled:
            found, q = self.scope.lookup(node.id)
            if not found and node.id in NAMES:
                self.flag(node, NAMES[node.id], node.id != "get_ipython")
            elif found and q:
                if not self._reference(node, q) and q in WATCHED_MODULES and id(node) not in self.attribute_bases:
                    self.flag(node, f"hands the module {q} around as a value (the scan cannot follow it)")
            elif not found and node.id in BUILTIN_NAMES:
                message = _match(CALLS, f"builtins.{node.id}")
                if message:
                    self.flag(node, message, _doubts(f"builtins.{node.id}"))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.attribute_bases.add(id(node.value))
        if node.attr in INTERNAL_ATTRS:
            self.flag(node, f"reads {node.attr}")
        if id(node) in self.handled:
            self.handled.add(id(node.value))
            self.visit(node.value)
            return
        q = self.qualified(node)
        if q is not None and isinstance(node.ctx, ast.Load):
            if node.attr == "__dict__":
                self.flag(node, f"touches {_text(node)}")
                self.handled.add(id(node.value))
            elif self._reference(node, q):
                self.handled.add(id(node.value))      # one note per chain: torch.save, not torch too
        if id(node.value) not in self.handled:        # not noted by its qualified name: by the attribute's
            if node.attr in IMPORT_ATTRS:
                self.flag(node, f"imports code or modules by name (.{node.attr})")
            elif node.attr == "modules" and id(node) not in self.called:
                self.flag(node, "reads .modules (the table of loaded modules)")
        self.visit(node.value)

    def _reference(self, node: ast.AST, q: str) -> bool:
        message = _match(CALLS, q)
        if message:
            self.flag(node, f"{message}" if "(" in message else f"{message} ({_text(node)})", _doubts(q))
            return True
        message = _module_rule(q)
        if message:
            self.flag(node, f"uses {_text(node)} ({message})", _doubts(q))
            return True
        return False

    def visit_Call(self, node: ast.Call) -> None:
        self.called.add(id(node.func))
        q = self.qualified(node.func)
        self._names_by_string(node, q)
        if q in OPENERS:
            mode = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "mode"), None)
            self._check_mode(node, mode)
        elif q in ("builtins.setattr", "builtins.delattr") and node.args and self.course_object(node.args[0]):
            self.flag(node, f"patches {_text(node.args[0])} with {q.split('.')[-1]}")
        elif q == "builtins.vars" and (not node.args or self.course_object(node.args[0])):
            self.flag(node, "uses vars()")
        elif isinstance(node.func, ast.Attribute):
            attr, base = node.func.attr, node.func.value
            base_q = self.qualified(base)
            if attr in ("__setattr__", "__delattr__") and (
                    self.course_object(base) or (node.args and self.course_object(node.args[0]))):
                self.flag(node, f"patches with {attr}")
            elif base_q in MUTATED and attr in MUTATING_METHODS:
                self.flag(node, MUTATED[base_q])
                self.handled.add(id(base))
            elif base_q is None and attr in FILE_METHODS:
                self.flag(node, f"{FILE_METHODS[attr]} (.{attr})", doubt=False)
            elif base_q is None and attr == "open":
                mode = node.args[0] if node.args else next(
                    (k.value for k in node.keywords if k.arg == "mode"), None)
                self._check_mode(node, mode)
            elif base_q is None and self.protected_root(base) and attr in MUTATING_METHODS | {"__init__"}:
                self.flag(node, f"changes {_text(base)} (.{attr})")
        self.generic_visit(node)

    def _names_by_string(self, node: ast.Call, q: str | None) -> None:
        """``getattr(x, 'che' + 'cks')``, ``operator.attrgetter(name)``: a name the scan cannot read."""
        if q in NAME_LOOKUPS and len(node.args) >= 2:
            name = node.args[1]
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                self.flag(node, f"looks up an attribute by a computed name ({q.split('.')[-1]})")
            elif name.value in INTERNAL_ATTRS | IMPORT_ATTRS | {"modules"}:
                self.flag(node, f"reads {name.value} ({q.split('.')[-1]})")
            else:
                target = self.qualified(node) if q == "builtins.getattr" else None
                if target:
                    self._reference(node, target)
        elif q in ("operator.attrgetter", "operator.methodcaller") and node.args:
            name = node.args[0]
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)) or any(
                    part.startswith("_") for part in name.value.split(".")):
                self.flag(node, f"looks up an attribute by a computed or private name ({q.split('.')[-1]})")

    def _check_mode(self, node: ast.Call, mode: ast.AST | None) -> None:
        if mode is None:
            return
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
            if set(mode.value) & set("wax+"):
                self.flag(node, f"writes a file (open mode {mode.value!r})", doubt=False)
        else:
            self.flag(node, "opens a file with a computed mode", doubt=False)

    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if isinstance(value, str) and (value.startswith("/proc") or "/proc/" in value):
            self.flag(node, "reads /proc", doubt=False)


def _text(node: ast.AST, limit: int = 60) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # unparse is robust, but a note must never crash grading
        text = type(node).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ----------------------------------------------------------------------------- public API

def scan_source(source: str, label: str, ctx: Context | None = None, doubts: list[str] | None = None) -> list[str]:
    """Notes for one cell's code. ``label`` names the cell in the notes (``ex3_answer``).
    The notes of findings that can switch off a kernel-side rule are appended to ``doubts``."""
    ctx = ctx or Context()
    try:
        python, findings = _to_python(source)
    except Exception:  # noqa: BLE001 - IPython's transformers gave up: read the cell as Python
        python, findings = source, []
    try:
        tree = ast.parse(python)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        where = f"line {err.lineno}: " if isinstance(err, SyntaxError) and err.lineno else ""
        detail = (err.msg if isinstance(err, SyntaxError) else type(err).__name__) or "invalid"
        notes = [f"{REVIEW} {label} line {n} {m}" for n, m in findings]
        return notes + [f"{REVIEW} {label} could not be parsed ({where}{detail})"]
    scanner = _Scanner(ctx)
    try:
        scanner.visit(tree)
    except RecursionError:
        findings.append((1, "is nested too deeply to scan"))
    # IPython syntax: a line magic (%run, %load_ext) runs code in the kernel; a shell command
    # or a cell magic (%%bash, %%writefile) runs a process or writes a file
    doubtful = scanner.doubtful | {f for f in findings if not f[1].startswith(("runs a shell command",
                                                                             "runs the cell magic"))}
    findings += scanner.findings
    notes, seen = [], set()
    for line, message in sorted(findings, key=lambda f: f[0]):
        note = f"{REVIEW} {label} line {line} {message}"
        if note not in seen:
            seen.add(note)
            notes.append(note)
            if doubts is not None and (line, message) in doubtful:
                doubts.append(note)
    return notes


def cells_to_scan(submitted, released=None, ctx: Context | None = None) -> list[tuple[str, str]]:
    """(label, source) of the answer cells and of every code cell nbgrader will not restore."""
    ctx = ctx or build_context(submitted, released)
    out = []
    for index, cell in enumerate(submitted.cells, start=1):
        if cell.get("cell_type") != "code":
            continue
        meta = _nbgrader(cell)
        grade_id = meta.get("grade_id")
        if grade_id and grade_id in ctx.locked_ids:
            continue                              # nbgrader puts the released source back
        if grade_id and meta.get("solution"):
            out.append((str(grade_id), cell.source))
        elif not grade_id and cell.source.strip() in ctx.released_sources:
            continue                              # an unlabelled cell of the release, untouched
        else:
            out.append((f"cell {index} (added)" if not grade_id else f"cell {index} ({grade_id})", cell.source))
    return out


def scan_notebook(submitted, released=None, doubts: list[str] | None = None) -> list[str]:
    """Review notes for a submitted notebook (a NotebookNode), given the released one; those
    that can switch off a kernel-side rule are also appended to ``doubts``."""
    ctx = build_context(submitted, released)
    notes: list[str] = []
    for label, source in cells_to_scan(submitted, released, ctx):
        notes += scan_source(source, label, ctx, doubts)
    if len(notes) > MAX_NOTES:
        notes = notes[:MAX_NOTES - 1] + [f"{REVIEW} and {len(notes) - MAX_NOTES + 1} more findings like these"]
    return notes


def scan_file(path: Path, release_path: Path | None = None, doubts: list[str] | None = None) -> list[str]:
    """Review notes for a notebook file; [] when it cannot be read (the grader reports that)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # duplicated cell ids and the like
        try:
            submitted = nbformat.read(path, as_version=4)
        except Exception:
            return []
        released = nbformat.read(release_path, as_version=4) if release_path else None
    return scan_notebook(submitted, released, doubts)
