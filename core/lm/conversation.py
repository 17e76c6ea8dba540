"""Conversations: chat messages in, the model's messages out, as LiteRT-LM's ``Conversation``.

``Engine.create_conversation()`` keeps one :class:`~.engine.Session` (one KV cache) across
turns. Each :meth:`Conversation.send_message` renders the message with the model's chat
template, feeds the text's tokens after what the cache already holds, and decodes the
answer to a stop token::

    with Engine("model.litertlm") as engine, engine.create_conversation() as chat:
        reply = chat.send_message("What is the capital of France?")
        print(reply["content"][0]["text"])

The chat template is, in order: ``chat_template`` given to ``create_conversation``, the
bundle's ``jinja_prompt_template``, or one made from its ``prompt_templates`` (each role's
prefix and suffix; :func:`default_chat_template`, as LiteRT-LM makes it for bundles without a
Jinja template); a bundle with neither gets the messages' text as it is. Templates are
Jinja, rendered in a sandbox (a bundle's template is input from a file: it may not reach
Python's objects). As LiteRT-LM 0.18 does, the first message is rendered after the
conversation's preface (the system message and ``messages``), the start token put before
it, and each later message rendered alone, its text fed after the tokens the model
generated (the last reply's final token, a stop token or the one the length limit cut off,
included).
"""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..errors import InvalidArgumentError
from .bundle import PromptTemplates

#: The role the model's messages have in a reply (LiteRT-LM's JSON), and in a template.
REPLY_ROLE, MODEL_ROLE = "assistant", "model"


def default_chat_template(templates: PromptTemplates) -> str:
    """The Jinja chat template of a bundle that has only ``prompt_templates``: each message
    is its role's prefix, its text (a string, or its text items), its role's suffix; then,
    asked for a generation prompt, the model's prefix. A role without affixes adds none."""
    def affixes(role: str) -> tuple[str, str]:
        a = getattr(templates, role, None)
        return (a.prefix, a.suffix) if a is not None else ("", "")

    roles = {"user": affixes("user"), MODEL_ROLE: affixes("model"), "system": affixes("system")}
    quoted = {role: tuple(_literal(s) for s in pair) for role, pair in roles.items()}
    parts = ["{%- for message in messages -%}"]
    for role, (prefix, suffix) in quoted.items():
        parts.append(f"{{%- if message.role == '{role}' -%}}{{{{ {prefix} }}}}"
                     "{%- if message.content is string -%}{{ message.content }}"
                     "{%- else -%}{%- for item in message.content -%}"
                     "{%- if item.type == 'text' -%}{{ item.text }}{%- endif -%}{%- endfor -%}{%- endif -%}"
                     f"{{{{ {suffix} }}}}{{%- endif -%}}")
    parts.append("{%- endfor -%}")
    parts.append(f"{{%- if add_generation_prompt -%}}{{{{ {quoted[MODEL_ROLE][0]} }}}}{{%- endif -%}}")
    return "".join(parts)


