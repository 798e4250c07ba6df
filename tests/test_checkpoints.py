"Checkpoints and metric logs survive crashes: round trips, failed saves, saves killed at any moment, torn JSONL lines."
import json, os, random, signal, subprocess, sys, time, warnings

import pytest
import torch

# raised inside transformers when peft wraps
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing")

from rlnb.core import TrainingState, TrainingStats
from rlnb.checkpoints import checkpoint_exists, load_checkpoint, save_checkpoint
from rlnb.loggers import create_jsonl_logger, create_progress_logger, load_metrics
from rlnb.tiny import create_tiny_model, create_tiny_tokenizer

torch.set_num_threads(1)  # tiny matrices: one thread is as fast, and far faster on a shared, busy CPU
TOK = create_tiny_tokenizer()


def tiny_model(seed=0):
    return create_tiny_model(TOK, hidden_size=64, intermediate_size=128, seed=seed)


def lora_state(seed=0):
    "A LoRA policy after one real optimizer step (adapters perturbed by hand first: LoRA starts as a no-op)."
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(seed)
    model = get_peft_model(tiny_model(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 4))
    return TrainingState(0, 0, model, opt, sched)


def take_a_step(state):
    with torch.no_grad():
        for n, p in state.model.named_parameters():
            if "lora_B" in n: p.normal_(0, 0.02)
    state.model(input_ids=torch.randint(0, len(TOK), (2, 10))).logits.pow(2).mean().backward()
    state.optimizer.step(); state.scheduler.step(); state.optimizer.zero_grad()
    return state._replace(iteration=state.iteration + 1, global_step=state.global_step + 1)


