#!/usr/bin/env bash
# One GPU session, prepared: everything the course needs to learn from a GPU, in under
# 8 minutes on one H200, ending in one table.
#
#     benchmarks/gpu_session.sh                 # from the repository root, on a CUDA machine
#     OUT=/somewhere benchmarks/gpu_session.sh  # keep logs, grades and JSON there
#
# What it does, in order (README, "Grading on a GPU runner"):
#  1. refuses at once, with one line and exit status 3, where there is no NVIDIA GPU or
#     PyTorch cannot use one;
#  2. the environment from the repository's own files: .venv when it exists (or $PYTHON),
#     else `make env`; the course installed into it with `pip install --no-deps -e .`;
#  3. the device: nvidia-smi, torch.cuda, and `python -m autograder doctor --device cuda`
#     (a sandboxed kernel sees the GPU, a bf16 step runs, the CUDA set-up is deterministic);
#  4. at the same time, sharing the GPU: the solutions and the untouched exercises graded in
#     the gpu profile on CUDA in the sandbox; the capstone benchmark for seeds 0, 1 and 2
#     (one process each); the estimate of benchmarks/capstone.py (on the CPU) to compare;
#  5. the attention benchmark (chapter 3) on CUDA, alone;
#  6. one table: the device, the grades, each seed's metrics and training times against the
#     estimate, the worst seed and the thresholds it gives with the margins of
#     benchmarks/capstone_thresholds.md, and the attention timings.
# Every step has a time limit, so the session ends within BUDGET_S (default 460 s) even
# when a step hangs; a step cut short shows in the table as such, with what it finished.
#
# REHEARSAL=1 runs the same steps on the CPU in the smoke profile, on chapter 1 and the
# classifier only (no GPU needed; about 3 minutes on 2 cores): it checks this script's
# plumbing, not the GPU.
set -u
cd "$(dirname "$0")/.."
if [ "${REHEARSAL:-0}" = 1 ]; then
  DEVICE=cpu PROFILE=smoke DTYPE=float32 LENGTHS="256 1024" MEMORY=4 WORKERS=1 TASKS=cls ASSIGNMENTS=ch01_embeddings
