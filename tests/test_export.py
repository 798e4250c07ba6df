"Exports of a trained model: merged Hugging Face folders and GGUF files load back and give the same greedy text."
import json

import pytest
import torch

# raised inside transformers when peft wraps
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing")

from rlnb.core import ModelConfig, TrainingConfig, is_peft_model
from rlnb.export import (gguf_vocabulary, llama_rope_permute, merged_model, model_card, save_gguf, save_hf,
                         write_new)
from rlnb.models import apply_lora, auto_tokenizer, load_model, load_tokenizer
from rlnb.rollouts import greedy_rollouts
from rlnb.tasks import task_for_policy

torch.set_num_threads(1)
TASK = task_for_policy("addition", "tiny")
HELD_OUT = TASK.sample(32, seed=987_654)


def greedy(model, tokenizer, examples=HELD_OUT, task=TASK, max_new_tokens=None):
    batch = greedy_rollouts(model, tokenizer, examples, max_new_tokens, system_prompt=task.system_prompt)
    return [r.generation.text for r in batch.rollouts]


def random_lora(model, r=8, seed=0):
    "A LoRA adapter whose B matrices are random, not zero: merging it changes the model."
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # peft draws the A matrices from the global generator
        model = apply_lora(model, r=r)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name: p.copy_(0.05 * torch.randn(p.shape, generator=generator))
    return model


@pytest.fixture(scope="module")
def tiny():
    "The SFT'd tiny model with a random adapter that changes some greedy answers, its tokenizer, its greedy texts."
    model, tokenizer = random_lora(load_model(ModelConfig("tiny", use_lora=False))), load_tokenizer("tiny")
    texts = greedy(model, tokenizer)
    with model.disable_adapter(): base = greedy(model, tokenizer)
    assert texts != base, "the adapter must matter, or a merge that dropped it would pass"
    return model, tokenizer, texts


def gguf_round_trip(file):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)


def test_merged_model_leaves_the_callers_model_unchanged(tiny):
    model = tiny[0]
    before = {n: p.detach().clone() for n, p in model.state_dict().items()}
    merged = merged_model(model)
    assert is_peft_model(model) and not is_peft_model(merged)
    assert not any("lora" in n for n in merged.state_dict())
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before)
    ids = torch.tensor([[20, 21, 22, 23, 24]])
    with torch.no_grad(): torch.testing.assert_close(merged(ids).logits, model(ids).logits, atol=1e-4, rtol=1e-4)
    plain = merged_model(merged)  # a plain model comes back as a copy
    assert plain is not merged and torch.equal(plain.lm_head.weight, merged.lm_head.weight)
    plain.lm_head.weight.data.zero_()
    assert merged.lm_head.weight.abs().sum() > 0


def test_hf_folder_round_trip(tiny, tmp_path):
    from transformers import AutoModelForCausalLM
    model, tokenizer, texts = tiny
    folder = save_hf(model, tokenizer, tmp_path / "out", card="# my card\n")
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "README.md"} <= names
    assert (folder / "README.md").read_text() == "# my card\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary sibling left
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    assert greedy(loaded, auto_tokenizer(str(folder))) == texts


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_gguf_round_trip(tiny, tmp_path, dtype):
    model, tokenizer, texts = tiny
    file = save_gguf(model, tokenizer, tmp_path / f"tiny-{dtype}.gguf", dtype=dtype)
    loaded, loaded_tokenizer = gguf_round_trip(file)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "12+34 <think>x</think>"}], tokenize=False,
                                         add_generation_prompt=True)
    assert loaded_tokenizer(chat)["input_ids"] == tokenizer(chat)["input_ids"]
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
    assert loaded_tokenizer.eos_token_id == tokenizer.eos_token_id
    assert loaded_tokenizer.pad_token_id == tokenizer.pad_token_id
    equal = sum(a == b for a, b in zip(greedy(loaded, loaded_tokenizer), texts))
    if dtype == "f32": assert equal == len(texts)
    else: assert equal >= 0.9 * len(texts), f"f16 kept {equal} of {len(texts)} greedy texts"


