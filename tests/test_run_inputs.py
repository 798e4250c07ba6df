"""Inputs that used to crash deep inside a run or pass silently: a message with an unknown role, an environment that
raises, vLLM engine arguments out of range, sampler log-probs above 0, token ids outside the vocabulary, two trainings
in threads of one process, a disk that fills during a checkpoint. Each is refused where it enters, naming it."""
import errno, re, threading, warnings

import pytest
import torch

from bad_inputs import model, run, small, tok

from rlnb import chat, generation, multiturn
from rlnb.sft import sft
from rlnb.core import Conversation, Generation, GenerationConfig, Message, Rollout, collate

torch.set_num_threads(1)


def returning(ids=(5,), logprobs=None):
    "A generator whose every completion has the token ids and log-probs given."
    def generator(m, t, prompts, cfg):
        return [Generation("x", token_ids=list(ids), logprobs=logprobs)
                for _ in prompts for _ in range(cfg.num_return_sequences)]
    return generator


# --- 1. a message's role ---------------------------------------------------------------------------------------------
def test_unknown_role_refused_where_messages_enter():
    with pytest.raises(ValueError, match=r"conversation\[1\] has role 'wizard'; a message's role is one of 'system'"):
        chat.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "wizard", "content": "x"}], tok())
    with pytest.raises(ValueError, match=r"`prompts\[0\]`.messages\[0\] has role 'User'"):
        run(prompts=[Conversation((Message("User", "1+1="),))], reward_fn=lambda r: 0.0)
    with pytest.raises(ValueError, match=r"sft: `examples\[0\]`.messages\[0\] has role 'human'"):
        sft(model(), tok(), [Conversation((Message("human", "1+1="), Message("assistant", "2")))])
    with pytest.raises(TypeError, match=r"conversation\[0\] has content None; a message's content is its text"):
        chat.apply_chat_template([{"role": "user", "content": None}], tok())


def test_environment_message_with_unknown_role():
    env = multiturn.Environment(step=lambda s, c: multiturn.EnvStep((Message("narrator", "a door"),)), name="story")
    with pytest.raises(ValueError, match=r"env 'story' step .*EnvStep.messages\[0\] has role 'narrator'"):
        multiturn.create_multiturn_rollout(model(), tok(), ["1+1="], GenerationConfig(max_new_tokens=2), env=env)


# --- 2. an environment that raises -----------------------------------------------------------------------------------
class Maze:
    "A user's environment class whose step fails on the second turn and whose reset can fail."
    def __init__(self, reset_fails=False): self.reset_fails = reset_fails
    def reset(self, conversation, answer):
        if self.reset_fails: raise FileNotFoundError("maze.txt")
        return 0
    def step(self, turn, conversation):
        if turn == 1: raise KeyError("room 7")
        return multiturn.EnvStep((Message("user", "go on"),), state=turn + 1)


@pytest.mark.parametrize("reset_fails, method, where, original, kind", [
    (False, "step", "prompt 0, sample 0, turn 1", "KeyError: 'room 7'", RuntimeError),  # a KeyError would quote it
    (True, "reset", "prompt 0, sample 0", "FileNotFoundError: maze.txt", FileNotFoundError)])  # the type kept
def test_environment_that_raises_is_named(reset_fails, method, where, original, kind):
    maze = Maze(reset_fails)
    env = multiturn.Environment(step=maze.step, reset=maze.reset, name="maze")
    with pytest.raises(kind) as info:
        multiturn.create_multiturn_rollout(model(), tok(), ["1+1=", "2+2="], GenerationConfig(max_new_tokens=2),
                                           env=env, max_turns=3)
    message = str(info.value)
    assert f"env 'maze' {method} (Maze.{method}) raised on {where}: {original}" in message, message
    assert type(info.value.__cause__).__name__ == original.split(":")[0]  # the original error is chained


