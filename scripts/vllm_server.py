"""Serve a model with vLLM for rlnb's `generator="vllm_server"`, then wait (Ctrl-C stops it).

    .venv-vllm/bin/python scripts/vllm_server.py --model tiny --lora-r 8 --port 8000
    .venv/bin/rlnb train -p generator vllm_server -p generator_url http://127.0.0.1:8000    # in another terminal

--model, --task and --lora-r name the base model as TrainingConfig does, so the trainer's policy fits the server:
the same base weights, and a LoRA rank the server holds (--lora-r 0: a policy that trains every weight; --merged: a
LoRA policy sent merged each step, for `-p generator vllm_server_merged`, faster on a CPU). Prints
"serving <url>" once the server answers. Chapter *A generation server* (nbs/70a_vllm_server.ipynb) explains it."""
import argparse, signal, sys

from rlnb.core import create_training_config
from rlnb.training import build_policy
from rlnb.vllm_server import start_vllm_server


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="as TrainingConfig.model: tiny, smollm2, a hub id, a folder")
    ap.add_argument("--task", default="addition", help="the tiny model's task (as TrainingConfig.task)")
    ap.add_argument("--lora-r", type=int, default=8, help="the trainer's LoRA rank (0: it trains every weight)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--host", default="127.0.0.1", help="0.0.0.0 serves other machines (a trusted network only)")
    ap.add_argument("--dtype", default="float32", help="the served precision: float32 or bfloat16")
    ap.add_argument("--merged", action="store_true",
                    help="no LoRA in the server: the trainer sends merged weights (-p generator vllm_server_merged)")
    ap.add_argument("--kv-cache-memory-bytes", type=int, default=2**29, help="the server's KV cache, in bytes")
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="the longest prompt + completion (None: the model's)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # from the start: `finally` stops a server half started
    config = create_training_config(model=args.model, task=args.task, lora_r=args.lora_r, dtype="float32")
    policy, tokenizer = build_policy(config)
    options = {} if args.max_model_len is None else {"max_model_len": args.max_model_len}
    server = start_vllm_server(policy, tokenizer, port=args.port, host=args.host, dtype=args.dtype,
                               kv_cache_memory_bytes=args.kv_cache_memory_bytes, lora=not args.merged, **options)
    print(f"serving {server.url} (log: {server.log})", flush=True)
    try:
        code = server.process.wait()
        print(f"the server exited with code {code}; its log ends:\n{server.log_tail()}", file=sys.stderr)
        return code or 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
