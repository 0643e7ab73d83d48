"""The learned reward model: Bradley–Terry loss, pairs, scoring, training, and its CLI."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlmap.cli import main
from rlmap.core.errors import InputError
from rlmap.embedded.tiny import TinySpec
from rlmap.embedded.warmstart import WarmStartSpec, warm_start
from rlmap.learned.preferences import make_pairs, wrong_answer
from rlmap.learned.reward_model import (
    Pair,
    RewardModelSpec,
    bradley_terry_loss,
    encode_pair_side,
    load_pairs,
    new_reward_model,
    score_batch,
    train_reward_model,
    write_pairs,
)
from rlmap.tasks.arithmetic import make_splits

# --- the loss ------------------------------------------------------------------------------


def test_bradley_terry_hand_case() -> None:
    # margins 2 and −1: −log σ(2) = log(1 + e^−2) = 0.126928; −log σ(−1) = log(1 + e) = 1.313262
    loss = bradley_terry_loss(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 1.0]))
    assert float(loss) == pytest.approx((0.126928 + 1.313262) / 2, abs=1e-6)


@given(
    st.lists(st.tuples(st.floats(-30, 30), st.floats(-30, 30)), min_size=1, max_size=20),
    st.floats(-100, 100),
)
def test_bradley_terry_matches_a_reference_loop_and_ignores_a_shared_shift(
    pairs: list[tuple[float, float]], shift: float
) -> None:
    c = torch.tensor([p[0] for p in pairs], dtype=torch.float64)
    r = torch.tensor([p[1] for p in pairs], dtype=torch.float64)
    reference = sum(
        math.log1p(math.exp(-(a - b))) if a - b > -30 else -(a - b) for a, b in pairs
    ) / len(pairs)
    assert float(bradley_terry_loss(c, r)) == pytest.approx(reference, rel=1e-6, abs=1e-9)
    shifted = bradley_terry_loss(c + shift, r + shift)  # only the margin matters
    assert float(shifted) == pytest.approx(float(bradley_terry_loss(c, r)), rel=1e-6, abs=1e-9)


# --- pairs -----------------------------------------------------------------------------------


@given(st.integers(0, 10**6), st.integers(0, 2**32))
def test_a_wrong_answer_is_never_the_answer(value: int, seed: int) -> None:
    answer = str(value)
    assert wrong_answer(answer, random.Random(seed)) != answer


def test_label_noise_flips_that_fraction_of_pairs() -> None:
    train, _ = make_splits(0, 200, 10, max_digits=2, ops="+")
    answers = {e.prompt: e.answer for e in train}
    clean = make_pairs(train, 1000, 0.0, random.Random(0))
    assert all(p.chosen == answers[p.prompt] for p in clean)
    noisy = make_pairs(train, 1000, 0.3, random.Random(0))
    flipped = sum(p.rejected == answers[p.prompt] for p in noisy) / len(noisy)
    assert 0.25 < flipped < 0.35


def test_pairs_round_trip_and_a_bad_line_is_named(tmp_path: Path) -> None:
    pairs = [Pair("1+1=", "2", "3"), Pair("2+2=", "4", "5")]
    write_pairs(tmp_path / "p.jsonl", pairs)
    assert load_pairs(tmp_path / "p.jsonl") == pairs
    (tmp_path / "bad.jsonl").write_text(
        '{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n{"prompt": "1+1=", "chosen": "2"}\n'
    )
    with pytest.raises(InputError, match=r"bad\.jsonl:2: missing field 'rejected'"):
        load_pairs(tmp_path / "bad.jsonl")


# --- scoring and training ------------------------------------------------------------------


def test_scores_do_not_depend_on_padding(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = new_reward_model(tiny_model_dir)
    rows = [encode_pair_side(tokenizer, "1+2=", "3"), encode_pair_side(tokenizer, "37+85=", "122")]
    together = score_batch(model, rows, int(tokenizer.pad_token_id))
    alone = torch.cat([score_batch(model, [r], int(tokenizer.pad_token_id)) for r in rows])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


SMALL_WARM_START = WarmStartSpec(
    max_digits=1,
    train_size=80,
    eval_size=20,
    steps=300,
    blur_steps=0,
    batch_size=64,
    model=TinySpec(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    ),
)


def test_bradley_terry_reaches_high_heldout_accuracy_on_noise_free_embedded_pairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1-digit addition keeps it to seconds: a warm start that knows the sums, then pairs
    # (correct vs plausible wrong answer) on 80 training prompts, judged on 20 unseen ones.
    monkeypatch.setenv("RLMAP_CACHE", str(tmp_path))
    base = warm_start(SMALL_WARM_START)
    train, heldout = make_splits(0, 80, 20, max_digits=1, ops="+")
    rng = random.Random(0)
    train_pairs, heldout_pairs = (
        make_pairs(train, 2000, 0.0, rng),
        make_pairs(heldout, 200, 0.0, rng),
    )
    _, _, metrics = train_reward_model(
        base, train_pairs, heldout_pairs, RewardModelSpec(steps=200, lr=1e-3)
    )
    assert metrics["rm/heldout_accuracy_before"] < 0.7  # a new head knows nothing
    assert metrics["rm/heldout_accuracy"] >= 0.85


def test_reward_model_cli_writes_a_plain_transformers_model(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pairs = tmp_path / "pairs.jsonl"
    assert (
        main(
            [
                "reward-model",
                "pairs",
                "--out",
                str(pairs),
                "--n",
                "64",
                "--heldout",
                "16",
                "data.train_size=100",
                "data.eval_size=20",
            ]
        )
        == 0
    )
    heldout = tmp_path / "pairs.heldout.jsonl"
    assert len(load_pairs(pairs)) == 64 and len(load_pairs(heldout)) == 16
    out = tmp_path / "rm"
    args = ["--pairs", str(pairs), "--eval-pairs", str(heldout), "--base", str(tiny_model_dir)]
    assert main(["reward-model", "train", *args, "--out", str(out), "--steps", "3"]) == 0
    assert "rm/heldout_accuracy" in capsys.readouterr().out
    model = AutoModelForSequenceClassification.from_pretrained(out)
    assert model.config.num_labels == 1
    assert "rm/heldout_accuracy" in json.loads((out / "reward_model.json").read_text())
