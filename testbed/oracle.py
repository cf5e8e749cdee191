"""An oracle critic for the CPU test bed: the exact per-turn advantage, as a CandidateRanker.

A diagnostic, not part of SWEET-RL: stage 2 (sweet/algorithms/sweet_rl.py, `--critic oracle`)
ranks candidates with the advantage the stage-1 critic is meant to learn, computed
exactly from the training-time information c (testbed.mdp.exact_advantage, in success
probability, on every preset). If stage 2 learns with it but not with the trained critic,
the critic is wrong; if it fails with both, stage 2 cannot use even a right ranking.
"""

from __future__ import annotations

from typing import Sequence

from sweet.core.records import State
from testbed import mdp
from testbed import bed as testbed_bed


class OracleCritic:
    """The CandidateRanker protocol (sweet.algorithms.sweet_candidates) with the test bed's exact advantage.

    tokenizer: the policy's (candidates are its token ids; decoded without special tokens).
    env:       the environment name; only "testbed" has an exact advantage.
    bed:       the test-bed preset of the tasks (testbed/bed.py; default `DEFAULT_BED`).
    """

    def __init__(self, tokenizer, env: str = "testbed", bed: str = testbed_bed.DEFAULT_BED):
        if env != "testbed":
            raise ValueError(f"OracleCritic knows the exact advantage of the 'testbed' environment only, got {env!r}")
        self.tokenizer = tokenizer
        self.design = testbed_bed.design(bed)

    def score_states(self, items: Sequence[tuple[State, Sequence[Sequence[int]], Sequence[str | None]]]
                     ) -> list[list[float]]:
        """Per (state, candidate action ids, finish reasons): A*(o_t, a, c) per candidate.
        A candidate cut at max_new_tokens is scored as the text it is (the runner would too)."""
        return [exact_advantages(state, self.tokenizer.batch_decode([list(ids) for ids in actions],
                                                                    skip_special_tokens=True), self.design)
                for state, actions, _ in items]


def exact_advantages(state: State, texts: Sequence[str],
                     bed: testbed_bed.BedDesign | str = testbed_bed.DEFAULT_BED) -> list[float]:
    """A*(o_t, a, c) (testbed.mdp.exact_advantage) of each candidate message `texts` at a
    test-bed State of a task of `bed`: its human replies so far, its turns left and its
    training-time information (the hidden reference)."""
    s = testbed_bed.design(bed)
    replies = [m["content"] for m in state.prompt if m["role"] == "user"][1:]  # the first is the description
    return [mdp.exact_advantage(s, state.training_info, replies, text, s.turns - state.turn_index) for text in texts]
