"Tests of rlnb.tiny that a notebook cannot do well: file-system caching, concurrency, the default model's quality."
import json, os, threading

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import rlnb.tiny as tiny
from rlnb.tasks import get_task
from rlnb.tiny import (build_tiny_model, build_tokenizer, greedy_accuracy, load_tiny_model, read_tiny_history,
                       tiny_cache_path)

FAST = dict(steps=6, sft_config={"eval_size": 16, "eval_every": 0}, progress=False)  # seconds, not a useful model


def _leftovers(root):
    return [p.name for p in root.iterdir() if ".tmp-" in p.name]


def test_tokenizer_round_trip_and_chat_template(tmp_path):
    tok = build_tokenizer()
    for s in ["12+34=46", "a b  c\n\nd\te", "  leading and trailing  ", "<think>x</think><tool_call>{}</tool_call>", ""]:
        assert tok.decode(tok.encode(s)) == s
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1="}],
                                   tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>" and tok.padding_side == "left"
    tok.save_pretrained(tmp_path)
    tok2 = AutoTokenizer.from_pretrained(tmp_path)
    assert tok2.encode("12 + 34\n") == tok.encode("12 + 34\n")
    assert tok2.apply_chat_template([{"role": "user", "content": "1+1="}], tokenize=False, add_generation_prompt=True) \
        == "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n"
    assert (tok2.pad_token_id, tok2.eos_token_id, tok2.padding_side) == (tok.pad_token_id, tok.eos_token_id, "left")


def test_model_save_load_round_trip(tmp_path):
    tok = build_tokenizer()
    model = build_tiny_model(tok)
    assert 500_000 <= sum(p.numel() for p in model.parameters()) <= 2_000_000
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([tok.encode("<|im_start|>user\n1+2=")])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    assert loaded.generation_config.eos_token_id == tok.eos_token_id
    assert loaded.generation_config.pad_token_id == tok.pad_token_id


def test_load_tiny_model_cold_then_warm(tmp_path, monkeypatch):
    monkeypatch.setenv("RLNB_CACHE", str(tmp_path))
    model, tok = load_tiny_model(**FAST)
    folder = tiny_cache_path(steps=FAST["steps"], sft_config=FAST["sft_config"])
    assert folder.parent == tmp_path and folder.is_dir()
    assert {"config.json", "model.safetensors", "tokenizer.json", "tiny_history.json"} <= {p.name for p in folder.iterdir()}
    assert len(read_tiny_history(folder)["loss"]) == FAST["steps"]
    assert not model.training and model.dtype == torch.float32 and model.device.type == "cpu"
    mtime = (folder / "model.safetensors").stat().st_mtime_ns

    def no_training(*args, **kwargs): raise AssertionError("the warm call trained again")
    monkeypatch.setattr(tiny, "sft_tiny_model", no_training)
    model2, _ = load_tiny_model(**FAST)
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime
    for a, b in zip(model.parameters(), model2.parameters()): assert torch.equal(a, b)
    assert _leftovers(tmp_path) == []
    # another seed is another model: it would need training
    with pytest.raises(AssertionError, match="trained again"): load_tiny_model(**{**FAST, "seed": 1})


def test_load_tiny_model_explicit_path(tmp_path):
    target = tmp_path / "my_model"
    load_tiny_model(path=target, **FAST)
    assert (target / "tiny_history.json").exists()
    assert AutoModelForCausalLM.from_pretrained(target) is not None
    (tmp_path / "junk").mkdir(); (tmp_path / "junk" / "notes.txt").write_text("not a model")
    with pytest.raises(ValueError, match="load_tiny_model: `path`"): load_tiny_model(path=tmp_path / "junk", **FAST)
    with pytest.raises(ValueError, match="steps"): load_tiny_model(steps=0, cache_dir=tmp_path)


def test_concurrent_first_calls_leave_a_valid_cache(tmp_path, monkeypatch):
    "Two threads miss the cache at the same time and both train; one rename wins, the other loads the winner."
    barrier = threading.Barrier(2, timeout=120)
    train_into = tiny._train_into

    def racing_train_into(*args, **kwargs):
        barrier.wait()  # both threads are past the cache check before either has finished
        return train_into(*args, **kwargs)
    monkeypatch.setattr(tiny, "_train_into", racing_train_into)
    results, errors = [None, None], []

    def worker(i):
        try: results[i] = load_tiny_model(cache_dir=tmp_path, **FAST)
        except Exception as e: errors.append(e)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert errors == []
    folder = tiny_cache_path(steps=FAST["steps"], cache_dir=tmp_path, sft_config=FAST["sft_config"])
    assert json.loads((folder / "tiny_history.json").read_text())["config"]["steps"] == FAST["steps"]
    assert _leftovers(tmp_path) == [] and [p.name for p in tmp_path.iterdir()] == [folder.name]
    for a, b in zip(results[0][0].parameters(), results[1][0].parameters()): assert torch.equal(a, b)


def test_default_model_is_partially_competent():
    """The cached default model (trained on first use) answers some, not all, held-out sums.
    Measured for seed 0 with the default settings: see `read_tiny_history(tiny_cache_path())["accuracy"]`
    (about 0.3-0.5 greedy accuracy on 256 held-out 2-digit additions)."""
    model, tok = load_tiny_model(progress=False)
    task = get_task("addition")
    config = read_tiny_history(tiny_cache_path())["config"]
    held_out = task.sample(config["eval_size"], seed=config["eval_seed"])  # never used for training
    acc = greedy_accuracy(model, tok, held_out, task.check)
    assert 0.1 <= acc <= 0.95, acc
