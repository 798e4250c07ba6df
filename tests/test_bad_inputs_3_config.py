"""Bad inputs, round three: the run config's bounds, names and ignored settings; model paths; thread counts; prompts.

Like tests/test_bad_inputs_2.py: each case is one bad input that must raise an exception of the right type whose
message names the field, the argument or the environment variable. Ignored settings are warnings, tested apart."""
import functools, os, subprocess, sys, warnings
from pathlib import Path

import pytest
import torch

from bad_inputs import check_bad_input

from rlnb import core, experiments, models, rollouts, tiny, training
from rlnb.core import TrainingConfig, create_training_config

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def _tiny():
    return tiny.load_tiny_model(progress=False)


def cfg(**kw):
    return create_training_config(**{**dict(num_iterations=2, prompts_per_step=2, group_size=2, max_new_tokens=4,
                                            eval_every=0), **kw})


def run(config=None, **kw):
    "One short run of train on the tiny model (loaded by name: config.model is 'tiny')."
    return training.train(config or cfg(), progress=False, **kw)


CASES = []


def case(name, exc, contains, fn):
    CASES.append(pytest.param(fn, exc, (contains,) if isinstance(contains, str) else tuple(contains), id=name))


# --- 1. bounds and rules, refused when the config is made -------------------------------------------------------------
case("config/rows 100 x 10,000", ValueError,
     ["prompts_per_step x group_size = 100 x 10,000 = 1,000,000", "the limit is 65,536"],
     lambda t: cfg(prompts_per_step=100, group_size=10_000))
case("config/rows one past the limit", ValueError, ["prompts_per_step x group_size", "65,537", "the limit is 65,536"],
     lambda t: cfg(prompts_per_step=65_537, group_size=1))
case("config/eval_size 10,001", ValueError, "`eval_size` must be <= 10,000", lambda t: cfg(eval_size=10_001))
case("config/seed 2**64", ValueError, "`seed` must be <=", lambda t: cfg(seed=2**64))
case("config/output_dir NUL", ValueError, ["`output_dir` '/tmp/a\\x00b'", "control character"],
     lambda t: cfg(output_dir="/tmp/a\x00b"))
case("config/output_dir newline", ValueError, ["`output_dir`", "control character '\\n'"],
     lambda t: cfg(output_dir=str(t / "a\nb")))
case("config/overlong_buffer > max_new_tokens", ValueError, "`overlong_buffer`=100 must be < max_new_tokens=4",
     lambda t: cfg(algorithm="dapo", overlong_buffer=100, max_new_tokens=4, dynamic_sampling=False))
case("config/overlong_buffer = max_new_tokens", ValueError, "`overlong_buffer`=4 must be < max_new_tokens=4",
     lambda t: cfg(algorithm="dapo", overlong_buffer=4, max_new_tokens=4, dynamic_sampling=False))
case("config/dynamic_sampling with group_size 1", ValueError,
     ["`dynamic_sampling`", "group_size=1", "nothing would train"],
     lambda t: cfg(algorithm="reinforce", dynamic_sampling=True, group_size=1))
case("seed/set_seed 2**64", ValueError, "set_seed: `seed` must be in [-2**63, 2**64 - 1]",
     lambda t: core.set_seed(2**64))

# --- 3. the model's name ----------------------------------------------------------------------------------------------
case("model/empty", ValueError, "`model` is empty", lambda t: cfg(model=""))
case("model/blank", ValueError, "`model` is empty", lambda t: cfg(model="   "))
case("model/NUL", ValueError, ["`model` 'ti\\x00ny'", "control character"], lambda t: cfg(model="ti\x00ny"))
case("model/\\x01", ValueError, ["`model` 'ti\\x01ny'", "control character"], lambda t: cfg(model="ti\x01ny"))
case("model/empty through train", ValueError, "`model` is empty", lambda t: run(dict(model="", num_iterations=1)))
case("model/check_run_params", ValueError, "`model`", lambda t: experiments.check_run_params({"model": "ti\x01ny"}))
case("model/missing absolute folder", FileNotFoundError, ["load_model: `model` folder '{tmp}/nope' does not exist"],
     lambda t: models.load_model(str(t / "nope")))
case("model/missing relative folder", FileNotFoundError, "`model` folder './no-such-model-folder' does not exist",
     lambda t: models.load_model("./no-such-model-folder"))
case("model/missing home folder", FileNotFoundError, "`model` folder '~/no-such-model-folder' does not exist",
     lambda t: models.load_model("~/no-such-model-folder"))
case("model/three-part path", FileNotFoundError, "`model` folder 'runs/no/such' does not exist",
     lambda t: models.load_model("runs/no/such"))
