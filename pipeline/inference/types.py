"""The engine-neutral types of inference: what every engine's probes, samplers and
vocabularies hand each other and the answer distributions (``simpipe.answers``).

They live here, beside ``base`` and not in one engine's subpackage, so that no engine
imports another's modules for a shared type: the llama.cpp and vLLM sampler models both
return ``NextToken`` from ``TopLogprobs``, and every probe (embedded, llama.cpp's server,
vLLM's server) is a ``Probe`` that raises ``ProbeError``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChainSettings:
    """The sampling parameters a request sends (llama.cpp's names and meanings)."""

    temperature: float
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off

    @property
    def truncates(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0


@dataclass(frozen=True)
class TopLogprobs:
    """The ``n`` most likely next tokens with their raw log-probabilities, most likely first.

    ``complete`` means these are all the tokens of the vocabulary that can have any
    probability (nothing unseen).
    """

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    complete: bool = False

    @property
    def floor(self) -> float:
        """An upper bound on the log-probability of every token not listed."""
        return -math.inf if self.complete or not self.logprobs else self.logprobs[-1]


@dataclass(frozen=True)
class NextToken:
    """The distribution of the token a server returns, over the grammar's valid tokens."""

    probs: dict[int, float]
    error_bound: float  # total-variation distance to the true distribution, at most


#: probe(path, n) -> (the top-n raw log-probabilities after prompt + path, prompt tokens the
#: model evaluated for it, tokens it generated)
Probe = Callable[[tuple[int, ...], int], tuple[TopLogprobs, int, int]]


class ProbeError(RuntimeError):
    """The model did not return next-token log-probabilities for a prompt."""


@dataclass(frozen=True)
class AnswerVocab:
    """What answer sharing needs from a model's vocabulary."""

    n_tokens: int
    eog_ids: frozenset[int]
    # id -> text, for every token whose text uses only the answer alphabet
    pieces: dict[int, str]


#: Token texts llama.cpp treats as end of generation whatever the metadata says: read from a
#: GGUF file (``llamacpp.gguf_vocab``) and asked of llama.cpp's and vLLM's servers alike.
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
})

#: The longest answer-token text a server's vocabulary is asked about (``candidate_pieces``).
MAX_PIECE_CHARS = 3
#: ``post(path, body) -> JSON`` (raises ProbeError): a server probe's one request
Post = Callable[[str, dict], Any]
#: ``post_many(path, bodies) -> [JSON]`` in order
PostMany = Callable[[str, list[dict]], list[Any]]


def candidate_pieces(alphabet: frozenset[str]) -> list[str]:
    """Texts an answer token can have: digits, with at most a leading space then sign
    (what llama.cpp's and vLLM's servers are asked to tokenize for the answer vocabulary)."""
    digits = sorted(c for c in alphabet if c.isdigit())
    leads = [""] + [c for c in (" ", "-", " -") if set(c) <= alphabet]
    out = []
    for lead in leads:
        for n in range(0 if lead else 1, MAX_PIECE_CHARS - len(lead) + 1):
            out.extend(lead + "".join(p) for p in itertools.product(digits, repeat=n))
    return out