def test_gguf_f16_is_half_the_size(tiny, tmp_path):
    model, tokenizer, _ = tiny
    f32 = save_gguf(model, tokenizer, tmp_path / "a.gguf", dtype="f32").stat().st_size
    f16 = save_gguf(model, tokenizer, tmp_path / "b.gguf", dtype="f16").stat().st_size
    assert 0.45 * f32 < f16 < 0.6 * f32


def test_rlnb_load_model_reads_an_exported_gguf(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("RLNB_CACHE", str(tmp_path / "cache"))
    model, tokenizer, texts = tiny
    file = save_gguf(model, tokenizer, tmp_path / "tiny.gguf", dtype="f32")
    loaded = load_model(ModelConfig(str(file), use_lora=False))
    assert greedy(loaded, load_tokenizer(str(file))) == texts


def test_existing_paths_are_refused_and_kept(tiny, tmp_path):
    model, tokenizer, _ = tiny
    folder, file = tmp_path / "hf", tmp_path / "m.gguf"
    folder.mkdir(); (folder / "keep.txt").write_text("mine")
    file.write_bytes(b"mine")
    with pytest.raises(FileExistsError, match="hf already exists"): save_hf(model, tokenizer, folder)
    with pytest.raises(FileExistsError, match="m.gguf already exists"): save_gguf(model, tokenizer, file)
    assert (folder / "keep.txt").read_text() == "mine" and file.read_bytes() == b"mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "m.gguf"]


def test_a_failed_write_leaves_nothing(tmp_path):
    def fails(path):
        path.mkdir(); (path / "config.json").write_text("{}")
        raise OSError("disk full")
    with pytest.raises(OSError, match="disk full"): write_new(tmp_path / "out", fails)
    assert list(tmp_path.iterdir()) == []


def test_unsupported_architecture_and_bad_arguments_are_refused(tiny, tmp_path):
    import transformers
    _, tokenizer, _ = tiny
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=266))
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel.*qwen2.*llama"):
        save_gguf(gpt2, tokenizer, tmp_path / "g.gguf")
    with pytest.raises(ValueError, match="dtype"): save_gguf(tiny[0], tokenizer, tmp_path / "x.gguf", dtype="q8_0")
    with pytest.raises(ValueError, match=r"\.gguf"): save_gguf(tiny[0], tokenizer, tmp_path / "x.bin")
    with pytest.raises(TypeError, match="card"): save_hf(tiny[0], tokenizer, tmp_path / "h", card={"a": 1})
    assert list(tmp_path.iterdir()) == []


def test_tokenizer_fields_mark_special_and_added_tokens(tiny):
    tokenizer = tiny[1]
    fields = gguf_vocabulary(tokenizer, len(tokenizer) + 2)  # two embedding rows past the vocabulary
    types = dict(zip(fields["tokens"], fields["token_types"]))
    assert types["<|im_end|>"] == 3 and types["<think>"] == 4 and types["a"] == 1  # control, user-defined, normal
    assert fields["token_types"][-2:] == [5, 5] and fields["merges"] == []  # unused placeholders; no merges
    assert [fields["tokens"][i] for i in tokenizer("a+b")["input_ids"]] == ["a", "+", "b"]


def test_llama_permutation_is_what_transformers_undoes():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor
    heads, kv_heads, head_dim, hidden = 6, 2, 8, 5
    undo = LlamaTensorProcessor(config=dict(num_attention_heads=heads, num_key_value_heads=kv_heads))
    q, k = torch.randn(heads * head_dim, hidden).numpy(), torch.randn(kv_heads * head_dim, hidden).numpy()
    assert not (llama_rope_permute(q, heads) == q).all()
    assert (undo._reverse_permute_weights(llama_rope_permute(q, heads), heads, heads) == q).all()
    assert (undo._reverse_permute_weights(llama_rope_permute(k, kv_heads), heads, kv_heads) == k).all()


