"""Does our environment score like InterCode? Its GPT-4 episodes replayed turn by turn (a CLI).

    python -m coevo_jax.envs.intercode_sql.agreement [--backend sqlite|mariadb|mysql] [--episodes FILE] [--json OUT]

`reward_agreement` replays every recorded action through `InterCodeSqlEnv` (on the backend `--backend` names;
the mariadb one needs `bash launch/mariadb.sh start`, the mysql one `bash launch/mysql.sh start`) and compares our score after each turn with the reward
InterCode recorded (turns its harness rejected before they reached the database are skipped). The CLI prints the agreement summary and, per split, how many expert demonstrations
(`experts.replay_experts`) were kept and dropped; `--json` also writes every disagreement.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from coevo_jax.envs.intercode_sql.env import BACKENDS, InterCodeSqlEnv
from coevo_jax.envs.intercode_sql.experts import (
    EPISODES_PATH,
    HARNESS_REJECTION,
    GptEpisode,
    load_episodes,
    replay_experts,
)

REWARD_TOLERANCE = 0.011  # InterCode rounds tau-scaled rewards to 2 decimals


@dataclasses.dataclass
class Agreement:
    """How often our per-turn score equals InterCode's recorded reward (within rounding)."""

    turns: int = 0
    turns_agreeing: int = 0
    harness_turns_skipped: int = 0
    episodes: int = 0
    final_agreeing: int = 0
    success_agreeing: int = 0  # both say reward 1, or both say below 1, after the last turn
    disagreements: list[dict] = dataclasses.field(default_factory=list)

    def summary(self) -> dict:
        return {
            "turns": self.turns,
            "turns_agreeing": self.turns_agreeing,
            "turn_agreement": self.turns_agreeing / max(self.turns, 1),
            "episodes": self.episodes,
            "final_agreeing": self.final_agreeing,
            "final_reward_agreement": self.final_agreeing / max(self.episodes, 1),
            "success_agreement": self.success_agreeing / max(self.episodes, 1),
            "harness_turns_skipped": self.harness_turns_skipped,
        }


def reward_agreement(env: InterCodeSqlEnv, episodes: list[GptEpisode]) -> Agreement:
    """Replays each episode's actions through `env`, comparing our score after every turn with InterCode's."""
    report = Agreement()
    for episode in episodes:
        env.reset(episode.task_id)
        ours, theirs = 0.0, 0.0
        for turn, (action, observation, recorded) in enumerate(
            zip(episode.actions, episode.observations, episode.rewards, strict=True)
        ):
            if observation.startswith(HARNESS_REJECTION):
                report.harness_turns_skipped += 1
                continue
            text, ours, _, _ = env.step(action)
            theirs = recorded
            report.turns += 1
            if abs(ours - recorded) <= REWARD_TOLERANCE:
                report.turns_agreeing += 1
            else:
                report.disagreements.append(
                    {
                        "task": episode.task_id,
                        "turn": turn,
                        "action": action,
                        "mysql_observation": observation[:300],
                        "our_observation": text[:300],
                        "intercode_reward": recorded,
                        "our_reward": ours,
                    }
                )
        report.episodes += 1
        report.final_agreeing += abs(ours - theirs) <= REWARD_TOLERANCE
        report.success_agreeing += (ours == 1.0) == (theirs == 1.0)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="InterCode-SQL: reward agreement with InterCode's GPT-4 runs"
    )
    parser.add_argument("--backend", choices=BACKENDS, default="sqlite")
    parser.add_argument("--episodes", default=str(EPISODES_PATH))
    parser.add_argument("--json", help="write the summary and every disagreement here")
    args = parser.parse_args(argv)
    env = InterCodeSqlEnv(backend=args.backend)
    episodes = load_episodes(args.episodes)
    report = reward_agreement(env, episodes)
    summary = report.summary()
    experts = {split: replay_experts(env, split, episodes) for split in env.splits()}
    summary["experts"] = {s: {"kept": len(k), "dropped": len(d)} for s, (k, d) in experts.items()}
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps({**summary, "disagreements": report.disagreements}, indent=1))
    env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
