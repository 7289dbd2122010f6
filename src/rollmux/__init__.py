"""RollMux: multiplexing RL post-training jobs across disaggregated GPU pools."""
