"""Build the trained models the package ships (rlnb/weights/) with their recipes, then commit the folders:

    python tools/ship_models.py            # builds the folders that are missing, removes the ones no recipe names
    python tools/ship_models.py --rebuild  # builds every one again

The default tiny model (chapter 92: `load_tiny_model()`'s recipe), then the two made from it: the tool-use model
(chapter 63: `load_tool_use_model()`) and the tiny reward model (chapter 50: `load_tiny_reward_model()`). Each is
built in a temporary cache and moved into rlnb/weights/ under its cache name, which `rlnb.cache.shipped_or_cached`
looks up. Change a recipe and its name changes: the old folder is removed, the new one built. One torch thread, as
the recipes were measured."""
import argparse, os, shutil, sys, tempfile, time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RLNB_NUM_THREADS", "1")

from rlnb.cache import SHIPPED_DIR  # noqa: E402 (after the thread settings)
from rlnb.reward_models import load_tiny_reward_model, tiny_reward_model_path  # noqa: E402
from rlnb.tiny import load_tiny_model, tiny_cache_path  # noqa: E402
from rlnb.tool_use import load_tool_use_model, tool_use_cache_path  # noqa: E402

MODELS = {  # name -> (the cache folder of its recipe, the loader that builds it into a cache_dir)
    "tiny addition model": (tiny_cache_path, lambda cache: load_tiny_model(cache_dir=cache)),
    "tool-use model": (tool_use_cache_path, lambda cache: load_tool_use_model(cache_dir=cache, progress=True)),
    "tiny reward model": (tiny_reward_model_path, lambda cache: load_tiny_reward_model(cache_dir=cache)),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rebuild", action="store_true", help="build every shipped model again")
    args = ap.parse_args()
    SHIPPED_DIR.mkdir(exist_ok=True)
    names = {path().name for path, _ in MODELS.values()}
    for stale in sorted(p for p in SHIPPED_DIR.iterdir() if p.name not in names):
        print(f"removing {stale} (no recipe names it)")
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    for what, (path, build) in MODELS.items():  # in order: the tool-use model starts from the shipped tiny model
        target = SHIPPED_DIR / path().name
        if target.exists() and not args.rebuild:
            print(f"{what}: {target} is there")
            continue
        shutil.rmtree(target, ignore_errors=True)
        with tempfile.TemporaryDirectory() as cache:
            t0 = time.time()
            build(cache)
            shutil.move(Path(cache) / target.name, target)
        print(f"{what}: built {target} in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
