"""The learned critics against the exact advantage (testbed/learning.py): how each SWEET-RL
variant's critic ranked its stage-2 candidates, overall and per agent turn, against the
test bed's A* (testbed.oracle.exact_advantages), with c (`sweet`) and without
(`sweet_no_info`). It tells a wrong critic from a stage 2 that cannot use a right ranking.
Beside it, the agreement the exact solver says a critic needs for stage 2 to reach MT-DPO
(`agreement_needed`: testbed.agreement.agreement_needed, once per bed), and
where each learned critic puts its credit on its own pairs, the answer or the questions
(`credit_splits`: sweet.critic.inspect.credit_split, per seed and pooled).
"""

from __future__ import annotations

import json
from pathlib import Path


def critic_vs_oracle(out: Path, seeds: list[int], policies: list[str], setup,
                     folders: dict[str, dict[int, str]] | None = None) -> dict[str, dict]:
    """How each SWEET-RL variant's critic ranked its stage-2 candidates against the test
    bed's exact advantage A* (testbed.oracle.exact_advantages for the setup's bed,
    success-valued), from the scores in
    candidates.jsonl (in `folders[name][seed]`, default seed<S>/<name>), over all seeds:
      pairs: of candidate pairs at one state whose A* differ, the share the critic orders
             the same way (a critic tie counts half); per_turn the same by agent turn;
      top1:  of states whose candidates' A* differ, the share where the critic's top
             candidate has the best A*; top1_last the same on the last turn only;
      questions: of pairs of two QUESTIONS at one state two turns before the end whose
             A* differ, the share ordered as A*: the one decision where a question's
             worth depends on what was already asked (ask for the constant still
             missing, not again for a known one), so the only one that tests whether
             the critic reads the dialogue rather than the question's wording;
      ties_split: of candidate pairs whose A* are EQUAL, the share the critic scores
             apart: stage 2 turns each into a preference the exact critic would not give
             (the solver: what limits stage 2 for a critic with continuous scores);
      stage2: the (chosen, rejected) pairs stage 2 trained on, drawn again as its run drew
             them (`stage2_pairs`): how many, and how many of them A* orders the same way,
             ties, or orders the other way."""
    return pool_checks([critic_counts(out, seed, policies, setup, folders) for seed in seeds])


COUNTS = ("agree", "pairs", "top", "top_n", "last", "last_n", "q_agree", "q_pairs", "ties", "split")


def critic_counts(out: Path, seed: int, policies: list[str], setup,
                  folders: dict[str, dict[int, str]] | None = None) -> dict[str, dict]:
    """One seed's counts behind `critic_vs_oracle`, per policy with stage-2 candidates:
    {name: {agree, pairs, top, top_n, last, last_n, q_agree, q_pairs, ties, split,
    by_turn: {turn: [agreeing, pairs]}, stage2: {pairs, agree, tied, reversed}}}, plain
    data that adds up over seeds (`pool_checks`)."""
    from colbench.protocols import ANSWER_MARKER
    from sweet.algorithms.sweet_rl import SweetConfig, load_states
    from sweet.core.records import read_candidates, state_key
    from testbed.oracle import exact_advantages

    sd = out / f"seed{seed}"
    found = {}
    for name in policies:  # a policy without stage-2 candidates (no critic) has nothing to check
        folder = Path((folders or {}).get(name, {}).get(seed, sd / name))
        rows = read_candidates(folder / "candidates.jsonl")
        if not rows:
            continue
        c = dict.fromkeys(COUNTS, 0.0)
        by_turn: dict[int, list[float]] = {}  # turn -> [agreeing, pairs]
        states = {state_key(s): s for s in load_states(SweetConfig(
            episodes=str(sd / "episodes.jsonl"), tasks=setup.train_tasks, env=setup.env, episode_fraction=1.0))}
        exact_of: dict[str, list[float]] = {}
        for key, row in rows.items():
            state = states[key]
            texts = [x.text for x in row.candidates]
            exact = exact_of[key] = exact_advantages(state, texts, setup.bed)
            critic = [x.advantage for x in row.candidates]
            asks = state.turn_index == setup.max_turns - 2
            turn = by_turn.setdefault(state.turn_index, [0.0, 0.0])
            for i in range(len(exact)):
                for j in range(i + 1, len(exact)):
                    if exact[i] == exact[j]:  # equal worth: stage 2 makes it a pair if the critic splits it
                        c["ties"] += 1
                        c["split"] += float(critic[i] != critic[j])
                    else:
                        d = (critic[i] - critic[j]) * (exact[i] - exact[j])
                        hit = 1.0 if d > 0 else 0.5 if critic[i] == critic[j] else 0.0
                        c["pairs"] += 1
                        c["agree"] += hit
                        turn[0], turn[1] = turn[0] + hit, turn[1] + 1
                        if asks and ANSWER_MARKER not in texts[i] and ANSWER_MARKER not in texts[j]:
                            c["q_pairs"] += 1
                            c["q_agree"] += hit
            if len(set(exact)) > 1:
                hit = float(exact[max(range(len(critic)), key=critic.__getitem__)] == max(exact))
                c["top"] += hit
                c["top_n"] += 1
                if state.turn_index == setup.max_turns - 1:
                    c["last"] += hit
                    c["last_n"] += 1
        found[name] = {**c, "by_turn": {str(t): v for t, v in sorted(by_turn.items())},
                       "stage2": stage2_pairs(folder, rows, exact_of, sd / "episodes.jsonl", setup, seed)}
    return found


