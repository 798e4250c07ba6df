"Data parallelism (rlnb.distributed): two gloo processes take the update one process takes on the concatenated batch."
import json, os, socket, subprocess, sys, time
from pathlib import Path

import pytest
import rlnb
import torch
import torch.multiprocessing as mp

from rlnb.algorithms import ALGORITHMS, create_algorithm_config
from rlnb.core import GenerationConfig, TrainingConfig, TrainingState, set_seed
from rlnb.distributed import close_distributed
from rlnb.kl import create_reference_model
from rlnb.models import apply_lora
from rlnb.rollouts import create_batch_rollouts
from rlnb.tasks import get_task
from rlnb.tiny import load_tiny_model
from rlnb.step import create_optimizer, default_optimizer_step, training_step
from learnable import first_and_last, learnable_run, lora_policy

GROUP, PROMPTS, WORLD = 4, 4, 2
CASES = [(name, {}) for name in sorted(ALGORITHMS)] + [("grpo", {"aggregation": "token_mean"}),
                                                       ("ppo", {"aggregation": "sequence_mean"}),
                                                       ("grpo", {"beta": 0.04})]
VECTOR = ("gdpo", {})  # GDPO on 2-component rewards: its batch z-score needs every rank's rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def policy_and_rollouts():
    "A LoRA policy away from its reference and 4 groups of 4 rollouts of different lengths, with distinct rewards."
    torch.set_num_threads(1)
    base, tok = load_tiny_model("addition")
    set_seed(0)
    policy = apply_lora(base, r=4)
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad: p.add_(0.05 * torch.randn_like(p))
    examples = get_task("addition").sample(PROMPTS, seed=3)
    batch = create_batch_rollouts(policy, tok, examples, GenerationConfig(max_new_tokens=6, num_return_sequences=GROUP))
    rewards = torch.rand(len(batch.rollouts), generator=torch.Generator().manual_seed(1)).tolist()
    baselines = torch.rand(len(batch.rollouts), generator=torch.Generator().manual_seed(2)).tolist()  # ReMax's
    # opsd's and sdpo's hinted-prompt log-probs, as their rollout_wrapper writes them
    teachers = [(-torch.rand(len(r.token_ids), generator=torch.Generator().manual_seed(3 + i)) * 3).tolist()
                for i, r in enumerate(batch.rollouts)]
    return policy, tok, [r._replace(rewards=x, metadata={**(r.metadata or {}), "baseline_reward": b,
                                                          "teacher_logprobs": t})
                         for r, x, b, t in zip(batch.rollouts, rewards, baselines, teachers)]


def as_vectors(rollouts):
    "The rollouts with 2-component rewards (r, 1 - r^2)."
    return [r._replace(rewards=[r.rewards, 1 - r.rewards ** 2]) for r in rollouts]


LR = 1e-2  # the learning rate of the updates compared below


def assert_same_first_adamw_step(after2: dict, after1: dict, grads1: dict, label: str):
    "Weights after one AdamW step from the same start, on gradients equal to rounding: the same step, by name."
    # AdamW's first step moves each weight by lr * g / (|g| + eps), about lr * sign(g): an entry whose gradient is
    # within rounding of 0 may step either way in two sums of the same terms (up to 2 lr apart); the others alike.
    assert after1.keys() == after2.keys(), label
    for key in after1:  # (a weight without a gradient only decays: alike in both)
        settled = grads1[key].abs() > 1e-5 if key in grads1 else torch.ones_like(after1[key], dtype=torch.bool)
        torch.testing.assert_close(after2[key][settled], after1[key][settled], rtol=1e-4, atol=3e-4,
                                   msg=lambda m: f"{label} {key}: {m}")
        assert float((after2[key] - after1[key]).abs().max()) <= 2 * LR * (1 + 1e-4), (label, key)


def assert_same_update(two: tuple, one: tuple, label: str):
    "(gradients, weights after, metrics) of an update in two processes equal to one process's, to float rounding."
    (grads2, weights2, metrics2), (grads1, weights1, metrics1) = two, one
    assert grads1 and grads1.keys() == grads2.keys(), label
    for key in grads1:
        torch.testing.assert_close(grads2[key], grads1[key], rtol=1e-4, atol=1e-6, msg=lambda m: f"{label} {key}: {m}")
    assert_same_first_adamw_step(weights2, weights1, grads1, label)
    for key in ("loss/total", "reward/mean", "reward/std", "tokens/generated"):
        assert metrics2[key] == pytest.approx(metrics1[key], rel=1e-4, abs=1e-6), (label, key)


