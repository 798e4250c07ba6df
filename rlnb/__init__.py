"""Reinforcement learning for LLM post-training, taught and built in notebooks

Modules, in the order data flows through a run: `rlnb.core` (records, `collate`, the run config `TrainingConfig`,
shared helpers), `rlnb.checks` (the argument checks of the losses), `rlnb.cache` (folders built once), `rlnb.tasks`
(verifiable tasks, dataset loaders), `rlnb.models` (models and tokenizers, `MODEL_LOADERS`, LoRA),
`rlnb.real_models` (SmolLM2 and any GGUF file, offline), `rlnb.chat` (chat templates, thinking), `rlnb.decoding`
(drawing a batch's tokens: left padding, log-probs while sampling, stop strings), `rlnb.prefill` (one prefill per
distinct prompt, LoRA folded while sampling), `rlnb.generation` (batched sampling, `batch_generate`), `rlnb.logprobs`
(log-probs of sampled tokens), `rlnb.tools` (tool calls),
`rlnb.rewards` (reward functions, checked), `rlnb.reward_transforms` (aggregation, normalisation, Pareto
ranks, shaping, the reward transform), `rlnb.reward_models` (reward models), `rlnb.kl` (KL estimators, reference
models), `rlnb.rollouts` (grouped rollouts, `rollout_fn`, prompt loaders), `rlnb.sampling`
(group filters, dynamic sampling), `rlnb.algorithms` (advantages, losses, the registry), `rlnb.catalogue` (RLOO,
REINFORCE, DAPO, GSPO, REINFORCE++), `rlnb.dpo` (online DPO), `rlnb.ppo` (PPO: value head, GAE), `rlnb.mismatch`
(the sampler/trainer mismatch measured, a bf16 sampler), `rlnb.rollout_corrections` (correcting it: TIS, MIS,
IcePop, Geo-RS), `rlnb.off_policy_masks` (OPSM, K3 rejection sampling, trust-region
masking, the importance-weighted KL), `rlnb.policy_losses` (CISPO, SAPO, GMPO, DPPO, Clip-Cov, KL-Cov),
`rlnb.sequence_ratios` (GSPO-token, LUSPO, VESPO), `rlnb.trust_regions` (INTELLECT-2's two-sided clip, DRO, TOPR,
M2PO), `rlnb.entropy` (entropy bonus, high-entropy mask, adaptive weight), `rlnb.baselines` (MaxRL, GDPO, ReMax,
REINFORCE++-baseline, OPO, GPG, Lite PPO, the optimal token baseline), `rlnb.passk` (pass@k evaluation and
training), `rlnb.distillation` (on-policy distillation from a teacher, self-distillation),
`rlnb.loggers` (loggers, metrics, plots), `rlnb.checkpoints` (crash-safe checkpoints), `rlnb.training` (`train` and
its hooks), `rlnb.sft` (SFT through the same loop), `rlnb.engines` (vLLM as the sampler, weight sync),
`rlnb.distributed` (data parallelism over processes), `rlnb.quickstart` (`quick_start_training`), `rlnb.tiny` (the
built-in tiny model), `rlnb.experiments` (papermill runs and sweeps on any executor), `rlnb.sweep_results`
(`load_sweep`, `plot_sweep`),
`rlnb.cli` (the `rlnb run` / `rlnb sweep` / `rlnb train` / `rlnb chat` / `rlnb eval` / `rlnb export` commands),
`rlnb.widgets` (the live training dashboard), `rlnb.viewer` (the token-level rollout viewer), and after the run:
`rlnb.runs` (`load_run`: a run folder's trained model), `rlnb.talk` (chat with it, compare it with its base),
`rlnb.evaluation` (several models on the same held-out prompts, one table) and `rlnb.export` (a Hugging Face folder
or a GGUF file, with a model card).

Modules:

- `rlnb.cli`: `rlnb run`, `rlnb sweep` and `rlnb train`: a papermill run, a sweep, or `train` itself (torchrun), from a shell; `rlnb chat`, `rlnb eval` and `rlnb export` on a finished run.
- `rlnb.runs`: `load_run(folder)`: the trained policy of any run folder, on the base model it was trained from, checked, at its last checkpoint or at any kept one.
- `rlnb.talk`: `chat_reply`, a terminal chat (`rlnb chat RUN --base`) and `compare_replies`: the trained model's answers beside the base model's, on the same prompts, with the task's reward on each.
- `rlnb.vllm_server`: vLLM in its own process, behind its OpenAI-compatible API: the policy moves there after each update (a LoRA adapter hot-loaded, or every weight reloaded), and the trainer samples through HTTP."""

__version__ = "0.0.1"

import os as _os

