"The package as a programmer uses it: `import rlnb`, the public names, and notebooks in sync with the library."
import ast, json, subprocess, sys
from pathlib import Path

import rlnb

ROOT = Path(__file__).resolve().parent.parent

# The public names this stage of rlnb promises (shared/API.md), by module.
PUBLIC = {
    "core": "ModelConfig GenerationConfig Message Conversation Generation Rollout Batch TrainingConfig TrainingStats "
            "TrainingState CollatedBatch collate set_seed rollouts_to_jsonl rollouts_from_jsonl create_training_config "
            "model_device pad_token_id is_peft_model group_stats TRAINING_CONFIG_SECTIONS",
    "docstrings": "document_fields document_parameters document_sections",
    "checks": "check_2d check_finite check_finite_number rewards_1d resolve_group_ids",
    "cache": "default_cache_dir build_atomically load_from_folder LOCK_FILE FolderInUseError lock_holder folder_lock",
    "tasks": "get_task list_tasks resolve_task load_jsonl_dataset extract_gsm8k_answer extract_number",
    "models": "load_model load_tokenizer apply_lora MODEL_LOADERS TOKENIZER_LOADERS",
    "chat": "format_prompt apply_chat_template parse_thinking",
    "generation": "generate generate_with_logprobs batch_generate merged_lora",
    "logprobs": "compute_logprobs_for_tokens precision_context AUTO_BF16_MAX_TIME bf16_time_ratio "
                "choose_mixed_precision",
    "tools": "generate_conversation_turn extract_tool_calls execute_tools",
    "rewards": "trl_reward compute_scalar_reward compute_vector_reward compute_batch_rewards format_reward "
               "exact_match_reward length_penalty_reward",
    "reward_transforms": "aggregate_vector_rewards normalize_rewards apply_reward_shaping weighted_sum_aggregator "
                         "min_aggregator max_aggregator mean_aggregator create_reward_transform pareto_ranks "
                         "pareto_reward",
    "reward_models": "load_reward_model compute_reward_model_score create_rm_reward_fn create_rm_rollout_fn "
                     "preference_loss create_preference_pairs create_rollout_pairs train_reward_model "
                     "load_tiny_reward_model",
    "kl": "compute_forward_kl compute_reverse_kl compute_per_token_kl compute_batch_kl create_truncated_kl "
          "create_adaptive_kl create_reference_model get_reference_logprobs create_ema_updater "
          "create_periodic_updater update_reference_model check_same_tokenizer check_teacher_model load_teacher "
          "attach_teacher teacher_metrics",
    "rollouts": "create_rollout create_batch_rollouts create_rollout_fn create_prompt_loader DataBuffer "
                "evaluate_accuracy create_eval_fn",
    "multiturn": "parse_tool_calls parse_function_calls chat_template_tool_parser execute_and_track_tools "
                 "track_tool_calls EnvStep Environment create_tool_environment create_multiturn_rollout "
                 "create_multiturn_rollout_fn",
    "sampling": "batch_groups nonzero_std_filter min_reward_filter diversity_filter length_filter combine_filters "
                "create_prompt_source create_filtered_rollout_fn",
    "algorithms": "compute_advantages compute_policy_gradient_loss compute_grpo_advantages compute_grpo_loss "
                  "create_grpo_config create_algorithm_config compute_batch_advantages compute_loss_by_algorithm "
                  "get_algorithm_config register_algorithm find_algorithm check_algorithm_spec StepExtension "
                  "register_step_extension step_extensions STEP_EXTENSIONS",
    "catalogue": "compute_rloo_advantages compute_reinforce_advantages compute_reinforce_loss compute_dapo_loss "
                 "create_dapo_config gspo_loss compute_reinforce_pp_advantages DAPO_DEFAULTS",
    "dpo": "compute_dpo_pairs compute_dpo_loss dpo_loss",
    "ppo": "create_value_head add_value_head compute_token_rewards compute_gae compute_ppo_advantages "
           "compute_value_loss compute_ppo_loss create_ppo_config PPO_DEFAULTS",
    "mismatch": "mismatch_metrics sampler_copy create_hf_generator sample_and_score LOG_RATIO_BOUND",
    "rollout_corrections": "rollout_correction ROLLOUT_CORRECTIONS apply_rollout_correction check_rollout_correction "
                           "find_rollout_correction sequence_log_ratio",
    "baselines": "compute_maxrl_advantages compute_gdpo_advantages compute_remax_advantages "
                 "create_greedy_baseline_rollout_fn",
    "policy_losses": "cispo_loss sapo_loss sapo_gate gmpo_loss dppo_loss dppo_moved DPPO_DIVERGENCES token_covariance "
                     "clip_cov_select compute_clip_cov_advantages kl_cov_loss policy_tokens finish_policy_loss "
                     "PolicyTokens",
    "entropy": "entropy_bonus high_entropy_mask adaptive_entropy_coef entropy_coefficient update_entropy_control "
               "apply_entropy_controls entropy_loss_term finish_entropy_control ENTROPY_CONTROLS",
    "passk": "evaluate_pass_at_k PassAtK compute_passk_advantages",
    "evaluation": "evaluate_model evaluate_models plot_evaluation pass_at_k_ks check_evaluation_arguments "
                  "HELD_OUT_SEED MAX_EVAL_SIZE MAX_EVAL_SAMPLES",
    "distributed": "world_size process_rank init_distributed config_digest check_distributed_config shard_prompts "
                   "rank_seed create_sharded_prompt_loader sync_parameters batch_advantages loss_share "
                   "all_reduce_gradients averaged_step reduced_stats any_rank is_sharded decoder_layers shard_module "
                   "shard_training_state full_parameters full_training_state sharded_hooks even_micro_batches "
                   "sharded_micro_batches",
    "distillation": "compute_distillation_advantages compute_opd_advantages",
    "loggers": "reward_metrics update_ema_metrics log_to_console log_to_wandb create_jsonl_logger load_metrics "
               "plot_metrics create_progress_logger create_tensorboard_logger load_wandb_metrics",
    "checkpoints": "save_checkpoint load_checkpoint checkpoint_exists checkpoint_metadata",
    "step": "lr_multiplier create_optimizer default_optimizer_step create_training_state default_num_threads "
            "is_metrics OneProcess DATA_PARALLEL data_parallel needs_reference_pass training_step",
    "training": "SAMPLERS FAST_SAMPLERS choose_generator training_iteration train",
    "train_checks": "HOOK_SIGNATURES checked_template_fn checked_generator warn_unused_hooks check_train_arguments",
    "resume": "RUN_IDENTITY output_lock output_paths check_same_run resumed_state",
    "sft": "sft sft_loss tokenize_sft_example",
    "quickstart": "quick_start_training",
    "tiny": "load_tiny_model create_tiny_tokenizer create_tiny_model",
    "tiny_sft": "sft_tiny_model train_tiny_model_into read_tiny_history",
    "experiments": "RunResult STATUS_FILE RUN_LOCK_FILE ATTEMPTS_DIR ProcessPerRun check_run_params run_name "
                   "expand_grid run_experiment run_sweep read_json_object read_run_status why_incomplete "
                   "write_toy_notebook",
    "sweep_results": "Sweep load_sweep plot_sweep",
    "widgets": "create_dashboard_logger draw_dashboard metrics_html samples_html DASHBOARD_PANELS",
    "viewer": "view_rollouts token_values tokens_html colorbar_html rollout_html group_html RolloutViewer "
              "QUANTITY_STYLES",
    "environments": "count_letters create_text_environment create_verifier_tool create_verification_environment "
                    "ConversationState create_conversation_environment scripted_user swap_roles create_model_user",
    "export": "merged_model write_new save_hf save_gguf model_card gguf_architecture gguf_tensor_name "
              "llama_rope_permute gguf_tensors gguf_vocabulary",
    "tool_use": "TOOL_SYSTEM_PROMPT TOOL_USE_SFT TOOL_USE_RL products_task tool_demonstration "
                "create_tool_demonstrations sft_tool_use_model tool_use_cache_path load_tool_use_model tool_use_stats "
                "create_tool_use_rollout_fn evaluate_tool_use tool_use_config",
}