def one_update(policy, tok, rollouts, name, options, start):
    "One training_step from the weights `start`: (the gradient it stepped on, the weights after, the metrics)."
    with torch.no_grad():
        for k, p in policy.named_parameters():
            if k in start: p.copy_(start[k])
    torch.manual_seed(0)  # PPO's value head: created inside the step
    opt, _ = create_optimizer(policy, learning_rate=LR)
    ref = create_reference_model(policy)  # also the teacher of opd: the policy with its adapters off
    state = TrainingState(0, 0, policy, opt, None, ref_model=ref, teacher=ref)
    grads = {}
    def step(state, max_grad_norm):
        named = [*state.model.named_parameters()]
        if state.value_head is not None:
            named += [(f"value_head.{k}", p) for k, p in state.value_head.named_parameters()]
        grads.update({k: p.grad.clone() for k, p in named if p.grad is not None})
        return default_optimizer_step(state, max_grad_norm)
    state, stats = training_step(state, rollouts, create_algorithm_config(name, **options), optimizer_step_fn=step,
                                 tokenizer=tok,
                                 config=TrainingConfig(max_grad_norm=0.0))
    weights = {k: p.detach().clone() for k, p in policy.named_parameters() if p.requires_grad}
    if state.value_head is not None:
        weights.update({f"value_head.{k}": p.detach().clone() for k, p in state.value_head.named_parameters()})
    return grads, weights, dict(stats.custom_metrics)


def _refusals(rank: int) -> dict:
    "What train says to a config that differs between ranks, a batch that does not split, a sampler ahead."
    from rlnb.training import train
    said, run = {}, dict(num_iterations=1, eval_every=0, output_dir=None)
    for label, config in (("differs", TrainingConfig(learning_rate=1e-3 * (rank + 1), **run)),
                          ("split", TrainingConfig(prompts_per_step=3, **run)),
                          ("ahead", TrainingConfig(off_policy_steps=1, **run))):
        try: train(config, progress=False)
        except ValueError as e: said[label] = str(e)
    return said


def _update_worker(rank, world, port, out):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        policy, tok, rollouts = policy_and_rollouts()
        start = {k: p.detach().clone() for k, p in policy.named_parameters() if p.requires_grad}
        k = len(rollouts) // world
        mine = rollouts[rank * k:(rank + 1) * k]
        results = [one_update(policy, tok, mine, n, o, start) for n, o in CASES]
        results.append(one_update(policy, tok, as_vectors(mine), *VECTOR, start))
        said = _refusals(rank)  # in the same processes: each start costs seconds
        if rank == 0: torch.save((results, said), out)
    finally: close_distributed()


@pytest.mark.slow
def test_two_processes_take_the_single_process_update_and_refuse_bad_launches(tmp_path):
    out = tmp_path / "ranks.pt"
    mp.spawn(_update_worker, args=(WORLD, free_port(), str(out)), nprocs=WORLD)
    two, said = torch.load(out, weights_only=False)
    assert "differs from rank 0's" in said["differs"]
    assert "prompts_per_step=3 does not split over 2 processes" in said["split"]
    assert "off_policy_steps=1 runs in one process only" in said["ahead"]
    policy, tok, rollouts = policy_and_rollouts()
    start = {k: p.detach().clone() for k, p in policy.named_parameters() if p.requires_grad}
    assert len(two) == len(CASES) + 1
    for k, ((name, options), update2) in enumerate(zip([*CASES, VECTOR], two)):
        update1 = one_update(policy, tok, rollouts if k < len(CASES) else as_vectors(rollouts), name, options, start)
        assert_same_update(update2, update1, f"{name} {options}" + (" vector rewards" if k == len(CASES) else ""))


RUN = dict(num_iterations=4, prompts_per_step=4, group_size=4, eval_every=2, eval_size=8, max_new_tokens=6)


