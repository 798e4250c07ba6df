"""Errors that used to come raw from a library rlnb calls, now named where the input enters: a CUDA device on a
machine without one, a model name that is neither registered, a folder nor reachable on the hub."""
import pytest
import torch

from rlnb.core import ModelConfig
from rlnb.models import load_model, load_tokenizer


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_a_cuda_device_without_cuda_is_named():
    with pytest.raises(ValueError, match="`device`='cuda', but this process has no CUDA GPU"):
        load_model(ModelConfig("tiny", device="cuda"))


@pytest.mark.parametrize("load", [load_model, load_tokenizer])
def test_a_model_name_neither_registered_nor_found_says_what_a_name_may_be(load, monkeypatch):
    import huggingface_hub
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # offline as in CI, without the wait
    with pytest.raises(ValueError, match=r"'SMOLLM2' is not a registered model name \(.*smollm2.*tiny.*\), a local"):
        load("SMOLLM2")  # the registered name is lower-case; the hub has no such id (and is offline in CI)


def test_a_read_only_cache_is_named_with_what_to_do(tmp_path, monkeypatch):
    import rlnb.cache as cache
    def read_only(path): raise PermissionError(13, "Permission denied", str(path.parent))  # as mkdtemp there would
    monkeypatch.setattr(cache, "_start_build", read_only)
    with pytest.raises(PermissionError, match=r"cannot build '.*/x': .* is not writable by this user; point RLNB"):
        cache.build_atomically(tmp_path / "x", lambda p: None, lambda p: False)


@pytest.mark.parametrize("value", [" ", "/tmp/a\nb", " /tmp/cache", "/tmp/a\tb"])
def test_a_cache_path_with_blanks_or_control_characters_is_named(value, monkeypatch):
    from rlnb.cache import default_cache_dir
    monkeypatch.setenv("RLNB_CACHE", value)
    with pytest.raises(ValueError, match=r"\$RLNB_CACHE is .*: blank, or with spaces at its ends or control"):
        default_cache_dir()


@pytest.mark.parametrize("device, says", [("meta", "holds no weights, only their shapes"),
                                          ("xla", "has no xla device")])
def test_a_device_this_process_cannot_load_onto_is_named(device, says):
    with pytest.raises(ValueError, match=f"`device`='{device}'.*{says}"):
        load_model(ModelConfig("tiny", device=device))


@pytest.mark.parametrize("content", [b"", b"\0" * 64, b"[" * 100_000])
def test_a_tokenizer_folder_with_a_damaged_file_is_named(tmp_path, content):
    import shutil
    from rlnb.tiny import tiny_model_path
    folder = tmp_path / "tok"
    shutil.copytree(tiny_model_path(), folder)
    (folder / "tokenizer.json").write_bytes(content)
    with pytest.raises(ValueError, match=r"the folder '.*tok' holds a file that cannot be read"):
        load_tokenizer(str(folder))


def test_a_tokenizer_file_that_is_a_folder_is_named(tmp_path):
    import shutil
    from rlnb.tiny import tiny_model_path
    folder = tmp_path / "tok"
    shutil.copytree(tiny_model_path(), folder)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").mkdir()  # transformers would load a tokenizer that encodes nothing
    with pytest.raises(ValueError, match=r"tokenizer.json in the folder '.*tok' is not a file"):
        load_tokenizer(str(folder))
