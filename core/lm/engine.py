"""Generation: prefill and decode of a decoder LLM exported with an external KV cache, as
LiteRT-LM runs it, on any litegpu backend.

A decoder exported by litert-torch has ``prefill_<N>`` signatures (N prompt tokens at once)
and a ``decode`` signature (one token); each takes ``tokens``, ``input_pos``, the KV cache
(``kv_cache_k_<i>`` / ``kv_cache_v_<i>``) and maybe an attention ``mask``, and returns the
cache written at ``input_pos`` (and ``logits``: decode always, prefill where exported). The
cache outputs of one step are the cache inputs of the next.

:class:`Engine` mirrors ``litert_lm.Engine`` (``create_session``) and :class:`Session`
``litert_lm.Session`` (``run_prefill``, ``run_decode``, ``run_decode_async``,
``get_benchmark_info``), with token-level calls beside them (:meth:`Session.prefill_tokens`,
:meth:`Session.decode_token`) and :meth:`Session.generate` for a prompt in, text out.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InvalidArgumentError, ModelFormatError, ResourceLimitError
from .bundle import Bundle, LlmMetadata
from .tokenizer import Tokenizer

log = logging.getLogger(__name__)

_PREFILL = re.compile(r"^prefill(?:_(\d+))?$")
_KV = "kv_cache_"
_MASKED = np.float32(-np.inf)   # litert-torch's causal mask value


@dataclass(frozen=True)
class SamplerConfig:
    """How the next token is picked (LiteRT-LM's ``SamplerConfig``): ``top_k`` 1 (or
    ``temperature`` 0) is greedy; otherwise the ``top_k`` most likely tokens, cut to the
    smallest set whose probability reaches ``top_p``, drawn at ``temperature`` from a
    generator seeded with ``seed``."""

    top_k: int | None = None
    top_p: float | None = None
    temperature: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.top_k is not None and self.top_k <= 0:
            raise InvalidArgumentError(f"top_k must be positive, got {self.top_k}")
        if self.top_p is not None and not 0 <= self.top_p <= 1:
            raise InvalidArgumentError(f"top_p must be within [0, 1], got {self.top_p}")
        if self.temperature is not None and self.temperature < 0:
            raise InvalidArgumentError(f"temperature must not be negative, got {self.temperature}")

    @property
    def greedy(self) -> bool:
        """True when the most likely token is always taken."""
        return self.temperature == 0 or self.top_k == 1 or (self.top_k, self.top_p, self.temperature) == (None,) * 3


GREEDY = SamplerConfig(top_k=1)


class Sampler:
    """Picks tokens from logits as a :class:`SamplerConfig` says."""

    def __init__(self, config: SamplerConfig) -> None:
        self.config = config
        self.rng = np.random.default_rng(config.seed)

    def __call__(self, logits: np.ndarray) -> int:
        c = self.config
        if c.greedy:    # the logits' own precision picks the same token, without a copy
            return int(np.argmax(logits))
        logits = np.asarray(logits, np.float64).reshape(-1)
        k = min(c.top_k or logits.size, logits.size)
        top = np.argpartition(-logits, k - 1)[:k]
        top = top[np.argsort(-logits[top], kind="stable")]
        scaled = logits[top] / (c.temperature if c.temperature else 1.0)
        p = np.exp(scaled - scaled.max())
        p /= p.sum()
        if c.top_p is not None and c.top_p < 1:
            keep = int(np.searchsorted(np.cumsum(p), c.top_p) + 1)
            top, p = top[:keep], p[:keep] / p[:keep].sum()
        return int(top[self.rng.choice(top.size, p=p)])


@dataclass
class BenchmarkInfo:
    """Token counts and times of a session's prefill and decode (``litert_lm.BenchmarkInfo``)."""

    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0


@dataclass
class Responses:
    """Generated texts, one per batch entry (``litert_lm.Responses``); ``tokens`` the ids."""

    texts: list[str] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)