# --- 4. a sampler's log-probs ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0.5, float("nan"), float("inf"), float("-inf")])
def test_sampler_logprobs_positive_or_not_finite_refused(value):
    with pytest.raises(ValueError, match=r"train: `generator`'s result 0 \(prompt 0, sample 0\): logprobs\[1\] is"):
        run(generator=returning([5, 6], [-0.5, value]))
    with pytest.raises(ValueError, match=r"batch_generate: `generator`'s result 0 .*: logprobs\[1\] is"):
        generation.batch_generate(model(), tok(), ["1+1="], GenerationConfig(max_new_tokens=2),
                                  generator=returning([5, 6], [-0.5, value]))
    out = generation.batch_generate(model(), tok(), ["1+1="], GenerationConfig(max_new_tokens=2),
                                    generator=returning([5, 6], [-0.5, 2e-7]))
    assert out[0].logprobs == [-0.5, 2e-7]  # rounding of a probability near 1: kept as it is


# --- 5. token ids outside the vocabulary -----------------------------------------------------------------------------
@pytest.mark.parametrize("bad, shown", [(2**70, "an integer of 71 bits"), (-1, "-1"), (266, "266")])
def test_generator_token_ids_outside_the_vocabulary(bad, shown):
    with pytest.raises(ValueError, match=rf"train: `generator`'s result 0 \(prompt 0, sample 0\): token_ids\[1\] is "
                                         rf"{shown}, not a token id: the model's vocabulary has ids 0 to 265"):
        run(generator=returning([5, bad]))


@pytest.mark.parametrize("bad, shown", [(2**70, "an integer of 71 bits"), (-4, "-4"), (10**4, "10000")])
def test_prompt_token_ids_outside_the_vocabulary(bad, shown):
    with pytest.raises(ValueError, match=rf"batch_generate: prompts\[1\]\[0\] is {shown}, not a token id"):
        generation.batch_generate(model(), tok(), [[5], [bad]], GenerationConfig(max_new_tokens=2))


def test_rollout_token_ids_past_int64_named_by_collate():
    with pytest.raises(ValueError, match=r"collate: rollouts\[1\].token_ids holds a value that is not a token id"):
        collate([Rollout("a", prompt_token_ids=[1], token_ids=[4]),
                 Rollout("b", prompt_token_ids=[1], token_ids=[4, 2**70])], 0)
    with pytest.raises(ValueError, match=r"collate: rollouts\[0\].prompt_token_ids\[0\] is -2"):
        collate([Rollout("a", prompt_token_ids=[-2], token_ids=[4])], 0)
    with pytest.raises(ValueError, match=r"collate: rollouts\[0\].token_ids holds float32 values, not token ids"):
        collate([Rollout("a", prompt_token_ids=[1], token_ids=[4, 2.5])], 0)  # was read as token 2


# --- 3. vLLM engine arguments, checked before vLLM is imported -------------------------------------------------------
@pytest.mark.parametrize("options, says", [
    (dict(gpu_memory_utilization=1.5), "`gpu_memory_utilization` must be a number in (0, 1]"),
    (dict(gpu_memory_utilization=0), "`gpu_memory_utilization` must be a number in (0, 1]"),
    (dict(max_model_len=10**6), "`max_model_len` must be an int >= 1 and at most the model's 256 positions"),
    (dict(tensor_parallel_size=64), "`tensor_parallel_size` must be an int >= 1 and at most"),
    (dict(pipeline_parallel_size=0), "`pipeline_parallel_size` must be an int >= 1"),
    (dict(swap_space=float("nan")), "`swap_space` must be a number of GiB >= 0"),
    (dict(swap_space=2**40), "`swap_space` must be a number of GiB >= 0 up to"),
    (dict(kv_cache_memory_bytes=2**80), "`kv_cache_memory_bytes` must be an int of bytes from 2**20 (1 MiB) up to"),
    (dict(dtype="int8"), "`dtype` must be one of 'auto', 'float32', 'float', 'bfloat16', 'float16', 'half'"),
    (dict(seed=2**40), "`seed` must be an int from 0 to 2**32 - 1"),
    (dict(max_num_seqs=-3), "`max_num_seqs` must be an int >= 1"),
    (dict(skip_tokenizer_init=False), "`skip_tokenizer_init` is set by rlnb")])
