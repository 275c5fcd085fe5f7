"""The KV pool's dtype: ``auto`` is measured once per machine and cached, bad values are usage errors, and every
dtype ``auto`` can pick keeps the real model's predictions over a long text (the quality guard)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from bench.quality import prose_ids
from radixchat.config import Settings
from radixchat.engine import kv_dtype as KD
from radixchat.engine.attention import paged_decode_usable
from radixchat.engine.batch import ScheduledBatch
from radixchat.engine.kernels import load_paged_attention
from radixchat.engine.kv_pool import KVPool, KVShape, ReqToTokenTable
from radixchat.engine.model_runner import ModelRunner
from radixchat.errors import ConfigError

CPU = torch.device("cpu")


def test_an_unknown_kv_dtype_is_a_usage_error_naming_the_choices():
    with pytest.raises(ConfigError, match="kv_dtype.*'auto', 'float32', 'bfloat16' or 'float16'"):
        Settings.load({"kv_dtype": "int8"})
    with pytest.raises(ConfigError, match="auto, float32, bfloat16, float16"):
        KD.check_kv_dtype("fp8")


def test_auto_takes_a_narrower_dtype_only_when_it_clearly_wins():
    assert KD.choose({"float32": 1.0, "float16": 0.95, "bfloat16": 0.93}) == "float32"  # within the margin
    assert KD.choose({"float32": 1.0, "float16": 0.6, "bfloat16": 0.58}) == "float16"  # a tie: more mantissa
    assert KD.choose({"float32": 1.0, "float16": 0.9, "bfloat16": 0.5}) == "bfloat16"  # clearly faster
    assert KD.choose({"float32": 1.0}) == "float32"
    # a probe taken again keeps the earlier choice unless the new winner beats it by the margin
    assert KD.choose({"float32": 1.0, "float16": 0.95, "bfloat16": 0.93}, held="float16") == "float16"
    assert KD.choose({"float32": 0.8, "float16": 1.0, "bfloat16": 1.0}, held="float16") == "float32"
    assert KD.choose({"float32": 1.0, "float16": 0.6, "bfloat16": 0.58}, held="bfloat16") == "bfloat16"


def test_the_choice_is_measured_once_per_machine_and_cached(tmp_path, monkeypatch):
    shape = (4, 2, 64)
    calls = []
    real = KD.probe

    def counting(s):  # noqa: ANN001, ANN202
        calls.append(s)
        return real(s)

    monkeypatch.setattr(KD, "probe", counting)
    monkeypatch.setattr(KD, "PROBE_CONTEXT", 512)  # the choice's mechanics, not its figures
    monkeypatch.setattr(KD, "cpu_load", lambda: 0.1)  # a quiet machine: a busy one re-probes (below)
    first = KD.resolve_kv_dtype("auto", torch.float32, CPU, shape, tmp_path)
    again = KD.resolve_kv_dtype("auto", torch.float32, CPU, shape, tmp_path)
    assert first == again and first in (torch.float32, torch.float16, torch.bfloat16)
    assert calls == [shape]  # the second start read the cache
    # An explicit dtype, a model in another dtype, or no setting (the exact path) never probe.
    assert KD.resolve_kv_dtype("bfloat16", torch.float32, CPU, shape, tmp_path) == torch.bfloat16
    assert KD.resolve_kv_dtype("auto", torch.bfloat16, CPU, shape, tmp_path) == torch.bfloat16
    assert KD.resolve_kv_dtype(None, torch.float32, CPU, shape, tmp_path) == torch.float32
    assert calls == [shape]


def test_a_probe_taken_on_a_busy_machine_is_taken_again_once_it_is_quiet(tmp_path, monkeypatch):
    shape = (4, 2, 64)
    calls = []
    real = KD.probe
    monkeypatch.setattr(KD, "probe", lambda s: calls.append(s) or real(s))
    monkeypatch.setattr(KD, "PROBE_CONTEXT", 512)
    monkeypatch.setattr(KD, "cpu_load", lambda: 1.5)
    KD.resolve_kv_dtype("auto", torch.float32, CPU, shape, tmp_path)
    KD.resolve_kv_dtype("auto", torch.float32, CPU, shape, tmp_path)  # still busy: the busy probe is used
    assert len(calls) == 1
    monkeypatch.setattr(KD, "cpu_load", lambda: 0.1)
    KD.resolve_kv_dtype("auto", torch.float32, CPU, shape, tmp_path)  # quiet now: measured again
    KD.resolve_kv_dtype("auto", torch.float32, CPU, shape, tmp_path)  # and that quiet probe is kept
    assert len(calls) == 2


def test_a_deterministic_start_holds_a_busy_probe_and_a_new_probe_must_clearly_win(tmp_path, monkeypatch):
    """A deterministic reply may not change because a probe was taken again between two processes; and a probe
    taken again replaces the pool's dtype only where the new one is clearly faster than the one held."""
    shape = (4, 2, 64)
    measured = iter(
        [
            {"float32": 1.0, "float16": 0.8, "bfloat16": 0.9},  # busy: float16
            {
                "float32": 1.0,
                "float16": 0.95,
                "bfloat16": 0.97,
            },  # quiet: float32 by the rule, within the margin
            {"float32": 1.0, "float16": 1.2, "bfloat16": 1.2},  # float32 clearly faster than the held float16
        ]
    )
    monkeypatch.setattr(KD, "probe", lambda s: next(measured))
    monkeypatch.setattr(KD, "cpu_load", lambda: 1.5)
    assert KD.resolve_kv_dtype("auto", torch.float32, CPU, shape, tmp_path) == torch.float16
    monkeypatch.setattr(KD, "cpu_load", lambda: 0.1)
    assert KD.resolve_kv_dtype("auto", torch.float32, CPU, shape, tmp_path, hold=True) == torch.float16
    assert KD.resolve_kv_dtype("auto", torch.float32, CPU, shape, tmp_path) == torch.float16  # measured: held
    assert KD.resolve_kv_dtype("auto", torch.float32, CPU, shape, tmp_path) == torch.float16  # quiet: cached
    monkeypatch.setattr(KD, "cpu_load", lambda: 1.5)
    KD.write_probe(
        tmp_path, KD._signature(shape), {"timings": {"float32": 1.0}, "auto": "float16", "load": 1.5}
    )
    monkeypatch.setattr(KD, "cpu_load", lambda: 0.1)
    assert KD.resolve_kv_dtype("auto", torch.float32, CPU, shape, tmp_path) == torch.float32
    assert next(measured, None) is None


