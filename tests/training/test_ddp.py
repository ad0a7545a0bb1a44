"""DDP: `torchrun --nproc-per-node 2 -m headrank train lm` (gloo, CPU) matches one process on the
same global batch within float tolerance."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from headrank.io.rundir import latest_checkpoint, read_metrics
from headrank.training.config import lm_config
from headrank.training.loop import train

ARGS = dict(steps=12, max_chars=20000, seq_len=16, batch_size=8, n_layers=2, d_model=16, n_heads=2,
            eval_tokens=512, lr=1e-2, warmup=0, log_every=1, track_every=6, checkpoint_every=6)
RTOL = 1e-4  # relative, on losses, evaluation metrics and tracker means after 12 AdamW steps
ATOL_W = 1e-5  # absolute, on every weight (init std 0.02, lr 1e-2)


def _cli_args(cfg_args: dict) -> list[str]:
    out = []
    for k, v in cfg_args.items():
        out += ["--" + k.replace("_", "-"), str(v)]
    return out


@pytest.mark.slow
def test_torchrun_two_processes_match_one_process(tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.fail("torchrun not found beside the interpreter")
    single = tmp_path / "single"
    train(single, lm_config(**ARGS), device="cpu", tensorboard=False, threads=1)

    cli = {k: v for k, v in ARGS.items() if k not in ("warmup",)}
    # warmup has no CLI flag of its own: run the same config through the library under torchrun
    script = tmp_path / "ddp_run.py"
    script.write_text(
        "import sys\n"
        "from headrank.training.config import lm_config\n"
        "from headrank.training.loop import train\n"
        f"train(sys.argv[1], lm_config(**{ARGS!r}), device='cpu', tensorboard=False, threads=1)\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    ddp = tmp_path / "ddp"
    p = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", str(script), str(ddp)],
                       capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stderr[-3000:]

    a, b = read_metrics(single), read_metrics(ddp)
    assert [r["step"] for r in a] == [r["step"] for r in b] and len(a) == 13
    for ra, rb in zip(a, b, strict=True):
        for k in ("loss", "acc", "val_loss", "test_loss", "test_ppl"):
            if k in ra:
                assert rb[k] == pytest.approx(ra[k], rel=RTOL, abs=1e-6), (ra["step"], k)
        if "mean" in ra:
            for prod in ("qk", "ov"):
                for k in ("nuclear", "frob_bound", "effective_rank"):
                    assert rb["mean"][prod][k] == pytest.approx(ra["mean"][prod][k], rel=RTOL)
    assert a[1]["loss"] != a[-1]["loss"]  # it trained
    wa = load_file(str(latest_checkpoint(single) / "model.safetensors"))
    wb = load_file(str(latest_checkpoint(ddp) / "model.safetensors"))
    assert wa.keys() == wb.keys()
    worst = max(float(np.abs(wa[k] - wb[k]).max()) for k in wa)
    moved = max(float(np.abs(wa[k] - load_file(str(single / "checkpoints" / "step-00000006" / "model.safetensors"))[k]).max())
                for k in wa)
    rel = max(abs(rb["loss"] - ra["loss"]) / abs(ra["loss"]) for ra, rb in zip(a, b, strict=True) if "loss" in ra)
    print(f"DDP vs one process: max |weight diff| {worst:.1e} (weights moved {moved:.1e} in the last 6 steps), "
          f"max relative loss diff {rel:.1e}")
    assert worst < ATOL_W < moved, (worst, moved)
    import json

    assert json.loads((ddp / "summary.json").read_text())["world_size"] == 2
    # and the CLI entry point itself runs under torchrun (rank 0 prints, the others stay quiet)
    out = tmp_path / "cli"
    p = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "headrank", "train", "lm",
                        "--out", str(out), "--device", "cpu", "--threads", "1", "--json", *_cli_args(cli)],
                       capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout)["final"]["step"] == 12
