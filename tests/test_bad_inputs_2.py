"""Bad inputs, round two: hook results checked where they enter, bounds refused up front, resume checks, files named.

Like tests/test_bad_inputs.py: each case is one bad input that must raise an exception of the right type whose message
names the hook, the argument or the file."""
import json, os, subprocess, sys, time

import nbformat
import pytest
import torch

from bad_inputs import check_bad_input, model, run, saved_run, small, tok

from rlnb import (algorithms, checkpoints, core, generation, loggers, logprobs, models, multiturn, training)
from rlnb.core import Generation, GenerationConfig, TrainingState, create_training_config

torch.set_num_threads(1)




CASES = []


def case(name, exc, contains, fn):
    CASES.append(pytest.param(fn, exc, (contains,) if isinstance(contains, str) else tuple(contains), id=name))


# --- every hook's result, checked where it enters ---------------------------------------------------------------------
case("hook/loss_fn returns a tensor", TypeError, ["`loss_fn` returned a Tensor", "pair (loss, metrics)"],
     lambda t: run(loss_fn=lambda batch, logprobs, cfg: logprobs.sum()))
case("hook/loss_fn returns a vector loss", TypeError, ["`loss_fn` returned a tensor of shape", "scalar"],
     lambda t: run(loss_fn=lambda batch, logprobs, cfg: (logprobs.sum(1), {})))
case("hook/loss_fn metrics not a dict", TypeError, ["`loss_fn` returned", "dict of numbers"],
     lambda t: run(loss_fn=lambda batch, logprobs, cfg: (logprobs.sum(), ["x"])))
case("hook/optimizer_step_fn returns None", TypeError, "`optimizer_step_fn` returned None",
     lambda t: run(optimizer_step_fn=lambda state, max_norm: None))
case("hook/eval_fn returns a float", TypeError, "`eval_fn` returned 0.5",
     lambda t: run(config=small(eval_every=1), eval_fn=lambda state: 0.5))
case("hook/iteration_hook returns a list", TypeError, "`iteration_hook` returned a list",
     lambda t: run(iteration_hook=lambda state, batch: list(batch.rollouts)))
case("hook/kl_fn returns one value per row", ValueError, ["kl_fn `<lambda>` returned shape", "one KL value per token"],
     lambda t: run(config=small(beta=0.1), kl_fn=lambda lp, ref: (lp - ref).sum(1)))
case("hook/dapo reward is a str", ValueError, ["reward function `<lambda>` returned a str"],
     lambda t: run(config=small(algorithm="dapo", max_new_tokens=6, overlong_buffer=2, dynamic_sampling=False),
                   reward_fn=lambda r: "1.0"))
case("hook/template_fn returns a list", TypeError, "`template_fn` returned a list",
     lambda t: run(template_fn=lambda conv, tokenizer: ["1+1="]))
case("hook/tool_parser returns a str", TypeError, "`tool_parser` returned a str",
     lambda t: run(tool_parser=lambda text: "calculator"))
case("hook/tool_parser call without a name", TypeError, "returned call 0 with name None; expected a str",
     lambda t: run(tool_parser=lambda text: [{"arguments": {}}]))
case("hook/prompt_loader returns a dict", TypeError, "`prompt_loader` must return a list of prompts",
     lambda t: run(config=small(prompts_per_step=16), prompt_loader=lambda it: {"1+1=": "2"}, reward_fn=lambda r: 0.0))
case("hook/generator without token ids", ValueError, ["`generator`'s result 0", "token_ids=None"],
     lambda t: run(generator=lambda m, tk, prompts, cfg: [Generation("2")] * (len(prompts) * cfg.num_return_sequences)))
case("hook/generator returns strings", TypeError, ["`generator`'s result 0", "expected a rlnb Generation"],
     lambda t: run(generator=lambda m, tk, prompts, cfg: ["2"] * (len(prompts) * cfg.num_return_sequences)))
case("hook/generator logprobs of another length", ValueError, "1 logprobs for 2 token ids",
     lambda t: run(generator=lambda m, tk, prompts, cfg: [Generation("2", token_ids=[5, 6], logprobs=[-1.0])]
                   * (len(prompts) * cfg.num_return_sequences)))

