"`rlnb eval` and `rlnb export` on a run folder, as a user types them: real processes, real files read back."
import os, subprocess, sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import rlnb

ROOT = Path(__file__).resolve().parent.parent


def rlnb_command(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "rlnb.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=900)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs") / "grpo"
    rlnb.quick_start_training(num_iterations=6, prompts_per_step=4, group_size=4, eval_every=3, eval_size=16,
                              output_dir=str(folder), progress=False)
    return folder


@pytest.mark.slow
def test_rlnb_eval_prints_the_table_evaluate_runs_gives(run_folder, tmp_path):
    done = rlnb_command("eval", run_folder, "--base", "-p", "samples", "4", "--csv", tmp_path / "t.csv",
                        "--plot", tmp_path / "t.png")
    assert done.returncode == 0, done.stderr
    table = rlnb.evaluate_runs([run_folder], base=True, samples=4)
    saved = pd.read_csv(tmp_path / "t.csv", index_col="model")
    assert list(saved.index) == ["base", "grpo"] and (tmp_path / "t.png").stat().st_size > 1000
    for column in ("accuracy", "pass@1", "pass@4", "reward", "length"):
        assert saved[column].tolist() == pytest.approx(table[column].tolist()), column
        assert column in done.stdout.splitlines()[0]
    logged = rlnb.load_metrics(run_folder / "metrics.jsonl").dropna(subset=["eval/accuracy"])
    assert table.loc["grpo", "accuracy"] == logged["eval/accuracy"].iloc[-1]  # the run's own last evaluation
    for args, says in ((("-p", "sampels", "4"), "did you mean 'samples'"),
                       (("--csv", tmp_path / "no" / "t.csv"), "its folder does not exist"),
                       (("--plot", tmp_path / "t.xyz"), "name an image file")):
        bad = rlnb_command("eval", run_folder, *args)  # refused before any model loads
        assert bad.returncode == 2 and says in bad.stderr, bad.stderr


@pytest.mark.slow
def test_rlnb_export_writes_files_that_load_back_with_the_trained_greedy_text(run_folder, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    run = rlnb.load_run(run_folder)
    prompts = run.task.sample(16, seed=987_654)
    def texts(model, tokenizer):
        return [r.generation.text for r in rlnb.greedy_rollouts(model, tokenizer, prompts).rollouts]
    trained = texts(run.model, run.tokenizer)
    for fmt, out in (("hf", tmp_path / "hf"), ("gguf", tmp_path / "model.gguf")):
        done = rlnb_command("export", run_folder, out, "--format", fmt, "--dtype", "f32")
        assert done.returncode == 0 and f"wrote {out} ({fmt})" in done.stdout, done.stderr
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert texts(hf, rlnb.auto_tokenizer(str(tmp_path / "hf"))) == trained
    gguf = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="model.gguf", dtype=torch.float32)
    assert texts(gguf, AutoTokenizer.from_pretrained(tmp_path, gguf_file="model.gguf")) == trained
    card = (tmp_path / "model.md").read_text()
    command = next(line for line in card.splitlines() if line.startswith("rlnb train "))
    for setting in ("prompts_per_step 4", "group_size 4", "num_iterations 6",  # as given, and the "auto" ones as chosen
                    "generator hf", "mixed_precision no", "rollout_correction none"):
        assert f" -p {setting} " in f"{command} ", (setting, command)
    assert "| accuracy_final |" in card
    before = (tmp_path / "model.gguf").stat().st_mtime_ns
    again = rlnb_command("export", run_folder, tmp_path / "model.gguf", "--format", "gguf")
    assert again.returncode == 2 and "already exists" in again.stderr
    assert (tmp_path / "model.gguf").stat().st_mtime_ns == before  # nothing overwritten
    for args, says in (((tmp_path, tmp_path / "x"), "holds no checkpoint to load"),
                       ((run_folder, tmp_path / "x.bin", "--format", "gguf"), "needs a path ending in .gguf")):
        bad = rlnb_command("export", *args)
        assert bad.returncode == 2 and says in bad.stderr, bad.stderr