def _spawned(worker, *args):
    "Run `worker(rank, world, *args)` in WORLD gloo processes."
    mp.spawn(_in_group, args=(WORLD, free_port(), worker, args), nprocs=WORLD)


def _in_group(rank, world, port, worker, args):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try: worker(rank, world, *args)
    finally: close_distributed()


def _train_and_resume(rank, world, root):
    from rlnb.training import train
    root = Path(root)
    train(TrainingConfig(output_dir=str(root / "straight"), **RUN), progress=False)
    train(TrainingConfig(output_dir=str(root / "halves"), **RUN), progress=False,
          stop_fn=lambda state, metrics: state.iteration == 2)  # stopped at 2 (a checkpoint), then resumed to 4
    train(TrainingConfig(output_dir=str(root / "halves"), resume=True, **RUN), progress=False)


def _adapter(folder: Path) -> dict:
    from safetensors.torch import load_file
    return load_file(str(next((folder / "checkpoint").rglob("adapter_model.safetensors"))))


def _rows(folder: Path) -> list:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_two_process_run_logs_once_and_resumes_exactly(tmp_path):
    _spawned(_train_and_resume, str(tmp_path))
    straight, halves = _adapter(tmp_path / "straight"), _adapter(tmp_path / "halves")
    for k in straight: torch.testing.assert_close(halves[k], straight[k], rtol=0, atol=0, msg=k)
    a, b = _rows(tmp_path / "straight"), _rows(tmp_path / "halves")
    steps = [r["step"] for r in a if "reward/mean" in r]
    assert steps == [1, 2, 3, 4]  # logged once (rank 0), not once per rank
    pick = lambda rows: [(r["step"], r.get("reward/mean"), r.get("eval/accuracy")) for r in rows]
    assert pick(a) == pick(b)
    start = _adapter(tmp_path / "straight")
    # the same checkpoint resumed by one process: it continues the run where two left it
    from rlnb.training import train
    state = train(TrainingConfig(output_dir=str(tmp_path / "straight"), resume=True, **{**RUN, "num_iterations": 5}),
                  progress=False)
    assert state.iteration == 5 and [r["step"] for r in _rows(tmp_path / "straight") if "reward/mean" in r][-1] == 5
    assert any((start[k] != _adapter(tmp_path / "straight")[k]).any() for k in start)


def _every_algorithm(rank, world, out):
    from rlnb.training import train
    done = {}
    for name in sorted(ALGORITHMS):
        options = {"k": 2} if name == "grpo_passk" else None  # k below the group of 4: pass@4 would train nothing
        state = train(TrainingConfig(algorithm=name, num_iterations=2, prompts_per_step=4, group_size=4, eval_every=0,
                                     max_new_tokens=6, output_dir=None, teacher="tiny" if name == "opd" else None,
                                     algorithm_options=options), progress=False)
        w = torch.cat([p.detach().reshape(-1) for p in state.model.parameters() if p.requires_grad])
        done[name] = (state.iteration, w)
    torch.save(done, f"{out}.{rank}")


@pytest.mark.slow
def test_every_algorithm_runs_with_two_processes(tmp_path):
    out = str(tmp_path / "every.pt")
    _spawned(_every_algorithm, out)
    zero, one = (torch.load(f"{out}.{r}", weights_only=False) for r in range(WORLD))
    assert sorted(zero) == sorted(ALGORITHMS)
    for name in zero:
        assert zero[name][0] == 2, name
        torch.testing.assert_close(one[name][1], zero[name][1], rtol=0, atol=0, msg=name)  # the ranks stay equal




