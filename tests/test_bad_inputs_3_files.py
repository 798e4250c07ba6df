"""Bad inputs, round three (files): checkpoints checked field by field on loading, the set-aside checkpoint furthest
into the run recovered, metrics files that are links or folders refused, and resume keeping the metric rows it
cannot date.

Like tests/test_bad_inputs_2.py: each case is one bad input that must raise an exception of the right type whose
message names the file and what is wrong in it; behaviour fixes are plain tests below the cases."""
import json, os, shutil, warnings

import pytest
import torch

from bad_inputs import _tiny, check_bad_input, model, saved_run, small

from rlnb import checkpoints, loggers, models, training
from rlnb.core import TrainingState

torch.set_num_threads(1)
nan, inf = float("nan"), float("inf")


CASES = []


def case(name, exc, contains, fn, marks=()):
    CASES.append(pytest.param(fn, exc, (contains,) if isinstance(contains, str) else tuple(contains), id=name,
                              marks=marks))


# --- state.json, field by field -------------------------------------------------------------------------------------
def linear(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 4)


def saved(t, **parts):
    "A checkpoint of a small linear model (with an SGD optimizer and a scheduler) in t/ckpt."
    net = linear()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)
    return checkpoints.save_checkpoint(TrainingState(3, 3, net, opt, sched, **parts), t / "ckpt")


