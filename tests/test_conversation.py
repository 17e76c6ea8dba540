"""litegpu.lm's conversations (``Engine.create_conversation``) against LiteRT-LM's own.

LiteRT-LM's ``Conversation`` (litert-lm-api, run in the exporter's environment: it is not a
dependency of litegpu) on the exported bundles, greedy: the same replies, turn after turn,
with the bundle's prompt templates, a system message, a reply ended by a stop token, and a
Jinja template given to the conversation. The rest are litegpu's own checks: the template
made from prompt templates, messages' forms, a hostile template, streaming, misuse.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import pytest

from litegpu.errors import InvalidArgumentError, ResourceLimitError
from litegpu.lm import Bundle, Engine, PromptAffixes, PromptTemplates, SamplerConfig, TokenUnion
from litegpu.lm.conversation import ChatTemplate, default_chat_template, normalize_message
from litegpu.testing.lm_bundle import BundleWriter

GREEDY = SamplerConfig(top_k=1)

LITERT_LM = '''
import json, sys
import litert_lm
litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
path, case = sys.argv[1], json.loads(sys.argv[2])
with litert_lm.Engine(path, backend=litert_lm.Backend.CPU(thread_count=2), max_num_tokens=case["max_num_tokens"]) as engine:
    options = {k: case[k] for k in ("system_message", "chat_template") if case.get(k)}
    with engine.create_conversation(sampler_config=litert_lm.SamplerConfig(top_k=1),
                                    max_output_tokens=case["max_output_tokens"], **options) as chat:
        print(json.dumps([chat.send_message(turn).to_json() for turn in case["turns"]]))
'''

# A template that prints each message's content as it is given (LiteRT-LM gives it as a
# list of items, which prints as JSON).
BRACKETS = ("{%- for message in messages -%}{{ '[' + message['role'] + '] ' }}{{ message['content'] }}{{ '\\n' }}"
            "{%- endfor -%}{%- if add_generation_prompt -%}{{ '[model] ' }}{%- endif -%}")


def _litert_lm(python, tmp_path, bundle, case: dict) -> list[dict]:
    script = tmp_path / "litert_lm_conversation.py"
    script.write_text(LITERT_LM)
    run = subprocess.run([str(python), str(script), str(bundle), json.dumps(case)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _litegpu(bundle, case: dict) -> list[dict]:
    with Engine(bundle, max_num_tokens=case["max_num_tokens"]) as engine, engine.create_conversation(
            sampler_config=GREEDY, max_output_tokens=case["max_output_tokens"],
            system_message=case.get("system_message"), chat_template=case.get("chat_template")) as chat:
        return [chat.send_message(turn) for turn in case["turns"]]


def _stopping_bundle(source, path, piece: str):
    """``source`` with ``piece`` made a stop token too (the tiny random model says it often)."""
    bundle = Bundle.open(source)
    tok = bundle.tokenizer()
    meta = dataclasses.replace(bundle.metadata, stop_tokens=bundle.metadata.stop_tokens
                               + (TokenUnion(ids=(tok.piece_to_id(piece),)),))
    writer = BundleWriter()
    writer.model(bytes(bundle.model_bytes()))
    writer.sentencepiece(bytes(bundle.data(bundle.find("SP_Tokenizer")[0])))
    writer.llm_metadata(meta)
    return writer.write(path)


@pytest.mark.parametrize("case", [
    {"turns": ["What is the cpu backend?", "and the gpu?", "why?"], "max_output_tokens": 20},
    {"turns": ["Hello there", "tell me more"], "max_output_tokens": 16, "system_message": "You are terse."},
    {"turns": ["What is the cpu backend?", "and the gpu?", "why?", "ok"], "max_output_tokens": 20, "stop": "ok"},
    {"turns": ["Hello there"], "max_output_tokens": 16, "system_message": "You are terse.", "chat_template": BRACKETS},
], ids=["three-turns", "system-message", "replies-ended-by-a-stop-token", "jinja-template-printing-content"])
def test_a_conversation_replies_what_litert_lm_s_conversation_replies(case, tmp_path, decoder, litert_lm_python):
    """Each turn's text is rendered with the template (the bundle's prompt templates made a
    Jinja template, or the one given), the first after the system message and the start
    token, each later one after the tokens the model generated (a stop token included)."""
    bundle = decoder("llama_f32_comp", ".litertlm")
    if "stop" in case:
        bundle = _stopping_bundle(bundle, tmp_path / "stopping.litertlm", case["stop"])
    case = {**case, "max_num_tokens": 128}
    want = _litert_lm(litert_lm_python, tmp_path, bundle, case)
    got = _litegpu(bundle, case)
    assert got == want
    assert all(reply["role"] == "assistant" and reply["content"][0]["text"] for reply in got)
    if "stop" in case:     # (some replies did end at the stop token, before the limit)
        assert any(len(reply["content"][0]["text"].split()) < 4 for reply in got)


def test_the_default_template_wraps_each_role_in_its_affixes():
    templates = PromptTemplates(user=PromptAffixes("<u>", "</u>\n"), model=PromptAffixes("<m>", "</m>\n"),
                                system=PromptAffixes("<s>", "</s>\n"))
    template = ChatTemplate(default_chat_template(templates))
    messages = [normalize_message("be brief", "system"), normalize_message("hi"),
                normalize_message({"role": "assistant", "content": "hello"}),
                normalize_message({"content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]})]
    assert template.render(messages, add_generation_prompt=True) == \
        "<s>be brief</s>\n<u>hi</u>\n<m>hello</m>\n<u>a b</u>\n<m>"
    assert template.render(messages[:2], add_generation_prompt=False) == "<s>be brief</s>\n<u>hi</u>\n"
    # A role without affixes (no system prompt template) adds nothing; quotes and newlines survive.
    bare = ChatTemplate(default_chat_template(PromptTemplates(user=PromptAffixes("'\\\n", ""))))
    assert bare.render([normalize_message("x", "system"), normalize_message("y")], True) == "x'\\\ny"


@pytest.mark.parametrize("message, why", [
    (42, "a string or a mapping"), ({"role": "user"}, "a string or a mapping with 'content'"),
    ({"content": [{"type": "image", "blob": b""}]}, "text messages only"), ({"content": ["x"]}, "items with a 'type'"),
])
def test_a_message_of_the_wrong_form_is_named(message, why):
    with pytest.raises(InvalidArgumentError, match=why):
        normalize_message(message)


@pytest.mark.parametrize("source, why", [
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "failed"),       # the sandbox
    ("{% for %}", "does not compile"),
    ("{{ raise_exception('no system role') }}", "refused the messages: no system role"),
])
def test_a_bad_or_hostile_template_is_a_clear_error(source, why):
    with pytest.raises(InvalidArgumentError, match=why):
        ChatTemplate(source).render([normalize_message("hi")], True)


def test_streaming_gives_the_reply_token_by_token_and_the_conversation_goes_on(decoder):
    bundle = decoder("llama_f32_comp", ".litertlm")
    with Engine(bundle, max_num_tokens=128) as engine:
        with engine.create_conversation(sampler_config=GREEDY, max_output_tokens=12) as chat:
            whole = chat.send_message("What is the cpu backend?")
            second = chat.send_message("and the gpu?")
        with engine.create_conversation(sampler_config=GREEDY, max_output_tokens=12) as chat:
            chunks = list(chat.send_message_async("What is the cpu backend?"))
            assert len(chunks) > 1 and all(c["role"] == "assistant" for c in chunks)
            assert "".join(c["content"][0]["text"] for c in chunks) == whole["content"][0]["text"]
            assert chat.send_message("and the gpu?") == second
            assert [m["role"] for m in chat.history] == ["user", "model", "user", "model"]
        with pytest.raises(InvalidArgumentError, match="closed"):
            chat.send_message("again")
        # A conversation longer than the cache stops with the engine's clear error.
        with engine.create_conversation(sampler_config=GREEDY) as chat:
            with pytest.raises(ResourceLimitError, match="exceed"):
                for _ in range(20):
                    chat.send_message("tell me more about the cpu backend and its kernels")


def test_a_bare_decoder_has_no_conversation(decoder):
    with Engine(decoder("llama_f32_comp")) as engine:
        with pytest.raises(InvalidArgumentError, match="tokenizer"):
            engine.create_conversation()


def test_a_conversation_on_a_gpu_backend_replies_what_the_cpu_replies(gpu_name, decoder):
    """The chat's turns run on the device, its KV cache kept there between them; a hybrid
    decoder's logits are LiteRT's bits on PoCL and lavapipe, so the replies are the cpu's."""
    bundle = decoder("llama_int8_dynamic_comp", ".litertlm")
    replies = {}
    for backend in ("cpu", gpu_name):
        with Engine(bundle, backend=backend, max_num_tokens=128) as engine, engine.create_conversation(
                sampler_config=GREEDY, max_output_tokens=16, system_message="Be brief.") as chat:
            replies[backend] = [chat.send_message(turn) for turn in ("What is the cpu backend?", "and the gpu?")]
    assert replies[gpu_name] == replies["cpu"]


def test_the_chat_command_replies_to_each_line_as_the_conversation_does(decoder, monkeypatch, capsys, tmp_path):
    """``litegpu chat``: each stdin line a message (blank ones skipped), each reply on stdout
    as the API gives it, the speeds on stderr; a template file that cannot be read is one
    error line, before the model loads."""
    import io

    from litegpu.cli import main
    bundle = decoder("llama_f32_comp", ".litertlm")
    turns = ["What is the cpu backend?", "and the gpu?"]
    monkeypatch.setattr("sys.stdin", io.StringIO(turns[0] + "\n\n" + turns[1] + "\n"))
    assert main(["chat", str(bundle), "--system", "Be brief.", "--max-tokens", "12", "--max-num-tokens", "128"]) == 0
    out, err = capsys.readouterr()
    with Engine(bundle, max_num_tokens=128) as engine, engine.create_conversation(
            system_message="Be brief.", sampler_config=GREEDY, max_output_tokens=12) as chat:
        want = [chat.send_message(turn)["content"][0]["text"] for turn in turns]
    assert out.splitlines() == want
    assert "decode:" in err and "tokens/s" in err
    assert main(["chat", str(bundle), "--template", str(tmp_path / "missing.jinja")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot read the chat template" in err[0]