def pool_checks(per_seed: list[dict[str, dict]]) -> dict[str, dict]:
    """`critic_counts` of several seeds as `critic_vs_oracle`'s shares (policies in the
    order they first appear; a policy with no pair of differing A* is left out)."""
    checks = {}
    for name in dict.fromkeys(n for counts in per_seed for n in counts):
        seeds = [counts[name] for counts in per_seed if name in counts]
        c = {k: sum(x[k] for x in seeds) for k in COUNTS}
        if not c["pairs"]:
            continue
        by_turn: dict[int, list[float]] = {}
        for x in seeds:
            for t, (a, n) in x["by_turn"].items():
                acc = by_turn.setdefault(int(t), [0.0, 0.0])
                acc[0], acc[1] = acc[0] + a, acc[1] + n
        stage2 = {k: sum(x["stage2"][k] for x in seeds) for k in ("pairs", "agree", "tied", "reversed")}
        checks[name] = {"pairs": c["agree"] / c["pairs"], "n_pairs": int(c["pairs"]),
                        "top1": c["top"] / max(c["top_n"], 1), "n_states": int(c["top_n"]),
                        "top1_last": c["last"] / c["last_n"] if c["last_n"] else None, "n_last": int(c["last_n"]),
                        "questions": c["q_agree"] / c["q_pairs"] if c["q_pairs"] else None,
                        "n_questions": int(c["q_pairs"]),
                        "ties_split": c["split"] / c["ties"] if c["ties"] else None, "n_ties": int(c["ties"]),
                        "stage2": stage2,
                        "per_turn": {str(t): {"pairs": a / n, "n_pairs": int(n)}
                                     for t, (a, n) in sorted(by_turn.items()) if n}}
    return checks