# --- the objects train is handed ------------------------------------------------------------------------------------
case("train/model is a name", TypeError, ["`model` must be a torch model", "config.model='tiny'"],
     lambda t: training.train(small(), model="tiny", tokenizer=tok(), progress=False))
case("train/tokenizer is a name", TypeError, "`tokenizer` must be a tokenizer object",
     lambda t: training.train(small(), model=model(), tokenizer="tiny", progress=False))
case("train/initial_state is a dict", TypeError, "`initial_state` must be a TrainingState",
     lambda t: training.train(small(), initial_state={}, tokenizer=tok(), progress=False))
case("train/progress is a str", TypeError, "`progress` must be True or False",
     lambda t: training.train(small(), progress="no"))

# --- bounds and config rules, refused before anything starts ---------------------------------------------------------
case("config/lora_r huge", ValueError, "`lora_r` must be <= 4,096", lambda t: create_training_config(lora_r=100_000))
case("config/prompts x group", ValueError, ["prompts_per_step x group_size", "the limit is 65,536"],
     lambda t: create_training_config(prompts_per_step=100_000, group_size=1_000))
case("config/eval_size huge", ValueError, "`eval_size` must be <= 10,000",
     lambda t: create_training_config(eval_size=10**9))
case("config/num_threads huge", ValueError, "`num_threads` must be <= 1,024",
     lambda t: create_training_config(num_threads=10**6))
case("config/over_sampling_factor", ValueError, "`over_sampling_factor` must be <=",
     lambda t: create_training_config(over_sampling_factor=10**6))
case("config/learning_rate 5", ValueError, "`learning_rate` must be <= 1.0",
     lambda t: create_training_config(learning_rate=5.0))
case("config/seed below torch's range", ValueError, "`seed` must be >= -2**63",
     lambda t: create_training_config(seed=-(2**64)))
case("config/seed huge", ValueError, "`seed` must be <=", lambda t: create_training_config(seed=2**70))
case("config/output_dir empty", ValueError, "`output_dir` is empty", lambda t: create_training_config(output_dir=""))
case("config/beta twice", ValueError, "`beta` is given twice",
     lambda t: create_training_config(beta=0.1, algorithm_options={"beta": 0.2}))
case("lora/alpha nan", ValueError, "`alpha` must be a finite number > 0",
     lambda t: models.apply_lora(model(), alpha=float("nan")))
case("lora/target_modules ints", TypeError, "`target_modules` must be module names",
     lambda t: models.apply_lora(model(), target_modules=[1, 2]))
case("lora/target_modules unknown", ValueError, "match no module",
     lambda t: models.apply_lora(model(), target_modules=["qq_proj"]))
case("gen/prompt fills the context", ValueError, ["prompts[0] has", "the model's whole context (256 positions)"],
     lambda t: generation.batch_generate(model(), tok(), ["1" * 300], GenerationConfig(max_new_tokens=4)))
case("gen/merge_lora=1", TypeError, "`config.merge_lora` must be True or False",
     lambda t: generation.batch_generate(model(), tok(), ["1+1="], GenerationConfig(max_new_tokens=2, merge_lora=1)))
case("logprobs/token id past the vocabulary", ValueError, ["holds token ids from 1 to 99999", "another tokenizer"],
     lambda t: logprobs.compute_logprobs_for_tokens(model(), torch.tensor([[1, 2, 99999]]), torch.ones(1, 3), 1))

# --- files named -----------------------------------------------------------------------------------------------------
def _binary_metrics(t):
    (t / "metrics.jsonl").write_bytes(bytes(range(256)) * 8)
    return loggers.load_metrics(t / "metrics.jsonl")
case("files/binary metrics", ValueError, ["{tmp}/metrics.jsonl holds no JSON records", "not a metrics file"],
     _binary_metrics)


def _bad_rollouts(t):
    (t / "r.jsonl").write_text(json.dumps({"__record__": "Rollout", "prompt": "1+1=", "token_ids": "abc",
                                           "rewards": "x"}) + "\n")
    return core.rollouts_from_jsonl(t / "r.jsonl")
