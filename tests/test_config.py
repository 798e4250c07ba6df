"One config: every field of TrainingConfig changes what a run does, or is rejected; none is accepted and ignored."
import math, sys

import pytest
import torch

import rlnb.training as training
from rlnb.algorithms import STEP_EXTENSIONS
from rlnb.core import TrainingConfig, create_training_config
from rlnb.models import MODEL_LOADERS, TOKENIZER_LOADERS
from rlnb.tiny import load_tiny_model
from rlnb.training import train

torch.set_num_threads(1)
BASE = dict(num_iterations=2, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=2, eval_size=16,
            seed=3)  # a seed whose samples differ within groups in both iterations: a zero gradient would hide changes
CHANGES = {  # field -> a value different from BASE's (or the default)
    "model": "tiny-perturbed", "dtype": "bfloat16", "task": "reverse", "task_format": "chat", "algorithm": "dr_grpo",
    "algorithm_options": {"scale": "none"}, "beta": 0.5, "teacher": "tiny-perturbed",
    "num_iterations": 3, "prompts_per_step": 3, "group_size": 3, "temperature": 0.5, "max_new_tokens": 2,
    "dynamic_sampling": True, "over_sampling_factor": 2.0,
    "max_sampling_rounds": 2, "overlong_buffer": 5,
    "learning_rate": 1e-3, "lr_schedule": "constant", "warmup_steps": 2, "weight_decay": 0.5, "max_grad_norm": 1e-4,
    "lora_r": 4, "fsdp": True, "updates_per_batch": 2, "micro_batch_size": 3, "seed": 1, "eval_every": 1,
    "eval_size": 1,
    "output_dir": "OUT", "checkpoint_every": 1, "resume": True, "max_seconds": 1e-6, "num_threads": 2,
    "keep_checkpoints": True,
    "generator": "hf_bf16", "generator_url": "http://127.0.0.1:9", "rollout_correction": "tis_token",
    "rollout_correction_cap": 1.001,
    "rollout_correction_low": 0.999, "rollout_correction_high": 1.001, "off_policy_steps": 1,
    "entropy_coef": 0.01, "entropy_top_fraction": 0.2, "entropy_target": 100.0, "entropy_coef_step": 1e-3,
    "entropy_coef_max": 1e-5, "mixed_precision": "bf16", "plugins": "config_plugin",
}
# the module `plugins` names: importing it registers a step extension that every step reports
PLUGIN = """
from rlnb.algorithms import StepExtension, register_step_extension
register_step_extension("config_plugin", StepExtension(
    loss_term=lambda batch, logprobs, entropy, config, algo: (logprobs.new_zeros(()), {"plugin/seen": 1.0})))
"""
NEEDS = {  # field -> the settings under which it acts (the run it must change is BASE with these)
    "generator_url": {"generator": "vllm_server"},  # no server there: the run fails, naming the address
    "rollout_correction_cap": {"generator": "hf_bf16", "rollout_correction": "tis_token"},
    "rollout_correction_low": {"generator": "hf_bf16", "rollout_correction": "icepop"},
    "rollout_correction_high": {"generator": "hf_bf16", "rollout_correction": "icepop", "rollout_correction_low": 0.5},
    "entropy_coef_step": {"entropy_target": 100.0},  # an entropy below the target: the weight rises by the step
    "entropy_coef_max": {"entropy_target": 100.0, "entropy_coef_step": 1e-3},  # ... up to the ceiling
}


def perturbed_tiny(config):
    model = load_tiny_model(progress=False)[0]
    with torch.no_grad():
        for p in model.parameters(): p.add_(0.01)
    return model


def outcome(config, monkeypatch):
    "Everything observable about a run: metric rows (timings aside), weights, forward passes, saves, threads, files."
    rows, forwards, saves, threads = [], [0], [0], set()
    real_save = training.save_checkpoint
    monkeypatch.setattr(training, "save_checkpoint",
                        lambda *a, **k: (saves.__setitem__(0, saves[0] + 1), real_save(*a, **k))[1])
    def log(state, stats):
        threads.add(torch.get_num_threads())
        rows.append({k: round(v, 6) if isinstance(v, float) and math.isfinite(v) else v
                     for k, v in stats.custom_metrics.items() if not k.startswith("time/")})
        if not hasattr(state.model, "_counted"):
            state.model._counted = True
            state.model.register_forward_pre_hook(lambda *a: forwards.__setitem__(0, forwards[0] + 1))
    state = train(config, logger=log, progress=False)
    weights = [p.detach().clone() for p in state.model.parameters() if p.requires_grad]
    files = sorted(p.name for p in __import__("pathlib").Path(config.output_dir).iterdir()) if config.output_dir else []
    return dict(rows=rows, weights=weights, forwards=forwards[0], saves=saves[0], threads=threads, files=files)


def same(a, b):
    return (a["rows"] == b["rows"] and a["forwards"] == b["forwards"] and a["saves"] == b["saves"]
            and a["threads"] == b["threads"] and a["files"] == b["files"] and len(a["weights"]) == len(b["weights"])
            and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a["weights"], b["weights"])))


def test_every_field_is_covered():
    assert set(CHANGES) == set(TrainingConfig._fields)


@pytest.mark.slow
def test_every_field_changes_the_run_or_is_rejected(monkeypatch, tmp_path):
    MODEL_LOADERS["tiny-perturbed"], TOKENIZER_LOADERS["tiny-perturbed"] = (
        perturbed_tiny, lambda c: load_tiny_model(progress=False)[1])
    (tmp_path / "config_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert list(CHANGES)[-1] == "plugins"  # last: the extension it registers would change every run after it
    try:
        base_config = create_training_config(**BASE)
        base = outcome(base_config, monkeypatch)
        assert same(base, outcome(base_config, monkeypatch)), (
            "the base run is not deterministic: the comparison would mean nothing")
        ignored = []
        for field, value in CHANGES.items():
            if field == "output_dir": value = str(tmp_path / "out")
            saving = field in ("checkpoint_every", "keep_checkpoints")  # they act on a run with an output_dir
            extra = {"output_dir": str(tmp_path / field)} if saving else NEEDS.get(field, {})
            config = create_training_config(**{**BASE, **extra, field: value})
            try: changed = outcome(config, monkeypatch)
            except (ValueError, ConnectionError) as e:
                assert field in str(e) or "output_dir" in str(e) or str(value) in str(e), (
                    f"{field}: rejected, but the error does not name it: {e}")
                continue
            if saving:
                with_dir = create_training_config(**BASE, output_dir=str(tmp_path / f"{field}-base"))
                base_f = outcome(with_dir, monkeypatch)
            elif field in NEEDS:
                base_f = outcome(create_training_config(**{**BASE, **NEEDS[field]}), monkeypatch)
            else:
                base_f = base
            if same(changed, base_f): ignored.append(field)
        assert not ignored, f"accepted and ignored: {ignored}"
    finally:
        del MODEL_LOADERS["tiny-perturbed"], TOKENIZER_LOADERS["tiny-perturbed"]
        STEP_EXTENSIONS.pop("config_plugin", None)
        sys.modules.pop("config_plugin", None)


def test_a_lower_case_bool_from_the_command_line_says_what_to_write():
    from rlnb.core import create_training_config
    with pytest.raises(ValueError, match=r"`fsdp` must be bool, got 'true' \(str\) \(write True"):
        create_training_config(fsdp="true")
    with pytest.raises(ValueError, match=r"got 'text' \(str\)$"):  # other text: no hint
        create_training_config(fsdp="text")