@dataclass(frozen=True)
class _Signature:
    """One prefill or decode signature: its key, tokens per call, and input names."""

    key: str
    length: int
    kv_names: tuple[str, ...]
    has_mask: bool
    mask_shape: tuple[int, ...] | None
    logits: bool


class _InterpreterIO:
    """Signatures run through an ``Interpreter``-API runtime's signature runners (LiteRT's,
    to compare under one loop): the KV cache goes in and comes back as host arrays each step."""

    def __init__(self, interpreter) -> None:
        self.interpreter = interpreter
        self._runners: dict = {}
        self._signatures: dict[str, tuple[dict, dict]] | None = None

    def signatures(self) -> dict[str, tuple[dict, dict]]:
        """``{key: (input details, output details)}`` by name, read once (the engine never resizes)."""
        if self._signatures is None:
            self._signatures = {}
            for key in self.interpreter.get_signature_list():
                runner = self.interpreter.get_signature_runner(key)
                self._signatures[key] = (runner.get_input_details(), runner.get_output_details())
        return self._signatures

    def feed_arrays(self, sig: _Signature, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Arrays of the model's shapes and dtypes for the ``names`` inputs of ``sig``, which
        each step fills and :meth:`run` reads."""
        details = self.signatures()[sig.key][0]
        return {n: np.zeros(details[n]["shape"], details[n]["dtype"]) for n in names}

    def new_state(self, decode: _Signature) -> dict[str, np.ndarray]:
        return self.feed_arrays(decode, decode.kv_names)

    def run(self, state: dict, sig: _Signature, feeds: dict[str, np.ndarray]) -> dict:
        runner = self._runners.get(sig.key)
        if runner is None:
            runner = self._runners[sig.key] = self.interpreter.get_signature_runner(sig.key)
        out = runner(**feeds, **state)
        state.update((name, out[name]) for name in sig.kv_names)
        return out

    def report(self, key: str):
        """The signature's delegation report (litegpu's interpreter only)."""
        return self.interpreter.get_signature_runner(key).get_delegation_report()

    def close(self) -> None:
        self._runners, self.interpreter = {}, None


class _Feeds:
    """A signature's token, position and mask inputs, filled in place for each step.

    Padding positions continue the prompt, clamped to the cache: what they write in the
    cache lies beyond the position, where the mask hides it until a later step overwrites
    it. The causal mask's row for position ``r`` is 0 at columns ``<= r`` and
    :data:`_MASKED` after: it is the window ``[Z-1-r, Z-1-r+kv)`` of a ramp of ``Z`` zeros
    then ``kv`` masked values, so a step's rows are one strided copy of the ramp's windows."""

    def __init__(self, sig: _Signature, arrays: dict[str, np.ndarray], kv_length: int) -> None:
        self.arrays = arrays
        self.tokens = arrays["tokens"].reshape(-1)
        self.positions = arrays["input_pos"].reshape(-1)
        longest = kv_length + self.positions.size
        self._clamped = np.minimum(np.arange(longest), kv_length - 1).astype(self.positions.dtype)
        self.mask = None
        if sig.has_mask:
            rows = sig.mask_shape[-2]
            self.mask = arrays["mask"].reshape(-1, rows, kv_length)
            self._zeros = kv_length + rows     # a row's position is below the cache's length plus the rows
            ramp = np.full(self._zeros + kv_length, _MASKED, self.mask.dtype)
            ramp[:self._zeros] = 0
            self._windows = np.lib.stride_tricks.sliding_window_view(ramp, kv_length)

    def fill(self, ids: list[int], position: int) -> None:
        """The inputs of ``ids`` at ``position`` (zero tokens after them)."""
        n = len(ids)
        self.tokens[:n] = ids
        self.tokens[n:] = 0
        self.positions[...] = self._clamped[position:position + self.positions.size]
        if self.mask is not None:
            end = self._zeros - position
            self.mask[...] = self._windows[end - self.mask.shape[1]:end][::-1]


class _KvState:
    """A session's KV cache on a :class:`_CompiledIO`: its sets of buffers (one updated in
    place, or two a step reads and writes in turn), whose set is read next, its output
    buffers, and each signature's run maps for it, made once."""

    def __init__(self, sets: list[dict]) -> None:
        self.sets = sets
        self.turn = 0
        self.outputs: dict[str, dict] = {}     # each signature's non-cache output buffers
        self.maps: dict[tuple[str, int], tuple[dict, dict]] = {}


