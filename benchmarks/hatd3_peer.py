"""The peer run beside ``baselines/hatd3.py``: AgileRL's MATD3 on the same MPE task, settings and budget.

    pip install torch==2.13.0 -e ".[bench-marl]"       # its own environment (AgileRL pins pettingzoo < 1.27)
    OMP_NUM_THREADS=1 python benchmarks/hatd3_peer.py --seed 0 --total-steps 1000000

AgileRL (PyPI) has MATD3, not HATD3: each agent has its own twin critics on every agent's observation and
action, and the actors are updated together rather than one after another. Everything else is HARL's tuned
HATD3 setting for simple_speaker_listener (continuous), which ``baselines/hatd3.py`` runs: batches of 1,000,
one update per 20 transitions stored, 10,000 transitions before the first update, Gaussian exploration noise
0.1, target smoothing 0.2 clipped at 0.5, policy delay 2, actor learning rate 5e-4, critic 1e-3, gamma 0.99,
tau 0.005, networks of 128 units (AgileRL's smallest stack, an encoder and a head, has three hidden layers
where HARL's has two; no layer norm), bootstrapping through the time limit (AgileRL stores terminations only as
dones). One env steps here (AgileRL's vector envs are subprocesses) with an update every 20 of its steps: the
same number of updates per stored transition as rlflow's 20 envs with one update per step.

Every ``--eval-every`` env steps it evaluates the actors without noise for ``--eval-episodes`` episodes and
prints the mean team return (the sum over both agents), the quantity rlflow's run logs; the evaluations go to
``--out`` as CSV (step, mean return, seconds so far). After the last step it evaluates the final actors over
``--final-eval-episodes`` (100) episodes, as ``python -m baselines.hatd3 --evaluate RUN/learner.pt
--eval-episodes 100`` does for rlflow's.
"""

from __future__ import annotations

import argparse
import csv
import time

import numpy as np
import torch
from agilerl.algorithms import MATD3
from agilerl.components.data import MultiAgentTransition, transition_to_tensordict
from agilerl.components.replay_buffer import ReplayBuffer
from agilerl.vector import PzDummyVecEnv
from mpe2 import simple_speaker_listener_v4


def make_env(seed: int) -> PzDummyVecEnv:
    env = PzDummyVecEnv(simple_speaker_listener_v4.parallel_env(max_cycles=25, continuous_actions=True))
    env.reset(seed=seed)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--total-steps", type=int, default=1_000_000)
    parser.add_argument("--eval-every", type=int, default=100_000)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--final-eval-episodes", type=int, default=100,
                        help="episodes of the evaluation after the last step")
    parser.add_argument("--out", default="hatd3_peer.csv")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    env, eval_env = make_env(args.seed), make_env(args.seed + 10_000)
    agent_ids = list(env.agents)
    for i, a in enumerate(agent_ids):  # the warm-up's random actions
        env.single_action_space(a).seed(args.seed + i)
    agent = MATD3(
        observation_spaces=[env.single_observation_space(a) for a in agent_ids],
        action_spaces=[env.single_action_space(a) for a in agent_ids],
        agent_ids=agent_ids, O_U_noise=False, expl_noise=0.1, policy_freq=2, batch_size=1_000,
        lr_actor=5e-4, lr_critic=1e-3, learn_step=20, gamma=0.99, tau=0.005,
        net_config={"latent_dim": 128, "encoder_config": {"hidden_size": [128], "layer_norm": False},
                    "head_config": {"hidden_size": [128], "layer_norm": False}},
    )
    memory = ReplayBuffer(max_size=1_000_000)
    obs, info = env.reset(seed=args.seed)
    start, rows = time.perf_counter(), []
    for step in range(1, args.total_steps + 1):
        if step <= 10_000:  # uniformly random actions first, as HARL's warm-up
            raw = {a: env.single_action_space(a).sample()[None] for a in agent_ids}
            action = raw
        else:
            action, raw = agent.get_action(obs=obs, infos=info)
        next_obs, reward, termination, truncation, info = env.step(action)
        transition = transition_to_tensordict(MultiAgentTransition(obs=obs, action=raw, reward=reward,
                                                                   next_obs=next_obs, done=termination))
        transition.batch_size = torch.Size([1])
        memory.add(transition)
        if step > 10_000 and step % 20 == 0:
            agent.learn(memory.sample(1_000))
        obs = next_obs
        if all(bool(np.asarray(termination[a]).any() or np.asarray(truncation[a]).any()) for a in agent_ids):
            obs, info = env.reset()
            agent.reset_action_noise([0])
        if step % args.eval_every == 0:
            agent.set_training_mode(False)
            score = float(agent.test(eval_env, loop=args.eval_episodes, sum_scores=True))
            agent.set_training_mode(True)
            rows.append((step, score, time.perf_counter() - start))
            print(f"eval at {step} env steps: mean return {score:.2f} over {args.eval_episodes} episodes "
                  f"({rows[-1][2]:.0f} s)", flush=True)
            with open(args.out, "w", newline="") as f:
                csv.writer(f).writerows([("step", "return", "seconds"), *rows])
    agent.set_training_mode(False)
    final = float(agent.test(eval_env, loop=args.final_eval_episodes, sum_scores=True))
    print(f"final evaluation: mean return {final:.2f} over {args.final_eval_episodes} episodes "
          f"({time.perf_counter() - start:.0f} s in all)", flush=True)


if __name__ == "__main__":
    main()