case("model/missing folder, tokenizer", FileNotFoundError, "load_tokenizer: `model` folder",
     lambda t: models.load_tokenizer(str(t / "nope")))
case("model/missing folder through train", FileNotFoundError, ["`model` folder '{tmp}/nope' does not exist"],
     lambda t: run(cfg(model=str(t / "nope"), num_iterations=1)))
case("model/blank in load_model", ValueError, "`model_name_or_path` must be", lambda t: models.load_model(" "))

# --- 4. $RLNB_NUM_THREADS gets num_threads' range ---------------------------------------------------------------------
for value in ("99999", "1025", "0", "-2", "two"):
    case(f"threads/RLNB_NUM_THREADS={value}", ValueError,
         ["$RLNB_NUM_THREADS must be an integer from 1 to 1,024", f"got {value!r}"],
         lambda t, value=value: (os.environ.__setitem__("RLNB_NUM_THREADS", value), core.env_num_threads())[1])

# --- 5. prompts: a bounded count, a seed in range, an order -----------------------------------------------------------
case("prompts/loader 10**9 per step", ValueError, "`prompts_per_step` must be <= 100,000",
     lambda t: rollouts.create_prompt_loader(["a", "b"], 10**9))
case("prompts/loader seed 2**64", ValueError, "create_prompt_loader: `seed` must be in",
     lambda t: rollouts.create_prompt_loader(["a", "b"], 2, seed=2**64))
case("prompts/DataBuffer seed 2**64", ValueError, "DataBuffer: `seed` must be in",
     lambda t: rollouts.DataBuffer(["a", "b"], seed=2**64))
case("prompts/DataBuffer seed str", TypeError, "DataBuffer: `seed` must be an int",
     lambda t: rollouts.DataBuffer(["a", "b"], seed="1"))
case("prompts/DataBuffer set", TypeError, ["DataBuffer: `prompts` is a set, which has no order", "PYTHONHASHSEED"],
     lambda t: rollouts.DataBuffer({"1+1=", "2+2="}))
case("prompts/DataBuffer frozenset", TypeError, "`prompts` is a frozenset, which has no order",
     lambda t: rollouts.DataBuffer(frozenset({"1+1=", "2+2="})))
case("prompts/create_prompt_loader set", TypeError, "`prompts` is a set",
     lambda t: rollouts.create_prompt_loader({"1+1=", "2+2="}, 2))
case("prompts/train set", TypeError, "`prompts` is a set, which has no order",
     lambda t: run(prompts={"1+1=", "2+2="}, reward_fn=lambda r: 0.0))
case("prompts/prompt_loader returns a set", TypeError, ["`prompt_loader` must return a list", "no order"],
     lambda t: run(create_training_config(num_iterations=1, group_size=2, max_new_tokens=2, eval_every=0),
                   prompt_loader=lambda i: {"1+1=", "2+2="}, reward_fn=lambda r: 0.0))
case("prompts/create_batch_rollouts set", TypeError, "create_batch_rollouts: `prompts` is a set",
     lambda t: rollouts.create_batch_rollouts(*_tiny(), {"1+1=", "2+2="}, core.GenerationConfig(max_new_tokens=2)))
case("prompts/check_ordered", TypeError, "train: `prompts` is a set", lambda t: rollouts.check_ordered({"a"}))


@pytest.mark.parametrize("fn, exc, contains", CASES)
def test_bad_input(fn, exc, contains, tmp_path, monkeypatch):
    monkeypatch.setenv("RLNB_NUM_THREADS", "1")  # a case may change it; monkeypatch puts it back
    check_bad_input(fn, exc, contains, tmp_path)


# --- what is still accepted -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_limits_themselves_are_accepted():
    c = cfg(prompts_per_step=4096, group_size=16, eval_every=5, eval_size=10_000, seed=2**64 - 1, overlong_buffer=3)
    assert (c.prompts_per_step * c.group_size, c.eval_size, c.overlong_buffer) == (65_536, 10_000, 3)
    assert cfg(algorithm="dapo", group_size=2, dynamic_sampling=True).dynamic_sampling is True
    assert cfg(model="HuggingFaceTB/SmolLM2-135M-Instruct", output_dir="runs/a b").model.endswith("Instruct")
    assert rollouts.create_prompt_loader(["a"], 100_000, seed=-(2**63))(0) == ["a"] * 100_000
    assert core.set_seed(2**64 - 1) == 2**64 - 1 and core.set_seed(-(2**63)) == -(2**63)