case("files/rollouts of the wrong types", ValueError, ["{tmp}/r.jsonl:1", "`token_ids` must be a list of ints",
                                                       "`rewards` must be a number"], _bad_rollouts)


def _truncated_weights(t):
    folder = t / "model"
    model().save_pretrained(folder)
    (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:100])
    return models.load_model(core.ModelConfig(str(folder)))
case("files/truncated model.safetensors", ValueError, ["could not load the model from {tmp}/model", "model.safetensors",
                                                       "truncated or damaged"], _truncated_weights)


def _status_of_wrong_types(t):
    from rlnb.experiments import run_experiment
    (t / "run").mkdir()
    (t / "run" / "status.json").write_text(json.dumps({"status": "failed", "params": [1], "attempt": "x"}))
    nb = t / "x.ipynb"; nbformat.write(nbformat.v4.new_notebook(), nb)
    return run_experiment(nb, {}, t / "run", check_params=None)
case("files/status.json of the wrong types", ValueError, ["{tmp}/run/status.json", "not written by rlnb"],
     _status_of_wrong_types)


def _notebook_that_is_not_one(t):
    from rlnb.experiments import run_experiment
    nb = t / "x.ipynb"; nb.write_text("{}")
    return run_experiment(nb, {}, t / "run", check_params=None)
case("files/a notebook that is not one", ValueError, ["{tmp}/x.ipynb", "is not a papermill notebook"],
     _notebook_that_is_not_one)


def _checkpoint_through_a_link(t):
    (t / "real").mkdir()
    (t / "link").symlink_to(t / "real", target_is_directory=True)
    return checkpoints.save_checkpoint(TrainingState(0, 0, model(), None), t / "link")
case("files/checkpoint path is a link", ValueError, ["{tmp}/link", "is a symbolic link"], _checkpoint_through_a_link)


@pytest.mark.parametrize("fn, exc, contains", CASES)
def test_bad_input(fn, exc, contains, tmp_path):
    check_bad_input(fn, exc, contains, tmp_path)


# --- resume checks what it loads --------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, message", [
    (dict(task="arithmetic"), "task: 'addition' there, 'arithmetic' here"),
    (dict(seed=5), "seed: 0 there, 5 here"),
    (dict(lora_r=8), "lora_r: 4 there, 8 here"),
    (dict(group_size=4), "group_size: 2 there, 4 here"),
])
def test_resume_refuses_another_run(saved_run, change, message):
    config = small(**{**dict(num_iterations=3, lora_r=4, output_dir=str(saved_run), resume=True), **change})
    with pytest.raises(ValueError, match="resume=True, but .* holds another run") as info:
        training.train(config, progress=False)
    assert message in str(info.value)


