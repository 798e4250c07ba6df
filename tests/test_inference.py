"""Inference (rlnb.models, chat, generation, logprobs, tools) as a programmer uses it: on an untrained tiny model
(no SFT, no network)."""
import copy, subprocess, sys, time
from pathlib import Path

import pytest
import torch

from rlnb.core import Generation, GenerationConfig, ModelConfig, Rollout, collate, set_seed
from rlnb.chat import format_prompt
from rlnb.generation import batch_generate, generate, generate_with_logprobs
from rlnb.logprobs import compute_logprobs_for_tokens, naive_logprobs
from rlnb.models import MODEL_LOADERS, TOKENIZER_LOADERS, apply_lora, load_model, load_tokenizer
from rlnb.tools import execute_tools, extract_tool_calls
from rlnb.tiny import create_tiny_model, create_tiny_tokenizer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is as fast, and much faster on a shared CPU
    tok = create_tiny_tokenizer()
    yield create_tiny_model(tok), tok
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def prompts(tiny):
    _, tok = tiny
    return [format_prompt(q, tok) for q in ("1+2=", "12+34=", "999+1=", "7+70=", "5+5=")] + ["3+4="]


def score(model, tok, gens, temperature=1.0, micro_batch_size=None):
    rs = [Rollout("", prompt_token_ids=g.metadata["prompt_token_ids"], token_ids=g.token_ids, logprobs=g.logprobs)
          for g in gens]
    cb = collate(rs, tok.pad_token_id, tok.eos_token_id)
    with torch.no_grad():
        lp = compute_logprobs_for_tokens(model, cb.input_ids, cb.attention_mask, cb.completion_ids.shape[1],
                                         temperature, micro_batch_size)
    return lp, cb


@pytest.mark.slow
def test_import_alone_in_a_fresh_process():
    "Each module imports without the notebooks having been run first."
    for module, name in (("models", "load_model"), ("chat", "format_prompt"), ("generation", "batch_generate"),
                         ("logprobs", "compute_logprobs_for_tokens"), ("tools", "generate_conversation_turn")):
        code = f"import rlnb.{module} as m; assert callable(m.{name})"
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_batched_equals_one_at_a_time_and_matches_training_logprobs(tiny, prompts):
    model, tok = tiny
    cfg = GenerationConfig(max_new_tokens=10, do_sample=False, logprobs=True)
    batched = batch_generate(model, tok, prompts, cfg, batch_size=4)
    for g, p in zip(batched, prompts):
        s = generate(model, tok, p, cfg)
        assert g.token_ids == s.token_ids
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(s.logprobs), atol=1e-4, rtol=0)
    lp, cb = score(model, tok, batched, micro_batch_size=2)
    assert ((lp - cb.old_logprobs).abs() * cb.completion_mask).max() < 1e-4


def test_sampled_groups_are_prompt_major_and_match_training_logprobs(tiny, prompts):
    model, tok = tiny
    set_seed(0)
    gens = batch_generate(model, tok, prompts, GenerationConfig(max_new_tokens=8, temperature=0.7, top_k=20,
                                                                num_return_sequences=3, logprobs=True),
                          batch_size=4)
    assert [g.metadata["prompt_index"] for g in gens] == [i for i in range(len(prompts)) for _ in range(3)]
    assert [g.metadata["sample_index"] for g in gens[:3]] == [0, 1, 2]
    lp, cb = score(model, tok, gens, temperature=0.7)
    assert ((lp - cb.old_logprobs).abs() * cb.completion_mask).max() < 1e-4