class _CompiledIO:
    """Signatures run through a litegpu ``CompiledModel`` on tensor buffers.

    The KV cache is one set of buffers, each given as both the input and the output of its
    layer's cache, where the model allows it (each cache input is read by its
    DYNAMIC_UPDATE_SLICE alone, whose result is the output: every decoder litert-torch
    exports): each step's update writes its new entries where the cache lies, as LiteRT-LM
    runs it, and nothing else of the cache is copied. On the host the model runs on the
    buffers' own arrays; on a device the buffers are device memory and the cache never
    comes back to the host. A model that reads a cache input elsewhere gets two sets of
    buffers: a step reads one set and writes the other, then they swap (on the host, the
    one set is copied instead)."""

    def __init__(self, model, host: bool = False) -> None:
        self.model = model
        self.host = host
        self._in_place: bool | None = None   # (see new_state)
        # Caches of ended sessions, zeroed for the next: the model's steps stay bound to
        # their arrays (binding a new set costs a slow first run).
        self._free: list[_KvState] = []
        # Per signature: its input buffers (the feeds) and the ones a run copies in (device
        # buffers; a host buffer is the array the step fills). Outputs are each session's.
        self._buffers: dict[str, tuple[dict, tuple]] = {}
        self._signatures: dict[str, tuple[dict, dict]] | None = None

    @classmethod
    def create(cls, source: dict, backend: str, num_threads: int) -> "_CompiledIO":
        """A model compiled for ``backend`` (``"GPU"``: the best GPU backend; ``"cpu"``: the
        host alone, its cache updated in place), cpu taking what a device cannot run."""
        from ..compiled_model import CompiledModel, CpuOptions, HardwareAccelerator, Options
        host = backend.lower() == "cpu"
        accelerators = HardwareAccelerator.CPU if host else HardwareAccelerator.GPU | HardwareAccelerator.CPU
        options = Options(hardware_accelerators=accelerators, cpu_options=CpuOptions(num_threads=max(num_threads, 0)))
        named = None if backend.upper() == "GPU" else backend
        if "model_path" in source:
            return cls(CompiledModel.from_file(source["model_path"], options=options, backend=named), host)
        return cls(CompiledModel.from_buffer(source["model_content"], options=options, backend=named), host)

    def signatures(self) -> dict[str, tuple[dict, dict]]:
        """``{key: (input details, output details)}`` by name, read once (the engine never resizes)."""
        if self._signatures is None:
            self._signatures = {key: (self.model.get_input_tensor_details(key),
                                      self.model.get_output_tensor_details(key))
                                for key in self.model.get_signature_list()}
        return self._signatures

    def feed_arrays(self, sig: _Signature, names: Sequence[str]) -> dict[str, np.ndarray]:
        """The arrays each step fills for the ``names`` inputs of ``sig``: a host input
        buffer's own array (the run reads it where it lies), else one that :meth:`run`
        copies into the device buffer."""
        inputs = {n: self.model.create_input_buffer_by_name(sig.key, n) for n in names}
        arrays = {}
        for n, buf in inputs.items():
            details = buf.get_tensor_details()
            arrays[n] = np.zeros(details["shape"], details["dtype"]) if buf.is_device else buf.array
        copied = tuple((inputs[n], arrays[n]) for n in names if inputs[n].is_device)
        self._buffers[sig.key] = (inputs, copied)
        return arrays

    def new_state(self, decode: _Signature) -> "_KvState":
        """The sets of KV buffers (one updated in place where the model allows it, else two),
        zeros, of the kind the decode signature prefers: an ended session's, when there is one
        (see :meth:`release`)."""
        if self._free:
            state = self._free.pop()
            for buffers in state.sets:
                for buf in buffers.values():
                    buf.array[...] = 0
            state.turn = 0
            return state
        if self._in_place is None:
            self._in_place = self.host or all(
                self.model._updates_in_place(key, decode.kv_names)
                for key, (ins, _) in self.signatures().items() if set(decode.kv_names) <= set(ins))
        return _KvState([{n: self.model.create_input_buffer_by_name(decode.key, n) for n in decode.kv_names}
                         for _ in range(1 if self._in_place else 2)])

    def release(self, state: "_KvState") -> None:
        """Keep an ended session's host cache for the next session (a few at most)."""
        if self.host and len(self._free) < 2:
            self._free.append(state)

    def run(self, state: "_KvState", sig: _Signature, feeds: dict[str, np.ndarray]) -> dict:
        """Run ``sig`` on the arrays :meth:`feed_arrays` gave (``feeds``, filled) and the
        session's cache; the non-cache outputs by name, in the session's own buffers (another
        session's steps leave them alone)."""
        inputs, copied = self._buffers[sig.key]
        for buf, array in copied:
            buf.write(array)
        maps = state.maps.get((sig.key, state.turn))
        if maps is None:
            outputs = state.outputs.get(sig.key)
            if outputs is None:
                outputs = state.outputs[sig.key] = {
                    n: self.model.create_output_buffer_by_name(sig.key, n)
                    for n in self.model.get_signature_list()[sig.key]["outputs"] if n not in sig.kv_names}
            current, other = state.sets[state.turn], state.sets[(state.turn + 1) % len(state.sets)]
            maps = state.maps[sig.key, state.turn] = ({**inputs, **current}, {**outputs, **other})
            # (every step runs on these buffers: the first binds the model's steps to them)
            self.model._expect_reuse(sig.key, *maps)
        self.model.run_by_name(sig.key, *maps)
        state.turn = (state.turn + 1) % len(state.sets)
        return {name: buf.array for name, buf in state.outputs[sig.key].items()}

    def report(self, key: str):
        """The signature's delegation report."""
        return self.model.delegation_reports()[self.model.get_signature_index(key)]

    def close(self) -> None:
        self.model.close()
        self._buffers = {}


