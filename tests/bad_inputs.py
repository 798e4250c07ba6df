"What the bad-input suites share: the check that a case raises the right error, and the smallest training run."
import copy, functools, warnings

import pytest


def check_bad_input(fn, exc, contains, tmp_path):
    "`fn(tmp_path)` raises `exc` whose message (notes included) holds every string of `contains` ({tmp}: tmp_path)."
    with pytest.raises(exc) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the question is the error; a warning on the way to it is not
        fn(tmp_path)
    message = str(info.value) + "".join("\n" + n for n in getattr(info.value, "__notes__", []))
    missing = [c for c in (c.replace("{tmp}", str(tmp_path)) for c in contains) if c not in message]
    assert not missing, f"{type(info.value).__name__} message lacks {missing}: {message[:500]}"


@functools.cache
def _tiny():
    from rlnb import tiny
    return tiny.load_tiny_model(progress=False)


def tok():
    "The tiny model's tokenizer."
    return _tiny()[1]


def model():
    "A fresh copy of the tiny model."
    return copy.deepcopy(_tiny()[0])


def small(**kw):
    "The smallest run config: one iteration of 2 prompts x 2 completions of 2 tokens, no LoRA, no evaluation."
    from rlnb.core import create_training_config
    return create_training_config(**{**dict(num_iterations=1, prompts_per_step=2, group_size=2, max_new_tokens=2,
                                            eval_every=0, lora_r=0), **kw})


def run(**kw):
    "One short run of train with the given hooks (a fresh tiny model)."
    from rlnb import training
    config = kw.pop("config", small())
    return training.train(config, model=model(), tokenizer=tok(), progress=False, **kw)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    "A finished 2-iteration LoRA run with its checkpoint (import it to use it as a fixture)."
    from rlnb import training
    out = tmp_path_factory.mktemp("run")
    training.train(small(num_iterations=2, lora_r=4, output_dir=str(out)), progress=False)
    return out