@pytest.mark.parametrize("micro_batch_size", [None, 5])
def test_shared_prompts_give_the_full_pass_logprobs_and_gradients(tiny, prompts, micro_batch_size):
    "Groups of samples per prompt: one prefill per distinct prompt gives the same log-probs and LoRA gradients."
    model, tok = tiny
    policy = apply_lora(copy.deepcopy(model), r=4)
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad: p.add_(0.05 * torch.randn_like(p))  # B != 0, so A gets gradients too
    set_seed(0)
    gens = batch_generate(policy, tok, prompts, GenerationConfig(max_new_tokens=6, num_return_sequences=4))
    rs = [Rollout("", prompt_token_ids=g.metadata["prompt_token_ids"], token_ids=g.token_ids) for g in gens]
    cb = collate(rs, tok.pad_token_id, tok.eos_token_id)
    C, adapters = cb.completion_ids.shape[1], [p for p in policy.parameters() if p.requires_grad]
    out, rows = {}, []
    hook = policy.get_base_model().model.register_forward_pre_hook(
        lambda m, args, kw: rows.append(len(kw["input_ids"])), with_kwargs=True)
    for share in (False, True):
        rows.clear()
        lp = compute_logprobs_for_tokens(policy, cb.input_ids, cb.attention_mask, C, 0.8, micro_batch_size,
                                         share_prompts=share)
        out[share] = (lp * cb.completion_mask).detach(), torch.autograd.grad((lp * cb.completion_mask).sum(), adapters)
        # the prompts really ran once each (a renamed cache argument once turned this off)
        if share and micro_batch_size is None:
            assert rows[0] == len(prompts), rows
    hook.remove()
    torch.testing.assert_close(out[True][0], out[False][0], atol=1e-5, rtol=0)
    for a, b in zip(out[True][1], out[False][1]):
        assert b.abs().sum() > 0
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_shared_prefill_samples_what_plain_generate_samples(tiny):
    "Sampling from one prefill per prompt draws the same tokens as repeating each prompt row (same seed)."
    from rlnb.generation import _hf_generate_kwargs, left_pad
    model, tok = tiny
    # equal token lengths: batch_generate keeps the order
    qs = [format_prompt(q, tok) for q in ("12+34=", "999+1=", "70+70=")]
    cfg = GenerationConfig(max_new_tokens=6, temperature=1.0, num_return_sequences=5)
    set_seed(3)
    gens = batch_generate(model, tok, qs, cfg)
    ids, mask = left_pad([tok.encode(q) for q in qs], tok.pad_token_id)
    set_seed(3)
    with torch.no_grad():
        plain = model.generate(input_ids=ids.repeat_interleave(5, 0), attention_mask=mask.repeat_interleave(5, 0),
                               **_hf_generate_kwargs(cfg._replace(num_return_sequences=1), tok, tok.pad_token_id,
                                                     [tok.eos_token_id]))
    assert [g.token_ids for g in gens] == [row[ids.shape[1]:ids.shape[1] + len(g.token_ids)].tolist()
                                           for row, g in zip(plain.sequences, gens)]


class EndOddRows:
    "A logits processor that makes every odd row emit EOS at step `at` (0-based)."
    def __init__(self, eos_id, at): self.eos_id, self.at, self.calls = eos_id, at, 0
    def __call__(self, input_ids, scores):
        self.calls += 1
        if self.calls - 1 != self.at: return scores
        scores = scores.clone(); scores[1::2, self.eos_id] += 1e4
        return scores


@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_early_eos_rows_are_cut_and_scored_right(tiny, prompts, pad_is_eos):
    """Rows that stop early end with one EOS, others run to the budget; also when the pad token is the EOS token
    (GPT-2 style)."""
    model, _ = tiny
    tok = create_tiny_tokenizer()
    if pad_is_eos: tok.pad_token = tok.eos_token
    cfg = GenerationConfig(max_new_tokens=6, do_sample=False, logprobs=True,
                           custom_params={"logits_processor": [EndOddRows(tok.eos_token_id, 2)]})
    gens = batch_generate(model, tok, prompts, cfg)
    stops = [g for g in gens if g.finish_reason == "stop"]
    assert len(stops) == len(prompts) // 2
    for g in gens:
        if g.finish_reason == "stop": assert len(g.token_ids) == 3 and g.token_ids[-1] == tok.eos_token_id
        else: assert len(g.token_ids) == 6 and tok.eos_token_id not in g.token_ids
        assert len(g.logprobs) == len(g.token_ids)
    lp, cb = score(model, tok, gens)  # the recorder runs before custom processors: it saw the model's raw logits
    assert ((lp - cb.old_logprobs).abs() * cb.completion_mask).max() < 1e-4


def test_generation_restores_mode_and_cache(tiny, prompts):
    model, tok = tiny
    model.train(); model.config.use_cache = False
    try:
        batch_generate(model, tok, prompts[:2], GenerationConfig(max_new_tokens=2))
        assert model.training and model.config.use_cache is False
    finally:
        model.eval(); model.config.use_cache = True


def test_logprobs_equal_the_per_row_reference_with_padding_on_both_sides(tiny):
    "compute_logprobs_for_tokens (batched, shared prompts, micro-batches) against naive_logprobs (one row at a time)."
    model, tok = tiny
    rs = [Rollout("", prompt_token_ids=tok.encode(p), token_ids=tok.encode(c))
          for p, c in [("1+2=", "3x"), ("a longer prompt 1+2=", "3"), ("1+2=", "345"), ("7=", "")]]
    cb = collate(rs, tok.pad_token_id)  # prompts left-padded, completions right-padded (one of them empty)
    C = cb.completion_ids.shape[1]
    with torch.no_grad():
        naive = naive_logprobs(model, cb.input_ids, cb.attention_mask, C, temperature=0.7)  # (4, C)
        for mb in (None, 1, 3):
            fast = compute_logprobs_for_tokens(model, cb.input_ids, cb.attention_mask, C, 0.7, micro_batch_size=mb)
            torch.testing.assert_close(fast * cb.completion_mask, naive, atol=1e-5, rtol=0)
        ids = torch.tensor([tok.encode("1+2=3x")])
        by_hand = torch.log_softmax(model(ids).logits[0, -3:-1].float() / 0.7, -1).gather(-1, ids[0, -2:, None])[:, 0]
    torch.testing.assert_close(naive[0, :2], by_hand, atol=1e-5, rtol=0)
    assert naive[1, 1:].eq(0).all() and naive[3].eq(0).all()  # completion padding scores 0


