"""GRPO's math: group-relative advantages and the clipped policy-gradient loss.

For a prompt with G sampled completions and rewards r_1..r_G, the advantage of
completion i is A_i = (r_i - mean(r)) / (std(r) + eps), shared by all its tokens (a
group whose rewards are all equal teaches nothing and gets A = 0).

The per-token loss, with ratio rho = exp(logp - logp_old), is the PPO clipped
surrogate -min(rho A, clip(rho, 1 - eps_clip, 1 + eps_clip) A), plus, when
``kl_coef`` > 0, kl_coef times the k3 estimator of KL(pi || pi_ref):
exp(logp_ref - logp) - (logp_ref - logp) - 1, which is >= 0 and 0 where they agree.
The loss is the mean over all tokens of the batch.
"""
from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """Advantages [B] for rewards [B] laid out as consecutive groups of ``group_size``."""
    if rewards.numel() % group_size:
        raise ValueError(f"rewards: {rewards.numel()} values, expected a multiple of group_size={group_size}")
    groups = rewards.view(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    return (centred / (groups.std(dim=1, keepdim=True, unbiased=False) + eps)).view(-1)


def grpo_loss(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, clip: float = 0.2,
              logp_ref: torch.Tensor | None = None, kl_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss over token log-probs [B, T] and advantages [B]; returns (loss, stats)."""
    ratio = torch.exp(logp - logp_old)
    adv = advantages.unsqueeze(1)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    loss = -surrogate.mean()
    stats = {"clip_frac": ((ratio.detach() - 1).abs() > clip).float().mean().item()}
    if logp_ref is not None and kl_coef > 0:
        delta = logp_ref - logp
        kl = (torch.exp(delta) - delta - 1).mean()
        loss = loss + kl_coef * kl
        stats["kl"] = kl.detach().item()
    return loss, stats