def test_resume_checks_tensors_state_and_optimizer(saved_run, tmp_path):
    import shutil
    from safetensors.torch import load_file, save_file
    def copy_run():
        dest = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
        shutil.copytree(saved_run, dest)
        return dest
    resume = lambda out: training.train(small(num_iterations=3, lora_r=4, output_dir=str(out), resume=True),
                                        progress=False)
    out = copy_run()  # an adapter tensor missing
    file = out / "checkpoint" / "adapter_model.safetensors"
    weights = load_file(str(file)); weights.pop(sorted(weights)[0]); save_file(weights, str(file))
    with pytest.raises(ValueError, match="lacks adapter weights the model has"): resume(out)
    out = copy_run()  # state.json with a negative iteration
    meta = json.loads((out / "checkpoint" / "state.json").read_text()); meta["iteration"] = -3
    (out / "checkpoint" / "state.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="has iteration=-3, expected an int >= 0"): resume(out)
    out = copy_run()  # an optimizer saved for parameters of other shapes
    opt_file = out / "checkpoint" / "optimizer.pt"
    state = torch.load(opt_file, weights_only=True)
    for s in state["state"].values():
        for k, v in s.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0: s[k] = torch.zeros(v.numel() + 1)
    torch.save(state, opt_file)
    with pytest.raises(ValueError, match="optimizer.pt holds 'exp_avg' of shape"): resume(out)
    out = copy_run()  # junk lines in metrics.jsonl do not block resume
    with open(out / "metrics.jsonl", "a") as f: f.write('[1, 2]\n"text"\n{"iteration": "x"}\n')
    state = resume(out)
    assert state.iteration == 3


@pytest.mark.slow
def test_two_trainings_never_share_an_output_dir(tmp_path):
    "A second process on the same output_dir is refused, naming the first; nothing of the first run is touched."
    out = tmp_path / "run"
    code = ("from rlnb.core import create_training_config\nfrom rlnb.training import train\n"
            f"train(create_training_config(num_iterations=400, prompts_per_step=2, group_size=2, max_new_tokens=2, "
            f"eval_every=0, lora_r=0, output_dir={str(out)!r}), progress=False)")
    first = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.time() + 120
        while not (out / "metrics.jsonl").exists():
            assert time.time() < deadline and first.poll() is None, "the first run never started"
            time.sleep(0.2)
        with pytest.raises(RuntimeError, match=f"in use by another process \\(purpose rlnb.train, pid {first.pid}"):
            training.train(small(output_dir=str(out)), progress=False)
        with pytest.raises(RuntimeError, match="in use by another process"):
            training.train(small(output_dir=str(out), resume=True), progress=False)
    finally:
        first.kill(); first.wait()
    rows = (out / "metrics.jsonl").read_text().count("\n")
    assert rows > 0  # the first run's rows are all there


def test_zero_loss_is_explained_once():
    lines = []
    log = loggers.create_progress_logger(4, every_s=1e9, every_frac=0.25, log_fn=lines.append)
    for it in range(1, 5):
        log(TrainingState(it, it, None, None), core.TrainingStats(0.0, 1, 1e-4, 0.0, 0.3, 0.1,
            {"reward/mean": 0.3, "loss/policy": 0.0, "time/step_s": 0.5}))
    notes = [l for l in lines if "a loss near 0 is normal" in l]
    assert len(notes) == 1 and len(lines) == 5, lines


def test_tool_names_invented_by_the_model_do_not_become_columns():
    from rlnb.core import Rollout
    calls = tuple({"name": f"tool_{i}", "arguments": {}} for i in range(300)) + ({"name": "x" * 500, "arguments": {}},)
    metrics = multiturn.track_tool_calls([Rollout("", tool_calls=calls, tool_results=())])
    per_tool = {k.split("/")[1] for k in metrics if k.count("/") == 2}
    assert len(per_tool) <= multiturn.MAX_TOOL_COLUMNS + 1 and "<other>" in per_tool


def test_a_tool_cannot_leave_a_detached_process_behind():
    from rlnb.tools import execute_tools
    def detach():
        child = subprocess.Popen(["sleep", "60"], start_new_session=True)  # setsid: out of the tool's process group
        return str(child.pid)
    result = execute_tools([{"name": "detach", "arguments": {}}], tools={"detach": detach}, timeout_s=5)
    pid = int(result[0]["content"])
    time.sleep(0.3)
    try: state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError: state = "gone"
    assert state in ("Z", "gone"), f"the detached process {pid} still runs ({state})"


def test_the_xml_tool_parser_is_linear():
    text = "<tool " * 50_000  # 300 kB with no '>' anywhere: each start used to scan to the end
    t0 = time.perf_counter()
    assert multiturn.parse_tool_calls(text) == []
    assert time.perf_counter() - t0 < 3.0


def test_huge_rewards_keep_their_advantages():
    r = torch.tensor([1e20, 3e20, 2e20, 0.0])
    adv = algorithms.compute_grpo_advantages(r, group_size=4)  # the variance (1e40) overflowed float32 before: all 0
    torch.testing.assert_close(adv, algorithms.compute_grpo_advantages(r / 1e20, group_size=4), rtol=1e-3, atol=0)


def test_a_budget_past_the_context_is_said_before_sampling():
    with pytest.warns(UserWarning, match="a completion can run past the model's context of 256 positions"):
        generation.batch_generate(model(), tok(), ["1" * 250], GenerationConfig(max_new_tokens=10, do_sample=False))