class Engine:
    """A decoder LLM ready to generate: a ``.litertlm`` bundle (model, tokenizer, metadata)
    or a bare ``.tflite`` decoder (token ids in and out, no tokenizer).

    ``backend``: ``"cpu"``, ``"GPU"`` (the best GPU backend, cpu for what it cannot run)
    or a backend's name. ``max_num_tokens`` caps prompt plus output (default: the KV cache's
    length, or the bundle's own cap when smaller). ``runtime``: a class with
    ``ai_edge_litert``'s ``Interpreter`` API to run the model with instead of litegpu's
    (LiteRT's own, to compare both under one generation loop); ``backend`` is then unused.
    """

    def __init__(self, model_path: str | os.PathLike, backend: str = "cpu", num_threads: int = 0,
                 max_num_tokens: int | None = None, tokenizer: Tokenizer | None = None, runtime=None) -> None:
        path = Path(model_path)
        self.bundle: Bundle | None = None
        self.metadata: LlmMetadata | None = None
        self.tokenizer = tokenizer
        if path.suffix == ".litertlm":
            self.bundle = Bundle.open(path)
            self.metadata = self.bundle.metadata
            # The model read where the bundle is mapped (a copy held a second 100 MB of a
            # 100M decoder); LiteRT's Interpreter (``runtime``) takes bytes.
            view = self.bundle.model_bytes()
            source = {"model_content": bytes(view) if runtime is not None else view}
            if self.tokenizer is None:
                self.tokenizer = self.bundle.tokenizer()
        else:
            source = {"model_path": str(path)}
        if runtime is not None:
            self.io = _InterpreterIO(runtime(**source, num_threads=num_threads or None))
        else:
            self.io = _CompiledIO.create(source, backend, num_threads)
        self.backend = backend
        self.prefills, self.decode = self._signatures()
        self.kv_length = self._kv_length()
        self.lock = threading.Lock()
        self._feeds: dict[str, _Feeds] = {}
        limit = self.kv_length if not (self.metadata and self.metadata.max_num_tokens) else \
            min(self.kv_length, self.metadata.max_num_tokens)
        self.max_num_tokens = min(limit, max_num_tokens) if max_num_tokens else limit

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Release the model and the bundle (its memory map goes with its last view)."""
        self.io.close()
        self.bundle = None

    # -- what the model is ----------------------------------------------------------------
    def _signatures(self) -> tuple[list[_Signature], _Signature]:
        listing = self.io.signatures()
        prefills, decode = [], None
        for key, (ins, outs) in listing.items():
            if "tokens" not in ins or "input_pos" not in ins:
                continue
            kv = tuple(sorted(n for n in ins if n.startswith(_KV)))
            missing = [n for n in kv if n not in outs]
            if missing:
                raise ModelFormatError(f"signature {key!r} takes KV cache inputs {missing} it does not return: "
                                       "not a decoder with an external KV cache")
            length = int(np.prod(ins["tokens"]["shape"]))
            mask = ins.get("mask")
            sig = _Signature(key, length, kv, mask is not None, None if mask is None else tuple(mask["shape"]),
                             "logits" in outs)
            if key == "decode":
                decode = sig
            elif _PREFILL.match(key):
                prefills.append(sig)
        if decode is None or not decode.logits:
            raise ModelFormatError(f"no 'decode' signature returning logits among {sorted(listing)}: not a decoder "
                                   "exported with prefill/decode signatures")
        if not prefills:
            prefills = [decode]        # a model without prefill signatures takes the prompt a token at a time
        if {s.kv_names for s in prefills} != {decode.kv_names}:
            raise ModelFormatError("the prefill and decode signatures take different KV caches")
        return sorted(prefills, key=lambda s: s.length), decode

    def _kv_length(self) -> int:
        """The cache's positions: a mask's last dimension, else the cache's longest axis
        (litert-torch lays K out [batch, heads, positions, dim] and V [batch, heads, dim, positions])."""
        if self.decode.mask_shape:
            return int(self.decode.mask_shape[-1])
        details = self.io.signatures()[self.decode.key][0]
        return max(int(d) for name in self.decode.kv_names for d in details[name]["shape"][1:])

    def feeds(self, sig: _Signature) -> "_Feeds":
        """The arrays a run of ``sig`` reads its tokens, positions and mask from."""
        feeds = self._feeds.get(sig.key)
        if feeds is None:
            names = ["tokens", "input_pos"] + (["mask"] if sig.has_mask else [])
            feeds = self._feeds[sig.key] = _Feeds(sig, self.io.feed_arrays(sig, names), self.kv_length)
        return feeds

    def delegation_report(self, signature: str = "decode"):
        """Where each node of a signature runs (see ``Interpreter.get_delegation_report``)."""
        return self.io.report(signature)

    @property
    def vocab_size(self) -> int:
        """The length of the decode signature's logits."""
        return int(self.io.signatures()[self.decode.key][1]["logits"]["shape"][-1])

    def start_ids(self) -> list[int]:
        """The ids a session's first prompt starts with: the bundle's start token, else (no
        metadata) the tokenizer's BOS, else none."""
        tok, meta = self.tokenizer, self.metadata
        if meta is not None:
            return list(meta.start_token.resolve(tok)) if meta.start_token is not None else []
        return [tok.bos_id] if tok is not None and tok.bos_id is not None else []

    def create_session(self, apply_prompt_template: bool = True,
                       sampler_config: SamplerConfig | None = None) -> "Session":
        """A new conversation state: an empty KV cache at position 0."""
        if sampler_config is None and self.metadata and self.metadata.sampler_params:
            p = self.metadata.sampler_params
            sampler_config = SamplerConfig(top_k=p.k or None, top_p=p.p or None,
                                           temperature=p.temperature or None, seed=p.seed) \
                if p.type != "GREEDY" else GREEDY
        return Session(self, apply_prompt_template, sampler_config or GREEDY)

    def create_conversation(self, *, messages=None, system_message: str | None = None,
                            sampler_config: SamplerConfig | None = None, max_output_tokens: int | None = None,
                            chat_template: str | None = None, extra_context=None) -> "Conversation":
        """A chat with the model (LiteRT-LM's ``create_conversation``): see
        :class:`~litegpu.lm.conversation.Conversation`."""
        from .conversation import Conversation
        return Conversation(self, messages=messages, system_message=system_message, sampler_config=sampler_config,
                            max_output_tokens=max_output_tokens, chat_template=chat_template,
                            extra_context=extra_context)


