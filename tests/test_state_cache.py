"""StateCache: bit-identical warm/cold switches, budget refusal, buffer reuse, stats."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from rollmux.errors import SpecError  # noqa: E402
from rollmux.runtime.state_cache import (  # noqa: E402
    CacheBudgetError,
    CacheFolderError,
    CacheKeyError,
    CacheStateError,
    CheckpointMismatchError,
    Residency,
    StateCache,
)

VOCAB, WIDTH, SEQ, BATCH = 64, 32, 8, 4
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class TinyLM(torch.nn.Module):
    """Embedding, one transformer block, a BatchNorm (for buffers), a head: ~40k params."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.block = torch.nn.TransformerEncoderLayer(WIDTH, 4, 2 * WIDTH, dropout=0.0, batch_first=True)
        self.norm = torch.nn.BatchNorm1d(WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.block(self.embed(tokens))
        hidden = self.norm(hidden.transpose(1, 2)).transpose(1, 2)
        return self.head(hidden)


def make_job(seed: int = 0, device: str = "cpu") -> tuple[TinyLM, torch.optim.Adam]:
    torch.manual_seed(seed)
    model = TinyLM().to(device)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def batch(step: int, device: str = "cpu") -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator).to(device)


def train_step(model: TinyLM, optimizer: torch.optim.Optimizer, step: int, device: str = "cpu") -> float:
    tokens = batch(step, device)
    optimizer.zero_grad()
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    return loss.item()


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, torch.Tensor]:
    state = {f"m.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    if optimizer is not None:
        for index, values in optimizer.state_dict()["state"].items():
            state.update({f"o.{index}.{k}": v.clone() for k, v in values.items()})
    return state


def assert_identical(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert left.keys() == right.keys()
    for name in left:
        a, b = left[name], right[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a.cpu().view(-1).view(torch.uint8), b.cpu().view(-1).view(torch.uint8)), name


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    if optimizer is not None:
        tensors += [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def trained_job(steps: int = 2, device: str = "cpu") -> tuple[TinyLM, torch.optim.Adam]:
    model, optimizer = make_job(device=device)
    for step in range(steps):
        train_step(model, optimizer, step, device)
    return model, optimizer


def test_warm_round_trips_are_bit_identical_over_many_cycles() -> None:
    model, optimizer = trained_job()
    before = snapshot(model, optimizer)
    params = list(model.parameters())
    cache = StateCache(budget_bytes=1 << 24)
    cache.register("job", model, optimizer)
    for _ in range(25):
        cache.offload("job")
        assert cache.residency("job") is Residency.HOST
        assert all(p.numel() == 0 for p in model.parameters())
        cache.load("job", "cpu")
        assert_identical(before, snapshot(model, optimizer))
    assert list(model.parameters()) == params
    assert [p for g in optimizer.param_groups for p in g["params"]] == params


def test_adam_state_round_trips_and_keeps_its_tensor_objects() -> None:
    model, optimizer = trained_job(steps=3)
    state_objects = {id(v) for s in optimizer.state.values() for v in s.values()}
    before = optimizer.state_dict()
    cache = StateCache(budget_bytes=1 << 24)
    cache.register("job", model, optimizer)
    cache.offload("job")
    assert all(v.numel() == 0 for s in optimizer.state.values() for v in s.values())
    cache.load("job", "cpu")
    after = optimizer.state_dict()
    assert {id(v) for s in optimizer.state.values() for v in s.values()} == state_objects
    assert before["param_groups"] == after["param_groups"]
    for index, values in before["state"].items():
        for k, v in values.items():
            assert torch.equal(v, after["state"][index][k]), (index, k)
    assert all(s["step"].device.type == "cpu" for s in optimizer.state.values())


def test_training_with_a_switch_between_every_step_matches_training_without() -> None:
    reference_model, reference_opt = make_job()
    reference = [train_step(reference_model, reference_opt, step) for step in range(6)]

    model, optimizer = make_job()
    cache = StateCache(budget_bytes=1 << 24)
    cache.register(("job", "train"), model, optimizer)
    losses = []
    for step in range(6):
        with cache.resident(("job", "train"), "cpu"):
            losses.append(train_step(model, optimizer, step))
        assert cache.residency(("job", "train")) is Residency.HOST
    cache.load(("job", "train"), "cpu")
    assert losses == reference
    assert_identical(snapshot(reference_model, reference_opt), snapshot(model, optimizer))


def test_budget_refusal_names_key_and_bytes_and_changes_nothing() -> None:
    model, optimizer = trained_job()
    before = snapshot(model, optimizer)
    pointers = [p.data_ptr() for p in model.parameters()]
    need = state_bytes(model, optimizer)
    cache = StateCache(budget_bytes=need // 2)
    cache.register("big", model, optimizer)
    with pytest.raises(CacheBudgetError) as raised:
        cache.offload("big")
    assert raised.value.key == "big"
    assert raised.value.needed_bytes >= need
    assert raised.value.left_bytes == need // 2
    assert "'big'" in str(raised.value) and str(need // 2) in str(raised.value)
    assert cache.residency("big") is Residency.DEVICE
    assert [p.data_ptr() for p in model.parameters()] == pointers
    assert_identical(before, snapshot(model, optimizer))
    assert cache.reserved_bytes == 0 and cache.records == ()
    assert train_step(model, optimizer, 9) > 0  # still trainable


def test_budget_is_shared_and_a_cold_save_gives_it_back(tmp_path) -> None:
    first, first_opt = trained_job()
    second, second_opt = trained_job()
    cache = StateCache(budget_bytes=int(1.5 * state_bytes(first, first_opt)))
    cache.register("a", first, first_opt)
    cache.register("b", second, second_opt)
    cache.offload("a")
    with pytest.raises(CacheBudgetError):
        cache.offload("b")
    assert cache.residency("b") is Residency.DEVICE
    cache.save_cold("a", tmp_path)
    cache.offload("b")
    assert cache.residency("b") is Residency.HOST


def test_two_entries_cannot_keep_their_cold_state_in_one_folder(tmp_path) -> None:
    """The files have fixed names: the second save overwrote the first entry's only copy,
    and its load_cold then failed, or read the other job's values when the shapes agreed."""
    first, first_opt = trained_job(steps=2)
    second, second_opt = trained_job(steps=3)
    kept = {k: v.clone() for k, v in first.state_dict().items()}
    cache = StateCache(budget_bytes=1 << 24)
    cache.register("a", first, first_opt)
    cache.register("b", second, second_opt)
    cache.save_cold("a", tmp_path / "cold")
    files = {p.name: p.read_bytes() for p in (tmp_path / "cold").iterdir()}
    with pytest.raises(CacheFolderError, match="entry 'a''s cold state is there"):
        cache.save_cold("b", tmp_path / "cold" / ".." / "cold")  # the same folder by another path
    assert {p.name: p.read_bytes() for p in (tmp_path / "cold").iterdir()} == files
    assert cache.residency("b") is Residency.DEVICE
    cache.save_cold("b", tmp_path / "other")
    cache.load_cold("a", tmp_path / "cold", "cpu")
    assert all(torch.equal(first.state_dict()[k], v) for k, v in kept.items())
    cache.load_cold("b", tmp_path / "other", "cpu")
    cache.save_cold("b", tmp_path / "cold")  # "a" is on its device again: its old files may go


def test_host_buffers_are_allocated_once_and_reused() -> None:
    model, optimizer = trained_job()
    cache = StateCache(budget_bytes=1 << 24)
    cache.register("job", model, optimizer)
    cache.offload("job")
    pointers = {k: v.data_ptr() for k, v in cache.host_buffers("job").items()}
    reserved = cache.reserved_bytes
    for step in range(4):
        cache.load("job", "cpu")
        train_step(model, optimizer, step)
        cache.offload("job")
        assert {k: v.data_ptr() for k, v in cache.host_buffers("job").items()} == pointers
        assert cache.reserved_bytes == reserved
    assert state_bytes(model, None) <= reserved


def test_optimizer_state_created_after_first_offload_gets_new_buffers() -> None:
    model, optimizer = make_job()
    cache = StateCache(budget_bytes=1 << 24)
    cache.register("job", model, optimizer)
    cache.offload("job")  # Adam has no state yet
    module_pointers = {k: v.data_ptr() for k, v in cache.host_buffers("job").items()}
    assert all(k.startswith("module.") for k in module_pointers)
    cache.load("job", "cpu")
    train_step(model, optimizer, 0)
    before = snapshot(model, optimizer)
    cache.offload("job")
    buffers = cache.host_buffers("job")
    assert {k: buffers[k].data_ptr() for k in module_pointers} == module_pointers
    assert any(k.startswith("optim.") for k in buffers)
    cache.load("job", "cpu")
    assert_identical(before, snapshot(model, optimizer))


def test_a_state_whose_shapes_change_keeps_its_host_memory_bounded() -> None:
    """A slot that changes shape gets a new buffer; the arena left with no buffer in use is
    freed (it was kept: reserved memory grew with every change until the budget refused
    an offload of a state that fitted it three times over)."""
    layer = torch.nn.Linear(1, 1, bias=False)
    size = 512 * 1024  # 2 MiB of float32
    cache = StateCache(budget_bytes=3 * 4 * (size + 1) + 3 * 4096)
    layer.weight.data = torch.zeros(size)
    cache.register("job", layer)
    reserved = []
    for cycle in range(8):
        cache.offload("job")
        reserved.append(cache.reserved_bytes)
        cache.load("job", "cpu")
        layer.weight.data = torch.full((size + cycle % 2,), float(cycle))  # the shape flips each cycle
    cache.offload("job")
    assert max(reserved) <= 2 * reserved[0] + 4096 and cache.reserved_bytes <= 2 * reserved[0] + 4096, reserved
    cache.load("job", "cpu")
    assert layer.weight.shape == (size + 1,) and bool((layer.weight == 7.0).all())


def test_a_module_another_entry_holds_is_refused_on_register() -> None:
    """Registered under two keys (say job/rollout and job/train), an offload of one emptied
    the tensors the other still counted as resident: its phase then ran on (0,) weights."""
    model, optimizer = make_job()
    cache = StateCache(budget_bytes=1 << 24)
    cache.register("job/rollout", model, optimizer)
    with pytest.raises(SpecError, match="entry 'job/rollout' holds some of them"):
        cache.register("job/train", model)
    with pytest.raises(SpecError, match="entry 'job/rollout' holds some of them"):
        cache.register("job/head", model.head)  # a part of it
    assert "job/train" not in cache and "job/rollout" in cache
    cache.register("other", make_job(1)[0])


def test_a_cold_optimizer_state_is_refused_for_parameters_in_another_order(tmp_path) -> None:
    """The i-th parameter's moments go to the optimizer's i-th parameter: an optimizer built
    over the same module with its parameters in another order took (3, 4) moments for a
    (2,) parameter, and failed only inside optimizer.step()."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    cache = StateCache(budget_bytes=0)
    cache.register("job", model, optimizer)
    saved = snapshot(model, optimizer)
    cache.save_cold("job", tmp_path)
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    reordered = torch.optim.Adam(list(fresh.parameters())[::-1])
    cache.register("fresh", fresh, reordered)
    before = snapshot(fresh, reordered)
    with pytest.raises(CheckpointMismatchError, match=r"optimizer parameter 0=shape \(3, 4\): expected shape \(2,\)"):
        cache.load_cold("fresh", tmp_path, "cpu")
    assert_identical(before, snapshot(fresh, reordered))
    in_order = torch.optim.Adam(fresh.parameters())
    cache.remove("fresh")
    cache.register("fresh", fresh, in_order)
    cache.load_cold("fresh", tmp_path, "cpu")
    assert_identical(saved, snapshot(fresh, in_order))


def test_stats_and_records_count_the_bytes_moved() -> None:
    model, optimizer = trained_job()
    expected = state_bytes(model, optimizer)
    cache = StateCache(budget_bytes=1 << 24)
    cache.register("job", model, optimizer)
    for _ in range(3):
        cache.offload("job")
        cache.load("job", "cpu")
    records = cache.records
    assert [(r.direction, r.path) for r in records] == [("offload", "warm"), ("load", "warm")] * 3
    assert all(r.bytes == expected and r.seconds > 0 and r.key == "job" for r in records)
    stats = cache.stats()
    assert stats.totals[("warm", "offload")].count == 3
    assert stats.totals[("warm", "load")].bytes == 3 * expected
    assert stats.totals[("cold", "load")].count == 0
    assert stats.reserved_bytes == cache.reserved_bytes >= expected
    assert stats.budget_bytes == 1 << 24 and stats.entries == 1


def test_cold_round_trip_is_bit_identical_and_training_continues(tmp_path) -> None:
    reference_model, reference_opt = make_job()
    reference = [train_step(reference_model, reference_opt, step) for step in range(5)]

    model, optimizer = make_job()
    cache = StateCache(budget_bytes=1 << 24)
    cache.register("job", model, optimizer)
    losses = [train_step(model, optimizer, step) for step in range(2)]
    before = snapshot(model, optimizer)
    cache.offload("job")
    record = cache.save_cold("job", tmp_path / "job")  # from HOST: gives the buffers back
    assert (record.direction, record.path, record.bytes) == ("offload", "cold", state_bytes_of(before))
    assert cache.residency("job") is Residency.DISK and cache.reserved_bytes == 0
    assert all(p.numel() == 0 for p in model.parameters())
    cache.load_cold("job", tmp_path / "job", "cpu")
    assert_identical(before, snapshot(model, optimizer))
    losses.append(train_step(model, optimizer, 2))
    cache.save_cold("job", tmp_path / "job")  # from DEVICE
    cache.load_cold("job", tmp_path / "job", "cpu")
    losses += [train_step(model, optimizer, step) for step in range(3, 5)]
    assert losses == reference
    assert cache.stats().totals[("cold", "offload")].count == 2


def state_bytes_of(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def test_cold_checkpoint_restores_into_a_freshly_built_job(tmp_path) -> None:
    model, optimizer = trained_job(steps=3)
    before = snapshot(model, optimizer)
    cache = StateCache(budget_bytes=0)
    cache.register("job", model, optimizer)
    cache.save_cold("job", tmp_path)

    fresh_model, fresh_opt = make_job(seed=7)  # a restarted process: other init, empty Adam state
    restarted = StateCache(budget_bytes=0)
    restarted.register("job", fresh_model, fresh_opt)
    restarted.load_cold("job", tmp_path, "cpu")
    assert_identical(before, snapshot(fresh_model, fresh_opt))
    cache.load_cold("job", tmp_path, "cpu")
    assert train_step(fresh_model, fresh_opt, 3) == train_step(model, optimizer, 3)


def test_cold_checkpoint_of_another_shape_is_refused_before_changes(tmp_path) -> None:
    model, optimizer = trained_job()
    cache = StateCache(budget_bytes=0)
    cache.register("job", model, optimizer)
    cache.save_cold("job", tmp_path)
    other = torch.nn.Linear(3, 5)
    other_before = snapshot(other, None)
    cache.register("other", other)
    with pytest.raises(CheckpointMismatchError, match="only in the"):
        cache.load_cold("other", tmp_path, "cpu")
    assert_identical(other_before, snapshot(other, None))

    cache.save_cold("other", tmp_path / "linear")
    wider = torch.nn.Linear(4, 5)
    wider_before = snapshot(wider, None)
    cache.register("wider", wider)
    with pytest.raises(CheckpointMismatchError, match=r"module.weight=\(5, 3\)"):
        cache.load_cold("wider", tmp_path / "linear", "cpu")
    assert_identical(wider_before, snapshot(wider, None))
    assert cache.residency("wider") is Residency.DEVICE


def test_offload_drops_gradients() -> None:
    model, optimizer = trained_job()
    assert any(p.grad is not None for p in model.parameters())
    cache = StateCache(budget_bytes=1 << 24)
    cache.register("job", model, optimizer)
    cache.offload("job")
    cache.load("job", "cpu")
    assert all(p.grad is None for p in model.parameters())


def test_resident_offloads_even_when_the_body_raises() -> None:
    model, optimizer = trained_job()
    cache = StateCache(budget_bytes=1 << 24)
    cache.register("job", model, optimizer)
    with cache.resident("job", "cpu") as record:
        assert record is None  # already on the device
    with pytest.raises(RuntimeError, match="phase failed"):
        with cache.resident("job", "cpu") as record:
            assert record is not None and record.direction == "load"
            raise RuntimeError("phase failed")
    assert cache.residency("job") is Residency.HOST


def test_misuse_raises_one_error_type_each(tmp_path) -> None:
    model, optimizer = trained_job()
    cache = StateCache(budget_bytes=1 << 24)
    cache.register("job", model, optimizer)
    with pytest.raises(CacheKeyError, match="'nope'"):
        cache.offload("nope")
    with pytest.raises(CacheKeyError, match="not yet registered"):
        cache.register("job", model, optimizer)
    with pytest.raises(CacheStateError, match="residency='device'"):
        cache.load("job", "cpu")
    cache.offload("job")
    with pytest.raises(CacheStateError):
        cache.offload("job")
    with pytest.raises(CacheStateError):
        cache.remove("job")
    with pytest.raises(CacheStateError):
        cache.load_cold("job", tmp_path, "cpu")
    with pytest.raises(SpecError, match="budget_bytes"):
        StateCache(budget_bytes=-1)
    with pytest.raises(SpecError, match="optimizer"):
        cache.register("foreign", torch.nn.Linear(2, 2), optimizer)
    cache.load("job", "cpu")
    cache.remove("job")
    assert cache.stats().entries == 0


@CUDA
def test_cuda_round_trip_uses_pinned_buffers_and_keeps_training_exact() -> None:
    reference_model, reference_opt = make_job(device="cuda")
    reference = [train_step(reference_model, reference_opt, step, "cuda") for step in range(4)]

    model, optimizer = make_job(device="cuda")
    cache = StateCache(budget_bytes=1 << 26)
    cache.register("job", model, optimizer)
    losses = []
    for step in range(4):
        with cache.resident("job", "cuda"):
            losses.append(train_step(model, optimizer, step, "cuda"))
        assert all(b.is_pinned() for b in cache.host_buffers("job").values())
    cache.load("job", "cuda")
    assert losses == reference
    assert all(p.is_cuda for p in model.parameters())
    assert all(s["step"].device.type == "cpu" for s in optimizer.state.values())
    assert_identical(snapshot(reference_model, reference_opt), snapshot(model, optimizer))


@CUDA
def test_cpu_entry_loads_onto_cuda_and_cold_loads_back(tmp_path) -> None:
    model, optimizer = trained_job()
    before = snapshot(model, optimizer)
    cache = StateCache(budget_bytes=1 << 24)
    cache.register("job", model, optimizer)
    cache.offload("job")
    cache.load("job", "cuda")
    assert all(p.is_cuda for p in model.parameters())
    assert_identical(before, snapshot(model, optimizer))
    cache.save_cold("job", tmp_path)
    cache.load_cold("job", tmp_path, "cuda")
    assert_identical(before, snapshot(model, optimizer))
