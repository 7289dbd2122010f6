"""RollMux: multiplexing RL post-training jobs across disaggregated GPU pools."""
from rollmux import native as _native

_native.install()  # the compiled kernel, where it was built from today's source


def __getattr__(name: str):
    """Lazy ``from rollmux import Client``: the SDK's HTTP stack loads only when asked for."""
    if name == "Client":
        from rollmux.runtime.sdk import Client

        return Client
    raise AttributeError(f"module 'rollmux' has no attribute {name!r}")
