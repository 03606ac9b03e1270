"""The GPU path, proven as far as a CPU can: the ``gpu`` profile graded end to end in a dry
run, its models under bf16 autocast, the CUDA determinism the kernel set-up applies, the
sandbox's GPU device nodes, and the GPU session script's refusal without a GPU.

What needs a GPU (speed, marks, the sandbox really reaching the device) is measured by
``benchmarks/gpu_session.sh`` on a GPU machine; README, "Grading on a GPU runner".
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autograder import sandbox as sb
from autograder.settings import GradingSettings
from course.capstone.profiles import DRY_RUN_ENV, PROFILES, current_profile, dry_run
from grading_tools import rows_of, run_grade
from notebook_tools import ROOT, grade_id, solution_answers, student_notebook, write_notebook

CAPSTONE = "ch07_capstone"


# ------------------------------------------------------------------ the dry run, end to end

@pytest.fixture(scope="module")
def dry_run_grade(tmp_path_factory):
    """The reference answers, submitted as a student would, graded by the real autograder
    (sandbox on) in a dry run of the gpu profile on the CPU."""

    subs = tmp_path_factory.mktemp("dry-subs")
    nb = student_notebook(CAPSTONE, solution_answers(CAPSTONE))
    write_notebook(nb, subs / "student" / CAPSTONE / f"{CAPSTONE}.ipynb")
    out = tmp_path_factory.mktemp("dry-out")
    env = {"COURSE_DRY_RUN": "0"}   # only --dry-run decides, whatever the shell says
    run_grade(subs, out, "--dry-run", "--device", "cpu", "--seed", "0", profile="gpu", workers=1, timeout=120, env=env)
    row = rows_of(out)[0]
    folder = out / "nbgrader" / "autograded" / "student" / CAPSTONE
    import nbformat

    return row, nbformat.read(folder / f"{CAPSTONE}.ipynb", as_version=4), folder, out


def _cell_scores(out: Path) -> dict[str, float]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{out / 'nbgrader' / 'gradebook.db'}") as gb:
        sub = gb.find_submission_notebook(CAPSTONE, CAPSTONE, "student")
        return {g.name: float(g.score) for g in sub.grades}, {g.name: float(g.max_score) for g in sub.grades}


def _text(cell) -> str:
    return "".join(o.get("text", "") + o.get("evalue", "") for o in cell.get("outputs", []))


@pytest.mark.slow
def test_dry_run_grades_the_gpu_profile_end_to_end(dry_run_grade):
    row, nb, folder, out = dry_run_grade
    assert row["status"] == "graded" and "dry run (--dry-run) of the gpu profile" in row["notes"], row
    cells = {grade_id(c): c for c in nb.cells if grade_id(c)}
    assert "profile gpu" in _text(cells["setup"])
    scores, maxima = _cell_scores(out)
    evaluations = {"lm_eval", "g2p_eval", "cls_eval"}
    # Every unit check, visible and hidden, passes: the dry run changes nothing but the budget.
    assert all(scores[name] == maxima[name] for name in scores if name not in evaluations), scores
    for name in ("lm_train", "g2p_train", "cls_train"):       # trained, and plotted its loss
        assert not [o for o in cells[name].outputs if o.output_type == "error"], _text(cells[name])
        assert any(o.output_type == "display_data" for o in cells[name].outputs), name
    # Two steps do not reach the marks: each evaluation either passes or misses a threshold;
    # nothing else (a shape error, a time-out) may happen.
    for name in evaluations:
        for error in (o for o in cells[name].outputs if o.output_type == "error"):
            assert error.ename == "CheckFailed" and "misses the threshold" in error.evalue, (name, error)


@pytest.mark.slow
def test_dry_run_checkpoints_have_the_gpu_models_and_score_the_same_again(dry_run_grade):
    row, nb, folder, out = dry_run_grade
    checkpoints = {task: folder / "capstone_checkpoints" / f"{task}.pt" for task in ("lm", "g2p", "cls")}
    gpu = PROFILES["gpu"]
    for task, path in checkpoints.items():
        saved = torch.load(path, map_location="cpu", weights_only=True)
        assert saved["profile"] == "gpu" and saved["dry_run"] is True, task
        state = saved["state_dict"]
        cfg = getattr(gpu, task)
        prefix = {"lm": "blocks", "g2p": "encoder", "cls": "blocks"}[task]
        layers = {int(k.split(".")[1]) for k in state if k.startswith(prefix + ".")}
        assert len(layers) == cfg.n_layers, (task, sorted(layers))
        widths = {v.shape[-1] for k, v in state.items() if k.endswith("ln_1.weight")}
        assert widths == {cfg.d_model}, (task, widths)
    # Scored again outside the notebook (by the code `python -m course.capstone.evaluate`
    # runs), on the same few items: the same numbers as in the notebook.
    from course.capstone.evaluate import evaluate

    again = {k: v for path in checkpoints.values() for k, v in evaluate(path).items()}
    cells = {grade_id(c): _text(c) for c in nb.cells if grade_id(c)}
    shown = {"test_loss": r"held-out loss \(nats/char\):? ([\d.]+)",
             "per": r"phoneme error rate on 8 held-out words:? ([\d.]+)",
             "accuracy": r"stress-pattern accuracy on 8 held-out words:? ([\d.]+)"}
    for metric, cell in (("test_loss", "lm_eval"), ("per", "g2p_eval"), ("accuracy", "cls_eval")):
        found = re.search(shown[metric], cells[cell])
        assert found, (cell, cells[cell][:500])
        assert again[metric] == pytest.approx(float(found[1]), abs=2e-4), (metric, again)


def test_dry_run_keeps_the_models_and_shrinks_only_the_budget(monkeypatch):
    gpu, dry = PROFILES["gpu"], dry_run(PROFILES["gpu"])
    for task in ("lm", "g2p", "cls"):
        full, small = getattr(gpu, task), getattr(dry, task)
        for field in ("d_model", "n_layers", "n_heads", "dropout", "lr", "min_lr"):
            assert getattr(small, field) == getattr(full, field), (task, field)
        assert small.steps == 2 and small.batch_size <= 4
    assert (dry.lm.block_size, dry.g2p.beam_size, dry.use_bf16, dry.thresholds) == \
        (gpu.lm.block_size, gpu.g2p.beam_size, gpu.use_bf16, gpu.thresholds)
    assert dry.lm.eval_tokens == 2 * gpu.lm.block_size and dry.g2p.eval_words == 8 and dry.cls.eval_words == 8
    assert dry.name == "gpu" and dry.dry_run and not gpu.dry_run and dry_run(dry) is dry
    monkeypatch.setenv("COURSE_PROFILE", "gpu")
    monkeypatch.setenv(DRY_RUN_ENV, "1")
    assert current_profile() == dry
    monkeypatch.setenv(DRY_RUN_ENV, "0")
    assert current_profile() is gpu
    monkeypatch.setenv(DRY_RUN_ENV, "yes")
    with pytest.raises(ValueError, match="COURSE_DRY_RUN"):
        current_profile()


def test_only_the_grader_command_line_makes_a_dry_run(monkeypatch):
    """The kernel and the trusted evaluation read COURSE_DRY_RUN; the grader sets it from its
    own --dry-run, never from the environment it was started in."""
    for key in ("COURSE_DEVICE", "COURSE_CELL_TIMEOUT", "COURSE_PROFILE", "PATH", "CUBLAS_WORKSPACE_CONFIG"):
        if key in os.environ:     # apply_to_environment() writes these: restore them afterwards
            monkeypatch.setenv(key, os.environ[key])
        else:
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv(DRY_RUN_ENV, "1")
    settings = GradingSettings.from_env(profile="gpu")
    assert settings.dry_run is False and settings.kernel_environment()[DRY_RUN_ENV] == "0"
    settings.apply_to_environment()
    assert os.environ[DRY_RUN_ENV] == "0"
    dry = GradingSettings.from_env(profile="gpu", dry_run=True)
    assert dry.kernel_environment()[DRY_RUN_ENV] == "1"
    dry.apply_to_environment()
    assert os.environ[DRY_RUN_ENV] == "1" and current_profile().dry_run
    from autograder.cli import main

    with pytest.raises(SystemExit):      # --dry-run is a grading option, not a self-check's
        main(["check", "x.ipynb", "--dry-run"])


# ------------------------------------------------------------------ bf16 autocast on the CPU

def test_gpu_models_train_and_decode_under_bf16_autocast_on_the_cpu():
    """The gpu profile's models, with its dropout, run a training step (forward, backward,
    clipping, AdamW) and their evaluation calls under bf16 autocast. The notebook's train()
    autocasts on CUDA only, so the CPU's autocast is opened around it here."""
    import torch.nn.functional as F

    from autograder.extract import solution_namespace
    from course.capstone import data

    if not torch.amp.is_autocast_available("cpu"):
        pytest.skip("this PyTorch has no bf16 autocast on the CPU")
    ns = solution_namespace(ROOT / "solutions" / CAPSTONE / f"{CAPSTONE}.ipynb")
    gpu, cpu, rng = PROFILES["gpu"], torch.device("cpu"), torch.Generator().manual_seed(0)
    dtypes: list[torch.dtype] = []
    ids = data.lm_ids("test")
    lm = ns["build_lm"](gpu.lm, data.char_tokenizer().vocab_size)
    g2p = ns["build_g2p"](gpu.g2p, len(data.SRC_VOCAB), len(data.TGT_VOCAB))
    cls = ns["build_classifier"](gpu.cls, len(data.SRC_VOCAB), len(data.PATTERNS))
    assert {m.p for m in lm.modules() if isinstance(m, torch.nn.Dropout)} == {gpu.lm.dropout}
    pairs = [("cat", ("K", "AE", "T")), ("moon", ("M", "UW", "N")), ("shine", ("SH", "AY", "N"))]
    words = [w for w, _ in pairs]
    cls_x, cls_y = data.classifier_eval_tensors(gpu.cls.max_len, 2)
    runs = [
        (lm, lambda s: data.lm_batch(ids, 1, 24, rng),           # short windows: the block is 256
         lambda m, x, y: F.cross_entropy(m(x).flatten(0, 1).float(), y.flatten()), lm.blocks[-1].qkv),
        (g2p, lambda s: data.g2p_batch(pairs, 2, rng),
         lambda m, s, ti, to: F.cross_entropy(m(s, ti).flatten(0, 1).float(), to.flatten(), ignore_index=data.PAD),
         g2p.decoder[-1].kv_x),
        (cls, lambda s: (cls_x, cls_y), lambda m, x, y: F.cross_entropy(m(x).float(), y), cls.blocks[-1].qkv),
    ]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for model, get, loss_fn, layer in runs:
            hook = layer.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
            losses = ns["train"](model, get, loss_fn, 1, 1e-3, 1e-4, 1, cpu, use_bf16=gpu.use_bf16, progress=False)
            hook.remove()
            assert len(losses) == 1 and torch.isfinite(torch.tensor(losses)).all()
        decoded = ns["greedy_decode"](g2p, data.pad([data.encode_word(w) for w in words[:2]]), 6)
        beam = ns["beam_search"](g2p, torch.tensor([data.encode_word(words[0])]), gpu.g2p.beam_size, 6)
        sample = ns["generate"](lm, torch.tensor([[1, 2, 3]]), 3, gpu.lm.block_size, 0.8, 20,
                                torch.Generator().manual_seed(0))
    assert dtypes == [torch.bfloat16] * 3, dtypes
    assert len(decoded) == 2 and isinstance(beam, list) and sample.shape == (1, 6)