def test_left_padding_does_not_change_logprobs(tiny):
    model, tok = tiny
    a = Rollout("", prompt_token_ids=tok.encode("1+2="), token_ids=tok.encode("3"))
    b = Rollout("", prompt_token_ids=tok.encode("a much longer prompt 1+2="), token_ids=tok.encode("3"))
    alone, padded = collate([a], tok.pad_token_id), collate([a, b], tok.pad_token_id)
    with torch.no_grad():
        x = compute_logprobs_for_tokens(model, alone.input_ids, alone.attention_mask, 1)
        y = compute_logprobs_for_tokens(model, padded.input_ids, padded.attention_mask, 1)[:1]
    torch.testing.assert_close(x, y, atol=1e-5, rtol=0)


def test_load_model_from_a_saved_directory_with_lora_and_checkpointing(tiny, tmp_path, prompts):
    "The from_pretrained path (no network: a local folder), LoRA, gradient checkpointing, gradients only in adapters."
    model, tok = tiny
    model.save_pretrained(tmp_path); tok.save_pretrained(tmp_path)
    cfg = ModelConfig(model_name_or_path=str(tmp_path), device="cpu", use_lora=True, lora_r=2,
                      gradient_checkpointing=True)
    m = load_model(cfg)
    base = m.get_base_model()
    assert getattr(base, "is_activation_checkpointing", None) or base.is_gradient_checkpointing
    t = load_tokenizer(cfg)
    assert t.padding_side == "left" and t.pad_token_id == tok.pad_token_id
    gens = batch_generate(m, t, prompts[:2], GenerationConfig(max_new_tokens=4, do_sample=False))
    _, cb = score(m, t, gens)
    m.train()
    lp = compute_logprobs_for_tokens(m, cb.input_ids, cb.attention_mask, cb.completion_ids.shape[1])
    (lp * cb.loss_mask).sum().backward()
    grads = {n: p.grad for n, p in m.named_parameters()}
    assert all(g is None for n, g in grads.items() if "lora_" not in n)
    assert any(g is not None and g.abs().sum() > 0 for n, g in grads.items() if "lora_B" in n)


def test_generator_hook_gets_the_prompt_list(tiny, prompts):
    "One generator contract: (model, tokenizer, prompts, config) -> prompt-major list; generate passes [prompt]."
    model, tok = tiny
    seen = []
    def echo(m, t, ps, c):
        seen.append(list(ps))
        return [Generation(f"{p}#{j}", token_ids=[]) for p in ps for j in range(c.num_return_sequences)]
    gens = batch_generate(model, tok, prompts[:2], GenerationConfig(num_return_sequences=2), batch_size=1,
                          generator=echo)
    assert [g.text for g in gens] == [f"{p}#{j}" for p in prompts[:2] for j in range(2)] and seen == [prompts[:2]]
    assert generate(model, tok, prompts[0], generator=echo).text == f"{prompts[0]}#0" and seen[-1] == [prompts[0]]
    with pytest.raises(ValueError, match="expected 2"):
        batch_generate(model, tok, prompts[:1], GenerationConfig(num_return_sequences=2), generator=lambda *a: [])


def test_logprob_extractor_scores_the_sampled_tokens(tiny, prompts):
    """generate_with_logprobs: recorded log-probs by default; a logprob_extractor (compute_logprobs_for_tokens) gives
    the same."""
    model, tok = tiny
    cfg = GenerationConfig(max_new_tokens=6, temperature=0.7)
    set_seed(4)
    recorded = generate_with_logprobs(model, tok, prompts[1], cfg)
    set_seed(4)
    scored = generate_with_logprobs(model, tok, prompts[1], cfg, logprob_extractor=compute_logprobs_for_tokens)
    assert scored.token_ids == recorded.token_ids and len(scored.logprobs) == len(scored.token_ids)
    torch.testing.assert_close(torch.tensor(scored.logprobs), torch.tensor(recorded.logprobs), atol=1e-4, rtol=0)
    calls = []
    def extractor(m, input_ids, attention_mask, completion_length, temperature=1.0, micro_batch_size=None):
        calls.append((tuple(input_ids.shape), completion_length, temperature))
        return compute_logprobs_for_tokens(m, input_ids, attention_mask, completion_length, temperature,
                                           micro_batch_size)
    # a backend without log-probs
    replay = lambda m, t, ps, c: [Generation(recorded.text, token_ids=recorded.token_ids)]
    out = generate_with_logprobs(model, tok, prompts[1], cfg, logprob_extractor=extractor, generator=replay)
    torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(recorded.logprobs), atol=1e-4, rtol=0)
    P = len(tok.encode(prompts[1]))
    assert calls == [((1, P + len(recorded.token_ids)), len(recorded.token_ids), 0.7)]
    with pytest.raises(ValueError, match="logprob_extractor"):
        generate_with_logprobs(model, tok, prompts[1], cfg, generator=replay)