def test_public_names_importable_from_top_level():
    missing = [f"{m}.{n}" for m, names in PUBLIC.items() for n in names.split() if not hasattr(rlnb, n)]
    assert not missing, f"not importable from rlnb: {missing}"


def test_star_import_gives_public_names():
    ns = {}
    exec("from rlnb import *", ns)
    assert "collate" in ns and "Rollout" in ns


def test_every_module_has_a_notebook():
    "Each generated module names the notebook it came from, and that notebook exists."
    for py in (ROOT / "rlnb").glob("*.py"):
        if py.name.startswith("_"): continue
        first = py.read_text().splitlines()[:6]
        src = [l for l in first if "File to edit:" in l]
        assert src, f"{py.name} is not generated by nbdev"
        nb = (py.parent / src[0].split("File to edit:")[1].strip().rstrip(".")).resolve()
        assert nb.exists(), f"{py.name} says it comes from {nb}, which does not exist"


def test_notebooks_are_clean():
    "Committed notebooks carry no execution metadata beyond what nbdev-clean keeps."
    for nb in (ROOT / "nbs").rglob("*.ipynb"):
        if ".ipynb_checkpoints" in nb.parts: continue
        d = json.loads(nb.read_text())
        for c in d["cells"]:
            assert set(c.get("metadata", {})) <= {"tags"}, f"{nb.name}: cell metadata {c['metadata']}"
            if c["cell_type"] == "code": assert c.get("execution_count") is None, f"{nb.name}: execution counts"


