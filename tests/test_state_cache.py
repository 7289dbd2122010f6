"""StateCache: bit-identical warm/cold switches, budget refusal, buffer reuse, stats."""
from __future__ import annotations

import numpy as np
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
    arena_bytes,
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



@pytest.mark.parametrize("where", ["param_groups", "state"])
def test_a_cold_save_of_values_the_weights_only_loader_refuses_changes_nothing(tmp_path, where) -> None:
    """optimizer.pt was written with torch.save and read with torch.load(weights_only=True):
    an lr from numpy (np.logspace) was saved, the tensors freed, and the entry then stuck on
    disk, its state readable by no load_cold."""
    model, optimizer = trained_job()
    before = snapshot(model, optimizer)
    param = next(model.parameters())
    if where == "param_groups":
        optimizer.param_groups[0]["lr"] = np.logspace(-4, -2, 3)[0]
        place, kind = r"\['param_groups'\]\[0\]\['lr'\]", "numpy.float64"
    else:
        optimizer.state[param]["seen"] = np.array([1.0, 2.0])
        place, kind = r"\['state'\]\[0\]\['seen'\]", "numpy.ndarray"
    cache = StateCache(budget_bytes=1 << 24)
    cache.register("job", model, optimizer)
    cache.offload("job")
    reserved, buffers = cache.reserved_bytes, {k: v.data_ptr() for k, v in cache.host_buffers("job").items()}
    with pytest.raises(SpecError, match=rf"entry 'job': save_cold: optimizer\.state_dict\(\){place}.*not {kind}"):
        cache.save_cold("job", tmp_path / "cold")
    assert not (tmp_path / "cold").exists()
    assert cache.residency("job") is Residency.HOST and cache.reserved_bytes == reserved
    assert {k: v.data_ptr() for k, v in cache.host_buffers("job").items()} == buffers
    cache.load("job", "cpu")
    optimizer.state[param].pop("seen", None)
    optimizer.param_groups[0]["lr"] = 1e-2
    assert_identical(before, snapshot(model, optimizer))
    cache.save_cold("job", tmp_path / "cold")  # plain values: saved and read back
    cache.load_cold("job", tmp_path / "cold", "cpu")
    assert_identical(before, snapshot(model, optimizer))


class MasterCopy(torch.optim.Optimizer):
    """Keeps an fp32 copy of each parameter and an exact int64 counter (mixed precision),
    and both again in a tuple and a dict."""

    def __init__(self, params) -> None:
        super().__init__(params, {"lr": 0.5})

    @torch.no_grad()
    def step(self, closure=None) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                state = self.state[param]
                state.setdefault("master", param.detach().float() + 1e-3)
                state["seen"] = state.get("seen", torch.tensor([2**40], dtype=torch.int64)) + 1
                state["master"].sub_(group["lr"] * param.grad.float())
                state["last"] = (state["master"].clone(), {"seen": state["seen"].clone()})
                param.copy_(state["master"])


def master_state(model: torch.nn.Module, optimizer: MasterCopy) -> dict[str, torch.Tensor]:
    state = {f"m.{k}": v for k, v in model.state_dict().items()}
    for index, param in enumerate(model.parameters()):
        values = optimizer.state[param]
        assert type(values["last"]) is tuple and type(values["last"][1]) is dict
        state |= {f"{index}.master": values["master"], f"{index}.seen": values["seen"],
                  f"{index}.last.0": values["last"][0], f"{index}.last.1": values["last"][1]["seen"]}
    return state