@pytest.mark.parametrize("seed", [2**64 - 1, 2**63, -(2**63)])
def test_every_config_seed_trains_on_a_prompt_list(seed):
    "The report's repro: seed=2**64-1 with a prompts list died in DataBuffer ('Overflow when unpacking long long')."
    state = run(cfg(seed=seed, num_iterations=1, lora_r=0), prompts=["1+1=", "2+2="], reward_fn=lambda r: 0.0)
    assert state.iteration == 1


def test_data_buffer_streams_of_small_seeds_are_unchanged():
    "Seeds mixed modulo 2**64 (any seed works) give the very order they gave before: resumed runs stay exact."
    for seed, epoch in [(0, 0), (3, 2), (-1, 1), (12_345_678, 5)]:
        buf = rollouts.DataBuffer(list(range(10)), seed=seed)
        before = torch.randperm(10, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()
        assert buf.prompts_at(10 * epoch, 10) == before
    assert len(rollouts.DataBuffer(["a", "b"], seed=2**64 - 1).get_prompts(5)) == 5


def test_dict_keys_keep_their_order():
    assert rollouts.DataBuffer({"b": 1, "a": 2}.keys()).prompts == ["b", "a"]


def test_an_existing_home_folder_loads(tmp_path, monkeypatch):
    "'~/m' is expanded: the folder in the home directory loads (transformers alone calls it a malformed id)."
    model, tokenizer = _tiny()
    model.save_pretrained(tmp_path / "m"); tokenizer.save_pretrained(tmp_path / "m")
    monkeypatch.setenv("HOME", str(tmp_path))
    loaded = models.load_model("~/m")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    assert models.load_tokenizer("~/m").encode("1+2=") == tokenizer.encode("1+2=")


def test_env_num_threads_in_range(monkeypatch):
    monkeypatch.setenv("RLNB_NUM_THREADS", "1024")
    assert core.env_num_threads() == 1024
    monkeypatch.setenv("RLNB_NUM_THREADS", " 3 ")
    assert core.env_num_threads() == 3
    monkeypatch.delenv("RLNB_NUM_THREADS")
    assert core.env_num_threads() is None


# --- 2. settings given but ignored: one warning, when the config is made ----------------------------------------------
def test_eval_size_without_evaluations_warns():
    with pytest.warns(UserWarning, match=r"`eval_size`=7 is ignored: eval_every=0"):
        cfg(eval_every=0, eval_size=7)


def test_warmup_longer_than_the_run_warns():
    with pytest.warns(UserWarning, match=r"`warmup_steps`=1,000,000 is more than the run's 2 optimizer steps"):
        cfg(warmup_steps=10**6, lr_schedule="constant")
    with pytest.warns(UserWarning, match=r"`warmup_steps`=5 is more than the run's 4 optimizer steps"):
        cfg(warmup_steps=5, updates_per_batch=2)


def test_checkpoint_every_without_output_dir_warns():
    with pytest.warns(UserWarning, match=r"`checkpoint_every`=1 is ignored: without output_dir"):
        core.warn_unsaved_checkpoints(cfg(checkpoint_every=1))


def quiet(fn):
    "The warnings `fn()` gives."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught]


def test_no_warning_where_the_setting_acts_or_was_not_given():
    every_field = {**TrainingConfig()._asdict(), "eval_every": 0}  # papermill passes every field, eval_size default
    assert quiet(lambda: create_training_config(**every_field)) == []
    assert quiet(lambda: cfg(eval_every=1, eval_size=7, warmup_steps=2, checkpoint_every=1)) == []
    config = TrainingConfig(num_iterations=1, warmup_steps=5, eval_every=0, eval_size=3)  # made without the door
    assert quiet(lambda: create_training_config(config)) == []  # train re-checks a config: nothing new was given
    assert quiet(lambda: core.warn_unsaved_checkpoints(cfg(checkpoint_every=1), checkpoint_fn=print)) == []
    assert quiet(lambda: core.warn_unsaved_checkpoints(cfg(checkpoint_every=1, output_dir="runs/x"))) == []


def test_warns_once_per_call_site():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3): cfg(eval_every=0, eval_size=7)
    assert len(caught) == 1


# --- 3. the command line refuses a bad model name before a kernel starts ----------------------------------------------
@pytest.mark.slow
def test_rlnb_run_refuses_a_control_character_in_model(tmp_path):
    out = tmp_path / "o"
    r = subprocess.run([sys.executable, "-m", "rlnb.cli", "run", str(ROOT / "nbs/experiments/grpo_training.ipynb"),
                        "-o", str(out), "-p", "model", "ti\x01ny"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2, r.stderr[-2000:]
    assert "`model` 'ti\\x01ny' holds the control character" in r.stderr
    assert not out.exists()  # refused before anything was written or started
