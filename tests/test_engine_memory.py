"""EngineMemory: a rollout engine's device memory given back between phases (torch_memory_saver).

On a machine without CUDA only the refusal is checked. With CUDA a randomly initialised
GPT-2 generates greedily, sleeps (weights to the host, cache dropped), wakes, and must
generate the same tokens from the same tensors at the same addresses, three times over.
"""
from __future__ import annotations

import pytest
import torch

from rollmux.errors import DeviceUnavailableError
from rollmux.integrations.engine_memory import EngineMemory
from rollmux.runtime.state_cache import CacheStateError, Residency

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CACHE_BYTES = 256 << 20


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_is_refused_before_anything_is_allocated() -> None:
    with pytest.raises(DeviceUnavailableError, match="a CUDA device"):
        EngineMemory("rollout")


def greedy(model: torch.nn.Module, prompt: torch.Tensor) -> list[int]:
    with torch.no_grad():
        return model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)[0].tolist()


@CUDA
def test_sleep_gives_the_memory_back_and_wake_resumes_exactly() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    memory = EngineMemory("test-engine")
    torch.manual_seed(0)
    with memory.weights():
        model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=1024)).cuda().eval()
    with memory.cache():
        cache = torch.ones(CACHE_BYTES, dtype=torch.uint8, device="cuda")
    handle = memory.guard(model)
    prompt = torch.tensor([[5, 17, 99, 3]], device="cuda")
    expected = greedy(model, prompt)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    addresses = [p.data_ptr() for p in model.parameters()]
    for _ in range(3):
        asleep = memory.sleep()
        assert asleep.weights_bytes >= weight_bytes
        assert asleep.cache_bytes >= CACHE_BYTES
        assert asleep.host_bytes == asleep.weights_bytes
        with pytest.raises(CacheStateError, match="run the engine"):
            model(prompt)
        with pytest.raises(CacheStateError, match="sleep"):
            memory.sleep()
        awake = memory.wake()
        assert awake.weights_bytes >= weight_bytes and awake.cache_bytes >= CACHE_BYTES
        cache.fill_(7)  # the dropped kind is usable again (contents were undefined)
        assert int(cache[-1]) == 7
        assert [p.data_ptr() for p in model.parameters()] == addresses
        assert greedy(model, prompt) == expected
    # the SDK's state hook: job.phase("rollout", state=memory) enters resident(key, device)
    with memory.resident("job/rollout", "cuda") as record:
        assert record is None  # it was awake
    assert memory.residency is Residency.HOST
    with memory.resident("job/rollout", "cuda") as record:
        assert record.direction == "wake"
        assert greedy(model, prompt) == expected
    memory.wake()
    with pytest.raises(CacheStateError, match="wake"):
        memory.wake()
    handle.remove()