def test_cold_round_trip_keeps_optimizer_state_dtypes_load_state_dict_casts(tmp_path) -> None:
    """Optimizer.load_state_dict casts every non-step state tensor to its floating
    parameter's dtype: the fp32 master copy of a bf16 parameter came back bf16 and the
    int64 counter 2**40 + 1 as a float, 2**40."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 3).to(torch.bfloat16)
    optimizer = MasterCopy(model.parameters())
    for _ in range(2):
        model(torch.ones(2, 3, dtype=torch.bfloat16)).sum().backward()
        optimizer.step()
    before = {k: v.clone() for k, v in master_state(model, optimizer).items()}
    cache = StateCache(budget_bytes=1 << 20)
    cache.register("job", model, optimizer)
    cache.save_cold("job", tmp_path)
    cache.load_cold("job", tmp_path, "cpu")
    assert_identical(before, master_state(model, optimizer))  # dtypes and bits, also in the tuple and the dict
    assert optimizer.state[model.weight]["seen"].tolist() == [2**40 + 2]
    fresh = torch.nn.Linear(3, 3).to(torch.bfloat16)  # a restarted job: its state comes from the file
    fresh_opt = MasterCopy(fresh.parameters())
    restarted = StateCache(budget_bytes=0)
    restarted.register("job", fresh, fresh_opt)
    restarted.load_cold("job", tmp_path, "cpu")
    assert_identical(before, master_state(fresh, fresh_opt))


def test_an_arena_whose_buffers_were_all_replaced_is_freed() -> None:
    """An arena counted as in use while it still *named* a kept slot, though that slot's
    buffer had moved to a newer arena: growing b then a kept three arenas and refused an
    offload whose state fitted the budget."""
    mib = 1 << 20
    model = torch.nn.Module()
    model.register_buffer("a", torch.zeros(mib // 4))
    model.register_buffer("b", torch.zeros(mib // 4))
    grown = arena_bytes({"x": (torch.Size([mib // 4 + 16]), torch.float32)})
    cache = StateCache(budget_bytes=mib + 2 * grown)
    cache.register("job", model)
    cache.offload("job")
    cache.load("job", "cpu")
    model.b = torch.full((mib // 4 + 16,), 2.0)
    cache.offload("job")  # arena {a, b} keeps a's buffer; arena {b} holds b's
    cache.load("job", "cpu")
    model.a = torch.full((mib // 4 + 16,), 1.0)
    cache.offload("job")  # arena {a, b} serves no slot now: freed
    assert cache.reserved_bytes == 2 * grown
    assert {k: v.shape for k, v in cache.host_buffers("job").items()} == {"module.a": (mib // 4 + 16,),
                                                                            "module.b": (mib // 4 + 16,)}
    cache.load("job", "cpu")
    assert bool((model.a == 1.0).all()) and bool((model.b == 2.0).all())


def lbfgs_job(seed: int = 0) -> tuple[torch.nn.Linear, torch.optim.LBFGS, object]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.LBFGS(model.parameters(), history_size=3, max_iter=4)
    x, y = torch.randn(16, 8), torch.randn(16, 4)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        return loss

    return model, optimizer, closure


def lbfgs_state(model: torch.nn.Module, optimizer: torch.optim.LBFGS) -> dict[str, object]:
    """Module tensors and LBFGS's state by name, the items of its lists as ``<key>.<j>``."""
    state: dict[str, object] = {f"m.{k}": v for k, v in model.state_dict().items()}
    for key, value in optimizer.state[model.weight].items():
        for j, item in enumerate(value) if isinstance(value, list) else [("", value)]:
            state[f"o.{key}.{j}"] = item
    return state


def assert_same_lbfgs_state(before: dict[str, object], now: dict[str, object]) -> None:
    assert now.keys() == before.keys()
    for k, v in before.items():
        if isinstance(v, torch.Tensor):
            assert now[k].dtype == v.dtype, k
            assert torch.equal(now[k].view(-1).view(torch.uint8), v.view(-1).view(torch.uint8)), k
        else:
            assert now[k] == v, k


def test_lbfgs_state_nested_in_lists_switches_warm_and_cold(tmp_path) -> None:
    """LBFGS keeps its history (old_dirs, old_stps, ro, al) in lists of tensors: they were
    neither offloaded nor counted, and stayed on the device (5 MB for a 256x256 layer)."""
    reference, reference_opt, reference_closure = lbfgs_job()
    model, optimizer, closure = lbfgs_job()
    for _ in range(3):
        reference_opt.step(reference_closure)
        optimizer.step(closure)
    cache = StateCache(budget_bytes=1 << 20)
    cache.register("job", model, optimizer)
    for path in ("warm", "cold"):
        state = lbfgs_state(model, optimizer)
        before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
        nested = {k: v for k, v in state.items() if k.count(".") == 2 and not k.endswith(".")}
        assert len(nested) == 12 and {k.split(".")[1] for k in nested} == {"old_dirs", "old_stps", "ro", "al"}
        lists = {k: v for k, v in optimizer.state[model.weight].items() if isinstance(v, list)}
        record = cache.offload("job") if path == "warm" else cache.save_cold("job", tmp_path)
        assert record.bytes == sum(v.numel() * v.element_size() for v in before.values() if isinstance(v, torch.Tensor))
        assert all(t.numel() == 0 for t in nested.values())
        if path == "warm":
            assert "optim.0['old_dirs'][0]" in cache.host_buffers("job")
            cache.load("job", "cpu")
            assert all(lbfgs_state(model, optimizer)[k] is t for k, t in nested.items())  # the same objects
            assert all(optimizer.state[model.weight][k] is v for k, v in lists.items())
        else:
            cache.load_cold("job", tmp_path, "cpu")
        assert_same_lbfgs_state(before, lbfgs_state(model, optimizer))
        assert optimizer.step(closure).item() == reference_opt.step(reference_closure).item()
    # the same bits as a run never switched (load_cold onto a CPU copies what safetensors read, aligned to
    # 8 bytes only: a dot product's vectorised sum over it rounded differently, in the last bits)
    assert torch.equal(model.weight.view(torch.uint8), reference.weight.view(torch.uint8))


class ViewBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(8.0))
        self.register_buffer("head", self.w.data[:4])  # shares w's storage