class Session:
    """One conversation with an :class:`Engine`'s model: the KV cache and the position."""

    def __init__(self, engine: Engine, apply_prompt_template: bool = True,
                 sampler_config: SamplerConfig = GREEDY) -> None:
        self.engine = engine
        self.apply_prompt_template = apply_prompt_template
        self.sampler = Sampler(sampler_config)
        self.state = engine.io.new_state(engine.decode)
        release = getattr(engine.io, "release", None)
        if release is not None:     # the cache goes back to the engine with the session
            weakref.finalize(self, release, self.state)
        self.position = 0
        self.last_token: int | None = None
        self.logits: np.ndarray | None = None
        self.info = BenchmarkInfo()
        self._pending: list[int] = []
        self._cancelled = False

    # -- tokens ---------------------------------------------------------------------------
    def prefill_tokens(self, ids: Sequence[int]) -> None:
        """Feed ``ids`` to the model, in chunks of the prefill signatures' lengths; the next
        decode starts after them. The last id is held back when no prefill returns logits:
        the first decode step feeds it and gives the next token's logits."""
        ids = [int(i) for i in ids]
        if not ids:
            return
        self._check_room(len(ids))
        start = time.perf_counter()
        engine = self.engine
        head, self.last_token = ids[:-1], ids[-1]
        while head:
            sig = next((s for s in engine.prefills if s.length >= len(head)), engine.prefills[-1])
            chunk, head = head[:sig.length], head[sig.length:]
            self._run(sig, chunk)
        self.info.prefill_tokens += len(ids)
        self.info.prefill_seconds += time.perf_counter() - start

    def decode_token(self) -> int:
        """One decode step: feed the last token, sample the next; returns it."""
        if self.last_token is None:
            raise InvalidArgumentError("decode before any prefill: there is no token to continue from")
        self._check_room(1)
        start = time.perf_counter()
        out = self._run(self.engine.decode, [self.last_token])
        self.logits = np.asarray(out["logits"]).reshape(-1)
        token = self.sampler(self.logits)
        self.last_token = token
        self.info.decode_tokens += 1
        self.info.decode_seconds += time.perf_counter() - start
        return token

    def _check_room(self, count: int) -> None:
        if self.position + count > self.engine.max_num_tokens:
            raise ResourceLimitError(f"{self.position} tokens in the cache and {count} more exceed the model's "
                                     f"{self.engine.max_num_tokens} (its KV cache length"
                                     + (" or the bundle's max_num_tokens)" if self.engine.metadata else ")"))

    def _run(self, sig: _Signature, ids: list[int]) -> dict:
        feeds = self.engine.feeds(sig)
        with self.engine.lock:     # sessions of one engine share its feed arrays
            feeds.fill(ids, self.position)
            out = self.engine.io.run(self.state, sig, feeds.arrays)
        self.position += len(ids)
        return out

    # -- text -----------------------------------------------------------------------------
    def encode_prompt(self, text: str, first: bool) -> list[int]:
        """The prompt's ids as LiteRT-LM feeds them: the start token first in a session, then,
        when templated, the user turn's prefix, the text, the user turn's suffix and the
        model turn's prefix, each encoded on its own (as LiteRT-LM does: encoding them joined
        can merge pieces across the seams)."""
        tok = self._tokenizer()
        meta = self.engine.metadata
        templates = meta.prompt_templates if meta and self.apply_prompt_template else None
        parts = [text]
        if templates is not None:
            user, model = templates.user, templates.model
            parts = [user.prefix if user else "", text, user.suffix if user else "", model.prefix if model else ""]
        ids = [i for part in parts if part for i in tok.encode(part)]
        return self.engine.start_ids() + ids if first else ids

    def _tokenizer(self) -> Tokenizer:
        if self.engine.tokenizer is None:
            raise InvalidArgumentError("this model has no tokenizer (a bare .tflite): use prefill_tokens and "
                                       "decode_token, or open a .litertlm bundle")
        return self.engine.tokenizer

    def _stop_ids(self) -> set[int]:
        meta, tok = self.engine.metadata, self.engine.tokenizer
        stops: set[int] = set()
        if meta is not None and tok is not None:
            for t in meta.stop_tokens:
                ids = t.resolve(tok)
                if len(ids) == 1:
                    stops.add(ids[0])
        elif tok is not None and tok.eos_id is not None:
            stops.add(tok.eos_id)
        return stops

    def run_prefill(self, contents: list[str]) -> None:
        """Feed prompt text (LiteRT-LM's ``run_prefill``); several calls append."""
        for text in contents:
            self.prefill_tokens(self.encode_prompt(text, first=self.position == 0 and self.last_token is None))

    def run_decode(self, max_tokens: int | None = None) -> Responses:
        """Decode until a stop token or the cache is full (LiteRT-LM's ``run_decode``)."""
        tokens: list[int] = []
        tok = self._tokenizer()
        for chunk in self.run_decode_async(max_tokens):
            tokens += chunk.tokens[0]
        return Responses([tok.decode(tokens)], [tokens])

    def run_decode_async(self, max_tokens: int | None = None) -> Iterator[Responses]:
        """Decode, yielding each token as a :class:`Responses` of the text it adds. The
        text is the decoding of every token so far less what was already yielded: a piece
        alone would lose the space SentencePiece marks on it, and a character split across
        tokens waits for its last byte."""
        stops = self._stop_ids()
        # Prompt and output together fit in max_num_tokens, as LiteRT-LM counts: the last
        # prompt token is not in the cache yet (the first step feeds it), so one less.
        room = self.engine.max_num_tokens - self.position - (self.last_token is not None)
        limit = room if max_tokens is None else min(room, max_tokens)
        tok = self.engine.tokenizer
        self._cancelled = False
        ids: list[int] = []
        shown = ""
        for _ in range(limit):
            if self._cancelled:
                return
            token = self.decode_token()
            if token in stops:
                return
            ids.append(token)
            text = tok.decode(ids) if tok else ""
            new = text[len(shown):] if text.startswith(shown) and not text.endswith("\ufffd") else ""
            shown += new
            yield Responses([new], [[token]])

    def generate(self, prompt: str, max_tokens: int | None = None) -> str:
        """The model's answer to ``prompt``: prefill, then decode to a stop token."""
        self.run_prefill([prompt])
        return self.run_decode(max_tokens).texts[0]

    def cancel_process(self) -> None:
        """Stop a running :meth:`run_decode_async` after its current token."""
        self._cancelled = True

    def get_benchmark_info(self) -> BenchmarkInfo:
        """Tokens and seconds of this session's prefill and decode."""
        return self.info
