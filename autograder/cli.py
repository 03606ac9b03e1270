"""Command line: ``python -m autograder {generate,grade,check,doctor}``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .sandbox import SandboxUnavailable
from .settings import (DEFAULT_TIMEOUT, DEVICE_ENV, MEMORY_ENV, PROFILE_ENV, PROFILES, TIMEOUT_ENV,
                       GradingSettings, repo_root)


def _settings(args) -> GradingSettings:
    return GradingSettings.from_env(device=args.device, cell_timeout=args.timeout, profile=args.profile,
                                    unsandboxed=getattr(args, "unsandboxed", False),
                                    memory_gb=getattr(args, "memory", None), seed=getattr(args, "seed", None),
                                    dry_run=getattr(args, "dry_run", False))


def _grade_parser(sub) -> argparse.ArgumentParser:
    grade = sub.add_parser("grade", help="grade <dir>/<student>/<assignment>/<notebook>.ipynb")
    grade.add_argument("submissions", type=Path)
    grade.add_argument("--out", type=Path, required=True, help="where grades.csv and feedback go")
    grade.add_argument("--unsandboxed", action="store_true",
                       help="grade without the sandbox (only your own notebooks: students' code then runs "
                            "with your rights); every row is noted")
    grade.add_argument("--memory", type=float, metavar="GIB",
                       help=f"memory limit of each submission's kernel (default: ${MEMORY_ENV} or 4)")
    from .coursetree import THREADS_ENV
    from .workers import cores, default_workers

    grade.add_argument("--workers", type=int, metavar="N",
                       help=f"grade N submissions at once, each in its own sandbox and kernel, with the CPU "
                            f"cores shared out between them (default: one per core, fewer when N kernels' "
                            f"--memory would not fit; here {default_workers(4.0)} of {cores()} cores at 4 GiB); "
                            f"${THREADS_ENV} sets the threads of each kernel instead (a machine shared with "
                            f"other work)")
    grade.add_argument("--cluster", metavar="ADDRESS",
                       help="send each submission to the Ray cluster at ADDRESS (host:port of `ray start "
                            "--head`) as a task; every machine needs this repository at the same path "
                            "(README: Grading on a cluster)")
    grade.add_argument("--force", action="store_true",
                       help="grade everything again (by default a second run on the same --out regrades only "
                            "submissions whose notebooks, the course or the settings changed)")
    grade.add_argument("--student", metavar="NAME",
                       help="grade this student's submissions again and keep every other row of the last run")
    grade.add_argument("--seed", type=int,
                       help="seed of the hidden tests' inputs (default: drawn once per --out and kept in "
                            "OUT/nbgrader/grading-secret); the same seed reproduces a grade")
    grade.add_argument("--dry-run", action="store_true",
                       help="a dry run of --profile: the capstone's models of that profile (sizes, dropout, "
                            "bf16, beam size) trained a few steps and scored on a few held-out items, to show "
                            "that the profile runs end to end (scores are not grades; every row says so)")
    return grade


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__)
    parser.add_argument("--root", type=Path, help="course repository (default: found from here)")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("generate", help="regenerate exercises/ (and exercises-zh/) from solutions/")

    grade = _grade_parser(sub)

    doctor = sub.add_parser("doctor", help="check that a sandboxed kernel can run here (and sees the GPU with "
                                           "--device cuda)")
    doctor.add_argument("--device", default="cuda", help="cpu or cuda (default: cuda)")
    doctor.add_argument("--memory", type=float, metavar="GIB",
                        help=f"the kernel's memory limit to check under (default: ${MEMORY_ENV} or 4)")

    check = sub.add_parser("check", help="self-check one notebook against its visible tests")
    check.add_argument("notebook", type=Path)

    for p in (grade, check):
        p.add_argument("--device", help=f"cpu, cuda or auto (default: ${DEVICE_ENV} or cpu)")
        p.add_argument("--timeout", type=int,
                       help=f"seconds per cell (default: ${TIMEOUT_ENV} or {DEFAULT_TIMEOUT})")
        p.add_argument("--profile", choices=PROFILES,
                       help=f"capstone budget: smoke, cpu or gpu (default: ${PROFILE_ENV} or cpu)")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "generate":
            from .generate import generate_exercises

            from .translation import LANGUAGES

            root = repo_root(args.root)
            names = generate_exercises(root / "solutions", root / "exercises",
                                       {language: root / folder for language, folder in LANGUAGES.items()})
            folders = ", ".join(f"{folder}/" for folder in ("exercises", *LANGUAGES.values()))
            print(f"generated {folders} for: {', '.join(names)}")
            return 0
        if args.command == "grade":
            from .grade import grade_folder

            from .workers import default_workers

            root = repo_root(args.root)
            settings = _settings(args)
            workers = args.workers if args.workers is not None else default_workers(settings.memory_gb)
            if workers < 1:
                raise ValueError(f"--workers must be at least 1, not {workers}")
            rows = grade_folder(args.submissions, args.out, root / "solutions", settings,
                                show_progress=not args.no_progress, workers=workers, force=args.force,
                                student=args.student, cluster=args.cluster)
            total = sum(r.score for r in rows)
            print(f"{args.out / 'grades.csv'}: {len(rows)} submission(s), {total:g} points in all; "
                  f"feedback in {args.out / 'feedback'}/")
            return 0
        if args.command == "doctor":
            from .doctor import run_doctor

            return run_doctor(GradingSettings.from_env(device=args.device, memory_gb=args.memory))
        if args.command == "check":
            from course.i18n import use_language

            from .selfcheck import check_language, format_report, run_visible_tests

            with use_language(check_language(args.notebook)):
                results = run_visible_tests(args.notebook, _settings(args))
                print(format_report(results))
            return 0 if results and all(r.passed for r in results) else 1
    except (FileNotFoundError, ValueError, SandboxUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 2
