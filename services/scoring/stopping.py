"""The scoring service's stop checks: the shared ones of ``services/common/stopping.py``,
re-exported where the IRT sampler and the catalogue first used them."""

from fortis.services.common.stopping import StopCheck, caller_stop, never, raise_if_stopped

__all__ = ["StopCheck", "caller_stop", "never", "raise_if_stopped"]
