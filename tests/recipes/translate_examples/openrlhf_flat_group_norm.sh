# Written for the tests: a ≤0.10 invocation (flat flag names), GRPO-style group_norm with a
# k3 KL loss and dynamic filtering.
python -m openrlhf.cli.train_ppo_ray \
  --pretrain Qwen/Qwen2.5-Math-1.5B \
  --advantage_estimator group_norm \
  --n_samples_per_prompt 8 --rollout_batch_size 128 --train_batch_size 256 \
  --use_kl_loss --init_kl_coef 0.001 --kl_estimator k3 \
  --dynamic_filtering --rollout.max_new_tokens 1024 \
  --actor.lr_scheduler constant --actor.adam.lr 1e-6