# ------------------------------------------------------------------ determinism on CUDA

@pytest.fixture
def restore_torch_flags():
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
             os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2], saved[3]
    if saved[4] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[4]


def test_cuda_determinism_is_decided_for_cuda_only():
    from course.device import cuda_environment, determinism_for

    assert determinism_for("cpu") == {} and cuda_environment("cpu") == {}
    settings = determinism_for("cuda:0")
    assert settings == {"env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, "use_deterministic_algorithms": True,
                        "warn_only": True, "cudnn.deterministic": True, "cudnn.benchmark": False}
    assert cuda_environment("cuda") == cuda_environment("auto") == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    # The grader puts the cuBLAS workspace into the kernel's environment (read when CUDA starts).
    assert GradingSettings.from_env(device="cuda").kernel_environment()["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert "CUBLAS_WORKSPACE_CONFIG" not in GradingSettings.from_env(device="cpu").kernel_environment()


def test_the_kernel_set_up_makes_cuda_deterministic(monkeypatch, restore_torch_flags):
    """get_device() (the notebooks' set-up cell) applies the settings when the device is
    CUDA, and leaves PyTorch alone on the CPU."""
    from course.device import get_device

    torch.use_deterministic_algorithms(False)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    assert get_device().type == "cpu" and not torch.are_deterministic_algorithms_enabled()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)    # no CUDA call is made
    monkeypatch.setenv("COURSE_DEVICE", "cuda")
    assert get_device() == torch.device("cuda")
    assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


