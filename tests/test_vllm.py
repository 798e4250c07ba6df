"""rlnb.engines with the real vLLM engine: greedy equality after a weight change, sampled log-probs equal to the
trainer's, a short `train(generator="vllm")` run logging the mismatch, and the bad-input errors.
Runs in .venv-vllm (`bash scripts/install.sh vllm`); skipped where vLLM is not installed (rlnb's own .venv)."""
import importlib.util
import subprocess
import sys
import textwrap

import pytest
import torch

from rlnb.core import GenerationConfig, collate, create_training_config, set_seed
from rlnb.engines import create_vllm_engine, create_vllm_generator, import_vllm, sync_weights
from rlnb.generation import batch_generate
from rlnb.logprobs import compute_logprobs_for_tokens
from rlnb.mismatch import mismatch_metrics
from rlnb.models import apply_lora
from rlnb.rollouts import create_batch_rollouts
from rlnb.tiny import load_tiny_model
from rlnb.training import train

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed here (`bash scripts/install.sh vllm` "
                                "makes .venv-vllm, where these tests run)")
PROMPTS = ["12+34=", "5+77=", "40+41=", "9+9="]


@pytest.mark.slow
def test_import_error_names_the_install_command():
    "Without vLLM, the generator's first use says how to install it; rlnb itself imports either way."
    code = textwrap.dedent("""
        import sys; sys.modules["vllm"] = None  # as if vLLM were not installed
        from rlnb.engines import import_vllm
        try: import_vllm()
        except ImportError as e: print(e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "bash scripts/install.sh vllm" in out


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_tiny_model(progress=False)


@pytest.fixture(scope="module")
def generator(tiny):
    "One engine for the module (building one takes seconds)."
    return create_vllm_generator(tiny[0])


def changed_tiny(tok, lr=0.5, steps=3):
    "The tiny model after a few SGD steps on a made-up target: every weight differs from the engine's."
    model = load_tiny_model(progress=False)[0]
    target = torch.tensor([tok("12+34=99<|im_end|>").input_ids])
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        model(input_ids=target, labels=target).loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


@needs_vllm
def test_greedy_equals_transformers_after_a_weight_change(tiny, generator):
    _, tok = tiny
    config = GenerationConfig(max_new_tokens=12, do_sample=False)
    for model in (changed_tiny(tok), changed_tiny(tok, lr=0.1, steps=5)):  # two syncs in a row
        engine, reference = generator(model, tok, PROMPTS, config), batch_generate(model, tok, PROMPTS, config)
        assert [(g.text, g.token_ids, g.finish_reason) for g in engine] == \
               [(g.text, g.token_ids, g.finish_reason) for g in reference]
        assert all(g.metadata["sync_s"] > 0 and g.metadata["prompt_token_ids"] for g in engine)


@needs_vllm
def test_temperature_zero_and_do_sample_false_are_greedy(tiny, generator):
    model, tok = tiny
    a = generator(model, tok, PROMPTS, GenerationConfig(max_new_tokens=8, do_sample=False, num_return_sequences=2))
    b = generator(model, tok, PROMPTS, GenerationConfig(max_new_tokens=8, temperature=0.0, num_return_sequences=2))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert all(a[2 * i].token_ids == a[2 * i + 1].token_ids for i in range(len(PROMPTS)))


@needs_vllm
def test_sampled_logprobs_equal_the_trainers_on_a_lora_policy(tiny, generator):
    "Temperature 0.7, a LoRA policy with a trained-looking adapter: the engine's log-probs are the float32 trainer's."
    _, tok = tiny
    lora = apply_lora(load_tiny_model(progress=False)[0], r=4, alpha=8)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name: p.add_(0.01)
    config = GenerationConfig(max_new_tokens=12, temperature=0.7, num_return_sequences=4)
    set_seed(0)
    batch = create_batch_rollouts(lora, tok, PROMPTS, config, generator=generator)
    cb = collate(batch.rollouts, tok.pad_token_id, tok.eos_token_id)
    with torch.no_grad():
        old = compute_logprobs_for_tokens(lora, cb.input_ids, cb.attention_mask, cb.completion_ids, 0.7)
    metrics = mismatch_metrics(old, cb.rollout_logprobs, cb.loss_mask)
    assert metrics["mismatch/logprob_abs_diff_max"] < 1e-4, metrics
    set_seed(0)  # set_seed makes the engine's samples repeatable
    again = create_batch_rollouts(lora, tok, PROMPTS, config, generator=generator)
    assert [r.token_ids for r in again.rollouts] == [r.token_ids for r in batch.rollouts]


@needs_vllm
def test_stop_strings_are_cut_after_sampling(tiny, generator):
    model, tok = tiny
    config = GenerationConfig(max_new_tokens=12, do_sample=False, stop_strings=("1",))
    engine, reference = generator(model, tok, PROMPTS, config), batch_generate(model, tok, PROMPTS, config)
    assert [(g.text, g.token_ids, g.finish_reason) for g in engine] == \
           [(g.text, g.token_ids, g.finish_reason) for g in reference]


@needs_vllm
def test_an_architecture_the_engine_cannot_load_is_named(tiny):
    import transformers

    class MyPolicy(transformers.Qwen2ForCausalLM):  # vLLM picks its implementation by this class name: it has none
        pass

    with pytest.raises(RuntimeError, match="cannot serve this policy, a MyPolicy"):
        create_vllm_engine(MyPolicy(tiny[0].config))


@needs_vllm
def test_a_failed_sync_names_the_parameter_and_the_next_sync_repairs(tiny, generator):
    model, tok = tiny

    class Broken(torch.nn.Module):
        def state_dict(self): return {"model.embed_tokens.weight": torch.zeros(3, 5)}

    config = GenerationConfig(max_new_tokens=8, do_sample=False)
    reference = batch_generate(model, tok, PROMPTS, config)
    generator(model, tok, PROMPTS, config)
    with pytest.raises(ValueError, match="'model.embed_tokens.weight' has shape"):
        sync_weights(generator.llm, Broken())
    assert [g.token_ids for g in generator(model, tok, PROMPTS, config)] == [g.token_ids for g in reference]


class RecordingEngine:
    "Wraps a live engine and records its calls; sleep and wake are only recorded (no-ops on vLLM's CPU build)."
    def __init__(self, llm): self.llm, self.calls = llm, []
    def sleep(self, level): self.calls.append(f"sleep {level}")
    def wake_up(self, tags=None): self.calls.append(f"wake {tags}")

    def __getattr__(self, name):
        attr = getattr(self.llm, name)
        if not callable(attr): return attr

        def recorded(*args, **kwargs):
            self.calls.append(name)
            return attr(*args, **kwargs)
        return recorded


@needs_vllm
def test_sleep_is_refused_on_the_cpu_build_with_the_reason(tiny):
    with pytest.raises(ValueError, match="`sleep=True` needs vLLM's sleep mode, which its cpu build does not have"):
        create_vllm_generator(sleep=True)
    with pytest.raises(TypeError, match="`sleep` must be a bool"):
        create_vllm_generator(sleep="yes")


@needs_vllm
def test_a_sleeping_engine_wakes_its_weights_for_the_sync_and_its_cache_for_sampling(tiny, generator, monkeypatch):
    "The order a GPU build needs: asleep from the build, weights woken, synced, cache woken, sampled, asleep again."
    import rlnb.engines as engines
    model, tok = tiny
    recorder = RecordingEngine(generator.llm)  # the module's engine: a second one in this process is not freed safely
    monkeypatch.setattr(engines, "_check_sleep_mode", lambda fn: None)  # as on a GPU build
    monkeypatch.setattr(engines, "create_vllm_engine", lambda model, **options: recorder)
    sleepy = create_vllm_generator(sleep=True)
    assert sleepy.engine_options["enable_sleep_mode"] is True
    config = GenerationConfig(max_new_tokens=8, do_sample=False)
    for _ in range(2): out = sleepy(model, tok, PROMPTS, config)
    one_call = ["wake ['weights']", "collective_rpc", "reset_prefix_cache", "wake ['kv_cache']", "generate", "sleep 2"]
    assert recorder.calls == ["sleep 2"] + one_call * 2
    assert [g.token_ids for g in out] == [g.token_ids for g in batch_generate(model, tok, PROMPTS, config)]


@needs_vllm
def test_the_cpu_builds_engine_is_eager_by_default(generator):
    "On vLLM's CPU build the engine skips torch.compile (starts in seconds); elsewhere vLLM's default would compile."
    assert generator.llm.llm_engine.vllm_config.model_config.enforce_eager is True


@needs_vllm
def test_import_vllm_returns_the_module():
    assert import_vllm().__name__ == "vllm"


@needs_vllm
def test_train_with_the_vllm_generator_logs_the_mismatch():
    "Last but one: when train's engine is freed, vLLM's process-wide state goes with it (the module's engine too)."
    config = create_training_config(generator="vllm", num_iterations=3, prompts_per_step=4, group_size=4,
                                    eval_every=0, seed=0)
    state = train(config, progress=False)
    assert len(state.stats_history) == 3
    for stats in state.stats_history:
        m = stats.custom_metrics
        assert abs(m["mismatch/kl"]) < 1e-6 and abs(m["mismatch/ratio_max"] - 1) < 1e-3, m
    assert torch.get_num_threads() == 1  # vLLM's thread setting did not stick


@needs_vllm
def test_generator_auto_samples_a_real_model_with_the_bf16_engine(monkeypatch):
    "The default generator, 'auto', takes the bf16 engine for a model over SMALL_MODEL_PARAMS where vLLM is installed."
    import rlnb.step as step
    monkeypatch.setattr(step, "SMALL_MODEL_PARAMS", 0)  # the tiny model stands in for a real one (is_small_model)
    config = create_training_config(num_iterations=1, prompts_per_step=4, group_size=4, eval_every=0, seed=0,
                                    mixed_precision="no")
    state = train(config, progress=False)
    assert state.metadata["config"].generator == "vllm_bf16"
    assert state.stats_history[0].custom_metrics["mismatch/kl"] > 1e-6  # bf16 samples, float32 trainer


@needs_vllm
@pytest.mark.slow
def test_smollm2_greedy_equals_transformers_after_a_weight_change():
    from rlnb.models import load_model, load_tokenizer
    model, tok = load_model("smollm2"), load_tokenizer("smollm2")
    gen = create_vllm_generator(model)
    with torch.no_grad():
        for p in model.parameters(): p.add_(torch.randn_like(p) * 1e-3)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
               for q in ("What is the capital of France?", "List three fruits.")]
    config = GenerationConfig(max_new_tokens=16, do_sample=False)
    assert [g.token_ids for g in gen(model, tok, prompts, config)] == \
           [g.token_ids for g in batch_generate(model, tok, prompts, config)]
