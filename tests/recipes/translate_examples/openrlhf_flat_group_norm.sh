# Written for the tests: a ≤0.10 invocation (flat flag names), GRPO-style group_norm with a
# k3 KL loss, dynamic filtering, IcePop against the vLLM log-probs, Adam betas, no warm-up.
python -m openrlhf.cli.train_ppo_ray \
  --pretrain Qwen/Qwen2.5-Math-1.5B \
  --advantage_estimator group_norm \
  --n_samples_per_prompt 8 --rollout_batch_size 128 --train_batch_size 256 \
  --use_kl_loss --init_kl_coef 0.001 --kl_estimator k3 \
  --dynamic_filtering --max_new_tokens 1024 \
  --enable_vllm_is_correction --vllm_is_correction_type icepop \
  --vllm_is_truncated_threshold 0.5 5.0 \
  --lr_scheduler constant --lr_warmup_ratio 0 --actor_learning_rate 1e-6 --adam_betas 0.9 0.98