# ------------------------------------------------------------------ the sandbox on a GPU runner

def _fake_dev(root: Path) -> Path:
    dev = root / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    (dev / "dri").mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia10", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset",
                 "nvidia-caps/nvidia-cap1", "dri/renderD128", "null", "nvidia-foo"):
        (dev / name).write_text("")
    return dev


def test_gpu_binds_pass_every_nvidia_node_and_sys(tmp_path):
    dev, sys_dir = _fake_dev(tmp_path), tmp_path / "sys"
    sys_dir.mkdir()
    args = sb.gpu_binds(dev, sys_dir)
    pairs = [(args[i], args[i + 1], args[i + 2]) for i in range(0, len(args), 3)]
    assert [(flag, target) for flag, _, target in pairs] == [
        ("--dev-bind", "/dev/nvidia0"), ("--dev-bind", "/dev/nvidia1"), ("--dev-bind", "/dev/nvidia10"),
        ("--dev-bind", "/dev/nvidiactl"), ("--dev-bind", "/dev/nvidia-uvm"), ("--dev-bind", "/dev/nvidia-uvm-tools"),
        ("--dev-bind", "/dev/nvidia-modeset"), ("--dev-bind", "/dev/nvidia-caps"), ("--dev-bind", "/dev/dri"),
        ("--ro-bind", "/sys")]
    assert all(Path(source).exists() for _, source, _ in pairs)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert sb.gpu_binds(empty, sys_dir) == []          # no GPU: nothing passed, not even /sys