def test_model_and_tokenizer_registries(tiny):
    "A name in MODEL_LOADERS / TOKENIZER_LOADERS is loaded by its loader, then placed and wrapped like any model."
    model, tok = tiny
    MODEL_LOADERS["test-copy"] = lambda c: copy.deepcopy(model)
    TOKENIZER_LOADERS["test-copy"] = lambda c: create_tiny_tokenizer()
    try:
        m = load_model(ModelConfig("test-copy", device="cpu", dtype="bfloat16", use_lora=True, lora_r=2))
        assert m.get_base_model().dtype == torch.bfloat16 and any(p.requires_grad for p in m.parameters())
        assert load_tokenizer("test-copy").padding_side == "left"
        assert load_model("test-copy", model_loader=lambda c: model) is model  # the argument beats the registry
    finally:
        del MODEL_LOADERS["test-copy"], TOKENIZER_LOADERS["test-copy"]


def test_clear_errors(tiny):
    model, tok = tiny
    cfg = GenerationConfig(max_new_tokens=4)
    with pytest.raises(ValueError, match="`prompts` is empty"): batch_generate(model, tok, [], cfg)
    with pytest.raises(ValueError, match="num_return_sequences"):
        batch_generate(model, tok, ["1+1="], cfg._replace(num_return_sequences=0))
    with pytest.raises(ValueError, match="max_new_tokens"):
        batch_generate(model, tok, ["1+1="], cfg._replace(max_new_tokens=0))
    bare = create_tiny_tokenizer(); bare.pad_token = None; bare.eos_token = None
    with pytest.raises(ValueError, match="neither a pad token nor an EOS token"):
        batch_generate(model, bare, ["1+1="], cfg)
    ids, mask = torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="completion ids have shape"):
        compute_logprobs_for_tokens(model, ids, mask, torch.ones(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="completion_length"): compute_logprobs_for_tokens(model, ids, mask, 5)
    with pytest.raises(ValueError, match="match no module"): apply_lora(copy.deepcopy(model), target_modules=["nope"])


@pytest.mark.slow
def test_tools_never_eval_and_time_out():
    calls = extract_tool_calls('<tool_call>{"name": "sleep", "arguments": {}}</tool_call>'
                               '<tool_call>__import__("os").system("x")</tool_call>')
    t0 = time.time()
    # 1 s: long enough for a fork on a loaded 2-core machine, far shorter than the 10 s sleep it must cut
    res = execute_tools(calls, tools={"sleep": lambda: time.sleep(10)}, timeout_s=1.0)
    assert time.time() - t0 < 5
    assert res[0]["error"].startswith("TimeoutError") and "invalid JSON" in res[1]["error"]


def test_the_inverse_cdf_sampler_inside_generate(tiny, monkeypatch):
    "Forced on the tiny model's small vocabulary: first-token frequencies follow the softmax, and top-k holds."
    import rlnb.decoding as D
    import rlnb.generation as G
    from rlnb.chat import format_prompt
    model, tok = tiny
    monkeypatch.setattr(D, "INVERSE_CDF_MIN_VOCAB", 0)  # SmolLM2-sized vocabularies use it; here it is forced
    prompt = format_prompt("49+97=", tok)
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    with torch.no_grad(): p = torch.softmax(model(torch.tensor([ids])).logits[0, -1], -1)  # (V,)
    torch.manual_seed(0)
    gens = batch_generate(model, tok, [prompt], GenerationConfig(max_new_tokens=1, num_return_sequences=4000))
    freq = torch.bincount(torch.tensor([g.token_ids[0] for g in gens]), minlength=len(p)).float() / 4000
    assert ((freq - p).abs() <= 4 * (p * (1 - p) / 4000).sqrt() + 1e-3).all()
    kw = G._hf_generate_kwargs(GenerationConfig(top_k=3), tok, tok.pad_token_id, [tok.eos_token_id])
    assert kw["do_sample"] is False and isinstance(kw["logits_processor"][-1], G._InverseCdfSampler)
    top3 = set(p.topk(3).indices.tolist())
    gens = batch_generate(model, tok, [prompt], GenerationConfig(max_new_tokens=1, num_return_sequences=500, top_k=3))
    assert {g.token_ids[0] for g in gens} <= top3
