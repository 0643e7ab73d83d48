"""The paper index: every preset with its paper and the hyper-parameters it quotes.

``docs/papers.md`` is generated from this file (``rlmap papers > docs/papers.md``),
and a test checks that the two agree.
"""

from __future__ import annotations

from rlmap.correction.params import KLParams
from rlmap.feedback.params import FeedbackParams
from rlmap.recipes import presets as p
from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.presets import Preset, Quote

registry = p.registry

_PPO_CLIP = Quote("clip ε = 0.2", "behaviour.clip_high", 0.2)
_GRPO_G = Quote("64 outputs sampled per question", "sampling.group_size", 64)

registry.add(
    "classic-rlhf",
    Preset(
        build=lambda: p.critic_ppo_config(
            "classic-rlhf",
            feedback=FeedbackParams(source="reward_model"),
            kl=KLParams(placement="reward", estimator="k1", beta=0.02),
        ),
        summary="learned reward model + critic + GAE + PPO clip + KL in the reward",
        paper="Ouyang et al. 2022, Training language models to follow instructions with human "
        "feedback (InstructGPT); Ziegler et al. 2019, Fine-Tuning Language Models from Human "
        "Preferences",
        quotes=(
            Quote("per-token KL penalty in the reward, β = 0.02", "kl.beta", 0.02),
            Quote("GAE γ = 1", "credit.gamma", 1.0),
            Quote("GAE λ = 0.95", "credit.lam", 0.95),
            _PPO_CLIP,
        ),
    ),
)
registry.add(
    "grpo",
    Preset(
        build=p.grpo_config,
        summary="verifier + G per prompt + group-normalised advantage + PPO clip + KL k3 in loss",
        paper="Shao et al. 2024, DeepSeekMath: Pushing the Limits of Mathematical Reasoning in "
        "Open Language Models",
        quotes=(
            _GRPO_G,
            Quote("KL coefficient β = 0.04", "kl.beta", 0.04),
            Quote("policy learning rate 1e-6", "optim.lr", 1e-6),
            Quote("max length 1024", "generation.max_new_tokens", 1024),
            Quote("training batch size 1024, one policy update per exploration stage"),
        ),
        note="The paper's loss averages per response then per group: that is response_mean.",
    ),
)
registry.add(
    "dr-grpo",
    Preset(
        build=p.dr_grpo_config,
        summary="grpo with the std-free advantage and a fixed-budget (length-free) denominator",
        paper="Liu et al. 2025, Understanding R1-Zero-Like Training: A Critical Perspective",
        quotes=(
            Quote("advantage R_i − mean_g R, no division by std"),
            Quote("loss normalised by a constant (max generation length), not |o_i|"),
        ),
        note="Everything else as the grpo preset, KL term included (docs/formulas.md §9).",
    ),
)
registry.add(
    "rloo",
    Preset(
        build=lambda: p.on_policy_config("rloo", "rloo"),
        summary="leave-one-out baseline + on-policy REINFORCE + response mean",
        paper="Ahmadian et al. 2024, Back to Basics: Revisiting REINFORCE Style Optimization "
        "for Learning from Human Feedback in LLMs",
        quotes=(Quote("k = 4 samples per prompt (k = 2 also reported)", "sampling.group_size", 4),),
    ),
)
registry.add(
    "reinforce",
    Preset(
        build=lambda: p.on_policy_config("reinforce", "reinforce"),
        summary="batch-mean baseline + on-policy REINFORCE + response mean",
        paper="Williams 1992, Simple Statistical Gradient-Following Algorithms for "
        "Connectionist Reinforcement Learning; baseline as in Ahmadian et al. 2024",
    ),
)
registry.add(
    "dapo",
    Preset(
        build=p.dapo_config,
        summary="verifier + group advantage + Clip-Higher + dynamic sampling + token mean "
        "+ soft overlong punishment, no KL",
        paper="Yu et al. 2025, DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
        quotes=(
            Quote("ε_low = 0.2", "behaviour.clip_low", 0.2),
            Quote("ε_high = 0.28", "behaviour.clip_high", 0.28),
            Quote("16 responses per prompt", "sampling.group_size", 16),
            Quote("max generation 20,480 tokens", "generation.max_new_tokens", 20480),
            Quote("soft punish cache 4,096 tokens", "feedback.overlong_cache", 4096),
            Quote("learning rate 1e-6 with 20 warm-up rollout steps", "optim.lr", 1e-6),
            Quote("prompt batch 512, mini-batch 512 (16 gradient updates per rollout step)"),
            Quote("no KL penalty", "kl.placement", "none"),
        ),
    ),
)
registry.add(
    "vapo",
    Preset(
        build=p.vapo_config,
        summary="verifier + pretrained critic + decoupled, length-adaptive GAE + Clip-Higher "
        "+ token mean + positive NLL + group sampling",
        paper="Yue et al. 2025, VAPO: Efficient and Reliable Reinforcement Learning for "
        "Advanced Reasoning Tasks",
        quotes=(
            Quote("value pretraining 50 steps on Monte-Carlo returns", "critic.warmup_steps", 50),
            Quote("λ_critic = 1.0", "credit.lam_critic", 1.0),
            Quote("length-adaptive λ_policy with α = 0.05", "credit.adaptive_alpha", 0.05),
            Quote("ε_low = 0.2, ε_high = 0.28", "behaviour.clip_high", 0.28),
            Quote("positive-example NLL weight μ = 0.1", "behaviour.positive_nll", 0.1),
            Quote("actor lr 1e-6", "optim.lr", 1e-6),
            Quote("critic lr 2e-6", "optim.critic_lr", 2e-6),
            Quote("512 prompts × 16 samples per step", "sampling.group_size", 16),
        ),
        note="α is scaled by the length limits (0.05 × 20,480 / 16 = 64) so that α·l at the "
        "length limit is the paper's (1,024). λ_policy = 1 − 1/(α·l) is clamped to [0, 1]: "
        "the paper's α = 0.05 on responses of a few tokens would give α·l < 1, a negative λ "
        "clamped to 0 (pure TD(0)).",
    ),
)
registry.add(
    "gspo",
    Preset(
        build=lambda: p.grpo_variant("gspo", objective="gspo", clip_low=3e-4, clip_high=4e-4),
        summary="grpo with a sequence-level ratio (geometric mean) and sequence clipping",
        paper="Zheng et al. 2025, Group Sequence Policy Optimization (Qwen)",
        quotes=(
            Quote("ε_low = 3e-4", "behaviour.clip_low", 3e-4),
            Quote("ε_high = 4e-4", "behaviour.clip_high", 4e-4),
        ),
        note="Only the objective differs from the grpo preset (docs/formulas.md §9).",
    ),
)
registry.add(
    "cispo",
    Preset(
        build=lambda: p.grpo_variant("cispo", objective="cispo", clip_low=1.0, clip_high=0.28),
        summary="grpo with clipped, detached IS weights on every token's log-prob gradient",
        paper="MiniMax 2025, MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning "
        "Attention",
        quotes=(
            Quote("ε_low effectively unbounded (not clipped below)", "behaviour.clip_low", 1.0),
            Quote("only ε_high is tuned; no value is quoted"),
        ),
        note="ε_high = 0.28 is rlmap's choice (Clip-Higher's value); the paper gives none.",
    ),
)
registry.add(
    "sapo",
    Preset(
        build=lambda: p.grpo_variant("sapo", objective="sapo", sapo_tau_pos=1.0, sapo_tau_neg=1.05),
        summary="grpo with a soft, sigmoid-gated ratio instead of a hard clip",
        paper="Gao et al. 2025 (Qwen Team), Soft Adaptive Policy Optimization",
        quotes=(
            Quote("τ_pos = 1.0", "behaviour.sapo_tau_pos", 1.0),
            Quote("τ_neg = 1.05", "behaviour.sapo_tau_neg", 1.05),
        ),
    ),
)
registry.add(
    "dppo",
    Preset(
        build=lambda: p.grpo_variant(
            "dppo", objective="dppo_tv", mode="bypass", dppo_tv_low=0.15, dppo_tv_high=0.15
        ),
        summary="grpo with a binary total-variation trust region on the rollout policy: tokens "
        "whose probability moved past δ in the advantage's direction get no gradient, the rest "
        "the raw ratio",
        paper="Qi et al. 2026, Rethinking the Trust Region in LLM Reinforcement Learning "
        "(DPPO, arXiv 2602.04879)",
        quotes=(
            Quote(
                "the trust region is anchored to the rollout (behaviour) policy, not a "
                "recomputed one",
                "behaviour.mode",
                "bypass",
            ),
            Quote("binary-TV δ = 0.15 (verl's DPPO example)", "behaviour.dppo_tv_high", 0.15),
            Quote("no clip on the kept tokens' ratio (verl's example: clip_ratio_c = 10,000)"),
        ),
        note="δ is the anchors' example value (verl; prime-rl and SkyRL default to 0.2); the "
        "binary-KL variant is behaviour.objective=dppo_kl. With one optimiser step per batch "
        "and an engine that shares the policy, d = 1 and nothing is masked: the mask bites "
        "with several steps per batch, a bfloat16 engine or stale (async) data.",
    ),
)
registry.add(
    "dro",
    Preset(
        build=p.dro_config,
        summary="mean-baseline advantage + direct reward optimisation: −Â·log π_θ plus a "
        "quadratic (β/2)(log r)² pull towards the behaviour policy, no clip",
        paper="Richemond et al. 2024, Offline Regularised Reinforcement Learning for Large "
        "Language Models Alignment (DRO); Kimi Team 2025, Kimi k1.5",
        quotes=(
            Quote("β = 0.05 (verl's DRO example and Tinker's)", "behaviour.dro_beta", 0.05),
            Quote(
                "mean-of-group baseline, no std division (Kimi k1.5)", "credit.estimator", "dr_grpo"
            ),
        ),
        note="The penalty is per token, as both anchors apply it (Kimi k1.5 writes it on the "
        "sequence log-ratio). With one optimiser step per batch r = 1 and DRO is pg: it bites "
        "with several steps per batch or stale data. Everything else as the grpo preset.",
    ),
)
registry.add(
    "gmpo",
    Preset(
        build=lambda: p.grpo_variant(
            "gmpo", objective="gmpo", gmpo_clip_low=0.4, gmpo_clip_high=0.4
        ),
        summary="grpo with the geometric mean of the token ratios (clipped in log space) as "
        "each response's ratio",
        paper="Zhao et al. 2025, Geometric-Mean Policy Optimization (GMPO, arXiv 2507.20673)",
        quotes=(
            Quote(
                "clip range (e^−0.4, e^0.4) on the token ratios", "behaviour.gmpo_clip_high", 0.4
            ),
        ),
        note="Only the objective differs from the grpo preset (docs/formulas.md §9).",
    ),
)
registry.add(
    "sao",
    Preset(
        build=p.sao_config,
        summary="single rollout + critic (K = 2) + adaptive GAE + async queue + direct ratio "
        "+ double-sided gate + staleness",
        paper="Hou et al., Single-Rollout Asynchronous Optimization for Agentic "
        "Reinforcement Learning",
        quotes=(
            Quote("one trajectory per prompt", "sampling.group_size", 1),
            Quote("K = 2 critic updates per actor update", "critic.updates_per_step", 2),
            Quote("λ_critic = 1.0", "credit.lam_critic", 1.0),
            Quote(
                "adaptive λ_policy with α = 1.5 on action-token length",
                "credit.adaptive_alpha",
                1.5,
            ),
            Quote("DIS band ε = (0.3, 5.0) for reasoning", "behaviour.gate_low", 0.3),
            Quote("DIS band ε = (0.8, 3.0) for coding"),
        ),
    ),
)
registry.add(
    "ppo",
    Preset(
        build=lambda: p.critic_ppo_config("ppo"),
        summary="verifier + critic + GAE + PPO clip + token mean (PPO for RLVR)",
        paper="Schulman et al. 2017, Proximal Policy Optimization Algorithms; Schulman et al. "
        "2016, High-Dimensional Continuous Control Using Generalized Advantage Estimation",
        quotes=(_PPO_CLIP, Quote("GAE λ = 0.95", "credit.lam", 0.95)),
    ),
)


def preset(name: str) -> RecipeConfig:
    """The config of preset ``name``; unknown names list the known presets."""
    return registry.get(name).build()


def paper_index_markdown() -> str:
    """docs/papers.md: each preset, its paper, and the quoted hyper-parameters."""
    lines = [
        "# Paper index",
        "",
        "Generated by `rlmap papers > docs/papers.md` from `src/rlmap/recipes/catalog.py`.",
        "Quoted values are the papers' (models of billions of parameters); `rlmap explain NAME`",
        "shows which of them the preset scaled for the embedded default.",
        "",
    ]
    for name in registry.names():
        entry = registry.get(name)
        lines += [f"## `{name}`", "", entry.summary + ".", "", f"Paper: {entry.paper}.", ""]
        lines += [f"- {q.text}" + (f" (`{q.field}`)" if q.field else "") for q in entry.quotes]
        if entry.note:
            lines += ["", f"Note: {entry.note}"]
        lines.append("")
    return "\n".join(lines)