@pytest.mark.slow
def test_the_torchrun_command_trains_and_one_process_resumes_it(tmp_path):
    "`torchrun ... -m rlnb.cli train`: rank 0 logs once and writes the summary; one process resumes the run."
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    params = ["-p", "output_dir", str(tmp_path / "ddp"), "-p", "prompts_per_step", "4", "-p", "group_size", "4",
              "-p", "eval_every", "2", "-p", "eval_size", "8"]
    torchrun = str(Path(sys.executable).parent / "torchrun")
    done = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", "-m", "rlnb.cli", "train", *params,
                           "-p", "num_iterations", "2"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("trained 2 steps with 2 process(es)") == 1, done.stdout
    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["final_step"] == 2
    again = subprocess.run([sys.executable, "-m", "rlnb.cli", "train", *params, "-p", "num_iterations", "3",
                            "-p", "resume", "True"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stdout and "trained 3 steps with 1 process(es)" in again.stdout, again.stdout
    rows = _rows(tmp_path / "ddp")
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2, 3]


DYING = r'''
"`rlnb train` with rank 1 killed (SIGKILL: no last words), or raising an error, as it starts iteration 3's update."
import os, signal, sys
import rlnb.training
step = rlnb.training.training_step
def dying(state, *args, **kwargs):
    if os.environ.get("RANK") == "1" and state.iteration == 2:
        if os.environ["HOW"] == "kill": os.kill(os.getpid(), signal.SIGKILL)
        raise ValueError("rank 1's own error")
    return step(state, *args, **kwargs)
rlnb.training.training_step = dying
from rlnb.cli import main
sys.exit(main(sys.argv[1:]))
'''


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill", "raise"])
def test_a_rank_dying_mid_run_stops_the_run_with_one_line_and_one_process_resumes_it(tmp_path, how):
    "Rank 1 dies in iteration 3 of 5: rank 0 stops within seconds, says so in one line; its checkpoint resumes."
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "HOW": how}
    (tmp_path / "dying.py").write_text(DYING)
    params = ["-p", "output_dir", str(tmp_path / "run"), "-p", "prompts_per_step", "4", "-p", "group_size", "4",
              "-p", "eval_every", "0", "-p", "num_iterations", "5", "-p", "checkpoint_every", "1"]
    torchrun = str(Path(sys.executable).parent / "torchrun")
    t0 = time.perf_counter()
    died = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", str(tmp_path / "dying.py"), "train",
                           *params], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    seconds = time.perf_counter() - t0
    assert died.returncode != 0, died.stdout
    said = [line for line in died.stderr.splitlines() if line.startswith("rlnb train: error: train:")]
    assert len(said) == 1, died.stderr[-3000:]  # rank 0's line
    assert ("rank 1 of 2 stopped during iteration 3 of 5" in said[0]
            and f"the last checkpoint, iteration 2 in {tmp_path / 'run' / 'checkpoint'}, is intact" in said[0]
            and "resume=True" in said[0] and "any number of processes" in said[0]), said[0]
    if how == "raise": assert "rlnb train: error: rank 1's own error" in died.stderr  # rank 1 says its own
    assert seconds < 120, seconds  # both ranks gone at once: nobody waits for gloo's 30-minute timeout
    if how == "raise": return  # the resume is the same as after a kill
    again = subprocess.run([sys.executable, "-m", "rlnb.cli", "train", *params, "-p", "resume", "True"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "trained 5 steps with 1 process(es)" in again.stdout, again.stdout
    assert [r["step"] for r in _rows(tmp_path / "run") if "reward/mean" in r] == [1, 2, 3, 4, 5]


def _learns(rank, world, out):
    "20 iterations of GRPO on tests/learnable.py's reward (answers that start with '1'), 8 prompts split 4 and 4."
    state, tok = lora_policy(lr=3e-3)
    rows, _ = learnable_run(state, tok)
    torch.save(rows, f"{out}.{rank}")


@pytest.mark.slow
def test_a_two_process_run_learns(tmp_path):
    out = str(tmp_path / "rewards")
    _spawned(_learns, out)
    rows, others = (torch.load(f"{out}.{r}", weights_only=False) for r in range(WORLD))
    assert len(rows) == 20 and others == []  # rank 0 alone logs (the whole batch's mean reward)
    first, last = first_and_last(rows)
    assert last >= first + 0.3 and last >= 0.85, (first, last)


# (algorithm, options, LoRA rank (0: every weight trained), micro-batch size: then rank 0 takes 4 rollouts, rank 1 12)
FSDP_CASES = [("grpo", {}, 0, None), ("ppo", {}, 0, None), ("grpo", {"beta": 0.04}, 0, None), ("dpo", {}, 0, None),
              ("grpo", {}, 4, None), ("grpo", {}, 0, 4)]


def full_policy_and_rollouts(lora_r: int = 0):
    "The tiny policy moved off its start (every weight trained, or LoRA of rank `lora_r`) and the rollouts above."
    torch.set_num_threads(1)
    policy, tok, rollouts = policy_and_rollouts()  # rollouts sampled by the LoRA policy: any tokens will do
    base, _ = load_tiny_model("addition")
    set_seed(0)
    with torch.no_grad():
        for p in base.parameters(): p.add_(0.01 * torch.randn_like(p))
    return (apply_lora(base, r=lora_r) if lora_r else base), tok, rollouts


def sharded_update(policy, tok, rollouts, name, options, shard: bool, micro_batch_size=None):
    "One training_step of a fresh policy (sharded if `shard`): (its gradients by name, weights after, metrics)."
    from rlnb.distributed import full_training_state, shard_training_state
    torch.manual_seed(0)
    opt, _ = create_optimizer(policy, learning_rate=LR)
    ref = create_reference_model(policy) if options.get("beta") or name == "dpo" else None
    state = TrainingState(0, 0, policy, opt, None, ref_model=ref)
    if shard: state = shard_training_state(state)
    grads = {}
    def step(state, max_grad_norm):
        named = [*state.model.named_parameters()]
        if state.value_head is not None:
            named += [(f"value_head.{k}", p) for k, p in state.value_head.named_parameters()]
        for k, p in named:
            if p.grad is not None: grads[k] = p.grad.full_tensor() if shard else p.grad.clone()
        return default_optimizer_step(state, max_grad_norm)
    state, stats = training_step(state, rollouts, create_algorithm_config(name, **options), optimizer_step_fn=step,
                                 tokenizer=tok,
                                 config=TrainingConfig(max_grad_norm=1.0, micro_batch_size=micro_batch_size))
    plain = full_training_state(state) if shard else state
    if plain is None: return None
    weights = {k: p.detach().clone() for k, p in plain.model.named_parameters() if p.requires_grad}
    if plain.value_head is not None:
        weights.update({f"value_head.{k}": p.detach().clone() for k, p in plain.value_head.named_parameters()})
    return grads, weights, dict(stats.custom_metrics), plain.optimizer.state_dict()


def _fsdp_worker(rank, world, out):
    results = []
    for name, options, lora_r, micro in FSDP_CASES:
        policy, tok, rollouts = full_policy_and_rollouts(lora_r)
        k = len(rollouts) // world if micro is None else 4  # uneven: 1 micro-batch on rank 0, 3 on rank 1
        mine = rollouts[:k] if rank == 0 else rollouts[k:]
        results.append(sharded_update(policy, tok, mine, name, options, True, micro))
    if rank == 0: torch.save(results, out)


@pytest.mark.slow
def test_fsdp_takes_the_single_process_update(tmp_path):
    "Two ranks sharding the policy (FSDP2) take the update one process takes on the whole batch: full fine-tuning."
    out = tmp_path / "fsdp.pt"
    _spawned(_fsdp_worker, str(out))
    two = torch.load(out, weights_only=False)
    for (name, options, lora_r, micro), (grads2, weights2, metrics2, opt2) in zip(FSDP_CASES, two):
        policy, tok, rollouts = full_policy_and_rollouts(lora_r)
        grads1, weights1, metrics1, opt1 = sharded_update(policy, tok, rollouts, name, options, False, micro)
        label = f"{name} {options} lora_r={lora_r} micro_batch_size={micro}"
        assert grads1 and grads1.keys() == grads2.keys(), label
        for key in grads1:
            torch.testing.assert_close(grads2[key], grads1[key], rtol=1e-4, atol=1e-6,
                                       msg=lambda m: f"{label} {key}: {m}")
        assert_same_first_adamw_step(weights2, weights1, grads1, label)
        for key in ("loss/total", "grad_norm", "reward/mean"):
            assert metrics2[key] == pytest.approx(metrics1[key], rel=1e-4, abs=1e-6), (label, key)
        moments1, moments2 = opt1["state"], opt2["state"]  # the gathered optimizer state: the one process's
        assert moments1.keys() == moments2.keys(), label
        for i in moments1:
            torch.testing.assert_close(moments2[i]["exp_avg"], moments1[i]["exp_avg"], rtol=1e-4, atol=1e-6)


FSDP_RUN = dict(num_iterations=2, prompts_per_step=4, group_size=4, eval_every=2, eval_size=8, max_new_tokens=6,
                lora_r=0)


def _fsdp_train(rank, world, root):
    from rlnb.training import train
    train(TrainingConfig(output_dir=str(Path(root) / "fsdp"), fsdp=True, **FSDP_RUN), progress=False)
    halves = TrainingConfig(output_dir=str(Path(root) / "halves"), fsdp=True, **FSDP_RUN)
    train(halves, progress=False, stop_fn=lambda state, metrics: state.iteration == 1)  # a checkpoint at 1
    train(halves._replace(resume=True), progress=False)  # loaded whole, sharded again, on to 2


@pytest.mark.slow
def test_an_fsdp_run_checkpoints_and_resumes_in_one_process(tmp_path):
    "2 sharded iterations, evaluated and checkpointed by rank 0 (stopped and resumed sharded: the same weights); one "
    "process (no FSDP) resumes the full weights."
    from safetensors.torch import load_file
    from rlnb.training import train
    _spawned(_fsdp_train, str(tmp_path))
    folder = tmp_path / "fsdp"
    saved = load_file(str(folder / "checkpoint" / "model.safetensors"))
    resumed = load_file(str(tmp_path / "halves" / "checkpoint" / "model.safetensors"))
    for k in saved: torch.testing.assert_close(resumed[k], saved[k], rtol=0, atol=0, msg=k)  # the same run
    rows = _rows(folder)
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2] and any("eval/accuracy" in r for r in rows)
    state = train(TrainingConfig(output_dir=str(folder), resume=True, **{**FSDP_RUN, "num_iterations": 3}),
                  progress=False)
    assert state.iteration == 3 and state.global_step == 3
    weights = dict(state.model.named_parameters())
    assert all(k in weights or k == "lm_head.weight" for k in saved)  # lm_head: tied to the embeddings
    assert any((weights[k] != saved[k]).any() for k in saved if k in weights)  # the third step moved them
    with pytest.raises(ValueError, match="fsdp=True shards the model over several processes"):
        train(TrainingConfig(fsdp=True, num_iterations=1, eval_every=0), progress=False)


@pytest.mark.slow
def test_the_fsdp_torchrun_command_trains_every_weight(tmp_path):
    "The chapter's launch command, `torchrun ... -m rlnb.cli train -p fsdp True -p lora_r 0`, on the tiny model."
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    params = ["-p", "fsdp", "True", "-p", "lora_r", "0", "-p", "output_dir", str(tmp_path / "fsdp"), "-p",
              "num_iterations", "2", "-p", "prompts_per_step", "4", "-p", "group_size", "4", "-p", "eval_every", "2",
              "-p", "eval_size", "8"]
    torchrun = str(Path(sys.executable).parent / "torchrun")
    done = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", "-m", "rlnb.cli", "train", *params],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("trained 2 steps with 2 process(es)") == 1, done.stdout
    assert (tmp_path / "fsdp" / "checkpoint" / "model.safetensors").is_file()  # every weight, gathered by rank 0
    run = rlnb.load_run(tmp_path / "fsdp")  # the sharded run loads whole, as any run does
    assert (run.iteration, run.config.fsdp, rlnb.is_peft_model(run.model)) == (2, True, False)
    assert isinstance(rlnb.chat_reply(run.model, run.tokenizer, "12+34=", 4), str)


@pytest.mark.slow
def test_accelerate_launch_multi_gpu_starts_two_cpu_processes(tmp_path):
    "`accelerate launch --multi_gpu` takes its torchrun path, GPUs or not: two gloo processes here (`--cpu`: one)."
    pytest.importorskip("accelerate")
    accelerate = Path(sys.executable).parent / "accelerate"
    if not accelerate.exists(): pytest.skip("no `accelerate` command beside this Python")
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    params = ["-p", "output_dir", str(tmp_path / "acc"), "-p", "prompts_per_step", "4", "-p", "group_size", "4",
              "-p", "eval_every", "0", "-p", "num_iterations", "2"]
    done = subprocess.run([str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
                           "-m", "rlnb.cli", "train", *params], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("trained 2 steps with 2 process(es)") == 1, done.stdout
    assert json.loads((tmp_path / "acc" / "summary.json").read_text())["world_size"] == 2
