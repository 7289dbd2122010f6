import importlib.util
import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("MPLBACKEND", "Agg")

#: Test modules that start Ray, a service process or server, a real RL framework or a
#: browser, or that depend on wall-clock time (leases, grace periods, live phase times).
#: Their tests carry the ``serial`` mark: ``make test`` runs every other test on two
#: workers (pytest-xdist), then these alone, one at a time, so that no live test shares
#: the machine's cores with another test. ``test_serial_marks_cover_every_live_module``
#: (tests/test_suite_layout.py) keeps this list complete.
SERIAL_MODULES = frozenset({
    "test_async_spec", "test_benchmark_args", "test_cli_frameworks", "test_cli_interrupt", "test_demo",
    "test_demo_moves", "test_demo_ray", "test_demo_regroup", "test_demo_tail", "test_demo_weight_sync",
    "test_engine_memory", "test_extras", "test_fleet_ray", "test_grpo_workers", "test_live_async",
    "test_live_moves", "test_live_tail", "test_native", "test_ray_adapter", "test_ray_start", "test_report_html",
    "test_reward_service", "test_rollart_demo", "test_rollart_live", "test_sdk", "test_service_e2e",
    "test_service_fleet", "test_service_hostile", "test_service_load", "test_service_tls", "test_sharded_state",
    "test_state_cache", "test_store", "test_trl_integration", "test_verl_adapter", "test_vllm_engine",
    "test_weight_sync", "test_whatif", "test_whatif_fleet",
})


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.stem in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)


@pytest.fixture(scope="session")
def benchmark_script():
    """Import ``benchmarks/<name>.py`` as a module (the scripts are not a package)."""
    folder = Path(__file__).resolve().parent.parent / "benchmarks"

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