def _literal(text: str) -> str:
    """``text`` as a Jinja string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r") + "'"


def normalize_message(message: str | Mapping[str, Any], role: str = "user") -> dict[str, Any]:
    """A message as a template gets it (as LiteRT-LM gives it): ``role`` (``assistant`` is
    the model's) and ``content``, a list of ``{"type": "text", "text": ...}`` items, also
    where the message's content is one string (a template that prints the content prints
    the list, in JSON). A string is a ``role`` message of that text."""
    if isinstance(message, str):
        message = {"role": role, "content": message}
    if not isinstance(message, Mapping) or "content" not in message:
        raise InvalidArgumentError(f"a message is a string or a mapping with 'content', got {message!r:.80}")
    content = message["content"]
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    elif not isinstance(content, Sequence) or not all(isinstance(i, Mapping) and "type" in i for i in content):
        raise InvalidArgumentError("a message's content is a string or a list of items with a 'type'")
    kinds = {i["type"] for i in content} - {"text"}
    if kinds:
        raise InvalidArgumentError(f"this engine takes text messages only, not {sorted(kinds)}")
    role = str(message.get("role", role))
    return {**message, "role": MODEL_ROLE if role == REPLY_ROLE else role, "content": [dict(i) for i in content]}


class ChatTemplate:
    """A Jinja chat template, compiled once in a sandbox (``jinja2``, the ``[lm]`` extra)."""

    def __init__(self, source: str) -> None:
        try:
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as exc:
            raise InvalidArgumentError(f"chat templates need jinja2 ({exc}): pip install 'litegpu[lm]'") from None
        self._errors = TemplateError
        # (Hugging Face's settings, which the chat templates bundles carry are written for;
        # lists and mappings print as JSON, as LiteRT-LM's renderer prints them)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, finalize=_as_json)
        env.globals["raise_exception"] = _raise
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        try:
            self.template = env.from_string(source)
        except TemplateError as exc:
            raise InvalidArgumentError(f"the chat template does not compile: {exc}") from None

    def render(self, messages: list[dict], add_generation_prompt: bool, **context: Any) -> str:
        """The text of ``messages``."""
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        tools=None, **context)
        except self._errors as exc:
            raise InvalidArgumentError(f"the chat template failed on these messages: {exc}") from None


def _as_json(value: Any) -> Any:
    return json.dumps(value, ensure_ascii=False) if isinstance(value, (list, dict)) else value


def _raise(message: str) -> None:
    raise InvalidArgumentError(f"the chat template refused the messages: {message}")


class Conversation:
    """A chat with an engine's model (LiteRT-LM's ``Conversation``): see the module docstring.

    ``messages``: a preface of earlier messages (rendered before the first message sent);
    ``system_message``: a system message put first; ``max_output_tokens``: the longest
    reply (default: until a stop token or the cache is full)."""

    def __init__(self, engine, *, messages: Sequence[str | Mapping[str, Any]] | None = None,
                 system_message: str | None = None, sampler_config=None, max_output_tokens: int | None = None,
                 chat_template: str | None = None, extra_context: Mapping[str, Any] | None = None) -> None:
        if engine.tokenizer is None:
            raise InvalidArgumentError("a conversation needs the model's tokenizer: open a .litertlm bundle")
        self.engine = engine
        self.session = engine.create_session(apply_prompt_template=False, sampler_config=sampler_config)
        self.max_output_tokens = max_output_tokens
        self.extra_context = dict(extra_context or {})
        preface = [normalize_message(m) for m in messages or ()]
        if system_message is not None:
            preface.insert(0, normalize_message(system_message, "system"))
        self.preface = preface
        self.history: list[dict[str, Any]] = []
        self.template = self._template(chat_template)
        self._lock = threading.Lock()

    def _template(self, source: str | None) -> ChatTemplate | None:
        meta = self.engine.metadata
        if source is None and meta is not None:
            source = meta.jinja_prompt_template
            if source is None and meta.prompt_templates is not None:
                source = default_chat_template(meta.prompt_templates)
        return None if source is None else ChatTemplate(source)

    def __enter__(self) -> "Conversation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """End the conversation (its KV cache goes back to the engine)."""
        self.session = None

    # -- turns ----------------------------------------------------------------------------
    def send_message(self, message: str | Mapping[str, Any], max_output_tokens: int | None = None) -> dict[str, Any]:
        """The model's reply to ``message``: ``{"role": "assistant", "content": [{"type":
        "text", "text": ...}]}``."""
        text = "".join(chunk["content"][0]["text"] for chunk in self.send_message_async(message, max_output_tokens))
        return _reply(text)

    def send_message_async(self, message: str | Mapping[str, Any],
                           max_output_tokens: int | None = None) -> Iterator[dict[str, Any]]:
        """The reply as it is generated: a message per token with the text it adds."""
        with self._lock:
            session = self.session
            if session is None:
                raise InvalidArgumentError("the conversation is closed")
            message = normalize_message(message)
            pending = [] if not self.history or session.last_token is None else [session.last_token]
            session.prefill_tokens(pending + self._prompt_ids(message))
            self.history.append(message)
            limit = max_output_tokens if max_output_tokens is not None else self.max_output_tokens
            parts = []
            for chunk in session.run_decode_async(limit):
                parts.append(chunk.texts[0])
                yield _reply(chunk.texts[0])
            self.history.append(normalize_message("".join(parts), MODEL_ROLE))

    def _prompt_ids(self, message: dict[str, Any]) -> list[int]:
        """What ``message`` feeds: its rendering (after the preface and the start token on
        the first turn), tokenized as one text."""
        first = not self.history
        messages = (self.preface if first else []) + [message]
        tok = self.engine.tokenizer
        if self.template is None:
            text = "".join(_text(m) for m in messages)
        else:
            text = self.template.render(messages, add_generation_prompt=True, **self.extra_context)
        ids = tok.encode(text)
        return self.engine.start_ids() + ids if first else ids


def _text(message: dict[str, Any]) -> str:
    return "".join(item.get("text", "") for item in message["content"])


def _reply(text: str) -> dict[str, Any]:
    return {"role": REPLY_ROLE, "content": [{"type": "text", "text": text}]}
