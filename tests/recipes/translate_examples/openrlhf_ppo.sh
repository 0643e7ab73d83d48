# TRANSLATE.md Ex. 4: OpenRLHF examples/scripts/train_ppo_ray_hybrid_engine.sh (v0.11 flags)
python3 -m openrlhf.cli.train_ppo_ray --reward.model_name_or_path OpenRLHF/Llama-3-8b-rm-700k \
  --train.batch_size 128 --rollout.batch_size 1024 --rollout.n_samples_per_prompt 1 --train.max_epochs 1 \
  --data.max_len 2048 --actor.adam.lr 5e-7 --critic.adam.lr 9e-6 --algo.kl.init_coef 0.01 \
  --reward.normalize_enable --algo.advantage.is_correction_enable --vllm.num_engines 4 --ds.packing_samples