def test_a_gpu_sandbox_binds_the_nodes_and_a_cpu_sandbox_none(tmp_path, monkeypatch):
    import course

    if not sb.bwrap_path():
        pytest.skip("bubblewrap is not installed")
    dev, sys_dir = _fake_dev(tmp_path), tmp_path / "sys"
    sys_dir.mkdir()
    real = sb.gpu_binds
    monkeypatch.setattr(sb, "gpu_binds", lambda: real(dev, sys_dir))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64")
    env = GradingSettings.from_env(device="cuda", profile="gpu").kernel_environment()
    gpu = sb.Sandbox(tmp_path / "gpu", Path(course.__file__).parent, gpu=True, env=env)
    cpu = sb.Sandbox(tmp_path / "cpu", Path(course.__file__).parent)
    try:
        with_gpu, without = gpu.prefix(), cpu.prefix()
    finally:
        gpu.cleanup()
        cpu.cleanup()
    joined = " ".join(with_gpu)
    assert f"--dev-bind {dev}/nvidia0 /dev/nvidia0" in joined and f"--ro-bind {sys_dir} /sys" in joined
    assert "--setenv CUBLAS_WORKSPACE_CONFIG :4096:8" in joined and "--setenv CUDA_CACHE_PATH" in joined
    assert "--setenv LD_LIBRARY_PATH /usr/local/nvidia/lib64" in joined
    assert "--dev-bind" not in without and "/sys" not in without and "LD_LIBRARY_PATH" not in without


def test_doctor_says_clearly_when_the_gpu_is_missing():
    done = subprocess.run([sys.executable, "-m", "autograder", "doctor", "--device", "cuda"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    if torch.cuda.is_available():
        assert done.returncode == 0, done.stdout + done.stderr
        return
    assert done.returncode == 1 and "FAIL  PyTorch sees a GPU here" in done.stdout, done.stdout
    assert done.stdout.strip().splitlines()[-1] == "doctor: some checks failed (FAIL lines above)"


@pytest.mark.skipif(not sb.available(), reason="bubblewrap is not usable here")
def test_doctor_runs_python_in_a_sandbox_on_the_cpu():
    done = subprocess.run([sys.executable, "-m", "autograder", "doctor", "--device", "cpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok    a sandboxed Python with torch" in done.stdout


# ------------------------------------------------------------------ the GPU session script and the estimate

SESSION = ROOT / "benchmarks" / "gpu_session.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the script would run")
@pytest.mark.parametrize("fake_nvidia_smi", [False, True], ids=["no-nvidia-smi", "torch-without-cuda"])
def test_gpu_session_refuses_clearly_without_cuda(tmp_path, fake_nvidia_smi):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("bash", "date", "mkdir", "dirname", "tail", "cat"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        if found:
            (bindir / tool).symlink_to(found)
    if fake_nvidia_smi:        # a driver tool that answers, and a PyTorch that sees no GPU
        (bindir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: a fake'\n")
        (bindir / "nvidia-smi").chmod(0o755)
    done = subprocess.run([str(bindir / "bash"), str(SESSION)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={"PATH": str(bindir), "OUT": str(tmp_path / "out"),
                                            "PYTHON": sys.executable})
    assert done.returncode == 3, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_session: refused: "), done.stderr
    assert ("PyTorch sees no GPU" if fake_nvidia_smi else "no NVIDIA GPU here") in lines[0]
    assert done.stdout == ""


def test_the_estimate_adds_compute_launches_and_synchronisations():
    sys.path.insert(0, str(ROOT))
    from benchmarks.capstone import gpu_seconds, workflow_timeout_minutes

    phase = {"flops": 1e12, "scale": 2.0, "ops": 1000, "syncs": 10, "units": 100}
    # per unit: 2e12 FLOP at 100 TFLOP/s = 0.02 s; 1000 ops x 10 us = 0.01 s; 10 syncs x 20 us = 0.0002 s
    assert gpu_seconds(phase, 100.0, 10.0, 20.0) == pytest.approx(100 * 0.0302)
    assert workflow_timeout_minutes() == 180