def test_vllm_engine_arguments_out_of_range(options, says):
    from rlnb.engines import create_vllm_engine, create_vllm_generator
    with pytest.raises(ValueError, match="create_vllm_engine: " + re.escape(says)):
        create_vllm_engine(model(), **options)  # refused before vLLM is imported (not installed here)
    with pytest.raises(ValueError, match="VLLMGenerator: " + re.escape(says)):
        create_vllm_generator(model(), **options)  # when the generator is made, not at its first call


def test_vllm_generator_without_a_model_checks_at_once():
    from rlnb.engines import create_vllm_generator
    with pytest.raises(TypeError, match="VLLMGenerator: `enforce_eager` must be True or False, got 'yes'"):
        create_vllm_generator(enforce_eager="yes")
    with pytest.raises(ValueError, match=r"VLLMGenerator: `gpu_memory_utilization` must be a number in \(0, 1\]"):
        create_vllm_generator(gpu_memory_utilization=2)


# --- 7. a disk that fills during a checkpoint ------------------------------------------------------------------------
def _failing(kind):
    "A writer that fails as safetensors or torch does when the disk fills, or with a plain OSError."
    from safetensors import SafetensorError
    def writer(*args, **kwargs):
        if kind == "safetensors":
            raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No '
                                  'space left on device" })')
        if kind == "torch":
            raise RuntimeError("[enforce fail at inline_container.cc:626] . PytorchStreamWriter failed writing file "
                               "data/0: file write failed")
        raise OSError(errno.EDQUOT, "Disk quota exceeded")
    return writer


@pytest.mark.parametrize("kind, module, name, code", [
    ("safetensors", "safetensors.torch", "save_model", errno.ENOSPC),
    ("torch", "torch", "save", errno.ENOSPC),
    ("quota", "safetensors.torch", "save_model", errno.EDQUOT)])
def test_disk_full_during_a_checkpoint(kind, module, name, code, tmp_path, monkeypatch):
    import importlib, shutil
    from rlnb.checkpoints import load_checkpoint, save_checkpoint
    from rlnb.step import create_training_state
    state = create_training_state(model(), small())
    save_checkpoint(state._replace(iteration=3, global_step=3), tmp_path / "ckpt")
    monkeypatch.setattr(importlib.import_module(module), name, _failing(kind))
    usage = shutil.disk_usage  # torch's message does not say why: a disk with 1 byte free does
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(p)._replace(free=1))
    with pytest.raises(OSError) as info:
        save_checkpoint(state._replace(iteration=4, global_step=4), tmp_path / "ckpt")
    monkeypatch.undo()
    message = str(info.value)
    assert info.value.errno == code
    assert f"writing the checkpoint {tmp_path / 'ckpt'} failed ({__import__('os').strerror(code)})" in message, message
    assert "the checkpoint needs about " in message and "MiB; 0.0 MiB are free there" in message, message
    assert "the previous checkpoint there is intact (iteration 3, step 3)" in message, message
    assert load_checkpoint(tmp_path / "ckpt", model()).iteration == 3  # and it loads
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary folder left


# --- 6. two trainings in threads of one process ----------------------------------------------------------------------
@pytest.mark.slow
def test_second_training_in_another_thread_is_refused():
    started, release, outcome = threading.Event(), threading.Event(), {}
    def hold(state, stats):  # the first run's logger: it waits while the second one tries to start
        started.set()
        release.wait(30)
    def first():
        try: outcome["first"] = run(logger=hold).iteration
        except Exception as e: outcome["first"] = e
    thread = threading.Thread(target=first, name="first-run")
    thread.start()
    assert started.wait(60)
    try:
        with pytest.raises(RuntimeError, match="train: another training is running in this process "
                                               r"\(thread 'first-run', started .*output_dir=None\); two trainings"):
            run()
    finally:
        release.set()
        thread.join(60)
    assert outcome["first"] == 1  # the first run was not disturbed
    assert run().iteration == 1  # and once it returned, a training starts again
