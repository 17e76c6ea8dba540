"""Generative decoders as LiteRT-LM packages them: ``.litertlm`` bundles and their tokenizers.

A ``.litertlm`` bundle holds a decoder LLM's ``.tflite`` model(s) (prefill/decode, and
embedders or adapters beside it), its tokenizer (SentencePiece, or a zlib-compressed
HuggingFace ``tokenizer.json``) and its ``LlmMetadata`` (start and stop tokens, prompt
templates, default sampling, context length, model family). :class:`Bundle` reads one,
every offset checked, the models as zero-copy views::

    bundle = Bundle.open("gemma3-1b-it-int4.litertlm")
    model = bundle.load_model("prefill_decode")      # a litegpu Model
    tokenizer = bundle.tokenizer()
    stop_ids = [t.resolve(tokenizer) for t in bundle.metadata.stop_tokens]

:class:`Engine`, :class:`Conversation` and :class:`Session` generate with one (or, token by
token, with a bare ``.tflite`` decoder), mirroring LiteRT-LM's Python API::

    with Engine("model.litertlm", backend="cpu") as engine:
        with engine.create_conversation() as chat:         # the model's chat template
            print(chat.send_message("Why is the sky blue?")["content"][0]["text"])
        session = engine.create_session()                   # prompt text in, text out
        print(session.generate("Why is the sky blue?"))
        print(session.get_benchmark_info().decode_tokens_per_second)

LiteRT-LM is the oracle. Tokenizers and chat templates need the ``[lm]`` extra
(``sentencepiece``, ``tokenizers``, ``jinja2``), imported only when one is made.
"""
from __future__ import annotations

from .bundle import (BLOCK_SIZE, MAGIC, MAJOR_VERSION, SECTION_TYPES, Bundle, LlmMetadata, LlmModelType,
                     PromptAffixes, PromptTemplates, SamplerParams, Section, TokenUnion, normalize_model_type)
from .conversation import Conversation
from .engine import BenchmarkInfo, Engine, Responses, SamplerConfig, Session
from .protobuf import Message
from .tokenizer import (HuggingFaceTokenizer, SentencePieceTokenizer, Tokenizer, TokenizerUnavailableError,
                        load_tokenizer)

__all__ = [
    "Bundle", "Section", "LlmMetadata", "TokenUnion", "PromptAffixes", "PromptTemplates", "SamplerParams",
    "LlmModelType", "normalize_model_type", "MAGIC", "MAJOR_VERSION", "BLOCK_SIZE", "SECTION_TYPES",
    "Message", "Tokenizer", "SentencePieceTokenizer", "HuggingFaceTokenizer", "TokenizerUnavailableError",
    "load_tokenizer", "Engine", "Session", "Conversation", "SamplerConfig", "Responses", "BenchmarkInfo",
]
