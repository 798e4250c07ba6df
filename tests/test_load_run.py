"load_run, load_base, `rlnb chat` on runs of every kind: LoRA, full weights, PPO's critic, a model object, papermill."
import json, os, subprocess, sys
from pathlib import Path

import pytest
import torch

import rlnb
from rlnb.runs import find_checkpoint, load_base, load_run, run_checkpoints

ROOT = Path(__file__).resolve().parent.parent
SHORT = dict(num_iterations=4, prompts_per_step=4, group_size=4, eval_every=2, eval_size=8, progress=False)


def logits(model, tokenizer, text="12+34="):
    with torch.no_grad(): return model(**tokenizer([text], return_tensors="pt")).logits


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs") / "lora"
    state, _ = rlnb.quick_start_training(**SHORT, output_dir=str(folder), checkpoint_every=2, keep_checkpoints=True)
    return folder, state


@pytest.mark.slow
def test_a_lora_run_loads_as_trained_and_keeps_its_checkpoints(lora_run):
    folder, state = lora_run
    run = load_run(folder)
    assert torch.equal(logits(run.model, run.tokenizer), logits(state.model, run.tokenizer))
    assert list(run_checkpoints(folder)) == [2, 4] and run.iteration == 4
    early = load_run(folder, iteration=2)
    assert not torch.equal(logits(early.model, run.tokenizer), logits(run.model, run.tokenizer))
    base = load_base(run)
    with torch.no_grad(), run.model.disable_adapter():  # the base under the adapter is the base load_base builds
        assert torch.equal(logits(base, run.tokenizer), logits(run.model, run.tokenizer))
    random_state = torch.get_rng_state()
    load_run(folder)
    assert torch.equal(torch.get_rng_state(), random_state)  # loading to look changes no random state


@pytest.mark.slow
def test_broken_checkpoints_are_named(lora_run, tmp_path):
    folder, _ = lora_run
    import shutil
    shutil.copytree(folder, tmp_path / "copy")
    (tmp_path / "copy" / "checkpoint" / "state.json").write_text("{not json")
    with pytest.raises(ValueError, match="state.json is not valid JSON"): load_run(tmp_path / "copy")
    (tmp_path / "copy" / "checkpoints" / "4" / "adapter_model.safetensors").unlink()
    with pytest.raises(ValueError, match="state.json is not valid JSON"): run_checkpoints(tmp_path / "copy")
    shutil.rmtree(tmp_path / "copy" / "checkpoint")
    with pytest.raises(FileNotFoundError, match="adapter_model.safetensors is missing"):
        load_run(tmp_path / "copy")  # the last kept checkpoint is the last one now, and it lost its weights
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError, match="is not a folder .it is a file"): load_run(tmp_path / "file")
    with pytest.raises(ValueError, match="`iteration` picks one of a run's"):
        find_checkpoint(folder / "checkpoint", iteration=2)
    with pytest.raises(ValueError, match="no checkpoint of iteration True"): load_run(folder, iteration=True)


def test_keep_checkpoints_needs_an_output_dir():
    with pytest.raises(ValueError, match="`keep_checkpoints`=True keeps each checkpoint in output_dir"):
        rlnb.create_training_config(keep_checkpoints=True)


@pytest.mark.slow
def test_full_weight_and_ppo_runs_load(tmp_path):
    state, _ = rlnb.quick_start_training(**SHORT, lora_r=0, output_dir=str(tmp_path / "full"))
    run = load_run(tmp_path / "full")
    assert not rlnb.is_peft_model(run.model) and (tmp_path / "full" / "checkpoint" / "model.safetensors").is_file()
    assert torch.equal(logits(run.model, run.tokenizer), logits(state.model, run.tokenizer))
    state, _ = rlnb.quick_start_training(**SHORT, algorithm="ppo", output_dir=str(tmp_path / "ppo"))
    run = load_run(tmp_path / "ppo", merge=True)  # its value head is read and set aside
    assert not rlnb.is_peft_model(run.model)
    assert torch.allclose(logits(run.model, run.tokenizer), logits(state.model, run.tokenizer), atol=1e-4)


@pytest.mark.slow
def test_a_run_of_a_model_object_needs_that_model(tmp_path):
    model, tokenizer = rlnb.load_tiny_model(progress=False)
    state, _ = rlnb.quick_start_training(**SHORT, model=model, tokenizer=tokenizer, output_dir=str(tmp_path / "obj"))
    with pytest.raises(ValueError, match="trained from a model object passed to train"): load_run(tmp_path / "obj")
    fresh, _ = rlnb.load_tiny_model(progress=False)
    run = load_run(tmp_path / "obj", model=fresh, tokenizer=tokenizer)
    assert torch.equal(logits(run.model, tokenizer), logits(state.model, tokenizer))
    with pytest.raises(ValueError, match="trained from a model object"): load_base(run)


def chat(*args, stdin=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "rlnb.cli", "chat", *map(str, args)], input=stdin,
                          capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_rlnb_chat_talks_to_a_run_and_its_base(lora_run):
    folder, state = lora_run
    run = load_run(folder)
    done = chat(folder, "--base", "-m", "12+34=", "-m", "7+8=")
    assert done.returncode == 0, done.stderr
    want = rlnb.chat_reply(run.model, run.tokenizer, "12+34=", run.config.max_new_tokens)
    assert f"you> 12+34=\ntrained> {want}\nbase> " in done.stdout and "you> 7+8=" in done.stdout
    typed = chat(folder, stdin="12+34=\n/reset\n12+34=\n")  # from the terminal: each line a turn, end of input ends
    assert typed.returncode == 0 and typed.stdout.count(f"trained> {want}") == 2, typed.stdout
    assert "(a new conversation)" in typed.stdout
    for args, says in (((folder.parent,), "holds runs, each in a folder of its own (lora)"),
                       ((folder, "--iteration", "3"), "no checkpoint of iteration 3; it has [2, 4]"),
                       ((folder / "missing",), "is not a folder"),
                       ((folder, "--max-new-tokens", "0"), "--max-new-tokens must be at least 1")):
        bad = chat(*args)
        assert bad.returncode == 2 and says in bad.stderr, bad.stderr


@pytest.mark.slow
def test_the_papermill_run_loads(tmp_path):
    "The README's main job, shortened: `rlnb run` on the training notebook, then load_run on its folder."
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    args = ["run", str(ROOT / "nbs/experiments/grpo_training.ipynb"), "-o", str(tmp_path / "grpo")]
    for name, value in {**SHORT, "progress": None}.items():
        if value is not None: args += ["-p", name, str(value)]
    done = subprocess.run([sys.executable, "-m", "rlnb.cli", *args], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    run = load_run(tmp_path / "grpo")
    summary = json.loads((tmp_path / "grpo" / "summary.json").read_text())
    assert run.iteration == summary["final_step"] == 4 and run.config.num_iterations == 4