def test_model_card_contents(tmp_path):
    import yaml
    config = TrainingConfig(model="smollm2", algorithm="dr_grpo", task="gsm8k", lora_r=16, learning_rate=2e-5,
                            num_iterations=123, group_size=4, prompts_per_step=3, beta=0.04, seed=7)
    metrics = dict(reward_start=0.125, reward_final=0.75, accuracy_start=0.25, accuracy_final=0.5, steps=123,
                   reward_window=10)
    card = model_card(config, metrics, command=["rlnb", "train", "-p", "task", "gsm8k"])
    _, front, body = card.split("---", 2)
    meta = yaml.safe_load(front)
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and meta["library_name"] == "rlnb"
    assert {"reinforcement-learning", "dr_grpo"} <= set(meta["tags"])
    for key, value in [("lora_r", "16"), ("learning_rate", "2e-05"), ("num_iterations", "123"), ("group_size", "4"),
                       ("prompts_per_step", "3"), ("beta", "0.04"), ("seed", "7"), ("reward_start", "0.125"),
                       ("reward_final", "0.75"), ("accuracy_start", "0.25"), ("accuracy_final", "0.5"),
                       ("steps", "123")]:
        assert f"| {key} | {value} |" in body, key
    assert "reward_window" not in body and "rlnb train -p task gsm8k" in body and "`gsm8k`" in body
    assert model_card(json.loads(json.dumps(config._asdict())), metrics, "x") == model_card(config, metrics, "x")
    tiny_card = model_card(TrainingConfig())
    assert "base_model" not in tiny_card.split("---")[1] and "## Results" not in tiny_card
    with pytest.raises(TypeError, match="config"): model_card("tiny")


@pytest.mark.slow
def test_trained_tiny_model_round_trips(tmp_path):
    "The chapter's run: 60 GRPO iterations, then HF, GGUF f32 and f16 on the 32 held-out prompts."
    from transformers import AutoModelForCausalLM
    from rlnb.quickstart import quick_start_training
    state, _ = quick_start_training(num_iterations=60, progress=False)
    tokenizer = load_tokenizer("tiny")
    texts = greedy(state.model, tokenizer)
    folder = save_hf(state.model, tokenizer, tmp_path / "hf")
    assert greedy(AutoModelForCausalLM.from_pretrained(folder), auto_tokenizer(str(folder))) == texts
    for dtype in ("f32", "f16"):
        file = save_gguf(state.model, tokenizer, tmp_path / f"m-{dtype}.gguf", dtype=dtype)
        equal = sum(a == b for a, b in zip(greedy(*gguf_round_trip(file)), texts))
        assert equal == len(texts) if dtype == "f32" else equal >= 0.9 * len(texts), (dtype, equal)


@pytest.mark.slow
def test_smollm2_round_trips(tmp_path):
    "A llama model: the q/k permutation, 49k tokens with merges, an adapter that changes the greedy text."
    from transformers import AutoModelForCausalLM
    model = random_lora(load_model(ModelConfig("smollm2", use_lora=False, dtype="float32")), seed=0)
    tokenizer, task = load_tokenizer("smollm2"), task_for_policy("addition", "smollm2")
    examples = task.sample(3, seed=987_654)
    run = lambda m, t: greedy(m, t, examples, task, max_new_tokens=16)
    texts = run(model, tokenizer)
    with model.disable_adapter(): assert run(model, tokenizer) != texts
    folder = save_hf(model, tokenizer, tmp_path / "hf")
    assert run(AutoModelForCausalLM.from_pretrained(folder), auto_tokenizer(str(folder))) == texts
    file = save_gguf(model, tokenizer, tmp_path / "smollm2.gguf", dtype="f32")
    loaded, loaded_tokenizer = gguf_round_trip(file)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 123 + 4567? Don't guess."}],
                                           tokenize=False, add_generation_prompt=True)
    assert loaded_tokenizer(prompt)["input_ids"] == tokenizer(prompt)["input_ids"]
    assert run(loaded, loaded_tokenizer) == texts
