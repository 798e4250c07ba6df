"The check shared by the bad-input suites: a case's call raises the right exception, naming what it should."
import warnings

import pytest


def check_bad_input(fn, exc, contains, tmp_path):
    "`fn(tmp_path)` raises `exc` whose message (notes included) holds every string of `contains` ({tmp}: tmp_path)."
    with pytest.raises(exc) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the question is the error; a warning on the way to it is not
        fn(tmp_path)
    message = str(info.value) + "".join("\n" + n for n in getattr(info.value, "__notes__", []))
    missing = [c for c in (c.replace("{tmp}", str(tmp_path)) for c in contains) if c not in message]
    assert not missing, f"{type(info.value).__name__} message lacks {missing}: {message[:500]}"
