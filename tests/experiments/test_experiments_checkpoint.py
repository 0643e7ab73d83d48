"""Checkpoints: plain-transformers loading, exact resume, atomicity under a crash, rotation,
what makes one damaged, and a full disk mid-write."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import math
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from rlmap.core.errors import InputError
from rlmap.embedded.tokenizer import build_tokenizer
from rlmap.experiments import checkpoint
from rlmap.experiments.checkpoint import (
    capture_rng,
    latest_checkpoint,
    list_checkpoints,
    save_checkpoint,
)
from rlmap.experiments.checkpoint_load import (
    RNG_SHAPE,
    Each,
    dataclass_shape,
    load_trainer_state,
    restore_optimizers,
    restore_rng,
    resume_point,
    shape_problem,
)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


def tiny_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def optim_for(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    return opt, sched


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any) -> None:
    """One update whose batch is drawn from the torch RNG (so RNG state matters)."""
    ids = torch.randint(4, 20, (2, 6))
    loss = model(input_ids=ids, labels=ids).loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()


def save(run: Path, step: int, model: Any, tok: Any, opt: Any, sched: Any, **kw: Any) -> Path:
    return save_checkpoint(
        run,
        step,
        model=model,
        tokenizer=tok,
        optimizers={"policy": opt},
        schedulers={"policy": sched},
        extra={"ledger": {"generated_tokens": step}},
        **kw,
    )


def tree_digest(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def test_checkpoint_loads_with_plain_transformers(tmp_path: Path, tokenizer: Any) -> None:
    model = tiny_model(tokenizer)
    opt, sched = optim_for(model)
    ckpt = save(tmp_path, 1, model, tokenizer, opt, sched)
    assert ckpt == tmp_path / "checkpoints" / "step_1"
    assert (ckpt / "model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(ckpt)
    loaded_tok = AutoTokenizer.from_pretrained(ckpt)
    ids = torch.tensor([tokenizer.encode("12+34=")])
    assert loaded_tok.encode("12+34=") == tokenizer.encode("12+34=")
    assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_extra_models_saved_in_subdirectories(tmp_path: Path, tokenizer: Any) -> None:
    model, critic = tiny_model(tokenizer, 0), tiny_model(tokenizer, 1)
    opt, sched = optim_for(model)
    ckpt = save(tmp_path, 1, model, tokenizer, opt, sched, extra_models={"critic": critic})
    loaded = AutoModelForCausalLM.from_pretrained(ckpt / "critic")
    assert torch.equal(loaded.lm_head.weight, critic.lm_head.weight)
    with pytest.raises(ValueError, match="plain directory name"):
        save(tmp_path, 2, model, tokenizer, opt, sched, extra_models={"../x": critic})


def test_resume_restores_optimizer_scheduler_and_rng_exactly(
    tmp_path: Path, tokenizer: Any
) -> None:
    model = tiny_model(tokenizer)
    opt, sched = optim_for(model)
    random.seed(1)
    np.random.seed(1)
    train_step(model, opt, sched)
    ckpt = save(tmp_path, 1, model, tokenizer, opt, sched)
    # what the uninterrupted run draws and computes next (draws first, then one step)
    expected_draws = (torch.rand(4), random.random(), np.random.rand(3))
    train_step(model, opt, sched)
    expected_params = [p.detach().clone() for p in model.parameters()]

    resumed = AutoModelForCausalLM.from_pretrained(ckpt)
    opt2, sched2 = optim_for(resumed)
    state = load_trainer_state(ckpt)
    restore_optimizers(state, optimizers={"policy": opt2}, schedulers={"policy": sched2})
    restore_rng(state)
    assert state["step"] == 1 and state["extra"] == {"ledger": {"generated_tokens": 1}}
    assert sched2.last_epoch == 1
    draws = (torch.rand(4), random.random(), np.random.rand(3))
    assert torch.equal(draws[0], expected_draws[0]) and draws[1] == expected_draws[1]
    np.testing.assert_array_equal(draws[2], expected_draws[2])

    train_step(resumed, opt2, sched2)  # samples the same batch as the uninterrupted run
    for got, want in zip(resumed.parameters(), expected_params, strict=True):
        assert torch.equal(got, want)


def test_restore_optimizers_rejects_mismatched_names(tmp_path: Path, tokenizer: Any) -> None:
    model = tiny_model(tokenizer)
    opt, sched = optim_for(model)
    state = load_trainer_state(save(tmp_path, 1, model, tokenizer, opt, sched))
    with pytest.raises(ValueError, match="saved \\['policy'\\], given \\['critic'\\]"):
        restore_optimizers(state, optimizers={"critic": opt}, schedulers={"policy": sched})


def test_failed_save_leaves_previous_checkpoint_and_no_step_dir(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_model(tokenizer)
    opt, sched = optim_for(model)
    first = save(tmp_path, 1, model, tokenizer, opt, sched)
    before = tree_digest(first)

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("power cut")  # after the weights and tokenizer are written

    monkeypatch.setattr(checkpoint.torch, "save", crash)
    with pytest.raises(RuntimeError, match="power cut"):
        save(tmp_path, 2, model, tokenizer, opt, sched)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_1"]
    assert latest_checkpoint(tmp_path) == first
    assert tree_digest(first) == before
    assert load_trainer_state(first)["step"] == 1


def test_killed_save_leaves_only_an_ignored_tmp_dir_that_is_cleaned_later(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_model(tokenizer)
    opt, sched = optim_for(model)
    first = save(tmp_path, 1, model, tokenizer, opt, sched)
    with monkeypatch.context() as patch:  # kill -9 mid-save: no cleanup handler runs
        patch.setattr(checkpoint.os, "replace", _raise)
        patch.setattr(checkpoint.shutil, "rmtree", lambda *a, **k: None)
        with pytest.raises(RuntimeError):
            save(tmp_path, 2, model, tokenizer, opt, sched)
    (leftover,) = (tmp_path / "checkpoints").glob(".tmp-*")
    assert (leftover / "model.safetensors").exists()  # half a checkpoint, out of sight
    assert latest_checkpoint(tmp_path) == first
    assert list_checkpoints(tmp_path) == [first]
    dead = leftover.with_name(".tmp-step_2-999999999")  # as if left by a dead process
    leftover.rename(dead)
    second = save(tmp_path, 2, model, tokenizer, opt, sched)
    assert latest_checkpoint(tmp_path) == second and not dead.exists()


def _raise(*args: object, **kwargs: object) -> None:
    raise RuntimeError("killed")


def test_rotation_keeps_the_newest_and_never_overwrites(tmp_path: Path, tokenizer: Any) -> None:
    model = tiny_model(tokenizer)
    opt, sched = optim_for(model)
    for step in (1, 2, 9, 10):  # 10 after 9: numeric order, not string order
        save(tmp_path, step, model, tokenizer, opt, sched, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_10", "step_9"]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_10"
    save(tmp_path, 11, model, tokenizer, opt, sched, keep=1)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_11"]
    with pytest.raises(FileExistsError):
        save(tmp_path, 11, model, tokenizer, opt, sched)
    with pytest.raises(ValueError, match="keep"):
        save(tmp_path, 12, model, tokenizer, opt, sched, keep=0)


def test_latest_checkpoint_of_a_run_without_any(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    (tmp_path / "checkpoints" / ".tmp-step_3-1").mkdir(parents=True)
    assert latest_checkpoint(tmp_path) is None


# --- issue 27: a checkpoint missing a field is damaged; a full disk names the checkpoint ----


@dataclasses.dataclass(frozen=True)
class _Inner:
    level: int = 0
    recent: tuple[float, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Outer:
    step: int = 0
    beta: float | None = None
    ev: float = 0.0
    inner: _Inner | None = None


def test_a_dataclass_shape_requires_every_field_typed_by_its_annotation() -> None:
    shape = dataclass_shape(_Outer)
    saved = dataclasses.asdict(_Outer(step=3, beta=0.5, ev=-math.inf, inner=_Inner(2, (1.0,))))
    assert shape_problem(saved, shape) is None
    assert shape_problem(saved | {"ev": 2}, shape) is None  # an int where a float goes: fine
    assert shape_problem(saved | {"beta": None, "inner": None}, shape) is None  # X | None
    assert shape_problem({k: v for k, v in saved.items() if k != "ev"}, shape) == "ev: missing"
    assert shape_problem(saved | {"step": "3"}, shape) == "step: expected int, got str"
    assert shape_problem(saved | {"inner": {"level": 1}}, shape) == "inner.recent: missing"
    assert shape_problem(saved | {"inner": 1}, shape) == "inner: expected a dict, got int"


def test_shape_problem_names_the_dotted_field_and_the_list_item() -> None:
    shape = {"extra": {"ranks": Each({"torch": torch.Tensor})}, "opt": (list, tuple)}
    ok = {"extra": {"ranks": [{"torch": torch.zeros(1)}]}, "opt": (), "more": 1}
    assert shape_problem(ok, shape) is None  # fields beyond the shape are allowed
    assert shape_problem({"opt": []}, shape) == "extra: missing"
    assert (
        shape_problem(ok | {"extra": {"ranks": [{"torch": torch.zeros(1)}, {}]}}, shape)
        == "extra.ranks[1].torch: missing"
    )
    assert shape_problem(ok | {"opt": {}}, shape) == "opt: expected list or tuple, got dict"
    assert shape_problem(ok | {"extra": []}, shape) == "extra: expected a dict, got list"


def test_resume_point_skips_a_state_lacking_a_field_for_the_newest_intact_one(
    tmp_path: Path, tokenizer: Any
) -> None:
    model = tiny_model(tokenizer)
    opt, sched = optim_for(model)
    first, second = (save(tmp_path, step, model, tokenizer, opt, sched) for step in (1, 2))
    state = load_trainer_state(second)
    del state["extra"]["ledger"]["generated_tokens"]
    torch.save(state, second / "trainer_state.pt")
    needs = {"extra": {"ledger": {"generated_tokens": int}}}
    ckpt, saved, damaged = resume_point(tmp_path, (), lambda s: shape_problem(s, needs))
    assert ckpt == first and saved is not None and saved["step"] == 1
    assert damaged == [
        (second, f"{second}/trainer_state.pt: extra.ledger.generated_tokens: missing")
    ]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_1", "step_2"]
    with pytest.raises(InputError, match=r"step_2/trainer_state.pt: nowhere: missing; no intact"):
        resume_point(tmp_path, (), lambda s: shape_problem(s, {"nowhere": int}))  # none intact


def test_capture_rng_always_holds_the_states_a_resume_requires() -> None:
    assert shape_problem(capture_rng(), RNG_SHAPE) is None


def _full_disk_in(where: str) -> Callable[..., None]:
    """A write that fails as it does on a full disk: torch.save, writing to a Python file,
    raises a RuntimeError over the file's OSError; safetensors (Rust) quotes the OS error."""

    def fail(*args: object, **kwargs: object) -> None:
        if where == "torch.save":
            try:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError:  # chained implicitly (__context__), as torch's is
                raise RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos")  # noqa: B904
        raise RuntimeError(
            f"Error while serializing: I/O error: No space left on device (os error {errno.ENOSPC})"
        )

    return fail


@pytest.mark.parametrize("where", ["torch.save", "save_pretrained"])
def test_a_full_disk_mid_checkpoint_names_the_checkpoint_and_keeps_the_previous(
    where: str, tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: internal error (SafetensorError: ... No space left on device), naming no path.
    model = tiny_model(tokenizer)
    opt, sched = optim_for(model)
    first = save(tmp_path, 1, model, tokenizer, opt, sched)
    before = tree_digest(first)
    if where == "torch.save":
        monkeypatch.setattr(checkpoint.torch, "save", _full_disk_in(where))
    else:
        monkeypatch.setattr(model, "save_pretrained", _full_disk_in(where))
    with pytest.raises(OSError) as err:
        save(tmp_path, 2, model, tokenizer, opt, sched)
    assert err.value.errno == errno.ENOSPC and err.value.strerror == os.strerror(errno.ENOSPC)
    assert err.value.filename == str(tmp_path / "checkpoints" / "step_2")
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_1"]  # no .tmp-*
    assert tree_digest(first) == before