def load(t, **kw):
    net = linear(1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    return checkpoints.load_checkpoint(t / "ckpt", net, opt, torch.optim.lr_scheduler.StepLR(opt, 10), **kw)


def with_state(t, **fields):
    "Save, then set `fields` in state.json (None: remove the field), then load."
    file = saved(t) / "state.json"
    meta = {**json.loads(file.read_text()), **fields}
    file.write_text(json.dumps({k: v for k, v in meta.items() if v is not None}))
    return load(t)


def stats_record(**fields):
    return {"__record__": "TrainingStats", "loss": 0.1, "grad_norm": 0.5, "learning_rate": 1e-4, "kl_divergence": 0.0,
            "rewards_mean": 0.2, "rewards_std": 0.1, "custom_metrics": {"reward/mean": 0.2}, **fields}


STATE = "{tmp}/ckpt/state.json"
case("ckpt/iteration 10**20", ValueError, [STATE, "iteration=100000000000000000000", "< 2**53"],
     lambda t: with_state(t, iteration=10**20))
case("ckpt/global_step 2**53", ValueError, [STATE, f"global_step={2**53}", "< 2**53"],
     lambda t: with_state(t, global_step=2**53))
case("ckpt/iteration a float", ValueError, [STATE, "iteration=3.0"], lambda t: with_state(t, iteration=3.0))
case("ckpt/stats_history of ints", ValueError, [STATE, "stats_history[0] = 1, not a TrainingStats record"],
     lambda t: with_state(t, stats_history=[1, 2]))
case("ckpt/stats_history of plain dicts", ValueError, [STATE, "stats_history[0] = {'a': 1}, not a TrainingStats"],
     lambda t: with_state(t, stats_history=[{"a": 1}]))
case("ckpt/stats_history a dict", ValueError, [STATE, "stats_history that is not a list"],
     lambda t: with_state(t, stats_history={"a": 1}))
case("ckpt/stats_history loss a str", ValueError, [STATE, "stats_history[1]", "loss is 'x', not a number"],
     lambda t: with_state(t, stats_history=[stats_record(), stats_record(loss="x")]))
case("ckpt/stats_history metric a list", ValueError, [STATE, "custom_metrics['reward/mean'] is a list"],
     lambda t: with_state(t, stats_history=[stats_record(custom_metrics={"reward/mean": [1]})]))
case("ckpt/stats_history metrics a list", ValueError, [STATE, "custom_metrics is a list, not an object"],
     lambda t: with_state(t, stats_history=[stats_record(custom_metrics=[1])]))
case("ckpt/stats_history record of another kind", ValueError, [STATE, "does not read back"],
     lambda t: with_state(t, stats_history=[{"__record__": "TrainingStats", "nope": 1}]))
case("ckpt/metadata.config a str", ValueError, [STATE, "a str as metadata.config, not an object"],
     lambda t: with_state(t, metadata={"config": "junk"}))
case("ckpt/metadata.config a list", ValueError, [STATE, "a list as metadata.config"],
     lambda t: with_state(t, metadata={"config": [1]}))
case("ckpt/format from the future", ValueError, [STATE, "format='rlnb-checkpoint/999'", "'rlnb-checkpoint/1'"],
     lambda t: with_state(t, format="rlnb-checkpoint/999"))
case("ckpt/format missing", ValueError, [STATE, "lacks ['format']"], lambda t: with_state(t, format=None))
case("ckpt/optimizer flag not a bool", ValueError, [STATE, "optimizer='yes', expected true or false"],
     lambda t: with_state(t, optimizer="yes"))


# --- weights that are not finite ------------------------------------------------------------------------------------
def poison(file, value=nan):
    "Put `value` into the first element of every floating tensor of a safetensors file."
    from safetensors.torch import load_file, save_file
    weights = load_file(str(file))
    for w in weights.values():
        if w.is_floating_point(): w.view(-1)[0] = value
    save_file(weights, str(file))


case("ckpt/NaN in model.safetensors", ValueError, ["{tmp}/ckpt/model.safetensors", "NaN or infinite values in"],
     lambda t: (poison(saved(t) / "model.safetensors"), load(t)))
case("ckpt/inf in model.safetensors", ValueError, ["{tmp}/ckpt/model.safetensors", "NaN or infinite"],
     lambda t: (poison(saved(t) / "model.safetensors", inf), load(t)))
case("ckpt/NaN in value_head.safetensors", ValueError, ["{tmp}/ckpt/value_head.safetensors", "NaN or infinite"],
     lambda t: (poison(saved(t, value_head=torch.nn.Linear(4, 1)) / "value_head.safetensors"),
                load(t, value_head=torch.nn.Linear(4, 1))))


def lora_checkpoint(t):
    m = models.apply_lora(model(), r=4)
    return checkpoints.save_checkpoint(TrainingState(1, 1, m, None), t / "ckpt")


case("ckpt/NaN in adapter_model.safetensors", ValueError, ["{tmp}/ckpt/adapter_model.safetensors", "NaN or infinite"],
     lambda t: (poison(lora_checkpoint(t) / "adapter_model.safetensors"),
                checkpoints.load_checkpoint(t / "ckpt", models.apply_lora(model(), r=4))))


# --- files the checkpoint was saved with, gone --------------------------------------------------------------------
for name in ("optimizer.pt", "scheduler.pt", "rng.pt"):
    case(f"ckpt/{name} deleted", FileNotFoundError,
         [f"{{tmp}}/ckpt/{name} is missing", "saved with it", "would not continue the run exactly"],
         lambda t, name=name: ((saved(t) / name).unlink(), load(t)))


# --- metrics files that are not rlnb's own ------------------------------------------------------------------------
def link_to_other(t, content=""):
    (t / "other.txt").write_text(content)
    (t / "metrics.jsonl").symlink_to(t / "other.txt")
    return t / "metrics.jsonl"


case("metrics/logger on a link", ValueError, ["{tmp}/metrics.jsonl", "is a symbolic link"],
     lambda t: loggers.create_jsonl_logger(link_to_other(t)))
case("metrics/logger on a folder", ValueError, ["{tmp}/metrics.jsonl", "is a folder"],
     lambda t: ((t / "metrics.jsonl").mkdir(), loggers.create_jsonl_logger(t / "metrics.jsonl")))
case("metrics/logger on a fifo", ValueError, ["{tmp}/metrics.jsonl", "not a regular file"],
     lambda t: (os.mkfifo(t / "metrics.jsonl"), loggers.create_jsonl_logger(t / "metrics.jsonl")))
case("metrics/check names the caller", ValueError, ["train: the metrics file", "{tmp}/metrics.jsonl"],
     lambda t: loggers.check_metrics_file(link_to_other(t), "train"))
case("metrics/drop rows through a link", ValueError, ["drop_metrics_after", "{tmp}/metrics.jsonl", "symbolic link"],
     lambda t: loggers.drop_metrics_after(link_to_other(t, '{"iteration": 5, "step": 5}\n'), 2))
case("metrics/drop rows iteration a str", TypeError, "`iteration` must be an int >= 0, got '2'",
     lambda t: loggers.drop_metrics_after(t / "metrics.jsonl", "2"))
case("train/fresh run, metrics.jsonl a link", ValueError, ["{tmp}/run/metrics.jsonl", "is a symbolic link"],
     lambda t: ((t / "run").mkdir(), link_to_other(t / "run"),
                training.train(small(output_dir=str(t / "run")), model=model(), tokenizer=_tiny()[1], progress=False)))
# train checks its output_dir (rlnb.resume.output_paths) before it makes the logger: the folder is named, not read
case("train/fresh run, metrics.jsonl a folder", ValueError, ["{tmp}/run/metrics.jsonl", "is a folder"],
     lambda t: ((t / "run" / "metrics.jsonl").mkdir(parents=True),
                training.train(small(output_dir=str(t / "run")), model=model(), tokenizer=_tiny()[1], progress=False)))


# --- rollouts read back from JSONL ------------------------------------------------------------------------------------
def _rollouts_with(t, **fields):
    from rlnb.core import Rollout, rollouts_from_jsonl, rollouts_to_jsonl
    rollouts_to_jsonl([Rollout("1+1=", prompt_token_ids=[1, 2], token_ids=[3, 4], rewards=1.0,
                               logprobs=[-0.5, -0.1])], t / "r.jsonl")
    record = json.loads((t / "r.jsonl").read_text())
    (t / "r.jsonl").write_text(json.dumps({**record, **fields}) + "\n")
    return rollouts_from_jsonl(t / "r.jsonl")


case("rollouts/generation a plain string", ValueError, ["{tmp}/r.jsonl:1", "`generation` must be null or a Generation"],
     lambda t: _rollouts_with(t, generation="2"))
case("rollouts/positive log-probs", ValueError, ["{tmp}/r.jsonl:1", "`logprobs` must be log-probabilities"],
     lambda t: _rollouts_with(t, logprobs=[0.5, -0.1]))
case("rollouts/unknown status", ValueError, ["{tmp}/r.jsonl:1", "`status` must be one of"],
     lambda t: _rollouts_with(t, status="exploded"))


@pytest.mark.parametrize("fn, exc, contains", CASES)
def test_bad_input(fn, exc, contains, tmp_path):
    check_bad_input(fn, exc, contains, tmp_path)


def test_a_fresh_run_writes_nothing_through_a_linked_metrics_file(tmp_path):
    (tmp_path / "run").mkdir()
    link_to_other(tmp_path / "run")
    with pytest.raises(ValueError, match="symbolic link"):
        training.train(small(output_dir=str(tmp_path / "run")), model=model(), tokenizer=_tiny()[1], progress=False)
    assert (tmp_path / "run" / "other.txt").read_text() == ""


# --- recovery picks the set-aside checkpoint furthest into the run ------------------------------------------------
def set_aside(path, iteration, step, suffix, mtime):
    "A complete checkpoint at `iteration`/`step` set aside as a killed save leaves it (`.{name}.old-*`), dated `mtime`."
    folder = checkpoints.save_checkpoint(TrainingState(iteration, step, linear(iteration), None), path.parent / "tmp")
    aside = path.parent / f".{path.name}.old-{suffix}"
    os.rename(folder, aside)
    for f in (*aside.iterdir(), aside): os.utime(f, (mtime, mtime))
    return aside


def test_recovery_picks_the_highest_iteration_not_the_newest_file(tmp_path):
    path = tmp_path / "checkpoint"
    set_aside(path, 2, 2, "2222", mtime=1_000_000)  # the run's latest checkpoint, older files
    set_aside(path, 1, 1, "1111", mtime=2_000_000)  # a copy of an earlier one, made later by hand
    assert checkpoints.checkpoint_metadata(path)["iteration"] == 2
    net = linear(9)
    assert checkpoints.load_checkpoint(path, net, restore_rng=False).iteration == 2
    assert torch.equal(net.weight, linear(2).weight)
    checkpoints.save_checkpoint(TrainingState(3, 3, linear(3), None), path)  # recovers iteration 2 first, then swaps
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
    assert checkpoints.checkpoint_metadata(path)["iteration"] == 3


def test_recovery_breaks_an_iteration_tie_by_step(tmp_path):
    path = tmp_path / "checkpoint"
    set_aside(path, 4, 9, "later", mtime=1_000_000)
    set_aside(path, 4, 8, "earlier", mtime=2_000_000)
    assert checkpoints.checkpoint_metadata(path)["global_step"] == 9


def test_recovery_never_deletes_a_checkpoint_further_than_the_one_kept(tmp_path):
    path = tmp_path / "checkpoint"
    checkpoints.save_checkpoint(TrainingState(1, 1, linear(1), None), path)
    ahead = set_aside(path, 7, 7, "copy", mtime=1_000_000)  # put there by hand: no save leaves one further than path
    with pytest.warns(UserWarning, match="further into the run .* it is kept, not deleted"):
        checkpoints.save_checkpoint(TrainingState(2, 2, linear(2), None), path)
    assert checkpoints.checkpoint_metadata(ahead)["iteration"] == 7
    assert checkpoints.checkpoint_metadata(path)["iteration"] == 2
    behind = set_aside(path, 1, 1, "old", mtime=1_000_000)  # an ordinary leftover: deleted, without a word
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one further ahead still warns
        checkpoints.save_checkpoint(TrainingState(3, 3, linear(3), None), path)
    assert not behind.exists() and ahead.exists()


def test_an_unreadable_set_aside_checkpoint_ranks_last(tmp_path):
    path = tmp_path / "checkpoint"
    set_aside(path, 2, 2, "good", mtime=1_000_000)
    bad = set_aside(path, 5, 5, "bad", mtime=2_000_000)
    (bad / "state.json").write_text("{torn")
    assert checkpoints.checkpoint_metadata(path)["iteration"] == 2


# --- metric rows: only rlnb's own rows after the checkpoint are dropped ---------------------------------------------
def test_drop_metrics_after_keeps_every_row_it_cannot_date(tmp_path):
    file = tmp_path / "metrics.jsonl"
    kept = ['{"iteration": 1, "step": 1, "reward/mean": 0.5}', '{"iteration": "1", "custom": 5}',
            '{"iteration": 5, "custom": 5}', '{"iteration": 5.0, "step": 5}', '{"iteration": true, "step": 9}',
            '{"note": "no iteration"}', '[1, 2]', 'not json', '"text"', '{"iteration": 2, "step": 2}']
    dropped = ['{"iteration": 3, "step": 3}', '{"iteration": 3, "step": 3, "eval/accuracy": 0.5}']
    file.write_bytes(("\n".join(kept[:5] + dropped[:1] + kept[5:] + dropped[1:]) + "\n").encode() + b"\xff\xfe\n")
    assert loggers.drop_metrics_after(file, 2) == 2
    assert file.read_bytes() == ("\n".join(kept) + "\n").encode() + b"\xff\xfe\n"  # the rest byte for byte
    assert loggers.drop_metrics_after(file, 2) == 0


def test_drop_metrics_after_drops_a_torn_last_row_and_keeps_a_whole_unterminated_one(tmp_path):
    file = tmp_path / "metrics.jsonl"
    file.write_text('{"iteration": 1, "step": 1}\n{"iteration": 2, "st')
    assert loggers.drop_metrics_after(file, 1) == 1
    assert file.read_text() == '{"iteration": 1, "step": 1}\n'
    file.write_text('{"iteration": 1, "step": 1}\n{"note": "mine"}')
    assert loggers.drop_metrics_after(file, 1) == 0
    assert file.read_text() == '{"iteration": 1, "step": 1}\n{"note": "mine"}'  # untouched
    assert loggers.drop_metrics_after(tmp_path / "missing.jsonl", 1) == 0


# --- train's resume ---------------------------------------------------------------------------------------------------
@pytest.fixture
def run_copy(saved_run, tmp_path):
    shutil.copytree(saved_run, tmp_path / "run")
    return tmp_path / "run"


def resume(out):
    return training.train(small(num_iterations=3, lora_r=4, output_dir=str(out), resume=True), progress=False)


def edit_state(out, **fields):
    file = out / "checkpoint" / "state.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **fields}))


def test_resume_refuses_a_huge_iteration(run_copy):
    edit_state(run_copy, iteration=10**20)
    with pytest.raises(ValueError, match=r"state.json has iteration=100000000000000000000, expected an int >= 0"):
        resume(run_copy)


def test_resume_refuses_a_config_that_is_not_an_object(run_copy):
    meta = json.loads((run_copy / "checkpoint" / "state.json").read_text())
    edit_state(run_copy, metadata={**meta["metadata"], "config": "junk"})
    with pytest.raises(ValueError, match="state.json has a str as metadata.config"): resume(run_copy)


def test_resume_refuses_junk_stats_history(run_copy):
    edit_state(run_copy, stats_history=[1, 2])
    with pytest.raises(ValueError, match=r"state.json has stats_history\[0\] = 1"): resume(run_copy)


def test_resume_refuses_non_finite_adapters(run_copy):
    poison(run_copy / "checkpoint" / "adapter_model.safetensors")
    with pytest.raises(ValueError, match="adapter_model.safetensors holds NaN or infinite values"): resume(run_copy)


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng.pt"])
def test_resume_refuses_a_checkpoint_missing_a_file_it_was_saved_with(run_copy, name):
    (run_copy / "checkpoint" / name).unlink()
    with pytest.raises(FileNotFoundError, match=f"checkpoint/{name} is missing, but the checkpoint was saved with it"):
        resume(run_copy)


def test_resume_refuses_a_linked_metrics_file(run_copy, tmp_path):
    os.rename(run_copy / "metrics.jsonl", tmp_path / "elsewhere.jsonl")
    (run_copy / "metrics.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    with pytest.raises(ValueError, match="metrics.jsonl' is a symbolic link"): resume(run_copy)
    assert (run_copy / "metrics.jsonl").is_symlink()  # not replaced by a file




def test_resume_keeps_metric_rows_it_cannot_date(run_copy):
    with open(run_copy / "metrics.jsonl", "a") as f: f.write('{"iteration": "1", "custom": 5}\n')
    assert resume(run_copy).iteration == 3
    rows = [json.loads(l) for l in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert {"iteration": "1", "custom": 5} in rows
    assert [r["iteration"] for r in rows if isinstance(r["iteration"], int)] == [1, 2, 3]