# OpenMP threads that sleep while they wait instead of spinning: on a shared CPU, spinning threads take the cores the
# work needs (SmolLM2's steps ran 10-30x slower under load; benchmarks/threads.py). OpenMP reads this when torch first
# loads it, so it counts where rlnb is imported before torch (the `rlnb` command, its notebooks' kernels, which
# inherit it, and scripts that import rlnb first). An OMP_WAIT_POLICY already set wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The public names of every module, so `import rlnb; rlnb.collate(...)` and `from rlnb import *` both work.
from .core import *
from .checks import *  # check_2d, check_finite, check_finite_number, rewards_1d, resolve_group_ids
from .cache import *  # default_cache_dir, build_atomically, load_from_folder, folder_lock: cached folders, locks
from .tasks import *
from .models import *
from .real_models import *  # registers "smollm2" and ".gguf" in rlnb.models.MODEL_LOADERS / TOKENIZER_LOADERS
from .chat import *
from .decoding import *  # left_pad, encode_prompts, eos_token_ids, generation_mode: drawing a batch's tokens
from .prefill import *  # distinct_prompts, prefill_prompts, can_share_prompts, merged_lora: one prompt, n samples
from .generation import *
from .logprobs import *
from .tools import *
from .rewards import *
from .reward_transforms import *  # aggregators, normalisers, Pareto ranks, shaping, create_reward_transform
from .kl import *
from .rollouts import *
from .multiturn import *  # multi-turn episodes, tool-call parsers, environments
from .sampling import *
from .algorithms import *
from .catalogue import *  # registers rloo, reinforce, dapo, gspo, reinforce++ in ALGORITHMS
from .dpo import *  # registers dpo
from .ppo import *  # registers ppo
from .mismatch import *  # the sampler/trainer mismatch measured: metrics, the bf16 sampler
from .rollout_corrections import *  # correcting it: TIS/MIS/IcePop/Geo-RS weights and masks, into every loss
from .off_policy_masks import *  # registers opsm, k3_rs, trm in ROLLOUT_CORRECTIONS and k3_is in KL_ESTIMATORS
from .policy_losses import *  # registers cispo, sapo, gmpo, dppo, clip_cov, kl_cov
from .sequence_ratios import *  # registers gspo_token, luspo, vespo
from .trust_regions import *  # registers intellect2, dro, topr, m2po
from .entropy import *  # entropy control: the bonus, the high-entropy token mask, the adaptive weight
from .baselines import *  # registers maxrl, gdpo, remax, reinforce++_baseline, opo, gpg, lite_ppo, otb in ALGORITHMS
from .passk import *  # evaluate_pass_at_k, compute_passk_advantages; registers grpo_passk
from .distillation import *  # registers opd (a teacher's per-token log-probs), opsd and sdpo (self-distillation)
from .loggers import *
from .checkpoints import *
from .step import *  # the optimizer and one training step, the seam of several processes (OneProcess)
from .train_checks import *
from .resume import *
from .interrupts import *  # SoftInterrupt: a first Ctrl-C stops a run at its next safe point
from .training import *
from .sft import *
from .quickstart import *
from .tiny import *  # registers "tiny" in rlnb.models.MODEL_LOADERS / TOKENIZER_LOADERS
from .tiny_sft import *  # how the tiny model is trained (load_tiny_model calls it the first time)
from .engines import *  # create_vllm_generator: vLLM as the sampler (vLLM itself is imported only when used)
from .vllm_server import *  # start_vllm_server, create_server_generator: sampling from a vLLM server through HTTP
from .distributed import *  # data parallelism on torch.distributed (replicated or FSDP-sharded), rank 0 writes
from .reward_models import *  # reward models: batched scoring, the tiny Bradley-Terry reward model
from .widgets import *  # the training dashboard
from .viewer import *  # the rollout viewer
from .experiments import *  # run_experiment, run_sweep (the `rlnb` command: rlnb.cli)
from .sweep_results import *  # load_sweep, plot_sweep: a sweep's folders as tables and plots
from .environments import *  # text, self-verification and conversation environments, simulated users
from .tool_use import *  # the tool-use task: calculator demonstrations, SFT start, RL settings and metrics
from .runs import *  # load_run: a run folder's trained policy, checked against its base model
from .talk import *  # chat_reply, chat_session (`rlnb chat`), compare_replies: talk to a run
from .evaluation import *  # evaluate_model, evaluate_models, plot_evaluation: models side by side in one table
from .export import *  # save_hf, save_gguf, model_card: a trained model as a Hugging Face folder or a GGUF file
from .docstrings import *  # document_fields, document_parameters, document_sections: what help() shows

# `help(rlnb.Rollout)` shows each field's comment instead of "Alias for field number 0"
document_fields(*(v for v in dict(globals()).values()
                  if isinstance(v, type) and issubclass(v, tuple) and hasattr(v, "_fields")
                  and getattr(v, "__module__", "").startswith("rlnb.")))
# `help(rlnb.TrainingConfig)` lists its fields by section
document_sections(TrainingConfig, TRAINING_CONFIG_SECTIONS)
# `help(rlnb.train)` lists each parameter's comment (the `# ...` beside it in the signature) under "Parameters:"
document_parameters(*(getattr(module, name) for module in list(globals().values())
                      if getattr(module, "__name__", "").startswith("rlnb.") and hasattr(module, "__file__")
                      for name in getattr(module, "__all__", ())))