def test_names_live_where_the_map_says():
    import importlib
    wrong = [f"{m}.{n}" for m, names in PUBLIC.items() for n in names.split()
             if not hasattr(importlib.import_module(f"rlnb.{m}"), n)]
    assert not wrong, f"not defined in the module the map names: {wrong}"


def test_help_shows_what_each_record_field_is():
    import pydoc
    import rlnb
    for record in (rlnb.Rollout, rlnb.Generation, rlnb.TrainingState, rlnb.RunResult, rlnb.TaskExample):
        text = pydoc.render_doc(record)
        assert "Alias for field number" not in text, record.__name__
    assert rlnb.Rollout.prompt.__doc__ == "prompt text as shown to the model (after the chat template)"


def _main_install() -> set[str]:
    "The distributions `pip install rlnb` brings (no extras): rlnb's requirements and theirs, as installed here."
    import re
    from importlib.metadata import PackageNotFoundError, distribution
    norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
    seen, todo = set(), ["rlnb"]
    while todo:
        name = norm(todo.pop())
        if name in seen: continue
        seen.add(name)
        try: requires = distribution(name).requires or []
        except PackageNotFoundError: continue  # a platform-specific requirement that is not installed here
        todo += [re.match(r"[A-Za-z0-9_.-]+", r).group() for r in requires if "extra ==" not in r]
    return seen


def _guarded(node, parents) -> bool:
    "An import inside `try: ... except ImportError` or under an `if` that asks `find_spec`: it may be missing."
    for p in parents.get(node, ()):
        if isinstance(p, ast.Try) and any("ImportError" in ast.unparse(h.type or ast.Name("")) for h in p.handlers):
            return True
        if isinstance(p, ast.If) and "find_spec" in ast.unparse(p.test): return True
    return False


def test_chapters_import_only_what_the_main_install_brings():
    "After `bash scripts/install.sh` (no dev extra) every chapter runs: what a cell imports comes with rlnb's own "
    "requirements, or the import is guarded (a dev extra's reference check is skipped without it)."
    import importlib.metadata, re
    modules = importlib.metadata.packages_distributions()  # top-level module -> distributions providing it
    norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
    installed, missing = _main_install(), []
    for nb in sorted((ROOT / "nbs").rglob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] != "code" or re.search(r"^#\|\s*(vllm|gpu)\b", source, re.M): continue
            tree = ast.parse("\n".join(l for l in source.splitlines() if not l.lstrip().startswith(("%", "!"))))
            parents = {}
            for p in ast.walk(tree):  # each node's enclosing statements, outermost first
                for child in ast.iter_child_nodes(p): parents[child] = parents.get(p, ()) + (p,)
            for node in ast.walk(tree):
                if any(isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)) for p in parents.get(node, ())):
                    continue  # imported when called: the function's own error says what to install
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"rlnb"}:
                    if not {norm(d) for d in modules.get(top, [])} & installed and not _guarded(node, parents):
                        missing.append(f"{nb.name}: {top}")
    assert not missing, f"imported by chapters but not installed by `bash scripts/install.sh`: {sorted(set(missing))}"


def test_no_public_name_is_exported_by_two_modules():
    "`from rlnb import *` star-imports every module: a name in two modules' __all__ would silently shadow one of them."
    import collections, importlib, re
    from pathlib import Path
    init = (Path(__file__).resolve().parent.parent / "rlnb" / "__init__.py").read_text()
    owners = collections.defaultdict(list)
    for module in re.findall(r"^from \.(\w+) import \*", init, re.M):
        for name in importlib.import_module(f"rlnb.{module}").__all__: owners[name].append(module)
    assert not {n: m for n, m in owners.items() if len(m) > 1}