class CarvedParams(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        flat = torch.zeros(10)
        self.a = torch.nn.Parameter(flat[:4].view(2, 2))
        self.b = torch.nn.Parameter(flat[4:])


class TiedLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # one Parameter in two places
        self.register_buffer("none_yet", self.embed.weight.data[:0])  # a zero-size view of its storage


def test_slots_sharing_storage_are_refused_naming_both(tmp_path) -> None:
    """A switch gives each slot storage of its own: a buffer viewing a parameter, or
    parameters carved from one buffer, silently stopped seeing each other's writes (warm),
    and the cold save raised safetensors' raw RuntimeError."""
    cache = StateCache(budget_bytes=1 << 24)
    with pytest.raises(SpecError, match=r"entry 'view': module.head='a tensor sharing storage with module.w'"):
        cache.register("view", ViewBuffer())
    with pytest.raises(SpecError, match=r"module.b='a tensor sharing storage with module.a'"):
        cache.register("carved", CarvedParams())
    assert "view" not in cache and "carved" not in cache

    torch.manual_seed(0)
    tied = TiedLM()  # one Parameter reached twice and a zero-size view are no sharing
    optimizer = torch.optim.Adam(tied.parameters())
    tied.head(tied.embed(torch.arange(4))).sum().backward()
    optimizer.step()
    before = snapshot(tied, optimizer)
    cache.register("tied", tied, optimizer)
    cache.offload("tied")
    cache.load("tied", "cpu")
    cache.save_cold("tied", tmp_path / "tied")
    cache.load_cold("tied", tmp_path / "tied", "cpu")
    assert tied.head.weight is tied.embed.weight
    assert_identical(before, snapshot(tied, optimizer))

    optimizer.state[tied.embed.weight]["alias"] = tied.embed.weight.data[:2]  # state created since register
    pointer = tied.embed.weight.data_ptr()
    for switch in (lambda: cache.offload("tied"), lambda: cache.save_cold("tied", tmp_path / "again")):
        with pytest.raises(SpecError, match=r"optim.0.alias='a tensor sharing storage with module.embed.weight'"):
            switch()
        assert cache.residency("tied") is Residency.DEVICE and tied.embed.weight.data_ptr() == pointer
    assert not (tmp_path / "again").exists() and cache.reserved_bytes == 0
    assert_identical(before, {k: v for k, v in snapshot(tied, optimizer).items() if "alias" not in k})


@pytest.mark.parametrize("make", [
    lambda: torch.eye(3).to_sparse(),
    lambda: torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8),
    lambda: torch.empty(3, device="meta"),
], ids=["sparse", "quantized", "meta"])
def test_tensors_the_cache_cannot_move_are_refused_on_register(make) -> None:
    """Accepted before: the offload then raised a raw RuntimeError or NotImplementedError."""
    module = torch.nn.Linear(2, 2)
    module.register_buffer("odd", make())
    cache = StateCache(budget_bytes=1 << 20)
    with pytest.raises(SpecError, match=r"entry 'job': module.odd=.*expected a dense \(torch.strided\)"):
        cache.register("job", module)
    assert "job" not in cache


def test_a_dtype_safetensors_cannot_write_is_refused_before_save_cold_changes_anything(tmp_path) -> None:
    """save_cold of a complex128 buffer raised a bare KeyError from safetensors."""
    module = torch.nn.Linear(2, 2)
    module.register_buffer("z", torch.randn(4, dtype=torch.complex128))
    before = snapshot(module, None)
    cache = StateCache(budget_bytes=1 << 20)
    cache.register("job", module)
    cache.offload("job")
    reserved = cache.reserved_bytes
    with pytest.raises(SpecError, match=r"entry 'job': save_cold: module.z=torch.complex128: expected a dtype "
                                        "safetensors can write"):
        cache.save_cold("job", tmp_path / "cold")
    assert not (tmp_path / "cold").exists()
    assert cache.residency("job") is Residency.HOST and cache.reserved_bytes == reserved
    cache.load("job", "cpu")
    assert_identical(before, snapshot(module, None))


def test_nested_resident_offloads_only_when_the_outermost_exits() -> None:
    """The inner exit offloaded: the outer body ran on (0,) tensors and its exit raised
    CacheStateError (an offload of a HOST entry)."""
    model, optimizer = trained_job()
    before = snapshot(model, optimizer)
    cache = StateCache(budget_bytes=1 << 24)
    cache.register("job", model, optimizer)
    cache.offload("job")
    with cache.resident("job", "cpu") as outer:
        assert outer is not None and outer.direction == "load"
        with cache.resident("job", "cpu") as inner:
            assert inner is None
        assert cache.residency("job") is Residency.DEVICE
        assert_identical(before, snapshot(model, optimizer))
        with pytest.raises(RuntimeError, match="inner failed"):
            with cache.resident("job", "cpu"):
                raise RuntimeError("inner failed")
        assert cache.residency("job") is Residency.DEVICE and model.head.weight.shape == (VOCAB, WIDTH)
    assert cache.residency("job") is Residency.HOST
    assert [r.direction for r in cache.records] == ["offload", "load", "offload"]
    with pytest.raises(RuntimeError, match="outer failed"):
        with cache.resident("job", "cpu"), cache.resident("job", "cpu"):
            raise RuntimeError("outer failed")
    assert cache.residency("job") is Residency.HOST

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