def lora_weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_checkpoint_round_trip_and_atomic_failure(tmp_path):
    state = take_a_step(lora_state())
    path = save_checkpoint(state._replace(iteration=5), tmp_path / "ckpt")
    saved, draw = lora_weights(state.model), torch.rand(3)  # what the run would draw next

    class Broken:  # an optimizer whose state cannot be written
        param_groups = []
        def state_dict(self): raise OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(state._replace(iteration=9, optimizer=Broken()), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary directory left behind
    assert json.loads((path / "state.json").read_text())["iteration"] == 5  # the previous checkpoint is intact

    fresh = lora_state(seed=1)
    assert any(not torch.equal(w, saved[n]) for n, w in lora_weights(fresh.model).items())
    loaded = load_checkpoint(path, fresh.model, fresh.optimizer, fresh.scheduler)
    assert (loaded.iteration, loaded.global_step) == (5, 1)
    for n, w in lora_weights(fresh.model).items(): assert torch.equal(w, saved[n]), n
    for k in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(fresh.optimizer.state_dict()["state"][0][k], state.optimizer.state_dict()["state"][0][k])
    assert fresh.scheduler.last_epoch == state.scheduler.last_epoch
    assert torch.equal(torch.rand(3), draw)  # the random stream is back at the save point


def test_full_model_checkpoint_round_trip(tmp_path):
    "Without LoRA the whole model (with its tied embeddings) goes into model.safetensors."
    model = tiny_model()
    with torch.no_grad():
        for p in model.parameters(): p.add_(0.01)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    path = save_checkpoint(TrainingState(2, 7, model, opt), tmp_path / "full")
    assert (path / "model.safetensors").exists() and not (path / "adapter_model.safetensors").exists()
    other = tiny_model(seed=1)
    assert load_checkpoint(path, other).global_step == 7
    for (n, a), b in zip(model.state_dict().items(), other.state_dict().values()): assert torch.equal(a, b), n


def test_a_save_killed_mid_swap_is_found_and_repaired(tmp_path):
    "Between renaming the old checkpoint aside and the new one in, `path` is missing: load looks aside."
    model = torch.nn.Linear(4, 4)
    path = save_checkpoint(TrainingState(3, 3, model, None), tmp_path / "ckpt")
    os.rename(path, tmp_path / ".ckpt.old-12345678")  # what a kill between the two renames leaves
    (tmp_path / ".ckpt.tmp-abcdef").mkdir()  # and a temporary folder from a kill while writing
    assert not path.exists() and checkpoint_exists(path)
    assert load_checkpoint(path, torch.nn.Linear(4, 4)).iteration == 3
    save_checkpoint(TrainingState(4, 4, model, None), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # repaired and tidied
    assert load_checkpoint(path, torch.nn.Linear(4, 4)).iteration == 4
    assert not checkpoint_exists(tmp_path / "nothing") and not checkpoint_exists(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a checkpoint"): load_checkpoint(tmp_path / "nothing", model)


CHILD = """
import os, sys, time, torch
from rlnb.core import TrainingState
from rlnb.checkpoints import save_checkpoint
path, i, widen = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def rename(src, dst, _rename=os.rename):  # optionally widen the window between the two renames of a swap
    _rename(src, dst)
    if ".old-" in str(dst): time.sleep(widen)
os.rename = rename
model = torch.nn.Linear(512, 512)
while True:
    i += 1
    with torch.no_grad(): model.weight.fill_(i); model.bias.fill_(i)
    save_checkpoint(TrainingState(i, i, model, None), path)
    print(i, flush=True)
"""


@pytest.mark.slow
def test_a_writer_killed_at_random_moments_always_leaves_a_complete_checkpoint(tmp_path):
    path, rng, last = tmp_path / "ckpt", random.Random(0), 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for k in range(6):  # half of the children sleep 10 ms mid-swap, so that some kills land between the renames
        args = [sys.executable, "-c", CHILD, str(path), str(last), "0.01" if k % 2 else "0"]
        child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert child.stdout.readline().strip(), "the child saved nothing"  # its first save is done
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            child.send_signal(signal.SIGKILL); child.wait(); child.stdout.close()
        assert checkpoint_exists(path)
        net = torch.nn.Linear(512, 512)
        found = load_checkpoint(path, net, restore_rng=False)
        assert (net.weight == found.iteration).all() and (net.bias == found.iteration).all()  # one save, not a mix
        assert found.iteration >= last
        last = found.iteration
    save_checkpoint(TrainingState(last + 1, last + 1, torch.nn.Linear(512, 512), None), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def stats(reward):
    return TrainingStats(0.1, 0.2, 1e-3, 0.0, 0.5, 0.1, {"reward/mean": reward})


def test_jsonl_logger_appends(tmp_path):
    log = create_jsonl_logger(tmp_path / "m.jsonl")
    state = TrainingState(0, 0, None, None)
    for i in range(3):
        log(state._replace(iteration=i, global_step=i), stats(i / 10))
        assert len((tmp_path / "m.jsonl").read_text().splitlines()) == i + 1  # on disk at once
    again = create_jsonl_logger(tmp_path / "m.jsonl")  # a second logger on the same file appends
    again(state._replace(iteration=3, global_step=3), stats(0.3))
    assert load_metrics(tmp_path / "m.jsonl")["reward/mean"].tolist() == [0.0, 0.1, 0.2, 0.3]


def test_jsonl_logger_closes_a_torn_tail_and_load_metrics_skips_torn_lines(tmp_path):
    file = tmp_path / "m.jsonl"
    file.write_text('{"step": 1, "reward/mean": 0.1}\n'
                    '{"step": 2, "rew{"step": 3, "reward/mean": 0.3}\n'
                    '{"step": 4, "rew')
    with pytest.warns(UserWarning, match="torn line"):
        create_jsonl_logger(file)(TrainingState(5, 5, None, None), stats(0.5))
    assert file.read_text().endswith('{"step": 4, "rew\n{"iteration": 5, "step": 5, "reward/mean": 0.5}\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = load_metrics(file)
    assert df["step"].tolist() == [1, 5]
    assert [str(w.message) for w in caught] == [
        f"load_metrics: skipped 2 lines of {file} (2, 3), not JSON records (torn writes?)"]
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError, match="holds no JSON records .* it is not a metrics file"): load_metrics(binary)


def test_progress_logger_prints_first_every_tenth_and_last():
    lines = []
    log = create_progress_logger(50, every_s=1e9, log_fn=lines.append)
    log(TrainingState(0, 0, None, None), TrainingStats(*[float("nan")] * 6, {"eval/accuracy": 0.25}))
    for it in range(1, 51):
        log(TrainingState(it, it, None, None), TrainingStats(-0.01, 1, 1e-4, 0.001, 0.3, 0.1,
            {"reward/mean": 0.3, "kl/mean": 0.001, "loss/policy": -0.01, "time/step_s": 0.5}))
    assert [l[:7] for l in lines] == [f"[{i:>2}/50 " for i in (0, 1, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50)]
    assert lines[0].startswith("[ 0/50   0%] acc 0.25  (the starting model, evaluated in ")  # at once: no silence
    assert lines[1] == "[ 1/50   2%] reward 0.30  kl 0.0010  loss -0.010  0.50 s/it  eta 24 s"  # acc shown once
