"""A small but real GRPO trainer for the RollMux demo: verifiable digit tasks, a tiny
from-scratch causal LM, rollout and training workers that run as Ray actors, and the
driver loop that wraps their phases with the RollMux job SDK.

Modules: ``task`` (vocabulary, tasks, exact-match rewards), ``policy`` (the model,
sampling with a KV cache, log-probabilities, supervised warm-up), ``algorithm``
(group-relative advantages, the clipped policy-gradient loss), ``profiles`` (the job
profiles the demo runs), ``workers`` (the two Ray actor classes) and ``driver`` (one
job's loop under the control plane).
"""