def stage2_pairs(folder: Path, rows: dict, exact_of: dict[str, list[float]], episodes: Path, setup,
                 seed: int) -> dict[str, int]:
    """The preference pairs a SWEET-RL run's stage 2 trained on, drawn again as it drew
    them (sweet.core.records.make_action_pairs over its states in its order, with its
    pairs_per_state and seed, from the run's config.json; without one, the test bed's
    settings: every state of `episodes`, 4 pairs per state, `seed`), each compared with A*
    (`exact_of`: state key -> the exact advantage of each of its candidates): how many
    pairs, and how many A* orders as the critic did (`agree`), scores equal (`tied`: a
    preference the exact critic would not give) or orders the other way (`reversed`)."""
    import random
    from dataclasses import fields

    from sweet.algorithms.sweet_rl import SweetConfig, load_states
    from sweet.core.records import make_action_pairs, state_key

    config = folder / "config.json"
    if config.exists():
        run = json.loads(config.read_text())
        names = {f.name for f in fields(SweetConfig)}
        cfg = SweetConfig(**{k: v for k, v in run["sweet"].items() if k in names and k != "episodes"},
                          episodes=str(episodes))  # the seed's file, wherever the run folder now lies
        seed = int(run["train"]["seed"])
    else:
        cfg = SweetConfig(episodes=str(episodes), tasks=setup.train_tasks, env=setup.env, episode_fraction=1.0)
    scored = [(s, rows[state_key(s)].for_state(s)) for s in load_states(cfg) if state_key(s) in rows]
    drawn, _ = make_action_pairs(scored, cfg.pairs_per_state, random.Random(seed))
    counts = {"pairs": len(drawn), "agree": 0, "tied": 0, "reversed": 0}
    index = {id(c): i for _, cands in scored for i, c in enumerate(cands)}
    for p in drawn:
        exact = exact_of[state_key(p.state)]
        a, b = exact[index[id(p.chosen)]], exact[index[id(p.rejected)]]
        counts["agree" if a > b else "tied" if a == b else "reversed"] += 1
    return counts


def checks_table(checks: dict[str, dict]) -> str:
    lines = ["| critic of | pairs ordered as A* | top candidate is A*-best | same, last turn | question pairs, "
             "two turns before the end | equal-A* pairs scored apart | stage-2 pairs: as A* / A* ties / reversed |",
             "|---|---|---|---|---|---|---|"]
    for name, c in checks.items():
        last = "n/a" if c["top1_last"] is None else f"{c['top1_last']:.2f} (of {c['n_last']})"
        asks = "n/a" if c.get("questions") is None else f"{c['questions']:.2f} (of {c['n_questions']})"
        apart = "n/a" if c.get("ties_split") is None else f"{c['ties_split']:.2f} (of {c['n_ties']})"
        s2 = c.get("stage2")
        drawn = ("n/a" if not s2 or not s2["pairs"] else
                 f"{s2['agree']} / {s2['tied']} / {s2['reversed']} (of {s2['pairs']})")
        lines.append(f"| {name} | {c['pairs']:.2f} (of {c['n_pairs']}) | {c['top1']:.2f} (of {c['n_states']}) | {last} "
                     f"| {asks} | {apart} | {drawn} |")
    turns = sorted({int(t) for c in checks.values() for t in c.get("per_turn", {})})
    if turns:
        lines += ["", "Pairs ordered as A*, per agent turn (0 = the first):", "",
                  "| critic of | " + " | ".join(f"turn {t}" for t in turns) + " |", "|---|" + "---|" * len(turns)]
        for name, c in checks.items():
            cells = [f"{c['per_turn'][str(t)]['pairs']:.2f} (of {c['per_turn'][str(t)]['n_pairs']})"
                     if str(t) in c["per_turn"] else "n/a" for t in turns]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def agreement_needed(bed: str, setup, out: Path) -> dict:
    """The exact solver's agreement with A* a critic needs for per-turn DPO to reach MT-DPO,
    per KL level and noise family (testbed.agreement.agreement_needed, its
    `to_json`; seconds on `default`), cached in OUT/agreement_needed.json under its settings."""
    from testbed import agreement as testbed_agreement
    from testbed import bed as testbed_bed

    key = {"bed": bed, "episodes_per_task": setup.episodes_per_task, "candidates": setup.candidates}
    cache = out / "agreement_needed.json"
    if cache.exists() and testbed_bed.bed_record((d := json.loads(cache.read_text())).get("key", {})) == key:
        return d["agreement_needed"]
    needed = testbed_agreement.agreement_needed(bed, episodes_per_task=setup.episodes_per_task,
                                            candidates=setup.candidates).to_json()
    out.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"key": key, "agreement_needed": needed}, indent=2))
    return needed