else
  DEVICE=cuda PROFILE=gpu DTYPE=bfloat16 LENGTHS="1024 4096 16384" MEMORY=16 WORKERS=4 TASKS="lm g2p cls"
  ASSIGNMENTS=; for d in solutions/*/; do d=${d%/}; ASSIGNMENTS="$ASSIGNMENTS ${d#solutions/}"; done
fi
START=$(date +%s)
BUDGET_S=${BUDGET_S:-460}
OUT=${OUT:-/tmp/gpu-session-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"

refuse() { echo "gpu_session: refused: $1" >&2; exit 3; }
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }

# ---- 1. a GPU, or nothing
[ "$DEVICE" = cpu ] || command -v nvidia-smi >/dev/null 2>&1 || refuse "no NVIDIA GPU here (nvidia-smi not found); run this on a CUDA machine"
[ "$DEVICE" = cpu ] || nvidia-smi -L >"$OUT/nvidia-smi-L.txt" 2>&1 || refuse "nvidia-smi finds no GPU: $(tail -n 1 "$OUT/nvidia-smi-L.txt")"

# ---- 2. the environment, from this repository's files
PY=${PYTHON:-.venv/bin/python}
if [ ! -x "$PY" ] && ! command -v "$PY" >/dev/null 2>&1; then
  echo "== no $PY: make env (the repository's pyproject.toml; needs the package index or a local mirror)"
  make env >"$OUT/make-env.log" 2>&1 || refuse "make env failed: $(tail -n 1 "$OUT/make-env.log") (log: $OUT/make-env.log)"
  PY=.venv/bin/python
fi
PY=$(command -v "$PY"); case "$PY" in /*) ;; *) PY="$PWD/$PY" ;; esac   # absolute, links kept (a venv)
DEVICE=$DEVICE "$PY" - <<'PYEOF' >"$OUT/torch-cuda.txt" 2>&1 || refuse "PyTorch sees no GPU: $(tail -n 1 "$OUT/torch-cuda.txt")"
import os, torch
if os.environ["DEVICE"] == "cpu":
    print(torch.__version__, "(a rehearsal on the CPU)")
    raise SystemExit(0)
assert torch.cuda.is_available(), (f"torch {torch.__version__} (CUDA build: {torch.version.cuda}) "
                                   "cannot use the GPU; install a CUDA build of PyTorch")
print(torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name(0))
PYEOF
if ! (cd / && "$PY" -c "import course, autograder, nbgrader" >/dev/null 2>&1); then
  echo "== installing the course into $PY (pip install --no-deps -e .)"
  "$PY" -m pip install --quiet --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 \
    || refuse "pip install -e . failed: $(tail -n 1 "$OUT/pip.log")"
  (cd / && "$PY" -c "import course, autograder, nbgrader" >"$OUT/imports.log" 2>&1) \
    || refuse "the environment lacks the course's packages: $(tail -n 1 "$OUT/imports.log") (run make env)"
fi
export PATH="$(dirname "$PY"):$PATH"

# ---- 3. the device
echo "== device"
[ "$DEVICE" = cpu ] && echo "CPU rehearsal" >"$OUT/nvidia-smi.csv" || \
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/nvidia-smi.csv" 2>&1
cat "$OUT/nvidia-smi.csv"
timeout 120 "$PY" -m autograder doctor --device "$DEVICE" --memory "$MEMORY" 2>&1 | tee "$OUT/doctor.txt"
DOCTOR=${PIPESTATUS[0]}

# ---- 4. grading and the capstone benchmark, at the same time
echo "== grading ($PROFILE profile, $DEVICE, sandbox) and the capstone benchmark (seeds 0 1 2), together"
SUBS="$OUT/submissions"
rm -rf "$SUBS" && mkdir -p "$SUBS"
for a in $ASSIGNMENTS; do
  mkdir -p "$SUBS/solutions" "$SUBS/exercises"
  cp -r "solutions/$a" "$SUBS/solutions/$a" && cp -r "exercises/$a" "$SUBS/exercises/$a"
done
PARALLEL_S=$(( $(left) - 75 ))          # what is left for this step: 60 s for attention, 15 for the table
[ "$PARALLEL_S" -gt 60 ] || refuse "no time left for the benchmarks (BUDGET_S=$BUDGET_S)"
date +%s >"$OUT/grade.start"
if [ "$DOCTOR" != 0 ]; then      # the sandbox cannot reach the GPU: leave the GPU to the benchmarks
  echo "doctor failed: grading skipped" >"$OUT/grade.log"; echo skipped >"$OUT/grade.rc"
else ( timeout "$PARALLEL_S" "$PY" -m autograder grade "$SUBS" --out "$OUT/grade" --profile "$PROFILE" --device "$DEVICE" \
    --memory "$MEMORY" --workers "$WORKERS" --timeout 600 --seed 0 --no-progress >"$OUT/grade.log" 2>&1; \
  echo $? >"$OUT/grade.rc"; date +%s >"$OUT/grade.end" ) &
fi
# One CPU thread per benchmark (their work is on the GPU; spinning OpenMP threads of several
# processes would starve each other); no nn.TransformerEncoderLayer baseline (no time for it).
for seed in 0 1 2; do
  ( OMP_NUM_THREADS=1 timeout "$PARALLEL_S" "$PY" benchmarks/capstone.py --profile "$PROFILE" --device "$DEVICE" \
      --seeds "$seed" --tasks $TASKS --variants reference --no-baselines --json "$OUT/capstone-seed$seed.json" >"$OUT/capstone-seed$seed.log" 2>&1; \
    echo $? >"$OUT/capstone-seed$seed.rc" ) &
done
( OMP_NUM_THREADS=2 COURSE_DEVICE=cpu timeout "$PARALLEL_S" "$PY" benchmarks/capstone.py --estimate --profile "$PROFILE" \
    --json "$OUT/estimate.json" >"$OUT/estimate.log" 2>&1; echo $? >"$OUT/estimate.rc" ) &
wait

# ---- 5. the attention benchmark, alone on the GPU
echo "== attention (chapter 3) on $DEVICE"
timeout "$(( $(left) - 15 ))" "$PY" benchmarks/attention_speed.py --device "$DEVICE" --dtype "$DTYPE" \
  --lengths $LENGTHS --repeats 5 >"$OUT/attention.log" 2>&1
echo $? >"$OUT/attention.rc"

# ---- 6. one table
TASKS="$TASKS" PROFILE="$PROFILE" "$PY" - "$OUT" "$DOCTOR" "$START" <<'EOF' | tee "$OUT/table.txt"
import csv, json, os, re, sys, time
from pathlib import Path

out, doctor_rc, start = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
profile = os.environ["PROFILE"]
read = lambda name: (out / name).read_text(errors="replace") if (out / name).is_file() else ""
rc = lambda name: read(name).strip() or "?"
MARGIN = {"lm": ("test loss", "<=", 0.20), "g2p": ("PER", "<=", 0.10), "cls": ("accuracy", ">=", -0.12)}
rows = [("device", read("nvidia-smi.csv").strip() or "?")]
rows.append(("torch / CUDA build", read("torch-cuda.txt").strip()))
rows.append(("sandboxed kernel sees the GPU (doctor)", "yes" if doctor_rc == 0 else f"NO (exit {doctor_rc}): see doctor.txt"))
grades = out / "grade" / "grades.csv"
if grades.is_file():
    graded = list(csv.DictReader(open(grades)))
    for r in graded:
        rows.append((f"grade {r['student']}/{r['assignment']}", f"{r['score']} / {r['max_score']} {r['status']}"
                     + (f" ({r['notes'][:80]})" if r["notes"] else "")))
    if read("grade.start") and read("grade.end"):
        rows.append((f"grading wall time ({len(graded)} notebooks)",
                     f"{int(read('grade.end')) - int(read('grade.start'))} s"))
else:
    rows.append(("grading", f"no grades.csv (exit {rc('grade.rc')}; 124 = cut at the time limit): see grade.log"))
runs = []
for seed in (0, 1, 2):
    data = read(f"capstone-seed{seed}.json")
    if data:
        runs += json.loads(data)["runs"]
    else:   # cut short: the lines it printed as each task finished
        for m in re.finditer(r"^\s+(\w+)\s+(reference)\s+seed (\d+): (.+?) ([\d.]+), train ([\d.]+) s",
                             read(f"capstone-seed{seed}.log"), re.M):
            runs.append({"task": m[1], "variant": m[2], "seed": int(m[3]), "metric_name": m[4],
                         "metric": float(m[5]), "seconds": float(m[6]), "partial": True})
        rows.append((f"capstone seed {seed}", f"exit {rc(f'capstone-seed{seed}.rc')} (124 = cut at the time limit); "
                     f"{sum(r['seed'] == seed for r in runs)} task(s) finished"))
estimate = json.loads(read("estimate.json")) if read("estimate.json") else None
est_train = {p["task"]: p["gpu_s"] for p in (estimate or {}).get("phases", []) if p["phase"] == "train"}
est_eval = {}
for p in (estimate or {}).get("phases", []):
    if p["phase"] != "train":
        est_eval[p["task"]] = est_eval.get(p["task"], 0.0) + p["gpu_s"]
for task in os.environ["TASKS"].split():
    ref = [r for r in runs if r["task"] == task and r["variant"] == "reference"]
    if not ref:
        rows.append((f"capstone {task}", "no run finished"))
        continue
    name, better, margin = MARGIN[task]
    values = [r["metric"] for r in ref]
    worst = max(values) if better == "<=" else min(values)
    per_seed = ", ".join(f"seed {r['seed']}: {r['metric']:.4f} in {r['seconds']:.0f} s" for r in sorted(ref, key=lambda r: r["seed"]))
    rows.append((f"capstone {task} {name}", per_seed))
    rows.append((f"  worst of {len(ref)} -> {profile} threshold", f"{worst:.4f} -> {better} {worst + margin:.2f}"))
    if task == "g2p":
        wer = [r["wer"] for r in ref if "wer" in r]
        if wer:
            rows.append((f"  worst WER -> {profile} threshold", f"{max(wer):.4f} -> <= {max(wer) + 0.15:.2f}"))
    if task in est_train:
        rows.append((f"  {task} training: measured (fastest seed) vs estimated",
                     f"{min(r['seconds'] for r in ref):.0f} s (sharing the GPU with 3 other jobs) vs "
                     f"{est_train[task]:.0f} s"))
    if any("phases" in r for r in ref):
        rows.append((f"  {task} evaluation, measured (fastest seed) vs estimated",
                     f"{min(sum(v for k, v in r['phases'].items() if k != 'train') for r in ref if 'phases' in r):.0f} s vs "
                     f"{est_eval.get(task, float('nan')):.0f} s"))
for r in runs:
    if r["variant"] == "torch-baseline":
        rows.append(("capstone lm nn.TransformerEncoderLayer baseline", f"{r['metric']:.4f} in {r['seconds']:.0f} s"))
for line in read("attention.log").splitlines():
    m = re.match(r"^\s*(\d+) (naive|tiled|sdpa)\s+([\d.]+|OOM)\s+(\S+)\s+(\S+)", line)
    if m:
        rows.append((f"attention L={m[1]} {m[2]}", f"{m[3]} ms, peak {m[5]} MiB"))
if not any(k.startswith("attention") for k, _ in rows):
    rows.append(("attention", f"no result (exit {rc('attention.rc')}): see attention.log"))
rows.append(("session wall time", f"{int(time.time()) - start} s"))
width = max(len(k) for k, _ in rows)
print(f"\n{'what':<{width}}  result\n{'-' * width}  {'-' * 60}")
for k, v in rows:
    print(f"{k:<{width}}  {v}")
print(f"\nlogs, grades and JSON: {out}")
EOF
ok=0
[ "$DOCTOR" = 0 ] && [ "$(cat "$OUT/grade.rc")" = 0 ] || ok=1
for seed in 0 1 2; do [ "$(cat "$OUT/capstone-seed$seed.rc" 2>/dev/null)" = 0 ] || ok=1; done
exit $ok
