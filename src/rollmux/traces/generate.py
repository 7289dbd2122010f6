"""Synthetic Philly-like traces, mapped to RL jobs by the same rules as philly.py.

Contract
--------
* ``generate(count, seed, ...)`` draws ``count`` Philly-like records with one
  ``random.Random(seed)``: Poisson arrivals (exponential gaps of mean
  ``mean_interarrival_s``, first job at 0), lognormal durations with mean
  ``mean_duration_s`` and log-space spread ``sigma`` (rounded to whole seconds, at least
  1 s and at most ``philly.MAX_DURATION_S``, the longest an RL job of the mapping can run),
  and GPU counts from ``GPU_WEIGHTS``. The same generator then maps them with
  ``philly.to_rl_jobs`` (profile, size class, phases, SLO, model, memory, GPU split).
* Same arguments, same jobs. Job ids are ``gen-0000``, ``gen-0001``, ... in arrival order.
* ``async_share`` (default 0) marks round(share x count) jobs asynchronous, chosen with
  a second ``random.Random`` seeded from ``seed`` (so the other jobs and every drawn
  figure are those of the synchronous trace): each gets ``staleness`` and keeps the
  iterations it had, ``iterations`` = its synchronous ``solo_iterations()`` (the same
  work; alone it ends sooner, ``Job.solo_run_s``).
* ``reward_share`` (default 0) gives round(share x count) jobs a reward model of their
  own, chosen with a third ``random.Random`` seeded from ``seed`` (every other figure is
  unchanged). Rule: the reward model is the job's own size class (a reward model trained
  from the same base as the policy, e.g. 7B policy and 7B reward model) served by the
  same kind of inference engine as its rollout, so its host memory per rollout node is
  the rollout figure of Table 2 for that size (``philly.TABLE2_MEM_GB``):
  ``reward_mem_gb`` = that figure and ``mem_roll_gb`` = twice it (the rollout state plus
  the reward model). With ``reward_s`` > 0 those jobs score on the shared reward service,
  ``reward_s`` seconds per iteration at ``reward_price_per_hour``, and do not hold the
  model on their rollout nodes (``Job.mem``); with ``reward_s`` 0 they score inside their
  own rollout and hold it (the counterfactual of the same trace).
* Defaults follow the packaged 300-job Philly segment: it spans 580 h (about 7,000 s
  between arrivals), its jobs run 40.6 h on average, and 76% of them hold 16 GPUs.
"""
from __future__ import annotations

import math
import random

from rollmux.errors import SpecError
from rollmux.model import (MAX_PHASE_S, MAX_PRICE, MAX_STALENESS, MAX_TIME_S, REWARD_PRICE_PER_HOUR, Job,
                           model_size_column)
from rollmux.traces.philly import MAX_DURATION_S, TABLE2_MEM_GB, PhillyJob, check_mix, to_rl_jobs

#: Philly GPU count -> weight, rounded from the packaged segment (16: 228, 20-24: 13,
#: 32: 59 of 300 jobs).
GPU_WEIGHTS = {16: 0.76, 24: 0.04, 32: 0.20}
#: Shared reward service seconds per iteration of a job that uses it (``--reward-s``):
#: an illustrative figure, about a third of a medium rollout of the profiles (100-400 s).
DEFAULT_REWARD_S = 60.0


def generate(count: int, seed: int, mix: str = "mixed",
             slo_range: tuple[float, float] = (1.0, 2.0),
             mean_interarrival_s: float = 7000.0, mean_duration_s: float = 146_000.0,
             sigma: float = 1.5, async_share: float = 0.0, staleness: int = 1,
             reward_share: float = 0.0, reward_s: float = DEFAULT_REWARD_S,
             reward_price_per_hour: float = REWARD_PRICE_PER_HOUR) -> list[Job]:
    """Return ``count`` synthetic RL jobs; see the module contract.

    Raises SpecError, naming the parameter, for a negative count or one whose arrivals
    pass ``MAX_TIME_S``, a non-positive mean or spread, an unknown mix, an SLO range
    outside 1 <= lo <= hi <= ``MAX_SLO``, an async or reward share outside [0, 1], a
    staleness outside 1 to ``MAX_STALENESS``, reward seconds outside 0 to ``MAX_PHASE_S``
    or a reward price outside 0 to ``MAX_PRICE`` (a job's bounds, ``Job.validate``).
    """
    if not (isinstance(reward_share, (int, float)) and 0.0 <= reward_share <= 1.0):
        raise SpecError("reward_share", reward_share, "a share in [0, 1]")
    for name, value, top, unit in (("reward_s", reward_s, MAX_PHASE_S, "seconds"),
                                   ("reward_price_per_hour", reward_price_per_hour, MAX_PRICE, "$ per busy hour")):
        if not (isinstance(value, (int, float)) and 0 <= value <= top):
            raise SpecError(name, value, f"{unit} from 0 to {top:g}")
    if not (isinstance(async_share, (int, float)) and 0.0 <= async_share <= 1.0):
        raise SpecError("async_share", async_share, "a share in [0, 1]")
    if not isinstance(staleness, int) or isinstance(staleness, bool) or not 1 <= staleness <= MAX_STALENESS:
        raise SpecError("staleness", staleness, f"an integer from 1 to {MAX_STALENESS} (for the asynchronous jobs)")
    if not isinstance(count, int) or count < 0:
        raise SpecError("count", count, "a job count >= 0")
    for name, value in (("mean_interarrival_s", mean_interarrival_s),
                        ("mean_duration_s", mean_duration_s), ("sigma", sigma)):
        if not (math.isfinite(value) and value > 0):
            raise SpecError(name, value, "a finite value > 0")
    check_mix(mix, slo_range)
    rng = random.Random(seed)
    mu = math.log(mean_duration_s) - sigma * sigma / 2
    sizes, weights = list(GPU_WEIGHTS), list(GPU_WEIGHTS.values())
    records = []
    arrival = 0.0
    for index in range(count):
        if index:
            arrival += rng.expovariate(1.0 / mean_interarrival_s)
        if arrival > MAX_TIME_S:
            raise SpecError("count", count, f"a job count whose arrivals fit in {MAX_TIME_S:g} s (job {index} "
                                            f"arrives at {arrival:.4g} s)")
        duration = float(min(MAX_DURATION_S, max(1, round(rng.lognormvariate(mu, sigma)))))
        gpus = rng.choices(sizes, weights)[0]
        records.append(PhillyJob(f"gen-{index:04d}", round(arrival, 1), gpus, duration))
    jobs = to_rl_jobs(records, rng, mix, slo_range)
    marked = random.Random(f"async-{seed}").sample(range(len(jobs)), round(async_share * len(jobs)))
    for index in sorted(marked):
        job = jobs[index]
        job.iterations = job.solo_iterations()
        job.staleness = staleness
    with_model = random.Random(f"reward-{seed}").sample(range(len(jobs)), round(reward_share * len(jobs)))
    for index in sorted(with_model):
        job = jobs[index]
        model_gb = TABLE2_MEM_GB[model_size_column(job.model)][0]
        job.reward_mem_gb = model_gb
        job.mem_roll_gb = round(job.mem_roll_gb + model_gb, 3)
        job.reward_s = float(reward_s)
        job.reward_price_per_hour = float(reward_price_per_hour)
    return jobs
