"""Decoders: litegpu against LiteRT under one generation loop, for agreement and speed.

For each decoder (``.tflite`` with prefill/decode signatures, or ``.litertlm``) it runs
:class:`litegpu.lm.Engine` twice, once on LiteRT's ``Interpreter`` and once on a litegpu
backend, from the same prompt ids:

- agreement: greedy tokens for ``--steps`` decode steps, and the largest logit error
  (absolute, and relative to LiteRT's largest logit) over the steps both runs were fed the
  same tokens; where they split, the margin between LiteRT's two best logits there (a
  split on a near tie is a rounding difference, not a wrong answer);
- speed, in one process, alternating blocks (each warmed first, ``--rounds`` rounds, the
  best block): prefill tokens/s (one prefill chunk of the longest prefill signature) and
  decode tokens/s (``--block`` decode steps from the same position).

``--litert-lm`` (bundles only; needs ``pip install litert-lm-api``) times litegpu against
LiteRT-LM's own CPU backend instead, the engine generative users run, alternating blocks in
one process: a block is one ``litert_lm.Benchmark`` run (a fresh engine; its own prefill and
decode tokens/s) against one litegpu session doing the same (benchmarks/acceptance_decoders.py).

Usage::

    python benchmarks/decoders.py [MODEL ...] [--dir ~/.cache/litegpu/decoders] [--backend cpu]
        [--threads 2] [--steps 32] [--markdown]

With no MODEL, every ``*.tflite`` and ``*.litertlm`` in ``--dir`` (where
``benchmarks/export_decoders.py`` writes them).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np

log = logging.getLogger("benchmarks.decoders")
# --litert-lm: a pause after each runtime's block, so the other does not start beside the
# first one's worker threads still spinning down.
SETTLE_S = 0.05
# --litert-lm: litegpu's warm-up after that pause lasts at least this long. A LiteRT-LM block
# times its prefill right after building its engine (busy cores); litegpu's timed block
# followed one warm block after the pause, and a tiny decoder's prefill (16 tokens, ~60 us
# hot) then still ran at 2-3x its hot time (the cores not yet back from the pause).
WARM_S = 0.03
DEFAULT_DIR = Path(os.environ.get("LITEGPU_DECODERS_DIR", Path.home() / ".cache" / "litegpu" / "decoders"))


def prompt_ids(vocab: int, count: int) -> list[int]:
    """A fixed prompt of ``count`` ids below ``vocab`` (no tokenizer needed)."""
    return [int(i) for i in np.random.default_rng(1234).integers(1, vocab, size=count)]


def agreement(path: Path, backend: str, threads: int, steps: int) -> dict:
    """Greedy tokens and logits of LiteRT and litegpu from one prompt."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    from litegpu.lm import Engine
    from acceptance_decoders import greedy
    results = []
    for runtime in (LiteRT, None):
        engine = Engine(path, backend=backend, num_threads=threads, runtime=runtime)
        prompt = prompt_ids(engine.vocab_size, min(12, engine.max_num_tokens // 4))
        # (the prompt's last id waits for the first decode step: len(prompt) - 1 positions are taken)
        results.append(greedy(engine, prompt, min(steps, engine.max_num_tokens - len(prompt))))
    (want_tokens, want), (got_tokens, got) = results
    same = next((i for i, (a, b) in enumerate(zip(want_tokens, got_tokens)) if a != b), len(want_tokens))
    # Logits are compared while both runs have fed the same tokens: up to and including the
    # step where they first choose differently (after it, each continues its own text).
    compared = slice(0, min(same + 1, len(want_tokens)))
    err = float(np.abs(got[compared] - want[compared]).max())
    top = np.sort(want[compared], axis=-1)
    return {"agree": same, "steps": len(want_tokens), "max_abs": err, "max_rel": err / float(np.abs(want).max()),
            "margin_at_split": float(top[-1, -1] - top[-1, -2]) if same < len(want_tokens) else None}


def speed(path: Path, backend: str, threads: int, block: int, rounds: int) -> dict:
    """Prefill and decode tokens/s of LiteRT and litegpu, alternating blocks, best block."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    from litegpu.lm import Engine
    engines = {"litert": Engine(path, num_threads=threads, runtime=LiteRT),
               "litegpu": Engine(path, backend=backend, num_threads=threads)}
    best = {(name, what): 0.0 for name in engines for what in ("prefill", "decode")}
    for r in range(rounds + 1):        # round 0 warms both
        for name, engine in engines.items():
            session = engine.create_session()
            length = engine.prefills[-1].length
            ids = prompt_ids(engine.vocab_size, length + 1)
            start = time.perf_counter()
            session.prefill_tokens(ids)
            prefill = length / (time.perf_counter() - start)
            at = session.position
            steps = min(block, engine.max_num_tokens - at - 1)
            start = time.perf_counter()
            for _ in range(steps):
                session.position = at           # the same position every step: the same work
                session.decode_token()
            decode = steps / (time.perf_counter() - start)
            if r:
                best[name, "prefill"] = max(best[name, "prefill"], prefill)
                best[name, "decode"] = max(best[name, "decode"], decode)
    return {f"{name}_{what}": value for (name, what), value in best.items()}


def versus_litert_lm(path: Path, backend: str, threads: int, rounds: int) -> dict:
    """Prefill and decode tokens/s of LiteRT-LM (CPU) and litegpu on a bundle, alternating
    blocks, best block."""
    import tempfile

    from acceptance_decoders import decode_shape, litegpu_block, litert_lm_block, prompt_ids as lm_prompt

    from litegpu.lm import Engine
    with Engine(path, backend=backend, num_threads=threads) as engine, tempfile.TemporaryDirectory() as cache:
        shape = decode_shape(engine.prefills[-1].length, engine.max_num_tokens)
        prompt = lm_prompt(engine.vocab_size, shape["prefill"] + 1)
        best = {k: 0.0 for k in ("litert_lm_prefill", "litert_lm_decode", "litegpu_prefill", "litegpu_decode")}
        for r in range(rounds + 1):     # round 0 warms both
            lm, _ = litert_lm_block(path, "litert-lm-cpu", shape, threads, cache)   # warms its fresh engine first
            time.sleep(SETTLE_S)
            warm = time.perf_counter()              # so litegpu warms too, after LiteRT-LM's run left the caches
            while time.perf_counter() - warm < WARM_S:
                litegpu_block(engine, shape, prompt)
            ours = litegpu_block(engine, shape, prompt)
            time.sleep(SETTLE_S)
            if r:
                for name, (pre, dec) in (("litert_lm", lm), ("litegpu", ours)):
                    best[f"{name}_prefill"] = max(best[f"{name}_prefill"], pre)
                    best[f"{name}_decode"] = max(best[f"{name}_decode"], dec)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", type=Path, help="decoders (default: every one in --dir)")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="where exported decoders are")
    parser.add_argument("--backend", default="cpu", help="litegpu backend (default cpu)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=32, help="greedy steps compared")
    parser.add_argument("--block", type=int, default=50, help="decode steps per timed block")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-speed", action="store_true", help="agreement only")
    parser.add_argument("--litert-lm", action="store_true",
                        help="bundles: speed against LiteRT-LM's CPU backend (no agreement run)")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    models = args.models or sorted([*args.dir.glob("*.tflite"), *args.dir.glob("*.litertlm")])
    if not models:
        log.error("no decoders given or found in %s (make them with benchmarks/export_decoders.py)", args.dir)
        return 2
    if args.litert_lm:
        return litert_lm_table([m for m in models if m.suffix == ".litertlm"], args)
    rows = []
    for i, path in enumerate(models, 1):
        log.info("[%d/%d] %s", i, len(models), path.name)
        row = {"model": path.stem, **agreement(path, args.backend, args.threads, args.steps)}
        if not args.no_speed:
            row.update(speed(path, args.backend, args.threads, args.block, args.rounds))
        rows.append(row)
        log.info("  %s", {k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()})
    if args.markdown:
        head = "| model | greedy agree | max abs logit err | max rel | margin at split |"
        if not args.no_speed:
            head += " prefill tok/s LiteRT | litegpu | ratio | decode tok/s LiteRT | litegpu | ratio |"
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for r in rows:
            margin = "" if r["margin_at_split"] is None else f"{r['margin_at_split']:.2e}"
            line = f"| {r['model']} | {r['agree']}/{r['steps']} | {r['max_abs']:.2e} | {r['max_rel']:.2e} | {margin} |"
            if not args.no_speed:
                line += (f" {r['litert_prefill']:.0f} | {r['litegpu_prefill']:.0f} | "
                         f"{r['litegpu_prefill'] / r['litert_prefill']:.2f} | {r['litert_decode']:.0f} | "
                         f"{r['litegpu_decode']:.0f} | {r['litegpu_decode'] / r['litert_decode']:.2f} |")
            print(line)
    return 0 if all(r["agree"] == r["steps"] for r in rows) else 1


def litert_lm_table(bundles: list[Path], args: argparse.Namespace) -> int:
    """--litert-lm: one markdown table of litegpu against LiteRT-LM."""
    if not bundles:
        log.error("--litert-lm times .litertlm bundles; none given or found")
        return 2
    print("| bundle | prefill tok/s LiteRT-LM | litegpu | ratio | decode tok/s LiteRT-LM | litegpu | ratio |")
    print("|---|---|---|---|---|---|---|")
    for path in bundles:
        r = versus_litert_lm(path, args.backend, args.threads, args.rounds)
        print(f"| {path.stem} | {r['litert_lm_prefill']:.0f} | {r['litegpu_prefill']:.0f} | "
              f"{r['litegpu_prefill'] / r['litert_lm_prefill']:.2f} | {r['litert_lm_decode']:.0f} | "
              f"{r['litegpu_decode']:.0f} | {r['litegpu_decode'] / r['litert_lm_decode']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
