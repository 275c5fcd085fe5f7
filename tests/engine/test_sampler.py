"""Top-k and top-p keep the tokens their rule says (checked against the rule in float64 over the whole
vocabulary, sorted), found without sorting the vocabulary, and a sampled token is drawn from those alone."""

from __future__ import annotations

import pytest
import torch

from radixchat.engine.request import Request
from radixchat.engine.sampler import NUCLEUS_CANDIDATES, Sampler, penalized_ids, top_k_top_p
from radixchat.sampling import SamplingParams


def _mass_before(row: torch.Tensor, top_k: int) -> torch.Tensor:
    """Each token's probability mass before it, most likely first, in float64 over the whole vocabulary (inf for
    the tokens top-k drops): a token stays while its mass before is under top_p."""
    row = row.double()
    if 0 < top_k < row.numel():
        row = row.masked_fill(row < torch.topk(row, top_k).values[-1], float("-inf"))
    probs = row.softmax(-1)
    sorted_probs, order = torch.sort(probs, descending=True)
    before = torch.empty_like(probs)
    before[order] = sorted_probs.cumsum(-1) - sorted_probs
    return before.masked_fill(row == float("-inf"), float("inf"))


def _rows(vocab: int):
    g = torch.Generator().manual_seed(vocab)
    for scale in (0.05, 1.0, 4.0, 20.0):  # flat (a nucleus of thousands) to peaked (one or two tokens)
        yield torch.randn(vocab, generator=g) * scale
    grammar = torch.randn(vocab, generator=g) * 2  # a grammar mask leaves a few tokens
    allowed = torch.randperm(vocab, generator=g)[:5]
    yield torch.full((vocab,), float("-inf")).index_copy_(0, allowed, grammar[allowed])


@pytest.mark.parametrize("vocab", [50, 49152])
@pytest.mark.parametrize(
    ("top_k", "top_p"), [(0, 0.9), (0, 0.5), (0, 0.999), (0, 1e-30), (40, 1.0), (40, 0.8), (3, 0.95)]
)
def test_the_kept_tokens_are_the_rules_over_the_whole_vocabulary(vocab, top_k, top_p):
    for row in _rows(vocab):
        kept = top_k_top_p(row, top_k, top_p)
        assert kept is not None
        ids, logits = kept
        kept_ids = set(ids.tolist())
        before = _mass_before(row, top_k)
        first = int(row.argmax())
        must = {first} | set(torch.nonzero(before < top_p - 1e-5).flatten().tolist())
        may = must | set(torch.nonzero(before <= top_p + 1e-5).flatten().tolist())
        assert (
            must <= kept_ids <= may
        )  # the rule, up to float32 softmax rounding (~1e-5 of mass) at the boundary
        assert len(set(ids.tolist())) == len(ids)  # each once
        assert torch.equal(logits, row[ids])


def test_a_flat_distribution_looks_past_the_first_candidates():
    row = torch.randn(49152, generator=torch.Generator().manual_seed(3)) * 0.05
    ids, _ = top_k_top_p(row, 0, 0.9)
    assert len(ids) > 4 * NUCLEUS_CANDIDATES  # found after widening the search
    before = _mass_before(row, 0)
    assert set(ids.tolist()) == set(torch.nonzero(before < 0.9).flatten().tolist())


def test_no_rule_keeps_every_token():
    assert top_k_top_p(torch.randn(100), 0, 1.0) is None
    assert top_k_top_p(torch.randn(100), 100, 1.0) is None


def _request(params: SamplingParams) -> Request:
    return Request(rid=1, prompt_ids=[1, 2, 3], params=params, max_total_len=64)


def test_a_sampled_token_is_one_the_rules_kept_and_follows_their_probabilities():
    vocab = 1000
    row = torch.full((vocab,), -10.0)
    row[[17, 500, 999]] = torch.tensor([2.0, 1.0, 0.0])  # 0.67, 0.24, 0.09 of the mass among themselves
    sampler = Sampler(vocab, eos_ids=set())
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=0)
    req = _request(params)
    req.generator = torch.Generator().manual_seed(0)
    counts: dict[int, int] = {}
    for _ in range(3000):
        token = sampler.sample(row.clone()[None], [req])[0]
        counts[token] = counts.get(token, 0) + 1
    assert set(counts) <= {17, 500, 999} and set(counts) >= {17, 500}
    probs = row.softmax(-1)
    assert abs(counts[17] / 3000 - probs[17] / probs[[17, 500, 999]].sum()) < 0.05


def test_the_penalized_ids_follow_the_output_as_it_grows_and_shrinks():
    req = _request(SamplingParams(repetition_penalty=1.3))
    req.prompt_ids = [5, 9, 5, 2]
    for token in (9, 11, 11, 40, 2, 7):
        req.output_ids.append(token)
        assert sorted(penalized_ids(req).tolist()) == sorted(set(req.all_ids))
    del req.output_ids[-3:]  # a retraction, or a regenerate reusing the request
    assert sorted(penalized_ids(req).tolist()) == sorted(set(req.all_ids))
    req.prompt_ids = [*req.prompt_ids, 33]
    assert sorted(penalized_ids(req).tolist()) == sorted(set(req.all_ids))


def test_the_repetition_penalty_steers_greedy_decoding_off_seen_tokens():
    vocab = 100
    sampler = Sampler(vocab, eos_ids=set())
    req = _request(SamplingParams(temperature=0.0, repetition_penalty=2.0))
    row = torch.zeros(vocab)
    row[[3, 60, 61]] = torch.tensor([5.0, 4.0, 3.0])
    assert sampler.sample(row.clone()[None], [req]) == [60]  # 3 is in the prompt: 5 / 2 < 4
    req.output_ids.append(60)
    assert sampler.sample(row.clone()[None], [req]) == [61]  # and now 60 was said: 4 / 2 < 3