def needed_table(needed: dict) -> str:
    """The solver's needed agreement per KL level (overall, and per turn at that noise),
    and the solver's own learned critics by the same measure, to read beside the checks."""
    levels = list(needed["mtdpo"])
    names = {"ties_broken": "Q* + noise per action", "ties_kept": "Q* + noise per value of Q* (ties kept)"}

    def cell(n: dict) -> str:
        if n["status"] == "none":
            return "none suffices (the oracle is below MT-DPO)"
        turns = ", ".join(f"turn {t} {v:.2f}" for t, v in n["per_turn"].items())
        return f"{'<= ' if n['status'] == 'grid_end' else ''}{n['agreement']:.2f} ({turns})"

    lines = ["| critic family | " + " | ".join(f"KL {k} (MT-DPO {needed['mtdpo'][k]:.3f})" for k in levels) + " |",
             "|---|" + "---|" * len(levels)]
    for family, f in needed["families"].items():
        lines.append(f"| {names.get(family, family)} | " + " | ".join(cell(f["needed"][k]) for k in levels) + " |")
    learned = "; ".join(f"{name} {a['overall']:.2f} ("
                        + ", ".join(f"turn {t} {v:.2f}" for t, v in a["per_turn"].items())
                        + f"; ties split {a['ties_split']:.2f})" for name, a in needed["learned"].items())
    return "\n".join(lines + ["", f"The solver's own learned critics, same measure in the population: {learned}."])


def credit_splits(out: Path, seeds: list[int], policies: list[str], setup) -> dict[str, dict]:
    """Per SWEET-RL variant with a learned critic (OUT/seed<S>/critic_<name>): the credit
    split of that critic on the equal-length pairs its pairing makes from the seed's
    episodes (sweet.critic.inspect.credit_split), per seed and pooled over seeds
    (pair-weighted means)."""
    return pool_credit({seed: seed_credit(out, seed, policies, setup) for seed in seeds})


def seed_credit(out: Path, seed: int, policies: list[str], setup) -> dict[str, dict]:
    """One seed's credit splits behind `credit_splits`: {name: CreditSplit.to_json()}."""
    from colbench.episodes import load_episodes
    from sweet.critic.inspect import score_credit_split
    from sweet.critic.model import TrainedCritic, load_training_info

    found: dict[str, dict] = {}
    info = None
    for name in policies:
        critic = out / f"seed{seed}" / f"critic_{name}"
        if not (critic / "critic_config.json").exists():
            continue
        info = info or load_training_info(setup.train_tasks, env=setup.env)
        episodes = load_episodes(out / f"seed{seed}" / "episodes.jsonl", env=setup.env)
        split = score_credit_split(TrainedCritic.load(critic), str(critic), episodes, info)
        if split is not None:
            found[name] = split.to_json()
    return found


def pool_credit(per_seed: dict[int, dict[str, dict]]) -> dict[str, dict]:
    """`seed_credit` of several seeds: {name: {"pooled": pool_splits(...), "per_seed": {seed: split}}}."""
    found: dict[str, dict] = {}
    for name in dict.fromkeys(n for splits in per_seed.values() for n in splits):
        seeds = {str(s): splits[name] for s, splits in per_seed.items() if name in splits}
        found[name] = {"pooled": pool_splits(list(seeds.values())), "per_seed": seeds}
    return found


def pool_splits(splits: list[dict]) -> dict:
    """Credit splits (CreditSplit.to_json) of several seeds as one: pair-weighted means,
    the answer's share of the pooled mean margin."""
    from sweet.critic.inspect import CreditSplit

    n = sum(v["pairs"] for v in splits)
    pooled = {k: sum(v[k] * v["pairs"] for v in splits) / n
              for k in ("earlier", "last", "ordered_by_earlier", "ordered_by_last")}
    return CreditSplit.from_json({"pairs": n, **pooled}).to_json()


def credit_table(splits: dict[str, dict]) -> str:
    lines = ["| critic of | equal-length pairs | mean margin | share on the answer | ordered by the answer alone "
             "| ordered by the questions alone |", "|---|---|---|---|---|---|"]
    for name, s in splits.items():
        p = s["pooled"]
        share = "n/a" if p["last_share"] is None else f"{p['last_share']:.0%}"
        lines.append(f"| {name} | {p['pairs']} | {p['earlier'] + p['last']:+.2f} | {share} | "
                     f"{p['ordered_by_last']:.2f} | {p['ordered_by_earlier']:.2f} |")
    return "\n".join(lines)