def _teacher_forced(lm, ids: list[int], kv_dtype: torch.dtype, chunk: int = 512, decoded: int = 64):
    """(top-1 token, NLL of the next token) at every position, computed over a pool of ``kv_dtype`` as the
    engine would: prefill chunks whose attention reads earlier chunks from the pool (in bfloat16 products
    over a half-precision pool), then the last ``decoded`` positions one token at a time, as decode steps
    (the paged kernels where they are built)."""
    n = len(ids)
    pool = KVPool(KVShape(lm.num_layers, lm.num_kv_heads, lm.head_dim, kv_dtype), n, CPU)
    table = ReqToTokenTable(1, n, CPU)
    table.write(0, 0, list(range(1, n + 1)))
    paged = paged_decode_usable(lm.head_dim, CPU)
    # as the engine runs it: prefill chunks in place, in bfloat16, over a half-precision pool
    runner = ModelRunner(lm.model, pool, table, paged=paged, paged_extend=paged and kv_dtype != torch.float32)
    req = SimpleNamespace(row=0, total_len=n)
    target = torch.tensor(ids[1:] + [0])
    top, nll = [], []
    start = 0
    with torch.inference_mode():
        while start < n:
            size = 1 if start >= n - decoded else min(chunk, n - decoded - start)
            decode = size == 1 and start > 0
            batch = ScheduledBatch([req], [start], [size], ids[start : start + size], int(decode))
            meta, pos, _ = runner.build_metadata(batch)
            logits = (
                lm.model(
                    input_ids=torch.tensor([ids[start : start + size]]),
                    position_ids=pos[None],
                    use_cache=False,
                    radix=meta,
                )
                .logits[0]
                .float()
            )
            top.append(logits.argmax(-1))
            nll.append(
                torch.nn.functional.cross_entropy(logits, target[start : start + size], reduction="none")
            )
            start += size
    return torch.cat(top)[:-1], torch.cat(nll)[:-1]


@pytest.mark.real_model
def test_quality_guard_every_narrow_kv_dtype_keeps_the_models_predictions(smol, smol_tokenizer):
    """Over a ~4k-token text, teacher-forced, the model over a float16 or bfloat16 pool agrees with the
    float32 pool on the top-1 token at >= 98% of positions, and its mean NLL is within 2% (issue 32)."""
    load_paged_attention()
    lm, _ = smol
    ids = prose_ids(smol_tokenizer, 4000)
    assert len(ids) >= 3900
    base_top, base_nll = _teacher_forced(lm, ids, torch.float32)
    for dtype in (torch.float16, torch.bfloat16):
        top, nll = _teacher_forced(lm, ids, dtype)
        agree = (top == base_top).float().mean().item()
        print(f"KV {dtype}: top-1 agreement {agree:.4f}, NLL {nll.mean():.4f} vs {base_nll.mean():.4f}")
        assert agree >= 0.98, (dtype, agree)
        assert abs(nll.mean().item() - base_nll.mean().item()) <= 0.02 * base_nll.mean().item(), dtype
