"""Stop strings, tool calls in the model's format, and token in / token out with a BPE tokenizer."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from chat_model import (
    QUESTION,
    RESULT,
    SPEC,
    chat_tokenizer,
    check_token_in_token_out,
    scripted_model,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmap.assembly.data import check_prompt_lengths
from rlmap.assembly.embedded import warm_start_spec
from rlmap.assembly.environments import environment_factory
from rlmap.core.batch import End, RewardStatus
from rlmap.embedded.tiny import build_tiny_model
from rlmap.embedded.tokenizer import CHATML
from rlmap.engines.engine import (
    Completion,
    StopStrings,
    cut_at_stop_strings,
    stop_string_end,
)
from rlmap.engines.hf import HFEngine
from rlmap.engines.hf_sampling import TextStop
from rlmap.recipes import build_config
from rlmap.rollout.episodes import run_episodes
from rlmap.tasks.arithmetic import Example, make_problem
from rlmap.tasks.calculator import calculator_tool, calls_in_json, demonstration
from rlmap.tasks.prompts import encode_prompt
from rlmap.tasks.sources.builtin import check_calculator
from rlmap.tasks.tool_calls import (
    CLOSE,
    ToolEnv,
    decoder,
    observation_ids,
    observation_text,
    parse_tool_call,
    run_tool,
)

PIECES = ["ab", "c", "</", "x", ">", "", "de", "</x>"]
"""A toy vocabulary for the stop-string arithmetic: id k decodes to PIECES[k]."""


def toy_decode(ids: list[int]) -> str:
    return "".join(PIECES[i] for i in ids)


TOY = StopStrings(("</x>",), toy_decode)


def test_a_stop_string_ends_at_the_token_that_completes_it() -> None:
    # "ab" "c" "</" "x" ">" → text "abc</x>": "</x>" is first whole after the 5th token
    assert stop_string_end(TOY, [0, 1, 2, 3, 4, 0]) == 5
    # the string inside one token: complete after that token (the 2nd)
    assert stop_string_end(TOY, [1, 7, 2, 3, 4]) == 2
    # an empty piece between: "</" "" "x" ">" still completes at ">" (the 4th)
    assert stop_string_end(TOY, [2, 5, 3, 4]) == 4
    assert stop_string_end(TOY, [2, 3, 0, 4]) is None  # "</xab>": never whole
    assert stop_string_end(TOY, []) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, len(PIECES) - 1), max_size=12))
def test_the_bisection_finds_what_a_scan_of_every_prefix_finds(ids: list[int]) -> None:
    scan = next((k for k in range(1, len(ids) + 1) if "</x>" in toy_decode(ids[:k])), None)
    assert stop_string_end(TOY, ids) == scan


def completion(ids: Sequence[int], stopped: bool = False, routes: bool = False) -> Completion:
    n = len(ids)
    routed = torch.arange(2 + n)[:, None, None] if routes else None
    return Completion(
        prompt_ids=(9, 9),
        response_ids=tuple(ids),
        logprobs=tuple(-0.1 * (k + 1) for k in range(n)),
        stopped=stopped,
        version=3,
        routes=routed,
    )


def test_a_completion_is_cut_after_its_stop_string_ids_logprobs_and_routes_alike() -> None:
    c = cut_at_stop_strings(completion([0, 2, 3, 4, 1, 6], routes=True), TOY)
    assert c.response_ids == (0, 2, 3, 4) and c.stopped and c.version == 3
    assert c.logprobs == pytest.approx((-0.1, -0.2, -0.3, -0.4))
    assert c.routes is not None and c.routes.flatten().tolist() == [0, 1, 2, 3, 4, 5]  # 2 + 4
    plain = completion([0, 1, 6])
    assert cut_at_stop_strings(plain, TOY) is plain and cut_at_stop_strings(plain, None) is plain
    assert not plain.stopped  # ran to the token limit: stays unstopped


def test_text_stop_ends_only_rows_whose_recent_response_tokens_hold_the_string() -> None:
    # prompt columns (width 2) hold "</x>" in row 0: the prompt never stops a row
    rows = torch.tensor([[7, 1, 0, 1], [0, 0, 2, 3], [0, 0, 1, 7]])
    stops = TextStop(TOY, width=2)
    assert stops(rows[:, :3], None).tolist() == [False, False, False]
    assert stops(torch.cat([rows, torch.tensor([[4], [4], [0]])], 1), None).tolist() == [
        False,
        True,
        True,
    ]


def test_a_tool_call_is_json_in_the_tags_and_anything_else_is_an_error() -> None:
    call = {"name": "calculator", "arguments": {"expression": "2*3"}}
    assert parse_tool_call(f"ok <tool_call>{json.dumps(call)}</tool_call>") == (
        "calculator",
        {"expression": "2*3"},
    )
    wire = {"name": "calculator", "arguments": json.dumps({"expression": "2*3"})}
    assert parse_tool_call(f"<tool_call>{json.dumps(wire)}</tool_call>")[1] == {"expression": "2*3"}
    tools = {"calculator": calculator_tool}
    assert run_tool(tools, f"<tool_call>{json.dumps(call)}</tool_call>") == ("6", False)
    for bad, why in [
        ("<tool_call>{'name': 1}</tool_call>", "not JSON"),
        ('<tool_call>["calculator"]</tool_call>', '"name"'),
        ('<tool_call>{"name": "calculator", "arguments": 3}</tool_call>', "an object"),
        ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', "no tool named 'search'"),
        (
            '<tool_call>{"name": "calculator", "arguments": {"expression": "2/0"}}</tool_call>',
            "error: cannot evaluate '2/0'",
        ),
        (
            '<tool_call>{"name": "calculator", "arguments": {"x": "1"}}</tool_call>',
            "calculator: missing a required argument: 'expression'",
        ),
        ("no call </tool_call>", "no <tool_call>"),
    ]:
        shown, failed = run_tool(tools, bad)
        assert failed and shown.startswith("error: ") and why in shown, (bad, shown)


def test_a_tool_that_breaks_is_an_infrastructure_failure_not_the_models() -> None:
    def search(query: str) -> str:
        """Look a query up.

        Args:
            query: what to look up
        """
        if query == "down":
            raise ConnectionError("the index is down")
        return int("not a number")  # type: ignore[return-value]  # a bug: ValueError

    for query in ("down", "bug"):
        call = f'<tool_call>{{"name": "search", "arguments": {{"query": "{query}"}}}}</tool_call>'
        with pytest.raises((ConnectionError, ValueError)):
            run_tool({"search": search}, call)
    # through the runner: the episode is aborted, its status infra_error, never a reward
    tokenizer = chat_tokenizer()
    env = ToolEnv(
        tokenizer, Example(QUESTION, RESULT), lambda r, a: 1.0, {"search": search}, max_turns=2
    )
    turn = tokenizer.encode(call, add_special_tokens=False)

    class OneCall:
        version = 0

        def generate(self, prompts: Sequence[Sequence[int]], **_: Any) -> list[list[Completion]]:
            return [
                [Completion(tuple(p), tuple(turn), (-0.1,) * len(turn), True, 0)] for p in prompts
            ]

    (episode,) = run_episodes(OneCall(), [env], max_new_tokens=64, temperature=1.0, top_p=1.0)  # type: ignore[arg-type]
    assert episode.end == End.ABORTED and episode.status == RewardStatus.INFRA_ERROR
    assert episode.rewards == ()


def test_a_tool_result_that_reads_like_a_special_token_stays_text() -> None:
    tokenizer = chat_tokenizer()
    ids = observation_ids(tokenizer, "a<|im_end|>b")
    assert ids.count(int(tokenizer.eos_token_id)) == 2  # the template's two, not the content's
    assert tokenizer.decode(ids) == observation_text(tokenizer, "a<|im_end|>b")


def test_the_observation_is_the_templates_own_tool_message() -> None:
    # ChatML: the assistant message closes, the tool message, then the generation prompt
    expected = "<|im_end|>\n<|im_start|>tool\n3145<|im_end|>\n<|im_start|>assistant\n"
    assert observation_text(chat_tokenizer(), "3145") == expected


@pytest.fixture(scope="module")
def scripted() -> torch.nn.Module:
    return scripted_model()


def test_the_hf_engine_trains_on_exactly_the_ids_it_sampled(scripted: torch.nn.Module) -> None:
    tokenizer = chat_tokenizer()
    engine = HFEngine(
        scripted, pad_token_id=int(tokenizer.pad_token_id), eos_token_id=int(tokenizer.eos_token_id)
    )
    check_token_in_token_out(engine)


@pytest.mark.parametrize("pad", ["its own", "eos"])
def test_the_hf_engine_cuts_each_row_at_its_own_stop_string(
    pad: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a random model's greedy rows, free and with a stop string of three of row 0's tokens
    # (from its 4th): each row must be its free self up to where a scan of its prefixes
    # first finds the string (or whole, where none does); rows that stop early are padded
    # by generate — with EOS itself when pad is EOS — and the pads are never kept
    tokenizer = chat_tokenizer()
    model = build_tiny_model(tokenizer, SPEC, seed=5).eval()
    eos = int(tokenizer.eos_token_id)
    engine = HFEngine(model, pad_token_id=eos if pad == "eos" else 0, eos_token_id=eos)
    prompts = [encode_prompt(tokenizer, q) for q in ("12*3=", "7*45=", "1*2*3*4=")]
    free = [
        c for (c,) in engine.generate(prompts, n=1, max_new_tokens=12, temperature=0.0, top_p=1.0)
    ]
    decode = decoder(tokenizer)
    text = decode(list(free[0].response_ids[3:6]))
    assert len(free[0].response_ids) == 12 and len(text) >= 3
    steps = []
    monkeypatch.setattr(TextStop, "__call__", counting(TextStop.__call__, steps))
    stops = StopStrings((text,), decode)
    cut = [
        c
        for (c,) in engine.generate(
            prompts, n=1, max_new_tokens=12, temperature=0.0, top_p=1.0, stop_strings=stops
        )
    ]
    for f, c in zip(free, cut, strict=True):
        n = len(f.response_ids)
        scan = next((k for k in range(1, n + 1) if text in decode(list(f.response_ids[:k]))), None)
        end = n if scan is None else scan
        assert c.response_ids == f.response_ids[:end] and c.stopped == (
            scan is not None or f.stopped
        )
        assert c.logprobs == pytest.approx(f.logprobs[:end], abs=1e-5)
    assert steps  # generate asked the stop criterion at each step


def counting(method: Any, calls: list[int]) -> Any:
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return method(self, *args, **kwargs)

    return wrapped


def test_a_malformed_call_is_a_tool_error_and_the_episode_goes_on() -> None:
    tokenizer = chat_tokenizer()
    env = ToolEnv(
        tokenizer,
        Example(QUESTION, RESULT),
        lambda r, a: 1.0,
        {"calculator": calculator_tool},
        max_turns=2,
    )
    env.reset()
    bad = tokenizer.encode('<tool_call>{"name": calculator}</tool_call>', add_special_tokens=False)
    step = env.step(bad)
    assert step.tool_call and step.tool_error and not (step.terminated or step.truncated)
    assert tokenizer.decode(list(step.observation)).startswith(
        "<|im_end|>\n<|im_start|>tool\nerror: the call is not JSON"
    )
    again = env.step(bad)  # the second of two turns: the budget is spent
    assert again.tool_error and again.truncated


def test_a_call_whose_completing_token_goes_on_is_still_a_call() -> None:
    """The engine cuts a turn at the token that completes ``</tool_call>``; that token may
    hold more text (``>{"`` is one token of the chat tokenizer), so the turn's text need
    not end with the tag: the call is still run, not scored as an answer."""
    tokenizer = chat_tokenizer()
    env = ToolEnv(
        tokenizer,
        Example(QUESTION, RESULT),
        lambda r, a: 1.0,
        {"calculator": calculator_tool},
        max_turns=2,
    )
    env.reset()
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "37*85"}}</tool_call'
    (goes_on,) = tokenizer.encode('>{"', add_special_tokens=False)
    turn = [*tokenizer.encode(call, add_special_tokens=False), goes_on]
    assert not tokenizer.decode(turn).endswith(CLOSE)
    step = env.step(turn)
    assert step.tool_call and not step.tool_error and not (step.terminated or step.truncated)
    assert "\n3145<|im_end|>" in tokenizer.decode(list(step.observation))


def test_the_chat_tokenizer_is_rebuilt_the_same_and_spells_the_tags_in_several_tokens() -> None:
    from rlmap.embedded.tokenizer import CHATML, build_bpe_tokenizer
    from rlmap.embedded.warmstart import CHAT_VOCAB, chat_corpus

    tokenizer = chat_tokenizer()
    again = build_bpe_tokenizer(chat_corpus(), vocab_size=CHAT_VOCAB)
    assert tokenizer.backend_tokenizer.to_str() == again.backend_tokenizer.to_str()
    assert 256 + 3 < len(tokenizer) <= CHAT_VOCAB and tokenizer.chat_template == CHATML
    assert (tokenizer.pad_token_id, tokenizer.eos_token) == (0, "<|im_end|>")
    assert len(tokenizer.encode(CLOSE, add_special_tokens=False)) > 1
    prompt = encode_prompt(tokenizer, "37*85=")
    assert tokenizer.decode(prompt) == "<|im_start|>user\n37*85=<|im_end|>\n<|im_start|>assistant\n"


def test_the_chat_tokenizer_reads_back_with_plain_transformers_as_it_was_built(
    tmp_path: Path,
) -> None:
    # AutoTokenizer loads a qwen2 model's tokenizer as Qwen2Tokenizer, which rebuilds the
    # pre-tokenizer from its own rules: a BPE with other rules came back splitting "42"
    # into "4" "2" where it had been trained on "42" (other ids for the same text)
    from transformers import AutoTokenizer

    from rlmap.embedded.warmstart import chat_corpus

    tokenizer = chat_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    texts = [*chat_corpus()[:600], "a<|im_end|>b  c\n\n x", "déjà 42 · 7"]
    assert [loaded.encode(x, add_special_tokens=False) for x in texts] == [
        tokenizer.encode(x, add_special_tokens=False) for x in texts
    ]
    messages = [{"role": "user", "content": "37*85="}]
    assert loaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    )
    assert (loaded.eos_token, loaded.pad_token) == ("<|im_end|>", "<|endoftext|>")


def test_a_chat_demonstration_calls_the_tool_in_json_and_reads_the_templates_message() -> None:
    tokenizer = chat_tokenizer()
    segments = demonstration(tokenizer, make_problem(37, "*", 85), "3145", use_tool=True)
    assert [tokenizer.decode(ids) for ids, _ in segments] == [
        '<tool_call>{"name": "calculator", "arguments": {"expression": "37*85"}}</tool_call>',
        "<|im_end|>\n<|im_start|>tool\n3145<|im_end|>\n<|im_start|>assistant\n",
        "3145<|im_end|>",
    ]
    assert [trained for _, trained in segments] == [True, False, True]
    (direct,) = demonstration(tokenizer, make_problem(37, "*", 85), "3145", use_tool=False)
    assert tokenizer.decode(direct[0]) == "3145<|im_end|>"


def test_the_calculator_task_on_a_chat_model_is_the_tool_env() -> None:
    cfg = build_config("ppo", None, ["data.task=calculator", "model.path=embedded:tiny-chat"])
    env = environment_factory(cfg, chat_tokenizer())(make_problem(37, "*", 85))
    assert isinstance(env, ToolEnv) and env.stop_strings.strings == (CLOSE,)
    assert warm_start_spec(cfg).chat


def four_args() -> list[str]:
    return ["data.task=calculator", "generation.max_new_tokens=32", "data.max_turns=4"]


def test_the_calculator_on_a_chat_model_is_refused_up_front_where_it_cannot_work() -> None:
    from rlmap.core.errors import ConfigError
    from rlmap.embedded.tokenizer import build_tokenizer
    from rlmap.tasks.calculator import TOOL_TOKENS

    cfg = build_config("ppo", None, ["data.task=calculator", "model.path=embedded:tiny-chat"])
    # the default budget (16 tokens) cannot hold a call of 24
    with pytest.raises(ConfigError, match=r"^generation\.max_new_tokens: 16 tokens cannot hold"):
        check_calculator(cfg.data, cfg.generation.max_new_tokens, chat_tokenizer())
    wide = build_config("ppo", None, ["data.task=calculator", "generation.max_new_tokens=32"])
    # 24 + 2 fit in 32
    check_calculator(wide.data, wide.generation.max_new_tokens, chat_tokenizer(), 128)
    # prompt "99*99=" in ChatML is 14 tokens (digits one by one), a call 24, its tool
    # message for up to "-9999" 15 (5 of frame before, 5 after): 3 turns need
    # 14 + 2·(24 + 15) + 32 = 124 positions, 4 turns 14 + 3·39 + 32 = 163 > 128
    four = build_config(
        "ppo", None, ["data.task=calculator", "generation.max_new_tokens=32", "data.max_turns=4"]
    )
    with pytest.raises(ConfigError, match=r"^data\.max_turns: 4 turns .* up to 163 positions"):
        check_calculator(four.data, four.generation.max_new_tokens, chat_tokenizer(), 128)
    # in segments an episode need not fit, a call, its result and a turn must: 14 + 39 + 32 = 85
    for policy in ("truncate_oldest", "compact"):
        cut = build_config("ppo", None, [*four_args(), f"data.context_policy={policy}"])
        check_calculator(cut.data, cut.generation.max_new_tokens, chat_tokenizer(), 128)
        check_calculator(cut.data, cut.generation.max_new_tokens, chat_tokenizer(), 85)
        with pytest.raises(ConfigError, match=r"^data\.context_policy: .* up to 85 positions"):
            check_calculator(cut.data, cut.generation.max_new_tokens, chat_tokenizer(), 84)
    no_tool_role = chat_tokenizer()
    no_tool_role.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}"
        "{% endif %}{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(ConfigError, match=r"^model\.path: its chat template cannot show a tool"):
        check_calculator(wide.data, wide.generation.max_new_tokens, no_tool_role)
    markers = build_tokenizer(extra_tokens=TOOL_TOKENS)
    markers.chat_template = CHATML_LIKE
    assert not calls_in_json(markers)  # the markers are single tokens: <calc>…</calc>
    assert calls_in_json(chat_tokenizer())


CHATML_LIKE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n"
    "{% endfor %}<|im_end|>\n{% endif %}" + CHATML
)
"""ChatML that lists the tools' schemas in a system turn, as Qwen's template does."""


def test_a_chat_model_is_shown_the_calculators_schema_through_its_template() -> None:
    from rlmap.core.errors import ConfigError, InputError
    from rlmap.embedded.warmstart import sft_batch
    from rlmap.tasks.calculator import prompt_tools

    shows_tools = chat_tokenizer()
    shows_tools.chat_template = TOOLS_TEMPLATE
    cfg = build_config("ppo", None, ["data.task=calculator", "generation.max_new_tokens=32"])
    env = environment_factory(cfg, shows_tools)(make_problem(37, "*", 85))
    text = shows_tools.decode(env.reset())
    tools = json.loads(text.split("# Tools\n")[1].split("\n")[0])
    assert tools["function"]["name"] == "calculator"  # what the model is to call it
    assert tools["function"]["parameters"]["required"] == ["expression"]
    assert tools["function"]["description"] == "Evaluate an integer arithmetic expression."
    assert text.endswith("<|im_start|>user\n37*85=<|im_end|>\n<|im_start|>assistant\n")
    # the embedded template shows no tools: its prompts (and its measured run) are unchanged
    plain = chat_tokenizer()
    env = environment_factory(cfg, plain)(make_problem(37, "*", 85))
    assert (
        plain.decode(env.reset()) == "<|im_start|>user\n37*85=<|im_end|>\n<|im_start|>assistant\n"
    )
    # the schema counts against the context: 124 positions hold 3 turns without it (see
    # the test above), not with it
    check_calculator(cfg.data, cfg.generation.max_new_tokens, plain, 124)
    with pytest.raises(ConfigError, match=r"^data\.max_turns: 3 turns"):
        check_calculator(cfg.data, cfg.generation.max_new_tokens, shows_tools, 124)
    schemas = prompt_tools(shows_tools)
    fits = len(encode_prompt(shows_tools, "37*85=")) + 1  # room for a token without tools
    check_prompt_lengths([("row 0", "37*85=")], shows_tools, fits)
    with pytest.raises(InputError, match=r"^row 0: prompt of \d+ tokens"):
        check_prompt_lengths([("row 0", "37*85=")], shows_tools, fits, tools=schemas)
    # the warm start's demonstrations are prompted as the environment prompts
    ids, _, labels = sft_batch(
        shows_tools, [make_problem(37, "*", 85)], 0.0, random.Random(0), tool_demos=1.0
    )
    prompt = [int(i) for i, label in zip(ids[0], labels[0], strict=True) if label == -100]
    assert shows_tools.decode(prompt).startswith(text)  # then the observation's ids
    # a template that refuses tools is a one-line error, not a jinja traceback
    refuses = chat_tokenizer()
    refuses.chat_template = (
        "{% if tools %}{{ raise_exception('no tools here') }}{% endif %}" + CHATML
    )
    with pytest.raises(ConfigError, match=r"^model\.path: its chat template cannot show the calc"):
        check_calculator(cfg.data, cfg.generation.max_new_tokens, refuses)
    with pytest.raises(InputError, match=r"^the model: its chat template refuses a prompt"):
        check_prompt_lengths([("row 0", "37*85=")], refuses, 128, tools=schemas)


def test_a_tool_the_model_cannot_be_shown_is_refused_naming_it() -> None:
    from rlmap.tasks.tool_calls import tool_schemas

    def search(query: str) -> str:  # no docstring: no description of the tool or its query
        return query

    with pytest.raises(ValueError, match=r"^tool 'search': no schema to show the model"):
        tool_schemas({"search": search})
    with pytest.raises(ValueError, match=r"^tool 'search'"):
        ToolEnv(
            chat_tokenizer(),
            Example(QUESTION, RESULT),
            lambda r, a: 1.0,
            {"search": search},
            max_turns=2,
        )
